//! gRPC `ModelInferRequest` (protobuf, as tonic decodes it) to the engine's request.
//!
//! Typed `contents` must pack into whole elements, one per value (BYTES: one length-prefixed
//! element per string); the converted request, sent again as `raw_input_contents`, must convert
//! to the same request; what passes the model's check must hold what its shape says.

use prost::Message;
use tessera_data_plane::fuzzing::grpc_infer_request;
use tessera_protocol::DataType;
use tessera_protocol::inference::{InferTensorContents, ModelInferRequest};

use super::http_infer::to_grpc;
use super::infer::{bytes_element_count, check_against_model, same};

/// Decodes `data` as a `ModelInferRequest` and converts it.
pub fn run(data: &[u8]) {
    let Ok(message) = ModelInferRequest::decode(data) else { return };
    let typed = message.raw_input_contents.is_empty();
    let contents: Vec<Option<InferTensorContents>> = message.inputs.iter().map(|i| i.contents.clone()).collect();
    let Ok(request) = grpc_infer_request(message) else { return };

    for (input, contents) in request.inputs.iter().zip(contents) {
        let Some(c) = contents.filter(|_| typed) else { continue };
        match input.datatype.element_size() {
            Some(size) => assert_eq!(input.data.len(), values(input.datatype, &c) * size, "input '{}'", input.name),
            None => assert_eq!(bytes_element_count(&input.data), Some(c.bytes_contents.len() as u64)),
        }
    }

    let again = grpc_infer_request(to_grpc(&request)).expect("a converted request, sent raw, converts");
    assert!(same(&request, &again), "the raw form converts to another request");
    check_against_model(request);
}

/// How many values `contents` holds in the field `datatype` reads.
fn values(datatype: DataType, c: &InferTensorContents) -> usize {
    match datatype {
        DataType::Bool => c.bool_contents.len(),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => c.uint_contents.len(),
        DataType::Uint64 => c.uint64_contents.len(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => c.int_contents.len(),
        DataType::Int64 => c.int64_contents.len(),
        DataType::Fp32 => c.fp32_contents.len(),
        DataType::Fp64 => c.fp64_contents.len(),
        DataType::Fp16 | DataType::Bf16 | DataType::Bytes => unreachable!("{datatype} has no fixed-size typed field"),
    }
}
