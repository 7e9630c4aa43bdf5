//! Drives workers through a phase: closed loop (N requests always in flight) or open loop (a
//! fixed send schedule), until a deadline or a request count. Each worker records its own
//! latencies and errors; they are merged when the phase ends, so the hot path takes no lock.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

/// Sends one prepared request and checks its response.
pub trait Worker: Send + 'static {
    /// One request; the error message is counted as is, so it should not carry per-request values.
    fn infer(&mut self) -> impl Future<Output = Result<(), String>> + Send;
}

/// How requests are issued.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Each worker sends its next request when the previous one completes.
    Closed {
        /// Workers, i.e. requests in flight.
        concurrency: usize,
    },
    /// Requests start on a constant schedule whatever the latency, up to `max_inflight` at once.
    Open {
        /// Requests per second.
        rate: f64,
        /// Workers; a request due while all are busy starts late and counts as delayed.
        max_inflight: usize,
    },
}

impl Load {
    /// Workers the load needs.
    pub fn workers(&self) -> usize {
        match *self {
            Load::Closed { concurrency } => concurrency.max(1),
            Load::Open { max_inflight, .. } => max_inflight.max(1),
        }
    }
}

/// When a phase ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    /// No request starts after this long (in-flight ones complete).
    After(Duration),
    /// After this many requests.
    Count(u64),
}

/// A request that starts this much after its due time is "delayed" (open loop): no worker was free.
const DELAYED_AFTER: Duration = Duration::from_millis(1);

/// Shared by the workers of a phase: hands out requests and their due times.
struct Schedule {
    start: Instant,
    load: Load,
    stop: Stop,
    /// Requests handed out so far.
    tickets: AtomicU64,
}

impl Schedule {
    /// The next request: `None` when the phase is over, else its due time (`None` = now).
    fn next(&self) -> Option<Option<Instant>> {
        match (self.load, self.stop) {
            (Load::Closed { .. }, Stop::After(d)) => (self.start.elapsed() < d).then_some(None),
            (Load::Closed { .. }, Stop::Count(n)) => (self.tickets.fetch_add(1, Ordering::Relaxed) < n).then_some(None),
            (Load::Open { rate, .. }, stop) => {
                let i = self.tickets.fetch_add(1, Ordering::Relaxed);
                let offset = Duration::from_secs_f64(i as f64 / rate);
                let more = match stop {
                    Stop::After(d) => offset < d,
                    Stop::Count(n) => i < n,
                };
                more.then(|| Some(self.start + offset))
            }
        }
    }
}

/// Live counters for the progress line (relaxed atomics, one add per request).
#[derive(Debug, Default)]
struct Counters {
    completed: AtomicU64,
    failed: AtomicU64,
}

/// What one worker saw.
#[derive(Debug, Default)]
struct WorkerResult {
    latencies_ns: Vec<u64>,
    errors: BTreeMap<String, u64>,
    delayed: u64,
}

/// What a phase measured.
#[derive(Debug, Default)]
pub struct PhaseResult {
    /// From the phase start until the last request completed.
    pub elapsed: Duration,
    /// Latency of every successful request, in nanoseconds.
    pub latencies_ns: Vec<u64>,
    /// Failed requests by error message.
    pub errors: BTreeMap<String, u64>,
    /// Open loop: requests that started late because every worker was busy.
    pub delayed: u64,
}

impl PhaseResult {
    /// Failed requests.
    pub fn failures(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// Progress lines on stderr, once a second.
#[derive(Debug, Clone)]
pub struct ProgressLine {
    /// Phase name printed first.
    pub label: &'static str,
    /// Inferences per request.
    pub batch: u32,
}

/// Runs `workers` through one phase and hands them back (connections stay open for the next).
pub async fn run_phase<W: Worker>(
    workers: Vec<W>,
    load: Load,
    stop: Stop,
    progress: Option<ProgressLine>,
) -> Result<(Vec<W>, PhaseResult), String> {
    let schedule = Arc::new(Schedule { start: Instant::now(), load, stop, tickets: AtomicU64::new(0) });
    let counters = Arc::new(Counters::default());
    let reporter = progress.map(|p| tokio::spawn(progress_task(p, schedule.start, counters.clone())));
    let handles: Vec<JoinHandle<(W, WorkerResult)>> =
        workers.into_iter().map(|w| tokio::spawn(run_worker(w, schedule.clone(), counters.clone()))).collect();
    let mut workers = Vec::with_capacity(handles.len());
    let mut result = PhaseResult::default();
    for handle in handles {
        let (worker, r) = handle.await.map_err(|e| format!("load worker failed: {e}"))?;
        workers.push(worker);
        result.latencies_ns.extend_from_slice(&r.latencies_ns);
        for (message, n) in r.errors {
            *result.errors.entry(message).or_default() += n;
        }
        result.delayed += r.delayed;
    }
    result.elapsed = schedule.start.elapsed();
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    Ok((workers, result))
}

async fn run_worker<W: Worker>(mut worker: W, schedule: Arc<Schedule>, counters: Arc<Counters>) -> (W, WorkerResult) {
    let mut result = WorkerResult { latencies_ns: Vec::with_capacity(16 * 1024), ..Default::default() };
    while let Some(due) = schedule.next() {
        if let Some(due) = due {
            let now = Instant::now();
            if due > now {
                tokio::time::sleep_until(due.into()).await;
            } else if now - due > DELAYED_AFTER {
                result.delayed += 1;
            }
        }
        let sent = Instant::now();
        let outcome = worker.infer().await;
        let ns = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
        match outcome {
            Ok(()) => result.latencies_ns.push(ns),
            Err(message) => {
                *result.errors.entry(message).or_default() += 1;
                counters.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        counters.completed.fetch_add(1, Ordering::Relaxed);
    }
    (worker, result)
}

/// Prints elapsed time, requests so far and the last second's throughput until aborted.
async fn progress_task(p: ProgressLine, start: Instant, counters: Arc<Counters>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let (mut last_n, mut last_t) = (0, start);
    loop {
        tick.tick().await;
        let (n, failed, now) =
            (counters.completed.load(Ordering::Relaxed), counters.failed.load(Ordering::Relaxed), Instant::now());
        let rate = (n - last_n) as f64 / now.duration_since(last_t).as_secs_f64().max(1e-9);
        eprintln!(
            "[{:>6.1}s] {}: {n} requests ({failed} failed), {rate:.0} req/s, {:.0} infer/s",
            now.duration_since(start).as_secs_f64(),
            p.label,
            rate * f64::from(p.batch),
        );
        (last_n, last_t) = (n, now);
    }
}

/// CPU time this process has used (user + system), from `/proc/self/stat`; `None` elsewhere.
pub fn process_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // USER_HZ is 100 on every Linux ABI Rust targets.
    Some(Duration::from_millis((utime + stime) * 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails every third request, takes no time.
    struct Fake {
        calls: u64,
    }

    impl Worker for Fake {
        async fn infer(&mut self) -> Result<(), String> {
            self.calls += 1;
            tokio::task::yield_now().await;
            if self.calls.is_multiple_of(3) { Err("boom".into()) } else { Ok(()) }
        }
    }

    #[tokio::test]
    async fn a_request_count_is_shared_by_the_workers() {
        let workers = vec![Fake { calls: 0 }, Fake { calls: 0 }];
        let (workers, r) =
            run_phase(workers, Load::Closed { concurrency: 2 }, Stop::Count(30), None).await.expect("ok");
        assert_eq!(workers.iter().map(|w| w.calls).sum::<u64>(), 30);
        assert_eq!(r.latencies_ns.len() as u64 + r.failures(), 30);
        assert_eq!(r.errors.keys().collect::<Vec<_>>(), ["boom"]);
    }

    #[tokio::test]
    async fn open_loop_follows_the_schedule() {
        let workers = (0..4).map(|_| Fake { calls: 0 }).collect();
        let load = Load::Open { rate: 1000.0, max_inflight: 4 };
        let (workers, r) = run_phase(workers, load, Stop::After(Duration::from_millis(100)), None).await.expect("ok");
        assert_eq!(workers.iter().map(|w| w.calls).sum::<u64>(), 100, "1000/s for 0.1 s");
        assert!(r.elapsed >= Duration::from_millis(99), "the last request is due at 99 ms");
        let (_, r) = run_phase(workers, load, Stop::Count(7), None).await.expect("ok");
        assert_eq!(r.latencies_ns.len() as u64 + r.failures(), 7);
    }

    #[test]
    fn cpu_time_is_readable_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(process_cpu_time().is_some());
        }
    }
}
