//! Which slices a critical Xid error or a lost GPU takes out: the policy of NVIDIA's Kubernetes
//! device plugin (`internal/rm/health.go`), as pure functions over the worker's slices.
//!
//! - Application Xids (13, 31, 43, 45, 68, 109) hurt one application, not the device: the
//!   slices they name stay healthy (the event is logged and counted against them).
//! - Any other critical Xid on a GPU not in MIG mode, or with GPU and compute instance ids both
//!   `0xFFFFFFFF`, takes every slice of that GPU.
//! - Otherwise it takes the MIG slice with that (parent GPU, GPU instance id, compute instance
//!   id), and nothing when no slice matches (as the device plugin does).
//! - A lost GPU takes every slice of that GPU.

use crate::worker::inventory::{SliceKind, SliceSpec};

/// Xids that hurt one application only (the device plugin's default skip list).
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];
/// The GPU or compute instance id of an event that concerns the whole GPU.
pub const WHOLE_GPU: u32 = u32::MAX;

/// A critical Xid event as NVML delivers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// UUID of the physical GPU (`GPU-...`).
    pub gpu_uuid: String,
    /// The Xid.
    pub xid: u64,
    /// GPU instance id; [`WHOLE_GPU`] when the error is not scoped to a MIG instance.
    pub gpu_instance_id: u32,
    /// Compute instance id; [`WHOLE_GPU`] when the error is not scoped to a MIG instance.
    pub compute_instance_id: u32,
}

/// What an event does to the worker's slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// An application Xid: these slices' runners were hit; the slices stay healthy.
    Application {
        /// Slice ids.
        slices: Vec<String>,
    },
    /// These slices must take no more replicas.
    Unhealthy {
        /// Slice ids.
        slices: Vec<String>,
        /// Why, for people: `Xid 79 (GPU has fallen off the bus) on GPU-...`.
        reason: String,
    },
}

/// The verdict on one critical Xid event.
pub fn judge_xid(slices: &[SliceSpec], event: &XidEvent) -> Verdict {
    let named = named_slices(slices, event);
    if APPLICATION_XIDS.contains(&event.xid) {
        return Verdict::Application { slices: named };
    }
    let scope = if whole_gpu(slices, event) {
        event.gpu_uuid.clone()
    } else {
        format!(
            "{} (GPU instance {}, compute instance {})",
            event.gpu_uuid, event.gpu_instance_id, event.compute_instance_id
        )
    };
    Verdict::Unhealthy { slices: named, reason: format!("{} on {scope}", describe_xid(event.xid)) }
}

/// The verdict on a GPU that fell off the bus (NVML answered `GPU_IS_LOST`).
pub fn judge_gpu_lost(slices: &[SliceSpec], gpu_uuid: &str) -> Verdict {
    Verdict::Unhealthy { slices: slices_of_gpu(slices, gpu_uuid), reason: format!("GPU {gpu_uuid} is lost") }
}

/// The slices an event names: the whole GPU's, or the one MIG slice it is scoped to.
fn named_slices(slices: &[SliceSpec], event: &XidEvent) -> Vec<String> {
    if whole_gpu(slices, event) {
        return slices_of_gpu(slices, &event.gpu_uuid);
    }
    slices
        .iter()
        .filter(|s| {
            s.kind == SliceKind::Mig
                && s.on_gpu(&event.gpu_uuid)
                && s.gpu_instance_id == Some(event.gpu_instance_id)
                && s.compute_instance_id == Some(event.compute_instance_id)
        })
        .map(|s| s.id.clone())
        .collect()
}

/// Whether an event concerns the whole GPU: both instance ids say so, or the GPU has no MIG
/// slices (not in MIG mode).
fn whole_gpu(slices: &[SliceSpec], event: &XidEvent) -> bool {
    let unscoped = event.gpu_instance_id == WHOLE_GPU && event.compute_instance_id == WHOLE_GPU;
    unscoped || !slices.iter().any(|s| s.kind == SliceKind::Mig && s.on_gpu(&event.gpu_uuid))
}

fn slices_of_gpu(slices: &[SliceSpec], gpu_uuid: &str) -> Vec<String> {
    slices.iter().filter(|s| s.on_gpu(gpu_uuid)).map(|s| s.id.clone()).collect()
}

/// `Xid 79 (GPU has fallen off the bus)`: the number with NVIDIA's short description when
/// it is a well-known one.
pub fn describe_xid(xid: u64) -> String {
    let what = match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup after previous errors",
        48 => "double-bit ECC error",
        61 | 62 => "internal micro-controller error",
        63 => "ECC page retirement or row remapping event",
        64 => "ECC page retirement or row remapping failure",
        68 => "video decoder exception",
        69 => "graphics engine class error",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        109 => "context switch timeout",
        119 | 120 => "GSP error",
        _ => return format!("Xid {xid}"),
    };
    format!("Xid {xid} ({what})")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
    const GPU1: &str = "GPU-11111111-1111-1111-1111-111111111111";

    fn mig(gpu: &str, n: u32) -> SliceSpec {
        SliceSpec {
            id: format!("MIG-{n}"),
            profile: "mig-1g.18gb".into(),
            kind: SliceKind::Mig,
            memory_bytes: 18 << 30,
            cpu_millis: 0,
            device_uuid: Some(format!("MIG-{n}")),
            gpu_index: Some(0),
            parent_gpu_uuid: Some(gpu.into()),
            gpu_instance_id: Some(n),
            compute_instance_id: Some(0),
        }
    }

    fn whole(gpu: &str) -> SliceSpec {
        SliceSpec {
            id: gpu.into(),
            profile: "gpu".into(),
            kind: SliceKind::Gpu,
            memory_bytes: 80 << 30,
            cpu_millis: 0,
            device_uuid: Some(gpu.into()),
            gpu_index: Some(1),
            parent_gpu_uuid: None,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    /// GPU0 in MIG mode with seven 1g.18gb instances (GI 1..=7), GPU1 whole, one CPU slice.
    fn node() -> Vec<SliceSpec> {
        let mut slices = crate::worker::inventory::cpu(1, 4, 1 << 30);
        slices.extend((1..=7).map(|n| mig(GPU0, n)));
        slices.push(whole(GPU1));
        slices
    }

    fn xid(gpu: &str, xid: u64, gi: u32, ci: u32) -> XidEvent {
        XidEvent { gpu_uuid: gpu.into(), xid, gpu_instance_id: gi, compute_instance_id: ci }
    }

    fn unhealthy(v: Verdict) -> (Vec<String>, String) {
        match v {
            Verdict::Unhealthy { slices, reason } => (slices, reason),
            other => panic!("expected unhealthy slices, got {other:?}"),
        }
    }

    #[test]
    fn application_xids_leave_the_slices_healthy_but_name_them() {
        for n in APPLICATION_XIDS {
            let v = judge_xid(&node(), &xid(GPU0, n, 3, 0));
            assert_eq!(v, Verdict::Application { slices: vec!["MIG-3".into()] }, "Xid {n}");
        }
        let v = judge_xid(&node(), &xid(GPU1, 31, WHOLE_GPU, WHOLE_GPU));
        assert_eq!(v, Verdict::Application { slices: vec![GPU1.into()] });
    }

    #[test]
    fn a_whole_gpu_xid_takes_every_slice_of_that_gpu_and_none_of_another() {
        let (slices, reason) = unhealthy(judge_xid(&node(), &xid(GPU0, 79, WHOLE_GPU, WHOLE_GPU)));
        assert_eq!(slices, (1..=7).map(|n| format!("MIG-{n}")).collect::<Vec<_>>());
        assert_eq!(reason, format!("Xid 79 (GPU has fallen off the bus) on {GPU0}"));
        let (slices, _) = unhealthy(judge_xid(&node(), &xid(GPU1, 48, WHOLE_GPU, WHOLE_GPU)));
        assert_eq!(slices, [GPU1]);
    }

    #[test]
    fn a_gpu_not_in_mig_mode_is_taken_whatever_the_instance_ids() {
        let (slices, _) = unhealthy(judge_xid(&node(), &xid(GPU1, 48, 0, 0)));
        assert_eq!(slices, [GPU1]);
    }

    #[test]
    fn a_mig_scoped_xid_takes_one_slice() {
        let (slices, reason) = unhealthy(judge_xid(&node(), &xid(GPU0, 94, 3, 0)));
        assert_eq!(slices, ["MIG-3"]);
        assert!(
            reason.starts_with("Xid 94 (contained ECC error) on GPU-0") && reason.contains("GPU instance 3"),
            "{reason}"
        );
        // No MIG slice with those ids: nothing is taken (the device plugin's rule).
        let (slices, _) = unhealthy(judge_xid(&node(), &xid(GPU0, 94, 9, 0)));
        assert!(slices.is_empty());
        let (slices, _) = unhealthy(judge_xid(&node(), &xid(GPU0, 94, 3, 1)));
        assert!(slices.is_empty());
    }

    #[test]
    fn unknown_gpus_and_unknown_xids() {
        let (slices, reason) = unhealthy(judge_xid(&node(), &xid("GPU-other", 1234, WHOLE_GPU, WHOLE_GPU)));
        assert!(slices.is_empty());
        assert_eq!(reason, "Xid 1234 on GPU-other");
    }

    #[test]
    fn a_lost_gpu_takes_all_its_slices() {
        let (slices, reason) = unhealthy(judge_gpu_lost(&node(), GPU0));
        assert_eq!(slices.len(), 7);
        assert_eq!(reason, format!("GPU {GPU0} is lost"));
        let (slices, _) = unhealthy(judge_gpu_lost(&node(), GPU1));
        assert_eq!(slices, [GPU1]);
    }
}
