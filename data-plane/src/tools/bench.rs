//! `tessera bench ort`: raw in-process ONNX Runtime throughput, the baseline for server overhead.
//! Uses the same session code and thread settings as the server's instances.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tessera_protocol::DataType;
use tessera_protocol::inference::ModelConfig;

use crate::engine::backend::onnx::OnnxSession;
use crate::engine::backend::providers::ProviderPlan;
use crate::engine::device::{Device, ExecutionTarget};
use crate::engine::model_spec::{ModelSpec, complete_and_check};
use crate::engine::tensor::{InputTensor, push_bytes_element};

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
}

/// Runs the benchmark and prints one JSON line with throughput and latency percentiles.
pub fn run_ort(args: &OrtBenchArgs) -> anyhow::Result<()> {
    let mut session =
        OnnxSession::load(&args.model, args.threads, args.spinning, &ProviderPlan::Cpu).map_err(anyhow::Error::msg)?;
    let target = ExecutionTarget { cores: args.threads, device: Device::Host };
    let spec =
        complete_and_check(ModelConfig::default(), "bench", &session.io(), &target).map_err(anyhow::Error::msg)?;
    let inputs = synthetic_inputs(&spec, args.batch);
    let parts: Vec<Vec<&InputTensor>> = inputs.iter().map(|i| vec![i]).collect();
    let wanted: Vec<usize> = (0..spec.outputs.len()).collect();
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
        "runs": latencies.len(),
        "inferences_per_sec": latencies.len() as f64 * args.batch as f64 / elapsed,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
    });
    println!("{result}");
    Ok(())
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
