//! A version's signature: the inputs and outputs a client sends and gets back (KServe names,
//! datatypes and shapes), the largest batch and the platform, worked out at upload from the
//! ONNX graph ([`crate::onnx::GraphIo`]) and the version's model config, the way a worker will
//! when it loads the version (Triton's auto-complete: a config that lists no tensors takes the
//! graph's, and batches by 4 when every tensor has a variable first dimension).
//!
//! Uploads are refused here, naming the tensor and what to do, when no worker could serve them:
//! an input or output that is not a tensor (scikit-learn's ZipMap output is a sequence of maps),
//! a tensor of an element type KServe cannot carry, or a config that contradicts the graph
//! (unknown names, other datatypes, other shapes, batching a graph whose first dimension is
//! fixed). Refusing at upload keeps the version from failing later, on every worker, at deploy.

use serde::{Deserialize, Serialize};
use tessera_protocol::DataType;
use tessera_protocol::inference::ModelConfig;
use utoipa::ToSchema;

use crate::error::{Error, Result};
use crate::onnx::{GraphIo, ValueInfo, ValueType};

/// The batch size a worker gives a model whose config names none, when it can batch.
pub const DEFAULT_MAX_BATCH_SIZE: i64 = 4;
/// The platform of every model Tessera runs.
pub const ONNX_PLATFORM: &str = "onnxruntime_onnx";

/// One input or output of a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TensorSignature {
    /// Tensor name, as requests give it.
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Shape as a request carries it, batch dimension included when the model batches; `-1`
    /// for a dimension of any size (only the batch dimension when the model declares no shape).
    pub shape: Vec<i64>,
}

/// What a version takes and returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Signature {
    /// Inputs, in the model's order.
    pub inputs: Vec<TensorSignature>,
    /// Outputs, in the model's order.
    pub outputs: Vec<TensorSignature>,
    /// Largest batch a request may carry; 0 when the model does not batch (then shapes have
    /// no batch dimension).
    pub max_batch_size: i64,
    /// Triton platform (`onnxruntime_onnx`).
    pub platform: String,
}

/// The KServe datatype of ONNX element type `elem_type`, if Tessera serves it.
fn datatype_of(elem_type: i64) -> Option<DataType> {
    Some(match elem_type {
        1 => DataType::Fp32,
        2 => DataType::Uint8,
        3 => DataType::Int8,
        4 => DataType::Uint16,
        5 => DataType::Int16,
        6 => DataType::Int32,
        7 => DataType::Int64,
        8 => DataType::Bytes,
        9 => DataType::Bool,
        10 => DataType::Fp16,
        11 => DataType::Fp64,
        12 => DataType::Uint32,
        13 => DataType::Uint64,
        16 => DataType::Bf16,
        _ => return None,
    })
}

/// ONNX's name for an element type, for messages.
fn onnx_type_name(elem_type: i64) -> String {
    match elem_type {
        0 => "an undefined element type".into(),
        14 => "complex64".into(),
        15 => "complex128".into(),
        17..=20 => "float8".into(),
        21 => "uint4".into(),
        22 => "int4".into(),
        23 => "float4".into(),
        n => format!("element type {n}"),
    }
}

const SERVED: &str = "BOOL, UINT8-64, INT8-64, FP16, BF16, FP32, FP64 or BYTES (string)";

/// A graph input or output as a worker will see it: name, datatype, full shape (`-1` for any).
#[derive(Debug, Clone, PartialEq)]
struct GraphTensor {
    name: String,
    datatype: DataType,
    /// `None`: the graph declares no shape.
    shape: Option<Vec<i64>>,
}

/// Why a graph value cannot be served, with what to do about it.
fn unservable(role: &str, v: &ValueInfo) -> String {
    let name = &v.name;
    match &v.ty {
        ValueType::Tensor { elem_type, .. } => format!(
            "{role} '{name}' is a tensor of {}, which Tessera does not serve; cast it in the graph to {SERVED}",
            onnx_type_name(*elem_type)
        ),
        ValueType::Sequence | ValueType::Map => {
            let what = if v.ty == ValueType::Sequence { "a sequence" } else { "a map" };
            format!(
                "{role} '{name}' is {what}, not a tensor: Tessera serves tensors only. A scikit-learn classifier \
                 converted by skl2onnx with its default ZipMap has such an output; convert it with \
                 options={{id(model): {{'zipmap': False}}}} (in to_onnx or convert_sklearn) to get the \
                 probabilities as a tensor"
            )
        }
        ValueType::SparseTensor => {
            format!("{role} '{name}' is a sparse tensor: Tessera serves dense tensors only; densify it in the graph")
        }
        ValueType::Optional => format!(
            "{role} '{name}' is an optional value: Tessera serves tensors only; make it a plain tensor in the graph"
        ),
        ValueType::Unknown => format!(
            "{role} '{name}' declares no type: every graph input and output needs a tensor type; export the model \
             again with its inputs and outputs typed"
        ),
    }
}

/// The graph value as a tensor a worker serves, or why it is not one.
fn graph_tensor(role: &str, v: &ValueInfo) -> std::result::Result<GraphTensor, String> {
    match &v.ty {
        ValueType::Tensor { elem_type, shape } => {
            let datatype = datatype_of(*elem_type).ok_or_else(|| unservable(role, v))?;
            let shape = shape.as_ref().map(|dims| dims.iter().map(|d| d.unwrap_or(-1)).collect());
            Ok(GraphTensor { name: v.name.clone(), datatype, shape })
        }
        _ => Err(unservable(role, v)),
    }
}

/// What the config says of one tensor.
struct ConfigTensor<'a> {
    name: &'a str,
    data_type: i32,
    dims: &'a [i64],
}

/// Works out a version's signature from its graph and its config (`config_field` names where
/// the config came from, for messages), or refuses the version, naming the tensor. `artifact`
/// names the ONNX file in messages.
pub fn signature(artifact: &str, io: &GraphIo, config: Option<&ModelConfig>, config_field: &str) -> Result<Signature> {
    let refuse = |message: String| Error::invalid("body", format!("{artifact}: {message}"));
    let default = ModelConfig::default();
    let config = config.unwrap_or(&default);
    // The sequence batcher's control and state tensors and `batch_input` targets are the
    // worker's to fill: a client never sends or sees them, and the config does not list them.
    let provided = tessera_protocol::model_config::server_provided_tensors(config);
    let io = &GraphIo {
        inputs: io.inputs.iter().filter(|v| !provided.contains(&v.name)).cloned().collect(),
        outputs: io.outputs.iter().filter(|v| !provided.contains(&v.name)).cloned().collect(),
    };
    if io.inputs.is_empty() {
        return Err(refuse("the graph has no inputs a request could feed".into()));
    }
    let inputs = io.inputs.iter().map(|v| graph_tensor("input", v)).collect::<std::result::Result<Vec<_>, _>>();
    let inputs = inputs.map_err(refuse)?;
    let listed_outputs: Vec<&str> = config.output.iter().map(|o| o.name.as_str()).collect();
    // With outputs listed, the others are never asked for: only the listed ones must be tensors.
    let outputs = io
        .outputs
        .iter()
        .filter(|o| listed_outputs.is_empty() || listed_outputs.contains(&o.name.as_str()))
        .map(|v| graph_tensor("output", v))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(refuse)?;
    let blame = |message: String| Error::invalid(config_field, format!("{config_field}: {message}"));
    check_platform(config).map_err(blame)?;
    let unspecified = config.input.is_empty() && config.output.is_empty();
    let can_batch = inputs.iter().chain(&outputs).all(|t| t.shape.as_ref().and_then(|s| s.first()) == Some(&-1));
    let max_batch_size = match i64::from(config.max_batch_size) {
        0 if unspecified && can_batch => DEFAULT_MAX_BATCH_SIZE,
        n => n,
    };
    let batching = max_batch_size > 0;
    let config_inputs: Vec<ConfigTensor<'_>> =
        config.input.iter().map(|i| ConfigTensor { name: &i.name, data_type: i.data_type, dims: &i.dims }).collect();
    let config_outputs: Vec<ConfigTensor<'_>> =
        config.output.iter().map(|o| ConfigTensor { name: &o.name, data_type: o.data_type, dims: &o.dims }).collect();
    let inputs = side("input", &inputs, &io.inputs, &config_inputs, batching).map_err(blame)?;
    let outputs = side("output", &outputs, &io.outputs, &config_outputs, batching).map_err(blame)?;
    let platform = if config.platform.is_empty() { ONNX_PLATFORM.to_string() } else { config.platform.clone() };
    Ok(Signature { inputs, outputs, max_batch_size, platform })
}

/// An ensemble's signature: its config's inputs and outputs, which it must declare with their
/// types (there is no graph to learn them from), with the batch dimension first when it batches.
pub fn of_ensemble(config: &ModelConfig, config_field: &str) -> Result<Signature> {
    let blame = |message: String| Error::invalid(config_field, format!("{config_field}: {message}"));
    let batching = config.max_batch_size > 0;
    let side = |role: &str, tensors: Vec<ConfigTensor<'_>>| -> Result<Vec<TensorSignature>> {
        if tensors.is_empty() {
            return Err(blame(format!("an ensemble must declare its {role}s in the config")));
        }
        tensors
            .iter()
            .map(|t| {
                let datatype = tessera_protocol::inference::DataType::try_from(t.data_type)
                    .ok()
                    .and_then(DataType::from_config)
                    .ok_or_else(|| blame(format!("ensemble {role} '{}' needs a data_type", t.name)))?;
                let mut shape = Vec::with_capacity(t.dims.len() + 1);
                if batching {
                    shape.push(-1);
                }
                shape.extend_from_slice(t.dims);
                Ok(TensorSignature { name: t.name.to_string(), datatype, shape })
            })
            .collect()
    };
    let inputs = config.input.iter().map(|i| ConfigTensor { name: &i.name, data_type: i.data_type, dims: &i.dims });
    let outputs = config.output.iter().map(|o| ConfigTensor { name: &o.name, data_type: o.data_type, dims: &o.dims });
    Ok(Signature {
        inputs: side("input", inputs.collect())?,
        outputs: side("output", outputs.collect())?,
        max_batch_size: i64::from(config.max_batch_size),
        platform: tessera_protocol::model_config::ENSEMBLE_PLATFORM.to_string(),
    })
}

/// Only ONNX models run: a config naming another backend would fail on every worker.
fn check_platform(config: &ModelConfig) -> std::result::Result<(), String> {
    let backend_ok = matches!(config.backend.as_str(), "" | "onnxruntime");
    let platform_ok = matches!(config.platform.as_str(), "" | ONNX_PLATFORM);
    if backend_ok && platform_ok {
        return Ok(());
    }
    Err(format!(
        "backend '{}' / platform '{}' is not served: Tessera runs ONNX models (backend \"onnxruntime\", platform \
         \"{ONNX_PLATFORM}\"); leave both out or use those",
        config.backend, config.platform
    ))
}

/// The signature of one side (inputs or outputs): the graph's tensors when the config lists
/// none, else the listed ones, each checked against the graph (`graph`: the side's tensors a
/// worker serves; `all`: every value of the side, for messages).
fn side(
    role: &str,
    graph: &[GraphTensor],
    all: &[ValueInfo],
    listed: &[ConfigTensor<'_>],
    batching: bool,
) -> std::result::Result<Vec<TensorSignature>, String> {
    let names = || all.iter().map(|t| format!("'{}'", t.name)).collect::<Vec<_>>().join(", ");
    if listed.is_empty() {
        return graph.iter().map(|t| batch_checked(role, t, batching)).collect();
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(listed.len());
    for c in listed {
        if !seen.insert(c.name) {
            return Err(format!("{role} '{}' is listed twice", c.name));
        }
        let t = graph.iter().find(|t| t.name == c.name).ok_or_else(|| {
            format!("{role} '{}' is not an {role} of the model; the model's {role}s are {}", c.name, names())
        })?;
        out.push(config_checked(role, t, c, batching)?);
    }
    // A graph input the config leaves out could never be fed: every request would fail.
    if role == "input"
        && let Some(missing) = graph.iter().find(|t| !seen.contains(t.name.as_str()))
    {
        return Err(format!("the model's input '{}' is missing from the config's inputs", missing.name));
    }
    Ok(out)
}

/// A graph tensor's signature when the config says nothing of it: batching needs a variable
/// first dimension, which the batch then takes. A graph that declares no shape for the tensor
/// is not refused (only its worker can tell): its signature shows the batch dimension alone.
fn batch_checked(role: &str, t: &GraphTensor, batching: bool) -> std::result::Result<TensorSignature, String> {
    let Some(shape) = t.shape.clone() else {
        let shape = if batching { vec![-1] } else { Vec::new() };
        return Ok(TensorSignature { name: t.name.clone(), datatype: t.datatype, shape });
    };
    if batching && shape.first() != Some(&-1) {
        return Err(format!(
            "{role} '{}' has shape {} in the model, but max_batch_size > 0 needs a variable first (batch) \
             dimension; set max_batch_size to 0 or export the model with a dynamic batch dimension",
            t.name,
            fmt_shape(&shape)
        ));
    }
    Ok(TensorSignature { name: t.name.clone(), datatype: t.datatype, shape })
}

/// A listed tensor's signature, checked against the graph: same datatype (when the config
/// names one), and config dims (after the batch dimension) that fit the graph's shape.
fn config_checked(
    role: &str,
    t: &GraphTensor,
    c: &ConfigTensor<'_>,
    batching: bool,
) -> std::result::Result<TensorSignature, String> {
    let named = tessera_protocol::inference::DataType::try_from(c.data_type).ok().and_then(DataType::from_config);
    if let Some(d) = named
        && d != t.datatype
    {
        return Err(format!(
            "{role} '{}' is {} in the config but {} in the model",
            t.name,
            d.config_name(),
            t.datatype.config_name()
        ));
    }
    if c.dims.is_empty() {
        return batch_checked(role, t, batching);
    }
    let mut wanted = Vec::with_capacity(c.dims.len() + 1);
    if batching {
        wanted.push(-1);
    }
    wanted.extend_from_slice(c.dims);
    if let Some(model) = &t.shape {
        let fits = wanted.len() == model.len() && wanted.iter().zip(model).all(|(w, m)| *m == -1 || w == m);
        if !fits {
            let hint =
                if batching { " (with max_batch_size > 0 the model needs a variable first dimension)" } else { "" };
            return Err(format!(
                "{role} '{}' has shape {} in the config but {} in the model{hint}",
                t.name,
                fmt_shape(&wanted),
                fmt_shape(model)
            ));
        }
    }
    Ok(TensorSignature { name: t.name.clone(), datatype: t.datatype, shape: wanted })
}

fn fmt_shape(shape: &[i64]) -> String {
    let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, elem_type: i64, dims: &[Option<i64>]) -> ValueInfo {
        ValueInfo { name: name.into(), ty: ValueType::Tensor { elem_type, shape: Some(dims.to_vec()) } }
    }

    fn io(inputs: Vec<ValueInfo>, outputs: Vec<ValueInfo>) -> GraphIo {
        GraphIo { inputs, outputs }
    }

    fn sig(name: &str, datatype: DataType, shape: &[i64]) -> TensorSignature {
        TensorSignature { name: name.into(), datatype, shape: shape.to_vec() }
    }

    fn refused(io: &GraphIo, config: Option<&str>) -> (String, String) {
        let parsed = config.map(|c| tessera_protocol::model_config::from_pbtxt(c).expect("config parses"));
        match signature("model.onnx", io, parsed.as_ref(), "config.pbtxt") {
            Err(Error::InvalidInput { field, message }) => (field.unwrap_or_default(), message),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn mlp() -> GraphIo {
        io(vec![tensor("x", 1, &[None, Some(4)])], vec![tensor("y", 1, &[None, Some(3)])])
    }

    #[test]
    fn a_graph_without_config_batches_by_default_when_it_can() {
        let s = signature("model.onnx", &mlp(), None, "config").unwrap();
        assert_eq!(
            s,
            Signature {
                inputs: vec![sig("x", DataType::Fp32, &[-1, 4])],
                outputs: vec![sig("y", DataType::Fp32, &[-1, 3])],
                max_batch_size: DEFAULT_MAX_BATCH_SIZE,
                platform: ONNX_PLATFORM.into(),
            }
        );
        // A fixed first dimension cannot batch: shapes stay as they are.
        let fixed = io(vec![tensor("x", 7, &[Some(2), Some(4)])], vec![tensor("y", 9, &[])]);
        let s = signature("model.onnx", &fixed, None, "config").unwrap();
        assert_eq!(s.max_batch_size, 0);
        assert_eq!(s.inputs, [sig("x", DataType::Int64, &[2, 4])]);
        assert_eq!(s.outputs, [sig("y", DataType::Bool, &[])]);
        // A tensor without a declared shape is left to the worker.
        let unknown =
            io(vec![ValueInfo { name: "x".into(), ty: ValueType::Tensor { elem_type: 1, shape: None } }], vec![]);
        let parsed = tessera_protocol::model_config::from_pbtxt("max_batch_size: 8").unwrap();
        let u = signature("model.onnx", &unknown, Some(&parsed), "config").unwrap();
        assert_eq!(u.inputs, [sig("x", DataType::Fp32, &[-1])]);
        let wire = serde_json::to_value(&s).unwrap();
        assert_eq!(wire["inputs"][0]["datatype"], "INT64");
        assert_eq!(wire["outputs"][0], serde_json::json!({ "name": "y", "datatype": "BOOL", "shape": [] }));
    }

    #[test]
    fn zipmap_and_other_non_tensors_are_refused_with_a_hint() {
        let zipmap = io(
            vec![tensor("float_input", 1, &[None, Some(4)])],
            vec![
                tensor("output_label", 7, &[None]),
                ValueInfo { name: "output_probability".into(), ty: ValueType::Sequence },
            ],
        );
        let (field, message) = refused(&zipmap, None);
        assert_eq!(field, "body");
        assert!(
            message.starts_with("model.onnx: output 'output_probability' is a sequence, not a tensor"),
            "{message}"
        );
        assert!(message.contains("'zipmap': False"), "{message}");
        // Listing only the label in the config serves the model without its probabilities.
        let config = "max_batch_size: 8 output [ { name: \"output_label\" data_type: TYPE_INT64 dims: [ ] } ]";
        let parsed = tessera_protocol::model_config::from_pbtxt(config).unwrap();
        let s = signature("model.onnx", &zipmap, Some(&parsed), "config.pbtxt").unwrap();
        assert_eq!(s.outputs, [sig("output_label", DataType::Int64, &[-1])]);
        for (ty, says) in [
            (ValueType::Map, "is a map"),
            (ValueType::SparseTensor, "sparse tensor"),
            (ValueType::Optional, "optional value"),
            (ValueType::Unknown, "declares no type"),
            (ValueType::Tensor { elem_type: 14, shape: None }, "tensor of complex64"),
            (ValueType::Tensor { elem_type: 0, shape: None }, "undefined element type"),
        ] {
            let bad = io(vec![ValueInfo { name: "in".into(), ty }], vec![]);
            let (_, message) = refused(&bad, None);
            assert!(message.contains(&format!("input 'in' {says}")) || message.contains(says), "{message}");
        }
        let (_, message) = refused(&io(vec![], vec![tensor("y", 1, &[])]), None);
        assert!(message.contains("no inputs"), "{message}");
    }

    #[test]
    fn configs_that_contradict_the_graph_are_refused_naming_the_tensor() {
        for (config, says) in [
            ("input [ { name: \"z\" data_type: TYPE_FP32 dims: [ 4 ] } ]", "input 'z' is not an input of the model"),
            (
                "max_batch_size: 8 input [ { name: \"x\" data_type: TYPE_INT32 dims: [ 4 ] } ]",
                "TYPE_INT32 in the config but TYPE_FP32",
            ),
            (
                "max_batch_size: 8 input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 5 ] } ]",
                "shape [-1, 5] in the config but [-1, 4]",
            ),
            ("input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] } ]", "shape [4] in the config but [-1, 4]"),
            ("output [ { name: \"q\" data_type: TYPE_FP32 dims: [ 3 ] } ]", "output 'q' is not an output of the model"),
            ("platform: \"tensorrt_plan\"", "platform 'tensorrt_plan' is not served"),
            (
                "max_batch_size: 8 input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] }, { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] } ]",
                "listed twice",
            ),
        ] {
            let (field, message) = refused(&mlp(), Some(config));
            assert_eq!(field, "config.pbtxt", "{config}");
            assert!(message.contains(says), "{config}: {message}");
        }
        // Batching a graph whose first dimension is fixed.
        let fixed = io(vec![tensor("x", 1, &[Some(1), Some(4)])], vec![tensor("y", 1, &[Some(1)])]);
        let (_, message) = refused(&fixed, Some("max_batch_size: 8"));
        assert!(message.contains("needs a variable first (batch) dimension"), "{message}");
        // A graph input the config leaves out.
        let two = io(vec![tensor("a", 1, &[None]), tensor("b", 1, &[None])], vec![tensor("y", 1, &[None])]);
        let (_, message) =
            refused(&two, Some("max_batch_size: 2 input [ { name: \"a\" data_type: TYPE_FP32 dims: [ ] } ]"));
        assert!(message.contains("input 'b' is missing"), "{message}");
    }

    #[test]
    fn consistent_configs_give_their_signature() {
        let config = "max_batch_size: 16 input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] } ] \
                      output [ { name: \"y\" data_type: TYPE_FP32 dims: [ 3 ] } ]";
        let parsed = tessera_protocol::model_config::from_pbtxt(config).unwrap();
        let s = signature("model.onnx", &mlp(), Some(&parsed), "config.pbtxt").unwrap();
        assert_eq!(s.max_batch_size, 16);
        assert_eq!(s.inputs, [sig("x", DataType::Fp32, &[-1, 4])]);
        assert_eq!(s.outputs, [sig("y", DataType::Fp32, &[-1, 3])]);
        // A config that only sets max_batch_size keeps the graph's tensors.
        let parsed = tessera_protocol::model_config::from_pbtxt("max_batch_size: 2").unwrap();
        let s = signature("model.onnx", &mlp(), Some(&parsed), "config.pbtxt").unwrap();
        assert_eq!((s.max_batch_size, s.inputs[0].shape.as_slice()), (2, &[-1, 4][..]));
        // max_batch_size 0 with listed tensors: no batch dimension.
        let parsed =
            tessera_protocol::model_config::from_pbtxt("input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 2, 4 ] } ]")
                .unwrap();
        let s = signature("model.onnx", &mlp(), Some(&parsed), "config.pbtxt").unwrap();
        assert_eq!((s.max_batch_size, s.inputs[0].shape.as_slice()), (0, &[2, 4][..]));
    }

    #[test]
    fn tensors_the_worker_fills_are_neither_asked_of_the_config_nor_shown_to_clients() {
        // Triton's simple_sequence: START and READY are control inputs, ACC_IN/ACC_OUT its state.
        let i32_ = |n: &str| tensor(n, 6, &[None, Some(1)]);
        let graph = io(
            vec![i32_("INPUT"), i32_("START"), i32_("READY"), i32_("ACC_IN")],
            vec![i32_("OUTPUT"), i32_("ACC_OUT")],
        );
        let config = r#"max_batch_size: 8
            input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
            output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
            sequence_batching {
              control_input [
                { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
                { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
              ]
              state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
            }"#;
        let parsed = tessera_protocol::model_config::from_pbtxt(config).expect("config parses");
        let s = signature("model.onnx", &graph, Some(&parsed), "config.pbtxt").expect("Triton's config is taken");
        assert_eq!(s.inputs, [sig("INPUT", DataType::Int32, &[-1, 1])]);
        assert_eq!(s.outputs, [sig("OUTPUT", DataType::Int32, &[-1, 1])]);
        // Without inputs listed, the client's are the graph's less the provided ones.
        let parsed = tessera_protocol::model_config::from_pbtxt(
            &config.replace(r#"input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]"#, ""),
        )
        .expect("config parses");
        let s = signature("model.onnx", &graph, Some(&parsed), "config.pbtxt").expect("auto-completed");
        assert_eq!(s.inputs, [sig("INPUT", DataType::Int32, &[-1, 1])]);
        // A graph input no control of the config names is still a missing input.
        let (field, message) = refused(&graph, Some(&config.replace(r#"name: "READY""#, r#"name: "GO""#)));
        assert_eq!(field, "config.pbtxt");
        assert!(message.contains("input 'READY' is missing from the config's inputs"), "{message}");
        // A graph whose every input the server fills leaves a client nothing to send.
        let only_controls = io(vec![i32_("START")], vec![i32_("OUTPUT")]);
        let (_, message) = refused(
            &only_controls,
            Some(&config.replace(r#"input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]"#, "")),
        );
        assert!(message.contains("no inputs a request could feed"), "{message}");
    }
}
