//! What the worker adds to the usage spool besides requests (see [`super`]): the labels of
//! assigned versions (tenant, model, version, slice profile), reserved slice time per replica,
//! and execution deltas from each loaded version's statistics.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tessera_protocol::agent;
use tokio_util::sync::CancellationToken;

use super::aggregate::minute_of;
use super::record::{BATCH_COUNTS, ExecutionsRecord, Labels, Record, SliceRecord};
use super::{Meter, UNKNOWN_PROFILE, now_us};
use crate::engine::manager::ModelManager;
use crate::engine::model::LoadedModel;
use crate::worker::inventory::Inventory;

/// How often execution deltas are spooled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// How often reserved slice time is spooled (also on every assignment change and at shutdown).
pub const SLICE_INTERVAL: Duration = Duration::from_secs(10);

/// The worker's metering inputs, shared by the reconciler hook and the sampling task.
pub struct Metering {
    meter: Arc<Meter>,
    /// Slice id to profile, from the inventory (replaced when the MIG layout changes).
    profiles: Mutex<HashMap<String, String>>,
    /// Replicas holding slices since the last accrual; the reconciler hook and the sampling
    /// task both advance it.
    clock: Mutex<SliceClock>,
}

impl Metering {
    /// Metering into `meter` for the slices of `inventory`; slice time counts from now.
    pub fn new(meter: Arc<Meter>, inventory: &Inventory) -> Self {
        let metering =
            Self { meter, profiles: Mutex::new(HashMap::new()), clock: Mutex::new(SliceClock::new(now_us())) };
        metering.set_slices(inventory);
        metering
    }

    /// The slices offered now (after a MIG layout change); the next assignment set uses them.
    pub fn set_slices(&self, inventory: &Inventory) {
        *self.profiles.lock() = inventory.slices.iter().map(|s| (s.id.clone(), s.profile.clone())).collect();
    }

    /// A new assignment set: labels its versions for request metering, spools the slice time
    /// the previous set held until now, and times the new set from now.
    pub fn assigned(&self, assignments: &[agent::Assignment]) {
        let profiles = self.profiles.lock().clone();
        let profile =
            |a: &agent::Assignment| profiles.get(&a.slice_id).cloned().unwrap_or_else(|| UNKNOWN_PROFILE.to_string());
        // A version's requests count on the profile of its first replica in the reconciler's
        // order (serving first, then by replica id).
        let mut ordered: Vec<&agent::Assignment> = assignments.iter().collect();
        ordered.sort_by(|a, b| (!a.serving, &a.replica_id).cmp(&(!b.serving, &b.replica_id)));
        let mut versions: BTreeMap<(&str, &str, i64), Labels> = BTreeMap::new();
        for a in &ordered {
            versions.entry((&a.tenant_id, &a.model_name, a.version)).or_insert_with(|| labels(a, profile(a)));
        }
        self.meter.set_labels(versions.into_values());
        let mut held: Vec<(String, Arc<Labels>)> = Vec::new();
        for a in ordered {
            if !profiles.contains_key(&a.slice_id) {
                tracing::warn!(replica_id = %a.replica_id, slice_id = %a.slice_id, "replica on an unknown slice: no slice time");
                continue;
            }
            held.push((a.slice_id.clone(), Arc::new(labels(a, profile(a)))));
        }
        let mut clock = self.clock.lock();
        let spans = clock.advance(now_us());
        self.spool_slices(spans);
        clock.hold(held);
    }

    /// Spools the slice time held since the last accrual.
    pub fn tick_slices(&self) {
        let spans = self.clock.lock().advance(now_us());
        self.spool_slices(spans);
    }

    fn spool_slices(&self, spans: Vec<(Arc<Labels>, i64, u64)>) {
        for (labels, start_us, reserved_us) in spans {
            self.meter.append(&labels, |id| Record::Slice(SliceRecord { id, start_us, reserved_us }));
        }
    }

    /// Samples execution deltas every [`SAMPLE_INTERVAL`] and slice time every
    /// [`SLICE_INTERVAL`] until `shutdown`; returns the sampler for the final flush.
    pub async fn run(self: Arc<Self>, manager: Arc<ModelManager>, shutdown: CancellationToken) -> ExecutionSampler {
        let mut sampler = ExecutionSampler::default();
        let mut samples = tokio::time::interval(SAMPLE_INTERVAL);
        let mut slices = tokio::time::interval(SLICE_INTERVAL);
        slices.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return sampler,
                _ = samples.tick() => {
                    sampler.sample(&manager, &self.meter);
                    self.sync_spool().await;
                }
                _ = slices.tick() => self.tick_slices(),
            }
        }
    }

    /// Syncs the spool to disk on a blocking thread (a slow disk must not stall the runtime).
    async fn sync_spool(&self) {
        let meter = self.meter.clone();
        match tokio::task::spawn_blocking(move || meter.sync()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, dir = %self.meter.dir().display(), "cannot sync the usage spool to disk")
            }
            Err(e) => tracing::warn!(error = %e, "the usage spool sync did not finish"),
        }
    }

    /// At shutdown, after in-flight requests finished: the last execution deltas and slice time,
    /// synced to disk.
    pub async fn flush(&self, mut sampler: ExecutionSampler, manager: &ModelManager) {
        sampler.sample(manager, &self.meter);
        self.tick_slices();
        self.sync_spool().await;
    }
}

fn labels(a: &agent::Assignment, slice_profile: String) -> Labels {
    Labels { tenant_id: a.tenant_id.clone(), model_name: a.model_name.clone(), version: a.version, slice_profile }
}

/// Reserved slice time: which replica holds which slice since when.
#[derive(Debug)]
pub struct SliceClock {
    since_us: i64,
    /// Slice id and labels of each assigned replica.
    held: Vec<(String, Arc<Labels>)>,
}

impl SliceClock {
    /// Nothing held, counting from `now_us`.
    pub fn new(now_us: i64) -> Self {
        Self { since_us: now_us, held: Vec::new() }
    }

    /// From now on these replicas hold their slices (call [`Self::advance`] first).
    pub fn hold(&mut self, held: Vec<(String, Arc<Labels>)>) {
        self.held = held;
    }

    /// The time held since the last call up to `now_us`, as `(labels, start, reserved µs)`
    /// spans cut at UTC minute boundaries; each slice's time is split evenly between the
    /// replicas sharing it (the remainder microseconds to the first ones, so nothing is lost).
    pub fn advance(&mut self, now_us: i64) -> Vec<(Arc<Labels>, i64, u64)> {
        let mut start = self.since_us;
        self.since_us = now_us;
        let mut sharing: BTreeMap<&str, Vec<&Arc<Labels>>> = BTreeMap::new();
        for (slice, labels) in &self.held {
            sharing.entry(slice).or_default().push(labels);
        }
        let mut out = Vec::new();
        while start < now_us {
            let end = now_us.min((minute_of(start) + 60) * 1_000_000);
            let span = u64::try_from(end - start).unwrap_or(0);
            for holders in sharing.values() {
                let n = holders.len() as u64;
                for (i, labels) in holders.iter().enumerate() {
                    let reserved = span / n + u64::from((i as u64) < span % n);
                    out.push((Arc::clone(labels), start, reserved));
                }
            }
            start = end;
        }
        out
    }
}

/// Counters of one loaded version at the last sample.
struct Sampled {
    model: Arc<LoadedModel>,
    tenant_id: String,
    model_name: String,
    executions: u64,
    compute_ns: u64,
    batches: [u64; BATCH_COUNTS],
}

/// Spools what each loaded version executed since the previous sample; a version that went away
/// (or was reloaded) gets its last delta from the instance it still holds, then is dropped.
#[derive(Default)]
pub struct ExecutionSampler {
    tracked: HashMap<(String, i64), Sampled>,
}

impl ExecutionSampler {
    /// Samples every tracked and every loaded version once.
    pub fn sample(&mut self, manager: &ModelManager, meter: &Meter) {
        let mut current: HashMap<(String, i64), Arc<LoadedModel>> = HashMap::new();
        for (key, versions) in manager.installed() {
            for version in versions {
                if let Ok(model) = manager.get(&key, Some(version)) {
                    current.insert((key.clone(), version), model);
                }
            }
        }
        let now = now_us();
        for ((_, version), sampled) in &mut self.tracked {
            sampled.spool_delta(*version, now, meter);
        }
        self.tracked.retain(|k, s| current.get(k).is_some_and(|m| Arc::ptr_eq(m, &s.model)));
        for ((key, version), model) in current {
            let Some((tenant, name)) = key.split_once('/') else { continue };
            let entry = (key.clone(), version);
            if self.tracked.contains_key(&entry) {
                continue;
            }
            // A fresh instance's statistics start at zero: its first delta is all it did.
            let sampled = Sampled {
                model,
                tenant_id: tenant.to_string(),
                model_name: name.to_string(),
                executions: 0,
                compute_ns: 0,
                batches: [0; BATCH_COUNTS],
            };
            let sampled = self.tracked.entry(entry).or_insert(sampled);
            sampled.spool_delta(version, now, meter);
        }
    }
}

impl Sampled {
    fn spool_delta(&mut self, version: i64, at_us: i64, meter: &Meter) {
        let (executions, compute_ns) = self.model.stats.mean_execution();
        let mut batches = [0; BATCH_COUNTS];
        let mut below = 0;
        for (slot, (_, cumulative)) in batches.iter_mut().zip(self.model.stats.batch_sizes.snapshot().0) {
            *slot = cumulative - below;
            below = cumulative;
        }
        if executions == self.executions {
            return;
        }
        let mut batch_counts = [0; BATCH_COUNTS];
        for (i, slot) in batch_counts.iter_mut().enumerate() {
            *slot = batches[i].saturating_sub(self.batches[i]);
        }
        let mut record = ExecutionsRecord {
            id: 0,
            at_us,
            executions: executions - self.executions,
            compute_ns: compute_ns.saturating_sub(self.compute_ns),
            batch_counts,
        };
        let labels = meter.labels(&self.tenant_id, &self.model_name, version);
        meter.append(&labels, move |id| {
            record.id = id;
            Record::Executions(record)
        });
        (self.executions, self.compute_ns, self.batches) = (executions, compute_ns, batches);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(model: &str) -> Arc<Labels> {
        Arc::new(Labels { tenant_id: "t".into(), model_name: model.into(), version: 1, slice_profile: "cpu".into() })
    }

    const MIN: i64 = 60_000_000;

    #[test]
    fn slice_time_is_cut_at_minutes_and_shared_exactly() {
        let mut clock = SliceClock::new(10 * MIN - 4_000_000);
        assert!(clock.advance(10 * MIN - 3_000_000).is_empty(), "nothing held yet");
        let (a, b, c) = (labels("a"), labels("b"), labels("c"));
        clock.hold(vec![("cpu-0".into(), a.clone()), ("cpu-0".into(), b.clone()), ("cpu-1".into(), c.clone())]);
        let spans = clock.advance(10 * MIN + 2_000_001);
        let summary: Vec<(&str, i64, u64)> = spans.iter().map(|(l, s, r)| (l.model_name.as_str(), *s, *r)).collect();
        assert_eq!(
            summary,
            [
                ("a", 10 * MIN - 3_000_000, 1_500_000),
                ("b", 10 * MIN - 3_000_000, 1_500_000),
                ("c", 10 * MIN - 3_000_000, 3_000_000),
                ("a", 10 * MIN, 1_000_001),
                ("b", 10 * MIN, 1_000_000),
                ("c", 10 * MIN, 2_000_001),
            ]
        );
        let total: u64 = spans.iter().map(|s| s.2).sum();
        assert_eq!(total, 2 * 5_000_001, "two slices, each held the whole span");
        assert!(clock.advance(10 * MIN + 2_000_001).is_empty(), "no time passed");
        clock.hold(Vec::new());
        assert!(clock.advance(11 * MIN).is_empty(), "unassigned: nothing accrues");
    }

    #[test]
    fn statistics_and_usage_share_batch_buckets() {
        assert_eq!(&crate::engine::stats::BATCH_BUCKETS[..], tessera_protocol::usage::BATCH_SIZE_BUCKETS);
    }
}
