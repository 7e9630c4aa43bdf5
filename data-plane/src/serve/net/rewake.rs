//! Re-polling a connection's future in place when it wakes itself while being polled.
//!
//! Serving one request, hyper's connection task wakes itself: the dispatcher hands the body to
//! the handler through a channel whose receiver, polled a moment earlier by the same task, left
//! that task's waker behind. Tokio treats a task woken during its own poll as a yield: it goes
//! to the back of the run queue and a sleeping worker thread is woken to help, which costs a
//! futex or eventfd call here and a wake-up and sleep there, per request, for nothing (the
//! task is polled again at once anyway). [`Rewake`] gives the inner future a waker that, while
//! the inner poll is running, only notes the wake; the poll is then repeated in place, a few
//! times at most and only while the task has cooperative budget left. Wakes from anywhere else
//! (another thread, a timer, a later readiness event) go straight to the task's own waker.
//!
//! Only an otherwise idle server re-polls in place. With requests in flight, the woken worker
//! has other connections to take over, and measured throughput at 16 concurrent clients was
//! lower without that help; so a busy server yields as before.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

use crate::engine::in_flight::InFlight;

/// In-place re-polls per outer poll before deferring to the runtime like any yield.
const MAX_REPOLLS: usize = 4;

/// Set while the inner future is being polled.
const POLLING: u8 = 1;
/// Set when the inner future was woken during that poll.
const WOKEN: u8 = 2;

/// Wraps a future so that its wakes during its own poll become an in-place re-poll.
pub struct Rewake<F> {
    inner: Pin<Box<F>>,
    state: Arc<State>,
    waker: Waker,
    /// Whether the server is busy (then a self-wake yields as usual).
    busy: fn() -> bool,
}

struct State {
    flags: AtomicU8,
    /// The task's own waker, from the latest outer poll.
    task: AtomicWaker,
}

impl Wake for State {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut flags = self.flags.load(Ordering::Acquire);
        while flags & POLLING != 0 {
            match self.flags.compare_exchange_weak(flags, flags | WOKEN, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(now) => flags = now,
            }
        }
        self.task.wake();
    }
}

impl<F: Future> Rewake<F> {
    /// Wraps `inner`; re-polls in place only while no request is in flight.
    pub fn new(inner: F) -> Self {
        Self::gated(inner, || !InFlight::none())
    }

    /// Wraps `inner`; re-polls in place only while `busy` says false.
    fn gated(inner: F, busy: fn() -> bool) -> Self {
        let state = Arc::new(State { flags: AtomicU8::new(0), task: AtomicWaker::new() });
        let waker = Waker::from(state.clone());
        Self { inner: Box::pin(inner), state, waker, busy }
    }
}

impl<F: Future> Future for Rewake<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.state.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..MAX_REPOLLS {
            this.state.flags.store(POLLING, Ordering::Release);
            let polled = this.inner.as_mut().poll(&mut inner_cx);
            let flags = this.state.flags.swap(0, Ordering::AcqRel);
            if polled.is_ready() || flags & WOKEN == 0 {
                return polled;
            }
            if !tokio::task::coop::has_budget_remaining() || (this.busy)() {
                break;
            }
        }
        // Still wanting to run: yield to the runtime as the inner future asked.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A hyper executor that spawns each task (an HTTP/2 stream's) on Tokio wrapped in [`Rewake`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RewakeExecutor;

impl<F> hyper::rt::Executor<F> for RewakeExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::spawn(Rewake::new(future));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts how often the task's own waker is woken.
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting_waker() -> (Arc<Counter>, Waker) {
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        (counter.clone(), Waker::from(counter))
    }

    /// Wakes itself on its first `self_wakes` polls, then finishes.
    struct SelfWaking {
        polls: usize,
        self_wakes: usize,
    }

    impl Future for SelfWaking {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls <= self.self_wakes {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(self.polls)
        }
    }

    #[test]
    fn a_wake_during_the_poll_repolls_in_place_without_waking_the_task() {
        let (counter, waker) = counting_waker();
        let mut future = Rewake::gated(SelfWaking { polls: 0, self_wakes: 2 }, || false);
        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
        assert_eq!(polled, Poll::Ready(3));
        assert_eq!(counter.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn endless_self_wakes_fall_back_to_a_yield() {
        let (counter, waker) = counting_waker();
        let mut future = Rewake::gated(SelfWaking { polls: 0, self_wakes: usize::MAX }, || false);
        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
        assert!(polled.is_pending());
        assert_eq!(future.inner.polls, MAX_REPOLLS);
        assert_eq!(counter.0.load(Ordering::SeqCst), 1, "the task is woken once to yield");
    }

    #[test]
    fn a_busy_server_yields_on_a_self_wake() {
        let (counter, waker) = counting_waker();
        let mut future = Rewake::gated(SelfWaking { polls: 0, self_wakes: 2 }, || true);
        assert!(Pin::new(&mut future).poll(&mut Context::from_waker(&waker)).is_pending());
        assert_eq!(future.inner.polls, 1);
        assert_eq!(counter.0.load(Ordering::SeqCst), 1, "the task is woken to run again later");
    }

    /// Keeps the waker it was polled with, to be woken later from outside.
    struct Parked(Option<Waker>);

    impl Future for Parked {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.0 = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[test]
    fn a_wake_after_the_poll_reaches_the_task() {
        let (counter, waker) = counting_waker();
        let mut future = Rewake::gated(Parked(None), || false);
        assert!(Pin::new(&mut future).poll(&mut Context::from_waker(&waker)).is_pending());
        assert_eq!(counter.0.load(Ordering::SeqCst), 0);
        let kept = future.inner.0.clone().expect("the inner future kept a waker");
        let from_elsewhere = std::thread::spawn(move || kept.wake());
        from_elsewhere.join().expect("waking thread");
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_wrapped_task_still_completes_on_the_runtime() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(Rewake::new(async move { rx.await.map(|v: u32| v + 1) }));
        tokio::task::yield_now().await;
        tx.send(41).expect("receiver alive");
        assert_eq!(task.await.expect("task").expect("value"), 42);
    }
}
