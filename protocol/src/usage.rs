//! Bucket bounds shared by the worker's usage meter and the control plane's roll-ups, so both
//! sides read a record's histograms the same way.

/// Upper bounds (inclusive, microseconds) of the request-latency buckets in a usage record;
/// one overflow bucket follows.
pub const LATENCY_BUCKETS_US: &[u64] = &[
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000,
];

/// Upper bounds (inclusive) of the executed-batch-size buckets in a usage record; one overflow
/// bucket follows.
pub const BATCH_SIZE_BUCKETS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256];

/// Slice profile of the usage records a gateway reports: requests it refused under a tenant's
/// limits, which never reached a slice.
pub const GATEWAY_PROFILE: &str = "gateway";

/// Every key of a gateway's usage record starts with this (`gw:<gateway>:<boot>:<n>`), so a
/// gateway's keys never meet a worker's.
pub const GATEWAY_KEY_PREFIX: &str = "gw:";

/// Whether `record` is what a gateway may report: refused requests only (profile
/// [`GATEWAY_PROFILE`], a key under [`GATEWAY_KEY_PREFIX`], every served counter zero). A
/// gateway's token is held to these, so it can neither bill a tenant for serving nor take a
/// worker's record key.
pub fn is_gateway_record(record: &crate::agent::UsageRecord) -> bool {
    record.slice_profile == GATEWAY_PROFILE
        && record.key.starts_with(GATEWAY_KEY_PREFIX)
        && record.requests == 0
        && record.failures == 0
        && record.inferences == 0
        && record.executions == 0
        && record.compute_seconds == 0.0
        && record.slice_seconds == 0.0
        && record.bytes_in == 0
        && record.bytes_out == 0
        && record.latency_sum_us == 0
        && record.latency_counts.iter().all(|&c| c == 0)
        && record.batch_size_counts.iter().all(|&c| c == 0)
}

/// Index of the bucket `value` falls in (the overflow bucket is `bounds.len()`).
pub fn bucket_index(bounds: &[u64], value: u64) -> usize {
    bounds.partition_point(|&b| b < value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_at_or_above_them() {
        assert_eq!(bucket_index(LATENCY_BUCKETS_US, 0), 0);
        assert_eq!(bucket_index(LATENCY_BUCKETS_US, 100), 0);
        assert_eq!(bucket_index(LATENCY_BUCKETS_US, 101), 1);
        assert_eq!(bucket_index(LATENCY_BUCKETS_US, u64::MAX), LATENCY_BUCKETS_US.len());
        assert_eq!(bucket_index(BATCH_SIZE_BUCKETS, 3), 2);
    }

    #[test]
    fn a_gateway_record_holds_refusals_only() {
        let refused = crate::agent::UsageRecord {
            key: format!("{GATEWAY_KEY_PREFIX}gw-1:b:0"),
            slice_profile: GATEWAY_PROFILE.into(),
            latency_counts: vec![0; LATENCY_BUCKETS_US.len() + 1],
            throttled: 3,
            ..Default::default()
        };
        assert!(is_gateway_record(&refused));
        let served = crate::agent::UsageRecord { requests: 1, ..refused.clone() };
        let timed = crate::agent::UsageRecord { latency_counts: vec![1], ..refused.clone() };
        let sliced = crate::agent::UsageRecord { slice_profile: "cpu".into(), ..refused.clone() };
        let workers_key = crate::agent::UsageRecord { key: "worker-1:b:0".into(), ..refused.clone() };
        for bad in [served, timed, sliced, workers_key] {
            assert!(!is_gateway_record(&bad), "{bad:?}");
        }
    }
}
