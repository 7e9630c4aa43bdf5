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
}
