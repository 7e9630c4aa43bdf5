//! The Prometheus endpoint: Triton's `nv_inference_*` families per model version (with Triton's
//! `model`/`version` labels), CPU metrics, and latency and batch-size histograms beyond Triton.
//! Counters come from the same statistics the statistics extension serves, so both agree.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tessera_protocol::inference::{ModelStatistics, StatisticDuration};

use crate::engine::model::LoadedModel;
use crate::engine::stats::{FailReason, Histogram, ModelStats};
use crate::serve::server::ServerState;

/// State of the metrics listener: the server plus the previous CPU sample.
struct MetricsState {
    server: Arc<ServerState>,
    /// Previous `/proc/stat` totals; each scrape reports utilisation since the last one.
    cpu: Mutex<Option<CpuSample>>,
}

/// Builds the router for the metrics listener: behind `Authorization: Bearer <token>` when
/// the server has a metrics token, open otherwise.
pub fn router(server: Arc<ServerState>) -> Router {
    let token = server.metrics_token().cloned();
    let state = Arc::new(MetricsState { server, cpu: Mutex::new(None) });
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
    let loaded = loaded_models(&state.server);
    let models: Vec<ModelMetrics<'_>> = loaded
        .iter()
        .map(|(tenant, m)| ModelMetrics {
            snapshot: m.stats.snapshot(&m.spec.name, &m.version.to_string()),
            tenant: tenant.as_deref(),
            stats: &m.stats,
            pending: m.pending(),
        })
        .collect();
    let mut text = render(&models);
    let cpu = {
        let mut previous = state.cpu.lock();
        let now = CpuSample::read();
        let utilization = match (previous.as_ref(), now.as_ref()) {
            (Some(a), Some(b)) => b.utilization_since(a),
            _ => None,
        };
        *previous = now;
        utilization
    };
    render_system(&mut text, cpu, MemInfo::read());
    if let Some(runners) = state.server.runners() {
        render_runners(&mut text, &runners.statuses());
    }
    if let Some(usage) = state.server.usage() {
        usage.render_metrics(&mut text);
    }
    if let Some(capture) = state.server.capture() {
        capture.render_metrics(&mut text);
    }
    for source in state.server.metrics_sources() {
        source.render_metrics(&mut text);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
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

/// One model version's numbers for a scrape.
pub struct ModelMetrics<'a> {
    /// Counters as the statistics extension reports them.
    pub snapshot: ModelStatistics,
    /// Tenant id on workers (a `tenant` label first); `None` for `serve`.
    pub tenant: Option<&'a str>,
    /// Live statistics (failure reasons, histograms).
    pub stats: &'a ModelStats,
    /// Requests waiting in the queue.
    pub pending: usize,
}

/// One counter family read from a statistics snapshot.
struct Family {
    name: &'static str,
    help: &'static str,
    value: fn(&ModelStatistics) -> u64,
}

fn dur(d: Option<StatisticDuration>) -> StatisticDuration {
    d.unwrap_or_default()
}

const FAMILIES: &[Family] = &[
    Family {
        name: "nv_inference_request_success",
        help: "Number of successful inference requests, all batch sizes",
        value: |s| dur(s.inference_stats.and_then(|i| i.success)).count,
    },
    Family {
        name: "nv_inference_count",
        help: "Number of inferences performed (does not include cached requests)",
        value: |s| s.inference_count,
    },
    Family {
        name: "nv_inference_exec_count",
        help: "Number of model executions performed (does not include cached requests)",
        value: |s| s.execution_count,
    },
    Family {
        name: "nv_inference_request_duration_us",
        help: "Cumulative inference request duration in microseconds (includes cached requests)",
        value: |s| dur(s.inference_stats.and_then(|i| i.success)).ns / 1000,
    },
    Family {
        name: "nv_inference_queue_duration_us",
        help: "Cumulative inference queuing duration in microseconds (includes cached requests)",
        value: |s| dur(s.inference_stats.and_then(|i| i.queue)).ns / 1000,
    },
    Family {
        name: "nv_inference_compute_input_duration_us",
        help: "Cumulative compute input duration in microseconds (does not include cached requests)",
        value: |s| dur(s.inference_stats.and_then(|i| i.compute_input)).ns / 1000,
    },
    Family {
        name: "nv_inference_compute_infer_duration_us",
        help: "Cumulative compute inference duration in microseconds (does not include cached requests)",
        value: |s| dur(s.inference_stats.and_then(|i| i.compute_infer)).ns / 1000,
    },
    Family {
        name: "nv_inference_compute_output_duration_us",
        help: "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        value: |s| dur(s.inference_stats.and_then(|i| i.compute_output)).ns / 1000,
    },
    Family {
        name: "nv_cache_num_hits_per_model",
        help: "Number of cache hits per model",
        value: |s| dur(s.inference_stats.and_then(|i| i.cache_hit)).count,
    },
    Family {
        name: "nv_cache_hit_duration_per_model",
        help: "Total cache hit duration per model, in microseconds",
        value: |s| dur(s.inference_stats.and_then(|i| i.cache_hit)).ns / 1000,
    },
    Family {
        name: "nv_cache_num_misses_per_model",
        help: "Number of cache misses per model",
        value: |s| dur(s.inference_stats.and_then(|i| i.cache_miss)).count,
    },
    Family {
        name: "nv_cache_miss_duration_per_model",
        help: "Total cache miss (insert+lookup) duration per model, in microseconds",
        value: |s| dur(s.inference_stats.and_then(|i| i.cache_miss)).ns / 1000,
    },
];

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

fn labels(m: &ModelMetrics<'_>) -> String {
    let (name, version) = (escape(&m.snapshot.name), escape(&m.snapshot.version));
    match m.tenant {
        Some(tenant) => format!("tenant=\"{}\",model=\"{name}\",version=\"{version}\"", escape(tenant)),
        None => format!("model=\"{name}\",version=\"{version}\""),
    }
}

/// Renders the per-model families for the given model versions.
pub fn render(models: &[ModelMetrics<'_>]) -> String {
    let mut out = String::new();
    for family in FAMILIES {
        header(&mut out, family.name, family.help, "counter");
        for m in models {
            let _ = writeln!(out, "{}{{{}}} {}", family.name, labels(m), (family.value)(&m.snapshot));
        }
    }
    header(&mut out, "nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "counter");
    for m in models {
        for reason in FailReason::ALL {
            let n = m.stats.failures(reason);
            let _ = writeln!(out, "nv_inference_request_failure{{{},reason=\"{}\"}} {n}", labels(m), reason.as_str());
        }
    }
    header(
        &mut out,
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
    );
    for m in models {
        let _ = writeln!(out, "nv_inference_pending_request_count{{{}}} {}", labels(m), m.pending);
    }
    type Pick = fn(&ModelStats) -> &Histogram;
    let histograms: [(&str, &str, Pick); 2] = [
        ("tessera_inference_request_duration_us", "Successful request latency in microseconds", |s| &s.latency_us),
        ("tessera_inference_batch_size", "Items per model execution (the batch the dynamic batcher formed)", |s| {
            &s.batch_sizes
        }),
    ];
    for (name, help, pick) in histograms {
        header(&mut out, name, help, "histogram");
        for m in models {
            let (buckets, sum) = pick(m.stats).snapshot();
            let l = labels(m);
            let mut count = 0;
            for (bound, cumulative) in buckets {
                let le = bound.map_or_else(|| "+Inf".to_string(), |b| b.to_string());
                let _ = writeln!(out, "{name}_bucket{{{l},le=\"{le}\"}} {cumulative}");
                count = cumulative;
            }
            let _ = writeln!(out, "{name}_sum{{{l}}} {sum}");
            let _ = writeln!(out, "{name}_count{{{l}}} {count}");
        }
    }
    out
}

fn render_system(out: &mut String, cpu: Option<f64>, mem: Option<MemInfo>) {
    if let Some(cpu) = cpu {
        header(out, "nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge");
        let _ = writeln!(out, "nv_cpu_utilization {cpu:.4}");
    }
    if let Some(mem) = mem {
        header(out, "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "gauge");
        let _ = writeln!(out, "nv_cpu_memory_total_bytes {}", mem.total);
        header(out, "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "gauge");
        let _ = writeln!(out, "nv_cpu_memory_used_bytes {}", mem.total.saturating_sub(mem.available));
    }
}

/// Runner processes: up or down, restarts by reason, resident memory.
fn render_runners(out: &mut String, runners: &[crate::runner::RunnerStatus]) {
    let labels =
        |r: &crate::runner::RunnerStatus| format!("tenant=\"{}\",slice=\"{}\"", escape(&r.tenant), escape(&r.slice));
    header(
        out,
        "tessera_runner_up",
        "Whether the runner process of a tenant's slice is serving (1) or restarting (0)",
        "gauge",
    );
    for r in runners {
        let _ = writeln!(out, "tessera_runner_up{{{}}} {}", labels(r), u8::from(r.pid != 0));
    }
    let help =
        "Times a runner process died and was started again, by reason (killed, oom, hung, signal, exit, spawn_failed)";
    header(out, "tessera_runner_restarts_total", help, "counter");
    for r in runners {
        for reason in RESTART_REASONS {
            let n = r.restarts.get(reason).copied().unwrap_or(0);
            let _ = writeln!(out, "tessera_runner_restarts_total{{{},reason=\"{reason}\"}} {n}", labels(r));
        }
    }
    header(out, "tessera_runner_resident_memory_bytes", "Resident memory of a runner process", "gauge");
    for r in runners {
        if let Some(bytes) = r.rss_bytes {
            let _ = writeln!(out, "tessera_runner_resident_memory_bytes{{{}}} {bytes}", labels(r));
        }
    }
    let help = "Tensor bytes exchanged with a runner process, by direction and path (inline in the socket frame, or through its shared-memory arenas)";
    header(out, "tessera_runner_tensor_bytes_total", help, "counter");
    for r in runners {
        for (direction, paths) in ["request", "response"].iter().zip(r.tensor_bytes) {
            for (path, n) in ["inline", "shared_memory"].iter().zip(paths) {
                let _ = writeln!(
                    out,
                    "tessera_runner_tensor_bytes_total{{{},direction=\"{direction}\",path=\"{path}\"}} {n}",
                    labels(r)
                );
            }
        }
    }
}

/// The closed set of runner restart reasons.
const RESTART_REASONS: [&str; 6] = ["killed", "oom", "hung", "signal", "exit", "spawn_failed"];

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
    use crate::engine::stats::{Execution, ModelStats};

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
    fn families_render_with_model_and_version_labels() {
        let stats = ModelStats::default();
        stats.success.record(2_000);
        stats.latency_us.observe(2);
        stats.record_execution(Execution { batch_size: 3, input_ns: 0, infer_ns: 0, output_ns: 0 });
        stats.record_failure_reason(FailReason::Rejected);
        let models =
            [ModelMetrics { snapshot: stats.snapshot("add_sub", "1"), tenant: None, stats: &stats, pending: 5 }];
        let text = render(&models);
        let l = "model=\"add_sub\",version=\"1\"";
        for line in [
            format!("nv_inference_request_success{{{l}}} 1"),
            format!("nv_inference_count{{{l}}} 3"),
            format!("nv_inference_request_duration_us{{{l}}} 2"),
            format!("nv_inference_request_failure{{{l},reason=\"REJECTED\"}} 1"),
            format!("nv_inference_pending_request_count{{{l}}} 5"),
            format!("tessera_inference_batch_size_bucket{{{l},le=\"2\"}} 0"),
            format!("tessera_inference_batch_size_bucket{{{l},le=\"4\"}} 1"),
            format!("tessera_inference_batch_size_count{{{l}}} 1"),
            format!("tessera_inference_request_duration_us_bucket{{{l},le=\"+Inf\"}} 1"),
        ] {
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn on_workers_every_model_series_carries_the_tenant_first() {
        let stats = ModelStats::default();
        stats.success.record(1_000);
        let models =
            [ModelMetrics { snapshot: stats.snapshot("m", "2"), tenant: Some("t-1"), stats: &stats, pending: 0 }];
        let text = render(&models);
        let series: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert!(series.len() > 20, "{text}");
        for line in series {
            assert!(line.contains("{tenant=\"t-1\",model=\"m\",version=\"2\""), "{line}");
        }
    }

    #[test]
    fn cpu_and_memory_parse_from_proc_files() {
        let a = CpuSample::parse("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3").expect("cpu line");
        let b = CpuSample::parse("cpu  150 0 150 900 0 0 0 0 0 0").expect("cpu line");
        assert_eq!(b.utilization_since(&a), Some(0.5));
        let mem = MemInfo::parse("MemTotal:  1000 kB\nMemFree: 10 kB\nMemAvailable:   250 kB\n").expect("meminfo");
        assert_eq!((mem.total, mem.available), (1_024_000, 256_000));
        let mut out = String::new();
        render_system(&mut out, Some(0.25), Some(mem));
        assert!(out.contains("nv_cpu_utilization 0.2500") && out.contains("nv_cpu_memory_used_bytes 768000"));
    }
}
