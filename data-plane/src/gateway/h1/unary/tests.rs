use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::Request;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::gateway::test_workers::{ServerIo, listen};

fn upstreams() -> Upstreams {
    let tls = tessera_protocol::tls::client_config(None).expect("client TLS config");
    Upstreams::new(tokio_rustls::TlsConnector::from(Arc::new(tls)))
}

fn upstream(port: u16) -> Arc<Upstream> {
    let base = format!("http://127.0.0.1:{port}");
    Arc::new(Upstream::new("w", &base, &base))
}

const PATH: &str = "/inference.GRPCInferenceService/ModelInfer";

fn headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("x-forwarded-identity", HeaderValue::from_static("signed"));
    // What a client's headers may still hold: the lean request sets its own.
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
    headers.insert(header::TE, HeaderValue::from_static("gzip"));
    headers
}

/// A worker's gRPC listener over HTTP/1.1, as `serve::grpc::serve` answers: the message echoed
/// chunked, the status (and the request's `te`, `host` and `content-length`) as trailers.
async fn grpc_worker(io: ServerIo) {
    let service = service_fn(|request: Request<Incoming>| async move {
        let seen = |name: &str| request.headers().get(name).cloned().unwrap_or(HeaderValue::from_static("-"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("x-te", seen("te"));
        trailers.insert("x-host", seen("host"));
        trailers.insert("x-length", seen("content-length"));
        trailers.insert("x-identity", seen("x-forwarded-identity"));
        let body = request.into_body().collect().await?.to_bytes();
        let frames = [Ok::<_, Infallible>(Frame::data(body)), Ok(Frame::trailers(trailers))];
        let mut response = Response::new(StreamBody::new(futures::stream::iter(frames)));
        response
            .headers_mut()
            .insert(header::TRAILER, HeaderValue::from_static("grpc-status, x-te, x-host, x-length, x-identity"));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        Ok::<_, hyper::Error>(response)
    });
    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service).await;
}

#[tokio::test]
async fn calls_alone_get_their_message_and_status_trailers_on_one_kept_connection() {
    let worker = listen(None, grpc_worker).await;
    let upstream = upstream(worker.port);
    let upstreams = upstreams();
    for i in 0..3 {
        let message = format!("\0\0\0\0\x05call{i}");
        let uri = Uri::from_static(PATH);
        let answer = upstreams.call(&upstream, &uri, &headers(), message.as_bytes()).await.expect("answered");
        assert_eq!(answer.status(), http::StatusCode::OK);
        assert_eq!(answer.headers()[header::CONTENT_TYPE], "application/grpc");
        for framing in [header::TRANSFER_ENCODING, header::TRAILER] {
            assert!(!answer.headers().contains_key(&framing), "the worker's {framing} is not passed on");
        }
        let whole = answer.into_body().collect().await.expect("the whole answer");
        let trailers = whole.trailers().cloned().expect("trailers");
        assert_eq!(&whole.to_bytes()[..], message.as_bytes(), "call {i}");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["x-te"], "trailers", "the call asks for trailers, whatever the client's te");
        assert_eq!(trailers["x-host"], format!("127.0.0.1:{}", worker.port));
        assert_eq!(trailers["x-length"], message.len().to_string(), "the body's own length");
        assert_eq!(trailers["x-identity"], "signed");
        assert_eq!(upstream.lean_pool(Listener::Grpc).idle(), 1, "given back after call {i}");
        assert_eq!(upstream.lean_pool(Listener::Http).idle(), 0, "the HTTP listener's pool is apart");
    }
    assert_eq!(worker.connections.load(Ordering::SeqCst), 1, "one connection carried every call");
}

#[tokio::test]
async fn an_idle_connection_the_worker_closed_is_let_go_by_the_sweep() {
    // A worker that closes each connection 300 ms after it opened, as a worker closes one idle
    // past its header timeout.
    let worker = listen(None, |io: ServerIo| async move {
        let _ = tokio::time::timeout(Duration::from_millis(300), grpc_worker(io)).await;
    })
    .await;
    let upstream = upstream(worker.port);
    let answer = upstreams().call(&upstream, &Uri::from_static(PATH), &headers(), b"").await.expect("answered");
    answer.into_body().collect().await.expect("the whole answer");
    assert_eq!(upstream.lean_pool(Listener::Grpc).idle(), 1, "kept for the next call");
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Nothing touched the pool since: the closed connection is still held.
    assert_eq!(upstream.lean_pool(Listener::Grpc).idle(), 1);
    upstream.sweep_idle();
    assert_eq!(upstream.lean_pool(Listener::Grpc).idle(), 0, "closed by the worker: let go");
}

/// A stand-in that reads a request, then writes `answer` in pieces of `piece` bytes, each
/// flushed on its own.
async fn raw_worker(answer: &'static [u8], piece: usize) -> (Arc<Upstream>, crate::gateway::test_workers::Listening) {
    let worker = listen(None, move |mut io: ServerIo| async move {
        let mut request = [0u8; 4096];
        if io.read(&mut request).await.unwrap_or(0) == 0 {
            return;
        }
        for part in answer.chunks(piece) {
            if io.write_all(part).await.is_err() || io.flush().await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Held open, as a worker keeping the connection alive does.
        let _ = io.read(&mut request).await;
    })
    .await;
    (upstream(worker.port), worker)
}

const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ntransfer-encoding: chunked\r\n\r\n\
    5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\ngrpc-status: 0\r\ngrpc-message: fine\r\n\r\n";

#[tokio::test]
async fn chunked_answers_are_decoded_whatever_pieces_they_arrive_in() {
    for piece in [1, 2, 3, 7, 64, CHUNKED.len()] {
        let (upstream, _worker) = raw_worker(CHUNKED, piece).await;
        let answer = upstreams().call(&upstream, &Uri::from_static(PATH), &headers(), b"\0\0\0\0\0").await;
        let whole = answer.expect("answered").into_body().collect().await.expect("decoded");
        let trailers = whole.trailers().cloned().expect("trailers");
        assert_eq!(&whole.to_bytes()[..], b"hello world", "pieces of {piece}");
        assert_eq!(
            (&trailers["grpc-status"], &trailers["grpc-message"]),
            (&"0".parse().expect("v"), &"fine".parse().expect("v"))
        );
        assert_eq!(upstream.lean_pool(Listener::Grpc).idle(), 1, "kept after pieces of {piece}");
    }
}

#[tokio::test]
async fn trailers_only_and_length_framed_answers_end_without_trailers() {
    // tonic's answer to a refused call: the status in the head, no body.
    let refused: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ngrpc-status: 5\r\ncontent-length: 0\r\n\r\n";
    let (upstream, _worker) = raw_worker(refused, refused.len()).await;
    let answer = upstreams().call(&upstream, &Uri::from_static(PATH), &headers(), b"").await.expect("answered");
    assert_eq!(answer.headers()["grpc-status"], "5");
    assert_eq!(upstream.lean_pool(Listener::Grpc).idle(), 1, "free before the empty body is read");
    let whole = answer.into_body().collect().await.expect("an empty body");
    assert!(whole.trailers().is_none());
    assert!(whole.to_bytes().is_empty());
    assert_eq!(upstream.lean_pool(Listener::Grpc).idle(), 1);

    let empty_trailers: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let (upstream, _worker) = raw_worker(empty_trailers, 4).await;
    let answer = upstreams().call(&upstream, &Uri::from_static(PATH), &headers(), b"").await.expect("answered");
    let whole = answer.into_body().collect().await.expect("decoded");
    assert!(whole.trailers().is_none(), "no trailer fields, no trailers frame");
    assert_eq!(&whole.to_bytes()[..], b"abc");
    assert_eq!(upstream.lean_pool(Listener::Grpc).idle(), 1);
}

#[tokio::test]
async fn malformed_or_cut_off_answers_fail_and_their_connection_is_closed() {
    let cases: [(&[u8], &str); 4] = [
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", "a chunk size is malformed"),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
            "a chunk does not end in CRLF",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nbad trailer\r\n\r\n",
            "its trailers are malformed",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\nconnection: close\r\n\r\nabc",
            "the connection closed inside the body",
        ),
    ];
    for (answer, why) in cases {
        let worker = listen(None, move |mut io: ServerIo| async move {
            let mut request = [0u8; 4096];
            let _ = io.read(&mut request).await;
            let _ = io.write_all(answer).await;
            let _ = io.shutdown().await;
        })
        .await;
        let upstream = upstream(worker.port);
        let answer = upstreams().call(&upstream, &Uri::from_static(PATH), &headers(), b"").await.expect("a head");
        let e = answer.into_body().collect().await.expect_err(why);
        assert!(e.to_string().contains(why), "{e}");
        assert_eq!(upstream.lean_pool(Listener::Grpc).idle(), 0, "{why}: not kept");
    }
}
