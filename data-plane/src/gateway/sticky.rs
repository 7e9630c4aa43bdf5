//! Sequence affinity: every request of a sequence (a stateful model's `sequence_id`) must reach
//! the replica that holds the sequence's state. The gateway reads the id from the request and
//! picks among the candidate replicas by rendezvous hashing on (tenant, model, id): every gateway
//! picks the same replica, and a replica leaving or joining moves only the sequences it held or
//! wins. Requests without an id are balanced as usual.

use ::http::HeaderMap;
use prost::Message;
use serde::Deserialize;
use tessera_protocol::inference::{ModelInferRequest, infer_parameter::ParameterChoice};

use super::proto_fields::Field;

/// The marker looked for before parsing anything: most requests carry no sequence id.
const KEY: &[u8] = b"sequence_id";

/// A request's correlation id, as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SequenceId {
    /// A non-zero number.
    Num(u64),
    /// A non-empty string.
    Str(String),
}

impl SequenceId {
    fn from_json(value: &serde_json::Value) -> Option<Self> {
        match value {
            serde_json::Value::Number(n) => n.as_u64().filter(|n| *n != 0).map(Self::Num),
            serde_json::Value::String(s) if !s.is_empty() => Some(Self::Str(s.clone())),
            _ => None,
        }
    }
}

/// The routing key of a sequence: stable across gateways and restarts (FNV-1a, not the
/// per-process randomized hasher).
pub fn sequence_key(tenant: &str, model: &str, id: &SequenceId) -> u64 {
    let mut h = Fnv::default();
    h.write(tenant.as_bytes());
    h.write(&[0xff]);
    h.write(model.as_bytes());
    h.write(&[0xff]);
    match id {
        SequenceId::Num(n) => {
            h.write(b"n");
            h.write(&n.to_le_bytes());
        }
        SequenceId::Str(s) => {
            h.write(b"s");
            h.write(s.as_bytes());
        }
    }
    h.0
}

/// A replica's rendezvous score for `key`: the candidate with the highest score takes the
/// sequence. `replica` names the replica the same way on every gateway (worker id, endpoint).
pub fn score(key: u64, worker_id: &str, endpoint: &str) -> u64 {
    let mut h = Fnv::default();
    h.write(worker_id.as_bytes());
    h.write(&[0xff]);
    h.write(endpoint.as_bytes());
    mix(h.0 ^ key)
}

/// SplitMix64's finalizer: spreads FNV's weak low bits so scores compare fairly.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// The sequence id of an HTTP inference request (its JSON header: the whole body, or the part
/// `Inference-Header-Content-Length` gives); `None` when it has none or the body is not JSON
/// (the worker then answers the client's mistake).
pub fn http_sequence_id(headers: &HeaderMap, body: &[u8]) -> Option<SequenceId> {
    let json_length = headers.get("inference-header-content-length").and_then(|v| v.to_str().ok());
    http_sequence_id_from(json_length, body)
}

/// [`http_sequence_id`] given the `Inference-Header-Content-Length` value, when there is one.
pub fn http_sequence_id_from(json_length: Option<&str>, body: &[u8]) -> Option<SequenceId> {
    let json_len = json_length.and_then(|v| v.parse::<usize>().ok()).unwrap_or(body.len());
    let json = body.get(..json_len)?;
    if !contains(json, KEY) {
        return None;
    }
    #[derive(Deserialize)]
    struct Header {
        #[serde(default)]
        parameters: serde_json::Map<String, serde_json::Value>,
    }
    let header: Header = serde_json::from_slice(json).ok()?;
    header.parameters.get("sequence_id").and_then(SequenceId::from_json)
}

/// `ModelInferRequest.parameters`' field number.
const PARAMETERS_FIELD: u64 = 4;

/// The `parameters` entries of a `ModelInferRequest` that mention `sequence_id`, gathered from
/// a walk of its top-level fields (encoded with their tags, so they decode as a request holding
/// only them): a caller walking the message for other fields too reads the id in the same walk.
#[derive(Debug, Default)]
pub struct SequenceParameters {
    entries: Vec<u8>,
}

impl SequenceParameters {
    /// Keeps `field` if it is a `parameters` entry that mentions `sequence_id`.
    pub fn add(&mut self, field: Field<'_>) {
        if field.number == PARAMETERS_FIELD && field.delimited.is_some_and(|entry| contains(entry, KEY)) {
            self.entries.extend_from_slice(field.encoded);
        }
    }

    /// The sequence id the kept entries give, if any.
    pub fn id(self) -> Option<SequenceId> {
        if self.entries.is_empty() {
            return None;
        }
        let request = ModelInferRequest::decode(self.entries.as_slice()).ok()?;
        match request.parameters.get("sequence_id")?.parameter_choice.as_ref()? {
            ParameterChoice::Int64Param(n) => u64::try_from(*n).ok().filter(|n| *n != 0).map(SequenceId::Num),
            ParameterChoice::Uint64Param(n) => Some(*n).filter(|n| *n != 0).map(SequenceId::Num),
            ParameterChoice::StringParam(s) if !s.is_empty() => Some(SequenceId::Str(s.clone())),
            _ => None,
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::inference::InferParameter;

    use crate::gateway::proto_fields;

    /// The sequence id of a gRPC `ModelInferRequest` message, read as the gateway reads it in its
    /// walk of a call's first message (`grpc::target_of`); `None` when it is malformed.
    fn grpc_sequence_id(message: &[u8]) -> Option<SequenceId> {
        let mut parameters = SequenceParameters::default();
        for field in proto_fields::fields(message) {
            parameters.add(field.ok()?);
        }
        parameters.id()
    }

    #[test]
    fn ids_are_read_from_http_json_and_grpc_messages() {
        let body = br#"{"parameters":{"sequence_id":42,"sequence_start":true},"inputs":[]}"#;
        assert_eq!(http_sequence_id(&HeaderMap::new(), body), Some(SequenceId::Num(42)));
        let body = br#"{"parameters":{"sequence_id":"abc"},"inputs":[]}"#;
        assert_eq!(http_sequence_id(&HeaderMap::new(), body), Some(SequenceId::Str("abc".into())));
        let mut with_tail = br#"{"parameters":{"sequence_id":7}}"#.to_vec();
        let mut headers = HeaderMap::new();
        headers.insert("inference-header-content-length", with_tail.len().to_string().parse().expect("number"));
        with_tail.extend_from_slice(b"\x00\x01binary sequence_id");
        assert_eq!(http_sequence_id(&headers, &with_tail), Some(SequenceId::Num(7)));
        assert_eq!(http_sequence_id(&HeaderMap::new(), br#"{"inputs":[]}"#), None);
        assert_eq!(http_sequence_id(&HeaderMap::new(), br#"{"parameters":{"sequence_id":0}}"#), None);

        let mut request = ModelInferRequest { model_name: "m".into(), ..Default::default() };
        let param = |c| InferParameter { parameter_choice: Some(c) };
        request.parameters.insert("sequence_id".into(), param(ParameterChoice::StringParam("s1".into())));
        assert_eq!(grpc_sequence_id(&request.encode_to_vec()), Some(SequenceId::Str("s1".into())));
        request.parameters.insert("sequence_id".into(), param(ParameterChoice::Int64Param(9)));
        assert_eq!(grpc_sequence_id(&request.encode_to_vec()), Some(SequenceId::Num(9)));
        request.parameters.clear();
        assert_eq!(grpc_sequence_id(&request.encode_to_vec()), None);
    }

    #[test]
    fn grpc_ids_are_found_among_other_fields_and_never_in_tensor_bytes() {
        let param = |c| InferParameter { parameter_choice: Some(c) };
        let mut request = ModelInferRequest {
            model_name: "m".into(),
            model_version: "2".into(),
            id: "req-1".into(),
            raw_input_contents: vec![vec![7; 70_000].into(), b"sequence_id".to_vec().into()],
            ..Default::default()
        };
        request.parameters.insert("priority".into(), param(ParameterChoice::Int64Param(3)));
        // The marker inside a tensor or another parameter's value is not a sequence id.
        request.parameters.insert("note".into(), param(ParameterChoice::StringParam("sequence_id".into())));
        assert_eq!(grpc_sequence_id(&request.encode_to_vec()), None);
        request.parameters.insert("sequence_id".into(), param(ParameterChoice::Uint64Param(11)));
        let encoded = request.encode_to_vec();
        assert_eq!(grpc_sequence_id(&encoded), Some(SequenceId::Num(11)));
        // Cut anywhere, the message is malformed and yields no id rather than a panic.
        for cut in [1, 2, 5, encoded.len() / 2, encoded.len() - 1] {
            assert_eq!(grpc_sequence_id(&encoded[..cut]), None, "cut at {cut}");
        }
        assert_eq!(grpc_sequence_id(&[0xff; 11]), None);
        assert_eq!(grpc_sequence_id(&[0x0b]), None, "a group left open");
    }

    #[test]
    fn keys_separate_tenants_models_and_id_kinds() {
        let k = |t, m, id: SequenceId| sequence_key(t, m, &id);
        assert_eq!(k("t", "m", SequenceId::Num(1)), k("t", "m", SequenceId::Num(1)));
        assert_ne!(k("t", "m", SequenceId::Num(1)), k("u", "m", SequenceId::Num(1)));
        assert_ne!(k("t", "m", SequenceId::Num(1)), k("t", "n", SequenceId::Num(1)));
        assert_ne!(k("t", "m", SequenceId::Num(49)), k("t", "m", SequenceId::Str("1".into())));
    }
}
