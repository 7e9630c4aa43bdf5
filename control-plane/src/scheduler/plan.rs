//! One scheduler tick as a pure function: from a snapshot of the registry (workers,
//! deployments, replicas, quotas) and the time, decide every change: workers lost, targets
//! moved by aliases, replicas created, placed, switched to serving, drained and removed, and
//! the events that explain them. The loop in [`super::run`] reads the snapshot and applies the
//! plan in one transaction; everything here is deterministic and unit-tested.
//!
//! # Rollout model
//! A deployment wants `replicas` replicas of its *key* `(version, spec_generation)`, indexed
//! `0..replicas`. Replicas of another key are *old*.
//! - Missing current indices are created; they serve at once when no old replica serves
//!   (first deployment), else they start with `serving = false` and are placed preferring the
//!   worker and slice of the old replica with the same index.
//! - When every current replica is ready, they switch to serving and the old serving replicas
//!   drain (`serving = false`) until `drain_until`, then they are removed.
//! - Old replicas that never served (a rollout superseded by another) are removed at once.
//! - A failed new replica stops the rollout: the old replicas keep serving.
//!
//! # Canary model
//! A deployment with a canary also wants `canary_replicas` replicas of `(canary_version,
//! spec_generation)`, marked `canary` and indexed `0..canary_replicas` on their own; the rollout
//! above only ever looks at the other (stable) replicas. See `canary` for how they serve,
//! drain and how a promotion ends.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde_json::{Value, json};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Placement, Placer, ReplicaRequest, WorkerSpec};
use crate::deployments::memory::replica_memory;
use crate::states::{ReplicaState, WorkerState};
pub use crate::tick::{
    DeploymentInfo, NewReplica, Plan, PlannedEvent, ReplicaChange, ReplicaInfo, Snapshot, VersionInfo, WorkerInfo,
};

mod canary;

/// Timing settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// A worker silent this long is lost.
    pub lost_after: Duration,
    /// How long old replicas drain after a switch.
    pub drain: Duration,
    /// When this control plane became the scheduling leader. Silence before it does not
    /// count: after a control-plane outage workers need a heartbeat interval to reconnect,
    /// and declaring every one of them lost would move every replica for nothing.
    pub leader_since: Option<OffsetDateTime>,
}

/// The model config a replica loads: the version's stored config with the deployment's name,
/// instance group and batching applied (Triton's JSON form).
///
/// The instance kind is the profile's: `KIND_GPU` on `gpu` and `mig-*` slices (the slice is
/// the device, so the stored group's `gpus` go), `KIND_CPU` on `cpu`. A stored config that asks
/// for a GPU keeps `KIND_GPU` even on `cpu`: such deployments (and alias moves that would make
/// one) are refused, and one that gets here anyway (stored before that check) must fail on its
/// worker saying why, not quietly run on CPU.
pub fn render_config(d: &DeploymentInfo, stored: Option<&Value>) -> Value {
    let mut config = match stored {
        Some(Value::Object(map)) => Value::Object(map.clone()),
        _ => json!({}),
    };
    let asks_for_gpu = || {
        let parsed = stored.and_then(|c| tessera_protocol::model_config::from_json(&c.to_string()).ok());
        parsed.is_some_and(|c| matches!(crate::model_config::device_ask(&c), crate::model_config::DeviceAsk::Gpu(_)))
    };
    let kind = if d.profile != "cpu" || asks_for_gpu() { "KIND_GPU" } else { "KIND_CPU" };
    // The JSON form's other spelling would otherwise stand beside the rendered group.
    if let Some(map) = config.as_object_mut() {
        map.remove("instanceGroup");
    }
    config["name"] = json!(d.model_name);
    config["instance_group"] = json!([{ "count": d.instance_count, "kind": kind }]);
    if let Some(n) = d.max_batch_size {
        config["max_batch_size"] = json!(n);
    }
    if let Some(b) = &d.dynamic_batching {
        config["dynamic_batching"] = b.clone();
    }
    config
}

/// What new replicas are: stable ones (serving at once unless a rollout waits for them) or a
/// canary's (serving once ready).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Start {
    /// Stable replicas.
    Stable {
        /// Whether unversioned requests reach them from the start.
        serving: bool,
    },
    /// Canary replicas.
    Canary,
}

/// Adds new replicas of `version` at `indices` to the plan, each preferring the place of the
/// old serving replica with its index; returns their insert positions and preferences.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_replicas(
    d: &DeploymentInfo,
    version_info: Option<&VersionInfo>,
    version: i64,
    indices: Vec<i64>,
    old_serving: &[&ReplicaInfo],
    start: Start,
    new_id: &mut dyn FnMut() -> Uuid,
    out: &mut Plan,
) -> Vec<(usize, Option<Placement>)> {
    if indices.is_empty() {
        return Vec::new();
    }
    let size = version_info.map_or(0, |v| v.size_bytes);
    let config = render_config(d, version_info.and_then(|v| v.config.as_ref()));
    let (serving, canary) = match start {
        Start::Stable { serving } => (serving, false),
        Start::Canary => (false, true),
    };
    let mut created = Vec::with_capacity(indices.len());
    for index in indices {
        let preferred = old_serving
            .iter()
            .find(|o| o.index == index)
            .and_then(|o| Some(Placement { worker: o.worker_id.clone()?, slice: o.slice_id.clone()? }));
        out.inserts.push(NewReplica {
            id: new_id(),
            tenant_id: d.tenant_id,
            deployment_id: d.id,
            index,
            version,
            spec_generation: d.spec_generation,
            profile: d.profile.clone(),
            memory_bytes: replica_memory(d.memory_bytes, size),
            config: config.clone(),
            placement: Err(String::new()),
            serving,
            canary,
        });
        created.push((out.inserts.len() - 1, preferred));
    }
    created
}

/// Decides one tick. `new_id` names created replicas (random in production, counted in tests).
pub fn plan(snapshot: &Snapshot, now: OffsetDateTime, settings: &Settings, new_id: &mut dyn FnMut() -> Uuid) -> Plan {
    let mut out = Plan::default();
    let live = live_workers(snapshot, now, settings, &mut out);
    let mut placer = Placer::new(
        snapshot
            .workers
            .iter()
            .filter(|w| live.contains(w.id.as_str()))
            .map(|w| WorkerSpec { id: w.id.clone(), slices: w.slices.clone() })
            .collect(),
    );
    // Unhealthy slices of live workers: nothing new goes there, and what is there moves.
    let mut unhealthy: HashMap<(&str, &str), &str> = HashMap::new();
    for w in snapshot.workers.iter().filter(|w| live.contains(w.id.as_str())) {
        for (slice, reason) in &w.unhealthy_slices {
            placer.set_unhealthy(&w.id, slice);
            unhealthy.insert((w.id.as_str(), slice.as_str()), reason.as_str());
        }
    }
    for (tenant, quotas) in &snapshot.slice_quotas {
        for (profile, limit) in quotas {
            placer.set_quota(&tenant.to_string(), profile, usize::try_from(*limit).unwrap_or(0));
        }
    }
    let mut by_deployment: HashMap<Uuid, Vec<&ReplicaInfo>> = HashMap::new();
    for r in &snapshot.replicas {
        by_deployment.entry(r.deployment_id).or_default().push(r);
    }
    let mut deployments: Vec<&DeploymentInfo> = snapshot.deployments.iter().collect();
    deployments.sort_by_key(|d| d.id);
    let mut decisions = Vec::new();
    for d in deployments {
        let replicas = by_deployment.remove(&d.id).unwrap_or_default();
        decisions.push(decide(d, replicas, snapshot, now, settings, new_id, &mut out));
    }
    // Replicas of deployments that no longer exist: nothing to keep (the delete cascades, but
    // a replica seen without its deployment is removed all the same).
    let mut orphans: Vec<&ReplicaInfo> = by_deployment.into_values().flatten().collect();
    orphans.sort_by_key(|r| r.id);
    out.changes.extend(orphans.into_iter().map(|r| ReplicaChange::Delete { id: r.id }));
    place_all(&mut placer, &decisions, &live, &unhealthy, &mut out);
    out
}

/// Marks silent workers lost; returns the ids of the workers that can take replicas.
fn live_workers<'a>(
    snapshot: &'a Snapshot,
    now: OffsetDateTime,
    settings: &Settings,
    out: &mut Plan,
) -> BTreeSet<&'a str> {
    let mut live = BTreeSet::new();
    let mut workers: Vec<&WorkerInfo> = snapshot.workers.iter().collect();
    workers.sort_by(|a, b| a.id.cmp(&b.id));
    for w in workers {
        if w.state != WorkerState::Ready.as_str() {
            continue;
        }
        let heard = settings.leader_since.map_or(w.last_heartbeat_at, |t| t.max(w.last_heartbeat_at));
        let silent = now - heard;
        if silent > settings.lost_after {
            out.lost_workers.push(w.id.clone());
            continue;
        }
        live.insert(w.id.as_str());
    }
    live
}

/// What a deployment's replicas need from the placement pass.
struct Decision<'a> {
    deployment: &'a DeploymentInfo,
    /// Kept replicas (placed or not).
    kept: Vec<&'a ReplicaInfo>,
    /// Indices of created replicas in `Plan::inserts`, with the placement to prefer.
    created: Vec<(usize, Option<Placement>)>,
}

fn decide<'a>(
    d: &'a DeploymentInfo,
    replicas: Vec<&'a ReplicaInfo>,
    snapshot: &Snapshot,
    now: OffsetDateTime,
    settings: &Settings,
    new_id: &mut dyn FnMut() -> Uuid,
    out: &mut Plan,
) -> Decision<'a> {
    let event = |kind: &'static str, replica_id: Option<Uuid>, worker_id: Option<String>, message: String| {
        PlannedEvent { tenant_id: d.tenant_id, deployment_id: d.id, kind, replica_id, worker_id, message }
    };
    let mut version = d.version;
    if let Some(v) = d.alias_version.filter(|v| *v != d.version) {
        version = v;
        out.retarget.push((d.id, v));
        let alias = d.alias.as_deref().unwrap_or_default();
        out.events.push(event("retargeted", None, None, format!("alias '{alias}' moved to version {v}")));
    }
    let key = (version, d.spec_generation);
    let wanted = d.replicas.max(0);
    // The canary's replicas roll on their own (see [`canary`]); everything below is the stable ones'.
    let (canaries, replicas): (Vec<&ReplicaInfo>, Vec<&ReplicaInfo>) = replicas.into_iter().partition(|r| r.canary);
    let Sorted { current, mut old_serving, mut draining } = sort_out(d, replicas, key, wanted, now, out);
    let rolling = !old_serving.is_empty();
    let version_info = snapshot.versions.get(&(d.model_id, version));
    let missing: Vec<i64> = (0..wanted).filter(|i| !current.contains_key(i)).collect();
    if !missing.is_empty() && rolling && current.is_empty() {
        out.events.push(event("rollout_started", None, None, format!("rolling out version {version}")));
    }
    let start = Start::Stable { serving: !rolling };
    let mut created = start_replicas(d, version_info, version, missing, &old_serving, start, new_id, out);
    let all_ready = created.is_empty()
        && current.len() as i64 == wanted
        && current.values().all(|r| r.state == ReplicaState::Ready);
    if rolling && all_ready {
        for r in current.values().filter(|r| !r.serving) {
            out.changes.push(ReplicaChange::Serve { id: r.id });
        }
        let until = now + settings.drain;
        for r in &old_serving {
            out.changes.push(ReplicaChange::Drain { id: r.id, until });
        }
        out.events.push(event(
            "rollout_switched",
            None,
            None,
            format!("version {version} now serving; old replicas draining"),
        ));
        draining.append(&mut old_serving);
    } else if !rolling {
        for r in current.values().filter(|r| !r.serving) {
            out.changes.push(ReplicaChange::Serve { id: r.id });
        }
    }
    let settled = !rolling
        && created.is_empty()
        && current.len() as i64 == wanted
        && current.values().all(|r| r.state == ReplicaState::Ready && r.serving);
    let mut kept: Vec<&ReplicaInfo> = current.into_values().collect();
    kept.extend(old_serving);
    kept.extend(draining);
    let track = canary::Track { target: version, stable_settled: settled, now };
    let (canary_kept, canary_created) = canary::decide(d, canaries, track, snapshot, settings, new_id, out);
    kept.extend(canary_kept);
    created.extend(canary_created);
    Decision { deployment: d, kept, created }
}

/// A deployment's replicas by role in a rollout.
struct Sorted<'a> {
    /// Replicas of the target key, by index.
    current: BTreeMap<i64, &'a ReplicaInfo>,
    /// Replicas of another key that still serve.
    old_serving: Vec<&'a ReplicaInfo>,
    /// Replicas draining, not yet done.
    draining: Vec<&'a ReplicaInfo>,
}

/// Sorts a deployment's replicas against the target `key`, removing what has no place:
/// drained replicas, current ones beyond `wanted` (or duplicates), old ones that never served.
fn sort_out<'a>(
    d: &DeploymentInfo,
    mut replicas: Vec<&'a ReplicaInfo>,
    key: (i64, i64),
    wanted: i64,
    now: OffsetDateTime,
    out: &mut Plan,
) -> Sorted<'a> {
    replicas.sort_by_key(|r| (r.index, r.id));
    let mut sorted = Sorted { current: BTreeMap::new(), old_serving: Vec::new(), draining: Vec::new() };
    for r in replicas {
        let keep = if r.state == ReplicaState::Draining {
            let done = r.drain_until.is_none_or(|t| t <= now);
            if done {
                out.events.push(PlannedEvent {
                    tenant_id: d.tenant_id,
                    deployment_id: d.id,
                    kind: "drained",
                    replica_id: Some(r.id),
                    worker_id: r.worker_id.clone(),
                    message: format!("version {} drained", r.version),
                });
            } else {
                sorted.draining.push(r);
            }
            !done
        } else if (r.version, r.spec_generation) == key {
            let fits = r.index < wanted && !sorted.current.contains_key(&r.index);
            if fits {
                sorted.current.insert(r.index, r);
            }
            fits
        } else if r.serving {
            sorted.old_serving.push(r);
            true
        } else {
            false
        };
        if !keep {
            out.changes.push(ReplicaChange::Delete { id: r.id });
        }
    }
    sorted
}

/// Places every kept replica that lost its worker or its slice's health or never had one, and
/// every created one. Existing placements on live workers are recorded first so they count.
fn place_all(
    placer: &mut Placer,
    decisions: &[Decision<'_>],
    live: &BTreeSet<&str>,
    unhealthy: &HashMap<(&str, &str), &str>,
    out: &mut Plan,
) {
    let request = |d: &DeploymentInfo, r_index: i64, profile: &str, memory: i64| ReplicaRequest {
        deployment: d.id.to_string(),
        index: u32::try_from(r_index).unwrap_or(u32::MAX),
        tenant: d.tenant_id.to_string(),
        profile: profile.to_string(),
        memory_bytes: u64::try_from(memory).unwrap_or(0),
    };
    // Per deployment, the last (so the most crowded) slice its replicas had to share this tick.
    let mut colocated: BTreeMap<Uuid, (Uuid, String)> = BTreeMap::new();
    let mut unplaced: Vec<(&DeploymentInfo, &ReplicaInfo)> = Vec::new();
    let mut crash_looping: Vec<(&DeploymentInfo, &ReplicaInfo, Placement)> = Vec::new();
    for decision in decisions {
        for r in &decision.kept {
            let at = match (&r.worker_id, &r.slice_id) {
                (Some(w), Some(s)) if live.contains(w.as_str()) => {
                    Some(Placement { worker: w.clone(), slice: s.clone() })
                }
                _ => None,
            };
            let req = request(decision.deployment, r.index, &r.profile, r.memory_bytes);
            match at {
                // Its slice is unhealthy: it moves like a lost worker's replica.
                Some(at) if unhealthy.contains_key(&(at.worker.as_str(), at.slice.as_str())) => {
                    unplaced.push((decision.deployment, r));
                }
                // Its worker's runner keeps dying: it moves once everything else has its place.
                Some(at) if is_crash_looping(r) => crash_looping.push((decision.deployment, r, at)),
                Some(at) if placer.assign(&req, &at).is_ok() => {}
                _ => unplaced.push((decision.deployment, r)),
            }
        }
    }
    for (d, r) in unplaced {
        if r.state == ReplicaState::Draining {
            // Nothing to drain on a worker that is gone.
            out.changes.push(ReplicaChange::Delete { id: r.id });
            continue;
        }
        let event = |kind: &'static str, worker_id: Option<String>, message: String| PlannedEvent {
            tenant_id: d.tenant_id,
            deployment_id: d.id,
            kind,
            replica_id: Some(r.id),
            worker_id,
            message,
        };
        let label = replica_label(r.canary, r.index);
        // Placed before, on a worker that is gone (or no longer has that slice).
        let lost_from = r.worker_id.clone();
        if let Some(w) = lost_from.as_ref().filter(|w| !live.contains(w.as_str())) {
            out.events.push(event("worker_lost", Some(w.clone()), format!("worker {w} is gone; {label} moves")));
        }
        let sick = r.worker_id.as_deref().zip(r.slice_id.as_deref()).filter(|at| unhealthy.contains_key(at));
        if let Some((w, s)) = sick {
            let why = unhealthy.get(&(w, s)).copied().unwrap_or_default();
            out.events.push(event(
                "slice_unhealthy",
                Some(w.to_string()),
                format!("slice {s} on worker {w} is unhealthy ({why}); {label} moves"),
            ));
        }
        let req = request(d, r.index, &r.profile, r.memory_bytes);
        match placer.place(&req) {
            Ok(p) => {
                if let Some(why) = placer.colocation(&req, &p) {
                    colocated.insert(d.id, (d.tenant_id, why));
                }
                let message = format!("{label} placed on worker {} slice {}", p.worker, p.slice);
                let kind = if lost_from.is_some() { "rescheduled" } else { "placed" };
                out.events.push(event(kind, Some(p.worker.clone()), message));
                out.changes.push(ReplicaChange::Place { id: r.id, placement: p });
            }
            Err(e) => {
                let reason = e.to_string();
                if lost_from.is_some()
                    || r.reason.as_deref() != Some(reason.as_str())
                    || r.state != ReplicaState::Pending
                {
                    out.events.push(event("unplaceable", None, format!("{label}: {reason}")));
                    out.changes.push(ReplicaChange::Unplaced { id: r.id, reason });
                }
            }
        }
    }
    for (d, r, at) in crash_looping {
        move_off_crash_loop(placer, d, r, &at, &request(d, r.index, &r.profile, r.memory_bytes), out);
    }
    for decision in decisions {
        let d = decision.deployment;
        for (i, preferred) in &decision.created {
            let new = &mut out.inserts[*i];
            let req = request(d, new.index, &new.profile, new.memory_bytes);
            let result = placer.place_preferring(&req, preferred.as_ref());
            if let Some(why) = result.as_ref().ok().and_then(|p| placer.colocation(&req, p)) {
                colocated.insert(d.id, (d.tenant_id, why));
            }
            let label = replica_label(new.canary, new.index);
            let (kind, worker, message) = match &result {
                Ok(p) => (
                    "placed",
                    Some(p.worker.clone()),
                    format!("{label} placed on worker {} slice {}", p.worker, p.slice),
                ),
                Err(e) => ("unplaceable", None, format!("{label}: {e}")),
            };
            new.placement = result.map_err(|e| e.to_string());
            let id = new.id;
            out.events.push(PlannedEvent {
                tenant_id: d.tenant_id,
                deployment_id: d.id,
                kind,
                replica_id: Some(id),
                worker_id: worker,
                message,
            });
        }
    }
    for (deployment_id, (tenant_id, message)) in colocated {
        out.events.push(PlannedEvent {
            tenant_id,
            deployment_id,
            kind: "replicas_colocated",
            replica_id: None,
            worker_id: None,
            message,
        });
    }
}

/// How events name a replica: `replica 0`, or `canary replica 0` (the two tracks share indices).
fn replica_label(canary: bool, index: i64) -> String {
    if canary { format!("canary replica {index}") } else { format!("replica {index}") }
}

/// Whether a replica failed because the runner hosting it on its worker keeps dying.
fn is_crash_looping(r: &ReplicaInfo) -> bool {
    r.state == ReplicaState::Failed
        && r.reason.as_deref().is_some_and(|why| why.starts_with(tessera_protocol::CRASH_LOOP_REASON))
}

/// Times a replica is moved off crash loops before it stays where it is: a model that kills
/// every runner would otherwise bounce between workers forever, reloading each time.
pub const MAX_CRASH_MOVES: i64 = 2;

/// Places a crash-looping replica on another worker; with no other worker to take it, or once
/// it was moved [`MAX_CRASH_MOVES`] times and still crash-loops, it stays where it is (its worker
/// keeps restarting the runner with backoff; a `crash_loop` event says so once).
fn move_off_crash_loop(
    placer: &mut Placer,
    d: &DeploymentInfo,
    r: &ReplicaInfo,
    at: &Placement,
    req: &ReplicaRequest,
    out: &mut Plan,
) {
    if r.crash_moves >= MAX_CRASH_MOVES {
        let _ = placer.assign(req, at);
        if r.crash_moves == MAX_CRASH_MOVES {
            let why = r.reason.as_deref().unwrap_or_default();
            let message = format!(
                "replica {} kept crash-looping after {} moves to other workers; it stays on worker {}, which keeps \
                 restarting its runner with backoff, until the deployment changes: {why}",
                r.index, MAX_CRASH_MOVES, at.worker
            );
            out.events.push(PlannedEvent {
                tenant_id: d.tenant_id,
                deployment_id: d.id,
                kind: "crash_loop",
                replica_id: Some(r.id),
                worker_id: Some(at.worker.clone()),
                message,
            });
            out.changes.push(ReplicaChange::StayInCrashLoop { id: r.id });
        }
        return;
    }
    match placer.place_avoiding(req, Some(&at.worker)) {
        Ok(p) => {
            let why = r.reason.as_deref().unwrap_or_default();
            let message = format!(
                "replica {} moved from worker {} to worker {} slice {}: {why}",
                r.index, at.worker, p.worker, p.slice
            );
            out.events.push(PlannedEvent {
                tenant_id: d.tenant_id,
                deployment_id: d.id,
                kind: "rescheduled",
                replica_id: Some(r.id),
                worker_id: Some(p.worker.clone()),
                message,
            });
            out.changes.push(ReplicaChange::MoveOffCrashLoop { id: r.id, placement: p });
        }
        Err(_) => {
            // Nowhere else: it keeps its place (and counts there).
            let _ = placer.assign(req, at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tick::SliceSpec;

    const GIB: u64 = 1 << 30;

    pub(super) fn now() -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + Duration::from_secs(1_000)
    }

    pub(super) fn settings() -> Settings {
        Settings { lost_after: Duration::from_secs(10), drain: Duration::from_secs(3), leader_since: None }
    }

    pub(super) fn ids() -> impl FnMut() -> Uuid {
        let mut n = 0u128;
        move || {
            n += 1;
            Uuid::from_u128(0xffff_0000 + n)
        }
    }

    pub(super) fn tenant(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    pub(super) fn worker(id: &str, slices: usize, gib: u64) -> WorkerInfo {
        WorkerInfo {
            id: id.into(),
            state: WorkerState::Ready.as_str().into(),
            last_heartbeat_at: now(),
            slices: (0..slices)
                .map(|i| SliceSpec { id: format!("cpu-{i}"), profile: "cpu".into(), memory_bytes: gib * GIB })
                .collect(),
            unhealthy_slices: BTreeMap::new(),
        }
    }

    pub(super) fn deployment(n: u128, tenant_id: Uuid, replicas: i64, version: i64) -> DeploymentInfo {
        DeploymentInfo {
            id: Uuid::from_u128(1_000 + n),
            tenant_id,
            model_name: format!("m{n}"),
            model_id: Uuid::from_u128(2_000 + n),
            version,
            alias: None,
            alias_version: None,
            spec_generation: 1,
            profile: "cpu".into(),
            replicas,
            instance_count: 1,
            max_batch_size: None,
            dynamic_batching: None,
            memory_bytes: Some(i64::try_from(GIB).unwrap()),
            canary_version: None,
            canary_replicas: 0,
        }
    }

    pub(super) fn replica(
        d: &DeploymentInfo,
        n: u128,
        index: i64,
        version: i64,
        at: Option<(&str, &str)>,
        state: ReplicaState,
    ) -> ReplicaInfo {
        ReplicaInfo {
            id: Uuid::from_u128(5_000 + n),
            deployment_id: d.id,
            index,
            version,
            spec_generation: d.spec_generation,
            profile: d.profile.clone(),
            memory_bytes: d.memory_bytes.unwrap_or(1),
            worker_id: at.map(|(w, _)| w.to_string()),
            slice_id: at.map(|(_, s)| s.to_string()),
            state,
            reason: None,
            crash_moves: 0,
            serving: true,
            drain_until: None,
            canary: false,
        }
    }

    pub(super) fn snapshot(
        workers: Vec<WorkerInfo>,
        deployments: Vec<DeploymentInfo>,
        replicas: Vec<ReplicaInfo>,
    ) -> Snapshot {
        Snapshot { workers, deployments, replicas, ..Snapshot::default() }
    }

    pub(super) fn run(s: &Snapshot) -> Plan {
        plan(s, now(), &settings(), &mut ids())
    }

    pub(super) fn placed(p: &Plan) -> Vec<(String, String)> {
        p.inserts.iter().map(|r| r.placement.clone().map(|p| (p.worker, p.slice)).unwrap_or_default()).collect()
    }

    #[test]
    fn a_new_deployment_is_spread_and_serves_at_once() {
        let d = deployment(1, tenant(1), 2, 1);
        let p = run(&snapshot(vec![worker("w1", 2, 4), worker("w2", 2, 4)], vec![d], vec![]));
        assert_eq!(placed(&p), [("w1".into(), "cpu-0".into()), ("w2".into(), "cpu-0".into())]);
        assert!(p.inserts.iter().all(|r| r.serving && r.version == 1));
        assert_eq!(p.events.iter().filter(|e| e.kind == "placed").count(), 2);
        assert_eq!(p.inserts[0].config["instance_group"], json!([{ "count": 1, "kind": "KIND_CPU" }]));
    }

    #[test]
    fn replicas_spread_over_slices_and_sharing_one_is_an_event() {
        let d = deployment(1, tenant(1), 3, 1);
        let p = run(&snapshot(vec![worker("w1", 3, 4)], vec![d.clone()], vec![]));
        let slices: Vec<String> = placed(&p).into_iter().map(|(_, s)| s).collect();
        assert_eq!(slices, ["cpu-0", "cpu-1", "cpu-2"]);
        assert!(p.events.iter().all(|e| e.kind != "replicas_colocated"), "{:?}", p.events);
        // Two slices for three replicas: one event says which slice they share and why.
        let p = run(&snapshot(vec![worker("w1", 2, 4)], vec![d.clone()], vec![]));
        let shared: Vec<&PlannedEvent> = p.events.iter().filter(|e| e.kind == "replicas_colocated").collect();
        assert_eq!(shared.len(), 1, "{:?}", p.events);
        assert_eq!(shared[0].deployment_id, d.id);
        assert!(shared[0].message.starts_with("2 replicas share slice cpu-0 on worker w1: "), "{}", shared[0].message);
    }

    #[test]
    fn slices_serve_one_tenant_and_unplaceable_replicas_say_why_once() {
        let (a, b) = (deployment(1, tenant(1), 1, 1), deployment(2, tenant(2), 1, 1));
        let s = snapshot(vec![worker("w1", 1, 4)], vec![a.clone(), b.clone()], vec![]);
        let p = run(&s);
        let reason = p.inserts[1].placement.clone().unwrap_err();
        assert!(reason.contains("no 'cpu' slice"), "{reason}");
        assert!(p.events.iter().any(|e| e.kind == "unplaceable" && e.deployment_id == b.id));
        // Next tick: the same reason is not repeated.
        let mut pending = replica(&b, 2, 0, 1, None, ReplicaState::Pending);
        pending.reason = Some(reason);
        let s = snapshot(
            vec![worker("w1", 1, 4)],
            vec![a.clone(), b],
            vec![replica(&a, 1, 0, 1, Some(("w1", "cpu-0")), ReplicaState::Ready), pending],
        );
        assert!(run(&s).is_empty(), "{:?}", run(&s));
    }

    #[test]
    fn memory_must_fit() {
        let mut d = deployment(1, tenant(1), 1, 1);
        d.memory_bytes = Some(i64::try_from(5 * GIB).unwrap());
        let p = run(&snapshot(vec![worker("w1", 2, 4)], vec![d], vec![]));
        assert!(p.inserts[0].placement.is_err());
    }

    #[test]
    fn a_lost_workers_replicas_move_elsewhere() {
        let d = deployment(1, tenant(1), 2, 1);
        let mut w1 = worker("w1", 2, 4);
        w1.last_heartbeat_at = now() - Duration::from_secs(11);
        let replicas = vec![
            replica(&d, 1, 0, 1, Some(("w1", "cpu-0")), ReplicaState::Ready),
            replica(&d, 2, 1, 1, Some(("w2", "cpu-0")), ReplicaState::Ready),
        ];
        let p = run(&snapshot(vec![w1, worker("w2", 2, 4)], vec![d], replicas));
        assert_eq!(p.lost_workers, ["w1"]);
        // w2's other slice, not the one its sibling holds: replicas spread across slices too.
        let moved = ReplicaChange::Place {
            id: Uuid::from_u128(5_001),
            placement: Placement { worker: "w2".into(), slice: "cpu-1".into() },
        };
        assert_eq!(p.changes, [moved]);
        assert!(p.events.iter().all(|e| e.kind != "replicas_colocated"), "{:?}", p.events);
        assert!(p.events.iter().any(|e| e.kind == "worker_lost"));
        assert!(p.events.iter().any(|e| e.kind == "rescheduled"));
    }

    #[test]
    fn a_replica_whose_runner_keeps_dying_moves_to_another_worker_or_stays_when_there_is_none() {
        let d = deployment(1, tenant(1), 1, 1);
        let mut looping = replica(&d, 1, 0, 1, Some(("w1", "cpu-0")), ReplicaState::Failed);
        looping.reason = Some(format!("{}it keeps dying: killed by signal 6", tessera_protocol::CRASH_LOOP_REASON));
        let p = run(&snapshot(vec![worker("w1", 2, 4), worker("w2", 2, 4)], vec![d.clone()], vec![looping.clone()]));
        let moved = ReplicaChange::MoveOffCrashLoop {
            id: Uuid::from_u128(5_001),
            placement: Placement { worker: "w2".into(), slice: "cpu-0".into() },
        };
        assert_eq!(p.changes, [moved]);
        let event = p.events.iter().find(|e| e.kind == "rescheduled").expect("an event says why");
        assert!(
            event.message.contains("from worker w1 to worker w2") && event.message.contains("signal 6"),
            "{event:?}"
        );

        // Alone on its worker, it stays; a failure of another kind (a bad model) stays too.
        let p = run(&snapshot(vec![worker("w1", 2, 4)], vec![d.clone()], vec![looping.clone()]));
        assert!(p.changes.is_empty() && p.events.is_empty(), "{p:?}");
        looping.reason = Some("failed to load: bad model".into());
        let p = run(&snapshot(vec![worker("w1", 2, 4), worker("w2", 2, 4)], vec![d], vec![looping]));
        assert!(p.changes.is_empty(), "{p:?}");
    }

    #[test]
    fn a_replica_that_crash_loops_everywhere_stops_moving_and_says_so_once() {
        let d = deployment(1, tenant(1), 1, 1);
        let workers = || vec![worker("w1", 2, 4), worker("w2", 2, 4), worker("w3", 2, 4)];
        let mut looping = replica(&d, 1, 0, 1, Some(("w2", "cpu-0")), ReplicaState::Failed);
        looping.reason = Some(format!("{}it keeps dying: out of memory", tessera_protocol::CRASH_LOOP_REASON));
        // Moves left: it moves.
        looping.crash_moves = MAX_CRASH_MOVES - 1;
        let p = run(&snapshot(workers(), vec![d.clone()], vec![looping.clone()]));
        assert!(matches!(p.changes.as_slice(), [ReplicaChange::MoveOffCrashLoop { .. }]), "{p:?}");
        // Out of moves: it stays on its worker, keeps its slice, and an event says why, once.
        looping.crash_moves = MAX_CRASH_MOVES;
        let p = run(&snapshot(workers(), vec![d.clone()], vec![looping.clone()]));
        assert_eq!(p.changes, [ReplicaChange::StayInCrashLoop { id: looping.id }]);
        let event = p.events.iter().find(|e| e.kind == "crash_loop").expect("a crash_loop event");
        assert!(event.message.contains("after 2 moves") && event.message.contains("out of memory"), "{event:?}");
        looping.crash_moves = MAX_CRASH_MOVES + 1;
        let p = run(&snapshot(workers(), vec![d], vec![looping]));
        assert!(p.changes.is_empty() && p.events.is_empty(), "nothing more to say: {p:?}");
    }

    /// A simulated H200 node with seven 1g.18gb MIG slices `MIG-<id>-<n>`.
    fn h200(id: &str) -> WorkerInfo {
        WorkerInfo { slices: crate::scheduler::tests::h200_1g_slices(id), ..worker(id, 0, 0) }
    }

    fn on_mig(mut d: DeploymentInfo) -> DeploymentInfo {
        d.profile = "mig-1g.18gb".into();
        d
    }

    #[test]
    fn replicas_move_off_a_gpu_whose_slices_are_unhealthy() {
        let d = on_mig(deployment(1, tenant(1), 2, 1));
        let mut w1 = h200("w1");
        let xid = "Xid 79 (GPU has fallen off the bus) on GPU-1";
        w1.unhealthy_slices = w1.slices.iter().map(|s| (s.id.clone(), xid.to_string())).collect();
        let replicas = vec![
            replica(&d, 1, 0, 1, Some(("w1", "MIG-w1-0")), ReplicaState::Ready),
            replica(&d, 2, 1, 1, Some(("w2", "MIG-w2-0")), ReplicaState::Ready),
        ];
        let p = run(&snapshot(vec![w1, h200("w2")], vec![d], replicas));
        let moved = ReplicaChange::Place {
            id: Uuid::from_u128(5_001),
            placement: Placement { worker: "w2".into(), slice: "MIG-w2-1".into() },
        };
        assert_eq!(p.changes, [moved], "it takes a slice of the healthy GPU its sibling does not hold");
        let why = p.events.iter().find(|e| e.kind == "slice_unhealthy").expect("an event says why");
        assert!(why.message.contains("MIG-w1-0") && why.message.contains(xid), "{why:?}");
        assert!(p.events.iter().any(|e| e.kind == "rescheduled" && e.replica_id == Some(Uuid::from_u128(5_001))));
        assert!(p.lost_workers.is_empty(), "the worker itself is fine");
    }

    #[test]
    fn a_mig_scoped_xid_moves_only_that_slices_replicas_and_new_ones_avoid_it() {
        let (a, b) = (on_mig(deployment(1, tenant(1), 1, 1)), on_mig(deployment(2, tenant(2), 1, 1)));
        let mut w1 = h200("w1");
        w1.unhealthy_slices.insert("MIG-w1-0".into(), "Xid 94 (contained ECC error) on GPU-1".into());
        let replicas = vec![
            replica(&a, 1, 0, 1, Some(("w1", "MIG-w1-0")), ReplicaState::Ready),
            replica(&b, 2, 0, 1, Some(("w1", "MIG-w1-1")), ReplicaState::Ready),
        ];
        let p = run(&snapshot(vec![w1.clone()], vec![a.clone(), b.clone()], replicas.clone()));
        let moved = ReplicaChange::Place {
            id: Uuid::from_u128(5_001),
            placement: Placement { worker: "w1".into(), slice: "MIG-w1-2".into() },
        };
        assert_eq!(p.changes, [moved], "tenant 2 keeps MIG-w1-1; tenant 1 takes a free healthy slice");
        // A new deployment of seven replicas of a slice each finds four healthy free slices
        // (one is unhealthy, two hold tenants 1 and 2).
        let mut c = on_mig(deployment(3, tenant(3), 7, 1));
        c.memory_bytes = Some(10 << 30);
        let p = run(&snapshot(vec![w1], vec![a, b, c], replicas));
        let slices: Vec<String> = p.inserts.iter().filter_map(|r| r.placement.clone().ok()).map(|p| p.slice).collect();
        assert!(!slices.iter().any(|s| s == "MIG-w1-0"), "{slices:?}");
        assert_eq!(p.inserts.iter().filter(|r| r.placement.is_err()).count(), 3);
    }

    #[test]
    fn a_new_leader_gives_workers_time_to_reconnect() {
        let d = deployment(1, tenant(1), 1, 1);
        let mut w1 = worker("w1", 2, 4);
        // Silent for 11 s because the control plane was down; it became leader 1 s ago.
        w1.last_heartbeat_at = now() - Duration::from_secs(11);
        let replicas = vec![replica(&d, 1, 0, 1, Some(("w1", "cpu-0")), ReplicaState::Ready)];
        let snap = snapshot(vec![w1, worker("w2", 2, 4)], vec![d], replicas);
        let settings = Settings { leader_since: Some(now() - Duration::from_secs(1)), ..settings() };
        let p = plan(&snap, now(), &settings, &mut ids());
        assert!(p.lost_workers.is_empty() && p.changes.is_empty(), "{p:?}");
        let settings = Settings { leader_since: Some(now() - Duration::from_secs(11)), ..settings };
        assert_eq!(plan(&snap, now(), &settings, &mut ids()).lost_workers, ["w1"]);
    }

    #[test]
    fn draining_replicas_on_a_lost_worker_are_dropped_not_moved() {
        let d = deployment(1, tenant(1), 1, 2);
        let mut w1 = worker("w1", 2, 4);
        w1.state = "lost".into();
        let mut draining = replica(&d, 1, 0, 1, Some(("w1", "cpu-0")), ReplicaState::Draining);
        (draining.serving, draining.drain_until) = (false, Some(now() + Duration::from_secs(60)));
        let current = replica(&d, 2, 0, 2, Some(("w2", "cpu-0")), ReplicaState::Ready);
        let p = run(&snapshot(vec![w1, worker("w2", 2, 4)], vec![d], vec![draining.clone(), current]));
        assert_eq!(p.changes, [ReplicaChange::Delete { id: draining.id }]);
    }

    #[test]
    fn slice_quotas_hold() {
        let d = deployment(1, tenant(1), 3, 1);
        let mut s = snapshot(vec![worker("w1", 2, 2), worker("w2", 2, 2)], vec![d], vec![]);
        s.slice_quotas.insert(tenant(1), BTreeMap::from([("cpu".to_string(), 1)]));
        let p = run(&s);
        assert_eq!(placed(&p)[..2], [("w1".into(), "cpu-0".into()), ("w1".into(), "cpu-0".into())]);
        let third = p.inserts[2].placement.clone().unwrap_err();
        assert!(third.contains("quota of 1 'cpu' slice"), "{third}");
    }

    #[test]
    fn a_rollout_loads_beside_switches_when_ready_then_drains() {
        let d = deployment(1, tenant(1), 2, 2);
        let old = vec![
            replica(&d, 1, 0, 1, Some(("w2", "cpu-1")), ReplicaState::Ready),
            replica(&d, 2, 1, 1, Some(("w1", "cpu-0")), ReplicaState::Ready),
        ];
        let workers = vec![worker("w1", 2, 4), worker("w2", 2, 4)];
        // Step 1: new replicas, not serving, next to the old one of the same index.
        let p = run(&snapshot(workers.clone(), vec![d.clone()], old.clone()));
        assert_eq!(placed(&p), [("w2".into(), "cpu-1".into()), ("w1".into(), "cpu-0".into())]);
        assert!(p.inserts.iter().all(|r| !r.serving && r.version == 2));
        assert!(p.events.iter().any(|e| e.kind == "rollout_started"));
        assert!(p.changes.is_empty());
        // Step 2: one new replica still loading: nothing switches.
        let mut new: Vec<ReplicaInfo> = p
            .inserts
            .iter()
            .map(|r| {
                let at = r.placement.clone().unwrap();
                ReplicaInfo {
                    id: r.id,
                    deployment_id: d.id,
                    index: r.index,
                    version: 2,
                    spec_generation: 1,
                    profile: "cpu".into(),
                    memory_bytes: r.memory_bytes,
                    worker_id: Some(at.worker),
                    slice_id: Some(at.slice),
                    state: ReplicaState::Ready,
                    reason: None,
                    crash_moves: 0,
                    serving: false,
                    drain_until: None,
                    canary: false,
                }
            })
            .collect();
        new[1].state = ReplicaState::Loading;
        let all = |new: &[ReplicaInfo]| old.iter().chain(new).cloned().collect::<Vec<_>>();
        assert!(run(&snapshot(workers.clone(), vec![d.clone()], all(&new))).is_empty());
        // Step 3: all ready: switch and drain.
        new[1].state = ReplicaState::Ready;
        let p = run(&snapshot(workers.clone(), vec![d.clone()], all(&new)));
        let until = now() + Duration::from_secs(3);
        assert_eq!(
            p.changes,
            [
                ReplicaChange::Serve { id: new[0].id },
                ReplicaChange::Serve { id: new[1].id },
                ReplicaChange::Drain { id: old[0].id, until },
                ReplicaChange::Drain { id: old[1].id, until },
            ]
        );
        // Step 4: drained replicas go once their time is up.
        let drained: Vec<ReplicaInfo> = old
            .iter()
            .map(|r| ReplicaInfo {
                state: ReplicaState::Draining,
                serving: false,
                drain_until: Some(until),
                ..r.clone()
            })
            .collect();
        let serving: Vec<ReplicaInfo> = new.iter().map(|r| ReplicaInfo { serving: true, ..r.clone() }).collect();
        let replicas: Vec<ReplicaInfo> = drained.iter().chain(&serving).cloned().collect();
        assert!(run(&snapshot(workers.clone(), vec![d.clone()], replicas.clone())).is_empty(), "still draining");
        let later = plan(&snapshot(workers, vec![d.clone()], replicas), until, &settings(), &mut ids());
        assert_eq!(later.changes, [ReplicaChange::Delete { id: old[0].id }, ReplicaChange::Delete { id: old[1].id }]);
    }

    #[test]
    fn a_moved_alias_retargets_and_superseded_replicas_go() {
        let mut d = deployment(1, tenant(1), 1, 2);
        d.alias = Some("production".into());
        d.alias_version = Some(3);
        let mut superseded = replica(&d, 2, 0, 2, Some(("w1", "cpu-0")), ReplicaState::Loading);
        superseded.serving = false;
        let serving = replica(&d, 1, 0, 1, Some(("w1", "cpu-0")), ReplicaState::Ready);
        let p = run(&snapshot(vec![worker("w1", 2, 4)], vec![d.clone()], vec![serving, superseded.clone()]));
        assert_eq!(p.retarget, [(d.id, 3)]);
        assert_eq!(p.inserts.len(), 1);
        assert_eq!((p.inserts[0].version, p.inserts[0].serving), (3, false));
        assert!(p.changes.contains(&ReplicaChange::Delete { id: superseded.id }));
    }

    #[test]
    fn scaling_down_removes_the_highest_indices() {
        let d = deployment(1, tenant(1), 1, 1);
        let replicas = vec![
            replica(&d, 1, 0, 1, Some(("w1", "cpu-0")), ReplicaState::Ready),
            replica(&d, 2, 1, 1, Some(("w1", "cpu-0")), ReplicaState::Ready),
        ];
        let p = run(&snapshot(vec![worker("w1", 2, 4)], vec![d], replicas));
        assert_eq!(p.changes, [ReplicaChange::Delete { id: Uuid::from_u128(5_002) }]);
    }

    #[test]
    fn configs_carry_the_deployment_settings() {
        let mut d = deployment(1, tenant(1), 1, 1);
        d.instance_count = 3;
        d.max_batch_size = Some(8);
        d.dynamic_batching = Some(json!({ "max_queue_delay_microseconds": 100, "preferred_batch_size": [4] }));
        let stored = json!({ "name": "other", "max_batch_size": 2, "input": [{ "name": "x" }] });
        let c = render_config(&d, Some(&stored));
        assert_eq!(c["name"], "m1");
        assert_eq!(c["max_batch_size"], 8);
        assert_eq!(c["input"][0]["name"], "x");
        assert_eq!(c["instance_group"], json!([{ "count": 3, "kind": "KIND_CPU" }]));
        assert_eq!(c["dynamic_batching"]["preferred_batch_size"], json!([4]));
        d.profile = "mig-1g.10gb".into();
        assert_eq!(render_config(&d, None)["instance_group"][0]["kind"], "KIND_GPU");
        let cpu_model = json!({ "instance_group": [{ "kind": "KIND_CPU", "count": 4 }] });
        assert_eq!(render_config(&d, Some(&cpu_model))["instance_group"], json!([{ "count": 3, "kind": "KIND_GPU" }]));
    }

    #[test]
    fn a_gpu_config_is_never_rendered_for_the_cpu() {
        let d = deployment(1, tenant(1), 1, 1);
        assert_eq!(d.profile, "cpu");
        let gpu = json!({ "instanceGroup": [{ "kind": "KIND_GPU", "gpus": [1] }] });
        let c = render_config(&d, Some(&gpu));
        assert_eq!(c["instance_group"], json!([{ "count": 1, "kind": "KIND_GPU" }]));
        assert!(c.get("instanceGroup").is_none(), "{c}");
        let trt = json!({ "optimization": { "execution_accelerators": { "gpu_execution_accelerator": [{ "name": "tensorrt" }] } } });
        assert_eq!(render_config(&d, Some(&trt))["instance_group"][0]["kind"], "KIND_GPU");
    }

    #[test]
    fn a_tick_places_ten_thousand_replicas_on_a_thousand_workers() {
        let deployments: Vec<DeploymentInfo> = (0..500)
            .map(|i| DeploymentInfo { memory_bytes: Some(1 << 30), ..deployment(i, tenant(i % 100), 20, 1) })
            .collect();
        let workers: Vec<WorkerInfo> = (0..1_000).map(|i| worker(&format!("w{i:04}"), 8, 16)).collect();
        let started = std::time::Instant::now();
        let p = run(&snapshot(workers, deployments, vec![]));
        assert_eq!(p.inserts.len(), 10_000);
        assert!(p.inserts.iter().all(|r| r.placement.is_ok()));
        // Generous: debug builds on a shared CI machine (the release goal is under a second).
        assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    }

    #[test]
    fn plans_are_deterministic() {
        let deployments: Vec<DeploymentInfo> = (0..20).map(|i| deployment(i, tenant(i % 3), 3, 1)).collect();
        let workers: Vec<WorkerInfo> = (0..6).map(|i| worker(&format!("w{i}"), 4, 8)).collect();
        let s = snapshot(workers, deployments, vec![]);
        assert_eq!(run(&s), run(&s));
    }
}
