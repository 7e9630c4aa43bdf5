//! Roll-ups for people: usage summed by the groups a caller asks for, and per-step metrics
//! points (rates, latency percentiles, mean batch size) merged from the records' histograms.
//!
//! # Percentiles
//! Latency percentiles come from the merged bucket counts by linear interpolation inside the
//! bucket holding the rank (as Prometheus' `histogram_quantile`): a bucket `(lower, upper]`
//! holding `n` of the requests puts its share of the rank evenly between its bounds (the first
//! bucket starts at 0). A rank in the overflow bucket reports the largest finite bound.
//!
//! # Mean batch size
//! From the merged batch-size histogram: each bucket counts at the mean of the integer sizes it
//! holds (`(lower + 1 + upper) / 2`; exact for the buckets of one size, 1 and 2), the overflow
//! bucket at its lower bound + 1.

use std::collections::BTreeMap;

use tessera_protocol::usage::{BATCH_SIZE_BUCKETS, LATENCY_BUCKETS_US};

use crate::error::{Error, Result};
use crate::registry::{UsageRecordRow, UsageTotalsRow, add_counts};

/// Which keys usage is grouped by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupBy {
    /// By model.
    pub model: bool,
    /// By version.
    pub version: bool,
    /// By slice profile.
    pub profile: bool,
    /// By time, in buckets of this many seconds (60, 3600 or 86400).
    pub time: Option<i64>,
}

impl GroupBy {
    /// Parses a comma-separated list of `model`, `version`, `profile` and at most one of
    /// `minute`, `hour`, `day`; absent or empty groups nothing (one total).
    pub fn parse(s: Option<&str>) -> Result<Self> {
        let mut g = GroupBy::default();
        for part in s.unwrap_or("").split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let time = match part {
                "model" => {
                    g.model = true;
                    None
                }
                "version" => {
                    g.version = true;
                    None
                }
                "profile" => {
                    g.profile = true;
                    None
                }
                "minute" => Some(60),
                "hour" => Some(3600),
                "day" => Some(86_400),
                _ => {
                    return Err(Error::invalid(
                        "group_by",
                        "group_by takes model, version, profile, minute, hour or day (comma-separated)",
                    ));
                }
            };
            if let Some(t) = time {
                if g.time.is_some_and(|old| old != t) {
                    return Err(Error::invalid("group_by", "group by at most one of minute, hour and day"));
                }
                g.time = Some(t);
            }
        }
        Ok(g)
    }
}

/// Usage summed over one group; keys not grouped by are `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageGroup {
    /// Model, when grouped by model.
    pub model: Option<String>,
    /// Version, when grouped by version.
    pub version: Option<i64>,
    /// Slice profile, when grouped by profile.
    pub slice_profile: Option<String>,
    /// Start of the time bucket (Unix seconds), when grouped by time.
    pub start: Option<i64>,
    /// Successful requests.
    pub requests: i64,
    /// Failed requests.
    pub failures: i64,
    /// Inferences.
    pub inferences: i64,
    /// Compute, microseconds.
    pub compute_us: i64,
    /// Reserved slice time, microseconds.
    pub slice_us: i64,
    /// The part of `slice_us` held on GPU and MIG slices (GPU-time).
    pub gpu_slice_us: i64,
    /// The part of `compute_us` spent on GPU and MIG slices.
    pub gpu_compute_us: i64,
    /// Request bytes.
    pub bytes_in: i64,
    /// Response bytes.
    pub bytes_out: i64,
    /// Requests a gateway refused under the tenant's limits.
    pub throttled: i64,
}

type GroupKey = (Option<i64>, Option<String>, Option<i64>, Option<String>);

/// Sums `rows` by `g`, ordered by time bucket, then model, version and profile.
pub fn group_usage(rows: &[UsageTotalsRow], g: GroupBy) -> Vec<UsageGroup> {
    let mut groups: BTreeMap<GroupKey, UsageGroup> = BTreeMap::new();
    for r in rows {
        let start = g.time.map(|step| r.period_start.div_euclid(step) * step);
        let model = g.model.then(|| r.model_name.clone());
        let version = g.version.then_some(r.version);
        let slice_profile = g.profile.then(|| r.slice_profile.clone());
        let key = (start, model.clone(), version, slice_profile.clone());
        let e = groups.entry(key).or_insert_with(|| UsageGroup {
            model,
            version,
            slice_profile,
            start,
            ..UsageGroup::default()
        });
        e.requests += r.requests;
        e.failures += r.failures;
        e.inferences += r.inferences;
        e.compute_us += r.compute_us;
        e.slice_us += r.slice_us;
        if crate::types::is_gpu_profile(&r.slice_profile) {
            e.gpu_slice_us += r.slice_us;
            e.gpu_compute_us += r.compute_us;
        }
        e.bytes_in += r.bytes_in;
        e.bytes_out += r.bytes_out;
        e.throttled += r.throttled;
    }
    groups.into_values().collect()
}

/// Metrics of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Step start, Unix seconds.
    pub start: i64,
    /// Successful requests.
    pub requests: i64,
    /// Failed requests.
    pub failures: i64,
    /// Requests (successful and failed) per second over the step.
    pub request_rate: f64,
    /// Failed requests per second over the step.
    pub error_rate: f64,
    /// Requests a gateway refused under the tenant's limits.
    pub throttled: i64,
    /// Latency percentiles, microseconds (`None` without requests).
    pub p50_us: Option<u64>,
    /// 95th percentile.
    pub p95_us: Option<u64>,
    /// 99th percentile.
    pub p99_us: Option<u64>,
    /// Mean executed batch size (`None` without executions).
    pub mean_batch_size: Option<f64>,
}

/// The records of one step, merged.
#[derive(Default)]
struct Merged {
    requests: i64,
    failures: i64,
    throttled: i64,
    latency: Vec<i64>,
    batches: Vec<i64>,
}

/// One point per step in `[from, to)` (`from` aligned down to the step), with the records
/// whose period starts in it merged; steps without records are zero.
pub fn points(rows: &[UsageRecordRow], from: i64, to: i64, step: i64) -> Vec<Point> {
    let first = from.div_euclid(step) * step;
    let mut merged: BTreeMap<i64, Merged> = BTreeMap::new();
    for r in rows {
        let start = r.period_start.div_euclid(step) * step;
        let e = merged.entry(start).or_default();
        e.requests += r.requests;
        e.failures += r.failures;
        e.throttled += r.throttled;
        add_counts(&mut e.latency, &r.latency_counts.0);
        add_counts(&mut e.batches, &r.batch_size_counts.0);
    }
    let mut out = Vec::new();
    let mut start = first;
    while start < to {
        let Merged { requests, failures, throttled, latency, batches } = merged.remove(&start).unwrap_or_default();
        let seconds = step as f64;
        out.push(Point {
            start,
            requests,
            failures,
            request_rate: (requests + failures) as f64 / seconds,
            error_rate: failures as f64 / seconds,
            throttled,
            p50_us: quantile(&latency, LATENCY_BUCKETS_US, 0.50),
            p95_us: quantile(&latency, LATENCY_BUCKETS_US, 0.95),
            p99_us: quantile(&latency, LATENCY_BUCKETS_US, 0.99),
            mean_batch_size: mean_batch_size(&batches, BATCH_SIZE_BUCKETS),
        });
        start += step;
    }
    out
}

/// The `q` quantile of bucket `counts` over upper `bounds` (plus one overflow bucket), by
/// linear interpolation inside the bucket; `None` when empty.
pub fn quantile(counts: &[i64], bounds: &[u64], q: f64) -> Option<u64> {
    let total: i64 = counts.iter().sum();
    if total <= 0 || bounds.is_empty() {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0i64;
    for (i, &n) in counts.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let Some(&upper) = bounds.get(i) else { return bounds.last().copied() };
            let lower = if i == 0 { 0 } else { bounds[i - 1] };
            let share = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
            return Some(lower + ((upper - lower) as f64 * share).round() as u64);
        }
        below += n;
    }
    bounds.last().copied()
}

/// Mean batch size from bucket `counts` over upper `bounds` (plus one overflow bucket).
pub fn mean_batch_size(counts: &[i64], bounds: &[u64]) -> Option<f64> {
    let mut n = 0i64;
    let mut sum = 0.0;
    for (i, &c) in counts.iter().enumerate() {
        let lower = if i == 0 { 0 } else { bounds.get(i - 1).copied().unwrap_or(0) };
        let mid = match bounds.get(i) {
            Some(&upper) => (lower + 1 + upper) as f64 / 2.0,
            None => (lower + 1) as f64,
        };
        n += c;
        sum += c as f64 * mid;
    }
    (n > 0).then(|| sum / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::types::Json;
    use uuid::Uuid;

    fn totals(model: &str, version: i64, profile: &str, start: i64, requests: i64) -> UsageTotalsRow {
        UsageTotalsRow {
            model_name: model.into(),
            version,
            slice_profile: profile.into(),
            period_start: start,
            requests,
            failures: 1,
            inferences: requests * 2,
            executions: requests,
            compute_us: 10,
            slice_us: 100,
            bytes_in: 5,
            bytes_out: 6,
            throttled: 0,
        }
    }

    /// What a gateway reports: only refused requests, under the model the client named.
    fn refused(model: &str, start: i64, throttled: i64) -> UsageTotalsRow {
        UsageTotalsRow {
            model_name: model.into(),
            slice_profile: tessera_protocol::usage::GATEWAY_PROFILE.into(),
            period_start: start,
            throttled,
            ..UsageTotalsRow::default()
        }
    }

    #[test]
    fn throttled_requests_sum_beside_the_served_ones() {
        let rows = [totals("a", 1, "cpu", 60, 3), refused("a", 60, 4), refused("b", 120, 2)];
        let by_model = group_usage(&rows, GroupBy { model: true, ..GroupBy::default() });
        assert_eq!(
            by_model.iter().map(|g| (g.model.as_deref(), g.requests, g.throttled)).collect::<Vec<_>>(),
            [(Some("a"), 3, 4), (Some("b"), 0, 2)]
        );
        let mut gateway = record(120, 0, 0, 0);
        gateway.throttled = 5;
        let p = points(&[record(60, 6, 0, 0), gateway], 60, 180, 60);
        assert_eq!(p.iter().map(|p| (p.requests, p.throttled)).collect::<Vec<_>>(), [(6, 0), (0, 5)]);
        assert_eq!(p[1].request_rate, 0.0, "a refused request is not a request served");
    }

    #[test]
    fn group_by_parses_and_refuses_two_time_buckets() {
        assert_eq!(GroupBy::parse(None).unwrap(), GroupBy::default());
        let g = GroupBy::parse(Some("model,version,hour")).unwrap();
        assert!(g.model && g.version && !g.profile && g.time == Some(3600));
        assert!(GroupBy::parse(Some("minute,day")).is_err());
        assert!(GroupBy::parse(Some("tenant")).is_err());
    }

    #[test]
    fn usage_groups_set_only_their_keys() {
        let rows = [totals("a", 1, "cpu", 60, 3), totals("a", 2, "cpu", 120, 4), totals("b", 1, "gpu", 3660, 5)];
        let all = group_usage(&rows, GroupBy::default());
        assert_eq!(all.len(), 1);
        assert_eq!((all[0].requests, all[0].failures, all[0].inferences, all[0].slice_us), (12, 3, 24, 300));
        // Only the `gpu` row's time is GPU-time.
        assert_eq!((all[0].gpu_slice_us, all[0].gpu_compute_us), (100, 10));
        assert_eq!((all[0].model.as_deref(), all[0].start), (None, None));
        let by_model = group_usage(&rows, GroupBy { model: true, ..GroupBy::default() });
        assert_eq!(
            by_model.iter().map(|g| (g.model.as_deref(), g.requests)).collect::<Vec<_>>(),
            [(Some("a"), 7), (Some("b"), 5)]
        );
        let by_hour = group_usage(&rows, GroupBy { time: Some(3600), ..GroupBy::default() });
        assert_eq!(by_hour.iter().map(|g| (g.start, g.requests)).collect::<Vec<_>>(), [(Some(0), 7), (Some(3600), 5)]);
        assert_eq!(by_hour[0].version, None);
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let bounds = [100, 200, 400];
        // 10 in (0,100], 10 in (100,200]: the median is the top of the first bucket.
        assert_eq!(quantile(&[10, 10, 0, 0], &bounds, 0.5), Some(100));
        assert_eq!(quantile(&[10, 10, 0, 0], &bounds, 0.75), Some(150));
        assert_eq!(quantile(&[0, 0, 4, 0], &bounds, 0.5), Some(300));
        assert_eq!(quantile(&[1, 0, 0, 9], &bounds, 0.99), Some(400), "overflow reports the largest bound");
        assert_eq!(quantile(&[0, 0, 0, 0], &bounds, 0.5), None);
    }

    #[test]
    fn mean_batch_sizes_use_bucket_midpoints() {
        let bounds = [1, 2, 4, 8];
        assert_eq!(mean_batch_size(&[2, 2, 0, 0, 0], &bounds), Some(1.5));
        assert_eq!(mean_batch_size(&[0, 0, 1, 1, 0], &bounds), Some((3.5 + 6.5) / 2.0));
        assert_eq!(mean_batch_size(&[0, 0, 0, 0, 1], &bounds), Some(9.0));
        assert_eq!(mean_batch_size(&[0; 5], &bounds), None);
    }

    fn record(start: i64, requests: i64, failures: i64, bucket: usize) -> UsageRecordRow {
        let mut latency = vec![0; LATENCY_BUCKETS_US.len() + 1];
        latency[bucket] = requests + failures;
        let mut batches = vec![0; BATCH_SIZE_BUCKETS.len() + 1];
        batches[1] = requests;
        UsageRecordRow {
            key: format!("k{start}"),
            worker_id: "w".into(),
            tenant_id: Uuid::nil(),
            model_name: "m".into(),
            version: 1,
            slice_profile: "cpu".into(),
            period_start: start,
            period_seconds: 60,
            requests,
            failures,
            inferences: requests * 2,
            executions: requests,
            compute_us: 0,
            slice_us: 0,
            bytes_in: 0,
            bytes_out: 0,
            latency_counts: Json(latency),
            latency_sum_us: 0,
            batch_size_counts: Json(batches),
            throttled: 0,
        }
    }

    #[test]
    fn points_are_dense_and_rates_are_per_second() {
        let rows = [record(60, 50, 10, 3), record(60, 30, 0, 3), record(180, 6, 0, 0)];
        let p = points(&rows, 30, 240, 60);
        assert_eq!(p.iter().map(|p| p.start).collect::<Vec<_>>(), [0, 60, 120, 180]);
        assert_eq!((p[0].requests, p[0].p50_us, p[0].mean_batch_size), (0, None, None));
        assert_eq!((p[1].requests, p[1].failures), (80, 10));
        assert_eq!((p[1].request_rate, p[1].error_rate), (1.5, 10.0 / 60.0));
        // All 90 in (500, 1000]: the median sits halfway.
        assert_eq!(p[1].p50_us, Some(750));
        assert_eq!(p[1].p99_us, Some(995));
        assert_eq!(p[1].mean_batch_size, Some(2.0));
        assert_eq!(p[3].p95_us, Some(95));
        let hourly = points(&rows, 0, 3600, 3600);
        assert_eq!((hourly.len(), hourly[0].requests, hourly[0].request_rate), (1, 86, 96.0 / 3600.0));
    }
}
