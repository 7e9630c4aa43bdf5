//! The device a runner gets: none (a CPU slice), the host's (`tessera serve`), or one GPU or
//! MIG instance. The front starts a GPU or MIG slice's runner with `CUDA_VISIBLE_DEVICES` set to
//! the slice's uuid (one CUDA process sees one MIG instance; inside, it is device 0), the CUDA
//! library directories on `LD_LIBRARY_PATH` (the dynamic loader reads it once, at exec, so a
//! running process cannot add them), and its GPU memory cap as a flag; the runner turns the
//! flags back into the [`Device`] its loads see, the same one the front checks specs against.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::engine::device::Device;

/// The device side of a slice, as its runner is started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SliceDevice {
    /// Whatever the worker sees (a slice the worker does not know, `tessera serve`'s runner).
    #[default]
    Host,
    /// A CPU slice: its runner sees no GPU (`CUDA_VISIBLE_DEVICES` empty).
    Cpu,
    /// A whole GPU or a MIG instance: its runner sees that device alone, as CUDA device 0.
    Gpu(GpuShare),
}

/// One GPU or MIG instance given to a runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuShare {
    /// The runner's `CUDA_VISIBLE_DEVICES`: `GPU-<uuid>` or `MIG-<uuid>`.
    pub device_uuid: String,
    /// Whether it is a MIG instance (else a whole GPU).
    pub mig: bool,
    /// GPU memory ONNX Runtime's arenas may hold in the runner: the slice's memory less a
    /// reserve (see [`crate::engine::device::gpu_memory_cap`]).
    pub memory_limit_bytes: u64,
}

/// `tessera runner --slice-kind`: what the runner's slice is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RunnerSliceKind {
    /// A CPU slice: no GPU.
    Cpu,
    /// A whole GPU, visible as CUDA device 0.
    Gpu,
    /// A MIG instance, visible as CUDA device 0.
    Mig,
}

impl SliceDevice {
    /// The device loads on slice `slice` see inside its runner.
    pub fn target_device(&self, slice: &str) -> Device {
        match self {
            SliceDevice::Host => Device::Host,
            SliceDevice::Cpu => Device::CpuSlice { slice: slice.to_string() },
            SliceDevice::Gpu(share) => Device::GpuSlice {
                slice: slice.to_string(),
                mig: share.mig,
                memory_limit_bytes: share.memory_limit_bytes,
            },
        }
    }

    /// The `tessera runner` flags that carry this device.
    pub fn runner_args(&self) -> Vec<String> {
        match self {
            SliceDevice::Host => Vec::new(),
            SliceDevice::Cpu => vec!["--slice-kind=cpu".into()],
            SliceDevice::Gpu(share) => vec![
                format!("--slice-kind={}", if share.mig { "mig" } else { "gpu" }),
                format!("--gpu-memory-limit-bytes={}", share.memory_limit_bytes),
            ],
        }
    }

    /// The environment variables a runner on this device starts with: its visible devices and,
    /// when it may use a GPU, `LD_LIBRARY_PATH` led by `cuda_dirs` and ONNX Runtime's own
    /// directory (`ort_dir`), then what the worker had (`inherited`).
    pub fn runner_env(
        &self,
        cuda_dirs: &[PathBuf],
        ort_dir: Option<&Path>,
        inherited: Option<OsString>,
    ) -> Vec<(&'static str, OsString)> {
        let mut env = Vec::new();
        match self {
            // No devices visible: a CPU slice's runner cannot touch (or hold memory on) a GPU.
            SliceDevice::Cpu => return vec![("CUDA_VISIBLE_DEVICES", OsString::new())],
            SliceDevice::Gpu(share) => env.push(("CUDA_VISIBLE_DEVICES", OsString::from(&share.device_uuid))),
            SliceDevice::Host if cuda_dirs.is_empty() => return env,
            SliceDevice::Host => {}
        }
        let mut dirs: Vec<PathBuf> = cuda_dirs.to_vec();
        dirs.extend(ort_dir.map(Path::to_path_buf));
        dirs.extend(inherited.iter().flat_map(std::env::split_paths).filter(|p| !p.as_os_str().is_empty()));
        let mut unique: Vec<PathBuf> = Vec::with_capacity(dirs.len());
        for dir in dirs {
            if !unique.contains(&dir) {
                unique.push(dir);
            }
        }
        // Directories with ':' cannot be listed; they were refused when the flag was parsed.
        if let Ok(joined) = std::env::join_paths(unique) {
            env.push(("LD_LIBRARY_PATH", joined));
        }
        env
    }
}

/// The device a runner's loads see, from its flags: `--slice-kind` and, for GPU and MIG
/// slices, `--gpu-memory-limit-bytes`; neither means the host's devices.
pub fn device_from_args(slice: &str, kind: Option<RunnerSliceKind>, memory: Option<u64>) -> Result<Device, String> {
    let gpu = |mig: bool| match memory {
        Some(memory_limit_bytes) => Ok(Device::GpuSlice { slice: slice.to_string(), mig, memory_limit_bytes }),
        None => Err("--slice-kind gpu and mig need --gpu-memory-limit-bytes".to_string()),
    };
    match kind {
        None => Ok(Device::Host),
        Some(RunnerSliceKind::Cpu) => Ok(Device::CpuSlice { slice: slice.to_string() }),
        Some(RunnerSliceKind::Gpu) => gpu(false),
        Some(RunnerSliceKind::Mig) => gpu(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mig() -> SliceDevice {
        SliceDevice::Gpu(GpuShare { device_uuid: "MIG-ab12".into(), mig: true, memory_limit_bytes: 9 << 30 })
    }

    #[test]
    fn a_gpu_runner_sees_its_device_and_the_cuda_libraries() {
        let env = mig().runner_env(
            &[PathBuf::from("/opt/cuda/lib"), PathBuf::from("/opt/cudnn/lib")],
            Some(Path::new("/cache/ort-gpu")),
            Some(OsString::from("/usr/local/lib::/opt/cuda/lib")),
        );
        assert_eq!(
            env,
            vec![
                ("CUDA_VISIBLE_DEVICES", OsString::from("MIG-ab12")),
                ("LD_LIBRARY_PATH", OsString::from("/opt/cuda/lib:/opt/cudnn/lib:/cache/ort-gpu:/usr/local/lib")),
            ]
        );
        assert_eq!(mig().runner_args(), ["--slice-kind=mig", "--gpu-memory-limit-bytes=9663676416"]);
    }

    #[test]
    fn a_cpu_runner_sees_no_gpu_and_the_host_keeps_its_own() {
        assert_eq!(SliceDevice::Cpu.runner_env(&[], None, None), vec![("CUDA_VISIBLE_DEVICES", OsString::new())]);
        assert_eq!(SliceDevice::Cpu.runner_args(), ["--slice-kind=cpu"]);
        assert!(SliceDevice::Host.runner_env(&[], Some(Path::new("/ort")), None).is_empty());
        assert!(SliceDevice::Host.runner_args().is_empty());
        let host = SliceDevice::Host.runner_env(&[PathBuf::from("/cuda")], None, None);
        assert_eq!(host, vec![("LD_LIBRARY_PATH", OsString::from("/cuda"))]);
    }

    #[test]
    fn the_runner_reads_back_the_device_the_front_checks_against() {
        for (device, slice) in [(mig(), "MIG-ab12"), (SliceDevice::Cpu, "cpu-1"), (SliceDevice::Host, "local")] {
            let args = device.runner_args();
            let kind = args.iter().find_map(|a| a.strip_prefix("--slice-kind=")).map(|k| match k {
                "cpu" => RunnerSliceKind::Cpu,
                "gpu" => RunnerSliceKind::Gpu,
                _ => RunnerSliceKind::Mig,
            });
            let memory = args.iter().find_map(|a| a.strip_prefix("--gpu-memory-limit-bytes=")?.parse().ok());
            assert_eq!(device_from_args(slice, kind, memory), Ok(device.target_device(slice)));
        }
        assert!(device_from_args("GPU-1", Some(RunnerSliceKind::Gpu), None).is_err());
    }
}
