//! Tenants: created by platform admins; every other row belongs to one.

use serde_json::json;
use sqlx::FromRow;
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{Actor, NewAuditEvent};
use super::quotas::QuotaLimits;
use super::{Conn, Registry, exec, now, on_conn, on_unique};
use crate::error::{Error, Result};
use crate::types::Name;

/// A tenant.
#[derive(Debug, Clone, FromRow)]
pub struct TenantRow {
    /// Id.
    pub id: Uuid,
    /// Unique name (used in paths).
    pub name: String,
    /// Free-text display name.
    pub display_name: String,
    /// The platform's own tenant, home of platform-admin keys.
    pub is_platform: bool,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Last changed.
    pub updated_at: OffsetDateTime,
}

impl TenantRow {
    /// What the audit trail records about a tenant.
    pub fn summary(&self) -> serde_json::Value {
        json!({ "id": self.id, "name": self.name, "display_name": self.display_name })
    }
}

impl Conn {
    /// A tenant by name.
    pub async fn tenant_by_name(&mut self, name: &str) -> Result<Option<TenantRow>> {
        on_conn!(self, "tenant.by_name", |c| sqlx::query_as::<_, TenantRow>(
            "SELECT id, name, display_name, is_platform, created_at, updated_at FROM tenants WHERE name = $1"
        )
        .bind(name)
        .fetch_optional(c))
    }

    /// A tenant by id.
    pub async fn tenant_by_id(&mut self, id: Uuid) -> Result<Option<TenantRow>> {
        on_conn!(self, "tenant.by_id", |c| sqlx::query_as::<_, TenantRow>(
            "SELECT id, name, display_name, is_platform, created_at, updated_at FROM tenants WHERE id = $1"
        )
        .bind(id)
        .fetch_optional(c))
    }

    /// The platform tenant, if bootstrapped.
    pub async fn platform_tenant(&mut self) -> Result<Option<TenantRow>> {
        on_conn!(self, "tenant.platform", |c| sqlx::query_as::<_, TenantRow>(
            "SELECT id, name, display_name, is_platform, created_at, updated_at FROM tenants WHERE is_platform"
        )
        .fetch_optional(c))
    }

    /// All tenants by name (platform admins only; a short list by nature).
    pub async fn tenants(&mut self) -> Result<Vec<TenantRow>> {
        on_conn!(self, "tenant.list", |c| sqlx::query_as::<_, TenantRow>(
            "SELECT id, name, display_name, is_platform, created_at, updated_at FROM tenants ORDER BY name"
        )
        .fetch_all(c))
    }

    async fn insert_tenant(&mut self, t: &TenantRow) -> Result<()> {
        exec!(self, "tenant.insert", |c| sqlx::query(
            "INSERT INTO tenants (id, name, display_name, is_platform, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6)"
        )
        .bind(t.id)
        .bind(&t.name)
        .bind(&t.display_name)
        .bind(t.is_platform)
        .bind(t.created_at)
        .bind(t.updated_at)
        .execute(c))
        .map_err(|e| {
            on_unique(e, crate::error::ErrorCode::AlreadyExists, || format!("tenant '{}' already exists", t.name))
        })?;
        Ok(())
    }

    /// Takes the tenant's row lock for the rest of the transaction, so concurrent creates in
    /// one tenant check quotas one after the other (on SQLite the write lock does this).
    pub async fn lock_tenant(&mut self, tenant_id: Uuid) -> Result<()> {
        let done =
            exec!(self, "tenant.lock", |c| sqlx::query("UPDATE tenants SET updated_at = updated_at WHERE id = $1")
                .bind(tenant_id)
                .execute(c))?;
        if done == 0 {
            return Err(Error::NotFound("tenant"));
        }
        Ok(())
    }
}

impl Registry {
    /// Creates a tenant with the given quotas.
    pub async fn create_tenant(
        &self,
        actor: &Actor,
        name: &Name,
        display_name: &str,
        is_platform: bool,
        quotas: &QuotaLimits,
    ) -> Result<TenantRow> {
        let at = now();
        let tenant = TenantRow {
            id: Uuid::now_v7(),
            name: name.to_string(),
            display_name: display_name.to_string(),
            is_platform,
            created_at: at,
            updated_at: at,
        };
        let mut tx = self.begin().await?;
        tx.insert_tenant(&tenant).await?;
        tx.insert_quota(tenant.id, quotas).await?;
        let event = NewAuditEvent {
            tenant_id: tenant.id,
            action: "tenant.create",
            resource_type: "tenant",
            resource_id: tenant.name.clone(),
            before: None,
            after: Some(json!({ "tenant": tenant.summary(), "quotas": quotas })),
        };
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(tenant)
    }
}
