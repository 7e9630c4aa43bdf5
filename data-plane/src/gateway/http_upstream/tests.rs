use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;
use hyper::service::service_fn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// What a test worker does with each request.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Answers the request's body (repeated `times`), with the `Host` it was sent in `x-host`.
    Echo { times: usize },
    /// As `Echo` once, then closes the connection (`connection: close`).
    EchoThenClose,
    /// Reads the request, then hangs up without answering.
    HangUp,
}

/// A worker speaking HTTP/1.1 on loopback; counts its connections.
struct Worker {
    upstream: Arc<Upstream>,
    connections: Arc<AtomicUsize>,
}

async fn worker(behaviour: Behaviour, tls: Option<tokio_rustls::TlsAcceptor>, host: &str) -> Worker {
    let listening = super::super::test_workers::listen(tls, move |io| serve(io, behaviour)).await;
    let scheme = if host == "localhost" { "https" } else { "http" };
    let base = format!("{scheme}://{host}:{}", listening.port);
    Worker { upstream: Arc::new(Upstream::new("w", &base, &base)), connections: listening.connections }
}

async fn serve<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static>(
    mut io: T,
    behaviour: Behaviour,
) {
    if let Behaviour::HangUp = behaviour {
        let mut buffer = [0u8; 4096];
        let _ = io.read(&mut buffer).await;
        let _ = io.shutdown().await;
        return;
    }
    let service = service_fn(move |request: Request<Incoming>| async move {
        let host = request.headers().get(header::HOST).cloned();
        let body = request.into_body().collect().await?.to_bytes();
        let times = if let Behaviour::Echo { times } = behaviour { times } else { 1 };
        let mut response = Response::new(Full::new(Bytes::from(body.repeat(times))));
        if let Some(host) = host {
            response.headers_mut().insert("x-host", host);
        }
        if let Behaviour::EchoThenClose = behaviour {
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        Ok::<_, hyper::Error>(response)
    });
    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service).await;
}

fn request(body: &'static [u8]) -> Request<Full<Bytes>> {
    let mut request = Request::new(Full::new(Bytes::from_static(body)));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = Uri::from_static("/v2/models/m/infer");
    request
}

fn plain() -> HttpUpstreams {
    HttpUpstreams::new(tessera_protocol::tls::client_config(None).expect("client config"))
}

async fn read(answer: Response<UpstreamBody>) -> Vec<u8> {
    answer.into_body().collect().await.expect("answer body").to_bytes().to_vec()
}

#[tokio::test]
async fn a_connection_is_reused_once_its_answer_is_read_to_the_end() {
    let w = worker(Behaviour::Echo { times: 1 }, None, "127.0.0.1").await;
    let upstreams = plain();
    for i in 0..3 {
        let answer = upstreams.send(&w.upstream, request(b"ping")).await.expect("answered");
        let host = answer.headers().get("x-host").cloned();
        assert_eq!(read(answer).await, b"ping", "answer {i}");
        let expected = w.upstream.http.trim_start_matches("http://");
        assert_eq!(host.as_ref().and_then(|h| h.to_str().ok()), Some(expected), "the Host header is sent");
        assert_eq!(w.upstream.pool().idle(), 1, "given back after answer {i}");
    }
    assert_eq!(w.connections.load(Ordering::SeqCst), 1, "one connection for all three");
}

#[tokio::test]
async fn an_answer_dropped_half_read_closes_its_connection() {
    // 4 MiB: more than arrives in the first frame.
    let w = worker(Behaviour::Echo { times: 1 << 20 }, None, "127.0.0.1").await;
    let upstreams = plain();
    let answer = upstreams.send(&w.upstream, request(b"abcd")).await.expect("answered");
    let mut body = answer.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert!(first.data_ref().is_some_and(|d| d.len() < 4 << 20));
    drop(body);
    assert_eq!(w.upstream.pool().idle(), 0, "a half-read connection is not kept");
    let answer = upstreams.send(&w.upstream, request(b"abcd")).await.expect("answered on a new connection");
    assert_eq!(read(answer).await.len(), 4 << 20);
    assert_eq!(w.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn connections_the_worker_closes_are_passed_over() {
    let w = worker(Behaviour::EchoThenClose, None, "127.0.0.1").await;
    let upstreams = plain();
    for i in 0..3 {
        let answer = upstreams.send(&w.upstream, request(b"again")).await.expect("answered");
        assert_eq!(read(answer).await, b"again", "answer {i}");
        // No pause: the next request may find the connection not yet seen closed, and waits
        // for it to be either ready or closed before passing it over.
    }
    assert_eq!(w.connections.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn failures_say_whether_the_request_can_have_run() {
    let upstreams = plain();
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("address");
    let nowhere = Arc::new(Upstream::new("w", &format!("http://{closed}"), "unused:1"));
    let e = upstreams.send(&nowhere, request(b"x")).await.expect_err("refused");
    assert!(matches!(e, CallError::Unsent(_)), "{e}");
    // The request was written, then the worker hung up: it may have run.
    let w = worker(Behaviour::HangUp, None, "127.0.0.1").await;
    let e = upstreams.send(&w.upstream, request(b"x")).await.expect_err("hung up");
    assert!(matches!(e, CallError::Broken(_)), "{e}");
    let bad = Arc::new(Upstream::new("w", "not a uri", "unused:1"));
    let e = upstreams.send(&bad, request(b"x")).await.expect_err("bad address");
    assert!(matches!(e, CallError::Unsent(_)) && e.to_string().contains("names no host"), "{e}");
}

#[tokio::test]
async fn workers_serving_tls_are_reached_over_https_trusting_the_given_ca() {
    let tls = super::super::test_workers::tls();
    let w = worker(Behaviour::Echo { times: 1 }, Some(tls.acceptor), "localhost").await;

    let trusting = HttpUpstreams::new(tls.trusting);
    let answer = trusting.send(&w.upstream, request(b"sealed")).await.expect("answered");
    assert_eq!(read(answer).await, b"sealed");

    let fresh = Arc::new(Upstream::new("w", &w.upstream.http, &w.upstream.grpc));
    let e = plain().send(&fresh, request(b"x")).await.expect_err("untrusted");
    assert!(matches!(e, CallError::Unsent(_)) && e.to_string().contains("TLS"), "{e}");
}

#[tokio::test]
async fn connections_idle_too_long_are_closed_instead_of_used() {
    let w = worker(Behaviour::Echo { times: 1 }, None, "127.0.0.1").await;
    let upstreams = plain();
    let answer = upstreams.send(&w.upstream, request(b"one")).await.expect("answered");
    assert_eq!(read(answer).await, b"one");
    {
        let mut idle = w.upstream.pool().idle.lock();
        let long_ago = Instant::now().checked_sub(IDLE_TIMEOUT + Duration::from_secs(1)).expect("a past instant");
        idle.front_mut().expect("one idle connection").since = long_ago;
    }
    let answer = upstreams.send(&w.upstream, request(b"two")).await.expect("answered");
    assert_eq!(read(answer).await, b"two");
    assert_eq!(w.connections.load(Ordering::SeqCst), 2, "the stale connection was not used");
    assert_eq!(w.upstream.pool().idle(), 1, "only the new one is kept");
}
