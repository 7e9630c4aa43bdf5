//! The process-wide count of requests handed to a model and not yet answered, and, in a runner
//! process, of the requests it has read from its front and not yet answered ([`Received`]).
//!
//! The engine counts (the batcher per request, the runner client for a request out to a
//! runner), and so does the gateway (a request forwarded to a worker until its answer's head is
//! back); the network layer reads the count to decide whether an idle thread may busy-poll
//! its connections (`serve::net::busy_poll`) or re-poll a connection in place
//! (`serve::net::rewake`). The count lives here so the engine needs nothing from the network.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Requests handed to a model and not yet answered, process-wide.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Requests a runner process has read from its front and not yet answered (always 0 elsewhere).
static RECEIVED: AtomicUsize = AtomicUsize::new(0);

/// One count in a process-wide counter while it lives.
struct Counted(&'static AtomicUsize);

impl Counted {
    fn start(counter: &'static AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a request as in flight while it lives.
pub struct InFlight {
    _counted: Counted,
}

impl InFlight {
    /// Marks one more request in flight.
    pub fn start() -> Self {
        Self { _counted: Counted::start(&IN_FLIGHT) }
    }

    /// Whether no request is in flight anywhere in the process.
    pub fn none() -> bool {
        IN_FLIGHT.load(Ordering::Relaxed) == 0
    }
}

/// Counts a request a runner has read, from the read until its answer is sent. A runner's one
/// async thread reads every request that has arrived before it runs any of them, so the count
/// tells the batcher whether a request is alone or has others behind it.
pub struct Received {
    _counted: Counted,
}

impl Received {
    /// Marks one more request received.
    pub fn start() -> Self {
        Self { _counted: Counted::start(&RECEIVED) }
    }
}

/// Whether this runner holds other received requests besides the one asking: running it on
/// the async thread would then keep them (and the socket) waiting until it finishes.
pub fn others_received() -> bool {
    RECEIVED.load(Ordering::Relaxed) > 1
}

/// Whether this runner holds no received request (always true outside runners).
pub fn none_received() -> bool {
    RECEIVED.load(Ordering::SeqCst) == 0
}

/// The counter itself, for a busy-polling thread to watch while it spins.
pub(crate) fn counter() -> &'static AtomicUsize {
    &IN_FLIGHT
}
