//! A loaded model version: its checked spec, statistics, and instances running on their own
//! OS threads, each owning one ONNX Runtime session.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tessera_protocol::inference::ModelConfig;
use tokio::sync::oneshot;

use crate::backend::onnx::OnnxSession;
use crate::error::{Error, ErrorKind, Result};
use crate::infer::{InferRequest, InferResponse, ValidInferRequest};
use crate::model_spec::{ModelSpec, complete_and_check};
use crate::stats::{Execution, ModelStats};
use crate::tensor::{InputTensor, OutputTensor};

/// Requests that may wait for a free instance before new ones are refused.
const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// One queued request, carried from a handler to an instance thread.
struct Job {
    request: ValidInferRequest,
    enqueued: Instant,
    /// Handler side awaits the outputs; a closed receiver means the client went away.
    reply: oneshot::Sender<Result<Vec<OutputTensor>>>,
}

/// A model version ready to serve.
pub struct LoadedModel {
    /// The checked configuration.
    pub spec: Arc<ModelSpec>,
    /// Version number.
    pub version: i64,
    /// Statistics, shared with the instance threads.
    pub stats: Arc<ModelStats>,
    /// Handlers send, instance threads receive; dropping the last sender (unload) lets the
    /// instances drain what is queued and exit.
    jobs: crossbeam_channel::Sender<Job>,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel").field("name", &self.spec.name).field("version", &self.version).finish()
    }
}

impl LoadedModel {
    /// Loads `file` as version `version` of `name` with `config`, starting its instances. Blocking.
    pub fn load(name: &str, version: i64, file: &Path, config: ModelConfig, cores: usize) -> Result<Self, String> {
        if !file.is_file() {
            return Err(format!("model file {} does not exist", file.display()));
        }
        let probe = OnnxSession::load(file, 1)?;
        let spec = Arc::new(complete_and_check(config, name, &probe.io(), cores)?);
        let mut sessions = Vec::with_capacity(spec.instance_count);
        if spec.intra_op_threads == 1 {
            sessions.push(probe);
        } else {
            drop(probe);
        }
        while sessions.len() < spec.instance_count {
            sessions.push(OnnxSession::load(file, spec.intra_op_threads)?);
        }
        let stats = Arc::new(ModelStats::default());
        let (jobs, receiver) = crossbeam_channel::bounded(DEFAULT_QUEUE_CAPACITY);
        for (i, session) in sessions.into_iter().enumerate() {
            let (spec, stats, receiver) = (spec.clone(), stats.clone(), receiver.clone());
            std::thread::Builder::new()
                .name(format!("{name}-v{version}-{i}"))
                .spawn(move || run_instance(session, &spec, &stats, &receiver))
                .map_err(|e| format!("failed to start an instance thread: {e}"))?;
        }
        tracing::info!(
            model = name,
            version,
            instances = spec.instance_count,
            intra_op_threads = spec.intra_op_threads,
            max_batch_size = spec.max_batch_size,
            "model version loaded"
        );
        Ok(Self { spec, version, stats, jobs })
    }

    /// Runs one request: check it, queue it for a free instance, await the outputs.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        let arrived = Instant::now();
        let result = self.infer_inner(request).await;
        let ns = u64::try_from(arrived.elapsed().as_nanos()).unwrap_or(u64::MAX);
        match &result {
            Ok(_) => self.stats.success.record(ns),
            Err(_) => self.stats.fail.record(ns),
        }
        result
    }

    async fn infer_inner(&self, request: InferRequest) -> Result<InferResponse> {
        let valid = ValidInferRequest::new(request, &self.spec)?;
        let id = valid.id.clone();
        let (reply, outputs) = oneshot::channel();
        let job = Job { request: valid, enqueued: Instant::now(), reply };
        self.jobs.try_send(job).map_err(|e| match e {
            crossbeam_channel::TrySendError::Full(_) => {
                Error::unavailable(format!("Exceeds maximum queue size for model '{}'", self.spec.name))
            }
            crossbeam_channel::TrySendError::Disconnected(_) => {
                Error::unavailable(format!("model '{}' is unloading", self.spec.name))
            }
        })?;
        let outputs = outputs
            .await
            .map_err(|_| Error::internal(format!("model '{}' stopped before answering", self.spec.name)))??;
        Ok(InferResponse { model_name: self.spec.name.clone(), model_version: self.version.to_string(), id, outputs })
    }
}

/// An instance thread: takes queued jobs until the model is unloaded.
fn run_instance(
    mut session: OnnxSession,
    spec: &ModelSpec,
    stats: &ModelStats,
    jobs: &crossbeam_channel::Receiver<Job>,
) {
    while let Ok(job) = jobs.recv() {
        if job.reply.is_closed() {
            continue; // the client gave up while queued
        }
        stats.queue.record(u64::try_from(job.enqueued.elapsed().as_nanos()).unwrap_or(u64::MAX));
        let parts: Vec<Vec<&InputTensor>> = job.request.inputs.iter().map(|i| i.iter().collect()).collect();
        let result = session.run(spec, &parts, job.request.batch_size, &job.request.outputs);
        let reply = match result {
            Ok((outputs, t)) => {
                stats.compute_input.record(t.input_ns);
                stats.compute_infer.record(t.infer_ns);
                stats.compute_output.record(t.output_ns);
                stats.record_execution(Execution {
                    batch_size: job.request.batch_size as u64,
                    input_ns: t.input_ns,
                    infer_ns: t.infer_ns,
                    output_ns: t.output_ns,
                });
                Ok(outputs)
            }
            Err(message) => {
                tracing::warn!(model = %spec.name, error = %message, "inference failed");
                Err(Error::new(ErrorKind::Internal, message))
            }
        };
        // The receiver may be gone if the client disconnected mid-run; nothing to do then.
        let _ = job.reply.send(reply);
    }
}
