//! The sequence batcher of one stateful model version (Triton's `sequence_batching`): requests
//! carry a correlation id (`sequence_id`, a number or a string) and START/END flags; every
//! request of a sequence runs after the one before it, with the control inputs (START, END,
//! READY, CORRID) filled in and the implicit state the previous request produced fed back.
//!
//! One batcher task per version forms batches from [`slots::Sequences`] (the direct or the
//! oldest strategy) and releases sequences that idle past `max_sequence_idle_microseconds`;
//! instances run batches on dedicated OS threads, each owning its ONNX Runtime session.
//! The state lives here, not in an instance, so a sequence may run on any instance; its slot
//! (direct) or candidacy (oldest) is what bounds how many sequences run at once.

pub mod config;
mod run;
pub mod slots;

pub(crate) use run::run_spec;

use std::sync::Arc;

use parking_lot::Mutex;
use tessera_protocol::DataType;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::engine::backend::onnx::OnnxSession;
use crate::engine::batcher::policy::SAFETY_QUEUE_CAP;
use crate::engine::infer::{ParamValue, ValidInferRequest};
use crate::engine::model_spec::ModelSpec;
use crate::engine::stats::{FailReason, ModelStats};
use crate::engine::tensor::OutputTensor;
use crate::error::{Error, Result};
use config::SequenceConfig;
use slots::{Item, Refusal, Row, SeqId, Sequences};

/// A queued request and where its answer goes.
pub(crate) struct Pending {
    request: ValidInferRequest,
    reply: oneshot::Sender<Result<Vec<OutputTensor>>>,
    /// When it reached the model (its duration starts here).
    arrived: Instant,
}

/// State shared by handlers (admit), the batcher task (form batches, reap) and the instances
/// (complete).
pub(crate) struct Shared {
    /// Handlers admit under the lock; the batcher takes batches; instances complete them.
    sequences: Mutex<Sequences<Pending>>,
    /// Handlers and instances notify after a change; the batcher waits on it.
    notify: Notify,
    spec: Arc<ModelSpec>,
    /// The spec the session runs with: the request inputs plus control and state inputs, the
    /// outputs plus state outputs.
    run_spec: ModelSpec,
    config: SequenceConfig,
    stats: Arc<ModelStats>,
}

/// A batch on its way to an instance, holding that instance's permit.
struct Dispatch {
    rows: Vec<Row<Pending>>,
    /// Returned when the run ends, so the batcher forms the next batch only then.
    _permit: OwnedSemaphorePermit,
}

/// Handle to a stateful model version's sequence batcher; dropping it stops the batcher task
/// and the instances.
pub struct SequenceBatcher {
    shared: Arc<Shared>,
    /// One permit per instance; held from dispatch until the run ends.
    permits: Arc<Semaphore>,
    /// To the instance threads (for batches formed on the caller's task); the batcher task
    /// holds the other sender.
    batches: crossbeam_channel::Sender<Dispatch>,
    _stop: DropGuard,
}

impl SequenceBatcher {
    /// Starts the batcher task and one thread per session. Needs a Tokio runtime.
    pub fn start(
        spec: Arc<ModelSpec>,
        sessions: Vec<OnnxSession>,
        stats: Arc<ModelStats>,
        config: SequenceConfig,
        label: &str,
    ) -> Result<Self, String> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| format!("no async runtime: {e}"))?;
        let run_spec = run::run_spec(&spec, &config);
        let shared = Arc::new(Shared {
            sequences: Mutex::new(Sequences::new(config.clone(), SAFETY_QUEUE_CAP)),
            notify: Notify::new(),
            spec,
            run_spec,
            config,
            stats,
        });
        let permits = Arc::new(Semaphore::new(sessions.len()));
        // Bounded by the permits: at most one batch per instance is ever in the channel.
        let (batches, receiver) = crossbeam_channel::unbounded::<Dispatch>();
        for (i, session) in sessions.into_iter().enumerate() {
            let (shared, receiver) = (shared.clone(), receiver.clone());
            std::thread::Builder::new()
                .name(format!("{label}-{i}"))
                .spawn(move || run_instance(session, &shared, &receiver))
                .map_err(|e| format!("failed to start an instance thread: {e}"))?;
        }
        let stop = CancellationToken::new();
        runtime.spawn(batcher_task(shared.clone(), permits.clone(), batches.clone(), stop.clone()));
        Ok(Self { shared, permits, batches, _stop: stop.drop_guard() })
    }

    /// Queues a checked request of a sequence and waits for its outputs.
    pub async fn submit(&self, request: ValidInferRequest, arrived: Instant) -> Result<Vec<OutputTensor>> {
        let _in_flight = crate::engine::in_flight::InFlight::start();
        let model = &self.shared.spec.name;
        let (id, start, end) = sequence_of(&request, model, &self.shared.config)?;
        let (reply, answer) = oneshot::channel();
        let item = Item { payload: Pending { request, reply, arrived }, start, end, enqueued: Instant::now() };
        let admitted = self.shared.sequences.lock().admit(id.clone(), item);
        match admitted {
            Ok(()) => {}
            Err(Refusal::NeedsStart) => {
                return Err(Error::invalid(format!(
                    "inference request for sequence {id} to model '{model}' must specify the START flag on the first request of the sequence"
                )));
            }
            Err(Refusal::QueueFull) => {
                self.shared.stats.record_failure_reason(FailReason::Rejected);
                return Err(Error::unavailable(format!("Exceeds maximum queue size for model '{model}'")));
            }
        }
        self.dispatch_now();
        self.shared.notify.notify_one();
        answer.await.map_err(|_| Error::unavailable(format!("model '{model}' stopped before answering")))?
    }

    /// With an instance free, forms the batch the strategy allows now on the caller's task and
    /// hands it over, sparing the hop through the batcher task (which the notify after this
    /// still wakes for delays and idle timeouts).
    fn dispatch_now(&self) {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else { return };
        let step = self.shared.sequences.lock().next_batch(Instant::now(), true);
        log_expired(&self.shared, &step.expired);
        if !step.batch.is_empty() {
            // Instances gone (unloading): the rows' answers drop with them, failing the callers.
            let _ = self.batches.send(Dispatch { rows: step.batch, _permit: permit });
        }
    }

    /// Requests waiting for their turn.
    pub fn pending(&self) -> usize {
        self.shared.sequences.lock().queued()
    }
}

/// The request's correlation id and flags, refused as Triton refuses them: a sequence model
/// needs a non-zero (or non-empty) id and a batch of one.
fn sequence_of(request: &ValidInferRequest, model: &str, config: &SequenceConfig) -> Result<(SeqId, bool, bool)> {
    let id = match request.parameters.get("sequence_id") {
        Some(ParamValue::Str(s)) if !s.is_empty() => SeqId::Str(s.clone()),
        Some(p) => match p.as_u64() {
            Some(n) if n != 0 => SeqId::Num(n),
            _ => return Err(no_correlation_id(model)),
        },
        None => return Err(no_correlation_id(model)),
    };
    if request.batch_size != 1 {
        return Err(Error::invalid(format!(
            "inference request to model '{model}' must specify batch-size 1 due to requirements of sequence batcher"
        )));
    }
    match (&id, config.corrid_type()) {
        (SeqId::Num(_), Some(DataType::Bytes)) => {
            return Err(Error::invalid(format!(
                "sequence batcher expects a string correlation ID for model '{model}', got a number"
            )));
        }
        (SeqId::Str(_), Some(dt)) if dt != DataType::Bytes => {
            return Err(Error::invalid(format!(
                "sequence batcher expects a numeric correlation ID for model '{model}', got a string"
            )));
        }
        _ => {}
    }
    let flag = |key: &str| request.parameters.get(key).and_then(ParamValue::as_bool).unwrap_or(false);
    Ok((id, flag("sequence_start"), flag("sequence_end")))
}

fn no_correlation_id(model: &str) -> Error {
    Error::invalid(format!("inference request to model '{model}' must specify a non-zero or non-empty correlation ID"))
}

fn log_expired(shared: &Shared, expired: &[SeqId]) {
    for id in expired {
        tracing::info!(model = %shared.spec.name, sequence = %id, "sequence released after idling");
    }
}

/// Forms batches whenever an instance is free and the strategy says go, and releases idle
/// sequences when their time is up.
async fn batcher_task(
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    batches: crossbeam_channel::Sender<Dispatch>,
    stop: CancellationToken,
) {
    loop {
        let permit = permits.clone().try_acquire_owned().ok();
        let step = shared.sequences.lock().next_batch(Instant::now(), permit.is_some());
        log_expired(&shared, &step.expired);
        if let Some(permit) = permit
            && !step.batch.is_empty()
        {
            if batches.send(Dispatch { rows: step.batch, _permit: permit }).is_err() {
                return;
            }
            continue;
        }
        let wake = async {
            match step.wake_at {
                Some(at) => tokio::time::sleep_until(at).await,
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

/// An instance thread: runs dispatched batches until the batcher stops. After each run it
/// takes the next batch itself when the strategy says go now (the sequences it just answered
/// may have their next requests queued already), so a busy instance never waits for the
/// batcher task; when the strategy says wait, the batcher takes over.
fn run_instance(mut session: OnnxSession, shared: &Shared, batches: &crossbeam_channel::Receiver<Dispatch>) {
    crate::engine::priority::apply_to_instance_thread();
    while let Ok(Dispatch { mut rows, _permit: permit }) = batches.recv() {
        loop {
            run::run_batch(&mut session, shared, rows);
            let step = shared.sequences.lock().next_batch(Instant::now(), true);
            log_expired(shared, &step.expired);
            if step.batch.is_empty() {
                break;
            }
            rows = step.batch;
        }
        drop(permit);
        // The batcher may have a batch to form (or a delay or an idle timeout to wait for).
        shared.notify.notify_one();
    }
}
