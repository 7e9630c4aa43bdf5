//! `tessera bench http|grpc` against a real server: every request succeeds and the report's
//! client and server sides agree.

use std::process::Command;

use serde_json::Value;

use super::TestServer;

/// Runs the load generator to completion and parses its `--json` report.
fn bench(protocol: &str, url: &str, extra: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["bench", protocol, "--url", url, "--model", "add_sub", "--requests", "200", "--json", "--quiet"])
        .args(["--warmup", "0.2"])
        .args(extra)
        .output()
        .expect("run tessera bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "bench failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("report is not JSON ({e}): {stdout}"))
}

fn assert_sane(report: &Value, batch: u64) {
    assert_eq!(report["successes"], 200, "{report}");
    assert_eq!(report["failures"], 0, "{report}");
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
    let latency = &report["latency_us"];
    let p = |k: &str| latency[k].as_f64().unwrap_or(f64::NAN);
    assert!(p("min") > 0.0 && p("min") <= p("p50") && p("p50") <= p("p99") && p("p99") <= p("max"), "{report}");
    let rps = report["requests_per_sec"].as_f64().unwrap_or(0.0);
    assert!(rps > 0.0, "{report}");
    assert!((report["inferences_per_sec"].as_f64().unwrap_or(0.0) - rps * batch as f64).abs() < 1e-6 * rps.max(1.0));
    let server = &report["server"];
    assert_eq!(server["success_count"], 200, "the statistics delta covers exactly the window: {report}");
    assert_eq!(server["inference_count"], 200 * batch, "{report}");
    assert!(server["request_us"].as_f64().unwrap_or(0.0) > 0.0, "{report}");
    assert!(server["compute_infer_us"].as_f64().unwrap_or(0.0) > 0.0, "{report}");
}

#[test]
fn bench_http_and_grpc_check_every_response_and_read_the_statistics() {
    let s = TestServer::start(&[]);
    let http = bench("http", &s.http, &[]);
    assert_eq!(http["protocol"], "http");
    assert_eq!(http["concurrency"], 1);
    assert_sane(&http, 1);
    let grpc = bench("grpc", &s.grpc, &["--concurrency", "4", "--batch", "8"]);
    assert_sane(&grpc, 8);
}

#[test]
fn bench_fails_when_requests_fail() {
    let s = TestServer::start(&[]);
    // Batch 9 exceeds add_sub's max_batch_size of 8: every request is rejected.
    let output = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["bench", "http", "--url", &s.http, "--model", "add_sub", "--batch", "9", "--requests", "5"])
        .args(["--warmup", "0", "--json", "--quiet"])
        .output()
        .expect("run tessera bench");
    assert!(!output.status.success());
    let report: Value = serde_json::from_slice(&output.stdout).expect("a report is printed even on failure");
    assert_eq!(report["failures"], 5, "{report}");
    let errors = report["errors"].as_object().expect("errors by message");
    assert!(errors.keys().all(|k| k.starts_with("HTTP 400")), "{report}");
}
