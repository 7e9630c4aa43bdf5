//! Turning a byte range of a spool file into `UsageRecord`s: one per (tenant, model, version,
//! slice profile, UTC minute) that has records in the range, keyed by a hash of the worker, the
//! file, the range and the group. A range's contents never change (files are append-only), so
//! sending the same range again yields the same records under the same keys.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};
use tessera_protocol::agent::UsageRecord;
use tessera_protocol::usage::{LATENCY_BUCKETS_US, bucket_index};

use super::record::{BATCH_COUNTS, Labels, Record};

/// Labels ids seen so far in one spool file.
pub type Dictionary = HashMap<u32, Labels>;

/// The start of the UTC minute `at_us` (Unix microseconds) falls in, Unix seconds.
pub fn minute_of(at_us: i64) -> i64 {
    at_us.div_euclid(60_000_000) * 60
}

/// The idempotency key of one group of one range: hex SHA-256 over length-prefixed fields, so
/// no two different inputs hash the same text.
pub fn usage_key(worker_id: &str, file: &str, range: (u64, u64), labels: &Labels, minute: i64) -> String {
    let mut hash = Sha256::new();
    let version = labels.version.to_string();
    let (start, end, minute) = (range.0.to_string(), range.1.to_string(), minute.to_string());
    let fields = [
        worker_id,
        file,
        &start,
        &end,
        &labels.tenant_id,
        &labels.model_name,
        &version,
        &labels.slice_profile,
        &minute,
    ];
    for field in fields {
        hash.update((field.len() as u64).to_le_bytes());
        hash.update(field.as_bytes());
    }
    hex::encode(hash.finalize())
}

/// Folds the records of `range` (in file order, labels definitions included) into usage
/// records. `dictionary` holds the definitions met before the range and learns those in it.
/// Records naming an undefined id are skipped and counted in the second value.
pub fn aggregate(
    worker_id: &str,
    file: &str,
    range: (u64, u64),
    dictionary: &mut Dictionary,
    records: impl IntoIterator<Item = Record>,
) -> (Vec<UsageRecord>, usize) {
    let mut groups: BTreeMap<(Labels, i64), UsageRecord> = BTreeMap::new();
    let mut orphans = 0;
    for record in records {
        let (id, at_us) = match &record {
            Record::Labels(id, labels) => {
                dictionary.insert(*id, labels.clone());
                continue;
            }
            Record::Request(r) => (r.id, r.at_us),
            Record::Executions(e) => (e.id, e.at_us),
            Record::Slice(s) => (s.id, s.start_us),
        };
        let Some(labels) = dictionary.get(&id) else {
            orphans += 1;
            continue;
        };
        let minute = minute_of(at_us);
        let usage = groups.entry((labels.clone(), minute)).or_insert_with(|| UsageRecord {
            key: usage_key(worker_id, file, range, labels, minute),
            worker_id: worker_id.to_string(),
            tenant_id: labels.tenant_id.clone(),
            model_name: labels.model_name.clone(),
            version: labels.version,
            slice_profile: labels.slice_profile.clone(),
            minute,
            latency_counts: vec![0; LATENCY_BUCKETS_US.len() + 1],
            batch_size_counts: vec![0; BATCH_COUNTS],
            ..Default::default()
        });
        add(usage, &record);
    }
    (groups.into_values().collect(), orphans)
}

fn add(usage: &mut UsageRecord, record: &Record) {
    match record {
        Record::Labels(..) => {}
        Record::Request(r) if r.success => {
            usage.requests += 1;
            usage.inferences += u64::from(r.rows);
            add_request_common(usage, r.latency_us, r.bytes_in, r.bytes_out);
        }
        Record::Request(r) => {
            usage.failures += 1;
            add_request_common(usage, r.latency_us, r.bytes_in, r.bytes_out);
        }
        Record::Executions(e) => {
            usage.executions += e.executions;
            usage.compute_seconds += e.compute_ns as f64 / 1e9;
            for (total, n) in usage.batch_size_counts.iter_mut().zip(e.batch_counts) {
                *total += n;
            }
        }
        Record::Slice(s) => usage.slice_seconds += s.reserved_us as f64 / 1e6,
    }
}

fn add_request_common(usage: &mut UsageRecord, latency_us: u64, bytes_in: u64, bytes_out: u64) {
    usage.latency_counts[bucket_index(LATENCY_BUCKETS_US, latency_us)] += 1;
    usage.latency_sum_us += latency_us;
    usage.bytes_in += bytes_in;
    usage.bytes_out += bytes_out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::usage::record::{ExecutionsRecord, RequestRecord, SliceRecord};

    fn labels(version: i64) -> Labels {
        Labels { tenant_id: "t".into(), model_name: "m".into(), version, slice_profile: "cpu".into() }
    }

    fn request(id: u32, at_us: i64, success: bool, rows: u32, latency_us: u64) -> Record {
        Record::Request(RequestRecord { id, at_us, success, rows, latency_us, bytes_in: 10, bytes_out: 20 })
    }

    fn records() -> Vec<Record> {
        const MIN: i64 = 60_000_000;
        vec![
            Record::Labels(0, labels(1)),
            request(0, 5 * MIN + 1, true, 2, 90),
            request(0, 5 * MIN + 2, false, 0, 300),
            request(0, 6 * MIN, true, 1, 20_000_000),
            Record::Labels(1, labels(2)),
            request(1, 5 * MIN + 3, true, 4, 100),
            Record::Executions(ExecutionsRecord {
                id: 0,
                at_us: 5 * MIN + 4,
                executions: 2,
                compute_ns: 1_500_000_000,
                batch_counts: [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            }),
            Record::Slice(SliceRecord { id: 1, start_us: 5 * MIN, reserved_us: 2_500_000 }),
            request(9, 5 * MIN, true, 1, 1),
        ]
    }

    #[test]
    fn records_fold_per_labels_and_minute() {
        let mut dictionary = Dictionary::new();
        let (usage, orphans) = aggregate("w", "f", (0, 100), &mut dictionary, records());
        assert_eq!(orphans, 1, "id 9 was never defined");
        assert_eq!(dictionary.len(), 2);
        let summary: Vec<(i64, i64, u64, u64, u64)> =
            usage.iter().map(|u| (u.version, u.minute, u.requests, u.failures, u.inferences)).collect();
        assert_eq!(summary, [(1, 300, 1, 1, 2), (1, 360, 1, 0, 1), (2, 300, 1, 0, 4)]);
        let v1 = &usage[0];
        assert_eq!((v1.executions, v1.compute_seconds, v1.bytes_in, v1.bytes_out), (2, 1.5, 20, 40));
        assert_eq!(v1.latency_counts[0], 1);
        assert_eq!(v1.latency_counts[2], 1, "300 µs is in the 500 µs bucket");
        assert_eq!(v1.latency_sum_us, 390);
        assert_eq!(&v1.batch_size_counts[..3], &[1, 1, 0]);
        assert_eq!(usage[1].latency_counts[LATENCY_BUCKETS_US.len()], 1, "20 s overflows");
        assert_eq!(usage[2].slice_seconds, 2.5);
        assert!(usage.iter().all(|u| u.worker_id == "w" && u.tenant_id == "t" && u.slice_profile == "cpu"));
    }

    #[test]
    fn keys_are_deterministic_and_differ_by_range_group_and_file() {
        let run = |file: &str, range| {
            let (usage, _) = aggregate("w", file, range, &mut Dictionary::new(), records());
            usage.into_iter().map(|u| u.key).collect::<Vec<_>>()
        };
        let keys = run("f", (0, 100));
        assert_eq!(keys, run("f", (0, 100)), "a replay gets the same keys");
        assert_eq!(keys.len(), 3);
        assert!(keys.iter().all(|k| k.len() == 64));
        assert_ne!(keys[0], keys[1]);
        assert!(run("f", (0, 101)).iter().all(|k| !keys.contains(k)));
        assert!(run("g", (0, 100)).iter().all(|k| !keys.contains(k)));
        let odd = Labels { model_name: "a|b".into(), slice_profile: "c".into(), ..labels(1) };
        let other = Labels { model_name: "a".into(), slice_profile: "b|c".into(), ..labels(1) };
        assert_ne!(usage_key("w", "f", (0, 1), &odd, 0), usage_key("w", "f", (0, 1), &other, 0));
    }

    #[test]
    fn minutes_round_down_also_before_the_epoch() {
        assert_eq!(minute_of(59_999_999), 0);
        assert_eq!(minute_of(60_000_000), 60);
        assert_eq!(minute_of(-1), -60);
    }
}
