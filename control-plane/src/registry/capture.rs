//! Request/response capture in the registry: each tenant's retention setting and the check
//! that a worker's capture batch names a deployment of the tenant it claims. (A deployment's
//! capture settings live on its row, [`super::DeploymentRow::capture`].)

use serde_json::json;
use uuid::Uuid;

use super::audit::{Actor, NewAuditEvent};
use super::{Conn, Registry, exec, on_conn};
use crate::error::{Error, Result};

impl Conn {
    /// A tenant's capture retention in days; `None`: the control plane's default.
    pub async fn capture_retention(&mut self, tenant_id: Uuid) -> Result<Option<i64>> {
        let days: Option<Option<i64>> = on_conn!(self, "capture.retention", |c| sqlx::query_scalar(
            "SELECT capture_retention_days FROM tenants WHERE id = $1"
        )
        .bind(tenant_id)
        .fetch_optional(c))?;
        days.ok_or(Error::NotFound("tenant"))
    }

    /// Every tenant's id and capture retention (`None`: the default), for the retention sweep
    /// (which crosses tenants by nature; each tenant's files are then swept under its prefix).
    pub async fn capture_retentions(&mut self) -> Result<Vec<(Uuid, Option<i64>)>> {
        on_conn!(self, "capture.retentions", |c| sqlx::query_as::<_, (Uuid, Option<i64>)>(
            "SELECT id, capture_retention_days FROM tenants ORDER BY id"
        )
        .fetch_all(c))
    }

    /// Whether `deployment_id` is a deployment of `tenant_id` (what a capture batch claims).
    pub async fn is_deployment_of(&mut self, tenant_id: Uuid, deployment_id: Uuid) -> Result<bool> {
        let n: i64 = on_conn!(self, "capture.deployment_of", |c| sqlx::query_scalar(
            "SELECT COUNT(*) FROM deployments WHERE tenant_id = $1 AND id = $2"
        )
        .bind(tenant_id)
        .bind(deployment_id)
        .fetch_one(c))?;
        Ok(n > 0)
    }
}

impl Registry {
    /// Sets a tenant's capture retention (`None` returns to the default), audited.
    pub async fn set_capture_retention(&self, actor: &Actor, tenant_id: Uuid, days: Option<i64>) -> Result<()> {
        let mut tx = self.begin().await?;
        tx.lock_tenant(tenant_id).await?;
        let before = tx.capture_retention(tenant_id).await?;
        exec!(tx, "capture.set_retention", |c| sqlx::query(
            "UPDATE tenants SET capture_retention_days = $2 WHERE id = $1"
        )
        .bind(tenant_id)
        .bind(days)
        .execute(c))?;
        let event = NewAuditEvent {
            tenant_id,
            action: "capture_retention.update",
            resource_type: "capture_retention",
            resource_id: tenant_id.to_string(),
            before: Some(json!({ "days": before })),
            after: Some(json!({ "days": days })),
        };
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(())
    }
}
