//! Request/response capture on a worker: the deployments that capture (from the assignments),
//! the request path's sampling check, and the bounded queue sampled records wait in. A
//! background task ([`batch`]) encodes them as JSON Lines and ships them in batches to the
//! control plane, which stores them under the tenant's prefix.
//!
//! Capture is sampling, not billing: a record the queue has no room for, or a batch the control
//! plane did not take after a few tries, is dropped and counted in `/metrics`, never waited for.

pub mod batch;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;
use tessera_protocol::agent;
use tokio::sync::mpsc;

use crate::serve::capture::{CaptureHook, CaptureRecord, CaptureSettings, Ticket, draw, sampled};

/// Records waiting to be encoded; past it, records are dropped (and counted).
pub const QUEUE_CAPACITY: usize = 4096;

/// Why a record was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The queue was full (the background task fell behind).
    QueueFull,
    /// Even without tensors and parameters it exceeded `max_record_bytes`.
    TooLarge,
    /// Its batch was not stored by the control plane.
    ShipFailed,
}

impl DropReason {
    fn label(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::TooLarge => "too_large",
            DropReason::ShipFailed => "ship_failed",
        }
    }
}

/// Counters `/metrics` shows, shared by the hook and the background task.
#[derive(Debug, Default)]
pub struct CaptureCounters {
    sampled: AtomicU64,
    stored: AtomicU64,
    batches: AtomicU64,
    dropped: [AtomicU64; 3],
}

impl CaptureCounters {
    /// Counts `n` records dropped for `reason`.
    pub fn dropped(&self, reason: DropReason, n: u64) {
        self.dropped[reason as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a batch of `records` stored.
    pub fn stored(&self, records: u64) {
        self.stored.fetch_add(records, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    /// Records dropped for `reason` so far.
    pub fn dropped_count(&self, reason: DropReason) -> u64 {
        self.dropped[reason as usize].load(Ordering::Relaxed)
    }
}

/// A deployment that captures, by tenant, then by the model name clients use: nested so the
/// request path looks up borrowed names without building an owned key.
type Routes = HashMap<String, HashMap<String, Ticket>>;

/// The worker's capture hook: sampling on the request path, the sending half of the queue.
pub struct Capture {
    /// False while no assigned deployment captures: the request path's only cost then.
    any: AtomicBool,
    /// Replaced whole on every assignment change (read on every sampled-tenant request).
    routes: RwLock<Routes>,
    /// To the batching task; full → the record is dropped. Closed once the task ended.
    queue: mpsc::Sender<CaptureRecord>,
    counters: Arc<CaptureCounters>,
}

impl Capture {
    /// A hook and the receiving half its background task drains.
    pub fn new(capacity: usize) -> (Arc<Self>, mpsc::Receiver<CaptureRecord>) {
        let (queue, rx) = mpsc::channel(capacity.max(1));
        let capture = Capture {
            any: AtomicBool::new(false),
            routes: RwLock::new(Routes::new()),
            queue,
            counters: Arc::new(CaptureCounters::default()),
        };
        (Arc::new(capture), rx)
    }

    /// The counters, for the background task.
    pub fn counters(&self) -> Arc<CaptureCounters> {
        self.counters.clone()
    }

    /// Takes the capture settings of the deployments in a new assignment set.
    pub fn assigned(&self, assignments: &[agent::Assignment]) {
        let mut routes = Routes::new();
        for a in assignments {
            let Some(settings) = a.capture.as_ref().and_then(settings) else { continue };
            let ticket = Ticket { deployment_id: a.deployment_id.as_str().into(), settings };
            routes.entry(a.tenant_id.clone()).or_default().insert(a.model_name.clone(), ticket);
        }
        let any = !routes.is_empty();
        *self.routes.write() = routes;
        self.any.store(any, Ordering::Release);
    }
}

/// The settings of an assignment's capture, `None` when it can capture nothing.
fn settings(c: &agent::CaptureSettings) -> Option<CaptureSettings> {
    (c.sample_rate > 0.0).then_some(CaptureSettings {
        sample_rate: c.sample_rate,
        inputs: c.inputs,
        outputs: c.outputs,
        metadata: c.metadata,
        max_record_bytes: c.max_record_bytes,
    })
}

impl CaptureHook for Capture {
    fn sample(&self, tenant_id: &str, model: &str) -> Option<Ticket> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let routes = self.routes.read();
        let ticket = routes.get(tenant_id)?.get(model)?;
        if !sampled(ticket.settings.sample_rate, draw()) {
            return None;
        }
        self.counters.sampled.fetch_add(1, Ordering::Relaxed);
        Some(ticket.clone())
    }

    fn submit(&self, record: CaptureRecord) {
        if self.queue.try_send(record).is_err() {
            self.counters.dropped(DropReason::QueueFull, 1);
        }
    }

    fn render_metrics(&self, out: &mut String) {
        let c = &self.counters;
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        };
        counter(
            out,
            "tessera_capture_sampled_total",
            "Requests sampled for capture.",
            c.sampled.load(Ordering::Relaxed),
        );
        counter(
            out,
            "tessera_capture_stored_total",
            "Captured records the control plane stored.",
            c.stored.load(Ordering::Relaxed),
        );
        counter(
            out,
            "tessera_capture_batches_total",
            "Capture files the control plane stored.",
            c.batches.load(Ordering::Relaxed),
        );
        let name = "tessera_capture_dropped_total";
        let _ = writeln!(out, "# HELP {name} Captured records dropped, by reason.\n# TYPE {name} counter");
        for reason in [DropReason::QueueFull, DropReason::TooLarge, DropReason::ShipFailed] {
            let _ = writeln!(out, "{name}{{reason=\"{}\"}} {}", reason.label(), c.dropped_count(reason));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::serve::capture::{Finished, Tap};

    fn assignment(tenant: &str, model: &str, rate: Option<f64>) -> agent::Assignment {
        agent::Assignment {
            deployment_id: format!("dep-{model}"),
            tenant_id: tenant.into(),
            model_name: model.into(),
            capture: rate.map(|sample_rate| agent::CaptureSettings {
                sample_rate,
                inputs: true,
                outputs: true,
                metadata: true,
                max_record_bytes: 1 << 20,
            }),
            ..Default::default()
        }
    }

    fn record(ticket: Ticket) -> CaptureRecord {
        let done = Finished {
            tenant_id: "a".into(),
            model: "m".into(),
            version: 1,
            received_at: UNIX_EPOCH,
            duration: Duration::ZERO,
            error: None,
        };
        Tap::on(ticket.settings).into_record(ticket, done).expect("a record")
    }

    #[test]
    fn only_capturing_deployments_of_the_right_tenant_are_sampled() {
        let (capture, _rx) = Capture::new(4);
        assert!(capture.sample("a", "m").is_none(), "nothing assigned");
        capture.assigned(&[
            assignment("a", "m", Some(1.0)),
            assignment("a", "off", None),
            assignment("a", "zero", Some(0.0)),
        ]);
        assert_eq!(&*capture.sample("a", "m").expect("sampled").deployment_id, "dep-m");
        assert!(capture.sample("b", "m").is_none(), "another tenant's model of the same name");
        assert!(capture.sample("a", "off").is_none());
        assert!(capture.sample("a", "zero").is_none(), "rate 0 captures nothing");
        capture.assigned(&[]);
        assert!(capture.sample("a", "m").is_none(), "capture ends with the assignment");
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let (capture, mut rx) = Capture::new(2);
        capture.assigned(&[assignment("a", "m", Some(1.0))]);
        for _ in 0..5 {
            let ticket = capture.sample("a", "m").expect("sampled");
            capture.submit(record(ticket));
        }
        assert_eq!(capture.counters.dropped_count(DropReason::QueueFull), 3);
        assert!(rx.try_recv().is_ok() && rx.try_recv().is_ok() && rx.try_recv().is_err());
        let mut text = String::new();
        capture.render_metrics(&mut text);
        assert!(text.contains("tessera_capture_dropped_total{reason=\"queue_full\"} 3"), "{text}");
        assert!(text.contains("tessera_capture_sampled_total 5"), "{text}");
    }
}
