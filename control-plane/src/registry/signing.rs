//! Ed25519 keys that sign access tokens.
//!
//! They live in the registry so every control-plane replica signs with the same key and
//! publishes the same JWKS. Rotation adds a key and retires the others; a retired key stays
//! published until every token it signed has expired, so rotation breaks no token in flight.

use serde_json::json;
use sqlx::FromRow;
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{Actor, NewAuditEvent};
use super::{Conn, Registry, exec, on_conn};
use crate::error::Result;

/// A signing key.
#[derive(Clone, FromRow)]
pub struct SigningKeyRow {
    /// Key id (the JWT `kid`).
    pub kid: String,
    /// PKCS#8 DER of the private key.
    pub private_der: Vec<u8>,
    /// The 32-byte public key.
    pub public_key: Vec<u8>,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Retired (no longer signs) at.
    pub retired_at: Option<OffsetDateTime>,
}

impl std::fmt::Debug for SigningKeyRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKeyRow").field("kid", &self.kid).field("retired_at", &self.retired_at).finish()
    }
}

impl Conn {
    /// Keys still worth publishing: unretired, or retired after `retired_since`.
    pub async fn signing_keys(&mut self, retired_since: OffsetDateTime) -> Result<Vec<SigningKeyRow>> {
        on_conn!(self, "signing_key.list", |c| sqlx::query_as::<_, SigningKeyRow>(
            "SELECT kid, private_der, public_key, created_at, retired_at FROM signing_keys \
             WHERE retired_at IS NULL OR retired_at > $1 ORDER BY created_at DESC"
        )
        .bind(retired_since)
        .fetch_all(c))
    }
}

impl Registry {
    /// Stores `key` as the signing key and retires the others, auditing in `audit_tenant`.
    pub async fn rotate_signing_key(
        &self,
        actor: &Actor,
        audit_tenant: Option<Uuid>,
        key: &SigningKeyRow,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        exec!(tx, "signing_key.retire", |c| sqlx::query(
            "UPDATE signing_keys SET retired_at = $1 WHERE retired_at IS NULL"
        )
        .bind(key.created_at)
        .execute(c))?;
        exec!(tx, "signing_key.insert", |c| sqlx::query(
            "INSERT INTO signing_keys (kid, private_der, public_key, created_at) VALUES ($1, $2, $3, $4)"
        )
        .bind(&key.kid)
        .bind(&key.private_der)
        .bind(&key.public_key)
        .bind(key.created_at)
        .execute(c))?;
        if let Some(tenant_id) = audit_tenant {
            let event = NewAuditEvent {
                tenant_id,
                action: "signing_key.rotate",
                resource_type: "signing_key",
                resource_id: key.kid.clone(),
                before: None,
                after: Some(json!({ "kid": key.kid })),
            };
            tx.append_audit(actor, event).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Stores `key` only if no unretired key exists; returns whether it was stored.
    pub async fn insert_first_signing_key(&self, key: &SigningKeyRow) -> Result<bool> {
        let mut tx = self.begin().await?;
        let current: i64 = on_conn!(tx, "signing_key.count", |c| sqlx::query_scalar(
            "SELECT COUNT(*) FROM signing_keys WHERE retired_at IS NULL"
        )
        .fetch_one(c))?;
        if current > 0 {
            return Ok(false);
        }
        exec!(tx, "signing_key.insert", |c| sqlx::query(
            "INSERT INTO signing_keys (kid, private_der, public_key, created_at) VALUES ($1, $2, $3, $4)"
        )
        .bind(&key.kid)
        .bind(&key.private_der)
        .bind(&key.public_key)
        .bind(key.created_at)
        .execute(c))?;
        tx.commit().await?;
        Ok(true)
    }
}
