//! The NVML monitor: one dedicated OS thread (NVML calls block) that waits for critical Xid and
//! MIG configuration-change events on every GPU and samples the GPU metrics about once a
//! second. It stops within [`WAIT`] of its cancellation token.
//!
//! - A critical Xid is judged by [`xid::judge_xid`] and applied to [`SliceHealth`].
//! - A GPU that answers `GPU_IS_LOST` (to the event wait or to a sample) takes its slices out;
//!   when the wait reports a lost GPU and no GPU owns up to it, every GPU is taken out, and so
//!   is every GPU when the wait fails otherwise (the device plugin's rule: a GPU whose health
//!   cannot be watched takes no new work). The monitor then only samples.
//! - A MIG configuration change re-reads the GPUs; new slices go out on the layout channel and
//!   the worker registers them again.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, EventSet, Nvml};
use nvml_wrapper_sys::bindings::nvmlEventData_t;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::health::SliceHealth;
use super::nvml::{GpuDevice, read_gpus, slices};
use super::telemetry::{self, GpuMetrics};
use super::xid::{self, Verdict, XidEvent};
use crate::worker::inventory::SliceSpec;

/// Longest single wait for events: how late the thread notices cancellation.
pub const WAIT: Duration = Duration::from_millis(500);
/// Time between metric samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// What the monitor thread owns.
pub struct Monitor {
    /// NVML, shared with whoever opened it.
    pub nvml: Arc<Nvml>,
    /// The GPUs found at start (index and uuid name the GPUs events come from).
    pub gpus: Vec<GpuDevice>,
    /// Marks slices unhealthy.
    pub health: Arc<SliceHealth>,
    /// Keeps the last sample.
    pub metrics: Arc<GpuMetrics>,
    /// The GPU and MIG slices after a MIG configuration change: the monitor sends, the worker
    /// receives and registers again. Closed when the monitor stops.
    pub layout: watch::Sender<Vec<SliceSpec>>,
}

/// One event NVML delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Xid(XidEvent),
    MigConfigChange { gpu_uuid: String },
    Other,
}

impl Monitor {
    /// Starts the thread; it runs until `stop` is cancelled.
    pub fn spawn(self, stop: CancellationToken) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name("nvml-monitor".into()).spawn(move || self.run_monitor(&stop))
    }

    fn run_monitor(self, stop: &CancellationToken) {
        let nvml = self.nvml.clone();
        let mut current = slices(&self.gpus);
        let mut events = watch_events(&nvml, &self.gpus);
        let mut sampled: Option<Instant> = None;
        tracing::info!(gpus = self.gpus.len(), events = events.is_some(), "NVML monitor started");
        while !stop.is_cancelled() {
            if sampled.is_none_or(|t| t.elapsed() >= SAMPLE_INTERVAL) {
                self.sample(&nvml, &current);
                sampled = Some(Instant::now());
            }
            let Some(set) = &events else {
                std::thread::sleep(WAIT);
                continue;
            };
            match wait(&nvml, set, WAIT) {
                Ok(Event::Xid(e)) => self.on_xid(&current, &e),
                Ok(Event::MigConfigChange { gpu_uuid }) => self.on_mig_change(&nvml, &gpu_uuid, &mut current),
                Ok(Event::Other) | Err(NvmlError::Timeout) => {}
                Err(NvmlError::GpuLost) => self.on_lost(&nvml, &current),
                Err(e) => {
                    tracing::error!(error = %e, "waiting for NVML events failed; GPU health is no longer watched");
                    let reason = format!("NVML event wait failed: {e}");
                    let all: Vec<String> = current.iter().map(|s| s.id.clone()).collect();
                    self.health.apply(&Verdict::Unhealthy { slices: all, reason }, None);
                    events = None;
                }
            }
        }
        tracing::info!("NVML monitor stopped");
    }

    fn sample(&self, nvml: &Nvml, current: &[SliceSpec]) {
        let sample = telemetry::sample(nvml);
        for index in &sample.lost {
            // A GPU lost before the start offers no slices: nothing to take out.
            if let Some(gpu) = self.gpus.iter().find(|g| g.index == *index) {
                self.health.apply(&xid::judge_gpu_lost(current, &gpu.uuid), None);
            }
        }
        self.metrics.store(sample);
    }

    fn on_xid(&self, current: &[SliceSpec], event: &XidEvent) {
        let verdict = xid::judge_xid(current, event);
        if let Verdict::Unhealthy { slices, reason } = &verdict
            && slices.is_empty()
        {
            tracing::warn!(gpu_uuid = %event.gpu_uuid, xid = event.xid, %reason, "critical Xid names no slice of this worker");
        }
        self.health.apply(&verdict, Some(event.xid));
    }

    /// The wait said a GPU is lost: the GPUs that answer `GPU_IS_LOST` are; if none does,
    /// every GPU is taken out.
    fn on_lost(&self, nvml: &Nvml, current: &[SliceSpec]) {
        let lost: Vec<&GpuDevice> = self
            .gpus
            .iter()
            .filter(|g| matches!(nvml.device_by_index(g.index).and_then(|d| d.uuid()), Err(NvmlError::GpuLost)))
            .collect();
        let lost = if lost.is_empty() { self.gpus.iter().collect() } else { lost };
        for gpu in lost {
            self.health.apply(&xid::judge_gpu_lost(current, &gpu.uuid), None);
        }
    }

    fn on_mig_change(&self, nvml: &Nvml, gpu_uuid: &str, current: &mut Vec<SliceSpec>) {
        let found = match read_gpus(nvml) {
            Ok(gpus) => slices(&gpus),
            Err(e) => {
                tracing::error!(gpu_uuid, error = %e, "MIG configuration changed but the GPUs cannot be read; keeping the old slices");
                return;
            }
        };
        if found == *current {
            tracing::info!(gpu_uuid, "MIG configuration change event; the slices are the same");
            return;
        }
        tracing::info!(
            gpu_uuid,
            before = current.len(),
            after = found.len(),
            "MIG configuration changed; registering the new slices"
        );
        current.clone_from(&found);
        self.layout.send_replace(found);
    }
}

/// An event set with critical Xid and MIG configuration-change events of every GPU that
/// supports them; `None` when NVML cannot make one. A GPU that refuses registration is left
/// out with a warning (NVML frees a set whose registration failed, so the set is made again).
fn watch_events<'n>(nvml: &'n Nvml, gpus: &[GpuDevice]) -> Option<EventSet<'n>> {
    let mut skip = BTreeSet::new();
    'attempt: loop {
        let mut set = match nvml.create_event_set() {
            Ok(set) => set,
            Err(e) => {
                tracing::warn!(error = %e, "cannot create an NVML event set; GPU health is not watched");
                return None;
            }
        };
        for gpu in gpus.iter().filter(|g| !skip.contains(&g.index)) {
            let Ok(device) = nvml.device_by_index(gpu.index) else { continue };
            let supported = device.supported_event_types().unwrap_or(EventTypes::empty());
            if !supported.contains(EventTypes::CRITICAL_XID_ERROR) {
                tracing::warn!(gpu_uuid = %gpu.uuid, "GPU reports no critical Xid events; its health is not watched");
            }
            let wanted = (EventTypes::CRITICAL_XID_ERROR | EventTypes::MIG_CONFIG_CHANGE) & supported;
            if wanted.is_empty() {
                continue;
            }
            match device.register_events(wanted, set) {
                Ok(registered) => set = registered,
                Err(e) => {
                    tracing::warn!(gpu_uuid = %gpu.uuid, error = %e.error, "cannot watch a GPU's events; its health is not watched");
                    skip.insert(gpu.index);
                    continue 'attempt;
                }
            }
        }
        return Some(set);
    }
}

/// Waits up to `timeout` for one event, through the raw binding: the wrapper's `EventSet::wait`
/// drops the GPU and compute instance ids that scope an Xid to a MIG instance.
fn wait(nvml: &Nvml, set: &EventSet<'_>, timeout: Duration) -> Result<Event, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    // SAFETY: all-zero is a valid `nvmlEventData_t` (a null handle and numbers).
    let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set belongs to this NVML and `data` outlives the call.
    nvml_try(unsafe { sym(set.handle(), &mut data, timeout_ms) })?;
    // SAFETY: NVML filled in the handle of the GPU the event came from.
    let gpu_uuid = unsafe { Device::new(data.device, nvml) }.uuid()?;
    let kind = EventTypes::from_bits_truncate(data.eventType);
    Ok(if kind.contains(EventTypes::CRITICAL_XID_ERROR) {
        Event::Xid(XidEvent {
            gpu_uuid,
            xid: data.eventData,
            gpu_instance_id: data.gpuInstanceId,
            compute_instance_id: data.computeInstanceId,
        })
    } else if kind.contains(EventTypes::MIG_CONFIG_CHANGE) {
        Event::MigConfigChange { gpu_uuid }
    } else {
        Event::Other
    })
}
