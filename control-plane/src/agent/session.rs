//! One worker's session: the first message registers it; then one task per session reads
//! heartbeats (storing the worker's liveness and replica states) and sends the worker's
//! complete assignment set whenever its generation moves. It learns of changes from the
//! scheduler in this process and, for changes made by another control-plane replica, by
//! polling the generation every second. It also sends the revocation list after `Registered`
//! and again whenever it changes ([`crate::auth::revocations`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tessera_protocol::agent::{
    Artifact, Assignment, Assignments, ComposingModel, ControlMessage, Heartbeat, Register, Registered, SliceKind,
    WorkerMessage, control_message, worker_message,
};
use tessera_protocol::revocation::RevocationList;
use tessera_protocol::states::failure_reason;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};
use uuid::Uuid;

use super::BoxStream;
use crate::app::App;
use crate::registry::{AssignmentRow, ComposingRow, NewWorker, ReportedState, SliceRecord, now};
use crate::states::ReplicaState as Stored;

/// How often a session re-reads its worker's generation (changes made by another replica).
const POLL: Duration = Duration::from_secs(1);
/// Messages queued to a worker; the session task waits when the worker reads slowly.
const OUTBOX: usize = 4;
/// Longest worker id accepted.
const MAX_WORKER_ID: usize = 128;

/// Reads the `Register` message, registers the worker and starts its session task.
pub async fn start(
    app: Arc<App>,
    mut inbound: Streaming<WorkerMessage>,
    shutdown: CancellationToken,
) -> Result<BoxStream<ControlMessage>, Status> {
    let first = inbound.message().await?;
    let Some(WorkerMessage { kind: Some(worker_message::Kind::Register(register)) }) = first else {
        return Err(Status::invalid_argument("the first message of a session must be Register"));
    };
    let worker = parse_register(register)?;
    app.registry.register_worker(&worker).await?;
    tracing::info!(worker_id = %worker.id, slices = worker.slices.len(), http = %worker.http_endpoint, "worker registered");
    // A registration may make pending replicas placeable.
    app.signals.wake_scheduler();
    let (tx, rx) = mpsc::channel(OUTBOX);
    tokio::spawn(run(app, worker.id, inbound, tx, shutdown));
    Ok(Box::pin(ReceiverStream::new(rx)))
}

fn parse_register(r: Register) -> Result<NewWorker, Status> {
    let id_ok = !r.worker_id.is_empty()
        && r.worker_id.len() <= MAX_WORKER_ID
        && r.worker_id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if !id_ok {
        return Err(Status::invalid_argument("worker_id must be 1 to 128 characters of A-Z a-z 0-9 - _ . :"));
    }
    if r.http_endpoint.is_empty() || r.grpc_endpoint.is_empty() {
        return Err(Status::invalid_argument("http_endpoint and grpc_endpoint are required"));
    }
    let mut slices = Vec::with_capacity(r.slices.len());
    for s in r.slices {
        if s.id.is_empty() || s.profile.is_empty() {
            return Err(Status::invalid_argument("every slice needs an id and a profile"));
        }
        let kind = match SliceKind::try_from(s.kind) {
            Ok(SliceKind::Gpu) => "gpu",
            Ok(SliceKind::Mig) => "mig",
            _ => "cpu",
        };
        slices.push(SliceRecord { id: s.id, profile: s.profile, kind: kind.into(), memory_bytes: s.memory_bytes });
    }
    Ok(NewWorker {
        id: r.worker_id,
        http_endpoint: r.http_endpoint,
        grpc_endpoint: r.grpc_endpoint,
        metrics_endpoint: r.metrics_endpoint,
        slices,
        labels: r.labels.into_iter().collect::<BTreeMap<_, _>>(),
        version: r.version,
    })
}

type Outbox = mpsc::Sender<Result<ControlMessage, Status>>;

async fn run(
    app: Arc<App>,
    worker_id: String,
    mut inbound: Streaming<WorkerMessage>,
    tx: Outbox,
    shutdown: CancellationToken,
) {
    let interval_ms = u32::try_from(app.config.heartbeat_interval.as_millis()).unwrap_or(u32::MAX);
    let registered = control_message::Kind::Registered(Registered {
        worker_id: worker_id.clone(),
        heartbeat_interval_ms: interval_ms,
        // Workers check what gateways forward with the key of the gateways' token, not the token.
        gateway_identity_key: app
            .config
            .gateway_token
            .as_ref()
            .map(|t| tessera_protocol::auth::forwarded_identity_key(t.expose()).to_vec())
            .unwrap_or_default(),
    });
    if tx.send(Ok(ControlMessage { kind: Some(registered) })).await.is_err() {
        return;
    }
    // Before the first assignments: the worker refuses revoked tokens from the start.
    let mut revocations = app.revocations.subscribe();
    if !send_revocations(&mut revocations, &tx).await {
        return;
    }
    let mut changes = app.signals.watch_assignments();
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent: Option<i64> = None;
    // The unhealthy slices last stored for this worker; `None` until the first heartbeat.
    let mut unhealthy: Option<BTreeMap<String, String>> = None;
    loop {
        match send_if_changed(&app, &worker_id, &mut sent, &tx).await {
            Ok(true) => {}
            Ok(false) => break,
            // The registry is down: the worker keeps what it has; try again on the next wake.
            Err(e) => tracing::warn!(worker_id, error = %e, "could not read a worker's assignments"),
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tx.closed() => break,
            message = inbound.message() => match message {
                Ok(Some(WorkerMessage { kind: Some(worker_message::Kind::Heartbeat(hb)) })) => {
                    if let Err(e) = heartbeat(&app, &worker_id, hb, &mut unhealthy).await {
                        tracing::warn!(worker_id, error = %e, "could not record a heartbeat");
                    }
                }
                Ok(Some(_)) => {
                    let _ = tx.send(Err(Status::invalid_argument("only heartbeats may follow Register"))).await;
                    break;
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::info!(worker_id, error = %status, "worker session broke");
                    break;
                }
            },
            _ = changes.changed() => {}
            _ = poll.tick() => {}
            Ok(()) = revocations.changed() => {
                if !send_revocations(&mut revocations, &tx).await {
                    break;
                }
            }
        }
    }
    tracing::info!(worker_id, "worker session ended");
}

/// Sends the whole revocation list now held; false when the worker is gone.
async fn send_revocations(list: &mut watch::Receiver<Arc<RevocationList>>, tx: &Outbox) -> bool {
    let revocations = list.borrow_and_update().to_proto();
    let entries = revocations.keys.len() + revocations.users.len();
    let message = ControlMessage { kind: Some(control_message::Kind::Revocations(revocations)) };
    let sent = tx.send(Ok(message)).await.is_ok();
    tracing::debug!(entries, sent, "sent the revocation list");
    sent
}

/// Sends the assignment set when the worker's generation moved since the last one sent.
/// `Ok(false)` when the worker is gone (its stream closed).
async fn send_if_changed(
    app: &App,
    worker_id: &str,
    sent: &mut Option<i64>,
    tx: &Outbox,
) -> crate::error::Result<bool> {
    let mut conn = app.registry.conn().await?;
    let Some(generation) = conn.worker_generation(worker_id).await? else { return Ok(true) };
    if *sent == Some(generation) {
        return Ok(true);
    }
    let rows = conn.assignments(worker_id).await?;
    // Only ensembles compose: most sets have none and skip the query.
    let composing = if rows.iter().any(|r| tessera_protocol::model_config::is_ensemble_json(&r.config.0)) {
        conn.assigned_composing(worker_id).await?
    } else {
        Vec::new()
    };
    drop(conn);
    let assignments = Assignments {
        generation: u64::try_from(generation).unwrap_or(0),
        assignments: rows.into_iter().map(|r| assignment(r, &composing)).collect(),
    };
    let count = assignments.assignments.len();
    let message = ControlMessage { kind: Some(control_message::Kind::Assignments(assignments)) };
    if tx.send(Ok(message)).await.is_err() {
        return Ok(false);
    }
    tracing::debug!(worker_id, generation, count, "sent assignments");
    *sent = Some(generation);
    Ok(true)
}

fn assignment(r: AssignmentRow, composing: &[ComposingRow]) -> Assignment {
    let instance_group = r.config.0.get("instance_group").cloned();
    let composing = composing
        .iter()
        .filter(|c| c.ensemble_version_id == r.version_id)
        .map(|c| composing_model(c, instance_group.as_ref()))
        .collect();
    Assignment {
        replica_id: r.replica_id.to_string(),
        deployment_id: r.deployment_id.to_string(),
        tenant_id: r.tenant_id.to_string(),
        tenant_name: r.tenant_name,
        model_name: r.model_name,
        version: r.version,
        slice_id: r.slice_id,
        artifact: Some(artifact(r.artifact_key, r.sha256, r.size_bytes, r.format)),
        config_json: serde_json::to_string(&r.config.0).unwrap_or_default(),
        serving: r.serving,
        capture: crate::capture::CaptureSettings::for_worker(r.capture.as_ref().map(|j| &j.0)),
        composing,
    }
}

/// A composing model of an ensemble replica: its stored config under its own name, with the
/// replica's instance group (the deployment's instance count and the slice's kind apply to
/// the models that do the work; the ensemble itself runs none).
fn composing_model(c: &ComposingRow, instance_group: Option<&serde_json::Value>) -> ComposingModel {
    let mut config = match c.config.as_ref().map(|j| &j.0) {
        Some(serde_json::Value::Object(map)) => serde_json::Value::Object(map.clone()),
        _ => serde_json::json!({}),
    };
    config["name"] = serde_json::json!(c.model_name);
    if let (Some(group), Some(map)) = (instance_group, config.as_object_mut()) {
        map.remove("instanceGroup");
        map.insert("instance_group".into(), group.clone());
    }
    ComposingModel {
        model_name: c.model_name.clone(),
        version: c.version,
        artifact: Some(artifact(c.artifact_key.clone(), c.sha256.clone(), c.size_bytes, c.format.clone())),
        config_json: config.to_string(),
    }
}

fn artifact(key: String, sha256: String, size_bytes: i64, format: String) -> Artifact {
    Artifact { key, sha256, size_bytes: u64::try_from(size_bytes).unwrap_or(0), format }
}

async fn heartbeat(
    app: &App,
    worker_id: &str,
    hb: Heartbeat,
    stored: &mut Option<BTreeMap<String, String>>,
) -> crate::error::Result<()> {
    let applied = i64::try_from(hb.applied_generation).unwrap_or(i64::MAX);
    let mut conn = app.registry.conn().await?;
    conn.heartbeat(worker_id, now(), applied).await?;
    let unhealthy = unhealthy_slices(&hb);
    let health_changed = stored.as_ref() != Some(&unhealthy);
    if health_changed {
        for (slice_id, reason) in &unhealthy {
            if stored.as_ref().is_none_or(|s| !s.contains_key(slice_id)) {
                tracing::warn!(worker_id, slice_id, reason, "worker reports an unhealthy slice; its replicas move");
            }
        }
        conn.set_unhealthy_slices(worker_id, &unhealthy).await?;
        *stored = Some(unhealthy);
    }
    drop(conn);
    let reports = reported_states(&hb);
    let changed = app.registry.report_states(worker_id, &reports).await?;
    if !changed.is_empty() || health_changed {
        // A replica turning ready may complete a rollout; an unhealthy slice moves replicas.
        app.signals.wake_scheduler();
    }
    Ok(())
}

/// Longest unhealthy reason kept (a worker's message, shown in the API).
const MAX_REASON: usize = 512;

/// The unhealthy slices a heartbeat reports, by slice id; empty ids are skipped and long
/// reasons cut.
fn unhealthy_slices(hb: &Heartbeat) -> BTreeMap<String, String> {
    hb.unhealthy_slices
        .iter()
        .filter(|u| !u.slice_id.is_empty())
        .map(|u| {
            let mut reason = u.reason.clone();
            if reason.len() > MAX_REASON {
                let cut = (0..=MAX_REASON).rev().find(|i| reason.is_char_boundary(*i)).unwrap_or(0);
                reason.truncate(cut);
            }
            if reason.is_empty() {
                reason = "unhealthy".into();
            }
            (u.slice_id.clone(), reason)
        })
        .collect()
}

/// The states a heartbeat reports, as registry states; `draining` and unknown values are the
/// control plane's to decide and are skipped, as are ids that are not replica ids.
fn reported_states(hb: &Heartbeat) -> Vec<ReportedState> {
    hb.replicas
        .iter()
        .filter_map(|r| {
            let replica_id = Uuid::parse_str(&r.replica_id).ok()?;
            let state = Stored::reported(r.state)?;
            let reason = (state == Stored::Failed)
                .then_some(r.reason.as_str())
                .filter(|s| !s.is_empty())
                .map(|why| failure_reason(r.failure_kind, why));
            Some(ReportedState { replica_id, state, reason })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use tessera_protocol::agent::{LoadFailureKind, ReplicaState, ReplicaStatus, Slice, UnhealthySlice};

    use super::*;

    #[test]
    fn registration_is_checked() {
        let good = Register {
            worker_id: "w-1".into(),
            http_endpoint: "http://127.0.0.1:8000".into(),
            grpc_endpoint: "127.0.0.1:8001".into(),
            slices: vec![Slice {
                id: "cpu-0".into(),
                profile: "cpu".into(),
                kind: 1,
                memory_bytes: 5,
                ..Slice::default()
            }],
            ..Register::default()
        };
        let w = parse_register(good.clone()).unwrap();
        assert_eq!(w.slices[0].kind, "cpu");
        for bad in [
            Register { worker_id: String::new(), ..good.clone() },
            Register { worker_id: "a/b".into(), ..good.clone() },
            Register { http_endpoint: String::new(), ..good.clone() },
            Register { slices: vec![Slice::default()], ..good.clone() },
        ] {
            assert_eq!(parse_register(bad).unwrap_err().code(), tonic::Code::InvalidArgument);
        }
    }

    #[test]
    fn unhealthy_slices_are_read_with_their_reasons_bounded() {
        let slice = |id: &str, reason: &str| UnhealthySlice { slice_id: id.into(), reason: reason.into() };
        let hb = Heartbeat {
            unhealthy_slices: vec![
                slice("MIG-1", "Xid 79 on GPU-1"),
                slice("", "no id"),
                slice("MIG-2", ""),
                slice("MIG-3", &"é".repeat(400)),
            ],
            ..Heartbeat::default()
        };
        let got = unhealthy_slices(&hb);
        assert_eq!(got.len(), 3);
        assert_eq!(got["MIG-1"], "Xid 79 on GPU-1");
        assert_eq!(got["MIG-2"], "unhealthy");
        assert_eq!(got["MIG-3"].len(), MAX_REASON);
    }

    #[test]
    fn heartbeats_map_to_registry_states() {
        let id = Uuid::now_v7();
        let status = |state: ReplicaState, reason: &str| ReplicaStatus {
            replica_id: id.to_string(),
            state: state as i32,
            reason: reason.into(),
            ..ReplicaStatus::default()
        };
        let hb = Heartbeat {
            applied_generation: 3,
            replicas: vec![
                status(ReplicaState::Ready, ""),
                status(ReplicaState::Failed, "bad model"),
                status(ReplicaState::Draining, ""),
                ReplicaStatus { replica_id: "nope".into(), state: 2, ..ReplicaStatus::default() },
                ReplicaStatus {
                    failure_kind: LoadFailureKind::Configuration as i32,
                    ..status(ReplicaState::Failed, "output 'x' has no valid data_type")
                },
            ],
            unhealthy_slices: Vec::new(),
        };
        let got = reported_states(&hb);
        assert_eq!(got.len(), 3);
        assert!(unhealthy_slices(&hb).is_empty());
        assert_eq!((got[0].state, got[0].reason.as_deref()), (Stored::Ready, None));
        assert_eq!((got[1].state, got[1].reason.as_deref()), (Stored::Failed, Some("bad model")));
        let typed = (got[2].state, got[2].reason.as_deref());
        assert_eq!(typed, (Stored::Failed, Some("configuration: output 'x' has no valid data_type")));
    }
}
