//! The HTTP endpoint's connections: HTTP/1.1, or HTTP/2 with prior knowledge, with upgrades,
//! as `axum::serve` would serve them (see [`crate::accept`] for why it is our own).

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::rewake::RewakeExecutor;

/// Serves `router` on `listener` until `shutdown`; then stops accepting, lets every open
/// connection finish its request in progress, and returns once all are closed.
pub async fn serve(listener: TcpListener, router: Router, shutdown: CancellationToken) {
    crate::accept::serve(listener, "http", shutdown, |tcp, shutdown| connection(tcp, router.clone(), shutdown)).await;
}

/// Serves one connection; on shutdown it finishes the request in progress and closes.
async fn connection(tcp: TcpStream, router: Router, shutdown: CancellationToken) {
    let builder = Builder::new(RewakeExecutor);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), TowerToHyperService::new(router));
    crate::accept::drive(conn, "http", shutdown, |conn| conn.graceful_shutdown()).await;
}
