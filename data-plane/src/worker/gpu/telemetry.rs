//! GPU metrics under Triton's names (`nv_gpu_utilization`, `nv_gpu_memory_used_bytes`,
//! `nv_gpu_memory_total_bytes`, `nv_gpu_power_usage`, `nv_gpu_power_limit`,
//! `nv_energy_consumption`), labelled `gpu_uuid`; MIG instances add their memory with a `slice`
//! label (utilization and power are per GPU only: MIG devices do not answer them).
//!
//! The NVML monitor thread samples about once a second; a scrape renders the last sample and
//! never calls NVML, so a slow driver cannot stall the metrics endpoint.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use parking_lot::Mutex;

use super::health::SliceHealth;
use crate::serve::metrics::{MetricsSource, escape, header};

/// One GPU's readings; `None` where the device does not answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    /// `GPU-<uuid>`.
    pub uuid: String,
    /// Busy fraction of the last sample period, 0..1.
    pub utilization: Option<f64>,
    /// Device memory used and total, bytes.
    pub memory: Option<(u64, u64)>,
    /// Power draw, watts.
    pub power_watts: Option<f64>,
    /// Enforced power limit, watts.
    pub power_limit_watts: Option<f64>,
    /// Energy since the driver loaded, joules.
    pub energy_joules: Option<f64>,
    /// Memory of each MIG instance: (slice id, used, total).
    pub migs: Vec<(String, u64, u64)>,
}

/// What one sample saw: the readings, and the GPUs that answered `GPU_IS_LOST`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// One per GPU that answered.
    pub gpus: Vec<GpuReading>,
    /// NVML indices of the GPUs that answered `GPU_IS_LOST`.
    pub lost: Vec<u32>,
}

/// Reads every GPU once.
pub fn sample(nvml: &Nvml) -> Sample {
    let mut out = Sample::default();
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!(error = %e, "cannot count GPUs");
            return out;
        }
    };
    for index in 0..count {
        match read_gpu(nvml, index) {
            Ok(reading) => out.gpus.push(reading),
            Err(NvmlError::GpuLost) => out.lost.push(index),
            Err(e) => tracing::debug!(index, error = %e, "cannot sample a GPU"),
        }
    }
    out
}

fn read_gpu(nvml: &Nvml, index: u32) -> Result<GpuReading, NvmlError> {
    let device = nvml.device_by_index(index)?;
    let uuid = device.uuid()?;
    let memory = device.memory_info()?;
    let watts = |mw: u32| f64::from(mw) / 1000.0;
    Ok(GpuReading {
        uuid,
        utilization: answered(device.utilization_rates())?.map(|u| f64::from(u.gpu) / 100.0),
        memory: Some((memory.used, memory.total)),
        power_watts: answered(device.power_usage())?.map(watts),
        power_limit_watts: answered(device.enforced_power_limit())?.map(watts),
        // Millijoules; f64 holds them exactly for centuries of a GPU's draw.
        energy_joules: answered(device.total_energy_consumption())?.map(|mj| mj as f64 / 1000.0),
        migs: read_migs(&device)?,
    })
}

/// A reading the device may not support: `None` then; GPU_IS_LOST still fails the sample.
fn answered<T>(r: Result<T, NvmlError>) -> Result<Option<T>, NvmlError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(NvmlError::GpuLost) => Err(NvmlError::GpuLost),
        Err(_) => Ok(None),
    }
}

fn read_migs(gpu: &Device<'_>) -> Result<Vec<(String, u64, u64)>, NvmlError> {
    let enabled = matches!(gpu.mig_mode(), Ok(m) if m.current == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE);
    if !enabled {
        return Ok(Vec::new());
    }
    let mut migs = Vec::new();
    for i in 0..answered(gpu.mig_device_count())?.unwrap_or(0) {
        let Some(mig) = answered(gpu.mig_device_by_index(i))? else { continue };
        let uuid = mig.uuid()?;
        let memory = mig.memory_info()?;
        let id = crate::worker::inventory::device_uuid("MIG-", &uuid).unwrap_or(uuid);
        migs.push((id, memory.used, memory.total));
    }
    Ok(migs)
}

/// The worker's GPU metrics: the last sample and the slices' health. Always present on a
/// worker; without NVML it renders only the slices' health.
pub struct GpuMetrics {
    /// The last sample; written by the monitor thread, read by scrapes.
    last: Mutex<Option<Sample>>,
    /// Each GPU's energy counter at its first sample: Triton counts energy since the server
    /// started, NVML since the driver loaded.
    energy_at_start: Mutex<HashMap<String, f64>>,
    health: Arc<SliceHealth>,
}

impl GpuMetrics {
    /// Metrics over `health`, no sample yet.
    pub fn new(health: Arc<SliceHealth>) -> Self {
        Self { last: Mutex::new(None), energy_at_start: Mutex::new(HashMap::new()), health }
    }

    /// Keeps a new sample, its energy counted from each GPU's first sample.
    pub fn store(&self, mut sample: Sample) {
        let mut start = self.energy_at_start.lock();
        for g in &mut sample.gpus {
            if let Some(joules) = g.energy_joules.as_mut() {
                let first = *start.entry(g.uuid.clone()).or_insert(*joules);
                *joules = (*joules - first).max(0.0);
            }
        }
        drop(start);
        *self.last.lock() = Some(sample);
    }
}

impl MetricsSource for GpuMetrics {
    fn render_metrics(&self, out: &mut String) {
        if let Some(sample) = self.last.lock().as_ref() {
            render(out, sample);
        }
        self.health.render(out);
    }
}

/// Renders a sample with Triton's names and help texts.
pub fn render(out: &mut String, sample: &Sample) {
    type Pick = fn(&GpuReading) -> Option<f64>;
    let families: [(&str, &str, Pick); 4] = [
        ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", |g| g.utilization),
        ("nv_gpu_power_usage", "GPU power usage in watts", |g| g.power_watts),
        ("nv_gpu_power_limit", "GPU power management limit in watts", |g| g.power_limit_watts),
        ("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", |g| {
            g.energy_joules
        }),
    ];
    for (name, help, pick) in families {
        header(out, name, help, if name == "nv_energy_consumption" { "counter" } else { "gauge" });
        for g in &sample.gpus {
            if let Some(v) = pick(g) {
                let _ = writeln!(out, "{name}{{gpu_uuid=\"{}\"}} {v}", escape(&g.uuid));
            }
        }
    }
    type PickMemory = fn((u64, u64)) -> u64;
    let memory: [(&str, &str, PickMemory); 2] = [
        ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", |(_, total)| total),
        ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", |(used, _)| used),
    ];
    for (name, help, pick) in memory {
        header(out, name, help, "gauge");
        for g in &sample.gpus {
            let uuid = escape(&g.uuid);
            if let Some(m) = g.memory {
                let _ = writeln!(out, "{name}{{gpu_uuid=\"{uuid}\"}} {}", pick(m));
            }
            for (slice, used, total) in &g.migs {
                let _ = writeln!(
                    out,
                    "{name}{{gpu_uuid=\"{uuid}\",slice=\"{}\"}} {}",
                    escape(slice),
                    pick((*used, *total))
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_render_with_tritons_names() {
        let sample = Sample {
            gpus: vec![GpuReading {
                uuid: "GPU-1".into(),
                utilization: Some(0.37),
                memory: Some((1 << 30, 80 << 30)),
                power_watts: Some(312.0),
                power_limit_watts: Some(700.0),
                energy_joules: Some(123_456.789),
                migs: vec![("MIG-2".into(), 1 << 30, 18 << 30)],
            }],
            lost: Vec::new(),
        };
        let mut text = String::new();
        render(&mut text, &sample);
        for line in [
            "nv_gpu_utilization{gpu_uuid=\"GPU-1\"} 0.37",
            "nv_gpu_power_usage{gpu_uuid=\"GPU-1\"} 312",
            "nv_gpu_power_limit{gpu_uuid=\"GPU-1\"} 700",
            "nv_energy_consumption{gpu_uuid=\"GPU-1\"} 123456.789",
            "nv_gpu_memory_total_bytes{gpu_uuid=\"GPU-1\"} 85899345920",
            "nv_gpu_memory_used_bytes{gpu_uuid=\"GPU-1\",slice=\"MIG-2\"} 1073741824",
            "# TYPE nv_energy_consumption counter",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
