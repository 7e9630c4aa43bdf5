//! The KServe v2 HTTP infer body: JSON, with Triton's binary tensor data extension.
//!
//! Input: the body, or `#<Inference-Header-Content-Length>\n<body>`. A decoded request is
//! written again with every tensor in a binary tail and must decode to the same request; that
//! body with a byte more or less in its tail must be refused (declared sizes must add up). It
//! must also decode the same as the gRPC form of the same request. What passes the model's
//! check must hold what its shape says.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tessera_data_plane::engine::infer::{InferRequest, ParamValue, Parameters};
use tessera_data_plane::fuzzing::{decode_http_infer, grpc_infer_request};
use tessera_protocol::inference::infer_parameter::ParameterChoice;
use tessera_protocol::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use tessera_protocol::inference::{InferParameter, ModelInferRequest};

use super::infer::{check_against_model, same};

/// Decodes `data` as an HTTP infer body.
pub fn run(data: &[u8]) {
    let (header_length, body) = split(data);
    let Ok(request) = decode_http_infer(&Bytes::copy_from_slice(body), header_length.as_deref()) else { return };

    let (json, tail) = binary_body(&request);
    let length = json.len().to_string();
    let whole = Bytes::from([json.as_slice(), tail.as_slice()].concat());
    let again = decode_http_infer(&whole, Some(&length)).expect("a decoded request, written back, decodes");
    assert!(same(&request, &again), "the binary form decodes to another request");
    let longer = Bytes::from([whole.as_ref(), b"\0"].concat());
    assert!(decode_http_infer(&longer, Some(&length)).is_err(), "a tail longer than declared is accepted");
    if !tail.is_empty() {
        let shorter = whole.slice(..whole.len() - 1);
        assert!(decode_http_infer(&shorter, Some(&length)).is_err(), "a tail shorter than declared is accepted");
    }

    let grpc = grpc_infer_request(to_grpc(&request)).expect("the gRPC form of a decoded request converts");
    assert!(same(&request, &grpc), "the gRPC form converts to another request");
    check_against_model(request);
}

/// Splits off the `#<header length>\n` prefix, if any.
fn split(data: &[u8]) -> (Option<String>, &[u8]) {
    let Some(rest) = data.strip_prefix(b"#") else { return (None, data) };
    let Some(newline) = rest.iter().position(|b| *b == b'\n') else { return (None, data) };
    (Some(String::from_utf8_lossy(&rest[..newline]).into_owned()), &rest[newline + 1..])
}

/// The request as a JSON header with every tensor's bytes in the binary tail.
fn binary_body(request: &InferRequest) -> (Vec<u8>, Vec<u8>) {
    let mut tail = Vec::new();
    let inputs: Vec<Value> = request
        .inputs
        .iter()
        .map(|t| {
            tail.extend_from_slice(&t.data);
            json!({
                "name": t.name, "shape": t.shape, "datatype": t.datatype.as_wire(),
                "parameters": {"binary_data_size": t.data.len()},
            })
        })
        .collect();
    let outputs: Vec<Value> =
        request.outputs.iter().map(|o| json!({"name": o.name, "parameters": json_parameters(&o.parameters)})).collect();
    let header = json!({
        "id": request.id, "parameters": json_parameters(&request.parameters), "inputs": inputs, "outputs": outputs,
    });
    (serde_json::to_vec(&header).expect("a JSON value serializes"), tail)
}

fn json_parameters(parameters: &Parameters) -> Map<String, Value> {
    let value = |v: &ParamValue| match v {
        ParamValue::Bool(b) => json!(b),
        ParamValue::Int(i) => json!(i),
        ParamValue::Uint(u) => json!(u),
        // Decoded from JSON, so finite.
        ParamValue::Double(d) => json!(d),
        ParamValue::Str(s) => json!(s),
    };
    parameters.iter().map(|(k, v)| (k.clone(), value(v))).collect()
}

/// The request as a gRPC `ModelInferRequest` with `raw_input_contents`.
pub fn to_grpc(request: &InferRequest) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "fuzz".into(),
        model_version: String::new(),
        id: request.id.clone(),
        parameters: grpc_parameters(&request.parameters),
        inputs: request
            .inputs
            .iter()
            .map(|t| InferInputTensor {
                name: t.name.clone(),
                datatype: t.datatype.as_wire().into(),
                shape: t.shape.clone(),
                parameters: HashMap::new(),
                contents: None,
            })
            .collect(),
        outputs: request
            .outputs
            .iter()
            .map(|o| InferRequestedOutputTensor { name: o.name.clone(), parameters: grpc_parameters(&o.parameters) })
            .collect(),
        raw_input_contents: request.inputs.iter().map(|t| t.data.clone()).collect(),
    }
}

fn grpc_parameters(parameters: &Parameters) -> HashMap<String, InferParameter> {
    let choice = |v: &ParamValue| match v {
        ParamValue::Bool(b) => ParameterChoice::BoolParam(*b),
        ParamValue::Int(i) => ParameterChoice::Int64Param(*i),
        ParamValue::Uint(u) => ParameterChoice::Uint64Param(*u),
        ParamValue::Double(d) => ParameterChoice::DoubleParam(*d),
        ParamValue::Str(s) => ParameterChoice::StringParam(s.clone()),
    };
    parameters.iter().map(|(k, v)| (k.clone(), InferParameter { parameter_choice: Some(choice(v)) })).collect()
}
