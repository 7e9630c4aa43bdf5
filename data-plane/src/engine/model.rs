//! A loaded model version: its checked spec, statistics, and where it executes: its batcher
//! (queue, batcher task and instances) in this process, or a runner process that hosts them.

use std::path::Path;
use std::sync::Arc;
use tokio::time::Instant;

use crate::engine::backend::onnx::OnnxSession;
use crate::engine::backend::providers::ProviderPlan;
use crate::engine::batcher::Batcher;
use crate::engine::batcher::policy::BatchingConfig;
use crate::engine::classification::{self, Labels};
use crate::engine::device::ExecutionTarget;
use crate::engine::infer::{InferRequest, InferResponse, ValidInferRequest};
use crate::engine::model_spec::{ModelIo, ModelSpec, complete_and_check};
use crate::engine::sequence::SequenceBatcher;
use crate::engine::sequence::config::SequenceConfig;
use crate::engine::stats::{FailReason, ModelStats, nanos};
use crate::engine::tensor::OutputTensor;
use crate::engine::warmup;
use crate::error::Result;
use crate::runner::RemoteVersion;
use tessera_protocol::inference::ModelConfig;

/// A model version ready to serve.
pub struct LoadedModel {
    /// The checked configuration.
    pub spec: Arc<ModelSpec>,
    /// Version number.
    pub version: i64,
    /// Statistics, shared with the instance threads (or fed by the runner's answers).
    pub stats: Arc<ModelStats>,
    /// What the ONNX graph declares.
    pub io: ModelIo,
    /// Outputs' class labels (`label_filename`), for the classification extension.
    labels: Labels,
    /// Where requests run; dropped with the model (after the last request finished).
    execution: Execution,
}

/// Where a version's requests run.
enum Execution {
    /// Queue, batcher and instances in this process.
    Local(Batcher),
    /// A stateful model's sequence batcher and instances in this process.
    Sequence(SequenceBatcher),
    /// A runner process hosting them.
    Runner(RemoteVersion),
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel").field("name", &self.spec.name).field("version", &self.version).finish()
    }
}

impl LoadedModel {
    /// Loads `file` as version `version` of `name` with `config` on `target`, starting its
    /// instances (each with its device's execution providers). Blocking.
    pub fn load(
        name: &str,
        version: i64,
        file: &Path,
        config: ModelConfig,
        target: &ExecutionTarget,
    ) -> Result<Self, String> {
        if !file.is_file() {
            return Err(format!("model file {} does not exist", file.display()));
        }
        // The graph's IO completes the config; reading it on CPU needs no provider.
        let probe = OnnxSession::load(file, 1, false, &ProviderPlan::Cpu)?;
        let io = probe.io();
        let spec = Arc::new(complete_and_check(config, name, &io, target)?);
        let model_dir = file.parent().unwrap_or(Path::new("."));
        let labels = Labels::load(&spec, model_dir.parent().unwrap_or(model_dir))?;
        let mut probe = (spec.intra_op_threads == 1 && !spec.spinning).then_some(probe);
        let mut sessions = Vec::with_capacity(spec.instance_count());
        let mut providers = Vec::with_capacity(spec.instance_count());
        for device in &spec.instances {
            let plan = spec.accelerators.plan(*device, model_dir);
            // The probe serves as the first CPU instance when it has that instance's settings.
            let session = match probe.take_if(|_| plan == ProviderPlan::Cpu) {
                Some(probe) => probe,
                None => OnnxSession::load(file, spec.intra_op_threads, spec.spinning, &plan)?,
            };
            providers.push(plan.describe());
            sessions.push(session);
        }
        // Not needed: every instance wanted more threads or a GPU.
        drop(probe);
        // The version directory's parent is the model's: Triton's `warmup/` files live there.
        let samples = warmup::samples(&spec, model_dir.parent().unwrap_or(model_dir))?;
        if !samples.is_empty() {
            let started = std::time::Instant::now();
            for session in &mut sessions {
                warmup::run(session, &spec, &samples)?;
            }
            tracing::info!(
                model = name,
                version,
                samples = samples.len(),
                instances = sessions.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "model version warmed up"
            );
        }
        let stats = Arc::new(ModelStats::default());
        let label = format!("{name}-v{version}");
        let model_root = model_dir.parent().unwrap_or(model_dir);
        let (execution, dynamic) = match SequenceConfig::from_config(&spec.config, sessions.len(), model_root)? {
            Some(sequences) => {
                let batcher = SequenceBatcher::start(spec.clone(), sessions, stats.clone(), sequences, &label)?;
                (Execution::Sequence(batcher), false)
            }
            None => {
                let batching = BatchingConfig::from_config(&spec.config)?;
                let dynamic = batching.dynamic;
                (Execution::Local(Batcher::start(spec.clone(), sessions, stats.clone(), batching, &label)?), dynamic)
            }
        };
        providers.dedup();
        tracing::info!(
            model = name,
            version,
            instances = spec.instance_count(),
            providers = %providers.join(","),
            intra_op_threads = spec.intra_op_threads,
            max_batch_size = spec.max_batch_size,
            dynamic_batching = dynamic,
            "model version loaded"
        );
        Ok(Self { spec, version, stats, io, labels, execution })
    }

    /// A version a runner process loaded from `file`: its spec is completed here from the graph
    /// the runner reported, exactly as the runner completed it (on the same `target`).
    pub fn in_runner(
        name: &str,
        version: i64,
        file: &Path,
        config: ModelConfig,
        io: ModelIo,
        target: &ExecutionTarget,
        remote: RemoteVersion,
    ) -> Result<Self, String> {
        let spec = Arc::new(complete_and_check(config, name, &io, target)?);
        let model_dir = file.parent().and_then(Path::parent).unwrap_or(Path::new("."));
        let labels = Labels::load(&spec, model_dir)?;
        let stats = Arc::new(ModelStats::default());
        Ok(Self { spec, version, stats, io, labels, execution: Execution::Runner(remote) })
    }

    /// Runs one request: check it, queue it for a free instance, await the outputs.
    ///
    /// A request's duration starts once it passed the checks, as in Triton (which validates a
    /// request before it captures the request start), so the statistics' "overhead" compares
    /// like with like; a request that fails the checks is timed from its arrival.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        let received = Instant::now();
        let (classes, valid) = match classification::requested(&request.outputs)
            .and_then(|classes| Ok((classes, ValidInferRequest::new(request, &self.spec)?)))
        {
            Ok(checked) => checked,
            Err(e) => {
                self.stats.record_failure_reason(FailReason::Other);
                self.stats.fail.record(nanos(received.elapsed()));
                return Err(e);
            }
        };
        let id = valid.id.clone();
        let mut outputs = match &self.execution {
            Execution::Local(_) | Execution::Sequence(_) => self.run_valid(valid).await?,
            Execution::Runner(remote) => remote.infer(valid, &self.spec.name, &self.stats).await?,
        };
        if !classes.is_empty() {
            classification::apply(&self.spec, &self.labels, &classes, &mut outputs)?;
        }
        Ok(InferResponse { model_name: self.spec.name.clone(), model_version: self.version.to_string(), id, outputs })
    }

    /// Runs a request already checked against this version's spec (by the front, for a
    /// runner), recording a failure's duration.
    pub async fn run_valid(&self, valid: ValidInferRequest) -> Result<Vec<OutputTensor>> {
        let started = Instant::now();
        let result = match &self.execution {
            Execution::Local(batcher) => batcher.submit(valid, started).await,
            Execution::Sequence(batcher) => batcher.submit(valid, started).await,
            Execution::Runner(remote) => return remote.infer(valid, &self.spec.name, &self.stats).await,
        };
        if result.is_err() {
            self.stats.fail.record(nanos(started.elapsed()));
        }
        result
    }

    /// Requests waiting for an instance (for a runner: sent to it and not answered yet).
    pub fn pending(&self) -> usize {
        match &self.execution {
            Execution::Local(batcher) => batcher.pending(),
            Execution::Sequence(batcher) => batcher.pending(),
            Execution::Runner(remote) => remote.pending(),
        }
    }
}
