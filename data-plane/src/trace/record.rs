//! One sampled request's trace: the timestamps its steps stamp as it goes (HTTP or gRPC
//! handler, model, batcher, instance), handed to the process's trace sink when the last holder
//! drops it. An unsampled request carries [`Trace::off`], which holds nothing and stamps nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use super::sink::Sink;

/// A step of a request, named as in Triton's trace output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The HTTP handler starts reading the request.
    HttpRecvStart,
    /// The HTTP request is decoded.
    HttpRecvEnd,
    /// The gRPC handler starts reading the request.
    GrpcWaitreadStart,
    /// The gRPC request is decoded.
    GrpcWaitreadEnd,
    /// The request passed the model's checks.
    RequestStart,
    /// The request entered the model's queue.
    QueueStart,
    /// An instance took the request's batch.
    ComputeStart,
    /// The batch's inputs are in place.
    ComputeInputEnd,
    /// The model ran; outputs are being extracted.
    ComputeOutputStart,
    /// The batch's outputs are split per request.
    ComputeEnd,
    /// The model answered the request.
    RequestEnd,
    /// The response is complete.
    InferResponseComplete,
    /// The HTTP handler starts encoding the response.
    HttpSendStart,
    /// The HTTP response is encoded and handed to the connection.
    HttpSendEnd,
    /// The gRPC handler starts encoding the response.
    GrpcSendStart,
    /// The gRPC response is encoded and handed to the connection.
    GrpcSendEnd,
}

/// Which OpenTelemetry span an event belongs to (Triton's three: request, model, compute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// `InferRequest`: the protocol handler.
    Request,
    /// The model's span: checks to answer.
    Model,
    /// `compute`: an instance's run.
    Compute,
}

impl Event {
    /// Every event, in the order of their wire codes ([`Event::code`]).
    const ALL: [Event; 16] = [
        Self::HttpRecvStart,
        Self::HttpRecvEnd,
        Self::GrpcWaitreadStart,
        Self::GrpcWaitreadEnd,
        Self::RequestStart,
        Self::QueueStart,
        Self::ComputeStart,
        Self::ComputeInputEnd,
        Self::ComputeOutputStart,
        Self::ComputeEnd,
        Self::RequestEnd,
        Self::InferResponseComplete,
        Self::HttpSendStart,
        Self::HttpSendEnd,
        Self::GrpcSendStart,
        Self::GrpcSendEnd,
    ];

    /// The event's code on the runner wire.
    pub fn code(self) -> u8 {
        Self::ALL.iter().position(|e| *e == self).unwrap_or(0) as u8
    }

    /// The event of a wire code.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(usize::from(code)).copied()
    }

    /// Triton's name of the event.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HttpRecvStart => "HTTP_RECV_START",
            Self::HttpRecvEnd => "HTTP_RECV_END",
            Self::GrpcWaitreadStart => "GRPC_WAITREAD_START",
            Self::GrpcWaitreadEnd => "GRPC_WAITREAD_END",
            Self::RequestStart => "REQUEST_START",
            Self::QueueStart => "QUEUE_START",
            Self::ComputeStart => "COMPUTE_START",
            Self::ComputeInputEnd => "COMPUTE_INPUT_END",
            Self::ComputeOutputStart => "COMPUTE_OUTPUT_START",
            Self::ComputeEnd => "COMPUTE_END",
            Self::RequestEnd => "REQUEST_END",
            Self::InferResponseComplete => "INFER_RESPONSE_COMPLETE",
            Self::HttpSendStart => "HTTP_SEND_START",
            Self::HttpSendEnd => "HTTP_SEND_END",
            Self::GrpcSendStart => "GRPC_SEND_START",
            Self::GrpcSendEnd => "GRPC_SEND_END",
        }
    }

    /// The span the event is reported on in OpenTelemetry mode.
    pub fn span(self) -> Span {
        match self {
            Self::RequestStart | Self::QueueStart | Self::RequestEnd => Span::Model,
            Self::ComputeStart | Self::ComputeInputEnd | Self::ComputeOutputStart | Self::ComputeEnd => Span::Compute,
            _ => Span::Request,
        }
    }
}

/// The caller's span from a W3C `traceparent` header (OpenTelemetry context propagation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    /// The trace the request joins.
    pub trace_id: u128,
    /// The caller's span, parent of the request's span.
    pub span_id: u64,
}

impl Parent {
    /// Reads `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`; anything else (or all-zero
    /// ids, which the format forbids) is no parent.
    pub fn parse(header: &str) -> Option<Self> {
        let mut parts = header.trim().split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex(version, 2) || version == "ff" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        let trace_id = u128::from_str_radix(trace, 16).ok().filter(|id| *id != 0)?;
        let span_id = u64::from_str_radix(span, 16).ok().filter(|id| *id != 0)?;
        Some(Self { trace_id, span_id })
    }
}

/// Where a trace sits among others: its OpenTelemetry ids, fixed when it starts (so the traces
/// of an ensemble's composing models can hang under its spans), and for a composing model's
/// trace the ensemble's trace (Triton's `parent_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lineage {
    /// The OpenTelemetry trace: the caller's (from `traceparent`) or a new one.
    pub trace_id: u128,
    /// The `InferRequest` span (0 for a composing model's trace, which has none).
    pub request_span: u64,
    /// The model's span.
    pub model_span: u64,
    /// What the trace's top span hangs under: the caller's span, or the ensemble's model span.
    pub parent_span: Option<u64>,
    /// The containing ensemble's trace id; 0 for a request's own trace.
    pub parent_id: u64,
}

impl Lineage {
    /// A request's own trace, joining the caller's when it carried a `traceparent`.
    pub fn root(parent: Option<Parent>) -> Self {
        Self {
            trace_id: parent.map_or_else(|| random_id(128), |p| p.trace_id),
            request_span: random_id(64) as u64,
            model_span: random_id(64) as u64,
            parent_span: parent.map(|p| p.span_id),
            parent_id: 0,
        }
    }

    /// The trace of a composing model run for the trace `parent_id` with this lineage.
    fn child(&self, parent_id: u64) -> Self {
        Self {
            trace_id: self.trace_id,
            request_span: 0,
            model_span: random_id(64) as u64,
            parent_span: Some(self.model_span),
            parent_id,
        }
    }
}

/// A random non-zero id of `bits` bits.
pub fn random_id(bits: u32) -> u128 {
    let id = uuid::Uuid::new_v4().as_u128() >> (128 - bits);
    id.max(1)
}

/// A sampled request's trace, shared by the steps that stamp it; cloning is cheap.
#[derive(Debug, Clone, Default)]
pub struct Trace(Option<Arc<Record>>);

impl Trace {
    /// No trace: every stamp is a no-op.
    pub const fn off() -> Self {
        Self(None)
    }

    /// Whether this request is traced.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Notes `event` now.
    pub fn stamp(&self, event: Event) {
        if let Some(record) = &self.0 {
            record.stamp(event, Instant::now());
        }
    }

    /// Notes `event` at `at` (a time a step measured anyway).
    pub fn stamp_at(&self, event: Event, at: Instant) {
        if let Some(record) = &self.0 {
            record.stamp(event, at);
        }
    }

    /// Notes the request's id, once the request is decoded.
    pub fn set_request_id(&self, id: &str) {
        if let Some(record) = &self.0 {
            let mut state = record.state.lock();
            if state.request_id.is_empty() {
                state.request_id = id.to_string();
            }
        }
    }

    pub(super) fn on(record: Record) -> Self {
        Self(Some(Arc::new(record)))
    }

    /// A trace that goes nowhere but keeps its stamps for [`Trace::steps`]: how a runner
    /// records the queue and compute steps of a request its front traces.
    pub fn collecting() -> Self {
        Self::on(Record {
            id: 0,
            model: String::new(),
            version: 0,
            lineage: Lineage::root(None),
            log_frequency: 0,
            state: Mutex::default(),
            sink: Sink::None,
            ids: Default::default(),
        })
    }

    /// The trace of a composing model's request run for this (an ensemble's) request: traced
    /// when this one is, with the ensemble's trace as its parent.
    pub fn child(&self, model: &str, version: i64) -> Self {
        match &self.0 {
            None => Self::off(),
            Some(parent) => Self::on(Record {
                id: parent.ids.fetch_add(1, Ordering::Relaxed) + 1,
                model: model.to_string(),
                version,
                lineage: parent.lineage.child(parent.id),
                log_frequency: parent.log_frequency,
                state: Mutex::default(),
                sink: parent.sink.clone(),
                ids: parent.ids.clone(),
            }),
        }
    }

    /// The steps stamped so far, in steady-clock nanoseconds (`CLOCK_MONOTONIC`, the same in
    /// every process of the machine).
    pub fn steps(&self) -> Vec<(Event, u64)> {
        match &self.0 {
            Some(record) => record.state.lock().events.iter().map(|(e, at)| (*e, clock().steady_ns(*at))).collect(),
            None => Vec::new(),
        }
    }

    /// Notes `event` at steady-clock nanoseconds `ns` (stamped by another process).
    pub fn stamp_steady(&self, event: Event, ns: u64) {
        if self.0.is_some() {
            self.stamp_at(event, clock().instant(ns));
        }
    }
}

/// What one sampled request has recorded so far.
#[derive(Debug)]
pub(super) struct Record {
    pub(super) id: u64,
    pub(super) model: String,
    pub(super) version: i64,
    pub(super) lineage: Lineage,
    /// The file rotation in force when the request was sampled (Triton mode).
    pub(super) log_frequency: u32,
    pub(super) state: Mutex<RecordState>,
    pub(super) sink: Sink,
    /// The process's trace ids (the last one given), for composing models' traces.
    pub(super) ids: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
pub(super) struct RecordState {
    pub(super) request_id: String,
    pub(super) events: Vec<(Event, Instant)>,
}

impl Record {
    fn stamp(&self, event: Event, at: Instant) {
        self.state.lock().events.push((event, at));
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let state = std::mem::take(self.state.get_mut());
        let mut events = state.events;
        events.sort_by_key(|(_, at)| *at);
        self.sink.submit(Finished {
            id: self.id,
            model: std::mem::take(&mut self.model),
            version: self.version,
            request_id: state.request_id,
            lineage: self.lineage,
            log_frequency: self.log_frequency,
            events: events.into_iter().map(|(e, at)| (e, clock().steady_ns(at), clock().unix_ns(at))).collect(),
        });
    }
}

/// A finished trace, as the sinks write it.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The trace's number in this process, from 1.
    pub id: u64,
    /// Model name.
    pub model: String,
    /// Model version.
    pub version: i64,
    /// The request's id (empty when it gave none).
    pub request_id: String,
    /// Its OpenTelemetry ids and parents.
    pub lineage: Lineage,
    /// Traces per file in force when it was sampled.
    pub log_frequency: u32,
    /// Events in time order: (event, steady-clock ns, Unix-epoch ns).
    pub events: Vec<(Event, u64, u64)>,
}

/// Converts `Instant`s to Triton's steady-clock nanoseconds (`CLOCK_MONOTONIC`, as C++'s
/// `steady_clock` reads on Linux) and to Unix-epoch nanoseconds for OpenTelemetry.
struct Clock {
    at: Instant,
    steady_ns: u64,
    unix_ns: u64,
}

impl Clock {
    fn steady_ns(&self, t: Instant) -> u64 {
        shift(self.steady_ns, self.at, t)
    }

    fn unix_ns(&self, t: Instant) -> u64 {
        shift(self.unix_ns, self.at, t)
    }

    /// The `Instant` of steady-clock nanoseconds `ns` (the anchor when it cannot be shown).
    fn instant(&self, ns: u64) -> Instant {
        let shifted = match ns.checked_sub(self.steady_ns) {
            Some(after) => self.at.checked_add(std::time::Duration::from_nanos(after)),
            None => self.at.checked_sub(std::time::Duration::from_nanos(self.steady_ns - ns)),
        };
        shifted.unwrap_or(self.at)
    }
}

fn shift(base: u64, anchor: Instant, t: Instant) -> u64 {
    let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    match t.checked_duration_since(anchor) {
        Some(after) => base.saturating_add(ns(after)),
        None => base.saturating_sub(ns(anchor - t)),
    }
}

fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| {
        let at = Instant::now();
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
        let steady = match unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } {
            0 => (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64),
            _ => 0,
        };
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Clock { at, steady_ns: steady, unix_ns: unix }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_headers_parse_and_bad_ones_are_ignored() {
        let p = Parent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").expect("valid");
        assert_eq!(p.trace_id, 0x0af7651916cd43dd8448eb211c80319c);
        assert_eq!(p.span_id, 0xb7ad6b7169203331);
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
        ] {
            assert_eq!(Parent::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn instants_map_onto_both_clocks_in_order() {
        let c = clock();
        let later = c.at + std::time::Duration::from_micros(5);
        assert_eq!(c.steady_ns(later) - c.steady_ns(c.at), 5_000);
        assert_eq!(c.unix_ns(later) - c.unix_ns(c.at), 5_000);
        let earlier = c.at.checked_sub(std::time::Duration::from_nanos(10)).expect("the clock started long ago");
        assert_eq!(c.steady_ns(c.at) - c.steady_ns(earlier), 10);
    }
}
