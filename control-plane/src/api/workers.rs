//! Workers as the control plane sees them (platform admins): endpoints, liveness, slices and
//! which tenant holds each.

use std::collections::HashMap;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::models::PageParams;
use super::{ApiQuery, AppState, Caller, cursor};
use crate::error::{Error, Result};
use crate::kinds::wire_enum;
use crate::registry::WorkerRow;
use crate::types::Role;

pub use crate::states::WorkerState;

wire_enum! {
    /// What a slice is.
    pub enum SliceKind {
        /// CPU cores.
        Cpu = "cpu",
        /// A whole GPU.
        Gpu = "gpu",
        /// A MIG instance of a GPU.
        Mig = "mig",
    }
}

wire_enum! {
    /// Whether a slice takes replicas.
    pub enum SliceHealth {
        /// It does.
        Healthy = "healthy",
        /// Its worker saw a critical Xid error or lost its GPU: no replicas until it restarts.
        Unhealthy = "unhealthy",
    }
}

/// One slice of a worker.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkerSlice {
    /// Slice id, unique within the worker.
    pub id: String,
    /// Profile (`cpu`, `gpu`, `mig-1g.10gb`).
    pub profile: String,
    /// CPU, whole GPU or MIG instance.
    pub kind: SliceKind,
    /// Memory it can hold.
    pub memory_bytes: u64,
    /// Tenant whose replicas it holds (a slice serves one tenant); absent when free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<Uuid>,
    /// `unhealthy` when its worker saw a critical Xid error or lost its GPU (it takes no
    /// replicas until the worker restarts).
    pub health: SliceHealth,
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
    /// `lost` after no heartbeat for `--worker-lost-after-ms`.
    pub state: WorkerState,
    /// Last heartbeat.
    #[serde(with = "time::serde::rfc3339")]
    pub last_heartbeat_at: OffsetDateTime,
    /// Slices offered.
    pub slices: Vec<WorkerSlice>,
    /// Replicas placed on it.
    pub replicas: i64,
}

/// A page of workers.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkerList {
    /// By id.
    pub workers: Vec<Worker>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// Lists workers by id (platform admins).
#[utoipa::path(get, path = "/v1/workers", operation_id = "list_workers", tag = "deployments", params(PageParams),
    responses((status = 200, description = "A page of workers.", body = WorkerList)))]
pub async fn handle_worker_list(
    State(app): State<AppState>,
    caller: Caller,
    ApiQuery(page): ApiQuery<PageParams>,
) -> Result<Json<WorkerList>> {
    caller.principal.require(Role::PlatformAdmin, "list workers")?;
    let limit = page.limit()?;
    let mut conn = app.registry.conn().await?;
    let rows = conn.workers().await?;
    let counts: HashMap<String, i64> = conn.replica_counts().await?.into_iter().collect();
    let holders: HashMap<(String, String), Uuid> =
        conn.slice_tenants().await?.into_iter().map(|(w, s, t)| ((w, s), t)).collect();
    drop(conn);
    let (rows, next_cursor) =
        cursor::page(rows, "workers", |w: &WorkerRow| w.id.clone(), page.cursor.as_deref(), limit)?;
    let workers = rows.into_iter().map(|w| worker_view(w, &counts, &holders)).collect::<Result<_>>()?;
    Ok(Json(WorkerList { workers, next_cursor }))
}

/// The API's view of a worker, with its replica count and who holds each slice.
fn worker_view(
    w: WorkerRow,
    counts: &HashMap<String, i64>,
    holders: &HashMap<(String, String), Uuid>,
) -> Result<Worker> {
    // Both sets are written by this control plane (a worker's slice kinds were parsed at
    // registration), so a stranger is ours to fix.
    let state = WorkerState::parse(&w.state)
        .ok_or_else(|| Error::Internal(format!("worker {} has unknown state {}", w.id, w.state)))?;
    let mut slices = Vec::with_capacity(w.slices.0.len());
    for s in w.slices.0 {
        let kind = SliceKind::parse(&s.kind)
            .ok_or_else(|| Error::Internal(format!("slice {} of worker {} has unknown kind {}", s.id, w.id, s.kind)))?;
        let unhealthy_reason = w.unhealthy_slices.0.get(&s.id).cloned();
        slices.push(WorkerSlice {
            tenant_id: holders.get(&(w.id.clone(), s.id.clone())).copied(),
            health: if unhealthy_reason.is_some() { SliceHealth::Unhealthy } else { SliceHealth::Healthy },
            unhealthy_reason,
            id: s.id,
            profile: s.profile,
            kind,
            memory_bytes: s.memory_bytes,
        });
    }
    Ok(Worker {
        replicas: counts.get(&w.id).copied().unwrap_or(0),
        id: w.id,
        http_endpoint: w.http_endpoint,
        grpc_endpoint: w.grpc_endpoint,
        metrics_endpoint: w.metrics_endpoint,
        state,
        last_heartbeat_at: w.last_heartbeat_at,
        slices,
    })
}
