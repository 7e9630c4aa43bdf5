//! What a scheduler tick reads and writes: the whole desired and observed state (every
//! tenant's deployments and replicas: the scheduler places across tenants by nature) and the
//! application of a [`Plan`]. Both run inside one transaction under
//! [`Conn::lock_scheduling`].

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::deployments::{DeploymentRow, ReplicaRow, select_deployments, select_replicas};
use super::workers::WorkerRow;
use super::{Conn, exec, now, on_conn};
use crate::error::Result;
use crate::states::{ReplicaState, WorkerState};
use crate::tick::{DeploymentInfo, Plan, ReplicaChange, ReplicaInfo, SliceSpec, Snapshot, VersionInfo, WorkerInfo};

#[derive(sqlx::FromRow)]
struct VersionSize {
    model_id: Uuid,
    version: i64,
    size_bytes: i64,
    config: Option<Json<Value>>,
}

#[derive(sqlx::FromRow)]
struct AliasTarget {
    deployment_id: Uuid,
    version: i64,
}

#[derive(sqlx::FromRow)]
struct SliceQuota {
    tenant_id: Uuid,
    max_slices: Json<std::collections::BTreeMap<String, i64>>,
}

impl Conn {
    /// Reads everything a tick decides on.
    pub async fn scheduling_snapshot(&mut self) -> Result<Snapshot> {
        let workers = self.workers().await?;
        let deployments =
            on_conn!(self, "scheduling.deployments", |c| sqlx::query_as::<_, DeploymentRow>(select_deployments!(""))
                .fetch_all(c))?;
        let replicas =
            on_conn!(self, "scheduling.replicas", |c| sqlx::query_as::<_, ReplicaRow>(select_replicas!(""))
                .fetch_all(c))?;
        let versions = on_conn!(self, "scheduling.versions", |c| {
            sqlx::query_as::<_, VersionSize>(
            "SELECT v.model_id, v.version, v.size_bytes + v.composing_bytes AS size_bytes, v.config FROM model_versions v \
             JOIN deployments d ON d.model_id = v.model_id"
        )
        .fetch_all(c)
        })?;
        let aliases = on_conn!(self, "scheduling.aliases", |c| sqlx::query_as::<_, AliasTarget>(
            "SELECT d.id AS deployment_id, a.version FROM deployments d \
             JOIN model_aliases a ON a.model_id = d.model_id AND a.alias = d.alias"
        )
        .fetch_all(c))?;
        let quotas = on_conn!(self, "scheduling.quotas", |c| sqlx::query_as::<_, SliceQuota>(
            "SELECT q.tenant_id, q.max_slices FROM tenant_quotas q \
             WHERE q.tenant_id IN (SELECT tenant_id FROM deployments)"
        )
        .fetch_all(c))?;
        let alias_of: HashMap<Uuid, i64> = aliases.into_iter().map(|a| (a.deployment_id, a.version)).collect();
        Ok(Snapshot {
            workers: workers.into_iter().map(worker_info).collect(),
            deployments: deployments.into_iter().map(|d| deployment_info(d, &alias_of)).collect(),
            versions: versions
                .into_iter()
                .map(|v| {
                    ((v.model_id, v.version), VersionInfo { size_bytes: v.size_bytes, config: v.config.map(|c| c.0) })
                })
                .collect(),
            replicas: replicas.into_iter().map(replica_info).collect(),
            slice_quotas: quotas.into_iter().map(|q| (q.tenant_id, q.max_slices.0)).collect(),
        })
    }

    /// Applies a plan; returns the workers whose assignments changed (their generation was
    /// bumped). The replicas of each deployment that changed on a worker are stamped with that
    /// worker's new generation, the one their deployment's readiness waits for.
    pub async fn apply_plan(&mut self, plan: &Plan, snapshot: &Snapshot) -> Result<BTreeSet<String>> {
        let at = now();
        // (deployment, worker) pairs whose assignments this plan changes.
        let mut changed: BTreeSet<(Uuid, String)> = BTreeSet::new();
        let placed_on: HashMap<Uuid, (Uuid, Option<&String>)> =
            snapshot.replicas.iter().map(|r| (r.id, (r.deployment_id, r.worker_id.as_ref()))).collect();
        for id in &plan.lost_workers {
            exec!(self, "worker.mark_lost", |c| sqlx::query("UPDATE workers SET state = $2 WHERE id = $1")
                .bind(id)
                .bind(WorkerState::Lost.as_str())
                .execute(c))?;
        }
        for (deployment, version) in &plan.retarget {
            exec!(self, "deployment.retarget", |c| sqlx::query(
                "UPDATE deployments SET version = $2, updated_at = $3 WHERE id = $1"
            )
            .bind(deployment)
            .bind(version)
            .bind(at)
            .execute(c))?;
        }
        for deployment in &plan.clear_canary {
            // Only a promotion that is still the one planned: a canary set since then stays.
            exec!(self, "deployment.clear_canary", |c| sqlx::query(
                "UPDATE deployments SET canary_version = NULL, canary_weight = 0, canary_replicas = 0, updated_at = $2 \
                 WHERE id = $1 AND canary_version = version"
            )
            .bind(deployment)
            .bind(at)
            .execute(c))?;
        }
        for r in &plan.inserts {
            let (worker, slice, state, reason) = match &r.placement {
                Ok(p) => (Some(p.worker.clone()), Some(p.slice.clone()), ReplicaState::Scheduled, None),
                Err(reason) => (None, None, ReplicaState::Pending, Some(reason.clone())),
            };
            if let Some(w) = &worker {
                changed.insert((r.deployment_id, w.clone()));
            }
            exec!(self, "replica.insert", |c| {
                sqlx::query(
                "INSERT INTO replicas (id, tenant_id, deployment_id, replica_index, version, spec_generation, profile, \
                 memory_bytes, config, worker_id, slice_id, state, reason, serving, drain_until, canary, created_at, \
                 updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, NULL, $15, $16, $16)"
            )
            .bind(r.id)
            .bind(r.tenant_id)
            .bind(r.deployment_id)
            .bind(r.index)
            .bind(r.version)
            .bind(r.spec_generation)
            .bind(&r.profile)
            .bind(r.memory_bytes)
            .bind(Json(&r.config))
            .bind(&worker)
            .bind(&slice)
            .bind(state.as_str())
            .bind(&reason)
            .bind(r.serving)
            .bind(r.canary)
            .bind(at)
            .execute(c)
            })?;
        }
        for change in &plan.changes {
            self.apply_change(change, at).await?;
            // A change names a replica of the snapshot (one this plan inserts is changed by its
            // insert alone).
            let Some(&(deployment, worker)) = placed_on.get(&change_id(change)) else { continue };
            if let Some(w) = worker {
                changed.insert((deployment, w.clone()));
            }
            if let ReplicaChange::Place { placement, .. } | ReplicaChange::MoveOffCrashLoop { placement, .. } = change {
                changed.insert((deployment, placement.worker.clone()));
            }
        }
        for e in &plan.events {
            let worker = e.worker_id.as_deref();
            self.insert_deployment_event(e.tenant_id, e.deployment_id, e.kind, e.replica_id, worker, &e.message)
                .await?;
        }
        let touched: BTreeSet<String> = changed.iter().map(|(_, w)| w.clone()).collect();
        for w in &touched {
            exec!(self, "worker.bump_generation", |c| sqlx::query(
                "UPDATE workers SET generation = generation + 1 WHERE id = $1"
            )
            .bind(w)
            .execute(c))?;
        }
        for (deployment, worker) in &changed {
            // Every replica of the deployment on that worker, not only the changed one: a
            // sibling removed (a scale down) is a change the ones left wait for too.
            exec!(self, "replica.stamp_assigned_generation", |c| sqlx::query(
                "UPDATE replicas SET assigned_generation = (SELECT generation FROM workers WHERE id = $2) \
                 WHERE deployment_id = $1 AND worker_id = $2"
            )
            .bind(deployment)
            .bind(worker)
            .execute(c))?;
        }
        Ok(touched)
    }

    async fn apply_change(&mut self, change: &ReplicaChange, at: OffsetDateTime) -> Result<()> {
        match change {
            ReplicaChange::Place { id, placement } => exec!(self, "replica.place", |c| {
                sqlx::query(
                "UPDATE replicas SET worker_id = $2, slice_id = $3, state = 'scheduled', reason = NULL, updated_at = $4 \
                 WHERE id = $1"
            )
            .bind(id)
            .bind(&placement.worker)
            .bind(&placement.slice)
            .bind(at)
            .execute(c)
            }),
            ReplicaChange::MoveOffCrashLoop { id, placement } => exec!(self, "replica.move_off_crash_loop", |c| {
                sqlx::query(
                    "UPDATE replicas SET worker_id = $2, slice_id = $3, state = 'scheduled', reason = NULL, \
                 crash_moves = crash_moves + 1, updated_at = $4 WHERE id = $1",
                )
                .bind(id)
                .bind(&placement.worker)
                .bind(&placement.slice)
                .bind(at)
                .execute(c)
            }),
            ReplicaChange::StayInCrashLoop { id } => exec!(self, "replica.stay_in_crash_loop", |c| sqlx::query(
                "UPDATE replicas SET crash_moves = crash_moves + 1, updated_at = $2 WHERE id = $1"
            )
            .bind(id)
            .bind(at)
            .execute(c)),
            ReplicaChange::Unplaced { id, reason } => exec!(self, "replica.unplace", |c| {
                sqlx::query(
                    "UPDATE replicas SET worker_id = NULL, slice_id = NULL, state = $4, reason = $2, updated_at = $3 \
                 WHERE id = $1",
                )
                .bind(id)
                .bind(reason)
                .bind(at)
                .bind(ReplicaState::Pending.as_str())
                .execute(c)
            }),
            ReplicaChange::Serve { id } => exec!(self, "replica.serve", |c| sqlx::query(
                "UPDATE replicas SET serving = TRUE, updated_at = $2 WHERE id = $1"
            )
            .bind(id)
            .bind(at)
            .execute(c)),
            ReplicaChange::Drain { id, until } => exec!(self, "replica.drain", |c| {
                sqlx::query(
                    "UPDATE replicas SET serving = FALSE, state = $4, drain_until = $2, updated_at = $3 WHERE id = $1",
                )
                .bind(id)
                .bind(until)
                .bind(at)
                .bind(ReplicaState::Draining.as_str())
                .execute(c)
            }),
            ReplicaChange::Delete { id } => {
                exec!(self, "replica.delete", |c| sqlx::query("DELETE FROM replicas WHERE id = $1").bind(id).execute(c))
            }
        }?;
        Ok(())
    }
}

fn change_id(change: &ReplicaChange) -> Uuid {
    match change {
        ReplicaChange::Place { id, .. }
        | ReplicaChange::MoveOffCrashLoop { id, .. }
        | ReplicaChange::StayInCrashLoop { id }
        | ReplicaChange::Unplaced { id, .. }
        | ReplicaChange::Serve { id }
        | ReplicaChange::Drain { id, .. }
        | ReplicaChange::Delete { id } => *id,
    }
}

fn worker_info(w: WorkerRow) -> WorkerInfo {
    WorkerInfo {
        id: w.id,
        state: w.state,
        last_heartbeat_at: w.last_heartbeat_at,
        slices: w
            .slices
            .0
            .into_iter()
            .map(|s| SliceSpec { id: s.id, profile: s.profile, memory_bytes: s.memory_bytes })
            .collect(),
        unhealthy_slices: w.unhealthy_slices.0,
    }
}

fn deployment_info(d: DeploymentRow, alias_of: &HashMap<Uuid, i64>) -> DeploymentInfo {
    DeploymentInfo {
        alias_version: d.alias.as_ref().and_then(|_| alias_of.get(&d.id).copied()),
        id: d.id,
        tenant_id: d.tenant_id,
        model_name: d.model_name,
        model_id: d.model_id,
        version: d.version,
        alias: d.alias,
        spec_generation: d.spec_generation,
        profile: d.profile,
        replicas: d.replicas,
        instance_count: d.instance_count,
        max_batch_size: d.max_batch_size,
        dynamic_batching: d.dynamic_batching.map(|j| j.0),
        memory_bytes: d.memory_bytes,
        canary_version: d.canary_version,
        canary_replicas: d.canary_replicas,
    }
}

fn replica_info(r: ReplicaRow) -> ReplicaInfo {
    ReplicaInfo {
        id: r.id,
        deployment_id: r.deployment_id,
        index: r.replica_index,
        version: r.version,
        spec_generation: r.spec_generation,
        profile: r.profile,
        memory_bytes: r.memory_bytes,
        worker_id: r.worker_id,
        slice_id: r.slice_id,
        state: r.state,
        reason: r.reason,
        serving: r.serving,
        drain_until: r.drain_until,
        crash_moves: r.crash_moves,
        canary: r.canary,
    }
}
