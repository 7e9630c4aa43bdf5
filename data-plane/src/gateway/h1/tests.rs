use std::convert::Infallible;
use std::sync::atomic::Ordering;

use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::DuplexStream;

use super::*;
use crate::auth::forwarded;
use crate::auth::test_support::{A_INFERENCE, TENANT_A};
use crate::gateway::test_workers::{ServerIo, listen, one_model_gateway};

/// What a stand-in worker does with each request.
#[derive(Clone, Copy)]
enum Worker {
    /// Answers `{method} {target}|{host}|{identity?}|{authorization?}|{body}` with a
    /// `Content-Length`.
    Echo,
    /// Answers the echo chunked, in two chunks.
    Chunked,
    /// Answers as `Echo` with `Connection: close`, then closes.
    EchoThenClose,
    /// Reads the request, then hangs up without answering.
    HangUp,
    /// Reads the request, then keeps the connection open without answering (a frozen worker).
    Silent,
    /// Reads the request, sends the head and 4 of the 100 bytes its answer announces, then
    /// keeps the connection open sending nothing more.
    HalfAnswer,
}

async fn serve_worker(io: ServerIo, worker: Worker) {
    if let Worker::HangUp | Worker::Silent | Worker::HalfAnswer = worker {
        let mut io = io;
        let mut buffer = [0u8; 4096];
        let _ = io.read(&mut buffer).await;
        if let Worker::HalfAnswer = worker {
            let _ = io.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf").await;
        }
        if let Worker::Silent | Worker::HalfAnswer = worker {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        return;
    }
    let service = service_fn(move |request: Request<Incoming>| async move {
        let (head, body) = request.into_parts();
        let body = body.collect().await?.to_bytes();
        let header = |name: &str| head.headers.get(name).map_or("-", |v| v.to_str().unwrap_or("?")).to_string();
        let identity = if head.headers.contains_key(forwarded::HEADER) { "signed" } else { "unsigned" };
        let text = format!(
            "{} {}|{}|{identity}|{}|{}",
            head.method,
            head.uri,
            header("host"),
            header("authorization"),
            String::from_utf8_lossy(&body)
        );
        let mut response = match worker {
            Worker::Chunked => {
                let frames =
                    [Ok::<_, Infallible>(Frame::data(Bytes::from(text))), Ok(Frame::data(Bytes::from_static(b"!")))];
                Response::new(http_body_util::Either::Right(StreamBody::new(futures::stream::iter(frames))))
            }
            _ => Response::new(http_body_util::Either::Left(Full::new(Bytes::from(text)))),
        };
        if let Worker::EchoThenClose = worker {
            response.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        Ok::<_, hyper::Error>(response)
    });
    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service).await;
}

/// A gateway whose tenant A has model `m` on one stand-in worker, and the worker's
/// connection count.
async fn gateway(worker: Worker, max_request_bytes: usize) -> (Arc<Gateway>, Arc<std::sync::atomic::AtomicUsize>) {
    let listening = listen(None, move |io| serve_worker(io, worker)).await;
    (one_model_gateway(listening.port, max_request_bytes), listening.connections)
}

/// A client connection served by [`connection`], and the task serving it.
fn client(g: &Arc<Gateway>) -> (DuplexStream, tokio::task::JoinHandle<()>) {
    client_buffering(g, 1 << 20)
}

/// [`client`] over a connection that holds `capacity` bytes on their way.
fn client_buffering(g: &Arc<Gateway>, capacity: usize) -> (DuplexStream, tokio::task::JoinHandle<()>) {
    let (near, far) = tokio::io::duplex(capacity);
    let router = crate::gateway::http::router(g.clone());
    let served = tokio::spawn(connection(far, g.clone(), router, CancellationToken::new(), Duration::from_secs(5)));
    (near, served)
}

/// An answer read off a client connection.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    /// The body as it came (chunked framing included).
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one answer (delimited by its length or chunked) from `io`, `read` holding what was
/// read past the previous one.
async fn read_answer(io: &mut DuplexStream, read: &mut BytesMut) -> Answer {
    loop {
        let mut raw = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Response::new(&mut raw);
        if let httparse::Status::Complete(len) = parsed.parse(read).expect("a valid answer head") {
            let status = parsed.code.expect("status");
            let headers: Vec<(String, String)> = parsed
                .headers
                .iter()
                .map(|h| (h.name.to_string(), String::from_utf8_lossy(h.value).into_owned()))
                .collect();
            let length = headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("content-length"));
            let length = length.map(|(_, v)| v.parse::<usize>().expect("a length"));
            let _ = read.split_to(len);
            let body = match length {
                Some(n) => {
                    while read.len() < n {
                        assert!(io.read_buf(read).await.expect("read") > 0, "closed within the body");
                    }
                    read.split_to(n).to_vec()
                }
                None => {
                    let mut scanner = head::ChunkedEnd::default();
                    let mut seen = 0;
                    loop {
                        if let Some(end) = scanner.advance(&read[seen..]).expect("valid chunks") {
                            break read.split_to(seen + end).to_vec();
                        }
                        seen = read.len();
                        assert!(io.read_buf(read).await.expect("read") > 0, "closed within the body");
                    }
                }
            };
            return Answer { status, headers, body };
        }
        assert!(io.read_buf(read).await.expect("read") > 0, "closed before an answer: {read:?}");
    }
}

fn infer(body: &str, extra: &str) -> String {
    format!(
        "POST /v2/models/m/infer?q=1 HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {A_INFERENCE}\r\n\
tessera-identity: forged\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn model_requests_are_forwarded_signed_and_answered_on_one_pooled_worker_connection() {
    let (g, connections) = gateway(Worker::Echo, 1 << 20).await;
    let (mut io, _) = client(&g);
    let mut read = BytesMut::new();
    // Two requests in one write (pipelined), then a third.
    io.write_all(format!("{}{}", infer("one", ""), infer("two", "")).as_bytes()).await.expect("write");
    for body in ["one", "two"] {
        let answer = read_answer(&mut io, &mut read).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let port =
            g.routes().tenants[TENANT_A].models["m"].replicas[0].upstream.http.rsplit(':').next().map(str::to_string);
        let expected = format!("POST /v2/models/m/infer?q=1|127.0.0.1:{}|signed|-|{body}", port.expect("a port"));
        assert_eq!(answer.text(), expected);
        assert_eq!(answer.header("connection"), None);
    }
    io.write_all(infer("three", "").as_bytes()).await.expect("write");
    assert!(read_answer(&mut io, &mut read).await.text().ends_with("|three"));
    assert_eq!(connections.load(Ordering::SeqCst), 1, "the worker connection was pooled");

    // A client asking to close gets its answer, then the end of the connection.
    io.write_all(infer("four", "Connection: close\r\n").as_bytes()).await.expect("write");
    let answer = read_answer(&mut io, &mut read).await;
    assert_eq!((answer.status, answer.header("connection")), (200, Some("close")));
    let mut rest = Vec::new();
    io.read_to_end(&mut rest).await.expect("read to the end");
    assert!(rest.is_empty() && read.is_empty());
}

#[tokio::test]
async fn what_the_lean_path_does_not_serve_goes_to_hyper_with_the_bytes_already_read() {
    let (g, _) = gateway(Worker::Echo, 1 << 20).await;
    let (mut io, served) = client(&g);
    let mut read = BytesMut::new();
    // A refused model request (lean path), the server's health (the router), then a model
    // request served by hyper's path on the same connection: all in one write.
    let unauthenticated = "GET /v2/models/m HTTP/1.1\r\nHost: gw\r\n\r\n";
    let health = "GET /v2/health/live HTTP/1.1\r\nHost: gw\r\n\r\n";
    io.write_all(format!("{unauthenticated}{health}{}", infer("after", "")).as_bytes()).await.expect("write");
    let refused = read_answer(&mut io, &mut read).await;
    assert_eq!((refused.status, refused.header("www-authenticate")), (401, Some("Bearer")), "{}", refused.text());
    assert!(refused.text().contains("error"), "{}", refused.text());
    assert_eq!(read_answer(&mut io, &mut read).await.status, 200, "health, from the router");
    let answer = read_answer(&mut io, &mut read).await;
    assert_eq!(answer.status, 200);
    assert!(answer.text().ends_with("|signed|-|after"), "{}", answer.text());
    drop(io);
    tokio::time::timeout(Duration::from_secs(5), served).await.expect("the connection ended").expect("task");

    // A chunked request body is hyper's to read.
    let (mut io, _) = client(&g);
    let chunked = format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {A_INFERENCE}\r\n\
Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    );
    io.write_all(chunked.as_bytes()).await.expect("write");
    let answer = read_answer(&mut io, &mut BytesMut::new()).await;
    assert!(answer.text().ends_with("|abc"), "{}", answer.text());
}

#[tokio::test]
async fn a_chunked_answer_passes_as_it_came_and_the_connection_goes_on() {
    let (g, connections) = gateway(Worker::Chunked, 1 << 20).await;
    let (mut io, _) = client(&g);
    let mut read = BytesMut::new();
    for body in ["a", "b"] {
        io.write_all(infer(body, "").as_bytes()).await.expect("write");
        let answer = read_answer(&mut io, &mut read).await;
        assert_eq!(answer.header("transfer-encoding"), Some("chunked"));
        let text = answer.text();
        assert!(text.ends_with(&format!("|{body}\r\n1\r\n!\r\n0\r\n\r\n")), "{text:?}");
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_unread_and_the_connection_closed() {
    let (g, _) = gateway(Worker::Echo, 8).await;
    let (mut io, served) = client(&g);
    io.write_all(infer("123456789", "").as_bytes()).await.expect("write");
    let answer = read_answer(&mut io, &mut BytesMut::new()).await;
    assert_eq!((answer.status, answer.header("connection")), (413, Some("close")));
    tokio::time::timeout(Duration::from_secs(5), served).await.expect("closed").expect("task");
    // Counted for its tenant, as through hyper's path.
    let text = String::from_utf8(g.metrics.render(&g)).expect("utf-8");
    let line = format!(
        "tessera_gateway_requests_total{{code=\"413\",model=\"m\",protocol=\"http\",tenant=\"{TENANT_A}\",version=\"\"}} 1"
    );
    assert!(text.contains(&line), "{line} in {text}");

    // A caller without a valid credential hears that first.
    let (mut io, _) = client(&g);
    let forged = infer("123456789", "").replace(A_INFERENCE, "tsk_forged");
    io.write_all(forged.as_bytes()).await.expect("write");
    let answer = read_answer(&mut io, &mut BytesMut::new()).await;
    assert_eq!((answer.status, answer.header("connection")), (401, Some("close")), "{}", answer.text());
}

#[tokio::test]
async fn a_worker_closing_its_idle_connection_costs_no_request_and_one_hanging_up_fails_one() {
    let (g, connections) = gateway(Worker::EchoThenClose, 1 << 20).await;
    let (mut io, _) = client(&g);
    let mut read = BytesMut::new();
    for body in ["one", "two", "three"] {
        io.write_all(infer(body, "").as_bytes()).await.expect("write");
        let answer = read_answer(&mut io, &mut read).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("connection"), None, "the worker's close is its own connection's");
        // Let the close arrive before the next request.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(connections.load(Ordering::SeqCst), 3);

    let (g, _) = gateway(Worker::HangUp, 1 << 20).await;
    let (mut io, _) = client(&g);
    io.write_all(infer("lost", "").as_bytes()).await.expect("write");
    let answer = read_answer(&mut io, &mut BytesMut::new()).await;
    assert_eq!(answer.status, 503);
    assert!(answer.text().contains("may have run"), "{}", answer.text());
}

#[tokio::test]
async fn a_worker_that_does_not_begin_its_answer_in_time_fails_the_request_with_504() {
    let (mut g, _) = gateway(Worker::Silent, 1 << 20).await;
    Arc::get_mut(&mut g).expect("not shared yet").upstream_timeout = Duration::from_millis(300);
    let (mut io, _) = client(&g);
    let started = std::time::Instant::now();
    io.write_all(infer("frozen", "").as_bytes()).await.expect("write");
    let answer = read_answer(&mut io, &mut BytesMut::new()).await;
    let waited = started.elapsed();
    assert_eq!(answer.status, 504, "{}", answer.text());
    assert!(answer.text().contains("did not begin its answer within 0.3 s"), "{}", answer.text());
    assert!(answer.text().contains("may have run"), "{}", answer.text());
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(3), "answered after {waited:?}");
}

#[tokio::test]
async fn a_client_that_stops_taking_its_answer_is_disconnected_after_the_stall_timeout() {
    let (mut g, connections) = gateway(Worker::Echo, 4 << 20).await;
    let stall = Duration::from_millis(300);
    Arc::get_mut(&mut g).expect("not shared yet").answer_stall = stall;
    // The worker echoes the body: an answer of 256 KiB, into a connection holding 4 KiB.
    let (mut io, served) = client_buffering(&g, 4 << 10);
    let body = "x".repeat(256 << 10);
    io.write_all(infer(&body, "").as_bytes()).await.expect("write");
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), served).await.expect("disconnected in time").expect("task");
    let waited = started.elapsed();
    assert!(waited >= stall, "disconnected after {waited:?}");
    // The worker's connection, its answer half relayed, is not kept: the next request opens another.
    let (mut io, _) = client(&g);
    io.write_all(infer("after", "").as_bytes()).await.expect("write");
    let answer = read_answer(&mut io, &mut BytesMut::new()).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_worker_that_stops_mid_answer_has_the_client_disconnected_after_the_stall_timeout() {
    let (mut g, connections) = gateway(Worker::HalfAnswer, 1 << 20).await;
    let stall = Duration::from_millis(300);
    Arc::get_mut(&mut g).expect("not shared yet").answer_stall = stall;
    let (mut io, served) = client(&g);
    io.write_all(infer("half", "").as_bytes()).await.expect("write");
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), io.read_to_end(&mut seen))
        .await
        .expect("closed in time")
        .expect("read");
    let waited = started.elapsed();
    assert!(waited >= stall, "disconnected after {waited:?}");
    let seen = String::from_utf8_lossy(&seen);
    assert!(seen.starts_with("HTTP/1.1 200") && seen.ends_with("\r\n\r\nhalf"), "{seen}");
    served.await.expect("task");
    // The worker's connection, its answer cut off, is not kept: the next request opens another.
    let (mut io, _) = client(&g);
    io.write_all(infer("again", "").as_bytes()).await.expect("write");
    let _ = tokio::time::timeout(Duration::from_secs(5), io.read_to_end(&mut Vec::new())).await;
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_stalled_head_is_closed_after_the_header_timeout() {
    let (g, _) = gateway(Worker::Echo, 1 << 20).await;
    let (mut near, far) = tokio::io::duplex(1 << 16);
    let router = crate::gateway::http::router(g.clone());
    let served = tokio::spawn(connection(far, g.clone(), router, CancellationToken::new(), Duration::from_millis(200)));
    near.write_all(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: g").await.expect("write");
    tokio::time::timeout(Duration::from_secs(5), served).await.expect("closed").expect("task");
}

#[tokio::test]
async fn a_body_arriving_in_pieces_is_read_whole_before_it_is_forwarded() {
    let (g, _) = gateway(Worker::Echo, 4 << 20).await;
    let (mut io, _) = client(&g);
    // Over the most room made at a time, so the buffer grows as the body arrives.
    let body = "x".repeat(MAX_BODY_READ + 5);
    let request = infer(&body, "");
    let (head, rest) = request.split_at(request.len() - body.len() + 3);
    io.write_all(head.as_bytes()).await.expect("write the head and 3 bytes");
    tokio::time::sleep(Duration::from_millis(20)).await;
    io.write_all(rest.as_bytes()).await.expect("write the rest");
    let answer = read_answer(&mut io, &mut BytesMut::new()).await;
    assert_eq!(answer.status, 200);
    assert!(answer.text().ends_with(&format!("|{body}")), "the whole body reached the worker");
}
