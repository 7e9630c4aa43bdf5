//! Per model-version statistics in the shape of Triton's statistics extension.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tessera_protocol::inference::{InferBatchStatistics, InferStatistics, ModelStatistics, StatisticDuration};

/// A duration in whole nanoseconds, saturating.
pub fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A count and a total duration, updated without locks.
#[derive(Debug, Default)]
pub struct Duration {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Duration {
    /// Records one event that took `ns`.
    pub fn record(&self, ns: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Snapshot as the protobuf message.
    pub fn snapshot(&self) -> StatisticDuration {
        StatisticDuration { count: self.count.load(Ordering::Relaxed), ns: self.ns.load(Ordering::Relaxed) }
    }
}

/// Why a request failed, as Triton's `nv_inference_request_failure` `reason` label says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// Refused by the queue: full or timed out.
    Rejected,
    /// The client went away before it ran.
    Canceled,
    /// The backend failed to run it.
    Backend,
    /// Anything else (invalid request, ...).
    Other,
}

impl FailReason {
    /// Every reason, in label order.
    pub const ALL: [FailReason; 4] =
        [FailReason::Rejected, FailReason::Canceled, FailReason::Backend, FailReason::Other];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::Rejected => "REJECTED",
            FailReason::Canceled => "CANCELED",
            FailReason::Backend => "BACKEND",
            FailReason::Other => "OTHER",
        }
    }
}

/// Upper bounds (µs) of the request latency histogram.
pub const LATENCY_BUCKETS_US: [u64; 14] =
    [50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000, 5_000_000];
/// Upper bounds of the executed batch size histogram.
pub const BATCH_BUCKETS: [u64; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// A cumulative histogram with fixed buckets, updated without locks.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    /// One count per bound, plus one for +Inf.
    counts: Vec<AtomicU64>,
    sum: AtomicU64,
}

impl Histogram {
    /// An empty histogram over `bounds`.
    pub fn new(bounds: &'static [u64]) -> Self {
        Self { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum: AtomicU64::new(0) }
    }

    /// Records one observation.
    pub fn observe(&self, value: u64) {
        let i = self.bounds.iter().position(|b| value <= *b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// `(upper bound or None for +Inf, cumulative count)` per bucket, and the sum.
    pub fn snapshot(&self) -> (Vec<(Option<u64>, u64)>, u64) {
        let mut cumulative = 0;
        let buckets = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                cumulative += c.load(Ordering::Relaxed);
                (self.bounds.get(i).copied(), cumulative)
            })
            .collect();
        (buckets, self.sum.load(Ordering::Relaxed))
    }
}

/// Per-batch-size compute durations.
#[derive(Debug, Default, Clone, Copy)]
struct BatchEntry {
    count: u64,
    input_ns: u64,
    infer_ns: u64,
    output_ns: u64,
}

/// Statistics of one model version; shared by its handlers and instance threads.
#[derive(Debug)]
pub struct ModelStats {
    /// Successful requests, request arrival to response.
    pub success: Duration,
    /// Failed requests.
    pub fail: Duration,
    /// Time requests waited for an instance.
    pub queue: Duration,
    /// Preparing inputs, per request.
    pub compute_input: Duration,
    /// Running the model, per request.
    pub compute_infer: Duration,
    /// Extracting outputs, per request.
    pub compute_output: Duration,
    /// Requests answered from the response cache: lookup time. Counted where the cache is
    /// (the front), never in a runner's tally.
    pub cache_hit: Duration,
    /// Requests the response cache did not hold: lookup and insert time.
    pub cache_miss: Duration,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    /// Summed compute time of all executions (decides inline runs).
    execution_ns: AtomicU64,
    last_inference_ms: AtomicU64,
    batches: Mutex<BTreeMap<u64, BatchEntry>>,
    failures: [AtomicU64; 4],
    /// Successful request durations (µs).
    pub latency_us: Histogram,
    /// Items per execution.
    pub batch_sizes: Histogram,
}

impl Default for ModelStats {
    fn default() -> Self {
        Self {
            success: Duration::default(),
            fail: Duration::default(),
            queue: Duration::default(),
            compute_input: Duration::default(),
            compute_infer: Duration::default(),
            compute_output: Duration::default(),
            cache_hit: Duration::default(),
            cache_miss: Duration::default(),
            inference_count: AtomicU64::new(0),
            execution_count: AtomicU64::new(0),
            execution_ns: AtomicU64::new(0),
            last_inference_ms: AtomicU64::new(0),
            batches: Mutex::new(BTreeMap::new()),
            failures: Default::default(),
            latency_us: Histogram::new(&LATENCY_BUCKETS_US),
            batch_sizes: Histogram::new(&BATCH_BUCKETS),
        }
    }
}

/// The timings of one backend execution.
#[derive(Debug, Clone, Copy)]
pub struct Execution {
    /// Items in the batch.
    pub batch_size: u64,
    /// Input preparation.
    pub input_ns: u64,
    /// Model run.
    pub infer_ns: u64,
    /// Output extraction.
    pub output_ns: u64,
}

impl ModelStats {
    /// Counts a failed request by reason.
    pub fn record_failure_reason(&self, reason: FailReason) {
        self.failures[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Failed requests with this reason.
    pub fn failures(&self, reason: FailReason) -> u64 {
        self.failures[reason as usize].load(Ordering::Relaxed)
    }

    /// Executions so far and their summed compute time (input + infer + output), in ns.
    pub fn mean_execution(&self) -> (u64, u64) {
        let count = self.execution_count.load(Ordering::Relaxed);
        let ns = self.execution_ns.load(Ordering::Relaxed);
        (count, ns)
    }

    /// Records one backend execution of `exec.batch_size` items.
    pub fn record_execution(&self, exec: Execution) {
        self.inference_count.fetch_add(exec.batch_size, Ordering::Relaxed);
        self.execution_count.fetch_add(1, Ordering::Relaxed);
        self.execution_ns.fetch_add(exec.input_ns + exec.infer_ns + exec.output_ns, Ordering::Relaxed);
        self.batch_sizes.observe(exec.batch_size);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.last_inference_ms.store(now_ms, Ordering::Relaxed);
        let mut batches = self.batches.lock();
        let entry = batches.entry(exec.batch_size).or_default();
        entry.count += 1;
        entry.input_ns += exec.input_ns;
        entry.infer_ns += exec.infer_ns;
        entry.output_ns += exec.output_ns;
    }

    /// Snapshot for the statistics endpoints.
    pub fn snapshot(&self, name: &str, version: &str) -> ModelStatistics {
        let batch_stats = self
            .batches
            .lock()
            .iter()
            .map(|(size, e)| InferBatchStatistics {
                batch_size: *size,
                compute_input: Some(StatisticDuration { count: e.count, ns: e.input_ns }),
                compute_infer: Some(StatisticDuration { count: e.count, ns: e.infer_ns }),
                compute_output: Some(StatisticDuration { count: e.count, ns: e.output_ns }),
            })
            .collect();
        ModelStatistics {
            name: name.to_string(),
            version: version.to_string(),
            last_inference: self.last_inference_ms.load(Ordering::Relaxed),
            inference_count: self.inference_count.load(Ordering::Relaxed),
            execution_count: self.execution_count.load(Ordering::Relaxed),
            inference_stats: Some(InferStatistics {
                success: Some(self.success.snapshot()),
                fail: Some(self.fail.snapshot()),
                queue: Some(self.queue.snapshot()),
                compute_input: Some(self.compute_input.snapshot()),
                compute_infer: Some(self.compute_infer.snapshot()),
                compute_output: Some(self.compute_output.snapshot()),
                cache_hit: Some(self.cache_hit.snapshot()),
                cache_miss: Some(self.cache_miss.snapshot()),
            }),
            batch_stats,
            memory_usage: Vec::new(),
            response_stats: Default::default(),
        }
    }
}

/// A plain copy of every counter of a [`ModelStats`]: what a runner process sends the worker so
/// the worker's statistics stay exact across runners and their restarts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Every atomic counter, in `ModelStats::atomics` order.
    pub counters: Vec<u64>,
    /// Per batch size: executions, input ns, infer ns, output ns.
    pub batches: Vec<(u64, [u64; 4])>,
}

impl Tally {
    /// What happened since `earlier` (a tally of the same statistics taken before this one).
    pub fn since(&self, earlier: &Tally) -> Tally {
        let mut counters: Vec<u64> = self
            .counters
            .iter()
            .zip(earlier.counters.iter().chain(std::iter::repeat(&0)))
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        // The last inference time is a point in time, not a count: the newer one stands.
        if let Some(last) = counters.get_mut(LAST_INFERENCE) {
            *last = self.counters[LAST_INFERENCE];
        }
        let batches = self
            .batches
            .iter()
            .filter_map(|(size, now)| {
                let before = earlier.batches.iter().find(|(s, _)| s == size).map_or([0; 4], |(_, b)| *b);
                let diff = std::array::from_fn(|i| now[i].saturating_sub(before[i]));
                (diff[0] > 0).then_some((*size, diff))
            })
            .collect();
        Tally { counters, batches }
    }

    /// Whether nothing happened in this tally.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty() && self.counters.iter().enumerate().all(|(i, c)| i == LAST_INFERENCE || *c == 0)
    }
}

/// Where the last inference time sits in [`ModelStats::atomics`].
const LAST_INFERENCE: usize = 15;

impl ModelStats {
    /// Every atomic counter in a fixed order ([`Tally::counters`]).
    fn atomics(&self) -> Vec<&AtomicU64> {
        let mut all = Vec::with_capacity(48);
        for d in
            [&self.success, &self.fail, &self.queue, &self.compute_input, &self.compute_infer, &self.compute_output]
        {
            all.extend([&d.count, &d.ns]);
        }
        all.extend([&self.inference_count, &self.execution_count, &self.execution_ns, &self.last_inference_ms]);
        all.extend(self.failures.iter());
        for h in [&self.latency_us, &self.batch_sizes] {
            all.extend(h.counts.iter());
            all.push(&h.sum);
        }
        all
    }

    /// A copy of every counter now.
    pub fn tally(&self) -> Tally {
        let counters = self.atomics().iter().map(|a| a.load(Ordering::Relaxed)).collect();
        let batches = self
            .batches
            .lock()
            .iter()
            .map(|(size, e)| (*size, [e.count, e.input_ns, e.infer_ns, e.output_ns]))
            .collect();
        Tally { counters, batches }
    }

    /// Adds what another process counted (a [`Tally::since`] delta); extra counters are ignored.
    pub fn add(&self, delta: &Tally) {
        for (i, (atomic, value)) in self.atomics().into_iter().zip(&delta.counters).enumerate() {
            if i == LAST_INFERENCE {
                atomic.fetch_max(*value, Ordering::Relaxed);
            } else {
                atomic.fetch_add(*value, Ordering::Relaxed);
            }
        }
        if delta.batches.is_empty() {
            return;
        }
        let mut batches = self.batches.lock();
        for (size, [count, input_ns, infer_ns, output_ns]) in &delta.batches {
            let e = batches.entry(*size).or_default();
            e.count += count;
            e.input_ns += input_ns;
            e.infer_ns += infer_ns;
            e.output_ns += output_ns;
        }
    }
}

/// Renders statistics as Triton's HTTP JSON (`{"model_stats": [...]}`), 64-bit counters as numbers.
pub fn to_json(stats: &[ModelStatistics]) -> serde_json::Value {
    let duration = |d: &Option<StatisticDuration>| {
        let d = d.unwrap_or_default();
        serde_json::json!({ "count": d.count, "ns": d.ns })
    };
    let models: Vec<serde_json::Value> = stats
        .iter()
        .map(|s| {
            let i = s.inference_stats.unwrap_or_default();
            serde_json::json!({
                "name": s.name,
                "version": s.version,
                "last_inference": s.last_inference,
                "inference_count": s.inference_count,
                "execution_count": s.execution_count,
                "inference_stats": {
                    "success": duration(&i.success),
                    "fail": duration(&i.fail),
                    "queue": duration(&i.queue),
                    "compute_input": duration(&i.compute_input),
                    "compute_infer": duration(&i.compute_infer),
                    "compute_output": duration(&i.compute_output),
                    "cache_hit": duration(&i.cache_hit),
                    "cache_miss": duration(&i.cache_miss),
                },
                "response_stats": {},
                "batch_stats": s.batch_stats.iter().map(|b| serde_json::json!({
                    "batch_size": b.batch_size,
                    "compute_input": duration(&b.compute_input),
                    "compute_infer": duration(&b.compute_infer),
                    "compute_output": duration(&b.compute_output),
                })).collect::<Vec<_>>(),
                "memory_usage": [],
            })
        })
        .collect();
    serde_json::json!({ "model_stats": models })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executions_accumulate_per_batch_size() {
        let stats = ModelStats::default();
        stats.record_execution(Execution { batch_size: 2, input_ns: 10, infer_ns: 100, output_ns: 5 });
        stats.record_execution(Execution { batch_size: 2, input_ns: 10, infer_ns: 100, output_ns: 5 });
        stats.record_execution(Execution { batch_size: 1, input_ns: 1, infer_ns: 1, output_ns: 1 });
        stats.success.record(500);
        let snap = stats.snapshot("m", "1");
        assert_eq!(snap.inference_count, 5);
        assert_eq!(snap.execution_count, 3);
        assert_eq!(snap.batch_stats.len(), 2);
        assert_eq!(snap.batch_stats[1].compute_infer, Some(StatisticDuration { count: 2, ns: 200 }));
        let json = to_json(&[snap]);
        assert_eq!(json["model_stats"][0]["inference_stats"]["success"]["count"], 1);
        assert_eq!(json["model_stats"][0]["batch_stats"][0]["batch_size"], 1);
    }

    #[test]
    fn tallies_carry_every_counter_and_deltas_add_up() {
        let runner = ModelStats::default();
        runner.record_execution(Execution { batch_size: 2, input_ns: 10, infer_ns: 100, output_ns: 5 });
        runner.success.record(700);
        runner.latency_us.observe(3);
        let first = runner.tally();
        assert_eq!(first.counters.len(), runner.atomics().len());
        runner.record_execution(Execution { batch_size: 4, input_ns: 1, infer_ns: 2, output_ns: 3 });
        runner.record_failure_reason(FailReason::Backend);
        runner.fail.record(9);
        let second = runner.tally();
        let front = ModelStats::default();
        front.add(&first.since(&Tally::default()));
        front.add(&second.since(&first));
        assert!(second.since(&second).is_empty());
        let (a, b) = (runner.snapshot("m", "1"), front.snapshot("m", "1"));
        assert_eq!(a, b);
        assert_eq!(front.failures(FailReason::Backend), 1);
        assert_eq!(front.latency_us.snapshot(), runner.latency_us.snapshot());
    }
}
