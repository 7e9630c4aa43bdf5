//! Triton's classification extension: an output asked for with `classification: K` (HTTP) or a
//! `classification` parameter (gRPC, `class_count` in tritonclient) comes back as BYTES holding
//! the top K `value:index[:label]` strings per batch row, labels from the output's
//! `label_filename`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use tessera_protocol::DataType;

use crate::engine::infer::RequestedOutput;
use crate::engine::model_spec::ModelSpec;
use crate::engine::tensor::{OutputTensor, push_bytes_element};
use crate::error::{Error, Result};

/// The largest label file read (a config cannot make a worker hold more).
const MAX_LABEL_BYTES: u64 = 16 << 20;

/// Each output's labels, from its `label_filename` (one label per line).
#[derive(Debug, Default)]
pub struct Labels(HashMap<String, Arc<Vec<String>>>);

impl Labels {
    /// Reads the label files the config names, relative to the model directory `model_dir`
    /// (the parent of its version directories), as Triton does.
    pub fn load(spec: &ModelSpec, model_dir: &Path) -> std::result::Result<Self, String> {
        let mut labels = HashMap::new();
        for output in spec.config.output.iter().filter(|o| !o.label_filename.is_empty()) {
            let file = &output.label_filename;
            let relative = Path::new(file);
            if !relative.components().all(|c| matches!(c, std::path::Component::Normal(_))) {
                return Err(format!(
                    "label_filename '{file}' of output '{}' must be a file in the model directory",
                    output.name
                ));
            }
            let path = model_dir.join(relative);
            let size =
                std::fs::metadata(&path).map_err(|e| format!("cannot read label file {}: {e}", path.display()))?.len();
            if size > MAX_LABEL_BYTES {
                return Err(format!("label file {} is larger than {MAX_LABEL_BYTES} bytes", path.display()));
            }
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read label file {}: {e}", path.display()))?;
            labels.insert(output.name.clone(), Arc::new(text.lines().map(str::to_string).collect()));
        }
        Ok(Self(labels))
    }
}

/// The class count each requested output asks for (0: the plain tensor), read before the request
/// is handed over. A count that is not a non-negative integer is refused.
pub fn requested(outputs: &[RequestedOutput]) -> Result<Vec<(String, usize)>> {
    let mut counts = Vec::new();
    for out in outputs {
        let Some(p) = out.parameters.get("classification") else { continue };
        let k = p.as_u64().and_then(|k| usize::try_from(k).ok()).ok_or_else(|| {
            Error::invalid(format!(
                "parameter 'classification' of output '{}' must be a non-negative integer, got {}",
                out.name,
                p.describe()
            ))
        })?;
        if k > 0 {
            counts.push((out.name.clone(), k));
        }
    }
    Ok(counts)
}

/// Replaces each output in `counts` with its top-K class strings.
pub fn apply(
    spec: &ModelSpec,
    labels: &Labels,
    counts: &[(String, usize)],
    outputs: &mut [OutputTensor],
) -> Result<()> {
    for (name, k) in counts {
        let Some(out) = outputs.iter_mut().find(|o| &o.name == name) else { continue };
        *out = classify(out, *k, spec.max_batch_size > 0, labels.0.get(name).map(|l| l.as_slice()))?;
    }
    Ok(())
}

/// One output's top `k` classes per batch row (the whole tensor when the model does not batch).
fn classify(out: &OutputTensor, k: usize, batched: bool, labels: Option<&[String]>) -> Result<OutputTensor> {
    let values = numbers(out)?;
    let rows = if batched { out.shape.first().copied().unwrap_or(0).max(0) as usize } else { 1 };
    let per_row = values.len().checked_div(rows).unwrap_or(0);
    let take = k.min(per_row);
    let mut data = Vec::new();
    for row in values.chunks(per_row.max(1)).take(rows) {
        let mut order: Vec<usize> = (0..row.len()).collect();
        // Highest first; equal values keep index order.
        order.sort_by(|a, b| row[*b].partial_cmp(&row[*a]).unwrap_or(std::cmp::Ordering::Equal));
        for index in order.into_iter().take(take) {
            let mut class = format!("{}:{index}", row[index]);
            if let Some(label) = labels.and_then(|l| l.get(index)) {
                class.push(':');
                class.push_str(label);
            }
            push_bytes_element(&mut data, class.as_bytes())?;
        }
    }
    let shape = if batched { vec![rows as i64, take as i64] } else { vec![take as i64] };
    Ok(OutputTensor { name: out.name.clone(), datatype: DataType::Bytes, shape, data: data.into() })
}

/// A value as Triton prints it: floats with six decimals (`std::to_string`), integers as they are.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Number {
    Int(i128),
    Float(f64),
}

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Number::Int(v) => write!(f, "{v}"),
            Number::Float(v) => write!(f, "{v:.6}"),
        }
    }
}

/// The output's elements as numbers; BOOL, BYTES, FP16 and BF16 have no classes in Triton.
fn numbers(out: &OutputTensor) -> Result<Vec<Number>> {
    let d = out.data.as_ref();
    macro_rules! read {
        ($t:ty, $n:expr, $wrap:expr) => {
            d.chunks_exact($n).map(|c| $wrap(<$t>::from_le_bytes(c.try_into().unwrap_or([0; $n])))).collect()
        };
    }
    Ok(match out.datatype {
        DataType::Uint8 => read!(u8, 1, |v| Number::Int(i128::from(v))),
        DataType::Uint16 => read!(u16, 2, |v| Number::Int(i128::from(v))),
        DataType::Uint32 => read!(u32, 4, |v| Number::Int(i128::from(v))),
        DataType::Uint64 => read!(u64, 8, |v| Number::Int(i128::from(v))),
        DataType::Int8 => read!(i8, 1, |v| Number::Int(i128::from(v))),
        DataType::Int16 => read!(i16, 2, |v| Number::Int(i128::from(v))),
        DataType::Int32 => read!(i32, 4, |v| Number::Int(i128::from(v))),
        DataType::Int64 => read!(i64, 8, |v| Number::Int(i128::from(v))),
        DataType::Fp32 => read!(f32, 4, |v| Number::Float(f64::from(v))),
        DataType::Fp64 => read!(f64, 8, Number::Float),
        other => {
            return Err(Error::invalid(format!(
                "class result not available for output due to unsupported type '{other}'"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::infer::ParamValue;

    fn tensor(datatype: DataType, shape: &[i64], data: Vec<u8>) -> OutputTensor {
        OutputTensor { name: "y".into(), datatype, shape: shape.to_vec(), data: data.into() }
    }

    fn strings(out: &OutputTensor) -> Vec<String> {
        crate::engine::tensor::bytes_elements(&out.data)
            .map(|e| String::from_utf8(e.expect("element").to_vec()).expect("utf8"))
            .collect()
    }

    fn fp32(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn a_model_without_batching_classifies_the_whole_tensor() {
        let out = tensor(DataType::Fp32, &[2, 2], fp32(&[0.1, 0.4, 0.3, 0.2]));
        let labels = ["a", "b", "c"].map(String::from);
        let classes = classify(&out, 2, false, Some(&labels)).expect("classes");
        assert_eq!(classes.shape, vec![2]);
        // Index 3 has no label: the string stops at the index.
        assert_eq!(strings(&classes), ["0.400000:1:b", "0.300000:2:c"]);
        let classes = classify(&out, 9, false, None).expect("classes");
        assert_eq!(strings(&classes), ["0.400000:1", "0.300000:2", "0.200000:3", "0.100000:0"]);
    }

    #[test]
    fn each_batch_row_gets_its_own_classes_and_ties_keep_index_order() {
        let data: Vec<u8> = [5i64, 5, 1, -2, 7, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let classes = classify(&tensor(DataType::Int64, &[2, 3], data), 2, true, None).expect("classes");
        assert_eq!(classes.shape, vec![2, 2]);
        assert_eq!(strings(&classes), ["5:0", "5:1", "7:1", "0:2"]);
        let empty = classify(&tensor(DataType::Fp32, &[0, 3], Vec::new()), 2, true, None).expect("no rows");
        assert_eq!((empty.shape, empty.data.len()), (vec![0, 0], 0));
    }

    #[test]
    fn types_without_an_order_are_refused_in_tritons_words() {
        for datatype in [DataType::Bool, DataType::Bytes, DataType::Fp16, DataType::Bf16] {
            let e = classify(&tensor(datatype, &[1, 1], vec![0, 0]), 1, true, None).expect_err("refused");
            assert_eq!(
                e.message,
                format!("class result not available for output due to unsupported type '{datatype}'")
            );
        }
    }

    #[test]
    fn counts_come_from_each_requested_output() {
        let out = |name: &str, value: ParamValue| RequestedOutput {
            name: name.into(),
            parameters: [("classification".to_string(), value)].into_iter().collect(),
        };
        let counts = requested(&[out("a", ParamValue::Int(3)), out("b", ParamValue::Uint(0))]).expect("counts");
        assert_eq!(counts, vec![("a".to_string(), 3)]);
        let e = requested(&[out("a", ParamValue::Int(-1))]).expect_err("negative").message;
        assert!(e.contains("'classification' of output 'a' must be a non-negative integer, got -1"), "{e}");
    }
}
