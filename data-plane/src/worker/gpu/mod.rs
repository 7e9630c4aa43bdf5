//! The worker's GPUs through NVML (`nvml-wrapper`, which loads `libnvidia-ml.so.1` at run time,
//! so the worker builds and runs without a GPU): the GPU and MIG slices it offers ([`nvml`]),
//! their health from critical Xid events ([`xid`], [`health`]), and GPU metrics
//! ([`telemetry`]), the last two watched by one dedicated thread ([`monitor`]).
//!
//! Where NVML comes from ([`NvmlSource`]): `--nvml-library PATH` loads that file and fails the
//! start when it cannot; otherwise the system's `libnvidia-ml.so.1` is tried, and a machine
//! without it runs a CPU-only worker. With `--inventory FILE` the GPUs are simulated and NVML is
//! not used at all.

pub mod health;
pub mod monitor;
pub mod nvml;
pub mod telemetry;
pub mod xid;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use crate::worker::inventory::SliceSpec;

/// The library NVML is loaded from when none is named.
pub const SYSTEM_LIBRARY: &str = "libnvidia-ml.so.1";

/// Where the worker's NVML comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlSource {
    /// No NVML: CPU slices and `--inventory` only (tests, `tessera dev`).
    Off,
    /// The system's `libnvidia-ml.so.1` when it is there; a CPU-only worker when it is not.
    System,
    /// This library (`--nvml-library`); failing to load it fails the start.
    Library(PathBuf),
}

/// NVML, loaded, and the GPUs it found at start.
pub struct Gpus {
    nvml: Arc<Nvml>,
    devices: Vec<nvml::GpuDevice>,
}

impl std::fmt::Debug for Gpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpus").field("devices", &self.devices).finish_non_exhaustive()
    }
}

impl Gpus {
    /// Loads NVML from `source` and reads the GPUs; `None` when there is no NVML to use.
    pub fn open(source: &NvmlSource) -> anyhow::Result<Option<Self>> {
        match source {
            NvmlSource::Off => Ok(None),
            NvmlSource::System => Self::open_system(OsStr::new(SYSTEM_LIBRARY)),
            NvmlSource::Library(path) => {
                let nvml = Nvml::builder()
                    .lib_path(path.as_os_str())
                    .init()
                    .with_context(|| format!("load the NVML library {} (--nvml-library)", path.display()))?;
                Self::read(nvml).map(Some)
            }
        }
    }

    /// The system library, by name: its absence means a CPU-only worker.
    fn open_system(name: &OsStr) -> anyhow::Result<Option<Self>> {
        match Nvml::builder().lib_path(name).init() {
            Ok(nvml) => Self::read(nvml).map(Some),
            Err(NvmlError::LibloadingError(e)) => {
                tracing::info!(library = ?name, reason = %e, "no NVML library; CPU-only worker");
                Ok(None)
            }
            Err(e) => {
                tracing::warn!(library = ?name, error = %e, "NVML is installed but does not start; no GPU slices");
                Ok(None)
            }
        }
    }

    fn read(nvml: Nvml) -> anyhow::Result<Self> {
        let devices = nvml::read_gpus(&nvml).context("read the GPUs through NVML")?;
        for gpu in &devices {
            let migs: Vec<&str> = gpu.migs.iter().map(|m| m.profile.as_str()).collect();
            tracing::info!(index = gpu.index, uuid = %gpu.uuid, name = %gpu.name, memory_bytes = gpu.memory_bytes, mig = gpu.mig_enabled, ?migs, "GPU found");
        }
        Ok(Self { nvml: Arc::new(nvml), devices })
    }

    /// The GPUs found at start.
    pub fn devices(&self) -> &[nvml::GpuDevice] {
        &self.devices
    }

    /// The GPU and MIG slices they offer.
    pub fn slices(&self) -> Vec<SliceSpec> {
        nvml::slices(&self.devices)
    }

    /// The GPUs, their MIG instances and the slices they offer, as `tessera gpus` prints them.
    pub fn report(&self) -> serde_json::Value {
        let gpus: Vec<serde_json::Value> = self
            .devices
            .iter()
            .map(|g| {
                let migs: Vec<serde_json::Value> = g
                    .migs
                    .iter()
                    .map(|m| {
                        serde_json::json!({
                            "uuid": m.uuid, "profile": m.profile, "memory_bytes": m.memory_bytes,
                            "gpu_instance_id": m.gpu_instance_id, "compute_instance_id": m.compute_instance_id,
                        })
                    })
                    .collect();
                serde_json::json!({
                    "index": g.index, "uuid": g.uuid, "name": g.name, "memory_bytes": g.memory_bytes,
                    "mig_enabled": g.mig_enabled, "mig": migs,
                })
            })
            .collect();
        let slices: Vec<serde_json::Value> = self
            .slices()
            .iter()
            .map(|s| serde_json::json!({ "id": s.id, "profile": s.profile, "memory_bytes": s.memory_bytes }))
            .collect();
        serde_json::json!({ "nvml": true, "gpus": gpus, "slices": slices })
    }

    /// The monitor of these GPUs (health events and metrics), not started yet.
    pub fn monitor(
        &self,
        health: Arc<health::SliceHealth>,
        metrics: Arc<telemetry::GpuMetrics>,
        layout: tokio::sync::watch::Sender<Vec<SliceSpec>>,
    ) -> monitor::Monitor {
        monitor::Monitor { nvml: self.nvml.clone(), gpus: self.devices.clone(), health, metrics, layout }
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! The project's fake `libnvidia-ml.so.1` (`tests/fake_nvml/fake_nvml.c`), built once per
    //! test binary and copied into a directory per test with its settings beside it.

    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;

    use sha2::Digest as _;

    /// The built library: compiled into a directory named after the source's hash, so runs
    /// share it and an edited source is built again.
    fn built() -> &'static Path {
        static BUILT: OnceLock<PathBuf> = OnceLock::new();
        BUILT.get_or_init(|| {
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake_nvml/fake_nvml.c");
            let text = std::fs::read(&source).expect("read fake_nvml.c");
            let hash = hex::encode(&sha2::Sha256::digest(&text)[..8]);
            let dir = std::env::temp_dir().join(format!("tessera-fake-nvml-{hash}"));
            let lib = dir.join("libnvidia-ml.so.1");
            if !lib.exists() {
                std::fs::create_dir_all(&dir).expect("create the fake NVML directory");
                // Built under a unique name and renamed: test binaries may build at once.
                let partial = dir.join(format!("build-{}.so", std::process::id()));
                let status = std::process::Command::new("cc")
                    .args(["-shared", "-fPIC", "-O1", "-o"])
                    .arg(&partial)
                    .arg(&source)
                    .status()
                    .expect("run cc to build the fake NVML");
                assert!(status.success(), "cc failed to build {}", source.display());
                std::fs::rename(&partial, &lib).expect("put the fake NVML in place");
            }
            lib
        })
    }

    /// A private copy of the fake library with `settings` (`FAKE_NVML_*=...` lines) beside it;
    /// returns the directory (keep it while NVML is loaded) and the library's path.
    pub fn library(settings: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let lib = dir.path().join("libnvidia-ml.so.1");
        std::fs::copy(built(), &lib).expect("copy the fake NVML");
        std::fs::write(dir.path().join("fake_nvml.conf"), settings).expect("write fake_nvml.conf");
        (dir, lib)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::worker::inventory::SliceKind;

    fn open(settings: &str) -> (tempfile::TempDir, Gpus) {
        let (dir, lib) = fake::library(settings);
        let gpus = Gpus::open(&NvmlSource::Library(lib)).expect("the fake loads").expect("NVML is on");
        (dir, gpus)
    }

    #[test]
    fn an_h200_in_mig_mode_and_a_whole_h100_give_their_slices() {
        let (_dir, gpus) = open("FAKE_NVML_GPUS=h200:1g.18gb*7;h100\n");
        let slices = gpus.slices();
        assert_eq!(slices.len(), 8);
        let gpu0 = "GPU-fa4e0000-0000-4000-8000-000000000000";
        for (i, s) in slices[..7].iter().enumerate() {
            let gi = u32::try_from(i).expect("small") + 1;
            assert_eq!(s.id, format!("MIG-fa4e0000-{gi:04x}-4000-8000-000000{gi:06x}"));
            assert_eq!((s.profile.as_str(), s.kind, s.memory_bytes), ("mig-1g.18gb", SliceKind::Mig, 18_432 << 20));
            assert_eq!((s.gpu_instance_id, s.compute_instance_id), (Some(gi), Some(0)));
            assert_eq!((s.parent_gpu_uuid.as_deref(), s.gpu_index), (Some(gpu0), Some(0)));
            assert_eq!(s.device_uuid.as_deref(), Some(s.id.as_str()));
        }
        let h100 = &slices[7];
        assert_eq!(h100.id, "GPU-fa4e0000-0000-4000-8000-000000000001");
        assert_eq!((h100.profile.as_str(), h100.kind, h100.memory_bytes), ("gpu", SliceKind::Gpu, 81_559 << 20));
        assert_eq!((h100.gpu_index, h100.gpu_instance_id, h100.parent_gpu_uuid.as_deref()), (Some(1), None, None));
        assert_eq!(gpus.devices()[0].name, "NVIDIA H200");
        let proto = slices[0].to_proto();
        assert_eq!((proto.gpu_instance_id, proto.compute_instance_id), (Some(1), Some(0)));
    }

    #[test]
    fn a_mixed_h200_layout_keeps_its_profiles() {
        let (_dir, gpus) = open("FAKE_NVML_GPUS=h200:3g.71gb,2g.35gb,1g.18gb*2\n");
        let profiles: Vec<(String, u64)> =
            gpus.slices().into_iter().map(|s| (s.profile, s.memory_bytes >> 20)).collect();
        let expected =
            [("mig-3g.71gb", 72_704), ("mig-2g.35gb", 35_840), ("mig-1g.18gb", 18_432), ("mig-1g.18gb", 18_432)];
        assert_eq!(profiles, expected.map(|(p, m)| (p.to_string(), m)));
    }

    #[test]
    fn no_system_library_means_a_cpu_only_worker() {
        let opened = Gpus::open_system(OsStr::new("libnvidia-ml-absent-for-tessera-tests.so.1")).expect("no error");
        assert!(opened.is_none());
        assert!(Gpus::open(&NvmlSource::Off).expect("off").is_none());
    }

    #[test]
    fn a_named_library_that_does_not_load_is_an_error_naming_it() {
        let err = Gpus::open(&NvmlSource::Library("/nonexistent/libnvidia-ml.so.1".into())).expect_err("must fail");
        assert!(format!("{err:#}").contains("/nonexistent/libnvidia-ml.so.1"), "{err:#}");
    }

    /// Waits until `done` holds, for up to five seconds.
    fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_monitor_marks_slices_from_injected_events_samples_metrics_and_follows_mig_changes() {
        let events = tempfile::NamedTempFile::new().expect("events file");
        let settings = format!("FAKE_NVML_GPUS=h200:1g.18gb*3;h100\nFAKE_NVML_EVENTS={}\n", events.path().display());
        let (_dir, gpus) = open(&settings);
        let slices = gpus.slices();
        let health = Arc::new(health::SliceHealth::new(&slices));
        let metrics = Arc::new(telemetry::GpuMetrics::new(health.clone()));
        let (layout, mut layouts) = watch::channel(slices.clone());
        let stop = CancellationToken::new();
        let thread = gpus.monitor(health.clone(), metrics.clone(), layout).spawn(stop.clone()).expect("spawn");
        let append = |line: &str| {
            use std::io::Write as _;
            let mut f = std::fs::OpenOptions::new().append(true).open(events.path()).expect("open events");
            writeln!(f, "{line}").expect("append an event");
        };

        // An application Xid on a MIG slice, then a MIG-scoped device Xid, then a whole-GPU one.
        append("xid=13 gpu=0 gi=1 ci=0");
        append("xid=94 gpu=0 gi=2 ci=0");
        eventually("the MIG-scoped Xid", || health.unhealthy().len() == 1);
        assert!(health.unhealthy().contains_key(&slices[1].id), "{:?}", health.unhealthy());
        append("xid=79 gpu=1 gi=4294967295 ci=4294967295");
        eventually("the whole-GPU Xid", || health.unhealthy().len() == 2);
        assert_eq!(
            health.unhealthy()[&slices[3].id],
            format!("Xid 79 (GPU has fallen off the bus) on {}", slices[3].id)
        );

        // Metrics arrive within a sample interval.
        let gpu0 = "GPU-fa4e0000-0000-4000-8000-000000000000";
        let utilization = format!("nv_gpu_utilization{{gpu_uuid=\"{gpu0}\"}} 0.37");
        let mig_memory =
            format!("nv_gpu_memory_total_bytes{{gpu_uuid=\"{gpu0}\",slice=\"{}\"}} {}", slices[0].id, 18_432u64 << 20);
        eventually("a sample", || {
            let mut text = String::new();
            crate::serve::metrics::MetricsSource::render_metrics(&*metrics, &mut text);
            text.contains(&utilization)
                && text.contains(&mig_memory)
                && text.contains("tessera_slice_xid_errors_total{")
        });

        // A new MIG layout on GPU 0 is read again and sent out.
        append("mig_config_change gpu=0 mig=3g.71gb,2g.35gb");
        eventually("the new layout", || layouts.has_changed().unwrap_or(false));
        let profiles: Vec<String> = layouts.borrow_and_update().iter().map(|s| s.profile.clone()).collect();
        assert_eq!(profiles, ["mig-3g.71gb", "mig-2g.35gb", "gpu"]);

        // A lost GPU takes its slices.
        append("gpu_lost gpu=0");
        eventually("the lost GPU", || health.unhealthy().values().any(|r| r.ends_with("is lost")));

        stop.cancel();
        thread.join().expect("the monitor stops");
    }
}
