//! CUDA IPC in the process that runs the model: clients' CUDA shared memory regions are
//! opened here (`cuIpcOpenMemHandle_v2`, once per region) and tensors are copied between them
//! and host memory (`cuMemcpyDtoHAsync`/`HtoDAsync` on a stream of this process's own in the
//! primary context of the device, then a wait for that stream, so an output is in the client's
//! memory before the answer leaves).
//!
//! `tessera serve` without `--runner` opens a region when it is registered, as Triton does. A
//! runner opens it at the first request that names it and closes it when its front says the
//! region is gone: unregistered, and no request in flight names it any more ([`CudaLease`]).
//! A handle registered under two names is opened once per device ([`CudaIpc`]).
//!
//! The copy goes through host memory: an input becomes an ordinary host tensor, which ONNX
//! Runtime copies to the device again on a GPU slice. Binding the client's device memory to
//! ONNX Runtime directly is a later optimization.
//!
//! Which device opens a handle: a process that sees exactly one CUDA device (the runner of a
//! GPU or MIG slice, whose `CUDA_VISIBLE_DEVICES` names it) opens every handle there, whatever
//! `device_id` the client registered, since the client numbers devices in its own view, which
//! the runner does not share. Otherwise (`tessera serve`, in-process or with `--runner`, seeing
//! the host's devices) `device_id` is the device to open on, as in Triton. CUDA IPC does not
//! cross MIG instances: the client's memory must be on the slice's GPU or MIG instance.
//!
//! Everything here builds and runs without CUDA: the driver library is loaded at run time and
//! touched only after [`library`] found it (cudarc panics when it is missing).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};

use cudarc::driver::{result, sys};
use parking_lot::Mutex;

/// Bytes of a `cudaIpcMemHandle_t`.
pub const HANDLE_BYTES: usize = 64;

/// A client's CUDA IPC memory handle (`cudaIpcMemHandle_t`): opaque bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcHandle(pub [u8; HANDLE_BYTES]);

impl IpcHandle {
    /// The handle in `bytes`, when they are exactly [`HANDLE_BYTES`] long.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }
}

impl std::fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The first bytes tell handles apart in logs; all 64 would only be noise.
        write!(f, "IpcHandle({}…)", hex::encode(&self.0[..8]))
    }
}

/// A registered CUDA region, as the process that opens it needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaRegionRef {
    /// Unique per registration in the front's process: a name registered again gets a new id,
    /// so a runner never confuses the new region with the old one it may still hold open.
    pub id: u64,
    /// The name the client registered it under (for messages).
    pub name: String,
    /// The IPC handle.
    pub handle: IpcHandle,
    /// The device id the client registered (see the module docs for how it maps).
    pub device_id: i64,
    /// Bytes registered.
    pub byte_size: u64,
}

/// Where one tensor's bytes are: a window of a CUDA region.
#[derive(Debug, Clone)]
pub struct CudaRef {
    /// The region.
    pub region: Arc<CudaRegionRef>,
    /// Where the window starts in the region.
    pub offset: u64,
    /// The window's length.
    pub byte_size: u64,
    /// On the front only: keeps the region's lease alive until the request is answered, so a
    /// runner is not told to close the region while the request still uses it.
    pub lease: Option<Arc<CudaLease>>,
}

/// The tensors of one request that are in CUDA regions, carried to the runner that runs the
/// model, which copies them (empty, unallocated, for nearly every request).
#[derive(Debug, Clone, Default)]
pub struct CudaIo {
    /// Inputs by name, copied from the device before the request runs (their tensors come
    /// with no bytes).
    pub inputs: Vec<(String, CudaRef)>,
    /// Outputs by name, copied to the device after it ran (answered with no bytes).
    pub outputs: Vec<(String, CudaRef)>,
}

impl CudaIo {
    /// Whether no tensor of the request is in a CUDA region.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty() && self.outputs.is_empty()
    }

    /// Where input `name` is, if in a CUDA region.
    pub fn input(&self, name: &str) -> Option<&CudaRef> {
        self.inputs.iter().find(|(n, _)| n == name).map(|(_, r)| r)
    }

    /// Where output `name` goes, if to a CUDA region.
    pub fn output(&self, name: &str) -> Option<&CudaRef> {
        self.outputs.iter().find(|(n, _)| n == name).map(|(_, r)| r)
    }
}

/// Something that opened regions and must hear when one is gone: a runner's connection.
pub trait CudaCloser: Send + Sync {
    /// Region `id` is gone: close it (a notice; nothing answers).
    fn close(&self, id: u64);
}

/// The front's hold on a registered CUDA region: the registry entry and every request that
/// names the region hold it. When the last one lets go, the region is closed in this process
/// (if it opened it) and in every runner that was sent it.
pub struct CudaLease {
    id: u64,
    /// The connections of the runners that were sent the region; a dead one is skipped.
    closers: Mutex<Vec<Weak<dyn CudaCloser>>>,
}

impl std::fmt::Debug for CudaLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaLease").field("id", &self.id).finish()
    }
}

impl CudaLease {
    /// The lease of region `id`.
    pub fn new(id: u64) -> Self {
        Self { id, closers: Mutex::new(Vec::new()) }
    }

    /// Notes that `closer` was sent the region, so that it hears when the region goes.
    pub fn sent_to(&self, closer: &Arc<dyn CudaCloser>) {
        let mut closers = self.closers.lock();
        closers.retain(|c| c.strong_count() > 0);
        if !closers.iter().any(|c| std::ptr::addr_eq(c.as_ptr(), Arc::as_ptr(closer))) {
            closers.push(Arc::downgrade(closer));
        }
    }
}

impl Drop for CudaLease {
    fn drop(&mut self) {
        global().release(self.id);
        for closer in self.closers.get_mut().drain(..) {
            if let Some(closer) = closer.upgrade() {
                closer.close(self.id);
            }
        }
    }
}

/// Why a region could not be opened or used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaError {
    /// This process has no CUDA: the reason (no driver library, `cuInit` failed, no device).
    Unavailable(String),
    /// CUDA is there but refused the region: what it said.
    Refused(String),
}

impl CudaError {
    /// The client's error for a request whose region `name` could not be opened or copied here.
    pub fn for_region(self, name: &str) -> crate::error::Error {
        match self {
            CudaError::Unavailable(why) => crate::error::Error::invalid(format!(
                "failed to use CUDA shared memory region '{name}': CUDA is not available in the process that runs \
                 the model ({why})"
            )),
            CudaError::Refused(why) => {
                tracing::debug!(region = name, error = %why, "CUDA shared memory region refused");
                crate::error::Error::invalid(format!("failed to use CUDA shared memory region '{name}': {why}"))
            }
        }
    }
}

/// Whether the CUDA driver library can be loaded here (`Err` says why not). Only loads it; the
/// front of a server whose models run in runners asks no more than this. Cached.
pub fn library() -> Result<(), String> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to load the library; no symbol is called.
    let present = *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() });
    if present { Ok(()) } else { Err("libcuda.so.1 not found".into()) }
}

/// Initialises the driver and counts the devices this process sees (`Err` says why it cannot).
/// Cached: the answer does not change during a process's life.
pub fn driver() -> Result<i32, String> {
    static COUNT: OnceLock<Result<i32, String>> = OnceLock::new();
    COUNT
        .get_or_init(|| {
            library()?;
            result::init().map_err(|e| format!("cuInit failed: {e}"))?;
            match result::device::get_count() {
                Ok(0) => Err("no CUDA device is visible".into()),
                Ok(n) => Ok(n),
                Err(e) => Err(format!("cuDeviceGetCount failed: {e}")),
            }
        })
        .clone()
}

/// The device (in this process's numbering) a region registered on `device_id` opens on, when
/// the process sees `visible` devices (see the module docs).
pub fn device_for(device_id: i64, visible: i32) -> Result<i32, String> {
    if visible == 1 {
        return Ok(0);
    }
    match i32::try_from(device_id) {
        Ok(d) if (0..visible).contains(&d) => Ok(d),
        _ => Err(format!("device id {device_id} is out of range: this process sees {visible} CUDA devices")),
    }
}

/// A device this process uses: its primary context (shared with ONNX Runtime's CUDA provider)
/// and a stream of Tessera's own for the copies.
struct Device {
    ctx: sys::CUcontext,
    stream: sys::CUstream,
}

// SAFETY: a primary context and a stream are process-wide driver objects that any thread may
// use once it made the context current; neither is ever destroyed (they live with the process).
unsafe impl Send for Device {}
// SAFETY: as above; the driver serialises what needs serialising.
unsafe impl Sync for Device {}

impl Device {
    /// Makes the device's context current on the calling thread.
    fn enter(&self) -> Result<(), CudaError> {
        // SAFETY: the context was retained in `device` and is never released.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|e| CudaError::Refused(format!("cuCtxSetCurrent: {e}")))
    }
}

/// Device `ordinal`, its primary context retained once for the life of the process.
fn device(ordinal: i32) -> Result<&'static Device, CudaError> {
    static DEVICES: OnceLock<Mutex<HashMap<i32, &'static Device>>> = OnceLock::new();
    let mut devices = DEVICES.get_or_init(Default::default).lock();
    if let Some(device) = devices.get(&ordinal) {
        return Ok(device);
    }
    let refused = |what: &str, e: result::DriverError| CudaError::Refused(format!("{what} on device {ordinal}: {e}"));
    let dev = result::device::get(ordinal).map_err(|e| refused("cuDeviceGet", e))?;
    // SAFETY: `dev` came from cuDeviceGet; the context is retained for good (never released).
    let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(|e| refused("cuDevicePrimaryCtxRetain", e))?;
    // SAFETY: the context was just retained.
    unsafe { result::ctx::set_current(ctx) }.map_err(|e| refused("cuCtxSetCurrent", e))?;
    let stream =
        result::stream::create(result::stream::StreamKind::NonBlocking).map_err(|e| refused("cuStreamCreate", e))?;
    let device: &'static Device = Box::leak(Box::new(Device { ctx, stream }));
    devices.insert(ordinal, device);
    Ok(device)
}

/// A client's region mapped into this process; closed when the last holder drops it.
pub struct Mapping {
    device: &'static Device,
    ptr: sys::CUdeviceptr,
    /// Bytes from `ptr` to the end of the client's allocation.
    available: u64,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let closed = self.device.enter().and_then(|()| {
            // SAFETY: `ptr` came from cuIpcOpenMemHandle_v2 and is closed only here, once.
            unsafe { sys::cuIpcCloseMemHandle(self.ptr) }
                .result()
                .map_err(|e| CudaError::Refused(format!("cuIpcCloseMemHandle: {e}")))
        });
        if let Err(e) = closed {
            tracing::warn!(error = ?e, "closing a CUDA shared memory region failed");
        }
    }
}

/// Opens `handle` on `device` and measures what it maps.
fn open_handle(device: &'static Device, handle: &IpcHandle) -> Result<Mapping, CudaError> {
    device.enter()?;
    let raw = sys::CUipcMemHandle { reserved: handle.0.map(|b| b as std::ffi::c_char) };
    let mut ptr: sys::CUdeviceptr = 0;
    let flags = sys::CUipcMem_flags_enum::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    // SAFETY: `ptr` is a valid out-pointer; the handle is plain bytes the driver checks.
    unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, raw, flags) }
        .result()
        .map_err(|e| CudaError::Refused(format!("cuIpcOpenMemHandle: {e}")))?;
    // From here the mapping closes itself if anything below fails.
    let mut mapping = Mapping { device, ptr, available: 0 };
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: valid out-pointers; `ptr` is a live mapping.
    unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }
        .result()
        .map_err(|e| CudaError::Refused(format!("cuMemGetAddressRange: {e}")))?;
    mapping.available = (base + size as u64).saturating_sub(ptr);
    Ok(mapping)
}

/// Opened regions in this process: by region id, and by (handle, device) so a handle
/// registered under two names is opened once.
#[derive(Default)]
struct Maps {
    by_region: HashMap<u64, Arc<Mapping>>,
    by_handle: HashMap<(IpcHandle, i32), Weak<Mapping>>,
}

/// This process's open regions.
#[derive(Default)]
pub struct CudaIpc {
    /// Held while a region is looked up or opened (opens are rare: once per region), never
    /// while one is copied.
    maps: Mutex<Maps>,
}

/// The process's [`CudaIpc`].
pub fn global() -> &'static CudaIpc {
    static GLOBAL: OnceLock<CudaIpc> = OnceLock::new();
    GLOBAL.get_or_init(CudaIpc::default)
}

impl CudaIpc {
    /// Region `region`, opened if this process has not opened it yet (blocking: call it off
    /// the async threads). Checks that the client's allocation holds the registered size.
    pub fn open(&self, region: &CudaRegionRef) -> Result<Arc<Mapping>, CudaError> {
        if let Some(mapping) = self.maps.lock().by_region.get(&region.id) {
            return Ok(mapping.clone());
        }
        let visible = driver().map_err(CudaError::Unavailable)?;
        let ordinal = device_for(region.device_id, visible).map_err(CudaError::Refused)?;
        let mut maps = self.maps.lock();
        if let Some(mapping) = maps.by_region.get(&region.id) {
            return Ok(mapping.clone());
        }
        let key = (region.handle, ordinal);
        let mapping = match maps.by_handle.get(&key).and_then(Weak::upgrade) {
            Some(mapping) => mapping,
            None => Arc::new(open_handle(device(ordinal)?, &region.handle)?),
        };
        if region.byte_size > mapping.available {
            return Err(CudaError::Refused(format!(
                "the allocation behind the handle holds {} bytes, fewer than the {} registered",
                mapping.available, region.byte_size
            )));
        }
        maps.by_handle.retain(|_, m| m.strong_count() > 0);
        maps.by_handle.insert(key, Arc::downgrade(&mapping));
        maps.by_region.insert(region.id, mapping.clone());
        Ok(mapping)
    }

    /// Forgets region `id`; its mapping closes once no copy uses it (and no other name holds
    /// the same handle). Nothing happens for a region this process never opened.
    pub fn release(&self, id: u64) {
        let mapping = self.maps.lock().by_region.remove(&id);
        // Closing happens here, outside the lock.
        drop(mapping);
    }

    /// Copies the window `at` out of its region (blocking).
    pub fn read(&self, at: &CudaRef) -> Result<Vec<u8>, CudaError> {
        let (mapping, src) = self.window(at)?;
        let len = usize::try_from(at.byte_size).map_err(|_| CudaError::Refused("the window is too large".into()))?;
        let mut out = vec![0u8; len];
        mapping.device.enter()?;
        // SAFETY: the window lies inside the mapping (checked in `window`), which `mapping`
        // keeps open; `out` outlives the copy, which is waited for before it is returned.
        unsafe {
            result::memcpy_dtoh_async(&mut out, src, mapping.device.stream)
                .and_then(|()| result::stream::synchronize(mapping.device.stream))
        }
        .map_err(|e| CudaError::Refused(format!("cuMemcpyDtoH: {e}")))?;
        Ok(out)
    }

    /// Copies `data` into its region at the window `at` (blocking; `data` must fit the window).
    pub fn write(&self, at: &CudaRef, data: &[u8]) -> Result<(), CudaError> {
        if data.len() as u64 > at.byte_size {
            return Err(CudaError::Refused("the data is larger than its window".into()));
        }
        let (mapping, dst) = self.window(at)?;
        mapping.device.enter()?;
        // SAFETY: as in `read`; the copy is waited for, so the client sees the bytes once this
        // returns and `data` outlives it.
        unsafe {
            result::memcpy_htod_async(dst, data, mapping.device.stream)
                .and_then(|()| result::stream::synchronize(mapping.device.stream))
        }
        .map_err(|e| CudaError::Refused(format!("cuMemcpyHtoD: {e}")))
    }

    /// The open mapping of `at`'s region and the device address of the window.
    fn window(&self, at: &CudaRef) -> Result<(Arc<Mapping>, sys::CUdeviceptr), CudaError> {
        let inside = at.offset.checked_add(at.byte_size).is_some_and(|end| end <= at.region.byte_size);
        if !inside {
            return Err(CudaError::Refused("the window lies outside the region".into()));
        }
        let mapping = self.open(&at.region)?;
        Ok((mapping.clone(), mapping.ptr + at.offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_exactly_64_bytes() {
        assert!(IpcHandle::from_slice(&[7; 64]).is_some());
        assert!(IpcHandle::from_slice(&[7; 63]).is_none());
        assert!(IpcHandle::from_slice(&[7; 65]).is_none());
        assert_eq!(format!("{:?}", IpcHandle([0xab; 64])), "IpcHandle(abababababababab…)");
    }

    #[test]
    fn a_process_with_one_device_opens_everything_there() {
        assert_eq!(device_for(3, 1), Ok(0), "a slice's runner: the client's numbering does not apply");
        assert_eq!(device_for(0, 1), Ok(0));
        assert_eq!(device_for(1, 2), Ok(1), "the host's view: the client's id, as in Triton");
        assert!(device_for(2, 2).is_err());
        assert!(device_for(-1, 4).is_err());
        assert!(device_for(i64::MAX, 4).unwrap_err().contains("out of range"));
    }

    #[test]
    fn without_cuda_nothing_opens_and_nothing_panics() {
        if library().is_ok() {
            return; // a machine with a driver: the GPU smoke test covers it
        }
        assert_eq!(library(), Err("libcuda.so.1 not found".to_string()));
        assert_eq!(driver(), Err("libcuda.so.1 not found".to_string()));
        let region = Arc::new(CudaRegionRef {
            id: 1,
            name: "r".into(),
            handle: IpcHandle([1; 64]),
            device_id: 0,
            byte_size: 64,
        });
        let at = CudaRef { region, offset: 0, byte_size: 8, lease: Some(Arc::new(CudaLease::new(1))) };
        let ipc = CudaIpc::default();
        assert!(matches!(ipc.read(&at), Err(CudaError::Unavailable(_))));
        assert!(matches!(ipc.write(&at, &[0; 8]), Err(CudaError::Unavailable(_))));
        ipc.release(1);
    }

    struct Counter(std::sync::atomic::AtomicU64);

    impl CudaCloser for Counter {
        fn close(&self, id: u64) {
            self.0.fetch_add(id, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn a_lease_tells_each_live_runner_once_when_the_last_holder_lets_go() {
        let runner = Arc::new(Counter(Default::default()));
        let gone: Arc<dyn CudaCloser> = Arc::new(Counter(Default::default()));
        let closer: Arc<dyn CudaCloser> = runner.clone();
        let lease = Arc::new(CudaLease::new(5));
        lease.sent_to(&closer);
        lease.sent_to(&closer);
        lease.sent_to(&gone);
        drop(gone);
        let request = lease.clone();
        drop(lease);
        assert_eq!(runner.0.load(std::sync::atomic::Ordering::Relaxed), 0, "a request still holds it");
        drop(request);
        assert_eq!(runner.0.load(std::sync::atomic::Ordering::Relaxed), 5, "told once");
    }
}
