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
use crate::engine::ensemble::{self, Ensemble};
use crate::engine::infer::{InferRequest, InferResponse, ValidInferRequest};
use crate::engine::load_error::LoadError;
use crate::engine::model_spec::{IoInfo, ModelIo, ModelSpec, complete_and_check};
use crate::engine::response_cache::{CacheSlot, ResponseCache};
use crate::engine::sequence::SequenceBatcher;
use crate::engine::sequence::config::SequenceConfig;
use crate::engine::stats::{Execution as Executed, FailReason, ModelStats, nanos};
use crate::engine::tensor::OutputTensor;
use crate::engine::warmup;
use crate::error::Result;
use crate::runner::RemoteVersion;
use crate::trace::{Event, Trace};
use tessera_protocol::inference::ModelConfig;
use tessera_protocol::inference::model_config::SchedulingChoice;

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
    /// The response cache, when the config enables it and the server has one.
    cache: Option<CacheSlot>,
}

/// Where a version's requests run.
enum Execution {
    /// Queue, batcher and instances in this process.
    Local(Batcher),
    /// A stateful model's sequence batcher and instances in this process.
    Sequence(SequenceBatcher),
    /// A runner process hosting them.
    Runner(RemoteVersion),
    /// Steps on other models of the same namespace.
    Ensemble(Ensemble),
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
    ) -> Result<Self, LoadError> {
        if !file.is_file() {
            return Err(LoadError::artifact(format!("model file {} does not exist", file.display())));
        }
        // The graph's IO completes the config; reading it on CPU needs no provider.
        let probe = OnnxSession::load(file, 1, false, &ProviderPlan::Cpu)?;
        let io = probe.io();
        let spec = Arc::new(complete_and_check(config, name, &io, target).map_err(LoadError::configuration)?);
        let model_dir = file.parent().unwrap_or(Path::new("."));
        let labels = Labels::load(&spec, model_dir.parent().unwrap_or(model_dir)).map_err(LoadError::configuration)?;
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
        let model_root = model_dir.parent().unwrap_or(model_dir);
        let sequences =
            SequenceConfig::from_config(&spec.config, sessions.len(), model_root).map_err(LoadError::configuration)?;
        // As in Triton, a sequence model's samples go to the model itself, past the sequence
        // batcher: they give its control inputs too (state inputs start as zeros when left out).
        let (warm_spec, zero_filled) = match &sequences {
            Some(sequences) => (
                crate::engine::sequence::run_spec(&spec, sequences),
                sequences.states.iter().map(|s| s.input_name.clone()).collect(),
            ),
            None => (spec.as_ref().clone(), Vec::new()),
        };
        // The version directory's parent is the model's: Triton's `warmup/` files live there.
        let samples = warmup::samples(&warm_spec, model_root, &zero_filled).map_err(LoadError::configuration)?;
        if !samples.is_empty() {
            let started = std::time::Instant::now();
            for session in &mut sessions {
                warmup::run(session, &warm_spec, &samples).map_err(LoadError::from_runtime)?;
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
        // Starting a batcher fails only without an async runtime or threads to spare.
        let (execution, dynamic) = match sequences {
            Some(sequences) => {
                let batcher = SequenceBatcher::start(spec.clone(), sessions, stats.clone(), sequences, &label)
                    .map_err(LoadError::resources)?;
                (Execution::Sequence(batcher), false)
            }
            None => {
                let batching = BatchingConfig::from_config(&spec.config).map_err(LoadError::configuration)?;
                let dynamic = batching.dynamic;
                let batcher = Batcher::start(spec.clone(), sessions, stats.clone(), batching, &label)
                    .map_err(LoadError::resources)?;
                (Execution::Local(batcher), dynamic)
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
        Ok(Self { spec, version, stats, io, labels, execution, cache: None })
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
    ) -> Result<Self, LoadError> {
        let spec = Arc::new(complete_and_check(config, name, &io, target).map_err(LoadError::configuration)?);
        let model_dir = file.parent().and_then(Path::parent).unwrap_or(Path::new("."));
        let labels = Labels::load(&spec, model_dir).map_err(LoadError::configuration)?;
        let stats = Arc::new(ModelStats::default());
        Ok(Self { spec, version, stats, io, labels, execution: Execution::Runner(remote), cache: None })
    }

    /// An ensemble version from its config alone (it has no model file); its composing models
    /// must be loaded already, `resolve` finds them in the ensemble's namespace.
    pub fn ensemble(
        name: &str,
        version: i64,
        config: ModelConfig,
        resolve: ensemble::Resolve,
    ) -> Result<Self, LoadError> {
        let spec = Arc::new(ensemble::spec_of(config, name).map_err(LoadError::configuration)?);
        let plan = ensemble::Plan::new(&spec).map_err(LoadError::configuration)?;
        let ensemble = Ensemble::new(&spec, plan, resolve)?;
        let info = |t: &crate::engine::model_spec::TensorSpec| IoInfo {
            name: t.name.clone(),
            datatype: Some(t.datatype),
            shape: spec.full_shape(&t.dims),
        };
        let io = ModelIo {
            inputs: spec.inputs.iter().map(info).collect(),
            outputs: spec.outputs.iter().map(info).collect(),
        };
        tracing::info!(model = name, version, steps = ?ensemble.model_names(), "ensemble loaded");
        let stats = Arc::new(ModelStats::default());
        let execution = Execution::Ensemble(ensemble);
        Ok(Self { spec, version, stats, io, labels: Labels::default(), execution, cache: None })
    }

    /// Answers repeated requests from `cache` when the config enables the response cache;
    /// `key` is the manager's key of the model (which names its tenant on workers).
    pub fn with_response_cache(mut self, cache: Option<&Arc<ResponseCache>>, key: &str) -> Self {
        let config = &self.spec.config;
        let mut enabled = config.response_cache.as_ref().is_some_and(|c| c.enable);
        // As in Triton: a stateful or decoupled model's answer depends on more than the request.
        let stateful = matches!(config.scheduling_choice, Some(SchedulingChoice::SequenceBatching(_)));
        if enabled && (stateful || config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled)) {
            tracing::warn!(model = %self.spec.name, "response_cache is ignored for sequence and decoupled models");
            enabled = false;
        }
        self.cache = cache.filter(|_| enabled).map(|cache| CacheSlot::new(cache.clone(), key));
        self
    }

    /// Whether repeated requests may be answered from the response cache.
    pub fn caches_responses(&self) -> bool {
        self.cache.is_some()
    }

    /// Runs one request: check it, queue it for a free instance, await the outputs.
    ///
    /// A request's duration starts once it passed the checks, as in Triton (which validates a
    /// request before it captures the request start), so the statistics' "overhead" compares
    /// like with like; a request that fails the checks is timed from its arrival.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        self.infer_traced(request, Trace::off()).await
    }

    /// [`Self::infer`] for a request that may be traced: the checks passed (REQUEST_START) and
    /// the answer (REQUEST_END) are stamped here, the queue and compute steps by the batcher
    /// and the instance that run it.
    pub async fn infer_traced(&self, request: InferRequest, trace: Trace) -> Result<InferResponse> {
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
        let mut valid = valid;
        if trace.is_on() {
            trace.set_request_id(&id);
            trace.stamp(Event::RequestStart);
            valid.trace = trace.clone();
        }
        let mut outputs = match &self.cache {
            // Inputs in CUDA regions have no bytes here to key on.
            Some(slot) if valid.cuda.is_empty() => self.run_cached(slot, valid, received).await?,
            _ => self.run_valid(valid).await?,
        };
        if !classes.is_empty() {
            classification::apply(&self.spec, &self.labels, &classes, &mut outputs)?;
        }
        trace.stamp(Event::RequestEnd);
        trace.stamp(Event::InferResponseComplete);
        Ok(InferResponse { model_name: self.spec.name.clone(), model_version: self.version.to_string(), id, outputs })
    }

    /// Answers from the response cache, or runs the request and keeps its answer. A hit counts
    /// as a success (from `received`) and a cache hit, as Triton counts it, and nothing else;
    /// a miss's lookup and insert time is its cache-miss time.
    async fn run_cached(
        &self,
        slot: &CacheSlot,
        valid: ValidInferRequest,
        received: Instant,
    ) -> Result<Vec<OutputTensor>> {
        let lookup = Instant::now();
        let key = slot.key(&valid);
        if let Some(outputs) = slot.lookup(&key) {
            self.stats.cache_hit.record(nanos(lookup.elapsed()));
            let total = nanos(received.elapsed());
            // Triton counts a hit as a success that queued for no time, and nothing else.
            self.stats.queue.record(0);
            self.stats.success.record(total);
            self.stats.latency_us.observe(total / 1_000);
            return Ok(outputs.to_vec());
        }
        let lookup_ns = nanos(lookup.elapsed());
        let outputs = self.run_valid(valid).await?;
        let insert = Instant::now();
        slot.insert(key, &outputs);
        self.stats.cache_miss.record(lookup_ns + nanos(insert.elapsed()));
        Ok(outputs)
    }

    /// The ensemble this version runs, if it is one.
    #[cfg(test)]
    pub(crate) fn as_ensemble(&self) -> Option<&Ensemble> {
        match &self.execution {
            Execution::Ensemble(ensemble) => Some(ensemble),
            _ => None,
        }
    }

    /// Runs a request already checked against this version's spec (by the front, for a
    /// runner), recording a failure's duration.
    pub async fn run_valid(&self, valid: ValidInferRequest) -> Result<Vec<OutputTensor>> {
        let started = Instant::now();
        let result = match &self.execution {
            Execution::Local(batcher) => batcher.submit(valid, started).await,
            Execution::Sequence(batcher) => batcher.submit(valid, started).await,
            // A traced request's queue and compute steps come back with the runner's answer.
            Execution::Runner(remote) => return remote.infer(valid, &self.spec.name, &self.stats).await,
            Execution::Ensemble(ensemble) => {
                let batch_size = valid.batch_size as u64;
                let result = ensemble.run(&self.spec, valid).await;
                if result.is_ok() {
                    self.record_ensemble_run(batch_size, nanos(started.elapsed()));
                } else {
                    self.stats.record_failure_reason(FailReason::Other);
                }
                result
            }
        };
        if result.is_err() {
            self.stats.fail.record(nanos(started.elapsed()));
        }
        result
    }

    /// Counts a successful ensemble request as Triton does: one execution of its batch, its
    /// whole time as compute (the steps' own queues and compute count in their models).
    fn record_ensemble_run(&self, batch_size: u64, ns: u64) {
        self.stats.success.record(ns);
        self.stats.latency_us.observe(ns / 1_000);
        self.stats.queue.record(0);
        self.stats.compute_input.record(0);
        self.stats.compute_infer.record(ns);
        self.stats.compute_output.record(0);
        self.stats.record_execution(Executed { batch_size, input_ns: 0, infer_ns: ns, output_ns: 0 });
    }

    /// Requests waiting for an instance (for a runner: sent to it and not answered yet).
    pub fn pending(&self) -> usize {
        match &self.execution {
            Execution::Local(batcher) => batcher.pending(),
            Execution::Sequence(batcher) => batcher.pending(),
            Execution::Runner(remote) => remote.pending(),
            // Its requests wait in the composing models' queues, and count there.
            Execution::Ensemble(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::device::Device;
    use crate::engine::in_flight::Received;
    use crate::engine::load_error::LoadErrorKind;

    /// The kind a load of `file` with the JSON `config` on `device` fails with.
    fn load_kind(file: &Path, config: &str, device: Device) -> std::result::Result<(), LoadErrorKind> {
        let config = tessera_protocol::model_config::from_json(config).expect("a config");
        let target = ExecutionTarget { cores: 1, device };
        LoadedModel::load("add_sub", 1, file, config, &target).map(drop).map_err(|e| e.kind)
    }

    #[tokio::test]
    async fn load_failures_are_classified_where_they_happen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("model.onnx");
        std::fs::write(&good, crate::tools::onnx_builder::add_sub()).expect("write the model");
        let garbage = dir.path().join("garbage.onnx");
        std::fs::write(&garbage, b"not an onnx model").expect("write the garbage");

        assert_eq!(load_kind(&good, "{}", Device::Host), Ok(()));
        assert_eq!(load_kind(&dir.path().join("gone.onnx"), "{}", Device::Host), Err(LoadErrorKind::Artifact));
        assert_eq!(load_kind(&garbage, "{}", Device::Host), Err(LoadErrorKind::Runtime));
        let no_such_output = r#"{"output": [{"name": "NOPE", "data_type": "TYPE_FP32", "dims": [16]}]}"#;
        assert_eq!(load_kind(&good, no_such_output, Device::Host), Err(LoadErrorKind::Configuration));
        let gpu = r#"{"instance_group": [{"kind": "KIND_GPU"}]}"#;
        let cpu_slice = Device::CpuSlice { slice: "cpu-0".into() };
        assert_eq!(load_kind(&good, gpu, cpu_slice), Err(LoadErrorKind::Configuration));
        let warmup = r#"{"model_warmup": [{"name": "w", "batch_size": 1, "inputs": {"NOPE": {"data_type": "TYPE_FP32", "dims": [16], "zero_data": true}}}]}"#;
        assert_eq!(load_kind(&good, warmup, Device::Host), Err(LoadErrorKind::Configuration));
    }

    #[tokio::test]
    async fn a_fast_model_runs_a_lone_request_inline_and_hands_it_over_with_others_received() {
        use futures::FutureExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("model.onnx");
        std::fs::write(&file, crate::tools::onnx_builder::add_sub()).expect("write the model");
        let target = ExecutionTarget { cores: 1, device: Device::Host };
        let model = LoadedModel::load("add_sub", 1, &file, ModelConfig::default(), &target).expect("loads");
        let request = || {
            let input = |name: &str| crate::engine::tensor::InputTensor {
                name: name.into(),
                datatype: tessera_protocol::DataType::Fp32,
                shape: vec![1, 16],
                data: bytes::Bytes::from(vec![0u8; 64]),
            };
            InferRequest { inputs: vec![input("INPUT0"), input("INPUT1")], ..Default::default() }
        };
        // Inline, the answer is ready on the first poll; handed to the instance thread, it is
        // not. The batcher runs inline once its running mean of executions, the cold first ones
        // included, is under its limit: on a loaded machine that takes more than a few.
        let mut inline = false;
        for _ in 0..1000 {
            model.infer(request()).await.expect("runs");
            if model.infer(request()).now_or_never().is_some() {
                inline = true;
                break;
            }
        }
        assert!(inline, "a lone request runs on the calling task");
        let (_this, _behind) = (Received::start(), Received::start());
        assert!(model.infer(request()).now_or_never().is_none(), "with another received it goes to the instance");
        model.infer(request()).await.expect("and is answered from there");
    }
}
