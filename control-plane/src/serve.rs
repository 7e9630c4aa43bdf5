//! The control plane's listener: one task per connection, with the limits `axum::serve` leaves
//! unset — a deadline for a request's first bytes and headers, a cap on HTTP/2 streams per
//! connection, keep-alive pings that find dead peers — and a graceful shutdown that lets the
//! requests in progress finish. With a certificate, connections are TLS.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tessera_protocol::stall::{ANSWER_STALL, WriteStall};
use tessera_protocol::tls::TlsAcceptor;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How the listener treats each connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// How long a client has to send a request's headers (and a new connection its first
    /// bytes) before the connection is closed.
    pub header_read_timeout: Duration,
    /// Requests one HTTP/2 connection may have open at once.
    pub max_streams: u32,
    /// How often an idle HTTP/2 connection is pinged; a peer that does not answer within the
    /// same time is dropped.
    pub keep_alive: Duration,
    /// How long a client may take none of its answer before its connection is closed.
    pub answer_stall: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(30),
            max_streams: 128,
            keep_alive: Duration::from_secs(30),
            answer_stall: ANSWER_STALL,
        }
    }
}

/// Serves `router` on `listener` until `shutdown`; then stops accepting, lets every connection
/// finish its requests in progress, and returns once all are closed. Handlers see the peer's
/// address as [`ConnectInfo<SocketAddr>`]. With `tls`, each connection gets its current
/// certificate.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    limits: ConnLimits,
    tls: Option<TlsAcceptor>,
) {
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        match accepted {
            Ok((tcp, peer)) => {
                connections.spawn(connection(tcp, peer, tls.clone(), router.clone(), shutdown.clone(), limits));
            }
            Err(e) => {
                // Out of file descriptors and the like: wait rather than spin on the error.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    () = shutdown.cancelled() => break,
                }
            }
        }
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    router: Router,
    shutdown: CancellationToken,
    limits: ConnLimits,
) {
    // hyper-util reads the first bytes (HTTP/1 or HTTP/2?) with no deadline, and hyper's header
    // timer starts only after them, so a client that sends nothing needs a deadline of its own.
    let mut first = [0u8; 1];
    tokio::select! {
        sent = tokio::time::timeout(limits.header_read_timeout, tcp.peek(&mut first)) => if sent.is_err() {
            return;
        },
        () = shutdown.cancelled() => return,
    }
    match tls {
        None => serve_connection(tcp, peer, router, shutdown, limits).await,
        Some(tls) => {
            let stream = tokio::select! {
                accepted = tls.accept(tcp, limits.header_read_timeout) => match accepted {
                    Ok(stream) => stream,
                    Err(e) => {
                        tracing::debug!(error = %e, "tls handshake failed");
                        return;
                    }
                },
                () = shutdown.cancelled() => return,
            };
            serve_connection(stream, peer, router, shutdown, limits).await;
        }
    }
}

/// Serves HTTP/1.1 and HTTP/2 on one connection's stream until it closes or, after
/// `shutdown`, finishes its requests in progress.
async fn serve_connection<IO>(io: IO, peer: SocketAddr, router: Router, shutdown: CancellationToken, limits: ConnLimits)
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        tower::ServiceExt::oneshot(router.clone(), req)
    });
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .max_header_list_size(16 << 10)
        .keep_alive_interval(limits.keep_alive)
        .keep_alive_timeout(limits.keep_alive);
    // hyper has no bound on a client that stops reading its answer.
    let io = TokioIo::new(WriteStall::new(io, limits.answer_stall));
    let conn = builder.serve_connection_with_upgrades(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut draining = false;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::trace!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = shutdown.cancelled(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn start(limits: ConnLimits) -> (SocketAddr, CancellationToken) {
        start_with(limits, None).await
    }

    async fn start_with(limits: ConnLimits, tls: Option<TlsAcceptor>) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let router = Router::new()
            .route("/peer", get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }))
            .route("/echo", post(|body: String| async move { body }))
            .route("/big", get(|| async { vec![7u8; 32 << 20] }))
            .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(limits.header_read_timeout));
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(listener, router, shutdown.clone(), limits, tls));
        (addr, shutdown)
    }

    /// Reads until the server closes the connection: how long that took, and what it sent.
    async fn closed_after(tcp: &mut TcpStream) -> (Duration, String) {
        let started = Instant::now();
        let mut seen = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut seen)).await;
        assert!(read.is_ok(), "the server kept the connection open for 10 s");
        (started.elapsed(), String::from_utf8_lossy(&seen).into_owned())
    }

    #[tokio::test]
    async fn slow_clients_are_cut_off_and_prompt_ones_are_served() {
        let limits = ConnLimits { header_read_timeout: Duration::from_millis(300), ..ConnLimits::default() };
        let (addr, _shutdown) = start(limits).await;

        // Nothing at all, then headers that never end, then a body shorter than announced.
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let (waited, _) = closed_after(&mut silent).await;
        assert!(waited < Duration::from_secs(3), "{waited:?}");
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        slow.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\n").await.expect("write");
        let (waited, _) = closed_after(&mut slow).await;
        assert!(waited < Duration::from_secs(3), "{waited:?}");
        let mut short = TcpStream::connect(addr).await.expect("connect");
        short.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc").await.expect("write");
        let (waited, answer) = closed_after(&mut short).await;
        assert!(waited < Duration::from_secs(3), "{waited:?}");
        assert!(answer.starts_with("HTTP/1.1 4"), "a client error, not a hang: {answer}");

        // A whole request is answered, with the peer's address known to the handler.
        let mut ok = TcpStream::connect(addr).await.expect("connect");
        ok.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        let (_, answer) = closed_after(&mut ok).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains(&ok.local_addr().expect("local").to_string()), "{answer}");
    }

    #[tokio::test]
    async fn a_client_that_takes_none_of_its_answer_is_cut_off_after_the_stall() {
        let limits = ConnLimits { answer_stall: Duration::from_millis(300), ..ConnLimits::default() };
        let (addr, _shutdown) = start(limits).await;
        // A small receive buffer, so the answer cannot all fit in the sockets' buffers.
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(64 << 10).expect("receive buffer");
        let mut reader = socket.connect(addr).await.expect("connect");
        reader.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut seen = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut seen)).await;
        assert!(read.is_ok(), "the connection stayed open for 10 s");
        // 32 MiB is more than the sockets' buffers hold: had the server waited, all of it.
        assert!(seen.len() < 32 << 20, "the whole answer came: the connection was kept");
    }

    #[tokio::test]
    async fn a_client_that_starts_its_tls_hello_and_stalls_is_cut_off_after_the_header_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (files, _) = tessera_protocol::tls::local::ensure(dir.path(), &["localhost"]).expect("certificate");
        let tls = TlsAcceptor::load(files.pair).expect("loads");
        let limits = ConnLimits { header_read_timeout: Duration::from_millis(300), ..ConnLimits::default() };
        let (addr, _shutdown) = start_with(limits, Some(tls)).await;
        let mut stalled = TcpStream::connect(addr).await.expect("connect");
        // A handshake record's header announcing 512 bytes, then nothing.
        stalled.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await.expect("write");
        let (waited, _) = closed_after(&mut stalled).await;
        assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(3), "closed after {waited:?}");
    }

    #[tokio::test]
    async fn shutdown_lets_the_request_in_progress_finish() {
        let (addr, shutdown) = start(ConnLimits::default()).await;
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab").await.expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        shutdown.cancel();
        tcp.write_all(b"cd").await.expect("write the rest");
        let (_, answer) = closed_after(&mut tcp).await;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("abcd"), "{answer}");
    }
}
