//! The share of the machine a runner gets: CPU affinity, memory limit, nice value, and its
//! device (none, the host's, or one GPU or MIG instance with a GPU memory cap).
//!
//! The worker spawns one runner per (tenant, slice). Before spawning it calls [`prepare_memory`],
//! which picks how the slice's memory is enforced, in this order:
//!
//! 1. a cgroup v2 child of the worker's own cgroup with `memory.max`, when the unified hierarchy
//!    has the memory controller and the worker's `cgroup.subtree_control` can enable it;
//! 2. a cgroup v1 child of the worker's own memory cgroup with `memory.limit_in_bytes`;
//! 3. `RLIMIT_DATA`, set in the child between fork and exec.
//!
//! Runner cgroups always sit beneath the worker's cgroup, never at a hierarchy's root: in a pod
//! the worker's cgroup is the pod's, and the root belongs to the host. With a cgroup the kernel's
//! OOM killer acts within it, so a model that allocates past the limit kills its runner and
//! nothing else. [`child_setup`] builds the `pre_exec` hook that joins that cgroup (so the
//! runner's first allocation is already charged to it) or sets the rlimit, pins the CPUs and sets
//! the nice value.

use std::ffi::{CStr, CString};
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Prefix of every runner cgroup's directory name, so a leftover is recognisable as ours.
const CGROUP_PREFIX: &str = "tessera-runner-";
/// Longest sanitised name, keeping the directory name well under NAME_MAX (255).
const MAX_NAME_LEN: usize = 200;
/// One more than the highest CPU id accepted: Linux's largest NR_CPUS is 8192.
const MAX_CPUS: usize = 8192;
/// How many times `rmdir` is tried: the kernel refuses (EBUSY) until the last task is released.
const RMDIR_ATTEMPTS: u32 = 50;
/// Pause between `rmdir` attempts; with [`RMDIR_ATTEMPTS`] about 100 ms in all.
const RMDIR_PAUSE: Duration = Duration::from_millis(2);

/// What a slice allows its runner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceLimits {
    /// Cores the runner is pinned to; empty means no pinning.
    pub cpus: Vec<usize>,
    /// Hard memory limit in bytes; `None` means unlimited.
    pub memory_bytes: Option<u64>,
    /// Nice value (-20..=19); `None` inherits the worker's.
    pub nice: Option<i32>,
    /// The GPU side: which device the runner sees.
    pub device: super::device::SliceDevice,
}

/// How the memory limit is enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryEnforcement {
    /// `memory.max` of this cgroup v2 directory.
    CgroupV2(PathBuf),
    /// `memory.limit_in_bytes` of this cgroup v1 directory.
    CgroupV1(PathBuf),
    /// `RLIMIT_DATA` of this many bytes, set in the child before exec.
    Rlimit(u64),
    /// No memory limit.
    Unlimited,
}

impl MemoryEnforcement {
    /// One phrase for the runner's start-up log line.
    pub fn describe(&self) -> String {
        match self {
            Self::CgroupV2(dir) => format!("cgroup v2 memory.max in {}", dir.display()),
            Self::CgroupV1(dir) => format!("cgroup v1 memory.limit_in_bytes in {}", dir.display()),
            Self::Rlimit(bytes) => format!("RLIMIT_DATA of {bytes} bytes (no writable memory cgroup)"),
            Self::Unlimited => "no memory limit".to_string(),
        }
    }
}

/// Creates the runner's cgroup when `memory_bytes` is set, and says how the limit applies.
///
/// Keep the returned cgroup alive as long as the runner (dropping it removes the directory) and
/// pass the enforcement to [`child_setup`]. Without a writable memory cgroup this falls back to
/// [`MemoryEnforcement::Rlimit`].
pub fn prepare_memory(
    name: &str,
    memory_bytes: Option<u64>,
) -> Result<(Option<RunnerCgroup>, MemoryEnforcement), String> {
    let Some(bytes) = memory_bytes else {
        return Ok((None, MemoryEnforcement::Unlimited));
    };
    Ok(match RunnerCgroup::create(name, bytes)? {
        Some(cgroup) => {
            let enforcement = cgroup.enforcement();
            (Some(cgroup), enforcement)
        }
        None => (None, MemoryEnforcement::Rlimit(bytes)),
    })
}

/// The two cgroup interfaces this module writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CgroupVersion {
    V1,
    V2,
}

/// A runner's cgroup (v1 or v2), removed (rmdir, retried briefly since the kernel needs the procs gone) on drop.
///
/// Dropping may block for up to about 100 ms while the kernel releases the runner's tasks: drop
/// it after the runner has been reaped, or off the async runtime.
#[derive(Debug)]
pub struct RunnerCgroup {
    dir: PathBuf,
    version: CgroupVersion,
    /// Set by [`RunnerCgroup::remove`] so `Drop` does not try again.
    removed: bool,
}

impl RunnerCgroup {
    /// Creates `<worker's cgroup>/tessera-runner-<name>` with the memory limit.
    ///
    /// Ok(None) when no writable memory controller exists. `name` is sanitised: characters
    /// outside `[A-Za-z0-9_.-]` become `_`.
    ///
    /// A directory left by a crashed worker is reused when it holds no processes; if it still
    /// does (an orphaned runner), this fails rather than share the limit with it.
    pub fn create(name: &str, memory_bytes: u64) -> Result<Option<Self>, String> {
        if memory_bytes == 0 {
            return Err("a memory limit of 0 bytes would kill the runner at once".to_string());
        }
        let (Some(own), Some(mountinfo)) =
            (read_optional(Path::new("/proc/self/cgroup"))?, read_optional(Path::new("/proc/self/mountinfo"))?)
        else {
            return Ok(None);
        };
        let memberships = parse_proc_cgroup(&own);
        let mounts = parse_mountinfo(&mountinfo);
        let dir_name = format!("{CGROUP_PREFIX}{}", sanitise_name(name));
        if let Some(parent) = worker_cgroup_dir(&mounts, &memberships, CgroupVersion::V2)
            && let Some(cgroup) = Self::create_v2(&parent, &dir_name, memory_bytes)?
        {
            return Ok(Some(cgroup));
        }
        match worker_cgroup_dir(&mounts, &memberships, CgroupVersion::V1) {
            Some(parent) => Self::create_in(&parent, &dir_name, CgroupVersion::V1, memory_bytes),
            None => Ok(None),
        }
    }

    /// Moves `pid` into it (write to cgroup.procs).
    ///
    /// Memory the process touched before the move stays charged where it was (cgroup v1 does not
    /// move charges by default), so prefer joining from the child with [`child_setup`].
    pub fn add(&self, pid: u32) -> Result<(), String> {
        // The kernel reads pid 0 as "the writer", which would move the worker itself.
        if pid == 0 {
            return Err(format!("refusing to move pid 0 (the worker itself) into {}", self.dir.display()));
        }
        write_file(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    /// How many times the kernel's OOM killer fired in it; None when unknown.
    ///
    /// Read from `oom_kill` in v1's `memory.oom_control` or v2's `memory.events`.
    pub fn oom_kills(&self) -> Option<u64> {
        let file = match self.version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        let text = fs::read_to_string(self.dir.join(file)).ok()?;
        flat_key(&text, "oom_kill")
    }

    /// How the memory limit is enforced by this cgroup.
    pub fn enforcement(&self) -> MemoryEnforcement {
        match self.version {
            CgroupVersion::V1 => MemoryEnforcement::CgroupV1(self.dir.clone()),
            CgroupVersion::V2 => MemoryEnforcement::CgroupV2(self.dir.clone()),
        }
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Removes the cgroup now, reporting a failure that `Drop` would only log.
    pub fn remove(mut self) -> Result<(), String> {
        self.removed = true;
        remove_cgroup_dir(&self.dir)
    }

    /// Enables the memory controller for the worker's children, then creates the cgroup.
    fn create_v2(parent: &Path, dir_name: &str, memory_bytes: u64) -> Result<Option<Self>, String> {
        let available = fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
        if !available.split_whitespace().any(|c| c == "memory") {
            return Ok(None);
        }
        let subtree = parent.join("cgroup.subtree_control");
        let enabled = fs::read_to_string(&subtree).unwrap_or_default();
        if !enabled.split_whitespace().any(|c| c == "memory")
            && let Err(error) = write_file(&subtree, "+memory")
        {
            // Usually EBUSY: v2's no-internal-process rule forbids enabling a controller for the
            // children of a cgroup that holds processes, and the worker lives in this one.
            tracing::warn!(%error, "cannot enable the cgroup v2 memory controller for runners");
            return Ok(None);
        }
        Self::create_in(parent, dir_name, CgroupVersion::V2, memory_bytes)
    }

    /// Creates (or reuses) `parent/dir_name` and writes the limit; Ok(None) when not permitted.
    fn create_in(parent: &Path, dir_name: &str, version: CgroupVersion, bytes: u64) -> Result<Option<Self>, String> {
        let dir = parent.join(dir_name);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => check_leftover(&dir)?,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM | libc::EROFS)) => {
                tracing::warn!(path = %dir.display(), error = %e, "cannot create a runner memory cgroup");
                return Ok(None);
            }
            Err(e) => return Err(format!("creating {}: {e}", dir.display())),
        }
        // From here on `Drop` removes the directory if writing the limit fails.
        let cgroup = Self { dir, version, removed: false };
        match version {
            CgroupVersion::V1 => cgroup.limit_v1(bytes)?,
            CgroupVersion::V2 => cgroup.limit_v2(bytes)?,
        }
        Ok(Some(cgroup))
    }

    fn limit_v1(&self, bytes: u64) -> Result<(), String> {
        let value = bytes.to_string();
        let limit = self.dir.join("memory.limit_in_bytes");
        let memsw = self.dir.join("memory.memsw.limit_in_bytes");
        // The kernel keeps memory+swap >= memory: lowering a reused cgroup's limit needs the
        // memory limit lowered first, raising it needs memory+swap raised first. Try memory first
        // and retry it after memory+swap.
        let first = write_file(&limit, &value);
        // memory+swap equal to memory means the runner cannot swap: the limit is hard. The file
        // exists only with swap accounting.
        if memsw.exists() {
            write_file(&memsw, &value)?;
        }
        if first.is_err() {
            write_file(&limit, &value)?;
        }
        // A new v1 memcg inherits oom_kill_disable from its parent; with it set, a runner past its
        // limit would hang instead of being killed.
        write_file(&self.dir.join("memory.oom_control"), "0")
    }

    fn limit_v2(&self, bytes: u64) -> Result<(), String> {
        write_file(&self.dir.join("memory.max"), &bytes.to_string())?;
        // Without swap the limit is hard, as on v1 with memory+swap; the file exists only when
        // swap is accounted.
        let swap = self.dir.join("memory.swap.max");
        if swap.exists() {
            write_file(&swap, "0")?;
        }
        // Kill every process of the runner together, so none is left half-working.
        let group = self.dir.join("memory.oom.group");
        if group.exists() {
            write_file(&group, "1")?;
        }
        Ok(())
    }
}

impl Drop for RunnerCgroup {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        if let Err(error) = remove_cgroup_dir(&self.dir) {
            tracing::warn!(%error, "runner cgroup left behind");
        }
    }
}

/// `rmdir`s a cgroup, retrying while the kernel still counts its tasks; a missing one is fine.
fn remove_cgroup_dir(dir: &Path) -> Result<(), String> {
    let mut attempt = 1;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempt < RMDIR_ATTEMPTS => {
                attempt += 1;
                std::thread::sleep(RMDIR_PAUSE);
            }
            Err(e) => return Err(format!("removing {}: {e}", dir.display())),
        }
    }
}

/// Accepts a leftover runner cgroup only when no process is in it.
fn check_leftover(dir: &Path) -> Result<(), String> {
    let procs = read_file(&dir.join("cgroup.procs"))?;
    let pids: Vec<&str> = procs.split_whitespace().collect();
    if pids.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} is left over from an earlier runner and still holds pids {}; stop them or remove the cgroup",
        dir.display(),
        pids.join(",")
    ))
}

/// Keeps `[A-Za-z0-9_.-]` and replaces everything else with `_`, so a tenant or slice name
/// cannot escape the worker's cgroup or clash with the kernel's own files.
fn sanitise_name(name: &str) -> String {
    name.chars()
        .take(MAX_NAME_LEN)
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '_' })
        .collect()
}

/// One line of `/proc/self/cgroup`: `hierarchy-id:controllers:path`.
#[derive(Debug, PartialEq, Eq)]
struct Membership {
    hierarchy: String,
    controllers: Vec<String>,
    path: String,
}

fn parse_proc_cgroup(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let hierarchy = fields.next()?.to_string();
            let controllers = fields.next()?.split(',').filter(|c| !c.is_empty()).map(str::to_string).collect();
            let path = fields.next()?.to_string();
            Some(Membership { hierarchy, controllers, path })
        })
        .collect()
}

/// A cgroup mount from `/proc/self/mountinfo`.
#[derive(Debug, PartialEq, Eq)]
struct CgroupMount {
    /// The cgroup the mount shows at its mount point (not `/` when a subtree is bind-mounted).
    root: String,
    mount_point: PathBuf,
    version: CgroupVersion,
    /// v1 controllers bound to the hierarchy; empty for v2.
    controllers: Vec<String>,
    read_only: bool,
}

/// Reads the cgroup mounts from mountinfo(5) lines:
/// `id parent major:minor root mount-point options [optional...] - fstype source super-options`.
fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let (fstype, _source, super_options) = (right.next()?, right.next()?, right.next().unwrap_or(""));
            let version = match fstype {
                "cgroup" => CgroupVersion::V1,
                "cgroup2" => CgroupVersion::V2,
                _ => return None,
            };
            let controllers = match version {
                CgroupVersion::V1 => super_options.split(',').map(str::to_string).collect(),
                CgroupVersion::V2 => Vec::new(),
            };
            Some(CgroupMount {
                root: unescape_mountinfo(left.get(3)?),
                mount_point: PathBuf::from(unescape_mountinfo(left.get(4)?)),
                version,
                controllers,
                read_only: left.get(5)?.split(',').any(|o| o == "ro"),
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space and so on).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal =
            bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The worker's own cgroup directory in the hierarchy that can carry a memory limit, if mounted
/// read-write and not the hierarchy's root.
fn worker_cgroup_dir(mounts: &[CgroupMount], memberships: &[Membership], version: CgroupVersion) -> Option<PathBuf> {
    let membership = memberships.iter().find(|m| match version {
        CgroupVersion::V2 => m.hierarchy == "0" && m.controllers.is_empty(),
        CgroupVersion::V1 => m.controllers.iter().any(|c| c == "memory"),
    })?;
    // At "/" the worker is at the root of the hierarchy (or of its cgroup namespace, which we
    // cannot tell apart from the host's root): never create runner cgroups there.
    if membership.path == "/" || !membership.path.starts_with('/') {
        return None;
    }
    mounts
        .iter()
        .filter(|m| m.version == version && !m.read_only)
        .filter(|m| version == CgroupVersion::V2 || m.controllers.iter().any(|c| c == "memory"))
        .find_map(|m| {
            let relative = if m.root == "/" {
                membership.path.as_str()
            } else {
                let rest = membership.path.strip_prefix(m.root.as_str())?;
                if !(rest.is_empty() || rest.starts_with('/')) {
                    return None;
                }
                rest
            };
            Some(m.mount_point.join(relative.trim_start_matches('/')))
        })
}

/// The number after `key` in a flat-keyed cgroup file (`key value` per line).
fn flat_key(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == key).then(|| words.next()?.parse().ok()).flatten()
    })
}

/// Reads a file, `None` when it does not exist (not Linux, or /proc not mounted).
fn read_optional(path: &Path) -> Result<Option<String>, String> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

fn read_file(path: &Path) -> Result<String, String> {
    fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// Writes `value` to an existing control file; never creates one (cgroupfs refuses that anyway).
fn write_file(path: &Path, value: &str) -> Result<(), String> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut file| file.write_all(value.as_bytes()))
        .map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

/// Prepares what the child must do between fork and exec.
///
/// That is: join the runner's cgroup or set the rlimit, pin the CPUs, set the nice value.
/// Pass the result to `CommandExt::pre_exec` (std or tokio). Everything is computed here, before
/// the fork; the closure itself only makes raw syscalls and allocates nothing, so it is
/// async-signal-safe. Joining the cgroup from the child, instead of [`RunnerCgroup::add`] after
/// the spawn, charges every page the runner ever touches to its cgroup.
pub fn child_setup(
    limits: &SliceLimits,
    memory: &MemoryEnforcement,
) -> Result<impl FnMut() -> io::Result<()> + Send + Sync + 'static, String> {
    let affinity = cpu_mask(&limits.cpus)?;
    if let Some(nice) = limits.nice
        && !(-20..=19).contains(&nice)
    {
        return Err(format!("nice value {nice} is outside -20..=19"));
    }
    let nice = limits.nice;
    let cgroup_procs = match memory {
        MemoryEnforcement::CgroupV1(dir) | MemoryEnforcement::CgroupV2(dir) => {
            let procs = dir.join("cgroup.procs");
            Some(
                CString::new(procs.as_os_str().as_bytes())
                    .map_err(|_| format!("{} contains a NUL", procs.display()))?,
            )
        }
        MemoryEnforcement::Rlimit(_) | MemoryEnforcement::Unlimited => None,
    };
    let rlimit = match memory {
        MemoryEnforcement::Rlimit(bytes) => Some(data_rlimit(*bytes)),
        _ => None,
    };
    Ok(move || {
        // Join first, so that everything after (and the exec itself) is charged to the cgroup.
        if let Some(procs) = &cgroup_procs {
            join_cgroup(procs)?;
        }
        if let Some(limit) = &rlimit {
            set_rlimit_data(limit)?;
        }
        if let Some(mask) = &affinity {
            set_affinity(mask)?;
        }
        if let Some(nice) = nice {
            set_nice(nice)?;
        }
        Ok(())
    })
}

/// A kernel CPU mask (an array of longs) for `cpus`; `None` when no pinning is asked for. Sized to
/// the highest CPU rather than `cpu_set_t`, which stops at 1024.
fn cpu_mask(cpus: &[usize]) -> Result<Option<Vec<libc::c_ulong>>, String> {
    let Some(&highest) = cpus.iter().max() else {
        return Ok(None);
    };
    if highest >= MAX_CPUS {
        return Err(format!("cpu {highest} is beyond the largest Linux supports ({})", MAX_CPUS - 1));
    }
    let bits = libc::c_ulong::BITS as usize;
    let mut mask = vec![0 as libc::c_ulong; highest / bits + 1];
    for &cpu in cpus {
        mask[cpu / bits] |= 1 << (cpu % bits);
    }
    Ok(Some(mask))
}

/// The `RLIMIT_DATA` to set for `bytes`, capped at the worker's own hard limit, which an
/// unprivileged child could not raise.
///
/// `RLIMIT_DATA`, not `RLIMIT_AS`: the address-space limit counts every reservation, and a runner
/// reserves far more than it uses (glibc reserves 64 MiB per malloc arena, ONNX Runtime's thread
/// pools 8 MiB stacks each, plus the mapped libraries and the shared request rings), so an AS limit
/// near the slice's memory would fail allocations long before the runner used that much. Since
/// Linux 4.7 the data limit counts private writable mappings (heap and anonymous `mmap`, where
/// weights and tensors live) and skips `PROT_NONE` reservations, file-backed text and `MAP_SHARED`
/// rings. It still counts virtual, not resident, memory, which is why it is only the fallback.
fn data_rlimit(bytes: u64) -> libc::rlimit {
    let mut current = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: `current` is a valid rlimit for the kernel to fill.
    let known = unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut current) } == 0;
    let wanted = bytes as libc::rlim_t;
    let hard = if known { wanted.min(current.rlim_max) } else { wanted };
    libc::rlimit { rlim_cur: hard, rlim_max: hard }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs`.
fn join_cgroup(procs: &CStr) -> io::Result<()> {
    // SAFETY: `procs` is NUL-terminated; open, write and close are async-signal-safe syscalls.
    let fd = unsafe { libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // The kernel reads "0" as the writing process, so the child need not format its own pid.
    // SAFETY: writes one byte from a static buffer to the fd opened above.
    let written = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
    let result = match written {
        1 => Ok(()),
        n if n < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::ErrorKind::WriteZero.into()),
    };
    // SAFETY: closes the fd opened above, once.
    unsafe { libc::close(fd) };
    result
}

fn set_rlimit_data(limit: &libc::rlimit) -> io::Result<()> {
    // SAFETY: `limit` points to a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_DATA, limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_affinity(mask: &[libc::c_ulong]) -> io::Result<()> {
    // SAFETY: the kernel reads `size_of_val(mask)` bytes, all of `mask`; it accepts a mask of any
    // whole number of longs (sched_setaffinity(2)), so it need not be a full `cpu_set_t`.
    let rc = unsafe { libc::sched_setaffinity(0, size_of_val(mask), mask.as_ptr().cast::<libc::cpu_set_t>()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_nice(nice: i32) -> io::Result<()> {
    // Nice is per thread on Linux; the child has one thread here, and the runner's threads inherit it.
    // SAFETY: a plain syscall on the calling process.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Parses a cpu list like "0-3,6" (as in cpuset files / slice inventories) into core ids, with a clear error.
///
/// The ids come back sorted without duplicates; blank input (an empty cpuset file) is no cores.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let list = s.trim();
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (first, last) = match part.split_once('-') {
            Some((first, last)) => (parse_cpu_id(first, list)?, parse_cpu_id(last, list)?),
            None => {
                let id = parse_cpu_id(part, list)?;
                (id, id)
            }
        };
        if first > last {
            return Err(format!("cpu list {list:?}: range {:?} runs backwards", part.trim()));
        }
        cpus.extend(first..=last);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

fn parse_cpu_id(text: &str, list: &str) -> Result<usize, String> {
    let text = text.trim();
    let id = (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse::<usize>().ok())
        .flatten()
        .ok_or_else(|| format!("cpu list {list:?}: {text:?} is not a cpu id"))?;
    if id >= MAX_CPUS {
        return Err(format!("cpu list {list:?}: cpu {id} is beyond the largest Linux supports ({})", MAX_CPUS - 1));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Child, Command, Stdio};

    use proptest::prelude::*;

    use super::*;

    const MIB: u64 = 1 << 20;

    /// Set (to anything) on machines known to have a writable memory cgroup, so that a missing one
    /// fails the tests instead of skipping them.
    const REQUIRE_ENV: &str = "TESSERA_REQUIRE_CGROUP_TESTS";

    /// A runner cgroup unique to this test process, or `None` (with the reason on stderr) where
    /// the machine has no writable memory cgroup.
    fn test_cgroup(tag: &str, bytes: u64) -> Option<RunnerCgroup> {
        let name = format!("test-{}-{tag}", std::process::id());
        match RunnerCgroup::create(&name, bytes) {
            Ok(Some(cgroup)) => {
                eprintln!("{tag}: using {}", cgroup.enforcement().describe());
                Some(cgroup)
            }
            Ok(None) if std::env::var_os(REQUIRE_ENV).is_some() => {
                panic!("{tag}: no writable memory cgroup, but {REQUIRE_ENV} is set")
            }
            Ok(None) => {
                eprintln!("skipping {tag}: no writable memory cgroup on this machine");
                None
            }
            Err(e) => panic!("{tag}: {e}"),
        }
    }

    /// The worker's cgroup path for the hierarchy `cgroup` lives in, as /proc/self/cgroup says.
    fn own_cgroup_path(cgroup: &RunnerCgroup) -> String {
        let text = fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup exists, or create found nothing");
        let memberships = parse_proc_cgroup(&text);
        let membership = memberships
            .iter()
            .find(|m| match cgroup.version {
                CgroupVersion::V1 => m.controllers.iter().any(|c| c == "memory"),
                CgroupVersion::V2 => m.hierarchy == "0",
            })
            .expect("create used one of these memberships");
        membership.path.clone()
    }

    /// Spawns `command` with `child_setup(limits, memory)` as its pre-exec hook.
    fn spawn_with(command: &mut Command, limits: &SliceLimits, memory: &MemoryEnforcement) -> Child {
        let setup = child_setup(limits, memory).expect("valid limits");
        // SAFETY: the hook only makes async-signal-safe syscalls (see `child_setup`).
        unsafe { command.pre_exec(setup) };
        command.spawn().expect("spawn the child")
    }

    fn kill(mut child: Child) {
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn parse_cpu_list_accepts_lists() {
        assert_eq!(parse_cpu_list("0-3,6"), Ok(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("5"), Ok(vec![5]));
        assert_eq!(parse_cpu_list("0-1\n"), Ok(vec![0, 1]));
        assert_eq!(parse_cpu_list(" 0 - 1 , 4 "), Ok(vec![0, 1, 4]));
        assert_eq!(parse_cpu_list("3,1,1-2"), Ok(vec![1, 2, 3]));
        assert_eq!(parse_cpu_list("2-2"), Ok(vec![2]));
        assert_eq!(parse_cpu_list(""), Ok(vec![]));
        assert_eq!(parse_cpu_list("\n"), Ok(vec![]));
    }

    #[test]
    fn parse_cpu_list_rejects_bad_input() {
        for (input, expected) in [
            ("3-1", "runs backwards"),
            ("a", "\"a\" is not a cpu id"),
            ("1-", "\"\" is not a cpu id"),
            ("-1", "\"\" is not a cpu id"),
            ("1,,2", "\"\" is not a cpu id"),
            ("+1", "\"+1\" is not a cpu id"),
            ("1-2-3", "\"2-3\" is not a cpu id"),
            ("0-7:2", "\"7:2\" is not a cpu id"),
            ("99999999999999999999999", "is not a cpu id"),
            ("0-8192", "cpu 8192 is beyond"),
        ] {
            let error = parse_cpu_list(input).expect_err(input);
            assert!(error.contains(expected), "{input:?}: {error}");
            assert!(error.contains(&format!("{:?}", input.trim())), "{input:?}: {error} names the list");
        }
    }

    /// Writes `cpus` the way the kernel does: ascending runs as `a-b`, joined by commas.
    fn format_cpu_list(cpus: &std::collections::BTreeSet<usize>) -> String {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for &cpu in cpus {
            match runs.last_mut() {
                Some((_, last)) if *last + 1 == cpu => *last = cpu,
                _ => runs.push((cpu, cpu)),
            }
        }
        let parts: Vec<String> =
            runs.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
        parts.join(",")
    }

    proptest! {
        #[test]
        fn parse_cpu_list_round_trips(cpus in proptest::collection::btree_set(0usize..MAX_CPUS, 0..64)) {
            let parsed = parse_cpu_list(&format_cpu_list(&cpus)).expect("a kernel-formatted list parses");
            prop_assert_eq!(parsed, cpus.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn names_are_sanitised() {
        assert_eq!(sanitise_name("acme/resnet:v1 slice-0.a_b"), "acme_resnet_v1_slice-0.a_b");
        assert_eq!(sanitise_name("../../etc"), ".._.._etc");
        assert_eq!(sanitise_name("é"), "_");
        assert_eq!(sanitise_name(&"x".repeat(500)).len(), MAX_NAME_LEN);
    }

    /// This machine's shape: v1 controllers under /sys/fs/cgroup/<ctrl>, an empty cgroup2.
    const V1_MOUNTINFO: &str = "\
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
34 30 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
35 30 0:31 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const V1_PROC_CGROUP: &str = "4:memory:/process_api/abc\n1:cpu:/\n0::/\n";

    #[test]
    fn finds_the_v1_memory_cgroup() {
        let (mounts, own) = (parse_mountinfo(V1_MOUNTINFO), parse_proc_cgroup(V1_PROC_CGROUP));
        assert_eq!(mounts.len(), 3, "only cgroup mounts: {mounts:?}");
        assert_eq!(
            worker_cgroup_dir(&mounts, &own, CgroupVersion::V1),
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        // The worker sits at the v2 root: never create runner cgroups there.
        assert_eq!(worker_cgroup_dir(&mounts, &own, CgroupVersion::V2), None);
    }

    #[test]
    fn finds_the_v2_cgroup() {
        let mountinfo = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        let own = parse_proc_cgroup("0::/kubepods/pod1/ctr\n");
        let mounts = parse_mountinfo(mountinfo);
        assert_eq!(
            worker_cgroup_dir(&mounts, &own, CgroupVersion::V2),
            Some(PathBuf::from("/sys/fs/cgroup/kubepods/pod1/ctr"))
        );
        assert_eq!(worker_cgroup_dir(&mounts, &own, CgroupVersion::V1), None);
    }

    #[test]
    fn honours_bind_mounted_roots_escapes_and_read_only_mounts() {
        let own = parse_proc_cgroup("7:memory:/docker/id/sub\n");
        let bind = "50 40 0:30 /docker/id /sys/fs/cgroup/my\\040mem rw - cgroup cgroup rw,memory\n";
        assert_eq!(
            worker_cgroup_dir(&parse_mountinfo(bind), &own, CgroupVersion::V1),
            Some(PathBuf::from("/sys/fs/cgroup/my mem/sub"))
        );
        let elsewhere = "50 40 0:30 /docker/i /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(worker_cgroup_dir(&parse_mountinfo(elsewhere), &own, CgroupVersion::V1), None);
        let read_only = "50 40 0:30 / /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup ro,memory\n";
        assert_eq!(worker_cgroup_dir(&parse_mountinfo(read_only), &own, CgroupVersion::V1), None);
        let other_controller = "50 40 0:30 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(worker_cgroup_dir(&parse_mountinfo(other_controller), &own, CgroupVersion::V1), None);
    }

    #[test]
    fn reads_oom_kill_counts() {
        assert_eq!(flat_key("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"), Some(3));
        assert_eq!(flat_key("low 0\nhigh 0\nmax 5\noom 2\noom_kill 1\noom_group_kill 0\n", "oom_kill"), Some(1));
        assert_eq!(flat_key("oom_kill_disable 0\nunder_oom 0\n", "oom_kill"), None);
    }

    #[test]
    fn describes_each_enforcement() {
        let dir = PathBuf::from("/sys/fs/cgroup/memory/w/tessera-runner-a");
        assert_eq!(
            MemoryEnforcement::CgroupV1(dir.clone()).describe(),
            "cgroup v1 memory.limit_in_bytes in /sys/fs/cgroup/memory/w/tessera-runner-a"
        );
        assert!(MemoryEnforcement::CgroupV2(dir).describe().starts_with("cgroup v2 memory.max in "));
        assert_eq!(MemoryEnforcement::Rlimit(5).describe(), "RLIMIT_DATA of 5 bytes (no writable memory cgroup)");
        assert_eq!(MemoryEnforcement::Unlimited.describe(), "no memory limit");
    }

    #[test]
    fn creates_runner_cgroup_beneath_own_cgroup() {
        let Some(cgroup) = test_cgroup("create", 64 * MIB) else { return };
        let dir = cgroup.path().to_path_buf();
        let own = own_cgroup_path(&cgroup);
        assert_ne!(own, "/", "never at the hierarchy's root");
        assert!(
            dir.parent().expect("a cgroup below the worker's").ends_with(own.trim_start_matches('/')),
            "{} is not beneath {own}",
            dir.display()
        );
        let name = dir.file_name().and_then(|n| n.to_str()).expect("a UTF-8 name");
        assert_eq!(name, format!("tessera-runner-test-{}-create", std::process::id()));
        let limit_file = match cgroup.enforcement() {
            MemoryEnforcement::CgroupV1(_) => "memory.limit_in_bytes",
            MemoryEnforcement::CgroupV2(_) => "memory.max",
            other => panic!("unexpected enforcement {other:?}"),
        };
        let limit = fs::read_to_string(dir.join(limit_file)).expect("the limit file exists");
        assert_eq!(limit.trim(), (64 * MIB).to_string());
        assert_eq!(cgroup.oom_kills(), Some(0));
        cgroup.remove().expect("an empty cgroup is removable");
        assert!(!dir.exists(), "{} was removed", dir.display());
    }

    #[test]
    fn prepare_memory_uses_a_cgroup_or_nothing() {
        assert!(matches!(prepare_memory("unlimited", None), Ok((None, MemoryEnforcement::Unlimited))));
        let Some(probe) = test_cgroup("prepare-probe", 64 * MIB) else { return };
        drop(probe);
        let name = format!("test-{}-prepare", std::process::id());
        let (cgroup, enforcement) = prepare_memory(&name, Some(64 * MIB)).expect("a cgroup exists");
        let cgroup = cgroup.expect("a cgroup, since one could be created");
        assert_eq!(enforcement, cgroup.enforcement());
    }

    #[test]
    fn reuses_an_empty_leftover_and_refuses_a_busy_one() {
        let Some(first) = test_cgroup("leftover", 64 * MIB) else { return };
        let dir = first.path().to_path_buf();
        // A worker that crashed never ran Drop.
        std::mem::forget(first);
        let name = format!("test-{}-leftover", std::process::id());
        let reused = RunnerCgroup::create(&name, 32 * MIB).expect("reuse").expect("still writable");
        assert_eq!(reused.path(), dir);
        let limit = match reused.enforcement() {
            MemoryEnforcement::CgroupV1(_) => "memory.limit_in_bytes",
            _ => "memory.max",
        };
        assert_eq!(fs::read_to_string(dir.join(limit)).expect("limit").trim(), (32 * MIB).to_string());

        let orphan = Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        reused.add(orphan.id()).expect("move the orphan in");
        std::mem::forget(reused);
        let error = RunnerCgroup::create(&name, 64 * MIB).expect_err("a busy leftover is refused");
        assert!(error.contains("still holds pids") && error.contains(&orphan.id().to_string()), "{error}");
        kill(orphan);
        let again = RunnerCgroup::create(&name, 64 * MIB).expect("reuse after the orphan died").expect("writable");
        again.remove().expect("removable once empty");
        assert!(!dir.exists());
    }

    #[test]
    fn add_refuses_pid_zero() {
        let Some(cgroup) = test_cgroup("pid0", 64 * MIB) else { return };
        let error = cgroup.add(0).expect_err("pid 0 is the worker");
        assert!(error.contains("pid 0"), "{error}");
    }

    /// `head -c 300M /dev/zero | tail`: tail keeps the unfinished last line, so it holds ~300 MiB.
    fn spawn_head() -> Child {
        Command::new("head").args(["-c", "300M", "/dev/zero"]).stdout(Stdio::piped()).spawn().expect("spawn head")
    }

    #[test]
    fn a_runner_past_its_limit_is_killed_alone() {
        let Some(cgroup) = test_cgroup("oom-join", 64 * MIB) else { return };
        let mut head = spawn_head();
        let mut tail = Command::new("tail");
        tail.stdin(head.stdout.take().expect("piped")).stdout(Stdio::null());
        // The runner joins its cgroup itself, before exec.
        let status = spawn_with(&mut tail, &SliceLimits::default(), &cgroup.enforcement()).wait().expect("wait tail");
        // The command still holds the pipe's read end, so head would block rather than get SIGPIPE.
        drop(tail);
        kill(head);
        assert_eq!(status.signal(), Some(libc::SIGKILL), "tail should be OOM-killed, got {status}");
        let kills = cgroup.oom_kills().expect("an oom_kill count");
        assert!(kills >= 1, "oom_kill = {kills}");
        // Still here: the OOM killer stayed inside the runner's cgroup.
    }

    #[test]
    fn add_moves_a_running_process_under_the_limit() {
        let Some(cgroup) = test_cgroup("oom-add", 64 * MIB) else { return };
        let mut sh = Command::new("sh")
            .args(["-c", "read -r _ && head -c 300M /dev/zero | tail > /dev/null"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn sh");
        cgroup.add(sh.id()).expect("move sh in");
        let membership = fs::read_to_string(format!("/proc/{}/cgroup", sh.id())).expect("sh is alive");
        let own = own_cgroup_path(&cgroup);
        let expected = format!("{}/{}", own, cgroup.path().file_name().and_then(|n| n.to_str()).expect("UTF-8"));
        assert!(membership.lines().any(|l| l.ends_with(&format!(":{expected}"))), "{membership}");
        // The pipeline starts only now, inside the cgroup.
        sh.stdin.take().expect("piped").write_all(b"go\n").expect("release sh");
        let status = sh.wait().expect("wait sh");
        assert_eq!(status.code(), Some(128 + libc::SIGKILL), "the shell reports tail's SIGKILL, got {status}");
        assert!(cgroup.oom_kills().expect("an oom_kill count") >= 1);
    }

    #[test]
    fn child_setup_pins_cpus_and_sets_nice() {
        // CPU 0 here; the first CPU we may use where a cpuset restricts the tests.
        let own = fs::read_to_string("/proc/self/status").expect("status");
        let allowed = |status: &str| {
            let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).expect("Cpus_allowed_list");
            parse_cpu_list(list).expect("the kernel's cpu list parses")
        };
        let cpu = allowed(&own)[0];
        // 19, the weakest priority, is the one any process may set, whatever the tests run at.
        let limits = SliceLimits { cpus: vec![cpu], nice: Some(19), ..SliceLimits::default() };
        let child = spawn_with(Command::new("sleep").arg("30"), &limits, &MemoryEnforcement::Unlimited);
        let status = fs::read_to_string(format!("/proc/{}/status", child.id())).expect("status");
        let stat = fs::read_to_string(format!("/proc/{}/stat", child.id())).expect("stat");
        kill(child);
        eprintln!("pinned to cpu {cpu}");
        assert_eq!(allowed(&status), [cpu]);
        // Field 19 is nice; fields 3 onwards follow the parenthesised command name.
        let after_comm = stat.rsplit_once(')').expect("(comm)").1;
        let nice: i32 = after_comm.split_whitespace().nth(19 - 3).expect("field 19").parse().expect("a number");
        assert_eq!(nice, 19);
    }

    #[test]
    fn child_setup_sets_the_data_rlimit_without_a_cgroup() {
        let memory = MemoryEnforcement::Rlimit(1 << 30);
        let child = spawn_with(Command::new("sleep").arg("30"), &SliceLimits::default(), &memory);
        let limits = fs::read_to_string(format!("/proc/{}/limits", child.id())).expect("limits");
        kill(child);
        let line = limits.lines().find(|l| l.starts_with("Max data size")).expect("a data line");
        let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
        assert_eq!(numbers, ["1073741824", "1073741824"], "{line}");
    }

    #[test]
    fn child_setup_rejects_impossible_limits() {
        let too_many = SliceLimits { cpus: vec![0, MAX_CPUS], ..SliceLimits::default() };
        let error = child_setup(&too_many, &MemoryEnforcement::Unlimited).err().expect("cpu out of range");
        assert!(error.contains("cpu 8192"), "{error}");
        let too_nice = SliceLimits { nice: Some(20), ..SliceLimits::default() };
        let error = child_setup(&too_nice, &MemoryEnforcement::Unlimited).err().expect("nice out of range");
        assert!(error.contains("nice value 20"), "{error}");
        let high_cpu = cpu_mask(&[0, 1100]).expect("valid").expect("pinned");
        assert_eq!(high_cpu.len(), 1100 / libc::c_ulong::BITS as usize + 1, "sized to the highest cpu, past 1024");
    }
}
