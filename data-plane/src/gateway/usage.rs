//! Throttled requests as usage: a gateway counts the requests it refuses under a tenant's
//! limits per (tenant, model, version, UTC minute) and ships them to the control plane with
//! `ReportUsage`, as usage records of slice profile [`GATEWAY_PROFILE`] whose only counter is
//! `throttled`, so a tenant sees in its usage what its limits turned away.
//!
//! Delivery is at least once and stored once: counts taken from the table become records whose
//! keys (`gw:<gateway>:<boot>:<n>`, `boot` drawn at start) stay the same through every retry, and
//! they are sent again until the control plane acknowledges them. Counts live in memory only: a
//! gateway that is killed loses what it had not shipped (at most one interval; a graceful stop
//! ships the rest). These counts are not billed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tessera_protocol::agent::UsageRecord;
use tessera_protocol::usage::{BATCH_SIZE_BUCKETS, GATEWAY_KEY_PREFIX, GATEWAY_PROFILE, LATENCY_BUCKETS_US};
use tokio_util::sync::CancellationToken;

use crate::worker::usage::ship::{SendError, UsageSink};

/// Most records one `ReportUsage` call carries (the control plane takes up to 10,000).
const BATCH_RECORDS: usize = 1_000;
/// How long the last shipment at shutdown may take.
const FINAL_SHIPMENT: Duration = Duration::from_secs(5);

/// (tenant id, model, version, minute start).
type Key = (String, String, i64, i64);

/// Refused requests not shipped yet.
#[derive(Debug, Default)]
pub struct ThrottledUsage {
    counts: Mutex<BTreeMap<Key, u64>>,
}

impl ThrottledUsage {
    /// Counts one refused request at `unix` seconds.
    pub fn count(&self, tenant: &str, model: &str, version: i64, unix: i64) {
        let minute = unix.div_euclid(60) * 60;
        *self.counts.lock().entry((tenant.to_string(), model.to_string(), version, minute)).or_default() += 1;
    }

    /// Takes every count, leaving none.
    pub(super) fn take(&self) -> BTreeMap<Key, u64> {
        std::mem::take(&mut *self.counts.lock())
    }
}

/// Turns counts into records keyed from `next` on.
struct Keys {
    prefix: String,
    next: u64,
}

impl Keys {
    fn new(gateway_id: &str) -> Self {
        let boot = uuid::Uuid::now_v7().simple();
        Keys { prefix: format!("{GATEWAY_KEY_PREFIX}{gateway_id}:{boot}:"), next: 0 }
    }

    fn records(&mut self, gateway_id: &str, counts: BTreeMap<Key, u64>) -> Vec<UsageRecord> {
        counts
            .into_iter()
            .map(|((tenant_id, model_name, version, minute), throttled)| {
                let key = format!("{}{}", self.prefix, self.next);
                self.next += 1;
                UsageRecord {
                    key,
                    worker_id: gateway_id.to_string(),
                    tenant_id,
                    model_name,
                    version,
                    slice_profile: GATEWAY_PROFILE.to_string(),
                    minute,
                    latency_counts: vec![0; LATENCY_BUCKETS_US.len() + 1],
                    batch_size_counts: vec![0; BATCH_SIZE_BUCKETS.len() + 1],
                    throttled,
                    ..UsageRecord::default()
                }
            })
            .collect()
    }
}

/// Ships throttled counts every `interval` until `stop`, then once more (briefly).
pub async fn ship(
    usage: Arc<ThrottledUsage>,
    mut sink: impl UsageSink,
    gateway_id: String,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut keys = Keys::new(&gateway_id);
    let mut pending: Vec<UsageRecord> = Vec::new();
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = ticks.tick() => {}
        }
        match step(&usage, &mut sink, &gateway_id, &mut keys, &mut pending).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("throttled usage reaches the control plane again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, pending = pending.len(), "could not ship throttled usage; retrying");
            }
            Err(_) => {}
        }
    }
    let last = async {
        while step(&usage, &mut sink, &gateway_id, &mut keys, &mut pending).await.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    if tokio::time::timeout(FINAL_SHIPMENT, last).await.is_err() {
        tracing::warn!(records = pending.len(), "throttled usage not shipped before exit; it is lost");
    }
}

/// Sends what is pending (taking new counts when nothing is), until all of it is acknowledged
/// or a call fails.
async fn step(
    usage: &ThrottledUsage,
    sink: &mut impl UsageSink,
    gateway_id: &str,
    keys: &mut Keys,
    pending: &mut Vec<UsageRecord>,
) -> Result<(), String> {
    if pending.is_empty() {
        *pending = keys.records(gateway_id, usage.take());
    }
    while !pending.is_empty() {
        let batch: Vec<UsageRecord> = pending.iter().take(BATCH_RECORDS).cloned().collect();
        match sink.send(batch).await {
            Ok(acknowledged) => {
                let done: std::collections::HashSet<String> = acknowledged.into_iter().collect();
                let before = pending.len();
                pending.retain(|r| !done.contains(&r.key));
                if pending.len() == before {
                    return Err("the control plane acknowledged none of the records sent".into());
                }
            }
            Err(SendError::Rejected(why)) => {
                // Sending the same records again cannot help: drop this batch, keep the rest.
                tracing::error!(reason = %why, "the control plane refused throttled usage records; dropped");
                let n = pending.len().min(BATCH_RECORDS);
                pending.drain(..n);
            }
            Err(SendError::Unavailable(why)) => return Err(why),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use futures::future::BoxFuture;

    use super::*;

    /// A control plane that stores each key once and fails the first `failures` calls.
    #[derive(Default)]
    struct Fake {
        stored: Arc<Mutex<BTreeMap<String, UsageRecord>>>,
        failures: usize,
        calls: usize,
    }

    impl UsageSink for Fake {
        fn send(&mut self, records: Vec<UsageRecord>) -> BoxFuture<'_, Result<Vec<String>, SendError>> {
            Box::pin(async move {
                self.calls += 1;
                if self.calls <= self.failures {
                    return Err(SendError::Unavailable("down".into()));
                }
                let mut stored = self.stored.lock();
                Ok(records
                    .into_iter()
                    .map(|r| {
                        let key = r.key.clone();
                        stored.entry(key.clone()).or_insert(r);
                        key
                    })
                    .collect())
            })
        }
    }

    #[test]
    fn counts_fall_into_minutes_per_model_and_version() {
        let usage = ThrottledUsage::default();
        for unix in [120, 150, 179, 180] {
            usage.count("t", "m", 0, unix);
        }
        usage.count("t", "m", 2, 130);
        usage.count("u", "m", 0, 130);
        let mut keys = Keys::new("gw0");
        let records = keys.records("gw0", usage.take());
        let seen: Vec<_> = records.iter().map(|r| (r.tenant_id.as_str(), r.version, r.minute, r.throttled)).collect();
        assert_eq!(seen, [("t", 0, 120, 3), ("t", 0, 180, 1), ("t", 2, 120, 1), ("u", 0, 120, 1)]);
        assert!(records.iter().all(|r| r.slice_profile == GATEWAY_PROFILE && r.requests == 0 && r.worker_id == "gw0"));
        // What a gateway's token is allowed to report.
        assert!(records.iter().all(tessera_protocol::usage::is_gateway_record));
        assert!(records.iter().all(|r| r.latency_counts.len() == LATENCY_BUCKETS_US.len() + 1));
        let distinct: std::collections::HashSet<_> = records.iter().map(|r| &r.key).collect();
        assert_eq!(distinct.len(), 4, "every record has its own key");
        assert!(usage.take().is_empty(), "taking empties the table");
    }

    #[tokio::test]
    async fn a_failed_call_is_retried_with_the_same_keys_and_stored_once() {
        let usage = ThrottledUsage::default();
        usage.count("t", "m", 0, 60);
        usage.count("t", "m", 0, 61);
        let mut fake = Fake { failures: 1, ..Fake::default() };
        let (mut keys, mut pending) = (Keys::new("gw"), Vec::new());
        assert!(step(&usage, &mut fake, "gw", &mut keys, &mut pending).await.is_err());
        let held: Vec<String> = pending.iter().map(|r| r.key.clone()).collect();
        assert_eq!(held.len(), 1);
        // A refusal counted meanwhile waits for the next step: the pending record goes first, as it was.
        usage.count("t", "m", 0, 62);
        step(&usage, &mut fake, "gw", &mut keys, &mut pending).await.expect("delivered");
        assert_eq!(fake.stored.lock().keys().cloned().collect::<Vec<_>>(), held);
        step(&usage, &mut fake, "gw", &mut keys, &mut pending).await.expect("delivered");
        let stored = fake.stored.lock();
        assert_eq!(stored.values().map(|r| r.throttled).sum::<u64>(), 3);
        assert_eq!(stored.len(), 2);
    }

    #[tokio::test]
    async fn stopping_ships_what_is_left() {
        let usage = Arc::new(ThrottledUsage::default());
        let fake = Fake::default();
        let stored = fake.stored.clone();
        let stop = CancellationToken::new();
        let shipping = tokio::spawn(ship(usage.clone(), fake, "gw".into(), Duration::from_secs(3600), stop.clone()));
        tokio::task::yield_now().await;
        usage.count("t", "m", 1, 600);
        stop.cancel();
        shipping.await.expect("shipper");
        assert_eq!(
            stored.lock().values().map(|r| (r.model_name.as_str(), r.version, r.throttled)).collect::<Vec<_>>(),
            [("m", 1, 1)]
        );
    }
}
