//! The worker's session with the control plane: register, then heartbeats up and assignment
//! sets down, over one bidirectional gRPC stream.
//!
//! Heartbeats carry the unhealthy slices too ([`Reports::unhealthy`]), at once when they
//! change. When the slices change (a new MIG layout), the session ends and a new one registers
//! them ([`Reports::register`]); the control plane updates the worker's slices on registration.
//!
//! The control plane also sends the revocation list on the session; the worker's authenticator
//! enforces each list as it arrives ([`crate::auth::Authenticator::apply_revocations`]).
//!
//! When the stream breaks (control plane restarting, network trouble, a refused token) the
//! worker reconnects with capped exponential backoff and meanwhile keeps serving everything it
//! has loaded: nothing is unloaded because the control plane is away (static stability). It
//! keeps enforcing the last revocation list too; the next session sends the list whole.

use std::sync::Arc;
use std::time::Duration;

use tessera_protocol::agent::{self, control_message, worker_message};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::client::AgentClient;
use super::reconcile::{Reconciler, WorkerStatus};
use crate::auth::{Authenticator, IdentityKey};

/// First reconnect delay.
const BACKOFF_START: Duration = Duration::from_millis(200);
/// Longest reconnect delay (well under the control plane's default worker-lost time of 10 s).
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long opening the stream may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Heartbeat interval until the control plane names one.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// Outgoing messages buffered; a full buffer means the control plane stopped reading.
const OUTBOX: usize = 16;

/// What the worker reports besides its replicas, each followed as it changes, and what enforces
/// what the control plane sends besides assignments.
pub struct Reports {
    /// The `Register` message. The worker sends a new one when its slices change; the session
    /// then ends and a new one registers with it.
    pub register: watch::Receiver<agent::Register>,
    /// The unhealthy slices every heartbeat carries; a change goes up at once.
    pub unhealthy: watch::Receiver<Vec<agent::UnhealthySlice>>,
    /// Set to the generation of the first assignment set the control plane sends (after
    /// registering): the worker is ready once that set is installed.
    pub assigned: watch::Sender<Option<u64>>,
    /// Enforces the revocation lists the control plane sends, and checks forwarded identities
    /// with the gateways' key it names.
    pub auth: Arc<Authenticator>,
    /// The forwarded-identity key derived from this worker's own token: the one checked when the
    /// control plane names no gateway key (its gateways hold the worker token).
    pub own_identity: IdentityKey,
}

/// Why a session ended.
#[derive(Debug)]
enum Ended {
    /// Shutdown was requested.
    Shutdown,
    /// The slices changed: register again at once.
    Reregister,
    /// The stream broke or could not be opened; `registered` if it got as far as that.
    Lost { reason: String, registered: bool },
}

/// Keeps a session open until `shutdown`, reconnecting as needed.
pub async fn run(client: AgentClient, mut reports: Reports, reconciler: Reconciler, shutdown: CancellationToken) {
    let mut backoff = BACKOFF_START;
    loop {
        let register = reports.register.borrow_and_update().clone();
        match session(client.clone(), &register, &mut reports, &reconciler, &shutdown).await {
            Ended::Shutdown => return,
            Ended::Reregister => {
                tracing::info!(
                    slices = reports.register.borrow().slices.len(),
                    "the slices changed; registering again"
                );
                backoff = BACKOFF_START;
                continue;
            }
            Ended::Lost { reason, registered } => {
                reports.auth.revocations().stream_lost();
                if registered {
                    backoff = BACKOFF_START;
                }
                let retry_ms = backoff.as_millis();
                if registered {
                    tracing::warn!(%reason, retry_ms, "control plane session lost; serving what is loaded");
                } else {
                    tracing::warn!(%reason, retry_ms, "cannot open a control plane session; serving what is loaded");
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One session: open, register, then exchange messages until it breaks.
async fn session(
    mut client: AgentClient,
    register: &agent::Register,
    reports: &mut Reports,
    reconciler: &Reconciler,
    shutdown: &CancellationToken,
) -> Ended {
    let (outbox, rx) = mpsc::channel(OUTBOX);
    let first = agent::WorkerMessage { kind: Some(worker_message::Kind::Register(register.clone())) };
    if outbox.try_send(first).is_err() {
        return lost("the session outbox is closed", false);
    }
    let opened = tokio::select! {
        () = shutdown.cancelled() => return Ended::Shutdown,
        opened = tokio::time::timeout(OPEN_TIMEOUT, client.session(ReceiverStream::new(rx))) => opened,
    };
    let mut inbound = match opened {
        Err(_) => return lost("the control plane did not open the session in time", false),
        Ok(Err(status)) => return lost(&describe(&status), false),
        Ok(Ok(response)) => response.into_inner(),
    };
    let mut status = reconciler.status();
    let mut heartbeat: Option<tokio::time::Interval> = None;
    let mut registered = false;
    // A closed channel keeps its last value; stop waiting on it.
    let (mut register_open, mut unhealthy_open) = (true, true);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ended::Shutdown,
            message = inbound.message() => match message {
                Ok(Some(message)) => {
                    if let Some(interval) = handle(message, register, reconciler, reports).await {
                        registered = true;
                        heartbeat = Some(ticker(interval));
                    }
                }
                Ok(None) => return lost("the control plane closed the session", registered),
                Err(status) => return lost(&describe(&status), registered),
            },
            _ = tick(&mut heartbeat) => {
                if !send_heartbeat(&outbox, &status.borrow_and_update(), &reports.unhealthy.borrow_and_update()) {
                    return lost("the control plane stopped reading heartbeats", registered);
                }
            }
            // Replica state changes go up at once, not at the next tick.
            changed = status.changed(), if registered => {
                if changed.is_err() {
                    return lost("the reconciler stopped", registered);
                }
                if !send_heartbeat(&outbox, &status.borrow_and_update(), &reports.unhealthy.borrow_and_update()) {
                    return lost("the control plane stopped reading heartbeats", registered);
                }
            }
            // So do slices found unhealthy: the control plane moves their replicas.
            changed = reports.unhealthy.changed(), if registered && unhealthy_open => {
                if changed.is_err() {
                    unhealthy_open = false;
                } else if !send_heartbeat(&outbox, &status.borrow_and_update(), &reports.unhealthy.borrow_and_update()) {
                    return lost("the control plane stopped reading heartbeats", registered);
                }
            }
            changed = reports.register.changed(), if register_open => {
                if changed.is_err() {
                    register_open = false;
                } else {
                    return Ended::Reregister;
                }
            }
        }
    }
}

/// Applies one control message; returns the heartbeat interval when it was `Registered`.
async fn handle(
    message: agent::ControlMessage,
    register: &agent::Register,
    reconciler: &Reconciler,
    reports: &Reports,
) -> Option<Duration> {
    match message.kind {
        Some(control_message::Kind::Registered(r)) => {
            if r.worker_id != register.worker_id {
                let answered = r.worker_id.as_str();
                tracing::warn!(worker_id = %register.worker_id, answered, "control plane answered another worker id");
            }
            let interval = match r.heartbeat_interval_ms {
                0 => DEFAULT_HEARTBEAT,
                ms => Duration::from_millis(u64::from(ms)),
            };
            let gateway_token = !r.gateway_identity_key.is_empty();
            match IdentityKey::from_bytes(&r.gateway_identity_key) {
                Some(key) => reports.auth.replace_forwarded_identity(key),
                None if gateway_token => {
                    // Keep the key held: a malformed one would refuse every gateway request.
                    tracing::warn!(bytes = r.gateway_identity_key.len(), "control plane sent a malformed gateway key");
                }
                None => reports.auth.replace_forwarded_identity(reports.own_identity.clone()),
            }
            tracing::info!(
                worker_id = %register.worker_id,
                heartbeat_ms = interval.as_millis(),
                gateway_token,
                "registered with the control plane"
            );
            Some(interval)
        }
        Some(control_message::Kind::Assignments(set)) => {
            let generation = set.generation;
            reconciler.apply(set).await;
            reports.assigned.send_if_modified(|first| first.is_none().then(|| *first = Some(generation)).is_some());
            None
        }
        Some(control_message::Kind::Revocations(list)) => {
            let list = tessera_protocol::revocation::RevocationList::from_proto(&list);
            let (keys, users) = list.counts();
            tracing::debug!(keys, users, "revocation list");
            reports.auth.apply_revocations(list);
            None
        }
        None => None,
    }
}

fn ticker(period: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

/// The next heartbeat tick; never, before registration.
async fn tick(heartbeat: &mut Option<tokio::time::Interval>) {
    match heartbeat {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Queues a heartbeat; false when the stream is gone or has stopped draining.
fn send_heartbeat(
    outbox: &mpsc::Sender<agent::WorkerMessage>,
    status: &WorkerStatus,
    unhealthy: &[agent::UnhealthySlice],
) -> bool {
    let heartbeat = agent::Heartbeat {
        applied_generation: status.applied_generation,
        replicas: status.replicas.clone(),
        unhealthy_slices: unhealthy.to_vec(),
    };
    let message = agent::WorkerMessage { kind: Some(worker_message::Kind::Heartbeat(heartbeat)) };
    match outbox.try_send(message) {
        Ok(()) => true,
        // A full outbox is a slow control plane: skip this beat, the next one carries the same.
        Err(mpsc::error::TrySendError::Full(_)) => true,
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

fn lost(reason: &str, registered: bool) -> Ended {
    Ended::Lost { reason: reason.to_string(), registered }
}

fn describe(status: &tonic::Status) -> String {
    match status.code() {
        tonic::Code::Unauthenticated => {
            format!("the control plane refused the worker token (--worker-token): {}", status.message())
        }
        code => format!("{code:?}: {}", status.message()),
    }
}
