//! Control-plane metrics, all defined here; exposed at `/metrics`.

use std::sync::LazyLock;
use std::time::Duration;

use anyhow::Context;
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};
use sha2::{Digest, Sha256};

use crate::states::{ReplicaState, WorkerState};

/// The bearer token `/metrics` requires. Only its sha256 is kept; a presented token is hashed
/// and the digests compared in constant time, so timing says nothing about the token.
#[derive(Clone, PartialEq, Eq)]
pub struct MetricsToken([u8; 32]);

impl std::fmt::Debug for MetricsToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsToken([redacted])")
    }
}

impl MetricsToken {
    /// A token from its text (surrounding white space dropped); refuses an empty one.
    pub fn new(token: &str) -> anyhow::Result<Self> {
        let token = token.trim();
        anyhow::ensure!(!token.is_empty(), "the metrics token is empty");
        Ok(MetricsToken(Sha256::digest(token.as_bytes()).into()))
    }

    /// Reads a token file (Prometheus reads the same file as `credentials_file`).
    pub fn from_file(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        Self::new(&text).with_context(|| format!("read {}", path.display()))
    }

    /// Whether `headers` carry `Authorization: Bearer <this token>`.
    pub fn admits(&self, headers: &http::HeaderMap) -> bool {
        let presented = headers
            .get(http::header::AUTHORIZATION)
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

/// The control plane's metric registry.
pub static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);

/// Duration of each registry query, by query label and outcome (`ok`, `error`).
static QUERY_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    let opts = HistogramOpts::new("tessera_registry_query_duration_seconds", "Duration of registry queries.")
        .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]);
    let h = HistogramVec::new(opts, &["query", "outcome"]).expect("valid histogram definition");
    REGISTRY.register(Box::new(h.clone())).expect("metric registered once");
    h
});

/// `/v1` responses by route template, method and status class (`2xx`..`5xx`).
static HTTP_RESPONSES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let opts = Opts::new("tessera_api_responses_total", "Responses of the /v1 API.");
    let c = IntCounterVec::new(opts, &["method", "route", "class"]).expect("valid counter definition");
    REGISTRY.register(Box::new(c.clone())).expect("metric registered once");
    c
});

/// Scheduler ticks by outcome (`idle`: nothing to do, `applied`, `error`); only the leader ticks.
static SCHEDULER_TICKS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let opts = Opts::new("tessera_scheduler_ticks_total", "Scheduler ticks run by this control plane, by outcome.");
    let c = IntCounterVec::new(opts, &["outcome"]).expect("valid counter definition");
    REGISTRY.register(Box::new(c.clone())).expect("metric registered once");
    c
});

/// Duration of whole scheduler ticks (read, plan, apply).
static SCHEDULER_TICK_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    let opts = HistogramOpts::new("tessera_scheduler_tick_duration_seconds", "Duration of scheduler ticks.")
        .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]);
    let h = Histogram::with_opts(opts).expect("valid histogram definition");
    REGISTRY.register(Box::new(h.clone())).expect("metric registered once");
    h
});

/// Replicas by state as of the leader's last tick.
static REPLICAS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    let opts = Opts::new("tessera_replicas", "Deployment replicas by state, as of the last scheduler tick.");
    let g = IntGaugeVec::new(opts, &["state"]).expect("valid gauge definition");
    REGISTRY.register(Box::new(g.clone())).expect("metric registered once");
    g
});

/// Workers by state as of the leader's last tick.
static WORKERS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    let opts = Opts::new("tessera_workers", "Registered workers by state, as of the last scheduler tick.");
    let g = IntGaugeVec::new(opts, &["state"]).expect("valid gauge definition");
    REGISTRY.register(Box::new(g.clone())).expect("metric registered once");
    g
});

/// Replicas the scheduler could not place (one per unplaceable decision).
static PLACEMENT_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    let c = IntCounter::new("tessera_scheduler_placement_failures_total", "Replica placements that found no slice.")
        .expect("valid counter definition");
    REGISTRY.register(Box::new(c.clone())).expect("metric registered once");
    c
});

/// Usage records received, by outcome (`stored`, `duplicate`).
static USAGE_RECORDS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let opts = Opts::new("tessera_usage_records_total", "Usage records received from workers, by outcome.");
    let c = IntCounterVec::new(opts, &["outcome"]).expect("valid counter definition");
    REGISTRY.register(Box::new(c.clone())).expect("metric registered once");
    c
});

/// Audit checkpoints by outcome (`signed`; `refused`: the chain no longer extends the last
/// checkpoint, a sign of tampering; `error`: the database or store failed).
static AUDIT_CHECKPOINTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let opts = Opts::new("tessera_audit_checkpoints_total", "Audit chain checkpoints by outcome.");
    let c = IntCounterVec::new(opts, &["outcome"]).expect("valid counter definition");
    REGISTRY.register(Box::new(c.clone())).expect("metric registered once");
    c
});

/// Webhook delivery attempts by what the delivery became (`delivered`; `pending`: failed, to be
/// retried; `failed`: failed for good).
static WEBHOOK_ATTEMPTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let opts = Opts::new("tessera_webhook_attempts_total", "Webhook delivery attempts by resulting status.");
    let c = IntCounterVec::new(opts, &["status"]).expect("valid counter definition");
    REGISTRY.register(Box::new(c.clone())).expect("metric registered once");
    c
});

/// Entries of the revocation list this replica holds, by kind (`key`, `user`).
static REVOCATIONS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    let opts = Opts::new(
        "tessera_revocation_list_entries",
        "Revoked API keys and disabled users on the revocation list pushed to workers and gateways, by kind.",
    );
    let g = IntGaugeVec::new(opts, &["kind"]).expect("valid gauge definition");
    REGISTRY.register(Box::new(g.clone())).expect("metric registered once");
    g
});

/// Replica and worker states the gauges always show (so a state that empties reads 0).
static REPLICA_STATES: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| ReplicaState::ALL.iter().map(|s| s.as_str()).collect());
static WORKER_STATES: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| WorkerState::ALL.iter().map(|s| s.as_str()).collect());

/// Records one scheduler tick: its outcome, duration, placement failures, and the replica and
/// worker states it saw.
pub fn observe_tick<'a>(
    outcome: &'static str,
    elapsed: Duration,
    placement_failures: u64,
    replica_states: impl IntoIterator<Item = &'a str>,
    worker_states: impl IntoIterator<Item = &'a str>,
) {
    SCHEDULER_TICKS.with_label_values(&[outcome]).inc();
    SCHEDULER_TICK_SECONDS.observe(elapsed.as_secs_f64());
    PLACEMENT_FAILURES.inc_by(placement_failures);
    set_counts(&REPLICAS, &REPLICA_STATES, replica_states);
    set_counts(&WORKERS, &WORKER_STATES, worker_states);
}

/// Sets one gauge per known state to how often it occurs; unknown states count as `other`.
fn set_counts<'a>(gauge: &IntGaugeVec, known: &[&str], states: impl IntoIterator<Item = &'a str>) {
    let mut counts: std::collections::BTreeMap<&str, i64> = known.iter().map(|s| (*s, 0)).collect();
    for s in states {
        let label = if known.contains(&s) { s } else { "other" };
        *counts.entry(label).or_insert(0) += 1;
    }
    for (state, n) in counts {
        gauge.with_label_values(&[state]).set(n);
    }
}

/// Records one usage delivery.
pub fn observe_usage(stored: u64, duplicates: u64) {
    USAGE_RECORDS.with_label_values(&["stored"]).inc_by(stored);
    USAGE_RECORDS.with_label_values(&["duplicate"]).inc_by(duplicates);
}

/// Records one audit checkpoint attempt: `signed`, `refused` or `error`.
pub fn observe_checkpoint(outcome: &'static str) {
    AUDIT_CHECKPOINTS.with_label_values(&[outcome]).inc();
}

/// Records one webhook delivery attempt.
pub fn observe_webhook_attempt(status: &'static str) {
    WEBHOOK_ATTEMPTS.with_label_values(&[status]).inc();
}

/// Records the revocation list's size.
pub fn observe_revocations(keys: usize, users: usize) {
    REVOCATIONS.with_label_values(&["key"]).set(i64::try_from(keys).unwrap_or(i64::MAX));
    REVOCATIONS.with_label_values(&["user"]).set(i64::try_from(users).unwrap_or(i64::MAX));
}

/// Records one registry query.
pub fn observe_query(label: &'static str, elapsed: Duration, ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    QUERY_SECONDS.with_label_values(&[label, outcome]).observe(elapsed.as_secs_f64());
}

/// Records one API response.
pub fn observe_response(method: &str, route: &str, status: u16) {
    let class = match status {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    HTTP_RESPONSES.with_label_values(&[method, route, class]).inc();
}

/// The metrics in Prometheus text format.
pub fn render() -> String {
    let encoder = prometheus::TextEncoder::new();
    encoder.encode_to_string(&REGISTRY.gather()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_tokens_admit_only_themselves() {
        let token = MetricsToken::new("s3cret\n").expect("a token");
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(http::header::AUTHORIZATION, v.parse().expect("header value"));
            h
        };
        assert!(token.admits(&with("Bearer s3cret")));
        assert!(token.admits(&with("bearer s3cret")));
        assert!(!token.admits(&with("Bearer s3cre")));
        assert!(!token.admits(&with("Basic s3cret")));
        assert!(!token.admits(&http::HeaderMap::new()));
        assert!(MetricsToken::new(" \n").is_err());
        assert!(!format!("{token:?}").contains("s3cret"));
    }

    #[test]
    fn state_gauges_count_every_known_state_and_lump_the_rest() {
        let gauge = IntGaugeVec::new(Opts::new("t_states", "test"), &["state"]).unwrap();
        set_counts(&gauge, &REPLICA_STATES, ["ready", "ready", "pending", "weird"]);
        let read = |s: &str| gauge.with_label_values(&[s]).get();
        assert_eq!((read("ready"), read("pending"), read("failed"), read("other")), (2, 1, 0, 1));
        set_counts(&gauge, &REPLICA_STATES, ["pending"]);
        assert_eq!((read("ready"), read("pending")), (0, 1), "a state that empties reads 0");
    }

    #[test]
    fn ticks_and_usage_show_in_the_text() {
        observe_tick("idle", Duration::from_millis(3), 2, ["ready"], ["ready", "lost"]);
        observe_usage(5, 1);
        let text = render();
        for needle in [
            "tessera_scheduler_ticks_total{outcome=\"idle\"}",
            "tessera_scheduler_tick_duration_seconds_bucket",
            "tessera_scheduler_placement_failures_total",
            "tessera_replicas{state=\"ready\"}",
            "tessera_workers{state=\"lost\"} 1",
            "tessera_usage_records_total{outcome=\"duplicate\"}",
        ] {
            assert!(text.contains(needle), "{needle} missing");
        }
    }
}
