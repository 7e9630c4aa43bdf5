use std::convert::Infallible;
use std::net::SocketAddr;

use http::{HeaderValue, header};
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;
use tessera_protocol::inference::{ModelInferRequest, ServerLiveResponse};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use super::*;
use crate::auth::forwarded;
use crate::auth::test_support::A_INFERENCE;
use crate::gateway::test_workers::{ServerIo, listen, one_model_gateway};

const INFER: &str = "/inference.GRPCInferenceService/ModelInfer";
/// The size of the message a stand-in worker answers `big` with.
const BIG: usize = 3 << 20;

/// A worker's gRPC listener (HTTP/2, or HTTP/1.1 for calls alone in flight): answers a
/// `ModelInferRequest` by its id: `slow` after 2 s, `big` with a [`BIG`] message, anything else
/// with the request echoed; then `grpc-status: 0` and whether the call carried an identity.
async fn grpc_worker(io: ServerIo) {
    let service = service_fn(|request: Request<Incoming>| async move {
        let identity = HeaderValue::from_static(if request.headers().contains_key(forwarded::HEADER) {
            "signed"
        } else {
            "unsigned"
        });
        let body = request.into_body().collect().await?.to_bytes();
        let id = ModelInferRequest::decode(&body[5..]).map(|r| r.id).unwrap_or_default();
        let message = match id.as_str() {
            "slow" => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                body
            }
            "big" => {
                let mut framed = BytesMut::from(&[0u8, 0, 0x30, 0, 0][..]);
                framed.resize(5 + BIG, b'x');
                framed.freeze()
            }
            _ => body,
        };
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("x-identity", identity);
        let frames = [Ok::<_, Infallible>(Frame::data(message)), Ok(Frame::trailers(trailers))];
        let mut response = Response::new(StreamBody::new(futures::stream::iter(frames)));
        response.headers_mut().insert(header::TRAILER, HeaderValue::from_static("grpc-status, x-identity"));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        Ok::<_, hyper::Error>(response)
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let _ = builder.serve_connection(TokioIo::new(io), service).await;
}

/// A gateway's gRPC listener in front of one stand-in worker, requests up to `max_request_bytes`.
struct Listening {
    addr: SocketAddr,
    shutdown: CancellationToken,
    served: tokio::task::JoinHandle<()>,
}

async fn gateway(max_request_bytes: usize, header_timeout: Duration) -> Listening {
    gateway_with(max_request_bytes, Timeouts { header: header_timeout, ..Timeouts::DEFAULT }).await
}

async fn gateway_with(max_request_bytes: usize, timeouts: Timeouts) -> Listening {
    let worker = listen(None, grpc_worker).await;
    let g = one_model_gateway(worker.port, max_request_bytes);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let shutdown = CancellationToken::new();
    let routes = grpc::routes(g.clone());
    let served = tokio::spawn(serve_with(listener, g, routes, shutdown.clone(), None, timeouts));
    Listening { addr, shutdown, served }
}

/// An HTTP/2 client connection whose streams open with a window of `window` bytes.
async fn client(addr: SocketAddr, window: u32) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (send, connection) = h2::client::Builder::new().initial_window_size(window).handshake(tcp).await.expect("h2");
    tokio::spawn(connection);
    send
}

/// A call's answer: its head, its messages as they came, and its trailers.
struct Answer {
    head: http::response::Parts,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

impl Answer {
    /// The call's `grpc-status`, from the trailers or (trailers-only) the head.
    fn code(&self) -> &str {
        let status = self.trailers.as_ref().and_then(|t| t.get("grpc-status"));
        status.or_else(|| self.head.headers.get("grpc-status")).and_then(|v| v.to_str().ok()).unwrap_or("none")
    }

    /// The call's `grpc-message`, decoded.
    fn message(&self) -> String {
        let status = self.trailers.as_ref().and_then(tonic::Status::from_header_map);
        let status = status.or_else(|| tonic::Status::from_header_map(&self.head.headers));
        status.map(|s| s.message().to_string()).unwrap_or_default()
    }
}

fn framed(message: &impl prost::Message) -> Bytes {
    let mut framed = BytesMut::from(&[0u8][..]);
    framed.extend_from_slice(&u32::try_from(message.encoded_len()).expect("small").to_be_bytes());
    message.encode(&mut framed).expect("encode");
    framed.freeze()
}

fn infer_request(id: &str) -> Bytes {
    framed(&ModelInferRequest { model_name: "m".into(), id: id.into(), ..Default::default() })
}

/// A gRPC call's head for `path`, with the test tenant's key and `extra` headers.
fn head(path: &str, extra: &[(&str, &str)]) -> Request<()> {
    let mut request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/grpc")
        .header(header::TE, "trailers")
        .header(header::AUTHORIZATION, format!("Bearer {A_INFERENCE}"));
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    request.body(()).expect("request")
}

/// Sends `body` to `path` with the test tenant's key and `extra` headers, and reads the answer
/// whole, giving the window back as it reads.
async fn call(send: &mut h2::client::SendRequest<Bytes>, path: &str, body: Bytes, extra: &[(&str, &str)]) -> Answer {
    let request = head(path, extra);
    let mut ready = send.clone().ready().await.expect("a stream to open");
    let (response, mut stream) = ready.send_request(request, false).expect("sent");
    stream.send_data(body, true).expect("body sent");
    let (head, mut answer) = response.await.expect("an answer").into_parts();
    let mut body = BytesMut::new();
    while let Some(data) = answer.data().await {
        let data = data.expect("answer data");
        let _ = answer.flow_control().release_capacity(data.len());
        body.extend_from_slice(&data);
    }
    let trailers = answer.trailers().await.expect("trailers read");
    Answer { head, body: body.freeze(), trailers }
}

#[tokio::test]
async fn model_calls_alone_and_together_are_forwarded_and_answered_with_their_status() {
    let gateway = gateway(1 << 20, Duration::from_secs(5)).await;
    let mut send = client(gateway.addr, 65_535).await;
    for i in 0..3 {
        let request = infer_request(&format!("alone {i}"));
        let answer = call(&mut send, INFER, request.clone(), &[]).await;
        assert_eq!(answer.head.status, http::StatusCode::OK);
        assert_eq!(answer.code(), "0", "{}", answer.message());
        assert_eq!(answer.body, request, "the worker's answer, unchanged");
        let trailers = answer.trailers.as_ref().expect("trailers");
        assert_eq!(trailers["x-identity"], "signed", "the worker saw the gateway's identity");
        assert!(!answer.head.headers.contains_key(header::TRAILER), "HTTP/1.1 framing stays behind");
    }
    // Calls in flight together on one connection: the later ones go to the worker over HTTP/2.
    let calls = (0..8).map(|i| {
        let mut send = send.clone();
        async move {
            let request = infer_request(&format!("together {i}"));
            (call(&mut send, INFER, request.clone(), &[]).await, request)
        }
    });
    for (answer, request) in futures::future::join_all(calls).await {
        assert_eq!(answer.code(), "0", "{}", answer.message());
        assert_eq!(answer.body, request);
    }
    gateway.shutdown.cancel();
}

#[tokio::test]
async fn other_methods_are_served_by_the_routes_and_unknown_ones_are_unimplemented() {
    let gateway = gateway(1 << 20, Duration::from_secs(5)).await;
    let mut send = client(gateway.addr, 65_535).await;
    let live =
        call(&mut send, "/inference.GRPCInferenceService/ServerLive", Bytes::from_static(b"\0\0\0\0\0"), &[]).await;
    assert_eq!(live.code(), "0");
    let answer = ServerLiveResponse::decode(&live.body[5..]).expect("a ServerLiveResponse");
    assert!(answer.live);
    let unknown = call(&mut send, "/inference.GRPCInferenceService/Nonsense", Bytes::new(), &[]).await;
    assert_eq!(unknown.code(), "12", "UNIMPLEMENTED");
    assert!(unknown.message().contains("Nonsense"), "{}", unknown.message());
    gateway.shutdown.cancel();
}

#[tokio::test]
async fn an_answer_larger_than_the_clients_window_arrives_whole() {
    let gateway = gateway(1 << 20, Duration::from_secs(5)).await;
    let mut send = client(gateway.addr, 65_535).await;
    let answer = call(&mut send, INFER, infer_request("big"), &[]).await;
    assert_eq!(answer.code(), "0", "{}", answer.message());
    assert_eq!(answer.body.len(), 5 + BIG);
    // The connection serves on.
    assert_eq!(call(&mut send, INFER, infer_request("after"), &[]).await.code(), "0");
    gateway.shutdown.cancel();
}

#[tokio::test]
async fn calls_past_their_deadline_or_over_the_limit_or_malformed_are_refused_with_the_reason() {
    let gateway = gateway(1024, Duration::from_secs(5)).await;
    let mut send = client(gateway.addr, 65_535).await;
    let started = Instant::now();
    let late = call(&mut send, INFER, infer_request("slow"), &[("grpc-timeout", "100m")]).await;
    assert_eq!(late.code(), "4", "DEADLINE_EXCEEDED: {}", late.message());
    assert!(late.message().contains("grpc-timeout"), "{}", late.message());
    assert!(started.elapsed() < Duration::from_secs(1), "answered at the deadline, not the worker's 2 s");
    let bad = call(&mut send, INFER, infer_request("x"), &[("grpc-timeout", "soon")]).await;
    assert_eq!(bad.code(), "3", "INVALID_ARGUMENT: {}", bad.message());
    assert!(bad.message().contains("grpc-timeout"), "{}", bad.message());
    let large = framed(&ModelInferRequest { model_name: "m".into(), id: "x".repeat(4096), ..Default::default() });
    let refused = call(&mut send, INFER, large, &[]).await;
    assert_eq!(refused.code(), "8", "RESOURCE_EXHAUSTED: {}", refused.message());
    assert!(refused.message().contains("1024 bytes"), "{}", refused.message());
    let unnamed = call(&mut send, INFER, framed(&ModelInferRequest::default()), &[]).await;
    assert_eq!(unnamed.code(), "3", "INVALID_ARGUMENT: {}", unnamed.message());
    assert_eq!(call(&mut send, INFER, infer_request("fine"), &[]).await.code(), "0", "the connection serves on");
    gateway.shutdown.cancel();
}

#[tokio::test]
async fn a_call_the_client_resets_ends_and_the_connection_serves_on() {
    let gateway = gateway(1 << 20, Duration::from_secs(5)).await;
    let mut send = client(gateway.addr, 65_535).await;
    let mut ready = send.clone().ready().await.expect("ready");
    let (response, mut stream) = ready.send_request(head(INFER, &[]), false).expect("sent");
    stream.send_data(infer_request("slow"), true).expect("body");
    tokio::time::sleep(Duration::from_millis(100)).await;
    stream.send_reset(Reason::CANCEL);
    drop(response);
    let answer = call(&mut send, INFER, infer_request("next"), &[]).await;
    assert_eq!(answer.code(), "0", "{}", answer.message());
    gateway.shutdown.cancel();
}

#[tokio::test]
async fn shutdown_lets_the_call_in_progress_finish_then_closes_the_connection() {
    let gateway = gateway(1 << 20, Duration::from_secs(5)).await;
    let send = client(gateway.addr, 65_535).await;
    let in_progress = tokio::spawn({
        let mut send = send.clone();
        async move { call(&mut send, INFER, infer_request("slow"), &[]).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    gateway.shutdown.cancel();
    let answer = tokio::time::timeout(Duration::from_secs(10), in_progress).await.expect("answered").expect("joined");
    assert_eq!(answer.code(), "0", "{}", answer.message());
    tokio::time::timeout(Duration::from_secs(10), gateway.served).await.expect("stopped").expect("joined");
    let refused = send.ready().await.map(drop);
    assert!(refused.is_err(), "no call opens on a connection that was told to go away");
}

#[tokio::test]
async fn an_http1_client_is_served_by_hyper() {
    let gateway = gateway(1 << 20, Duration::from_secs(5)).await;
    let tcp = TcpStream::connect(gateway.addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.expect("HTTP/1.1");
    tokio::spawn(connection);
    let request = Request::post("/inference.GRPCInferenceService/ServerLive")
        .header(header::HOST, gateway.addr.to_string())
        .header(header::CONTENT_TYPE, "application/grpc")
        .header(header::TE, "trailers")
        .body(http_body_util::Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .expect("request");
    let response = sender.send_request(request).await.expect("answered");
    assert_eq!(response.status(), http::StatusCode::OK);
    let whole = response.into_body().collect().await.expect("body");
    let trailers = whole.trailers().cloned().expect("the status as trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert!(ServerLiveResponse::decode(&whole.to_bytes()[5..]).expect("a message").live);
    gateway.shutdown.cancel();
}

#[tokio::test]
async fn a_client_that_stops_inside_the_preface_or_an_http1_head_is_disconnected_after_the_header_timeout() {
    use tokio::io::AsyncReadExt as _;
    let timeout = Duration::from_millis(300);
    let gateway = gateway(1 << 20, timeout).await;
    for sent in [&PREFACE[..10], b"POST /inference.GRPCInferenceService/ServerLive HTTP/1.1\r\n"] {
        let mut tcp = TcpStream::connect(gateway.addr).await.expect("connect");
        tcp.write_all(sent).await.expect("write");
        let started = Instant::now();
        let mut seen = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut seen)).await;
        assert!(read.is_ok(), "the gateway kept a connection open for 10 s after {} bytes", sent.len());
        let waited = started.elapsed();
        assert!(waited >= timeout - Duration::from_millis(50), "closed after {waited:?}");
    }
    gateway.shutdown.cancel();
}

#[test]
fn the_headers_http2_forbids_are_dropped_from_answers_and_the_rest_kept() {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("content-type", "application/grpc"),
        ("connection", "keep-alive"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "close"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "h2c"),
        ("te", "trailers"),
        ("grpc-status", "0"),
    ] {
        headers.append(http::HeaderName::from_static(name), HeaderValue::from_static(value));
    }
    strip_connection_headers(&mut headers);
    let mut left: Vec<_> = headers.keys().map(|n| n.as_str()).collect();
    left.sort_unstable();
    assert_eq!(left, ["content-type", "grpc-status"]);
}

/// Opens a ModelInfer call and sends `pieces` of its body `apart`, the last ending it unless
/// `end` is false; gives back the answer's head.
async fn call_in_pieces(
    send: &h2::client::SendRequest<Bytes>,
    pieces: Vec<Bytes>,
    apart: Duration,
    end: bool,
) -> http::Response<RecvStream> {
    let mut ready = send.clone().ready().await.expect("ready");
    let (response, mut stream) = ready.send_request(head(INFER, &[]), false).expect("sent");
    let last = pieces.len().saturating_sub(1);
    for (i, piece) in pieces.into_iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(apart).await;
        }
        stream.send_data(piece, end && i == last).expect("a piece of the body");
    }
    let answered = tokio::time::timeout(Duration::from_secs(10), response).await.expect("answered in time");
    // The stream stays open until the answer (dropping it would reset the call).
    drop(stream);
    answered.expect("a head")
}

#[tokio::test]
async fn a_unary_call_whose_body_stalls_is_refused_after_a_keep_alive_interval_or_two() {
    let every = Duration::from_millis(200);
    let gateway =
        gateway_with(1 << 20, Timeouts { header: Duration::from_secs(5), tick: every, ..Timeouts::DEFAULT }).await;
    let mut send = client(gateway.addr, 65_535).await;
    // Half a message, then nothing.
    let started = Instant::now();
    let response = call_in_pieces(&send, vec![infer_request("stalled").slice(..6)], every, false).await;
    let waited = started.elapsed();
    assert!(waited >= every && waited < 4 * every, "answered after {waited:?}");
    let status = tonic::Status::from_header_map(response.headers()).expect("a trailers-only answer");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{}", status.message());
    assert!(status.message().contains("sent nothing for 0.2 s"), "{}", status.message());
    assert_eq!(call(&mut send, INFER, infer_request("next"), &[]).await.code(), "0", "the connection serves on");

    // A method the routes serve is watched by the same clock.
    let mut ready = send.clone().ready().await.expect("ready");
    let (response, mut stream) = ready.send_request(head("/grpc.health.v1.Health/Check", &[]), false).expect("sent");
    stream.send_data(Bytes::from_static(b"\0\0\0"), false).expect("part of a message");
    let answered = tokio::time::timeout(Duration::from_secs(10), response).await.expect("answered in time");
    let (head, mut answer) = answered.expect("a head").into_parts();
    let trailers = answer.trailers().await.expect("trailers read").unwrap_or(head.headers);
    let status = tonic::Status::from_header_map(&trailers).expect("a status");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{}", status.message());
    assert!(status.message().contains("sent nothing for 0.2 s"), "{}", status.message());
    drop(stream);
    gateway.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), gateway.served).await.expect("shut down").expect("join");
}

#[tokio::test]
async fn a_call_whose_client_takes_none_of_its_answer_is_reset_after_a_keep_alive_interval_or_two() {
    let every = Duration::from_millis(200);
    let gateway =
        gateway_with(8 << 20, Timeouts { header: Duration::from_secs(5), tick: every, ..Timeouts::DEFAULT }).await;
    let send = client(gateway.addr, 65_535).await;
    let mut ready = send.clone().ready().await.expect("ready");
    let (response, mut stream) = ready.send_request(head(INFER, &[]), false).expect("sent");
    stream.send_data(infer_request("big"), true).expect("body sent");
    let (head, mut answer) = response.await.expect("a head").into_parts();
    assert_eq!(head.status, http::StatusCode::OK);
    // Read what the window lets through, never giving it back.
    let started = Instant::now();
    let mut read = 0;
    let reset = loop {
        match tokio::time::timeout(Duration::from_secs(10), answer.data()).await.expect("reset in time") {
            Some(Ok(data)) => read += data.len(),
            Some(Err(e)) => break e,
            None => panic!("the whole answer arrived with no window given back"),
        }
    };
    let waited = started.elapsed();
    assert_eq!(reset.reason(), Some(Reason::CANCEL), "{reset}");
    assert!(read <= 65_535, "{read} bytes through a window of 65,535");
    assert!(waited >= every && waited < 4 * every, "reset after {waited:?}");
    // (This client's connection window stays spent: it gave none of it back.)
    let mut other = client(gateway.addr, 65_535).await;
    assert_eq!(call(&mut other, INFER, infer_request("next"), &[]).await.code(), "0", "the gateway serves on");
    drop(send);
    gateway.shutdown.cancel();
}

#[tokio::test]
async fn a_unary_call_whose_body_keeps_coming_slowly_is_forwarded() {
    let every = Duration::from_millis(200);
    let gateway =
        gateway_with(1 << 20, Timeouts { header: Duration::from_secs(5), tick: every, ..Timeouts::DEFAULT }).await;
    let send = client(gateway.addr, 65_535).await;
    let whole = infer_request("slow but steady");
    let step = whole.len().div_ceil(5);
    let pieces = (0..whole.len()).step_by(step).map(|i| whole.slice(i..(i + step).min(whole.len()))).collect();
    // Five pieces 150 ms apart: 600 ms in all, three intervals, but never one without a piece.
    let response = call_in_pieces(&send, pieces, Duration::from_millis(150), true).await;
    assert_eq!(response.status(), http::StatusCode::OK);
    let (head, mut body) = response.into_parts();
    assert!(head.headers.get("grpc-status").is_none(), "not refused: {:?}", head.headers);
    let mut answer = BytesMut::new();
    while let Some(data) = body.data().await {
        answer.extend_from_slice(&data.expect("answer data"));
    }
    let trailers = body.trailers().await.expect("trailers").expect("some");
    assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]));
    assert_eq!(answer.freeze(), whole, "the stand-in worker echoes the whole body");
    gateway.shutdown.cancel();
}

#[tokio::test]
async fn a_call_its_worker_does_not_begin_to_answer_in_time_is_deadline_exceeded() {
    let worker = listen(None, grpc_worker).await;
    let mut g = one_model_gateway(worker.port, 1 << 20);
    Arc::get_mut(&mut g).expect("not shared yet").upstream_timeout = Duration::from_millis(300);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let routes = grpc::routes(g.clone());
    let timeouts = Timeouts { header: Duration::from_secs(5), ..Timeouts::DEFAULT };
    tokio::spawn(serve_with(listener, g, routes, CancellationToken::new(), None, timeouts));
    let mut send = client(addr, 65_535).await;
    // The stand-in worker takes 2 s over a call named "slow".
    let started = Instant::now();
    let answer = call(&mut send, INFER, infer_request("slow"), &[]).await;
    assert_eq!(answer.code(), "4", "DEADLINE_EXCEEDED: {}", answer.message());
    assert!(answer.message().contains("did not begin its answer within 0.3 s"), "{}", answer.message());
    assert!(started.elapsed() < Duration::from_millis(1500), "answered after {:?}", started.elapsed());
    assert_eq!(call(&mut send, INFER, infer_request("next"), &[]).await.code(), "0", "the connection serves on");
}
