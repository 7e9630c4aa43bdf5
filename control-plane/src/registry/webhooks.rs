//! Webhooks and their deliveries: the outbox the dispatcher ([`crate::webhooks`]) drains.
//!
//! An event becomes one delivery row per subscribed hook, written by the same transaction as
//! the change it announces (a deployment event, a version upload, an alias move), so an event
//! is neither lost when the control plane dies after the change nor sent for a change that
//! rolled back. Hooks, deliveries and the tenant's private-target allowance are changed
//! with an audit event in the same transaction, like every other mutation here.

use serde_json::{Value, json};
use sqlx::FromRow;
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{Actor, NewAuditEvent};
use super::{Conn, Registry, exec, now, on_conn};
use crate::error::{Error, Result};
use crate::kinds::{AuditAction, AuditResourceType, DeploymentEventKind, WebhookDeliveryStatus, WebhookEventType};

/// Most hooks a tenant may register.
pub const MAX_WEBHOOKS_PER_TENANT: i64 = 20;

/// A registered webhook.
#[derive(Clone, FromRow)]
pub struct WebhookRow {
    /// Id.
    pub id: Uuid,
    /// Owner.
    pub tenant_id: Uuid,
    /// Where deliveries are POSTed.
    pub url: String,
    /// Free text.
    pub description: String,
    /// Subscribed event types, comma-separated wire names.
    pub events: String,
    /// The HMAC key deliveries are signed with.
    pub secret: String,
    /// Disabled hooks keep their deliveries pending and get no new ones.
    pub enabled: bool,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Last changed.
    pub updated_at: OffsetDateTime,
}

impl std::fmt::Debug for WebhookRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("WebhookRow")
            .field("id", &self.id)
            .field("url", &self.url)
            .field("events", &self.events)
            .finish()
    }
}

impl WebhookRow {
    /// The subscribed event types (unknown names, which only an older build could store, are
    /// left out).
    pub fn event_types(&self) -> Vec<WebhookEventType> {
        self.events.split(',').filter_map(WebhookEventType::parse).collect()
    }

    /// Whether the hook receives events of `kind` (every hook receives pings).
    pub fn subscribes(&self, kind: WebhookEventType) -> bool {
        kind == WebhookEventType::Ping || self.events.split(',').any(|e| e == kind.as_str())
    }

    /// What the audit trail records about a hook (never its secret).
    pub fn summary(&self) -> Value {
        json!({ "url": self.url, "description": self.description, "events": self.events, "enabled": self.enabled })
    }
}

/// The stored form of a list of event types.
pub fn events_text(events: &[WebhookEventType]) -> String {
    events.iter().map(|e| e.as_str()).collect::<Vec<_>>().join(",")
}

/// A delivery: one event to one hook, with its attempts so far.
#[derive(Debug, Clone, FromRow)]
pub struct DeliveryRow {
    /// Position in the hook's list.
    pub seq: i64,
    /// Id (the `Tessera-Delivery` header).
    pub id: Uuid,
    /// Owner.
    pub tenant_id: Uuid,
    /// The hook.
    pub webhook_id: Uuid,
    /// The event (shared by every hook's delivery of it and by replays).
    pub event_id: Uuid,
    /// Its type.
    pub event_type: String,
    /// The JSON body sent.
    pub payload: String,
    /// pending, delivered or failed.
    pub status: String,
    /// Attempts made.
    pub attempts: i64,
    /// When the next attempt is due (pending only).
    pub next_attempt_at: Option<OffsetDateTime>,
    /// When the last attempt ended.
    pub last_attempt_at: Option<OffsetDateTime>,
    /// The receiver's last HTTP status.
    pub last_http_status: Option<i64>,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// The delivery this one replays.
    pub replay_of: Option<Uuid>,
    /// Queued.
    pub created_at: OffsetDateTime,
    /// Delivered (a 2xx answer).
    pub delivered_at: Option<OffsetDateTime>,
}

/// A delivery due now, with what sending it needs.
#[derive(Clone, FromRow)]
pub struct DueDeliveryRow {
    /// Delivery id.
    pub id: Uuid,
    /// Owner.
    pub tenant_id: Uuid,
    /// The hook.
    pub webhook_id: Uuid,
    /// Event type.
    pub event_type: String,
    /// Body.
    pub payload: String,
    /// Attempts before this one.
    pub attempts: i64,
    /// The hook's URL.
    pub url: String,
    /// The hook's secret.
    pub secret: String,
    /// Whether the tenant may reach private targets.
    pub allow_private: bool,
}

impl std::fmt::Debug for DueDeliveryRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DueDeliveryRow").field("id", &self.id).field("url", &self.url).finish()
    }
}

/// How an attempt ended.
#[derive(Debug, Clone)]
pub struct AttemptOutcome {
    /// The status the delivery takes.
    pub status: WebhookDeliveryStatus,
    /// The receiver's HTTP status, if it answered.
    pub http_status: Option<u16>,
    /// Why it failed.
    pub error: Option<String>,
    /// When to try again (pending only).
    pub next_attempt_at: Option<OffsetDateTime>,
}

/// A new hook.
#[derive(Debug, Clone)]
pub struct NewWebhook {
    /// URL, already checked.
    pub url: String,
    /// Free text.
    pub description: String,
    /// Subscribed types.
    pub events: Vec<WebhookEventType>,
    /// Generated secret.
    pub secret: String,
}

/// Changes to a hook (absent fields stay).
#[derive(Debug, Clone, Default)]
pub struct WebhookPatch {
    /// New URL, already checked.
    pub url: Option<String>,
    /// New description.
    pub description: Option<String>,
    /// New subscriptions.
    pub events: Option<Vec<WebhookEventType>>,
    /// Enable or disable.
    pub enabled: Option<bool>,
}

macro_rules! select_webhooks {
    ($rest:literal) => {
        concat!(
            "SELECT id, tenant_id, url, description, events, secret, enabled, created_at, updated_at FROM webhooks ",
            $rest
        )
    };
}

macro_rules! select_deliveries {
    ($rest:literal) => {
        concat!(
            "SELECT seq, id, tenant_id, webhook_id, event_id, event_type, payload, status, attempts, next_attempt_at, \
             last_attempt_at, last_http_status, last_error, replay_of, created_at, delivered_at \
             FROM webhook_deliveries ",
            $rest
        )
    };
}

/// The webhook event a deployment event announces, if any.
fn deployment_event_type(kind: &str) -> Option<WebhookEventType> {
    match DeploymentEventKind::parse(kind)? {
        DeploymentEventKind::Created => Some(WebhookEventType::DeploymentCreated),
        DeploymentEventKind::Ready => Some(WebhookEventType::DeploymentReady),
        DeploymentEventKind::Failed => Some(WebhookEventType::DeploymentFailed),
        DeploymentEventKind::RolloutSwitched => Some(WebhookEventType::DeploymentRolledOut),
        _ => None,
    }
}

/// The webhook event an audited change announces, with its data, if any.
fn audit_event_type(event: &NewAuditEvent) -> Option<(WebhookEventType, Value)> {
    match AuditAction::parse(event.action)? {
        AuditAction::VersionCreate => {
            let (model, version) = event.resource_id.rsplit_once('/')?;
            let mut data = json!({ "model": model, "version": version.parse::<i64>().ok()? });
            if let (Some(Value::Object(after)), Value::Object(d)) = (&event.after, &mut data) {
                for key in ["sha256", "size_bytes", "format"] {
                    if let Some(v) = after.get(key) {
                        d.insert(key.to_string(), v.clone());
                    }
                }
            }
            Some((WebhookEventType::VersionUploaded, data))
        }
        AuditAction::AliasSet => {
            let (model, alias) = event.resource_id.rsplit_once('@')?;
            let version = |s: &Option<Value>| s.as_ref().and_then(|v| v.get("version")).cloned();
            Some((
                WebhookEventType::AliasMoved,
                json!({ "model": model, "alias": alias, "version": version(&event.after),
                        "previous_version": version(&event.before) }),
            ))
        }
        _ => None,
    }
}

impl Conn {
    /// A tenant's hooks, oldest first.
    pub async fn webhooks(&mut self, tenant_id: Uuid) -> Result<Vec<WebhookRow>> {
        on_conn!(self, "webhook.list", |c| sqlx::query_as::<_, WebhookRow>(select_webhooks!(
            "WHERE tenant_id = $1 ORDER BY created_at, id"
        ))
        .bind(tenant_id)
        .fetch_all(c))
    }

    /// One hook of a tenant.
    pub async fn webhook(&mut self, tenant_id: Uuid, id: Uuid) -> Result<Option<WebhookRow>> {
        on_conn!(self, "webhook.get", |c| sqlx::query_as::<_, WebhookRow>(select_webhooks!(
            "WHERE tenant_id = $1 AND id = $2"
        ))
        .bind(tenant_id)
        .bind(id)
        .fetch_optional(c))
    }

    /// Whether a platform admin let the tenant's hooks reach private targets.
    pub async fn webhooks_allow_private(&mut self, tenant_id: Uuid) -> Result<bool> {
        let allowed: Option<bool> = on_conn!(self, "webhook.allow_private", |c| sqlx::query_scalar(
            "SELECT webhooks_allow_private FROM tenants WHERE id = $1"
        )
        .bind(tenant_id)
        .fetch_optional(c))?;
        Ok(allowed.unwrap_or(false))
    }

    /// Queues `kind` with `data` to every enabled hook of the tenant that subscribes to it.
    /// Call it inside the transaction of the change the event announces.
    pub async fn enqueue_webhook_event(&mut self, tenant_id: Uuid, kind: WebhookEventType, data: Value) -> Result<()> {
        let hooks: Vec<Uuid> = self
            .webhooks(tenant_id)
            .await?
            .into_iter()
            .filter(|h| h.enabled && h.subscribes(kind))
            .map(|h| h.id)
            .collect();
        if hooks.is_empty() {
            return Ok(());
        }
        let event_id = Uuid::now_v7();
        let payload = event_body(event_id, tenant_id, kind, now(), data);
        for hook in hooks {
            self.insert_delivery(tenant_id, hook, event_id, kind.as_str(), &payload, None).await?;
        }
        Ok(())
    }

    /// Queues the webhook event a deployment event announces, if it announces one; the
    /// deployment's name and model are read only when some hook listens.
    pub(super) async fn enqueue_deployment_webhook(
        &mut self,
        tenant_id: Uuid,
        deployment_id: Uuid,
        kind: &str,
        replica_id: Option<Uuid>,
        message: &str,
    ) -> Result<()> {
        let Some(event) = deployment_event_type(kind) else { return Ok(()) };
        if !self.webhooks(tenant_id).await?.iter().any(|h| h.enabled && h.subscribes(event)) {
            return Ok(());
        }
        let named: Option<(String, Uuid)> = on_conn!(self, "webhook.deployment_name", |c| sqlx::query_as(
            "SELECT name, model_id FROM deployments WHERE tenant_id = $1 AND id = $2"
        )
        .bind(tenant_id)
        .bind(deployment_id)
        .fetch_optional(c))?;
        let model: Option<String> = match &named {
            Some((_, model_id)) => on_conn!(self, "webhook.model_name", |c| sqlx::query_scalar(
                "SELECT name FROM models WHERE tenant_id = $1 AND id = $2"
            )
            .bind(tenant_id)
            .bind(*model_id)
            .fetch_optional(c))?,
            None => None,
        };
        let data = json!({
            "deployment_id": deployment_id,
            "deployment": named.map(|(n, _)| n),
            "model": model,
            "replica_id": replica_id,
            "message": message,
        });
        self.enqueue_webhook_event(tenant_id, event, data).await
    }

    /// Queues the webhook event an audited change announces, if it announces one.
    pub(super) async fn enqueue_audit_webhook(&mut self, event: &NewAuditEvent) -> Result<()> {
        match audit_event_type(event) {
            Some((kind, data)) => self.enqueue_webhook_event(event.tenant_id, kind, data).await,
            None => Ok(()),
        }
    }

    async fn insert_delivery(
        &mut self,
        tenant_id: Uuid,
        webhook_id: Uuid,
        event_id: Uuid,
        event_type: &str,
        payload: &str,
        replay_of: Option<Uuid>,
    ) -> Result<DeliveryRow> {
        let (id, at) = (Uuid::now_v7(), now());
        exec!(self, "webhook_delivery.insert", |c| sqlx::query(
            "INSERT INTO webhook_deliveries (id, tenant_id, webhook_id, event_id, event_type, payload, status, \
             attempts, next_attempt_at, replay_of, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8, $9, $8)"
        )
        .bind(id)
        .bind(tenant_id)
        .bind(webhook_id)
        .bind(event_id)
        .bind(event_type)
        .bind(payload)
        .bind(WebhookDeliveryStatus::Pending.as_str())
        .bind(at)
        .bind(replay_of)
        .execute(c))?;
        self.webhook_delivery(tenant_id, webhook_id, id)
            .await?
            .ok_or_else(|| Error::Internal("delivery vanished".into()))
    }

    /// A page of a hook's deliveries, newest first: at most `limit` older than `before_seq`,
    /// of `status` when given.
    pub async fn webhook_deliveries(
        &mut self,
        tenant_id: Uuid,
        webhook_id: Uuid,
        status: Option<WebhookDeliveryStatus>,
        before_seq: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeliveryRow>> {
        on_conn!(self, "webhook_delivery.list", |c| sqlx::query_as::<_, DeliveryRow>(select_deliveries!(
            "WHERE tenant_id = $1 AND webhook_id = $2 AND seq < COALESCE($3, 9223372036854775807) \
             AND ($4 IS NULL OR status = $4) ORDER BY seq DESC LIMIT $5"
        ))
        .bind(tenant_id)
        .bind(webhook_id)
        .bind(before_seq)
        .bind(status.map(|s| s.as_str()))
        .bind(limit)
        .fetch_all(c))
    }

    /// One delivery of a hook.
    pub async fn webhook_delivery(
        &mut self,
        tenant_id: Uuid,
        webhook_id: Uuid,
        id: Uuid,
    ) -> Result<Option<DeliveryRow>> {
        on_conn!(self, "webhook_delivery.get", |c| sqlx::query_as::<_, DeliveryRow>(select_deliveries!(
            "WHERE tenant_id = $1 AND webhook_id = $2 AND id = $3"
        ))
        .bind(tenant_id)
        .bind(webhook_id)
        .bind(id)
        .fetch_optional(c))
    }

    /// Up to `limit` pending deliveries due at `at`, of enabled hooks, oldest due first. Crosses
    /// tenants: the dispatcher serves every tenant's outbox.
    pub async fn due_webhook_deliveries(&mut self, at: OffsetDateTime, limit: i64) -> Result<Vec<DueDeliveryRow>> {
        on_conn!(self, "webhook_delivery.due", |c| sqlx::query_as::<_, DueDeliveryRow>(
            "SELECT d.id, d.tenant_id, d.webhook_id, d.event_type, d.payload, d.attempts, w.url, w.secret, \
             t.webhooks_allow_private AS allow_private \
             FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id JOIN tenants t ON t.id = d.tenant_id \
             WHERE d.status = 'pending' AND d.next_attempt_at <= $1 AND w.enabled \
             ORDER BY d.next_attempt_at, d.seq LIMIT $2"
        )
        .bind(at)
        .bind(limit)
        .fetch_all(c))
    }

    /// Records an attempt of a delivery (only while it is pending, so a replay or a delete in
    /// between is not overwritten).
    pub async fn record_webhook_attempt(&mut self, id: Uuid, outcome: &AttemptOutcome) -> Result<()> {
        let at = now();
        let delivered = (outcome.status == WebhookDeliveryStatus::Delivered).then_some(at);
        exec!(self, "webhook_delivery.attempt", |c| sqlx::query(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, last_attempt_at = $2, last_http_status = $3, \
             last_error = $4, status = $5, next_attempt_at = $6, delivered_at = $7 \
             WHERE id = $1 AND status = 'pending'"
        )
        .bind(id)
        .bind(at)
        .bind(outcome.http_status.map(i64::from))
        .bind(&outcome.error)
        .bind(outcome.status.as_str())
        .bind(outcome.next_attempt_at)
        .bind(delivered)
        .execute(c))?;
        Ok(())
    }

    async fn update_webhook_row(&mut self, row: &WebhookRow) -> Result<()> {
        exec!(self, "webhook.update", |c| sqlx::query(
            "UPDATE webhooks SET url = $3, description = $4, events = $5, secret = $6, enabled = $7, updated_at = $8 \
             WHERE tenant_id = $1 AND id = $2"
        )
        .bind(row.tenant_id)
        .bind(row.id)
        .bind(&row.url)
        .bind(&row.description)
        .bind(&row.events)
        .bind(&row.secret)
        .bind(row.enabled)
        .bind(row.updated_at)
        .execute(c))?;
        Ok(())
    }
}

/// The JSON body of an event.
pub fn event_body(event_id: Uuid, tenant_id: Uuid, kind: WebhookEventType, at: OffsetDateTime, data: Value) -> String {
    let created_at = at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
    json!({ "id": event_id, "type": kind.as_str(), "created_at": created_at, "tenant_id": tenant_id, "data": data })
        .to_string()
}

fn audit(
    tenant_id: Uuid,
    action: AuditAction,
    resource_id: String,
    before: Option<Value>,
    after: Option<Value>,
) -> NewAuditEvent {
    let resource_type = match action {
        AuditAction::WebhookSettingsUpdate => AuditResourceType::WebhookSettings,
        _ => AuditResourceType::Webhook,
    };
    NewAuditEvent {
        tenant_id,
        action: action.as_str(),
        resource_type: resource_type.as_str(),
        resource_id,
        before,
        after,
    }
}

impl Registry {
    /// Registers a hook.
    pub async fn create_webhook(&self, actor: &Actor, tenant_id: Uuid, new: NewWebhook) -> Result<WebhookRow> {
        let mut tx = self.begin().await?;
        if tx.webhooks(tenant_id).await?.len() as i64 >= MAX_WEBHOOKS_PER_TENANT {
            return Err(Error::conflict(
                crate::error::ErrorCode::Conflict,
                format!("a tenant may register at most {MAX_WEBHOOKS_PER_TENANT} webhooks"),
            ));
        }
        let at = now();
        let row = WebhookRow {
            id: Uuid::now_v7(),
            tenant_id,
            url: new.url,
            description: new.description,
            events: events_text(&new.events),
            secret: new.secret,
            enabled: true,
            created_at: at,
            updated_at: at,
        };
        exec!(tx, "webhook.insert", |c| sqlx::query(
            "INSERT INTO webhooks (id, tenant_id, url, description, events, secret, enabled, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)"
        )
        .bind(row.id)
        .bind(row.tenant_id)
        .bind(&row.url)
        .bind(&row.description)
        .bind(&row.events)
        .bind(&row.secret)
        .bind(row.enabled)
        .bind(row.created_at)
        .execute(c))?;
        tx.append_audit(
            actor,
            audit(tenant_id, AuditAction::WebhookCreate, row.id.to_string(), None, Some(row.summary())),
        )
        .await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Changes a hook.
    pub async fn update_webhook(
        &self,
        actor: &Actor,
        tenant_id: Uuid,
        id: Uuid,
        patch: WebhookPatch,
    ) -> Result<WebhookRow> {
        let mut tx = self.begin().await?;
        let before = tx.webhook(tenant_id, id).await?.ok_or(Error::NotFound("webhook"))?;
        let mut row = before.clone();
        if let Some(url) = patch.url {
            row.url = url;
        }
        if let Some(d) = patch.description {
            row.description = d;
        }
        if let Some(events) = patch.events {
            row.events = events_text(&events);
        }
        if let Some(enabled) = patch.enabled {
            row.enabled = enabled;
        }
        row.updated_at = now();
        tx.update_webhook_row(&row).await?;
        let event =
            audit(tenant_id, AuditAction::WebhookUpdate, id.to_string(), Some(before.summary()), Some(row.summary()));
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Replaces a hook's secret; deliveries from now on are signed with `secret`.
    pub async fn rotate_webhook_secret(
        &self,
        actor: &Actor,
        tenant_id: Uuid,
        id: Uuid,
        secret: String,
    ) -> Result<WebhookRow> {
        let mut tx = self.begin().await?;
        let mut row = tx.webhook(tenant_id, id).await?.ok_or(Error::NotFound("webhook"))?;
        row.secret = secret;
        row.updated_at = now();
        tx.update_webhook_row(&row).await?;
        tx.append_audit(actor, audit(tenant_id, AuditAction::WebhookSecretRotate, id.to_string(), None, None)).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Deletes a hook and its deliveries.
    pub async fn delete_webhook(&self, actor: &Actor, tenant_id: Uuid, id: Uuid) -> Result<()> {
        let mut tx = self.begin().await?;
        let before = tx.webhook(tenant_id, id).await?.ok_or(Error::NotFound("webhook"))?;
        exec!(tx, "webhook_delivery.delete_hook", |c| sqlx::query(
            "DELETE FROM webhook_deliveries WHERE tenant_id = $1 AND webhook_id = $2"
        )
        .bind(tenant_id)
        .bind(id)
        .execute(c))?;
        exec!(tx, "webhook.delete", |c| sqlx::query("DELETE FROM webhooks WHERE tenant_id = $1 AND id = $2")
            .bind(tenant_id)
            .bind(id)
            .execute(c))?;
        tx.append_audit(
            actor,
            audit(tenant_id, AuditAction::WebhookDelete, id.to_string(), Some(before.summary()), None),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Queues a delivery's event again to its hook, as a new delivery.
    pub async fn replay_webhook_delivery(
        &self,
        actor: &Actor,
        tenant_id: Uuid,
        webhook_id: Uuid,
        delivery_id: Uuid,
    ) -> Result<DeliveryRow> {
        let mut tx = self.begin().await?;
        let d = tx.webhook_delivery(tenant_id, webhook_id, delivery_id).await?.ok_or(Error::NotFound("delivery"))?;
        let replay =
            tx.insert_delivery(tenant_id, webhook_id, d.event_id, &d.event_type, &d.payload, Some(d.id)).await?;
        let after = json!({ "webhook_id": webhook_id, "replay_of": d.id, "event_id": d.event_id });
        tx.append_audit(
            actor,
            audit(tenant_id, AuditAction::WebhookDeliveryReplay, replay.id.to_string(), None, Some(after)),
        )
        .await?;
        tx.commit().await?;
        Ok(replay)
    }

    /// Queues a `ping` event to one hook.
    pub async fn ping_webhook(&self, actor: &Actor, tenant_id: Uuid, webhook_id: Uuid) -> Result<DeliveryRow> {
        let mut tx = self.begin().await?;
        let hook = tx.webhook(tenant_id, webhook_id).await?.ok_or(Error::NotFound("webhook"))?;
        let (event_id, kind) = (Uuid::now_v7(), WebhookEventType::Ping);
        let payload = event_body(event_id, tenant_id, kind, now(), json!({ "webhook_id": hook.id }));
        let d = tx.insert_delivery(tenant_id, hook.id, event_id, kind.as_str(), &payload, None).await?;
        tx.append_audit(actor, audit(tenant_id, AuditAction::WebhookPing, hook.id.to_string(), None, None)).await?;
        tx.commit().await?;
        Ok(d)
    }

    /// Lets (or stops letting) a tenant's hooks reach private targets (platform admins).
    pub async fn set_webhooks_allow_private(&self, actor: &Actor, tenant_id: Uuid, allow: bool) -> Result<()> {
        let mut tx = self.begin().await?;
        let before = tx.webhooks_allow_private(tenant_id).await?;
        exec!(tx, "webhook.set_allow_private", |c| sqlx::query(
            "UPDATE tenants SET webhooks_allow_private = $2 WHERE id = $1"
        )
        .bind(tenant_id)
        .bind(allow)
        .execute(c))?;
        let event = audit(
            tenant_id,
            AuditAction::WebhookSettingsUpdate,
            tenant_id.to_string(),
            Some(json!({ "allow_private_targets": before })),
            Some(json!({ "allow_private_targets": allow })),
        );
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_and_audit_events_map_to_webhook_types() {
        assert_eq!(deployment_event_type("created"), Some(WebhookEventType::DeploymentCreated));
        assert_eq!(deployment_event_type("ready"), Some(WebhookEventType::DeploymentReady));
        assert_eq!(deployment_event_type("failed"), Some(WebhookEventType::DeploymentFailed));
        assert_eq!(deployment_event_type("rollout_switched"), Some(WebhookEventType::DeploymentRolledOut));
        assert_eq!(deployment_event_type("placed"), None);
        let alias = NewAuditEvent {
            tenant_id: Uuid::nil(),
            action: "alias.set",
            resource_type: "model_alias",
            resource_id: "m@prod".into(),
            before: Some(json!({"version": 1})),
            after: Some(json!({"version": 2})),
        };
        let (kind, data) = audit_event_type(&alias).unwrap();
        assert_eq!(kind, WebhookEventType::AliasMoved);
        assert_eq!(data, json!({"model": "m", "alias": "prod", "version": 2, "previous_version": 1}));
        let version = NewAuditEvent {
            action: "version.create",
            resource_type: "model_version",
            resource_id: "m/3".into(),
            before: None,
            after: Some(json!({"sha256": "ab", "secret": "no"})),
            ..alias
        };
        let (kind, data) = audit_event_type(&version).unwrap();
        assert_eq!(kind, WebhookEventType::VersionUploaded);
        assert_eq!(data, json!({"model": "m", "version": 3, "sha256": "ab"}));
    }

    #[test]
    fn pings_reach_every_hook() {
        let at = OffsetDateTime::UNIX_EPOCH;
        let hook = WebhookRow {
            id: Uuid::nil(),
            tenant_id: Uuid::nil(),
            url: "https://x".into(),
            description: String::new(),
            events: "alias.moved".into(),
            secret: "s".into(),
            enabled: true,
            created_at: at,
            updated_at: at,
        };
        assert!(hook.subscribes(WebhookEventType::AliasMoved));
        assert!(hook.subscribes(WebhookEventType::Ping));
        assert!(!hook.subscribes(WebhookEventType::DeploymentReady));
        assert!(!format!("{hook:?}").contains("\"s\""));
    }
}
