//! Workers: registered over the agent session, kept alive by heartbeats, and the assignment
//! set each one must hold. Workers belong to the platform, not to a tenant; the queries that
//! read replicas by worker cross tenants on purpose (a worker hosts several tenants' slices).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::FromRow;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Conn, Registry, exec, now, on_conn};
use crate::error::Result;
use crate::states::{ReplicaState, WorkerState};

/// One slice a worker offers, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceRecord {
    /// Unique within the worker.
    pub id: String,
    /// Profile the scheduler matches (`cpu`, `gpu`, `mig-1g.10gb`).
    pub profile: String,
    /// `cpu`, `gpu` or `mig`.
    pub kind: String,
    /// Memory it can hold.
    pub memory_bytes: u64,
}

/// A worker.
#[derive(Debug, Clone, FromRow)]
pub struct WorkerRow {
    /// Id chosen by the worker.
    pub id: String,
    /// KServe HTTP base URL.
    pub http_endpoint: String,
    /// KServe gRPC address.
    pub grpc_endpoint: String,
    /// Metrics base URL (may be empty).
    pub metrics_endpoint: String,
    /// Slices offered.
    pub slices: Json<Vec<SliceRecord>>,
    /// Labels.
    pub labels: Json<BTreeMap<String, String>>,
    /// Worker binary version.
    pub version: String,
    /// `ready` or `lost`.
    pub state: String,
    /// Assignment generation: grows with every change to the worker's replicas.
    pub generation: i64,
    /// The generation the worker last reported as applied.
    pub applied_generation: i64,
    /// First (or latest) registration.
    pub registered_at: OffsetDateTime,
    /// Last heartbeat.
    pub last_heartbeat_at: OffsetDateTime,
    /// Slices the worker reported unhealthy, with why (the last heartbeat's set).
    pub unhealthy_slices: Json<BTreeMap<String, String>>,
}

/// What a worker says when it registers.
#[derive(Debug, Clone)]
pub struct NewWorker {
    /// Id.
    pub id: String,
    /// KServe HTTP base URL.
    pub http_endpoint: String,
    /// KServe gRPC address.
    pub grpc_endpoint: String,
    /// Metrics base URL.
    pub metrics_endpoint: String,
    /// Slices.
    pub slices: Vec<SliceRecord>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Binary version.
    pub version: String,
}

/// A replica the worker must hold, with what it needs to load it.
#[derive(Debug, Clone, FromRow)]
pub struct AssignmentRow {
    /// Replica.
    pub replica_id: Uuid,
    /// Deployment.
    pub deployment_id: Uuid,
    /// Tenant.
    pub tenant_id: Uuid,
    /// Tenant name.
    pub tenant_name: String,
    /// Model name.
    pub model_name: String,
    /// Version.
    pub version: i64,
    /// The version's id (what an ensemble's composing versions are recorded under).
    pub version_id: Uuid,
    /// Slice.
    pub slice_id: String,
    /// Rendered model config.
    pub config: Json<Value>,
    /// Whether unversioned requests reach it.
    pub serving: bool,
    /// Artifact key.
    pub artifact_key: String,
    /// Artifact sha256.
    pub sha256: String,
    /// Artifact size.
    pub size_bytes: i64,
    /// Artifact format.
    pub format: String,
    /// The deployment's capture settings, if ever set.
    pub capture: Option<Json<Value>>,
}

/// A replica state a worker reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedState {
    /// Replica.
    pub replica_id: Uuid,
    /// `loading`, `ready` or `failed` (the others are the control plane's to decide).
    pub state: ReplicaState,
    /// Why it failed.
    pub reason: Option<String>,
}

/// A replica whose state changed on a report.
#[derive(Debug, Clone, FromRow)]
pub struct ChangedReplica {
    /// Tenant.
    pub tenant_id: Uuid,
    /// Deployment.
    pub deployment_id: Uuid,
    /// Index.
    pub replica_index: i64,
}

macro_rules! select_workers {
    ($rest:literal) => {
        concat!(
            "SELECT id, http_endpoint, grpc_endpoint, metrics_endpoint, slices, labels, version, state, generation, ",
            "applied_generation, registered_at, last_heartbeat_at, unhealthy_slices FROM workers ",
            $rest
        )
    };
}

impl Conn {
    /// Every worker by id (platform admins; the scheduler).
    pub async fn workers(&mut self) -> Result<Vec<WorkerRow>> {
        on_conn!(self, "worker.list", |c| sqlx::query_as::<_, WorkerRow>(select_workers!("ORDER BY id")).fetch_all(c))
    }

    /// A worker's assignment generation, if it is registered.
    pub async fn worker_generation(&mut self, id: &str) -> Result<Option<i64>> {
        on_conn!(self, "worker.generation", |c| sqlx::query_scalar::<_, i64>(
            "SELECT generation FROM workers WHERE id = $1"
        )
        .bind(id)
        .fetch_optional(c))
    }

    /// Replicas per worker (for the workers listing).
    pub async fn replica_counts(&mut self) -> Result<Vec<(String, i64)>> {
        on_conn!(self, "worker.replica_counts", |c| sqlx::query_as::<_, (String, i64)>(
            "SELECT worker_id, COUNT(*) FROM replicas WHERE worker_id IS NOT NULL GROUP BY worker_id"
        )
        .fetch_all(c))
    }

    /// Which tenant holds each (worker, slice) (for the workers listing).
    pub async fn slice_tenants(&mut self) -> Result<Vec<(String, String, Uuid)>> {
        on_conn!(self, "worker.slice_tenants", |c| sqlx::query_as::<_, (String, String, Uuid)>(
            "SELECT DISTINCT worker_id, slice_id, tenant_id FROM replicas \
             WHERE worker_id IS NOT NULL AND slice_id IS NOT NULL"
        )
        .fetch_all(c))
    }

    /// The replicas a worker must hold, with their artifacts, by replica id.
    pub async fn assignments(&mut self, worker_id: &str) -> Result<Vec<AssignmentRow>> {
        on_conn!(self, "worker.assignments", |c| {
            sqlx::query_as::<_, AssignmentRow>(
            "SELECT r.id AS replica_id, r.deployment_id, r.tenant_id, t.name AS tenant_name, m.name AS model_name, \
             r.version, v.id AS version_id, r.slice_id, r.config, r.serving, v.artifact_key, v.sha256, v.size_bytes, v.format, d.capture \
             FROM replicas r JOIN deployments d ON d.id = r.deployment_id JOIN models m ON m.id = d.model_id \
             JOIN tenants t ON t.id = r.tenant_id \
             JOIN model_versions v ON v.model_id = d.model_id AND v.version = r.version \
             WHERE r.worker_id = $1 AND r.slice_id IS NOT NULL ORDER BY r.id"
        )
        .bind(worker_id)
        .fetch_all(c)
        })
    }

    /// Whether an object-store key is a registered artifact (what workers may fetch).
    pub async fn is_artifact(&mut self, key: &str) -> Result<bool> {
        let n: i64 = on_conn!(self, "version.by_artifact_key", |c| sqlx::query_scalar(
            "SELECT COUNT(*) FROM model_versions WHERE artifact_key = $1"
        )
        .bind(key)
        .fetch_one(c))?;
        Ok(n > 0)
    }

    /// Records a heartbeat and the assignment generation the worker has applied; a worker
    /// marked lost that still beats is ready again. False when the worker is not registered.
    pub async fn heartbeat(&mut self, id: &str, at: OffsetDateTime, applied_generation: i64) -> Result<bool> {
        let n = exec!(self, "worker.heartbeat", |c| sqlx::query(
            "UPDATE workers SET last_heartbeat_at = $2, state = $4, applied_generation = $3 WHERE id = $1"
        )
        .bind(id)
        .bind(at)
        .bind(applied_generation)
        .bind(WorkerState::Ready.as_str())
        .execute(c))?;
        Ok(n > 0)
    }

    /// Stores the slices a worker reports unhealthy (slice id to reason), replacing the set
    /// it reported before. False when the worker is not registered.
    pub async fn set_unhealthy_slices(&mut self, id: &str, unhealthy: &BTreeMap<String, String>) -> Result<bool> {
        let n = exec!(self, "worker.set_unhealthy_slices", |c| sqlx::query(
            "UPDATE workers SET unhealthy_slices = $2 WHERE id = $1"
        )
        .bind(id)
        .bind(Json(unhealthy))
        .execute(c))?;
        Ok(n > 0)
    }
}

impl Registry {
    /// Registers (or re-registers) a worker as ready, bumping its generation so its session
    /// sends a fresh assignment set that its replicas' deployments wait for.
    pub async fn register_worker(&self, w: &NewWorker) -> Result<WorkerRow> {
        let at = now();
        let mut tx = self.begin().await?;
        exec!(tx, "worker.upsert", |c| sqlx::query(
            "INSERT INTO workers (id, http_endpoint, grpc_endpoint, metrics_endpoint, slices, labels, version, state, \
             generation, registered_at, last_heartbeat_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $9, 1, $8, $8) \
             ON CONFLICT (id) DO UPDATE SET http_endpoint = $2, grpc_endpoint = $3, metrics_endpoint = $4, \
             slices = $5, labels = $6, version = $7, state = $9, generation = workers.generation + 1, \
             registered_at = $8, last_heartbeat_at = $8"
        )
        .bind(&w.id)
        .bind(&w.http_endpoint)
        .bind(&w.grpc_endpoint)
        .bind(&w.metrics_endpoint)
        .bind(Json(&w.slices))
        .bind(Json(&w.labels))
        .bind(&w.version)
        .bind(at)
        .bind(WorkerState::Ready.as_str())
        .execute(c))?;
        let row = on_conn!(tx, "worker.get", |c| sqlx::query_as::<_, WorkerRow>(select_workers!("WHERE id = $1"))
            .bind(&w.id)
            .fetch_one(c))?;
        // A worker that registers (again) gets its whole set anew and may have lost what it held:
        // every replica on it waits for this generation, as a placement would.
        exec!(tx, "replica.stamp_registered_worker", |c| sqlx::query(
            "UPDATE replicas SET assigned_generation = $2 WHERE worker_id = $1"
        )
        .bind(&w.id)
        .bind(row.generation)
        .execute(c))?;
        tx.commit().await?;
        Ok(row)
    }

    /// Stores the replica states a worker reported (only for replicas placed on it, never
    /// over the control plane's own `draining`), with a `ready`/`failed` event for each
    /// change. Returns the replicas that changed.
    pub async fn report_states(&self, worker_id: &str, reports: &[ReportedState]) -> Result<Vec<ChangedReplica>> {
        let mut changed = Vec::new();
        if reports.is_empty() {
            return Ok(changed);
        }
        let at = now();
        let mut tx = self.begin().await?;
        for report in reports {
            let row = on_conn!(tx, "replica.report_state", |c| sqlx::query_as::<_, ChangedReplica>(
                "UPDATE replicas SET state = $3, reason = $4, updated_at = $5, \
                 crash_moves = CASE WHEN $3 = $6 THEN 0 ELSE crash_moves END \
                 WHERE id = $1 AND worker_id = $2 AND state <> $7 \
                 AND (state <> $3 OR COALESCE(reason, '') <> COALESCE($4, '')) \
                 RETURNING tenant_id, deployment_id, replica_index"
            )
            .bind(report.replica_id)
            .bind(worker_id)
            .bind(report.state.as_str())
            .bind(&report.reason)
            .bind(at)
            .bind(ReplicaState::Ready.as_str())
            .bind(ReplicaState::Draining.as_str())
            .fetch_optional(c))?;
            let Some(row) = row else { continue };
            if report.state != ReplicaState::Loading {
                let message = match &report.reason {
                    Some(reason) => format!("replica {} {}: {reason}", row.replica_index, report.state),
                    None => format!("replica {} {} on worker {worker_id}", row.replica_index, report.state),
                };
                let (tenant, deployment) = (row.tenant_id, row.deployment_id);
                let replica = Some(report.replica_id);
                let kind = report.state.as_str();
                tx.insert_deployment_event(tenant, deployment, kind, replica, Some(worker_id), &message).await?;
            }
            changed.push(row);
        }
        tx.commit().await?;
        Ok(changed)
    }
}
