//! Audit events: appended in the same transaction as the change they describe, hash-chained
//! per tenant, listed with filters and a cursor, and verified link by link.
//!
//! Chain rule: event `n` of a tenant stores `prev_hash` = event `n-1`'s `hash` (64 zeros for
//! the first) and `hash` = sha256 of a canonical JSON of all its fields including `prev_hash`.
//! `audit_heads` holds each chain's last `(seq, hash)`; bumping it first serialises appends
//! and lets verification notice events deleted from the end.

use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::FromRow;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Conn, Registry, exec, now, on_conn};
use crate::error::Result;

/// `prev_hash` of a chain's first event.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Who made a change and from where: taken from the request.
#[derive(Debug, Clone, Default)]
pub struct Actor {
    /// The API key behind the credential (for a token: the key it was exchanged for).
    pub key_id: Option<Uuid>,
    /// The user that key belongs to, if any.
    pub user_id: Option<Uuid>,
    /// The request id (`x-request-id`).
    pub request_id: String,
    /// The client's address.
    pub client_addr: Option<String>,
}

/// A change to record.
#[derive(Debug, Clone)]
pub struct NewAuditEvent {
    /// Tenant whose chain gets the event.
    pub tenant_id: Uuid,
    /// What happened, `resource.verb` (e.g. `model.create`).
    pub action: &'static str,
    /// Kind of resource changed.
    pub resource_type: &'static str,
    /// Which one (a name or id, unique within the type and tenant).
    pub resource_id: String,
    /// Summary of the state before (absent for creations).
    pub before: Option<serde_json::Value>,
    /// Summary of the state after (absent for deletions).
    pub after: Option<serde_json::Value>,
}

/// A stored audit event.
#[derive(Debug, Clone, FromRow)]
pub struct AuditEventRow {
    /// Event id.
    pub id: Uuid,
    /// Tenant chain.
    pub tenant_id: Uuid,
    /// Position in the tenant's chain, from 1.
    pub seq: i64,
    /// Acting key.
    pub actor_key_id: Option<Uuid>,
    /// The acting key's user.
    pub actor_user_id: Option<Uuid>,
    /// Action.
    pub action: String,
    /// Resource type.
    pub resource_type: String,
    /// Resource id.
    pub resource_id: String,
    /// JSON text of the state before.
    pub before_state: Option<String>,
    /// JSON text of the state after.
    pub after_state: Option<String>,
    /// Request id.
    pub request_id: String,
    /// Client address.
    pub client_addr: Option<String>,
    /// When.
    pub created_at: OffsetDateTime,
    /// Previous event's hash.
    pub prev_hash: String,
    /// This event's hash.
    pub hash: String,
}

/// Field order here is the canonical order; changing it breaks every stored chain. Fields
/// added later are left out when absent, so events from before them hash as they did.
#[derive(Serialize)]
struct CanonicalEvent<'a> {
    v: u8,
    id: String,
    tenant_id: String,
    seq: i64,
    actor_key_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    actor_user_id: Option<String>,
    action: &'a str,
    resource_type: &'a str,
    resource_id: &'a str,
    before: Option<&'a str>,
    after: Option<&'a str>,
    request_id: &'a str,
    client_addr: Option<&'a str>,
    created_at_us: i128,
    prev_hash: &'a str,
}

impl AuditEventRow {
    /// The hash this event should carry, computed from its other fields.
    pub fn compute_hash(&self) -> String {
        let canonical = CanonicalEvent {
            v: 1,
            id: self.id.to_string(),
            tenant_id: self.tenant_id.to_string(),
            seq: self.seq,
            actor_key_id: self.actor_key_id.map(|k| k.to_string()),
            actor_user_id: self.actor_user_id.map(|u| u.to_string()),
            action: &self.action,
            resource_type: &self.resource_type,
            resource_id: &self.resource_id,
            before: self.before_state.as_deref(),
            after: self.after_state.as_deref(),
            request_id: &self.request_id,
            client_addr: self.client_addr.as_deref(),
            created_at_us: self.created_at.unix_timestamp_nanos() / 1_000,
            prev_hash: &self.prev_hash,
        };
        // Serialising a struct of strings and integers cannot fail.
        let bytes = serde_json::to_vec(&canonical).expect("canonical audit event serialises");
        hex::encode(Sha256::digest(bytes))
    }
}

/// Filters for listing events; all optional.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// Only this action.
    pub action: Option<String>,
    /// Only this resource type.
    pub resource_type: Option<String>,
    /// Only this resource id.
    pub resource_id: Option<String>,
    /// Only this acting key.
    pub actor_key_id: Option<Uuid>,
    /// Only this acting user.
    pub actor_user_id: Option<Uuid>,
    /// Only events older than this sequence number (the cursor).
    pub before_seq: Option<i64>,
}

/// Who an event's actor is, by name: the acting key's label and its user's email, when the
/// key or user still exists (a deleted one leaves only the id in the event).
#[derive(Debug, Clone, Default, PartialEq, Eq, FromRow)]
pub struct AuditActorRow {
    /// The event's position in its chain.
    pub seq: i64,
    /// The acting key's name.
    pub key_name: Option<String>,
    /// The email of the user the acting key belongs to.
    pub user_email: Option<String>,
}

/// The first broken link found by verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainBreak {
    /// Sequence number where the chain breaks.
    pub seq: i64,
    /// The event there, if it exists.
    pub event_id: Option<Uuid>,
    /// What is wrong.
    pub reason: &'static str,
}

/// Checks a chain event by event, in order; pure, so tests drive it without a database.
#[derive(Debug, Clone)]
pub struct ChainVerifier {
    next_seq: i64,
    prev_hash: String,
    checked: u64,
}

impl Default for ChainVerifier {
    fn default() -> Self {
        ChainVerifier { next_seq: 1, prev_hash: GENESIS_HASH.to_string(), checked: 0 }
    }
}

impl ChainVerifier {
    /// A verifier that continues after event `seq` with hash `hash` (a checkpoint).
    pub fn resume(seq: i64, hash: &str) -> Self {
        ChainVerifier { next_seq: seq + 1, prev_hash: hash.to_string(), checked: 0 }
    }

    /// Checks the next event.
    pub fn check(&mut self, event: &AuditEventRow) -> Result<(), ChainBreak> {
        let broken = |reason| ChainBreak { seq: self.next_seq, event_id: Some(event.id), reason };
        if event.seq != self.next_seq {
            return Err(ChainBreak { seq: self.next_seq, event_id: None, reason: "event missing from the chain" });
        }
        if event.prev_hash != self.prev_hash {
            return Err(broken("prev_hash does not match the previous event's hash"));
        }
        if event.compute_hash() != event.hash {
            return Err(broken("event content does not match its hash"));
        }
        self.prev_hash.clone_from(&event.hash);
        self.next_seq += 1;
        self.checked += 1;
        Ok(())
    }

    /// Checks the end of the chain against the recorded head.
    pub fn finish(&self, head: Option<(i64, String)>) -> Result<(), ChainBreak> {
        let (seq, hash) = head.unwrap_or((0, GENESIS_HASH.to_string()));
        if seq != self.next_seq - 1 || hash != self.prev_hash {
            return Err(ChainBreak {
                seq: self.next_seq,
                event_id: None,
                reason: "events missing at the end of the chain",
            });
        }
        Ok(())
    }

    /// Events checked so far.
    pub fn checked(&self) -> u64 {
        self.checked
    }
}

/// `SELECT <every event column> FROM audit_events <rest>`, as one static string.
macro_rules! select_events {
    ($rest:literal) => {
        concat!(
            "SELECT id, tenant_id, seq, actor_key_id, actor_user_id, action, resource_type, resource_id, before_state, ",
            "after_state, request_id, client_addr, created_at, prev_hash, hash FROM audit_events ",
            $rest
        )
    };
}

impl Conn {
    /// Appends an event to its tenant's chain. Call inside the transaction of the change.
    pub async fn append_audit(&mut self, actor: &Actor, event: NewAuditEvent) -> Result<AuditEventRow> {
        // The API lists these as closed enums: a new one must be added there (tests catch it).
        debug_assert!(
            crate::kinds::AuditAction::parse(event.action).is_some()
                && crate::kinds::AuditResourceType::parse(event.resource_type).is_some(),
            "audit action {} on {} is missing from crate::kinds",
            event.action,
            event.resource_type
        );
        // In the same transaction: the webhook outbox gets the event or neither does.
        self.enqueue_audit_webhook(&event).await?;
        let tenant = event.tenant_id;
        exec!(self, "audit.head_init", |c| sqlx::query(
            "INSERT INTO audit_heads (tenant_id, seq, hash) VALUES ($1, 0, $2) ON CONFLICT (tenant_id) DO NOTHING"
        )
        .bind(tenant)
        .bind(GENESIS_HASH)
        .execute(c))?;
        let (seq, prev_hash): (i64, String) = on_conn!(self, "audit.head_bump", |c| sqlx::query_as(
            "UPDATE audit_heads SET seq = seq + 1 WHERE tenant_id = $1 RETURNING seq, hash"
        )
        .bind(tenant)
        .fetch_one(c))?;
        let mut row = AuditEventRow {
            id: Uuid::now_v7(),
            tenant_id: tenant,
            seq,
            actor_key_id: actor.key_id,
            actor_user_id: actor.user_id,
            action: event.action.to_string(),
            resource_type: event.resource_type.to_string(),
            resource_id: event.resource_id,
            before_state: event.before.map(|v| v.to_string()),
            after_state: event.after.map(|v| v.to_string()),
            request_id: actor.request_id.clone(),
            client_addr: actor.client_addr.clone(),
            created_at: now(),
            prev_hash,
            hash: String::new(),
        };
        row.hash = row.compute_hash();
        self.insert_audit_row(&row).await?;
        exec!(self, "audit.head_set", |c| sqlx::query("UPDATE audit_heads SET hash = $2 WHERE tenant_id = $1")
            .bind(tenant)
            .bind(&row.hash)
            .execute(c))?;
        Ok(row)
    }

    async fn insert_audit_row(&mut self, r: &AuditEventRow) -> Result<()> {
        exec!(self, "audit.insert", |c| sqlx::query(
            "INSERT INTO audit_events (id, tenant_id, seq, actor_key_id, actor_user_id, action, resource_type, \
             resource_id, before_state, after_state, request_id, client_addr, created_at, prev_hash, hash) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
        )
        .bind(r.id)
        .bind(r.tenant_id)
        .bind(r.seq)
        .bind(r.actor_key_id)
        .bind(r.actor_user_id)
        .bind(&r.action)
        .bind(&r.resource_type)
        .bind(&r.resource_id)
        .bind(&r.before_state)
        .bind(&r.after_state)
        .bind(&r.request_id)
        .bind(&r.client_addr)
        .bind(r.created_at)
        .bind(&r.prev_hash)
        .bind(&r.hash)
        .execute(c))?;
        Ok(())
    }

    /// Newest-first page of a tenant's events matching `filter`.
    pub async fn audit_events(
        &mut self,
        tenant_id: Uuid,
        filter: &AuditFilter,
        limit: i64,
    ) -> Result<Vec<AuditEventRow>> {
        on_conn!(self, "audit.list", |c| sqlx::query_as::<_, AuditEventRow>(select_events!(
            "WHERE tenant_id = $1 AND ($2 IS NULL OR action = $2) AND ($3 IS NULL OR resource_type = $3) \
             AND ($4 IS NULL OR resource_id = $4) AND ($5 IS NULL OR actor_key_id = $5) \
             AND ($6 IS NULL OR actor_user_id = $6) AND ($7 IS NULL OR seq < $7) ORDER BY seq DESC LIMIT $8"
        ))
        .bind(tenant_id)
        .bind(&filter.action)
        .bind(&filter.resource_type)
        .bind(&filter.resource_id)
        .bind(filter.actor_key_id)
        .bind(filter.actor_user_id)
        .bind(filter.before_seq)
        .bind(limit)
        .fetch_all(c))
    }

    /// The actors' key names and user emails of a tenant's events `from_seq..=to_seq`. Kept
    /// out of the event rows: names change and are not part of the hashed record. The acting
    /// key may live in another tenant (a platform admin's), so keys and users are joined by id.
    pub async fn audit_actor_names(
        &mut self,
        tenant_id: Uuid,
        from_seq: i64,
        to_seq: i64,
    ) -> Result<Vec<AuditActorRow>> {
        on_conn!(self, "audit.actor_names", |c| sqlx::query_as::<_, AuditActorRow>(
            "SELECT e.seq AS seq, k.name AS key_name, u.email AS user_email FROM audit_events e \
             LEFT JOIN api_keys k ON k.id = e.actor_key_id LEFT JOIN users u ON u.id = e.actor_user_id \
             WHERE e.tenant_id = $1 AND e.seq >= $2 AND e.seq <= $3 \
             AND (e.actor_key_id IS NOT NULL OR e.actor_user_id IS NOT NULL)"
        )
        .bind(tenant_id)
        .bind(from_seq)
        .bind(to_seq)
        .fetch_all(c))
    }

    /// Oldest-first page of a tenant's chain after `after_seq`, up to `until_seq`.
    pub async fn audit_chain_page(
        &mut self,
        tenant_id: Uuid,
        after_seq: i64,
        until_seq: i64,
        limit: i64,
    ) -> Result<Vec<AuditEventRow>> {
        on_conn!(self, "audit.chain_page", |c| sqlx::query_as::<_, AuditEventRow>(select_events!(
            "WHERE tenant_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4"
        ))
        .bind(tenant_id)
        .bind(after_seq)
        .bind(until_seq)
        .bind(limit)
        .fetch_all(c))
    }

    /// The id and hash of a tenant's event `seq`, if there is one.
    pub async fn audit_event_hash(&mut self, tenant_id: Uuid, seq: i64) -> Result<Option<(Uuid, String)>> {
        on_conn!(self, "audit.event_hash", |c| sqlx::query_as::<_, (Uuid, String)>(
            "SELECT id, hash FROM audit_events WHERE tenant_id = $1 AND seq = $2"
        )
        .bind(tenant_id)
        .bind(seq)
        .fetch_optional(c))
    }

    /// The recorded head of a tenant's chain.
    pub async fn audit_head(&mut self, tenant_id: Uuid) -> Result<Option<(i64, String)>> {
        on_conn!(self, "audit.head", |c| sqlx::query_as::<_, (i64, String)>(
            "SELECT seq, hash FROM audit_heads WHERE tenant_id = $1"
        )
        .bind(tenant_id)
        .fetch_optional(c))
    }
}

/// Outcome of verifying one tenant's chain.
#[derive(Debug, Clone)]
pub struct ChainReport {
    /// Events that checked out before the first break (all of them when intact).
    pub events_checked: u64,
    /// The first broken link, if any.
    pub first_break: Option<ChainBreak>,
}

/// Events read per query while walking a chain.
const CHAIN_PAGE: i64 = 500;

impl Registry {
    /// Walks a tenant's whole chain in pages and reports the first broken link.
    pub async fn verify_audit_chain(&self, tenant_id: Uuid) -> Result<ChainReport> {
        let mut conn = self.conn().await?;
        let head = conn.audit_head(tenant_id).await?;
        let mut verifier = ChainVerifier::default();
        let first_break = match walk(&mut conn, tenant_id, &mut verifier, i64::MAX).await? {
            Err(b) => Some(b),
            Ok(()) => verifier.finish(head).err(),
        };
        Ok(ChainReport { events_checked: verifier.checked(), first_break })
    }

    /// Every chain's recorded head, `(tenant, seq, hash)`: what the checkpointer signs. The one
    /// audit query across tenants, for that background task only.
    pub async fn audit_heads(&self) -> Result<Vec<(Uuid, i64, String)>> {
        let mut conn = self.conn().await?;
        on_conn!(conn, "audit.heads", |c| sqlx::query_as::<_, (Uuid, i64, String)>(
            "SELECT tenant_id, seq, hash FROM audit_heads ORDER BY tenant_id"
        )
        .fetch_all(c))
    }

    /// Whether a tenant's chain, up to `head`, extends `from` (a checkpoint's `(seq, hash)`;
    /// `None`: the chain's start): the event at `from` still has its hash, and every event after
    /// it links up to `head`. Reads only the events after `from`.
    pub async fn audit_chain_extends(
        &self,
        tenant_id: Uuid,
        from: Option<(i64, String)>,
        head: &(i64, String),
    ) -> Result<Result<(), ChainBreak>> {
        let (from_seq, from_hash) = from.unwrap_or_else(|| (0, GENESIS_HASH.to_string()));
        let mut conn = self.conn().await?;
        if head.0 < from_seq {
            return Ok(Err(ChainBreak {
                seq: head.0 + 1,
                event_id: None,
                reason: "the chain is shorter than its last checkpoint",
            }));
        }
        if from_seq > 0 {
            let at = conn.audit_event_hash(tenant_id, from_seq).await?;
            if at.as_ref().is_none_or(|(_, hash)| *hash != from_hash) {
                let reason = "the checkpointed event is gone or has another hash";
                return Ok(Err(ChainBreak { seq: from_seq, event_id: at.map(|(id, _)| id), reason }));
            }
        }
        let mut verifier = ChainVerifier::resume(from_seq, &from_hash);
        Ok(match walk(&mut conn, tenant_id, &mut verifier, head.0).await? {
            Err(b) => Err(b),
            Ok(()) => verifier.finish(Some(head.clone())),
        })
    }
}

/// Feeds a tenant's events after the verifier's position, up to `until_seq`, to the verifier
/// in pages; stops at the first break.
async fn walk(
    conn: &mut Conn,
    tenant_id: Uuid,
    verifier: &mut ChainVerifier,
    until_seq: i64,
) -> Result<Result<(), ChainBreak>> {
    let mut after = verifier.next_seq - 1;
    loop {
        let page = conn.audit_chain_page(tenant_id, after, until_seq, CHAIN_PAGE).await?;
        for event in &page {
            if let Err(b) = verifier.check(event) {
                return Ok(Err(b));
            }
            after = event.seq;
        }
        if (page.len() as i64) < CHAIN_PAGE {
            return Ok(Ok(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: i64) -> Vec<AuditEventRow> {
        let tenant = Uuid::from_u128(7);
        let mut prev = GENESIS_HASH.to_string();
        (1..=n)
            .map(|seq| {
                let mut row = AuditEventRow {
                    id: Uuid::from_u128(seq as u128),
                    tenant_id: tenant,
                    seq,
                    actor_key_id: Some(Uuid::from_u128(1)),
                    actor_user_id: (seq % 2 == 0).then(|| Uuid::from_u128(2)),
                    action: "model.create".into(),
                    resource_type: "model".into(),
                    resource_id: format!("m{seq}"),
                    before_state: None,
                    after_state: Some(format!("{{\"name\":\"m{seq}\"}}")),
                    request_id: format!("req-{seq}"),
                    client_addr: Some("127.0.0.1:1".into()),
                    created_at: OffsetDateTime::from_unix_timestamp(1_700_000_000 + seq).unwrap(),
                    prev_hash: prev.clone(),
                    hash: String::new(),
                };
                row.hash = row.compute_hash();
                prev.clone_from(&row.hash);
                row
            })
            .collect()
    }

    fn verify(events: &[AuditEventRow], head: Option<(i64, String)>) -> Result<u64, ChainBreak> {
        let mut v = ChainVerifier::default();
        for e in events {
            v.check(e)?;
        }
        v.finish(head)?;
        Ok(v.checked())
    }

    fn head_of(events: &[AuditEventRow]) -> Option<(i64, String)> {
        events.last().map(|e| (e.seq, e.hash.clone()))
    }

    #[test]
    fn intact_chain_verifies() {
        let events = chain(5);
        assert_eq!(verify(&events, head_of(&events)), Ok(5));
        assert_eq!(verify(&[], None), Ok(0));
    }

    #[test]
    fn edited_event_is_found() {
        let mut events = chain(5);
        let head = head_of(&events);
        events[2].after_state = Some("{\"name\":\"evil\"}".into());
        let b = verify(&events, head).unwrap_err();
        assert_eq!((b.seq, b.reason), (3, "event content does not match its hash"));
    }

    #[test]
    fn rehashed_edit_breaks_the_next_link() {
        let mut events = chain(5);
        let head = head_of(&events);
        events[2].after_state = Some("{}".into());
        events[2].hash = events[2].compute_hash();
        let b = verify(&events, head).unwrap_err();
        assert_eq!((b.seq, b.reason), (4, "prev_hash does not match the previous event's hash"));
    }

    #[test]
    fn resumed_verifier_checks_from_a_checkpoint() {
        let events = chain(5);
        let mut v = ChainVerifier::resume(2, &events[1].hash);
        for e in &events[2..] {
            v.check(e).unwrap();
        }
        assert_eq!((v.checked(), v.finish(head_of(&events))), (3, Ok(())));
        let mut wrong = ChainVerifier::resume(2, &events[0].hash);
        assert_eq!(wrong.check(&events[2]).unwrap_err().reason, "prev_hash does not match the previous event's hash");
    }

    #[test]
    fn deleted_events_are_found() {
        let events = chain(5);
        let head = head_of(&events);
        let mut middle = events.clone();
        middle.remove(1);
        assert_eq!(verify(&middle, head.clone()).unwrap_err().seq, 2);
        let tail = &events[..4];
        assert_eq!(verify(tail, head).unwrap_err().reason, "events missing at the end of the chain");
    }
}
