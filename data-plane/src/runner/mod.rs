//! Runner processes: each tenant's model versions on a slice run in a process of their own
//! (`tessera runner`), so one tenant's crash, leak or hang never touches another.
//!
//! The worker (the front) keeps the listeners, authentication, routing and metering; it starts
//! one runner per (tenant, slice) ([`supervisor`]), talks to it over a Unix socket ([`wire`],
//! [`conn`]), and restarts it when it dies. Inside, the runner ([`process`]) hosts the engine:
//! model versions with their batchers and ONNX Runtime instances.

pub mod conn;
pub mod cuda;
pub mod device;
pub mod limits;
pub mod outbox;
pub mod process;
pub mod shm;
pub mod supervisor;
pub mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::time::Instant;

pub use process::RunnerArgs;
pub use supervisor::{DEFAULT_IDLE_EXIT, RunnerStatus, Runners, RunnersConfig};

use crate::engine::infer::ValidInferRequest;
use crate::engine::stats::{FailReason, ModelStats, nanos};
use crate::engine::tensor::OutputTensor;
use crate::error::{Error, Result};
use conn::CallError;
use supervisor::{RESTART_WAIT, Slot};
use wire::{FromRunner, InferCall, ToRunner};

/// Requests in runners, process-wide.
static REMOTE_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Which runner hosts a version: one per (tenant, slice).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Placement {
    /// Tenant (its id on workers; `serve` for `tessera serve`).
    pub tenant: String,
    /// Slice id.
    pub slice: String,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.tenant, self.slice)
    }
}

/// The front's handle on a version loaded in a runner; dropping it unloads the version there.
pub struct RemoteVersion {
    slot: Arc<Slot>,
    key: String,
    version: i64,
    /// Requests sent and not answered yet.
    pending: AtomicUsize,
}

impl RemoteVersion {
    fn new(slot: Arc<Slot>, key: String, version: i64) -> Self {
        Self { slot, key, version, pending: AtomicUsize::new(0) }
    }

    /// Runs a checked request in the runner. The runner's statistics for it arrive with the
    /// answer (added to `stats` by the connection); a runner that dies first costs the request
    /// a 503 naming the model, counted here as a failure.
    pub async fn infer(
        &self,
        request: ValidInferRequest,
        model: &str,
        stats: &Arc<ModelStats>,
    ) -> Result<Vec<OutputTensor>> {
        // A lone request lets the front's idle thread keep polling (the runner's answer is among
        // what it watches); with others in flight it parks, leaving the CPU to the runner.
        let others = REMOTE_IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
        let _remote = Pending(&REMOTE_IN_FLIGHT);
        let _in_flight = (others > 0).then(crate::engine::in_flight::InFlight::start);
        let _pending = Pending::start(&self.pending);
        let started = Instant::now();
        let wait = match request.timeout_us {
            0 => RESTART_WAIT,
            us => RESTART_WAIT.min(std::time::Duration::from_micros(us)),
        };
        // Nearly always empty (a clone that allocates nothing); kept to check the answer.
        let cuda = request.cuda.clone();
        let trace = request.trace.clone();
        let call = ToRunner::Infer(InferCall { key: self.key.clone(), version: self.version, request });
        // A call that never reached a dead runner goes to the one that replaces it (once).
        for attempt in 0..2 {
            let conn = match self.slot.ready(wait, model).await {
                Ok(conn) => conn,
                Err(e) => return Err(failed(stats, started, e)),
            };
            cuda::sent_to(&cuda, &conn);
            match conn.call(&call, Some(stats)).await {
                Ok(FromRunner::Answer { result, steps, .. }) => {
                    for (event, ns) in steps {
                        trace.stamp_steady(event, ns);
                    }
                    return result.and_then(|outputs| cuda::check_answer(&cuda, &outputs).map(|()| outputs));
                }
                Ok(_) => return Err(failed(stats, started, Error::internal("the runner answered out of turn"))),
                Err(CallError::NotSent) if attempt == 0 => continue,
                Err(_) => {
                    let e = Error::unavailable(format!(
                        "model '{model}' is unavailable: its runner stopped while running the request; retry"
                    ))
                    .retry_after(1);
                    return Err(failed(stats, started, e));
                }
            }
        }
        let e = Error::unavailable(format!("model '{model}' is unavailable: its runner is restarting")).retry_after(1);
        Err(failed(stats, started, e))
    }

    /// Requests in the runner now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

impl Drop for RemoteVersion {
    fn drop(&mut self) {
        self.slot.unload(&self.key, self.version);
    }
}

/// A failure the runner never counted (it died or was not there): counted here.
fn failed(stats: &ModelStats, started: Instant, e: Error) -> Error {
    stats.record_failure_reason(FailReason::Other);
    stats.fail.record(nanos(started.elapsed()));
    e
}

/// Counts something (a request in flight, a load on its way) while it lives.
struct Pending<'a>(&'a AtomicUsize);

impl<'a> Pending<'a> {
    fn start(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }

    /// Takes over one count already added.
    fn counting(count: &'a AtomicUsize) -> Self {
        Self(count)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
