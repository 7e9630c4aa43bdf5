//! KServe v2 over HTTP/1.1 with the binary tensor extension: one keep-alive hyper connection per
//! worker, the request body encoded once and shared, binary outputs parsed in place.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST};
use http::{HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::Value;
use tessera_protocol::DataType;
use tokio::net::TcpStream;

use super::stats::ServerStats;
use super::tensors::{InputData, ModelInfo, OutputCheck, ResponseTensor, TensorMeta};
use super::{Target, Worker};

/// Header giving the length of the JSON part of a binary-extension body.
const HEADER_LENGTH: &str = "inference-header-content-length";

/// One keep-alive HTTP/1.1 connection, reopened when the server closes it.
pub struct HttpConn {
    /// `host:port` to connect to.
    addr: Arc<str>,
    host: HeaderValue,
    sender: Option<SendRequest<Full<Bytes>>>,
}

/// A response: status, the `Inference-Header-Content-Length` value and the whole body.
struct Response {
    status: StatusCode,
    header_length: Option<usize>,
    body: Bytes,
}

impl HttpConn {
    /// A connection to `addr` (`host:port`), opened on first use.
    pub fn new(addr: &str) -> Result<Self, String> {
        let host = HeaderValue::from_str(addr).map_err(|_| format!("invalid address '{addr}'"))?;
        Ok(Self { addr: addr.into(), host, sender: None })
    }

    async fn send(&mut self, mut request: Request<Full<Bytes>>) -> Result<Response, String> {
        request.headers_mut().insert(HOST, self.host.clone());
        let mut sender = match self.sender.take() {
            Some(sender) if !sender.is_closed() => sender,
            _ => connect(&self.addr).await?,
        };
        let (parts, body) = async {
            sender.ready().await?;
            let (parts, body) = sender.send_request(request).await?.into_parts();
            Ok::<_, hyper::Error>((parts, body.collect().await?.to_bytes()))
        }
        .await
        .map_err(|e| format!("http: {e}"))?;
        // Only a connection that completed its exchange is kept.
        self.sender = Some(sender);
        let header_length = parts.headers.get(HEADER_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse().ok());
        Ok(Response { status: parts.status, header_length, body })
    }

    async fn get_json(&mut self, path: &str) -> Result<Value, String> {
        let uri: Uri = path.parse().map_err(|_| format!("invalid path '{path}'"))?;
        let request = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("GET {path}: {e}"))?;
        let response = self.send(request).await?;
        if response.status != StatusCode::OK {
            return Err(format!("GET {path}: {}", error_message(response.status, &response.body)));
        }
        serde_json::from_slice(&response.body).map_err(|e| format!("GET {path}: invalid JSON: {e}"))
    }
}

/// Opens a keep-alive connection; its driver task ends when either side closes it.
async fn connect(addr: &str) -> Result<SendRequest<Full<Bytes>>, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| format!("connect: {e}"))?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.map_err(|e| format!("connect: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// `HTTP 503: Exceeds maximum queue size`, from a KServe `{"error": ...}` body when there is one.
fn error_message(status: StatusCode, body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct ErrorBody<'a> {
        #[serde(borrow)]
        error: Cow<'a, str>,
    }
    match serde_json::from_slice::<ErrorBody<'_>>(body) {
        Ok(e) => format!("HTTP {}: {}", status.as_u16(), e.error),
        Err(_) => format!("HTTP {}", status.as_u16()),
    }
}

/// `/v2/models/{m}[/versions/{v}]`, names percent-encoded.
fn model_path(target: &Target) -> String {
    let mut path = format!("/v2/models/{}", encode_segment(&target.model));
    if let Some(v) = &target.version {
        path.push_str("/versions/");
        path.push_str(&encode_segment(v));
    }
    path
}

fn encode_segment(s: &str) -> Cow<'_, str> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
    if s.bytes().all(plain) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.bytes().map(|b| if plain(b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect())
}

/// Control-plane calls (metadata, config, statistics) on their own connection.
pub struct HttpControl {
    conn: HttpConn,
    target: Target,
}

impl HttpControl {
    /// A client for `target`.
    pub fn new(target: &Target) -> Result<Self, String> {
        Ok(Self { conn: HttpConn::new(&target.addr)?, target: target.clone() })
    }

    /// Model metadata plus `max_batch_size` from the configuration.
    pub async fn model_info(&mut self) -> Result<ModelInfo, String> {
        let path = model_path(&self.target);
        let metadata = self.conn.get_json(&path).await?;
        let tensors = |key: &str| -> Result<Vec<TensorMeta>, String> {
            let list = metadata[key].as_array().ok_or_else(|| format!("model metadata without '{key}'"))?;
            list.iter().map(tensor_meta).collect()
        };
        let (inputs, outputs) = (tensors("inputs")?, tensors("outputs")?);
        let batching = match self.conn.get_json(&format!("{path}/config")).await {
            Ok(config) => config["max_batch_size"].as_u64().unwrap_or(0) > 0,
            // Without the configuration extension, a variable first dimension means batching.
            Err(_) => inputs.iter().all(|i| i.shape.first() == Some(&-1)),
        };
        Ok(ModelInfo { inputs, outputs, batching })
    }

    /// The model's statistics, summed over the versions reported.
    pub async fn stats(&mut self) -> Result<ServerStats, String> {
        let body = self.conn.get_json(&format!("{}/stats", model_path(&self.target))).await?;
        ServerStats::from_json(&body)
    }
}

fn tensor_meta(v: &Value) -> Result<TensorMeta, String> {
    let name = v["name"].as_str().ok_or("tensor metadata without a name")?;
    let datatype = v["datatype"].as_str().unwrap_or_default();
    let datatype = DataType::from_wire(datatype).ok_or_else(|| format!("tensor '{name}': unknown datatype"))?;
    let shape = v["shape"].as_array().ok_or_else(|| format!("tensor '{name}' without a shape"))?;
    let shape: Result<Vec<i64>, String> =
        shape.iter().map(|d| d.as_i64().ok_or_else(|| format!("tensor '{name}': bad dimension"))).collect();
    Ok(TensorMeta { name: name.to_string(), datatype, shape: shape? })
}

/// Encodes an inference request with every input in the binary tail and every output asked
/// back as binary. Returns the body and the length of its JSON header.
pub fn encode_infer_body(inputs: &[InputData]) -> (Bytes, usize) {
    let json_inputs: Vec<Value> = inputs
        .iter()
        .map(|i| {
            serde_json::json!({
                "name": i.name,
                "shape": i.shape,
                "datatype": i.datatype.as_wire(),
                "parameters": { "binary_data_size": i.data.len() },
            })
        })
        .collect();
    let header = serde_json::json!({ "inputs": json_inputs, "parameters": { "binary_data_output": true } });
    let header = header.to_string();
    let tail: usize = inputs.iter().map(|i| i.data.len()).sum();
    let mut body = BytesMut::with_capacity(header.len() + tail);
    body.put_slice(header.as_bytes());
    for input in inputs {
        body.put_slice(&input.data);
    }
    (body.freeze(), header.len())
}

/// The JSON part of a response, borrowed from the body.
#[derive(Deserialize)]
struct ResponseHeader<'a> {
    #[serde(borrow, default)]
    outputs: Vec<ResponseOutput<'a>>,
}

#[derive(Deserialize)]
struct ResponseOutput<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    datatype: Cow<'a, str>,
    shape: Vec<i64>,
    #[serde(default)]
    parameters: Option<OutputParameters>,
}

#[derive(Deserialize)]
struct OutputParameters {
    binary_data_size: Option<usize>,
}

/// Checks a successful response body: binary outputs in JSON order after the header.
pub fn check_infer_response(check: &OutputCheck, header_length: Option<usize>, body: &[u8]) -> Result<(), String> {
    let split = header_length.unwrap_or(body.len());
    let (header, mut tail) = body.split_at_checked(split).ok_or("Inference-Header-Content-Length beyond the body")?;
    let header: ResponseHeader<'_> =
        serde_json::from_slice(header).map_err(|e| format!("invalid response JSON: {:?}", e.classify()))?;
    let mut tensors = Vec::with_capacity(header.outputs.len());
    for out in &header.outputs {
        let size = out.parameters.as_ref().and_then(|p| p.binary_data_size);
        let size = size.ok_or_else(|| format!("output '{}' is not binary", out.name))?;
        let (data, rest) = tail.split_at_checked(size).ok_or("binary outputs run past the body")?;
        tail = rest;
        tensors.push(ResponseTensor { name: &out.name, datatype: &out.datatype, shape: &out.shape, data });
    }
    if !tail.is_empty() {
        return Err("bytes left after the binary outputs".into());
    }
    check.check(tensors)
}

/// A load worker: one connection, one prepared request.
pub struct HttpWorker {
    conn: HttpConn,
    uri: Uri,
    body: Bytes,
    header_length: HeaderValue,
    content_length: HeaderValue,
    check: Arc<OutputCheck>,
}

impl HttpWorker {
    /// A worker sending `body` (from [`encode_infer_body`]) to `target`.
    pub fn new(target: &Target, body: Bytes, header_length: usize, check: Arc<OutputCheck>) -> Result<Self, String> {
        let path = format!("{}/infer", model_path(target));
        Ok(Self {
            conn: HttpConn::new(&target.addr)?,
            uri: path.parse().map_err(|_| format!("invalid path '{path}'"))?,
            content_length: HeaderValue::from(body.len()),
            body,
            header_length: HeaderValue::from(header_length),
            check,
        })
    }

    fn request(&self) -> Result<Request<Full<Bytes>>, String> {
        Request::builder()
            .method(Method::POST)
            .uri(self.uri.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"))
            .header(CONTENT_LENGTH, self.content_length.clone())
            .header(HEADER_LENGTH, self.header_length.clone())
            .body(Full::new(self.body.clone()))
            .map_err(|e| format!("request: {e}"))
    }
}

impl Worker for HttpWorker {
    async fn infer(&mut self) -> Result<(), String> {
        let request = self.request()?;
        let response = self.conn.send(request).await?;
        if response.status != StatusCode::OK {
            return Err(error_message(response.status, &response.body));
        }
        check_infer_response(&self.check, response.header_length, &response.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Vec<InputData> {
        vec![
            InputData {
                name: "A".into(),
                datatype: DataType::Int32,
                shape: vec![1, 2],
                data: Bytes::from(vec![1u8; 8]),
            },
            InputData {
                name: "B".into(),
                datatype: DataType::Bytes,
                shape: vec![1],
                data: Bytes::from_static(b"\x01\0\0\0z"),
            },
        ]
    }

    #[test]
    fn body_is_a_json_header_then_inputs_in_order() {
        let (body, header_length) = encode_infer_body(&inputs());
        let header: Value = serde_json::from_slice(&body[..header_length]).expect("header is JSON");
        assert_eq!(header["parameters"]["binary_data_output"], true);
        assert_eq!(
            header["inputs"][0],
            serde_json::json!({"name": "A", "shape": [1, 2], "datatype": "INT32", "parameters": {"binary_data_size": 8}})
        );
        assert_eq!(header["inputs"][1]["parameters"]["binary_data_size"], 5);
        assert!(header["inputs"][0].get("data").is_none());
        assert_eq!(&body[header_length..], b"\x01\x01\x01\x01\x01\x01\x01\x01\x01\0\0\0z");
    }

    fn response(outputs: &[(&str, &[i64], &[u8])]) -> (Vec<u8>, usize) {
        let json: Vec<Value> = outputs
            .iter()
            .map(|(name, shape, data)| {
                serde_json::json!({"name": name, "datatype": "FP32", "shape": shape,
                    "parameters": {"binary_data_size": data.len()}})
            })
            .collect();
        let mut body =
            serde_json::json!({"model_name": "m", "model_version": "1", "outputs": json}).to_string().into_bytes();
        let header_length = body.len();
        for (_, _, data) in outputs {
            body.extend_from_slice(data);
        }
        (body, header_length)
    }

    #[test]
    fn responses_are_split_and_checked() {
        let meta = |name: &str| TensorMeta { name: name.into(), datatype: DataType::Fp32, shape: vec![-1, 2] };
        let check = ModelInfo { inputs: vec![], outputs: vec![meta("X"), meta("Y")], batching: true }.output_check(1);
        let (body, len) = response(&[("X", &[1, 2], &[0; 8]), ("Y", &[1, 2], &[0; 8])]);
        check_infer_response(&check, Some(len), &body).expect("good response");

        let (body, len) = response(&[("X", &[1, 2], &[0; 8]), ("Y", &[1, 2], &[0; 4])]);
        assert_eq!(
            check_infer_response(&check, Some(len), &body).expect_err("bad size"),
            "output 'Y': byte size does not match its shape"
        );
        let (body, len) = response(&[("X", &[1, 2], &[0; 8])]);
        assert!(check_infer_response(&check, Some(len), &body).expect_err("missing").contains("missing"));
        let (mut body, len) = response(&[("X", &[1, 2], &[0; 8]), ("Y", &[1, 2], &[0; 8])]);
        assert!(check_infer_response(&check, Some(len + 1000), &body).is_err());
        body.pop();
        assert!(check_infer_response(&check, Some(len), &body).expect_err("short").contains("past the body"));
        assert!(
            check_infer_response(
                &check,
                None,
                br#"{"outputs":[{"name":"X","datatype":"FP32","shape":[1,2],"data":[1,2]}]}"#
            )
            .expect_err("json output")
            .contains("not binary")
        );
    }

    #[test]
    fn errors_and_paths() {
        assert_eq!(error_message(StatusCode::SERVICE_UNAVAILABLE, br#"{"error":"full"}"#), "HTTP 503: full");
        assert_eq!(error_message(StatusCode::BAD_GATEWAY, b"<html>"), "HTTP 502");
        let target = Target { addr: "h:1".into(), model: "a b".into(), version: Some("2".into()) };
        assert_eq!(model_path(&target), "/v2/models/a%20b/versions/2");
    }
}
