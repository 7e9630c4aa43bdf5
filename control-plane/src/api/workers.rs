//! Workers as the control plane sees them (platform admins): endpoints, liveness, slices and
//! which tenant holds each.

use std::collections::HashMap;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{AppState, Caller};
use crate::error::Result;
use crate::types::Role;

/// One slice of a worker.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkerSlice {
    /// Slice id, unique within the worker.
    pub id: String,
    /// Profile (`cpu`, `gpu`, `mig-1g.10gb`).
    pub profile: String,
    /// `cpu`, `gpu` or `mig`.
    pub kind: String,
    /// Memory it can hold.
    pub memory_bytes: u64,
    /// Tenant whose replicas it holds (a slice serves one tenant); absent when free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<Uuid>,
    /// `healthy`, or `unhealthy` when its worker saw a critical Xid error or lost its GPU
    /// (it takes no replicas until the worker restarts).
    pub health: String,
    /// Why it is unhealthy, e.g. `Xid 79 (GPU has fallen off the bus) on GPU-...`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unhealthy_reason: Option<String>,
}

/// A worker.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Worker {
    /// Worker id.
    pub id: String,
    /// KServe HTTP endpoint.
    pub http_endpoint: String,
    /// KServe gRPC endpoint.
    pub grpc_endpoint: String,
    /// Metrics endpoint (empty when disabled).
    pub metrics_endpoint: String,
    /// `ready` or `lost` (no heartbeat for `--worker-lost-after-ms`).
    pub state: String,
    /// Last heartbeat.
    #[serde(with = "time::serde::rfc3339")]
    pub last_heartbeat_at: OffsetDateTime,
    /// Slices offered.
    pub slices: Vec<WorkerSlice>,
    /// Replicas placed on it.
    pub replicas: i64,
}

/// Every worker.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkerList {
    /// By id.
    pub workers: Vec<Worker>,
}

/// Lists workers (platform admins).
#[utoipa::path(get, path = "/v1/workers", operation_id = "list_workers", tag = "deployments",
    responses((status = 200, description = "Workers.", body = WorkerList)))]
pub async fn handle_worker_list(State(app): State<AppState>, caller: Caller) -> Result<Json<WorkerList>> {
    caller.principal.require(Role::PlatformAdmin, "list workers")?;
    let mut conn = app.registry.conn().await?;
    let rows = conn.workers().await?;
    let counts: HashMap<String, i64> = conn.replica_counts().await?.into_iter().collect();
    let holders: HashMap<(String, String), Uuid> =
        conn.slice_tenants().await?.into_iter().map(|(w, s, t)| ((w, s), t)).collect();
    let workers = rows
        .into_iter()
        .map(|w| Worker {
            slices: w
                .slices
                .0
                .into_iter()
                .map(|s| WorkerSlice {
                    tenant_id: holders.get(&(w.id.clone(), s.id.clone())).copied(),
                    unhealthy_reason: w.unhealthy_slices.0.get(&s.id).cloned(),
                    health: if w.unhealthy_slices.0.contains_key(&s.id) { "unhealthy" } else { "healthy" }.into(),
                    id: s.id,
                    profile: s.profile,
                    kind: s.kind,
                    memory_bytes: s.memory_bytes,
                })
                .collect(),
            replicas: counts.get(&w.id).copied().unwrap_or(0),
            id: w.id,
            http_endpoint: w.http_endpoint,
            grpc_endpoint: w.grpc_endpoint,
            metrics_endpoint: w.metrics_endpoint,
            state: w.state,
            last_heartbeat_at: w.last_heartbeat_at,
        })
        .collect();
    Ok(Json(WorkerList { workers }))
}
