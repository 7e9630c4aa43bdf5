//! The gateway's KServe v2 gRPC front end, a proxy at the HTTP/2 level: a call's messages are
//! forwarded as the client framed them (compressed or not), and the worker's response,
//! trailers included, goes back unchanged. Only the first message is read, to find the model
//! (fields 1 and 2 of every model request are its name and version). Server health, metadata
//! and the repository index are answered here; shared memory and model control are refused
//! with the reason.
//!
//! A unary call is buffered, so it can be sent to another replica under the rule in
//! [`super::forward`], and so is its answer up to 4 MiB, which then reaches the client in one
//! write. A stream (`ModelStreamInfer`) goes to one replica, chosen by its first message
//! (another one when that replica cannot be connected to, before any of the stream was sent:
//! [`forward::SharedStream`]), and holds its tenant's concurrency slot for its whole life.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io::Read as _;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use prost::Message;
use tessera_protocol::health::health_check_response::ServingStatus;
use tessera_protocol::health::{HealthCheckRequest, HealthCheckResponse};
use tessera_protocol::inference::repository_index_response::ModelIndex;
use tessera_protocol::inference::{
    RepositoryIndexResponse, ServerLiveResponse, ServerMetadataResponse, ServerReadyResponse,
};
use tessera_protocol::stall::Stall;
use tonic::Status;
use tracing::Instrument as _;

use super::Gateway;
use super::forward::{self, BoxError};
use super::http::RetainForwardable as _;
use super::proto_fields::{self, Field};
use super::sticky::{SequenceId, SequenceParameters};
use crate::auth::forwarded;
use crate::error::{Error, ErrorKind};

type S = State<Arc<Gateway>>;

/// The gRPC front end's routes.
pub fn routes(gateway: Arc<Gateway>) -> tonic::service::Routes {
    let router = axum::Router::new()
        .route("/inference.GRPCInferenceService/{method}", axum::routing::post(inference))
        .route("/grpc.health.v1.Health/Check", axum::routing::post(health_check))
        .fallback(|| async { status_response(Status::unimplemented("unknown gRPC service or method")) })
        .with_state(gateway);
    tonic::service::Routes::from(router)
}

async fn inference(State(g): S, Path(method): Path<String>, request: Request) -> Response {
    match method.as_str() {
        "ServerLive" => message_response(&ServerLiveResponse { live: g.is_live() }),
        "ServerReady" => message_response(&ServerReadyResponse { ready: g.is_ready() }),
        "ServerMetadata" => message_response(&ServerMetadataResponse {
            name: "tessera-gateway".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: ["model_configuration", "statistics"].map(String::from).into(),
        }),
        "RepositoryIndex" => repository_index(&g, request.headers()).await,
        "ModelInfer" | "ModelMetadata" | "ModelReady" | "ModelConfig" | "ModelStatistics" => {
            let started = Instant::now();
            let (parts, body) = request.into_parts();
            match axum::body::to_bytes(body, g.max_request_bytes).await {
                Ok(body) => unary(&g, parts, body, started).await,
                Err(e) => error_response(over_limit(&g, e)),
            }
        }
        "ModelStreamInfer" => forward_stream(&g, request).await.unwrap_or_else(error_response),
        "RepositoryModelLoad" | "RepositoryModelUnload" => {
            error_response(Error::permission_denied("model control is managed by the control plane"))
        }
        "TraceSetting" | "LogSettings" => {
            error_response(Error::new(ErrorKind::Unsupported, super::http::SETTINGS_PER_WORKER))
        }
        m if m.contains("SharedMemory") => error_response(Error::new(
            ErrorKind::Unsupported,
            "shared memory needs a direct connection to a worker; through the gateway, send tensors in the request",
        )),
        _ => status_response(Status::unimplemented(format!("method {method} is not supported by the gateway"))),
    }
}

async fn health_check(State(g): S, request: Request) -> Response {
    let body = match axum::body::to_bytes(request.into_body(), 64 * 1024).await {
        Ok(body) => body,
        Err(e) => return status_response(Status::invalid_argument(format!("unreadable health check request: {e}"))),
    };
    let service = first_message(&body).and_then(|m| HealthCheckRequest::decode(m).ok()).map(|r| r.service);
    let status = match service.as_deref() {
        None => return status_response(Status::invalid_argument("malformed health check request")),
        Some("" | "inference.GRPCInferenceService") if g.is_ready() => ServingStatus::Serving,
        Some("" | "inference.GRPCInferenceService") => ServingStatus::NotServing,
        Some(other) => return status_response(Status::not_found(format!("unknown service '{other}'"))),
    };
    message_response(&HealthCheckResponse { status: status as i32 })
}

async fn repository_index(g: &Gateway, headers: &HeaderMap) -> Response {
    // The index is the gateway's own table: it spends none of the tenant's limits.
    let caller = match g.authenticate(authorization(headers)).await {
        Ok(c) => c,
        Err(e) => return error_response(e),
    };
    let models = caller
        .model_names()
        .into_iter()
        .map(|(name, m)| {
            let ready = m.replicas.iter().any(|r| r.serving);
            ModelIndex {
                name: name.to_string(),
                version: String::new(),
                state: if ready { "READY" } else { "UNAVAILABLE" }.into(),
                reason: String::new(),
            }
        })
        .collect();
    message_response(&RepositoryIndexResponse { models })
}

fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

/// Whether `path` names a unary method the gateway forwards to a model's replica (the rest
/// are answered here, refused, or streams).
pub(super) fn forwards_unary(path: &str) -> bool {
    matches!(
        path.strip_prefix("/inference.GRPCInferenceService/"),
        Some("ModelInfer" | "ModelMetadata" | "ModelReady" | "ModelConfig" | "ModelStatistics")
    )
}

/// The refusal of a request body over the gateway's limit, or one that broke off.
pub(super) fn over_limit(g: &Gateway, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::TooLarge,
        format!("request over the gateway's limit of {} bytes or unreadable: {e}", g.max_request_bytes),
    )
}

/// Forwards a unary model call (a method [`forwards_unary`] names) whose body is read, begun at
/// `started`: the worker's answer, or the refusal, counted in the metrics once the model is known.
pub(super) async fn unary(g: &Gateway, parts: http::request::Parts, body: Bytes, started: Instant) -> Response {
    forward_unary(g, parts, body, started).await.unwrap_or_else(|(e, metric)| {
        if let Some((tenant, model)) = metric {
            g.metrics.observe(&tenant, &model, "", "grpc", grpc_code(&e), started.elapsed());
        }
        error_response(e)
    })
}

type Failed = (Error, Option<(String, String)>);

async fn forward_unary(
    g: &Gateway,
    mut parts: http::request::Parts,
    body: Bytes,
    started: Instant,
) -> Result<Response, Failed> {
    let caller = g.authenticate(authorization(&parts.headers)).await.map_err(|e| (e, None))?;
    let target = target_of(&body, &parts.headers, g.max_request_bytes).map_err(|e| (e, None))?;
    let tenant = caller.tenant.clone();
    let failed = |e: Error| (e, Some((tenant.clone(), target.name.clone())));
    let model = caller.model(&target.name).map_err(failed)?;
    let slot = g.admit(&caller, model, &target.name, target.version).map_err(failed)?;
    let identity = g.identity_header(&caller.principal).map_err(failed)?;
    let headers = upstream_headers(std::mem::take(&mut parts.headers), identity);
    let path = parts.uri.path_and_query().cloned().map_or_else(|| Uri::from_static("/"), Uri::from);
    let send = |upstream: &Arc<super::routes::Upstream>| {
        let (upstream, path, headers, body) = (upstream.clone(), &path, &headers, body.clone());
        Ok(async move { g.upstream.send_unary_grpc(&upstream, path, headers, body).await })
    };
    let stale = |r: &http::Response<_>| r.headers().get("grpc-status").is_some_and(|s| s == "5");
    let sequence = target.sequence.as_ref().map(|id| super::sticky::sequence_key(&tenant, &target.name, id));
    let span = crate::spans::forward("grpc", &tenant, &target.name, target.version);
    let sending = forward::send(g, &target.name, model, target.version, sequence, send, stale);
    let answer = sending.instrument(span).await.map_err(failed)?;
    let whole = read_whole(answer.response, g.answer_stall).await.map_err(failed)?;
    g.metrics.observe(&tenant, &target.name, &answer.version.to_string(), "grpc", whole.code, started.elapsed());
    Ok(stream_back(whole.response, (answer.in_flight, slot)))
}

/// Largest unary answer read whole before it goes on (gRPC's default largest message); the
/// rest of a larger one streams on after it, so the gateway never holds more per call.
const WHOLE_ANSWER_BYTES: usize = 4 << 20;

/// A unary call's answer, read ahead.
struct WholeAnswer<B> {
    /// The answer with its framing headers dropped, its body read to its end (trailers
    /// included) or to [`WHOLE_ANSWER_BYTES`].
    response: http::Response<ReadAhead<B>>,
    /// Its `grpc-status`, from the headers (trailers-only answers) or the trailers; "0" when
    /// the trailers are still to come.
    code: &'static str,
}

/// Reads a worker's unary answer ahead, whole when it is not over [`WHOLE_ANSWER_BYTES`]. A
/// unary answer is one message; handed on whole, it goes to the client in one write.
/// Streamed on, the message went out as soon as it came, and the trailers (read after it from
/// the worker's connection) in a second write that the client waited for. A worker that sends
/// none of the rest of its answer for `stall`, here or as the rest streams on, fails the call:
/// the worker answers its connection's pings all the same, and nothing else would end the wait.
async fn read_whole<B>(response: http::Response<B>, stall: Duration) -> Result<WholeAnswer<B>, Error>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let (mut head, mut body) = response.into_parts();
    let mut status = head.headers.get("grpc-status").cloned();
    let (mut frames, mut bytes, mut ended) = (VecDeque::new(), 0, false);
    let mut stall = Stall::new(stall);
    while !ended && bytes <= WHOLE_ANSWER_BYTES {
        let next = poll_fn(|cx| {
            let polled = std::pin::Pin::new(&mut body).poll_frame(cx);
            stall.poll(cx, polled)
        });
        match next.await {
            None => return Err(stalled(&stall)),
            Some(None) => ended = true,
            Some(Some(Err(e))) => {
                let why = forward::error_chain(e.into().as_ref());
                return Err(Error::unavailable(format!("the worker's answer broke off before its end: {why}")));
            }
            Some(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    status = status.or_else(|| trailers.get("grpc-status").cloned());
                    ended = true;
                }
                bytes += frame.data_ref().map_or(0, Bytes::len);
                frames.push_back(frame);
            }
        }
    }
    let code = status.as_ref().and_then(|v| v.to_str().ok()).map_or("0", code_label);
    // An HTTP/1.1 answer's framing headers (`transfer-encoding`, `trailer`) are not HTTP/2's.
    head.headers.retain_forwardable();
    let body = ReadAhead { frames, rest: (!ended).then_some((body, stall)) };
    Ok(WholeAnswer { response: http::Response::from_parts(head, body), code })
}

/// A worker's answer that sent nothing more for `stall`'s limit.
fn stalled(stall: &Stall) -> Error {
    let secs = stall.limit().as_secs();
    Error::new(ErrorKind::UpstreamTimeout, format!("the worker sent none of the rest of its answer for {secs} s"))
}

/// A body whose first frames were read ahead: those, then what `rest` still has, each frame
/// within its stall's limit.
struct ReadAhead<B> {
    frames: VecDeque<Frame<Bytes>>,
    rest: Option<(B, Stall)>,
}

impl<B> http_body::Body for ReadAhead<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        let Some((rest, stall)) = self.rest.as_mut() else { return Poll::Ready(None) };
        let polled = std::pin::Pin::new(rest).poll_frame(cx);
        stall.poll(cx, polled).map(|frame| match frame {
            Some(frame) => frame.map(|frame| frame.map_err(Into::into)),
            None => Some(Err(stalled(stall).into())),
        })
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(|(rest, _)| rest.is_end_stream())
    }
}

async fn forward_stream(g: &Gateway, request: Request) -> Result<Response, Error> {
    let caller = g.authenticate(authorization(request.headers())).await?;
    let (mut parts, body) = request.into_parts();
    let mut data = body.into_data_stream();
    // Read until the first message is whole: it names the model.
    let mut prefix = BytesMut::new();
    let first_len = loop {
        if prefix.len() >= 5 {
            let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
            if len > g.max_request_bytes {
                return Err(Error::new(
                    ErrorKind::TooLarge,
                    format!("message over the gateway's limit of {} bytes", g.max_request_bytes),
                ));
            }
            if prefix.len() >= 5 + len {
                break 5 + len;
            }
        }
        match data.next().await {
            Some(Ok(chunk)) => prefix.extend_from_slice(&chunk),
            Some(Err(e)) => return Err(Error::invalid(format!("stream broke before its first message: {e}"))),
            // A stream closed before any message: nothing to route, nothing to answer.
            None if prefix.is_empty() => return Ok(message_frames(Vec::new())),
            None => return Err(Error::invalid("stream ended inside its first message")),
        }
    };
    let prefix = prefix.freeze();
    let target = target_of(&prefix[..first_len], &parts.headers, g.max_request_bytes)?;
    let model = caller.model(&target.name)?;
    // A stream holds one of its tenant's concurrency slots (and takes one token) for its life.
    let slot = g.admit(&caller, model, &target.name, target.version)?;
    // A stream is routed by its first request's sequence, if any: its later requests follow it.
    let sequence = target.sequence.as_ref().map(|id| super::sticky::sequence_key(&caller.tenant, &target.name, id));
    let identity = g.identity_header(&caller.principal)?;
    let rest = data.map(|chunk| chunk.map(Frame::data).map_err(|e| -> BoxError { Box::new(e) }));
    let frames = futures::stream::once(async move { Ok::<_, BoxError>(Frame::data(prefix)) }).chain(rest);
    let stream = forward::SharedStream::new(frames);
    let headers = upstream_headers(std::mem::take(&mut parts.headers), identity);
    let path = parts.uri.path().to_string();
    let send = |upstream: &Arc<super::routes::Upstream>| {
        // A connect failure sends nothing; anything else may have reached a worker.
        if stream.was_read() {
            return Err(Error::unavailable(format!(
                "the stream for '{}' broke after part of it was sent; open a new one",
                target.name
            )));
        }
        let mut req = http::Request::new(stream.body());
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = forward::worker_uri(&upstream.grpc, &path).map_err(|e| Error::internal(e.to_string()))?;
        *req.headers_mut() = headers.clone();
        Ok(g.upstream.grpc.request(req))
    };
    // A stream's errors come in its messages, never as a stale route in its head.
    let answer = forward::send(g, &target.name, model, target.version, sequence, send, |_| false).await?;
    Ok(stream_back(answer.response, (answer.in_flight, slot)))
}

/// The model a request names.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) version: Option<i64>,
    /// The request's sequence id, which picks its replica.
    pub(crate) sequence: Option<SequenceId>,
}

/// Reads the model's name and version and the sequence id from a call's first message
/// (decompressed as the `grpc-encoding` header says when its frame is flagged compressed).
pub(crate) fn target_of(framed: &[u8], headers: &HeaderMap, limit: usize) -> Result<Target, Error> {
    let Some(message) = first_message(framed) else {
        return Err(Error::invalid("the request holds no complete gRPC message"));
    };
    let decompressed;
    let message = match framed[0] {
        0 => message,
        1 => {
            decompressed = decompress(message, headers, limit)?;
            &decompressed[..]
        }
        // The worker's decoder (tonic) refuses any other flag; the client hears it from here.
        flag => return Err(Error::invalid(format!("compression flag {flag} is neither 0 nor 1"))),
    };
    let (name, version, sequence) =
        read_first_message(message).ok_or_else(|| Error::invalid("the request message is malformed"))?;
    if name.is_empty() {
        return Err(Error::invalid("the request names no model"));
    }
    let version =
        match version.as_str() {
            "" => None,
            v => Some(v.parse::<i64>().ok().filter(|v| *v > 0).ok_or_else(|| {
                Error::invalid(format!("version '{}' is not a positive integer", v.escape_default()))
            })?),
        };
    Ok(Target { name, version, sequence })
}

/// A compressed message, decompressed as the `grpc-encoding` header says, if it is not over
/// `limit` bytes.
fn decompress(message: &[u8], headers: &HeaderMap, limit: usize) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    let encoding = headers.get("grpc-encoding").and_then(|v| v.to_str().ok()).unwrap_or("identity");
    let read = match encoding {
        // Read at most one byte past the limit: a small bomb must not expand in memory.
        "gzip" => flate2::read::GzDecoder::new(message).take(limit as u64 + 1).read_to_end(&mut out),
        "deflate" => flate2::read::ZlibDecoder::new(message).take(limit as u64 + 1).read_to_end(&mut out),
        other => {
            return Err(Error::new(ErrorKind::Unsupported, format!("grpc-encoding '{other}' is not supported")));
        }
    };
    read.map_err(|e| Error::invalid(format!("the compressed message could not be read: {e}")))?;
    if out.len() > limit {
        return Err(Error::new(ErrorKind::TooLarge, format!("the decompressed message is over {limit} bytes")));
    }
    Ok(out)
}

/// The first message of a gRPC body (after its 5-byte frame header), if whole.
fn first_message(framed: &[u8]) -> Option<&[u8]> {
    let header = framed.get(..5)?;
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    framed.get(5..5 + len)
}

/// A `ModelInferRequest`'s model name and version (fields 1 and 2) and its sequence id, read in
/// one walk of its top-level fields; `None` when it is not protobuf.
fn read_first_message(m: &[u8]) -> Option<(String, String, Option<SequenceId>)> {
    let (mut name, mut version) = (String::new(), String::new());
    let mut sequence = SequenceParameters::default();
    for field in proto_fields::fields(m) {
        match field.ok()? {
            Field { number: 1, delimited: Some(bytes), .. } => name = String::from_utf8(bytes.to_vec()).ok()?,
            Field { number: 2, delimited: Some(bytes), .. } => version = String::from_utf8(bytes.to_vec()).ok()?,
            field => sequence.add(field),
        }
    }
    Some((name, version, sequence.id()))
}

/// The client's headers minus the connection's own and the credential (the HTTP front end's
/// rule, keeping `te: trailers`, which gRPC requires), plus the identity.
fn upstream_headers(mut headers: HeaderMap, identity: HeaderValue) -> HeaderMap {
    // h2 refuses any `te` but `trailers` (the one gRPC sends), which alone is kept.
    let trailers = headers.get_all(header::TE).iter().any(|v| v == "trailers");
    super::http::strip_unforwardable(&mut headers);
    if trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    headers.insert(forwarded::HEADER, identity);
    headers
}

/// The upstream response with its body streamed back; `guards` live until the body is done.
fn stream_back<B, G>(response: http::Response<B>, guards: G) -> Response
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    G: Send + Sync + 'static,
{
    let (head, incoming) = response.into_parts();
    let body = incoming.map_frame(move |frame| {
        let _ = &guards;
        frame
    });
    Response::from_parts(head, Body::new(body))
}

fn code_label(code: &str) -> &'static str {
    const CODES: [&str; 17] =
        ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16"];
    CODES.iter().find(|c| **c == code).copied().unwrap_or("2")
}

fn grpc_code(e: &Error) -> &'static str {
    code_label(&(e.codes().1 as i32).to_string())
}

/// A trailers-only response for `e`; 429s carry `retry-after` (seconds) as metadata.
pub(super) fn error_response(e: Error) -> Response {
    let retry = e.retry_after_s;
    let mut status = Status::from(e);
    if let Some(seconds) = retry {
        status.metadata_mut().insert("retry-after", seconds.into());
    }
    status_response(status)
}

fn status_response(status: Status) -> Response {
    status.into_http::<Body>()
}

/// A successful unary answer: one message, then `grpc-status: 0`.
fn message_response(message: &impl Message) -> Response {
    let mut frame = BytesMut::with_capacity(5 + message.encoded_len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.encoded_len()).unwrap_or(u32::MAX));
    // Encoding into a buffer with enough room cannot fail.
    let _ = message.encode(&mut frame);
    message_frames(vec![frame.freeze()])
}

fn message_frames(messages: Vec<Bytes>) -> Response {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let frames = messages
        .into_iter()
        .map(Frame::data)
        .chain(std::iter::once(Frame::trailers(trailers)))
        .map(Ok::<_, std::convert::Infallible>);
    let mut response = Response::new(Body::new(StreamBody::new(futures::stream::iter(frames))));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

#[cfg(test)]
mod tests {
    use futures::FutureExt as _;
    use http_body_util::combinators::UnsyncBoxBody;
    use tessera_protocol::inference::infer_parameter::ParameterChoice;
    use tessera_protocol::inference::{InferParameter, ModelInferRequest};

    use super::*;

    const LIMIT: usize = 1 << 20;
    /// How long a worker's answer may stall.
    const STALL: Duration = Duration::from_secs(30);

    /// A worker's unary answer over HTTP/1.1: its head, its message, then (`delay` later, as
    /// read from the connection) its trailers; or a cut-off connection instead of trailers.
    fn answer(trailers: Option<(&'static str, Duration)>) -> http::Response<UnsyncBoxBody<Bytes, std::io::Error>> {
        let frames = futures::stream::iter(0..2).then(move |i| async move {
            if i == 0 {
                return Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\x02\x0a\x00")));
            }
            let Some((status, delay)) = trailers else { return Err(std::io::Error::other("connection reset")) };
            tokio::time::sleep(delay).await;
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static(status));
            Ok(Frame::trailers(trailers))
        });
        let mut response = http::Response::new(StreamBody::new(frames).boxed_unsync());
        response.headers_mut().insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        response.headers_mut().insert(header::TRAILER, HeaderValue::from_static("grpc-status, grpc-message"));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        response
    }

    #[tokio::test]
    async fn a_unary_answer_is_handed_on_whole_with_its_status_read_from_the_trailers() {
        let whole = read_whole(answer(Some(("5", Duration::from_millis(30)))), STALL).await.expect("whole");
        assert_eq!(whole.code, "5");
        let (head, mut body) = whole.response.into_parts();
        let mut names: Vec<_> = head.headers.keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-type"], "HTTP/1.1 framing headers dropped");
        // Message and trailers both ready at once: hyper's HTTP/2 server writes them together.
        let data = body.frame().now_or_never().flatten().expect("the message, ready").expect("data");
        assert_eq!(data.into_data().expect("a data frame"), Bytes::from_static(b"\0\0\0\0\x02\x0a\x00"));
        let trailers = body.frame().now_or_never().flatten().expect("the trailers, ready").expect("trailers");
        assert_eq!(trailers.into_trailers().expect("trailers")["grpc-status"], "5");
        assert!(body.frame().now_or_never().expect("the end, ready").is_none());

        let e = read_whole(answer(None), STALL).await.err().expect("a cut-off answer");
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert!(e.message.contains("broke off before its end: connection reset"), "{}", e.message);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_stops_sending_its_answer_fails_the_call_after_the_stall_limit() {
        // The trailers 29 s after the message: read.
        let whole = read_whole(answer(Some(("0", Duration::from_secs(29)))), STALL).await.expect("whole");
        assert_eq!(whole.code, "0");
        // 31 s after it: given up on, at 30 s.
        let started = tokio::time::Instant::now();
        let e = read_whole(answer(Some(("0", Duration::from_secs(31)))), STALL).await.err().expect("a stalled answer");
        let waited = started.elapsed();
        assert!(waited >= STALL && waited < STALL + Duration::from_secs(1), "given up after {waited:?}");
        assert_eq!(e.kind, ErrorKind::UpstreamTimeout);
        assert_eq!(e.message, "the worker sent none of the rest of its answer for 30 s");

        // The same past the read-ahead limit, as the rest streams on.
        let chunk = Bytes::from(vec![7u8; WHOLE_ANSWER_BYTES + 1]);
        let frames = futures::stream::iter(0..2).then(move |i| {
            let chunk = chunk.clone();
            async move {
                if i == 0 {
                    return Ok::<_, std::io::Error>(Frame::data(chunk));
                }
                tokio::time::sleep(Duration::from_secs(31)).await;
                Ok(Frame::trailers(HeaderMap::new()))
            }
        });
        let read = read_whole(http::Response::new(StreamBody::new(frames).boxed_unsync()), STALL).await;
        let mut body = read.expect("the first frame read ahead").response.into_body();
        assert!(body.frame().await.expect("the message").is_ok());
        let e = body.frame().await.expect("an end").expect_err("the stall, as an error");
        assert_eq!(e.to_string(), "the worker sent none of the rest of its answer for 30 s");
    }

    #[tokio::test]
    async fn a_unary_answer_over_the_read_ahead_limit_streams_on_after_it() {
        let chunk = Bytes::from(vec![7u8; WHOLE_ANSWER_BYTES / 2 + 1]);
        let frames = futures::stream::iter(0..4).then(move |i| {
            let chunk = chunk.clone();
            async move {
                if i < 3 {
                    return Ok::<_, std::io::Error>(Frame::data(chunk));
                }
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                Ok(Frame::trailers(trailers))
            }
        });
        let read = read_whole(http::Response::new(StreamBody::new(frames).boxed_unsync()), STALL).await.expect("read");
        let body = read.response.into_body();
        assert_eq!(body.frames.len(), 2, "read until over the limit, no further");
        let whole = body.collect().await.expect("the rest streams on");
        assert_eq!(whole.trailers().expect("trailers")["grpc-status"], "0");
        assert_eq!(whole.to_bytes().len(), 3 * (WHOLE_ANSWER_BYTES / 2 + 1));
    }

    fn framed(m: &impl Message) -> Vec<u8> {
        let body = m.encode_to_vec();
        let mut out = vec![0u8];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn upstream_headers_keep_te_trailers_and_swap_the_credential_for_the_identity() {
        let mut client = HeaderMap::new();
        client.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer key"));
        client.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        client.append(header::TE, HeaderValue::from_static("gzip"));
        client.append(header::TE, HeaderValue::from_static("trailers"));
        let headers = upstream_headers(client, HeaderValue::from_static("signed"));
        assert_eq!(headers.get_all(header::TE).iter().collect::<Vec<_>>(), [&HeaderValue::from_static("trailers")]);
        assert!(headers.get(header::AUTHORIZATION).is_none());
        assert_eq!(headers.get(forwarded::HEADER), Some(&HeaderValue::from_static("signed")));
        assert_eq!(headers.get(header::CONTENT_TYPE), Some(&HeaderValue::from_static("application/grpc")));

        let mut without = HeaderMap::new();
        without.insert(header::TE, HeaderValue::from_static("deflate"));
        assert!(upstream_headers(without, HeaderValue::from_static("signed")).get(header::TE).is_none());
    }

    #[test]
    fn the_model_is_read_from_the_first_message() {
        let request = ModelInferRequest {
            model_name: "mlp".into(),
            model_version: "3".into(),
            id: "r1".into(),
            raw_input_contents: vec![vec![7u8; 4096].into()],
            ..Default::default()
        };
        let t = target_of(&framed(&request), &HeaderMap::new(), LIMIT).expect("read");
        assert_eq!((t.name.as_str(), t.version, t.sequence), ("mlp", Some(3), None));
        // The sequence id is read in the same walk.
        let mut sequenced = request.clone();
        let id = InferParameter { parameter_choice: Some(ParameterChoice::Uint64Param(12)) };
        sequenced.parameters.insert("sequence_id".into(), id);
        let t = target_of(&framed(&sequenced), &HeaderMap::new(), LIMIT).expect("read");
        assert_eq!((t.name.as_str(), t.sequence), ("mlp", Some(SequenceId::Num(12))));
        let unversioned = ModelInferRequest { model_name: "mlp".into(), ..Default::default() };
        assert_eq!(target_of(&framed(&unversioned), &HeaderMap::new(), LIMIT).expect("read").version, None);
    }

    #[test]
    fn a_first_message_with_an_unknown_group_is_read_as_the_worker_reads_it() {
        // Field 99 as a group holding a string, before the model's name: prost (the worker's
        // decoder) skips it, so the gateway must too rather than refuse the call as malformed.
        let request = ModelInferRequest { model_name: "mlp".into(), ..Default::default() };
        let mut message = vec![0x9b, 0x06, 0x0a, 0x01, b'x', 0x9c, 0x06];
        message.extend(request.encode_to_vec());
        let decoded = ModelInferRequest::decode(message.as_slice()).expect("prost skips the group");
        assert_eq!(decoded.model_name, "mlp");
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        assert_eq!(target_of(&framed, &HeaderMap::new(), LIMIT).expect("read").name, "mlp");
    }

    #[test]
    fn compressed_first_messages_are_read_too() {
        use std::io::Write as _;
        let request = ModelInferRequest { model_name: "zipped".into(), ..Default::default() };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&request.encode_to_vec()).expect("compress");
        let body = gz.finish().expect("compress");
        let mut out = vec![1u8];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        let mut headers = HeaderMap::new();
        headers.insert("grpc-encoding", HeaderValue::from_static("gzip"));
        assert_eq!(target_of(&out, &headers, LIMIT).expect("read").name, "zipped");
        // A bomb: a small frame that expands past the limit is refused, not read into memory.
        let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        bomb.write_all(&vec![0u8; 4 * LIMIT]).expect("compress");
        let bomb = bomb.finish().expect("compress");
        let mut framed_bomb = vec![1u8];
        framed_bomb.extend_from_slice(&(bomb.len() as u32).to_be_bytes());
        framed_bomb.extend_from_slice(&bomb);
        let e = target_of(&framed_bomb, &headers, LIMIT).expect_err("refused");
        assert_eq!(e.kind, ErrorKind::TooLarge);
        headers.insert("grpc-encoding", HeaderValue::from_static("snappy"));
        assert_eq!(target_of(&out, &headers, LIMIT).err().map(|e| e.kind), Some(ErrorKind::Unsupported));
    }

    #[test]
    fn malformed_requests_are_refused_clearly() {
        let no_name = ModelInferRequest::default();
        assert!(target_of(&framed(&no_name), &HeaderMap::new(), LIMIT).is_err());
        let bad_version = ModelInferRequest { model_name: "m".into(), model_version: "x".into(), ..Default::default() };
        let e = target_of(&framed(&bad_version), &HeaderMap::new(), LIMIT).expect_err("refused");
        assert!(e.message.contains("'x'"), "{}", e.message);
        assert!(target_of(&[0, 0, 0, 0, 9, 1], &HeaderMap::new(), LIMIT).is_err(), "truncated");
        assert!(target_of(&[0, 0, 0, 0, 2, 0x0a, 0x05], &HeaderMap::new(), LIMIT).is_err(), "field runs past the end");
        let mut bad_flag = framed(&ModelInferRequest { model_name: "m".into(), ..Default::default() });
        bad_flag[0] = 2;
        let e = target_of(&bad_flag, &HeaderMap::new(), LIMIT).expect_err("refused");
        assert_eq!((e.kind, e.message.as_str()), (ErrorKind::InvalidArg, "compression flag 2 is neither 0 nor 1"));
    }
}
