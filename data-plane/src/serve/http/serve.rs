//! The HTTP endpoint's connections: HTTP/1.1, or HTTP/2 with prior knowledge, with upgrades,
//! as `axum::serve` would serve them (see [`crate::serve::net::accept`] for why it is our own),
//! over plain TCP or TLS.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tessera_protocol::stall::{ANSWER_STALL, WriteStall};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower_http::timeout::RequestBodyTimeoutLayer;

use crate::serve::net::rewake::RewakeExecutor;
use crate::serve::net::tls::TlsAcceptor;

/// How long a client may take to send its first bytes after connecting, and each request
/// head (HTTP/1); then the connection is closed, so clients that trickle headers (slowloris)
/// cannot hold connections open. It also bounds how long an idle keep-alive connection waits
/// for its next request. hyper's own default once a timer is set; a constant because the
/// listener flags are outside the HTTP module.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a request body may go without sending more of itself: a body shorter than its
/// `Content-Length` (or an HTTP/2 stream that stops sending data) then fails its request
/// instead of holding it, and its connection, forever.
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `router` on `listener` until `shutdown`, over TLS when `tls` is given (each
/// connection gets the acceptor's current certificate); then stops accepting, lets every open
/// connection finish its request in progress, and returns once all are closed.
pub async fn serve(listener: TcpListener, router: Router, shutdown: CancellationToken, tls: Option<TlsAcceptor>) {
    serve_with(listener, router, shutdown, tls, HEADER_READ_TIMEOUT, BODY_READ_TIMEOUT, ANSWER_STALL).await;
}

/// [`serve`] with given header and body read timeouts and answer stall.
async fn serve_with(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    tls: Option<TlsAcceptor>,
    header_timeout: Duration,
    body_timeout: Duration,
    answer_stall: Duration,
) {
    let router = with_body_timeout(router, body_timeout);
    crate::serve::net::accept::serve(listener, "http", header_timeout, shutdown, move |tcp, shutdown| {
        connection(tcp, tls.clone(), router.clone(), shutdown, header_timeout, answer_stall)
    })
    .await;
}

/// `router` with requests whose bodies stall for `body_timeout` failed (408).
pub(crate) fn with_body_timeout(router: Router, body_timeout: Duration) -> Router {
    router.layer(RequestBodyTimeoutLayer::new(body_timeout))
}

/// Serves one connection, after its TLS handshake when `tls` is given; on shutdown it
/// finishes the request in progress and closes.
async fn connection(
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    router: Router,
    shutdown: CancellationToken,
    header_timeout: Duration,
    answer_stall: Duration,
) {
    // One branch per connection; each request then runs on a stream type known at compile time.
    match tls {
        None => serve_connection(tcp, router, shutdown, header_timeout, answer_stall).await,
        Some(tls) => {
            if let Some(stream) =
                crate::serve::net::accept::tls_handshake(&tls, tcp, "http", header_timeout, &shutdown).await
            {
                serve_connection(stream, router, shutdown, header_timeout, answer_stall).await;
            }
        }
    }
}

/// Serves HTTP on one connection's stream until it closes or, after `shutdown`, finishes its
/// request in progress; a client that takes none of its answer for `answer_stall` is
/// disconnected.
pub(crate) async fn serve_connection<IO>(
    io: IO,
    router: Router,
    shutdown: CancellationToken,
    header_timeout: Duration,
    answer_stall: Duration,
) where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut builder = Builder::new(RewakeExecutor);
    builder.http1().timer(TokioTimer::new()).header_read_timeout(header_timeout);
    crate::serve::net::limits::http2(&mut builder.http2());
    // hyper has no bound on a client that stops reading its answer.
    let io = TokioIo::new(WriteStall::new(io, answer_stall));
    let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(router));
    crate::serve::net::accept::drive(conn, "http", shutdown, |conn| conn.graceful_shutdown()).await;
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Instant;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Reads until the server closes the connection; how long that took.
    async fn closed_after(tcp: &mut TcpStream, what: &str) -> (Duration, Vec<u8>) {
        let started = Instant::now();
        let mut seen = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut seen)).await;
        assert!(read.is_ok(), "the server kept the connection of {what} open for 10 s");
        (started.elapsed(), seen)
    }

    /// Bytes of `GET /big`'s answer: more than loopback's socket buffers hold for a client
    /// with a small receive buffer.
    const BIG_ANSWER: usize = 32 << 20;

    /// A server whose header and body timeouts and answer stall are all `header_timeout`.
    async fn start(header_timeout: Duration) -> (SocketAddr, CancellationToken) {
        start_with(header_timeout, None).await
    }

    /// [`start`] over TLS when `tls` is given.
    async fn start_with(header_timeout: Duration, tls: Option<TlsAcceptor>) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let read_body = |body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>| async move {
            match body {
                Ok(b) => (axum::http::StatusCode::OK, b.len().to_string()),
                Err(e) => (e.status(), e.body_text()),
            }
        };
        let big = || async { vec![7u8; BIG_ANSWER] };
        let router = Router::new().route("/", get(|| async { "ok" }).post(read_body)).route("/big", get(big));
        let shutdown = CancellationToken::new();
        let (body_timeout, answer_stall) = (header_timeout, header_timeout);
        tokio::spawn(serve_with(listener, router, shutdown.clone(), tls, header_timeout, body_timeout, answer_stall));
        (addr, shutdown)
    }

    #[tokio::test]
    async fn a_client_that_takes_none_of_its_answer_is_disconnected_after_the_stall() {
        let stall = Duration::from_millis(300);
        let (addr, shutdown) = start(stall).await;
        // A small receive buffer, so the answer cannot all fit in the sockets' buffers.
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(64 << 10).expect("receive buffer");
        let mut reader = socket.connect(addr).await.expect("connect");
        reader.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        // Reads nothing for several stalls: the server gives up on the connection meanwhile.
        tokio::time::sleep(stall * 5).await;
        let mut seen = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut seen)).await;
        assert!(read.is_ok(), "the connection stayed open for 10 s");
        assert!(seen.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&seen[..seen.len().min(64)]));
        assert!(seen.len() < BIG_ANSWER, "the whole answer came: the connection was kept");

        // A client that reads serves itself the whole answer, however long it takes.
        let mut prompt = TcpStream::connect(addr).await.expect("connect");
        prompt.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        let mut whole = Vec::new();
        prompt.read_to_end(&mut whole).await.expect("read");
        assert!(whole.len() > BIG_ANSWER, "{} bytes", whole.len());
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_request_head_is_disconnected() {
        let timeout = Duration::from_millis(300);
        let (addr, shutdown) = start(timeout).await;

        let mut complete = TcpStream::connect(addr).await.expect("connect");
        complete.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        let (_, reply) = closed_after(&mut complete, "a complete request").await;
        assert!(reply.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&reply));

        let mut half = TcpStream::connect(addr).await.expect("connect");
        half.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.expect("write");
        let (waited, _) = closed_after(&mut half, "half a head").await;
        assert!(waited >= timeout - Duration::from_millis(50), "closed after {waited:?}");

        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let (waited, seen) = closed_after(&mut silent, "a silent client").await;
        assert!(waited >= timeout - Duration::from_millis(50) && seen.is_empty(), "closed after {waited:?}");
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_body_shorter_than_its_content_length_fails_instead_of_waiting_forever() {
        let timeout = Duration::from_millis(300);
        let (addr, shutdown) = start(timeout).await;

        let mut short = TcpStream::connect(addr).await.expect("connect");
        let head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nConnection: close\r\n\r\n";
        short.write_all(format!("{head}only ten b").as_bytes()).await.expect("write");
        let (waited, reply) = closed_after(&mut short, "a short body").await;
        let reply = String::from_utf8_lossy(&reply);
        assert!(reply.starts_with("HTTP/1.1 4"), "answered with a client error: {reply}");
        assert!(waited >= timeout - Duration::from_millis(50), "after the timeout, not before: {waited:?}");

        let mut whole = TcpStream::connect(addr).await.expect("connect");
        let head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\n";
        whole.write_all(format!("{head}full").as_bytes()).await.expect("write");
        let (_, reply) = closed_after(&mut whole, "a whole body").await;
        assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 200"));
        shutdown.cancel();
    }

    #[tokio::test]
    async fn over_tls_requests_are_served_with_the_current_certificate_and_plain_ones_are_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (files, _) = tessera_protocol::tls::local::ensure(dir.path(), &["localhost"]).expect("certificate");
        let tls = TlsAcceptor::load(files.pair.clone()).expect("loads");
        let (addr, shutdown) = start_with(Duration::from_secs(5), Some(tls)).await;
        let config = tessera_protocol::tls::client_config(Some(&files.ca)).expect("client config");
        let client = reqwest::Client::builder().use_preconfigured_tls(config).build().expect("client");
        let url = format!("https://localhost:{}/", addr.port());
        let answer = client.get(&url).send().await.expect("GET over TLS");
        assert_eq!(answer.text().await.expect("body"), "ok");

        // A client speaking plain HTTP to the TLS port gets no HTTP answer.
        let mut plain = TcpStream::connect(addr).await.expect("connect");
        plain.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        let (_, reply) = closed_after(&mut plain, "a plain client").await;
        assert!(!reply.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&reply));
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_client_that_starts_its_tls_hello_and_stalls_is_disconnected_after_the_header_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (files, _) = tessera_protocol::tls::local::ensure(dir.path(), &["localhost"]).expect("certificate");
        let tls = TlsAcceptor::load(files.pair.clone()).expect("loads");
        let timeout = Duration::from_millis(300);
        let (addr, shutdown) = start_with(timeout, Some(tls)).await;
        let mut stalled = TcpStream::connect(addr).await.expect("connect");
        // A handshake record's header announcing 512 bytes, then nothing.
        stalled.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await.expect("write");
        let (waited, _) = closed_after(&mut stalled, "a stalled TLS hello").await;
        assert!(waited >= timeout - Duration::from_millis(50), "closed after {waited:?}");
        shutdown.cancel();
    }
}
