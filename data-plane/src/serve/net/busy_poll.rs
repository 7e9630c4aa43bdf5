//! Bounded busy-polling of client connections before an async worker thread sleeps.
//!
//! A client that sends its next request right after reading a response (any closed-loop
//! client at low concurrency) otherwise finds the server's threads asleep: its write then pays
//! for waking one, and the server answers only after the wake-up. On virtual machines a
//! wake-up crosses into the hypervisor and costs more than the small model itself. So when the
//! server has nothing in flight, the worker about to sleep first watches the connections for
//! up to a short window. The window is bounded, only one thread spins at a time, it yields its
//! CPU to any other runnable thread on each turn, and it stops as soon as any request is in
//! flight, so a loaded server (whose CPU goes to executions and other clients) does not spin.
//! A proxy (the gateway) also spins while one forwarded request awaits its worker's answer, so
//! that answer finds it awake too, and stops once more are in flight.

use std::os::fd::AsFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

/// Default window; a closed-loop client's turn-around (reading a response, sending the next
/// request) takes some tens to a couple hundred microseconds.
pub const DEFAULT_WINDOW_US: u64 = 200;
/// [`DEFAULT_WINDOW_US`] as a duration (what `tessera dev` uses).
pub const DEFAULT_WINDOW: Duration = Duration::from_micros(DEFAULT_WINDOW_US);

/// The process's poller, set once at start by the serving roles.
static ACTIVE: OnceLock<BusyPoll> = OnceLock::new();

/// Watches connections so an idle worker can see a request arrive without sleeping.
pub struct BusyPoll {
    /// Edge-triggered readability of every accepted connection (closed ones leave it).
    epoll: Epoll,
    window: Duration,
    /// Requests in flight up to which a thread still spins: 0 on a server (any request in flight
    /// has work for the CPU), 1 on a proxy (its one request waits on a worker's answer, which a
    /// spin catches without a wake-up; with more, the load is the worker's and the CPU is too).
    allowed_in_flight: usize,
    /// Held by the one thread spinning.
    spinning: AtomicBool,
}

/// How a spin ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spin {
    /// Another thread was spinning, or a request is in flight: park at once.
    Skipped,
    /// A connection became readable.
    Readable,
    /// A request went in flight (another thread took the work).
    Busy,
    /// The window passed with nothing to read.
    TimedOut,
}

impl BusyPoll {
    /// A poller spinning up to `window` while at most `allowed_in_flight` requests are in flight.
    pub fn new(window: Duration, allowed_in_flight: usize) -> nix::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        Ok(Self { epoll, window, allowed_in_flight, spinning: AtomicBool::new(false) })
    }

    /// Adds an accepted connection to the set watched, edge-triggered: a spin ends when bytes
    /// (or the peer's close) arrive, once. Level-triggered, a connection its peer closed while it
    /// sat unread (a gateway's idle pooled connection the worker timed out) stayed readable and
    /// ended every spin at once, which left a proxy sleeping through every answer.
    pub fn watch(&self, connection: impl AsFd) -> nix::Result<()> {
        self.epoll.add(connection, EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLET, 0))
    }

    /// Polls the watched connections until one is readable, more requests than allowed go in
    /// flight (per `in_flight`) or the window passes.
    pub fn spin(&self, in_flight: &AtomicUsize) -> Spin {
        let busy = || in_flight.load(Ordering::Relaxed) > self.allowed_in_flight;
        if busy() || self.spinning.swap(true, Ordering::Acquire) {
            return Spin::Skipped;
        }
        let end = Instant::now() + self.window;
        let mut events = [EpollEvent::empty()];
        let outcome = loop {
            match self.epoll.wait(&mut events, EpollTimeout::ZERO) {
                Ok(0) => {}
                // Readable, or the poller broke: either way stop spinning.
                Ok(_) | Err(_) => break Spin::Readable,
            }
            if busy() {
                break Spin::Busy;
            }
            if Instant::now() >= end {
                break Spin::TimedOut;
            }
            // Give the CPU to anything else runnable here (a model instance, a client).
            let _ = nix::sched::sched_yield();
        };
        self.spinning.store(false, Ordering::Release);
        outcome
    }
}

/// Turns busy-polling on for this server process with `window` (zero: off): threads spin only
/// while no request is in flight. Later calls are ignored.
pub fn enable(window: Duration) {
    enable_with(window, 0);
}

/// Turns busy-polling on for a proxy (the gateway): threads also spin while one forwarded
/// request awaits its answer, and stop once more are in flight. Later calls are ignored.
pub fn enable_for_proxy(window: Duration) {
    enable_with(window, 1);
}

fn enable_with(window: Duration, allowed_in_flight: usize) {
    if window.is_zero() || ACTIVE.get().is_some() {
        return;
    }
    match BusyPoll::new(window, allowed_in_flight) {
        Ok(poll) => {
            if ACTIVE.set(poll).is_ok() {
                tracing::debug!(window_us = window.as_micros() as u64, "busy-polling connections before sleeping");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot create a poller; threads sleep without busy-polling"),
    }
}

/// Watches an accepted connection, when busy-polling is on.
pub fn watch(connection: impl AsFd) {
    if let Some(poll) = ACTIVE.get()
        && let Err(e) = poll.watch(connection)
    {
        tracing::debug!(error = %e, "cannot watch a connection for busy-polling");
    }
}

/// The window busy-polling uses in this process (zero when off), for runner processes to
/// take the same.
pub fn window() -> Duration {
    ACTIVE.get().map_or(Duration::ZERO, |p| p.window)
}

/// The async runtime's hook before a worker thread parks.
pub fn before_park() {
    if let Some(poll) = ACTIVE.get() {
        poll.spin(crate::engine::in_flight::counter());
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    use super::*;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        (client, server)
    }

    #[test]
    fn spinning_ends_when_a_watched_connection_has_data() {
        let poll = BusyPoll::new(Duration::from_secs(30), 0).expect("epoll");
        let (mut client, server) = pair();
        poll.watch(&server).expect("watch");
        client.write_all(b"x").expect("write");
        let started = Instant::now();
        assert_eq!(poll.spin(&AtomicUsize::new(0)), Spin::Readable);
        assert!(started.elapsed() < Duration::from_secs(10), "returned at once, not after the window");
    }

    #[test]
    fn spinning_gives_up_after_the_window() {
        let poll = BusyPoll::new(Duration::from_millis(5), 0).expect("epoll");
        let (_client, server) = pair();
        poll.watch(&server).expect("watch");
        let started = Instant::now();
        assert_eq!(poll.spin(&AtomicUsize::new(0)), Spin::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(5));
    }

    #[test]
    fn a_request_in_flight_stops_or_skips_spinning() {
        let poll = BusyPoll::new(Duration::from_secs(30), 0).expect("epoll");
        let in_flight = AtomicUsize::new(1);
        assert_eq!(poll.spin(&in_flight), Spin::Skipped);
        // One going in flight mid-spin (another thread took a request) ends it.
        let poll = std::sync::Arc::new(poll);
        let in_flight = std::sync::Arc::new(AtomicUsize::new(0));
        let spinner = {
            let (poll, in_flight) = (poll.clone(), in_flight.clone());
            std::thread::spawn(move || poll.spin(&in_flight))
        };
        while !poll.spinning.load(Ordering::Relaxed) {
            std::thread::yield_now();
        }
        in_flight.store(1, Ordering::Relaxed);
        assert_eq!(spinner.join().expect("spinner"), Spin::Busy);
    }

    #[test]
    fn a_proxy_spins_while_one_request_awaits_its_answer_and_not_with_more() {
        let poll = BusyPoll::new(Duration::from_millis(5), 1).expect("epoll");
        let (_client, server) = pair();
        poll.watch(&server).expect("watch");
        assert_eq!(poll.spin(&AtomicUsize::new(1)), Spin::TimedOut);
        assert_eq!(poll.spin(&AtomicUsize::new(2)), Spin::Skipped);
    }

    #[test]
    fn one_thread_spins_at_a_time() {
        let poll = BusyPoll::new(Duration::from_secs(30), 0).expect("epoll");
        poll.spinning.store(true, Ordering::Relaxed);
        assert_eq!(poll.spin(&AtomicUsize::new(0)), Spin::Skipped);
    }

    #[test]
    fn a_connection_its_peer_closed_ends_one_spin_not_every_one() {
        let poll = BusyPoll::new(Duration::from_millis(5), 0).expect("epoll");
        let (client, server) = pair();
        let (mut other_client, other_server) = pair();
        poll.watch(&server).expect("watch");
        poll.watch(&other_server).expect("watch");
        // An idle connection its peer closed, left unread (a pooled one a worker timed out).
        drop(client);
        assert_eq!(poll.spin(&AtomicUsize::new(0)), Spin::Readable);
        assert_eq!(poll.spin(&AtomicUsize::new(0)), Spin::TimedOut, "the close was news once");
        other_client.write_all(b"x").expect("write");
        assert_eq!(poll.spin(&AtomicUsize::new(0)), Spin::Readable, "bytes on another connection still end a spin");
        drop(server);
    }

    #[test]
    fn a_closed_connection_leaves_the_watched_set() {
        let poll = BusyPoll::new(Duration::from_millis(5), 0).expect("epoll");
        let (client, server) = pair();
        poll.watch(&server).expect("watch");
        drop(server);
        drop(client);
        assert_eq!(poll.spin(&AtomicUsize::new(0)), Spin::TimedOut);
    }
}
