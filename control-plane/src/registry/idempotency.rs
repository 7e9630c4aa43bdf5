//! Idempotency-Key records: the first response to a (tenant, caller, key) triple, replayed to
//! retries by the same caller only.

use time::{Duration, OffsetDateTime};
use uuid::Uuid;

use super::{Registry, exec, on_conn};
use crate::error::Result;

/// How long a key is remembered.
pub const RETENTION: Duration = Duration::hours(24);

/// Whose keys these are: a record is only ever replayed to the caller that stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyScope {
    /// The caller's tenant.
    pub tenant_id: Uuid,
    /// The caller: its credential and role (see `Principal::idempotency_caller`).
    pub caller: String,
}

/// What a request carrying an Idempotency-Key should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyClaim {
    /// First use: run the request, then [`Registry::finish_idempotent`].
    New,
    /// Already answered: replay this status and body.
    Replay {
        /// Status of the first response.
        status: u16,
        /// Body of the first response.
        body: Vec<u8>,
    },
    /// The first request with this key is still running.
    InProgress,
    /// The key was used for a different request.
    Mismatch,
}

impl Registry {
    /// Claims `key` for a request with `fingerprint` (method, path and body digest).
    pub async fn claim_idempotent(
        &self,
        scope: &IdempotencyScope,
        key: &str,
        fingerprint: &str,
        at: OffsetDateTime,
    ) -> Result<IdempotencyClaim> {
        let mut tx = self.begin().await?;
        exec!(tx, "idempotency.expire", |c| sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
            .bind(at - RETENTION)
            .execute(c))?;
        let inserted = exec!(tx, "idempotency.claim", |c| sqlx::query(
            "INSERT INTO idempotency_keys (tenant_id, caller, key, fingerprint, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, caller, key) DO NOTHING"
        )
        .bind(scope.tenant_id)
        .bind(&scope.caller)
        .bind(key)
        .bind(fingerprint)
        .bind(at)
        .execute(c))?;
        if inserted == 1 {
            tx.commit().await?;
            return Ok(IdempotencyClaim::New);
        }
        let (stored, status, body): (String, Option<i32>, Option<Vec<u8>>) =
            on_conn!(tx, "idempotency.get", |c| sqlx::query_as(
                "SELECT fingerprint, status_code, response_body FROM idempotency_keys \
                 WHERE tenant_id = $1 AND caller = $2 AND key = $3"
            )
            .bind(scope.tenant_id)
            .bind(&scope.caller)
            .bind(key)
            .fetch_one(c))?;
        tx.commit().await?;
        Ok(match (stored == fingerprint, status) {
            (false, _) => IdempotencyClaim::Mismatch,
            (true, None) => IdempotencyClaim::InProgress,
            (true, Some(s)) => {
                IdempotencyClaim::Replay { status: u16::try_from(s).unwrap_or(500), body: body.unwrap_or_default() }
            }
        })
    }

    /// Stores the response of a claimed key.
    pub async fn finish_idempotent(&self, scope: &IdempotencyScope, key: &str, status: u16, body: &[u8]) -> Result<()> {
        let mut conn = self.conn().await?;
        exec!(conn, "idempotency.finish", |c| sqlx::query(
            "UPDATE idempotency_keys SET status_code = $4, response_body = $5 \
             WHERE tenant_id = $1 AND caller = $2 AND key = $3"
        )
        .bind(scope.tenant_id)
        .bind(&scope.caller)
        .bind(key)
        .bind(i32::from(status))
        .bind(body)
        .execute(c))?;
        Ok(())
    }

    /// Forgets a claimed key whose request never ran or failed in a way a retry may fix.
    pub async fn release_idempotent(&self, scope: &IdempotencyScope, key: &str) -> Result<()> {
        let mut conn = self.conn().await?;
        exec!(conn, "idempotency.release", |c| sqlx::query(
            "DELETE FROM idempotency_keys WHERE tenant_id = $1 AND caller = $2 AND key = $3 AND status_code IS NULL"
        )
        .bind(scope.tenant_id)
        .bind(&scope.caller)
        .bind(key)
        .execute(c))?;
        Ok(())
    }
}
