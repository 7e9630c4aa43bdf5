//! The data plane's log spans: what an event logged on the way of a request, a batch, a
//! forwarded call or a model load is about, so that its line carries the tenant, model, version
//! and request id (and the caller's W3C trace id) without every event repeating them.
//!
//! - `request` (DEBUG): one per inference, opened by the request facade from the [`Origin`] the
//!   HTTP or gRPC front end filled in; it covers the model lookup, the queue, the batch and the
//!   encode, and the batcher carries it to the batch the request runs in.
//! - `batch` (DEBUG): one per model execution on an instance, `follows_from` each request it
//!   carries (a batch has many parents, so it is no request's child).
//! - `forward` (DEBUG): the gateway's sending of one request to a replica.
//! - `load` and `install` (INFO): a model loaded from the repository, a version installed by a
//!   worker's reconciler.
//!
//! Per-request spans are DEBUG because an enabled span costs microseconds per request (an
//! earlier measurement on the loaded 2-core box: ~4–6 µs with text lines, 6–12 µs with JSON),
//! against tens of nanoseconds while DEBUG is off, as it is by default: the macros then build
//! nothing and the fields are never computed. `span_cost` in the tests measures both (`cargo
//! test --release -p tessera-data-plane span_cost -- --ignored --nocapture`).
//! `log_verbose_level` 1 (or `RUST_LOG`) turns them on. A runner process has spans of its own:
//! the worker's request span does not cross the socket, so a batch in a runner has no request to
//! follow.

use std::sync::atomic::{AtomicU64, Ordering};

use tracing::{Level, Span, field};

use crate::trace::record::Parent;

/// Where an inference came from, as its front end saw it.
#[derive(Clone, Copy)]
pub struct Origin<'a> {
    /// `http` or `grpc`. (The client's request id is in the decoded body or message: the
    /// front end names it with [`name_request`] once decoded.)
    pub protocol: &'static str,
    /// Reads the request's `traceparent` header; asked only when the span is on.
    pub traceparent: &'a (dyn Fn() -> Option<&'a str> + Sync),
}

impl<'a> Origin<'a> {
    /// An origin without a `traceparent` (tests, internal callers).
    pub fn bare(protocol: &'static str) -> Self {
        Self { protocol, traceparent: &|| None }
    }
}

/// Whether DEBUG spans can be on at all: one relaxed load of the global level hint, so the
/// request path pays nothing more while they are off.
#[inline]
fn debug_on() -> bool {
    tracing::level_filters::LevelFilter::current() >= Level::DEBUG
}

/// Numbers requests that came without an id, so that their lines still group.
static UNNAMED: AtomicU64 = AtomicU64::new(0);

/// The id a request is logged under: the client's, or `#n` for one without.
fn request_id(id: &str) -> field::DisplayValue<String> {
    if id.is_empty() {
        field::display(format!("#{}", UNNAMED.fetch_add(1, Ordering::Relaxed) + 1))
    } else {
        field::display(id.to_string())
    }
}

/// The span of one inference to `model` (its version and request id are recorded later).
pub fn request(origin: &Origin<'_>, tenant: Option<&str>, model: &str) -> Span {
    let span = tracing::debug_span!(
        "request",
        protocol = origin.protocol,
        tenant = field::Empty,
        model,
        version = field::Empty,
        request_id = field::Empty,
        trace_id = field::Empty,
        parent_span_id = field::Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(tenant) = tenant {
        span.record("tenant", tenant);
    }
    if let Some(parent) = (origin.traceparent)().and_then(Parent::parse) {
        span.record("trace_id", field::display(format_args!("{:032x}", parent.trace_id)));
        span.record("parent_span_id", field::display(format_args!("{:016x}", parent.span_id)));
    }
    span
}

/// Records the version a request resolved to on its span.
pub fn resolved(span: &Span, version: i64) {
    if !span.is_disabled() {
        span.record("version", version);
    }
}

/// Names the current request by the id its decoded body or message carries; `#n` when it has
/// none.
pub fn name_request(id: &str) {
    if debug_on() {
        let span = Span::current();
        if !span.is_disabled() && span.metadata().is_some_and(|m| m.name() == "request") {
            span.record("request_id", request_id(id));
        }
    }
}

/// The request span a request is handed to the batcher under (off when DEBUG is).
pub fn current() -> Span {
    if debug_on() { Span::current() } else { Span::none() }
}

/// The span of one execution of `requests` (`items` batch rows) of `model` on an instance,
/// following each request span of `parents`.
pub fn batch<'p>(model: &str, requests: usize, items: usize, parents: impl Iterator<Item = &'p Span>) -> Span {
    let span = tracing::debug_span!("batch", model, requests, items);
    if !span.is_disabled() {
        for parent in parents {
            span.follows_from(parent);
        }
    }
    span
}

/// The span of the gateway's forwarding of one request for `model` to its replicas.
pub fn forward(protocol: &'static str, tenant: &str, model: &str, version: Option<i64>) -> Span {
    tracing::debug_span!("forward", protocol, tenant, model, version)
}

/// The span of loading `model` from the repository.
pub fn load(model: &str) -> Span {
    tracing::info_span!("load", model)
}

/// The span of a worker's install of `version` of the model keyed `key` (tenant/model).
pub fn install(key: &str, version: i64) -> Span {
    tracing::info_span!("install", key, version)
}

#[cfg(test)]
mod tests;
