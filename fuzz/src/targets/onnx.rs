//! ONNX upload validation: the control plane's protobuf wire walk over a `ModelProto`.
//!
//! The walk must give the same verdict reading forwards (an archive entry) as seeking (a stored
//! object). What it accepts must decode with prost, a full protobuf decoder, into a model with
//! the parts it claims to have seen; the same bytes cut short by one, or said to be one byte
//! shorter than they are, must be refused.

use std::io::Cursor;

use prost::Message;
use tessera_control_plane::onnx::{OnnxError, Seeking, Streamed, check_model};

/// The `ModelProto` fields the walk looks at (prost skips the others).
#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(int64, tag = "1")]
    ir_version: i64,
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphProto>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    opset_import: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeProto>,
    #[prost(bytes = "vec", repeated, tag = "12")]
    output: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeProto {
    #[prost(bytes = "vec", optional, tag = "4")]
    op_type: Option<Vec<u8>>,
}

/// Walks `data` as an uploaded `.onnx` file.
pub fn run(data: &[u8]) {
    let len = data.len() as u64;
    let streamed = verdict(check_model(&mut Streamed::new(data), len));
    let seeking = verdict(check_model(&mut Seeking::new(Cursor::new(data), len), len));
    assert_eq!(streamed, seeking, "reading forwards and seeking disagree");
    if streamed.is_err() {
        return;
    }
    let model = ModelProto::decode(data).expect("a model the walk accepts is protobuf");
    assert!(model.ir_version != 0 && !model.opset_import.is_empty());
    let graph = model.graph.expect("an accepted model has a graph");
    assert!(!graph.node.is_empty() || !graph.output.is_empty());
    assert!(graph.node.iter().all(|n| n.op_type.is_some()), "every node names its op_type");
    let cut = &data[..data.len() - 1];
    assert!(check_model(&mut Streamed::new(cut), len - 1).is_err(), "a model cut short is accepted");
    assert!(check_model(&mut Streamed::new(data), len - 1).is_err(), "trailing data is accepted");
}

fn verdict<T>(result: Result<T, OnnxError>) -> Result<(), String> {
    result.map(|_| ()).map_err(|e| e.to_string())
}
