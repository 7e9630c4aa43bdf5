//! Starting and keeping alive one runner process per (tenant, slice).
//!
//! Each [`Slot`] has a task that spawns its runner (`tessera runner --tenant T --slice S`, the
//! socket on fd 3, the slice's limits applied), loads every version registered on the slot,
//! publishes the connection, and waits. When the runner dies (crash, OOM kill, `kill -9`) the
//! calls on it fail at once with 503, the slot records why (signal or exit code, the last lines
//! of its stderr), and it starts a new runner after an exponential backoff, reloading the same
//! versions before requests flow again. Requests that arrive meanwhile wait for it (bounded).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::conn::{RunnerConn, StatsSinks};
use super::limits::{MemoryEnforcement, SliceLimits, child_setup, prepare_memory};
use super::shm::{FrontShm, Traffic};
use super::wire::{FromRunner, LoadCall, ToRunner};
use super::{Pending, Placement, RemoteVersion};
use crate::engine::device::ExecutionTarget;
use crate::engine::load_error::LoadError;
use crate::engine::model::LoadedModel;
use crate::error::{Error, Result};

/// First wait before restarting a runner that died.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between restarts of a runner that keeps dying.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A runner that lived this long before dying starts again after [`MIN_BACKOFF`].
const STABLE_AFTER: Duration = Duration::from_secs(30);
/// How long a request waits for its runner to come back before it gets 503.
pub const RESTART_WAIT: Duration = Duration::from_secs(10);
/// Lines of a runner's stderr kept to explain its death.
const STDERR_TAIL: usize = 20;
/// A runner that died this often within [`CRASH_LOOP_WINDOW`] is in a crash loop.
pub const CRASH_LOOP_DEATHS: usize = 3;
/// See [`CRASH_LOOP_DEATHS`].
pub const CRASH_LOOP_WINDOW: Duration = Duration::from_secs(60);
/// How often a runner is asked whether it is alive.
const PING_EVERY: Duration = Duration::from_secs(1);
/// How long a ping may go unanswered before the runner counts as hung.
const PING_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a runner has to exit after its socket closes at shutdown, before SIGKILL.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// How runners are started.
#[derive(Debug, Clone)]
pub struct RunnersConfig {
    /// The `tessera` binary to run as `tessera runner`.
    pub exe: PathBuf,
    /// Limits per slice id; a slice not listed runs unlimited.
    pub limits: HashMap<String, SliceLimits>,
    /// How long a runner left with no versions lives on before it exits (a tenant's last
    /// replica left this slice); a version placed meanwhile reuses it.
    pub idle_exit: Duration,
    /// Bytes of each shared-memory arena (requests, responses) per runner; 0 sends every
    /// tensor through the socket.
    pub shm_bytes: usize,
    /// Directories of the CUDA libraries (cuBLAS, cuDNN, ...) put first on the
    /// `LD_LIBRARY_PATH` of runners that may use a GPU.
    pub cuda_library_dirs: Vec<PathBuf>,
}

/// Default [`RunnersConfig::idle_exit`].
pub const DEFAULT_IDLE_EXIT: Duration = Duration::from_secs(30);

/// A runner as metrics and heartbeats see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerStatus {
    /// Tenant.
    pub tenant: String,
    /// Slice.
    pub slice: String,
    /// Process id; 0 while it is down.
    pub pid: u32,
    /// Times it died and was started again, by reason (`killed`, `oom`, `hung`, `signal`, `exit`, `spawn_failed`).
    pub restarts: BTreeMap<&'static str, u64>,
    /// Resident memory of the process, when it is up.
    pub rss_bytes: Option<u64>,
    /// Tensor bytes sent and received: (request, response) × (inline, shared memory).
    pub tensor_bytes: [[u64; 2]; 2],
    /// Why it last died, if it did.
    pub last_exit: Option<String>,
}

/// Every runner of this process, by (tenant, slice).
pub struct Runners {
    config: RunnersConfig,
    /// Limits and device per slice id: `config.limits` at start, replaced when the worker's
    /// slices change (a new MIG layout), so a new slice's runner is confined to its device.
    limits: parking_lot::RwLock<HashMap<String, SliceLimits>>,
    /// Bumped whenever a runner dies, so heartbeats report crash loops at once.
    deaths: watch::Sender<u64>,
    /// Numbers every load, so each gets its own key in its runner.
    loads: AtomicU64,
    /// The live slots. `slot` adds; a slot's task removes its slot when the runner retires.
    slots: Arc<Mutex<HashMap<Placement, Arc<Slot>>>>,
    shutdown: CancellationToken,
}

/// One (tenant, slice) and its runner process over time.
pub struct Slot {
    placement: Placement,
    /// The live connection; `None` while the runner starts or restarts. The slot task sends.
    conn: watch::Sender<Option<Arc<RunnerConn>>>,
    /// Versions to (re)load in every runner this slot starts.
    loads: Mutex<BTreeMap<(String, i64), LoadCall>>,
    /// Loads on their way (counted under the slots lock): an idle runner is not retired
    /// under them.
    loading: std::sync::atomic::AtomicUsize,
    /// The statistics of each loaded version, for what runners report unasked.
    sinks: Arc<StatsSinks>,
    pid: AtomicU32,
    /// Tensor bytes its runners exchanged, across restarts.
    traffic: Arc<Traffic>,
    restarts: Mutex<BTreeMap<&'static str, u64>>,
    /// When the runner died lately (the last [`CRASH_LOOP_DEATHS`]), to tell a crash loop.
    deaths: Mutex<VecDeque<Instant>>,
    last_exit: Mutex<Option<String>>,
}

impl Runners {
    /// No runners yet; each starts with the first version placed on its (tenant, slice).
    pub fn new(config: RunnersConfig, shutdown: CancellationToken) -> Arc<Self> {
        let (deaths, _) = watch::channel(0);
        let limits = parking_lot::RwLock::new(config.limits.clone());
        Arc::new(Self { config, limits, deaths, loads: AtomicU64::new(0), slots: Arc::default(), shutdown })
    }

    /// Replaces the slices' limits (the worker's slices changed); runners started from now on
    /// get the new ones, running ones keep theirs until they restart.
    pub fn set_slice_limits(&self, limits: HashMap<String, SliceLimits>) {
        *self.limits.write() = limits;
    }

    /// Loads a version in the runner of `placement` (starting it if needed) and returns the
    /// front's handle on it, its spec checked for the slice's device as the runner checked it.
    /// A runner that does not come up, or dies during the load, is a resource failure (it may
    /// have hit its memory limit); the runner's own load failures keep their kind.
    pub async fn load(
        &self,
        placement: &Placement,
        mut call: LoadCall,
        cores: usize,
    ) -> Result<LoadedModel, LoadError> {
        // Each load is its own instance in the runner: a reload of the same version loads
        // beside the old one, and dropping the old handle unloads only the old instance.
        call.key = format!("{}#{}", call.key, self.loads.fetch_add(1, Ordering::Relaxed));
        let slot = self.slot(placement);
        let _loading = Pending::counting(&slot.loading);
        let conn = slot.ready(RESTART_WAIT * 3, &call.name).await.map_err(|e| LoadError::resources(e.message))?;
        let io = match conn.call(&ToRunner::Load(Box::new(call.clone())), None).await {
            Ok(FromRunner::Loaded(io)) => io,
            Ok(FromRunner::LoadFailed(e)) => return Err(e),
            Ok(FromRunner::Failed(e)) => return Err(LoadError::runtime(e.message)),
            Ok(other) => return Err(LoadError::runtime(format!("the runner answered a load with {other:?}"))),
            Err(_) => {
                return Err(LoadError::resources(format!("the runner of {placement} stopped while loading the model")));
            }
        };
        let (key, version) = (call.key.clone(), call.version);
        slot.loads.lock().insert((key.clone(), version), call.clone());
        let remote = RemoteVersion::new(slot.clone(), key.clone(), version);
        let device = self.limits.read().get(&placement.slice).map(|l| l.device.target_device(&placement.slice));
        let target = ExecutionTarget { cores, device: device.unwrap_or_default() };
        let model = LoadedModel::in_runner(&call.name, version, &call.file, call.config, io, &target, remote)?;
        slot.sinks.lock().insert((key, version), Arc::downgrade(&model.stats));
        Ok(model)
    }

    /// Every runner's state.
    pub fn statuses(&self) -> Vec<RunnerStatus> {
        let mut all: Vec<RunnerStatus> = self.slots.lock().values().map(|s| s.status()).collect();
        all.sort_by(|a, b| (&a.tenant, &a.slice).cmp(&(&b.tenant, &b.slice)));
        all
    }

    /// The runners in a crash loop ([`CRASH_LOOP_DEATHS`] deaths within [`CRASH_LOOP_WINDOW`]),
    /// with why they last died: their replicas are reported failed.
    pub fn crash_loops(&self) -> HashMap<Placement, String> {
        let now = Instant::now();
        self.slots
            .lock()
            .values()
            .filter(|s| {
                let deaths = s.deaths.lock();
                deaths.len() >= CRASH_LOOP_DEATHS && deaths.front().is_some_and(|t| now - *t <= CRASH_LOOP_WINDOW)
            })
            .map(|s| (s.placement.clone(), s.last_exit.lock().clone().unwrap_or_default()))
            .collect()
    }

    /// Changes whenever a runner dies.
    pub fn deaths(&self) -> watch::Receiver<u64> {
        self.deaths.subscribe()
    }

    /// The slot of `placement` (made and started if there is none), counted as loading.
    fn slot(&self, placement: &Placement) -> Arc<Slot> {
        let mut slots = self.slots.lock();
        if let Some(slot) = slots.get(placement) {
            slot.loading.fetch_add(1, Ordering::Relaxed);
            return slot.clone();
        }
        let (conn, _) = watch::channel(None);
        let slot = Arc::new(Slot {
            placement: placement.clone(),
            conn,
            loads: Mutex::new(BTreeMap::new()),
            loading: std::sync::atomic::AtomicUsize::new(0),
            sinks: Arc::default(),
            pid: AtomicU32::new(0),
            traffic: Arc::default(),
            restarts: Mutex::new(BTreeMap::new()),
            deaths: Mutex::new(VecDeque::new()),
            last_exit: Mutex::new(None),
        });
        slot.loading.fetch_add(1, Ordering::Relaxed);
        slots.insert(placement.clone(), slot.clone());
        let limits = self.limits.read().get(&placement.slice).cloned().unwrap_or_default();
        let task = SlotTask {
            exe: self.config.exe.clone(),
            limits,
            idle_exit: self.config.idle_exit,
            shm_bytes: self.config.shm_bytes,
            cuda_library_dirs: self.config.cuda_library_dirs.clone(),
            deaths: self.deaths.clone(),
            slots: self.slots.clone(),
            shutdown: self.shutdown.clone(),
        };
        tokio::spawn(slot_task(slot.clone(), task));
        slot
    }
}

impl Slot {
    /// The live connection, waiting up to `wait` for a starting runner.
    pub async fn ready(&self, wait: Duration, model: &str) -> Result<Arc<RunnerConn>> {
        let mut rx = self.conn.subscribe();
        let found = tokio::time::timeout(wait, rx.wait_for(|c| c.as_ref().is_some_and(|c| !c.is_closed()))).await;
        match found {
            Ok(Ok(conn)) => conn.clone().ok_or_else(|| self.down(model)),
            _ => Err(self.down(model)),
        }
    }

    fn down(&self, model: &str) -> Error {
        Error::unavailable(format!("model '{model}' is unavailable: its runner is restarting; retry shortly"))
            .retry_after(1)
    }

    /// Forgets a version (it left this worker): restarts no longer load it, and the runner
    /// drops it now.
    pub fn unload(&self, key: &str, version: i64) {
        self.loads.lock().remove(&(key.to_string(), version));
        self.sinks.lock().remove(&(key.to_string(), version));
        let Some(conn) = self.conn.borrow().clone() else { return };
        let call = ToRunner::Unload { key: key.to_string(), version };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = conn.call(&call, None).await;
            });
        }
    }

    fn status(&self) -> RunnerStatus {
        let pid = self.pid.load(Ordering::Relaxed);
        RunnerStatus {
            tenant: self.placement.tenant.clone(),
            slice: self.placement.slice.clone(),
            pid,
            restarts: self.restarts.lock().clone(),
            rss_bytes: (pid != 0).then(|| resident_bytes(pid)).flatten(),
            tensor_bytes: [&self.traffic.request, &self.traffic.response]
                .map(|way| way.each_ref().map(|n| n.load(Ordering::Relaxed))),
            last_exit: self.last_exit.lock().clone(),
        }
    }
}

/// Keeps the slot's runner alive until shutdown.
/// What a slot's task needs besides its slot.
struct SlotTask {
    exe: PathBuf,
    limits: SliceLimits,
    idle_exit: Duration,
    shm_bytes: usize,
    cuda_library_dirs: Vec<PathBuf>,
    /// Bumped when the runner dies.
    deaths: watch::Sender<u64>,
    /// The runners' slots, to leave when the runner retires.
    slots: Arc<Mutex<HashMap<Placement, Arc<Slot>>>>,
    shutdown: CancellationToken,
}

async fn slot_task(slot: Arc<Slot>, task: SlotTask) {
    let SlotTask { exe, limits, idle_exit, shm_bytes, cuda_library_dirs, deaths, slots, shutdown } = task;
    let label = slot.placement.to_string();
    // The cgroup lives as long as this task (dropping it removes the directory).
    let (cgroup, memory) = match prepare_memory(&cgroup_name(&slot.placement), limits.memory_bytes) {
        Ok(prepared) => prepared,
        Err(e) => {
            tracing::warn!(runner = %label, error = %e, "could not create the runner's cgroup; using an rlimit");
            (None, limits.memory_bytes.map_or(MemoryEnforcement::Unlimited, MemoryEnforcement::Rlimit))
        }
    };
    tracing::info!(runner = %label, memory = %memory.describe(), cpus = ?limits.cpus, nice = ?limits.nice, device = ?limits.device, "runner limits");
    // Computed once: the worker's own environment does not change.
    let ort_dir = crate::engine::backend::runtime::locate().and_then(|p| p.parent().map(std::path::Path::to_path_buf));
    let env = limits.device.runner_env(&cuda_library_dirs, ort_dir.as_deref(), std::env::var_os("LD_LIBRARY_PATH"));
    if let Some(cgroup) = &cgroup {
        sweep_leftover_cgroups(cgroup.path());
    }
    let mut backoff = MIN_BACKOFF;
    while !shutdown.is_cancelled() {
        let started = Instant::now();
        let oom_before = cgroup.as_ref().and_then(|c| c.oom_kills());
        let mut ended = match spawn(&slot, &exe, &limits, &memory, shm_bytes, &env) {
            Ok(running) => serve(&slot, running, &shutdown, &Retire { slots: &slots, after: idle_exit }).await,
            Err(e) => Some(format!("could not start: {e}")),
        };
        if let (Some(reason), Some(before)) = (&mut ended, oom_before)
            && cgroup.as_ref().and_then(|c| c.oom_kills()).is_some_and(|after| after > before)
        {
            *reason = format!("out of memory: the kernel killed it at the slice's limit ({reason})");
        }
        slot.conn.send_replace(None);
        slot.pid.store(0, Ordering::Relaxed);
        let Some(reason) = ended else { break };
        *slot.restarts.lock().entry(restart_reason(&reason)).or_default() += 1;
        if started.elapsed() >= STABLE_AFTER {
            backoff = MIN_BACKOFF;
        }
        tracing::warn!(runner = %label, %reason, retry_in_ms = backoff.as_millis() as u64, "runner died; restarting");
        *slot.last_exit.lock() = Some(reason);
        {
            let mut recent = slot.deaths.lock();
            if recent.len() == CRASH_LOOP_DEATHS {
                recent.pop_front();
            }
            recent.push_back(Instant::now());
        }
        deaths.send_modify(|n| *n += 1);
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shutdown.cancelled() => break,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    // Removing the cgroup waits (briefly) for the kernel to let go of the runner.
    if let Some(cgroup) = cgroup {
        let _ = tokio::task::spawn_blocking(move || drop(cgroup)).await;
    }
}

/// A started runner: the child, its connection and the tail of its stderr.
struct Running {
    child: tokio::process::Child,
    conn: Arc<RunnerConn>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

/// Starts the runner process with its socket on fd 3, its shared-memory arenas on fds 4 and 5
/// (when `shm_bytes` > 0), its limits applied and its device's environment (`env`).
fn spawn(
    slot: &Slot,
    exe: &std::path::Path,
    limits: &SliceLimits,
    memory: &MemoryEnforcement,
    shm_bytes: usize,
    env: &[(&str, std::ffi::OsString)],
) -> std::io::Result<Running> {
    let (front, child_end) = std::os::unix::net::UnixStream::pair()?;
    let shm = match shm_bytes {
        0 => None,
        bytes => match FrontShm::create(bytes, slot.traffic.clone()) {
            Ok(created) => Some(created),
            // Without arenas every tensor still crosses, through the socket.
            Err(error) => {
                tracing::warn!(runner = %slot.placement, %error, "no shared memory for the runner; tensors go through its socket");
                None
            }
        },
    };
    let mut fds = vec![(child_end.as_raw_fd(), super::process::SOCKET_FD)];
    if let Some((_, arenas)) = &shm {
        fds.push((arenas.request.as_raw_fd(), SHM_FDS[0]));
        fds.push((arenas.response.as_raw_fd(), SHM_FDS[1]));
    }
    let mut setup = child_setup(limits, memory).map_err(std::io::Error::other)?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("runner")
        .arg("--tenant")
        .arg(&slot.placement.tenant)
        .arg("--slice")
        .arg(&slot.placement.slice)
        .arg(format!("--instance-nice={}", crate::engine::priority::instance_nice()))
        .arg(format!("--busy-poll-us={}", crate::serve::net::busy_poll::window().as_micros()))
        .args(limits.device.runner_args())
        .envs(env.iter().map(|(k, v)| (k, v)));
    if shm.is_some() {
        cmd.arg(format!("--shm-fds={},{}", SHM_FDS[0], SHM_FDS[1]));
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
    // SAFETY: the closure runs between fork and exec and only makes raw system calls (dup2,
    // fcntl, prctl, and the limit calls prepared by `child_setup`), which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            place_fds(&fds)?;
            // The runner never outlives its worker, even if the worker is killed.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Its own process group: a Ctrl-C at the worker's terminal must not kill the
            // runners before the worker has drained the requests running on them.
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            setup()
        });
    }
    let mut child = cmd.spawn()?;
    drop(child_end);
    // The runner holds its own copies of the descriptors now; the front keeps its mappings.
    let shm = shm.map(|(front_shm, _fds)| front_shm);
    let pid = child.id().unwrap_or(0);
    slot.pid.store(pid, Ordering::Relaxed);
    let stderr = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
    if let Some(pipe) = child.stderr.take() {
        tokio::spawn(forward_stderr(pipe, stderr.clone()));
    }
    front.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(front)?;
    let conn = RunnerConn::start(stream, slot.placement.to_string(), slot.sinks.clone(), shm);
    tracing::info!(runner = %slot.placement, pid, "runner started");
    Ok(Running { child, conn, stderr })
}

/// Where the runner finds its shared-memory arenas (requests, responses).
const SHM_FDS: [std::os::fd::RawFd; 2] = [4, 5];

/// In the child: each (descriptor, target) pair lands on its target, without close-on-exec.
/// Every source is first copied above the targets, so placing one never overwrites another.
fn place_fds(fds: &[(std::os::fd::RawFd, std::os::fd::RawFd)]) -> std::io::Result<()> {
    let mut high = [0; 3];
    // SAFETY: plain system calls on descriptors this (forked) process owns.
    unsafe {
        for (slot, (fd, _)) in high.iter_mut().zip(fds) {
            *slot = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 64);
            if *slot < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // dup2 clears close-on-exec on the copy it makes.
        for (copy, (_, target)) in high.iter().zip(fds) {
            if libc::dup2(*copy, *target) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Reloads the slot's versions, publishes the connection and waits for the runner to end.
/// Returns why it died, or `None` at shutdown.
async fn serve(slot: &Slot, mut running: Running, shutdown: &CancellationToken, retire: &Retire<'_>) -> Option<String> {
    let loads: Vec<LoadCall> = slot.loads.lock().values().cloned().collect();
    for call in loads {
        match running.conn.call(&ToRunner::Load(Box::new(call.clone())), None).await {
            Ok(FromRunner::Loaded(_)) => {}
            Ok(FromRunner::LoadFailed(LoadError { message, .. }) | FromRunner::Failed(Error { message, .. })) => {
                tracing::warn!(runner = %slot.placement, model = %call.name, version = call.version, error = %message, "reload after restart failed");
            }
            _ => break,
        }
    }
    slot.conn.send_replace(Some(running.conn.clone()));
    let status = tokio::select! {
        status = running.child.wait() => status,
        hung = liveness(&running.conn) => {
            tracing::warn!(runner = %slot.placement, "runner stopped answering pings; killing it");
            let _ = running.child.start_kill();
            let status = running.child.wait().await;
            running.conn.shutdown();
            return Some(format!("{hung}; {}", status.map_or_else(|e| e.to_string(), describe_exit)));
        }
        () = running.conn.closed() => {
            // The socket closed or lied: the process is of no use any more.
            let _ = running.child.start_kill();
            running.child.wait().await
        }
        () = retire.when_idle(slot) => {
            tracing::info!(runner = %slot.placement, "runner has no versions left; it exits");
            running.conn.shutdown();
            if tokio::time::timeout(EXIT_GRACE, running.child.wait()).await.is_err() {
                let _ = running.child.start_kill();
                let _ = running.child.wait().await;
            }
            return None;
        }
        () = shutdown.cancelled() => {
            running.conn.shutdown();
            if tokio::time::timeout(EXIT_GRACE, running.child.wait()).await.is_err() {
                let _ = running.child.start_kill();
                let _ = running.child.wait().await;
            }
            return None;
        }
    };
    running.conn.shutdown();
    // Let the stderr forwarder catch the last lines (an abort message comes just before exit).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let tail: Vec<String> = running.stderr.lock().iter().rev().take(5).rev().cloned().collect();
    let how = match status {
        Ok(s) => describe_exit(s),
        Err(e) => format!("could not be waited for: {e}"),
    };
    Some(if tail.is_empty() { how } else { format!("{how}; last output: {}", tail.join(" | ")) })
}

/// When a runner with nothing to host leaves.
struct Retire<'a> {
    slots: &'a Mutex<HashMap<Placement, Arc<Slot>>>,
    after: Duration,
}

impl Retire<'_> {
    /// Resolves once the slot has hosted nothing (and had nothing on its way) for `after`, with
    /// the slot taken out of the map in the same step, so a new load makes a new slot.
    async fn when_idle(&self, slot: &Slot) {
        let check = (self.after / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let mut idle_since: Option<Instant> = None;
        loop {
            tokio::time::sleep(check).await;
            let idle = || slot.loads.lock().is_empty() && slot.loading.load(Ordering::Relaxed) == 0;
            if !idle() {
                idle_since = None;
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < self.after {
                continue;
            }
            let mut slots = self.slots.lock();
            if idle() {
                slots.remove(&slot.placement);
                return;
            }
        }
    }
}

/// Pings the runner every [`PING_EVERY`]; returns (with why) once one goes unanswered for
/// [`PING_TIMEOUT`]. A runner's pings are answered by its async thread, never behind model runs,
/// so only a hung or stopped process misses them.
async fn liveness(conn: &RunnerConn) -> String {
    loop {
        tokio::time::sleep(PING_EVERY).await;
        match tokio::time::timeout(PING_TIMEOUT, conn.call(&ToRunner::Ping, None)).await {
            Ok(Ok(_)) => {}
            // A closed connection is noticed by the caller's other branch.
            Ok(Err(_)) => std::future::pending::<()>().await,
            Err(_) => return format!("hung: no answer to a ping within {} s", PING_TIMEOUT.as_secs()),
        }
    }
}

/// "killed by signal 9 (SIGKILL)" or "exited with code 3".
fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => {
            let name = signal_name(sig);
            format!("killed by signal {sig} ({name})")
        }
        _ => "ended".into(),
    }
}

/// The names of the signals a runner dies of.
fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "other",
    }
}

/// The restart metric's closed label set.
fn restart_reason(reason: &str) -> &'static str {
    if reason.starts_with("hung") {
        "hung"
    } else if reason.starts_with("out of memory") {
        "oom"
    } else if reason.contains("SIGKILL") {
        "killed"
    } else if reason.contains("signal") {
        "signal"
    } else if reason.starts_with("exited") {
        "exit"
    } else {
        "spawn_failed"
    }
}

/// Copies the runner's stderr (its logs) to ours, keeping the last lines.
async fn forward_stderr(pipe: tokio::process::ChildStderr, tail: Arc<Mutex<VecDeque<String>>>) {
    let mut lines = BufReader::new(pipe).lines();
    let mut out = tokio::io::stderr();
    while let Ok(Some(line)) = lines.next_line().await {
        let _ = out.write_all(format!("{line}\n").as_bytes()).await;
        let mut tail = tail.lock();
        if tail.len() == STDERR_TAIL {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}

/// Resident memory of process `pid` (`/proc/<pid>/statm`).
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// The cgroup directory name of a runner: the worker's pid (several workers may share a
/// machine, and a tenant a slice id on each), tenant and slice.
fn cgroup_name(p: &Placement) -> String {
    format!("{}-{}-{}", std::process::id(), p.tenant, p.slice)
}

/// Removes runner cgroups that workers no longer running left behind (a worker killed with
/// SIGKILL cannot remove its own). Busy or foreign directories are left alone (rmdir fails).
fn sweep_leftover_cgroups(ours: &std::path::Path) {
    let Some(parent) = ours.parent() else { return };
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("tessera-runner-").and_then(|rest| rest.split('-').next()) else { continue };
        let gone = pid.parse::<u32>().is_ok_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists());
        if gone && std::fs::remove_dir(entry.path()).is_ok() {
            tracing::info!(cgroup = %entry.path().display(), "removed a runner cgroup left by a worker that is gone");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_are_described_for_people_and_labelled_for_metrics() {
        let killed = describe_exit(ExitStatus::from_raw(9));
        assert_eq!(killed, "killed by signal 9 (SIGKILL)");
        assert_eq!(restart_reason(&killed), "killed");
        let code = describe_exit(ExitStatus::from_raw(3 << 8));
        assert_eq!(code, "exited with code 3");
        assert_eq!(restart_reason(&code), "exit");
        assert_eq!(restart_reason(&describe_exit(ExitStatus::from_raw(6))), "signal");
    }
}
