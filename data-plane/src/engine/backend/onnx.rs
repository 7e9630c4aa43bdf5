//! One ONNX Runtime session: load a model file, describe its IO, run a request.

use std::path::Path;

use bytes::Bytes;
use ort::environment::ThreadManager;
use ort::memory::Allocator;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::{DynTensor, DynValue, TensorElementType, ValueType};
use tessera_protocol::DataType;

use super::providers::ProviderPlan;
use crate::engine::load_error::LoadError;
use crate::engine::model_spec::{IoInfo, ModelIo, ModelSpec};
use crate::engine::ragged::RaggedSpec;
use crate::engine::tensor::{InputTensor, OutputTensor};
use crate::error::Error;

/// A loaded ONNX model; one per instance thread, since running needs `&mut`.
pub struct OnnxSession {
    session: Session,
}

/// Time spent in each phase of one run, for statistics.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunTimings {
    /// Building ORT input tensors.
    pub input_ns: u64,
    /// `Session::run`.
    pub infer_ns: u64,
    /// Copying outputs out.
    pub output_ns: u64,
}

/// Maps an ORT element type to a KServe datatype.
fn datatype_of(ty: TensorElementType) -> Option<DataType> {
    Some(match ty {
        TensorElementType::Bool => DataType::Bool,
        TensorElementType::Uint8 => DataType::Uint8,
        TensorElementType::Uint16 => DataType::Uint16,
        TensorElementType::Uint32 => DataType::Uint32,
        TensorElementType::Uint64 => DataType::Uint64,
        TensorElementType::Int8 => DataType::Int8,
        TensorElementType::Int16 => DataType::Int16,
        TensorElementType::Int32 => DataType::Int32,
        TensorElementType::Int64 => DataType::Int64,
        TensorElementType::Float16 => DataType::Fp16,
        TensorElementType::Bfloat16 => DataType::Bf16,
        TensorElementType::Float32 => DataType::Fp32,
        TensorElementType::Float64 => DataType::Fp64,
        TensorElementType::String => DataType::Bytes,
        _ => return None,
    })
}

/// Maps a KServe datatype to the ORT element type.
fn element_type_of(dt: DataType) -> TensorElementType {
    match dt {
        DataType::Bool => TensorElementType::Bool,
        DataType::Uint8 => TensorElementType::Uint8,
        DataType::Uint16 => TensorElementType::Uint16,
        DataType::Uint32 => TensorElementType::Uint32,
        DataType::Uint64 => TensorElementType::Uint64,
        DataType::Int8 => TensorElementType::Int8,
        DataType::Int16 => TensorElementType::Int16,
        DataType::Int32 => TensorElementType::Int32,
        DataType::Int64 => TensorElementType::Int64,
        DataType::Fp16 => TensorElementType::Float16,
        DataType::Bf16 => TensorElementType::Bfloat16,
        DataType::Fp32 => TensorElementType::Float32,
        DataType::Fp64 => TensorElementType::Float64,
        DataType::Bytes => TensorElementType::String,
    }
}

fn io_info(name: &str, ty: &ValueType) -> IoInfo {
    let (datatype, shape) = match ty {
        ValueType::Tensor { ty, shape, .. } => (datatype_of(*ty), shape.iter().copied().collect()),
        _ => (None, Vec::new()),
    };
    IoInfo { name: name.to_string(), datatype, shape }
}

/// Starts ONNX Runtime's intra-op pool threads (all but the one running the session, which is
/// the instance thread) as named threads with the instance priority (see [`crate::engine::priority`]).
struct IntraOpThreads;

impl ThreadManager for IntraOpThreads {
    type Thread = std::thread::JoinHandle<()>;

    fn create(&self, work: impl FnOnce() + Send + 'static) -> ort::Result<Self::Thread> {
        let run = move || {
            crate::engine::priority::apply_to_instance_thread();
            work();
        };
        std::thread::Builder::new()
            .name("ort-intra-op".to_string())
            .spawn(run)
            .map_err(|e| ort::Error::new(format!("failed to start an intra-op thread: {e}")))
    }

    fn join(thread: Self::Thread) -> ort::Result<()> {
        thread.join().map_err(|_| ort::Error::new("an intra-op thread panicked"))
    }
}

impl OnnxSession {
    /// Loads `path` with `intra_threads` intra-op threads and the plan's execution providers;
    /// `spinning` lets idle ORT threads spin (lower latency, but they burn cores the network
    /// threads need on small machines).
    /// Failures are classified: a missing execution provider is a configuration error,
    /// running out of memory a resource error, anything else ONNX Runtime's.
    pub fn load(
        path: &Path,
        intra_threads: usize,
        spinning: bool,
        providers: &ProviderPlan,
    ) -> Result<Self, LoadError> {
        let env = super::runtime::environment().map_err(LoadError::runtime)?;
        let fail = |e: String| LoadError::from_runtime(format!("failed to load ONNX model {}: {e}", path.display()));
        let builder = Session::builder(env)
            .map_err(|e| fail(e.to_string()))?
            .with_optimization_level(GraphOptimizationLevel::Level3)
            .map_err(|e| fail(e.to_string()))?
            .with_intra_threads(intra_threads)
            .map_err(|e| fail(e.to_string()))?
            .with_inter_threads(1)
            .map_err(|e| fail(e.to_string()))?
            .with_intra_op_spinning(spinning)
            .map_err(|e| fail(e.to_string()))?
            .with_inter_op_spinning(spinning)
            .map_err(|e| fail(e.to_string()))?
            .with_thread_manager(IntraOpThreads)
            .map_err(|e| fail(e.to_string()))?;
        let session = super::ep::with_providers(builder, providers)
            .map_err(LoadError::configuration)?
            .commit_from_file(path)
            .map_err(|e| match providers {
                ProviderPlan::Cpu => fail(e.to_string()),
                gpu => fail(format!("with {}: {}", gpu.describe(), super::ep::tidy(e.message()))),
            })?;
        Ok(Self { session })
    }

    /// The graph's inputs and outputs.
    pub fn io(&self) -> ModelIo {
        ModelIo {
            inputs: self.session.inputs().iter().map(|o| io_info(o.name(), o.dtype())).collect(),
            outputs: self.session.outputs().iter().map(|o| io_info(o.name(), o.dtype())).collect(),
        }
    }

    /// Runs one batch: `inputs` in model order, each a list of parts concatenated along dim 0;
    /// returns the `wanted` outputs (indices into the spec's outputs) in that order.
    pub fn run(
        &mut self,
        spec: &ModelSpec,
        inputs: &[Vec<&InputTensor>],
        batch_size: usize,
        wanted: &[usize],
    ) -> Result<(Vec<OutputTensor>, RunTimings), Error> {
        let mut timings = RunTimings::default();
        let start = std::time::Instant::now();
        let mut values: Vec<(String, DynValue)> = Vec::with_capacity(inputs.len());
        let ragged = spec.ragged.as_ref();
        for (i, (parts, tensor_spec)) in inputs.iter().zip(&spec.inputs).enumerate() {
            if parts.is_empty() {
                continue;
            }
            let shape = match ragged {
                Some(r) if r.is_ragged(i) => Some(flat_shape(parts)),
                _ => None,
            };
            let value = build_input(parts, tensor_spec.datatype, spec.max_batch_size > 0, batch_size, shape)
                .map_err(Error::internal)?;
            values.push((tensor_spec.name.clone(), value));
        }
        if let Some(r) = ragged {
            add_batch_inputs(r, inputs, &mut values)?;
        }
        let after_input = std::time::Instant::now();
        timings.input_ns = crate::engine::stats::nanos(after_input - start);
        let mut outputs = self.session.run(values).map_err(|e| run_error(&e))?;
        let after_infer = std::time::Instant::now();
        timings.infer_ns = crate::engine::stats::nanos(after_infer - after_input);
        let mut result = Vec::with_capacity(wanted.len());
        for out_spec in wanted.iter().filter_map(|i| spec.outputs.get(*i)) {
            let value = outputs
                .remove(&out_spec.name)
                .ok_or_else(|| Error::internal(format!("model produced no output '{}'", out_spec.name)))?;
            result.push(extract_output(&out_spec.name, out_spec.datatype, value).map_err(Error::internal)?);
        }
        timings.output_ns = crate::engine::stats::nanos(after_infer.elapsed());
        Ok((result, timings))
    }
}

/// The client's view of a failed run. ONNX Runtime's "invalid argument" means the inputs do not
/// suit the graph (400, as Triton's onnxruntime backend maps it); anything else is the server's
/// (500). Either way the message keeps what ORT says went wrong but not the source paths and C++
/// signatures of its build that it prefixes to it.
fn run_error(e: &ort::Error) -> Error {
    let message = format!("onnx runtime failed: {}", strip_source_locations(e.message()));
    match e.code() {
        ort::ErrorCode::InvalidArgument => Error::invalid(message),
        _ => Error::internal(message),
    }
}

/// Drops `/path/file.ext:123 <signature>` locations from an ONNX Runtime message: each source
/// path token, and the C++ signature after it up to its closing parenthesis.
pub(super) fn strip_source_locations(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message.trim_end();
    // A location may open the message: look there before looking for the next " /".
    while let Some(start) = if rest.starts_with('/') { Some(0) } else { rest.find(" /").map(|i| i + 1) } {
        let token_end = rest[start..].find(' ').map_or(rest.len(), |i| start + i);
        let is_location = rest[start..token_end].rsplit_once(':').is_some_and(|(_, line)| line.parse::<u32>().is_ok());
        if !is_location {
            out.push_str(&rest[..token_end]);
            rest = &rest[token_end..];
            continue;
        }
        out.push_str(&rest[..start]);
        let after = &rest[token_end..];
        // A signature ends at the first ")" followed by a space; keep what follows it.
        rest = match after.find(") ") {
            Some(i) if after[..i].contains('(') => after[i + 2..].trim_start(),
            _ => after.trim_start(),
        };
    }
    out.push_str(rest);
    out
}

/// The shape of a ragged input: every element of the batch, end to end.
fn flat_shape(parts: &[&InputTensor]) -> Vec<i64> {
    vec![parts.iter().map(|p| p.shape.iter().product::<i64>()).sum()]
}

/// Appends the batch's `batch_input` tensors, computed from their source inputs' shapes.
fn add_batch_inputs(
    ragged: &RaggedSpec,
    inputs: &[Vec<&InputTensor>],
    values: &mut Vec<(String, DynValue)>,
) -> Result<(), Error> {
    for batch_input in &ragged.batch_inputs {
        let parts = inputs.get(batch_input.source).map(Vec::as_slice).unwrap_or_default();
        let shapes: Vec<&[i64]> = parts.iter().map(|p| p.shape.as_slice()).collect();
        let (shape, data) = batch_input.generate(&shapes);
        // One buffer shared by every target (cloning `Bytes` copies no elements).
        let data = Bytes::from(data);
        for target in &batch_input.targets {
            let tensor = InputTensor {
                name: target.clone(),
                datatype: batch_input.datatype,
                shape: shape.clone(),
                data: data.clone(),
            };
            let value = build_input(&[&tensor], batch_input.datatype, false, 0, None).map_err(Error::internal)?;
            values.push((target.clone(), value));
        }
    }
    Ok(())
}

/// Builds one ORT tensor from request parts with a single copy (gathering along dim 0), of
/// `flat` shape when given (a ragged input).
fn build_input(
    parts: &[&InputTensor],
    datatype: DataType,
    batching: bool,
    batch: usize,
    flat: Option<Vec<i64>>,
) -> Result<DynValue, String> {
    let first = parts[0];
    let shape = match flat {
        Some(shape) => shape,
        None => {
            let mut shape = first.shape.clone();
            if batching && parts.len() > 1 {
                shape[0] = batch as i64;
            }
            shape
        }
    };
    if datatype == DataType::Bytes {
        return super::strings::build(parts, shape);
    }
    let mut tensor = DynTensor::new(&Allocator::default(), element_type_of(datatype), shape)
        .map_err(|e| format!("failed to allocate input tensor '{}': {e}", first.name))?;
    let total: usize = parts.iter().map(|p| p.data.len()).sum();
    if total == 0 {
        return Ok(tensor.into()); // zero elements: ORT may hand out no buffer at all
    }
    // SAFETY: the tensor was allocated for exactly this shape and type, whose byte size the request
    // check proved equals the summed part lengths; we write within `total` bytes.
    let dst = unsafe { std::slice::from_raw_parts_mut(tensor.data_ptr_mut().cast::<u8>(), total) };
    let mut offset = 0;
    for part in parts {
        dst[offset..offset + part.data.len()].copy_from_slice(&part.data);
        offset += part.data.len();
    }
    Ok(tensor.into())
}

/// ORT-owned output memory, kept alive by the value that owns it, viewed as bytes.
struct OrtBuffer {
    /// Owns the tensor memory `ptr` points into.
    _value: DynValue,
    ptr: *const u8,
    len: usize,
}

// SAFETY: `DynValue` is Send + Sync (ort asserts it); `ptr` only points into memory that value
// owns and that nothing mutates after the run, so sharing the view across threads is sound.
unsafe impl Send for OrtBuffer {}
// SAFETY: as above; the bytes are read-only.
unsafe impl Sync for OrtBuffer {}

impl AsRef<[u8]> for OrtBuffer {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` addresses `len` initialised bytes of tensor data owned by `_value`, which
        // lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Takes an output out of ORT without copying it: the returned bytes keep the ORT value alive.
fn extract_output(name: &str, datatype: DataType, value: DynValue) -> Result<OutputTensor, String> {
    let shape: Vec<i64> = value.shape().iter().copied().collect();
    let count = tessera_protocol::element_count(&shape).map_err(|e| e.to_string())?;
    let data = if datatype == DataType::Bytes {
        Bytes::from(super::strings::extract(&value, count).map_err(|e| format!("output '{name}': {e}"))?)
    } else {
        let len = datatype.element_size().unwrap_or(1) * count;
        let ptr = value
            .view()
            .downcast::<ort::value::DynTensorValueType>()
            .map_err(|e| format!("output '{name}' is not a tensor: {e}"))?
            .data_ptr()
            .cast::<u8>();
        Bytes::from_owner(OrtBuffer { _value: value, ptr, len })
    };
    Ok(OutputTensor { name: name.to_string(), datatype, shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_locations_leave_ort_messages_and_the_rest_stays() {
        let ort = "Non-zero status code returned while running Sub node. Name:'' Status Message: \
                   /onnxruntime_src/onnxruntime/core/providers/cpu/math/element_wise_ops.h:583 void \
                   onnxruntime::BroadcastIterator::Append(ptrdiff_t, ptrdiff_t) axis == 1 || axis == largest was \
                   false. Attempting to broadcast an axis by a dimension other than 1. 2 by 3\n";
        assert_eq!(
            strip_source_locations(ort),
            "Non-zero status code returned while running Sub node. Name:'' Status Message: axis == 1 || axis == \
             largest was false. Attempting to broadcast an axis by a dimension other than 1. 2 by 3"
        );
        let plain = "Got invalid dimensions for input: INPUT0 for the following indices index: 1 Got: 3 Expected: 16";
        assert_eq!(strip_source_locations(plain), plain);
        assert_eq!(strip_source_locations("ratio a / b at /tmp/x.onnx"), "ratio a / b at /tmp/x.onnx");
        let provider = "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:2043 onnxruntime::Provider& \
                        onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load library \
                        /opt/ort/libonnxruntime_providers_cuda.so with error: libcublasLt.so.13: cannot open";
        assert_eq!(
            strip_source_locations(provider),
            "[ONNXRuntimeError] : 1 : FAIL : Failed to load library /opt/ort/libonnxruntime_providers_cuda.so with \
             error: libcublasLt.so.13: cannot open"
        );
    }
}
