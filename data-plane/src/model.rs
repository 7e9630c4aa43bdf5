//! A loaded model version: its checked spec, statistics, and its scheduler (queue, batcher and
//! instances).

use std::path::Path;
use std::sync::Arc;
use tokio::time::Instant;

use crate::backend::onnx::OnnxSession;
use crate::error::Result;
use crate::infer::{InferRequest, InferResponse, ValidInferRequest};
use crate::model_spec::{ModelSpec, complete_and_check};
use crate::scheduler::Scheduler;
use crate::scheduler::policy::BatchingConfig;
use crate::stats::{FailReason, ModelStats, nanos};
use tessera_protocol::inference::ModelConfig;

/// A model version ready to serve.
pub struct LoadedModel {
    /// The checked configuration.
    pub spec: Arc<ModelSpec>,
    /// Version number.
    pub version: i64,
    /// Statistics, shared with the instance threads.
    pub stats: Arc<ModelStats>,
    /// Queue, batcher and instances; dropped with the model (after the last request finished).
    scheduler: Scheduler,
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
        let probe = OnnxSession::load(file, 1, false)?;
        let spec = Arc::new(complete_and_check(config, name, &probe.io(), cores)?);
        let mut sessions = Vec::with_capacity(spec.instance_count);
        if spec.intra_op_threads == 1 && !spec.spinning {
            sessions.push(probe);
        } else {
            drop(probe);
        }
        while sessions.len() < spec.instance_count {
            sessions.push(OnnxSession::load(file, spec.intra_op_threads, spec.spinning)?);
        }
        let stats = Arc::new(ModelStats::default());
        let batching = BatchingConfig::from_config(&spec.config)?;
        let dynamic = batching.dynamic;
        let label = format!("{name}-v{version}");
        let scheduler = Scheduler::start(spec.clone(), sessions, stats.clone(), batching, &label)?;
        tracing::info!(
            model = name,
            version,
            instances = spec.instance_count,
            intra_op_threads = spec.intra_op_threads,
            max_batch_size = spec.max_batch_size,
            dynamic_batching = dynamic,
            "model version loaded"
        );
        Ok(Self { spec, version, stats, scheduler })
    }

    /// Runs one request: check it, queue it for a free instance, await the outputs.
    ///
    /// A request's duration starts once it passed the checks, as in Triton (which validates a
    /// request before it captures the request start), so the statistics' "overhead" compares
    /// like with like; a request that fails the checks is timed from its arrival.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        let received = Instant::now();
        let valid = match ValidInferRequest::new(request, &self.spec) {
            Ok(valid) => valid,
            Err(e) => {
                self.stats.record_failure_reason(FailReason::Other);
                self.stats.fail.record(nanos(received.elapsed()));
                return Err(e);
            }
        };
        let started = Instant::now();
        let id = valid.id.clone();
        match self.scheduler.submit(valid, started).await {
            Ok(outputs) => Ok(InferResponse {
                model_name: self.spec.name.clone(),
                model_version: self.version.to_string(),
                id,
                outputs,
            }),
            Err(e) => {
                self.stats.fail.record(nanos(started.elapsed()));
                Err(e)
            }
        }
    }

    /// Requests waiting for an instance.
    pub fn pending(&self) -> usize {
        self.scheduler.pending()
    }
}
