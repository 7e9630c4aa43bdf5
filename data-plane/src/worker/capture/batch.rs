//! The capture queue's background work: a low-priority thread encodes records as JSON Lines
//! (off the request path, and below it in the scheduler) and gathers them per deployment; a
//! task ships a batch when it reaches [`BATCH_BYTES`] or when the flush interval passes,
//! through `ReportCapture` (a few tries, then dropped and counted).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tessera_protocol::agent::ReportCaptureRequest;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{CaptureCounters, DropReason};
use crate::serve::capture::CaptureRecord;
use crate::worker::client::AgentClient;

/// A batch is shipped once its lines reach this many bytes (well under gRPC's 4 MiB).
pub const BATCH_BYTES: usize = 1 << 20;
/// Tries per batch before it is dropped.
const TRIES: u32 = 3;
/// First retry delay (doubled per try).
const BACKOFF_START: Duration = Duration::from_millis(200);
/// How long one `ReportCapture` call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the last flush at shutdown may take.
const FINAL_FLUSH: Duration = Duration::from_secs(5);
/// How often the queue is drained into batches.
const DRAIN_EVERY: Duration = Duration::from_millis(20);
/// Encoded batches waiting for the shipping task.
const ENCODED_BATCHES: usize = 4;
/// The encoder thread's nice value: below requests, above nothing else in particular.
#[cfg(target_os = "linux")]
const ENCODER_NICE: libc::c_int = 10;

/// One deployment's records waiting to ship.
#[derive(Debug, Default)]
struct Pending {
    tenant_id: String,
    first_at_ms: i64,
    records: u32,
    jsonl: Vec<u8>,
}

/// Gathers encoded records per deployment (a plain struct: tests drive it without a task).
#[derive(Debug, Default)]
pub struct Batcher {
    pending: HashMap<Arc<str>, Pending>,
}

impl Batcher {
    /// Encodes and adds a record; answers a batch that became full. A record too large even
    /// bare is dropped and counted.
    pub fn add(&mut self, record: CaptureRecord, counters: &CaptureCounters) -> Option<ReportCaptureRequest> {
        let Some(line) = record.encode() else {
            counters.dropped(DropReason::TooLarge, 1);
            return None;
        };
        let pending = self.pending.entry(record.deployment_id.clone()).or_default();
        if pending.records == 0 {
            pending.tenant_id = record.tenant_id.clone();
            pending.first_at_ms = record.received_at_ms();
        }
        pending.records += 1;
        pending.jsonl.extend_from_slice(&line);
        if pending.jsonl.len() < BATCH_BYTES {
            return None;
        }
        let full = self.pending.remove(&record.deployment_id)?;
        Some(request(&record.deployment_id, full))
    }

    /// Every waiting batch, emptying the batcher.
    pub fn take_all(&mut self) -> Vec<ReportCaptureRequest> {
        self.pending.drain().map(|(deployment, p)| request(&deployment, p)).collect()
    }
}

fn request(deployment_id: &str, p: Pending) -> ReportCaptureRequest {
    ReportCaptureRequest {
        worker_id: String::new(),
        tenant_id: p.tenant_id,
        deployment_id: deployment_id.to_string(),
        batch_id: uuid::Uuid::now_v7().to_string(),
        first_at_ms: p.first_at_ms,
        records: p.records,
        jsonl: p.jsonl,
    }
}

/// Where batches go: the control plane, or a fake in tests.
pub trait CaptureSink: Send {
    /// Stores one batch; `Err` says why it was not.
    fn store(&mut self, batch: ReportCaptureRequest) -> BoxFuture<'_, Result<(), String>>;
}

impl CaptureSink for AgentClient {
    fn store(&mut self, batch: ReportCaptureRequest) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            match tokio::time::timeout(CALL_TIMEOUT, self.report_capture(batch)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
                Err(_) => Err("ReportCapture timed out".into()),
            }
        })
    }
}

/// The shipping half: the worker's id, the sink and the counters.
pub struct Shipper<S> {
    /// Stamped on every batch.
    pub worker_id: String,
    /// Where batches go.
    pub sink: S,
    /// Shared with the hook.
    pub counters: Arc<CaptureCounters>,
}

impl<S: CaptureSink> Shipper<S> {
    /// Ships one batch, trying a few times; a batch still refused is dropped and counted.
    pub async fn ship(&mut self, mut batch: ReportCaptureRequest) {
        batch.worker_id.clone_from(&self.worker_id);
        let records = u64::from(batch.records);
        let mut delay = BACKOFF_START;
        for attempt in 1..=TRIES {
            match self.sink.store(batch.clone()).await {
                Ok(()) => {
                    self.counters.stored(records);
                    return;
                }
                Err(e) if attempt == TRIES => {
                    tracing::warn!(deployment_id = %batch.deployment_id, records, error = %e, "capture batch dropped");
                }
                Err(_) => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
        self.counters.dropped(DropReason::ShipFailed, records);
    }

    /// Ships what the encoder thread batches from `queue` until `shutdown`: full batches at
    /// once, the rest every `interval`; at shutdown what is queued ships once more within a
    /// short deadline.
    pub async fn run(mut self, queue: mpsc::Receiver<CaptureRecord>, interval: Duration, shutdown: CancellationToken) {
        let (batches, mut encoded) = mpsc::channel(ENCODED_BATCHES);
        let encoder = Encoder { queue, batches, interval, stop: shutdown.clone(), counters: self.counters.clone() };
        if let Err(e) = std::thread::Builder::new().name("capture-encode".into()).spawn(move || encoder.run()) {
            // Without the thread the queue's receiver is gone: every record counts as dropped.
            tracing::error!(error = %e, "capture encoder thread did not start; captured records will be dropped");
            return;
        }
        loop {
            tokio::select! {
                batch = encoded.recv() => match batch {
                    Some(batch) => self.ship(batch).await,
                    None => return,
                },
                () = shutdown.cancelled() => break,
            }
        }
        let last = async {
            while let Some(batch) = encoded.recv().await {
                self.ship(batch).await;
            }
        };
        if tokio::time::timeout(FINAL_FLUSH, last).await.is_err() {
            tracing::warn!("capture batches not delivered in time at shutdown");
        }
    }
}

/// The encoding half, on a thread of its own at a lower scheduling priority: encoding is the
/// costly part of capture (JSON and base64 of every tensor), and on a busy worker it must give
/// way to requests rather than share the async runtime's threads with them.
struct Encoder {
    queue: mpsc::Receiver<CaptureRecord>,
    batches: mpsc::Sender<ReportCaptureRequest>,
    interval: Duration,
    stop: CancellationToken,
    counters: Arc<CaptureCounters>,
}

impl Encoder {
    /// Drains the queue every [`DRAIN_EVERY`] until stopped or the hook is gone, then hands
    /// over what is left. The queue is drained on a tick rather than waited on: a waiting
    /// receiver would be woken by every request's record, a thread wake-up per request on the
    /// request path (measured: +90 µs p50 for gRPC add_sub at concurrency 1).
    fn run(mut self) {
        lower_priority();
        let mut batcher = Batcher::default();
        let mut flushed = Instant::now();
        loop {
            let mut last = self.stop.is_cancelled();
            loop {
                match self.queue.try_recv() {
                    Ok(record) => {
                        if let Some(full) = batcher.add(record, &self.counters)
                            && !self.hand_over(full)
                        {
                            return;
                        }
                    }
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        last = true;
                        break;
                    }
                }
            }
            if last || flushed.elapsed() >= self.interval {
                for batch in batcher.take_all() {
                    if !self.hand_over(batch) {
                        return;
                    }
                }
                flushed = Instant::now();
            }
            if last {
                return;
            }
            std::thread::sleep(DRAIN_EVERY);
        }
    }

    /// Gives a batch to the shipping task, waiting while it is behind (the record queue then
    /// fills and drops); false once the task has ended (the batch is counted dropped).
    fn hand_over(&self, batch: ReportCaptureRequest) -> bool {
        let records = u64::from(batch.records);
        if self.batches.blocking_send(batch).is_err() {
            self.counters.dropped(DropReason::ShipFailed, records);
            return false;
        }
        true
    }
}

/// Lowers the calling thread's scheduling priority (Linux nice +10, per thread); elsewhere
/// the thread keeps its priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain syscalls on the calling thread's own id; no memory is passed.
        let tid = unsafe { libc::gettid() };
        let Ok(tid) = libc::id_t::try_from(tid) else { return };
        // SAFETY: as above; a failure leaves the priority as it was.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, ENCODER_NICE) } != 0 {
            tracing::debug!("capture encoder keeps its scheduling priority");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::engine::infer::InferRequest;
    use crate::serve::capture::{CaptureSettings, Finished, Tap, Ticket};

    fn record(deployment: &str, max: u64) -> CaptureRecord {
        let settings =
            CaptureSettings { sample_rate: 1.0, inputs: true, outputs: true, metadata: true, max_record_bytes: max };
        let mut tap = Tap::on(settings);
        tap.request(&InferRequest { id: "r".into(), ..Default::default() });
        let done = Finished {
            tenant_id: "t".into(),
            model: "m".into(),
            version: 1,
            received_at: UNIX_EPOCH + Duration::from_millis(42),
            duration: Duration::ZERO,
            error: None,
        };
        tap.into_record(Ticket { deployment_id: deployment.into(), settings }, done).expect("a record")
    }

    #[test]
    fn records_gather_per_deployment_as_json_lines() {
        let counters = CaptureCounters::default();
        let mut batcher = Batcher::default();
        for d in ["a", "b", "a"] {
            assert!(batcher.add(record(d, 1 << 20), &counters).is_none());
        }
        assert!(batcher.add(record("a", 10), &counters).is_none(), "too large even bare");
        assert_eq!(counters.dropped_count(DropReason::TooLarge), 1);
        let mut batches = batcher.take_all();
        batches.sort_by(|x, y| x.deployment_id.cmp(&y.deployment_id));
        assert_eq!(batches.len(), 2);
        assert_eq!((batches[0].records, batches[1].records), (2, 1));
        assert_eq!(batches[0].first_at_ms, 42);
        let lines: Vec<&[u8]> = batches[0].jsonl.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 2);
        for line in lines {
            let v: serde_json::Value = serde_json::from_slice(line).expect("a JSON line");
            assert_eq!(v["deployment_id"], "a");
        }
        assert!(batcher.take_all().is_empty());
    }

    #[test]
    fn a_full_batch_ships_at_once() {
        let counters = CaptureCounters::default();
        let mut batcher = Batcher::default();
        let per_line = record("a", 1 << 20).encode().expect("fits").len();
        let needed = BATCH_BYTES.div_ceil(per_line);
        let full = (0..needed).filter_map(|_| batcher.add(record("a", 1 << 20), &counters)).collect::<Vec<_>>();
        assert_eq!(full.len(), 1);
        assert_eq!(full[0].records as usize, needed);
        assert!(batcher.take_all().is_empty());
    }

    /// Keeps what it is given.
    #[derive(Clone, Default)]
    struct Keeping(Arc<parking_lot::Mutex<Vec<ReportCaptureRequest>>>);

    impl CaptureSink for Keeping {
        fn store(&mut self, batch: ReportCaptureRequest) -> BoxFuture<'_, Result<(), String>> {
            self.0.lock().push(batch);
            Box::pin(async { Ok(()) })
        }
    }

    #[tokio::test]
    async fn the_encoder_thread_hands_every_record_over_by_shutdown() {
        let counters = Arc::new(CaptureCounters::default());
        let sink = Keeping::default();
        let shipper = Shipper { worker_id: "w".into(), sink: sink.clone(), counters: counters.clone() };
        let (queue, rx) = mpsc::channel(64);
        let stop = CancellationToken::new();
        // A long interval: only the shutdown flushes.
        let task = tokio::spawn(shipper.run(rx, Duration::from_secs(3600), stop.clone()));
        for d in ["a", "b", "a"] {
            queue.try_send(record(d, 1 << 20)).expect("room");
        }
        // Past a few drain ticks, so the records are in the encoder's batches, not the queue.
        tokio::time::sleep(DRAIN_EVERY * 3).await;
        assert!(sink.0.lock().is_empty(), "nothing ships before the interval");
        queue.try_send(record("a", 1 << 20)).expect("room");
        stop.cancel();
        tokio::time::timeout(FINAL_FLUSH * 2, task).await.expect("ends in time").expect("no panic");
        let stored = sink.0.lock();
        let records: u32 = stored.iter().map(|b| b.records).sum();
        assert_eq!(records, 4);
        assert!(stored.iter().all(|b| b.worker_id == "w"));
        assert_eq!(counters.dropped_count(DropReason::ShipFailed), 0);
    }

    #[tokio::test]
    async fn a_full_batch_ships_before_the_interval() {
        let counters = Arc::new(CaptureCounters::default());
        let sink = Keeping::default();
        let shipper = Shipper { worker_id: "w".into(), sink: sink.clone(), counters };
        let per_line = record("a", 1 << 20).encode().expect("fits").len();
        let needed = BATCH_BYTES.div_ceil(per_line);
        let (queue, rx) = mpsc::channel(needed + 1);
        let stop = CancellationToken::new();
        let task = tokio::spawn(shipper.run(rx, Duration::from_secs(3600), stop.clone()));
        for _ in 0..needed {
            queue.try_send(record("a", 1 << 20)).expect("room");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while sink.0.lock().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(DRAIN_EVERY).await;
        }
        assert_eq!(sink.0.lock().first().map(|b| b.records as usize), Some(needed));
        stop.cancel();
        task.await.expect("no panic");
    }

    struct Failing(u32);

    impl CaptureSink for Failing {
        fn store(&mut self, _: ReportCaptureRequest) -> BoxFuture<'_, Result<(), String>> {
            self.0 += 1;
            Box::pin(async { Err("down".to_string()) })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_the_control_plane_refuses_is_dropped_after_a_few_tries() {
        let counters = Arc::new(CaptureCounters::default());
        let mut shipper = Shipper { worker_id: "w".into(), sink: Failing(0), counters: counters.clone() };
        let mut batcher = Batcher::default();
        batcher.add(record("a", 1 << 20), &counters);
        for batch in batcher.take_all() {
            shipper.ship(batch).await;
        }
        assert_eq!(shipper.sink.0, TRIES);
        assert_eq!(counters.dropped_count(DropReason::ShipFailed), 1);
    }
}
