//! The health of the worker's slices: which are unhealthy and why, what the heartbeat reports,
//! and the `tessera_slice_*` metrics.
//!
//! A slice marked unhealthy stays so until the worker restarts, as NVIDIA's device plugin does:
//! NVML says when a GPU breaks but not reliably when it is whole again, and a GPU that raised
//! a critical Xid usually needs a reset (which restarts the worker's pod anyway).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use parking_lot::Mutex;
use tessera_protocol::agent;
use tokio::sync::watch;

use super::xid::Verdict;
use crate::serve::metrics::{escape, header};
use crate::worker::inventory::SliceSpec;

/// The health of every slice; shared by the NVML monitor thread (which marks slices), the
/// session (which reports them) and the metrics endpoint.
pub struct SliceHealth {
    state: Mutex<State>,
    /// The unhealthy slices as the heartbeat carries them. The monitor thread sends on every
    /// change; the session receives and sends a heartbeat at once.
    reports: watch::Sender<Vec<agent::UnhealthySlice>>,
}

#[derive(Default)]
struct State {
    /// Every slice the worker offers now: id to profile.
    profiles: BTreeMap<String, String>,
    /// Unhealthy slice id to why (also slices that went away in a MIG change, until restart).
    unhealthy: BTreeMap<String, String>,
    /// Critical Xid events counted per (slice, kind).
    xids: BTreeMap<(String, XidKind), u64>,
    /// The tenant whose replicas each slice holds (from the assignments), for the log.
    tenants: HashMap<String, String>,
}

/// Whether an Xid hurt an application or the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum XidKind {
    Application,
    Device,
}

impl XidKind {
    fn as_str(self) -> &'static str {
        match self {
            XidKind::Application => "application",
            XidKind::Device => "device",
        }
    }
}

impl SliceHealth {
    /// Every slice healthy.
    pub fn new(slices: &[SliceSpec]) -> Self {
        let health = Self { state: Mutex::new(State::default()), reports: watch::Sender::new(Vec::new()) };
        health.set_slices(slices);
        health
    }

    /// The slices offered now (after a MIG change); marks already made are kept.
    pub fn set_slices(&self, slices: &[SliceSpec]) {
        self.state.lock().profiles = slices.iter().map(|s| (s.id.clone(), s.profile.clone())).collect();
    }

    /// Notes which tenant each slice serves (a new assignment set), so an application Xid can
    /// be blamed on it.
    pub fn assigned(&self, assignments: &[agent::Assignment]) {
        let tenants = assignments.iter().map(|a| (a.slice_id.clone(), a.tenant_name.clone())).collect();
        self.state.lock().tenants = tenants;
    }

    /// Applies a verdict; `xid` is the Xid behind it (`None` for a lost GPU). Returns the
    /// slices newly marked unhealthy.
    pub fn apply(&self, verdict: &Verdict, xid: Option<u64>) -> Vec<String> {
        let mut state = self.state.lock();
        let mut newly = Vec::new();
        match verdict {
            Verdict::Application { slices } => {
                for slice in slices {
                    *state.xids.entry((slice.clone(), XidKind::Application)).or_default() += 1;
                    let tenant = state.tenants.get(slice).map_or("", String::as_str);
                    tracing::warn!(
                        slice,
                        tenant,
                        xid,
                        "application Xid on a slice; its runner was hit, the slice stays healthy"
                    );
                }
            }
            Verdict::Unhealthy { slices, reason } => {
                for slice in slices {
                    if xid.is_some() {
                        *state.xids.entry((slice.clone(), XidKind::Device)).or_default() += 1;
                    }
                    if !state.unhealthy.contains_key(slice) {
                        tracing::error!(slice, %reason, "slice unhealthy until the worker restarts");
                        state.unhealthy.insert(slice.clone(), reason.clone());
                        newly.push(slice.clone());
                    }
                }
            }
        }
        if !newly.is_empty() {
            let reports = report(&state.unhealthy);
            drop(state);
            self.reports.send_replace(reports);
        }
        newly
    }

    /// Follows the unhealthy slices as the heartbeat reports them.
    pub fn subscribe(&self) -> watch::Receiver<Vec<agent::UnhealthySlice>> {
        self.reports.subscribe()
    }

    /// The unhealthy slices and why.
    pub fn unhealthy(&self) -> BTreeMap<String, String> {
        self.state.lock().unhealthy.clone()
    }

    /// `tessera_slice_healthy` and `tessera_slice_xid_errors_total`.
    pub fn render(&self, out: &mut String) {
        let state = self.state.lock();
        header(
            out,
            "tessera_slice_healthy",
            "Whether a slice takes replicas (1) or was found unhealthy through NVML (0) until the worker restarts",
            "gauge",
        );
        for (slice, profile) in &state.profiles {
            let healthy = u8::from(!state.unhealthy.contains_key(slice));
            let (slice, profile) = (escape(slice), escape(profile));
            let _ = writeln!(out, "tessera_slice_healthy{{slice=\"{slice}\",profile=\"{profile}\"}} {healthy}");
        }
        header(
            out,
            "tessera_slice_xid_errors_total",
            "Critical Xid errors that named a slice, by kind (application: its runner was hit; device: the slice is unhealthy)",
            "counter",
        );
        for ((slice, kind), n) in &state.xids {
            let slice = escape(slice);
            let _ = writeln!(out, "tessera_slice_xid_errors_total{{slice=\"{slice}\",kind=\"{}\"}} {n}", kind.as_str());
        }
    }
}

fn report(unhealthy: &BTreeMap<String, String>) -> Vec<agent::UnhealthySlice> {
    unhealthy
        .iter()
        .map(|(slice_id, reason)| agent::UnhealthySlice { slice_id: slice_id.clone(), reason: reason.clone() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_slices_stay_so_and_are_reported_once() {
        let health = SliceHealth::new(&crate::worker::inventory::cpu(2, 2, 1));
        let mut reports = health.subscribe();
        let verdict = Verdict::Unhealthy { slices: vec!["cpu-1".into()], reason: "Xid 79 on GPU-x".into() };
        assert_eq!(health.apply(&verdict, Some(79)), ["cpu-1"]);
        assert!(reports.has_changed().expect("open"));
        let seen = reports.borrow_and_update().clone();
        assert_eq!((seen[0].slice_id.as_str(), seen[0].reason.as_str()), ("cpu-1", "Xid 79 on GPU-x"));
        // The same again changes nothing but the count.
        let again = Verdict::Unhealthy { slices: vec!["cpu-1".into()], reason: "Xid 48 on GPU-x".into() };
        assert!(health.apply(&again, Some(48)).is_empty());
        assert!(!reports.has_changed().expect("open"));
        assert_eq!(health.unhealthy()["cpu-1"], "Xid 79 on GPU-x");
        // Application Xids only count.
        health.apply(&Verdict::Application { slices: vec!["cpu-0".into()] }, Some(13));
        let mut text = String::new();
        health.render(&mut text);
        assert!(text.contains("tessera_slice_healthy{slice=\"cpu-0\",profile=\"cpu\"} 1"), "{text}");
        assert!(text.contains("tessera_slice_healthy{slice=\"cpu-1\",profile=\"cpu\"} 0"), "{text}");
        assert!(text.contains("tessera_slice_xid_errors_total{slice=\"cpu-1\",kind=\"device\"} 2"), "{text}");
        assert!(text.contains("tessera_slice_xid_errors_total{slice=\"cpu-0\",kind=\"application\"} 1"), "{text}");
    }
}
