//! The sequence batcher's bookkeeping, free of channels and threads so tests drive it with
//! made-up times: which sequences hold a slot (direct) or are candidates (oldest), which wait in
//! the backlog, each sequence's queued requests and implicit state, which requests form the next
//! batch, and which idle sequences are released.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::config::{SequenceConfig, Strategy};

/// A correlation id: a number or a string, as the client sent it (Triton's `sequence_id`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SeqId {
    /// A non-zero unsigned id.
    Num(u64),
    /// A non-empty string id.
    Str(String),
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SeqId::Num(n) => write!(f, "{n}"),
            SeqId::Str(s) => f.write_str(s),
        }
    }
}

/// One request of a sequence, waiting in its sequence's queue.
#[derive(Debug)]
pub struct Item<T> {
    /// What the caller hands through (the request and where its answer goes).
    pub payload: T,
    /// The request starts the sequence (its state restarts).
    pub start: bool,
    /// The request ends the sequence (it is released once the request ran).
    pub end: bool,
    /// When it was queued.
    pub enqueued: Instant,
}

/// One row of a batch: a sequence's oldest request and the state it runs with.
#[derive(Debug)]
pub struct Row<T> {
    /// The sequence.
    pub id: SeqId,
    /// The request.
    pub item: Item<T>,
    /// The implicit state tensors' bytes, one per state in config order.
    pub state: Vec<Vec<u8>>,
}

/// What [`Sequences::next_batch`] decided.
#[derive(Debug)]
pub struct Step<T> {
    /// Rows to run now (empty: none).
    pub batch: Vec<Row<T>>,
    /// When to look again: a batching delay ends or an idle sequence times out.
    pub wake_at: Option<Instant>,
    /// Sequences released for idling.
    pub expired: Vec<SeqId>,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not a START, and the sequence is unknown (never started, ended or idled out).
    NeedsStart,
    /// Too many requests are queued.
    QueueFull,
}

/// A live sequence.
#[derive(Debug)]
struct Sequence<T> {
    queue: VecDeque<Item<T>>,
    /// One of its requests is running; the next waits for the state it produces.
    in_flight: bool,
    /// Holds a slot (direct) or is a candidate (oldest); else it waits in the backlog.
    active: bool,
    /// Its last queued request has END: only a new START may follow.
    ending: bool,
    /// The last time a request of it arrived or finished, for the idle timeout.
    last_active: Instant,
    state: Vec<Vec<u8>>,
}

/// All sequences of one model version.
#[derive(Debug)]
pub struct Sequences<T> {
    config: SequenceConfig,
    seqs: HashMap<SeqId, Sequence<T>>,
    active: usize,
    /// Sequences waiting for a slot, oldest first.
    backlog: VecDeque<SeqId>,
    queued: usize,
    max_queued: usize,
}

impl<T> Sequences<T> {
    /// No sequences yet; at most `max_queued` requests may wait.
    pub fn new(config: SequenceConfig, max_queued: usize) -> Self {
        Self { config, seqs: HashMap::new(), active: 0, backlog: VecDeque::new(), queued: 0, max_queued }
    }

    /// Requests waiting (queued, not running).
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Live sequences (holding a slot or in the backlog).
    pub fn live(&self) -> usize {
        self.seqs.len()
    }

    /// Queues a request of sequence `id`. A START for an unknown id opens the sequence (in a slot
    /// when one is free, else in the backlog); any other request needs a live sequence.
    pub fn admit(&mut self, id: SeqId, item: Item<T>) -> Result<(), Refusal> {
        if self.queued >= self.max_queued {
            return Err(Refusal::QueueFull);
        }
        let (start, end, now) = (item.start, item.end, item.enqueued);
        match self.seqs.get_mut(&id) {
            Some(seq) if start || !seq.ending => {
                seq.ending = end;
                seq.last_active = now;
                seq.queue.push_back(item);
            }
            Some(_) => return Err(Refusal::NeedsStart),
            None if !start => return Err(Refusal::NeedsStart),
            None => {
                let active = self.active < self.config.capacity;
                if active {
                    self.active += 1;
                } else {
                    self.backlog.push_back(id.clone());
                }
                let seq = Sequence {
                    queue: VecDeque::from([item]),
                    in_flight: false,
                    active,
                    ending: end,
                    last_active: now,
                    state: self.initial_state(),
                };
                self.seqs.insert(id, seq);
            }
        }
        self.queued += 1;
        Ok(())
    }

    fn initial_state(&self) -> Vec<Vec<u8>> {
        self.config.states.iter().map(|s| s.initial.clone()).collect()
    }

    /// Releases idle sequences, then forms the next batch when `may_run` (an instance is free)
    /// and the strategy says go.
    pub fn next_batch(&mut self, now: Instant, may_run: bool) -> Step<T> {
        let expired = self.reap(now);
        let mut ready: Vec<(Instant, SeqId)> = self
            .seqs
            .iter()
            .filter(|(_, s)| s.active && !s.in_flight)
            .filter_map(|(id, s)| s.queue.front().map(|i| (i.enqueued, id.clone())))
            .collect();
        ready.sort_by_key(|(at, _)| *at);
        let (size, batch_wake) = if may_run { self.batch_size(&ready, now) } else { (0, None) };
        let batch = ready.into_iter().take(size).filter_map(|(_, id)| self.take(id)).collect();
        let wake_at = [batch_wake, self.idle_deadline()].into_iter().flatten().min();
        Step { batch, wake_at, expired }
    }

    /// How many of the `ready` sequences to run now, or when to decide again.
    fn batch_size(&self, ready: &[(Instant, SeqId)], now: Instant) -> (usize, Option<Instant>) {
        let Some((oldest, _)) = ready.first() else { return (0, None) };
        let n = ready.len().min(self.config.max_batch);
        let (delay, full) = match &self.config.strategy {
            Strategy::Direct { max_queue_delay, minimum_slot_utilization } => {
                let utilized = *minimum_slot_utilization > 0.0
                    && n as f32 >= minimum_slot_utilization * self.config.capacity.min(self.config.max_batch) as f32;
                (*max_queue_delay, n == self.config.max_batch || utilized)
            }
            Strategy::Oldest { preferred, max_queue_delay } => {
                (*max_queue_delay, n == self.config.max_batch || preferred.last().is_some_and(|p| n >= *p))
            }
        };
        let deadline = *oldest + delay;
        if !(full || delay.is_zero() || now >= deadline) {
            return (0, Some(deadline));
        }
        let size = match &self.config.strategy {
            Strategy::Oldest { preferred, .. } => preferred.iter().rev().find(|p| **p <= n).copied().unwrap_or(n),
            Strategy::Direct { .. } => n,
        };
        (size, None)
    }

    /// Takes sequence `id`'s oldest request to run, with the state it runs with.
    fn take(&mut self, id: SeqId) -> Option<Row<T>> {
        let initial = self.initial_state();
        let seq = self.seqs.get_mut(&id)?;
        let item = seq.queue.pop_front()?;
        self.queued -= 1;
        seq.in_flight = true;
        if item.start {
            seq.state = initial;
        }
        let state = seq.state.clone();
        Some(Row { id, item, state })
    }

    /// A request of `id` finished at `now`: keeps the state it produced (`None` when it failed:
    /// the state stays as it was), and releases the sequence after its END.
    pub fn complete(&mut self, id: &SeqId, ended: bool, state: Option<Vec<Vec<u8>>>, now: Instant) {
        let Some(seq) = self.seqs.get_mut(id) else { return };
        seq.in_flight = false;
        seq.last_active = now;
        if let Some(state) = state {
            seq.state = state;
        }
        if ended && seq.queue.is_empty() {
            self.release(id);
        }
    }

    /// Drops sequence `id`, freeing its slot for the oldest sequence in the backlog.
    fn release(&mut self, id: &SeqId) {
        let Some(seq) = self.seqs.remove(id) else { return };
        self.queued -= seq.queue.len();
        if !seq.active {
            self.backlog.retain(|b| b != id);
            return;
        }
        self.active -= 1;
        while let Some(next) = self.backlog.pop_front() {
            if let Some(s) = self.seqs.get_mut(&next) {
                s.active = true;
                self.active += 1;
                break;
            }
        }
    }

    /// Releases sequences that had nothing queued or running for the idle timeout.
    fn reap(&mut self, now: Instant) -> Vec<SeqId> {
        let idle = self.config.idle;
        let expired: Vec<SeqId> = self
            .seqs
            .iter()
            .filter(|(_, s)| is_idle(s) && now.saturating_duration_since(s.last_active) >= idle)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.release(id);
        }
        expired
    }

    /// When the next idle sequence times out.
    fn idle_deadline(&self) -> Option<Instant> {
        self.seqs.values().filter(|s| is_idle(s)).map(|s| s.last_active + self.config.idle).min()
    }

    /// The idle timeout (for tests and logs).
    pub fn idle_timeout(&self) -> Duration {
        self.config.idle
    }
}

fn is_idle<T>(s: &Sequence<T>) -> bool {
    !s.in_flight && s.queue.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sequence::config::StateSpec;
    use tessera_protocol::DataType;

    fn config(strategy: Strategy, capacity: usize, max_batch: usize) -> SequenceConfig {
        SequenceConfig {
            strategy,
            capacity,
            max_batch,
            idle: Duration::from_millis(100),
            controls: Vec::new(),
            states: vec![StateSpec {
                input_name: "S_IN".into(),
                output_name: "S_OUT".into(),
                datatype: DataType::Int32,
                dims: vec![1],
                initial: vec![0; 4],
            }],
        }
    }

    fn direct(capacity: usize, max_batch: usize) -> Sequences<u32> {
        let strategy = Strategy::Direct { max_queue_delay: Duration::ZERO, minimum_slot_utilization: 0.0 };
        Sequences::new(config(strategy, capacity, max_batch), 100)
    }

    fn item(payload: u32, start: bool, end: bool, at: Instant) -> Item<u32> {
        Item { payload, start, end, enqueued: at }
    }

    fn payloads(step: &Step<u32>) -> Vec<u32> {
        step.batch.iter().map(|r| r.item.payload).collect()
    }

    #[test]
    fn a_sequence_runs_one_request_at_a_time_and_carries_its_state() {
        let t0 = Instant::now();
        let mut s = direct(4, 4);
        let id = SeqId::Num(7);
        s.admit(id.clone(), item(1, true, false, t0)).expect("start");
        s.admit(id.clone(), item(2, false, false, t0)).expect("next");
        let step = s.next_batch(t0, true);
        assert_eq!(payloads(&step), vec![1]);
        assert_eq!(step.batch[0].state, vec![vec![0u8; 4]], "a START begins with the initial state");
        assert!(s.next_batch(t0, true).batch.is_empty(), "the second waits for the first's state");
        s.complete(&id, false, Some(vec![vec![5, 0, 0, 0]]), t0);
        let step = s.next_batch(t0, true);
        assert_eq!(step.batch[0].state, vec![vec![5u8, 0, 0, 0]], "the state produced feeds the next request");
    }

    #[test]
    fn unknown_ended_and_idle_sequences_need_a_start() {
        let t0 = Instant::now();
        let mut s = direct(4, 4);
        assert_eq!(s.admit(SeqId::Str("a".into()), item(1, false, false, t0)), Err(Refusal::NeedsStart));
        let id = SeqId::Num(1);
        s.admit(id.clone(), item(1, true, true, t0)).expect("a one-request sequence");
        assert_eq!(s.admit(id.clone(), item(2, false, false, t0)), Err(Refusal::NeedsStart), "END was queued");
        let step = s.next_batch(t0, true);
        s.complete(&step.batch[0].id, true, None, t0);
        assert_eq!(s.live(), 0, "released after its END ran");
        s.admit(id.clone(), item(3, true, false, t0)).expect("restart");
        let step = s.next_batch(t0, true);
        s.complete(&id, false, None, t0);
        assert_eq!(step.wake_at, None);
        let step = s.next_batch(t0 + Duration::from_millis(50), true);
        assert_eq!(step.wake_at, Some(t0 + Duration::from_millis(100)), "wakes to reap it");
        let step = s.next_batch(t0 + Duration::from_millis(100), true);
        assert_eq!(step.expired, vec![id.clone()]);
        assert_eq!(s.admit(id, item(4, false, false, t0)), Err(Refusal::NeedsStart));
    }

    #[test]
    fn direct_batches_one_request_per_slot_and_backlogs_the_rest() {
        let t0 = Instant::now();
        let mut s = direct(2, 2);
        for (n, id) in [1, 2, 3].into_iter().enumerate() {
            s.admit(SeqId::Num(id), item(id as u32, true, false, t0 + Duration::from_micros(n as u64))).expect("start");
        }
        s.admit(SeqId::Num(1), item(11, false, true, t0)).expect("second of 1");
        let step = s.next_batch(t0, true);
        assert_eq!(payloads(&step), vec![1, 2], "two slots; sequence 3 waits in the backlog");
        assert!(s.next_batch(t0, false).batch.is_empty(), "nothing runs without a free instance");
        assert_eq!(s.queued(), 2);
        s.complete(&SeqId::Num(1), false, None, t0);
        s.complete(&SeqId::Num(2), true, None, t0);
        let step = s.next_batch(t0, true);
        assert_eq!(payloads(&step), vec![11, 3], "2 ended: 3 took its slot");
    }

    #[test]
    fn direct_waits_for_more_slots_up_to_its_delay_or_utilization() {
        let t0 = Instant::now();
        let strategy = Strategy::Direct { max_queue_delay: Duration::from_millis(10), minimum_slot_utilization: 0.5 };
        let mut s = Sequences::new(config(strategy, 4, 4), 100);
        s.admit(SeqId::Num(1), item(1, true, false, t0)).expect("start");
        let step = s.next_batch(t0, true);
        assert!(step.batch.is_empty());
        assert_eq!(step.wake_at, Some(t0 + Duration::from_millis(10)));
        s.admit(SeqId::Num(2), item(2, true, false, t0)).expect("start");
        assert_eq!(payloads(&s.next_batch(t0, true)).len(), 2, "half the slots have a request");
        s.admit(SeqId::Num(3), item(3, true, false, t0)).expect("start");
        assert_eq!(payloads(&s.next_batch(t0 + Duration::from_millis(10), true)), vec![3], "the delay ran out");
    }

    #[test]
    fn oldest_takes_the_oldest_requests_up_to_a_preferred_size() {
        let t0 = Instant::now();
        let strategy = Strategy::Oldest { preferred: vec![2], max_queue_delay: Duration::from_millis(5) };
        let mut s = Sequences::new(config(strategy, 8, 4), 100);
        for id in [5u64, 4, 3] {
            let at = t0 + Duration::from_micros(10 - id);
            s.admit(SeqId::Num(id), item(id as u32, true, false, at)).expect("start");
        }
        assert_eq!(payloads(&s.next_batch(t0 + Duration::from_micros(10), true)), vec![5, 4], "oldest two");
        let step = s.next_batch(t0 + Duration::from_micros(10), true);
        assert!(step.batch.is_empty(), "one left waits for company");
        assert_eq!(s.next_batch(t0 + Duration::from_millis(6), true).batch.len(), 1);
    }

    #[test]
    fn a_full_queue_is_refused() {
        let t0 = Instant::now();
        let strategy = Strategy::Direct { max_queue_delay: Duration::ZERO, minimum_slot_utilization: 0.0 };
        let mut s = Sequences::new(config(strategy, 1, 1), 2);
        s.admit(SeqId::Num(1), item(1, true, false, t0)).expect("one");
        s.admit(SeqId::Num(1), item(2, false, false, t0)).expect("two");
        assert_eq!(s.admit(SeqId::Num(1), item(3, false, false, t0)), Err(Refusal::QueueFull));
    }
}
