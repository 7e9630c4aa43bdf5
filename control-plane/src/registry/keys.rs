//! API keys: stored as a keyed hash, found by their public prefix.

use serde_json::json;
use sqlx::FromRow;
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{Actor, NewAuditEvent};
use super::{Conn, Registry, exec, now, on_conn, on_unique};
use crate::error::{Error, Result};
use crate::types::Role;

/// A stored API key (never the secret).
#[derive(Debug, Clone, FromRow)]
pub struct ApiKeyRow {
    /// Id.
    pub id: Uuid,
    /// Owning tenant.
    pub tenant_id: Uuid,
    /// Public, unique prefix: the part of the key before the secret.
    pub prefix: String,
    /// Keyed hash of the whole key (see [`crate::auth::keys`]).
    pub secret_hash: String,
    /// Label.
    pub name: String,
    /// Role name.
    pub role: String,
    /// The user the key belongs to (none for service keys and the bootstrap key).
    pub user_id: Option<Uuid>,
    /// Key that created this one.
    pub created_by: Option<Uuid>,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Stops working at.
    pub expires_at: Option<OffsetDateTime>,
    /// Revoked at.
    pub revoked_at: Option<OffsetDateTime>,
    /// Last successful use (updated at most once a minute).
    pub last_used_at: Option<OffsetDateTime>,
    /// The key's own requests per second at the gateways; 0 = only the tenant's limit.
    pub max_requests_per_second: i64,
    /// The key's own requests in flight at the gateways; 0 = only the tenant's limit.
    pub max_concurrent_requests: i64,
}

impl ApiKeyRow {
    /// The key's role; a stored role that no longer parses counts as the weakest.
    pub fn role(&self) -> Role {
        self.role.parse().unwrap_or(Role::Inference)
    }

    /// Whether the key works at `at`.
    pub fn is_active(&self, at: OffsetDateTime) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|e| e > at)
    }

    fn summary(&self) -> serde_json::Value {
        json!({
            "id": self.id, "prefix": self.prefix, "name": self.name, "role": self.role, "user_id": self.user_id,
            "expires_at": self.expires_at.map(|t| t.unix_timestamp()),
            "revoked": self.revoked_at.is_some(),
            "max_requests_per_second": self.max_requests_per_second,
            "max_concurrent_requests": self.max_concurrent_requests,
        })
    }
}

/// A key to store.
#[derive(Debug, Clone)]
pub struct NewApiKey {
    /// Public prefix.
    pub prefix: String,
    /// Keyed hash of the key.
    pub secret_hash: String,
    /// Label.
    pub name: String,
    /// Role.
    pub role: Role,
    /// Owner, if a user of the tenant: must be enabled, and holding at least `role`.
    pub user_id: Option<Uuid>,
    /// Expiry.
    pub expires_at: Option<OffsetDateTime>,
    /// The key's own limits at the gateways: requests per second and in flight (0 = none).
    pub limits: (i64, i64),
}

macro_rules! select_keys {
    ($rest:literal) => {
        concat!(
            "SELECT id, tenant_id, prefix, secret_hash, name, role, user_id, created_by, created_at, expires_at, revoked_at, ",
            "last_used_at, max_requests_per_second, max_concurrent_requests FROM api_keys ",
            $rest
        )
    };
}

impl Conn {
    /// The key with this prefix, in any tenant: the one lookup not scoped by tenant, because
    /// it is how a request's tenant is found.
    pub async fn key_by_prefix(&mut self, prefix: &str) -> Result<Option<ApiKeyRow>> {
        on_conn!(self, "key.by_prefix", |c| sqlx::query_as::<_, ApiKeyRow>(select_keys!("WHERE prefix = $1"))
            .bind(prefix)
            .fetch_optional(c))
    }

    /// A tenant's keys, oldest first.
    pub async fn keys(&mut self, tenant_id: Uuid) -> Result<Vec<ApiKeyRow>> {
        on_conn!(self, "key.list", |c| sqlx::query_as::<_, ApiKeyRow>(select_keys!(
            "WHERE tenant_id = $1 ORDER BY created_at, id"
        ))
        .bind(tenant_id)
        .fetch_all(c))
    }

    /// One of a tenant's keys.
    pub async fn key(&mut self, tenant_id: Uuid, id: Uuid) -> Result<Option<ApiKeyRow>> {
        on_conn!(self, "key.get", |c| sqlx::query_as::<_, ApiKeyRow>(select_keys!("WHERE tenant_id = $1 AND id = $2"))
            .bind(tenant_id)
            .bind(id)
            .fetch_optional(c))
    }

    /// Whether any active platform-admin key exists.
    pub async fn has_platform_admin_key(&mut self, at: OffsetDateTime) -> Result<bool> {
        let n: i64 = on_conn!(self, "key.count_platform_admin", |c| sqlx::query_scalar(
            "SELECT COUNT(*) FROM api_keys WHERE role = 'platform-admin' AND revoked_at IS NULL \
             AND (expires_at IS NULL OR expires_at > $1)"
        )
        .bind(at)
        .fetch_one(c))?;
        Ok(n > 0)
    }

    /// Keys revoked at or after `since`, with when: the keys of the revocation list.
    pub async fn keys_revoked_since(&mut self, since: OffsetDateTime) -> Result<Vec<(Uuid, OffsetDateTime)>> {
        on_conn!(self, "key.revoked_since", |c| sqlx::query_as::<_, (Uuid, OffsetDateTime)>(
            "SELECT id, revoked_at FROM api_keys WHERE revoked_at IS NOT NULL AND revoked_at >= $1"
        )
        .bind(since)
        .fetch_all(c))
    }

    /// Records a use of the key.
    pub async fn touch_key(&mut self, id: Uuid, at: OffsetDateTime) -> Result<()> {
        exec!(self, "key.touch", |c| sqlx::query("UPDATE api_keys SET last_used_at = $2 WHERE id = $1")
            .bind(id)
            .bind(at)
            .execute(c))?;
        Ok(())
    }

    /// Checks that a user of the tenant may own a key with `role`, locking the user so that
    /// disabling them waits for this key (and then revokes it too).
    async fn check_key_owner(&mut self, tenant_id: Uuid, user_id: Uuid, role: Role) -> Result<()> {
        let user = self.lock_user(tenant_id, user_id).await?;
        let user = user.ok_or_else(|| Error::invalid("user_id", "no such user in this tenant"))?;
        if user.disabled_at.is_some() {
            return Err(Error::conflict(
                crate::error::ErrorCode::UserDisabled,
                "the user is disabled and may not get new keys",
            ));
        }
        if !user.role().allows(role) {
            let message = format!("a key of user {} may not exceed the user's role '{}'", user.email, user.role);
            return Err(Error::invalid("role", message));
        }
        Ok(())
    }

    async fn insert_key(&mut self, k: &ApiKeyRow) -> Result<()> {
        exec!(self, "key.insert", |c| sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, prefix, secret_hash, name, role, user_id, created_by, created_at, \
             expires_at, max_requests_per_second, max_concurrent_requests) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        )
        .bind(k.id)
        .bind(k.tenant_id)
        .bind(&k.prefix)
        .bind(&k.secret_hash)
        .bind(&k.name)
        .bind(&k.role)
        .bind(k.user_id)
        .bind(k.created_by)
        .bind(k.created_at)
        .bind(k.expires_at)
        .bind(k.max_requests_per_second)
        .bind(k.max_concurrent_requests)
        .execute(c))
        .map_err(|e| {
            on_unique(e, crate::error::ErrorCode::AlreadyExists, || "an API key with this prefix already exists".into())
        })?;
        Ok(())
    }

    /// Audits `action` on a key: `before` (none for a new key) to `after`.
    async fn audit_key(
        &mut self,
        actor: &Actor,
        action: &'static str,
        before: Option<&ApiKeyRow>,
        after: &ApiKeyRow,
    ) -> Result<()> {
        let event = NewAuditEvent {
            tenant_id: after.tenant_id,
            action,
            resource_type: "api_key",
            resource_id: after.id.to_string(),
            before: before.map(ApiKeyRow::summary),
            after: Some(after.summary()),
        };
        self.append_audit(actor, event).await?;
        Ok(())
    }
}

impl Registry {
    /// Stores a new key for a tenant.
    pub async fn create_key(&self, actor: &Actor, tenant_id: Uuid, new: NewApiKey) -> Result<ApiKeyRow> {
        let key = ApiKeyRow {
            id: Uuid::now_v7(),
            tenant_id,
            prefix: new.prefix,
            secret_hash: new.secret_hash,
            name: new.name,
            role: new.role.as_str().to_string(),
            user_id: new.user_id,
            created_by: actor.key_id,
            created_at: now(),
            expires_at: new.expires_at,
            revoked_at: None,
            last_used_at: None,
            max_requests_per_second: new.limits.0,
            max_concurrent_requests: new.limits.1,
        };
        let mut tx = self.begin().await?;
        if let Some(user_id) = new.user_id {
            tx.check_key_owner(tenant_id, user_id, new.role).await?;
        }
        tx.insert_key(&key).await?;
        tx.audit_key(actor, "api_key.create", None, &key).await?;
        tx.commit().await?;
        Ok(key)
    }

    /// Revokes one of a tenant's keys (idempotent: revoking twice keeps the first time).
    pub async fn revoke_key(&self, actor: &Actor, tenant_id: Uuid, id: Uuid) -> Result<ApiKeyRow> {
        let mut tx = self.begin().await?;
        let before = tx.key(tenant_id, id).await?.ok_or(Error::NotFound("api key"))?;
        if before.revoked_at.is_some() {
            return Ok(before);
        }
        let at = now();
        exec!(tx, "key.revoke", |c| sqlx::query(
            "UPDATE api_keys SET revoked_at = $3 WHERE tenant_id = $1 AND id = $2"
        )
        .bind(tenant_id)
        .bind(id)
        .bind(at)
        .execute(c))?;
        let after = ApiKeyRow { revoked_at: Some(at), ..before.clone() };
        tx.audit_key(actor, "api_key.revoke", Some(&before), &after).await?;
        tx.commit().await?;
        Ok(after)
    }

    /// Changes one of a tenant's keys' own limits (requests per second, requests in flight).
    pub async fn set_key_limits(
        &self,
        actor: &Actor,
        tenant_id: Uuid,
        id: Uuid,
        limits: (i64, i64),
    ) -> Result<ApiKeyRow> {
        let mut tx = self.begin().await?;
        let before = tx.key(tenant_id, id).await?.ok_or(Error::NotFound("api key"))?;
        exec!(tx, "key.limits", |c| sqlx::query(
            "UPDATE api_keys SET max_requests_per_second = $3, max_concurrent_requests = $4 \
             WHERE tenant_id = $1 AND id = $2"
        )
        .bind(tenant_id)
        .bind(id)
        .bind(limits.0)
        .bind(limits.1)
        .execute(c))?;
        let after =
            ApiKeyRow { max_requests_per_second: limits.0, max_concurrent_requests: limits.1, ..before.clone() };
        tx.audit_key(actor, "api_key.update", Some(&before), &after).await?;
        tx.commit().await?;
        Ok(after)
    }
}
