//! The accept loop of the HTTP and gRPC endpoints: one task per connection, each wrapped in
//! [`Rewake`], with graceful shutdown. It does what `axum::serve` and tonic's server do; it
//! exists so that the connection tasks (and, through [`RewakeExecutor`], the HTTP/2 stream
//! tasks) can be wrapped.
//!
//! [`RewakeExecutor`]: crate::serve::net::rewake::RewakeExecutor

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::serve::net::rewake::Rewake;
use crate::serve::net::tls::TlsAcceptor;

/// Accepts on `listener` until `shutdown`, running `connection` for each accepted stream (with
/// TCP_NODELAY set and the stream registered for busy-polling) and a clone of `shutdown` once
/// the client has sent something within `first_bytes` (see `sent_something`); then stops
/// accepting and returns once every connection task has ended. `endpoint` names the listener
/// in logs.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    endpoint: &'static str,
    first_bytes: Duration,
    shutdown: CancellationToken,
    connection: F,
) where
    F: Fn(TcpStream, CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let connection = std::sync::Arc::new(connection);
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) if is_per_connection(&e) => continue,
            Err(e) => {
                // Out of file descriptors and the like: wait rather than spin on the error.
                tracing::error!(endpoint, error = %e, "accepting a connection failed");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    () = shutdown.cancelled() => break,
                }
            }
        };
        // Nagle off: otherwise replies above a few KB stall ~40 ms on delayed ACKs.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(endpoint, error = %e, "cannot set TCP_NODELAY");
        }
        crate::serve::net::busy_poll::watch(&tcp);
        let (connection, shutdown) = (connection.clone(), shutdown.clone());
        connections.spawn(Rewake::new(async move {
            if sent_something(&tcp, first_bytes, endpoint, &shutdown).await {
                connection(tcp, shutdown).await;
            }
        }));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Drives one hyper connection to its end; once `shutdown` fires it asks the connection (through
/// `graceful`) to finish the requests in progress and close.
pub async fn drive<C, E, G>(conn: C, endpoint: &'static str, shutdown: CancellationToken, graceful: G)
where
    C: Future<Output = Result<(), E>>,
    E: Display,
    G: FnOnce(Pin<&mut C>),
{
    let mut conn = std::pin::pin!(conn);
    let mut graceful = Some(graceful);
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::trace!(endpoint, error = %e, "connection ended with an error");
                }
                return;
            }
            () = shutdown.cancelled(), if graceful.is_some() => {
                if let Some(graceful) = graceful.take() {
                    graceful(conn.as_mut());
                }
            }
        }
    }
}

/// Whether the client on `tcp` sent its first bytes (or closed, which the server then sees)
/// within `timeout`, and `shutdown` has not come first. hyper-util reads the first bytes (HTTP/1
/// or HTTP/2?) with no timeout, and hyper's header timer starts only after that, so a client
/// that connects and sends nothing would otherwise hold its connection. With TLS the first bytes
/// are the client's hello.
async fn sent_something(
    tcp: &TcpStream,
    timeout: Duration,
    endpoint: &'static str,
    shutdown: &CancellationToken,
) -> bool {
    let mut first = [0u8; 1];
    // `peek`, not `readable`, whose readiness may be a false positive.
    tokio::select! {
        peeked = tokio::time::timeout(timeout, tcp.peek(&mut first)) => {
            if peeked.is_err() {
                tracing::trace!(endpoint, "closing a connection that sent nothing");
            }
            peeked.is_ok()
        }
        () = shutdown.cancelled() => false,
    }
}

/// `io` after its TLS handshake with the acceptor's current certificate, or `None` when the
/// handshake failed or outlasted `timeout` (logged), or `shutdown` came first.
pub async fn tls_handshake<IO>(
    tls: &TlsAcceptor,
    io: IO,
    endpoint: &'static str,
    timeout: Duration,
    shutdown: &CancellationToken,
) -> Option<TlsStream<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    tokio::select! {
        accepted = tls.accept(io, timeout) => match accepted {
            Ok(stream) => Some(stream),
            Err(e) => {
                tracing::debug!(endpoint, error = %e, "tls handshake failed");
                None
            }
        },
        () = shutdown.cancelled() => None,
    }
}

/// Accept errors that concern only the connection being accepted (the client gave up).
fn is_per_connection(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}
