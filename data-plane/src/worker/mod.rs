//! `tessera worker`: serves inference for the replicas the control plane assigns to it.
//!
//! The worker registers its slices with the control plane over the agent protocol, fetches the
//! artifacts of its assignments into a local cache, loads them into the engine under each
//! tenant's namespace, reports their states in heartbeats, and serves the KServe v2 HTTP and
//! gRPC endpoints with bearer-credential checks. Every billable request is spooled to
//! `<data-dir>/usage/` before it is answered ([`usage`], [`usage::metering`]) and shipped to the
//! control plane with retries ([`usage::ship`]). When the control plane is away it keeps serving
//! what it has and spooling what it serves (static stability).

pub mod archive;
pub mod cache;
pub mod capture;
pub mod client;
pub mod config;
pub mod credentials;
pub mod gpu;
pub mod inventory;
pub mod reconcile;
pub mod retry;
pub mod saved;
pub mod session;
pub mod usage;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tessera_protocol::agent;
use tokio_util::sync::CancellationToken;

pub use config::{Isolation, WorkerArgs, WorkerConfig, WorkerToken};

use crate::auth::Authenticator;
use crate::engine::device::Device;
use crate::engine::manager::{ControlMode, ModelManager};
use crate::engine::repository::Repository;
use crate::runner as runners;
use crate::serve::net::tls::TlsAcceptor;
use crate::serve::server::{BoundAddrs, Listeners, ServerState};
use crate::worker::usage::Meter;

/// File in the data directory that keeps the generated worker id.
const WORKER_ID_FILE: &str = "worker-id";
/// Directory in the data directory that holds the usage spool.
const USAGE_DIR: &str = "usage";
/// How long the last usage shipment at shutdown may take.
const FINAL_SHIP: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs a worker until `shutdown` is cancelled; `on_bound` hears the bound addresses.
pub async fn run(
    config: WorkerConfig,
    shutdown: CancellationToken,
    on_bound: impl FnOnce(BoundAddrs),
) -> anyhow::Result<()> {
    crate::engine::backend::runtime::environment().map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("create the data directory {}", config.data_dir.display()))?;
    let worker_id = worker_id(&config.data_dir, config.worker_id.as_deref())?;
    let gpus = gpu::Gpus::open(&config.nvml)?;
    let nvml_slices = gpus.as_ref().map(gpu::Gpus::slices).unwrap_or_default();
    let inventory = inventory::Inventory::detect(
        config.cpu_slices,
        config.slice_memory_bytes,
        config.inventory.as_deref(),
        nvml_slices,
    )
    .map_err(anyhow::Error::msg)
    .context("build the slice inventory")?;
    let health = Arc::new(gpu::health::SliceHealth::new(&inventory.slices));
    let gpu_metrics = Arc::new(gpu::telemetry::GpuMetrics::new(health.clone()));
    let client = client::connect(&config.control_plane, &config.worker_token, config.ca_cert.as_deref())?;
    let tls = config.tls.clone().map(TlsAcceptor::watch).transpose().context("load the TLS certificate")?;
    let scheme = if tls.is_some() { "https" } else { "http" };

    let repository_dir = config.data_dir.join("repository");
    std::fs::create_dir_all(&repository_dir).context("create the repository directory")?;
    let repository = Repository::open(&repository_dir).map_err(anyhow::Error::msg)?;
    let mut manager = ModelManager::new(repository, ControlMode::Explicit)
        .with_response_cache(crate::engine::response_cache::ResponseCache::enabled(config.response_cache));
    let runners_stop = CancellationToken::new();
    let runners = config.runner_exe.clone().map(|exe| {
        let limits = inventory.slice_limits();
        for (slice, l) in &limits {
            tracing::info!(slice = %slice, cpus = ?l.cpus, memory_bytes = l.memory_bytes, device = ?l.device, "runner limits of the slice");
        }
        runners::Runners::new(
            runners::RunnersConfig {
                exe,
                limits,
                idle_exit: config.runner_idle_exit,
                shm_bytes: config.runner_shm_bytes,
                cuda_library_dirs: config.cuda_library_dirs.clone(),
            },
            runners_stop.clone(),
        )
    });
    if let Some(runners) = &runners {
        // Every assignment names its slice; this placement is never used by a worker.
        let nowhere = runners::Placement { tenant: "unplaced".into(), slice: "none".into() };
        manager = manager.with_runners(runners.clone(), nowhere);
    } else {
        manager = manager.with_slice_devices(in_process_devices(&inventory));
    }
    let manager = Arc::new(manager);
    let credentials = Arc::new(
        credentials::ControlPlaneCredentials::new(client.clone())
            .with_saved_token_keys(config.data_dir.join("token-keys.json")),
    );
    // Until the control plane names its gateways' key (`Registered`), identities signed with the
    // key of the worker token are trusted: gateways that hold that token sign with it.
    let own_identity = crate::auth::IdentityKey::from_token(config.worker_token.expose());
    let authenticator =
        Arc::new(Authenticator::new(credentials, config.key_cache_ttl).with_forwarded_identity(own_identity.clone()));
    let usage_dir = config.data_dir.join(USAGE_DIR);
    let meter =
        Arc::new(Meter::open(&usage_dir).with_context(|| format!("open the usage spool in {}", usage_dir.display()))?);
    let (capture, capture_queue) = capture::Capture::new(capture::QUEUE_CAPACITY);
    let tracer = crate::trace::Tracer::start(config.trace.clone()).context("start tracing")?;
    let mut state = ServerState::new(manager.clone(), false, config.max_input_size)
        .with_tracer(tracer)
        .with_auth(authenticator.clone())
        .with_usage_hook(meter.clone())
        .with_capture_hook(capture.clone())
        .with_tenant_limit(config.tenant_max_in_flight)
        .with_metrics_token(config.metrics_token.clone())
        .with_shared_memory(config.client_shm.with_models_in_runners(runners.is_some()))
        .with_metrics_source(gpu_metrics.clone())
        .with_metrics_source(authenticator.revocations());
    if let Some(runners) = runners {
        state = state.with_runners(runners);
    }
    let state = Arc::new(state);

    let source: Arc<dyn cache::ArtifactSource> = Arc::new(client.clone());
    let cache = cache::ArtifactCache::open(config.data_dir.join("cache"), source)
        .with_context(|| format!("open the artifact cache in {}", config.data_dir.display()))?;

    let addrs =
        BoundAddrs { http: Some(config.http_addr), grpc: Some(config.grpc_addr), metrics: Some(config.metrics_addr) };
    let listeners = Listeners::start(state.clone(), addrs, tls, &shutdown).await?;
    on_bound(listeners.bound);
    let saved = saved::SavedAssignments::in_dir(&config.data_dir);
    let metering = Arc::new(usage::metering::Metering::new(meter, &inventory));
    let on_apply: reconcile::OnApply = {
        let (metering, health, capture) = (metering.clone(), health.clone(), capture.clone());
        Arc::new(move |assignments| {
            metering.assigned(assignments);
            health.assigned(assignments);
            capture.assigned(assignments);
        })
    };
    let reconciler = reconcile::Reconciler::start(
        manager.clone(),
        Arc::new(cache),
        Some(saved),
        Some(on_apply),
        state.runners_arc(),
        shutdown.clone(),
    );
    let sampling = tokio::spawn(metering.clone().run(manager.clone(), shutdown.clone()));
    let shipper = usage::ship::Shipper::new(usage_dir, worker_id.clone(), client.clone());
    let shipping = tokio::spawn(shipper.run(config.usage_ship_interval, shutdown.clone()));
    // Capture batches flush on the usage shipment interval; they stop only after the listeners
    // drained (their own token), so the last requests' records ship too.
    let capture_stop = CancellationToken::new();
    let capture_shipper =
        capture::batch::Shipper { worker_id: worker_id.clone(), sink: client.clone(), counters: capture.counters() };
    let capture_task =
        tokio::spawn(capture_shipper.run(capture_queue, config.usage_ship_interval, capture_stop.clone()));
    // Ready only once registered and what the control plane assigned at start is installed.
    let (assigned_tx, assigned_rx) = tokio::sync::watch::channel(None);
    tokio::spawn(ready_when_installed(state.clone(), assigned_rx, reconciler.status(), shutdown.clone()));

    let register = registration(&worker_id, scheme, &config.advertise_host, listeners.bound, &inventory);
    tracing::info!(
        %worker_id,
        control_plane = %config.control_plane,
        http = %register.http_endpoint,
        grpc = %register.grpc_endpoint,
        slices = register.slices.len(),
        "worker started"
    );
    let (register_tx, register_rx) = tokio::sync::watch::channel(register);
    let monitor_stop = CancellationToken::new();
    let monitor = match &gpus {
        Some(gpus) => {
            let (layout_tx, layout_rx) = tokio::sync::watch::channel(gpus.slices());
            let relayout = Relayout {
                inventory,
                health: health.clone(),
                metering: metering.clone(),
                runners: state.runners_arc(),
                register: register_tx,
            };
            tokio::spawn(relayout.run(layout_rx));
            let monitor = gpus.monitor(health.clone(), gpu_metrics, layout_tx);
            Some(monitor.spawn(monitor_stop.clone()).context("start the NVML monitor thread")?)
        }
        None => None,
    };
    let reports = session::Reports {
        register: register_rx,
        unhealthy: health.subscribe(),
        assigned: assigned_tx,
        auth: authenticator,
        own_identity,
    };
    session::run(client, reports, reconciler, shutdown.clone()).await;
    monitor_stop.cancel();
    if let Some(thread) = monitor {
        // The thread notices within one event wait (half a second).
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    listeners.drain(&state).await;
    capture_stop.cancel();
    let _ = capture_task.await;
    // Runners stop only now: the requests drained above ran on them.
    runners_stop.cancel();
    // In-flight requests are spooled now; add the last execution deltas and slice time, then
    // try once more to deliver everything (what is left ships after the next start).
    if let Ok(sampler) = sampling.await {
        metering.flush(sampler, &manager).await;
    }
    if let Ok(mut shipper) = shipping.await {
        match tokio::time::timeout(FINAL_SHIP, shipper.ship_all(&CancellationToken::new())).await {
            Ok(Ok(())) => tracing::info!("usage delivered"),
            Ok(Err(e)) => tracing::warn!(error = %e, "usage not delivered; it ships after the next start"),
            Err(_) => tracing::warn!("usage not delivered in time; it ships after the next start"),
        }
    }
    Ok(())
}

/// The devices of the slices when models load inside the worker: CPU slices have no GPU, and a
/// GPU or MIG slice cannot be kept to its device (only a runner's `CUDA_VISIBLE_DEVICES` can).
/// Marks the server started (ready) once the control plane's first assignment set after
/// registering is applied and settled ([`reconcile::WorkerStatus::settled`]).
async fn ready_when_installed(
    state: Arc<ServerState>,
    mut assigned: tokio::sync::watch::Receiver<Option<u64>>,
    mut status: tokio::sync::watch::Receiver<reconcile::WorkerStatus>,
    shutdown: CancellationToken,
) {
    let generation = tokio::select! {
        () = shutdown.cancelled() => return,
        first = assigned.wait_for(Option::is_some) => match first.ok().and_then(|g| *g) {
            Some(generation) => generation,
            None => return,
        },
    };
    tokio::select! {
        () = shutdown.cancelled() => {}
        settled = status.wait_for(|s| s.settled(generation)) => {
            if settled.is_ok() {
                state.mark_started();
                tracing::info!(generation, "worker ready: registered and its assignments installed");
            }
        }
    }
}

fn in_process_devices(inventory: &inventory::Inventory) -> std::collections::HashMap<String, Device> {
    inventory
        .slices
        .iter()
        .map(|s| {
            let slice = s.id.clone();
            let device = match s.kind {
                inventory::SliceKind::Cpu => Device::CpuSlice { slice },
                inventory::SliceKind::Gpu | inventory::SliceKind::Mig => Device::Unconfined { slice },
            };
            (s.id.clone(), device)
        })
        .collect()
}

/// Follows the MIG layout: when the monitor reads new GPU slices, the inventory, the slices'
/// health and metering take them and the session registers them.
struct Relayout {
    inventory: inventory::Inventory,
    health: Arc<gpu::health::SliceHealth>,
    metering: Arc<usage::metering::Metering>,
    /// Runners take the new slices' limits and devices (none when models run in-process).
    runners: Option<Arc<runners::Runners>>,
    /// The session receives; a new message makes it register again.
    register: tokio::sync::watch::Sender<agent::Register>,
}

impl Relayout {
    async fn run(mut self, mut layout: tokio::sync::watch::Receiver<Vec<inventory::SliceSpec>>) {
        // Ends when the monitor stops (it holds the sender).
        while layout.changed().await.is_ok() {
            let gpu_slices = layout.borrow_and_update().clone();
            self.inventory = self.inventory.with_gpu_slices(gpu_slices);
            self.health.set_slices(&self.inventory.slices);
            self.metering.set_slices(&self.inventory);
            if let Some(runners) = &self.runners {
                runners.set_slice_limits(self.inventory.slice_limits());
            }
            let slices = self.inventory.to_proto();
            self.register.send_modify(|r| r.slices = slices);
        }
    }
}

/// The `Register` message: id, the endpoints clients reach (HTTP ones as `scheme://`, `https`
/// when the listeners speak TLS), the slices offered.
fn registration(
    worker_id: &str,
    scheme: &str,
    host: &str,
    bound: BoundAddrs,
    inventory: &inventory::Inventory,
) -> agent::Register {
    let url =
        |addr: Option<SocketAddr>| addr.map(|a| format!("{scheme}://{}", advertised(host, a))).unwrap_or_default();
    agent::Register {
        worker_id: worker_id.to_string(),
        http_endpoint: url(bound.http),
        grpc_endpoint: bound.grpc.map(|a| advertised(host, a)).unwrap_or_default(),
        metrics_endpoint: url(bound.metrics),
        slices: inventory.to_proto(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        labels: Default::default(),
    }
}

/// `host:port` as clients reach a bound address (IPv6 hosts bracketed).
fn advertised(host: &str, bound: SocketAddr) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{}", bound.port())
    } else {
        format!("{host}:{}", bound.port())
    }
}

/// The worker id: the one given, else the one kept in the data directory, else a new one
/// (written there for the next start).
fn worker_id(data_dir: &Path, given: Option<&str>) -> anyhow::Result<String> {
    if let Some(id) = given {
        return config::parse_worker_id(id).map_err(|e| anyhow::anyhow!("invalid --worker-id '{id}': {e}"));
    }
    let path = data_dir.join(WORKER_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim();
            config::parse_worker_id(id)
                .map_err(|e| anyhow::anyhow!("{} holds an invalid worker id: {e}", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = uuid::Uuid::new_v4().to_string();
            std::fs::write(&path, format!("{id}\n")).with_context(|| format!("write {}", path.display()))?;
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_id_is_generated_once_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = worker_id(dir.path(), None).expect("generated");
        assert_eq!(worker_id(dir.path(), None).expect("kept"), first);
        assert_eq!(worker_id(dir.path(), Some("w-7")).expect("given"), "w-7");
        std::fs::write(dir.path().join(WORKER_ID_FILE), "../../x").expect("write");
        assert!(worker_id(dir.path(), None).is_err());
    }

    /// Whether `task` is still waiting after a while (paused time: as long as it takes).
    async fn waits(task: &mut tokio::task::JoinHandle<()>) -> bool {
        tokio::time::timeout(std::time::Duration::from_secs(5), task).await.is_err()
    }

    /// Not ready before registering, nor while the first assigned set is loading; ready once
    /// it is installed (a failed replica counts as settled: it is reported, not waited for).
    #[tokio::test(start_paused = true)]
    async fn ready_only_after_registering_and_installing_the_first_assignments() {
        let dir = tempfile::tempdir().expect("tempdir");
        let manager = ModelManager::new(Repository::open(dir.path()).expect("a repository"), ControlMode::None);
        let state = Arc::new(ServerState::new(Arc::new(manager), false, 1 << 20));
        let (assigned_tx, assigned_rx) = tokio::sync::watch::channel(None);
        let (status_tx, status_rx) = tokio::sync::watch::channel(reconcile::WorkerStatus::default());
        let mut task =
            tokio::spawn(ready_when_installed(state.clone(), assigned_rx, status_rx, CancellationToken::new()));
        let replica = |state: agent::ReplicaState| agent::ReplicaStatus {
            replica_id: "r1".into(),
            state: state.into(),
            ..Default::default()
        };

        assert!(waits(&mut task).await && !state.is_ready(), "not registered yet");
        assigned_tx.send_replace(Some(3));
        assert!(waits(&mut task).await && !state.is_ready(), "the set is not applied yet");
        status_tx.send_replace(reconcile::WorkerStatus {
            applied_generation: 3,
            replicas: vec![replica(agent::ReplicaState::Loading)],
        });
        assert!(waits(&mut task).await && !state.is_ready(), "its replica is loading");
        status_tx.send_replace(reconcile::WorkerStatus {
            applied_generation: 3,
            replicas: vec![replica(agent::ReplicaState::Ready)],
        });
        task.await.expect("the task ends");
        assert!(state.is_ready());
    }

    #[test]
    fn advertised_endpoints() {
        let bound: SocketAddr = "0.0.0.0:8000".parse().expect("addr");
        assert_eq!(advertised("10.0.0.5", bound), "10.0.0.5:8000");
        assert_eq!(advertised("::1", bound), "[::1]:8000");
        assert_eq!(advertised("worker-3.internal", bound), "worker-3.internal:8000");
    }
}
