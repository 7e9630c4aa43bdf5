//! Idempotency-Key records: the first response to a (tenant, key) pair, replayed to retries.

use time::{Duration, OffsetDateTime};
use uuid::Uuid;

use super::{Registry, exec, on_conn};
use crate::error::Result;

/// How long a key is remembered.
pub const RETENTION: Duration = Duration::hours(24);

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
        tenant_id: Uuid,
        key: &str,
        fingerprint: &str,
        at: OffsetDateTime,
    ) -> Result<IdempotencyClaim> {
        let mut tx = self.begin().await?;
        exec!(tx, "idempotency.expire", |c| sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
            .bind(at - RETENTION)
            .execute(c))?;
        let inserted = exec!(tx, "idempotency.claim", |c| sqlx::query(
            "INSERT INTO idempotency_keys (tenant_id, key, fingerprint, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant_id, key) DO NOTHING"
        )
        .bind(tenant_id)
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
                "SELECT fingerprint, status_code, response_body FROM idempotency_keys WHERE tenant_id = $1 AND key = $2"
            )
            .bind(tenant_id)
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
    pub async fn finish_idempotent(&self, tenant_id: Uuid, key: &str, status: u16, body: &[u8]) -> Result<()> {
        let mut conn = self.conn().await?;
        exec!(conn, "idempotency.finish", |c| sqlx::query(
            "UPDATE idempotency_keys SET status_code = $3, response_body = $4 WHERE tenant_id = $1 AND key = $2"
        )
        .bind(tenant_id)
        .bind(key)
        .bind(i32::from(status))
        .bind(body)
        .execute(c))?;
        Ok(())
    }

    /// Forgets a claimed key whose request failed in a way a retry may fix (a 5xx).
    pub async fn release_idempotent(&self, tenant_id: Uuid, key: &str) -> Result<()> {
        let mut conn = self.conn().await?;
        exec!(conn, "idempotency.release", |c| sqlx::query(
            "DELETE FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 AND status_code IS NULL"
        )
        .bind(tenant_id)
        .bind(key)
        .execute(c))?;
        Ok(())
    }
}
