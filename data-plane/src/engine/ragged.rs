//! Ragged batching, as Triton's onnxruntime backend does it: inputs marked `allow_ragged_batch`
//! batch across requests of different shapes and reach the model as one flat 1-D tensor (the
//! requests' elements end to end, no padding); `batch_input` tensors the server computes from the
//! batch (element counts, offsets, item shapes) tell the model where each request's part lies;
//! `batch_output` with `BATCH_SCATTER_WITH_INPUT_SHAPE` splits an output back per request by the
//! shape of the request's source input.
//!
//! Models without any of these carry no [`RaggedSpec`], and the batch path pays one `Option`
//! check for it.

use tessera_protocol::DataType;
use tessera_protocol::inference::batch_input::Kind as InputKind;
use tessera_protocol::inference::batch_output::Kind as OutputKind;
use tessera_protocol::inference::{self, ModelConfig};

use crate::engine::infer::ValidInferRequest;
use crate::engine::model_spec::{IoInfo, TensorSpec};
use crate::engine::tensor::{OutputTensor, fmt_shape, row_offsets, slice_rows};
use crate::error::{Error, Result};

/// What a model's config asks of ragged batching, checked against the model.
#[derive(Debug, Clone, PartialEq)]
pub struct RaggedSpec {
    /// Per model input (spec order): whether it is fed as the flat concatenation of the batch.
    pub ragged: Vec<bool>,
    /// Tensors the server computes for each batch.
    pub batch_inputs: Vec<BatchInputSpec>,
    /// Outputs split per request by a source input's shape.
    pub scatters: Vec<Scatter>,
}

/// One `batch_input`: a tensor computed from the shapes of a source input across the batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchInputSpec {
    /// What the tensor holds.
    pub kind: InputKind,
    /// Model inputs fed with it (Triton allows several).
    pub targets: Vec<String>,
    /// INT32 or FP32.
    pub datatype: DataType,
    /// Index of the source input in the spec's inputs.
    pub source: usize,
}

/// One output scattered with `BATCH_SCATTER_WITH_INPUT_SHAPE`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scatter {
    /// Index of the output in the spec's outputs.
    pub output: usize,
    /// Index of the source input in the spec's inputs.
    pub source: usize,
    /// The output's full shape in the config (`-1` batch dim first when batching); each `-1`
    /// takes the source input's dimension at the same place.
    pub shape: Vec<i64>,
}

/// Whether the config asks for ragged batching at all.
pub fn configured(config: &ModelConfig) -> bool {
    !config.batch_input.is_empty()
        || !config.batch_output.is_empty()
        || config.input.iter().any(|i| i.allow_ragged_batch)
}

/// Whether `output` is the target of a `batch_output` (its dims need not match the model's).
pub fn is_batch_output(config: &ModelConfig, output: &str) -> bool {
    config.batch_output.iter().any(|b| b.target_name.iter().any(|t| t == output))
}

/// Triton core's checks of `batch_input` and `batch_output` (`ValidateBatchIO`), with its
/// messages (the core appends " for `<model>`").
pub fn validate_batch_io(config: &ModelConfig) -> Result<(), String> {
    validate_batch_io_inner(config).map_err(|e| format!("{e} for {}", config.name))
}

fn validate_batch_io_inner(config: &ModelConfig) -> Result<(), String> {
    let is_input = |name: &str| config.input.iter().any(|i| i.name == name);
    for b in &config.batch_input {
        let kind = InputKind::try_from(b.kind).map_err(|_| format!("unknown batch input kind '{}'", b.kind))?;
        if b.source_input.len() != 1 {
            return Err(format!(
                "batch input kind '{}' expects 1 source input, got {}",
                kind.as_str_name(),
                b.source_input.len()
            ));
        }
        let int32 = inference::DataType::TypeInt32 as i32;
        let fp32 = inference::DataType::TypeFp32 as i32;
        if b.data_type != int32 && b.data_type != fp32 {
            return Err("batch input data type must be TYPE_INT32 or TYPE_FP32".into());
        }
        if let Some(s) = b.source_input.iter().find(|s| !is_input(s)) {
            return Err(format!("unknown source input name '{s}'"));
        }
    }
    for b in &config.batch_output {
        let kind = OutputKind::try_from(b.kind).map_err(|_| format!("unknown batch output kind '{}'", b.kind))?;
        if b.source_input.len() != 1 {
            return Err(format!(
                "batch output kind '{}' expects 1 source input, got {}",
                kind.as_str_name(),
                b.source_input.len()
            ));
        }
        if let Some(s) = b.source_input.iter().find(|s| !is_input(s)) {
            return Err(format!("unknown source input name '{s}'"));
        }
        let mut seen = std::collections::HashSet::new();
        for t in &b.target_name {
            if !config.output.iter().any(|o| &o.name == t) {
                return Err(format!("unknown target output name '{t}'"));
            }
            if !seen.insert(t) {
                return Err(format!("target output name '{t}' can only be specified once"));
            }
        }
    }
    Ok(())
}

/// The onnxruntime backend's check of a ragged input: the model must take it as `[-1]`, the
/// flat concatenation, whatever its config dims; an optional input cannot be ragged.
pub fn check_ragged_input(model: &str, input: &inference::ModelInput, info: &IoInfo) -> Result<(), String> {
    if input.optional {
        return Err(format!(
            "unable to load model '{model}', configuration expects model provides input with shape [-1] for ragged \
             input '{}', which is not supported for optional input",
            input.name
        ));
    }
    if info.shape != [-1] {
        // Triton's message, double space included.
        return Err(format!(
            "unable to load model '{model}', configuration expects model provides input with shape [-1]  for ragged \
             input '{}', model provides {}",
            input.name,
            fmt_shape(&info.shape)
        ));
    }
    Ok(())
}

/// Builds the [`RaggedSpec`] of a checked model, or `None` when it batches nothing raggedly.
/// `model_inputs` are the graph's inputs: each batch input target must be one, of the batch
/// input's type (Triton finds out only when a request runs; this refuses the load instead).
pub fn spec(
    config: &ModelConfig,
    inputs: &[TensorSpec],
    outputs: &[TensorSpec],
    model_inputs: &[IoInfo],
) -> Result<Option<RaggedSpec>, String> {
    if !configured(config) {
        return Ok(None);
    }
    let index_of = |name: &str| inputs.iter().position(|i| i.name == name);
    let ragged = inputs.iter().map(|s| config.input.iter().any(|i| i.name == s.name && i.allow_ragged_batch)).collect();
    let mut batch_inputs = Vec::with_capacity(config.batch_input.len());
    for b in &config.batch_input {
        let kind = InputKind::try_from(b.kind).map_err(|_| format!("unknown batch input kind '{}'", b.kind))?;
        let datatype =
            if b.data_type == inference::DataType::TypeInt32 as i32 { DataType::Int32 } else { DataType::Fp32 };
        if b.target_name.is_empty() {
            return Err(format!("batch input of kind '{}' names no target_name", kind.as_str_name()));
        }
        for target in &b.target_name {
            check_target(target, datatype, inputs, model_inputs)?;
        }
        let source =
            index_of(&b.source_input[0]).ok_or_else(|| format!("unknown source input name '{}'", b.source_input[0]))?;
        // Every request must carry the source, or the counts would not line up with the batch.
        if inputs[source].optional {
            return Err(format!(
                "batch input source '{}' is optional; it must be in every request",
                inputs[source].name
            ));
        }
        batch_inputs.push(BatchInputSpec { kind, targets: b.target_name.clone(), datatype, source });
    }
    let batching = config.max_batch_size > 0;
    let mut scatters = Vec::new();
    for b in &config.batch_output {
        let source =
            index_of(&b.source_input[0]).ok_or_else(|| format!("unknown source input name '{}'", b.source_input[0]))?;
        for target in &b.target_name {
            let output = outputs
                .iter()
                .position(|o| &o.name == target)
                .ok_or_else(|| format!("unknown target output name '{target}'"))?;
            let spec = &outputs[output];
            let mut shape = Vec::with_capacity(spec.dims.len() + 1);
            if batching {
                shape.push(-1);
            }
            shape.extend_from_slice(&spec.dims);
            scatters.push(Scatter { output, source, shape });
        }
    }
    Ok(Some(RaggedSpec { ragged, batch_inputs, scatters }))
}

fn check_target(
    target: &str,
    datatype: DataType,
    inputs: &[TensorSpec],
    model_inputs: &[IoInfo],
) -> Result<(), String> {
    if inputs.iter().any(|i| i.name == target) {
        return Err(format!("batch input target '{target}' is also a configured input; the server provides it"));
    }
    let info = model_inputs.iter().find(|i| i.name == target).ok_or_else(|| {
        let names: Vec<String> = model_inputs.iter().map(|i| format!("'{}'", i.name)).collect();
        format!("batch input target '{target}' is not an input of the model; model inputs: [{}]", names.join(", "))
    })?;
    if info.datatype != Some(datatype) {
        return Err(format!(
            "batch input target '{target}' is {} in the configuration but {} in the model",
            datatype.config_name(),
            info.datatype.map_or("an unsupported type", |d| d.config_name())
        ));
    }
    Ok(())
}

impl RaggedSpec {
    /// Whether model input `index` is ragged.
    pub fn is_ragged(&self, index: usize) -> bool {
        self.ragged.get(index).copied().unwrap_or(false)
    }
}

/// Elements of a shape (shapes here passed the request checks, so the product fits).
fn elements(shape: &[i64]) -> i64 {
    shape.iter().product()
}

impl BatchInputSpec {
    /// The tensor (shape, little-endian bytes) for a batch whose requests' source inputs have
    /// `shapes`, in batch order; as Triton's backend utilities compute it.
    pub fn generate(&self, shapes: &[&[i64]]) -> (Vec<i64>, Vec<u8>) {
        let (shape, values) = values_of(self.kind, shapes);
        let mut bytes = Vec::with_capacity(values.len() * 4);
        for v in values {
            match self.datatype {
                DataType::Fp32 => bytes.extend_from_slice(&(v as f32).to_le_bytes()),
                _ => bytes.extend_from_slice(&(v as i32).to_le_bytes()),
            }
        }
        (shape, bytes)
    }
}

/// Shape and values of a batch input of `kind` over the source shapes.
fn values_of(kind: InputKind, shapes: &[&[i64]]) -> (Vec<i64>, Vec<i64>) {
    let counts: Vec<i64> = shapes.iter().map(|s| elements(s)).collect();
    let accumulated: Vec<i64> = counts
        .iter()
        .scan(0i64, |sum, c| {
            *sum += c;
            Some(*sum)
        })
        .collect();
    let n = shapes.len() as i64;
    match kind {
        InputKind::BatchElementCount => (vec![n], counts),
        InputKind::BatchAccumulatedElementCount => (vec![n], accumulated),
        InputKind::BatchAccumulatedElementCountWithZero => (vec![n + 1], [0].into_iter().chain(accumulated).collect()),
        // The tensor says it by its shape; Triton leaves its contents unset, here they are zeros.
        InputKind::BatchMaxElementCountAsShape => {
            let max = counts.into_iter().max().unwrap_or(0);
            (vec![max], vec![0; max as usize])
        }
        InputKind::BatchItemShape | InputKind::BatchItemShapeFlatten => {
            let rank = shapes.first().map_or(0, |s| s.len().saturating_sub(1));
            let mut values = Vec::new();
            let mut items = 0;
            for shape in shapes {
                let (batch, item) = shape.split_first().map_or((1, &[][..]), |(b, rest)| (*b, rest));
                for _ in 0..batch {
                    values.extend_from_slice(item);
                }
                items += batch;
            }
            let shape =
                if kind == InputKind::BatchItemShape { vec![items, rank as i64] } else { vec![items * rank as i64] };
            (shape, values)
        }
    }
}

/// Splits a ragged batch's outputs per request: scattered outputs by each request's source
/// input shape, the others along the first dimension by the requests' batch sizes, as usual.
/// `wanted` are the spec output indices `outputs` hold, in that order.
pub fn split(
    ragged: &RaggedSpec,
    requests: &[&ValidInferRequest],
    outputs: &[OutputTensor],
    wanted: &[usize],
) -> Result<Vec<Vec<OutputTensor>>> {
    let rows: usize = requests.iter().map(|r| r.batch_size).sum();
    let mut parts: Vec<Vec<OutputTensor>> = Vec::with_capacity(outputs.len());
    for (output, index) in outputs.iter().zip(wanted) {
        match ragged.scatters.iter().find(|s| s.output == *index) {
            Some(scatter) => parts.push(scatter_output(scatter, requests, output)?),
            None if requests.len() == 1 => parts.push(vec![output.clone()]),
            None => {
                let offsets = row_offsets(output, rows)?;
                let mut start = 0;
                let mut per = Vec::with_capacity(requests.len());
                for r in requests {
                    per.push(slice_rows(output, &offsets, start, r.batch_size));
                    start += r.batch_size;
                }
                parts.push(per);
            }
        }
    }
    // Each request gets the outputs it asked for, in its order.
    let per_request = requests
        .iter()
        .enumerate()
        .map(|(i, request)| {
            request
                .outputs
                .iter()
                .filter_map(|o| wanted.iter().position(|w| w == o))
                .map(|k| parts[k][i].clone())
                .collect()
        })
        .collect();
    Ok(per_request)
}

/// One output cut into consecutive pieces, each shaped like its request's source input.
fn scatter_output(
    scatter: &Scatter,
    requests: &[&ValidInferRequest],
    output: &OutputTensor,
) -> Result<Vec<OutputTensor>> {
    let mut offset = 0usize;
    let mut pieces = Vec::with_capacity(requests.len());
    for request in requests {
        let source = request.inputs.get(scatter.source).and_then(Option::as_ref).ok_or_else(|| {
            Error::invalid(format!("output '{}' is scattered by an input the request does not carry", output.name))
        })?;
        let shape = scatter_shape(&scatter.shape, &source.shape).ok_or_else(|| {
            Error::internal(format!(
                "output '{}' with shape {} cannot be scattered by input '{}' of shape {}",
                output.name,
                fmt_shape(&scatter.shape),
                source.name,
                fmt_shape(&source.shape)
            ))
        })?;
        let count = elements(&shape) as usize;
        let len = match output.datatype.element_size() {
            Some(size) => count.checked_mul(size),
            // BYTES elements are a 4-byte length and the bytes each: walk this piece's.
            None => string_bytes(output.data.get(offset..).unwrap_or_default(), count),
        };
        let Some(len) = len.filter(|len| offset.saturating_add(*len) <= output.data.len()) else {
            return Err(Error::internal(format!(
                "output '{}' holds {} bytes, fewer than the batch's requests need",
                output.name,
                output.data.len()
            )));
        };
        pieces.push(OutputTensor {
            name: output.name.clone(),
            datatype: output.datatype,
            shape,
            data: output.data.slice(offset..offset + len),
        });
        offset += len;
    }
    Ok(pieces)
}

/// The bytes `count` BYTES elements take at the start of `data` (each a 4-byte little-endian
/// length, then that many bytes); `None` when `data` ends first.
fn string_bytes(data: &[u8], count: usize) -> Option<usize> {
    let mut at = 0usize;
    for _ in 0..count {
        let len = u32::from_le_bytes(data.get(at..at.checked_add(4)?)?.try_into().ok()?) as usize;
        at = at.checked_add(4)?.checked_add(len)?;
        if at > data.len() {
            return None;
        }
    }
    Some(at)
}

/// The response shape of a scattered output: the config's full shape with each `-1` taken
/// from the source input's shape at the same place (`None` when the input has no such dim).
fn scatter_shape(config: &[i64], source: &[i64]) -> Option<Vec<i64>> {
    config.iter().enumerate().map(|(i, d)| if *d == -1 { source.get(i).copied() } else { Some(*d) }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_counts_and_offsets_follow_the_requests() {
        let shapes: [&[i64]; 3] = [&[1, 3], &[1, 4], &[2, 2]];
        assert_eq!(values_of(InputKind::BatchElementCount, &shapes), (vec![3], vec![3, 4, 4]));
        assert_eq!(values_of(InputKind::BatchAccumulatedElementCount, &shapes), (vec![3], vec![3, 7, 11]));
        assert_eq!(values_of(InputKind::BatchAccumulatedElementCountWithZero, &shapes), (vec![4], vec![0, 3, 7, 11]));
        assert_eq!(values_of(InputKind::BatchMaxElementCountAsShape, &shapes), (vec![4], vec![0; 4]));
    }

    #[test]
    fn item_shapes_repeat_per_batch_item() {
        let shapes: [&[i64]; 2] = [&[2, 3, 5], &[1, 4, 1]];
        let expected = vec![3, 5, 3, 5, 4, 1];
        assert_eq!(values_of(InputKind::BatchItemShape, &shapes), (vec![3, 2], expected.clone()));
        assert_eq!(values_of(InputKind::BatchItemShapeFlatten, &shapes), (vec![6], expected));
    }

    #[test]
    fn generated_tensors_are_int32_or_fp32_bytes() {
        let spec = |datatype| BatchInputSpec {
            kind: InputKind::BatchAccumulatedElementCountWithZero,
            targets: vec!["INDEX".into()],
            datatype,
            source: 0,
        };
        let shapes: [&[i64]; 2] = [&[1, 2], &[1, 5]];
        let (shape, bytes) = spec(DataType::Int32).generate(&shapes);
        assert_eq!(shape, vec![3]);
        let ints: Vec<i32> = bytes.chunks(4).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
        assert_eq!(ints, vec![0, 2, 7]);
        let (_, bytes) = spec(DataType::Fp32).generate(&shapes);
        let floats: Vec<f32> = bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
        assert_eq!(floats, vec![0.0, 2.0, 7.0]);
    }

    #[test]
    fn scatter_shapes_take_the_source_dims() {
        assert_eq!(scatter_shape(&[-1, -1], &[1, 7]), Some(vec![1, 7]));
        assert_eq!(scatter_shape(&[-1, 3], &[2, 7]), Some(vec![2, 3]));
        assert_eq!(scatter_shape(&[-1, -1, -1], &[1, 7]), None);
    }

    fn request(shape: &[i64], batch_size: usize, outputs: Vec<usize>) -> ValidInferRequest {
        let input = crate::engine::tensor::InputTensor {
            name: "X".into(),
            datatype: DataType::Fp32,
            shape: shape.to_vec(),
            data: bytes::Bytes::from(vec![0u8; elements(shape) as usize * 4]),
        };
        ValidInferRequest {
            id: String::new(),
            parameters: Default::default(),
            priority: 0,
            timeout_us: 0,
            batch_size,
            inputs: vec![Some(input)],
            outputs,
            cuda: Default::default(),
            trace: Default::default(),
        }
    }

    fn floats(t: &OutputTensor) -> Vec<f32> {
        t.data.chunks(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
    }

    #[test]
    fn split_scatters_by_input_shape_and_splits_the_rest_by_rows() {
        let ragged = RaggedSpec {
            ragged: vec![true],
            batch_inputs: Vec::new(),
            scatters: vec![Scatter { output: 0, source: 0, shape: vec![-1, -1] }],
        };
        let flat: Vec<u8> = (0..5).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let scattered = OutputTensor { name: "Y".into(), datatype: DataType::Fp32, shape: vec![5], data: flat.into() };
        let sums: Vec<u8> = [10.0f32, 20.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let per_row = OutputTensor { name: "S".into(), datatype: DataType::Fp32, shape: vec![2, 1], data: sums.into() };
        let (a, b) = (request(&[1, 2], 1, vec![0, 1]), request(&[1, 3], 1, vec![1]));
        let split = split(&ragged, &[&a, &b], &[scattered, per_row], &[0, 1]).expect("splits");
        assert_eq!(split[0].len(), 2);
        assert_eq!((split[0][0].shape.clone(), floats(&split[0][0])), (vec![1, 2], vec![0.0, 1.0]));
        assert_eq!((split[0][1].shape.clone(), floats(&split[0][1])), (vec![1, 1], vec![10.0]));
        assert_eq!(split[1].len(), 1, "the second request asked only for S");
        assert_eq!((split[1][0].name.as_str(), floats(&split[1][0])), ("S", vec![20.0]));
    }

    #[test]
    fn string_outputs_scatter_by_their_elements() {
        let ragged = RaggedSpec {
            ragged: vec![true],
            batch_inputs: Vec::new(),
            scatters: vec![Scatter { output: 0, source: 0, shape: vec![-1, -1] }],
        };
        let strings: Vec<u8> = ["a", "bc", "", "def"]
            .iter()
            .flat_map(|s| [&(s.len() as u32).to_le_bytes()[..], s.as_bytes()].concat())
            .collect();
        let out = OutputTensor { name: "Y".into(), datatype: DataType::Bytes, shape: vec![4], data: strings.into() };
        let (a, b) = (request(&[1, 1], 1, vec![0]), request(&[1, 3], 1, vec![0]));
        let pieces = split(&ragged, &[&a, &b], std::slice::from_ref(&out), &[0]).expect("splits");
        assert_eq!((pieces[0][0].shape.clone(), pieces[0][0].data.as_ref()), (vec![1, 1], &b"\x01\0\0\0a"[..]));
        assert_eq!(pieces[1][0].shape, vec![1, 3]);
        assert_eq!(pieces[1][0].data.as_ref(), &out.data[5..]);
        // Fewer strings than the requests need: an error naming the output.
        let c = request(&[1, 5], 1, vec![0]);
        let err = split(&ragged, &[&c], &[out], &[0]).expect_err("too few strings");
        assert!(err.message.contains("output 'Y'"), "{}", err.message);
        assert_eq!(string_bytes(&[1, 0, 0], 1), None, "a cut length");
        assert_eq!(string_bytes(&[9, 0, 0, 0, b'x'], 1), None, "a cut string");
        assert_eq!(string_bytes(&[], 0), Some(0));
    }

    #[test]
    fn a_short_scattered_output_is_an_error_not_a_panic() {
        let ragged = RaggedSpec {
            ragged: vec![true],
            batch_inputs: Vec::new(),
            scatters: vec![Scatter { output: 0, source: 0, shape: vec![-1, -1] }],
        };
        let short =
            OutputTensor { name: "Y".into(), datatype: DataType::Fp32, shape: vec![1], data: vec![0u8; 4].into() };
        let a = request(&[1, 2], 1, vec![0]);
        let err = split(&ragged, &[&a], &[short], &[0]).expect_err("too short");
        assert!(err.message.contains("holds 4 bytes"), "{}", err.message);
    }

    #[test]
    fn batch_io_is_validated_with_tritons_messages() {
        let refused = |text: &str, expect: &str| {
            let mut config = tessera_protocol::model_config::from_pbtxt(text).expect("parses");
            config.name = "m".into();
            let err = validate_batch_io(&config).expect_err(text);
            assert_eq!(err, format!("{expect} for m"));
        };
        let io = "input [ { name: \"X\" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ] \
                  output [ { name: \"Y\" data_type: TYPE_FP32 dims: [ -1 ] } ]";
        refused(
            &format!("{io} batch_input [ {{ kind: BATCH_ELEMENT_COUNT target_name: \"N\" data_type: TYPE_FP32 }} ]"),
            "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0",
        );
        refused(
            &format!(
                "{io} batch_input [ {{ kind: BATCH_ELEMENT_COUNT target_name: \"N\" data_type: TYPE_INT64 source_input: \"X\" }} ]"
            ),
            "batch input data type must be TYPE_INT32 or TYPE_FP32",
        );
        refused(
            &format!(
                "{io} batch_input [ {{ kind: BATCH_ITEM_SHAPE target_name: \"N\" data_type: TYPE_INT32 source_input: \"Z\" }} ]"
            ),
            "unknown source input name 'Z'",
        );
        refused(
            &format!(
                "{io} batch_output [ {{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: \"Q\" source_input: \"X\" }} ]"
            ),
            "unknown target output name 'Q'",
        );
        refused(
            &format!("{io} batch_output [ {{ target_name: [ \"Y\", \"Y\" ] source_input: \"X\" }} ]"),
            "target output name 'Y' can only be specified once",
        );
        refused(
            &format!("{io} batch_output [ {{ target_name: \"Y\" source_input: [ \"X\", \"X\" ] }} ]"),
            "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 2",
        );
    }
}
