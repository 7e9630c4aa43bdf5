//! The spans as the log lines show them (JSON lines captured from a request through the HTTP
//! front end), and what a span costs on and off (`span_cost`, ignored: a measurement).

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use parking_lot::Mutex;
use serde_json::Value;
use tower::Service;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::prelude::*;

use super::*;
use crate::auth::test_support::*;

/// Log output kept in memory.
#[derive(Clone, Default)]
pub(crate) struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = Lines;

    fn make_writer(&'a self) -> Lines {
        self.clone()
    }
}

impl Lines {
    /// Every line as JSON.
    pub(crate) fn json(&self) -> Vec<Value> {
        let text = String::from_utf8(self.0.lock().clone()).expect("utf-8 lines");
        text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
    }

    /// The `span` object of the line whose message is `message`.
    pub(crate) fn span_of(&self, message: &str) -> Value {
        let lines = self.json();
        let line = lines.iter().find(|l| l["message"] == message);
        line.unwrap_or_else(|| panic!("no '{message}' line in {lines:?}"))["span"].clone()
    }
}

/// JSON lines as production writes them (`logging::init(true, ..)`), everything of this crate
/// down to TRACE, for this thread (a current-thread runtime runs every task here).
pub(crate) fn capture() -> (Lines, tracing::subscriber::DefaultGuard) {
    let lines = Lines::default();
    let layer = tracing_subscriber::fmt::layer().json().flatten_event(true).with_writer(lines.clone());
    let subscriber = tracing_subscriber::registry().with(EnvFilter::new("tessera_data_plane=trace")).with(layer);
    (lines, tracing::subscriber::set_default(subscriber))
}

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

async fn infer(router: &axum::Router, body: Value, traceparent: Option<&str>) -> StatusCode {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri("/v2/models/add_sub/infer")
        .header(header::AUTHORIZATION, format!("Bearer {A_INFERENCE}"));
    if let Some(tp) = traceparent {
        request = request.header("traceparent", tp);
    }
    let request = request.body(Body::from(body.to_string())).expect("a request");
    router.clone().call(request).await.expect("infallible").status()
}

#[tokio::test]
async fn a_requests_lines_carry_its_span_and_the_callers_trace_id() {
    let (lines, _guard) = capture();
    let (state, _dir) = tenant_state().await;
    let router = crate::serve::http::router(state);
    let mut body = add_sub_request();
    body["id"] = "req-7".into();
    assert_eq!(infer(&router, body, Some(TRACEPARENT)).await, StatusCode::OK);
    let span = lines.span_of("request answered");
    assert_eq!(span["name"], "request");
    assert_eq!(span["protocol"], "http");
    assert_eq!(span["tenant"], TENANT_A);
    assert_eq!(span["model"], "add_sub");
    assert_eq!(span["version"], 1);
    assert_eq!(span["request_id"], "req-7");
    assert_eq!(span["trace_id"], "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(span["parent_span_id"], "b7ad6b7169203331");
}

#[tokio::test]
async fn a_request_without_an_id_or_traceparent_is_numbered_and_a_failure_logs_at_debug() {
    let (lines, _guard) = capture();
    let (state, _dir) = tenant_state().await;
    let router = crate::serve::http::router(state);
    assert_eq!(infer(&router, add_sub_request(), None).await, StatusCode::OK);
    let span = lines.span_of("request answered");
    assert!(span["request_id"].as_str().is_some_and(|id| id.starts_with('#')), "{span}");
    assert!(span.get("trace_id").is_none(), "{span}");

    let mut bad = add_sub_request();
    bad["inputs"][0]["shape"] = serde_json::json!([1, 3]);
    assert_eq!(infer(&router, bad, Some("not-a-traceparent")).await, StatusCode::BAD_REQUEST);
    let failed = lines.json().into_iter().find(|l| l["message"] == "request failed").expect("a failure line");
    assert_eq!(failed["level"], "DEBUG");
    assert_eq!(failed["span"]["model"], "add_sub");
    assert!(failed["span"].get("trace_id").is_none(), "{failed}");
}

#[test]
fn a_batch_follows_its_requests_and_spans_stay_off_below_their_level() {
    let (_lines, _guard) = capture();
    let traceparent = || Some(TRACEPARENT);
    let origin = Origin { protocol: "grpc", traceparent: &traceparent };
    let requests = [request(&origin, Some("t"), "m"), request(&origin, None, "m")];
    assert!(requests.iter().all(|s| !s.is_disabled()));
    let batch = batch("m", 2, 3, requests.iter());
    assert!(!batch.is_disabled());
    drop(_guard);
    let subscriber = tracing_subscriber::registry().with(EnvFilter::new("info"));
    tracing::subscriber::with_default(subscriber, || {
        assert!(request(&origin, Some("t"), "m").is_disabled());
        assert!(current().is_disabled());
        assert!(!install("t/m", 1).is_disabled());
    });
}

/// Nanoseconds per call of `f`, over `n` calls.
fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

/// One request's span work as the facade and front ends do it, with one event inside.
fn one_request(origin: &Origin<'_>, event: bool) {
    let span = request(origin, Some("0b8a4a5e-1d0c-4f7e-9a51-5b1d1c2f3a01"), "add_sub");
    resolved(&span, 1);
    let _entered = span.enter();
    name_request("");
    if event {
        tracing::trace!("request answered");
    }
}

/// `cargo test --release -p tessera-data-plane span_cost -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, not a check"]
fn span_cost() {
    let traceparent = || Some(TRACEPARENT);
    let origin = Origin { protocol: "http", traceparent: &traceparent };
    let n = 200_000;
    let off = tracing_subscriber::registry()
        .with(EnvFilter::new("info"))
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::sink));
    let off = tracing::subscriber::with_default(off, || per_call(n, || one_request(&origin, true)));
    println!("spans off (default filter):   {off:>8.0} ns per request");
    for json in [false, true] {
        let layer = tracing_subscriber::fmt::layer().with_writer(std::io::sink);
        let layer = if json { layer.json().flatten_event(true).boxed() } else { layer.boxed() };
        let on = tracing_subscriber::registry().with(EnvFilter::new("tessera_data_plane=trace")).with(layer);
        let (span, with_event) = tracing::subscriber::with_default(on, || {
            (per_call(n / 10, || one_request(&origin, false)), per_call(n / 10, || one_request(&origin, true)))
        });
        let format = if json { "json" } else { "text" };
        println!("spans on ({format}): span {span:>8.0} ns, span and one line {with_event:>8.0} ns per request");
    }
}
