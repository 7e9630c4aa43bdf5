//! Conversions between the gRPC messages and the engine's request/response types, and from
//! tonic's codec failures to the crate's errors.

use std::collections::HashMap;

use bytes::Bytes;
use tessera_protocol::DataType;
use tessera_protocol::inference::{
    InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse, infer_parameter::ParameterChoice,
    model_infer_response::InferOutputTensor,
};

use tonic::{Code, Status};

use crate::engine::infer::{InferRequest, InferResponse, ParamValue, Parameters, RequestedOutput};
use crate::engine::tensor::{InputTensor, push_bytes_element};
use crate::error::{Error, ErrorKind, Result};

/// Converts gRPC parameters into engine parameters.
pub fn parameters(params: HashMap<String, InferParameter>) -> Parameters {
    params
        .into_iter()
        .filter_map(|(k, v)| {
            let value = match v.parameter_choice? {
                ParameterChoice::BoolParam(b) => ParamValue::Bool(b),
                ParameterChoice::Int64Param(i) => ParamValue::Int(i),
                ParameterChoice::Uint64Param(u) => ParamValue::Uint(u),
                ParameterChoice::DoubleParam(d) => ParamValue::Double(d),
                ParameterChoice::StringParam(s) => ParamValue::Str(s),
            };
            Some((k, value))
        })
        .collect()
}

/// Converts a `ModelInferRequest` into an engine request (model name and version stay outside).
pub fn infer_request(req: ModelInferRequest) -> Result<InferRequest> {
    let raw = req.raw_input_contents;
    let uses_typed = req.inputs.iter().any(|i| i.contents.is_some());
    if !raw.is_empty() && uses_typed {
        return Err(Error::invalid("contents field must not be specified when using raw_input_contents for any input"));
    }
    if !raw.is_empty() && raw.len() != req.inputs.len() {
        return Err(Error::invalid(format!(
            "raw_input_contents has {} entries but the request has {} inputs",
            raw.len(),
            req.inputs.len()
        )));
    }
    let mut raw = raw.into_iter();
    let mut inputs = Vec::with_capacity(req.inputs.len());
    for input in req.inputs {
        let datatype = DataType::from_wire(&input.datatype).ok_or_else(|| {
            Error::invalid(format!("input '{}' has an unknown datatype '{}'", input.name, input.datatype))
        })?;
        let data = match (raw.next(), input.contents) {
            (Some(bytes), _) => bytes,
            (None, Some(contents)) => typed_contents(&input.name, datatype, contents)?,
            (None, None) => Bytes::new(),
        };
        inputs.push(InputTensor { name: input.name, datatype, shape: input.shape, data });
    }
    let outputs = req
        .outputs
        .into_iter()
        .map(|o| RequestedOutput { name: o.name, parameters: parameters(o.parameters) })
        .collect();
    Ok(InferRequest { id: req.id, parameters: parameters(req.parameters), inputs, outputs })
}

/// Packs typed `contents` into little-endian bytes, with range checks for narrow types.
fn typed_contents(name: &str, datatype: DataType, c: InferTensorContents) -> Result<Bytes> {
    fn narrow<T, U: TryFrom<T> + Copy>(name: &str, values: Vec<T>, to_le: impl Fn(U) -> Vec<u8>) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(values.len() * std::mem::size_of::<U>());
        for v in values {
            let v = U::try_from(v)
                .map_err(|_| Error::invalid(format!("a value of input '{name}' is out of range for its datatype")))?;
            out.extend(to_le(v));
        }
        Ok(out)
    }
    let out: Vec<u8> = match datatype {
        DataType::Bool => c.bool_contents.into_iter().map(u8::from).collect(),
        DataType::Uint8 => narrow::<u32, u8>(name, c.uint_contents, |v| vec![v])?,
        DataType::Uint16 => narrow::<u32, u16>(name, c.uint_contents, |v| v.to_le_bytes().to_vec())?,
        DataType::Uint32 => c.uint_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::Uint64 => c.uint64_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::Int8 => narrow::<i32, i8>(name, c.int_contents, |v| v.to_le_bytes().to_vec())?,
        DataType::Int16 => narrow::<i32, i16>(name, c.int_contents, |v| v.to_le_bytes().to_vec())?,
        DataType::Int32 => c.int_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::Int64 => c.int64_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::Fp32 => c.fp32_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::Fp64 => c.fp64_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DataType::Bytes => {
            let mut out = Vec::new();
            for element in &c.bytes_contents {
                push_bytes_element(&mut out, element)?;
            }
            out
        }
        DataType::Fp16 | DataType::Bf16 => {
            return Err(Error::invalid(format!(
                "input '{name}': datatype {datatype} has no typed contents field; send it in raw_input_contents"
            )));
        }
    };
    Ok(Bytes::from(out))
}

/// Converts an engine response into a `ModelInferResponse` with `raw_output_contents`, as Triton does.
pub fn infer_response(resp: InferResponse) -> ModelInferResponse {
    let mut outputs = Vec::with_capacity(resp.outputs.len());
    let mut raw = Vec::with_capacity(resp.outputs.len());
    for out in resp.outputs {
        outputs.push(InferOutputTensor {
            name: out.name,
            datatype: out.datatype.as_wire().to_string(),
            shape: out.shape,
            parameters: HashMap::new(),
            contents: None,
        });
        raw.push(out.data);
    }
    ModelInferResponse {
        model_name: resp.model_name,
        model_version: resp.model_version,
        id: resp.id,
        parameters: HashMap::new(),
        outputs,
        raw_output_contents: raw,
    }
}

/// How tonic 0.14 words a request message over the size limit (its code: OUT_OF_RANGE).
const TOO_LARGE: &str = "Error, decoded message length too large";
/// How tonic 0.14 and tonic-prost word a request message that cannot be read (their code:
/// INTERNAL): not protobuf, compressed data that does not decompress, a message cut short by
/// the end of the stream, a unary call without its message.
const UNREADABLE: [&str; 4] = [
    "failed to decode Protobuf message",
    "Error decompressing",
    "Unexpected EOF decoding stream",
    "Missing request message",
];

/// The crate's error for a request message that tonic's codec refused with a code other than
/// the crate's own: too large is RESOURCE_EXHAUSTED and unreadable is INVALID_ARGUMENT (the
/// client's mistakes), where tonic says OUT_OF_RANGE and INTERNAL. `None` for anything else,
/// which keeps its code (the handlers' own errors, and the protocol errors gRPC says are INTERNAL).
pub fn codec_error(status: &Status) -> Option<Error> {
    let message = status.message();
    let kind = match status.code() {
        Code::OutOfRange if message.starts_with(TOO_LARGE) => ErrorKind::TooLarge,
        Code::Internal if UNREADABLE.iter().any(|p| message.starts_with(p)) => ErrorKind::InvalidArg,
        _ => return None,
    };
    Some(Error::new(kind, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::inference::model_infer_request::InferInputTensor;

    fn tensor(datatype: &str, contents: Option<InferTensorContents>) -> InferInputTensor {
        InferInputTensor { name: "x".into(), datatype: datatype.into(), shape: vec![2], contents, ..Default::default() }
    }

    #[test]
    fn typed_contents_become_little_endian_bytes() {
        let req = ModelInferRequest {
            inputs: vec![
                tensor("INT16", Some(InferTensorContents { int_contents: vec![1, -1], ..Default::default() })),
                tensor(
                    "BYTES",
                    Some(InferTensorContents { bytes_contents: vec![b"ab".to_vec(), vec![]], ..Default::default() }),
                ),
            ],
            ..Default::default()
        };
        let req = infer_request(req).expect("valid");
        assert_eq!(req.inputs[0].data.as_ref(), &[1, 0, 255, 255]);
        assert_eq!(req.inputs[1].data.as_ref(), &[2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
    }

    #[test]
    fn out_of_range_and_mixed_contents_are_rejected() {
        let req = ModelInferRequest {
            inputs: vec![tensor("UINT8", Some(InferTensorContents { uint_contents: vec![256], ..Default::default() }))],
            ..Default::default()
        };
        assert!(infer_request(req).expect_err("range").message.contains("out of range"));
        let req = ModelInferRequest {
            inputs: vec![tensor("INT32", Some(InferTensorContents::default()))],
            raw_input_contents: vec![Bytes::from_static(&[0; 8])],
            ..Default::default()
        };
        assert!(infer_request(req).expect_err("mixed").message.contains("raw_input_contents"));
        let req = ModelInferRequest {
            inputs: vec![tensor("FP16", Some(InferTensorContents::default()))],
            ..Default::default()
        };
        assert!(infer_request(req).is_err());
    }

    /// A gRPC message frame: the compressed flag, the length, the payload.
    fn frame(compressed: u8, len: u32, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![compressed];
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(payload);
        frame
    }

    /// What tonic's own decoder answers for `body` as a stream of requests of at most 1 KiB.
    async fn decoder_status(body: Vec<u8>, encoding: Option<tonic::codec::CompressionEncoding>) -> Status {
        use tonic::codec::Codec as _;
        let decoder = tonic_prost::ProstCodec::<ModelInferResponse, ModelInferRequest>::new().decoder();
        let body = http_body_util::Full::new(Bytes::from(body));
        let mut stream = tonic::codec::Streaming::new_request(decoder, body, encoding, Some(1024));
        stream.message().await.expect_err("the decoder refuses the message")
    }

    #[tokio::test]
    async fn codec_failures_become_the_crates_codes() {
        use tonic::codec::CompressionEncoding::Gzip;
        let cases = [
            (frame(0, 4, &[0xff; 4]), None, ErrorKind::InvalidArg, "failed to decode Protobuf message"),
            (frame(0, 1025, &[]), None, ErrorKind::TooLarge, "length too large"),
            (frame(1, 4, &[0xff; 4]), Some(Gzip), ErrorKind::InvalidArg, "Error decompressing"),
            (frame(0, 10, &[0; 3]), None, ErrorKind::InvalidArg, "Unexpected EOF"),
        ];
        for (body, encoding, kind, words) in cases {
            let status = decoder_status(body, encoding).await;
            let err = codec_error(&status).unwrap_or_else(|| panic!("mapped: {status:?}"));
            assert_eq!(err.kind, kind, "{status:?}");
            assert!(err.message.contains(words), "{}", err.message);
        }
        assert_eq!(
            codec_error(&Status::internal("Missing request message.")).map(|e| e.kind),
            Some(ErrorKind::InvalidArg)
        );
    }

    #[tokio::test]
    async fn other_failures_keep_their_code() {
        // gRPC requires INTERNAL for a compressed flag without an encoding.
        let protocol = decoder_status(frame(1, 4, &[0xff; 4]), None).await;
        assert_eq!(protocol.code(), Code::Internal);
        for status in [protocol, Status::internal("boom"), Status::out_of_range("x"), Status::not_found("x")] {
            assert!(codec_error(&status).is_none(), "{status:?}");
        }
    }
}
