//! The keys of the Postgres advisory locks the control plane takes, in one place: two uses of
//! one key would make them exclude each other (a leader's session lock held for hours would
//! stop every transaction waiting on the same key).

/// Placement writes, one transaction at a time across control planes.
pub const SCHEDULING: i64 = 0x7465_7373_0001;
/// The scheduler's leader (session lock).
pub const SCHEDULER_LEADER: i64 = 0x7465_7373_0002;
/// Usage deliveries (shared) against retention folds (exclusive), per transaction.
pub const USAGE_RETENTION: i64 = 0x7465_7373_0003;
/// The webhook sender's leader (session lock).
pub const WEBHOOK_SENDER: i64 = 0x7465_7373_0004;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lock_has_its_own_key() {
        let keys = [SCHEDULING, SCHEDULER_LEADER, USAGE_RETENTION, WEBHOOK_SENDER];
        let distinct: std::collections::BTreeSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len());
    }
}
