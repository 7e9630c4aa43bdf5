//! The Prometheus endpoint: Triton's `nv_inference_*` counters per model version, rendered from
//! the same statistics the statistics extension serves, so the two never disagree.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use tessera_protocol::inference::{ModelStatistics, StatisticDuration};

use crate::server::ServerState;

/// Builds the router for the metrics listener.
pub fn router(state: Arc<ServerState>) -> Router {
    Router::new().route("/metrics", get(handle_metrics)).with_state(state)
}

async fn handle_metrics(State(state): State<Arc<ServerState>>) -> impl IntoResponse {
    let stats = state.statistics(None, None).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], render(&stats))
}

/// One counter family: name, help, and how to read it from a snapshot.
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
        value: |s| dur(s.inference_stats.as_ref().and_then(|i| i.success)).count,
    },
    Family {
        name: "nv_inference_request_failure",
        help: "Number of failed inference requests, all batch sizes",
        value: |s| dur(s.inference_stats.as_ref().and_then(|i| i.fail)).count,
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
        value: |s| dur(s.inference_stats.as_ref().and_then(|i| i.success)).ns / 1000,
    },
    Family {
        name: "nv_inference_queue_duration_us",
        help: "Cumulative inference queuing duration in microseconds (includes cached requests)",
        value: |s| dur(s.inference_stats.as_ref().and_then(|i| i.queue)).ns / 1000,
    },
    Family {
        name: "nv_inference_compute_input_duration_us",
        help: "Cumulative compute input duration in microseconds (does not include cached requests)",
        value: |s| dur(s.inference_stats.as_ref().and_then(|i| i.compute_input)).ns / 1000,
    },
    Family {
        name: "nv_inference_compute_infer_duration_us",
        help: "Cumulative compute inference duration in microseconds (does not include cached requests)",
        value: |s| dur(s.inference_stats.as_ref().and_then(|i| i.compute_infer)).ns / 1000,
    },
    Family {
        name: "nv_inference_compute_output_duration_us",
        help: "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        value: |s| dur(s.inference_stats.as_ref().and_then(|i| i.compute_output)).ns / 1000,
    },
];

/// Renders Prometheus text exposition for the given snapshots.
pub fn render(stats: &[ModelStatistics]) -> String {
    let mut out = String::new();
    for family in FAMILIES {
        let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
        let _ = writeln!(out, "# TYPE {} counter", family.name);
        for s in stats {
            let _ = writeln!(
                out,
                "{}{{model=\"{}\",version=\"{}\"}} {}",
                family.name,
                escape(&s.name),
                escape(&s.version),
                (family.value)(s)
            );
        }
    }
    out
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Execution, ModelStats};

    #[test]
    fn counters_render_with_model_and_version_labels() {
        let stats = ModelStats::default();
        stats.success.record(2_000);
        stats.record_execution(Execution { batch_size: 3, input_ns: 0, infer_ns: 0, output_ns: 0 });
        let text = render(&[stats.snapshot("add_sub", "1")]);
        assert!(text.contains("nv_inference_request_success{model=\"add_sub\",version=\"1\"} 1"), "{text}");
        assert!(text.contains("nv_inference_count{model=\"add_sub\",version=\"1\"} 3"), "{text}");
        assert!(text.contains("nv_inference_request_duration_us{model=\"add_sub\",version=\"1\"} 2"), "{text}");
        assert!(text.contains("# TYPE nv_inference_exec_count counter"));
    }
}
