//! Control-plane metrics, all defined here; exposed at `/metrics`.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

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
