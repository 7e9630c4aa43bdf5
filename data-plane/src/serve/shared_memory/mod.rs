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
//! CUDA regions will be a second [`RegionKind`]: Triton keeps system and CUDA regions in one
//! name space, and so does this registry.

pub mod tensors;

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::auth::Principal;
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
        Self { allow, tenants: None }
    }

    /// A worker: per-tenant name spaces, the key rule and `limits`.
    pub fn worker(allow: bool, limits: TenantLimits) -> Self {
        Self { allow, tenants: Some(limits) }
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

/// The kinds of region (CUDA joins it with the GPU issue).
#[derive(Debug)]
pub enum RegionKind {
    /// A window on a POSIX shared memory object.
    System(SystemRegion),
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

/// A region as status lists it.
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
    /// The system region, for the operations only it has.
    fn system(&self) -> &SystemRegion {
        match &self.kind {
            RegionKind::System(system) => system,
        }
    }

    /// The region's byte size.
    pub fn byte_size(&self) -> u64 {
        self.system().byte_size
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

    /// Reads `len` bytes at `offset` in the region (checked against it).
    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.check_window(offset, len)?;
        let system = self.system();
        let len = usize::try_from(len).map_err(|_| Error::invalid("shared memory byte size is too large"))?;
        let mut out = vec![0u8; len];
        system.file.read_exact_at(&mut out, system.offset + offset).map_err(|e| self.io_failed("read", &e))?;
        Ok(out)
    }

    /// Writes `data` at `offset` in the region (checked against it).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_window(offset, data.len() as u64)?;
        let system = self.system();
        system.file.write_all_at(data, system.offset + offset).map_err(|e| self.io_failed("write", &e))
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

    fn status(&self) -> RegionStatus {
        let system = self.system();
        RegionStatus {
            name: self.name.clone(),
            key: system.key.clone(),
            offset: system.offset,
            byte_size: system.byte_size,
        }
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
}

/// The owner name space of `caller`: its tenant, or the server's one (`serve`).
fn owner_of(caller: Option<&Principal>) -> &str {
    caller.map_or("", |p| p.tenant_id.as_str())
}

impl SharedMemory {
    /// An empty registry under `policy`.
    pub fn new(policy: ShmPolicy) -> Self {
        Self { policy, owners: Mutex::new(HashMap::new()) }
    }

    /// Whether clients may register and use regions.
    pub fn allowed(&self) -> bool {
        self.policy.allow
    }

    fn check_allowed(&self) -> Result<()> {
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
        let mut owners = self.owners.lock();
        let owned = owners.entry(owner.to_string()).or_default();
        if owned.regions.contains_key(name) {
            return Err(already_registered(name));
        }
        self.check_limits(owned, byte_size)?;
        owned.bytes += byte_size;
        owned.regions.insert(name.to_string(), Arc::new(region));
        Ok(())
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

    /// Unregisters `name` of `caller` (`None`: all of them). A name that is not registered is
    /// not an error, as in Triton.
    pub fn unregister(&self, caller: Option<&Principal>, name: Option<&str>) -> Result<()> {
        self.check_allowed()?;
        let owner = owner_of(caller);
        let mut owners = self.owners.lock();
        let Some(owned) = owners.get_mut(owner) else { return Ok(()) };
        match name {
            Some(name) => {
                if let Some(region) = owned.regions.remove(name) {
                    owned.bytes -= region.byte_size();
                }
            }
            None => *owned = Owned::default(),
        }
        if owned.regions.is_empty() {
            owners.remove(owner);
        }
        Ok(())
    }

    /// The status of `caller`'s region `name`, or of all of them.
    pub fn status(&self, caller: Option<&Principal>, name: Option<&str>) -> Result<Vec<RegionStatus>> {
        let owners = self.owners.lock();
        let owned = owners.get(owner_of(caller));
        match name {
            None => Ok(owned.map(|o| o.regions.values().map(|r| r.status()).collect()).unwrap_or_default()),
            Some(name) => match owned.and_then(|o| o.regions.get(name)) {
                Some(region) => Ok(vec![region.status()]),
                None => Err(Error::not_found(format!("Unable to find system shared memory region: '{name}'"))),
            },
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
