//! The usage meter on workers, from record to shipment: what was served, durably on local disk
//! before the client hears back ([`record`], [`spool`]), what the worker adds besides requests
//! ([`metering`]), and the shipper ([`ship`]) that delivers it to the control plane.
//!
//! **What is billable.** Every inference request (HTTP infer, gRPC `ModelInfer`, each
//! `ModelStreamInfer` response) whose caller authenticated to a tenant and whose model name and
//! version resolved to a loaded version in that tenant, however it ends afterwards: a success
//! counts as a request with its batch rows as inferences; an error after that point (bad body,
//! wrong shape, queue full, backend failure) counts as a failure. Requests refused before that
//! (no or bad credential, unknown model or version, another tenant's model, body over the size
//! limit) are not metered: they never reached a tenant's model.
//!
//! **Records.** Each such request appends one fixed-size record (labels id, finish time,
//! success, batch rows, latency, bytes in and out) to the current spool file with a single
//! `write` under the spool lock, before the response leaves: the page cache keeps it through a
//! SIGKILL (no fsync per request; the worker syncs the spool to disk every second, off the
//! request path, so a power loss loses at most that second). A record the spool cannot take
//! (disk full, I/O error) is held in memory, in order, and written before any newer one as soon
//! as a write succeeds again (tried on every append and every second), so a full disk delays
//! usage rather than losing it; serving goes on. Up to [`PENDING_MAX`] records wait so (a few
//! MiB); past that, or if the worker dies before space returns, they are lost and counted in
//! `tessera_usage_spool_write_errors_total`. Tenant, model, version and slice profile are interned per
//! file (a labels record precedes an id's first use). Executions, compute time and batch sizes
//! come from each loaded version's statistics: the worker samples their deltas every second
//! and when a version goes away, and appends them as execution records (exact over time; only
//! the last second before a crash is lost). Reserved slice time comes from the assignments:
//! every 10 s, when the set changes and at shutdown the worker appends, per assigned replica and
//! UTC minute, the time it held its slice divided by the replicas sharing that slice.
//!
//! `serve` has no meter: its request path does no metering work at all.

pub mod aggregate;
pub mod metering;
pub mod record;
pub mod ship;
pub mod spool;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};

use crate::serve::facade::UsageHook;
use crate::serve::metrics::header;
use record::{Labels, Record, RequestRecord};
use spool::SpoolWriter;

/// Slice profile of usage whose slice is not in the inventory (cannot happen when the control
/// plane assigns the worker's own slices); never empty, which the control plane refuses.
pub const UNKNOWN_PROFILE: &str = "unknown";

/// Most records held in memory while the spool cannot take them (about 150 bytes each).
pub const PENDING_MAX: usize = 100_000;

/// Labels by tenant id, model name and version.
type LabelIndex = HashMap<String, HashMap<String, BTreeMap<i64, Arc<Labels>>>>;

/// The spool writer plus the labels of every assigned version.
pub struct Meter {
    dir: PathBuf,
    /// Request handlers and the worker's samplers append under it: it orders a labels definition
    /// before its use and keeps rotation from splitting a record.
    spool: Mutex<Spool>,
    /// Written when assignments change (before their installs start); read per request.
    labels: RwLock<LabelIndex>,
    write_errors: AtomicU64,
}

/// The writer and the records it could not take yet, oldest first.
struct Spool {
    writer: SpoolWriter,
    pending: VecDeque<(Arc<Labels>, Record)>,
    /// Appends that failed since the spool last took everything (for rare logging).
    failures: u64,
}

impl Spool {
    /// Writes the pending records, in order, until one fails.
    fn write_pending(&mut self) -> io::Result<()> {
        let was = self.pending.len();
        while let Some((labels, record)) = self.pending.front() {
            self.writer.append(labels, |id| record.clone().with_id(id))?;
            self.pending.pop_front();
        }
        if was > 0 {
            tracing::warn!(
                records = was,
                failures = self.failures,
                "the usage spool is writable again; held records written"
            );
            self.failures = 0;
        }
        Ok(())
    }
}

pub use crate::serve::facade::Outcome;

impl Meter {
    /// A meter spooling to `dir` (a new spool file is started there).
    pub fn open(dir: &Path) -> io::Result<Self> {
        Self::open_with_rotation(dir, spool::ROTATE_BYTES)
    }

    /// As [`Self::open`], starting a new file past `rotate_at` bytes.
    pub fn open_with_rotation(dir: &Path, rotate_at: u64) -> io::Result<Self> {
        Ok(Self {
            dir: dir.to_path_buf(),
            spool: Mutex::new(Spool {
                writer: SpoolWriter::open(dir, rotate_at)?,
                pending: VecDeque::new(),
                failures: 0,
            }),
            labels: RwLock::new(HashMap::new()),
            write_errors: AtomicU64::new(0),
        })
    }

    /// The spool directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes records held since the spool failed, if it takes them now, and forces everything
    /// spooled so far onto the disk (blocks: call it off the request path).
    pub fn sync(&self) -> io::Result<()> {
        // The lock is held only to collect the files; appends go on while they sync.
        let files = {
            let mut spool = self.spool.lock();
            // Still failing: they wait for the next try (the error was logged when it began).
            let _ = spool.write_pending();
            spool.writer.take_unsynced()
        };
        // Every file gets its sync even when one fails; the first error is reported.
        let mut result = Ok(());
        for file in &files {
            if let Err(e) = file.sync_data() {
                result = result.and(Err(e));
            }
        }
        result
    }

    /// Records that could not be spooled and were dropped (more than [`PENDING_MAX`] waiting):
    /// that usage is lost.
    pub fn write_errors(&self) -> u64 {
        self.write_errors.load(Ordering::Relaxed)
    }

    /// Records held in memory until the spool takes them.
    pub fn pending(&self) -> usize {
        self.spool.lock().pending.len()
    }

    /// Sets the labels of these versions (kept for versions not named: a request may still run
    /// on a version that was just unassigned). Unchanged labels keep their identity.
    pub fn set_labels(&self, all: impl IntoIterator<Item = Labels>) {
        let mut index = self.labels.write();
        for labels in all {
            let slot = index
                .entry(labels.tenant_id.clone())
                .or_default()
                .entry(labels.model_name.clone())
                .or_default()
                .entry(labels.version)
                .or_insert_with(|| Arc::new(labels.clone()));
            if **slot != labels {
                *slot = Arc::new(labels);
            }
        }
    }

    /// The labels of a version; a version never assigned (cannot happen on a worker: versions
    /// load only from assignments) gets [`UNKNOWN_PROFILE`] rather than going unmetered.
    pub fn labels(&self, tenant_id: &str, model_name: &str, version: i64) -> Arc<Labels> {
        let found =
            self.labels.read().get(tenant_id).and_then(|m| m.get(model_name)).and_then(|v| v.get(&version)).cloned();
        found.unwrap_or_else(|| {
            tracing::warn!(tenant_id, model_name, version, "metering a version without an assignment");
            let labels = Labels {
                tenant_id: tenant_id.into(),
                model_name: model_name.into(),
                version,
                slice_profile: UNKNOWN_PROFILE.into(),
            };
            self.set_labels([labels]);
            self.labels(tenant_id, model_name, version)
        })
    }

    /// Spools one finished request of `model_name` version `version` in `tenant_id`.
    pub fn record_request(&self, tenant_id: &str, model_name: &str, version: i64, outcome: Outcome) {
        let labels = self.labels(tenant_id, model_name, version);
        let latency_us = u64::try_from(outcome.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.append(&labels, |id| {
            Record::Request(RequestRecord {
                id,
                at_us: now_us(),
                success: outcome.success,
                rows: if outcome.success { outcome.rows } else { 0 },
                latency_us,
                bytes_in: outcome.bytes_in,
                bytes_out: outcome.bytes_out,
            })
        });
    }

    /// Appends the record `make` builds for the labels' id, after any records held since a
    /// failure. A record the spool cannot take is held in memory (see the module docs); failures
    /// are logged, never returned: serving goes on when the disk is full.
    pub fn append(&self, labels: &Arc<Labels>, make: impl FnOnce(u32) -> Record) {
        let record = make(0);
        let mut spool = self.spool.lock();
        let written = spool.write_pending().and_then(|()| spool.writer.append(labels, |id| record.clone().with_id(id)));
        let Err(e) = written else { return };
        spool.failures += 1;
        let n = spool.failures;
        if spool.pending.len() < PENDING_MAX {
            spool.pending.push_back((labels.clone(), record));
            // Powers of two: the first failure and then ever more rarely, not once per request.
            if n.is_power_of_two() {
                let held = spool.pending.len();
                tracing::error!(error = %e, failures = n, held, dir = %self.dir.display(), "cannot spool usage; holding it in memory until the spool takes it");
            }
        } else {
            drop(spool);
            let lost = self.write_errors.fetch_add(1, Ordering::Relaxed) + 1;
            if lost.is_power_of_two() {
                tracing::error!(error = %e, lost, dir = %self.dir.display(), "cannot spool usage and {PENDING_MAX} records wait already; it is lost");
            }
        }
    }
}

/// Now, Unix microseconds.
pub fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The worker's meter is the serving layer's usage hook: it hears every inference that reached
/// a tenant's model and adds the spool's health to `/metrics`.
impl UsageHook for Meter {
    fn record(&self, tenant_id: &str, model: &str, version: i64, outcome: Outcome) {
        self.record_request(tenant_id, model, version, outcome);
    }

    fn render_metrics(&self, out: &mut String) {
        render_usage(out, self.write_errors(), self.pending(), spool::backlog_bytes(self.dir()).ok());
    }
}

fn render_usage(out: &mut String, write_errors: u64, pending: usize, backlog: Option<u64>) {
    use std::fmt::Write as _;
    header(out, "tessera_usage_spool_write_errors_total", "Usage records that could not be spooled (lost)", "counter");
    let _ = writeln!(out, "tessera_usage_spool_write_errors_total {write_errors}");
    let help = "Usage records held in memory until the spool takes them (disk full)";
    header(out, "tessera_usage_spool_pending_records", help, "gauge");
    let _ = writeln!(out, "tessera_usage_spool_pending_records {pending}");
    if let Some(bytes) = backlog {
        let help = "Spooled usage bytes the control plane has not acknowledged yet";
        header(out, "tessera_usage_spool_backlog_bytes", help, "gauge");
        let _ = writeln!(out, "tessera_usage_spool_backlog_bytes {bytes}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spool_health_is_in_the_metrics() {
        let mut out = String::new();
        render_usage(&mut out, 3, 5, Some(96));
        assert!(out.contains("tessera_usage_spool_write_errors_total 3"));
        assert!(out.contains("tessera_usage_spool_pending_records 5"));
        assert!(out.contains("tessera_usage_spool_backlog_bytes 96"));
    }

    #[test]
    fn records_the_disk_refuses_wait_in_memory_and_are_written_in_order_when_it_takes_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let meter = Meter::open(dir.path()).expect("open");
        let ok = |rows| Outcome { started: std::time::Instant::now(), success: true, rows, bytes_in: 1, bytes_out: 1 };
        meter.record_request("t", "m", 1, ok(1));
        // The disk is full: /dev/full refuses every write with ENOSPC.
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let spooled = meter.spool.lock().writer.swap_file(Arc::new(full));
        for rows in 2..=4 {
            meter.record_request("t", "m", 1, ok(rows));
        }
        assert_eq!((meter.pending(), meter.write_errors()), (3, 0), "held, not lost");
        // A retry that fails keeps them (the sync itself fails here too: /dev/full cannot sync).
        let _ = meter.sync();
        assert_eq!((meter.pending(), meter.write_errors()), (3, 0));
        // Space returns: the next sync (or append) writes them, oldest first, before newer ones.
        meter.spool.lock().writer.swap_file(spooled);
        meter.sync().expect("sync");
        meter.record_request("t", "m", 1, ok(5));
        assert_eq!((meter.pending(), meter.write_errors()), (0, 0));
        let files = spool::files(dir.path()).expect("list");
        assert_eq!(files.len(), 1, "a refused write does not start a new file");
        let scanned = spool::scan(&std::fs::read(&files[0].path).expect("read"));
        assert!(!scanned.damaged);
        let rows: Vec<u32> = scanned
            .records
            .iter()
            .filter_map(|(_, r)| match r {
                Record::Request(r) => Some(r.rows),
                _ => None,
            })
            .collect();
        assert_eq!(rows, [1, 2, 3, 4, 5]);
    }

    #[test]
    fn requests_are_spooled_with_their_labels() {
        let dir = tempfile::tempdir().expect("tempdir");
        let meter = Meter::open(dir.path()).expect("open");
        let labels = Labels { tenant_id: "t".into(), model_name: "m".into(), version: 2, slice_profile: "gpu".into() };
        meter.set_labels([labels.clone()]);
        let first = meter.labels("t", "m", 2);
        meter.set_labels([labels.clone()]);
        assert!(Arc::ptr_eq(&first, &meter.labels("t", "m", 2)), "unchanged labels keep their id");
        let outcome =
            Outcome { started: std::time::Instant::now(), success: false, rows: 5, bytes_in: 7, bytes_out: 0 };
        meter.record_request("t", "m", 2, outcome);
        meter.record_request("t", "m", 9, Outcome { success: true, ..outcome });
        let files = spool::files(dir.path()).expect("list");
        let scanned = spool::scan(&std::fs::read(&files[0].path).expect("read"));
        let records: Vec<Record> = scanned.records.into_iter().map(|(_, r)| r).collect();
        assert_eq!(records.len(), 4);
        assert_eq!(records[0], Record::Labels(0, labels));
        assert!(matches!(
            records[1],
            Record::Request(RequestRecord { id: 0, success: false, rows: 0, bytes_in: 7, .. })
        ));
        assert!(matches!(&records[2], Record::Labels(1, l) if l.version == 9 && l.slice_profile == UNKNOWN_PROFILE));
        assert!(matches!(records[3], Record::Request(RequestRecord { id: 1, success: true, rows: 5, .. })));
        assert_eq!(meter.write_errors(), 0);
    }
}
