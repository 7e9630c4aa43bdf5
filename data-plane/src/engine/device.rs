//! Where a model version's instances execute: the device context a load gets from the process
//! that loads it (`tessera serve`, a runner on a worker's CPU, GPU or MIG slice), and how the
//! config's instance groups become instances on it.
//!
//! A runner on a GPU or MIG slice is started with `CUDA_VISIBLE_DEVICES=<the slice's uuid>`, so
//! inside it the slice is CUDA device 0 and nothing else is visible; its GPU memory cap (the
//! slice's memory less a reserve, see [`gpu_memory_cap`]) is shared out between the version's
//! GPU instances. A CPU slice's runner sees no GPU at all. `tessera serve` owns the machine:
//! `KIND_GPU` instances go to the CUDA devices their group lists in `gpus` (default 0).
//!
//! `KIND_AUTO` (and a config without instance groups) runs on CPU here: the control plane
//! renders `KIND_GPU` for deployments on GPU profiles, and `tessera serve` does not probe GPUs.

use tessera_protocol::inference::{ModelConfig, ModelInstanceGroup, model_instance_group::Kind};

/// Most instances one model version may run: each is a session (a copy of the model's weights in
/// memory) and a dedicated thread.
pub const MAX_INSTANCES: usize = 64;

/// GPU memory a slice keeps outside ONNX Runtime's arena: 1 GiB, or a quarter of a slice under
/// 4 GiB.
pub const GPU_MEMORY_RESERVE: u64 = 1 << 30;

/// The context a version loads in: the cores its instances share and the GPU side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionTarget {
    /// Cores the instances share (intra-op threads are dealt from them).
    pub cores: usize,
    /// Which GPU, if any, `KIND_GPU` instances may use.
    pub device: Device,
}

impl ExecutionTarget {
    /// The whole machine as this process sees it, with its available cores (`tessera serve`).
    pub fn host() -> Self {
        Self { cores: available_cores(), device: Device::Host }
    }
}

/// The cores this process may run on.
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// The GPU side of an [`ExecutionTarget`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Device {
    /// Every GPU this process sees (`tessera serve`): `KIND_GPU` instances use the CUDA devices
    /// their group lists in `gpus` (default 0), capped only by the config's own `gpu_mem_limit`.
    #[default]
    Host,
    /// A worker's CPU slice: no GPU (its runner is started with none visible).
    CpuSlice {
        /// Slice id, for messages.
        slice: String,
    },
    /// A worker's GPU or MIG slice in a process that is not confined to it (a worker that runs
    /// models in-process sees every GPU of the machine).
    Unconfined {
        /// Slice id, for messages.
        slice: String,
    },
    /// A GPU or MIG slice's runner: the slice is CUDA device 0, the only one it sees.
    GpuSlice {
        /// Slice id, for messages.
        slice: String,
        /// Whether the slice is a MIG instance (else a whole GPU).
        mig: bool,
        /// GPU memory the version's instances may hold in ONNX Runtime's arenas, together.
        memory_limit_bytes: u64,
    },
}

impl Device {
    /// Whether this is a worker slice (whose files and devices tenants must not reach past).
    pub fn is_slice(&self) -> bool {
        !matches!(self, Device::Host)
    }
}

/// Where one instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceDevice {
    /// ONNX Runtime's CPU provider.
    Cpu,
    /// The CUDA execution provider (TensorRT first when the config asks) on a CUDA device.
    Gpu {
        /// CUDA device ordinal as this process sees it.
        device_id: i32,
        /// `gpu_mem_limit` of this instance's arena; `None` leaves it to the config.
        memory_limit_bytes: Option<u64>,
    },
}

/// The GPU memory ONNX Runtime's arenas may take on a slice of `slice_bytes`: the slice less a
/// reserve ([`GPU_MEMORY_RESERVE`], a quarter of small slices) for what the arena does not
/// count: the CUDA context (about 500 MiB on Hopper), cuBLAS and cuDNN workspaces and handles,
/// and TensorRT's engine builds. A fixed reserve rather than a percentage: those costs do not
/// grow with the slice (10 % of a 141 GB GPU would idle 14 GB), and MIG profile names round up
/// (a 1g.10gb instance holds 9.75 GiB).
pub fn gpu_memory_cap(slice_bytes: u64) -> u64 {
    slice_bytes.saturating_sub(GPU_MEMORY_RESERVE.min(slice_bytes / 4))
}

/// The instances the config's instance groups ask for on `device`: `count` CPU instances per
/// `KIND_CPU` / `KIND_AUTO` / `KIND_MODEL` group, `count` per listed GPU for `KIND_GPU`, one
/// CPU instance without groups. On a GPU slice the cap is shared out between GPU instances.
pub fn instance_devices(config: &ModelConfig, device: &Device) -> Result<Vec<InstanceDevice>, String> {
    let mut instances = Vec::new();
    for group in &config.instance_group {
        if group.count < 0 {
            return Err(format!("instance group count must be >= 0, got {}", group.count));
        }
        // Proto3 cannot tell an unset count from 0; Triton reads both as 1.
        let count = usize::try_from(group.count.max(1)).unwrap_or(1);
        let per_device = match Kind::try_from(group.kind) {
            Ok(Kind::Cpu | Kind::Auto | Kind::Model) => vec![InstanceDevice::Cpu],
            Ok(Kind::Gpu) => gpu_devices(group, device)?,
            Err(_) => return Err(format!("instance group has an unknown kind {}", group.kind)),
        };
        let total = instances.len().saturating_add(count.saturating_mul(per_device.len()));
        if total > MAX_INSTANCES {
            let asked = group_total(config);
            return Err(format!(
                "instance groups ask for {asked} instances; a model version may have at most {MAX_INSTANCES}"
            ));
        }
        for d in per_device {
            instances.extend(std::iter::repeat_n(d, count));
        }
    }
    if instances.is_empty() {
        instances.push(InstanceDevice::Cpu);
    }
    if let Device::GpuSlice { memory_limit_bytes, .. } = device {
        share_gpu_memory(&mut instances, *memory_limit_bytes);
    }
    Ok(instances)
}

/// Instances all groups ask for, for the message when there are too many.
fn group_total(config: &ModelConfig) -> usize {
    config
        .instance_group
        .iter()
        .map(|g| {
            let devices = if g.kind == Kind::Gpu as i32 { g.gpus.len().max(1) } else { 1 };
            usize::try_from(g.count.max(1)).unwrap_or(1).saturating_mul(devices)
        })
        .fold(0usize, usize::saturating_add)
}

/// The CUDA devices one `KIND_GPU` group runs on, or why it cannot run here.
fn gpu_devices(group: &ModelInstanceGroup, device: &Device) -> Result<Vec<InstanceDevice>, String> {
    if let Some(bad) = group.gpus.iter().find(|g| **g < 0) {
        return Err(format!("instance group lists GPU {bad}; GPU ids are 0 or more"));
    }
    let on = |device_id: i32| InstanceDevice::Gpu { device_id, memory_limit_bytes: None };
    match device {
        Device::Host if group.gpus.is_empty() => Ok(vec![on(0)]),
        Device::Host => {
            let mut ids = group.gpus.clone();
            ids.sort_unstable();
            ids.dedup();
            Ok(ids.into_iter().map(on).collect())
        }
        Device::CpuSlice { slice } => {
            Err(format!("instance group kind KIND_GPU needs a GPU, but replica's slice {slice} is a CPU slice"))
        }
        Device::Unconfined { slice } => Err(format!(
            "instance group kind KIND_GPU needs a runner process confined to slice {slice}, but this worker \
             loads models in-process (--isolation in-process)"
        )),
        Device::GpuSlice { slice, mig, .. } => match group.gpus.iter().find(|g| **g != 0) {
            Some(other) => {
                let what = if *mig { "MIG instance" } else { "GPU" };
                Err(format!(
                    "instance group lists GPU {other}, but replica's slice {slice} is one {what}, seen as GPU 0"
                ))
            }
            None => Ok(vec![on(0)]),
        },
    }
}

/// Gives each GPU instance an equal part of the slice's cap: each has an arena of its own.
fn share_gpu_memory(instances: &mut [InstanceDevice], cap: u64) {
    let gpu = instances.iter().filter(|i| matches!(i, InstanceDevice::Gpu { .. })).count();
    let Ok(gpu) = u64::try_from(gpu) else { return };
    if gpu == 0 {
        return;
    }
    for instance in instances {
        if let InstanceDevice::Gpu { memory_limit_bytes, .. } = instance {
            *memory_limit_bytes = Some(cap / gpu);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::inference::ModelInstanceGroup;

    fn config(groups: &[(Kind, i32, &[i32])]) -> ModelConfig {
        let instance_group = groups
            .iter()
            .map(|(kind, count, gpus)| ModelInstanceGroup {
                kind: *kind as i32,
                count: *count,
                gpus: gpus.to_vec(),
                ..Default::default()
            })
            .collect();
        ModelConfig { instance_group, ..Default::default() }
    }

    fn gpu(device_id: i32, memory_limit_bytes: Option<u64>) -> InstanceDevice {
        InstanceDevice::Gpu { device_id, memory_limit_bytes }
    }

    #[test]
    fn the_host_runs_gpu_groups_on_the_gpus_they_list() {
        let host = Device::Host;
        assert_eq!(instance_devices(&config(&[]), &host), Ok(vec![InstanceDevice::Cpu]));
        assert_eq!(instance_devices(&config(&[(Kind::Gpu, 0, &[])]), &host), Ok(vec![gpu(0, None)]));
        let two_per_gpu = config(&[(Kind::Gpu, 2, &[1, 0]), (Kind::Cpu, 1, &[])]);
        let expected = vec![gpu(0, None), gpu(0, None), gpu(1, None), gpu(1, None), InstanceDevice::Cpu];
        assert_eq!(instance_devices(&two_per_gpu, &host), Ok(expected));
        let err = instance_devices(&config(&[(Kind::Gpu, 1, &[-1])]), &host).expect_err("negative id");
        assert!(err.contains("GPU -1"), "{err}");
        // Auto stays on the CPU: serve does not probe GPUs.
        assert_eq!(instance_devices(&config(&[(Kind::Auto, 2, &[])]), &host), Ok(vec![InstanceDevice::Cpu; 2]));
    }

    #[test]
    fn a_gpu_slice_is_device_zero_and_shares_its_cap() {
        let slice = Device::GpuSlice { slice: "MIG-1".into(), mig: true, memory_limit_bytes: 9 << 30 };
        let two = instance_devices(&config(&[(Kind::Gpu, 2, &[])]), &slice).expect("fits");
        assert_eq!(two, vec![gpu(0, Some(9 << 29)); 2]);
        assert_eq!(instance_devices(&config(&[(Kind::Gpu, 1, &[0])]), &slice), Ok(vec![gpu(0, Some(9 << 30))]));
        let err = instance_devices(&config(&[(Kind::Gpu, 1, &[1])]), &slice).expect_err("no GPU 1");
        assert!(err.contains("lists GPU 1") && err.contains("MIG-1 is one MIG instance"), "{err}");
        let mixed = instance_devices(&config(&[(Kind::Gpu, 1, &[]), (Kind::Cpu, 1, &[])]), &slice).expect("ok");
        assert_eq!(mixed, vec![gpu(0, Some(9 << 30)), InstanceDevice::Cpu]);
    }

    #[test]
    fn gpu_groups_without_a_gpu_name_the_slice() {
        let cpu = Device::CpuSlice { slice: "cpu-0".into() };
        let err = instance_devices(&config(&[(Kind::Gpu, 1, &[])]), &cpu).expect_err("cpu slice");
        assert_eq!(err, "instance group kind KIND_GPU needs a GPU, but replica's slice cpu-0 is a CPU slice");
        assert_eq!(instance_devices(&config(&[(Kind::Cpu, 3, &[])]), &cpu), Ok(vec![InstanceDevice::Cpu; 3]));
        let loose = Device::Unconfined { slice: "GPU-1".into() };
        let err = instance_devices(&config(&[(Kind::Gpu, 1, &[])]), &loose).expect_err("in-process");
        assert!(err.contains("--isolation in-process"), "{err}");
    }

    #[test]
    fn counts_are_checked() {
        let err = instance_devices(&config(&[(Kind::Cpu, -1, &[])]), &Device::Host).expect_err("negative");
        assert!(err.contains(">= 0"), "{err}");
        let err = instance_devices(&config(&[(Kind::Gpu, 40, &[0, 1])]), &Device::Host).expect_err("too many");
        assert!(err.contains("80 instances") && err.contains("at most 64"), "{err}");
        let err = instance_devices(&config(&[(Kind::Cpu, 100_000, &[])]), &Device::Host).expect_err("too many");
        assert!(err.contains("100000 instances"), "{err}");
    }

    #[test]
    fn the_cap_keeps_a_reserve() {
        assert_eq!(gpu_memory_cap(10 << 30), 9 << 30);
        assert_eq!(gpu_memory_cap(141 << 30), 140 << 30);
        assert_eq!(gpu_memory_cap(2 << 30), 3 << 29);
        assert_eq!(gpu_memory_cap(0), 0);
    }
}
