//! Inference requests and responses, and the check that turns a request into a
//! [`ValidInferRequest`] for one model (parse, don't validate).

use std::collections::BTreeMap;

use tessera_protocol::DataType;

use crate::engine::cuda_ipc::CudaIo;
use crate::engine::model_spec::{ModelSpec, TensorSpec};
use crate::engine::tensor::{InputTensor, OutputTensor, check_data_size, checked_element_count, fmt_shape};
use crate::error::{Error, Result};

/// A request or tensor parameter value (KServe allows bool, number or string).
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    /// Boolean.
    Bool(bool),
    /// Signed integer.
    Int(i64),
    /// Unsigned integer (gRPC `uint64_param`).
    Uint(u64),
    /// Floating point.
    Double(f64),
    /// String.
    Str(String),
}

impl ParamValue {
    /// The value as a bool when it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            ParamValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The value as a non-negative integer when it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            ParamValue::Int(i) => u64::try_from(*i).ok(),
            ParamValue::Uint(u) => Some(*u),
            _ => None,
        }
    }

    /// The value for messages: numbers and bools as they are, strings only by their kind.
    pub fn describe(&self) -> String {
        match self {
            ParamValue::Bool(b) => b.to_string(),
            ParamValue::Int(i) => i.to_string(),
            ParamValue::Uint(u) => u.to_string(),
            ParamValue::Double(d) => d.to_string(),
            ParamValue::Str(_) => "a string".into(),
        }
    }
}

/// The bool parameter `key`, `None` when absent; an error naming it (and `owner`, e.g.
/// " of output 'x'") when it has another type.
pub fn bool_param(params: &Parameters, key: &str, owner: &str) -> Result<Option<bool>> {
    params
        .get(key)
        .map(|p| {
            p.as_bool()
                .ok_or_else(|| Error::invalid(format!("parameter '{key}'{owner} must be a bool, got {}", p.describe())))
        })
        .transpose()
}

/// Parameters keyed by name.
pub type Parameters = BTreeMap<String, ParamValue>;

/// An output the client asked for, with how it wants it encoded over HTTP.
#[derive(Debug, Clone, Default)]
pub struct RequestedOutput {
    /// Output name.
    pub name: String,
    /// Output parameters (e.g. `binary_data`).
    pub parameters: Parameters,
}

/// An inference request as decoded from HTTP or gRPC, not yet checked against a model.
#[derive(Debug, Clone, Default)]
pub struct InferRequest {
    /// Client-chosen id, echoed back.
    pub id: String,
    /// Request parameters.
    pub parameters: Parameters,
    /// Input tensors in request order.
    pub inputs: Vec<InputTensor>,
    /// Requested outputs; empty means all.
    pub outputs: Vec<RequestedOutput>,
    /// Inputs and outputs in CUDA regions that the runner running the model copies (those
    /// inputs come without bytes); empty when this process copies them itself, or there are none.
    pub cuda: CudaIo,
}

/// A request checked against a model: every input known, typed, shaped and sized correctly.
#[derive(Debug)]
pub struct ValidInferRequest {
    /// Client-chosen id.
    pub id: String,
    /// Request parameters.
    pub parameters: Parameters,
    /// The `priority` parameter, within the model's levels; 0 = the model's default level.
    pub priority: u64,
    /// The `timeout` parameter in microseconds; 0 = none.
    pub timeout_us: u64,
    /// Batch size (1 for models that do not batch).
    pub batch_size: usize,
    /// Inputs in the model's input order; `None` for an optional input left out.
    pub inputs: Vec<Option<InputTensor>>,
    /// Indices into the model's outputs to return, in response order.
    pub outputs: Vec<usize>,
    /// Inputs and outputs in CUDA regions, copied by the runner that runs the model.
    pub cuda: CudaIo,
    /// The request's trace, stamped by the batcher and the instance that run it (off unless
    /// the request was sampled; never sent to a runner).
    pub trace: crate::trace::Trace,
}

/// The engine's answer to one request.
#[derive(Debug, Clone)]
pub struct InferResponse {
    /// Model name.
    pub model_name: String,
    /// Version that ran.
    pub model_version: String,
    /// The request's id.
    pub id: String,
    /// Outputs in the requested order.
    pub outputs: Vec<OutputTensor>,
}

impl ValidInferRequest {
    /// Checks `request` against `spec`.
    pub fn new(request: InferRequest, spec: &ModelSpec) -> Result<Self> {
        let model = &spec.name;
        let mut inputs: Vec<Option<InputTensor>> = vec![None; spec.inputs.len()];
        let mut batch: Option<i64> = None;
        for input in request.inputs {
            let idx = spec.inputs.iter().position(|s| s.name == input.name).ok_or_else(|| {
                Error::invalid(format!("unexpected inference input '{}' for model '{model}'", input.name))
            })?;
            if inputs[idx].is_some() {
                return Err(Error::invalid(format!(
                    "input '{}' appears more than once in the request for model '{model}'",
                    input.name
                )));
            }
            let in_cuda = request.cuda.input(&input.name).map(|r| r.byte_size);
            let input_batch = check_input(&input, &spec.inputs[idx], spec, in_cuda)?;
            match (batch, input_batch) {
                (Some(b), Some(ib)) if b != ib => {
                    return Err(Error::invalid(format!(
                        "inputs of model '{model}' disagree on the batch size: {b} and {ib} (input '{}')",
                        input.name
                    )));
                }
                (None, Some(ib)) => batch = Some(ib),
                _ => {}
            }
            inputs[idx] = Some(input);
        }
        check_missing(&inputs, spec)?;
        check_parameters(&request.parameters)?;
        let (priority, timeout_us) = queue_parameters(&request.parameters, spec)?;
        let outputs = select_outputs(&request.outputs, spec)?;
        Ok(Self {
            id: request.id,
            parameters: request.parameters,
            priority,
            timeout_us,
            batch_size: batch.map_or(1, |b| b as usize),
            inputs,
            outputs,
            cuda: request.cuda,
            trace: crate::trace::Trace::off(),
        })
    }
}

/// Checks one input; returns its batch size when the model batches. An input in a CUDA region
/// (`in_cuda`: its byte size) has no bytes yet: its size is checked against the region's window
/// here, and a BYTES input's elements by the runner once it copied them.
fn check_input(input: &InputTensor, spec: &TensorSpec, model: &ModelSpec, in_cuda: Option<u64>) -> Result<Option<i64>> {
    let name = &input.name;
    if input.datatype != spec.datatype {
        return Err(Error::invalid(format!(
            "inference input '{name}' data-type is '{}', but model '{}' expects '{}'",
            input.datatype, model.name, spec.datatype
        )));
    }
    let count = checked_element_count(name, &input.shape)?;
    let batching = model.max_batch_size > 0;
    if input.shape.len() != spec.dims.len() + usize::from(batching) {
        return Err(shape_error(input, spec, model));
    }
    let (batch, item_shape) = if batching {
        let Some((first, rest)) = input.shape.split_first() else {
            return Err(shape_error(input, spec, model));
        };
        if *first < 1 {
            return Err(Error::invalid(format!(
                "inference request batch-size must be at least 1 for '{}', got {first} for input '{name}'",
                model.name
            )));
        }
        if *first > i64::from(model.max_batch_size) {
            return Err(Error::invalid(format!(
                "inference request batch-size must be <= {} for '{}', got {first} for input '{name}'",
                model.max_batch_size, model.name
            )));
        }
        (Some(*first), rest)
    } else {
        (None, &input.shape[..])
    };
    let fits = item_shape.len() == spec.dims.len()
        && item_shape.iter().zip(&spec.dims).all(|(got, want)| *want == -1 || got == want);
    if !fits {
        return Err(shape_error(input, spec, model));
    }
    match in_cuda {
        None => check_data_size(name, input.datatype, count, &input.data)?,
        Some(bytes) => check_window_size(name, input.datatype, count, bytes)?,
    }
    Ok(batch)
}

/// Checks the byte size of an input in a CUDA region against its shape and datatype (BYTES:
/// the runner counts the elements after the copy).
fn check_window_size(name: &str, datatype: DataType, count: usize, bytes: u64) -> Result<()> {
    let Some(size) = datatype.element_size() else { return Ok(()) };
    let expected =
        count.checked_mul(size).ok_or_else(|| Error::invalid(format!("byte size of input '{name}' overflows")))?;
    if expected as u64 != bytes {
        return Err(Error::invalid(format!(
            "unexpected total byte size {bytes} for input '{name}', expecting {expected}"
        )));
    }
    Ok(())
}

fn shape_error(input: &InputTensor, spec: &TensorSpec, model: &ModelSpec) -> Error {
    Error::invalid(format!(
        "unexpected shape for input '{}' for model '{}'. Expected {}, got {}",
        input.name,
        model.name,
        fmt_shape(&model.full_shape(&spec.dims)),
        fmt_shape(&input.shape)
    ))
}

fn check_missing(inputs: &[Option<InputTensor>], spec: &ModelSpec) -> Result<()> {
    let missing: Vec<String> = spec
        .inputs
        .iter()
        .zip(inputs)
        .filter(|(s, i)| i.is_none() && !s.optional)
        .map(|(s, _)| format!("'{}'", s.name))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let given = inputs.iter().flatten().count();
    Err(Error::invalid(format!(
        "expected {} inputs but got {given} inputs for model '{}'; missing required input(s) [{}]",
        spec.inputs.iter().filter(|s| !s.optional).count(),
        spec.name,
        missing.join(", ")
    )))
}

fn select_outputs(requested: &[RequestedOutput], spec: &ModelSpec) -> Result<Vec<usize>> {
    if requested.is_empty() {
        return Ok((0..spec.outputs.len()).collect());
    }
    let mut selected = Vec::with_capacity(requested.len());
    for out in requested {
        let idx = spec.outputs.iter().position(|s| s.name == out.name).ok_or_else(|| {
            Error::invalid(format!("unexpected inference output '{}' for model '{}'", out.name, spec.name))
        })?;
        if selected.contains(&idx) {
            return Err(Error::invalid(format!("output '{}' is requested more than once", out.name)));
        }
        selected.push(idx);
    }
    Ok(selected)
}

/// Checks the reserved request parameters that hold for both protocols; the batcher reads
/// `priority` and `timeout` itself.
fn check_parameters(params: &Parameters) -> Result<()> {
    if let Some(id) = params.get("sequence_id")
        && !matches!(id, ParamValue::Str(_))
        && id.as_u64().is_none()
    {
        return Err(Error::invalid(format!(
            "parameter 'sequence_id' must be an unsigned integer or a string, got {}",
            id.describe()
        )));
    }
    bool_param(params, "sequence_start", "")?;
    bool_param(params, "sequence_end", "")?;
    check_classification(params, "classification", None)
}

/// The `priority` and `timeout` parameters the batcher queues by. A malformed value, or a
/// priority above the model's levels, is refused: a client must never believe a priority or
/// timeout applies when it does not.
fn queue_parameters(params: &Parameters, spec: &ModelSpec) -> Result<(u64, u64)> {
    let unsigned = |key: &str, what: &str| match params.get(key) {
        None => Ok(0),
        Some(p) => p.as_u64().ok_or_else(|| Error::invalid(format!("parameter '{key}' must be {what}"))),
    };
    let priority = unsigned("priority", "a non-negative integer")?;
    let levels = crate::engine::batcher::policy::priority_levels(&spec.config);
    if priority > levels {
        return Err(Error::invalid(format!(
            "priority {priority} is out of range: this model has {levels} priority level(s)"
        )));
    }
    Ok((priority, unsigned("timeout", "a non-negative integer (microseconds)")?))
}

/// Refuses `classification` as a request parameter: it belongs to each requested output
/// (`crate::engine::classification`); a count of 0 asks for nothing and passes.
fn check_classification(params: &Parameters, key: &str, output: Option<&str>) -> Result<()> {
    let Some(p) = params.get(key) else { return Ok(()) };
    let owner = output.map(|name| format!(" of output '{name}'")).unwrap_or_default();
    match p.as_u64() {
        Some(0) => Ok(()),
        Some(_) => Err(Error::invalid("'classification' is a parameter of each requested output, not of the request")),
        None => Err(Error::invalid(format!(
            "parameter '{key}'{owner} must be a non-negative integer, got {}",
            p.describe()
        ))),
    }
}

/// Whether a datatype may appear in JSON `data` (Triton refuses FP16 and BF16 there).
pub fn json_capable(datatype: DataType) -> bool {
    !matches!(datatype, DataType::Fp16 | DataType::Bf16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model_spec::{IoInfo, ModelIo, complete_and_check};
    use bytes::Bytes;
    use tessera_protocol::inference::ModelConfig;

    fn add_sub() -> ModelSpec {
        let io = |n: &str| IoInfo { name: n.into(), datatype: Some(DataType::Fp32), shape: vec![-1, 16] };
        let io = ModelIo { inputs: vec![io("INPUT0"), io("INPUT1")], outputs: vec![io("OUTPUT0"), io("OUTPUT1")] };
        let config = ModelConfig { max_batch_size: 8, ..Default::default() };
        let host = crate::engine::device::ExecutionTarget { cores: 2, device: crate::engine::device::Device::Host };
        complete_and_check(config, "add_sub", &io, &host).expect("valid spec")
    }

    fn input(name: &str, shape: &[i64], bytes: usize) -> InputTensor {
        InputTensor {
            name: name.into(),
            datatype: DataType::Fp32,
            shape: shape.to_vec(),
            data: Bytes::from(vec![0u8; bytes]),
        }
    }

    fn request(inputs: Vec<InputTensor>) -> InferRequest {
        InferRequest { id: "7".into(), inputs, ..Default::default() }
    }

    fn err(req: InferRequest) -> String {
        ValidInferRequest::new(req, &add_sub()).expect_err("invalid").message
    }

    #[test]
    fn a_good_request_is_accepted_in_model_order() {
        let req = request(vec![input("INPUT1", &[2, 16], 128), input("INPUT0", &[2, 16], 128)]);
        let valid = ValidInferRequest::new(req, &add_sub()).expect("valid");
        assert_eq!(valid.batch_size, 2);
        assert_eq!(valid.inputs[0].as_ref().map(|i| i.name.as_str()), Some("INPUT0"));
        assert_eq!(valid.outputs, vec![0, 1]);
    }

    #[test]
    fn each_bad_request_names_the_problem() {
        let e = err(request(vec![input("INPUT0", &[1, 16], 64)]));
        assert!(e.contains("missing") && e.contains("'INPUT1'"), "{e}");
        let e = err(request(vec![input("INPUT0", &[1, 15], 60), input("INPUT1", &[1, 16], 64)]));
        assert!(e.contains("shape") && e.contains("Expected [-1,16], got [1,15]"), "{e}");
        let e = err(request(vec![input("INPUT0", &[1, 16], 60), input("INPUT1", &[1, 16], 64)]));
        assert!(e.contains("byte size 60") && e.contains("expecting 64"), "{e}");
        let e = err(request(vec![input("X", &[1, 16], 64)]));
        assert!(e.contains("unexpected inference input 'X'"), "{e}");
        let e = err(request(vec![input("INPUT0", &[9, 16], 9 * 64), input("INPUT1", &[9, 16], 9 * 64)]));
        assert!(e.contains("batch-size must be <= 8"), "{e}");
        let e = err(request(vec![input("INPUT0", &[0, 16], 0), input("INPUT1", &[0, 16], 0)]));
        assert!(e.contains("batch-size must be at least 1") && e.contains("got 0"), "{e}");
        let e = err(request(vec![input("INPUT0", &[1, -4], 0), input("INPUT1", &[1, 16], 64)]));
        assert!(e.contains("INPUT0"), "{e}");
        let e = err(request(vec![input("INPUT0", &[1, 16], 64), input("INPUT1", &[2, 16], 128)]));
        assert!(e.contains("batch size"), "{e}");
        let mut wrong_type = input("INPUT0", &[1, 16], 64);
        wrong_type.datatype = DataType::Int32;
        let e = err(request(vec![wrong_type, input("INPUT1", &[1, 16], 64)]));
        assert!(e.contains("'INT32'") && e.contains("expects 'FP32'"), "{e}");
    }

    #[test]
    fn unknown_requested_output_is_rejected() {
        let mut req = request(vec![input("INPUT0", &[1, 16], 64), input("INPUT1", &[1, 16], 64)]);
        req.outputs.push(RequestedOutput { name: "OUTPUT9".into(), ..Default::default() });
        let e = err(req);
        assert!(e.contains("unexpected inference output 'OUTPUT9'"), "{e}");
    }

    #[test]
    fn overflowing_shapes_are_rejected_before_any_allocation() {
        let e =
            err(request(vec![input("INPUT0", &[1, 4_294_967_296, 4_294_967_296], 0), input("INPUT1", &[1, 16], 64)]));
        assert!(e.contains("INPUT0"), "{e}");
    }

    #[test]
    fn an_input_in_a_cuda_region_is_sized_by_its_window() {
        use crate::engine::cuda_ipc::{CudaRef, CudaRegionRef, IpcHandle};
        let window = |byte_size| {
            let region = CudaRegionRef { id: 1, name: "g".into(), handle: IpcHandle([0; 64]), device_id: 0, byte_size };
            CudaRef { region: std::sync::Arc::new(region), offset: 0, byte_size, lease: None }
        };
        let mut req = request(vec![input("INPUT0", &[2, 16], 0), input("INPUT1", &[2, 16], 128)]);
        req.cuda.inputs.push(("INPUT0".into(), window(128)));
        let valid = ValidInferRequest::new(req, &add_sub()).expect("no bytes yet, and the window fits the shape");
        assert_eq!((valid.batch_size, valid.cuda.inputs.len()), (2, 1), "the reference travels on");
        let mut req = request(vec![input("INPUT0", &[2, 16], 0), input("INPUT1", &[2, 16], 128)]);
        req.cuda.inputs.push(("INPUT0".into(), window(64)));
        let e = err(req);
        assert!(e.contains("unexpected total byte size 64 for input 'INPUT0', expecting 128"), "{e}");
    }

    fn good() -> InferRequest {
        request(vec![input("INPUT0", &[1, 16], 64), input("INPUT1", &[1, 16], 64)])
    }

    fn with_params(params: &[(&str, ParamValue)]) -> InferRequest {
        let mut req = good();
        req.parameters = params.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        req
    }

    fn two_levels() -> ModelSpec {
        use tessera_protocol::inference::ModelDynamicBatching;
        use tessera_protocol::inference::model_config::SchedulingChoice;
        let mut spec = add_sub();
        let levels = ModelDynamicBatching { priority_levels: 2, default_priority_level: 2, ..Default::default() };
        spec.config.scheduling_choice = Some(SchedulingChoice::DynamicBatching(levels));
        spec
    }

    #[test]
    fn priority_and_timeout_are_read_once_and_refused_when_malformed() {
        fn valid(params: &[(&str, ParamValue)]) -> Result<ValidInferRequest> {
            ValidInferRequest::new(with_params(params), &two_levels())
        }
        let ok = valid(&[("priority", ParamValue::Int(1)), ("timeout", ParamValue::Uint(10))]).expect("well-formed");
        assert_eq!((ok.priority, ok.timeout_us), (1, 10));
        let none = valid(&[]).expect("no parameters");
        assert_eq!((none.priority, none.timeout_us), (0, 0), "the model's default level, no timeout");
        let e = valid(&[("priority", ParamValue::Int(3))]).expect_err("no level 3").message;
        assert!(e.contains("priority 3"), "{e}");
        for bad in [ParamValue::Int(-5), ParamValue::Double(1.5), ParamValue::Str("abc".into())] {
            let err = valid(&[("timeout", bad)]).expect_err("malformed timeout");
            assert!(err.message.contains("parameter 'timeout'"), "{}", err.message);
            assert_eq!(crate::error::codes_for(err.kind).0.as_u16(), 400);
        }
        let e = valid(&[("priority", ParamValue::Int(-1))]).expect_err("negative").message;
        assert!(e.contains("parameter 'priority' must be a non-negative integer"), "{e}");
    }

    #[test]
    fn sequence_parameters_must_have_their_types() {
        let fine = [
            ("sequence_id", ParamValue::Uint(u64::MAX)),
            ("sequence_id", ParamValue::Int(7)),
            ("sequence_id", ParamValue::Str("abc".into())),
            ("sequence_start", ParamValue::Bool(true)),
            ("sequence_end", ParamValue::Bool(false)),
        ];
        ValidInferRequest::new(with_params(&fine), &add_sub()).expect("well-typed");
        let bad = [
            ("sequence_id", ParamValue::Int(-1), "'sequence_id' must be an unsigned integer or a string, got -1"),
            ("sequence_id", ParamValue::Double(1.5), "'sequence_id'"),
            ("sequence_id", ParamValue::Bool(true), "'sequence_id'"),
            ("sequence_start", ParamValue::Str("yes".into()), "'sequence_start' must be a bool, got a string"),
            ("sequence_end", ParamValue::Int(1), "'sequence_end' must be a bool, got 1"),
        ];
        for (key, value, needle) in bad {
            let e = err(with_params(&[(key, value)]));
            assert!(e.contains(needle), "{key}: {e}");
        }
    }

    #[test]
    fn classification_belongs_to_outputs_not_to_the_request() {
        let mut req = good();
        let parameters = [("classification".to_string(), ParamValue::Int(3))].into_iter().collect();
        req.outputs.push(RequestedOutput { name: "OUTPUT1".into(), parameters });
        assert_eq!(ValidInferRequest::new(req, &add_sub()).map(|v| v.outputs).map_err(|e| e.message), Ok(vec![1]));
        let e = err(with_params(&[("classification", ParamValue::Uint(2))]));
        assert_eq!(e, "'classification' is a parameter of each requested output, not of the request");
    }
}
