//! The batcher's queue and its pure batch-forming function.
//!
//! Order of service: level 1 first, FIFO within a level, requests that timed out under a DELAY
//! policy after all others. A batch is always a prefix of that order (like Triton, a request
//! whose shapes differ from the batch's first request closes the batch rather than being
//! skipped), so forming one never reorders requests.

use std::collections::VecDeque;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::policy::{BatchingConfig, OnTimeout};
use crate::engine::infer::ValidInferRequest;
use crate::engine::tensor::OutputTensor;
use crate::error::{Error, Result};

/// Where a request's outputs (or error) go.
pub type Reply = oneshot::Sender<Result<Vec<OutputTensor>>>;

/// A request waiting to run.
#[derive(Debug)]
pub struct Pending {
    /// The checked request.
    pub request: ValidInferRequest,
    /// When it was queued.
    pub enqueued: Instant,
    /// When the request reached the model (before checks); request duration starts here.
    pub arrived: Instant,
    /// When it times out, if ever.
    pub deadline: Option<Instant>,
    /// Closed when the client has gone away.
    pub reply: Reply,
    /// Item shapes of every input (`None` = optional input absent); batches share one key.
    key: Vec<Option<Vec<i64>>>,
    /// The request's log span, which its batch's span follows (off unless DEBUG spans are on).
    pub span: tracing::Span,
}

impl Pending {
    /// Wraps a request queued at `now`.
    pub fn new(request: ValidInferRequest, now: Instant, reply: Reply) -> Self {
        let key =
            request.inputs.iter().map(|i| i.as_ref().map(|t| t.shape.get(1..).unwrap_or_default().to_vec())).collect();
        Self { request, enqueued: now, arrived: now, deadline: None, reply, key, span: tracing::Span::none() }
    }

    /// Lets the inputs marked in `ragged` (by model input index) differ in shape from the rest
    /// of a batch, as Triton does for `allow_ragged_batch` inputs.
    pub fn batch_regardless_of_shape(&mut self, ragged: &[bool]) {
        for (key, ragged) in self.key.iter_mut().zip(ragged) {
            if *ragged && let Some(shape) = key {
                shape.clear();
            }
        }
    }

    fn items(&self) -> usize {
        self.request.batch_size
    }
}

/// Why a request left the queue without running.
#[derive(Debug)]
pub enum Dropped {
    /// Timed out under a REJECT policy.
    TimedOut(Pending),
    /// The client went away.
    Cancelled(Pending),
}

/// What the batcher should do next.
#[derive(Debug, Default)]
pub struct Step {
    /// Requests to run together now.
    pub batch: Vec<Pending>,
    /// Requests removed without running.
    pub dropped: Vec<Dropped>,
    /// When to look again if nothing was sent (oldest request's delay or a deadline).
    pub wake_at: Option<Instant>,
    /// The batch's place among all batches formed from this queue (0, 1, 2, ...), by which
    /// `preserve_ordering` releases responses.
    pub seq: u64,
}

/// Pending requests of one model version, by priority level.
#[derive(Debug)]
pub struct BatchQueue {
    config: BatchingConfig,
    /// Index 0 = priority level 1.
    levels: Vec<VecDeque<Pending>>,
    /// Requests that timed out under a DELAY policy, served last.
    delayed: VecDeque<Pending>,
    /// Requests that carry a deadline (skip deadline scans when 0).
    with_deadline: usize,
    /// Batches formed so far: the next batch's `seq`.
    formed: u64,
}

impl BatchQueue {
    /// An empty queue.
    pub fn new(config: BatchingConfig) -> Self {
        let levels = (0..config.priority_levels).map(|_| VecDeque::new()).collect();
        Self { config, levels, delayed: VecDeque::new(), with_deadline: 0, formed: 0 }
    }

    /// The scheduling settings.
    pub fn config(&self) -> &BatchingConfig {
        &self.config
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.levels.iter().map(VecDeque::len).sum::<usize>() + self.delayed.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a request at the level its `priority` parameter names, applying the level's
    /// policy; a full level refuses at once (the request is dropped with the error).
    pub fn push(&mut self, mut pending: Pending, model: &str, dropped: &mut Vec<Dropped>) -> Result<()> {
        let level = self.level_of(&pending.request);
        if self.levels[level].len() >= self.config.policies[level].max_queue_size {
            // Requests whose clients left still hold places until the batcher next looks; a
            // new request must not be refused for them.
            self.drop_cancelled(level, dropped);
        }
        let policy = &self.config.policies[level];
        if self.levels[level].len() >= policy.max_queue_size {
            return Err(Error::unavailable(format!("Exceeds maximum queue size for model '{model}'")));
        }
        pending.deadline = policy.timeout_for(pending.request.timeout_us).map(|t| pending.enqueued + t);
        if pending.deadline.is_some() {
            self.with_deadline += 1;
        }
        self.levels[level].push_back(pending);
        Ok(())
    }

    /// Moves the requests of `level` whose clients left into `dropped`.
    fn drop_cancelled(&mut self, level: usize, dropped: &mut Vec<Dropped>) {
        for p in std::mem::take(&mut self.levels[level]) {
            if p.reply.is_closed() {
                self.with_deadline -= usize::from(p.deadline.is_some());
                dropped.push(Dropped::Cancelled(p));
            } else {
                self.levels[level].push_back(p);
            }
        }
    }

    /// The queue index of a request's level; its priority was checked against the model's levels
    /// when the request was validated.
    fn level_of(&self, request: &ValidInferRequest) -> usize {
        match usize::try_from(request.priority) {
            Ok(0) => self.config.default_priority - 1,
            Ok(p) => p.min(self.levels.len()) - 1,
            Err(_) => self.levels.len() - 1,
        }
    }

    /// Decides what to run at `now` (pure apart from the queue itself; no clock reads).
    pub fn next_batch(&mut self, now: Instant) -> Step {
        let mut step = Step::default();
        self.sweep(now, &mut step.dropped);
        let mut sizes = Vec::new();
        let mut total = 0usize;
        let mut closed = false;
        let mut first_key: Option<&Vec<Option<Vec<i64>>>> = None;
        let mut oldest: Option<Instant> = None;
        for p in self.iter() {
            let fits_shape = first_key.is_none_or(|k| *k == p.key);
            let fits_size = total + p.items() <= self.config.max_batch_size;
            let first = first_key.is_none();
            if !first && (!self.config.dynamic || !fits_shape || !fits_size) {
                closed = true;
                break;
            }
            first_key = Some(&p.key);
            oldest = Some(oldest.map_or(p.enqueued, |o: Instant| o.min(p.enqueued)));
            total += p.items();
            sizes.push(total);
            if total == self.config.max_batch_size {
                closed = true;
                break;
            }
        }
        let Some(oldest) = oldest else {
            return step;
        };
        let take = self.decide(&sizes, closed, oldest, now);
        match take {
            Some(n) => {
                step.batch = self.pop_front(n);
                step.seq = self.formed;
                self.formed += 1;
            }
            None => {
                let deadline = self.iter().filter_map(|p| p.deadline).min();
                let delay_end = oldest + self.config.max_queue_delay;
                step.wake_at = Some(deadline.map_or(delay_end, |d| d.min(delay_end)));
            }
        }
        step
    }

    /// How many requests (a prefix) to send now, or `None` to wait for more. Triton's rules
    /// (`GetDynamicBatch`), with no preferred sizes meaning `max_batch_size` as Triton
    /// normalises it:
    /// - before the delay is up, the largest prefix of a preferred size goes at once, or, when
    ///   the queue holds more than the largest preferred size and no prefix is preferred, the
    ///   prefix that stays within it;
    /// - everything that fits goes once the batch cannot grow (closed, or at the largest
    ///   preferred size), the delay is up, or there is no delay.
    fn decide(&self, sizes: &[usize], closed: bool, oldest: Instant, now: Instant) -> Option<usize> {
        let all = sizes.len();
        let c = &self.config;
        if !c.dynamic {
            return Some(all);
        }
        let largest = c.preferred.last().copied().unwrap_or(c.max_batch_size);
        let preferred =
            |size: usize| if c.preferred.is_empty() { size == largest } else { c.preferred.contains(&size) };
        let mut best = None;
        for (i, &size) in sizes.iter().enumerate() {
            if i > 0 && size > largest {
                best = best.or(Some(i));
                break;
            }
            if preferred(size) {
                best = Some(i + 1);
            }
        }
        let no_delay = c.max_queue_delay.is_zero();
        let expired = !no_delay && now >= oldest + c.max_queue_delay;
        if let Some(n) = best
            && !expired
        {
            return Some(n);
        }
        (closed || sizes[all - 1] >= largest || expired || no_delay).then_some(all)
    }

    /// Removes cancelled requests and handles timeouts.
    fn sweep(&mut self, now: Instant, dropped: &mut Vec<Dropped>) {
        for level in 0..self.levels.len() {
            self.drop_cancelled(level, dropped);
            if self.with_deadline == 0 {
                continue;
            }
            let on_timeout = self.config.policies[level].on_timeout;
            for p in std::mem::take(&mut self.levels[level]) {
                if p.deadline.is_some_and(|d| now >= d) {
                    self.with_deadline -= 1;
                    match on_timeout {
                        OnTimeout::Reject => dropped.push(Dropped::TimedOut(p)),
                        OnTimeout::Delay => self.delayed.push_back(Pending { deadline: None, ..p }),
                    }
                } else {
                    self.levels[level].push_back(p);
                }
            }
        }
        let delayed = std::mem::take(&mut self.delayed);
        for p in delayed {
            if p.reply.is_closed() {
                dropped.push(Dropped::Cancelled(p));
            } else {
                self.delayed.push_back(p);
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.levels.iter().flatten().chain(self.delayed.iter())
    }

    fn pop_front(&mut self, mut n: usize) -> Vec<Pending> {
        let mut out = Vec::with_capacity(n);
        for queue in self.levels.iter_mut().chain(std::iter::once(&mut self.delayed)) {
            while n > 0 {
                let Some(p) = queue.pop_front() else { break };
                self.with_deadline -= usize::from(p.deadline.is_some());
                out.push(p);
                n -= 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::batcher::policy::QueuePolicy;
    use crate::engine::infer::{ParamValue, Parameters};
    use crate::engine::tensor::InputTensor;
    use bytes::Bytes;
    use std::time::Duration;
    use tessera_protocol::DataType;

    fn config(preferred: &[usize], delay_us: u64) -> BatchingConfig {
        BatchingConfig {
            dynamic: true,
            max_batch_size: 8,
            preferred: preferred.to_vec(),
            max_queue_delay: Duration::from_micros(delay_us),
            preserve_ordering: false,
            priority_levels: 2,
            default_priority: 2,
            policies: vec![QueuePolicy::default(), QueuePolicy::default()],
        }
    }

    fn request(batch: usize, width: i64, params: &[(&str, ParamValue)]) -> ValidInferRequest {
        let input = InputTensor {
            name: "x".into(),
            datatype: DataType::Fp32,
            shape: vec![batch as i64, width],
            data: Bytes::new(),
        };
        // Validation turns these parameters into the typed fields the queue reads.
        let param = |key: &str| params.iter().find(|(k, _)| *k == key).and_then(|(_, v)| v.as_u64()).unwrap_or(0);
        ValidInferRequest {
            id: String::new(),
            parameters: Parameters::new(),
            priority: param("priority"),
            timeout_us: param("timeout"),
            batch_size: batch,
            inputs: vec![Some(input)],
            outputs: vec![0],
            cuda: Default::default(),
            trace: Default::default(),
        }
    }

    struct Harness {
        queue: BatchQueue,
        receivers: Vec<oneshot::Receiver<Result<Vec<OutputTensor>>>>,
        /// What pushes let go of.
        dropped: Vec<Dropped>,
    }

    impl Harness {
        fn new(config: BatchingConfig) -> Self {
            Self { queue: BatchQueue::new(config), receivers: Vec::new(), dropped: Vec::new() }
        }

        fn push(&mut self, req: ValidInferRequest) -> std::result::Result<(), Error> {
            let (tx, rx) = oneshot::channel();
            self.receivers.push(rx);
            self.queue.push(Pending::new(req, Instant::now(), tx), "m", &mut self.dropped)
        }

        fn batch_sizes(&mut self) -> Vec<usize> {
            self.queue.next_batch(Instant::now()).batch.iter().map(|p| p.items()).collect()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waits_for_the_delay_then_sends_what_is_there() {
        let mut h = Harness::new(config(&[], 100));
        h.push(request(1, 4, &[])).expect("queued");
        h.push(request(2, 4, &[])).expect("queued");
        let step = h.queue.next_batch(Instant::now());
        assert!(step.batch.is_empty());
        assert_eq!(step.wake_at, Some(Instant::now() + Duration::from_micros(100)));
        tokio::time::advance(Duration::from_micros(100)).await;
        assert_eq!(h.batch_sizes(), vec![1, 2]);
        assert!(h.queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_at_once_and_the_rest_waits() {
        let mut h = Harness::new(config(&[], 1_000));
        for b in [3, 5, 2] {
            h.push(request(b, 4, &[])).expect("queued");
        }
        assert_eq!(h.batch_sizes(), vec![3, 5], "3 + 5 reaches max_batch_size 8");
        assert!(h.batch_sizes().is_empty(), "the 2 waits for the delay");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reachable_preferred_size_goes_at_once_and_the_delay_sends_the_rest() {
        let mut h = Harness::new(config(&[2, 4], 50));
        for _ in 0..4 {
            h.push(request(1, 4, &[])).expect("queued");
        }
        assert_eq!(h.batch_sizes().len(), 4, "4 is the largest preferred size: no wait");
        for _ in 0..3 {
            h.push(request(1, 4, &[])).expect("queued");
        }
        assert_eq!(h.batch_sizes().len(), 2, "a prefix of preferred size 2 goes without waiting");
        assert!(h.batch_sizes().is_empty(), "1 is not preferred: wait");
        tokio::time::advance(Duration::from_micros(50)).await;
        assert_eq!(h.batch_sizes().len(), 1, "after the delay, what is there");
    }

    #[tokio::test(start_paused = true)]
    async fn more_than_the_largest_preferred_size_sends_that_much_at_once() {
        let mut h = Harness::new(config(&[4], 1_000));
        for _ in 0..5 {
            h.push(request(1, 4, &[])).expect("queued");
        }
        assert_eq!(h.batch_sizes(), vec![1, 1, 1, 1], "the preferred 4 goes, the fifth waits");
        assert!(h.batch_sizes().is_empty());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(h.batch_sizes(), vec![1], "the fifth goes after the delay");
        // No prefix is preferred (3, then 6): the prefix within the largest preferred size goes.
        for b in [3, 3] {
            h.push(request(b, 4, &[])).expect("queued");
        }
        assert_eq!(h.batch_sizes(), vec![3], "3 + 3 would pass 4");
    }

    #[tokio::test(start_paused = true)]
    async fn after_the_delay_everything_that_fits_goes_not_just_a_preferred_prefix() {
        let mut h = Harness::new(config(&[4], 100));
        for b in [3, 2] {
            h.push(request(b, 4, &[])).expect("queued");
        }
        assert_eq!(h.batch_sizes(), vec![3], "3 + 2 would pass 4, so the 3 goes");
        tokio::time::advance(Duration::from_micros(100)).await;
        for b in [1, 2] {
            h.push(request(b, 4, &[])).expect("queued");
        }
        tokio::time::advance(Duration::from_micros(100)).await;
        assert_eq!(h.batch_sizes(), vec![2, 1, 2], "the delay is up for the oldest: all 5 rows go");
    }

    #[tokio::test(start_paused = true)]
    async fn batches_are_numbered_in_the_order_they_form() {
        let mut h = Harness::new(config(&[], 0));
        let mut seqs = Vec::new();
        for _ in 0..3 {
            h.push(request(1, 4, &[])).expect("queued");
            seqs.push(h.queue.next_batch(Instant::now()).seq);
            assert!(h.queue.next_batch(Instant::now()).batch.is_empty(), "an empty step takes no number");
        }
        assert_eq!(seqs, vec![0, 1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn different_shapes_close_the_batch() {
        let mut h = Harness::new(config(&[], 0));
        h.push(request(1, 4, &[])).expect("queued");
        h.push(request(1, 4, &[])).expect("queued");
        h.push(request(1, 5, &[])).expect("queued");
        assert_eq!(h.batch_sizes(), vec![1, 1]);
        assert_eq!(h.batch_sizes(), vec![1]);
    }

    #[tokio::test(start_paused = true)]
    async fn ragged_inputs_batch_whatever_their_shapes() {
        let mut h = Harness::new(config(&[], 0));
        for width in [4, 5, 9] {
            let (tx, rx) = oneshot::channel();
            h.receivers.push(rx);
            let mut pending = Pending::new(request(1, width, &[]), Instant::now(), tx);
            pending.batch_regardless_of_shape(&[true]);
            h.queue.push(pending, "m", &mut h.dropped).expect("queued");
        }
        assert_eq!(h.batch_sizes(), vec![1, 1, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn higher_priority_goes_first() {
        let mut h = Harness::new(config(&[], 0));
        h.push(request(1, 4, &[])).expect("default level 2");
        h.push(request(2, 4, &[("priority", ParamValue::Int(1))])).expect("level 1");
        let step = h.queue.next_batch(Instant::now());
        assert_eq!(step.batch[0].items(), 2, "level 1 first");
    }

    #[tokio::test(start_paused = true)]
    async fn full_queue_rejects_at_once() {
        let mut c = config(&[], 0);
        c.policies[1].max_queue_size = 2;
        let mut h = Harness::new(c);
        h.push(request(1, 4, &[])).expect("1");
        h.push(request(1, 4, &[])).expect("2");
        let err = h.push(request(1, 4, &[])).expect_err("full");
        assert!(err.message.contains("Exceeds maximum queue size"));
        assert_eq!(crate::error::codes_for(err.kind).0.as_u16(), 503);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_lets_go_of_cancelled_requests_before_refusing() {
        let mut c = config(&[], 0);
        c.policies[1].max_queue_size = 2;
        let mut h = Harness::new(c);
        h.push(request(1, 4, &[])).expect("1");
        h.push(request(1, 4, &[])).expect("2");
        h.receivers.remove(0);
        h.push(request(1, 4, &[])).expect("the cancelled request's place is free");
        assert_eq!(h.dropped.len(), 1);
        assert!(matches!(h.dropped[0], Dropped::Cancelled(_)));
        assert_eq!(h.queue.len(), 2);
        h.push(request(1, 4, &[])).expect_err("full again");
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_reject_or_delay_by_policy() {
        let mut c = config(&[], 1_000_000);
        c.policies[1].default_timeout = Some(Duration::from_micros(100));
        c.policies[0].default_timeout = Some(Duration::from_micros(100));
        c.policies[0].on_timeout = OnTimeout::Delay;
        let mut h = Harness::new(c);
        h.push(request(1, 4, &[])).expect("level 2, REJECT");
        h.push(request(1, 4, &[("priority", ParamValue::Int(1))])).expect("level 1, DELAY");
        tokio::time::advance(Duration::from_micros(150)).await;
        h.push(request(1, 4, &[])).expect("fresh level 2");
        let step = h.queue.next_batch(Instant::now());
        assert_eq!(step.dropped.len(), 1);
        assert!(matches!(step.dropped[0], Dropped::TimedOut(_)));
        assert_eq!(h.queue.len(), 2, "the DELAY request stays, behind the fresh one");
        assert!(step.wake_at.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_requests_are_dropped_from_the_queue() {
        let mut h = Harness::new(config(&[], 0));
        h.push(request(1, 4, &[])).expect("queued");
        h.push(request(1, 4, &[])).expect("queued");
        h.receivers.remove(0);
        let step = h.queue.next_batch(Instant::now());
        assert_eq!(step.dropped.len(), 1);
        assert!(matches!(step.dropped[0], Dropped::Cancelled(_)));
        assert_eq!(step.batch.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn without_dynamic_batching_each_request_runs_alone() {
        let mut h = Harness::new(BatchingConfig::direct(QueuePolicy::default()));
        h.push(request(3, 4, &[])).expect("queued");
        h.push(request(1, 4, &[])).expect("queued");
        assert_eq!(h.batch_sizes(), vec![3]);
        assert_eq!(h.batch_sizes(), vec![1]);
    }
}
