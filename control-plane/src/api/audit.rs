//! The audit trail: listing with filters and a cursor, and chain verification.

use std::collections::HashMap;

use axum::Json;
use axum::extract::State;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::{ApiQuery, AppState, Caller, cursor};
use crate::app::TenantRef;
use crate::audit_checkpoints::Violation;
use crate::audit_checkpoints::{self, CheckpointKey};
use crate::error::{Error, Result};
use crate::kinds::{AuditAction, AuditResourceType, wire_enum};
use crate::registry::{AuditActorRow, AuditEventRow, AuditFilter};
use crate::types::Role;

/// One audit event.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditEvent {
    /// Id.
    pub id: Uuid,
    /// Position in the tenant's chain, from 1.
    pub seq: i64,
    /// Acting API key (absent for the system).
    pub actor_key_id: Option<Uuid>,
    /// The user the acting key belongs to (absent for service keys and the system).
    pub actor_user_id: Option<Uuid>,
    /// The acting key's name, while the key exists.
    pub actor_key_name: Option<String>,
    /// The email of the acting key's user, while the user exists.
    pub actor_user_email: Option<String>,
    /// What happened, `resource.verb`.
    pub action: AuditAction,
    /// Kind of resource.
    pub resource_type: AuditResourceType,
    /// Which resource.
    pub resource_id: String,
    /// Summary of the state before.
    #[schema(value_type = Option<Object>)]
    pub before: Option<serde_json::Value>,
    /// Summary of the state after.
    #[schema(value_type = Option<Object>)]
    pub after: Option<serde_json::Value>,
    /// The request's `x-request-id`.
    pub request_id: String,
    /// Client address.
    pub client_addr: Option<String>,
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Hash of the previous event in the chain.
    pub prev_hash: String,
    /// This event's hash.
    pub hash: String,
}

impl TryFrom<AuditEventRow> for AuditEvent {
    type Error = Error;

    fn try_from(e: AuditEventRow) -> Result<Self> {
        let json = |s: Option<String>| s.and_then(|s| serde_json::from_str(&s).ok());
        // Every action the registry writes is in the enum (it asserts so); a stranger here is
        // a stored row this build does not know, which is ours to fix, not the caller's.
        let unknown =
            |what: &str, value: &str| Error::Internal(format!("audit event {} has unknown {what} {value}", e.seq));
        Ok(AuditEvent {
            id: e.id,
            seq: e.seq,
            actor_key_id: e.actor_key_id,
            actor_user_id: e.actor_user_id,
            actor_key_name: None,
            actor_user_email: None,
            action: AuditAction::parse(&e.action).ok_or_else(|| unknown("action", &e.action))?,
            resource_type: AuditResourceType::parse(&e.resource_type)
                .ok_or_else(|| unknown("resource type", &e.resource_type))?,
            resource_id: e.resource_id,
            before: json(e.before_state),
            after: json(e.after_state),
            request_id: e.request_id,
            client_addr: e.client_addr,
            created_at: e.created_at,
            prev_hash: e.prev_hash,
            hash: e.hash,
        })
    }
}

/// A page of events.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    /// Events, newest first.
    pub events: Vec<AuditEvent>,
    /// Pass as `cursor` for older events; absent on the last page.
    pub next_cursor: Option<String>,
}

/// Which events.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// Tenant (default: the caller's; platform admins may name any).
    #[param(pattern = "^[a-z0-9][a-z0-9_.-]{0,62}$")]
    pub tenant: Option<String>,
    /// Only this action.
    pub action: Option<AuditAction>,
    /// Only this resource type.
    pub resource_type: Option<AuditResourceType>,
    /// Only this resource.
    #[param(max_length = 200)]
    pub resource_id: Option<String>,
    /// Only this acting key.
    pub actor_key_id: Option<Uuid>,
    /// Only this acting user.
    pub actor_user_id: Option<Uuid>,
    /// Most events to return (1 to 500, default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page (opaque; anything else is refused with 400).
    #[param(max_length = 256)]
    pub cursor: Option<String>,
}

/// Longest audit filter value.
const MAX_FILTER_LEN: usize = 200;

impl AuditParams {
    /// Refuses filter values longer than the schema allows, naming the parameter.
    fn check(&self) -> Result<()> {
        if self.resource_id.as_ref().is_some_and(|v| v.chars().count() > MAX_FILTER_LEN) {
            return Err(Error::invalid(
                "resource_id",
                format!("resource_id must be at most {MAX_FILTER_LEN} characters"),
            ));
        }
        Ok(())
    }
}

/// Which tenant's chain.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct VerifyParams {
    /// Tenant (default: the caller's; platform admins may name any).
    #[param(pattern = "^[a-z0-9][a-z0-9_.-]{0,62}$")]
    pub tenant: Option<String>,
}

/// The first broken link of a chain.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ChainBreak {
    /// Sequence number where the chain breaks.
    pub seq: i64,
    /// The event there, if it exists.
    pub event_id: Option<Uuid>,
    /// What is wrong.
    pub reason: String,
}

/// Result of checking a chain.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditVerification {
    /// The tenant whose chain was checked.
    pub tenant: String,
    /// True when every link holds and the chain matches its newest signed checkpoint, and no
    /// checkpoint file fails to verify.
    pub ok: bool,
    /// Events that checked out before the first break (all of them when intact).
    pub events_checked: u64,
    /// The first broken link; when the links hold but the chain no longer matches its newest
    /// checkpoint, the checkpointed sequence number with the reason.
    pub first_break: Option<ChainBreak>,
    /// The chain compared with the signed checkpoints in the object store; absent when this
    /// control plane has no `--audit-signing-key-file`.
    pub checkpoints: Option<CheckpointVerification>,
}

/// The chain compared with its signed checkpoints.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CheckpointVerification {
    /// Id of the key checkpoints must be signed with (`GET /v1/audit/checkpoints/key`).
    pub key_id: String,
    /// The newest checkpoint whose signature verifies; absent before the first one.
    pub latest: Option<CheckpointRef>,
    /// How the chain no longer matches `latest`, if it does not.
    pub violation: Option<CheckpointViolation>,
    /// Events after `latest`: no checkpoint covers them yet.
    pub events_after_checkpoint: i64,
    /// Checkpoint files newer than `latest` whose signature or content does not verify.
    pub invalid: Vec<InvalidCheckpoint>,
    /// What a checkpoint can and cannot prove.
    pub proves: String,
}

/// A checkpoint file.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CheckpointRef {
    /// Its key in the object store (`audit/checkpoints/<tenant id>/<seq>.json`).
    pub object: String,
    /// The chain's head sequence number it signs.
    pub seq: i64,
    /// The hash of that event.
    pub head_hash: String,
    /// When it was signed (RFC 3339).
    pub signed_at: String,
}

/// A history rewritten since a checkpoint was signed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CheckpointViolation {
    /// `truncated` (events deleted after the checkpoint was signed) or `rewritten` (the
    /// checkpointed event, or one before it, changed).
    pub kind: Violation,
    /// The checkpoint it contradicts (its object key).
    pub checkpoint: String,
    /// The checkpointed sequence number.
    pub seq: i64,
    /// What is wrong.
    pub reason: String,
}

/// A checkpoint file that does not verify.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct InvalidCheckpoint {
    /// Its key in the object store.
    pub object: String,
    /// Why it does not verify.
    pub reason: String,
}

wire_enum! {
    /// The signature algorithm of audit checkpoints.
    pub enum CheckpointAlgorithm {
        /// Ed25519 (RFC 8032).
        Ed25519 = "Ed25519",
    }
}

/// The public key that verifies audit checkpoints.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CheckpointKeyInfo {
    /// Always `Ed25519`.
    pub algorithm: CheckpointAlgorithm,
    /// The `key_id` checkpoints name: hex of the first 8 bytes of the sha256 of the raw key.
    pub key_id: String,
    /// The raw 32-byte public key, base64.
    pub public_key: String,
    /// The same key as SPKI PEM (for `openssl pkeyutl -verify -pubin -inkey`).
    pub public_key_pem: String,
}

/// What a checkpoint proves, stated in every verification answer.
const CHECKPOINTS_PROVE: &str = "A checkpoint proves that events 1..seq are unchanged since signed_at: truncating, \
    editing or re-chaining them is reported. Events after the newest checkpoint (events_after_checkpoint) are only as \
    trustworthy as the database: they can be appended, removed or re-chained unnoticed until a checkpoint covers \
    them. A checkpoint file deleted from the object store is not noticed.";

async fn audit_tenant(app: &AppState, caller: &Caller, tenant: Option<&str>) -> Result<TenantRef> {
    let tenant = tenant.unwrap_or(&caller.principal.tenant_name);
    app.tenant_for(&caller.principal, tenant, Role::TenantAdmin, "read the audit trail").await
}

/// Lists a tenant's audit events, newest first (tenant admins).
#[utoipa::path(get, path = "/v1/audit", operation_id = "list_audit_events", tag = "audit", params(AuditParams),
    responses((status = 200, description = "A page of events.", body = AuditPage)))]
pub async fn handle_audit_list(
    State(app): State<AppState>,
    caller: Caller,
    ApiQuery(params): ApiQuery<AuditParams>,
) -> Result<Json<AuditPage>> {
    let t = audit_tenant(&app, &caller, params.tenant.as_deref()).await?;
    params.check()?;
    let limit = match params.limit {
        None => 100,
        Some(n @ 1..=500) => n,
        Some(_) => return Err(Error::invalid("limit", "limit must be between 1 and 500")),
    };
    let before_seq = params.cursor.as_deref().map(|c| cursor::decode_number("audit", c)).transpose()?;
    let filter = AuditFilter {
        action: params.action.map(|a| a.as_str().to_string()),
        resource_type: params.resource_type.map(|r| r.as_str().to_string()),
        resource_id: params.resource_id,
        actor_key_id: params.actor_key_id,
        actor_user_id: params.actor_user_id,
        before_seq,
    };
    let mut conn = app.registry.conn().await?;
    let rows = conn.audit_events(t.id, &filter, limit + 1).await?;
    let more = rows.len() as i64 > limit;
    let mut events = rows.into_iter().take(limit as usize).map(AuditEvent::try_from).collect::<Result<Vec<_>>>()?;
    if let (Some(newest), Some(oldest)) = (events.first(), events.last()) {
        let names = conn.audit_actor_names(t.id, oldest.seq, newest.seq).await?;
        name_actors(&mut events, names);
    }
    let next_cursor = if more { events.last().map(|e| cursor::encode("audit", &e.seq.to_string())) } else { None };
    Ok(Json(AuditPage { events, next_cursor }))
}

/// Fills in the actors' key names and user emails, so people are told apart by name rather
/// than by key id.
fn name_actors(events: &mut [AuditEvent], names: Vec<AuditActorRow>) {
    let by_seq: HashMap<i64, AuditActorRow> = names.into_iter().map(|n| (n.seq, n)).collect();
    for e in events {
        if let Some(n) = by_seq.get(&e.seq) {
            e.actor_key_name.clone_from(&n.key_name);
            e.actor_user_email.clone_from(&n.user_email);
        }
    }
}

/// Checks a tenant's audit chain link by link and reports the first broken one (tenant
/// admins).
#[utoipa::path(get, path = "/v1/audit/verify", operation_id = "verify_audit_chain", tag = "audit", params(VerifyParams),
    responses((status = 200, description = "The verdict (`ok` false names the first break).", body = AuditVerification)))]
pub async fn handle_audit_verify(
    State(app): State<AppState>,
    caller: Caller,
    ApiQuery(params): ApiQuery<VerifyParams>,
) -> Result<Json<AuditVerification>> {
    let t = audit_tenant(&app, &caller, params.tenant.as_deref()).await?;
    let report = app.registry.verify_audit_chain(t.id).await?;
    let mut first_break =
        report.first_break.map(|b| ChainBreak { seq: b.seq, event_id: b.event_id, reason: b.reason.into() });
    let checkpoints = match &app.config.audit_signing_key {
        Some(key) => Some(check_checkpoints(&app, key, t.id).await?),
        None => None,
    };
    let checkpoints_hold = checkpoints.as_ref().is_none_or(|c| c.violation.is_none() && c.invalid.is_empty());
    if let (None, Some(v)) = (&first_break, checkpoints.as_ref().and_then(|c| c.violation.as_ref())) {
        let at = app.registry.conn().await?.audit_event_hash(t.id, v.seq).await?;
        first_break = Some(ChainBreak { seq: v.seq, event_id: at.map(|(id, _)| id), reason: v.reason.clone() });
    }
    Ok(Json(AuditVerification {
        tenant: t.name,
        ok: first_break.is_none() && checkpoints_hold,
        events_checked: report.events_checked,
        first_break,
        checkpoints,
    }))
}

/// Compares a tenant's chain with its newest valid checkpoint.
async fn check_checkpoints(app: &AppState, key: &CheckpointKey, tenant: Uuid) -> Result<CheckpointVerification> {
    let found = audit_checkpoints::latest(&app.store, &key.verifying_key(), tenant).await?;
    let mut conn = app.registry.conn().await?;
    let head_seq = conn.audit_head(tenant).await?.map_or(0, |(seq, _)| seq);
    let (mut latest, mut violation, mut after) = (None, None, head_seq);
    if let Some((object, c)) = found.valid {
        let at = conn.audit_event_hash(tenant, c.seq).await?;
        violation = audit_checkpoints::compare(&c, head_seq, at.as_ref().map(|(_, h)| h.as_str())).map(|v| {
            CheckpointViolation { kind: v, checkpoint: object.clone(), seq: c.seq, reason: v.reason().into() }
        });
        after = (head_seq - c.seq).max(0);
        latest = Some(CheckpointRef { object, seq: c.seq, head_hash: c.head_hash, signed_at: c.signed_at });
    }
    let invalid = found.invalid.into_iter().map(|i| InvalidCheckpoint { object: i.object, reason: i.reason }).collect();
    Ok(CheckpointVerification {
        key_id: key.key_id().to_string(),
        latest,
        violation,
        events_after_checkpoint: after,
        invalid,
        proves: CHECKPOINTS_PROVE.into(),
    })
}

/// The public key that verifies the audit checkpoints in the object store, so an auditor can
/// check them offline (any authenticated caller; 404 when checkpoints are off).
#[utoipa::path(get, path = "/v1/audit/checkpoints/key", operation_id = "get_audit_checkpoint_key", tag = "audit",
    responses((status = 200, description = "The Ed25519 public key.", body = CheckpointKeyInfo)))]
pub async fn handle_checkpoint_key_get(
    State(app): State<AppState>,
    _caller: Caller,
) -> Result<Json<CheckpointKeyInfo>> {
    let key = app.config.audit_signing_key.as_ref().ok_or(Error::NotFound("audit checkpoint key"))?;
    Ok(Json(CheckpointKeyInfo {
        algorithm: CheckpointAlgorithm::Ed25519,
        key_id: key.key_id().to_string(),
        public_key: BASE64.encode(key.verifying_key().as_bytes()),
        public_key_pem: key.public_pem(),
    }))
}
