//! The slices a worker offers: shares of its CPU cores, whole GPUs and MIG instances.
//!
//! CPU slices come from `--cpu-slices N`: `cpu-0` .. `cpu-<N-1>`, profile `cpu`, each with
//! `cores × 1000 / N` CPU millis and `--slice-memory-bytes` (default: total RAM / N, from
//! `/proc/meminfo`).
//!
//! GPU and MIG slices come from NVML ([`super::gpu`]): every GPU not in MIG mode is one slice,
//! every MIG instance of a GPU in MIG mode is one. Where there is no GPU (tests, demos),
//! `--inventory FILE` describes simulated ones instead; a worker given a file does not use NVML
//! at all. The file is JSON:
//!
//! ```json
//! {
//!   "gpus": [
//!     { "uuid": "GPU-6a1e5c3b-0000-0000-0000-000000000000", "index": 0,
//!       "memory_bytes": 85899345920 },
//!     { "uuid": "GPU-7b2f6d4c-0000-0000-0000-000000000001", "index": 1,
//!       "memory_bytes": 85899345920,
//!       "mig": [
//!         { "uuid": "MIG-1c1d7a8e-0000-0000-0000-000000000000", "profile": "1g.10gb" },
//!         { "uuid": "MIG-2d2e8b9f-0000-0000-0000-000000000001", "profile": "3g.40gb",
//!           "memory_bytes": 42949672960 }
//!       ] }
//!   ]
//! }
//! ```
//!
//! A GPU without MIG instances is one slice `GPU-<uuid>` with profile `gpu`; a GPU in MIG mode
//! offers only its instances, each a slice `MIG-<uuid>` with profile `mig-<profile>` (for
//! example `mig-1g.10gb`). UUIDs may be written with or without their `GPU-` / `MIG-` prefix.
//! A MIG instance's `memory_bytes` defaults to the profile's `<n>gb` suffix in GiB. Unknown
//! fields and duplicate UUIDs are errors.

use std::collections::HashMap;

use crate::engine::device::gpu_memory_cap;
use crate::runner::device::{GpuShare, SliceDevice};
use crate::runner::limits::SliceLimits;
use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use tessera_protocol::agent;

/// What kind of device a slice is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceKind {
    /// A share of the CPU cores.
    Cpu,
    /// A whole GPU.
    Gpu,
    /// A MIG instance of a GPU.
    Mig,
}

/// One unit of isolation the worker offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceSpec {
    /// Unique within the worker: `cpu-0`, `GPU-<uuid>`, `MIG-<uuid>`.
    pub id: String,
    /// Profile the control plane's placement matches: `cpu`, `gpu`, `mig-1g.10gb`.
    pub profile: String,
    /// Device kind.
    pub kind: SliceKind,
    /// Memory the slice can hold.
    pub memory_bytes: u64,
    /// CPU cores in thousandths (CPU slices; 0 otherwise).
    pub cpu_millis: u32,
    /// `CUDA_VISIBLE_DEVICES` value (GPU and MIG slices).
    pub device_uuid: Option<String>,
    /// Physical GPU index (GPU and MIG slices).
    pub gpu_index: Option<u32>,
    /// Physical GPU of a MIG instance.
    pub parent_gpu_uuid: Option<String>,
    /// GPU instance id of a MIG instance (from NVML; critical Xid events name it).
    pub gpu_instance_id: Option<u32>,
    /// Compute instance id of a MIG instance (from NVML; critical Xid events name it).
    pub compute_instance_id: Option<u32>,
}

impl SliceSpec {
    /// A whole GPU (`gpu_uuid` prefixed `GPU-`) as one slice of profile `gpu`.
    pub fn whole_gpu(gpu_uuid: String, index: u32, memory_bytes: u64) -> Self {
        Self {
            id: gpu_uuid.clone(),
            profile: "gpu".into(),
            kind: SliceKind::Gpu,
            memory_bytes,
            cpu_millis: 0,
            device_uuid: Some(gpu_uuid),
            gpu_index: Some(index),
            parent_gpu_uuid: None,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    /// A MIG instance (`uuid` prefixed `MIG-`) of profile `mig-<profile>` on `parent` (its GPU's
    /// uuid and index), with its GPU and compute instance ids when known.
    pub fn mig_instance(
        uuid: String,
        profile: &str,
        memory_bytes: u64,
        (parent_uuid, index): (&str, u32),
        instance_ids: Option<(u32, u32)>,
    ) -> Self {
        Self {
            id: uuid.clone(),
            profile: format!("mig-{profile}"),
            kind: SliceKind::Mig,
            memory_bytes,
            cpu_millis: 0,
            device_uuid: Some(uuid),
            gpu_index: Some(index),
            parent_gpu_uuid: Some(parent_uuid.to_string()),
            gpu_instance_id: instance_ids.map(|(gi, _)| gi),
            compute_instance_id: instance_ids.map(|(_, ci)| ci),
        }
    }

    /// The slice as the agent protocol carries it.
    pub fn to_proto(&self) -> agent::Slice {
        let kind = match self.kind {
            SliceKind::Cpu => agent::SliceKind::Cpu,
            SliceKind::Gpu => agent::SliceKind::Gpu,
            SliceKind::Mig => agent::SliceKind::Mig,
        };
        agent::Slice {
            id: self.id.clone(),
            profile: self.profile.clone(),
            kind: kind.into(),
            memory_bytes: self.memory_bytes,
            cpu_millis: self.cpu_millis,
            device_uuid: self.device_uuid.clone().unwrap_or_default(),
            gpu_index: self.gpu_index.unwrap_or_default(),
            parent_gpu_uuid: self.parent_gpu_uuid.clone().unwrap_or_default(),
            gpu_instance_id: self.gpu_instance_id,
            compute_instance_id: self.compute_instance_id,
        }
    }

    /// Whether the slice is GPU `gpu_uuid` or one of its MIG instances.
    pub fn on_gpu(&self, gpu_uuid: &str) -> bool {
        match self.kind {
            SliceKind::Cpu => false,
            SliceKind::Gpu => self.device_uuid.as_deref() == Some(gpu_uuid),
            SliceKind::Mig => self.parent_gpu_uuid.as_deref() == Some(gpu_uuid),
        }
    }
}

/// Every slice of a worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// CPU slices first, then GPUs and MIG instances in file order.
    pub slices: Vec<SliceSpec>,
}

impl Inventory {
    /// Builds the inventory from the flags: `cpu_slices` CPU shares, then the GPUs of the
    /// optional file, or else `nvml_slices` (what NVML found; empty without NVML).
    pub fn detect(
        cpu_slices: u32,
        slice_memory_bytes: Option<u64>,
        gpu_file: Option<&Path>,
        nvml_slices: Vec<SliceSpec>,
    ) -> Result<Self, String> {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let memory = match slice_memory_bytes {
            Some(bytes) => bytes,
            None if cpu_slices == 0 => 0,
            None => total_memory_bytes()? / u64::from(cpu_slices),
        };
        let mut slices = cpu(cpu_slices, cores, memory);
        if let Some(path) = gpu_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the inventory file {}: {e}", path.display()))?;
            slices.extend(parse_gpu_inventory(&text).map_err(|e| format!("inventory file {}: {e}", path.display()))?);
        } else {
            slices.extend(nvml_slices);
        }
        if slices.is_empty() {
            return Err("the worker offers no slices (--cpu-slices 0, no --inventory and no GPU found)".into());
        }
        Ok(Self { slices })
    }

    /// The same CPU slices with these GPU and MIG slices (NVML's answer after the MIG layout
    /// changed).
    pub fn with_gpu_slices(&self, gpu_slices: Vec<SliceSpec>) -> Self {
        let mut slices: Vec<SliceSpec> = self.slices.iter().filter(|s| s.kind == SliceKind::Cpu).cloned().collect();
        slices.extend(gpu_slices);
        Self { slices }
    }

    /// The slices as the agent protocol carries them.
    pub fn to_proto(&self) -> Vec<agent::Slice> {
        self.slices.iter().map(SliceSpec::to_proto).collect()
    }

    /// What each slice's runner may use. A CPU slice: its share of the cores this process may
    /// run on (dealt round-robin), the slice's memory as a hard limit, and no GPU. A GPU or MIG
    /// slice: its device alone (as CUDA device 0) with a GPU memory cap of the slice's memory
    /// less a reserve ([`gpu_memory_cap`]); its host memory and cores are not divided (the
    /// device bounds it, and its CPU work is feeding the device).
    pub fn slice_limits(&self) -> HashMap<String, SliceLimits> {
        let allowed = allowed_cpus();
        let cpu_slices: Vec<&SliceSpec> = self.slices.iter().filter(|s| s.kind == SliceKind::Cpu).collect();
        let count = cpu_slices.len().max(1);
        let cpu = cpu_slices.iter().enumerate().map(|(i, s)| {
            let cpus = if allowed.len() >= count {
                allowed.iter().copied().skip(i).step_by(count).collect()
            } else {
                allowed.get(i % allowed.len().max(1)).copied().into_iter().collect()
            };
            let limits = SliceLimits { cpus, memory_bytes: Some(s.memory_bytes), nice: None, device: SliceDevice::Cpu };
            (s.id.clone(), limits)
        });
        let gpu = self.slices.iter().filter(|s| s.kind != SliceKind::Cpu).map(|s| {
            let share = GpuShare {
                device_uuid: s.device_uuid.clone().unwrap_or_else(|| s.id.clone()),
                mig: s.kind == SliceKind::Mig,
                memory_limit_bytes: gpu_memory_cap(s.memory_bytes),
            };
            (s.id.clone(), SliceLimits { device: SliceDevice::Gpu(share), ..SliceLimits::default() })
        });
        cpu.chain(gpu).collect()
    }
}

/// The cores this process may run on, in order; empty when they cannot be read.
fn allowed_cpus() -> Vec<usize> {
    let Ok(set) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else { return Vec::new() };
    (0..nix::sched::CpuSet::count()).filter(|c| set.is_set(*c).unwrap_or(false)).collect()
}

/// `count` equal shares of `cores` cores, each holding `memory_bytes`.
pub fn cpu(count: u32, cores: usize, memory_bytes: u64) -> Vec<SliceSpec> {
    let total_millis = u64::try_from(cores).unwrap_or(u64::MAX).saturating_mul(1000);
    let millis = u32::try_from(total_millis / u64::from(count.max(1))).unwrap_or(u32::MAX);
    (0..count)
        .map(|i| SliceSpec {
            id: format!("cpu-{i}"),
            profile: "cpu".into(),
            kind: SliceKind::Cpu,
            memory_bytes,
            cpu_millis: millis,
            device_uuid: None,
            gpu_index: None,
            parent_gpu_uuid: None,
            gpu_instance_id: None,
            compute_instance_id: None,
        })
        .collect()
}

/// Total RAM from `/proc/meminfo`.
fn total_memory_bytes() -> Result<u64, String> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| format!("cannot read /proc/meminfo ({e}); set --slice-memory-bytes"))?;
    parse_meminfo(&text).ok_or_else(|| "no MemTotal in /proc/meminfo; set --slice-memory-bytes".into())
}

/// `MemTotal:  16318480 kB` → bytes.
fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuFile {
    gpus: Vec<GpuEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuEntry {
    uuid: String,
    index: u32,
    memory_bytes: u64,
    /// Product name, for people reading the file.
    #[serde(default)]
    #[allow(dead_code)]
    name: Option<String>,
    #[serde(default)]
    mig: Vec<MigEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigEntry {
    uuid: String,
    profile: String,
    #[serde(default)]
    memory_bytes: Option<u64>,
}

/// Parses a simulated GPU / MIG inventory (the format in the module doc).
pub fn parse_gpu_inventory(text: &str) -> Result<Vec<SliceSpec>, String> {
    let file: GpuFile = serde_json::from_str(text).map_err(|e| format!("invalid inventory JSON: {e}"))?;
    let mut seen = BTreeSet::new();
    let mut slices = Vec::new();
    for gpu in file.gpus {
        let gpu_uuid = device_uuid("GPU-", &gpu.uuid)?;
        if !seen.insert(gpu_uuid.clone()) {
            return Err(format!("duplicate GPU uuid {gpu_uuid}"));
        }
        if gpu.mig.is_empty() {
            slices.push(SliceSpec::whole_gpu(gpu_uuid, gpu.index, gpu.memory_bytes));
            continue;
        }
        for mig in gpu.mig {
            let uuid = device_uuid("MIG-", &mig.uuid)?;
            if !seen.insert(uuid.clone()) {
                return Err(format!("duplicate MIG uuid {uuid}"));
            }
            if !valid_profile(&mig.profile) {
                return Err(format!("MIG {uuid}: invalid profile '{}' (expected e.g. 1g.10gb)", mig.profile));
            }
            let memory_bytes = match mig.memory_bytes {
                Some(bytes) => bytes,
                None => profile_memory(&mig.profile)
                    .ok_or_else(|| format!("MIG {uuid}: give memory_bytes (profile '{}' names none)", mig.profile))?,
            };
            let parent = (gpu_uuid.as_str(), gpu.index);
            slices.push(SliceSpec::mig_instance(uuid, &mig.profile, memory_bytes, parent, None));
        }
    }
    Ok(slices)
}

/// `prefix` + the uuid, whether or not it was written with the prefix.
pub(crate) fn device_uuid(prefix: &str, uuid: &str) -> Result<String, String> {
    let bare = uuid.strip_prefix(prefix).unwrap_or(uuid);
    if bare.is_empty() || !bare.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return Err(format!("invalid uuid '{uuid}' (hex digits and '-', optionally prefixed {prefix})"));
    }
    Ok(format!("{prefix}{bare}"))
}

/// MIG profile names: lower-case letters, digits and dots, like `1g.10gb` or `1c.3g.40gb`.
pub(crate) fn valid_profile(profile: &str) -> bool {
    !profile.is_empty() && profile.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.')
}

/// The memory a MIG profile names: `1g.10gb` → 10 GiB.
fn profile_memory(profile: &str) -> Option<u64> {
    let last = profile.rsplit('.').next()?;
    let gib: u64 = last.strip_suffix("gb")?.parse().ok()?;
    gib.checked_mul(1 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_shares_split_the_cores() {
        let slices = cpu(3, 4, 1000);
        assert_eq!(slices.len(), 3);
        assert_eq!(slices[2].id, "cpu-2");
        assert!(slices.iter().all(|s| s.cpu_millis == 1333 && s.memory_bytes == 1000 && s.profile == "cpu"));
        let proto = slices[0].to_proto();
        assert_eq!(proto.kind(), agent::SliceKind::Cpu);
        assert_eq!(proto.device_uuid, "");
        assert!(cpu(0, 4, 1).is_empty());
    }

    #[test]
    fn meminfo_is_read_in_bytes() {
        assert_eq!(parse_meminfo("MemTotal:       16318480 kB\nMemFree: 1 kB\n"), Some(16_318_480 * 1024));
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotal: lots kB\n"), None);
    }

    #[test]
    fn gpu_file_gives_gpu_and_mig_slices() {
        let text = r#"{"gpus": [
            {"uuid": "GPU-aa11", "index": 0, "memory_bytes": 80, "name": "A100"},
            {"uuid": "bb22", "index": 1, "memory_bytes": 80, "mig": [
                {"uuid": "MIG-cc33", "profile": "1g.10gb"},
                {"uuid": "dd44", "profile": "3g.40gb", "memory_bytes": 7}
            ]}
        ]}"#;
        let slices = parse_gpu_inventory(text).expect("valid file");
        let ids: Vec<&str> = slices.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["GPU-aa11", "MIG-cc33", "MIG-dd44"]);
        assert_eq!((slices[0].profile.as_str(), slices[0].kind), ("gpu", SliceKind::Gpu));
        assert_eq!(slices[1].profile, "mig-1g.10gb");
        assert_eq!(slices[1].memory_bytes, 10 << 30);
        assert_eq!(slices[1].parent_gpu_uuid.as_deref(), Some("GPU-bb22"));
        assert_eq!(slices[2].memory_bytes, 7);
        let proto = slices[1].to_proto();
        assert_eq!((proto.kind(), proto.gpu_index, proto.device_uuid.as_str()), (agent::SliceKind::Mig, 1, "MIG-cc33"));
    }

    #[test]
    fn gpu_and_mig_runners_get_their_device_and_a_memory_cap() {
        let text = r#"{"gpus": [
            {"uuid": "GPU-aa11", "index": 0, "memory_bytes": 85899345920},
            {"uuid": "GPU-bb22", "index": 1, "memory_bytes": 80, "mig": [{"uuid": "MIG-cc33", "profile": "1g.10gb"}]}
        ]}"#;
        let mut slices = cpu(1, 2, 1 << 30);
        slices.extend(parse_gpu_inventory(text).expect("valid file"));
        let limits = Inventory { slices }.slice_limits();
        assert_eq!(limits["cpu-0"].device, SliceDevice::Cpu);
        assert_eq!(limits["cpu-0"].memory_bytes, Some(1 << 30));
        let gpu = GpuShare { device_uuid: "GPU-aa11".into(), mig: false, memory_limit_bytes: 79 << 30 };
        assert_eq!(limits["GPU-aa11"], SliceLimits { device: SliceDevice::Gpu(gpu), ..SliceLimits::default() });
        let mig = GpuShare { device_uuid: "MIG-cc33".into(), mig: true, memory_limit_bytes: 9 << 30 };
        assert_eq!(limits["MIG-cc33"].device, SliceDevice::Gpu(mig));
        assert_eq!(limits.len(), 3);
    }

    #[test]
    fn bad_gpu_files_are_refused() {
        use serde_json::json;
        let gpu = |uuid: &str| json!({"uuid": uuid, "index": 0, "memory_bytes": 1});
        let mig =
            |mig: serde_json::Value| json!({"gpus": [{"uuid": "1", "index": 0, "memory_bytes": 1, "mig": [mig]}]});
        let cases = [
            (json!({"gpus": [{"uuid": "GPU-1", "index": 0}]}), "memory_bytes"),
            (json!({"gpus": [{"uuid": "GPU-1", "index": 0, "memory_bytes": 1, "extra": 1}]}), "extra"),
            (json!({"gpus": [gpu("GPU-1"), gpu("1")]}), "duplicate"),
            (json!({"gpus": [gpu("GPU-../x")]}), "invalid uuid"),
            (mig(json!({"uuid": "2", "profile": "big"})), "memory_bytes"),
            (mig(json!({"uuid": "2", "profile": "1G 5GB", "memory_bytes": 1})), "invalid profile"),
        ];
        for (value, needle) in cases {
            let text = value.to_string();
            let err = parse_gpu_inventory(&text).expect_err(&text);
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
