//! Tessera's control plane: the tenant registry (Postgres or SQLite), API keys and access
//! tokens, model versions in an object store, aliases, quotas, the hash-chained audit trail,
//! deployments and their scheduler, usage metering, prices and invoices, the agent gRPC service
//! workers connect to, and the `/v1` REST API with its OpenAPI document (REST and gRPC share one
//! listener).
//!
//! [`run`] is the whole service; `tessera control-plane` parses [`ControlPlaneArgs`] and calls
//! it, and tests and `tessera dev` call it the same way.

pub mod agent;
pub mod api;
pub mod app;
pub mod archive;
pub mod audit_checkpoints;
pub mod auth;
pub mod capture;
pub mod config;
pub mod console;
pub mod deployments;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod kinds;
pub mod locks;
pub mod metrics;
pub mod model_config;
pub mod onnx;
pub mod registry;
pub mod scheduler;
pub mod serve;
pub mod signature;
pub mod sso;
pub mod states;
pub mod store;
pub mod tick;
pub mod types;
pub mod uploads;
pub mod usage;
pub mod webhooks;

use std::net::SocketAddr;

use anyhow::Context;
use tessera_protocol::tls::TlsAcceptor;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use api::{openapi, openapi_json};
pub use config::{Config, ControlPlaneArgs, Secret};

/// Runs the control plane until `shutdown` is cancelled: waits for and migrates the
/// database, opens the artifact store, bootstraps the platform admin, then serves `/v1` and
/// the agent service and runs the scheduler.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_with(config, shutdown, |_| {}).await
}

/// [`run`], calling `on_bound` with the address the listener got (port 0 picks one).
pub async fn run_with(
    config: Config,
    shutdown: CancellationToken,
    on_bound: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let database = registry::redact_url(config.database_url.expose());
    tracing::info!(?config, database = %database, "starting tessera control-plane");
    // Before the database wait: a bad certificate fails the start at once.
    let tls = config.tls.clone().map(TlsAcceptor::watch).transpose().context("load the TLS certificate")?;
    let registry = registry::Registry::connect(config.database_url.expose(), config.database_wait, &shutdown).await?;
    let store = store::ArtifactStore::open(&config.object_store).context("open the artifact store")?;
    let listen = config.listen;
    let metrics_listen = config.metrics_listen;
    let agent_listen = config.agent_listen;
    let app = app::App::new(registry.clone(), store, config).await.context("load token signing keys")?;
    if let Some(key) = app.bootstrap().await.context("bootstrap the platform tenant")? {
        // Shown once, on stdout (not in the logs, which are shipped elsewhere).
        println!("platform-admin API key (shown once, store it now): {key}");
    }
    let listener = TcpListener::bind(listen).await.with_context(|| format!("bind the http listener on {listen}"))?;
    let local = listener.local_addr().context("read the bound address")?;
    tracing::info!(protocol = "http", addr = %local, "listening");
    let metrics_listener = match metrics_listen {
        Some(addr) => {
            let l = TcpListener::bind(addr).await.with_context(|| format!("bind the metrics listener on {addr}"))?;
            tracing::info!(protocol = "metrics", addr = %l.local_addr().context("read the bound address")?, "listening");
            Some(l)
        }
        None => None,
    };
    let agent_listener = match agent_listen {
        Some(addr) => {
            let l = TcpListener::bind(addr).await.with_context(|| format!("bind the agent listener on {addr}"))?;
            tracing::info!(protocol = "agent", addr = %l.local_addr().context("read the bound address")?, "listening");
            Some(l)
        }
        None => None,
    };
    if app.config.worker_token.is_none() {
        tracing::warn!("no --worker-token: workers cannot connect");
    }
    on_bound(local);
    // Background parts stop with `shutdown`, or when the server stops on its own.
    let stop = shutdown.child_token();
    let scheduler = tokio::spawn(scheduler::run::run_scheduler(app.clone(), stop.clone()));
    let retention = tokio::spawn(usage::run_retention(app.clone(), stop.clone()));
    let webhooks = tokio::spawn(webhooks::dispatch::run_dispatcher(app.clone(), stop.clone()));
    let limits = serve::ConnLimits {
        header_read_timeout: app.config.client_timeout,
        answer_stall: app.config.client_timeout,
        ..serve::ConnLimits::default()
    };
    let checkpoints = tokio::spawn(audit_checkpoints::run_checkpoints(
        app.registry.clone(),
        app.store.clone(),
        app.config.audit_signing_key.clone(),
        app.config.audit_checkpoint_interval,
        stop.clone(),
    ));
    let revocations =
        tokio::spawn(auth::revocations::run_revocations(app.revocations.clone(), app.registry.clone(), stop.clone()));
    let metrics = metrics_listener.map(|l| {
        let router = api::metrics_router(app.config.metrics_token.clone());
        tokio::spawn(serve::serve(l, router, stop.clone(), limits, tls.clone()))
    });
    let agent_router = agent::routes(app.clone(), stop.clone());
    let (router, agent) = match agent_listener {
        // Alone on its listener, the agent service is not reachable through the API's port.
        Some(l) => (
            api::router(app).merge(agent::elsewhere_routes()),
            Some(tokio::spawn(serve::serve(l, agent_router, stop.clone(), limits, tls.clone()))),
        ),
        None => (api::router(app).merge(agent_router), None),
    };
    serve::serve(listener, router, stop.clone(), limits, tls).await;
    stop.cancel();
    let _ = scheduler.await;
    let _ = retention.await;
    let _ = webhooks.await;
    let _ = checkpoints.await;
    let _ = revocations.await;
    for listener in [metrics, agent].into_iter().flatten() {
        let _ = listener.await;
    }
    registry.close().await;
    tracing::info!("control plane stopped");
    Ok(())
}
