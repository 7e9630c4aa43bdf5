//! KServe v2 JSON inference bodies with Triton's binary tensor data extension: decoding requests
//! straight into typed byte buffers and encoding responses.

use std::fmt;

use bytes::Bytes;
use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use tessera_protocol::DataType;

use super::nonfinite::{self, Prepared};
use crate::engine::infer::{
    InferRequest, InferResponse, ParamValue, Parameters, RequestedOutput, bool_param, json_capable,
};
use crate::engine::model_spec::ModelSpec;
use crate::engine::tensor::{InputTensor, OutputTensor, bytes_elements, push_bytes_element};
use crate::error::{Error, Result};
use crate::serve::shared_memory::tensors::{self as shm, OutputRegions, ShmInput, ShmInputs, ShmRef};

/// Header that splits the JSON part of a body from its binary tail.
pub const HEADER_LENGTH: &str = "inference-header-content-length";
/// [`HEADER_LENGTH`] as Triton's documentation spells it, for messages.
const HEADER_LENGTH_NAME: &str = "Inference-Header-Content-Length";

#[derive(Deserialize)]
struct JsonRequest<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default, borrow)]
    parameters: Option<&'a RawValue>,
    inputs: Vec<JsonInput<'a>>,
    #[serde(default, borrow)]
    outputs: Option<Vec<JsonOutput<'a>>>,
}

#[derive(Deserialize)]
struct JsonInput<'a> {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default, borrow)]
    parameters: Option<&'a RawValue>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct JsonOutput<'a> {
    name: String,
    #[serde(default, borrow)]
    parameters: Option<&'a RawValue>,
}

/// Splits a body into its JSON header and binary tail using `Inference-Header-Content-Length`.
fn split_body(body: &Bytes, header_length: Option<&str>) -> Result<(Bytes, Bytes)> {
    let Some(raw) = header_length else {
        return Ok((body.clone(), Bytes::new()));
    };
    let len: usize =
        raw.trim().parse().map_err(|_| Error::invalid(format!("invalid Inference-Header-Content-Length '{raw}'")))?;
    if len == 0 {
        // The handler decodes raw binary requests against their model (`super::raw`) before this.
        return Err(Error::invalid(
            "Inference-Header-Content-Length 0 marks a raw binary request, which needs its model",
        ));
    }
    if len > body.len() {
        return Err(Error::invalid(format!(
            "Inference-Header-Content-Length {len} is larger than the request body of {} bytes",
            body.len()
        )));
    }
    Ok((body.slice(..len), body.slice(len..)))
}

/// Decodes an infer request body: its JSON header, then the binary tail that
/// `Inference-Header-Content-Length` (`header_length`) splits off. The inputs whose bytes are in
/// shared memory come back apart, their tensors still empty.
pub fn decode_body(body: &Bytes, header_length: Option<&str>) -> Result<(InferRequest, ShmInputs)> {
    let (header, tail) = split_body(body, header_length)?;
    decode_request(&header, &tail)
}

/// Decodes a request whose JSON part is `header` and binary tail is `tail`.
fn decode_request(header: &[u8], tail: &Bytes) -> Result<(InferRequest, ShmInputs)> {
    let prepared = nonfinite::prepare(header);
    let json = parse_header(&prepared.json)?;
    prepared.check_placement(json.inputs.iter().filter_map(|i| i.data)).map_err(Error::invalid)?;
    let mut offset = 0usize;
    let mut inputs = Vec::with_capacity(json.inputs.len());
    let mut shm_inputs = ShmInputs::new();
    for input in json.inputs {
        let (tensor, in_shm) = decode_input(input, tail, &mut offset, &prepared)?;
        if let Some(at) = in_shm {
            shm_inputs.push(ShmInput { index: inputs.len(), at });
        }
        inputs.push(tensor);
    }
    if offset != tail.len() {
        return Err(Error::invalid(format!(
            "binary data sizes do not add up: inputs declare {offset} bytes of binary data but the body carries {}",
            tail.len()
        )));
    }
    let outputs = json
        .outputs
        .unwrap_or_default()
        .into_iter()
        .map(|o| Ok(RequestedOutput { name: o.name, parameters: decode_parameters(o.parameters)? }))
        .collect::<Result<Vec<_>>>()?;
    let request = InferRequest {
        id: json.id.unwrap_or_default(),
        parameters: decode_parameters(json.parameters)?,
        inputs,
        outputs,
        cuda: Default::default(),
    };
    Ok((request, shm_inputs))
}

/// Parses the JSON header; bytes after it get a hint, as they are most often a binary tail
/// sent without the header that says where the JSON ends.
fn parse_header(json: &[u8]) -> Result<JsonRequest<'_>> {
    let mut values = serde_json::Deserializer::from_slice(json).into_iter::<JsonRequest<'_>>();
    let parsed = match values.next() {
        Some(parsed) => parsed,
        // Empty or blank: let serde_json say so in its words.
        None => serde_json::from_slice(json),
    };
    let request = parsed.map_err(|e| Error::invalid(format!("failed to parse the request JSON buffer: {e}")))?;
    if json[values.byte_offset()..].iter().any(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        return Err(Error::invalid(format!(
            "failed to parse the request JSON buffer: trailing characters after the JSON object; binary data after \
             the JSON needs the {HEADER_LENGTH_NAME} header, set to the length of the JSON"
        )));
    }
    Ok(request)
}

fn decode_input(
    input: JsonInput<'_>,
    tail: &Bytes,
    offset: &mut usize,
    prepared: &Prepared<'_>,
) -> Result<(InputTensor, Option<ShmRef>)> {
    let name = input.name;
    let datatype = DataType::from_wire(&input.datatype)
        .ok_or_else(|| Error::invalid(format!("input '{name}' has an unknown datatype '{}'", input.datatype)))?;
    let parameters = decode_parameters(input.parameters)?;
    let binary_size = match parameters.get("binary_data_size") {
        None => None,
        Some(p) => Some(p.as_u64().ok_or_else(|| {
            Error::invalid(format!("input '{name}': binary_data_size must be a non-negative integer"))
        })?),
    };
    let in_shm = shm::parse(&parameters, &name)?;
    let data = match (input.data, binary_size, &in_shm) {
        (None, None, Some(_)) => Bytes::new(),
        (None, Some(size), None) => take_binary(&name, size, tail, offset)?,
        (Some(raw), None, None) => decode_json_data(&name, datatype, &input.shape, raw, prepared)?,
        (data, binary, shm) => return Err(content_error(&name, data.is_some(), binary.is_some(), shm.is_some())),
    };
    Ok((InputTensor { name, datatype, shape: input.shape, data }, in_shm))
}

/// The next `size` bytes of the binary tail, from `offset` on.
fn take_binary(name: &str, size: u64, tail: &Bytes, offset: &mut usize) -> Result<Bytes> {
    let size = usize::try_from(size).map_err(|_| Error::invalid("binary_data_size too large"))?;
    let end = offset.checked_add(size).filter(|end| *end <= tail.len()).ok_or_else(|| {
        Error::invalid(format!(
            "binary data sizes do not add up: input '{name}' needs {size} bytes at offset {} but the body has only {}",
            offset,
            tail.len()
        ))
    })?;
    let data = tail.slice(*offset..end);
    *offset = end;
    Ok(data)
}

/// Triton's refusal of an input that does not set exactly one of its three data sources
/// (`data`, a binary part, a shared memory region), naming the input as well.
fn content_error(name: &str, data: bool, binary: bool, shm: bool) -> Error {
    let set: Vec<&str> = [(data, "'data'"), (binary, "'binary_data_size'"), (shm, "'shared_memory_region'")]
        .into_iter()
        .filter_map(|(on, what)| on.then_some(what))
        .collect();
    let but = if set.is_empty() { "no field is set".to_string() } else { format!("set {}", set.join(" ")) };
    Error::invalid(format!(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', \
         'shared_memory_region' in 'parameters'. But {but} (input '{name}')"
    ))
}

/// Parses a JSON `data` array (flat or nested) straight into typed little-endian bytes.
fn decode_json_data(
    name: &str,
    datatype: DataType,
    shape: &[i64],
    raw: &RawValue,
    prepared: &Prepared<'_>,
) -> Result<Bytes> {
    if !json_capable(datatype) {
        // Triton's words.
        return Err(Error::invalid(format!(
            "receiving {datatype} data via JSON is not supported. Please use the binary data format for input {name}"
        )));
    }
    let expected = tessera_protocol::element_count(shape)
        .map_err(|e| Error::invalid(format!("invalid shape for input '{name}': {e}")))?;
    let capacity = expected.saturating_mul(datatype.element_size().unwrap_or(8)).min(1 << 26);
    let (out, count) = match datatype {
        DataType::Fp32 | DataType::Fp64 => {
            let mut out = Vec::with_capacity(capacity);
            prepared.decode_floats(raw, datatype, &mut out).map(|count| (out, count))
        }
        _ => decode_other(raw, datatype, prepared, capacity),
    }
    .map_err(|e| Error::invalid(format!("unable to parse 'data' of input '{name}': {e}")))?;
    if count != expected {
        return Err(Error::invalid(format!(
            "unexpected number of elements for input '{name}': shape {} needs {expected}, 'data' has {count}",
            crate::engine::tensor::fmt_shape(shape),
        )));
    }
    Ok(Bytes::from(out))
}

/// Parses `data` of a type other than FP32/FP64, where NaN and Infinity have no meaning.
fn decode_other(
    raw: &RawValue,
    datatype: DataType,
    prepared: &Prepared<'_>,
    capacity: usize,
) -> std::result::Result<(Vec<u8>, usize), String> {
    if let Some(token) = prepared.token_in(raw) {
        return Err(format!("{token} is not a valid {datatype} value"));
    }
    let mut sink = Sink { datatype, out: Vec::with_capacity(capacity), count: 0 };
    let mut de = serde_json::Deserializer::from_str(raw.get());
    Flatten(&mut sink).deserialize(&mut de).map_err(|e| e.to_string())?;
    Ok((sink.out, sink.count))
}

/// Accumulates decoded elements.
struct Sink {
    datatype: DataType,
    out: Vec<u8>,
    count: usize,
}

/// Triton's refusal of a JSON value whose kind does not fit the datatype (a number for BOOL, a
/// float or a negative number for an integer type, a boolean or string for a number).
pub(super) fn wrong_kind(datatype: DataType) -> String {
    let (non, what) = match datatype {
        DataType::Bool => ("non-boolean", "boolean"),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => {
            ("non-unsigned-integer", "unsigned-integer")
        }
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            ("non-signed-integer", "signed-integer")
        }
        DataType::Bytes => ("non-string", "string"),
        DataType::Fp32 | DataType::Fp64 | DataType::Fp16 | DataType::Bf16 => ("non-number", "number"),
    };
    format!("attempt to access JSON {non} as {what} ({datatype} data)")
}

impl Sink {
    fn push_int(&mut self, v: i128) -> std::result::Result<(), String> {
        let datatype = self.datatype;
        let unsigned = matches!(datatype, DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64);
        if unsigned && v < 0 {
            return Err(wrong_kind(datatype));
        }
        let out = &mut self.out;
        let bad = || format!("value {v} is out of range for {datatype}");
        match datatype {
            DataType::Uint8 => out.extend(u8::try_from(v).map_err(|_| bad())?.to_le_bytes()),
            DataType::Uint16 => out.extend(u16::try_from(v).map_err(|_| bad())?.to_le_bytes()),
            DataType::Uint32 => out.extend(u32::try_from(v).map_err(|_| bad())?.to_le_bytes()),
            DataType::Uint64 => out.extend(u64::try_from(v).map_err(|_| bad())?.to_le_bytes()),
            DataType::Int8 => out.extend(i8::try_from(v).map_err(|_| bad())?.to_le_bytes()),
            DataType::Int16 => out.extend(i16::try_from(v).map_err(|_| bad())?.to_le_bytes()),
            DataType::Int32 => out.extend(i32::try_from(v).map_err(|_| bad())?.to_le_bytes()),
            DataType::Int64 => out.extend(i64::try_from(v).map_err(|_| bad())?.to_le_bytes()),
            // FP32 and FP64 data goes through `nonfinite`; FP16 and BF16 have no JSON form.
            DataType::Bool | DataType::Fp32 | DataType::Fp64 | DataType::Fp16 | DataType::Bf16 | DataType::Bytes => {
                return Err(wrong_kind(datatype));
            }
        }
        self.count += 1;
        Ok(())
    }
}

/// Flattens nested JSON arrays of scalars into a [`Sink`].
struct Flatten<'s>(&'s mut Sink);

impl<'de> DeserializeSeed<'de> for Flatten<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Flatten<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an array of {} values", self.0.datatype)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while seq.next_element_seed(Flatten(&mut *self.0))?.is_some() {}
        Ok(())
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> std::result::Result<(), E> {
        if self.0.datatype != DataType::Bool {
            return Err(E::custom(wrong_kind(self.0.datatype)));
        }
        self.0.out.push(u8::from(v));
        self.0.count += 1;
        Ok(())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<(), E> {
        self.0.push_int(i128::from(v)).map_err(E::custom)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<(), E> {
        self.0.push_int(i128::from(v)).map_err(E::custom)
    }

    /// Floats (`1.0` too) are refused for integer and BOOL data, as Triton refuses them.
    fn visit_f64<E: serde::de::Error>(self, _v: f64) -> std::result::Result<(), E> {
        Err(E::custom(wrong_kind(self.0.datatype)))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<(), E> {
        if self.0.datatype != DataType::Bytes {
            return Err(E::custom(wrong_kind(self.0.datatype)));
        }
        push_bytes_element(&mut self.0.out, v.as_bytes()).map_err(|e| E::custom(e.message))?;
        self.0.count += 1;
        Ok(())
    }
}

/// Decodes a JSON parameters object into typed values.
fn decode_parameters(raw: Option<&RawValue>) -> Result<Parameters> {
    let Some(raw) = raw else { return Ok(Parameters::new()) };
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(raw.get()).map_err(|e| Error::invalid(format!("'parameters' must be an object: {e}")))?;
    map.into_iter()
        .map(|(k, v)| {
            let value = match v {
                serde_json::Value::Bool(b) => ParamValue::Bool(b),
                serde_json::Value::String(s) => ParamValue::Str(s),
                serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                    (Some(i), _, _) => ParamValue::Int(i),
                    (None, Some(u), _) => ParamValue::Uint(u),
                    (_, _, Some(f)) => ParamValue::Double(f),
                    _ => return Err(Error::invalid(format!("parameter '{k}' is not a usable number"))),
                },
                _ => return Err(Error::invalid(format!("parameter '{k}' must be a bool, number or string"))),
            };
            Ok((k, value))
        })
        .collect()
}

/// How the client wants outputs encoded, read from the request before it is handed over.
#[derive(Debug, Default)]
pub struct BinaryChoice {
    /// The request's `binary_data_output`.
    default: bool,
    /// Outputs whose own `binary_data` parameter overrides the default.
    explicit: Vec<(String, bool)>,
}

impl BinaryChoice {
    /// Reads the request's encoding parameters; each must be a bool.
    pub fn of(request: &InferRequest) -> Result<Self> {
        let default = bool_param(&request.parameters, "binary_data_output", "")?.unwrap_or(false);
        let mut explicit = Vec::new();
        for output in &request.outputs {
            let owner = format!(" of output '{}'", output.name);
            let binary = bool_param(&output.parameters, "binary_data", &owner)?;
            if output.parameters.contains_key(shm::REGION) {
                check_shm_output(&output.parameters, binary)?;
            }
            if let Some(binary) = binary {
                explicit.push((output.name.clone(), binary));
            }
        }
        Ok(Self { default, explicit })
    }

    /// Every output binary: the answer to a raw binary request.
    pub fn all_binary() -> Self {
        Self { default: true, explicit: Vec::new() }
    }

    /// Refuses, before the model runs, an FP16 or BF16 output that would have to go into the JSON
    /// (asked for so, or by default), as Triton does; outputs in shared memory are exempt.
    pub fn check_json_outputs(
        &self,
        spec: &ModelSpec,
        request: &InferRequest,
        shm: Option<&OutputRegions>,
    ) -> Result<()> {
        let returned = spec
            .outputs
            .iter()
            .filter(|o| request.outputs.is_empty() || request.outputs.iter().any(|r| r.name == o.name));
        for out in returned {
            if json_capable(out.datatype) || shm.is_some_and(|s| s.find(&out.name).is_some()) {
                continue;
            }
            if !self.explicit.iter().find(|(n, _)| *n == out.name).map_or(self.default, |(_, b)| *b) {
                // Triton's words, with the output's name.
                return Err(Error::invalid(format!(
                    "sending {} data via JSON is not supported. Please use the binary data format for output {}",
                    out.datatype, out.name
                )));
            }
        }
        Ok(())
    }

    /// Where each output of `response` goes: into the JSON, the binary tail, or the region the
    /// request named for it (`shm`).
    pub fn places<'a>(&self, response: &InferResponse, shm: Option<&'a OutputRegions>) -> Vec<Place<'a>> {
        response
            .outputs
            .iter()
            .map(|out| {
                if let Some(at) = shm.and_then(|s| s.find(&out.name)) {
                    return Place::Shm(at);
                }
                let asked = self.explicit.iter().find(|(n, _)| *n == out.name).map_or(self.default, |(_, b)| *b);
                // FP16/BF16 have no JSON form, so they always travel as binary.
                if asked || !json_capable(out.datatype) { Place::Binary } else { Place::Json }
            })
            .collect()
    }
}

/// Triton's refusals for an output in shared memory that also asks for another form.
fn check_shm_output(params: &Parameters, binary: Option<bool>) -> Result<()> {
    if params.contains_key("classification") {
        return Err(Error::invalid("Output can't set both 'shared_memory_region' and 'classification'"));
    }
    if binary == Some(true) {
        return Err(Error::invalid("Output can't set both 'shared_memory_region' and 'binary_data'"));
    }
    Ok(())
}

/// Where one output of a response goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place<'a> {
    /// `data` in the JSON.
    Json,
    /// The binary tail.
    Binary,
    /// A shared memory region (already written); the JSON says where, with no data.
    Shm(&'a ShmRef),
}

/// An encoded response body and the JSON header length when a binary tail follows.
pub struct EncodedResponse {
    /// The body: the JSON header, then each binary output's buffer as it is.
    pub body: Vec<Bytes>,
    /// `Some(json_len)` when the body has a binary tail.
    pub header_length: Option<usize>,
}

/// Encodes a response: JSON header, then the binary outputs' bytes in output order.
pub fn encode_response(response: &InferResponse, places: &[Place<'_>]) -> Result<EncodedResponse> {
    let mut json = Vec::with_capacity(256);
    write_header(&mut json, response, places)
        .map_err(|e| Error::internal(format!("failed to encode response: {e}")))?;
    if !places.contains(&Place::Binary) {
        return Ok(EncodedResponse { body: vec![Bytes::from(json)], header_length: None });
    }
    let header_length = json.len();
    let mut body = Vec::with_capacity(response.outputs.len() + 1);
    body.push(Bytes::from(json));
    let binary = response.outputs.iter().zip(places).filter(|(_, p)| **p == Place::Binary);
    body.extend(binary.map(|(o, _)| o.data.clone()));
    Ok(EncodedResponse { body, header_length: Some(header_length) })
}

/// Writes the JSON header by hand rather than through serde: serde_json has no way to write
/// NaN or Infinity, which FP32/FP64 data needs (see [`nonfinite::write_floats`]).
fn write_header(out: &mut Vec<u8>, r: &InferResponse, places: &[Place<'_>]) -> serde_json::Result<()> {
    out.push(b'{');
    if !r.id.is_empty() {
        write_entry(out, "id", &r.id)?;
        out.push(b',');
    }
    write_entry(out, "model_name", &r.model_name)?;
    out.push(b',');
    write_entry(out, "model_version", &r.model_version)?;
    out.extend_from_slice(b",\"outputs\":[");
    for (i, (tensor, place)) in r.outputs.iter().zip(places).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_output(out, tensor, *place)?;
    }
    out.extend_from_slice(b"]}");
    Ok(())
}

fn write_output(out: &mut Vec<u8>, t: &OutputTensor, place: Place<'_>) -> serde_json::Result<()> {
    out.extend_from_slice(b"{\"name\":");
    serde_json::to_writer(&mut *out, &t.name)?;
    // Wire names are plain ASCII: nothing to escape.
    out.extend_from_slice(b",\"datatype\":\"");
    out.extend_from_slice(t.datatype.as_wire().as_bytes());
    out.extend_from_slice(b"\",\"shape\":[");
    let mut digits = itoa::Buffer::new();
    for (i, d) in t.shape.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(digits.format(*d).as_bytes());
    }
    out.extend_from_slice(b"],");
    match place {
        Place::Binary => {
            out.extend_from_slice(b"\"parameters\":{\"binary_data_size\":");
            out.extend_from_slice(digits.format(t.data.len()).as_bytes());
            out.push(b'}');
        }
        Place::Shm(at) => {
            out.extend_from_slice(b"\"parameters\":{");
            write_entry(out, shm::REGION, &at.region)?;
            out.push(b',');
            write_entry(out, shm::OFFSET, &at.offset)?;
            out.push(b',');
            write_entry(out, shm::BYTE_SIZE, &at.byte_size)?;
            out.push(b'}');
        }
        Place::Json => {
            out.extend_from_slice(b"\"data\":");
            match t.datatype {
                DataType::Fp32 | DataType::Fp64 => nonfinite::write_floats(out, t.datatype, &t.data)?,
                _ => serde_json::to_writer(&mut *out, &DataJson(t))?,
            }
        }
    }
    out.push(b'}');
    Ok(())
}

/// Writes a tensor as KServe v2 JSON (`name`, `datatype`, `shape`, `data`): what capture
/// records hold. FP16/BF16 have no JSON form and fail (the caller writes them base64).
pub(crate) fn write_json_tensor(out: &mut Vec<u8>, t: &OutputTensor) -> serde_json::Result<()> {
    write_output(out, t, Place::Json)
}

/// Writes `"key":value`. Keys are this module's constants (plain ASCII, nothing to escape):
/// only the value goes through serde_json.
fn write_entry<T: Serialize + ?Sized>(out: &mut Vec<u8>, key: &str, value: &T) -> serde_json::Result<()> {
    debug_assert!(key.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\'), "{key}");
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    serde_json::to_writer(&mut *out, value)
}

/// `data` of a type other than FP32/FP64, through serde.
struct DataJson<'a>(&'a OutputTensor);

macro_rules! seq_of {
    ($seq:expr, $data:expr, $ty:ty) => {
        for chunk in $data.chunks_exact(std::mem::size_of::<$ty>()) {
            let mut buf = [0u8; std::mem::size_of::<$ty>()];
            buf.copy_from_slice(chunk);
            $seq.serialize_element(&<$ty>::from_le_bytes(buf))?;
        }
    };
}

impl Serialize for DataJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let t = self.0;
        let mut seq = s.serialize_seq(None)?;
        let data = &t.data[..];
        match t.datatype {
            DataType::Bool => {
                for b in data {
                    seq.serialize_element(&(*b != 0))?;
                }
            }
            DataType::Uint8 => seq_of!(seq, data, u8),
            DataType::Uint16 => seq_of!(seq, data, u16),
            DataType::Uint32 => seq_of!(seq, data, u32),
            DataType::Uint64 => seq_of!(seq, data, u64),
            DataType::Int8 => seq_of!(seq, data, i8),
            DataType::Int16 => seq_of!(seq, data, i16),
            DataType::Int32 => seq_of!(seq, data, i32),
            DataType::Int64 => seq_of!(seq, data, i64),
            DataType::Bytes => {
                for element in bytes_elements(data) {
                    let element = element.map_err(serde::ser::Error::custom)?;
                    seq.serialize_element(&String::from_utf8_lossy(element))?;
                }
            }
            DataType::Fp32 | DataType::Fp64 => {
                return Err(serde::ser::Error::custom("FP32/FP64 data is written by nonfinite::write_floats"));
            }
            DataType::Fp16 | DataType::Bf16 => {
                return Err(serde::ser::Error::custom("FP16/BF16 outputs are always sent as binary"));
            }
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(json: &str) -> Result<InferRequest> {
        decode_request(json.as_bytes(), &Bytes::new()).map(|(request, _)| request)
    }

    #[test]
    fn nested_and_flat_json_data_decode_to_the_same_bytes() {
        let flat =
            decode(r#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"INT32","data":[1,2,3,4]}]}"#).expect("flat");
        let nested = decode(r#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"INT32","data":[[1,2],[3,4]]}]}"#)
            .expect("nested");
        assert_eq!(flat.inputs[0].data, nested.inputs[0].data);
        assert_eq!(&flat.inputs[0].data[..8], &[1, 0, 0, 0, 2, 0, 0, 0]);
    }

    #[test]
    fn every_json_datatype_decodes() {
        let cases = [
            ("BOOL", "[true,false]", vec![1u8, 0]),
            ("UINT8", "[1,255]", vec![1, 255]),
            ("INT8", "[-1,2]", vec![255, 2]),
            ("UINT16", "[258,0]", vec![2, 1, 0, 0]),
            ("FP32", "[1.5,2]", [1.5f32.to_le_bytes(), 2f32.to_le_bytes()].concat()),
            ("FP64", "[0.5,1]", [0.5f64.to_le_bytes(), 1f64.to_le_bytes()].concat()),
            ("BYTES", r#"["a",""]"#, vec![1, 0, 0, 0, b'a', 0, 0, 0, 0]),
        ];
        for (dt, data, bytes) in cases {
            let json = format!(r#"{{"inputs":[{{"name":"x","shape":[2],"datatype":"{dt}","data":{data}}}]}}"#);
            let req = decode(&json).unwrap_or_else(|e| panic!("{dt}: {}", e.message));
            assert_eq!(req.inputs[0].data.to_vec(), bytes, "{dt}");
        }
    }

    #[test]
    fn bad_json_inputs_are_rejected_with_reasons() {
        let e = decode("{not json").expect_err("malformed");
        assert!(e.message.contains("failed to parse the request JSON"), "{}", e.message);
        let e = decode(r#"{"inputs":[{"name":"x","shape":[3],"datatype":"INT32","data":[1,2]}]}"#).expect_err("count");
        assert!(e.message.contains("needs 3") && e.message.contains("has 2"), "{}", e.message);
        let e = decode(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"UINT8","data":[300]}]}"#).expect_err("range");
        assert!(e.message.contains("out of range"), "{}", e.message);
        let e = decode(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP16","data":[1]}]}"#).expect_err("fp16");
        assert!(e.message.contains("binary"), "{}", e.message);
        let e = decode(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"NOPE","data":[1]}]}"#).expect_err("dtype");
        assert!(e.message.contains("unknown datatype"), "{}", e.message);
        let e = decode(r#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT32","data":["a"]}]}"#).expect_err("str");
        assert!(e.message.contains("attempt to access JSON non-signed-integer as signed-integer"), "{}", e.message);
    }

    #[test]
    fn json_values_of_the_wrong_kind_are_refused_as_triton_refuses_them() {
        for (dt, data, words) in [
            ("BOOL", "[1,0]", "non-boolean as boolean"),
            ("BOOL", "[true,1]", "non-boolean as boolean"),
            ("INT32", "[1.0,2]", "non-signed-integer as signed-integer"),
            ("INT64", "[true,false]", "non-signed-integer as signed-integer"),
            ("UINT8", "[-1,2]", "non-unsigned-integer as unsigned-integer"),
            ("UINT32", "[1e3,2]", "non-unsigned-integer as unsigned-integer"),
            ("BYTES", "[1,2]", "non-string as string"),
        ] {
            let json = format!(r#"{{"inputs":[{{"name":"x","shape":[2],"datatype":"{dt}","data":{data}}}]}}"#);
            let e = decode(&json).expect_err(dt).message;
            assert!(e.contains(&format!("attempt to access JSON {words}")) && e.contains("'x'"), "{dt} {data}: {e}");
        }
        let e =
            decode(r#"{"inputs":[{"name":"h","shape":[1],"datatype":"FP16","data":[1]}]}"#).expect_err("fp16").message;
        assert_eq!(e, "receiving FP16 data via JSON is not supported. Please use the binary data format for input h");
    }

    #[test]
    fn binary_tail_is_split_by_declared_sizes() {
        let header = r#"{"inputs":[{"name":"a","shape":[1],"datatype":"INT32","parameters":{"binary_data_size":4}},{"name":"b","shape":[2],"datatype":"UINT8","parameters":{"binary_data_size":2}}]}"#;
        let tail = Bytes::from_static(&[1, 0, 0, 0, 7, 8]);
        let (req, _) = decode_request(header.as_bytes(), &tail).expect("binary");
        assert_eq!(req.inputs[1].data.as_ref(), &[7, 8]);
        let short = Bytes::from_static(&[1, 0, 0, 0, 7]);
        assert!(decode_request(header.as_bytes(), &short).expect_err("short").message.contains("do not add up"));
        let long = Bytes::from_static(&[1, 0, 0, 0, 7, 8, 9]);
        assert!(decode_request(header.as_bytes(), &long).expect_err("long").message.contains("do not add up"));
    }

    #[test]
    fn header_length_larger_than_body_is_rejected() {
        let body = Bytes::from_static(b"{}");
        assert!(split_body(&body, Some("10")).is_err());
        assert!(split_body(&body, Some("x")).is_err());
        let (h, t) = split_body(&Bytes::from_static(b"{}abc"), Some("2")).expect("split");
        assert_eq!((h.len(), t.len()), (2, 3));
    }

    #[test]
    fn output_headers_escape_names_and_write_every_dimension() {
        let response = InferResponse {
            model_name: "m\"1".into(),
            model_version: "1".into(),
            id: String::new(),
            outputs: vec![OutputTensor {
                name: "out \"x\" \\ \u{e9}\n".into(),
                datatype: DataType::Int8,
                shape: vec![2, 0, -1, i64::MAX],
                data: Bytes::from_static(&[1, 2]),
            }],
        };
        for place in [Place::Json, Place::Binary] {
            let enc = encode_response(&response, &[place]).expect("encode");
            let body = enc.body.concat();
            let json: serde_json::Value =
                serde_json::from_slice(&body[..enc.header_length.unwrap_or(body.len())]).expect("json");
            assert_eq!(json["model_name"], "m\"1");
            assert_eq!(json["outputs"][0]["name"], "out \"x\" \\ \u{e9}\n");
            assert_eq!(json["outputs"][0]["datatype"], "INT8");
            assert_eq!(json["outputs"][0]["shape"], serde_json::json!([2, 0, -1, i64::MAX]));
        }
    }

    #[test]
    fn responses_encode_json_and_binary_outputs() {
        let out = |name: &str, dt, data: Vec<u8>| OutputTensor {
            name: name.into(),
            datatype: dt,
            shape: vec![2],
            data: Bytes::from(data),
        };
        let response = InferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            id: "42".into(),
            outputs: vec![out("a", DataType::Int16, vec![1, 0, 255, 255]), out("b", DataType::Uint8, vec![9, 8])],
        };
        let enc = encode_response(&response, &[Place::Json, Place::Binary]).expect("encode");
        let len = enc.header_length.expect("binary tail");
        assert_eq!(enc.body.len(), 2, "header and one output buffer, not concatenated");
        let body = enc.body.concat();
        let json: serde_json::Value = serde_json::from_slice(&body[..len]).expect("json");
        assert_eq!(json["id"], "42");
        assert_eq!(json["outputs"][0]["data"], serde_json::json!([1, -1]));
        assert_eq!(json["outputs"][1]["parameters"]["binary_data_size"], 2);
        assert_eq!(&body[len..], &[9, 8]);
        let enc = encode_response(&response, &[Place::Json, Place::Json]).expect("json only");
        assert!(enc.header_length.is_none());
    }

    fn one_input(datatype: &str, data: &str) -> String {
        format!(r#"{{"inputs":[{{"name":"x","shape":[3],"datatype":"{datatype}","data":{data}}}]}}"#)
    }

    #[test]
    fn nan_and_infinity_decode_in_float_data_only() {
        let req = decode(&one_input("FP32", "[NaN, Infinity, -Infinity]")).expect("fp32");
        let values: Vec<f32> =
            req.inputs[0].data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert!(values[0].is_nan() && values[1] == f32::INFINITY && values[2] == f32::NEG_INFINITY, "{values:?}");
        let req = decode(&one_input("FP64", "[[-Infinity], [NaN], [2]]")).expect("fp64");
        assert_eq!(&req.inputs[0].data[..8], &f64::NEG_INFINITY.to_le_bytes());
        for dt in ["INT32", "BOOL", "BYTES"] {
            let e = decode(&one_input(dt, "[1, NaN, 2]")).expect_err(dt);
            assert!(e.message.contains("NaN is not a valid") && e.message.contains("'x'"), "{dt}: {}", e.message);
        }
        let elsewhere = [
            r#"{"id":NaN,"inputs":[]}"#,
            r#"{"inputs":[],"parameters":{"p":Infinity}}"#,
            r#"{"inputs":[],"unknown":[-Infinity]}"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1],"parameters":{"p":NaN}}]}"#,
        ];
        for json in elsewhere {
            let e = decode(json).expect_err(json);
            assert!(e.message.contains("may only appear in the 'data'"), "{json}: {}", e.message);
        }
        let e = decode(r#"{"inputs":[{"name":"x","shape":[NaN],"datatype":"FP32","data":[1]}]}"#).expect_err("shape");
        assert!(e.message.contains("failed to parse"), "{}", e.message);
        assert!(decode(&one_input("FP32", "[nan, 1, 2]")).is_err(), "only rapidjson's spellings");
    }

    #[test]
    fn non_finite_outputs_are_written_as_tokens() {
        let data: Vec<u8> = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN].iter().flat_map(|v| v.to_le_bytes()).collect();
        let response = InferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            id: String::new(),
            outputs: vec![OutputTensor {
                name: "y".into(),
                datatype: DataType::Fp32,
                shape: vec![3],
                data: Bytes::from(data),
            }],
        };
        let enc = encode_response(&response, &[Place::Json]).expect("encode");
        let text = String::from_utf8(enc.body.concat()).expect("utf-8");
        assert_eq!(
            text,
            r#"{"model_name":"m","model_version":"1","outputs":[{"name":"y","datatype":"FP32","shape":[3],"data":[Infinity,-Infinity,NaN]}]}"#
        );
        // What we write, we read.
        let again = one_input("FP32", &text[text.find("[Inf").expect("data")..text.len() - 3]);
        assert_eq!(decode(&again).expect("round trip").inputs[0].data.len(), 12);
    }

    #[test]
    fn encoding_parameters_must_be_bools() {
        let request = |params: &str, output: &str| {
            decode(&format!(
                r#"{{"parameters":{params},"inputs":[],"outputs":[{{"name":"y","parameters":{output}}}]}}"#
            ))
            .expect("decodes")
        };
        let choice = BinaryChoice::of(&request(r#"{"binary_data_output":true}"#, r#"{"binary_data":false}"#));
        assert_eq!(choice.expect("bools").explicit, vec![("y".to_string(), false)]);
        for bad in [r#""true""#, "1", r#""yes""#] {
            let e = BinaryChoice::of(&request(&format!(r#"{{"binary_data_output":{bad}}}"#), "{}")).expect_err(bad);
            assert!(e.message.contains("'binary_data_output' must be a bool"), "{}", e.message);
            let e = BinaryChoice::of(&request("{}", &format!(r#"{{"binary_data":{bad}}}"#))).expect_err(bad);
            assert!(e.message.contains("'binary_data' of output 'y' must be a bool"), "{}", e.message);
        }
    }

    #[test]
    fn binary_data_size_must_be_a_non_negative_integer() {
        for bad in ["-1", r#""4""#, "4.5", "true"] {
            let header = format!(
                r#"{{"inputs":[{{"name":"a","shape":[1],"datatype":"INT32","parameters":{{"binary_data_size":{bad}}}}}]}}"#
            );
            let e = decode_request(header.as_bytes(), &Bytes::from_static(&[0; 4])).expect_err(bad);
            assert!(e.message.contains("binary_data_size must be a non-negative integer"), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn binary_data_without_the_header_length_gets_a_hint() {
        let header = r#"{"inputs":[{"name":"a","shape":[1],"datatype":"INT32","parameters":{"binary_data_size":4}}]}"#;
        let body = Bytes::from([header.as_bytes(), &[1, 0, 0, 0]].concat());
        let e = decode_body(&body, None).expect_err("no header");
        assert!(
            e.message.contains("trailing characters") && e.message.contains("Inference-Header-Content-Length"),
            "{}",
            e.message
        );
        assert!(decode_body(&body, Some(&header.len().to_string())).is_ok());
        assert!(decode(&format!("{}  \n", one_input("INT32", "[1,2,3]"))).is_ok(), "trailing whitespace is fine");
        assert!(decode("").expect_err("empty").message.contains("failed to parse"));
    }

    #[test]
    fn inputs_in_shared_memory_come_apart_and_may_use_no_other_source() {
        let shm = r#""parameters":{"shared_memory_region":"r","shared_memory_offset":16,"shared_memory_byte_size":8}"#;
        let header = format!(
            r#"{{"inputs":[{{"name":"a","shape":[2],"datatype":"INT32",{shm}}},{{"name":"b","shape":[1],"datatype":"INT32","data":[5]}}]}}"#
        );
        let (req, shm_inputs) = decode_request(header.as_bytes(), &Bytes::new()).expect("valid");
        assert!(req.inputs[0].data.is_empty(), "filled in from the region later");
        assert_eq!(
            shm_inputs,
            vec![ShmInput { index: 0, at: ShmRef { region: "r".into(), offset: 16, byte_size: 8 } }]
        );
        let mixed = format!(r#"{{"inputs":[{{"name":"a","shape":[1],"datatype":"INT32","data":[1],{shm}}}]}}"#);
        let e = decode(&mixed).expect_err("data and region");
        assert!(e.message.ends_with("But set 'data' 'shared_memory_region' (input 'a')"), "{}", e.message);
        let both = r#"{"inputs":[{"name":"a","shape":[1],"datatype":"INT32","parameters":{"binary_data_size":4,"shared_memory_region":"r","shared_memory_byte_size":4}}]}"#;
        let e = decode_request(both.as_bytes(), &Bytes::from_static(&[0; 4])).expect_err("binary and region");
        assert!(e.message.contains("But set 'binary_data_size' 'shared_memory_region'"), "{}", e.message);
        let none = r#"{"inputs":[{"name":"a","shape":[1],"datatype":"INT32"}]}"#;
        assert!(decode(none).expect_err("no data").message.contains("But no field is set (input 'a')"));
    }

    #[test]
    fn outputs_in_shared_memory_say_where_and_carry_no_data() {
        let request = |params: &str| {
            decode(&format!(r#"{{"inputs":[],"outputs":[{{"name":"y","parameters":{params}}}]}}"#)).expect("decodes")
        };
        let shm = r#""shared_memory_region":"r","shared_memory_byte_size":8"#;
        for (extra, words) in
            [(r#""binary_data":true"#, "'binary_data'"), (r#""classification":2"#, "'classification'")]
        {
            let e = BinaryChoice::of(&request(&format!("{{{shm},{extra}}}"))).expect_err(words);
            assert_eq!(e.message, format!("Output can't set both 'shared_memory_region' and {words}"));
        }
        assert!(BinaryChoice::of(&request(&format!(r#"{{{shm},"binary_data":false}}"#))).is_ok());

        let at = ShmRef { region: "r".into(), offset: 4, byte_size: 8 };
        let out = OutputTensor { name: "y".into(), datatype: DataType::Fp16, shape: vec![2], data: Bytes::new() };
        let response =
            InferResponse { model_name: "m".into(), model_version: "1".into(), id: String::new(), outputs: vec![out] };
        let enc = encode_response(&response, &[Place::Shm(&at)]).expect("encode");
        assert!(enc.header_length.is_none(), "no binary tail for an output in shared memory");
        let json: serde_json::Value = serde_json::from_slice(&enc.body.concat()).expect("json");
        let y = &json["outputs"][0];
        assert!(y.get("data").is_none(), "{y}");
        assert_eq!(
            y["parameters"],
            serde_json::json!({"shared_memory_region": "r", "shared_memory_offset": 4, "shared_memory_byte_size": 8})
        );
    }
}
