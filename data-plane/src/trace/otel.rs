//! OpenTelemetry export over OTLP/HTTP with the JSON encoding (what Triton's exporter sends):
//! each trace becomes Triton's three spans, `InferRequest` (the protocol handler, child of the
//! caller's span when the request carried a `traceparent`), the model's span (named after the
//! model, with Triton's `triton.*` attributes) and `compute`, batched as OpenTelemetry's batch
//! span processor does (`bsp_*` settings).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::record::{Event, Finished, Span, random_id};

/// OpenTelemetry mode's settings (`--trace-config opentelemetry,<key>=<value>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelConfig {
    /// The collector's OTLP/HTTP traces endpoint.
    pub url: String,
    /// Resource attributes (`service.name` and any `resource=key=value`).
    pub resource: Vec<(String, String)>,
    /// Milliseconds between exports.
    pub bsp_schedule_delay_ms: u64,
    /// Spans per export at most.
    pub bsp_max_export_batch_size: usize,
    /// Traces waiting for export at most; more are dropped.
    pub bsp_max_queue_size: usize,
}

impl Default for OtelConfig {
    /// OpenTelemetry's defaults, with Tessera as the service.
    fn default() -> Self {
        Self {
            url: "http://localhost:4318/v1/traces".into(),
            resource: vec![("service.name".into(), "tessera".into())],
            bsp_schedule_delay_ms: 5000,
            bsp_max_export_batch_size: 512,
            bsp_max_queue_size: 2048,
        }
    }
}

impl OtelConfig {
    /// The settings the trace extension lists besides the common ones (as Triton lists them).
    pub fn listed(&self) -> [(&'static str, String); 4] {
        [
            ("url", self.url.clone()),
            ("bsp_schedule_delay", self.bsp_schedule_delay_ms.to_string()),
            ("bsp_max_export_batch_size", self.bsp_max_export_batch_size.to_string()),
            ("bsp_max_queue_size", self.bsp_max_queue_size.to_string()),
        ]
    }
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Exports the traces that arrive on `traces` until every sender is gone: every
/// `bsp_schedule_delay`, or sooner when a batch is full; what is left is sent at the end.
pub async fn export_task(config: OtelConfig, tls: rustls::ClientConfig, mut traces: mpsc::Receiver<Finished>) {
    let connector = HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().build();
    let client: HttpsClient = Client::builder(TokioExecutor::new()).pool_timer(TokioTimer::new()).build(connector);
    let mut tick = tokio::time::interval(Duration::from_millis(config.bsp_schedule_delay_ms.max(1)));
    let mut batch = Vec::new();
    loop {
        tokio::select! {
            got = traces.recv() => match got {
                Some(trace) => {
                    batch.push(trace);
                    // Up to three spans per trace.
                    if batch.len() * 3 >= config.bsp_max_export_batch_size {
                        export(&client, &config, &mut batch).await;
                    }
                }
                None => break,
            },
            _ = tick.tick() => export(&client, &config, &mut batch).await,
        }
    }
    export(&client, &config, &mut batch).await;
}

async fn export(client: &HttpsClient, config: &OtelConfig, batch: &mut Vec<Finished>) {
    if batch.is_empty() {
        return;
    }
    let body = request_body(&config.resource, batch);
    let spans = batch.len();
    batch.clear();
    let request = http::Request::post(&config.url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())));
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(url = %config.url, error = %e, "OpenTelemetry export URL is invalid");
            return;
        }
    };
    let sent = tokio::time::timeout(Duration::from_secs(10), client.request(request)).await;
    match sent {
        Ok(Ok(response)) if response.status().is_success() => {
            // Read to the end so the connection is reused.
            let _ = response.into_body().collect().await;
        }
        Ok(Ok(response)) => {
            tracing::warn!(url = %config.url, status = %response.status(), traces = spans, "OpenTelemetry export refused");
        }
        Ok(Err(e)) => tracing::warn!(url = %config.url, error = %e, traces = spans, "OpenTelemetry export failed"),
        Err(_) => tracing::warn!(url = %config.url, traces = spans, "OpenTelemetry export timed out"),
    }
}

/// The OTLP/HTTP JSON body (`ExportTraceServiceRequest`) for `traces`.
pub fn request_body(resource: &[(String, String)], traces: &[Finished]) -> Value {
    let attributes: Vec<Value> = resource.iter().map(|(k, v)| string_attr(k, v)).collect();
    let spans: Vec<Value> = traces.iter().flat_map(spans_of).collect();
    json!({
        "resourceSpans": [{
            "resource": {"attributes": attributes},
            "scopeSpans": [{"scope": {"name": "tessera"}, "spans": spans}],
        }]
    })
}

fn string_attr(key: &str, value: &str) -> Value {
    json!({"key": key, "value": {"stringValue": value}})
}

fn int_attr(key: &str, value: i64) -> Value {
    // OTLP JSON carries 64-bit integers as strings.
    json!({"key": key, "value": {"intValue": value.to_string()}})
}

/// Triton's spans of one trace: the request's (not for a composing model's trace, which hangs
/// under its ensemble's model span), the model's, and compute when an instance ran it here.
fn spans_of(trace: &Finished) -> Vec<Value> {
    let ids = &trace.lineage;
    let events_of =
        |span: Span| -> Vec<&(Event, u64, u64)> { trace.events.iter().filter(|(e, ..)| e.span() == span).collect() };
    let all: Vec<&(Event, u64, u64)> = trace.events.iter().collect();
    let model_attributes = vec![
        string_attr("triton.model_name", &trace.model),
        int_attr("triton.model_version", trace.version),
        int_attr("triton.trace_id", trace.id as i64),
        int_attr("triton.trace_parent_id", ids.parent_id as i64),
        string_attr("triton.request_id", &trace.request_id),
    ];
    let mut spans = Vec::with_capacity(3);
    let model_parent = if ids.parent_id == 0 {
        let request = events_of(Span::Request);
        spans.push(span_json(ids.trace_id, ids.request_span, ids.parent_span, "InferRequest", &all, &request, vec![]));
        Some(ids.request_span)
    } else {
        ids.parent_span
    };
    let model = events_of(Span::Model);
    spans.push(span_json(ids.trace_id, ids.model_span, model_parent, &trace.model, &model, &model, model_attributes));
    let compute = events_of(Span::Compute);
    if !compute.is_empty() {
        let id = random_id(64) as u64;
        spans.push(span_json(ids.trace_id, id, Some(ids.model_span), "compute", &compute, &compute, Vec::new()));
    }
    spans
}

/// One span: `extent` sets its start and end, `events` are listed on it.
fn span_json(
    trace_id: u128,
    span_id: u64,
    parent: Option<u64>,
    name: &str,
    extent: &[&(Event, u64, u64)],
    events: &[&(Event, u64, u64)],
    attributes: Vec<Value>,
) -> Value {
    let start = extent.iter().map(|(_, _, unix)| *unix).min().unwrap_or(0);
    let end = extent.iter().map(|(_, _, unix)| *unix).max().unwrap_or(start);
    let mut span = json!({
        "traceId": format!("{trace_id:032x}"),
        "spanId": format!("{span_id:016x}"),
        "name": name,
        // SPAN_KIND_SERVER, as Triton reports its spans.
        "kind": 2,
        "startTimeUnixNano": start.to_string(),
        "endTimeUnixNano": end.to_string(),
        "events": events.iter().map(|(e, _, unix)| json!({"name": e.as_str(), "timeUnixNano": unix.to_string()})).collect::<Vec<_>>(),
    });
    if let Some(parent) = parent {
        span["parentSpanId"] = json!(format!("{parent:016x}"));
    }
    if !attributes.is_empty() {
        span["attributes"] = json!(attributes);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::record::{Lineage, Parent};

    fn finished(parent: Option<Parent>) -> Finished {
        Finished {
            id: 7,
            model: "add_sub".into(),
            version: 1,
            request_id: "r".into(),
            lineage: Lineage::root(parent),
            log_frequency: 0,
            events: vec![
                (Event::HttpRecvStart, 1, 101),
                (Event::RequestStart, 2, 102),
                (Event::ComputeStart, 3, 103),
                (Event::ComputeEnd, 4, 104),
                (Event::RequestEnd, 5, 105),
                (Event::HttpSendEnd, 6, 106),
            ],
        }
    }

    #[test]
    fn a_trace_is_three_nested_spans_joining_the_callers_trace() {
        let parent = Parent { trace_id: 0xabc, span_id: 0xdef };
        let body = request_body(&[("service.name".into(), "tessera".into())], &[finished(Some(parent))]);
        let spans = body["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().expect("spans").clone();
        let names: Vec<_> = spans.iter().map(|s| s["name"].as_str().unwrap_or_default().to_string()).collect();
        assert_eq!(names, ["InferRequest", "add_sub", "compute"]);
        assert!(spans.iter().all(|s| s["traceId"] == format!("{:032x}", 0xabc)));
        assert_eq!(spans[0]["parentSpanId"], format!("{:016x}", 0xdef));
        assert_eq!(spans[1]["parentSpanId"], spans[0]["spanId"]);
        assert_eq!(spans[2]["parentSpanId"], spans[1]["spanId"]);
        assert_eq!(spans[0]["startTimeUnixNano"], "101");
        assert_eq!(spans[0]["endTimeUnixNano"], "106");
        assert_eq!(spans[1]["events"][0]["name"], "REQUEST_START");
        assert_eq!(spans[1]["attributes"][1]["value"]["intValue"], "1");
    }

    #[test]
    fn without_a_parent_the_request_span_is_a_root() {
        let body = request_body(&[], &[finished(None)]);
        let root = &body["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert!(root.get("parentSpanId").is_none());
        assert_eq!(root["traceId"].as_str().map(str::len), Some(32));
    }

    #[test]
    fn a_composing_models_trace_hangs_under_its_ensembles_model_span() {
        let ensemble = finished(None);
        let child = Finished {
            id: 8,
            model: "step".into(),
            lineage: Lineage {
                trace_id: ensemble.lineage.trace_id,
                request_span: 0,
                model_span: 0x55,
                parent_span: Some(ensemble.lineage.model_span),
                parent_id: 7,
            },
            ..finished(None)
        };
        let body = request_body(&[], &[ensemble.clone(), child]);
        let spans = body["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().expect("spans").clone();
        let names: Vec<_> = spans.iter().map(|s| s["name"].as_str().unwrap_or_default().to_string()).collect();
        assert_eq!(names, ["InferRequest", "add_sub", "compute", "step", "compute"], "no request span for the step");
        assert!(spans.iter().all(|s| s["traceId"] == spans[0]["traceId"]), "one trace");
        assert_eq!(spans[3]["parentSpanId"], spans[1]["spanId"]);
        assert_eq!(spans[3]["attributes"][3]["value"]["intValue"], "7", "triton.trace_parent_id");
    }
}
