//! `tessera serve`: binds the HTTP, gRPC and metrics listeners, loads the repository, and runs
//! until shutdown. [`ServerState`] and [`Listeners`] are shared with `tessera worker`, which
//! turns authentication on and keys models by tenant.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use tessera_protocol::inference::{ModelConfig, ModelStatistics};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{Authenticator, Principal, Role};
use crate::engine::manager::{ControlMode, ModelManager, scoped_key};
use crate::engine::model::LoadedModel;
use crate::engine::repository::Repository;
use crate::engine::response_cache::{CacheLimits, ResponseCache};
use crate::error::{Error, Result};
use crate::runner::{Placement, Runners, RunnersConfig};
use crate::serve::capture::CaptureHook;
use crate::serve::facade::UsageHook;
use crate::serve::metrics::{MetricsSource, MetricsToken};
use crate::serve::net::tls::{CertFiles, TlsAcceptor};
use crate::serve::shared_memory::{SharedMemory, ShmPolicy};
use crate::serve::tenant_gate::TenantGate;
use crate::trace::{Trace, TraceConfig, Tracer};

/// Every extension this server may list in server metadata; the shared-memory ones last, so
/// each set below is a prefix.
const ALL_EXTENSIONS: [&str; 12] = [
    "classification",
    "sequence",
    "sequence(string_id)",
    "binary_tensor_data",
    "parameters",
    "model_repository",
    "model_configuration",
    "statistics",
    "logging",
    "trace",
    "system_shared_memory",
    "cuda_shared_memory",
];
/// Extensions this server implements, as listed in server metadata.
pub const EXTENSIONS: &[&str] = ALL_EXTENSIONS.split_at(10).0;
/// [`EXTENSIONS`] with system shared memory, when clients may use it.
const EXTENSIONS_WITH_SHM: &[&str] = ALL_EXTENSIONS.split_at(11).0;
/// [`EXTENSIONS_WITH_SHM`] with CUDA shared memory, when the CUDA driver is here too.
const EXTENSIONS_WITH_CUDA_SHM: &[&str] = &ALL_EXTENSIONS;

/// Default `--http-max-input-size`, Triton's 64 MiB.
pub const DEFAULT_MAX_INPUT_SIZE: usize = 64 * 1024 * 1024;

/// Everything `serve` needs; built from the CLI.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Model repository directory.
    pub model_repository: PathBuf,
    /// HTTP listen address; `None` disables HTTP.
    pub http_addr: Option<SocketAddr>,
    /// gRPC listen address; `None` disables gRPC.
    pub grpc_addr: Option<SocketAddr>,
    /// Metrics listen address; `None` disables metrics.
    pub metrics_addr: Option<SocketAddr>,
    /// Model control mode.
    pub control_mode: ControlMode,
    /// Models to load at start in explicit mode (`*` = all).
    pub load_models: Vec<String>,
    /// Poll interval in poll mode.
    pub poll_interval: Duration,
    /// Ready only when every model is ready.
    pub strict_readiness: bool,
    /// Exit when a model fails to load at start.
    pub exit_on_error: bool,
    /// Largest accepted request body (HTTP) or message (gRPC).
    pub max_input_size: usize,
    /// Run the models in a runner process started from this `tessera` binary, as workers do,
    /// instead of in this process.
    pub runner_exe: Option<PathBuf>,
    /// Bytes of each of the runner's shared-memory arenas (0: none).
    pub runner_shm_bytes: usize,
    /// Bearer token `/metrics` requires; `None`: open.
    pub metrics_token: Option<MetricsToken>,
    /// Clients may register and use system and CUDA shared memory regions (Triton's
    /// `--allow-client-shm`).
    pub allow_client_shm: bool,
    /// Certificate and key every listener presents; `None`: plain HTTP.
    pub tls: Option<CertFiles>,
    /// Bytes the response cache holds (one tenant here, so one limit); 0 turns it off.
    pub response_cache_bytes: u64,
    /// Tracing at start (`--trace-config`).
    pub trace: TraceConfig,
}

/// Shared state of one server: the model manager plus server-level flags.
pub struct ServerState {
    /// Loaded models.
    pub manager: Arc<ModelManager>,
    /// Server name in metadata.
    pub name: &'static str,
    /// Server version in metadata.
    pub version: &'static str,
    /// Largest accepted request.
    pub max_input_size: usize,
    strict_readiness: bool,
    /// False while shutting down.
    live: AtomicBool,
    /// True once start-up loading finished.
    started: AtomicBool,
    /// Checks callers' credentials; `None` (`serve`) leaves every endpoint open.
    auth: Option<Arc<Authenticator>>,
    /// Hears billable requests (a worker's usage meter); `None` (`serve`) meters nothing.
    usage: Option<Arc<dyn UsageHook>>,
    /// Hears sampled requests of deployments that capture (a worker's capture queue).
    capture: Option<Arc<dyn CaptureHook>>,
    /// The runner processes models run in; `None` when they run in this process.
    runners: Option<Arc<Runners>>,
    /// Each tenant's cap on requests in flight (workers); `None` (`serve`): no cap.
    tenant_gate: Option<TenantGate>,
    /// Bearer token the metrics listener requires; `None`: open.
    metrics_token: Option<MetricsToken>,
    /// Clients' system and CUDA shared memory regions.
    shared_memory: SharedMemory,
    /// More families the metrics endpoint renders (a worker's GPUs and slice health).
    metrics_sources: Vec<Arc<dyn MetricsSource>>,
    /// Trace settings and where traces go.
    tracer: Tracer,
}

impl ServerState {
    /// Creates state over a manager.
    pub fn new(manager: Arc<ModelManager>, strict_readiness: bool, max_input_size: usize) -> Self {
        Self {
            manager,
            name: "tessera",
            version: env!("CARGO_PKG_VERSION"),
            max_input_size,
            strict_readiness,
            live: AtomicBool::new(true),
            started: AtomicBool::new(false),
            auth: None,
            usage: None,
            capture: None,
            runners: None,
            tenant_gate: None,
            metrics_token: None,
            shared_memory: SharedMemory::new(ShmPolicy::serve(true).with_max_input_bytes(max_input_size as u64)),
            metrics_sources: Vec::new(),
            tracer: Tracer::disabled(),
        }
    }

    /// Traces requests as `tracer` says.
    pub fn with_tracer(mut self, tracer: Tracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// The trace settings and sink.
    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    /// The trace of a request to `model` (as the caller names it) that resolved to `loaded`:
    /// off, at the cost of one atomic load, unless some trace level is on and it is sampled.
    /// `traceparent` reads the request's header of that name (asked only in OpenTelemetry mode).
    #[inline]
    pub fn start_trace<'h>(
        &self,
        caller: Option<&Principal>,
        model: &str,
        loaded: &LoadedModel,
        traceparent: impl FnOnce() -> Option<&'h str>,
    ) -> Trace {
        if !self.tracer.armed() {
            return Trace::off();
        }
        self.tracer.sample(&model_key(caller, model), &loaded.spec.name, loaded.version, traceparent)
    }

    /// The manager key a trace setting's model names, refused as Triton refuses an unknown
    /// model. On a multi-tenant worker a platform admin names a tenant's model by its key,
    /// `<tenant id>/<model>`.
    pub fn trace_model<'m>(&self, model: Option<&'m str>) -> Result<Option<&'m str>> {
        match model {
            Some(name) if self.manager.get(name, None).is_err() => {
                Err(Error::invalid(format!("Request for unknown model : {name}")))
            }
            other => Ok(other),
        }
    }

    /// Replaces the shared memory registry with an empty one under `policy`.
    pub fn with_shared_memory(mut self, policy: ShmPolicy) -> Self {
        self.shared_memory = SharedMemory::new(policy.with_max_input_bytes(self.max_input_size as u64));
        self
    }

    /// Clients' system and CUDA shared memory regions.
    pub fn shared_memory(&self) -> &SharedMemory {
        &self.shared_memory
    }

    /// The extensions server metadata lists.
    pub fn extensions(&self) -> &'static [&'static str] {
        match (self.shared_memory.allowed(), self.shared_memory.cuda_allowed()) {
            (true, true) => EXTENSIONS_WITH_CUDA_SHM,
            (true, false) => EXTENSIONS_WITH_SHM,
            (false, _) => EXTENSIONS,
        }
    }

    /// Adds families to the metrics endpoint.
    pub fn with_metrics_source(mut self, source: Arc<dyn MetricsSource>) -> Self {
        self.metrics_sources.push(source);
        self
    }

    /// The extra metric families.
    pub fn metrics_sources(&self) -> &[Arc<dyn MetricsSource>] {
        &self.metrics_sources
    }

    /// Caps each tenant's inference requests in flight at `limit`.
    pub fn with_tenant_limit(mut self, limit: usize) -> Self {
        self.tenant_gate = Some(TenantGate::new(limit));
        self
    }

    /// The per-tenant cap, when one is set.
    pub fn tenant_gate(&self) -> Option<&TenantGate> {
        self.tenant_gate.as_ref()
    }

    /// Makes the metrics listener require `token` (`None` leaves it open).
    pub fn with_metrics_token(mut self, token: Option<MetricsToken>) -> Self {
        self.metrics_token = token;
        self
    }

    /// The token the metrics listener requires, if any.
    pub fn metrics_token(&self) -> Option<&MetricsToken> {
        self.metrics_token.as_ref()
    }

    /// Notes the runner processes models run in (for their metrics).
    pub fn with_runners(mut self, runners: Arc<Runners>) -> Self {
        self.runners = Some(runners);
        self
    }

    /// The runner processes, when models run in them.
    pub fn runners(&self) -> Option<&Runners> {
        self.runners.as_deref()
    }

    /// A shared handle on the runner processes, when models run in them.
    pub fn runners_arc(&self) -> Option<Arc<Runners>> {
        self.runners.clone()
    }

    /// Requires a bearer credential on every endpoint except health, and resolves model names
    /// inside the caller's tenant.
    pub fn with_auth(mut self, authenticator: Arc<Authenticator>) -> Self {
        self.auth = Some(authenticator);
        self
    }

    /// Tells `hook` of every inference request that reaches a tenant's model (a worker's
    /// usage meter).
    pub fn with_usage_hook(mut self, hook: Arc<dyn UsageHook>) -> Self {
        self.usage = Some(hook);
        self
    }

    /// The usage hook, on workers.
    pub fn usage(&self) -> Option<&dyn UsageHook> {
        self.usage.as_deref()
    }

    /// Offers every inference that reaches a tenant's model to `hook` for capture.
    pub fn with_capture_hook(mut self, hook: Arc<dyn CaptureHook>) -> Self {
        self.capture = Some(hook);
        self
    }

    /// The capture hook, on workers.
    pub fn capture(&self) -> Option<&dyn CaptureHook> {
        self.capture.as_deref()
    }

    /// Whether model keys are tenant-scoped (`<tenant>/<model>`): authentication is on.
    pub fn is_multi_tenant(&self) -> bool {
        self.auth.is_some()
    }

    /// Server liveness.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Relaxed)
    }

    /// Marks start-up loading as finished (readiness may now turn true).
    pub fn mark_started(&self) {
        self.started.store(true, Ordering::Relaxed);
    }

    /// Server readiness: live, start-up done, and (strict) every model ready.
    pub fn is_ready(&self) -> bool {
        self.is_live()
            && self.started.load(Ordering::Relaxed)
            && (!self.strict_readiness || self.manager.every_model_ready())
    }

    /// Authenticates the caller and checks it holds `needed`, when authentication is on
    /// (`read_header`, which reads a request header by name, is only called then); `Ok(None)`
    /// when it is off.
    pub async fn authorize<'h>(
        &self,
        read_header: impl Fn(&'static str) -> Option<&'h str>,
        needed: Role,
    ) -> Result<Option<Principal>> {
        let Some(auth) = &self.auth else { return Ok(None) };
        let principal = auth
            .authenticate_request(read_header("authorization"), read_header(crate::auth::forwarded::HEADER))
            .await?;
        require_role(Some(&principal), needed)?;
        Ok(Some(principal))
    }

    /// Refuses the model repository API when authentication is on: on a worker, the control
    /// plane decides what is loaded.
    pub fn check_model_control(&self) -> Result<()> {
        match self.auth {
            None => Ok(()),
            Some(_) => Err(Error::permission_denied("model control is managed by the control plane")),
        }
    }

    /// Looks a model up in the caller's namespace: the given version, or the default one.
    /// Another tenant's model is as unknown as a model that does not exist.
    pub fn model(&self, caller: Option<&Principal>, name: &str, version: Option<i64>) -> Result<Arc<LoadedModel>> {
        let key = model_key(caller, name);
        self.manager.get(&key, version).map_err(|e| unscoped(e, &key, name))
    }

    /// Ready versions of a model in the caller's namespace, ascending.
    pub fn ready_versions(&self, caller: Option<&Principal>, name: &str) -> Result<Vec<Arc<LoadedModel>>> {
        let key = model_key(caller, name);
        self.manager.ready_versions(&key).map_err(|e| unscoped(e, &key, name))
    }

    /// Model metadata JSON (shared shape with gRPC).
    pub fn model_metadata(&self, caller: Option<&Principal>, model: &str, version: Option<i64>) -> Result<Value> {
        let loaded = self.model(caller, model, version)?;
        let versions: Vec<String> = match version {
            Some(v) => vec![v.to_string()],
            None => self.ready_versions(caller, model)?.iter().map(|m| m.version.to_string()).collect(),
        };
        let spec = &loaded.spec;
        let tensors = |list: &[crate::engine::model_spec::TensorSpec]| -> Vec<Value> {
            list.iter()
                .map(|t| json!({ "name": t.name, "datatype": t.datatype.as_wire(), "shape": spec.full_shape(&t.dims) }))
                .collect()
        };
        Ok(json!({
            "name": spec.name,
            "versions": versions,
            "platform": spec.platform(),
            "inputs": tensors(&spec.inputs),
            "outputs": tensors(&spec.outputs),
        }))
    }

    /// Statistics for all of the caller's models, one model, or one version: any key of the
    /// tenant may read them (Triton's tools, `perf_analyzer` and Model Analyzer, read them with
    /// the key they infer with), and only its own tenant's.
    pub fn statistics(
        &self,
        caller: Option<&Principal>,
        model: Option<&str>,
        version: Option<i64>,
    ) -> Result<Vec<ModelStatistics>> {
        if self.auth.is_some() {
            require_role(caller, Role::Inference)?;
        }
        let models = match (model, version) {
            (None, _) => match caller {
                None => self.manager.all_ready(),
                Some(principal) => self.tenant_ready(principal),
            },
            (Some(m), Some(v)) => vec![self.model(caller, m, Some(v))?],
            (Some(m), None) => self.ready_versions(caller, m)?,
        };
        Ok(models.iter().map(|m| m.stats.snapshot(&m.spec.name, &m.version.to_string())).collect())
    }

    /// Every ready model version in the caller's tenant.
    fn tenant_ready(&self, principal: &Principal) -> Vec<Arc<LoadedModel>> {
        let prefix = scoped_key(Some(&principal.tenant_id), "");
        self.manager
            .installed()
            .into_iter()
            .filter(|(key, _)| key.starts_with(&prefix))
            .flat_map(|(key, _)| self.manager.ready_versions(&key).unwrap_or_default())
            .collect()
    }
}

/// The manager key of `name` for `caller`: borrowed as is when authentication is off, so
/// `serve` allocates nothing per request.
pub fn model_key<'a>(caller: Option<&Principal>, name: &'a str) -> Cow<'a, str> {
    match caller {
        None => Cow::Borrowed(name),
        Some(principal) => Cow::Owned(scoped_key(Some(&principal.tenant_id), name)),
    }
}

/// Names the model in an error as the caller does (the namespace is the server's business).
fn unscoped(mut err: Error, key: &str, name: &str) -> Error {
    if key != name {
        err.message = err.message.replace(key, name);
    }
    err
}

/// Refuses a caller whose role is below `needed` (a missing caller passes: authentication off).
pub fn require_role(caller: Option<&Principal>, needed: Role) -> Result<()> {
    match caller {
        Some(principal) if principal.role < needed => Err(Error::permission_denied(format!(
            "this needs the '{needed}' role or above; the credential has '{}'",
            principal.role
        ))),
        _ => Ok(()),
    }
}

/// Reads the load API's parameters: `config` (a JSON model config) is honoured; `file:` overrides
/// are refused, since writing client files into the repository is how CVE-2023-31036 happened.
pub fn load_config_override<'a>(
    params: impl IntoIterator<Item = (&'a str, Option<String>)>,
) -> Result<Option<ModelConfig>> {
    let mut config = None;
    for (key, text) in params {
        if key.starts_with("file:") {
            return Err(Error::unsupported(format!("load parameter '{key}': file overrides are not supported")));
        }
        if key == "config" {
            let text = text.ok_or_else(|| Error::invalid("load parameter 'config' must be a JSON string"))?;
            let parsed = tessera_protocol::model_config::from_json(&text)
                .map_err(|e| Error::invalid(format!("load parameter 'config' is not a valid model config: {e}")))?;
            config = Some(parsed);
        }
    }
    Ok(config)
}

/// Addresses the server actually bound (port 0 resolved).
#[derive(Debug, Clone, Copy, Default)]
pub struct BoundAddrs {
    /// HTTP.
    pub http: Option<SocketAddr>,
    /// gRPC.
    pub grpc: Option<SocketAddr>,
    /// Metrics.
    pub metrics: Option<SocketAddr>,
}

async fn bind(addr: Option<SocketAddr>, protocol: &'static str) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = addr else { return Ok(None) };
    let listener = TcpListener::bind(addr).await.with_context(|| format!("bind the {protocol} listener on {addr}"))?;
    let local = listener.local_addr().context("read the bound address")?;
    tracing::info!(protocol, addr = %local, "listening");
    Ok(Some(listener))
}

/// Runs `serve` until `shutdown` is cancelled; `on_bound` hears the bound addresses.
pub async fn run(
    config: ServeConfig,
    shutdown: CancellationToken,
    on_bound: impl FnOnce(BoundAddrs),
) -> anyhow::Result<()> {
    if config.load_models.len() > 1 && config.load_models.iter().any(|m| m == "*") {
        anyhow::bail!("--load-model '*' loads every model, so it must be the only --load-model given");
    }
    crate::engine::backend::runtime::environment().map_err(anyhow::Error::msg)?;
    let repository = Repository::open(&config.model_repository).map_err(anyhow::Error::msg)?;
    let limits = CacheLimits { total_bytes: config.response_cache_bytes, tenant_bytes: config.response_cache_bytes };
    let mut manager =
        ModelManager::new(repository, config.control_mode).with_response_cache(ResponseCache::enabled(limits));
    let runners_stop = CancellationToken::new();
    let runners = config.runner_exe.map(|exe| {
        let config = RunnersConfig {
            exe,
            limits: Default::default(),
            idle_exit: crate::runner::DEFAULT_IDLE_EXIT,
            shm_bytes: config.runner_shm_bytes,
            // Its runner inherits serve's environment, `LD_LIBRARY_PATH` included.
            cuda_library_dirs: Vec::new(),
        };
        Runners::new(config, runners_stop.clone())
    });
    if let Some(runners) = &runners {
        let placement = Placement { tenant: "serve".into(), slice: "local".into() };
        manager = manager.with_runners(runners.clone(), placement);
    }
    let manager = Arc::new(manager);
    let tracer = Tracer::start(config.trace.clone()).context("start tracing")?;
    let mut state = ServerState::new(manager.clone(), config.strict_readiness, config.max_input_size)
        .with_tracer(tracer)
        .with_metrics_token(config.metrics_token.clone())
        .with_shared_memory(ShmPolicy::serve(config.allow_client_shm).with_models_in_runners(runners.is_some()));
    if let Some(runners) = runners {
        state = state.with_runners(runners);
    }
    let state = Arc::new(state);

    let tls = config.tls.map(TlsAcceptor::watch).transpose().context("load the TLS certificate")?;
    let addrs = BoundAddrs { http: config.http_addr, grpc: config.grpc_addr, metrics: config.metrics_addr };
    let listeners = Listeners::start(state.clone(), addrs, tls, &shutdown).await?;
    on_bound(listeners.bound);

    let failed = manager.load_startup(&config.load_models).await;
    if !failed.is_empty() && config.exit_on_error {
        shutdown.cancel();
        listeners.tasks.close();
        listeners.tasks.wait().await;
        anyhow::bail!("models failed to load at start (--exit-on-error): {}", failed.join(", "));
    }
    state.mark_started();
    tracing::info!(ready = state.is_ready(), failed = failed.len(), "server started");

    if config.control_mode == ControlMode::Poll {
        let (manager, token, interval) = (manager.clone(), shutdown.clone(), config.poll_interval);
        listeners.tasks.spawn(async move {
            loop {
                tokio::select! {
                    () = token.cancelled() => break,
                    () = tokio::time::sleep(interval) => manager.poll_once().await,
                }
            }
        });
    }
    shutdown.cancelled().await;
    listeners.drain(&state).await;
    // Runners stop only now: the requests drained above ran on them.
    runners_stop.cancel();
    Ok(())
}

/// The HTTP, gRPC and metrics servers of one [`ServerState`] (`serve` and `worker` share them).
pub struct Listeners {
    /// Addresses bound (port 0 resolved).
    pub bound: BoundAddrs,
    /// The server tasks; more may be spawned here to be awaited on shutdown.
    pub tasks: tokio_util::task::TaskTracker,
}

impl Listeners {
    /// Binds the addresses given (`None` = that protocol off) and starts serving them, over
    /// TLS when `tls` is given, until `shutdown` is cancelled.
    pub async fn start(
        state: Arc<ServerState>,
        addrs: BoundAddrs,
        tls: Option<TlsAcceptor>,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Self> {
        let http = bind(addrs.http, "http").await?;
        let grpc = bind(addrs.grpc, "grpc").await?;
        let metrics = bind(addrs.metrics, "metrics").await?;
        let local = |l: &Option<TcpListener>| l.as_ref().and_then(|l| l.local_addr().ok());
        let bound = BoundAddrs { http: local(&http), grpc: local(&grpc), metrics: local(&metrics) };

        let tasks = tokio_util::task::TaskTracker::new();
        if let Some(listener) = http {
            let router = crate::serve::http::router(state.clone());
            tasks.spawn(crate::serve::http::serve(listener, router, shutdown.clone(), tls.clone()));
        }
        if let Some(listener) = grpc {
            tasks.spawn(crate::serve::grpc::serve(listener, state.clone(), shutdown.clone(), tls.clone()));
        }
        if let Some(listener) = metrics {
            let router = crate::serve::metrics::router(state.clone());
            tasks.spawn(crate::serve::http::serve(listener, router, shutdown.clone(), tls));
        }
        Ok(Self { bound, tasks })
    }

    /// After shutdown was cancelled: stops answering liveness and waits (up to 30 s) for
    /// in-flight requests.
    pub async fn drain(self, state: &ServerState) {
        state.live.store(false, Ordering::Relaxed);
        tracing::info!("shutting down: draining in-flight requests");
        self.tasks.close();
        if tokio::time::timeout(Duration::from_secs(30), self.tasks.wait()).await.is_err() {
            tracing::warn!("in-flight requests did not finish within 30 s; exiting anyway");
        }
    }
}
