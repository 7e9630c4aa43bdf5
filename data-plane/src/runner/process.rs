//! Inside the runner process: reads the front's calls from the inherited socket, loads model
//! versions into the engine, runs requests on their batchers and writes the answers back.
//!
//! The runner trusts its front (the worker that spawned it) and nothing else; it exits when
//! the socket closes, so it never outlives its worker.

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::net::UnixStream;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::conn::read_some;
use super::device::{RunnerSliceKind, device_from_args};
use super::outbox::Outbox;
use super::shm::RunnerShm;
use super::wire::{FromRunner, InferCall, LoadCall, ToRunner, WireError, split_frame};
use crate::engine::device::{Device, ExecutionTarget, available_cores};
use crate::engine::load_error::LoadError;
use crate::engine::model::LoadedModel;
use crate::engine::stats::Tally;
use crate::error::Error;
use crate::trace::Event;

/// The file descriptor a runner finds its socket on (the front places it there).
pub const SOCKET_FD: RawFd = 3;

/// `tessera runner` flags: which tenant and slice this process serves (so `ps` shows it).
#[derive(Debug, Clone, clap::Args)]
pub struct RunnerArgs {
    /// The tenant whose models this runner hosts.
    #[arg(long)]
    pub tenant: String,
    /// The slice it runs on.
    #[arg(long)]
    pub slice: String,
    /// The inherited socket to the worker.
    #[arg(long, default_value_t = SOCKET_FD)]
    pub fd: RawFd,
    /// Microseconds the runner's idle thread polls its socket before it sleeps (the worker's
    /// `--busy-poll-us`); 0 turns it off.
    #[arg(long, default_value_t = 0)]
    pub busy_poll_us: u64,
    /// Nice value of model instance threads (the worker's `--instance-nice`).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub instance_nice: i32,
    /// The inherited shared-memory arenas for large tensors: requests (read-only) and
    /// responses, as two descriptors `REQUEST,RESPONSE`; without them every tensor goes
    /// through the socket.
    #[arg(long, value_delimiter = ',')]
    pub shm_fds: Vec<RawFd>,
    /// What the slice is (the front sets it): `cpu` (no GPU), `gpu` or `mig` (the slice's
    /// device, the only one `CUDA_VISIBLE_DEVICES` shows, as CUDA device 0); absent: every
    /// device the process sees (`tessera serve`).
    #[arg(long, value_enum)]
    pub slice_kind: Option<RunnerSliceKind>,
    /// GPU memory the runner's ONNX Runtime arenas may hold, all of a version's GPU instances
    /// together (GPU and MIG slices).
    #[arg(long)]
    pub gpu_memory_limit_bytes: Option<u64>,
}

/// How often statistics no answer carried are sent to the front.
const STATS_EVERY: std::time::Duration = std::time::Duration::from_millis(25);
/// Ticks with nothing to send and no request received or held after which the statistics
/// task sleeps until the next request: an idle runner's thread is not woken 40 times a second
/// (each wake-up followed by a busy-poll window), and tensors dropped just after their answer
/// still have two ticks to be reported released.
const IDLE_TICKS: u32 = 2;

/// A loaded version and the statistics already reported to the front.
struct Hosted {
    model: LoadedModel,
    /// Taken with every answer so the deltas the front adds sum to exactly what was counted.
    reported: Mutex<Tally>,
}

impl Hosted {
    fn delta(&self) -> Tally {
        let mut reported = self.reported.lock();
        let now = self.model.stats.tally();
        let delta = now.since(&reported);
        *reported = now;
        delta
    }
}

/// What the runner holds: versions by (key, version), and the requests still running.
#[derive(Default)]
struct State {
    models: Mutex<HashMap<(String, i64), Arc<Hosted>>>,
    /// Running inferences by call id, so a cancel can drop one.
    running: Mutex<HashMap<u64, AbortHandle>>,
    /// The arenas large tensors cross in.
    shm: Option<RunnerShm>,
    /// The device this runner's slice is, for every load.
    device: Device,
    /// The statistics task sleeps until [`Self::wake_stats`] (no request held, nothing to send).
    stats_idle: AtomicBool,
    /// A request was received since the statistics task last looked. Requests run inline
    /// leave no count behind them, so the count alone would call a loaded runner idle.
    received_since_tick: AtomicBool,
    /// Wakes the sleeping statistics task when a request is received.
    wake_stats: Notify,
}

impl State {
    /// Writes an answer frame (under the outbox's lock, so outputs take the response arena in
    /// frame order); false when the front is gone.
    fn send(&self, outbox: &Outbox, id: u64, answer: &FromRunner) -> bool {
        outbox.send(|b| answer.encode(id, b, self.shm.as_ref()))
    }

    /// Counts a request received, waking the statistics task if it sleeps.
    fn received(&self) -> crate::engine::in_flight::Received {
        let received = crate::engine::in_flight::Received::start();
        self.received_since_tick.store(true, Ordering::Relaxed);
        if self.stats_idle.load(Ordering::SeqCst) {
            self.wake_stats.notify_one();
        }
        received
    }
}

/// Runs the runner until the front closes its socket.
pub async fn run(args: RunnerArgs) -> anyhow::Result<()> {
    crate::engine::backend::runtime::environment().map_err(anyhow::Error::msg)?;
    let device =
        device_from_args(&args.slice, args.slice_kind, args.gpu_memory_limit_bytes).map_err(anyhow::Error::msg)?;
    crate::engine::priority::set_instance_nice(args.instance_nice);
    crate::serve::net::busy_poll::enable(std::time::Duration::from_micros(args.busy_poll_us));
    // SAFETY: the front placed a connected Unix socket at this descriptor for this process
    // alone (it is not used anywhere else in this process).
    let fd = unsafe { OwnedFd::from_raw_fd(args.fd) };
    let std_stream = std::os::unix::net::UnixStream::from(fd);
    std_stream.set_nonblocking(true).context("make the runner socket non-blocking")?;
    let stream = UnixStream::from_std(std_stream).context("register the runner socket")?;
    // The next request is picked up without a wake-up when it comes within the window.
    crate::serve::net::busy_poll::watch(&stream);
    let stream = Arc::new(stream);
    let shm = match args.shm_fds[..] {
        [] => None,
        [request, response] => Some(super::shm::adopt(request, response).context("map the shared-memory arenas")?),
        _ => anyhow::bail!("--shm-fds takes two descriptors, REQUEST,RESPONSE"),
    };
    tracing::info!(tenant = %args.tenant, slice = %args.slice, pid = std::process::id(), shared_memory = shm.is_some(), ?device, "runner started");
    let outbox = Outbox::new(stream.clone());
    tokio::spawn(outbox.clone().flush_task());
    let state = Arc::new(State { shm, device, ..State::default() });
    tokio::spawn(stats_task(state.clone(), outbox.clone()));
    let mut buf = BytesMut::with_capacity(256 * 1024);
    loop {
        match read_some(&stream, &mut buf).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(e).context("read from the worker"),
        }
        dispatch_all(&state, &outbox, &mut buf).context("the worker sent a malformed frame")?;
    }
    tracing::info!(tenant = %args.tenant, slice = %args.slice, "worker closed the connection; runner exits");
    Ok(())
}

/// Sends the statistics counted since the last answer of each version (a request cancelled or
/// timed out in the queue has no answer to carry them).
async fn stats_task(state: Arc<State>, outbox: Arc<Outbox>) {
    let mut tick = tokio::time::interval(STATS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut empty_ticks = 0;
    loop {
        tick.tick().await;
        let mut sent = false;
        let hosted: Vec<((String, i64), Arc<Hosted>)> =
            state.models.lock().iter().map(|(k, h)| (k.clone(), h.clone())).collect();
        for ((key, version), h) in hosted {
            let stats = h.delta();
            if !stats.is_empty() {
                if !state.send(&outbox, 0, &FromRunner::Stats { key, version, stats }) {
                    return;
                }
                sent = true;
            }
        }
        // Request regions whose tensors were dropped after their answer went out.
        if state.shm.as_ref().is_some_and(RunnerShm::has_released) {
            if !state.send(&outbox, 0, &FromRunner::Released) {
                return;
            }
            sent = true;
        }
        let received = state.received_since_tick.swap(false, Ordering::Relaxed);
        let idle = !sent && !received && crate::engine::in_flight::none_received();
        empty_ticks = if idle { empty_ticks + 1 } else { 0 };
        if empty_ticks >= IDLE_TICKS {
            // Set before the count is read again, so a request received in between (were the
            // runner's tasks not all on one thread) would notify, and `notified` return at once.
            state.stats_idle.store(true, Ordering::SeqCst);
            if crate::engine::in_flight::none_received() && !state.received_since_tick.load(Ordering::Relaxed) {
                state.wake_stats.notified().await;
            }
            state.stats_idle.store(false, Ordering::SeqCst);
            tick.reset();
            empty_ticks = 0;
        }
    }
}

fn dispatch_all(state: &Arc<State>, outbox: &Arc<Outbox>, buf: &mut BytesMut) -> Result<(), WireError> {
    while let Some((kind, id, body)) = split_frame(buf)? {
        dispatch(state, outbox, id, ToRunner::decode(kind, body, state.shm.as_ref())?);
    }
    Ok(())
}

fn dispatch(state: &Arc<State>, outbox: &Arc<Outbox>, id: u64, call: ToRunner) {
    match call {
        ToRunner::Infer(call) => infer(state, outbox, id, call),
        ToRunner::Cancel => {
            if let Some(task) = state.running.lock().remove(&id) {
                task.abort();
            }
        }
        ToRunner::Load(call) => {
            let (state, outbox) = (state.clone(), outbox.clone());
            tokio::spawn(async move {
                let answer = load(&state, *call).await;
                state.send(&outbox, id, &answer);
            });
        }
        ToRunner::Unload { key, version } => {
            // Requests running on it hold it; it goes when the last one finishes.
            state.models.lock().remove(&(key, version));
            state.send(outbox, id, &FromRunner::Done);
        }
        ToRunner::CudaRelease { id: region } => super::cuda::release(region),
        ToRunner::Ping => {
            let answer =
                FromRunner::Pong { rss_bytes: super::supervisor::resident_bytes(std::process::id()).unwrap_or(0) };
            state.send(outbox, id, &answer);
        }
    }
}

async fn load(state: &State, call: LoadCall) -> FromRunner {
    let LoadCall { key, name, version, file, config } = call;
    // The cores this runner is pinned to, not the machine's.
    let target = ExecutionTarget { cores: available_cores(), device: state.device.clone() };
    let loaded = tokio::task::spawn_blocking(move || LoadedModel::load(&name, version, &file, config, &target)).await;
    match loaded {
        Ok(Ok(model)) => {
            let io = model.io.clone();
            let hosted = Hosted { reported: Mutex::new(model.stats.tally()), model };
            state.models.lock().insert((key, version), Arc::new(hosted));
            FromRunner::Loaded(io)
        }
        Ok(Err(e)) => FromRunner::LoadFailed(e),
        Err(e) => FromRunner::LoadFailed(LoadError::runtime(format!("the model load failed: {e}"))),
    }
}

fn infer(state: &Arc<State>, outbox: &Arc<Outbox>, id: u64, call: InferCall) {
    let Some(hosted) = state.models.lock().get(&(call.key, call.version)).cloned() else {
        let e = Error::unavailable(format!("model version {} is not loaded in its runner", call.version));
        let answer = FromRunner::Answer { result: Err(e), stats: Tally::default(), steps: Vec::new() };
        state.send(outbox, id, &answer);
        return;
    };
    // Counted now, while the frames that arrived together are dispatched, so the first of
    // them to run already sees the others.
    let received = state.received();
    let (state2, outbox) = (state.clone(), outbox.clone());
    let task = tokio::spawn(async move {
        let _received = received;
        let guard = Answered { hosted: hosted.clone(), state: state2.clone(), outbox: outbox.clone(), id, done: false };
        let trace = call.request.trace.clone();
        let result = super::cuda::run_valid(&hosted.model, call.request).await;
        guard.answer(result, trace.steps());
        state2.running.lock().remove(&id);
    });
    state.running.lock().insert(id, task.abort_handle());
    if task.is_finished() {
        state.running.lock().remove(&id);
    }
}

/// Answers a call exactly once: with its result, or (when the task is aborted by a cancel)
/// with a cancellation, so the front's waiter and statistics always settle.
struct Answered {
    hosted: Arc<Hosted>,
    state: Arc<State>,
    outbox: Arc<Outbox>,
    id: u64,
    done: bool,
}

impl Answered {
    fn answer(mut self, result: Result<Vec<crate::engine::tensor::OutputTensor>, Error>, steps: Vec<(Event, u64)>) {
        self.done = true;
        let answer = FromRunner::Answer { result, stats: self.hosted.delta(), steps };
        self.state.send(&self.outbox, self.id, &answer);
    }
}

impl Drop for Answered {
    fn drop(&mut self) {
        if !self.done {
            let e = Error::new(crate::error::ErrorKind::Cancelled, "the request was cancelled");
            let answer = FromRunner::Answer { result: Err(e), stats: self.hosted.delta(), steps: Vec::new() };
            self.state.send(&self.outbox, self.id, &answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Waits up to 5 s for `check`.
    async fn until(what: &str, check: impl Fn() -> bool) {
        for _ in 0..500 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("not {what} within 5 s");
    }

    /// A runner's statistics task on its own, with the front's end of its socket.
    fn stats_task_alone() -> (Arc<State>, tokio::task::JoinHandle<()>, UnixStream) {
        let (ours, front) = UnixStream::pair().expect("socket pair");
        let state = Arc::new(State::default());
        let task = tokio::spawn(stats_task(state.clone(), Outbox::new(Arc::new(ours))));
        (state, task, front)
    }

    #[tokio::test]
    async fn an_idle_runner_stops_ticking_and_a_request_wakes_its_statistics_task() {
        let (state, task, _front) = stats_task_alone();
        let idle = || state.stats_idle.load(Ordering::SeqCst);
        until("asleep with no request held", idle).await;
        let received = state.received();
        until("awake once a request is received", || !idle()).await;
        // Ticking on while the request is held.
        tokio::time::sleep(STATS_EVERY * (IDLE_TICKS + 2)).await;
        assert!(!idle(), "a held request keeps the statistics task ticking");
        drop(received);
        until("asleep again once the request is answered", idle).await;
        task.abort();
    }

    #[tokio::test]
    async fn a_runner_whose_requests_each_end_between_ticks_keeps_ticking() {
        let (state, task, _front) = stats_task_alone();
        let idle = || state.stats_idle.load(Ordering::SeqCst);
        until("asleep with no request received", idle).await;
        // Requests run inline are received and answered between two ticks: none is held when
        // the task looks, yet the runner is busy.
        drop(state.received());
        for _ in 0..(STATS_EVERY * (IDLE_TICKS + 4)).as_millis() / 5 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(!idle(), "the statistics task slept while requests kept coming");
            drop(state.received());
        }
        task.abort();
    }
}
