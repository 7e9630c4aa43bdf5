//! Tensors in shared memory: the `shared_memory_*` parameters of a request's inputs and
//! outputs, the inputs read out of their regions before the request is queued (one copy into
//! the input tensor, as a body's bytes are), and the outputs written into theirs once it is
//! answered. A request that names no region allocates nothing here and takes no lock.
//!
//! A tensor in a CUDA region is copied here too when the model runs in this process; when it
//! runs in a runner, the request carries a reference to the region instead
//! ([`InferRequest::cuda`]) and the runner copies (see [`crate::runner::cuda`]).

use std::sync::Arc;

use crate::auth::Principal;
use crate::engine::infer::{InferRequest, InferResponse, ParamValue, Parameters};
use crate::error::{Error, Result};
use crate::serve::shared_memory::{Kind, Region, RegionKind, SharedMemory};

/// The parameter naming a tensor's region.
pub const REGION: &str = "shared_memory_region";
/// The parameter giving the tensor's offset in the region (default 0).
pub const OFFSET: &str = "shared_memory_offset";
/// The parameter giving the tensor's byte size.
pub const BYTE_SIZE: &str = "shared_memory_byte_size";

/// Reads and writes from this size on run on the blocking pool, off the async threads.
const BLOCKING_BYTES: usize = 1 << 20;

/// Where a tensor's bytes are, as the request names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmRef {
    /// Region name.
    pub region: String,
    /// Offset in the region.
    pub offset: u64,
    /// Byte size.
    pub byte_size: u64,
}

/// An input of a request whose bytes are in a region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmInput {
    /// Its index in the request's inputs (whose `data` is empty until [`resolve`] fills it).
    pub index: usize,
    /// Where its bytes are.
    pub at: ShmRef,
}

/// The inputs of one request that are in regions (empty, unallocated, for most requests).
pub type ShmInputs = Vec<ShmInput>;

/// Whether `params` hold any shared-memory parameter.
pub fn names_shared_memory(params: &Parameters) -> bool {
    !params.is_empty() && [REGION, OFFSET, BYTE_SIZE].iter().any(|k| params.contains_key(*k))
}

/// The shared-memory parameters of `tensor`: `None` when it has none, an error (Triton's
/// words) when they are incomplete or of the wrong type.
pub fn parse(params: &Parameters, tensor: &str) -> Result<Option<ShmRef>> {
    if !names_shared_memory(params) {
        return Ok(None);
    }
    let wrong_type = |key: &str, expected: &str| {
        Error::invalid(format!("invalid value type for '{key}' parameter for tensor '{tensor}', expected {expected}"))
    };
    let region = match params.get(REGION) {
        None => None,
        Some(ParamValue::Str(s)) => Some(s.clone()),
        Some(_) => return Err(wrong_type(REGION, "a string")),
    };
    let number = |key: &str| match params.get(key) {
        None => Ok(None),
        Some(p) => p.as_u64().map(Some).ok_or_else(|| wrong_type(key, "a non-negative integer")),
    };
    let (offset, byte_size) = (number(OFFSET)?, number(BYTE_SIZE)?);
    let Some(region) = region else {
        let key = if offset.is_some() { OFFSET } else { BYTE_SIZE };
        return Err(Error::invalid(format!(
            "'{key}' can not be specified without '{REGION}' parameter for tensor '{tensor}'"
        )));
    };
    let Some(byte_size) = byte_size else {
        return Err(Error::invalid(format!(
            "'{BYTE_SIZE}' must be specified along with '{REGION}' parameter for tensor '{tensor}'"
        )));
    };
    Ok(Some(ShmRef { region, offset: offset.unwrap_or(0), byte_size }))
}

/// The outputs of one request that go to regions, each holding its region until the answer
/// is written (so unregistering it meanwhile is safe).
#[derive(Debug)]
pub struct OutputRegions {
    outputs: Vec<OutputRegion>,
}

#[derive(Debug)]
struct OutputRegion {
    name: String,
    at: ShmRef,
    region: Arc<Region>,
    /// A CUDA region the runner that runs the model writes into.
    by_runner: bool,
}

/// Reads the request's shared-memory `inputs` into their tensors and resolves the outputs it
/// asks for in regions, all in `caller`'s name space. `None` when no output goes to a region.
pub async fn resolve(
    shm: &SharedMemory,
    caller: Option<&Principal>,
    request: &mut InferRequest,
    inputs: ShmInputs,
) -> Result<Option<OutputRegions>> {
    // Inputs read here land in memory as a body's would: the same limit holds for their sum.
    let total = inputs.iter().fold(0u64, |sum, i| sum.saturating_add(i.at.byte_size));
    if total > shm.max_input_bytes() {
        return Err(Error::invalid(format!(
            "the request's inputs in shared memory hold {total} bytes, above this server's limit of {} bytes per request",
            shm.max_input_bytes()
        )));
    }
    for input in inputs {
        let region = shm.get(caller, &input.at.region)?;
        let (offset, len) = (input.at.offset, input.at.byte_size);
        if let RegionKind::Cuda(cuda) = &region.kind
            && shm.models_in_runners()
        {
            region.check_window(offset, len)?;
            if let Some(tensor) = request.inputs.get(input.index) {
                request.cuda.inputs.push((tensor.name.clone(), cuda.window(offset, len)));
            }
            continue;
        }
        let data = read(region, offset, len).await?;
        if let Some(tensor) = request.inputs.get_mut(input.index) {
            tensor.data = data.into();
        }
    }
    let mut outputs = Vec::new();
    for output in &request.outputs {
        let Some(at) = parse(&output.parameters, &output.name)? else { continue };
        let region = shm.get(caller, &at.region)?;
        region.check_window(at.offset, at.byte_size)?;
        let by_runner = match &region.kind {
            RegionKind::Cuda(cuda) if shm.models_in_runners() => {
                request.cuda.outputs.push((output.name.clone(), cuda.window(at.offset, at.byte_size)));
                true
            }
            _ => false,
        };
        outputs.push(OutputRegion { name: output.name.clone(), at, region, by_runner });
    }
    Ok((!outputs.is_empty()).then_some(OutputRegions { outputs }))
}

impl OutputRegions {
    /// Where output `name` goes, if to a region.
    pub fn find(&self, name: &str) -> Option<&ShmRef> {
        self.outputs.iter().find(|o| o.name == name).map(|o| &o.at)
    }

    /// Writes the outputs that go to regions there and leaves them without data. An output
    /// larger than its window fails the request (Triton's message) before anything is written.
    pub async fn write(&self, response: &mut InferResponse) -> Result<()> {
        for out in &response.outputs {
            if let Some(target) = self.outputs.iter().find(|o| o.name == out.name)
                && out.data.len() as u64 > target.at.byte_size
            {
                return Err(output_too_small(&out.name, target.at.byte_size, out.data.len()));
            }
        }
        for out in &mut response.outputs {
            // The runner already wrote those, and answered them without bytes.
            if let Some(target) = self.outputs.iter().find(|o| o.name == out.name && !o.by_runner) {
                let data = std::mem::take(&mut out.data);
                write(target.region.clone(), target.at.offset, data).await?;
            }
        }
        Ok(())
    }
}

/// Triton's error for an output larger than the window the request gave it.
pub fn output_too_small(name: &str, window: u64, needed: usize) -> Error {
    Error::internal(format!(
        "shared memory size specified with the request for output '{name}' ({window} bytes) should be at least \
         {needed} bytes to hold the results"
    ))
}

/// Reads a window of `region`, on the blocking pool when it is large or in CUDA (a copy
/// from the device waits for it).
async fn read(region: Arc<Region>, offset: u64, len: u64) -> Result<Vec<u8>> {
    if len < BLOCKING_BYTES as u64 && region.kind() == Kind::System {
        return region.read(offset, len);
    }
    tokio::task::spawn_blocking(move || region.read(offset, len))
        .await
        .map_err(|_| Error::internal("reading a shared memory region failed"))?
}

/// Writes `data` into `region`, on the blocking pool when it is large or in CUDA.
async fn write(region: Arc<Region>, offset: u64, data: bytes::Bytes) -> Result<()> {
    if data.len() < BLOCKING_BYTES && region.kind() == Kind::System {
        return region.write(offset, &data);
    }
    tokio::task::spawn_blocking(move || region.write(offset, &data))
        .await
        .map_err(|_| Error::internal("writing a shared memory region failed"))?
}
