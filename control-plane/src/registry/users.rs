//! Users: people in a tenant, each with a role that caps the keys they may hold. Disabling a
//! user revokes every key of theirs in the same transaction; users are never deleted, so the
//! audit trail keeps naming them.

use serde_json::json;
use sqlx::FromRow;
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{Actor, NewAuditEvent};
use super::{Conn, Registry, exec, now, on_conn, on_unique};
use crate::error::{Error, Result};
use crate::types::{Email, Role};

/// A stored user.
#[derive(Debug, Clone, FromRow)]
pub struct UserRow {
    /// Id.
    pub id: Uuid,
    /// Owning tenant.
    pub tenant_id: Uuid,
    /// Email address, lower-cased; unique within the tenant.
    pub email: String,
    /// Display name.
    pub name: String,
    /// Role name: the most any key of the user may do.
    pub role: String,
    /// Key that created the user.
    pub created_by: Option<Uuid>,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Disabled at (their keys were revoked then).
    pub disabled_at: Option<OffsetDateTime>,
}

impl UserRow {
    /// The user's role; a stored role that no longer parses counts as the weakest.
    pub fn role(&self) -> Role {
        self.role.parse().unwrap_or(Role::Inference)
    }

    fn summary(&self) -> serde_json::Value {
        json!({
            "id": self.id, "email": self.email, "name": self.name, "role": self.role,
            "disabled": self.disabled_at.is_some(),
        })
    }
}

/// A user to create.
#[derive(Debug, Clone)]
pub struct NewUser {
    /// Email address.
    pub email: Email,
    /// Display name.
    pub name: String,
    /// Role.
    pub role: Role,
}

macro_rules! select_users {
    ($rest:literal) => {
        concat!("SELECT id, tenant_id, email, name, role, created_by, created_at, disabled_at FROM users ", $rest)
    };
}

impl Conn {
    /// A tenant's users, oldest first.
    pub async fn users(&mut self, tenant_id: Uuid) -> Result<Vec<UserRow>> {
        on_conn!(self, "user.list", |c| sqlx::query_as::<_, UserRow>(select_users!(
            "WHERE tenant_id = $1 ORDER BY created_at, id"
        ))
        .bind(tenant_id)
        .fetch_all(c))
    }

    /// Users disabled at or after `since`, with when: the users of the revocation list.
    pub async fn users_disabled_since(&mut self, since: OffsetDateTime) -> Result<Vec<(Uuid, OffsetDateTime)>> {
        on_conn!(self, "user.disabled_since", |c| sqlx::query_as::<_, (Uuid, OffsetDateTime)>(
            "SELECT id, disabled_at FROM users WHERE disabled_at IS NOT NULL AND disabled_at >= $1"
        )
        .bind(since)
        .fetch_all(c))
    }

    /// One of a tenant's users.
    pub async fn user(&mut self, tenant_id: Uuid, id: Uuid) -> Result<Option<UserRow>> {
        on_conn!(self, "user.get", |c| sqlx::query_as::<_, UserRow>(select_users!("WHERE tenant_id = $1 AND id = $2"))
            .bind(tenant_id)
            .bind(id)
            .fetch_optional(c))
    }

    /// One of a tenant's users, its row locked for the rest of the transaction (a no-op update
    /// does it on both databases), so a key created for the user and the user's disabling
    /// happen one after the other.
    pub async fn lock_user(&mut self, tenant_id: Uuid, id: Uuid) -> Result<Option<UserRow>> {
        on_conn!(self, "user.lock", |c| sqlx::query_as::<_, UserRow>(
            "UPDATE users SET disabled_at = disabled_at WHERE tenant_id = $1 AND id = $2 \
             RETURNING id, tenant_id, email, name, role, created_by, created_at, disabled_at"
        )
        .bind(tenant_id)
        .bind(id)
        .fetch_optional(c))
    }

    pub(super) async fn insert_user(&mut self, u: &UserRow) -> Result<()> {
        exec!(self, "user.insert", |c| sqlx::query(
            "INSERT INTO users (id, tenant_id, email, name, role, created_by, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)"
        )
        .bind(u.id)
        .bind(u.tenant_id)
        .bind(&u.email)
        .bind(&u.name)
        .bind(&u.role)
        .bind(u.created_by)
        .bind(u.created_at)
        .execute(c))
        .map_err(|e| {
            on_unique(e, crate::error::ErrorCode::AlreadyExists, || {
                format!("a user with email '{}' already exists", u.email)
            })
        })?;
        Ok(())
    }
}

impl Registry {
    /// Creates a user in a tenant.
    pub async fn create_user(&self, actor: &Actor, tenant_id: Uuid, new: NewUser) -> Result<UserRow> {
        let user = UserRow {
            id: Uuid::now_v7(),
            tenant_id,
            email: new.email.to_string(),
            name: new.name,
            role: new.role.as_str().to_string(),
            created_by: actor.key_id,
            created_at: now(),
            disabled_at: None,
        };
        let mut tx = self.begin().await?;
        tx.insert_user(&user).await?;
        let event = NewAuditEvent {
            tenant_id,
            action: "user.create",
            resource_type: "user",
            resource_id: user.id.to_string(),
            before: None,
            after: Some(user.summary()),
        };
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(user)
    }

    /// Disables a user and revokes their active keys, in one transaction (idempotent:
    /// disabling twice keeps the first time). Returns the user and how many keys were revoked.
    pub async fn disable_user(&self, actor: &Actor, tenant_id: Uuid, id: Uuid) -> Result<(UserRow, u64)> {
        let mut tx = self.begin().await?;
        let before = tx.lock_user(tenant_id, id).await?.ok_or(Error::NotFound("user"))?;
        if before.disabled_at.is_some() {
            return Ok((before, 0));
        }
        let at = now();
        exec!(tx, "user.disable", |c| sqlx::query(
            "UPDATE users SET disabled_at = $3 WHERE tenant_id = $1 AND id = $2"
        )
        .bind(tenant_id)
        .bind(id)
        .bind(at)
        .execute(c))?;
        let revoked = exec!(tx, "key.revoke_for_user", |c| sqlx::query(
            "UPDATE api_keys SET revoked_at = $3 WHERE tenant_id = $1 AND user_id = $2 AND revoked_at IS NULL"
        )
        .bind(tenant_id)
        .bind(id)
        .bind(at)
        .execute(c))?;
        let after = UserRow { disabled_at: Some(at), ..before.clone() };
        let mut summary = after.summary();
        summary["keys_revoked"] = json!(revoked);
        let event = NewAuditEvent {
            tenant_id,
            action: "user.disable",
            resource_type: "user",
            resource_id: id.to_string(),
            before: Some(before.summary()),
            after: Some(summary),
        };
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok((after, revoked))
    }
}
