//! A model's configuration completed from its ONNX file (Triton's auto-complete) and checked into a
//! [`ModelSpec`] the rest of the engine trusts.

use tessera_protocol::DataType;
use tessera_protocol::inference::model_config::SchedulingChoice;
use tessera_protocol::inference::{self, ModelConfig, ModelDynamicBatching, ModelInput, ModelOutput};

use crate::engine::backend::providers::Accelerators;
use crate::engine::device::{ExecutionTarget, InstanceDevice, instance_devices};
use crate::engine::ragged::{self, RaggedSpec};

/// Triton's default `max_batch_size` for auto-completed models that can batch.
pub const DEFAULT_MAX_BATCH_SIZE: i32 = 4;

/// Name and type of an input or output as declared by the ONNX model itself.
#[derive(Debug, Clone, PartialEq)]
pub struct IoInfo {
    /// Tensor name in the graph.
    pub name: String,
    /// Element type; `None` when ONNX uses a type KServe cannot carry.
    pub datatype: Option<DataType>,
    /// Shape as declared, `-1` for dynamic dimensions.
    pub shape: Vec<i64>,
}

/// What a backend reports about the model file it loaded.
#[derive(Debug, Clone, Default)]
pub struct ModelIo {
    /// Graph inputs.
    pub inputs: Vec<IoInfo>,
    /// Graph outputs.
    pub outputs: Vec<IoInfo>,
}

/// One input or output of a checked model: name, type and dims without the batch dimension.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Dims per batch item (`-1` = any).
    pub dims: Vec<i64>,
    /// Whether a request may leave this input out.
    pub optional: bool,
}

/// A model version's checked configuration.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// Model name (the repository directory name).
    pub name: String,
    /// 0 when the model does not batch; else the largest batch a request may carry.
    pub max_batch_size: u32,
    /// Inputs in config order.
    pub inputs: Vec<TensorSpec>,
    /// Outputs in config order.
    pub outputs: Vec<TensorSpec>,
    /// The instances (sessions on their own threads) to run, each on its device.
    pub instances: Vec<InstanceDevice>,
    /// The execution accelerators GPU instances use (TensorRT, CUDA options).
    pub accelerators: Accelerators,
    /// Intra-op threads per instance.
    pub intra_op_threads: usize,
    /// Whether ORT's idle threads spin (parameter `allow_spinning`, default off).
    pub spinning: bool,
    /// The completed config, as served by the config endpoint.
    pub config: ModelConfig,
    /// Ragged inputs, batch inputs and scattered outputs; `None` for the usual model.
    pub ragged: Option<RaggedSpec>,
}

impl ModelSpec {
    /// How many instances run.
    pub fn instance_count(&self) -> usize {
        self.instances.len()
    }

    /// The full shape of an input or output as clients see it (`-1` batch dim first when batching).
    pub fn full_shape(&self, dims: &[i64]) -> Vec<i64> {
        let mut shape = Vec::with_capacity(dims.len() + 1);
        if self.max_batch_size > 0 {
            shape.push(-1);
        }
        shape.extend_from_slice(dims);
        shape
    }

    /// The platform string reported in model metadata.
    pub fn platform(&self) -> &str {
        if self.config.platform.is_empty() { &self.config.backend } else { &self.config.platform }
    }
}

/// Completes `config` from the model's own IO (Triton's auto-complete) and checks it for a load
/// on `target` (whose device decides where `KIND_GPU` instances may run).
pub fn complete_and_check(
    mut config: ModelConfig,
    model_name: &str,
    io: &ModelIo,
    target: &ExecutionTarget,
) -> Result<ModelSpec, String> {
    check_identity(&mut config, model_name)?;
    check_supported(&config)?;
    if config.max_batch_size < 0 {
        return Err(format!("max_batch_size must be >= 0, got {}", config.max_batch_size));
    }
    // Control and state tensors are the sequence batcher's, and batch inputs the ragged
    // batcher's, not the client's.
    let provided = tessera_protocol::model_config::server_provided_tensors(&config);
    let model_inputs = io.inputs.clone();
    let client_io;
    let io = if provided.is_empty() {
        io
    } else {
        let keep = |t: &&IoInfo| !provided.contains(&t.name);
        client_io = ModelIo {
            inputs: io.inputs.iter().filter(keep).cloned().collect(),
            outputs: io.outputs.iter().filter(keep).cloned().collect(),
        };
        &client_io
    };
    autocomplete(&mut config, io);
    ragged::validate_batch_io(&config)?;
    let batching = config.max_batch_size > 0;
    let inputs =
        config.input.iter().map(|i| check_input(&config.name, i, io, batching)).collect::<Result<Vec<_>, _>>()?;
    let outputs = config
        .output
        .iter()
        .map(|o| check_output(o, io, batching, ragged::is_batch_output(&config, &o.name)))
        .collect::<Result<Vec<_>, _>>()?;
    if inputs.is_empty() {
        return Err("model has no inputs".into());
    }
    check_covers_the_model(&config, io)?;
    let ragged = ragged::spec(&config, &inputs, &outputs, &model_inputs)?;
    let instances = instance_devices(&config, &target.device)?;
    let accelerators = Accelerators::from_config(&config, &target.device)?;
    let intra_op_threads = intra_op_threads(&config, instances.len(), target.cores)?;
    let spinning = match config.parameters.get("allow_spinning").map(|p| p.string_value.trim()) {
        None | Some("false" | "0" | "") => false,
        Some("true" | "1") => true,
        Some(other) => return Err(format!("parameter allow_spinning must be true or false, got '{other}'")),
    };
    Ok(ModelSpec {
        name: model_name.to_string(),
        max_batch_size: config.max_batch_size as u32,
        inputs,
        outputs,
        instances,
        accelerators,
        intra_op_threads,
        spinning,
        config,
        ragged,
    })
}

fn check_identity(config: &mut ModelConfig, model_name: &str) -> Result<(), String> {
    if config.name.is_empty() {
        config.name = model_name.to_string();
    } else if config.name != model_name {
        return Err(format!("config name '{}' does not match the model directory name '{model_name}'", config.name));
    }
    let backend_ok = matches!(config.backend.as_str(), "" | "onnxruntime");
    let platform_ok = matches!(config.platform.as_str(), "" | "onnxruntime_onnx");
    if !backend_ok || !platform_ok {
        return Err(format!(
            "unsupported backend '{}' / platform '{}': this server runs ONNX models (backend \"onnxruntime\")",
            config.backend, config.platform
        ));
    }
    if config.backend.is_empty() {
        config.backend = "onnxruntime".into();
    }
    if config.platform.is_empty() {
        config.platform = "onnxruntime_onnx".into();
    }
    Ok(())
}

/// Refuses what the config asks for that this server does not do, rather than serving the model
/// without it: decoupled responses and ensembles would give wrong answers run as plain
/// requests, and a `reshape` would make requests' shapes mean something
/// else than the client meant.
fn check_supported(config: &ModelConfig) -> Result<(), String> {
    match &config.scheduling_choice {
        Some(SchedulingChoice::EnsembleScheduling(_)) => {
            return Err("ensemble_scheduling is not supported by this server".into());
        }
        Some(SchedulingChoice::DynamicBatching(_) | SchedulingChoice::SequenceBatching(_)) | None => {}
    }
    if config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled) {
        return Err("decoupled models (model_transaction_policy { decoupled: true }) are not supported".into());
    }
    let mut reshaped =
        config.input.iter().map(|i| (&i.name, &i.reshape)).chain(config.output.iter().map(|o| (&o.name, &o.reshape)));
    if let Some((name, _)) = reshaped.find(|(_, r)| r.is_some()) {
        return Err(format!("'{name}' has a reshape, which is not supported by this server"));
    }
    Ok(())
}

/// Every model input must be in the config (a graph input left out could never be fed, and every
/// request would fail inside ONNX Runtime), and no tensor may be listed twice.
fn check_covers_the_model(config: &ModelConfig, io: &ModelIo) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    let mut listed =
        config.input.iter().map(|i| ("input", &i.name)).chain(config.output.iter().map(|o| ("output", &o.name)));
    if let Some((role, name)) = listed.find(|(role, name)| !seen.insert((*role, *name))) {
        return Err(format!("{role} '{name}' is listed twice in the configuration"));
    }
    let missing: Vec<String> = io
        .inputs
        .iter()
        .filter(|m| !config.input.iter().any(|i| i.name == m.name))
        .map(|m| format!("'{}'", m.name))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "configuration expects {} inputs, the model has {}: missing {}",
            config.input.len(),
            io.inputs.len(),
            missing.join(", ")
        ));
    }
    Ok(())
}

/// Fills missing inputs, outputs, datatypes, dims and `max_batch_size` from the model.
fn autocomplete(config: &mut ModelConfig, io: &ModelIo) {
    let unspecified = config.input.is_empty() && config.output.is_empty();
    if unspecified && config.max_batch_size == 0 && can_batch(io) {
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE;
    }
    let strip = usize::from(config.max_batch_size > 0);
    if config.input.is_empty() {
        config.input = io.inputs.iter().map(|i| model_input(i, strip)).collect();
    }
    if config.output.is_empty() {
        config.output = io.outputs.iter().map(|o| model_output(o, strip)).collect();
    }
    // Like Triton's backends: a model that batches and names no scheduling batches dynamically.
    if config.max_batch_size > 1 && config.scheduling_choice.is_none() {
        config.scheduling_choice = Some(SchedulingChoice::DynamicBatching(ModelDynamicBatching::default()));
    }
    for input in &mut config.input {
        if let Some(info) = io.inputs.iter().find(|i| i.name == input.name) {
            fill_type_and_dims(&mut input.data_type, &mut input.dims, info, strip);
        }
    }
    for output in &mut config.output {
        if let Some(info) = io.outputs.iter().find(|o| o.name == output.name) {
            fill_type_and_dims(&mut output.data_type, &mut output.dims, info, strip);
        }
    }
}

/// A model can batch when every input and output has a dynamic first dimension.
fn can_batch(io: &ModelIo) -> bool {
    io.inputs.iter().chain(&io.outputs).all(|t| t.shape.first() == Some(&-1))
}

fn fill_type_and_dims(data_type: &mut i32, dims: &mut Vec<i64>, info: &IoInfo, strip: usize) {
    if *data_type == inference::DataType::TypeInvalid as i32
        && let Some(dt) = info.datatype
    {
        *data_type = dt.to_config() as i32;
    }
    if dims.is_empty() && info.shape.len() > strip {
        *dims = info.shape[strip..].to_vec();
    }
}

fn model_input(info: &IoInfo, strip: usize) -> ModelInput {
    ModelInput {
        name: info.name.clone(),
        data_type: info.datatype.map_or(0, |d| d.to_config() as i32),
        dims: info.shape.get(strip..).unwrap_or_default().to_vec(),
        ..Default::default()
    }
}

fn model_output(info: &IoInfo, strip: usize) -> ModelOutput {
    ModelOutput {
        name: info.name.clone(),
        data_type: info.datatype.map_or(0, |d| d.to_config() as i32),
        dims: info.shape.get(strip..).unwrap_or_default().to_vec(),
        ..Default::default()
    }
}

fn check_input(model: &str, input: &ModelInput, io: &ModelIo, batching: bool) -> Result<TensorSpec, String> {
    let info = io.inputs.iter().find(|i| i.name == input.name).ok_or_else(|| {
        format!(
            "configuration expects input '{}' but the model has no such input; model inputs: {}",
            input.name,
            names(&io.inputs)
        )
    })?;
    // A ragged input reaches the model flat, whatever its config dims say per request.
    let spec =
        check_tensor("input", &input.name, input.data_type, &input.dims, info, batching, !input.allow_ragged_batch)?;
    if input.allow_ragged_batch {
        ragged::check_ragged_input(model, input, info)?;
    }
    Ok(TensorSpec { optional: input.optional, ..spec })
}

/// `scattered`: a batch output, whose dims describe each request's piece, not the model's tensor.
fn check_output(output: &ModelOutput, io: &ModelIo, batching: bool, scattered: bool) -> Result<TensorSpec, String> {
    let info = io.outputs.iter().find(|o| o.name == output.name).ok_or_else(|| {
        format!(
            "configuration expects output '{}' but the model has no such output; model outputs: {}",
            output.name,
            names(&io.outputs)
        )
    })?;
    check_tensor("output", &output.name, output.data_type, &output.dims, info, batching, !scattered)
}

fn check_tensor(
    role: &str,
    name: &str,
    data_type: i32,
    dims: &[i64],
    info: &IoInfo,
    batching: bool,
    match_dims: bool,
) -> Result<TensorSpec, String> {
    let datatype = inference::DataType::try_from(data_type)
        .ok()
        .and_then(DataType::from_config)
        .ok_or_else(|| format!("{role} '{name}' has no valid data_type"))?;
    if info.datatype != Some(datatype) {
        return Err(format!(
            "{role} '{name}' is {} in the configuration but {} in the model",
            datatype.config_name(),
            info.datatype.map_or("an unsupported type", |d| d.config_name())
        ));
    }
    if let Some(d) = dims.iter().find(|d| **d < -1) {
        return Err(format!("{role} '{name}' has an invalid dimension {d}"));
    }
    let mut expected = Vec::with_capacity(dims.len() + 1);
    if batching {
        expected.push(-1);
    }
    expected.extend_from_slice(dims);
    if match_dims && !shapes_compatible(&expected, &info.shape) {
        let config_shape = crate::engine::tensor::fmt_shape(&expected);
        let hint = if batching { " (the model must have a dynamic first dimension to batch)" } else { "" };
        return Err(format!(
            "{role} '{name}' has shape {config_shape} in the configuration but {} in the model{hint}",
            crate::engine::tensor::fmt_shape(&info.shape)
        ));
    }
    Ok(TensorSpec { name: name.to_string(), datatype, dims: dims.to_vec(), optional: false })
}

/// Config dims fit model dims when ranks agree and every fixed model dim matches.
fn shapes_compatible(config: &[i64], model: &[i64]) -> bool {
    config.len() == model.len() && config.iter().zip(model).all(|(c, m)| *m == -1 || *c == *m)
}

fn names(infos: &[IoInfo]) -> String {
    let names: Vec<String> = infos.iter().map(|i| format!("'{}'", i.name)).collect();
    format!("[{}]", names.join(", "))
}

/// Most intra-op threads one instance may ask for: ONNX Runtime starts them all at load, and a
/// config asking for 100,000 hung the load while memory grew without bound.
pub const MAX_INTRA_OP_THREADS: usize = 256;

/// Intra-op threads per instance: the `intra_op_thread_count` parameter, else the cores shared out.
fn intra_op_threads(config: &ModelConfig, instances: usize, cores: usize) -> Result<usize, String> {
    let Some(p) = config.parameters.get("intra_op_thread_count") else {
        return Ok((cores / instances).max(1));
    };
    let n = p
        .string_value
        .trim()
        .parse::<usize>()
        .map_err(|_| format!("parameter intra_op_thread_count must be a whole number, got '{}'", p.string_value))?;
    if n > MAX_INTRA_OP_THREADS {
        return Err(format!("parameter intra_op_thread_count {n} is above the limit of {MAX_INTRA_OP_THREADS}"));
    }
    Ok(n.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::device::Device;
    use inference::model_instance_group::Kind;

    fn host(cores: usize) -> ExecutionTarget {
        ExecutionTarget { cores, device: Device::Host }
    }

    fn io(name: &str, shape: &[i64]) -> IoInfo {
        IoInfo { name: name.into(), datatype: Some(DataType::Fp32), shape: shape.to_vec() }
    }

    fn add_sub_io() -> ModelIo {
        ModelIo {
            inputs: vec![io("INPUT0", &[-1, 16]), io("INPUT1", &[-1, 16])],
            outputs: vec![io("OUTPUT0", &[-1, 16]), io("OUTPUT1", &[-1, 16])],
        }
    }

    #[test]
    fn empty_config_is_completed_from_the_model() {
        let spec = complete_and_check(ModelConfig::default(), "add_sub", &add_sub_io(), &host(2)).expect("completes");
        assert_eq!(spec.max_batch_size, DEFAULT_MAX_BATCH_SIZE as u32);
        assert_eq!(spec.inputs.len(), 2);
        assert_eq!(spec.outputs[1].name, "OUTPUT1");
        assert_eq!(spec.inputs[0].dims, vec![16]);
        assert_eq!(spec.config.name, "add_sub");
        assert_eq!(spec.config.backend, "onnxruntime");
        assert!(matches!(spec.config.scheduling_choice, Some(SchedulingChoice::DynamicBatching(_))));
        assert_eq!(spec.full_shape(&spec.inputs[0].dims), vec![-1, 16]);
    }

    #[test]
    fn fixed_first_dimension_means_no_batching() {
        let io = ModelIo { inputs: vec![io("X", &[3, 4])], outputs: vec![io("Y", &[3, 4])] };
        let spec = complete_and_check(ModelConfig::default(), "m", &io, &host(2)).expect("completes");
        assert_eq!(spec.max_batch_size, 0);
        assert_eq!(spec.inputs[0].dims, vec![3, 4]);
    }

    #[test]
    fn config_naming_a_missing_input_is_rejected_with_the_models_inputs() {
        let config = ModelConfig {
            max_batch_size: 8,
            input: vec![ModelInput { name: "NOPE".into(), data_type: 11, dims: vec![16], ..Default::default() }],
            ..Default::default()
        };
        let err = complete_and_check(config, "m", &add_sub_io(), &host(2)).expect_err("bad input");
        assert!(err.contains("'NOPE'") && err.contains("'INPUT0'"), "{err}");
    }

    #[test]
    fn batching_requires_a_dynamic_first_dimension() {
        let io = ModelIo { inputs: vec![io("X", &[3, 4])], outputs: vec![io("Y", &[3, 4])] };
        let config = ModelConfig { max_batch_size: 8, ..Default::default() };
        let err = complete_and_check(config, "m", &io, &host(2)).expect_err("cannot batch");
        assert!(err.contains("dynamic first dimension"), "{err}");
    }

    #[test]
    fn wrong_datatype_and_name_mismatch_are_rejected() {
        let config = ModelConfig {
            max_batch_size: 8,
            input: vec![ModelInput { name: "INPUT0".into(), data_type: 8, dims: vec![16], ..Default::default() }],
            ..Default::default()
        };
        let err = complete_and_check(config, "m", &add_sub_io(), &host(2)).expect_err("type");
        assert!(err.contains("TYPE_INT32") && err.contains("TYPE_FP32"), "{err}");
        let config = ModelConfig { name: "other".into(), ..Default::default() };
        assert!(complete_and_check(config, "m", &add_sub_io(), &host(2)).is_err());
    }

    #[test]
    fn what_the_server_does_not_do_is_refused_at_load() {
        let refused = |text: &str, expect: &str| {
            let config = tessera_protocol::model_config::from_pbtxt(text).expect("parses");
            let err = complete_and_check(config, "m", &add_sub_io(), &host(2)).expect_err(text);
            assert!(err.contains(expect), "{text}: {err}");
        };
        refused("max_batch_size: 8 model_transaction_policy { decoupled: true }", "decoupled");
        refused(
            "max_batch_size: 8 input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 4, 4 ] reshape { shape: [ 16 ] } } ]",
            "reshape",
        );
        // A model input the config leaves out could never be fed.
        refused(
            "max_batch_size: 8 input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 16 ] } ]",
            "missing 'INPUT1'",
        );
        refused(
            "max_batch_size: 8 input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 16 ] }, \
             { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 16 ] } ]",
            "input 'INPUT0' is listed twice",
        );
        let mut config = ModelConfig::default();
        config
            .parameters
            .insert("intra_op_thread_count".into(), inference::ModelParameter { string_value: "100000".into() });
        let err = complete_and_check(config, "m", &add_sub_io(), &host(2)).expect_err("too many threads");
        assert!(err.contains("above the limit"), "{err}");
    }

    /// Triton's `onnx_batch_input` QA model: every input 1-D, outputs `[-1, -1]`.
    fn batch_input_io() -> ModelIo {
        ModelIo {
            inputs: vec![io("RAGGED_INPUT", &[-1]), io("BATCH_AND_SIZE_INPUT", &[-1]), io("BATCH_INPUT", &[-1])],
            outputs: vec![
                io("RAGGED_OUTPUT", &[-1, -1]),
                io("BATCH_AND_SIZE_OUTPUT", &[-1, -1]),
                io("BATCH_OUTPUT", &[-1, -1]),
            ],
        }
    }

    /// Triton's `onnx_batch_input` QA config (gen_qa_ragged_models.py).
    const BATCH_INPUT_CONFIG: &str = r#"
        max_batch_size: 4
        input [ { name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
        output [ { name: "RAGGED_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "BATCH_AND_SIZE_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "BATCH_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
        batch_input [
          { kind: BATCH_ELEMENT_COUNT target_name: "BATCH_AND_SIZE_INPUT" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" },
          { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "BATCH_INPUT" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" }
        ]
        dynamic_batching { max_queue_delay_microseconds: 1000000 }
    "#;

    fn load(text: &str, io: &ModelIo) -> Result<ModelSpec, String> {
        let config = tessera_protocol::model_config::from_pbtxt(text).expect("parses");
        complete_and_check(config, "m", io, &host(2))
    }

    #[test]
    fn tritons_ragged_config_loads_against_the_flat_model() {
        let spec = load(BATCH_INPUT_CONFIG, &batch_input_io()).expect("loads as in Triton");
        assert_eq!(spec.inputs.len(), 1, "batch inputs are the server's, not the client's");
        assert_eq!(spec.full_shape(&spec.inputs[0].dims), vec![-1, -1]);
        let ragged = spec.ragged.expect("ragged");
        assert_eq!(ragged.ragged, vec![true]);
        assert_eq!(ragged.batch_inputs.len(), 2);
        assert_eq!(ragged.batch_inputs[1].targets, vec!["BATCH_INPUT".to_string()]);
        let plain = complete_and_check(ModelConfig::default(), "add_sub", &add_sub_io(), &host(2)).expect("ok");
        assert!(plain.ragged.is_none(), "a usual model carries nothing ragged");
    }

    #[test]
    fn ragged_configs_the_model_cannot_take_are_refused() {
        let refused = |text: &str, io: &ModelIo, expect: &str| {
            let err = load(text, io).expect_err(text);
            assert!(err.contains(expect), "{text}: {err}");
        };
        // The onnxruntime backend wants the ragged input flat in the model.
        let mut io2d = batch_input_io();
        io2d.inputs[0].shape = vec![-1, -1];
        refused(
            BATCH_INPUT_CONFIG,
            &io2d,
            "unable to load model 'm', configuration expects model provides input with shape [-1]  for ragged input \
             'RAGGED_INPUT', model provides [-1,-1]",
        );
        let optional =
            BATCH_INPUT_CONFIG.replace("allow_ragged_batch: true", "allow_ragged_batch: true optional: true");
        refused(&optional, &batch_input_io(), "which is not supported for optional input");
        let int_target = BATCH_INPUT_CONFIG.replacen(
            "target_name: \"BATCH_AND_SIZE_INPUT\" data_type: TYPE_FP32",
            "target_name: \"BATCH_AND_SIZE_INPUT\" data_type: TYPE_INT32",
            1,
        );
        refused(&int_target, &batch_input_io(), "batch input target 'BATCH_AND_SIZE_INPUT' is TYPE_INT32");
        let unknown =
            BATCH_INPUT_CONFIG.replace("target_name: \"BATCH_INPUT\"", "target_name: [ \"BATCH_INPUT\", \"NOPE\" ]");
        refused(&unknown, &batch_input_io(), "batch input target 'NOPE' is not an input of the model");
        let core = BATCH_INPUT_CONFIG.replacen("source_input: \"RAGGED_INPUT\"", "source_input: \"OTHER\"", 1);
        refused(&core, &batch_input_io(), "unknown source input name 'OTHER' for m");
        let sequence = BATCH_INPUT_CONFIG
            .replace("dynamic_batching { max_queue_delay_microseconds: 1000000 }", "sequence_batching { }");
        assert!(load(&sequence, &batch_input_io()).expect("as in Triton").ragged.is_some(), "with sequences too");
        // A graph input no one feeds: neither configured nor a batch input target.
        let dropped = BATCH_INPUT_CONFIG.replace("target_name: \"BATCH_INPUT\"", "target_name: \"NOPE\"");
        refused(&dropped, &batch_input_io(), "missing 'BATCH_INPUT'");
    }

    #[test]
    fn a_scattered_outputs_dims_need_not_match_the_model() {
        let io = ModelIo { inputs: vec![io("X", &[-1])], outputs: vec![io("Y", &[-1])] };
        let text = r#"
            max_batch_size: 8
            input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
            output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
            batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "Y" source_input: "X" } ]
        "#;
        let spec = load(text, &io).expect("Y is [-1] in the model, [-1, -1] per request");
        let scatter = &spec.ragged.expect("ragged").scatters[0];
        assert_eq!((scatter.output, scatter.source, scatter.shape.clone()), (0, 0, vec![-1, -1]));
        let unscattered = text.replace(
            "batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: \"Y\" source_input: \"X\" } ]",
            "",
        );
        assert!(load(&unscattered, &io).is_err(), "without batch_output Y's dims must match");
    }

    #[test]
    fn instances_and_threads_come_from_the_config() {
        let mut config = ModelConfig::default();
        config.instance_group.push(inference::ModelInstanceGroup {
            count: 2,
            kind: Kind::Cpu as i32,
            ..Default::default()
        });
        let spec = complete_and_check(config.clone(), "m", &add_sub_io(), &host(4)).expect("ok");
        assert_eq!((spec.instance_count(), spec.intra_op_threads), (2, 2));
        config
            .parameters
            .insert("intra_op_thread_count".into(), inference::ModelParameter { string_value: "3".into() });
        let spec = complete_and_check(config.clone(), "m", &add_sub_io(), &host(4)).expect("ok");
        assert_eq!(spec.intra_op_threads, 3);
        config.instance_group[0].count = 0;
        let spec = complete_and_check(config.clone(), "m", &add_sub_io(), &host(4)).expect("ok");
        assert_eq!(spec.instance_count(), 1, "an unset count means one, as in Triton");
        config.instance_group[0].count = 100_000;
        let err = complete_and_check(config.clone(), "m", &add_sub_io(), &host(4)).expect_err("too many");
        assert!(err.contains("100000 instances") && err.contains("at most 64"), "{err}");
        config.instance_group[0].count = 1;
        config.instance_group[0].kind = Kind::Gpu as i32;
        let spec = complete_and_check(config.clone(), "m", &add_sub_io(), &host(4)).expect("the host has GPU 0");
        assert_eq!(spec.instances, vec![InstanceDevice::Gpu { device_id: 0, memory_limit_bytes: None }]);
        let cpu_slice = ExecutionTarget { cores: 4, device: Device::CpuSlice { slice: "cpu-0".into() } };
        let err = complete_and_check(config, "m", &add_sub_io(), &cpu_slice).expect_err("no gpu");
        assert!(err.contains("KIND_GPU needs a GPU, but replica's slice cpu-0 is a CPU slice"), "{err}");
    }
}
