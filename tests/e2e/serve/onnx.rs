//! Writes small ONNX models from Rust (a few protobuf messages of the ONNX format), so these
//! tests need no Python to make their models.

use prost::Message;

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

/// ONNX element type numbers.
pub const FLOAT: i32 = 1;
/// ONNX string.
pub const STRING: i32 = 8;

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
    }
}

fn model(graph: GraphProto) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        producer_name: "tessera-tests".into(),
        graph: Some(graph),
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 13 }],
    }
    .encode_to_vec()
}

/// `OUTPUT0 = INPUT0 + INPUT1`, `OUTPUT1 = INPUT0 - INPUT1`, FP32 `[-1, 16]`.
pub fn add_sub() -> Vec<u8> {
    let t = |n: &str| value(n, FLOAT, &[-1, 16]);
    model(GraphProto {
        name: "add_sub".into(),
        node: vec![node("Add", &["INPUT0", "INPUT1"], "OUTPUT0"), node("Sub", &["INPUT0", "INPUT1"], "OUTPUT1")],
        input: vec![t("INPUT0"), t("INPUT1")],
        output: vec![t("OUTPUT0"), t("OUTPUT1")],
    })
}

/// `OUTPUT0 = INPUT0` for one element type, shape `[-1, -1]`.
pub fn identity(elem_type: i32) -> Vec<u8> {
    model(GraphProto {
        name: "identity".into(),
        node: vec![node("Identity", &["INPUT0"], "OUTPUT0")],
        input: vec![value("INPUT0", elem_type, &[-1, -1])],
        output: vec![value("OUTPUT0", elem_type, &[-1, -1])],
    })
}
