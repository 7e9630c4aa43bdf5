//! The request facade HTTP and gRPC both call for an inference: the model resolved in the
//! caller's tenant, the protocol's decode, infer and encode, and what the usage hook hears of
//! it, in one place. The serving layer knows no meter: a worker installs its usage meter as a
//! [`UsageHook`] and its capture queue as a [`CaptureHook`]; `tessera serve` installs neither.

use std::time::{Instant, SystemTime};

use tracing::Instrument as _;

use crate::auth::Principal;
use crate::engine::infer::InferRequest;
use crate::engine::model::LoadedModel;
use crate::engine::model_spec::ModelSpec;
use crate::error::Result;
use crate::serve::capture::{CaptureHook, Finished, Tap};
use crate::serve::server::ServerState;
use crate::spans::{self, Origin};

/// What one inference that reached a tenant's model came to.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// When the request reached the handler (after authentication).
    pub started: Instant,
    /// Answered successfully.
    pub success: bool,
    /// Batch rows of the request.
    pub rows: u32,
    /// Request body or message bytes.
    pub bytes_in: u64,
    /// Response body or message bytes (0 for a failure).
    pub bytes_out: u64,
}

/// Hears every inference that reached a tenant's model (a worker's usage meter).
pub trait UsageHook: Send + Sync {
    /// One inference, before its answer goes back to the client.
    fn record(&self, tenant_id: &str, model: &str, version: i64, outcome: Outcome);
    /// Appends the hook's own families to a `/metrics` scrape.
    fn render_metrics(&self, out: &mut String);
}

/// A protocol's inference: its encoded answer and what usage counts of it.
pub struct Answered<T> {
    /// The answer as the protocol sends it.
    pub answer: T,
    /// Batch rows of the request ([`batch_rows`]).
    pub rows: u32,
    /// Encoded answer bytes.
    pub bytes_out: u64,
}

impl ServerState {
    /// One inference: resolves `model` in the caller's tenant, runs the protocol's `run` on it
    /// (decode, infer, encode), and tells the usage hook how it went. `bytes_in` is asked only
    /// when a hook listens. `run` shows the request and answer to the [`Tap`], which keeps them
    /// only when the capture hook sampled this request. All of it runs in the request's log
    /// span (see [`spans`]), opened from `origin`.
    pub async fn infer<T>(
        &self,
        origin: Origin<'_>,
        caller: Option<&Principal>,
        model: &str,
        version: Option<i64>,
        bytes_in: impl FnOnce() -> u64,
        run: impl AsyncFnOnce(&LoadedModel, &mut Tap) -> Result<Answered<T>>,
    ) -> Result<T> {
        let span = spans::request(&origin, caller.map(|c| c.tenant_id.as_str()), model);
        let result = self.infer_in_span(caller, model, version, bytes_in, &span, run).instrument(span.clone()).await;
        span.in_scope(|| match &result {
            // A line per answered request only at TRACE; a failure is worth one at DEBUG.
            Ok(_) => tracing::trace!("request answered"),
            Err(e) => tracing::debug!(kind = ?e.kind, error = %e.message, "request failed"),
        });
        result
    }

    /// [`Self::infer`] inside its span, which hears the resolved version.
    async fn infer_in_span<T>(
        &self,
        caller: Option<&Principal>,
        model: &str,
        version: Option<i64>,
        bytes_in: impl FnOnce() -> u64,
        span: &tracing::Span,
        run: impl AsyncFnOnce(&LoadedModel, &mut Tap) -> Result<Answered<T>>,
    ) -> Result<T> {
        // Refused over its tenant's cap before it reaches a model: not billed.
        let _admitted = match (self.tenant_gate(), caller) {
            (Some(gate), Some(caller)) => Some(gate.admit(&caller.tenant_id)?),
            _ => None,
        };
        let metered = self.usage().zip(caller).map(|(hook, caller)| (hook, caller, Instant::now(), bytes_in()));
        let loaded = self.model(caller, model, version)?;
        spans::resolved(span, loaded.version);
        let capture = self.capture().zip(caller).and_then(|(hook, caller)| {
            let ticket = hook.sample(&caller.tenant_id, &loaded.spec.name)?;
            Some((hook, ticket, SystemTime::now(), Instant::now()))
        });
        let mut tap = capture.as_ref().map_or_else(Tap::off, |(_, ticket, ..)| Tap::on(ticket.settings));
        let result = run(&loaded, &mut tap).await;
        if let (Some((hook, ticket, received_at, started)), Some(caller)) = (capture, caller) {
            submit_capture(
                hook,
                tap,
                ticket,
                &result,
                Finished {
                    tenant_id: caller.tenant_id.clone(),
                    model: loaded.spec.name.clone(),
                    version: loaded.version,
                    received_at,
                    duration: started.elapsed(),
                    error: None,
                },
            );
        }
        if let Some((hook, caller, started, bytes_in)) = metered {
            let (success, rows, bytes_out) = match &result {
                Ok(done) => (true, done.rows, done.bytes_out),
                Err(_) => (false, 0, 0),
            };
            let outcome = Outcome { started, success, rows, bytes_in, bytes_out };
            hook.record(&caller.tenant_id, &loaded.spec.name, loaded.version, outcome);
        }
        result.map(|done| done.answer)
    }
}

/// Hands a sampled request's record to the capture hook (which never waits).
fn submit_capture<T>(
    hook: &dyn CaptureHook,
    tap: Tap,
    ticket: crate::serve::capture::Ticket,
    result: &Result<Answered<T>>,
    mut done: Finished,
) {
    done.error = result.as_ref().err().map(|e| e.message.clone());
    if let Some(record) = tap.into_record(ticket, done) {
        hook.submit(record);
    }
}

/// The batch rows of a request as usage counts them: the first input's first dimension for
/// a batching model, else 1.
pub fn batch_rows(spec: &ModelSpec, request: &InferRequest) -> u32 {
    if spec.max_batch_size == 0 {
        return 1;
    }
    let first = request.inputs.first().and_then(|i| i.shape.first()).copied().unwrap_or(1);
    u32::try_from(first).unwrap_or(0)
}
