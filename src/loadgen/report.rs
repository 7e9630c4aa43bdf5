//! The benchmark's result: one serializable struct, printed as a table or one JSON object.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::Serialize;

use super::latency::LatencySummary;
use super::stats::ServerBreakdown;

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `http` or `grpc`.
    pub protocol: &'static str,
    /// `host:port` driven.
    pub url: String,
    /// Model name.
    pub model: String,
    /// Model version asked for; `None` = the server's choice.
    pub model_version: Option<String>,
    /// Inferences per request.
    pub batch: u32,
    /// Closed loop: requests in flight.
    pub concurrency: Option<usize>,
    /// Open loop: requests started per second.
    pub request_rate: Option<f64>,
    /// Measured window in seconds.
    pub window_s: f64,
    /// Requests completed in the window (successes + failures).
    pub requests: u64,
    /// Requests that succeeded and passed the response check.
    pub successes: u64,
    /// Requests that failed.
    pub failures: u64,
    /// Requests that failed during warm-up (not in the window).
    pub warmup_failures: u64,
    /// Failures by message, warm-up included.
    pub errors: BTreeMap<String, u64>,
    /// Open loop: requests that started late because every worker was busy.
    pub delayed_requests: Option<u64>,
    /// Successful inferences (requests × batch) per second.
    pub inferences_per_sec: f64,
    /// Successful requests per second.
    pub requests_per_sec: f64,
    /// Client-side latency of successful requests.
    pub latency_us: LatencySummary,
    /// CPU the load generator used during the window, in cores (1.0 = one core busy).
    pub client_cpu_cores: Option<f64>,
    /// Server-side breakdown from the statistics delta over the window.
    pub server: Option<ServerBreakdown>,
    /// Why `server` is missing.
    pub server_error: Option<String>,
}

impl Report {
    /// The human-readable table.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_text(&mut out);
        out
    }

    fn write_text(&self, out: &mut String) -> fmt::Result {
        let load = match (self.concurrency, self.request_rate) {
            (_, Some(rate)) => format!("request rate {rate}/s"),
            (Some(c), None) => format!("concurrency {c}"),
            (None, None) => String::new(),
        };
        let version = self.model_version.as_deref().unwrap_or("latest");
        writeln!(
            out,
            "tessera bench {} {}: model {} (version {version}), batch {}, {load}, window {:.2} s",
            self.protocol, self.url, self.model, self.batch, self.window_s
        )?;
        writeln!(out, "  Client")?;
        writeln!(out, "    Requests          {} ok, {} failed", self.successes, self.failures)?;
        if let Some(delayed) = self.delayed_requests {
            writeln!(
                out,
                "    Delayed           {delayed} started over 1 ms late: every worker was busy (see --max-inflight)"
            )?;
        }
        writeln!(
            out,
            "    Throughput        {:.1} infer/s, {:.1} req/s",
            self.inferences_per_sec, self.requests_per_sec
        )?;
        let l = &self.latency_us;
        writeln!(
            out,
            "    Latency (µs)      avg {:.1}  p50 {:.1}  p90 {:.1}  p95 {:.1}  p99 {:.1}  max {:.1}",
            l.avg, l.p50, l.p90, l.p95, l.p99, l.max
        )?;
        if let Some(cores) = self.client_cpu_cores {
            writeln!(out, "    Client CPU        {cores:.2} cores")?;
        }
        writeln!(out, "  Server (statistics over the window)")?;
        match (&self.server, &self.server_error) {
            (Some(s), _) => {
                writeln!(out, "    Requests          {} ok, {} failed", s.success_count, s.fail_count)?;
                writeln!(
                    out,
                    "    Batches           {} inferences in {} executions (avg batch {:.2})",
                    s.inference_count, s.execution_count, s.avg_batch_size
                )?;
                writeln!(
                    out,
                    "    Avg request (µs)  {:.1} = overhead {:.1} + queue {:.1} + compute input {:.1} + infer {:.1} + output {:.1}",
                    s.request_us,
                    s.overhead_us,
                    s.queue_us,
                    s.compute_input_us,
                    s.compute_infer_us,
                    s.compute_output_us
                )?;
            }
            (None, Some(e)) => writeln!(out, "    unavailable: {e}")?,
            (None, None) => writeln!(out, "    unavailable")?,
        }
        if !self.errors.is_empty() {
            writeln!(out, "  Errors")?;
            for (message, n) in &self.errors {
                writeln!(out, "    {n:>8} × {message}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_json_carry_the_numbers() {
        let report = Report {
            protocol: "http",
            url: "127.0.0.1:8000".into(),
            model: "m".into(),
            model_version: None,
            batch: 2,
            concurrency: Some(4),
            request_rate: None,
            window_s: 2.0,
            requests: 10,
            successes: 9,
            failures: 1,
            warmup_failures: 0,
            errors: BTreeMap::from([("HTTP 503: full".to_string(), 1)]),
            delayed_requests: None,
            inferences_per_sec: 9.0,
            requests_per_sec: 4.5,
            latency_us: LatencySummary { avg: 1.0, min: 1.0, p50: 1.0, p90: 2.0, p95: 3.0, p99: 4.0, max: 5.0 },
            client_cpu_cores: Some(0.25),
            server: Some(ServerBreakdown { request_us: 20.0, overhead_us: 6.0, ..Default::default() }),
            server_error: None,
        };
        let text = report.to_text();
        assert!(text.contains("9 ok, 1 failed"), "{text}");
        assert!(text.contains("p99 4.0"), "{text}");
        assert!(text.contains("20.0 = overhead 6.0"), "{text}");
        assert!(text.contains("1 × HTTP 503: full"), "{text}");
        let json = serde_json::to_value(&report).expect("serializes");
        assert_eq!(json["latency_us"]["p95"], 3.0);
        assert_eq!(json["server"]["overhead_us"], 6.0);
        assert_eq!(json["errors"]["HTTP 503: full"], 1);
    }
}
