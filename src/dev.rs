//! `tessera dev`: the whole product on one machine, in one process, on embedded defaults —
//! the control plane on a SQLite file, a local object-store directory, one worker — with a
//! demo tenant and the demo model `simple` deployed, and examples printed that work as
//! printed.
//!
//! Everything lives under `--data-dir` (default `./.tessera`):
//! `registry.db`, `objects/`, `worker/` (worker id, artifact cache), `models/simple.onnx`,
//! `secrets.json` (platform-admin key, worker token, API key pepper; mode 0600), with `--tls`
//! `tls/` (a local CA `ca.pem`, and `cert.pem`, `key.pem` for localhost that every listener
//! presents; kept while valid),
//! `audit-signing-key.pem` (signs audit checkpoints; mode 0600) and `dev-credentials.json`
//! (the demo tenant's keys; mode 0600). A restart reuses all of it:
//! provisioning looks before it creates, so nothing is made twice.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use futures::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tessera_data_plane::BoundAddrs;
use tessera_data_plane::gateway::{GatewayAddrs, GatewayArgs};
use tessera_data_plane::serve::net::listen::PortArgs;
use tessera_data_plane::tools::onnx_builder;
use tessera_data_plane::worker::{WorkerConfig, WorkerToken};
use tessera_protocol::tls::{self, CaArgs, TlsArgs, local::LocalFiles};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::client::api::{ApiClient, ApiError, segment};
use crate::client::deploy;
use crate::client::models::{self, Artifact, Format};
use crate::client::settings::write_private;

/// The demo tenant.
pub const DEMO_TENANT: &str = "demo";
/// The demo model (and its deployment).
pub const DEMO_MODEL: &str = "simple";
/// The alias the demo deployment follows.
pub const DEMO_ALIAS: &str = "production";
/// The last line of the banner: scripts wait for it.
pub const READY_LINE: &str = "tessera dev is ready (Ctrl-C stops it)";

/// `tessera dev` flags.
#[derive(Debug, clap::Args)]
pub struct DevArgs {
    /// Directory for all state (registry, artifacts, worker cache, keys); a restart reuses it.
    #[arg(long, env = "TESSERA_DATA_DIR", default_value = "./.tessera")]
    pub data_dir: PathBuf,
    /// Address of the control plane (REST API, docs, console); port 0 picks a free one.
    #[arg(long, env = "TESSERA_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Worker ports (HTTP, gRPC, metrics), bound on the control plane's address.
    #[command(flatten)]
    pub ports: tessera_data_plane::serve::net::listen::PortArgs,
    /// Gateway ports: the one endpoint applications call.
    #[command(flatten)]
    pub gateway_ports: GatewayPorts,
    /// How long to wait for the demo deployment to become ready, in seconds.
    #[arg(long, default_value_t = 300)]
    pub ready_timeout_secs: u64,
    /// Built web console to serve at `/` (`scripts/setup-web.sh` builds `web/dist`); default:
    /// `web/dist` here or in the source tree, when built.
    #[arg(long, env = "TESSERA_CONSOLE_DIR")]
    pub console_dir: Option<PathBuf>,
    /// Serve every listener over TLS with a local certificate for localhost, 127.0.0.1 and ::1
    /// (made in `<data-dir>/tls/`, reused while valid); clients trust its `ca.pem`.
    #[arg(long, env = "TESSERA_DEV_TLS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub tls: bool,
}

/// The gateway's ports in `tessera dev` (the worker keeps tritonserver's 8000-8002).
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayPorts {
    /// Gateway HTTP port; 0 picks a free one.
    #[arg(long, env = "TESSERA_GATEWAY_HTTP_PORT", default_value_t = 9000)]
    pub gateway_http_port: u16,
    /// Gateway gRPC port; 0 picks a free one.
    #[arg(long, env = "TESSERA_GATEWAY_GRPC_PORT", default_value_t = 9001)]
    pub gateway_grpc_port: u16,
    /// Gateway metrics port; 0 picks a free one.
    #[arg(long, env = "TESSERA_GATEWAY_METRICS_PORT", default_value_t = 9002)]
    pub gateway_metrics_port: u16,
}

/// Secrets generated at first start and kept in `secrets.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Secrets {
    platform_admin_key: String,
    worker_token: String,
    api_key_pepper: String,
    /// What the gateway presents to the control plane (absent from earlier `secrets.json`).
    #[serde(default)]
    gateway_token: String,
}

/// The demo tenant's keys, kept in `dev-credentials.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DevCredentials {
    /// Tenant name.
    pub tenant: String,
    /// Tenant-admin key: the CLI, the REST API.
    pub tenant_admin_key: String,
    /// Inference-only key: what applications use.
    pub inference_key: String,
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::fill(&mut buf[..]);
    hex::encode(buf)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Option<T>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(serde_json::from_str(&text).with_context(|| format!("read {}", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("encode JSON")?;
    write_private(path, text.as_bytes()).with_context(|| format!("write {}", path.display()))
}

impl Secrets {
    fn load_or_create(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("secrets.json");
        if let Some(mut secrets) = read_json::<Secrets>(&path)? {
            if secrets.gateway_token.is_empty() {
                secrets.gateway_token = random_hex(32);
                write_json(&path, &secrets)?;
            }
            return Ok(secrets);
        }
        let secrets = Secrets {
            platform_admin_key: tessera_control_plane::auth::keys::generate().key,
            worker_token: random_hex(32),
            api_key_pepper: random_hex(32),
            gateway_token: random_hex(32),
        };
        write_json(&path, &secrets)?;
        Ok(secrets)
    }
}

/// Parses the control plane's own flags, so `dev` configures it exactly as a user would.
#[derive(Debug, Parser)]
struct ControlPlaneFlags {
    #[command(flatten)]
    args: tessera_control_plane::ControlPlaneArgs,
}

fn control_plane_config(
    args: &DevArgs,
    dir: &Path,
    secrets: &Secrets,
    tls: Option<&LocalFiles>,
) -> anyhow::Result<tessera_control_plane::Config> {
    let database = format!("sqlite://{}", dir.join("registry.db").display());
    let objects = dir.join("objects").display().to_string();
    let audit_key = audit_signing_key(dir)?.display().to_string();
    let mut flags: Vec<String> = vec![
        "control-plane".into(),
        "--listen".into(),
        args.listen.to_string(),
        "--database-url".into(),
        database,
        "--object-store".into(),
        objects,
        // `--flag=value`: a secret kept in the data directory may begin with '-'.
        format!("--bootstrap-admin-key={}", secrets.platform_admin_key),
        format!("--api-key-pepper={}", secrets.api_key_pepper),
        format!("--worker-token={}", secrets.worker_token),
        format!("--gateway-token={}", secrets.gateway_token),
        "--audit-signing-key-file".into(),
        audit_key,
    ];
    // Deployments show the gateway as their endpoint (known here unless its ports are picked
    // at random).
    let gw = &args.gateway_ports;
    if gw.gateway_http_port != 0 {
        let host = reachable(SocketAddr::new(args.listen.ip(), gw.gateway_http_port));
        flags.push(format!("--gateway-url={}://{host}", scheme(tls.is_some())));
    }
    if gw.gateway_grpc_port != 0 {
        flags.push(format!(
            "--gateway-grpc-address={}",
            reachable(SocketAddr::new(args.listen.ip(), gw.gateway_grpc_port))
        ));
    }
    if let Some(tls) = tls {
        flags.extend(["--tls-cert".into(), path_text(&tls.pair.cert), "--tls-key".into(), path_text(&tls.pair.key)]);
    }
    let flags =
        ControlPlaneFlags::try_parse_from(flags).map_err(|e| anyhow::anyhow!("configure the control plane: {e}"))?;
    let mut config = flags.args.into_config()?;
    if let Some(dir) = &args.console_dir {
        config.console_dir = Some(dir.clone());
    }
    Ok(config)
}

/// The local certificate of `--tls` in `<dir>/tls/`: kept while valid, else made anew.
fn local_certificate(dir: &Path) -> anyhow::Result<LocalFiles> {
    let tls_dir = dir.join("tls");
    let (files, made) = tls::local::ensure(&tls_dir, &tls::local::LOOPBACK_HOSTS)
        .with_context(|| format!("make a local TLS certificate in {}", tls_dir.display()))?;
    tracing::info!(ca = %files.ca.display(), made, "local tls certificate");
    Ok(files)
}

/// The audit checkpoint signing key in the data directory, generated at first start. In
/// production it belongs somewhere the database's administrators cannot read.
fn audit_signing_key(dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("audit-signing-key.pem");
    if !path.exists() {
        let pem = tessera_control_plane::audit_checkpoints::CheckpointKey::generate().to_pem()?;
        write_private(&path, pem.as_bytes()).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(path)
}

/// A path as a flag value.
fn path_text(path: &Path) -> String {
    path.display().to_string()
}

/// `https` when the listeners speak TLS, else `http`.
fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// A reachable form of a bound address (`0.0.0.0` becomes `127.0.0.1`).
fn reachable(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() { SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port()) } else { addr }
}

fn worker_config(
    args: &DevArgs,
    dir: &Path,
    control_plane: SocketAddr,
    secrets: &Secrets,
    tls: Option<&LocalFiles>,
) -> WorkerConfig {
    let token = WorkerToken::new(secrets.worker_token.clone());
    let url = format!("{}://{control_plane}", scheme(tls.is_some()));
    let mut config = WorkerConfig::local(url, token, dir.join("worker"));
    config.tls = tls.map(|t| t.pair.clone());
    config.ca_cert = tls.map(|t| t.ca.clone());
    // The worker listens where the control plane does (loopback by default).
    let ip = args.listen.ip();
    [config.http_addr, config.grpc_addr, config.metrics_addr] = args.ports.on(ip);
    config.advertise_host = reachable(SocketAddr::new(ip, 0)).ip().to_string();
    // The demo shows the real process model: the tenant's models run in a runner process.
    config.runner_exe = std::env::current_exe().ok();
    config
}

fn gateway_args(args: &DevArgs, control_plane: SocketAddr, secrets: &Secrets, tls: Option<&LocalFiles>) -> GatewayArgs {
    let p = &args.gateway_ports;
    GatewayArgs {
        control_plane: format!("{}://{control_plane}", scheme(tls.is_some())),
        tls: TlsArgs { tls_cert: tls.map(|t| t.pair.cert.clone()), tls_key: tls.map(|t| t.pair.key.clone()) },
        ca: CaArgs { ca_cert: tls.map(|t| t.ca.clone()) },
        gateway_token: Some(WorkerToken::new(secrets.gateway_token.clone())),
        worker_token: None,
        gateway_id: Some("dev-gateway".into()),
        ports: PortArgs {
            http_port: p.gateway_http_port,
            grpc_port: p.gateway_grpc_port,
            metrics_port: p.gateway_metrics_port,
        },
        address: args.listen.ip(),
        key_cache_secs: 60,
        threads: None,
        upstream_http2: false,
        busy_poll_us: tessera_data_plane::serve::net::busy_poll::DEFAULT_WINDOW_US,
        metrics_token_file: None,
        metrics_token: None,
        max_request_bytes: tessera_data_plane::gateway::DEFAULT_MAX_REQUEST_BYTES,
        upstream_timeout_secs: tessera_data_plane::gateway::DEFAULT_UPSTREAM_TIMEOUT_SECS,
        usage_ship_interval_ms: tessera_data_plane::worker::config::DEFAULT_USAGE_SHIP_INTERVAL_MS,
    }
}

/// A service's end: its name and how it ended.
type Ended = (&'static str, anyhow::Result<()>);

/// One running service: its task and the token that stops it.
struct Service {
    task: JoinHandle<()>,
    stop: CancellationToken,
}

/// How long each service may take to stop after Ctrl-C.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

impl Service {
    /// Spawns `fut`, reporting its end (a panic included) on `ended`.
    fn spawn<F>(name: &'static str, stop: CancellationToken, fut: F, ended: mpsc::Sender<Ended>) -> Self
    where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let task = tokio::spawn(async move {
            let outcome = std::panic::AssertUnwindSafe(fut).catch_unwind().await;
            let outcome = outcome.unwrap_or_else(|_| Err(anyhow::anyhow!("panicked")));
            let _ = ended.send((name, outcome)).await;
        });
        Service { task, stop }
    }

    async fn shut_down(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(STOP_TIMEOUT, self.task).await;
    }
}

/// A service ended before it listened; why comes on the `ended` channel.
#[derive(Debug, thiserror::Error)]
#[error("the {0} did not start")]
struct NotStarted(&'static str);

/// The first service end, as the error it is (both should run until stopped).
async fn first_end(ended: &mut mpsc::Receiver<Ended>) -> anyhow::Error {
    match ended.recv().await {
        Some((name, Ok(()))) => anyhow::anyhow!("the {name} stopped unexpectedly"),
        Some((name, Err(e))) => e.context(format!("the {name} failed")),
        None => anyhow::anyhow!("the services ended"),
    }
}

/// What the banner shows.
struct Running {
    data_dir: PathBuf,
    control_plane: SocketAddr,
    worker: BoundAddrs,
    gateway: GatewayAddrs,
    credentials: DevCredentials,
    deployment: deploy::Deployment,
    secrets_file: PathBuf,
    /// The console directory in effect, when it holds a built console.
    console: Option<PathBuf>,
    /// The local CA clients trust, when the listeners speak TLS.
    ca: Option<PathBuf>,
}

/// Runs `tessera dev` until `shutdown` is cancelled (Ctrl-C).
pub async fn run(args: DevArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("create {}", args.data_dir.display()))?;
    let dir = args.data_dir.canonicalize().with_context(|| format!("resolve {}", args.data_dir.display()))?;
    let secrets = Secrets::load_or_create(&dir)?;
    let tls = if args.tls { Some(local_certificate(&dir)?) } else { None };
    // Each service reports its end here once; three at most.
    let (ended_tx, mut ended) = mpsc::channel(3);
    let (bound_tx, bound_rx) = oneshot::channel();
    let stop = CancellationToken::new();
    let config = control_plane_config(&args, &dir, &secrets, tls.as_ref())?;
    let console = config.console_dir.clone().filter(|d| d.join("index.html").is_file());
    let run = tessera_control_plane::run_with(config, stop.clone(), |addr| {
        let _ = bound_tx.send(addr);
    });
    let control_plane = Service::spawn("control plane", stop, run, ended_tx.clone());
    let mut services = Vec::new();
    let started = tokio::select! {
        () = shutdown.cancelled() => Ok(None),
        e = first_end(&mut ended) => Err(e),
        r = start(&args, &dir, &secrets, tls.as_ref(), bound_rx, &mut services, ended_tx) => r.map(Some),
    };
    let outcome = match started {
        // A service that failed while starting says why on `ended` (an address in use, say).
        Err(e) if e.is::<NotStarted>() => {
            Err(tokio::time::timeout(Duration::from_secs(5), first_end(&mut ended)).await.unwrap_or(e))
        }
        Ok(Some(mut running)) => {
            running.console = console;
            print_banner(&running);
            tokio::select! {
                () = shutdown.cancelled() => Ok(()),
                e = first_end(&mut ended) => Err(e),
            }
        }
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    };
    eprintln!("tessera dev: stopping");
    // The gateway, then the worker: each drains its requests while what is behind it still
    // answers.
    for service in services.into_iter().rev() {
        service.shut_down().await;
    }
    control_plane.shut_down().await;
    outcome
}

/// Starts the worker once the control plane listens, provisions the demo, and waits until
/// its deployment is ready.
async fn start(
    args: &DevArgs,
    dir: &Path,
    secrets: &Secrets,
    tls: Option<&LocalFiles>,
    control_plane_bound: oneshot::Receiver<SocketAddr>,
    services: &mut Vec<Service>,
    ended: mpsc::Sender<Ended>,
) -> anyhow::Result<Running> {
    let control_plane = reachable(control_plane_bound.await.map_err(|_| NotStarted("control plane"))?);
    let (bound_tx, bound_rx) = oneshot::channel();
    let stop = CancellationToken::new();
    let run =
        tessera_data_plane::worker::run(worker_config(args, dir, control_plane, secrets, tls), stop.clone(), |addrs| {
            let _ = bound_tx.send(addrs);
        });
    services.push(Service::spawn("worker", stop, run, ended.clone()));
    let worker = bound_rx.await.map_err(|_| NotStarted("worker"))?;
    let (bound_tx, bound_rx) = oneshot::channel();
    let stop = CancellationToken::new();
    let run =
        tessera_data_plane::gateway::run(gateway_args(args, control_plane, secrets, tls), stop.clone(), |addrs| {
            let _ = bound_tx.send(addrs);
        });
    services.push(Service::spawn("gateway", stop, run, ended));
    let gateway = bound_rx.await.map_err(|_| NotStarted("gateway"))?;
    let url = format!("{}://{control_plane}", scheme(tls.is_some()));
    let ca = tls.map(|t| t.ca.clone());
    let admin = ApiClient::new(&url, &secrets.platform_admin_key, ca.as_deref())?;
    let credentials = provision_tenant(&admin, dir).await?;
    let tenant = ApiClient::new(&url, &credentials.tenant_admin_key, ca.as_deref())?;
    provision_model(&tenant, dir).await?;
    let timeout = Duration::from_secs(args.ready_timeout_secs.max(1));
    let deployment = deploy::wait_ready(&tenant, DEMO_TENANT, DEMO_MODEL, timeout).await?;
    gateway_routes_demo(gateway, &credentials.inference_key, ca.as_deref()).await?;
    Ok(Running {
        data_dir: args.data_dir.clone(),
        control_plane,
        worker,
        gateway,
        credentials,
        deployment,
        secrets_file: dir.join("secrets.json"),
        console: None,
        ca,
    })
}

/// Waits until the gateway's route table holds the demo model (it follows the control plane
/// within about a second), so the printed examples work as printed.
async fn gateway_routes_demo(gateway: GatewayAddrs, key: &str, ca: Option<&Path>) -> anyhow::Result<()> {
    let url = format!("{}://{}/v2/models/{DEMO_MODEL}/ready", scheme(ca.is_some()), reachable(gateway.http));
    let tls = tessera_protocol::tls::client_config(ca)?;
    let client = reqwest::Client::builder().use_preconfigured_tls(tls).build().context("build an HTTP client")?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ready = client.get(&url).bearer_auth(key).send().await.is_ok_and(|r| r.status().is_success());
        if ready {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("the gateway did not route the demo model within 30 s ({url})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a key still works (a registry deleted under a kept credentials file does not).
async fn key_works(admin: &ApiClient, key: &str) -> anyhow::Result<bool> {
    let check = admin.with_key(key).post::<_, serde_json::Value>("/v1/auth/token", &json!({})).await;
    match check {
        Ok(_) => Ok(true),
        Err(ApiError::Status { status, .. }) if status == reqwest::StatusCode::UNAUTHORIZED => Ok(false),
        Err(e) => Err(e).context("check the saved demo keys"),
    }
}

/// Creates the demo tenant and its two keys, unless they exist (keys come from
/// `dev-credentials.json` then).
async fn provision_tenant(admin: &ApiClient, dir: &Path) -> anyhow::Result<DevCredentials> {
    let tenant_path = format!("/v1/tenants/{DEMO_TENANT}");
    if admin.get_opt::<serde_json::Value>(&tenant_path).await.context("look up the demo tenant")?.is_none() {
        let body = json!({ "name": DEMO_TENANT, "display_name": "Demo" });
        admin.post::<_, serde_json::Value>("/v1/tenants", &body).await.context("create the demo tenant")?;
    }
    let path = dir.join("dev-credentials.json");
    if let Some(saved) = read_json::<DevCredentials>(&path)?
        && key_works(admin, &saved.tenant_admin_key).await?
        && key_works(admin, &saved.inference_key).await?
    {
        return Ok(saved);
    }
    let create = |name: &'static str, role: &'static str| {
        let body = json!({ "name": name, "role": role });
        async move {
            let created: serde_json::Value = admin
                .post(&format!("/v1/tenants/{DEMO_TENANT}/api-keys"), &body)
                .await
                .with_context(|| format!("create the demo {role} key"))?;
            created["key"].as_str().map(str::to_string).context("the created key has no secret")
        }
    };
    let credentials = DevCredentials {
        tenant: DEMO_TENANT.into(),
        tenant_admin_key: create("tessera dev: tenant admin", "tenant-admin").await?,
        inference_key: create("tessera dev: inference", "inference").await?,
    };
    write_json(&path, &credentials)?;
    Ok(credentials)
}

/// Registers `simple`, uploads the generated model as version 1, points `production` at it
/// and deploys it following the alias — each step only when it is not done yet.
async fn provision_model(api: &ApiClient, dir: &Path) -> anyhow::Result<()> {
    let latest = models::ensure_model(api, DEMO_TENANT, DEMO_MODEL).await?;
    let latest = if latest == 0 {
        let file = dir.join("models/simple.onnx");
        std::fs::create_dir_all(dir.join("models")).context("create the models directory")?;
        std::fs::write(&file, onnx_builder::simple()).with_context(|| format!("write {}", file.display()))?;
        let config = onnx_builder::simple_config().to_string();
        let artifact = Artifact { file: &file, format: Format::Onnx, config: Some(&config) };
        models::push(api, DEMO_TENANT, DEMO_MODEL, artifact).await?.version
    } else {
        latest
    };
    let alias_path = format!("/v1/tenants/{DEMO_TENANT}/models/{DEMO_MODEL}/aliases/{}", segment(DEMO_ALIAS));
    if api.get_opt::<serde_json::Value>(&alias_path).await.context("look up the alias")?.is_none() {
        api.call::<_, serde_json::Value>(reqwest::Method::PUT, &alias_path, &json!({ "version": latest }))
            .await
            .context("set the production alias")?;
    }
    if deploy::get(api, DEMO_TENANT, DEMO_MODEL).await?.is_none() {
        let body = json!({ "name": DEMO_MODEL, "model": DEMO_MODEL, "alias": DEMO_ALIAS, "replicas": 1 });
        api.post::<_, serde_json::Value>(&format!("/v1/tenants/{DEMO_TENANT}/deployments"), &body)
            .await
            .context("deploy the demo model")?;
    }
    Ok(())
}

/// The demo request: two INT32 `[1, 16]` tensors (1..=16 and all ones).
pub fn demo_request() -> serde_json::Value {
    let a: Vec<i32> = (1..=16).collect();
    let b = [1i32; 16];
    json!({ "inputs": [
        { "name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a },
        { "name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b },
    ]})
}

/// The Python interpreter to show: the project's venv when run from the repository.
fn python() -> (&'static str, &'static str) {
    if Path::new(".venv/bin/python").exists() {
        (".venv/bin/python", "")
    } else {
        ("python3", "# needs: pip install 'tritonclient[http]' numpy\n")
    }
}

/// How to run this binary again (its full path: it is often not on `PATH`).
fn tessera_command() -> String {
    std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "tessera".into())
}

/// `host:port`, or `-` for a listener that is off.
fn shown(addr: Option<SocketAddr>) -> String {
    addr.map(reachable).map_or_else(|| "-".to_string(), |a| a.to_string())
}

/// Where things are, and the demo's keys.
fn summary_section(r: &Running) -> String {
    let (cp, w, c) = (r.control_plane, &r.worker, &r.credentials);
    let s = scheme(r.ca.is_some());
    let tls = match &r.ca {
        Some(ca) => {
            format!("  TLS CA        {}  (--ca-cert, curl --cacert, tritonclient's SSL options)\n", ca.display())
        }
        None => String::new(),
    };
    format!(
        "Tessera dev: control plane, gateway, worker and demo tenant in one process (state in {dir})

  gateway       KServe v2 HTTP {gw_http}, gRPC {gw_grpc}, metrics {s}://{gw_metrics}/metrics
                (the endpoint applications call: every tenant, rate limits, balancing)
  REST API      {s}://{cp}/v1
  API docs      {s}://{cp}/docs
  console       {console}
  worker        KServe v2 HTTP {http}, gRPC {grpc}, metrics {s}://{metrics}/metrics (direct access)
{tls}
  tenant            {tenant}
  tenant-admin key  {admin}
  inference key     {inference}
  (platform-admin key and worker token: {secrets})

  model {DEMO_MODEL}: INT32 INPUT0, INPUT1 [-1, 16] -> OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1
  deployment {deployment}
",
        dir = r.data_dir.display(),
        console = console_line(s, r.control_plane, r.console.is_some()),
        gw_http = shown(Some(r.gateway.http)),
        gw_grpc = shown(Some(r.gateway.grpc)),
        gw_metrics = shown(Some(r.gateway.metrics)),
        http = shown(w.http),
        grpc = shown(w.grpc),
        metrics = shown(w.metrics),
        tenant = c.tenant,
        admin = c.tenant_admin_key,
        inference = c.inference_key,
        secrets = r.secrets_file.display(),
        deployment = r.deployment.summary(),
    )
}

/// Where the console is, or how to build it.
fn console_line(scheme: &str, control_plane: SocketAddr, built: bool) -> String {
    if built {
        format!("{scheme}://{control_plane}/  (sign in with the tenant-admin key)")
    } else {
        "not built: run scripts/setup-web.sh, then restart tessera dev".to_string()
    }
}

/// The demo request with curl, on one line; over https trusting `ca` when given.
fn curl_example(http: &str, key: &str, ca: Option<&Path>) -> String {
    let request = demo_request();
    let (scheme, trust) = match ca {
        Some(ca) => ("https", format!("--cacert {} ", ca.display())),
        None => ("http", String::new()),
    };
    format!(
        "curl -s {trust}-H \"Authorization: Bearer {key}\" -H 'Content-Type: application/json' -d '{request}' \
         {scheme}://{http}/v2/models/{DEMO_MODEL}/infer"
    )
}

/// The demo request with tritonclient, as a shell here-document; over https trusting `ca`
/// when given.
fn python_example(http: &str, key: &str, ca: Option<&Path>) -> String {
    let (python, note) = python();
    let ssl = match ca {
        Some(ca) => format!(", ssl=True, ssl_options={{\"ca_certs\": \"{}\"}}", ca.display()),
        None => String::new(),
    };
    format!(
        r#"{note}{python} - <<'EOF'
import numpy as np
import tritonclient.http as httpclient

client = httpclient.InferenceServerClient("{http}"{ssl})
headers = {{"Authorization": "Bearer {key}"}}
a = np.arange(1, 17, dtype=np.int32).reshape(1, 16)
b = np.ones((1, 16), dtype=np.int32)
inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
inputs[0].set_data_from_numpy(a)
inputs[1].set_data_from_numpy(b)
result = client.infer("{DEMO_MODEL}", inputs, headers=headers)
print("OUTPUT0 =", result.as_numpy("OUTPUT0"))
print("OUTPUT1 =", result.as_numpy("OUTPUT1"))
EOF"#
    )
}

/// The demo request with the tessera CLI (login saves the CA for the other verbs).
fn cli_example(control_plane: SocketAddr, key: &str, ca: Option<&Path>) -> String {
    let tessera = tessera_command();
    let request = demo_request();
    let (scheme, trust) = match ca {
        Some(ca) => ("https", format!(" --ca-cert {}", ca.display())),
        None => ("http", String::new()),
    };
    format!(
        "{tessera} login --url {scheme}://{control_plane} --key {key}{trust}\n\
         {tessera} infer --model {DEMO_MODEL} --input '{request}'"
    )
}

fn print_banner(r: &Running) {
    let http = shown(Some(r.gateway.http));
    let c = &r.credentials;
    println!("\n{}", summary_section(r));
    let ca = r.ca.as_deref();
    println!("Infer with curl:\n\n{}\n", curl_example(&http, &c.inference_key, ca));
    println!("Infer with tritonclient:\n\n{}\n", python_example(&http, &c.inference_key, ca));
    println!(
        "Infer with the tessera CLI (login saves the URL and key in ~/.config/tessera/config.json):\n\n{}\n",
        cli_example(r.control_plane, &c.tenant_admin_key, ca)
    );
    println!("{READY_LINE}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_request_is_two_int32_rows() {
        let r = demo_request();
        assert_eq!(r["inputs"][0]["data"][15], 16);
        assert_eq!(r["inputs"][1]["datatype"], "INT32");
        assert_eq!(r["inputs"][1]["data"].as_array().map(Vec::len), Some(16));
    }

    #[test]
    fn secrets_are_made_once_and_kept_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = Secrets::load_or_create(dir.path()).expect("create");
        let again = Secrets::load_or_create(dir.path()).expect("reload");
        assert_eq!(first.worker_token, again.worker_token);
        assert_eq!(first.gateway_token, again.gateway_token);
        assert_ne!(first.gateway_token, first.worker_token);
        assert!(tessera_control_plane::auth::keys::prefix_of(&first.platform_admin_key).is_some());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("secrets.json")).expect("stat").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn secrets_from_before_the_gateway_token_gain_one_that_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = r#"{"platform_admin_key": "k", "worker_token": "w", "api_key_pepper": "p"}"#;
        std::fs::write(dir.path().join("secrets.json"), old).expect("write");
        let first = Secrets::load_or_create(dir.path()).expect("upgrade");
        assert_eq!(first.worker_token, "w");
        assert_eq!(first.gateway_token.len(), 64);
        let again = Secrets::load_or_create(dir.path()).expect("reload");
        assert_eq!(first.gateway_token, again.gateway_token);
    }

    #[test]
    fn examples_carry_the_key_and_the_endpoint() {
        let curl = curl_example("127.0.0.1:8000", "tsk_k", None);
        assert!(curl.starts_with("curl -s -H \"Authorization: Bearer tsk_k\""), "{curl}");
        assert!(curl.ends_with(" http://127.0.0.1:8000/v2/models/simple/infer"), "{curl}");
        assert!(!curl.contains('\n'), "one line: {curl}");
        let py = python_example("127.0.0.1:8000", "tsk_k", None);
        assert!(py.contains("InferenceServerClient(\"127.0.0.1:8000\")"), "{py}");
        assert!(py.contains("headers = {\"Authorization\": \"Bearer tsk_k\"}"), "{py}");
        assert!(py.ends_with("\nEOF"), "{py}");

        let ca = Path::new("/d/tls/ca.pem");
        let curl = curl_example("127.0.0.1:8000", "tsk_k", Some(ca));
        assert!(curl.starts_with("curl -s --cacert /d/tls/ca.pem -H"), "{curl}");
        assert!(curl.ends_with(" https://127.0.0.1:8000/v2/models/simple/infer"), "{curl}");
        let py = python_example("127.0.0.1:8000", "tsk_k", Some(ca));
        assert!(py.contains(r#"("127.0.0.1:8000", ssl=True, ssl_options={"ca_certs": "/d/tls/ca.pem"})"#), "{py}");
        let cli = cli_example("127.0.0.1:8080".parse().expect("addr"), "tsk_k", Some(ca));
        assert!(cli.contains("login --url https://127.0.0.1:8080 --key tsk_k --ca-cert /d/tls/ca.pem"), "{cli}");
    }

    #[test]
    fn the_console_line_says_where_or_how_to_build() {
        let cp: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        assert!(console_line("http", cp, true).starts_with("http://127.0.0.1:8080/ "));
        assert!(console_line("https", cp, true).starts_with("https://127.0.0.1:8080/ "));
        assert!(console_line("http", cp, false).contains("scripts/setup-web.sh"));
    }

    #[test]
    fn unspecified_addresses_are_shown_as_loopback() {
        let any: SocketAddr = "0.0.0.0:8000".parse().expect("addr");
        assert_eq!(reachable(any).to_string(), "127.0.0.1:8000");
    }
}
