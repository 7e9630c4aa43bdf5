//! Triton's system shared memory extension: the registry of the regions clients registered,
//! one name space per owner (the tenant on a worker, the one client of `tessera serve`), and
//! the rules a worker adds so that a tenant reaches only its own memory.
//!
//! A region is a window `[offset, offset + byte_size)` of a POSIX shared memory object the
//! client created (`shm_open`). Registering opens the object read-write, as Triton does, checks
//! the window against the object's size and keeps the descriptor. Unlike Triton, Tessera does
//! not map the object: it reads inputs and writes outputs with `pread`/`pwrite` on that
//! descriptor, so a client that shrinks its object after registering it makes a request fail
//! instead of killing the server with `SIGBUS` (which a mapping past the end of a file raises).
//!
//! Unregistering drops the registry's handle at once (the name is free again); a request that
//! already resolved the region holds an `Arc` of it, so the descriptor lives until that request
//! is answered.
//!
//! On a worker ([`ShmPolicy::worker`]) shared memory is off unless `--allow-client-shm` is
//! given; when on, a tenant may only name keys that start with `/<tenant-name>:` (POSIX names
//! are host-wide, and the worker must not become a deputy that reads or writes another tenant's
//! objects, or its host's, for whoever guesses a key), and each tenant has a cap on its regions
//! and on their bytes.
//!
//! CUDA regions are the second [`RegionKind`] ([`SharedMemory::register_cuda`]): a client's
//! CUDA IPC handle, device id and size. Triton keeps system and CUDA regions in one name space,
//! and so does this registry; status and unregister see only their own kind, as in Triton.
//! The registry keeps only the entry: the handle is opened in the process that runs the model
//! ([`crate::engine::cuda_ipc`]): here when models run in this process (`tessera serve`
//! without `--runner`: at registration, as Triton does), else in the runner that runs the
//! request, at its first use there ([`crate::runner::cuda`]). On a worker a CUDA region belongs
//! to the tenant that registered it and counts against its caps like a system region; a CUDA
//! handle is a capability its exporting process hands out, so no key rule applies.

pub mod tensors;

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::auth::Principal;
use crate::engine::cuda_ipc::{self, CudaError, CudaLease, CudaRef, CudaRegionRef, IpcHandle};
use crate::error::{Error, ErrorKind, Result};

/// Default `--client-shm-max-regions`: regions one tenant may have registered on a worker.
pub const DEFAULT_MAX_REGIONS_PER_TENANT: usize = 64;
/// Default `--client-shm-max-mib`: MiB of regions one tenant may have registered on a worker.
pub const DEFAULT_MAX_MIB_PER_TENANT: u64 = 1024;

/// Triton's answer while client shared memory is off (its `--allow-client-shm`).
const DISABLED: &str = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.";

/// Who may register regions, and how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmPolicy {
    /// Registration and use allowed (`--allow-client-shm`).
    pub allow: bool,
    /// Per-tenant caps and the key rule; `None` on `tessera serve`, which follows Triton.
    pub tenants: Option<TenantLimits>,
    /// Models run in runner processes, which open CUDA regions themselves; otherwise this
    /// process opens them when they are registered.
    pub models_in_runners: bool,
    /// Most bytes one request may read from regions into memory here: the server's request
    /// size limit, which a body could not pass either.
    pub max_input_bytes: u64,
}

/// What one tenant may register on a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantLimits {
    /// Regions registered at once.
    pub max_regions: usize,
    /// Bytes of all its regions together.
    pub max_bytes: u64,
}

impl ShmPolicy {
    /// `tessera serve`: Triton's behaviour, one name space, no caps; `allow` off answers as
    /// Triton does with `--allow-client-shm=false`.
    pub fn serve(allow: bool) -> Self {
        Self { allow, tenants: None, models_in_runners: false, max_input_bytes: u64::MAX }
    }

    /// A worker: per-tenant name spaces, the key rule and `limits`; models run in runners.
    pub fn worker(allow: bool, limits: TenantLimits) -> Self {
        Self { allow, tenants: Some(limits), models_in_runners: true, max_input_bytes: u64::MAX }
    }

    /// Notes whether models run in runner processes (`tessera serve --runner`).
    pub fn with_models_in_runners(mut self, in_runners: bool) -> Self {
        self.models_in_runners = in_runners;
        self
    }

    /// Caps the bytes one request reads from regions (the server's request size limit).
    pub fn with_max_input_bytes(mut self, bytes: u64) -> Self {
        self.max_input_bytes = bytes;
        self
    }
}

/// One registered region.
#[derive(Debug)]
pub struct Region {
    /// The name the client registered it under.
    pub name: String,
    /// Where its bytes are.
    pub kind: RegionKind,
}

/// The kinds of region.
#[derive(Debug)]
pub enum RegionKind {
    /// A window on a POSIX shared memory object.
    System(SystemRegion),
    /// A client's CUDA allocation, by its IPC handle.
    Cuda(CudaRegion),
}

/// A client's CUDA allocation: what the process that runs the model needs to open it, and the
/// lease that closes it there once the region is gone.
#[derive(Debug)]
pub struct CudaRegion {
    /// Id, name, handle, device id, size.
    pub info: Arc<CudaRegionRef>,
    /// Held by this entry and by every request that names the region.
    pub lease: Arc<CudaLease>,
}

impl CudaRegion {
    /// The window `[offset, offset + byte_size)`, holding the lease.
    pub fn window(&self, offset: u64, byte_size: u64) -> CudaRef {
        CudaRef { region: self.info.clone(), offset, byte_size, lease: Some(self.lease.clone()) }
    }
}

/// Which kind of region a status or unregister call is about (Triton's separate routes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// System shared memory.
    System,
    /// CUDA shared memory.
    Cuda,
}

/// A window on a POSIX shared memory object, read and written through its descriptor.
#[derive(Debug)]
pub struct SystemRegion {
    /// The object's name, as registered.
    pub key: String,
    /// Where the window starts in the object.
    pub offset: u64,
    /// The window's length.
    pub byte_size: u64,
    file: File,
}

/// A CUDA region as status lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaRegionStatus {
    /// Name.
    pub name: String,
    /// The device id the client registered.
    pub device_id: u64,
    /// Length.
    pub byte_size: u64,
}

/// A system region as status lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStatus {
    /// Name.
    pub name: String,
    /// Key of the object.
    pub key: String,
    /// Offset in the object.
    pub offset: u64,
    /// Length.
    pub byte_size: u64,
}

impl Region {
    /// The region's kind.
    pub fn kind(&self) -> Kind {
        match &self.kind {
            RegionKind::System(_) => Kind::System,
            RegionKind::Cuda(_) => Kind::Cuda,
        }
    }

    /// The region's byte size.
    pub fn byte_size(&self) -> u64 {
        match &self.kind {
            RegionKind::System(system) => system.byte_size,
            RegionKind::Cuda(cuda) => cuda.info.byte_size,
        }
    }

    /// Checks that `[offset, offset + len)` lies inside the region (Triton's messages; a region
    /// is never empty, so offset 0 always passes the first check).
    pub fn check_window(&self, offset: u64, len: u64) -> Result<()> {
        let size = self.byte_size();
        if offset >= size {
            return Err(Error::invalid(format!("Invalid offset for shared memory region: '{}'", self.name)));
        }
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::invalid(format!(
                "Invalid offset + byte size for shared memory region: '{}'",
                self.name
            )));
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` in the region (checked against it). Blocking; a CUDA
    /// region is read through this process's mapping of it (models that run here).
    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.check_window(offset, len)?;
        let system = match &self.kind {
            RegionKind::System(system) => system,
            RegionKind::Cuda(cuda) => {
                return cuda_ipc::global().read(&cuda.window(offset, len)).map_err(|e| e.for_region(&self.name));
            }
        };
        let len = usize::try_from(len).map_err(|_| Error::invalid("shared memory byte size is too large"))?;
        let mut out = vec![0u8; len];
        system.file.read_exact_at(&mut out, system.offset + offset).map_err(|e| self.io_failed("read", &e))?;
        Ok(out)
    }

    /// Writes `data` at `offset` in the region (checked against it). Blocking, as [`Self::read`].
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_window(offset, data.len() as u64)?;
        match &self.kind {
            RegionKind::System(system) => {
                system.file.write_all_at(data, system.offset + offset).map_err(|e| self.io_failed("write", &e))
            }
            RegionKind::Cuda(cuda) => cuda_ipc::global()
                .write(&cuda.window(offset, data.len() as u64), data)
                .map_err(|e| e.for_region(&self.name)),
        }
    }

    /// A read or write that failed although the window checked out: the client shrank or
    /// broke its object after registering it.
    fn io_failed(&self, what: &str, e: &std::io::Error) -> Error {
        tracing::debug!(region = %self.name, error = %e, "shared memory {what} failed");
        Error::invalid(format!(
            "failed to {what} shared memory region '{}': the object is smaller than when it was registered",
            self.name
        ))
    }

    fn status(&self) -> Option<RegionStatus> {
        let RegionKind::System(system) = &self.kind else { return None };
        Some(RegionStatus {
            name: self.name.clone(),
            key: system.key.clone(),
            offset: system.offset,
            byte_size: system.byte_size,
        })
    }

    fn cuda_status(&self) -> Option<CudaRegionStatus> {
        let RegionKind::Cuda(cuda) = &self.kind else { return None };
        // Registration refuses negative ids, so the cast keeps the value.
        Some(CudaRegionStatus {
            name: self.name.clone(),
            device_id: cuda.info.device_id as u64,
            byte_size: cuda.info.byte_size,
        })
    }
}

/// One owner's regions.
#[derive(Debug, Default)]
struct Owned {
    /// By name (sorted, so status lists them in a stable order).
    regions: BTreeMap<String, Arc<Region>>,
    /// Sum of their byte sizes.
    bytes: u64,
}

/// The registry: every owner's regions.
#[derive(Debug)]
pub struct SharedMemory {
    policy: ShmPolicy,
    /// Regions by owner (tenant id; "" on `serve`). Held for a lookup or a change of the map
    /// only, never while a region is opened, read or written.
    owners: Mutex<HashMap<String, Owned>>,
    /// Numbers CUDA registrations ([`CudaRegionRef::id`]).
    next_cuda_id: AtomicU64,
}

/// The owner name space of `caller`: its tenant, or the server's one (`serve`).
fn owner_of(caller: Option<&Principal>) -> &str {
    caller.map_or("", |p| p.tenant_id.as_str())
}

impl SharedMemory {
    /// An empty registry under `policy`.
    pub fn new(policy: ShmPolicy) -> Self {
        if policy.allow {
            // Looks for the CUDA driver now, at start-up, rather than in the first request
            // that asks (the answer is cached).
            let _ = cuda_ipc::library();
        }
        Self { policy, owners: Mutex::new(HashMap::new()), next_cuda_id: AtomicU64::new(1) }
    }

    /// Whether clients may register and use regions.
    pub fn allowed(&self) -> bool {
        self.policy.allow
    }

    /// Whether clients may register CUDA regions: shared memory is allowed and the CUDA driver
    /// is here (the front's check; a runner without CUDA fails the requests that use one).
    pub fn cuda_allowed(&self) -> bool {
        self.policy.allow && cuda_ipc::library().is_ok()
    }

    /// Whether models run in runner processes, which open CUDA regions themselves.
    pub fn models_in_runners(&self) -> bool {
        self.policy.models_in_runners
    }

    /// Most bytes one request may read from regions into memory here.
    pub fn max_input_bytes(&self) -> u64 {
        self.policy.max_input_bytes
    }

    /// Refuses with Triton's message while client shared memory is off.
    pub fn check_allowed(&self) -> Result<()> {
        if self.policy.allow { Ok(()) } else { Err(Error::unsupported(DISABLED)) }
    }

    /// Registers `[offset, offset + byte_size)` of the object `key` as `name` for `caller`.
    pub fn register(
        &self,
        caller: Option<&Principal>,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<()> {
        self.check_allowed()?;
        if name.is_empty() {
            return Err(Error::invalid("'region name' is necessary to register system shared memory region"));
        }
        self.check_key(caller, name, key)?;
        let owner = owner_of(caller);
        if self.owners.lock().get(owner).is_some_and(|o| o.regions.contains_key(name)) {
            return Err(already_registered(name));
        }
        let file = open_object(key)?;
        check_object_size(&file, name, key, offset, byte_size)?;
        let region = Region {
            name: name.to_string(),
            kind: RegionKind::System(SystemRegion { key: key.to_string(), offset, byte_size, file }),
        };
        self.insert(owner, region)
    }

    /// Adds `region` to `owner`'s regions, unless its name was taken meanwhile or the owner's
    /// caps forbid it.
    fn insert(&self, owner: &str, region: Region) -> Result<()> {
        let mut owners = self.owners.lock();
        let owned = owners.entry(owner.to_string()).or_default();
        if owned.regions.contains_key(&region.name) {
            return Err(already_registered(&region.name));
        }
        self.check_limits(owned, region.byte_size())?;
        owned.bytes += region.byte_size();
        owned.regions.insert(region.name.clone(), Arc::new(region));
        Ok(())
    }

    /// Registers a client's CUDA allocation (its IPC `handle`, on its device `device_id`) as
    /// `name` for `caller`. The arguments are checked first; then, where models run here, the
    /// handle is opened at once (Triton's behaviour), else only the presence of the CUDA
    /// driver is checked and the runner opens it at first use.
    pub async fn register_cuda(
        &self,
        caller: Option<&Principal>,
        name: &str,
        handle: IpcHandle,
        device_id: i64,
        byte_size: u64,
    ) -> Result<()> {
        self.check_allowed()?;
        if name.is_empty() {
            return Err(Error::invalid("'region name' is necessary to register cuda shared memory region"));
        }
        if byte_size == 0 {
            return Err(Error::invalid(format!("failed to register shared memory region '{name}': invalid args")));
        }
        if device_id < 0 {
            return Err(Error::invalid(format!(
                "failed to register CUDA shared memory region: '{name}', invalid device id {device_id}"
            )));
        }
        let owner = owner_of(caller);
        if let Some(owned) = self.owners.lock().get(owner) {
            if owned.regions.contains_key(name) {
                return Err(already_registered(name));
            }
            self.check_limits(owned, byte_size)?;
        }
        let id = self.next_cuda_id.fetch_add(1, Ordering::Relaxed);
        let info = Arc::new(CudaRegionRef { id, name: name.to_string(), handle, device_id, byte_size });
        // Dropped on any failure below, which closes what was opened.
        let lease = Arc::new(CudaLease::new(id));
        self.check_cuda(&info).await?;
        self.insert(owner, Region { name: name.to_string(), kind: RegionKind::Cuda(CudaRegion { info, lease }) })
    }

    /// Checks that a CUDA region can be used: opens it where models run here, else checks
    /// that the driver is present. On the blocking pool: loading the driver and opening a
    /// handle wait on it.
    async fn check_cuda(&self, info: &Arc<CudaRegionRef>) -> Result<()> {
        let (info, in_runners) = (info.clone(), self.policy.models_in_runners);
        let name = info.name.clone();
        let checked = tokio::task::spawn_blocking(move || {
            if in_runners {
                return cuda_ipc::library().map_err(CudaError::Unavailable);
            }
            let visible = cuda_ipc::driver().map_err(CudaError::Unavailable)?;
            if info.device_id >= i64::from(visible) {
                return Err(CudaError::Refused(format!(
                    "device id {} is out of range: this server sees {visible} CUDA device(s)",
                    info.device_id
                )));
            }
            cuda_ipc::global().open(&info).map(drop)
        })
        .await
        .map_err(|_| Error::internal("registering a CUDA shared memory region failed"))?;
        checked.map_err(|e| match e {
            CudaError::Unavailable(why) => Error::invalid(format!(
                "failed to register CUDA shared memory region: '{name}', GPUs not supported: CUDA is not available \
                 on this server ({why})"
            )),
            CudaError::Refused(why) => {
                Error::invalid(format!("failed to register shared memory region '{name}': invalid args ({why})"))
            }
        })
    }

    /// On a worker, a key must start with `/<tenant-name>:` (see the module docs).
    fn check_key(&self, caller: Option<&Principal>, name: &str, key: &str) -> Result<()> {
        let (Some(_), Some(principal)) = (self.policy.tenants, caller) else { return Ok(()) };
        let prefix = tenant_key_prefix(&principal.tenant_name);
        let rest = key.strip_prefix(&prefix).unwrap_or("");
        if rest.is_empty() || rest.contains('/') {
            return Err(Error::invalid(format!(
                "cannot register shared memory region '{name}' with key '{key}': on this server a key must \
                 start with '{prefix}', the caller's tenant name, and name an object after it"
            )));
        }
        Ok(())
    }

    /// Refuses a registration that would take the owner past its caps (workers).
    fn check_limits(&self, owned: &Owned, byte_size: u64) -> Result<()> {
        let Some(limits) = self.policy.tenants else { return Ok(()) };
        if owned.regions.len() >= limits.max_regions {
            return Err(Error::new(
                ErrorKind::TooManyRequests,
                format!(
                    "the tenant has {} shared memory regions registered on this server, its limit \
                     (--client-shm-max-regions); unregister one first",
                    limits.max_regions
                ),
            ));
        }
        if owned.bytes.saturating_add(byte_size) > limits.max_bytes {
            return Err(Error::new(
                ErrorKind::TooManyRequests,
                format!(
                    "registering {byte_size} more bytes of shared memory would take the tenant past its \
                     limit of {} bytes on this server (--client-shm-max-mib); {} are registered",
                    limits.max_bytes, owned.bytes
                ),
            ));
        }
        Ok(())
    }

    /// Unregisters `caller`'s region `name` of `kind` (`None`: all of that kind). A name that
    /// is not registered, or is of the other kind, is left alone without an error, as in Triton.
    pub fn unregister(&self, caller: Option<&Principal>, kind: Kind, name: Option<&str>) -> Result<()> {
        self.check_allowed()?;
        let owner = owner_of(caller);
        let mut removed = Vec::new();
        let mut owners = self.owners.lock();
        let Some(owned) = owners.get_mut(owner) else { return Ok(()) };
        let names: Vec<String> = match name {
            Some(name) => {
                owned.regions.get(name).filter(|r| r.kind() == kind).map(|_| name.to_string()).into_iter().collect()
            }
            None => owned.regions.iter().filter(|(_, r)| r.kind() == kind).map(|(n, _)| n.clone()).collect(),
        };
        for name in names {
            if let Some(region) = owned.regions.remove(&name) {
                owned.bytes -= region.byte_size();
                removed.push(region);
            }
        }
        if owned.regions.is_empty() {
            owners.remove(owner);
        }
        drop(owners);
        release_off_thread(removed);
        Ok(())
    }

    /// The status of `caller`'s system region `name`, or of all of them.
    pub fn status(&self, caller: Option<&Principal>, name: Option<&str>) -> Result<Vec<RegionStatus>> {
        self.statuses(caller, Kind::System, name, Region::status)
    }

    /// The status of `caller`'s CUDA region `name`, or of all of them.
    pub fn cuda_status(&self, caller: Option<&Principal>, name: Option<&str>) -> Result<Vec<CudaRegionStatus>> {
        self.statuses(caller, Kind::Cuda, name, Region::cuda_status)
    }

    /// The regions of `kind` as `row` lists them, with Triton's errors for a name that is
    /// unknown or of the other kind.
    fn statuses<T>(
        &self,
        caller: Option<&Principal>,
        kind: Kind,
        name: Option<&str>,
        row: fn(&Region) -> Option<T>,
    ) -> Result<Vec<T>> {
        let owners = self.owners.lock();
        let owned = owners.get(owner_of(caller));
        let Some(name) = name else {
            return Ok(owned.map(|o| o.regions.values().filter_map(|r| row(r)).collect()).unwrap_or_default());
        };
        let (this, other) = match kind {
            Kind::System => ("system", "CUDA"),
            Kind::Cuda => ("CUDA", "system"),
        };
        match owned.and_then(|o| o.regions.get(name)) {
            Some(region) => row(region).map(|r| vec![r]).ok_or_else(|| {
                Error::not_found(format!(
                    "The region named '{name}' is registered as {other} shared memory, not {this} shared memory"
                ))
            }),
            None => {
                let this = if kind == Kind::Cuda { "cuda" } else { this };
                Err(Error::not_found(format!("Unable to find {this} shared memory region: '{name}'")))
            }
        }
    }

    /// `caller`'s region `name`, for a request that reads or writes it.
    pub fn get(&self, caller: Option<&Principal>, name: &str) -> Result<Arc<Region>> {
        self.check_allowed()?;
        let owners = self.owners.lock();
        owners
            .get(owner_of(caller))
            .and_then(|o| o.regions.get(name))
            .cloned()
            .ok_or_else(|| Error::not_found(format!("Unable to find shared memory region: '{name}'")))
    }
}

/// The prefix a tenant's keys carry on a worker. Tenant names are lower-case letters, digits,
/// `-`, `_` and `.`, so the `:` after the name ends it: tenant `acme` cannot name the keys of
/// tenant `acme-b`.
pub fn tenant_key_prefix(tenant_name: &str) -> String {
    format!("/{tenant_name}:")
}

/// Drops unregistered regions; CUDA ones close their mappings here (in-process), which waits
/// on the device, so that happens on the blocking pool when there is one.
fn release_off_thread(removed: Vec<Arc<Region>>) {
    let cuda = removed.iter().any(|r| r.kind() == Kind::Cuda);
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if cuda => drop(runtime.spawn_blocking(move || drop(removed))),
        _ => drop(removed),
    }
}

fn already_registered(name: &str) -> Error {
    Error::new(ErrorKind::AlreadyExists, format!("shared memory region '{name}' already in manager"))
}

/// Opens the POSIX shared memory object `key` read-write (close-on-exec: runner processes
/// must not inherit tenants' objects).
fn open_object(key: &str) -> Result<File> {
    let unable = || Error::internal(format!("Unable to open shared memory region: '{key}'"));
    let c_key = CString::new(key).map_err(|_| unable())?;
    // SAFETY: a NUL-terminated name that outlives the call; no memory is shared with the callee.
    let fd = unsafe { libc::shm_open(c_key.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0) };
    if fd < 0 {
        tracing::debug!(key, error = %std::io::Error::last_os_error(), "shm_open failed");
        return Err(unable());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Checks that the window fits in the object (a regular file of the shared memory file system).
fn check_object_size(file: &File, name: &str, key: &str, offset: u64, byte_size: u64) -> Result<()> {
    let invalid = || Error::internal(format!("Invalid shared memory region: '{key}'"));
    let meta = file.metadata().map_err(|_| invalid())?;
    if !meta.is_file() {
        return Err(invalid());
    }
    let fits = offset.checked_add(byte_size).is_some_and(|end| end <= meta.len());
    if byte_size == 0 || !fits {
        return Err(Error::invalid(format!("failed to register shared memory region '{name}': invalid args")));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
