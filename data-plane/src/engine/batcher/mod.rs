//! The dynamic batcher of one model version: requests queue in a [`queue::BatchQueue`]; one batcher task
//! forms batches when an instance is free; instances run them on dedicated OS threads, each
//! owning its ONNX Runtime session, and split the outputs back per request.

pub mod order;
pub mod policy;
pub mod queue;
mod timer;

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::engine::backend::onnx::OnnxSession;
use crate::engine::infer::ValidInferRequest;
use crate::engine::model_spec::ModelSpec;
use crate::engine::stats::{Execution, FailReason, ModelStats, nanos};
use crate::engine::tensor::{InputTensor, OutputTensor, row_offsets, slice_rows};
use crate::error::{Error, Result};
use crate::trace::{Event, Trace};
use order::{Delivery, Reorder, Ticket};
use policy::BatchingConfig;
use queue::{BatchQueue, Dropped, Pending};

/// State shared by handlers (push), the batcher task (pop) and metrics (length).
struct Shared {
    /// Handlers push under the lock; the batcher takes batches out.
    queue: Mutex<BatchQueue>,
    /// Handlers notify after a push; the batcher waits on it.
    notify: Notify,
    spec: Arc<ModelSpec>,
    stats: Arc<ModelStats>,
    /// Set with `preserve_ordering`: answers wait here for the batches formed before theirs.
    order: Option<Arc<Reorder>>,
}

impl Shared {
    /// The place in the order of the batch numbered `seq` (`None` without ordering).
    fn ticket(&self, seq: u64) -> Option<Ticket> {
        self.order.as_ref().map(|o| o.ticket(seq))
    }
}

/// A batch on its way to an instance, holding that instance's permit.
struct Dispatch {
    batch: Vec<Pending>,
    /// Its place in the order of answers, with `preserve_ordering`.
    ticket: Option<Ticket>,
    /// Returned to the batcher when the run ends, so the next batch forms only then.
    _permit: OwnedSemaphorePermit,
}

/// Handle to a model version's batcher; dropping it stops the batcher task and the instances.
pub struct Batcher {
    shared: Arc<Shared>,
    /// One permit per instance; held from dispatch until the run ends.
    permits: Arc<Semaphore>,
    /// To the instance threads (fast path); the batcher holds the other sender.
    batches: crossbeam_channel::Sender<Dispatch>,
    /// Whether a request may skip the queue when an instance is idle.
    fast_path: bool,
    /// The instances' sessions; instance thread `i` locks `sessions[i]` per batch, and the
    /// inline path borrows an idle one.
    sessions: Arc<Vec<Mutex<OnnxSession>>>,
    _stop: DropGuard,
}

/// A lone request may run on the calling task itself when the model's executions average less
/// than this: blocking an async worker for it costs less than two thread hand-offs, and stays
/// far under the half-millisecond an async task may block. "Lone": the instance is idle, the
/// queue empty, and (in a runner) no other request received.
const INLINE_LIMIT_NS: u64 = 150_000;
/// Executions to observe before trusting the average.
const INLINE_WARMUP: u64 = 8;

impl Batcher {
    /// Starts the batcher task and one thread per session. Needs a Tokio runtime.
    pub fn start(
        spec: Arc<ModelSpec>,
        sessions: Vec<OnnxSession>,
        stats: Arc<ModelStats>,
        config: BatchingConfig,
        label: &str,
    ) -> Result<Self, String> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| format!("no async runtime: {e}"))?;
        let order = config.preserve_ordering.then(|| Arc::new(Reorder::default()));
        let shared = Arc::new(Shared {
            queue: Mutex::new(BatchQueue::new(config)),
            notify: Notify::new(),
            spec: spec.clone(),
            stats: stats.clone(),
            order,
        });
        let permits = Arc::new(Semaphore::new(sessions.len()));
        let sessions: Arc<Vec<Mutex<OnnxSession>>> = Arc::new(sessions.into_iter().map(Mutex::new).collect());
        // Bounded by the permits: at most one batch per instance is ever in the channel.
        let (batches, receiver) = crossbeam_channel::unbounded::<Dispatch>();
        for i in 0..sessions.len() {
            let (shared, receiver, sessions) = (shared.clone(), receiver.clone(), sessions.clone());
            std::thread::Builder::new()
                .name(format!("{label}-{i}"))
                .spawn(move || run_instance(&sessions[i], &shared, &receiver))
                .map_err(|e| format!("failed to start an instance thread: {e}"))?;
        }
        let fast_path = config_allows_fast_path(&shared.queue.lock());
        let stop = CancellationToken::new();
        runtime.spawn(batcher_task(shared.clone(), permits.clone(), batches.clone(), stop.clone()));
        Ok(Self { shared, permits, batches, fast_path, sessions, _stop: stop.drop_guard() })
    }

    /// Queues a checked request that reached the model at `arrived` and waits for its outputs.
    /// Success statistics are recorded by the instance when the response is ready (as Triton
    /// times it), not when this task wakes to pick it up.
    pub async fn submit(&self, request: ValidInferRequest, arrived: Instant) -> Result<Vec<OutputTensor>> {
        let _in_flight = crate::engine::in_flight::InFlight::start();
        let (reply, mut outputs) = oneshot::channel();
        let mut pending = Pending::new(request, Instant::now(), reply);
        pending.arrived = arrived;
        pending.span = crate::spans::current();
        if let Some(ragged) = &self.shared.spec.ragged {
            pending.batch_regardless_of_shape(&ragged.ragged);
        }
        let Some(pending) = self.try_run_now(pending) else {
            return wait(&mut outputs, &self.shared.spec.name).await;
        };
        let mut dropped = Vec::new();
        let pushed = self.shared.queue.lock().push(pending, &self.shared.spec.name, &mut dropped);
        for d in dropped {
            drop_request(&self.shared, d);
        }
        if let Err(e) = pushed {
            self.shared.stats.record_failure_reason(FailReason::Rejected);
            return Err(e);
        }
        let waiting = Waiting { outputs, shared: &self.shared, answered: false };
        self.shared.notify.notify_one();
        waiting.answer().await
    }

    /// The fast path: with nothing queued, a free instance and no reason to wait (no batching
    /// delay, no priorities, no timeouts), hand the request straight to the instance, skipping
    /// the batcher hop. The batcher would have dispatched it the same way, only later.
    /// Returns the request when it must take the queue path instead.
    fn try_run_now(&self, pending: Pending) -> Option<Pending> {
        let request = &pending.request;
        if !self.fast_path || request.priority != 0 || request.timeout_us != 0 {
            return Some(pending);
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else { return Some(pending) };
        if !self.shared.queue.lock().is_empty() {
            return Some(pending);
        }
        // In a runner the calling task is on its only async thread: running there while other
        // requests wait would serialize their reading and answering with this execution, so
        // with others behind it the request goes to the instance thread and the two overlap.
        if self.runs_fast() && !crate::engine::in_flight::others_received() {
            // A free permit means some instance is idle; its session is unlocked or about to be.
            if let Some(mut session) = self.sessions.iter().find_map(|s| s.try_lock()) {
                run_batch(&mut session, &self.shared, vec![pending], None);
                drop(permit);
                return None;
            }
        }
        match self.batches.send(Dispatch { batch: vec![pending], ticket: None, _permit: permit }) {
            Ok(()) => None,
            // Instances are gone (unloading): hand the request back to the queue path.
            Err(crossbeam_channel::SendError(d)) => d.batch.into_iter().next(),
        }
    }

    /// Whether this model's executions are short enough to run inline.
    fn runs_fast(&self) -> bool {
        let (count, ns) = self.shared.stats.mean_execution();
        count >= INLINE_WARMUP && ns / count.max(1) < INLINE_LIMIT_NS
    }

    /// Requests waiting in the queue.
    pub fn pending(&self) -> usize {
        self.shared.queue.lock().len()
    }
}

/// A queued request's wait for its answer. A client that leaves drops this; the batcher is then
/// told at once, so the request leaves the queue (and the pending count) now rather than when the
/// batcher next looks, which with a long batching delay could be much later.
struct Waiting<'a> {
    outputs: Answer,
    shared: &'a Shared,
    answered: bool,
}

impl Waiting<'_> {
    async fn answer(mut self) -> Result<Vec<OutputTensor>> {
        let answer = wait(&mut self.outputs, &self.shared.spec.name).await;
        self.answered = true;
        answer
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.answered {
            // Closed before the notify, so the batcher finds the request cancelled.
            self.outputs.close();
            self.shared.notify.notify_one();
        }
    }
}

/// The answer to a request handed to the batcher.
async fn wait(outputs: &mut Answer, model: &str) -> Result<Vec<OutputTensor>> {
    outputs.await.map_err(|_| Error::unavailable(format!("model '{model}' stopped before answering")))?
}

/// Where a request's outputs arrive.
type Answer = oneshot::Receiver<Result<Vec<OutputTensor>>>;

/// Forms batches: waits until something is queued, then for a free instance, then for the
/// queue policy to say go, so a batch forms as late (and as full) as the policy allows.
async fn batcher_task(
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    batches: crossbeam_channel::Sender<Dispatch>,
    stop: CancellationToken,
) {
    loop {
        while shared.queue.lock().is_empty() {
            tokio::select! {
                () = shared.notify.notified() => {}
                () = stop.cancelled() => return,
            }
        }
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            () = stop.cancelled() => return,
        };
        let mut permit = Some(permit);
        while let Some(held) = permit.take() {
            let step = shared.queue.lock().next_batch(Instant::now());
            for dropped in step.dropped {
                drop_request(&shared, dropped);
            }
            if !step.batch.is_empty() {
                let ticket = shared.ticket(step.seq);
                if batches.send(Dispatch { batch: step.batch, ticket, _permit: held }).is_err() {
                    return;
                }
                break;
            }
            if step.wake_at.is_none() {
                break; // queue emptied (all cancelled or timed out): give the instance back
            }
            permit = Some(held);
            let wake = async {
                match step.wake_at {
                    Some(at) => timer::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shared.notify.notified() => {}
                () = wake => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

/// Skipping the queue is only invisible when the policy would send a lone request at once (with
/// no delay it does, preferred sizes or not) and no answer order has to be kept.
fn config_allows_fast_path(queue: &BatchQueue) -> bool {
    let c = queue.config();
    let no_timeouts = c.policies.iter().all(|p| p.default_timeout.is_none());
    c.max_queue_delay.is_zero() && c.priority_levels == 1 && no_timeouts && !c.preserve_ordering
}

fn drop_request(shared: &Shared, dropped: Dropped) {
    match dropped {
        Dropped::TimedOut(p) => {
            shared.stats.record_failure_reason(FailReason::Rejected);
            // The client may be gone already; nothing to do then.
            let _ = p.reply.send(Err(Error::unavailable("Request timeout expired")));
        }
        Dropped::Cancelled(p) => {
            // Nobody waits for an answer to record this failure, so it is recorded here.
            shared.stats.record_failure_reason(FailReason::Canceled);
            shared.stats.fail.record(nanos(p.arrived.elapsed()));
        }
    }
}

/// An instance thread: runs dispatched batches until the batcher stops. After each run it
/// keeps its permit and takes the next batch straight from the queue when the policy says go
/// now (Triton's "when an instance frees up, form a batch"), so a busy instance never idles
/// waiting for the batcher task; when the policy says wait, the batcher takes over.
fn run_instance(session: &Mutex<OnnxSession>, shared: &Shared, batches: &crossbeam_channel::Receiver<Dispatch>) {
    crate::engine::priority::apply_to_instance_thread();
    while let Ok(dispatch) = batches.recv() {
        let Dispatch { mut batch, mut ticket, _permit } = dispatch;
        loop {
            run_batch(&mut session.lock(), shared, batch, ticket);
            let step = shared.queue.lock().next_batch(Instant::now());
            for dropped in step.dropped {
                drop_request(shared, dropped);
            }
            if step.batch.is_empty() {
                break;
            }
            ticket = shared.ticket(step.seq);
            batch = step.batch;
        }
    }
}

/// Runs one batch on `session`, records its statistics and answers every request in it (in its
/// turn, when the batch has a ticket).
fn run_batch(session: &mut OnnxSession, shared: &Shared, batch: Vec<Pending>, ticket: Option<Ticket>) {
    let (spec, stats) = (&*shared.spec, &*shared.stats);
    let items: usize = batch.iter().map(|p| p.request.batch_size).sum();
    let span = crate::spans::batch(&spec.name, batch.len(), items, batch.iter().map(|p| &p.span));
    let _entered = span.enter();
    let start = Instant::now();
    match execute(session, spec, &batch, start) {
        Ok((per_request, mut timings)) => {
            // Compute covers the whole execution, as in Triton: gathering the batch's inputs
            // before the run counts as compute input, splitting outputs per request after it
            // as compute output (not as unaccounted overhead).
            let elapsed = nanos(start.elapsed());
            timings.output_ns = elapsed.saturating_sub(timings.input_ns + timings.infer_ns);
            stats.record_execution(Execution {
                batch_size: items as u64,
                input_ns: timings.input_ns,
                infer_ns: timings.infer_ns,
                output_ns: timings.output_ns,
            });
            // Every response of the batch is complete now: record them all, then reply, so no
            // request's duration includes waking the clients ahead of it.
            let done = Instant::now();
            for (pending, outputs) in batch.iter().zip(&per_request) {
                if pending.request.trace.is_on() {
                    stamp_run(&pending.request.trace, pending.enqueued, start, &timings, done);
                }
                stats.queue.record(nanos(start - pending.enqueued));
                stats.compute_input.record(timings.input_ns);
                stats.compute_infer.record(timings.infer_ns);
                stats.compute_output.record(timings.output_ns);
                if outputs.is_ok() {
                    let ns = nanos(done - pending.arrived);
                    stats.success.record(ns);
                    stats.latency_us.observe(ns / 1_000);
                }
            }
            deliver(ticket, batch.into_iter().map(|p| p.reply).zip(per_request));
        }
        Err(e) => {
            tracing::warn!(model = %spec.name, error = %e.message, requests = batch.len(), "execution failed");
            for _ in &batch {
                stats.record_failure_reason(FailReason::Backend);
            }
            deliver(ticket, batch.into_iter().map(|p| (p.reply, Err(e.clone()))));
        }
    }
}

/// Stamps a traced request's queue and compute steps from the times its batch measured anyway
/// (the dynamic batcher's and the sequence batcher's).
pub(crate) fn stamp_run(
    trace: &Trace,
    enqueued: Instant,
    start: Instant,
    timings: &crate::engine::backend::onnx::RunTimings,
    done: Instant,
) {
    let start = start.into_std();
    let input_end = start + std::time::Duration::from_nanos(timings.input_ns);
    trace.stamp_at(Event::QueueStart, enqueued.into_std());
    trace.stamp_at(Event::ComputeStart, start);
    trace.stamp_at(Event::ComputeInputEnd, input_end);
    trace.stamp_at(Event::ComputeOutputStart, input_end + std::time::Duration::from_nanos(timings.infer_ns));
    trace.stamp_at(Event::ComputeEnd, done.into_std());
}

/// Sends a batch's answers: now, or in the batch's turn when it has a ticket.
fn deliver(ticket: Option<Ticket>, answers: impl Iterator<Item = Delivery>) {
    match ticket {
        Some(ticket) => ticket.answer(answers.collect()),
        None => {
            for (reply, answer) in answers {
                // A closed receiver means the client left mid-run; nothing to do then.
                let _ = reply.send(answer);
            }
        }
    }
}

/// Outputs per request, in each request's order.
type PerRequest = Vec<Result<Vec<OutputTensor>>>;

/// Runs one batch: gathers inputs along dim 0 (one copy, into the ORT tensor), runs, and splits
/// outputs back per request by slicing the shared output buffers.
fn execute(
    session: &mut OnnxSession,
    spec: &ModelSpec,
    batch: &[Pending],
    start: Instant,
) -> Result<(PerRequest, crate::engine::backend::onnx::RunTimings)> {
    let parts: Vec<Vec<&InputTensor>> =
        (0..spec.inputs.len()).map(|i| batch.iter().filter_map(|p| p.request.inputs[i].as_ref()).collect()).collect();
    let mut wanted: Vec<usize> = batch.iter().flat_map(|p| p.request.outputs.iter().copied()).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let rows: usize = batch.iter().map(|p| p.request.batch_size).sum();
    let run_start = Instant::now();
    let (outputs, mut timings) = session.run(spec, &parts, rows, &wanted)?;
    timings.input_ns += nanos(run_start - start);
    if let Some(ragged) = &spec.ragged {
        let requests: Vec<&ValidInferRequest> = batch.iter().map(|p| &p.request).collect();
        let split = crate::engine::ragged::split(ragged, &requests, &outputs, &wanted)?;
        return Ok((split.into_iter().map(Ok).collect(), timings));
    }
    if batch.len() == 1 {
        let only = &batch[0].request.outputs;
        let pick = only.iter().filter_map(|o| wanted.iter().position(|w| w == o).map(|i| outputs[i].clone())).collect();
        return Ok((vec![Ok(pick)], timings));
    }
    let offsets: Vec<Vec<usize>> = outputs.iter().map(|o| row_offsets(o, rows)).collect::<Result<_>>()?;
    let mut start = 0;
    let mut per_request = Vec::with_capacity(batch.len());
    for pending in batch {
        let n = pending.request.batch_size;
        let mine = pending
            .request
            .outputs
            .iter()
            .filter_map(|o| wanted.iter().position(|w| w == o))
            .map(|i| slice_rows(&outputs[i], &offsets[i], start, n))
            .collect();
        per_request.push(Ok(mine));
        start += n;
    }
    Ok((per_request, timings))
}
