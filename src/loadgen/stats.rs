//! The server's side of a measurement: statistics-extension counters taken before and after the
//! window, and the per-request breakdown perf_analyzer prints from their difference.

use serde::Serialize;
use serde_json::Value;
use tessera_protocol::inference::{ModelStatistics, StatisticDuration};

/// A count and a total duration in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    /// Events.
    pub count: u64,
    /// Their total duration.
    pub ns: u64,
}

impl Counter {
    fn add(self, other: Self) -> Self {
        Self { count: self.count.wrapping_add(other.count), ns: self.ns.wrapping_add(other.ns) }
    }

    fn since(self, before: Self) -> Self {
        Self { count: self.count.saturating_sub(before.count), ns: self.ns.saturating_sub(before.ns) }
    }

    /// Average duration in microseconds; 0 without events.
    fn avg_us(self) -> f64 {
        if self.count == 0 { 0.0 } else { self.ns as f64 / self.count as f64 / 1e3 }
    }
}

/// The statistics of a model, summed over the versions reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Successful requests, arrival to response.
    pub success: Counter,
    /// Failed requests.
    pub fail: Counter,
    /// Waiting in the queue.
    pub queue: Counter,
    /// Preparing inputs.
    pub compute_input: Counter,
    /// Running the model.
    pub compute_infer: Counter,
    /// Extracting outputs.
    pub compute_output: Counter,
    /// Batch items inferred.
    pub inference_count: u64,
    /// Model executions.
    pub execution_count: u64,
}

impl ServerStats {
    fn add(self, o: Self) -> Self {
        Self {
            success: self.success.add(o.success),
            fail: self.fail.add(o.fail),
            queue: self.queue.add(o.queue),
            compute_input: self.compute_input.add(o.compute_input),
            compute_infer: self.compute_infer.add(o.compute_infer),
            compute_output: self.compute_output.add(o.compute_output),
            inference_count: self.inference_count.wrapping_add(o.inference_count),
            execution_count: self.execution_count.wrapping_add(o.execution_count),
        }
    }

    /// What happened between `before` and `self`.
    pub fn since(self, before: Self) -> Self {
        Self {
            success: self.success.since(before.success),
            fail: self.fail.since(before.fail),
            queue: self.queue.since(before.queue),
            compute_input: self.compute_input.since(before.compute_input),
            compute_infer: self.compute_infer.since(before.compute_infer),
            compute_output: self.compute_output.since(before.compute_output),
            inference_count: self.inference_count.saturating_sub(before.inference_count),
            execution_count: self.execution_count.saturating_sub(before.execution_count),
        }
    }

    /// Sums the gRPC statistics of every reported version.
    pub fn from_proto(stats: &[ModelStatistics]) -> Self {
        let c =
            |d: Option<StatisticDuration>| d.map_or_else(Counter::default, |d| Counter { count: d.count, ns: d.ns });
        stats.iter().fold(Self::default(), |sum, s| {
            let i = s.inference_stats.unwrap_or_default();
            sum.add(Self {
                success: c(i.success),
                fail: c(i.fail),
                queue: c(i.queue),
                compute_input: c(i.compute_input),
                compute_infer: c(i.compute_infer),
                compute_output: c(i.compute_output),
                inference_count: s.inference_count,
                execution_count: s.execution_count,
            })
        })
    }

    /// Sums the HTTP statistics (`{"model_stats": [...]}`) of every reported version. Counters
    /// may be JSON numbers or strings (protobuf JSON writes 64-bit integers as strings).
    pub fn from_json(body: &Value) -> Result<Self, String> {
        let models = body["model_stats"].as_array().ok_or("statistics without a 'model_stats' array")?;
        Ok(models.iter().fold(Self::default(), |sum, m| {
            let i = &m["inference_stats"];
            let c = |key: &str| Counter { count: json_u64(&i[key]["count"]), ns: json_u64(&i[key]["ns"]) };
            sum.add(Self {
                success: c("success"),
                fail: c("fail"),
                queue: c("queue"),
                compute_input: c("compute_input"),
                compute_infer: c("compute_infer"),
                compute_output: c("compute_output"),
                inference_count: json_u64(&m["inference_count"]),
                execution_count: json_u64(&m["execution_count"]),
            })
        }))
    }

    /// perf_analyzer's server-side breakdown of a delta.
    pub fn breakdown(&self) -> ServerBreakdown {
        let request_us = self.success.avg_us();
        let queue_us = self.queue.avg_us();
        let compute_input_us = self.compute_input.avg_us();
        let compute_infer_us = self.compute_infer.avg_us();
        let compute_output_us = self.compute_output.avg_us();
        let attributed = queue_us + compute_input_us + compute_infer_us + compute_output_us;
        ServerBreakdown {
            success_count: self.success.count,
            fail_count: self.fail.count,
            inference_count: self.inference_count,
            execution_count: self.execution_count,
            avg_batch_size: if self.execution_count == 0 {
                0.0
            } else {
                self.inference_count as f64 / self.execution_count as f64
            },
            request_us,
            queue_us,
            compute_input_us,
            compute_infer_us,
            compute_output_us,
            overhead_us: (request_us - attributed).max(0.0),
        }
    }
}

fn json_u64(v: &Value) -> u64 {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or(0)
}

/// Per-request averages over the window, in microseconds (like perf_analyzer's server section).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ServerBreakdown {
    /// Successful requests the server counted.
    pub success_count: u64,
    /// Failed requests the server counted.
    pub fail_count: u64,
    /// Batch items inferred.
    pub inference_count: u64,
    /// Model executions.
    pub execution_count: u64,
    /// Average executed batch size: inferences per execution.
    pub avg_batch_size: f64,
    /// Average successful request duration.
    pub request_us: f64,
    /// Average queue time.
    pub queue_us: f64,
    /// Average input preparation.
    pub compute_input_us: f64,
    /// Average model run.
    pub compute_infer_us: f64,
    /// Average output extraction.
    pub compute_output_us: f64,
    /// Request time not in queue or compute (frontend, scheduling, serialization).
    pub overhead_us: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(success: (u64, u64), queue: (u64, u64), infer: (u64, u64), counts: (u64, u64)) -> Value {
        let d = |(count, ns): (u64, u64)| serde_json::json!({ "count": count, "ns": ns });
        serde_json::json!({ "model_stats": [{
            "name": "m", "version": "1",
            "inference_count": counts.0, "execution_count": counts.1.to_string(),
            "inference_stats": {
                "success": d(success), "fail": d((0, 0)), "queue": d(queue),
                "compute_input": d((success.0, success.0 * 1000)), "compute_infer": d(infer),
                "compute_output": d((success.0, success.0 * 2000)),
            },
        }]})
    }

    #[test]
    fn delta_breakdown_matches_perf_analyzer() {
        let before = ServerStats::from_json(&sample((10, 1_000_000), (10, 5000), (10, 50_000), (10, 10))).expect("ok");
        // 100 more requests of 20 µs each: queue 1 µs, input 1, infer 10, output 2 => overhead 6.
        let after =
            ServerStats::from_json(&sample((110, 3_000_000), (110, 105_000), (110, 1_050_000), (410, 60))).expect("ok");
        let b = after.since(before).breakdown();
        assert_eq!(b.success_count, 100);
        assert!((b.request_us - 20.0).abs() < 1e-9);
        assert!((b.queue_us - 1.0).abs() < 1e-9);
        assert!((b.compute_input_us - 1.0).abs() < 1e-9);
        assert!((b.compute_infer_us - 10.0).abs() < 1e-9);
        assert!((b.compute_output_us - 2.0).abs() < 1e-9);
        assert!((b.overhead_us - 6.0).abs() < 1e-9);
        assert!((b.avg_batch_size - 8.0).abs() < 1e-9, "400 inferences in 50 executions");
    }

    #[test]
    fn versions_are_summed_and_empty_windows_are_zero() {
        let mut two = sample((1, 10), (1, 1), (1, 1), (1, 1));
        let second = two["model_stats"][0].clone();
        two["model_stats"].as_array_mut().expect("array").push(second);
        let s = ServerStats::from_json(&two).expect("ok");
        assert_eq!(s.success, Counter { count: 2, ns: 20 });
        assert_eq!(s.execution_count, 2, "string counters parse");
        assert_eq!(s.since(s).breakdown(), ServerBreakdown::default());
        assert!(ServerStats::from_json(&serde_json::json!({"error": "x"})).is_err());
    }
}
