use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;
use tokio::net::TcpListener;

use super::*;

/// What a test worker does with each call it accepts.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Answers the request's body back (repeated `times`), then `grpc-status: 0`.
    Echo { times: usize },
    /// Resets the stream with this reason, unanswered.
    Reset(h2::Reason),
}

/// A worker speaking HTTP/2 on loopback; counts its connections. With `tls`, it serves TLS.
struct Worker {
    address: String,
    connections: Arc<AtomicUsize>,
}

async fn worker(behaviour: Behaviour, tls: Option<tokio_rustls::TlsAcceptor>) -> Worker {
    let listening = super::super::test_workers::listen(tls, move |io| serve(io, behaviour)).await;
    Worker { address: format!("127.0.0.1:{}", listening.port), connections: listening.connections }
}

async fn serve<T: AsyncRead + AsyncWrite + Unpin>(io: T, behaviour: Behaviour) {
    let Ok(mut connection) = h2::server::handshake(io).await else { return };
    while let Some(Ok((request, mut respond))) = connection.accept().await {
        let (head, mut body) = request.into_parts();
        assert_eq!(head.headers.get("te").map(|v| v.as_bytes()), Some(&b"trailers"[..]));
        let mut received = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("request data");
            let _ = body.flow_control().release_capacity(chunk.len());
            received.extend_from_slice(&chunk);
        }
        match behaviour {
            Behaviour::Reset(reason) => respond.send_reset(reason),
            Behaviour::Echo { times } => {
                let mut send = respond.send_response(Response::new(()), false).expect("head");
                let answer = Bytes::from(received.repeat(times));
                send.reserve_capacity(answer.len());
                send.send_data(answer, false).expect("data");
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                send.send_trailers(trailers).expect("trailers");
            }
        }
    }
}

fn headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("te", http::HeaderValue::from_static("trailers"));
    headers.insert("content-type", http::HeaderValue::from_static("application/grpc"));
    headers
}

fn uri(scheme: &str, address: &str) -> Uri {
    format!("{scheme}://{address}/inference.GRPCInferenceService/ModelInfer").parse().expect("uri")
}

/// The whole answer: its data and its trailers.
async fn read(answer: Response<AnswerBody>) -> (Vec<u8>, HeaderMap) {
    let collected = answer.into_body().collect().await.expect("answer body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    (collected.to_bytes().to_vec(), trailers)
}

fn plain() -> GrpcUpstreams {
    GrpcUpstreams::new(tessera_protocol::tls::client_config(None).expect("client config"))
}

#[tokio::test]
async fn a_call_gets_its_answer_and_trailers_over_one_reused_connection() {
    // An answer of 3 MiB is over the stream's window: it arrives only if read windows are given back.
    let w = worker(Behaviour::Echo { times: 3 * 1024 }, None).await;
    let upstreams = plain();
    for i in 0..3u8 {
        let body = Bytes::from(vec![i; 1024]);
        let answer = upstreams.call(uri("http", &w.address), &headers(), body).await.expect("answered");
        assert_eq!(answer.status(), 200);
        let (data, trailers) = read(answer).await;
        assert_eq!(data.len(), 3 * 1024 * 1024);
        assert!(data.iter().all(|b| *b == i));
        assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]));
    }
    assert_eq!(w.connections.load(Ordering::SeqCst), 1, "one connection carries every call");
}

#[tokio::test]
async fn a_connection_the_worker_closed_is_replaced_before_the_next_call() {
    // A worker that serves one connection, closes it, then serves the next.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    tokio::spawn(async move {
        let (first, _) = listener.accept().await.expect("first");
        let mut connection = h2::server::handshake(first).await.expect("handshake");
        let (_request, mut respond) = connection.accept().await.expect("a call").expect("ok");
        let mut send = respond.send_response(Response::new(()), false).expect("head");
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        send.send_trailers(trailers).expect("trailers");
        // Finish writing the answer, then close the connection.
        let _ = tokio::time::timeout(Duration::from_millis(200), connection.accept()).await;
        drop(connection);
        let (second, _) = listener.accept().await.expect("second");
        serve(second, Behaviour::Echo { times: 1 }).await;
    });
    let upstreams = plain();
    let first = upstreams.call(uri("http", &address), &headers(), Bytes::from_static(b"one")).await.expect("first");
    read(first).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = upstreams.call(uri("http", &address), &headers(), Bytes::from_static(b"two")).await.expect("second");
    assert_eq!(read(second).await.0, b"two");
}

#[tokio::test]
async fn only_failures_that_sent_nothing_are_unsent() {
    let upstreams = plain();
    // Nobody listens: nothing was sent.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("address").to_string();
    let e = upstreams.call(uri("http", &closed), &headers(), Bytes::from_static(b"x")).await.expect_err("refused");
    assert!(matches!(e, CallError::Unsent(_)), "{e}");
    // REFUSED_STREAM: the worker says it did not read the call.
    let refusing = worker(Behaviour::Reset(h2::Reason::REFUSED_STREAM), None).await;
    let e = upstreams.call(uri("http", &refusing.address), &headers(), Bytes::from_static(b"x")).await;
    assert!(matches!(e, Err(CallError::Unsent(_))), "{:?}", e.map(|_| ()));
    // Any other reset came after the call went out: it may have run.
    let failing = worker(Behaviour::Reset(h2::Reason::INTERNAL_ERROR), None).await;
    let e = upstreams.call(uri("http", &failing.address), &headers(), Bytes::from_static(b"x")).await;
    assert!(matches!(e, Err(CallError::Broken(_))), "{:?}", e.map(|_| ()));
}

#[tokio::test]
async fn workers_serving_tls_are_called_over_https_trusting_the_given_ca() {
    let tls = super::super::test_workers::tls();
    let w = worker(Behaviour::Echo { times: 1 }, Some(tls.acceptor)).await;
    let port = w.address.rsplit(':').next().expect("port");
    let address = format!("localhost:{port}");

    let trusting = GrpcUpstreams::new(tls.trusting);
    let answer =
        trusting.call(uri("https", &address), &headers(), Bytes::from_static(b"sealed")).await.expect("answered");
    assert_eq!(read(answer).await.0, b"sealed");

    let e = plain().call(uri("https", &address), &headers(), Bytes::from_static(b"x")).await.expect_err("untrusted");
    assert!(matches!(e, CallError::Unsent(_)) && e.to_string().contains("TLS"), "{e}");
}
