//! Delivering the usage spool to the control plane (`ReportUsage`), at least once, each record
//! under a key that never changes, so the control plane stores it exactly once.
//!
//! One step: take the bytes of the oldest unfinished spool file from the cursor on, up to
//! [`RANGE_BYTES`] and ending at a record boundary; write that range into the cursor as pending
//! (atomically) *before* sending; fold it into usage records keyed by (worker, file, range,
//! group) ([`aggregate`](super::aggregate)); send them until every key is acknowledged, retrying with
//! capped exponential backoff for as long as it takes (the control plane may be down for hours;
//! requests keep spooling meanwhile); then advance the cursor past the range. After a crash the
//! pending range is sent again as it was, so a replay carries the same keys. A sealed file
//! (a newer one exists) that is fully acknowledged is deleted. An incomplete record at the end
//! of the live file waits for its write to finish; one at the end of a sealed file (cut by a
//! crash) is dropped with the file.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use futures::future::BoxFuture;
use tessera_protocol::agent::{ReportUsageRequest, UsageRecord};
use tokio_util::sync::CancellationToken;

use super::aggregate::{Dictionary, aggregate};
use super::record::Record;
use super::spool::{self, Cursor, SpoolFile};
use crate::worker::client::AgentClient;

/// Largest byte range shipped in one step.
pub const RANGE_BYTES: usize = 1 << 20;
/// Most usage records in one `ReportUsage` call.
const BATCH_RECORDS: usize = 500;
/// First retry delay.
const BACKOFF_START: Duration = Duration::from_millis(200);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Records the control plane refused as invalid, one line each (kept for an operator).
const REJECTED_FILE: &str = "rejected.log";
/// How long one `ReportUsage` call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why records were not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// The control plane refused the records as invalid: sending them again cannot help.
    Rejected(String),
    /// The control plane could not be reached or failed: try again later.
    Unavailable(String),
}

/// Where usage records go: the control plane, or a fake in tests.
pub trait UsageSink: Send {
    /// Sends records; answers the keys acknowledged.
    fn send(&mut self, records: Vec<UsageRecord>) -> BoxFuture<'_, Result<Vec<String>, SendError>>;
}

impl UsageSink for AgentClient {
    fn send(&mut self, records: Vec<UsageRecord>) -> BoxFuture<'_, Result<Vec<String>, SendError>> {
        Box::pin(async move {
            let call = self.report_usage(ReportUsageRequest { records });
            match tokio::time::timeout(CALL_TIMEOUT, call).await {
                Ok(Ok(response)) => Ok(response.into_inner().acknowledged),
                Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => {
                    Err(SendError::Rejected(status.message().to_string()))
                }
                Ok(Err(status)) => Err(SendError::Unavailable(format!("{:?}: {}", status.code(), status.message()))),
                Err(_) => Err(SendError::Unavailable("ReportUsage timed out".into())),
            }
        })
    }
}

/// Why shipping stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// `stop` was cancelled while a range was still unacknowledged (it stays pending).
    #[error("stopped before the control plane acknowledged the pending range")]
    Stopped,
    /// The spool directory could not be read or the cursor written.
    #[error("usage spool: {0}")]
    Io(#[from] std::io::Error),
}

/// What one step did.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Shipped a range or moved past a finished file, and more was waiting behind it.
    Progress,
    /// Shipped the live file up to its end as read: what was written since waits for the next
    /// round, so that under steady load a round ends instead of chasing each new record.
    CaughtUp,
    /// Nothing complete left to ship.
    Idle,
}

/// The labels dictionary of one file, as known up to a byte offset.
struct Known {
    seq: u64,
    upto: u64,
    dictionary: Dictionary,
}

/// Ships the spool in `dir` for `worker_id` through `sink`.
pub struct Shipper<S> {
    dir: PathBuf,
    worker_id: String,
    sink: S,
    known: Option<Known>,
}

impl<S: UsageSink> Shipper<S> {
    /// A shipper over the spool directory `dir`.
    pub fn new(dir: PathBuf, worker_id: String, sink: S) -> Self {
        Self { dir, worker_id, sink, known: None }
    }

    /// Ships everything complete in the spool when it reaches each file (records written
    /// while it ships wait for the next call); `Err(Stopped)` when `stop` interrupts a retry.
    pub async fn ship_all(&mut self, stop: &CancellationToken) -> Result<(), ShipError> {
        while self.step(stop).await? == Step::Progress {}
        Ok(())
    }

    /// Every `interval`, ships what is there; ends (without a final ship) on `shutdown`.
    pub async fn run(mut self, interval: Duration, shutdown: CancellationToken) -> Self {
        loop {
            match self.ship_all(&shutdown).await {
                Ok(()) | Err(ShipError::Stopped) => {}
                Err(e) => tracing::error!(error = %e, "cannot ship usage"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return self,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }

    async fn step(&mut self, stop: &CancellationToken) -> Result<Step, ShipError> {
        let mut cursor = Cursor::load(&self.dir)?;
        let files = spool::files(&self.dir)?;
        for done in files.iter().filter(|f| f.seq < cursor.file) {
            remove(done);
        }
        let Some(file) = files.iter().find(|f| f.seq >= cursor.file) else { return Ok(Step::Idle) };
        if file.seq != cursor.file {
            cursor = Cursor { file: file.seq, offset: 0, pending_end: None };
            cursor.save(&self.dir)?;
        }
        // Sealed is decided before reading: every write to a sealed file happened before the
        // newer file was created.
        let sealed = files.iter().any(|f| f.seq > file.seq);
        self.learn_dictionary(file, cursor.offset)?;
        let start = cursor.offset;
        let want = match cursor.pending_end {
            Some(end) => usize::try_from(end.saturating_sub(start)).unwrap_or(usize::MAX),
            None => RANGE_BYTES,
        };
        let bytes = spool::read_at(&file.path, start, want)?;
        // The live file read short of a fresh range: this step ships all it holds for now.
        let caught_up = !sealed && cursor.pending_end.is_none() && bytes.len() < want;
        let scanned = spool::scan(&bytes);
        let end = start + scanned.end as u64;
        if let Some(pending) = cursor.pending_end
            && pending != end
        {
            tracing::error!(file = %file.name, start, pending, readable = end, "pending usage range no longer reads whole");
        }
        if end == start {
            if !sealed {
                return Ok(Step::Idle);
            }
            self.finish_file(file, start, bytes.len())?;
            return Ok(Step::Progress);
        }
        if cursor.pending_end.is_none() {
            Cursor { pending_end: Some(end), ..cursor }.save(&self.dir)?;
        }
        let known = self.known.as_mut().expect("learn_dictionary set it for this file");
        let records = scanned.records.into_iter().map(|(_, r)| r);
        let (usage, orphans) = aggregate(&self.worker_id, &file.name, (start, end), &mut known.dictionary, records);
        known.upto = end;
        if orphans > 0 {
            tracing::error!(file = %file.name, orphans, "usage records without labels skipped");
        }
        self.deliver(usage, stop).await?;
        Cursor { file: file.seq, offset: end, pending_end: None }.save(&self.dir)?;
        Ok(if caught_up { Step::CaughtUp } else { Step::Progress })
    }

    /// Moves past a sealed file whose records are all acknowledged and removes it; `left`
    /// bytes after `offset` (a record cut by a crash, or damage) cannot be read and are dropped.
    fn finish_file(&mut self, file: &SpoolFile, offset: u64, left: usize) -> std::io::Result<()> {
        if left > 0 {
            tracing::warn!(file = %file.name, offset, left, "unreadable end of a sealed usage file dropped");
        }
        Cursor { file: file.seq + 1, offset: 0, pending_end: None }.save(&self.dir)?;
        remove(file);
        self.known = None;
        Ok(())
    }

    /// Makes `known` the dictionary of `file` up to `offset` (reading the file's start again
    /// after a restart or when the cursor moved without this shipper).
    fn learn_dictionary(&mut self, file: &SpoolFile, offset: u64) -> std::io::Result<()> {
        if self.known.as_ref().is_some_and(|k| k.seq == file.seq && k.upto == offset) {
            return Ok(());
        }
        let head = spool::read_at(&file.path, 0, usize::try_from(offset).unwrap_or(usize::MAX))?;
        let mut dictionary = Dictionary::new();
        for (_, record) in spool::scan(&head).records {
            if let Record::Labels(id, labels) = record {
                dictionary.insert(id, labels);
            }
        }
        self.known = Some(Known { seq: file.seq, upto: offset, dictionary });
        Ok(())
    }

    /// Sends `usage` until every key is acknowledged (or, refused as invalid on its own,
    /// set aside in `rejected.log`: one bad record must not hold up all later usage).
    async fn deliver(&mut self, mut usage: Vec<UsageRecord>, stop: &CancellationToken) -> Result<(), ShipError> {
        let mut backoff = BACKOFF_START;
        while !usage.is_empty() {
            let mut done = HashSet::new();
            // A call under way is abandoned at shutdown: the range stays pending, sent again later.
            let failed = tokio::select! {
                () = stop.cancelled() => return Err(ShipError::Stopped),
                failed = self.send_batches(&usage, &mut done) => failed,
            };
            usage.retain(|u| !done.contains(&u.key));
            if usage.is_empty() {
                return Ok(());
            }
            let reason = failed.unwrap_or_else(|| "some keys were not acknowledged".into());
            tracing::warn!(%reason, pending = usage.len(), retry_ms = backoff.as_millis(), "usage not delivered yet");
            tokio::select! {
                () = stop.cancelled() => return Err(ShipError::Stopped),
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
        Ok(())
    }

    /// One attempt at every record; fills `done` and returns why it stopped early, if it did.
    async fn send_batches(&mut self, usage: &[UsageRecord], done: &mut HashSet<String>) -> Option<String> {
        for batch in usage.chunks(BATCH_RECORDS) {
            match self.sink.send(batch.to_vec()).await {
                Ok(keys) => done.extend(keys),
                Err(SendError::Unavailable(reason)) => return Some(reason),
                // A refused batch goes again record by record, to find the bad ones.
                Err(SendError::Rejected(_)) => {
                    for record in batch {
                        match self.sink.send(vec![record.clone()]).await {
                            Ok(keys) => done.extend(keys),
                            Err(SendError::Unavailable(reason)) => return Some(reason),
                            Err(SendError::Rejected(reason)) => {
                                self.set_aside(record, &reason);
                                done.insert(record.key.clone());
                            }
                        }
                    }
                }
            }
        }
        None
    }

    fn set_aside(&self, record: &UsageRecord, reason: &str) {
        tracing::error!(key = %record.key, %reason, "the control plane refused a usage record; set aside in rejected.log");
        let line = format!("{reason}\t{record:?}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(REJECTED_FILE))
            .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        if let Err(e) = written {
            tracing::error!(error = %e, "cannot write rejected.log");
        }
    }
}

fn remove(file: &SpoolFile) {
    match std::fs::remove_file(&file.path) {
        Ok(()) => tracing::debug!(file = %file.name, "shipped usage file removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(file = %file.name, error = %e, "cannot remove a shipped usage file"),
    }
}

#[cfg(test)]
mod tests;
