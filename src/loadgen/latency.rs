//! Latency summaries: exact percentiles over the merged per-worker samples.

use serde::Serialize;

/// Client-side latency of successful requests, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Mean.
    pub avg: f64,
    /// Fastest request.
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest request.
    pub max: f64,
}

impl LatencySummary {
    /// Summarizes samples in nanoseconds; sorts them in place. All zero when there are none.
    pub fn from_ns(samples: &mut [u64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let us = |ns: u64| ns as f64 / 1e3;
        let total: u128 = samples.iter().map(|&ns| u128::from(ns)).sum();
        Self {
            avg: total as f64 / samples.len() as f64 / 1e3,
            min: us(samples[0]),
            p50: us(percentile(samples, 50.0)),
            p90: us(percentile(samples, 90.0)),
            p95: us(percentile(samples, 95.0)),
            p99: us(percentile(samples, 99.0)),
            max: us(samples[samples.len() - 1]),
        }
    }
}

/// Nearest-rank percentile of sorted, non-empty `sorted`: the smallest sample with at least
/// `p` percent of the samples at or below it.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    let n = sorted.len();
    let rank = (p / 100.0 * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let sorted: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&sorted, 50.0), 50);
        assert_eq!(percentile(&sorted, 90.0), 90);
        assert_eq!(percentile(&sorted, 99.0), 99);
        assert_eq!(percentile(&sorted, 100.0), 100);
        assert_eq!(percentile(&sorted, 0.0), 1, "p0 is the minimum, not an out-of-range index");
        assert_eq!(percentile(&[7], 99.0), 7);
        // 10 samples: p95 needs rank ceil(9.5) = 10, p50 rank 5.
        let ten: Vec<u64> = (1..=10).map(|v| v * 10).collect();
        assert_eq!(percentile(&ten, 95.0), 100);
        assert_eq!(percentile(&ten, 50.0), 50);
        assert_eq!(percentile(&ten, 51.0), 60);
    }

    #[test]
    fn summary_sorts_and_converts_to_microseconds() {
        let mut samples: Vec<u64> = (1..=1000).rev().map(|v| v * 1000).collect();
        let s = LatencySummary::from_ns(&mut samples);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 1000.0);
        assert_eq!(s.p50, 500.0);
        assert_eq!(s.p90, 900.0);
        assert_eq!(s.p95, 950.0);
        assert_eq!(s.p99, 990.0);
        assert!((s.avg - 500.5).abs() < 1e-9);
    }

    #[test]
    fn empty_summary_is_zero() {
        assert_eq!(LatencySummary::from_ns(&mut []), LatencySummary::default());
    }
}
