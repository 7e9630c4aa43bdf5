//! Reading the GPUs and their MIG instances through NVML, and the slices they make.
//!
//! `nvml-wrapper` wraps most of what is read here; the GPU and compute instance ids of a MIG
//! device are read through the raw bindings (`nvmlDeviceGetGpuInstanceId`,
//! `nvmlDeviceGetComputeInstanceId`). A MIG device's profile comes from its name, which NVML
//! gives as `NVIDIA H200 MIG 1g.18gb`; where a name carries none, it is made from the device's
//! attributes (`<GPU instance slices>g.<memory in GiB, rounded>gb`), which may differ from
//! NVIDIA's marketing name, so a warning says so.
//!
//! Tessera only reads the MIG layout: it never creates or destroys instances, nor changes MIG
//! mode, clocks or power limits (NVIDIA's MIG manager or `nvidia-smi` does that).

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use crate::worker::inventory::{SliceSpec, device_uuid, valid_profile};

/// A physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDevice {
    /// NVML index.
    pub index: u32,
    /// `GPU-<uuid>`.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Device memory.
    pub memory_bytes: u64,
    /// Whether MIG mode is on (then only its MIG instances are slices).
    pub mig_enabled: bool,
    /// Its MIG instances, in NVML's order.
    pub migs: Vec<MigDevice>,
}

/// A MIG instance (one GPU instance with one compute instance).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// `MIG-<uuid>`.
    pub uuid: String,
    /// Profile, e.g. `1g.18gb`.
    pub profile: String,
    /// Device memory of the instance.
    pub memory_bytes: u64,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id.
    pub compute_instance_id: u32,
}

/// Every GPU NVML sees, with its MIG instances. A GPU that answers `GPU_IS_LOST` is left out
/// with a warning (it can hold nothing); any other error fails the whole read.
pub fn read_gpus(nvml: &Nvml) -> Result<Vec<GpuDevice>, NvmlError> {
    let count = nvml.device_count()?;
    let mut gpus = Vec::with_capacity(count as usize);
    for index in 0..count {
        match read_gpu(nvml, index) {
            Ok(gpu) => gpus.push(gpu),
            Err(NvmlError::GpuLost) => tracing::warn!(index, "GPU is lost; it offers no slices"),
            Err(e) => return Err(e),
        }
    }
    Ok(gpus)
}

fn read_gpu(nvml: &Nvml, index: u32) -> Result<GpuDevice, NvmlError> {
    let device = nvml.device_by_index(index)?;
    let mig_enabled = match device.mig_mode() {
        Ok(mode) => mode.current == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE,
        // GPUs without MIG support answer NOT_SUPPORTED.
        Err(NvmlError::NotSupported) => false,
        Err(e) => return Err(e),
    };
    let migs = if mig_enabled { read_migs(nvml, &device)? } else { Vec::new() };
    Ok(GpuDevice {
        index,
        uuid: device.uuid()?,
        name: device.name()?,
        memory_bytes: device.memory_info()?.total,
        mig_enabled,
        migs,
    })
}

/// The MIG instances of a GPU in MIG mode: NVML numbers the possible ones and answers
/// NOT_FOUND for an index with no instance.
fn read_migs(nvml: &Nvml, gpu: &Device<'_>) -> Result<Vec<MigDevice>, NvmlError> {
    let max = gpu.mig_device_count()?;
    let mut migs = Vec::new();
    for i in 0..max {
        let mig = match gpu.mig_device_by_index(i) {
            Ok(mig) => mig,
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(e),
        };
        migs.push(read_mig(nvml, &mig)?);
    }
    Ok(migs)
}

fn read_mig(nvml: &Nvml, mig: &Device<'_>) -> Result<MigDevice, NvmlError> {
    let uuid = mig.uuid()?;
    let profile = match profile_from_name(&mig.name()?) {
        Some(profile) => profile,
        None => {
            let attributes = mig.attributes()?;
            let profile = profile_from_attributes(attributes.gpu_instance_slice_count, attributes.memory_size_mb);
            tracing::warn!(%uuid, %profile, "MIG device name names no profile; made one from its attributes");
            profile
        }
    };
    // SAFETY: the handle comes from NVML and lives as long as `nvml`.
    let handle = unsafe { mig.handle() };
    Ok(MigDevice {
        uuid,
        profile,
        memory_bytes: mig.memory_info()?.total,
        gpu_instance_id: instance_id(nvml, handle, Instance::Gpu)?,
        compute_instance_id: instance_id(nvml, handle, Instance::Compute)?,
    })
}

/// Which instance id to read.
enum Instance {
    Gpu,
    Compute,
}

/// The GPU or compute instance id of a MIG device, through the raw bindings (`nvml-wrapper`
/// does not wrap them).
fn instance_id(nvml: &Nvml, device: nvmlDevice_t, which: Instance) -> Result<u32, NvmlError> {
    type GetId = unsafe extern "C" fn(nvmlDevice_t, *mut std::os::raw::c_uint) -> nvmlReturn_t;
    let lib = nvml.lib();
    let sym: &GetId = match which {
        Instance::Gpu => nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?,
        Instance::Compute => nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?,
    };
    let mut id: std::os::raw::c_uint = 0;
    // SAFETY: `device` is a MIG handle NVML gave out and `id` outlives the call.
    nvml_try(unsafe { sym(device, &mut id) })?;
    Ok(id)
}

/// The profile in a MIG device's name: `NVIDIA H200 MIG 1g.18gb` → `1g.18gb`.
pub fn profile_from_name(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    valid_profile(profile).then(|| profile.to_string())
}

/// A profile name from a MIG device's attributes: 3 slices and 72704 MiB → `3g.71gb`.
pub fn profile_from_attributes(gpu_instance_slices: u32, memory_mib: u64) -> String {
    format!("{gpu_instance_slices}g.{}gb", (memory_mib + 512) / 1024)
}

/// The slices these GPUs offer: a GPU not in MIG mode is one slice `GPU-<uuid>` (profile
/// `gpu`); a GPU in MIG mode offers its instances, each `MIG-<uuid>` (profile `mig-<profile>`).
/// A GPU in MIG mode with no instances offers nothing.
pub fn slices(gpus: &[GpuDevice]) -> Vec<SliceSpec> {
    let mut slices = Vec::new();
    for gpu in gpus {
        let gpu_uuid = prefixed("GPU-", &gpu.uuid);
        if !gpu.mig_enabled {
            slices.push(SliceSpec::whole_gpu(gpu_uuid, gpu.index, gpu.memory_bytes));
            continue;
        }
        if gpu.migs.is_empty() {
            tracing::warn!(gpu_uuid, "GPU is in MIG mode with no MIG instances; it offers no slices");
        }
        for mig in &gpu.migs {
            let uuid = prefixed("MIG-", &mig.uuid);
            let ids = Some((mig.gpu_instance_id, mig.compute_instance_id));
            slices.push(SliceSpec::mig_instance(uuid, &mig.profile, mig.memory_bytes, (&gpu_uuid, gpu.index), ids));
        }
    }
    slices
}

/// NVML's UUIDs carry their prefix already (`GPU-`, `MIG-`); old drivers' MIG UUIDs did not.
fn prefixed(prefix: &str, uuid: &str) -> String {
    device_uuid(prefix, uuid).unwrap_or_else(|_| format!("{prefix}{}", uuid.strip_prefix(prefix).unwrap_or(uuid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_come_from_names_or_attributes() {
        assert_eq!(profile_from_name("NVIDIA H200 MIG 1g.18gb").as_deref(), Some("1g.18gb"));
        assert_eq!(profile_from_name("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb").as_deref(), Some("1c.3g.20gb"));
        assert_eq!(profile_from_name("NVIDIA H200"), None);
        assert_eq!(profile_from_name("NVIDIA H200 MIG 1G 18GB"), None);
        assert_eq!(profile_from_attributes(1, 18432), "1g.18gb");
        assert_eq!(profile_from_attributes(3, 72704), "3g.71gb");
        assert_eq!(profile_from_attributes(1, 9984), "1g.10gb");
    }
}
