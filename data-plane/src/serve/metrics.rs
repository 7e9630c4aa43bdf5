//! The Prometheus endpoint: Triton's `nv_inference_*` families per model version (with Triton's
//! `model`/`version` labels), CPU metrics, and latency and batch-size histograms beyond Triton.
//! Counters come from the same statistics the statistics extension serves, so both agree.
//! The families are built and written by [`exposition`] with the `prometheus` crate.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use sha2::{Digest, Sha256};

use crate::engine::model::LoadedModel;
use crate::serve::exposition::{self, ModelMetrics, System};
use crate::serve::server::ServerState;

/// State of the metrics listener: the server and the registry that reads it.
struct MetricsState {
    server: Arc<ServerState>,
    /// Holds the [`ServerCollector`] of `server`.
    registry: prometheus::Registry,
}

/// Builds the router for the metrics listener: behind `Authorization: Bearer <token>` when
/// the server has a metrics token, open otherwise.
pub fn router(server: Arc<ServerState>) -> Router {
    let token = server.metrics_token().cloned();
    let registry = exposition::registry(ServerCollector { server: server.clone(), cpu: Mutex::new(None) });
    let state = Arc::new(MetricsState { server, registry });
    let router = Router::new().route("/metrics", get(handle_metrics)).with_state(state);
    match token {
        Some(token) => router.layer(middleware::from_fn_with_state(token, require_token)),
        None => router,
    }
}

/// 401 with a `WWW-Authenticate` challenge unless the request carries the metrics token.
pub(crate) async fn require_token(State(token): State<MetricsToken>, req: Request, next: Next) -> Response {
    if token.admits(req.headers()) {
        return next.run(req).await;
    }
    let challenge = [(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"metrics\""))];
    (StatusCode::UNAUTHORIZED, challenge, "missing or invalid metrics token\n").into_response()
}

/// The bearer token `/metrics` requires (`--metrics-token-file`, `TESSERA_METRICS_TOKEN`).
/// Only its sha256 is kept; a presented token is hashed and the digests compared in constant
/// time, so timing says nothing about the token.
#[derive(Clone, PartialEq, Eq)]
pub struct MetricsToken([u8; 32]);

impl std::fmt::Debug for MetricsToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsToken([redacted])")
    }
}

impl std::str::FromStr for MetricsToken {
    type Err = String;

    /// A token from its text (surrounding white space dropped); refuses an empty one.
    fn from_str(token: &str) -> Result<Self, String> {
        let token = token.trim();
        if token.is_empty() {
            return Err("the metrics token is empty".into());
        }
        Ok(MetricsToken(Sha256::digest(token.as_bytes()).into()))
    }
}

impl MetricsToken {
    /// Reads a token file (Prometheus reads the same file as `credentials_file`).
    pub fn from_file(path: &std::path::Path) -> std::io::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("read {}: {e}", path.display())))?;
        text.parse()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))
    }

    /// Whether `headers` carry `Authorization: Bearer <this token>`.
    pub fn admits(&self, headers: &http::HeaderMap) -> bool {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        let Some(presented) = presented else { return false };
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        // Every byte is looked at whatever differs.
        digest.iter().zip(self.0.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

async fn handle_metrics(State(state): State<Arc<MetricsState>>) -> impl IntoResponse {
    let mut text = exposition::encode(&state.registry.gather());
    let server = &state.server;
    if let Some(usage) = server.usage() {
        usage.render_metrics(&mut text);
    }
    if let Some(capture) = server.capture() {
        capture.render_metrics(&mut text);
    }
    for source in server.metrics_sources() {
        source.render_metrics(&mut text);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// Reads the server's models, the host and the runners when a scrape gathers it.
struct ServerCollector {
    server: Arc<ServerState>,
    /// Previous `/proc/stat` totals; each scrape reports utilisation since the last one.
    cpu: Mutex<Option<CpuSample>>,
}

impl Collector for ServerCollector {
    fn desc(&self) -> Vec<&Desc> {
        // The families depend on what is loaded; `exposition`'s tests check their shape.
        Vec::new()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let loaded = loaded_models(&self.server);
        let models: Vec<ModelMetrics<'_>> = loaded
            .iter()
            .map(|(tenant, m)| ModelMetrics {
                snapshot: m.stats.snapshot(&m.spec.name, &m.version.to_string()),
                tenant: tenant.as_deref(),
                stats: &m.stats,
                pending: m.pending(),
            })
            .collect();
        let cpu = {
            let mut previous = self.cpu.lock();
            let now = CpuSample::read();
            let utilization = match (previous.as_ref(), now.as_ref()) {
                (Some(a), Some(b)) => b.utilization_since(a),
                _ => None,
            };
            *previous = now;
            utilization
        };
        let memory = MemInfo::read().map(|m| (m.total, m.total.saturating_sub(m.available)));
        let runners = self.server.runners().map(|r| r.statuses()).unwrap_or_default();
        exposition::families(&models, System { cpu, memory }, &runners)
    }
}

/// Every ready model version, with its tenant id on a multi-tenant server (workers), where a
/// key without a tenant is left out rather than shown tenant-less.
fn loaded_models(server: &ServerState) -> Vec<(Option<String>, Arc<LoadedModel>)> {
    if !server.is_multi_tenant() {
        return server.manager.all_ready().into_iter().map(|m| (None, m)).collect();
    }
    let mut out = Vec::new();
    for (key, versions) in server.manager.installed() {
        let Some((tenant, _)) = key.split_once('/').filter(|(tenant, _)| !tenant.is_empty()) else { continue };
        for version in versions {
            if let Ok(m) = server.manager.get(&key, Some(version)) {
                out.push((Some(tenant.to_string()), m));
            }
        }
    }
    out
}

/// More families for the metrics endpoint (a worker's GPU metrics and slice health). Rendering
/// runs on the async runtime: it reads what was sampled before, it never blocks.
pub trait MetricsSource: Send + Sync {
    /// Appends its families in the Prometheus text format.
    fn render_metrics(&self, out: &mut String);
}

/// Writes a family's `# HELP` and `# TYPE` lines.
pub(crate) fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value escaped for the Prometheus text format.
pub(crate) fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Aggregate CPU jiffies from `/proc/stat`.
#[derive(Debug, Clone, Copy)]
struct CpuSample {
    busy: u64,
    total: u64,
}

impl CpuSample {
    fn read() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    fn parse(text: &str) -> Option<Self> {
        let line = text.lines().find(|l| l.starts_with("cpu "))?;
        let values: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
        let total: u64 = values.iter().take(8).sum();
        let idle = values.get(3)? + values.get(4).copied().unwrap_or(0);
        Some(Self { busy: total.saturating_sub(idle), total })
    }

    fn utilization_since(&self, before: &CpuSample) -> Option<f64> {
        let total = self.total.checked_sub(before.total).filter(|t| *t > 0)?;
        Some(self.busy.saturating_sub(before.busy) as f64 / total as f64)
    }
}

/// Memory totals from `/proc/meminfo`.
#[derive(Debug, Clone, Copy)]
struct MemInfo {
    total: u64,
    available: u64,
}

impl MemInfo {
    fn read() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/meminfo").ok()?)
    }

    fn parse(text: &str) -> Option<Self> {
        let field = |name: &str| -> Option<u64> {
            let line = text.lines().find(|l| l.starts_with(name))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
        };
        Some(Self { total: field("MemTotal:")?, available: field("MemAvailable:")? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_tokens_admit_only_themselves() {
        let token: MetricsToken = "s3cret\n".parse().expect("a token");
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().expect("header value"));
            h
        };
        assert!(token.admits(&with("Bearer s3cret")));
        assert!(token.admits(&with("bearer s3cret")));
        assert!(!token.admits(&with("Bearer s3cre")));
        assert!(!token.admits(&with("Basic s3cret")));
        assert!(!token.admits(&http::HeaderMap::new()));
        assert!(" \n".parse::<MetricsToken>().is_err());
        assert!(!format!("{token:?}").contains("s3cret"));
    }

    #[test]
    fn cpu_and_memory_parse_from_proc_files() {
        let a = CpuSample::parse("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3").expect("cpu line");
        let b = CpuSample::parse("cpu  150 0 150 900 0 0 0 0 0 0").expect("cpu line");
        assert_eq!(b.utilization_since(&a), Some(0.5));
        let mem = MemInfo::parse("MemTotal:  1000 kB\nMemFree: 10 kB\nMemAvailable:   250 kB\n").expect("meminfo");
        assert_eq!((mem.total, mem.available), (1_024_000, 256_000));
    }
}
