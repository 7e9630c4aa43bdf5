//! Tensor bytes through shared memory: two sealed memfd arenas per runner, so a large tensor
//! crosses the process boundary as a position in a frame instead of bytes through the socket.
//!
//! The front creates both arenas before it spawns the runner and passes them as descriptors
//! (no names anywhere):
//! - the **request arena**: the front writes inputs there, the runner maps it read-only (sealed
//!   `F_SEAL_FUTURE_WRITE` after the front's own mapping) and reads them in place. Its first
//!   cache line holds the front's control word (how far it has read the response arena). The
//!   front allocates from it alone; the runner gives regions back with each answer
//!   ([`FrontShm::release`]), in any order.
//! - the **response arena**: the runner writes outputs there in the order its frames go out;
//!   the front copies each out once, while it decodes the frame, and then advances its control
//!   word, so the runner reuses the space with no message back.
//!
//! Allocator state lives in each writer's private memory, never in the shared pages, and the
//! front checks every position a runner sends (the lesson of Triton's Python-backend IPC CVEs).
//! Tensors under [`INLINE_MAX`] and any that find no room go inline in the frame as before:
//! up to 64 KiB a socket costs the same (`runner-ipc.md`, table 3).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

/// Tensors smaller than this travel inline in their frame.
pub const INLINE_MAX: usize = 64 * 1024;
/// Default size of each arena (request and response) per runner.
pub const DEFAULT_ARENA_BYTES: usize = 32 << 20;
/// Regions start on cache lines (ORT copies from them with vector loads).
const ALIGN: u64 = 64;
/// Bytes before the request arena's data: the front's control word, alone on its cache line.
const CONTROL_BYTES: usize = 64;

/// A shared mapping of a whole memfd; unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; every access goes through
// raw pointers at checked offsets, and who writes which region is the protocol's business.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(fd: &OwnedFd, writable: bool) -> std::io::Result<Self> {
        let len = usize::try_from(fd_size(fd)?).map_err(std::io::Error::other)?;
        if len <= CONTROL_BYTES {
            return Err(std::io::Error::other(format!("shared memory arena of {len} bytes is too small")));
        }
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a fresh shared mapping of a descriptor we own, at an address the kernel picks.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { ptr: ptr.cast(), len })
    }

    /// The request arena's control word: how far the front has read the response arena.
    fn control(&self) -> &AtomicU64 {
        // SAFETY: the mapping is page-aligned and longer than CONTROL_BYTES, so offset 0 holds
        // an aligned u64 for the mapping's lifetime; it is only ever accessed atomically.
        unsafe { &*self.ptr.cast::<AtomicU64>() }
    }

    /// The data region (after the control line) as a raw pointer and capacity.
    fn data(&self) -> (*mut u8, u64) {
        // SAFETY: CONTROL_BYTES < len (checked in `map`), so the offset stays inside the mapping.
        (unsafe { self.ptr.add(CONTROL_BYTES) }, (self.len - CONTROL_BYTES) as u64)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped; nothing borrows it past this value.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn fd_size(fd: &OwnedFd) -> std::io::Result<u64> {
    let file = std::mem::ManuallyDrop::new(
        // SAFETY: borrowed for a metadata call only; ManuallyDrop keeps the descriptor open.
        unsafe { std::fs::File::from_raw_fd(fd.as_raw_fd()) },
    );
    Ok(file.metadata()?.len())
}

/// Creates a sealable memfd of `len` bytes whose size can never change (so no mapping of it
/// can fault past its end).
fn create(name: &str, len: usize) -> std::io::Result<OwnedFd> {
    let name = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
    // SAFETY: a valid C string; the returned descriptor is checked and then owned.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain system calls on the descriptor we own.
    unsafe {
        if libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(fd)
}

fn add_seals(fd: &OwnedFd, seals: libc::c_int) -> std::io::Result<()> {
    // SAFETY: a plain system call on a descriptor we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn round_up(len: u64) -> u64 {
    len.div_ceil(ALIGN).max(1) * ALIGN
}

/// Where a region of `len` bytes goes in a ring of `cap` bytes whose free space starts at
/// monotonic position `head` and whose oldest live byte is `tail` (`tail == head`: nothing is
/// live): `(start of the data, new head)`. A region never wraps: it skips the ring's end.
fn place(cap: u64, head: u64, tail: u64, len: u64) -> Option<(u64, u64)> {
    let len = round_up(len);
    let offset = head % cap;
    let pad = if offset + len > cap { cap - offset } else { 0 };
    let pos = head.checked_add(pad)?;
    let end = pos.checked_add(len)?;
    let from = if tail == head { pos } else { tail };
    (end - from <= cap).then_some((pos, end))
}

/// The front's allocator over the request arena: regions come back in any order; space is
/// reused once everything before it came back.
struct RequestRing {
    cap: u64,
    head: u64,
    /// Live and returned regions in position order: (start including any skip, data start, end, returned).
    regions: VecDeque<(u64, u64, u64, bool)>,
}

impl RequestRing {
    fn alloc(&mut self, len: u64) -> Option<u64> {
        let tail = self.regions.front().map_or(self.head, |r| r.0);
        let (pos, end) = place(self.cap, self.head, tail, len)?;
        self.regions.push_back((self.head, pos, end, false));
        self.head = end;
        Some(pos)
    }

    fn free(&mut self, pos: u64) -> bool {
        let Ok(i) = self.regions.binary_search_by_key(&pos, |r| r.1) else { return false };
        if std::mem::replace(&mut self.regions[i].3, true) {
            return false;
        }
        while self.regions.front().is_some_and(|r| r.3) {
            self.regions.pop_front();
        }
        true
    }
}

/// Tensor bytes that crossed to and from one (tenant, slice)'s runners, by way; kept across
/// restarts for `tessera_runner_tensor_bytes_total`.
#[derive(Debug, Default)]
pub struct Traffic {
    /// Request tensors: [inline in the frame, in shared memory].
    pub request: [AtomicU64; 2],
    /// Response tensors: [inline in the frame, in shared memory].
    pub response: [AtomicU64; 2],
}

impl Traffic {
    fn count(counters: &[AtomicU64; 2], shared: bool, len: usize) {
        counters[usize::from(shared)].fetch_add(len as u64, Ordering::Relaxed);
    }
}

/// The two arenas' descriptors, for the runner's command (fds 4 and 5) until it has started.
pub struct ShmFds {
    /// The request arena (the runner maps it read-only).
    pub request: OwnedFd,
    /// The response arena (the runner maps it read-write).
    pub response: OwnedFd,
}

/// The front's side of one runner's arenas.
pub struct FrontShm {
    request: Mapping,
    response: Mapping,
    ring: Mutex<RequestRing>,
    traffic: Arc<Traffic>,
}

impl FrontShm {
    /// Creates both arenas of `bytes` each, counting what crosses in `traffic`; the descriptors
    /// go to the runner.
    pub fn create(bytes: usize, traffic: Arc<Traffic>) -> std::io::Result<(Arc<Self>, ShmFds)> {
        let len = bytes + CONTROL_BYTES;
        let request_fd = create("tessera-requests", len)?;
        let response_fd = create("tessera-responses", len)?;
        let request = Mapping::map(&request_fd, true)?;
        // The runner may only read what the front writes, and the arenas' seals stay as set.
        add_seals(&request_fd, libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL)?;
        let response = Mapping::map(&response_fd, false)?;
        add_seals(&response_fd, libc::F_SEAL_SEAL)?;
        let cap = request.data().1;
        let ring = Mutex::new(RequestRing { cap, head: 0, regions: VecDeque::new() });
        let fds = ShmFds { request: request_fd, response: response_fd };
        Ok((Arc::new(Self { request, response, ring, traffic }), fds))
    }

    /// Copies a request tensor into the arena: its position, or `None` to send it inline
    /// (small, or no room now).
    pub fn put(&self, data: &[u8]) -> Option<u64> {
        let pos = if data.len() < INLINE_MAX { None } else { self.ring.lock().alloc(data.len() as u64) };
        Traffic::count(&self.traffic.request, pos.is_some(), data.len());
        let pos = pos?;
        let (base, cap) = self.request.data();
        // SAFETY: `alloc` returned a region of at least data.len() bytes inside the data area
        // (it never wraps), reserved for this tensor until the runner gives it back.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base.add((pos % cap) as usize), data.len()) };
        Some(pos)
    }

    /// Counts a response tensor that came inline or from the arena.
    pub fn count_response(&self, shared: bool, len: usize) {
        Traffic::count(&self.traffic.response, shared, len);
    }

    /// The runner finished reading the request region at `pos`; false for a position the
    /// front never gave out (or one already returned).
    pub fn release(&self, pos: u64) -> bool {
        self.ring.lock().free(pos)
    }

    /// Copies an output the runner wrote at `pos` out of the response arena, then lets the
    /// runner reuse everything up to its end. `None` when the region lies outside the arena.
    pub fn take(&self, pos: u64, len: u64) -> Option<Bytes> {
        let (base, cap) = self.response.data();
        let offset = pos % cap;
        if offset.checked_add(len)? > cap {
            return None;
        }
        let len = usize::try_from(len).ok()?;
        let mut out = Vec::with_capacity(len);
        // SAFETY: offset + len lies inside the mapping (checked above); the bytes are copied
        // as they are, whatever the runner does to them meanwhile, into a buffer of len bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(base.add(offset as usize), out.as_mut_ptr(), len);
            out.set_len(len);
        }
        let end = pos.checked_add(round_up(len as u64))?;
        self.request.control().fetch_max(end, Ordering::Release);
        Some(Bytes::from(out))
    }
}

/// The runner's side of its arenas.
pub struct RunnerShm {
    inner: Arc<RunnerInner>,
}

struct RunnerInner {
    request: Mapping,
    response: Mapping,
    /// Where the next output goes (monotonic); the front's control word says how far it read.
    head: Mutex<u64>,
    /// Request regions whose tensors were dropped, not yet reported to the front.
    released: Mutex<Vec<u64>>,
}

impl RunnerShm {
    /// Maps the arenas the front passed as `request` and `response`.
    pub fn map(request: OwnedFd, response: OwnedFd) -> std::io::Result<Self> {
        let request = Mapping::map(&request, false)?;
        let response = Mapping::map(&response, true)?;
        let inner = RunnerInner { request, response, head: Mutex::new(0), released: Mutex::new(Vec::new()) };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// A request tensor at `pos` as bytes read in place; the region goes back to the front once
    /// every copy of the bytes is dropped. `None` when the region lies outside the arena.
    pub fn get(&self, pos: u64, len: u64) -> Option<Bytes> {
        let (_, cap) = self.inner.request.data();
        let offset = pos % cap;
        if offset.checked_add(len)? > cap {
            return None;
        }
        let lease = Lease { shm: self.inner.clone(), pos, offset: offset as usize, len: usize::try_from(len).ok()? };
        Some(Bytes::from_owner(lease))
    }

    /// Copies an output into the response arena, in frame order (the caller holds the socket's
    /// write lock): its position, or `None` to send it inline.
    pub fn put(&self, data: &[u8]) -> Option<u64> {
        if data.len() < INLINE_MAX {
            return None;
        }
        let (base, cap) = self.inner.response.data();
        let mut head = self.inner.head.lock();
        let read = self.inner.request.control().load(Ordering::Acquire).min(*head);
        let (pos, end) = place(cap, *head, read, data.len() as u64)?;
        // SAFETY: the region [pos, pos + len) lies inside the data area (it never wraps) and the
        // front has finished reading it (its control word is past it).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base.add((pos % cap) as usize), data.len()) };
        *head = end;
        Some(pos)
    }

    /// Whether request regions wait to be given back.
    pub fn has_released(&self) -> bool {
        !self.inner.released.lock().is_empty()
    }

    /// Request regions to give back, taken for the frame being written.
    pub fn take_released(&self) -> Vec<u64> {
        std::mem::take(&mut *self.inner.released.lock())
    }
}

/// A request tensor read in place; gives its region back when dropped.
struct Lease {
    shm: Arc<RunnerInner>,
    pos: u64,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for Lease {
    fn as_ref(&self) -> &[u8] {
        let (base, _) = self.shm.request.data();
        // SAFETY: [offset, offset + len) lies inside the mapping (checked in `get`), and the
        // front does not write the region until this lease gives it back.
        unsafe { std::slice::from_raw_parts(base.add(self.offset), self.len) }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.shm.released.lock().push(self.pos);
    }
}

/// The runner's arenas from the descriptors its command names.
pub fn adopt(request_fd: i32, response_fd: i32) -> std::io::Result<RunnerShm> {
    // SAFETY: the front placed these descriptors for this process alone (see the supervisor);
    // nothing else in this process uses them.
    let (request, response) = unsafe { (OwnedFd::from_raw_fd(request_fd), OwnedFd::from_raw_fd(response_fd)) };
    RunnerShm::map(request, response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(bytes: usize) -> (Arc<FrontShm>, RunnerShm) {
        let (front, fds) = FrontShm::create(bytes, Arc::default()).expect("create arenas");
        let runner = RunnerShm::map(fds.request, fds.response).expect("map arenas");
        (front, runner)
    }

    fn big(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn tensors_cross_both_ways_and_small_ones_stay_inline() {
        let (front, runner) = pair(1 << 20);
        assert_eq!(front.put(&[1; 100]), None, "small tensors go inline");
        assert_eq!(runner.put(&[1; 100]), None);
        let input = big(200_000, 7);
        let pos = front.put(&input).expect("room");
        let seen = runner.get(pos, input.len() as u64).expect("in bounds");
        assert_eq!(seen.as_ref(), input.as_slice());
        let output = big(300_000, 9);
        let at = runner.put(&output).expect("room");
        let copied = front.take(at, output.len() as u64).expect("in bounds");
        assert_eq!(copied.as_ref(), output.as_slice());
        assert!(runner.take_released().is_empty(), "still held");
        drop(seen);
        assert_eq!(runner.take_released(), vec![pos]);
        assert!(front.release(pos));
        assert!(!front.release(pos), "a region comes back once");
    }

    #[test]
    fn the_runner_cannot_write_the_request_arena() {
        let (_front, fds) = FrontShm::create(1 << 20, Arc::default()).expect("create");
        assert!(Mapping::map(&fds.request, true).is_err(), "sealed against new writable mappings");
        assert!(Mapping::map(&fds.request, false).is_ok());
        // SAFETY: a plain system call on a descriptor we own.
        let grown = unsafe { libc::ftruncate(fds.response.as_raw_fd(), 1 << 30) };
        assert_ne!(grown, 0, "the arenas' size is sealed");
    }

    #[test]
    fn request_regions_come_back_in_any_order_and_space_is_reused() {
        let mut ring = RequestRing { cap: 1024, head: 0, regions: VecDeque::new() };
        let a = ring.alloc(300).expect("a");
        let b = ring.alloc(300).expect("b");
        let c = ring.alloc(300).expect("c");
        assert_eq!((a, b, c), (0, 320, 640));
        assert_eq!(ring.alloc(200), None, "full");
        assert!(ring.free(b));
        assert_eq!(ring.alloc(200), None, "a still holds the start");
        assert!(ring.free(a));
        // 64 bytes are left at the end: the next region skips them and wraps to the start.
        assert_eq!(ring.alloc(600), Some(1024));
        assert!(!ring.free(12345), "unknown positions are refused");
        assert!(ring.free(c) && ring.free(1024));
        assert!(ring.regions.is_empty());
        assert_eq!(ring.alloc(1024), Some(1664 + 384), "a region as large as the ring fits once empty");
        assert_eq!(ring.alloc(1025), None);
    }

    #[test]
    fn the_runner_reuses_response_space_only_after_the_front_read_it() {
        let (front, runner) = pair(256 * 1024);
        let out = big(100_000, 1);
        let first = runner.put(&out).expect("room");
        let second = runner.put(&out).expect("room");
        assert_eq!(runner.put(&out), None, "the front has read nothing yet");
        assert!(front.take(first, out.len() as u64).is_some());
        let third = runner.put(&out).expect("the first region is free again");
        assert_eq!(third % front.response.data().1, 0, "wrapped to the start");
        assert_eq!(front.take(second, out.len() as u64).expect("second").as_ref(), out.as_slice());
        assert_eq!(front.take(third, out.len() as u64).expect("third").as_ref(), out.as_slice());
    }

    #[test]
    fn positions_outside_the_arena_are_refused() {
        let (front, runner) = pair(1 << 20);
        let cap = front.response.data().1;
        assert!(front.take(cap - 10, 11).is_none());
        assert!(front.take(0, u64::MAX).is_none());
        assert!(front.take(u64::MAX, 1).is_none());
        assert!(runner.get(cap - 10, 11).is_none());
        assert!(runner.get(0, cap + 1).is_none());
    }
}
