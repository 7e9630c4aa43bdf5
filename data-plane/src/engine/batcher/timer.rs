//! Waits with microsecond resolution for the batcher. Tokio's timer wheel ticks in whole
//! milliseconds, so a `max_queue_delay_microseconds: 100` (Triton's documented example) turned
//! into 1–2 ms of waiting, and a request with a 1 ms timeout expired before a 100 µs delay ended.
//! Short waits are kept by one process-wide timer thread instead (a condition variable waits to
//! the microsecond, within the kernel's timer slack); long ones, where a millisecond does not
//! matter, stay on Tokio's timer.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Waits at least this long go to Tokio's timer, whose rounding is then under a tenth.
const PRECISE_BELOW: Duration = Duration::from_millis(10);

/// Sleeps until `at`, to the microsecond for short waits.
pub async fn sleep_until(at: tokio::time::Instant) {
    let std_at = at.into_std();
    match timer() {
        Some(timer) if std_at.saturating_duration_since(Instant::now()) < PRECISE_BELOW => {
            PreciseSleep { timer, at: std_at, key: None }.await;
        }
        _ => tokio::time::sleep_until(at).await,
    }
}

/// The process-wide timer: wakers by deadline, and the thread that fires them.
struct Timer {
    /// Pending wakes by (deadline, id); the timer thread takes them out as they come due, a
    /// sleep dropped early takes its own out.
    wakes: Mutex<Wakes>,
    /// Signalled when a new earliest deadline arrives, so the thread waits for that instead.
    changed: Condvar,
}

#[derive(Default)]
struct Wakes {
    by_deadline: BTreeMap<(Instant, u64), Waker>,
    next_id: u64,
}

/// The timer, started on first use; `None` if its thread could not start (then every wait
/// uses Tokio's timer, only less precisely).
fn timer() -> Option<&'static Timer> {
    static TIMER: OnceLock<Option<&'static Timer>> = OnceLock::new();
    *TIMER.get_or_init(|| {
        // Lives as long as the process, like its thread.
        let timer: &'static Timer =
            Box::leak(Box::new(Timer { wakes: Mutex::new(Wakes::default()), changed: Condvar::new() }));
        match std::thread::Builder::new().name("tessera-timer".into()).spawn(move || run(timer)) {
            Ok(_) => Some(timer),
            Err(e) => {
                tracing::warn!(error = %e, "no batching timer thread; short batching delays round up to milliseconds");
                None
            }
        }
    })
}

/// The timer thread: wakes every sleep whose deadline passed, then waits for the next one.
fn run(timer: &'static Timer) {
    let mut wakes = timer.wakes.lock();
    loop {
        let now = Instant::now();
        while let Some(entry) = wakes.by_deadline.first_entry() {
            if entry.key().0 > now {
                break;
            }
            entry.remove().wake();
        }
        match wakes.by_deadline.keys().next().map(|(at, _)| *at) {
            Some(at) => {
                timer.changed.wait_until(&mut wakes, at);
            }
            None => timer.changed.wait(&mut wakes),
        }
    }
}

/// A short sleep registered with the timer thread.
struct PreciseSleep {
    timer: &'static Timer,
    at: Instant,
    /// Its key in the timer, once registered.
    key: Option<(Instant, u64)>,
}

impl Future for PreciseSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            self.unregister();
            return Poll::Ready(());
        }
        let timer = self.timer;
        let mut wakes = timer.wakes.lock();
        let key = match self.key {
            Some(key) => key,
            None => {
                wakes.next_id += 1;
                (self.at, wakes.next_id)
            }
        };
        let earliest = wakes.by_deadline.keys().next().is_none_or(|first| key < *first);
        wakes.by_deadline.insert(key, cx.waker().clone());
        drop(wakes);
        self.key = Some(key);
        if earliest {
            timer.changed.notify_one();
        }
        Poll::Pending
    }
}

impl PreciseSleep {
    fn unregister(&mut self) {
        if let Some(key) = self.key.take() {
            self.timer.wakes.lock().by_deadline.remove(&key);
        }
    }
}

impl Drop for PreciseSleep {
    fn drop(&mut self) {
        self.unregister();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn short_sleeps_end_close_to_their_deadline_not_on_the_next_millisecond() {
        let mut late = Vec::new();
        for _ in 0..20 {
            let at = tokio::time::Instant::now() + Duration::from_micros(150);
            sleep_until(at).await;
            let now = tokio::time::Instant::now();
            assert!(now >= at, "never early");
            late.push(now - at);
        }
        // Tokio's timer is never less than about a millisecond late; the least late of these
        // shows the resolution even when a busy test machine delays some wakes.
        let least = late.iter().min().copied().unwrap_or_default();
        assert!(least < Duration::from_micros(500), "least lateness {least:?} of {late:?}");
    }

    #[tokio::test]
    async fn a_sleep_dropped_early_leaves_nothing_behind() {
        let far = tokio::time::Instant::now() + Duration::from_millis(9);
        let raced = tokio::time::timeout(Duration::from_micros(100), sleep_until(far)).await;
        assert!(raced.is_err(), "the timeout came first");
        let timer = timer().expect("the timer thread runs");
        let left = timer.wakes.lock().by_deadline.keys().filter(|(at, _)| *at == far.into_std()).count();
        assert_eq!(left, 0);
    }

    #[tokio::test]
    async fn many_concurrent_sleeps_each_wait_their_own_time() {
        let start = tokio::time::Instant::now();
        let sleeps = (0..20u64).rev().map(|i| async move {
            sleep_until(start + Duration::from_micros(200 + 50 * i)).await;
            (i, tokio::time::Instant::now())
        });
        let done = futures::future::join_all(sleeps).await;
        assert_eq!(done.len(), 20);
        for (i, woke) in &done {
            assert!(*woke >= start + Duration::from_micros(200 + 50 * i), "sleep {i} woke early");
        }
    }
}
