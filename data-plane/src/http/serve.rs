//! The HTTP accept loop: one task per connection (HTTP/1.1, or HTTP/2 with prior knowledge),
//! each wrapped in [`Rewake`], with graceful shutdown. It does what `axum::serve` does; it
//! exists so that the connection tasks can be wrapped.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::rewake::Rewake;

/// Serves `router` on `listener` until `shutdown`; then stops accepting, lets every open
/// connection finish its request in progress, and returns once all are closed.
pub async fn serve(listener: TcpListener, router: Router, shutdown: CancellationToken) {
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
                tracing::error!(error = %e, "accepting an HTTP connection failed");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    () = shutdown.cancelled() => break,
                }
            }
        };
        connections.spawn(Rewake::new(connection(tcp, router.clone(), shutdown.clone())));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Serves one connection; on shutdown it finishes the request in progress and closes.
async fn connection(tcp: TcpStream, router: Router, shutdown: CancellationToken) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
    crate::busy_poll::watch(&tcp);
    let builder = Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), TowerToHyperService::new(router));
    let mut conn = std::pin::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::trace!(error = %e, "HTTP connection ended with an error");
                }
                return;
            }
            () = shutdown.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
        }
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
