//! Model warmup (Triton's `model_warmup`): every sample runs on every instance before the version
//! reports ready, so the first real request does not pay for lazy initialisation (allocator
//! arenas, kernel selection, a GPU provider's first-run work).

use std::path::{Component, Path};

use bytes::Bytes;
use tessera_protocol::DataType;
use tessera_protocol::inference::ModelWarmup;
use tessera_protocol::inference::model_warmup::input::InputDataType;

use crate::engine::backend::onnx::OnnxSession;
use crate::engine::model_spec::{ModelSpec, TensorSpec};
use crate::engine::tensor::InputTensor;

/// The most bytes one warmup input may hold (a config cannot make a worker allocate more).
const MAX_INPUT_BYTES: u64 = 256 << 20;

/// One warmup request, built from the config and checked against the model.
#[derive(Debug)]
pub struct Sample {
    name: String,
    rows: usize,
    runs: u32,
    /// Inputs in the spec's order; `None` for an optional input the sample leaves out.
    inputs: Vec<Option<InputTensor>>,
}

/// Builds the config's warmup samples. `model_dir` is the model's directory (the parent of its
/// version directories): `input_data_file` names a file in its `warmup/` directory, as in Triton.
/// Inputs in `zero_filled` (a sequence model's state) are zeros when a sample leaves them out.
pub fn samples(spec: &ModelSpec, model_dir: &Path, zero_filled: &[String]) -> Result<Vec<Sample>, String> {
    spec.config.model_warmup.iter().map(|w| sample(spec, model_dir, w, zero_filled)).collect()
}

fn sample(spec: &ModelSpec, model_dir: &Path, warmup: &ModelWarmup, zero_filled: &[String]) -> Result<Sample, String> {
    let name = &warmup.name;
    let bad = |why: String| format!("model_warmup '{name}': {why}");
    let rows = warmup.batch_size as usize;
    match spec.max_batch_size {
        0 if rows != 1 => return Err(bad(format!("batch_size must be 1 for a model that does not batch, not {rows}"))),
        max if max > 0 && (rows == 0 || rows > max as usize) => {
            return Err(bad(format!("batch_size must be between 1 and max_batch_size {max}, not {rows}")));
        }
        _ => {}
    }
    if let Some(unknown) = warmup.inputs.keys().find(|k| !spec.inputs.iter().any(|i| &i.name == *k)) {
        return Err(bad(format!("unknown input '{unknown}'")));
    }
    let mut inputs = Vec::with_capacity(spec.inputs.len());
    for input in &spec.inputs {
        let Some(given) = warmup.inputs.get(&input.name) else {
            if input.optional {
                inputs.push(None);
                continue;
            }
            if zero_filled.contains(&input.name) {
                inputs.push(Some(zeros(spec, input, rows)?));
                continue;
            }
            return Err(bad(format!("no data for input '{}'", input.name)));
        };
        let what = format!("input '{}'", input.name);
        let datatype = tessera_protocol::inference::DataType::try_from(given.data_type)
            .ok()
            .and_then(DataType::from_config)
            .ok_or_else(|| bad(format!("{what} has no valid data_type")))?;
        if datatype != input.datatype {
            return Err(bad(format!(
                "{what} is {}, the model expects {}",
                datatype.config_name(),
                input.datatype.config_name()
            )));
        }
        if given.dims.iter().any(|d| *d < 0) {
            return Err(bad(format!("{what}: dims must be fixed sizes, got {:?}", given.dims)));
        }
        let count = given.dims.iter().try_fold(1u64, |n, d| n.checked_mul(*d as u64));
        let row = match (count, datatype.element_size()) {
            (Some(count), Some(size)) => count.checked_mul(size as u64),
            // A BYTES row is at least a 4-byte length per element.
            (Some(count), None) => count.checked_mul(4),
            (None, _) => None,
        }
        .filter(|bytes| bytes.saturating_mul(rows as u64) <= MAX_INPUT_BYTES)
        .ok_or_else(|| bad(format!("{what} is larger than {MAX_INPUT_BYTES} bytes")))?;
        let count = count.unwrap_or(0) as usize;
        let data = match &given.input_data_type {
            None => return Err(bad(format!("{what} sets none of zero_data, random_data, input_data_file"))),
            // Zero bytes are zeros of every type, and empty strings as BYTES.
            Some(InputDataType::ZeroData(_)) => vec![0u8; row as usize],
            Some(InputDataType::RandomData(_)) if datatype == DataType::Bytes => vec![0u8; row as usize],
            Some(InputDataType::RandomData(_)) => random_bytes(row as usize),
            Some(InputDataType::InputDataFile(file)) => {
                read_file(model_dir, file, datatype, count, row).map_err(|why| bad(format!("{what}: {why}")))?
            }
        };
        let mut shape = Vec::with_capacity(given.dims.len() + 1);
        if spec.max_batch_size > 0 {
            shape.push(rows as i64);
        }
        shape.extend_from_slice(&given.dims);
        // A batch repeats the one row, as Triton duplicates the sample.
        let data = Bytes::from(data.repeat(rows));
        inputs.push(Some(InputTensor { name: input.name.clone(), datatype, shape, data }));
    }
    Ok(Sample { name: name.clone(), rows, runs: warmup.count.max(1), inputs })
}

/// `rows` rows of zeros for `input` (fixed dims only).
fn zeros(spec: &ModelSpec, input: &TensorSpec, rows: usize) -> Result<InputTensor, String> {
    let mut shape = Vec::with_capacity(input.dims.len() + 1);
    if spec.max_batch_size > 0 {
        shape.push(rows as i64);
    }
    shape.extend_from_slice(&input.dims);
    let elements = shape.iter().try_fold(1usize, |n, d| usize::try_from(*d).ok().and_then(|d| n.checked_mul(d)));
    let bytes = elements
        .and_then(|n| n.checked_mul(input.datatype.element_size().unwrap_or(4)))
        .filter(|b| *b as u64 <= MAX_INPUT_BYTES)
        .ok_or_else(|| format!("input '{}' has no fixed size to start from zeros", input.name))?;
    Ok(InputTensor { name: input.name.clone(), datatype: input.datatype, shape, data: Bytes::from(vec![0u8; bytes]) })
}

/// Reads `warmup/<file>` under `model_dir`: raw row-major data of `count` elements (BYTES as
/// 4-byte lengths and bytes). The name must stay inside that directory.
fn read_file(model_dir: &Path, file: &str, datatype: DataType, count: usize, row: u64) -> Result<Vec<u8>, String> {
    let relative = Path::new(file);
    if file.is_empty() || !relative.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(format!("input_data_file '{file}' must be a relative path inside the model's warmup/ directory"));
    }
    let path = model_dir.join("warmup").join(relative);
    let meta = std::fs::metadata(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.len() > MAX_INPUT_BYTES {
        return Err(format!("{} is larger than {MAX_INPUT_BYTES} bytes", path.display()));
    }
    let data = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let fits = match datatype.element_size() {
        Some(_) => data.len() as u64 == row,
        None => crate::engine::tensor::bytes_elements(&data)
            .try_fold(0usize, |n, e| e.map(|_| n + 1))
            .is_ok_and(|n| n == count),
    };
    if !fits {
        return Err(format!(
            "{} holds {} bytes, which is not {count} {} elements",
            path.display(),
            data.len(),
            datatype.config_name()
        ));
    }
    Ok(data)
}

/// Bytes from a small xorshift generator: warmup needs varied values, not secrets.
fn random_bytes(n: usize) -> Vec<u8> {
    let mut state = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
        | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Runs every sample `count` times (at least once) on `session`, asking for every output.
pub fn run(session: &mut OnnxSession, spec: &ModelSpec, samples: &[Sample]) -> Result<(), String> {
    let wanted: Vec<usize> = (0..spec.outputs.len()).collect();
    for sample in samples {
        let parts: Vec<Vec<&InputTensor>> = sample.inputs.iter().map(|i| i.iter().collect()).collect();
        for _ in 0..sample.runs {
            session
                .run(spec, &parts, sample.rows, &wanted)
                .map_err(|e| format!("model_warmup '{}' failed: {}", sample.name, e.message))?;
        }
    }
    Ok(())
}
