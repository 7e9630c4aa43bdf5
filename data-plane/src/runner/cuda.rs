//! CUDA shared memory across the front ↔ runner boundary. The front keeps only the registry
//! entry (handle, device id, size); a request whose tensors are in CUDA regions carries
//! references to them ([`CudaIo`]) to the runner that runs the model, which opens each region
//! once ([`cuda_ipc::global`]), copies the inputs device → host before the request runs and the
//! outputs host → device after, and answers those outputs without bytes. When a region is gone
//! (unregistered, and no request names it) its lease tells every runner that was sent it to
//! close it ([`ToRunner::CudaRelease`]).
//!
//! Whether a runner has CUDA is learnt at the first request that names a region there: a
//! runner without it (a CPU-only slice, a host without the driver) answers that request with
//! a clear error; registration on the front could only check that the front has the driver.

use std::sync::Arc;

use tokio::time::Instant;

use super::conn::RunnerConn;
use super::wire::ToRunner;
use crate::engine::cuda_ipc::{self, CudaCloser, CudaIo, CudaRef};
use crate::engine::infer::ValidInferRequest;
use crate::engine::model::LoadedModel;
use crate::engine::stats::{FailReason, nanos};
use crate::engine::tensor::{OutputTensor, check_data_size, checked_element_count};
use crate::error::{Error, Result};
use crate::serve::shared_memory::tensors::output_too_small;

impl CudaCloser for RunnerConn {
    fn close(&self, id: u64) {
        // A runner already gone took its mappings with it: nothing to tell.
        self.notify(&ToRunner::CudaRelease { id });
    }
}

/// On the front, before a request goes to a runner: each CUDA region it names will tell this
/// runner when it is gone.
pub fn sent_to(cuda: &CudaIo, conn: &Arc<RunnerConn>) {
    if cuda.is_empty() {
        return;
    }
    let closer: Arc<dyn CudaCloser> = conn.clone();
    for (_, at) in cuda.inputs.iter().chain(&cuda.outputs) {
        if let Some(lease) = &at.lease {
            lease.sent_to(&closer);
        }
    }
}

/// On the front, for a runner's answer: an output without bytes must be one the request asked
/// for in a CUDA region (the runner wrote it there), or one that has no bytes to have.
pub fn check_answer(cuda: &CudaIo, outputs: &[OutputTensor]) -> Result<()> {
    for out in outputs.iter().filter(|o| o.data.is_empty()) {
        if cuda.output(&out.name).is_some() {
            continue;
        }
        let count = checked_element_count(&out.name, &out.shape)?;
        if check_data_size(&out.name, out.datatype, count, &[]).is_err() {
            tracing::warn!(output = %out.name, "a runner answered an output without its bytes");
            return Err(Error::internal(format!("the runner answered output '{}' without its data", out.name)));
        }
    }
    Ok(())
}

/// In the runner: runs a checked request, first copying its inputs out of their CUDA regions
/// and afterwards its outputs into theirs. A request without CUDA tensors just runs.
pub async fn run_valid(model: &LoadedModel, mut request: ValidInferRequest) -> Result<Vec<OutputTensor>> {
    if request.cuda.is_empty() {
        return model.run_valid(request).await;
    }
    let started = Instant::now();
    let cuda = std::mem::take(&mut request.cuda);
    if let Err(e) = copy_in(&mut request, cuda.inputs).await {
        // The model never saw the request; count it as the batcher counts its failures.
        model.stats.record_failure_reason(FailReason::Other);
        model.stats.fail.record(nanos(started.elapsed()));
        return Err(e);
    }
    let mut outputs = model.run_valid(request).await?;
    copy_out(&mut outputs, cuda.outputs).await?;
    Ok(outputs)
}

/// Fills the inputs in CUDA regions (which came without bytes) and checks what arrived.
async fn copy_in(request: &mut ValidInferRequest, inputs: Vec<(String, CudaRef)>) -> Result<()> {
    if inputs.is_empty() {
        return Ok(());
    }
    let copied = blocking(move || {
        inputs.into_iter().map(|(name, at)| read(&at).map(|data| (name, data))).collect::<Result<Vec<_>>>()
    })
    .await?;
    for (name, data) in copied {
        let Some(tensor) = request.inputs.iter_mut().flatten().find(|t| t.name == name) else { continue };
        let count = checked_element_count(&name, &tensor.shape)?;
        check_data_size(&name, tensor.datatype, count, &data)?;
        tensor.data = data.into();
    }
    Ok(())
}

/// Writes the outputs asked for in CUDA regions there and leaves them without bytes. An output
/// larger than its window fails the request (Triton's message) before anything is written.
async fn copy_out(outputs: &mut [OutputTensor], targets: Vec<(String, CudaRef)>) -> Result<()> {
    if targets.is_empty() {
        return Ok(());
    }
    for (name, at) in &targets {
        if let Some(out) = outputs.iter().find(|o| &o.name == name)
            && out.data.len() as u64 > at.byte_size
        {
            return Err(output_too_small(name, at.byte_size, out.data.len()));
        }
    }
    let mut writes = Vec::with_capacity(targets.len());
    for (name, at) in targets {
        if let Some(out) = outputs.iter_mut().find(|o| o.name == name) {
            writes.push((at, std::mem::take(&mut out.data)));
        }
    }
    blocking(move || {
        writes
            .iter()
            .try_for_each(|(at, data)| cuda_ipc::global().write(at, data).map_err(|e| e.for_region(&at.region.name)))
    })
    .await
}

/// In the runner: the front says region `id` is gone. Closing waits for the device, so it
/// happens on the blocking pool (after any copy still using the region).
pub fn release(id: u64) {
    tokio::task::spawn_blocking(move || cuda_ipc::global().release(id));
}

/// Runs a copy on the blocking pool: the driver waits for the device.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|_| Error::internal("a CUDA shared memory copy failed"))?
}

fn read(at: &CudaRef) -> Result<Vec<u8>> {
    cuda_ipc::global().read(at).map_err(|e| e.for_region(&at.region.name))
}

#[cfg(test)]
mod tests {
    use tessera_protocol::DataType;

    use super::*;
    use crate::engine::cuda_ipc::{CudaRegionRef, IpcHandle};

    fn output(name: &str, data: Vec<u8>) -> OutputTensor {
        OutputTensor { name: name.into(), datatype: DataType::Fp32, shape: vec![2], data: data.into() }
    }

    #[test]
    fn only_outputs_asked_for_in_cuda_may_come_back_without_bytes() {
        let region = CudaRegionRef { id: 1, name: "g".into(), handle: IpcHandle([0; 64]), device_id: 0, byte_size: 8 };
        let at = CudaRef { region: Arc::new(region), offset: 0, byte_size: 8, lease: None };
        let cuda = CudaIo { inputs: Vec::new(), outputs: vec![("A".into(), at)] };
        check_answer(&cuda, &[output("A", Vec::new()), output("B", vec![0; 8])]).expect("A went to CUDA");
        let e = check_answer(&cuda, &[output("B", Vec::new())]).expect_err("B has bytes to have");
        assert_eq!(e.message, "the runner answered output 'B' without its data");
        let mut empty = output("C", Vec::new());
        empty.shape = vec![0];
        check_answer(&CudaIo::default(), &[empty]).expect("nothing to have");
    }
}
