//! Writes small ONNX models from Rust: the few protobuf messages of the ONNX format that a
//! graph of element-wise operators needs. Tests build their models with it (no Python), and
//! `tessera dev` ships its demo model, [`simple`], generated rather than downloaded.
//!
//! Shapes use `-1` for a symbolic dimension (named `batch`), so a model whose first
//! dimension is `-1` batches the way Triton auto-completes it.

use prost::Message;

/// ONNX element type `FLOAT` (f32).
pub const FLOAT: i32 = 1;
/// ONNX element type `INT32`.
pub const INT32: i32 = 6;
/// ONNX element type `STRING` (Triton's `BYTES`).
pub const STRING: i32 = 8;
/// ONNX element type `INT64`.
const INT64: i32 = 7;
/// ONNX `AttributeProto.AttributeType` `TENSOR`.
const ATTRIBUTE_TENSOR: i32 = 4;

/// ONNX IR version written into every model (ONNX 1.10+, read by every supported ORT).
const IR_VERSION: i64 = 8;
/// Default-domain opset the graphs use.
const OPSET: i64 = 13;

#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(int64, tag = "1")]
    ir_version: i64,
    #[prost(string, tag = "2")]
    producer_name: String,
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "8")]
    opset_import: Vec<OperatorSetIdProto>,
}

#[derive(Clone, PartialEq, Message)]
struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(int64, tag = "2")]
    version: i64,
}

#[derive(Clone, PartialEq, Message)]
struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(message, repeated, tag = "11")]
    input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    output: Vec<ValueInfoProto>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    output: Vec<String>,
    #[prost(string, tag = "3")]
    name: String,
    #[prost(string, tag = "4")]
    op_type: String,
    #[prost(message, repeated, tag = "5")]
    attribute: Vec<AttributeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct AttributeProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "5")]
    t: Option<TensorProto>,
    #[prost(int32, tag = "20")]
    r#type: i32,
}

#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    data_type: i32,
    #[prost(int64, repeated, tag = "7")]
    int64_data: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
struct ValueInfoProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    r#type: Option<TypeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TypeProto {
    #[prost(message, optional, tag = "1")]
    tensor_type: Option<TensorTypeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorTypeProto {
    #[prost(int32, tag = "1")]
    elem_type: i32,
    #[prost(message, optional, tag = "2")]
    shape: Option<TensorShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    dim: Vec<Dimension>,
}

#[derive(Clone, PartialEq, Message)]
struct Dimension {
    #[prost(int64, optional, tag = "1")]
    dim_value: Option<i64>,
    #[prost(string, optional, tag = "2")]
    dim_param: Option<String>,
}

fn value(name: &str, elem_type: i32, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| {
            if *d < 0 {
                Dimension { dim_param: Some("batch".into()), ..Default::default() }
            } else {
                Dimension { dim_value: Some(*d), ..Default::default() }
            }
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto { elem_type, shape: Some(TensorShapeProto { dim }) }),
        }),
    }
}

fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: format!("{op}_{output}"),
        op_type: op.into(),
        attribute: Vec::new(),
    }
}

/// A `Constant` node producing an INT64 tensor of shape `dims` (`[]` = a scalar).
fn int64_constant(output: &str, dims: &[i64], values: &[i64]) -> NodeProto {
    let value = TensorProto { dims: dims.to_vec(), data_type: INT64, int64_data: values.to_vec() };
    NodeProto {
        attribute: vec![AttributeProto { name: "value".into(), t: Some(value), r#type: ATTRIBUTE_TENSOR }],
        ..node("Constant", &[], output)
    }
}

fn model(graph: GraphProto) -> Vec<u8> {
    ModelProto {
        ir_version: IR_VERSION,
        producer_name: "tessera".into(),
        graph: Some(graph),
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: OPSET }],
    }
    .encode_to_vec()
}

/// `OUTPUT0 = INPUT0 + INPUT1`, `OUTPUT1 = INPUT0 - INPUT1`, all of `elem_type` and shape
/// `[-1, 16]`, in a graph called `name`.
pub fn add_sub_of(name: &str, elem_type: i32) -> Vec<u8> {
    let t = |n: &str| value(n, elem_type, &[-1, 16]);
    model(GraphProto {
        name: name.into(),
        node: vec![node("Add", &["INPUT0", "INPUT1"], "OUTPUT0"), node("Sub", &["INPUT0", "INPUT1"], "OUTPUT1")],
        input: vec![t("INPUT0"), t("INPUT1")],
        output: vec![t("OUTPUT0"), t("OUTPUT1")],
    })
}

/// `OUTPUT0 = INPUT0 + INPUT1`, `OUTPUT1 = INPUT0 - INPUT1`, FP32 `[-1, 16]`.
pub fn add_sub() -> Vec<u8> {
    add_sub_of("add_sub", FLOAT)
}

/// The demo model: Triton's quickstart `simple` (INT32 `INPUT0`, `INPUT1` of shape
/// `[-1, 16]`; `OUTPUT0` their sum, `OUTPUT1` their difference), so tritonclient's
/// well-known `simple_http_infer_client` examples run against it unchanged.
pub fn simple() -> Vec<u8> {
    add_sub_of("simple", INT32)
}

/// The Triton model configuration (JSON form) that goes with [`simple`]: batching on, up
/// to 8 requests a batch, as in Triton's quickstart repository.
pub fn simple_config() -> serde_json::Value {
    serde_json::json!({ "max_batch_size": 8 })
}

/// `OUTPUT0 = INPUT0` (FP32 `[-1, 16]`), computed the long way so that a run takes time in
/// proportion to its batch size: every row is copied `copies` times and the copies are added
/// and subtracted back `rounds` times. For tests that need executions of known relative length
/// (concurrent instances finishing out of order) without sleeping in the server.
pub fn busy(copies: i64, rounds: usize) -> Vec<u8> {
    let t = |n: &str| value(n, FLOAT, &[-1, 16]);
    let mut nodes = vec![
        int64_constant("copies", &[3], &[copies, 1, 1]),
        int64_constant("first", &[], &[0]),
        // [batch, 16] broadcast to [copies, batch, 16].
        node("Expand", &["INPUT0", "copies"], "spread"),
    ];
    let mut last = "spread".to_string();
    for i in 0..rounds {
        let (up, down) = (format!("up{i}"), format!("down{i}"));
        nodes.push(node("Add", &[&last, "spread"], &up));
        nodes.push(node("Sub", &[&up, "spread"], &down));
        last = down;
    }
    nodes.push(node("Gather", &[&last, "first"], "OUTPUT0"));
    model(GraphProto { name: "busy".into(), node: nodes, input: vec![t("INPUT0")], output: vec![t("OUTPUT0")] })
}

/// A stateful accumulator for the sequence batcher (INT32, shape `[-1, 1]` throughout): the
/// server feeds `START` and `READY` controls (`int32_false_true: [0, 1]`) and the implicit
/// state `ACC_IN` (the previous request's `ACC_OUT`); `ACC_OUT = ACC_IN * (READY - START) +
/// INPUT`, so a START begins from `INPUT`, and `OUTPUT = ACC_OUT`.
pub fn accumulator() -> Vec<u8> {
    let t = |n: &str| value(n, INT32, &[-1, 1]);
    model(GraphProto {
        name: "accumulator".into(),
        node: vec![
            node("Sub", &["READY", "START"], "keep"),
            node("Mul", &["ACC_IN", "keep"], "kept"),
            node("Add", &["kept", "INPUT"], "ACC_OUT"),
            node("Identity", &["ACC_OUT"], "OUTPUT"),
        ],
        input: vec![t("INPUT"), t("START"), t("READY"), t("ACC_IN")],
        output: vec![t("OUTPUT"), t("ACC_OUT")],
    })
}

/// The config that goes with [`accumulator`].
pub const ACCUMULATOR_CONFIG: &str = r#"max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
"#;

/// `OUTPUT0 = INPUT0` for one element type, shape `[-1, -1]`.
pub fn identity(elem_type: i32) -> Vec<u8> {
    model(GraphProto {
        name: "identity".into(),
        node: vec![node("Identity", &["INPUT0"], "OUTPUT0")],
        input: vec![value("INPUT0", elem_type, &[-1, -1])],
        output: vec![value("OUTPUT0", elem_type, &[-1, -1])],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> GraphProto {
        let model = ModelProto::decode(bytes).expect("our own encoding decodes");
        assert_eq!(model.ir_version, IR_VERSION);
        assert_eq!(model.opset_import[0].version, OPSET);
        model.graph.expect("a graph")
    }

    fn elem_type(v: &ValueInfoProto) -> i32 {
        v.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()).map_or(0, |t| t.elem_type)
    }

    #[test]
    fn simple_is_an_int32_add_sub_with_a_batch_dimension() {
        let graph = decode(&simple());
        assert_eq!(graph.name, "simple");
        let names: Vec<_> = graph.input.iter().chain(&graph.output).map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1"]);
        assert!(graph.input.iter().chain(&graph.output).all(|v| elem_type(v) == INT32));
        let ops: Vec<_> = graph.node.iter().map(|n| (n.op_type.as_str(), n.output[0].as_str())).collect();
        assert_eq!(ops, [("Add", "OUTPUT0"), ("Sub", "OUTPUT1")]);
        let dims = &graph.input[0].r#type.as_ref().and_then(|t| t.tensor_type.as_ref()).and_then(|t| t.shape.as_ref());
        let dims = dims.map(|s| s.dim.clone()).unwrap_or_default();
        assert_eq!(dims[0].dim_param.as_deref(), Some("batch"));
        assert_eq!(dims[1].dim_value, Some(16));
    }

    #[test]
    fn add_sub_and_identity_keep_their_types() {
        assert!(decode(&add_sub()).input.iter().all(|v| elem_type(v) == FLOAT));
        assert_eq!(elem_type(&decode(&identity(STRING)).output[0]), STRING);
    }

    #[test]
    fn busy_spreads_its_input_and_gathers_one_copy_back() {
        let graph = decode(&busy(100, 3));
        let ops: Vec<_> = graph.node.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["Constant", "Constant", "Expand", "Add", "Sub", "Add", "Sub", "Add", "Sub", "Gather"]);
        let copies = graph.node[0].attribute[0].t.as_ref().expect("a tensor");
        assert_eq!((copies.dims.as_slice(), copies.int64_data.as_slice()), (&[3][..], &[100, 1, 1][..]));
        assert_eq!(graph.node.last().map(|n| n.output[0].as_str()), Some("OUTPUT0"));
    }

    #[test]
    fn simple_config_parses_as_a_triton_config() {
        let config = tessera_protocol::model_config::from_json(&simple_config().to_string()).expect("valid config");
        assert_eq!(config.max_batch_size, 8);
    }
}
