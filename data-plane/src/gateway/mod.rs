//! `tessera gateway`: one KServe v2 endpoint (HTTP and gRPC) for every tenant. It
//! authenticates the caller as workers do (API keys through the control plane, cached; access
//! tokens offline against the signing keys), applies the tenant's rate and concurrency limits,
//! picks a ready replica of the model from the route table the control plane streams, and
//! forwards the request with the caller's identity signed for the worker.
//!
//! In modules: [`routes`] (the table, balancing and outlier state), [`limits`] (token buckets),
//! [`watch`] (the route stream), [`forward`] (upstream clients and retries; unary gRPC calls
//! through [`grpc_upstream`]), [`http`] and
//! [`grpc`] (the two front ends; model requests over HTTP/1.1 take the lean path of [`h1`], and
//! gRPC connections are served on h2 directly by [`h2_front`]),
//! [`metrics`] and [`usage`] (throttled requests, shipped to the
//! control plane as usage).

pub mod dial;
pub mod forward;
pub mod grpc;
pub mod grpc_upstream;
pub mod h1;
pub mod h2_front;
pub mod http;
pub mod http_upstream;
pub mod limits;
pub mod metrics;
pub mod proto_fields;
pub mod routes;
pub mod sticky;
#[cfg(test)]
mod test_workers;
pub mod usage;
pub mod watch;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ::http::HeaderValue;
use anyhow::Context;
use parking_lot::{Mutex, RwLock};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{Authenticator, IdentityKey, Principal, Role, forwarded};
use crate::error::{Error, ErrorKind};
use crate::serve::net::listen::PortArgs;
use crate::worker::config::WorkerToken;
use limits::Admitted;
use routes::{ModelRoutes, Routes};

/// Largest request body the gateway takes (the workers' default input limit plus room for the
/// JSON around it).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 128 * 1024 * 1024;

/// Seconds a worker has to begin answering a forwarded request (Knative's, and so KServe's,
/// default request timeout).
pub const DEFAULT_UPSTREAM_TIMEOUT_SECS: u64 = 300;

/// `tessera gateway` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayArgs {
    /// Control plane URL (its agent service), e.g. `http://cp:8080`.
    #[arg(long, env = "TESSERA_CONTROL_PLANE", value_parser = crate::worker::config::parse_control_plane)]
    pub control_plane: String,
    /// The control plane's gateway token (its `--gateway-token`): the gateway presents it to the
    /// control plane, which lets it call only what a gateway needs, and signs the identities it
    /// forwards with a key derived from it, which the control plane sends workers.
    #[arg(long, env = "TESSERA_GATEWAY_TOKEN", hide_env_values = true, required_unless_present = "worker_token")]
    pub gateway_token: Option<WorkerToken>,
    /// Instead of a gateway token, the agent token workers use (`--worker-token` of the control
    /// plane), for control planes without a gateway token: it can do all a worker can.
    #[arg(long, env = "TESSERA_WORKER_TOKEN", hide_env_values = true, conflicts_with = "gateway_token")]
    pub worker_token: Option<WorkerToken>,
    /// Stable id of this gateway (default: the host name and port).
    #[arg(long, env = "TESSERA_GATEWAY_ID", value_parser = crate::worker::config::parse_worker_id)]
    pub gateway_id: Option<String>,
    #[command(flatten)]
    pub ports: PortArgs,
    /// Address the listeners bind.
    #[arg(long, env = "TESSERA_GATEWAY_ADDRESS", default_value = "0.0.0.0")]
    pub address: std::net::IpAddr,
    /// Seconds a resolved API key is trusted before it is checked again.
    #[arg(long, env = "TESSERA_KEY_CACHE_SECS", default_value_t = 60)]
    pub key_cache_secs: u64,
    /// File holding the bearer token `/metrics` requires (as on workers); without it or
    /// `--metrics-token`, metrics are open.
    #[arg(long, env = "TESSERA_METRICS_TOKEN_FILE", conflicts_with = "metrics_token")]
    pub metrics_token_file: Option<std::path::PathBuf>,
    /// The bearer token `/metrics` requires, given directly.
    #[arg(long, env = "TESSERA_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<crate::serve::metrics::MetricsToken>,
    /// Forward HTTP requests and every unary gRPC call to workers over HTTP/2 (one multiplexed
    /// connection per worker for each) instead of pooled HTTP/1.1 connections (by default a
    /// unary call goes over HTTP/1.1 only when no other request is in flight to its worker).
    #[arg(long, env = "TESSERA_GATEWAY_UPSTREAM_HTTP2", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub upstream_http2: bool,
    /// Threads serving requests; 1 runs everything on one thread, which on a few shared cores
    /// saves the wake-ups between threads that dominate a proxy's cost. Default: a quarter of
    /// the cores, at least 1 (scale out with more gateways, or give more here).
    #[arg(long, env = "TESSERA_GATEWAY_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Microseconds an idle gateway thread keeps polling client and worker connections before
    /// it sleeps (as workers do); 0 turns it off.
    #[arg(long, env = "TESSERA_BUSY_POLL_US", default_value_t = crate::serve::net::busy_poll::DEFAULT_WINDOW_US)]
    pub busy_poll_us: u64,
    /// TLS of the HTTP, gRPC and metrics listeners.
    #[command(flatten)]
    pub tls: crate::serve::net::tls::TlsArgs,
    /// A CA to trust when the control plane speaks https.
    #[command(flatten)]
    pub ca: crate::serve::net::tls::CaArgs,
    /// Largest request body accepted, bytes.
    #[arg(long, env = "TESSERA_GATEWAY_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,
    /// Seconds a worker has to begin answering a forwarded request (for a stream, its first
    /// answer's head); a request it leaves waiting longer fails with 504 / DEADLINE_EXCEEDED and
    /// counts against the worker like a failure. It may have run, so it is not retried.
    #[arg(long, env = "TESSERA_GATEWAY_UPSTREAM_TIMEOUT_SECS", default_value_t = DEFAULT_UPSTREAM_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_timeout_secs: u64,
    /// Milliseconds between shipments of throttled-request counts to the control plane.
    #[arg(long, env = "TESSERA_USAGE_SHIP_INTERVAL_MS", default_value_t = crate::worker::config::DEFAULT_USAGE_SHIP_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub usage_ship_interval_ms: u64,
}

/// The gateway's default thread count: a quarter of the cores, at least one. A proxy's work is
/// mostly system calls and wake-ups; measured on 2 shared cores, one thread added 42 µs at p50
/// where two threads added 74 µs (`scripts/bench.sh --gateway`).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).max(1))
}

/// The bound addresses of a running gateway.
#[derive(Debug, Clone, Copy)]
pub struct GatewayAddrs {
    /// KServe v2 HTTP.
    pub http: SocketAddr,
    /// KServe v2 gRPC.
    pub grpc: SocketAddr,
    /// Prometheus metrics.
    pub metrics: SocketAddr,
}

/// What every request handler shares.
pub struct Gateway {
    routes: RwLock<Arc<Routes>>,
    updated: Mutex<Option<Instant>>,
    auth: Option<Arc<Authenticator>>,
    identity: IdentityKey,
    /// Signed identities by tenant and role, reused until half spent.
    signed: Mutex<HashMap<(String, Role), (HeaderValue, i64)>>,
    /// The gateway's metrics.
    pub metrics: metrics::GatewayMetrics,
    /// Upstream clients.
    pub upstream: forward::Clients,
    /// Largest request body accepted.
    pub max_request_bytes: usize,
    /// How long a worker has to begin answering a forwarded request.
    pub upstream_timeout: Duration,
    /// How long an answer may stall once begun: a client of the lean HTTP path taking none of a
    /// piece of it (a gRPC call's client is bounded by its connection's clock: [`h2_front`]), or
    /// a worker sending none of the rest of it.
    pub answer_stall: Duration,
    /// Requests refused under a tenant's limits, until they are shipped as usage.
    pub throttled_usage: Arc<usage::ThrottledUsage>,
    live: AtomicBool,
}

/// Whose limit refused a request.
enum Scope<'a> {
    /// The tenant's (its name).
    Tenant(&'a str),
    /// The caller's API key's own (its id).
    Key(uuid::Uuid),
}

/// The concurrency slots a request holds (its tenant's, and its key's where the key has its
/// own limits) until its response is done.
#[derive(Default)]
pub struct Slots {
    _tenant: Option<Admitted>,
    _key: Option<Admitted>,
}

/// A caller the gateway authenticated, with the route table its request is served from.
pub struct Caller {
    /// Who asked.
    pub principal: Principal,
    /// The route table the request is served from.
    pub routes: Arc<Routes>,
    /// The tenant's id (the `tenant` label of metrics, as on workers).
    pub tenant: String,
}

impl Gateway {
    fn new(
        auth: Option<Arc<Authenticator>>,
        identity: IdentityKey,
        max_request_bytes: usize,
        upstream: forward::Clients,
    ) -> Self {
        Self {
            routes: RwLock::new(Arc::new(Routes::default())),
            updated: Mutex::new(None),
            auth,
            identity,
            signed: Mutex::new(HashMap::new()),
            metrics: metrics::GatewayMetrics::default(),
            upstream,
            max_request_bytes,
            upstream_timeout: Duration::from_secs(DEFAULT_UPSTREAM_TIMEOUT_SECS),
            answer_stall: tessera_protocol::stall::ANSWER_STALL,
            throttled_usage: Arc::default(),
            live: AtomicBool::new(true),
        }
    }

    /// A gateway with no authentication source and an empty table, for unit tests.
    #[cfg(test)]
    pub fn for_tests() -> Self {
        let tls = tessera_protocol::tls::client_config(None).unwrap_or_else(|e| panic!("client TLS config: {e}"));
        Self::new(None, IdentityKey::from_token("test"), DEFAULT_MAX_REQUEST_BYTES, forward::Clients::new(tls, false))
    }

    /// The current route table.
    pub fn routes(&self) -> Arc<Routes> {
        self.routes.read().clone()
    }

    /// Replaces the route table.
    pub fn set_routes(&self, routes: Routes) {
        *self.routes.write() = Arc::new(routes);
        *self.updated.lock() = Some(Instant::now());
        self.metrics.route_update();
    }

    /// Enforces a revocation list the control plane sent with the route table.
    pub fn apply_revocations(&self, list: tessera_protocol::revocation::RevocationList) {
        if let Some(auth) = &self.auth {
            auth.apply_revocations(list);
        }
    }

    /// The route stream broke: the revocation list held goes stale (it is still enforced).
    pub fn revocation_stream_lost(&self) {
        if let Some(auth) = &self.auth {
            auth.revocations().stream_lost();
        }
    }

    /// The revocation list held, for the metrics; `None` without authentication.
    pub fn revocations(&self) -> Option<Arc<crate::auth::Revocations>> {
        self.auth.as_ref().map(|a| a.revocations())
    }

    /// How long ago the last table arrived; `None` before the first.
    pub fn route_table_age(&self) -> Option<Duration> {
        self.updated.lock().map(|at| at.elapsed())
    }

    /// Live until shutdown.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Relaxed)
    }

    /// Ready once it has a route table, while live.
    pub fn is_ready(&self) -> bool {
        self.is_live() && self.updated.lock().is_some()
    }

    /// Authenticates a request's `Authorization` value.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, Error> {
        let Some(auth) = &self.auth else { return Err(Error::unavailable("the gateway has no credential source")) };
        let principal = auth.authenticate(authorization).await?;
        Ok(Caller { tenant: principal.tenant_id.clone(), principal, routes: self.routes() })
    }

    /// Applies the limits of the caller's API key (when it has its own) and of its tenant to
    /// one request for `model` (a model the caller's tenant has: unknown models are refused
    /// before, spending no limit). A refusal is counted in the metrics and, as throttled usage,
    /// under the model and the version the client named (0 when none, or one the model does
    /// not have).
    pub fn admit(
        &self,
        caller: &Caller,
        model: &ModelRoutes,
        name: &str,
        version: Option<i64>,
    ) -> Result<Slots, Error> {
        let Some(tenant) = caller.routes.tenants.get(&caller.tenant) else { return Ok(Slots::default()) };
        let now = Instant::now();
        // The key's limit first: it is the narrower one, and a request it refuses then spends
        // none of the tenant's.
        let key = caller.principal.key_id.and_then(|id| tenant.keys.get(&id).map(|limiter| (id, limiter)));
        let key_slot = match key {
            Some((id, limiter)) => match limiter.admit(now) {
                Ok(slot) => Some(slot),
                Err(throttled) => return Err(self.refuse(caller, model, name, version, throttled, Scope::Key(id))),
            },
            None => None,
        };
        match tenant.limiter.admit(now) {
            Ok(slot) => Ok(Slots { _tenant: Some(slot), _key: key_slot }),
            Err(throttled) => Err(self.refuse(caller, model, name, version, throttled, Scope::Tenant(&tenant.name))),
        }
    }

    /// Counts a refusal and words it.
    fn refuse(
        &self,
        caller: &Caller,
        model: &ModelRoutes,
        name: &str,
        version: Option<i64>,
        throttled: limits::Throttled,
        scope: Scope<'_>,
    ) -> Error {
        let (reason, whose) = match scope {
            Scope::Tenant(tenant) => (throttled.reason(), format!("tenant '{tenant}'")),
            Scope::Key(id) => (throttled.key_reason(), format!("API key {id}")),
        };
        self.metrics.throttled(&caller.tenant, reason);
        let version = version.filter(|v| model.replicas.iter().any(|r| r.version == *v)).unwrap_or(0);
        self.throttled_usage.count(&caller.tenant, name, version, crate::auth::system_unix_now());
        let message = match throttled {
            limits::Throttled::Rate(_) => format!("{whose} is over its requests-per-second limit"),
            limits::Throttled::Concurrency => format!("{whose} has as many requests in flight as its limit allows"),
        };
        let seconds = u32::try_from(throttled.retry_after_secs()).unwrap_or(u32::MAX);
        Error::new(ErrorKind::TooManyRequests, message).retry_after(seconds)
    }

    /// The signed identity header for `who`.
    pub fn identity_header(&self, who: &Principal) -> Result<HeaderValue, Error> {
        let now = crate::auth::system_unix_now();
        let key = (who.tenant_id.clone(), who.role);
        if let Some((value, expires)) = self.signed.lock().get(&key)
            && *expires - now > forwarded::LIFETIME_SECS / 2
        {
            return Ok(value.clone());
        }
        let expires = now + forwarded::LIFETIME_SECS;
        let value = HeaderValue::from_str(&self.identity.sign(who, expires))
            .map_err(|_| Error::internal("could not encode a forwarded identity"))?;
        let mut signed = self.signed.lock();
        // Bounded by tenants × roles; cleared wholesale rather than tracked per entry.
        if signed.len() > 100_000 {
            signed.clear();
        }
        signed.insert(key, (value.clone(), expires));
        Ok(value)
    }
}

impl Caller {
    /// The model's routes in the caller's tenant, or a 404 naming it.
    pub fn model(&self, name: &str) -> Result<&ModelRoutes, Error> {
        self.routes
            .tenants
            .get(&self.principal.tenant_id)
            .and_then(|t| t.models.get(name))
            .ok_or_else(|| Error::not_found(format!("Request for unknown model: '{name}' is not deployed")))
    }

    /// The tenant's deployed model names (repository index).
    pub fn model_names(&self) -> Vec<(&str, &ModelRoutes)> {
        let mut names: Vec<_> = self
            .routes
            .tenants
            .get(&self.principal.tenant_id)
            .map(|t| t.models.iter().map(|(n, m)| (n.as_str(), m)).collect())
            .unwrap_or_default();
        names.sort_by_key(|(n, _)| *n);
        names
    }
}

/// Runs a gateway until `shutdown`; `on_bound` hears the bound addresses.
pub async fn run(
    args: GatewayArgs,
    shutdown: CancellationToken,
    on_bound: impl FnOnce(GatewayAddrs),
) -> anyhow::Result<()> {
    crate::serve::net::busy_poll::enable_for_proxy(Duration::from_micros(args.busy_poll_us));
    let tls = args.tls.acceptor()?;
    let token = args
        .gateway_token
        .as_ref()
        .or(args.worker_token.as_ref())
        .context("a gateway needs --gateway-token (or the workers' --worker-token)")?;
    let client = crate::worker::client::connect(&args.control_plane, token, args.ca.ca_cert.as_deref())?;
    let credentials = Arc::new(crate::worker::credentials::ControlPlaneCredentials::new(client.clone()));
    let auth = Arc::new(Authenticator::new(credentials, Duration::from_secs(args.key_cache_secs)));
    // Workers check with the same key: derived from their own token, or sent by the control plane.
    let identity = IdentityKey::from_token(token.expose());
    // Workers serving TLS are reached over https, trusting the same CA as the control plane.
    let upstream =
        forward::Clients::new(tessera_protocol::tls::client_config(args.ca.ca_cert.as_deref())?, args.upstream_http2);
    let mut gateway = Gateway::new(Some(auth), identity, args.max_request_bytes, upstream);
    gateway.upstream_timeout = Duration::from_secs(args.upstream_timeout_secs);
    let gateway = Arc::new(gateway);

    let [http_addr, grpc_addr, metrics_addr] = args.ports.on(args.address);
    let bind = async |addr: SocketAddr, what: &str| {
        TcpListener::bind(addr).await.with_context(|| format!("bind the gateway's {what} listener on {addr}"))
    };
    let (http, grpc, metrics) =
        (bind(http_addr, "HTTP").await?, bind(grpc_addr, "gRPC").await?, bind(metrics_addr, "metrics").await?);
    let addrs = GatewayAddrs { http: http.local_addr()?, grpc: grpc.local_addr()?, metrics: metrics.local_addr()? };
    for (protocol, addr) in [("http", addrs.http), ("grpc", addrs.grpc), ("metrics", addrs.metrics)] {
        tracing::info!(protocol, %addr, "listening");
    }
    let gateway_id = args.gateway_id.clone().unwrap_or_else(|| default_id(addrs.http.port()));
    tracing::info!(%gateway_id, http = %addrs.http, grpc = %addrs.grpc, metrics = %addrs.metrics, control_plane = %args.control_plane, "gateway started");
    on_bound(addrs);

    let usage_stop = CancellationToken::new();
    let shipping = tokio::spawn(usage::ship(
        gateway.throttled_usage.clone(),
        client.clone(),
        gateway_id.clone(),
        Duration::from_millis(args.usage_ship_interval_ms),
        usage_stop.clone(),
    ));
    let tasks = tokio_util::task::TaskTracker::new();
    tasks.spawn(http_upstream::sweep(gateway.clone(), shutdown.clone()));
    tasks.spawn(h1::serve(http, gateway.clone(), http::router(gateway.clone()), shutdown.clone(), tls.clone()));
    tasks.spawn(h2_front::serve(grpc, gateway.clone(), grpc::routes(gateway.clone()), shutdown.clone(), tls.clone()));
    let metrics_token = match &args.metrics_token_file {
        Some(path) => Some(
            crate::serve::metrics::MetricsToken::from_file(path)
                .with_context(|| format!("read the metrics token from {}", path.display()))?,
        ),
        None => args.metrics_token.clone(),
    };
    let (metrics_router, stop) = (metrics::router(gateway.clone(), metrics_token), shutdown.clone());
    tasks.spawn(crate::serve::http::serve(metrics, metrics_router, stop, tls));
    watch::run(client, gateway.clone(), gateway_id, shutdown.clone()).await;
    gateway.live.store(false, Ordering::Relaxed);
    tracing::info!("gateway shutting down: finishing requests in flight");
    tasks.close();
    if tokio::time::timeout(Duration::from_secs(30), tasks.wait()).await.is_err() {
        tracing::warn!("requests in flight did not finish within 30 s; exiting anyway");
    }
    // Every refusal is counted by now: ship what is left.
    usage_stop.cancel();
    if let Err(e) = shipping.await {
        tracing::warn!(error = %e, "the throttled usage shipper failed");
    }
    Ok(())
}

/// `<host name>-<port>`, or `gateway-<port>` without a usable host name.
fn default_id(port: u16) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String =
        host.trim().chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')).collect();
    if host.is_empty() || host.starts_with('.') { format!("gateway-{port}") } else { format!("{host}-{port}") }
}

#[cfg(test)]
mod tests {
    use tessera_protocol::agent::{self, KeyLimit, ModelRoute, RouteReplica, RouteTable, VersionWeight};

    use super::*;

    const LIMITED: uuid::Uuid = uuid::Uuid::from_u128(1);
    const FREE: uuid::Uuid = uuid::Uuid::from_u128(2);

    /// Tenant `t1` (`tenant_rps` requests/s, 3 in flight) with model `m`, whose key LIMITED has
    /// `key_rps` requests/s and 1 in flight of its own.
    fn routes(previous: &Routes, tenant_rps: u64, key_rps: u64) -> Routes {
        let replica = RouteReplica {
            replica_id: "r".into(),
            version: 1,
            worker_id: "w".into(),
            http_endpoint: "http://w:8000".into(),
            grpc_endpoint: "w:8001".into(),
            serving: true,
        };
        let table = RouteTable {
            tenants: vec![agent::TenantRoutes {
                tenant_id: "t1".into(),
                tenant_name: "acme".into(),
                requests_per_second: tenant_rps,
                concurrent_requests: 3,
                models: vec![ModelRoute {
                    model_name: "m".into(),
                    deployment_id: "d".into(),
                    weights: vec![VersionWeight { version: 1, weight: 100 }],
                    replicas: vec![replica],
                }],
                keys: vec![KeyLimit {
                    key_id: LIMITED.to_string(),
                    requests_per_second: key_rps,
                    concurrent_requests: 1,
                }],
            }],
            gateways: 1,
            revocations: None,
        };
        Routes::from_table(&table, previous)
    }

    fn caller(routes: &Arc<Routes>, key: uuid::Uuid) -> Caller {
        let principal =
            Principal { tenant_id: "t1".into(), tenant_name: "acme".into(), role: Role::Inference, key_id: Some(key) };
        Caller { principal, routes: routes.clone(), tenant: "t1".into() }
    }

    #[test]
    fn a_key_with_its_own_limits_is_held_to_them_and_its_refusals_spend_none_of_the_tenants() {
        let g = Gateway::for_tests();
        // Concurrency: the key's one slot, while its tenant has three.
        let routes_ = Arc::new(routes(&Routes::default(), 0, 0));
        let (limited, free) = (caller(&routes_, LIMITED), caller(&routes_, FREE));
        let m = limited.model("m").expect("model m");
        let first = g.admit(&limited, m, "m", None).expect("the key's first request");
        let e = g.admit(&limited, m, "m", Some(1)).err().expect("over the key's concurrency");
        assert_eq!(e.kind, ErrorKind::TooManyRequests);
        assert!(e.message.contains(&format!("API key {LIMITED} has as many requests in flight")), "{}", e.message);
        let _others = [g.admit(&free, m, "m", None).expect("2 of 3"), g.admit(&free, m, "m", None).expect("3 of 3")];
        let e = g.admit(&free, m, "m", None).err().expect("over the tenant's concurrency");
        assert!(e.message.contains("tenant 'acme' has as many"), "{}", e.message);
        drop(first);

        // Rate: the tenant's bucket holds 20 (100/s), the key's 1 (1/s); the key's refusals take none of the tenant's.
        let routes_ = Arc::new(routes(&Routes::default(), 100, 1));
        let (limited, free) = (caller(&routes_, LIMITED), caller(&routes_, FREE));
        let m = limited.model("m").expect("model m");
        drop(g.admit(&limited, m, "m", None).expect("the key's first request"));
        for _ in 0..50 {
            let e = g.admit(&limited, m, "m", None).err().expect("over the key's rate");
            assert!(e.message.contains(&format!("API key {LIMITED} is over its requests-per-second")), "{}", e.message);
        }
        let admitted = (0..50).filter(|_| g.admit(&free, m, "m", None).is_ok()).count();
        assert!((19..=20).contains(&admitted), "the tenant's burst less the key's one: {admitted}");

        let text = String::from_utf8(g.metrics.render(&g)).expect("utf-8");
        for (reason, n) in [("key_concurrency", 1), ("concurrency", 1), ("key_rate", 50), ("rate", 50 - admitted)] {
            let line = format!("tessera_gateway_throttled_total{{reason=\"{reason}\",tenant=\"t1\"}} {n}\n");
            assert!(text.contains(&line), "{line} in {text}");
        }
        // Refusals become throttled usage: under version 1 where named, else 0.
        let counted: Vec<(i64, u64)> = g.throttled_usage.take().into_iter().map(|((_, _, v, _), n)| (v, n)).collect();
        assert_eq!(counted, [(0, 101 - admitted as u64), (1, 1)]);
    }

    #[test]
    fn a_key_keeps_its_bucket_across_tables_and_loses_its_limit_when_the_table_drops_it() {
        let g = Gateway::for_tests();
        let first = Arc::new(routes(&Routes::default(), 100, 1));
        let m = first.tenants["t1"].models.get("m").expect("m");
        drop(g.admit(&caller(&first, LIMITED), m, "m", None).expect("first"));
        let second = Arc::new(routes(&first, 100, 1));
        let m = second.tenants["t1"].models.get("m").expect("m");
        assert!(g.admit(&caller(&second, LIMITED), m, "m", None).is_err(), "the bucket carried over: still empty");
        let raised = Arc::new(routes(&second, 100, 0));
        assert!(raised.tenants["t1"].keys[&LIMITED].admit(Instant::now()).is_ok(), "0 = no rate of its own");
    }
}
