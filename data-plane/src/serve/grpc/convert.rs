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
use crate::serve::shared_memory::tensors::{self as shm, OutputRegions, ShmInput, ShmInputs, ShmRef};

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
/// The inputs whose bytes are in shared memory come back apart, their tensors still empty; as
/// in Triton, `raw_input_contents` holds one entry per input that is not.
pub fn infer_request(req: ModelInferRequest) -> Result<(InferRequest, ShmInputs)> {
    let raw = req.raw_input_contents;
    if let Some(typed) = req.inputs.iter().find(|i| i.contents.is_some()).filter(|_| !raw.is_empty()) {
        // Triton's wording, naming the first input that has typed contents.
        return Err(Error::invalid(format!(
            "contents field must not be specified when using raw_input_contents for '{}' for model '{}'",
            typed.name, req.model_name
        )));
    }
    let mut shm_inputs = ShmInputs::new();
    let mut inputs = Vec::with_capacity(req.inputs.len());
    let mut raw = raw.into_iter();
    let raw_len = raw.len();
    for input in req.inputs {
        let datatype = DataType::from_wire(&input.datatype).ok_or_else(|| {
            Error::invalid(format!("input '{}' has an unknown datatype '{}'", input.name, input.datatype))
        })?;
        let in_shm = match input.parameters.is_empty() {
            true => None,
            false => shm::parse(&parameters(input.parameters), &input.name)?,
        };
        let data = match (in_shm, input.contents) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(format!(
                    "unexpected 'content' provided when using shared memory for input tensor '{}' for model '{}'",
                    input.name, req.model_name
                )));
            }
            (Some(at), None) => {
                shm_inputs.push(ShmInput { index: inputs.len(), at });
                Bytes::new()
            }
            (None, Some(contents)) => typed_contents(&input.name, datatype, contents)?,
            (None, None) => raw.next().unwrap_or_default(),
        };
        inputs.push(InputTensor { name: input.name, datatype, shape: input.shape, data });
    }
    let expected = inputs.len() - shm_inputs.len();
    if raw_len != 0 && raw_len != expected {
        let what = if shm_inputs.is_empty() { "inputs" } else { "inputs outside shared memory" };
        return Err(Error::invalid(format!(
            "raw_input_contents has {raw_len} entries but the request has {expected} {what}"
        )));
    }
    let outputs = req
        .outputs
        .into_iter()
        .map(|o| RequestedOutput { name: o.name, parameters: parameters(o.parameters) })
        .collect();
    let request =
        InferRequest { id: req.id, parameters: parameters(req.parameters), inputs, outputs, cuda: Default::default() };
    Ok((request, shm_inputs))
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
/// An output written to shared memory (`shm`) carries its region's parameters and an empty raw
/// entry: as in Triton, the entries stay one per output, which `tritonclient` indexes by position.
pub fn infer_response(resp: InferResponse, shm: Option<&OutputRegions>) -> ModelInferResponse {
    let mut outputs = Vec::with_capacity(resp.outputs.len());
    let mut raw = Vec::with_capacity(resp.outputs.len());
    for out in resp.outputs {
        let parameters = match shm.and_then(|s| s.find(&out.name)) {
            Some(at) => shm_parameters(at),
            None => HashMap::new(),
        };
        outputs.push(InferOutputTensor {
            name: out.name,
            datatype: out.datatype.as_wire().to_string(),
            shape: out.shape,
            parameters,
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

/// The parameters that say where an output in shared memory went.
fn shm_parameters(at: &ShmRef) -> HashMap<String, InferParameter> {
    let param = |choice| InferParameter { parameter_choice: Some(choice) };
    let offset = i64::try_from(at.offset).unwrap_or(i64::MAX);
    let byte_size = i64::try_from(at.byte_size).unwrap_or(i64::MAX);
    HashMap::from([
        (shm::REGION.to_string(), param(ParameterChoice::StringParam(at.region.clone()))),
        (shm::OFFSET.to_string(), param(ParameterChoice::Int64Param(offset))),
        (shm::BYTE_SIZE.to_string(), param(ParameterChoice::Int64Param(byte_size))),
    ])
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
        let (req, _) = infer_request(req).expect("valid");
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
            model_name: "m".into(),
            inputs: vec![tensor("INT32", Some(InferTensorContents::default()))],
            raw_input_contents: vec![Bytes::from_static(&[0; 8])],
            ..Default::default()
        };
        assert_eq!(
            infer_request(req).expect_err("mixed").message,
            "contents field must not be specified when using raw_input_contents for 'x' for model 'm'"
        );
        let req = ModelInferRequest {
            inputs: vec![tensor("FP16", Some(InferTensorContents::default()))],
            ..Default::default()
        };
        assert!(infer_request(req).is_err());
    }

    fn shm_parameters_of(region: &str, byte_size: i64) -> HashMap<String, InferParameter> {
        let param = |choice| InferParameter { parameter_choice: Some(choice) };
        HashMap::from([
            (shm::REGION.to_string(), param(ParameterChoice::StringParam(region.into()))),
            (shm::BYTE_SIZE.to_string(), param(ParameterChoice::Int64Param(byte_size))),
        ])
    }

    #[test]
    fn inputs_in_shared_memory_take_no_raw_entry() {
        let mut in_shm = tensor("INT32", None);
        in_shm.name = "a".into();
        in_shm.parameters = shm_parameters_of("r", 8);
        let req = ModelInferRequest {
            inputs: vec![in_shm.clone(), tensor("INT32", None)],
            raw_input_contents: vec![Bytes::from_static(&[1, 0, 0, 0, 2, 0, 0, 0])],
            ..Default::default()
        };
        let (req, shm_inputs) = infer_request(req).expect("one raw entry for the one input outside shm");
        assert_eq!(shm_inputs, vec![ShmInput { index: 0, at: ShmRef { region: "r".into(), offset: 0, byte_size: 8 } }]);
        assert!(req.inputs[0].data.is_empty());
        assert_eq!(req.inputs[1].data.len(), 8);

        let two_raw = ModelInferRequest {
            inputs: vec![in_shm.clone(), tensor("INT32", None)],
            raw_input_contents: vec![Bytes::from_static(&[0; 8]), Bytes::from_static(&[0; 8])],
            ..Default::default()
        };
        let e = infer_request(two_raw).expect_err("one raw entry too many");
        assert!(e.message.contains("has 1 inputs outside shared memory"), "{}", e.message);
        in_shm.contents = Some(InferTensorContents { int_contents: vec![1, 2], ..Default::default() });
        let typed = ModelInferRequest { model_name: "m".into(), inputs: vec![in_shm], ..Default::default() };
        let e = infer_request(typed).expect_err("contents and shm");
        assert_eq!(
            e.message,
            "unexpected 'content' provided when using shared memory for input tensor 'a' for model 'm'"
        );
    }

    #[test]
    fn every_output_keeps_its_raw_entry_and_one_in_no_region_has_no_parameters() {
        use crate::engine::tensor::OutputTensor;
        let out = |name: &str| OutputTensor {
            name: name.into(),
            datatype: DataType::Uint8,
            shape: vec![2],
            data: Bytes::from_static(&[1, 2]),
        };
        let mut response = InferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            id: String::new(),
            outputs: vec![out("y"), out("z")],
        };
        response.outputs[0].data = Bytes::new();
        let answer = infer_response(response, None);
        assert_eq!(answer.raw_output_contents.len(), 2);
        assert!(answer.outputs[0].parameters.is_empty(), "no region named, no parameters");
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
