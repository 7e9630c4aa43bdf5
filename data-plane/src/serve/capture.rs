//! Request/response capture on the request path: whether an inference is sampled (one atomic
//! load when no deployment captures, a map lookup and a random draw otherwise), what of it the
//! protocol shows the [`Tap`], and the owned [`CaptureRecord`] handed to the [`CaptureHook`]
//! (a worker's bounded queue). Encoding a record as a JSON Lines line ([`CaptureRecord::encode`])
//! happens off the request path, in the hook's background task.

use std::cell::Cell;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use tessera_protocol::DataType;

use crate::engine::infer::{InferRequest, InferResponse, ParamValue, Parameters};
use crate::engine::tensor::OutputTensor;

/// What of a deployment's requests is captured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CaptureSettings {
    /// Share of requests captured, 0.0 to 1.0.
    pub sample_rate: f64,
    /// Keep the input tensors.
    pub inputs: bool,
    /// Keep the output tensors.
    pub outputs: bool,
    /// Keep the request's and response's parameters.
    pub metadata: bool,
    /// Largest encoded record (the newline included).
    pub max_record_bytes: u64,
}

/// A sampled request's destination: the deployment it is captured for and how.
#[derive(Debug, Clone)]
pub struct Ticket {
    /// Deployment id (the capture files' folder).
    pub deployment_id: Arc<str>,
    /// What to keep.
    pub settings: CaptureSettings,
}

/// Hears sampled inferences (a worker's capture queue); `tessera serve` installs none.
pub trait CaptureHook: Send + Sync {
    /// Whether this request of `model` in `tenant_id` is captured: a cheap check on the
    /// request path.
    fn sample(&self, tenant_id: &str, model: &str) -> Option<Ticket>;
    /// Hands a record over without waiting (a full queue drops it and counts the drop).
    fn submit(&self, record: CaptureRecord);
    /// Appends the hook's own families to a `/metrics` scrape.
    fn render_metrics(&self, out: &mut String);
}

/// Whether a draw in `[0, 1)` falls within `rate`: 1.0 always, 0.0 never.
pub fn sampled(rate: f64, draw: f64) -> bool {
    rate >= 1.0 || draw < rate
}

thread_local! {
    /// Per-thread xorshift state, seeded from the process's random hasher keys.
    static RNG: Cell<u64> = Cell::new(RandomState::new().hash_one(std::thread::current().id()) | 1);
}

/// A uniform draw in `[0, 1)` from a per-thread xorshift64 generator: sampling needs speed,
/// not cryptographic quality.
pub fn draw() -> f64 {
    RNG.with(|cell| {
        let mut x = cell.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        cell.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// What a protocol shows of one request and its answer; inert (two branches) when the request
/// is not sampled. Tensor bytes are reference-counted, so keeping them copies no data.
#[derive(Debug, Default)]
pub struct Tap {
    kept: Option<Kept>,
}

#[derive(Debug)]
struct Kept {
    settings: CaptureSettings,
    request_id: String,
    parameters: Parameters,
    inputs: Vec<OutputTensor>,
    outputs: Option<Vec<OutputTensor>>,
}

impl Tap {
    /// A tap that keeps nothing.
    pub fn off() -> Self {
        Tap { kept: None }
    }

    /// A tap that keeps what `settings` ask for.
    pub fn on(settings: CaptureSettings) -> Self {
        let kept = Kept {
            settings,
            request_id: String::new(),
            parameters: Parameters::new(),
            inputs: Vec::new(),
            outputs: None,
        };
        Tap { kept: Some(kept) }
    }

    /// Notes the decoded request (its inputs already read from shared memory).
    pub fn request(&mut self, request: &InferRequest) {
        let Some(kept) = &mut self.kept else { return };
        kept.request_id.clone_from(&request.id);
        if kept.settings.metadata {
            kept.parameters.clone_from(&request.parameters);
        }
        if kept.settings.inputs {
            kept.inputs = request
                .inputs
                .iter()
                .map(|i| OutputTensor {
                    name: i.name.clone(),
                    datatype: i.datatype,
                    shape: i.shape.clone(),
                    data: i.data.clone(),
                })
                .collect();
        }
    }

    /// Notes the engine's answer (before outputs go to shared memory): its outputs when they
    /// are kept (its model name and version are the record's own).
    pub fn response(&mut self, response: &InferResponse) {
        let Some(kept) = &mut self.kept else { return };
        kept.outputs = Some(if kept.settings.outputs { response.outputs.clone() } else { Vec::new() });
    }

    /// The record of a finished request, when it was sampled.
    pub fn into_record(self, ticket: Ticket, done: Finished) -> Option<CaptureRecord> {
        let kept = self.kept?;
        Some(CaptureRecord {
            tenant_id: done.tenant_id,
            deployment_id: ticket.deployment_id,
            model: done.model,
            version: done.version,
            received_at: done.received_at,
            duration: done.duration,
            error: done.error,
            request_id: kept.request_id,
            parameters: kept.parameters,
            inputs: kept.inputs,
            outputs: kept.outputs,
            settings: kept.settings,
        })
    }
}

/// How a sampled request ended, as the facade saw it.
#[derive(Debug)]
pub struct Finished {
    /// Tenant id.
    pub tenant_id: String,
    /// Model name clients used.
    pub model: String,
    /// Version that ran.
    pub version: i64,
    /// Wall-clock time the request reached the handler.
    pub received_at: SystemTime,
    /// Time to the answer.
    pub duration: Duration,
    /// The error message, for a failed request.
    pub error: Option<String>,
}

/// One captured inference, owned, waiting to be encoded off the request path.
#[derive(Debug)]
pub struct CaptureRecord {
    /// Tenant id.
    pub tenant_id: String,
    /// Deployment id.
    pub deployment_id: Arc<str>,
    /// Model name.
    pub model: String,
    /// Version that ran.
    pub version: i64,
    /// When the request reached the handler.
    pub received_at: SystemTime,
    /// Time to the answer.
    pub duration: Duration,
    /// Error message of a failed request.
    pub error: Option<String>,
    /// The request's id as the client gave it (empty when none: the encoded record then
    /// carries one made up for it, a UUID, so that every record can be named).
    pub request_id: String,
    /// Request parameters (when metadata is kept).
    pub parameters: Parameters,
    /// Input tensors (when inputs are kept).
    pub inputs: Vec<OutputTensor>,
    /// The answer's outputs (empty unless outputs are kept); `None` for a failure.
    pub outputs: Option<Vec<OutputTensor>>,
    /// What was asked to be kept.
    pub settings: CaptureSettings,
}

/// How much of a record survives the size cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Detail {
    /// Everything asked for.
    Full,
    /// Tensors keep name, datatype and shape, not data.
    NoData,
    /// No tensors and no parameters: the request id, model, timing and status only.
    Bare,
}

impl CaptureRecord {
    /// Milliseconds since the Unix epoch the request was received at.
    pub fn received_at_ms(&self) -> i64 {
        self.received_at.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// The record as one JSON Lines line (newline included) of at most `max_record_bytes`:
    /// tensor data goes first, then tensors and parameters; a record whose bare fields alone
    /// exceed the cap is `None` (the caller counts it dropped).
    pub fn encode(&self) -> Option<Vec<u8>> {
        let max = usize::try_from(self.settings.max_record_bytes).unwrap_or(usize::MAX);
        // Made up here, off the request path, and once for all three attempts.
        let made_up;
        let id = if self.request_id.is_empty() {
            made_up = uuid::Uuid::now_v7().to_string();
            &made_up
        } else {
            &self.request_id
        };
        for detail in [Detail::Full, Detail::NoData, Detail::Bare] {
            let line = self.encode_at(id, detail, max);
            if line.len() <= max {
                return Some(line);
            }
        }
        None
    }

    fn encode_at(&self, id: &str, detail: Detail, max: usize) -> Vec<u8> {
        // A line past the cap is thrown away, so no more room than the cap is taken for it.
        let mut line = Vec::with_capacity(self.estimated_len(detail).min(max.saturating_add(1)));
        let head = Head {
            request_id: id,
            tenant_id: &self.tenant_id,
            deployment_id: &self.deployment_id,
            model: &self.model,
            version: self.version,
            received_at_ms: self.received_at_ms(),
            duration_us: u64::try_from(self.duration.as_micros()).unwrap_or(u64::MAX),
            status: if self.error.is_some() { "error" } else { "ok" },
            truncated: detail != Detail::Full,
            error: self.error.as_deref(),
        };
        write_json(&mut line, &head);
        // The head's closing brace is replaced by the request and response objects.
        line.pop();
        if detail != Detail::Bare {
            line.extend_from_slice(b",\"request\":");
            self.write_request(&mut line, id, detail == Detail::Full);
            if let Some(outputs) = &self.outputs {
                line.extend_from_slice(b",\"response\":");
                self.write_response(&mut line, outputs, detail == Detail::Full);
            }
        }
        line.extend_from_slice(b"}\n");
        line
    }

    /// Room for the whole line at `detail`, so the buffer is not regrown while it is written:
    /// the head, and with data up to 6 bytes of text per tensor byte (an FP32 as
    /// `-1.2345678e-12,`, a BOOL as `false,`).
    fn estimated_len(&self, detail: Detail) -> usize {
        let per_byte = if detail == Detail::Full { 6 } else { 0 };
        let tensors = |ts: &[OutputTensor]| {
            ts.iter().map(|t| 64 + t.name.len() + 8 * t.shape.len() + per_byte * t.data.len()).sum::<usize>()
        };
        let outputs = self.outputs.as_deref().map_or(0, tensors);
        512 + self.request_id.len() + self.error.as_ref().map_or(0, String::len) + tensors(&self.inputs) + outputs
    }

    fn write_request(&self, out: &mut Vec<u8>, id: &str, data: bool) {
        out.extend_from_slice(b"{\"id\":");
        write_json(out, id);
        if self.settings.metadata {
            out.extend_from_slice(b",\"parameters\":");
            write_json(out, &ParametersJson(&self.parameters));
        }
        if self.settings.inputs {
            out.extend_from_slice(b",\"inputs\":");
            write_tensors(out, &self.inputs, data);
        }
        out.push(b'}');
    }

    /// The response as KServe v2 JSON: the model and version that ran (the engine answers with
    /// the same ones), then the outputs.
    fn write_response(&self, out: &mut Vec<u8>, outputs: &[OutputTensor], data: bool) {
        out.extend_from_slice(b"{\"model_name\":");
        write_json(out, &self.model);
        out.extend_from_slice(b",\"model_version\":\"");
        out.extend_from_slice(itoa::Buffer::new().format(self.version).as_bytes());
        out.push(b'"');
        if self.settings.outputs {
            out.extend_from_slice(b",\"outputs\":");
            write_tensors(out, outputs, data);
        }
        out.push(b'}');
    }
}

/// A record's own fields, written straight from borrowed values (no JSON tree is built).
#[derive(Serialize)]
struct Head<'a> {
    request_id: &'a str,
    tenant_id: &'a str,
    deployment_id: &'a str,
    model: &'a str,
    version: i64,
    received_at_ms: i64,
    duration_us: u64,
    status: &'static str,
    truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

/// A tensor written without its data (`data_base64` when the data has no JSON form).
#[derive(Serialize)]
struct TensorHead<'a> {
    name: &'a str,
    datatype: &'a str,
    shape: &'a [i64],
    #[serde(skip_serializing_if = "Option::is_none")]
    data_base64: Option<String>,
}

/// Request parameters as a JSON object (a non-finite double as `null`, as serde_json has it).
struct ParametersJson<'a>(&'a Parameters);

impl Serialize for ParametersJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            match v {
                ParamValue::Bool(b) => map.serialize_entry(k, b)?,
                ParamValue::Int(i) => map.serialize_entry(k, i)?,
                ParamValue::Uint(u) => map.serialize_entry(k, u)?,
                ParamValue::Double(d) => map.serialize_entry(k, d)?,
                ParamValue::Str(s) => map.serialize_entry(k, s)?,
            }
        }
        map.end()
    }
}

/// Appends `value` as JSON. Writing into a `Vec` cannot fail and these values always
/// serialize (string keys, finite or `null` numbers); a failure would leave a truncated line
/// that the control plane's check refuses, so it is only logged.
fn write_json<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    if let Err(e) = serde_json::to_writer(&mut *out, value) {
        tracing::error!(error = %e, "capture record field did not encode");
    }
}

/// Tensors as KServe v2 JSON; FP16/BF16 (no JSON form) and anything that fails to encode as
/// `data_base64` of the raw bytes; without `data`, only name, datatype and shape.
fn write_tensors(out: &mut Vec<u8>, tensors: &[OutputTensor], data: bool) {
    out.push(b'[');
    for (i, t) in tensors.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let at = out.len();
        let json_ok = data
            && !matches!(t.datatype, DataType::Fp16 | DataType::Bf16)
            && crate::serve::http::codec::write_json_tensor(out, t).is_ok();
        if json_ok {
            continue;
        }
        out.truncate(at);
        let data_base64 = data.then(|| base64::engine::general_purpose::STANDARD.encode(&t.data));
        write_json(out, &TensorHead { name: &t.name, datatype: t.datatype.as_wire(), shape: &t.shape, data_base64 });
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::{Value, json};

    use super::*;
    use crate::engine::tensor::InputTensor;

    fn settings(max: u64) -> CaptureSettings {
        CaptureSettings { sample_rate: 1.0, inputs: true, outputs: true, metadata: true, max_record_bytes: max }
    }

    fn int32(name: &str, values: &[i32]) -> OutputTensor {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        OutputTensor {
            name: name.into(),
            datatype: DataType::Int32,
            shape: vec![values.len() as i64],
            data: data.into(),
        }
    }

    fn record(settings: CaptureSettings, error: Option<&str>) -> CaptureRecord {
        let mut tap = Tap::on(settings);
        let input = int32("INPUT0", &[1, 2, 3, 4]);
        let mut parameters = Parameters::new();
        parameters.insert("priority".into(), ParamValue::Int(2));
        tap.request(&InferRequest {
            id: "req-1".into(),
            parameters,
            inputs: vec![InputTensor {
                name: input.name,
                datatype: input.datatype,
                shape: input.shape,
                data: input.data,
            }],
            ..Default::default()
        });
        if error.is_none() {
            tap.response(&InferResponse {
                model_name: "add_sub".into(),
                model_version: "1".into(),
                id: "req-1".into(),
                outputs: vec![int32("OUTPUT0", &[5, 6, 7, 8])],
            });
        }
        let ticket = Ticket { deployment_id: "dep".into(), settings };
        let done = Finished {
            tenant_id: "t".into(),
            model: "add_sub".into(),
            version: 1,
            received_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            duration: Duration::from_micros(250),
            error: error.map(str::to_string),
        };
        tap.into_record(ticket, done).expect("a tap that is on makes a record")
    }

    fn parse(line: &[u8]) -> Value {
        assert_eq!(line.last(), Some(&b'\n'), "a JSON Lines line ends in a newline");
        serde_json::from_slice(line).expect("a record is one JSON object")
    }

    #[test]
    fn sampling_follows_the_rate() {
        assert!(sampled(1.0, 0.999_999));
        assert!(!sampled(0.0, 0.0), "rate 0 captures nothing, even a draw of 0");
        assert!(sampled(0.25, 0.2));
        assert!(!sampled(0.25, 0.25));
        let hits = (0..100_000).filter(|_| sampled(0.1, draw())).count();
        assert!((8_000..12_000).contains(&hits), "about 10% of draws: {hits}");
        assert!((0..10_000).map(|_| draw()).all(|d| (0.0..1.0).contains(&d)));
    }

    #[test]
    fn requests_without_an_id_get_one() {
        let settings = settings(1 << 20);
        let mut tap = Tap::on(settings);
        tap.request(&InferRequest::default());
        let ticket = Ticket { deployment_id: "d".into(), settings };
        let done = Finished {
            tenant_id: "t".into(),
            model: "m".into(),
            version: 1,
            received_at: UNIX_EPOCH,
            duration: Duration::ZERO,
            error: None,
        };
        let record = tap.into_record(ticket, done).expect("a record");
        let line = parse(&record.encode().expect("fits"));
        let id = line["request_id"].as_str().expect("an id");
        assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
        assert_eq!(line["request"]["id"], id, "the record and its request carry the same id");
    }

    #[test]
    fn an_inert_tap_makes_no_record() {
        let mut tap = Tap::off();
        tap.request(&InferRequest::default());
        let ticket = Ticket { deployment_id: "d".into(), settings: settings(1 << 20) };
        let done = Finished {
            tenant_id: "t".into(),
            model: "m".into(),
            version: 1,
            received_at: UNIX_EPOCH,
            duration: Duration::ZERO,
            error: None,
        };
        assert!(tap.into_record(ticket, done).is_none());
    }

    #[test]
    fn records_encode_as_kserve_json_lines() {
        let v = parse(&record(settings(1 << 20), None).encode().expect("fits"));
        assert_eq!(v["request_id"], "req-1");
        assert_eq!(v["model"], "add_sub");
        assert_eq!(v["version"], 1);
        assert_eq!(v["deployment_id"], "dep");
        assert_eq!(v["status"], "ok");
        assert_eq!(v["truncated"], false);
        assert_eq!(v["received_at_ms"], 1_700_000_000_123_i64);
        assert_eq!(v["duration_us"], 250);
        assert_eq!(v["request"]["parameters"]["priority"], 2);
        assert_eq!(
            v["request"]["inputs"][0],
            json!({"name": "INPUT0", "datatype": "INT32", "shape": [4], "data": [1, 2, 3, 4]})
        );
        assert_eq!(v["response"]["model_name"], "add_sub");
        assert_eq!(v["response"]["model_version"], "1", "a string, as KServe v2 JSON has it");
        assert_eq!(v["response"]["outputs"][0]["data"], json!([5, 6, 7, 8]));
    }

    #[test]
    fn settings_choose_what_is_kept() {
        let only_outputs = CaptureSettings { inputs: false, metadata: false, ..settings(1 << 20) };
        let v = parse(&record(only_outputs, None).encode().expect("fits"));
        assert!(v["request"].get("inputs").is_none());
        assert!(v["request"].get("parameters").is_none());
        assert_eq!(v["response"]["outputs"][0]["name"], "OUTPUT0");
        let failed = parse(&record(settings(1 << 20), Some("bad input")).encode().expect("fits"));
        assert_eq!(failed["status"], "error");
        assert_eq!(failed["error"], "bad input");
        assert!(failed.get("response").is_none());
    }

    #[test]
    fn binary_only_types_are_base64() {
        let half = OutputTensor {
            name: "h".into(),
            datatype: DataType::Fp16,
            shape: vec![1],
            data: Bytes::from_static(&[0, 60]),
        };
        let mut out = Vec::new();
        write_tensors(&mut out, &[half], true);
        let v: Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v[0]["data_base64"], "ADw=");
        assert!(v[0].get("data").is_none());
    }

    #[test]
    fn the_size_cap_drops_data_then_tensors_then_the_record() {
        let full = record(settings(1 << 20), None).encode().expect("fits").len() as u64;
        let no_data = parse(&record(settings(full - 1), None).encode().expect("fits without data"));
        assert_eq!(no_data["truncated"], true);
        assert_eq!(no_data["request"]["inputs"][0]["shape"], json!([4]));
        assert!(no_data["request"]["inputs"][0].get("data").is_none());
        let bare = record(settings(200), None).encode().expect("bare fits in 200 bytes");
        assert!(bare.len() <= 200);
        let bare = parse(&bare);
        assert!(bare.get("request").is_none());
        assert_eq!(bare["request_id"], "req-1");
        assert!(record(settings(20), None).encode().is_none(), "nothing fits in 20 bytes");
    }
}
