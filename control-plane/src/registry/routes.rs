//! What gateways route by: every deployment's loaded replicas on live workers, its traffic
//! weights, and the tenants' rate limits; and the gateways themselves, counted so that each
//! enforces its share of a limit.
//!
//! These queries cross tenants on purpose: a gateway serves every tenant, and the table it
//! gets holds no secret (endpoints, names, limits).

use std::time::Duration;

use sqlx::FromRow;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Conn, exec, on_conn};
use crate::error::Result;
use crate::states::{ReplicaState, WorkerState};

/// A tenant that has at least one deployment, with its limits.
#[derive(Debug, Clone, FromRow)]
pub struct RouteTenantRow {
    /// Tenant.
    pub tenant_id: Uuid,
    /// Tenant name.
    pub tenant_name: String,
    /// Requests per second; 0 = unlimited.
    pub requests_per_second: i64,
    /// Requests in flight; 0 = unlimited.
    pub concurrent_requests: i64,
}

/// An API key with limits of its own.
#[derive(Debug, Clone, FromRow)]
pub struct RouteKeyRow {
    /// Tenant.
    pub tenant_id: Uuid,
    /// Key.
    pub key_id: Uuid,
    /// Requests per second; 0 = none of its own.
    pub requests_per_second: i64,
    /// Requests in flight; 0 = none of its own.
    pub concurrent_requests: i64,
}

/// A deployment as routes see it.
#[derive(Debug, Clone, FromRow)]
pub struct RouteDeploymentRow {
    /// Deployment.
    pub deployment_id: Uuid,
    /// Tenant.
    pub tenant_id: Uuid,
    /// The model name clients use.
    pub model_name: String,
    /// The stable version.
    pub version: i64,
}

/// A loaded replica on a live worker.
#[derive(Debug, Clone, FromRow)]
pub struct RouteReplicaRow {
    /// Replica.
    pub replica_id: Uuid,
    /// Deployment.
    pub deployment_id: Uuid,
    /// Version it holds.
    pub version: i64,
    /// Whether unversioned requests reach it.
    pub serving: bool,
    /// `ready` or `draining`.
    #[sqlx(try_from = "String")]
    pub state: ReplicaState,
    /// Worker.
    pub worker_id: String,
    /// The worker's HTTP base URL.
    pub http_endpoint: String,
    /// The worker's gRPC address.
    pub grpc_endpoint: String,
}

impl Conn {
    /// Tenants with deployments, and their limits.
    pub async fn route_tenants(&mut self) -> Result<Vec<RouteTenantRow>> {
        on_conn!(self, "routes.tenants", |c| sqlx::query_as::<_, RouteTenantRow>(
            "SELECT t.id AS tenant_id, t.name AS tenant_name, q.max_requests_per_second AS requests_per_second, \
             q.max_concurrent_requests AS concurrent_requests \
             FROM tenants t JOIN tenant_quotas q ON q.tenant_id = t.id \
             WHERE EXISTS (SELECT 1 FROM deployments d WHERE d.tenant_id = t.id) ORDER BY t.id"
        )
        .fetch_all(c))
    }

    /// Unrevoked API keys with limits of their own.
    pub async fn route_keys(&mut self) -> Result<Vec<RouteKeyRow>> {
        on_conn!(self, "routes.keys", |c| sqlx::query_as::<_, RouteKeyRow>(
            "SELECT tenant_id, id AS key_id, max_requests_per_second AS requests_per_second, \
             max_concurrent_requests AS concurrent_requests FROM api_keys \
             WHERE revoked_at IS NULL AND (max_requests_per_second > 0 OR max_concurrent_requests > 0) \
             ORDER BY tenant_id, id"
        )
        .fetch_all(c))
    }

    /// Every deployment.
    pub async fn route_deployments(&mut self) -> Result<Vec<RouteDeploymentRow>> {
        on_conn!(self, "routes.deployments", |c| sqlx::query_as::<_, RouteDeploymentRow>(
            "SELECT d.id AS deployment_id, d.tenant_id, m.name AS model_name, d.version \
             FROM deployments d JOIN models m ON m.id = d.model_id ORDER BY d.tenant_id, m.name"
        )
        .fetch_all(c))
    }

    /// Every replica loaded (ready or draining) on a worker that is not lost.
    pub async fn route_replicas(&mut self) -> Result<Vec<RouteReplicaRow>> {
        on_conn!(self, "routes.replicas", |c| sqlx::query_as::<_, RouteReplicaRow>(
            "SELECT r.id AS replica_id, r.deployment_id, r.version, r.serving, r.state, w.id AS worker_id, \
             w.http_endpoint, w.grpc_endpoint \
             FROM replicas r JOIN workers w ON w.id = r.worker_id \
             WHERE r.state IN ($1, $2) AND w.state = $3 ORDER BY r.deployment_id, r.id"
        )
        .bind(ReplicaState::Ready.as_str())
        .bind(ReplicaState::Draining.as_str())
        .bind(WorkerState::Ready.as_str())
        .fetch_all(c))
    }

    /// Notes that gateway `id` has its route stream open now.
    pub async fn gateway_seen(&mut self, id: &str, version: &str, at: OffsetDateTime) -> Result<()> {
        exec!(self, "gateway.seen", |c| sqlx::query(
            "INSERT INTO gateways (id, version, last_seen_at) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO UPDATE SET version = $2, last_seen_at = $3"
        )
        .bind(id)
        .bind(version)
        .bind(at)
        .execute(c))?;
        Ok(())
    }

    /// Forgets gateway `id` (its stream closed), so the others take its share at once.
    pub async fn gateway_gone(&mut self, id: &str) -> Result<()> {
        exec!(self, "gateway.gone", |c| sqlx::query("DELETE FROM gateways WHERE id = $1").bind(id).execute(c))?;
        Ok(())
    }

    /// Gateways seen within `within` of `now` (at least 1: the one asking).
    pub async fn live_gateways(&mut self, now: OffsetDateTime, within: Duration) -> Result<u32> {
        let since = now - within;
        let n: i64 = on_conn!(self, "gateway.count", |c| sqlx::query_scalar(
            "SELECT COUNT(*) FROM gateways WHERE last_seen_at >= $1"
        )
        .bind(since)
        .fetch_one(c))?;
        Ok(u32::try_from(n.max(1)).unwrap_or(u32::MAX))
    }
}
