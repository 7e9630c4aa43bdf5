//! The gateway's Prometheus metrics, kept with the `prometheus` crate: requests and latency per
//! tenant (its id, as workers label theirs), model, routed version and protocol (so a canary's error rate and latency show beside
//! the stable version's), throttled requests, retries, ejections and upstream health.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use super::Gateway;
use crate::serve::metrics::{MetricsToken, require_token};

/// Latency buckets, seconds: 100 µs to 30 s.
const LATENCY_BUCKETS: [f64; 16] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0];

/// Every family the gateway exports.
#[derive(Clone)]
pub struct GatewayMetrics {
    registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    throttled: IntCounterVec,
    retries: IntCounterVec,
    ejections: IntCounterVec,
    upstreams: IntGaugeVec,
    route_updates: IntCounter,
    route_age: IntGauge,
}

fn expect<T>(made: prometheus::Result<T>) -> T {
    match made {
        Ok(v) => v,
        // The names and labels are constants checked by the tests below.
        Err(e) => unreachable!("invalid metric definition: {e}"),
    }
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = expect(IntCounterVec::new(Opts::new(name, help), labels));
            expect(registry.register(Box::new(c.clone())));
            c
        };
        let requests = counter(
            "tessera_gateway_requests_total",
            "Inference and model requests answered by the gateway, by tenant, model, routed version, protocol and status code.",
            &["tenant", "model", "version", "protocol", "code"],
        );
        let throttled = counter(
            "tessera_gateway_throttled_total",
            "Requests refused by a tenant's rate or concurrency limit.",
            &["tenant", "reason"],
        );
        let retries = counter(
            "tessera_gateway_retries_total",
            "Requests sent again to another replica before any of it ran (unreachable or draining replica).",
            &["reason"],
        );
        let ejections =
            counter("tessera_gateway_ejections_total", "Upstream workers ejected after failures.", &["worker"]);
        let route_updates = expect(IntCounter::new(
            "tessera_gateway_route_updates_total",
            "Route tables received from the control plane.",
        ));
        expect(registry.register(Box::new(route_updates.clone())));
        let duration = expect(HistogramVec::new(
            HistogramOpts::new(
                "tessera_gateway_request_duration_seconds",
                "Time from a request's arrival at the gateway to its response head, by tenant, model, routed version and protocol.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["tenant", "model", "version", "protocol"],
        ));
        expect(registry.register(Box::new(duration.clone())));
        let upstreams = expect(IntGaugeVec::new(
            Opts::new("tessera_gateway_upstreams", "Upstream workers in the route table, by state."),
            &["state"],
        ));
        expect(registry.register(Box::new(upstreams.clone())));
        let route_age = expect(IntGauge::new(
            "tessera_gateway_route_table_age_seconds",
            "Seconds since the last route table arrived (grows while the control plane is unreachable).",
        ));
        expect(registry.register(Box::new(route_age.clone())));
        // Every reason shows from the start (at 0), so a rate over it is defined before the first.
        for reason in ["unreachable", "stale_route"] {
            retries.with_label_values(&[reason]);
        }
        Self { registry, requests, duration, throttled, retries, ejections, upstreams, route_updates, route_age }
    }
}

impl GatewayMetrics {
    /// Counts one answered request and its latency.
    pub fn observe(&self, tenant: &str, model: &str, version: &str, protocol: &str, code: &str, elapsed: Duration) {
        self.requests.with_label_values(&[tenant, model, version, protocol, code]).inc();
        self.duration.with_label_values(&[tenant, model, version, protocol]).observe(elapsed.as_secs_f64());
    }

    /// Counts a throttled request.
    pub fn throttled(&self, tenant: &str, reason: &str) {
        self.throttled.with_label_values(&[tenant, reason]).inc();
    }

    /// Counts a retry on another replica.
    pub fn retried(&self, reason: &str) {
        self.retries.with_label_values(&[reason]).inc();
    }

    /// Counts an ejection.
    pub fn ejected(&self, worker: &str) {
        self.ejections.with_label_values(&[worker]).inc();
    }

    /// Counts a route table received.
    pub fn route_update(&self) {
        self.route_updates.inc();
    }

    /// The text exposition, with the gauges read now.
    pub fn render(&self, gateway: &Gateway) -> Vec<u8> {
        let now = Instant::now();
        let routes = gateway.routes();
        let (mut healthy, mut ejected) = (0, 0);
        for u in routes.upstreams() {
            if u.is_ejected(now) {
                ejected += 1;
            } else {
                healthy += 1;
            }
        }
        self.upstreams.with_label_values(&["healthy"]).set(healthy);
        self.upstreams.with_label_values(&["ejected"]).set(ejected);
        let age = gateway.route_table_age().map_or(-1, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.route_age.set(age);
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "could not encode the gateway's metrics");
        }
        if let Some(revocations) = gateway.revocations() {
            let mut text = String::new();
            crate::serve::metrics::MetricsSource::render_metrics(&*revocations, &mut text);
            out.extend_from_slice(text.as_bytes());
        }
        out
    }
}

/// The metrics listener's router (`GET /metrics`), behind the bearer token when one is set.
pub fn router(gateway: Arc<Gateway>, token: Option<MetricsToken>) -> Router {
    let router = Router::new().route("/metrics", get(handle_metrics)).with_state(gateway);
    match token {
        Some(token) => router.layer(axum::middleware::from_fn_with_state(token, require_token)),
        None => router,
    }
}

async fn handle_metrics(State(gateway): State<Arc<Gateway>>) -> Response {
    let body = gateway.metrics.render(&gateway);
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_defined_and_exported() {
        let m = GatewayMetrics::default();
        m.observe("acme", "mlp", "2", "http", "200", Duration::from_micros(300));
        m.throttled("acme", "rate");
        m.retried("unreachable");
        m.ejected("w1");
        m.route_update();
        let text = String::from_utf8(m.render(&Gateway::for_tests())).expect("utf-8");
        for family in [
            "tessera_gateway_requests_total{code=\"200\",model=\"mlp\",protocol=\"http\",tenant=\"acme\",version=\"2\"} 1",
            "tessera_gateway_request_duration_seconds_bucket",
            "tessera_gateway_throttled_total{reason=\"rate\",tenant=\"acme\"} 1",
            "tessera_gateway_retries_total{reason=\"unreachable\"} 1",
            "tessera_gateway_ejections_total{worker=\"w1\"} 1",
            "tessera_gateway_upstreams{state=\"healthy\"} 0",
            "tessera_gateway_route_updates_total 1",
            "tessera_gateway_route_table_age_seconds -1",
        ] {
            assert!(text.contains(family), "missing {family} in\n{text}");
        }
    }
}
