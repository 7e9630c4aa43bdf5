//! Tessera's control plane: the tenant registry (Postgres or SQLite), API keys and access
//! tokens, model versions in an object store, aliases, quotas, the hash-chained audit trail,
//! and the `/v1` REST API with its OpenAPI document.
//!
//! [`run`] is the whole service; `tessera control-plane` parses [`ControlPlaneArgs`] and calls
//! it, and tests and `tessera dev` call it the same way.

pub mod api;
pub mod app;
pub mod archive;
pub mod auth;
pub mod config;
pub mod error;
pub mod metrics;
pub mod registry;
pub mod scheduler;
pub mod store;
pub mod types;

use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use api::{openapi, openapi_json};
pub use config::{Config, ControlPlaneArgs, Secret};

/// Runs the control plane until `shutdown` is cancelled: waits for and migrates the
/// database, opens the artifact store, bootstraps the platform admin, then serves `/v1`.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let database = registry::redact_url(config.database_url.expose());
    tracing::info!(?config, database = %database, "starting tessera control-plane");
    let registry = registry::Registry::connect(config.database_url.expose(), config.database_wait, &shutdown).await?;
    let store = store::ArtifactStore::open(&config.object_store).context("open the artifact store")?;
    let listen = config.listen;
    let app = app::App::new(registry.clone(), store, config).await.context("load token signing keys")?;
    if let Some(key) = app.bootstrap().await.context("bootstrap the platform tenant")? {
        // Shown once, on stdout (not in the logs, which are shipped elsewhere).
        println!("platform-admin API key (shown once, store it now): {key}");
    }
    let listener = TcpListener::bind(listen).await.with_context(|| format!("bind the http listener on {listen}"))?;
    let local = listener.local_addr().context("read the bound address")?;
    tracing::info!(protocol = "http", addr = %local, "listening");
    let service = api::router(app).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, service).with_graceful_shutdown(shutdown.cancelled_owned()).await.context("serve http")?;
    registry.close().await;
    tracing::info!("control plane stopped");
    Ok(())
}
