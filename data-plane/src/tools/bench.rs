//! `tessera bench ort`: raw in-process ONNX Runtime throughput, the baseline for server overhead.
//! Uses the same session code and thread settings as the server's instances.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tessera_protocol::DataType;
use tessera_protocol::inference::ModelConfig;

use crate::engine::backend::onnx::OnnxSession;
use crate::engine::backend::providers::{Accelerators, ProviderPlan};
use crate::engine::device::{Device, ExecutionTarget, InstanceDevice};
use crate::engine::model_spec::{ModelSpec, complete_and_check};
use crate::engine::tensor::{InputTensor, OutputTensor, push_bytes_element};

/// Flags of `tessera bench ort`.
#[derive(Debug, Clone, clap::Args)]
pub struct OrtBenchArgs {
    /// ONNX model file.
    #[arg(long)]
    pub model: PathBuf,
    /// Batch size (first dimension of every input).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Intra-op threads of the session.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Let idle ORT threads spin (the server's default is off).
    #[arg(long)]
    pub spinning: bool,
    /// Seconds to measure (after a short warm-up).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Run on this CUDA device through ONNX Runtime's CUDA execution provider (the GPU build of
    /// ONNX Runtime), as a `KIND_GPU` instance would; default: the CPU provider.
    #[arg(long)]
    pub gpu: Option<i32>,
    /// Also run the same inputs on the CPU provider and report the largest difference of the
    /// outputs over their largest magnitude (FP32 outputs; needs `--gpu`).
    #[arg(long, requires = "gpu")]
    pub compare_cpu: bool,
}

/// Runs the benchmark and prints one JSON line with throughput and latency percentiles.
pub fn run_ort(args: &OrtBenchArgs) -> anyhow::Result<()> {
    let plan = match args.gpu {
        None => ProviderPlan::Cpu,
        Some(device_id) => {
            let dir = args.model.parent().unwrap_or(std::path::Path::new("."));
            Accelerators::default().plan(InstanceDevice::Gpu { device_id, memory_limit_bytes: None }, dir)
        }
    };
    let mut session = OnnxSession::load(&args.model, args.threads, args.spinning, &plan).map_err(anyhow::Error::msg)?;
    let target = ExecutionTarget { cores: args.threads, device: Device::Host };
    let spec =
        complete_and_check(ModelConfig::default(), "bench", &session.io(), &target).map_err(anyhow::Error::msg)?;
    let inputs = synthetic_inputs(&spec, args.batch);
    let parts: Vec<Vec<&InputTensor>> = inputs.iter().map(|i| vec![i]).collect();
    let wanted: Vec<usize> = (0..spec.outputs.len()).collect();
    let max_scaled_error = match args.compare_cpu {
        false => None,
        true => {
            let mut cpu =
                OnnxSession::load(&args.model, args.threads, false, &ProviderPlan::Cpu).map_err(anyhow::Error::msg)?;
            let reference = cpu.run(&spec, &parts, args.batch, &wanted).map_err(|e| anyhow::anyhow!(e.message))?;
            let got = session.run(&spec, &parts, args.batch, &wanted).map_err(|e| anyhow::anyhow!(e.message))?;
            Some(max_scaled_error(&reference.0, &got.0)?)
        }
    };
    let mut run =
        || session.run(&spec, &parts, args.batch, &wanted).map(|_| ()).map_err(|e| anyhow::anyhow!(e.message));
    let warmup = Instant::now();
    while warmup.elapsed() < Duration::from_millis(500) {
        run()?;
    }
    let mut latencies = Vec::new();
    let start = Instant::now();
    let budget = Duration::from_secs_f64(args.seconds.max(0.1));
    while start.elapsed() < budget {
        let t = Instant::now();
        run()?;
        latencies.push(t.elapsed());
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)].as_secs_f64() * 1e6;
    let result = serde_json::json!({
        "model": args.model.display().to_string(),
        "batch": args.batch,
        "threads": args.threads,
        "providers": plan.describe(),
        "max_error_vs_cpu": max_scaled_error,
        "runs": latencies.len(),
        "inferences_per_sec": latencies.len() as f64 * args.batch as f64 / elapsed,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
    });
    println!("{result}");
    Ok(())
}

/// How far the GPU's outputs are from the CPU's: for each FP32 output the largest `|a - b|`
/// over the largest `|a|` of the CPU's output (an elementwise ratio would be ruled by outputs
/// near zero, where TF32 matrix products, ORT's CUDA default, differ most in relative terms),
/// the worst over every output; outputs of other types must match exactly.
fn max_scaled_error(reference: &[OutputTensor], got: &[OutputTensor]) -> anyhow::Result<f64> {
    let mut worst = 0f64;
    for (r, g) in reference.iter().zip(got) {
        anyhow::ensure!(r.shape == g.shape, "output {}: shape {:?} on CPU, {:?} on GPU", r.name, r.shape, g.shape);
        if r.datatype != DataType::Fp32 {
            anyhow::ensure!(r.data == g.data, "output {} ({:?}) differs between CPU and GPU", r.name, r.datatype);
            continue;
        }
        let floats = |b: &[u8]| -> Vec<f64> {
            b.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect()
        };
        let (a, b) = (floats(&r.data), floats(&g.data));
        let scale = a.iter().filter(|v| v.is_finite()).fold(0f64, |m, v| m.max(v.abs()));
        let mut diff = 0f64;
        for (x, y) in a.iter().zip(&b) {
            // Equal infinities, or NaN on both sides, agree.
            if x == y || (x.is_nan() && y.is_nan()) {
                continue;
            }
            let d = (x - y).abs();
            anyhow::ensure!(d.is_finite(), "output {}: {x} on CPU, {y} on GPU", r.name);
            diff = diff.max(d);
        }
        worst = worst.max(if scale > 0.0 { diff / scale } else { diff });
    }
    Ok(worst)
}

/// Deterministic pseudo-random inputs matching the model's spec (dynamic dims become 1).
fn synthetic_inputs(spec: &ModelSpec, batch: usize) -> Vec<InputTensor> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    spec.inputs
        .iter()
        .map(|t| {
            let mut shape: Vec<i64> = t.dims.iter().map(|d| if *d < 0 { 1 } else { *d }).collect();
            if spec.max_batch_size > 0 {
                shape.insert(0, batch as i64);
            }
            let count: usize = shape.iter().product::<i64>().max(0) as usize;
            let data = match t.datatype {
                DataType::Fp32 => {
                    (0..count).flat_map(|_| ((next() % 2000) as f32 / 1000.0 - 1.0).to_le_bytes()).collect()
                }
                DataType::Bytes => {
                    let mut out = Vec::new();
                    for i in 0..count {
                        let _ = push_bytes_element(&mut out, format!("s{i}").as_bytes());
                    }
                    out
                }
                other => vec![0u8; count * other.element_size().unwrap_or(1)],
            };
            InputTensor { name: t.name.clone(), datatype: t.datatype, shape, data: Bytes::from(data) }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp32(name: &str, values: &[f32]) -> OutputTensor {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        OutputTensor {
            name: name.into(),
            datatype: DataType::Fp32,
            shape: vec![values.len() as i64],
            data: data.into(),
        }
    }

    #[test]
    fn the_error_is_the_worst_difference_over_the_outputs_scale_and_mismatches_are_errors() {
        let reference = [fp32("y", &[1.0, -2.0, 0.0])];
        assert_eq!(max_scaled_error(&reference, &reference).expect("same"), 0.0);
        // 0.002 off where the output is 1, and off by 1e-4 where it is 0: scaled by the largest |value|, 2.
        let got = [fp32("y", &[1.002, -2.0, 1e-4])];
        let e = max_scaled_error(&reference, &got).expect("comparable");
        assert!((e - 0.001).abs() < 1e-6, "{e}");
        let nan = [fp32("y", &[1.0, f32::NAN, 0.0])];
        assert!(max_scaled_error(&reference, &nan).is_err(), "a NaN on one side is no small error");
        assert!(max_scaled_error(&reference, &[fp32("y", &[1.0, 2.0])]).is_err(), "shapes differ");
        let ints =
            |v: u8| OutputTensor { name: "i".into(), datatype: DataType::Int8, shape: vec![1], data: vec![v].into() };
        assert!(max_scaled_error(&[ints(1)], &[ints(2)]).is_err(), "non-float outputs must match exactly");
    }
}
