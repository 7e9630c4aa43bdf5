//! A tenant's webhooks: registration (tenant admins; viewers read), their deliveries, replays
//! and test pings, and the platform admin's private-target allowance. The secret is shown
//! when a hook is created and when it is rotated, never again.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::models::PageParams;
use super::{ApiJson, ApiQuery, AppState, Caller, cursor};
use crate::app::{App, TenantRef};
use crate::error::{Error, Result};
use crate::kinds::{WebhookDeliveryStatus, WebhookEventType};
use crate::registry::{DeliveryRow, NewWebhook, WebhookPatch, WebhookRow};
use crate::types::Role;
use crate::webhooks::{signing, ssrf};

/// A webhook, without its secret.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Webhook {
    /// Id.
    pub id: Uuid,
    /// Where deliveries are POSTed.
    pub url: String,
    /// Free text.
    pub description: String,
    /// Event types it receives (and `ping`, always).
    pub events: Vec<WebhookEventType>,
    /// Disabled hooks get no new deliveries; pending ones wait.
    pub enabled: bool,
    /// Created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last changed.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl From<WebhookRow> for Webhook {
    fn from(w: WebhookRow) -> Self {
        Webhook {
            events: w.event_types(),
            id: w.id,
            url: w.url,
            description: w.description,
            enabled: w.enabled,
            created_at: w.created_at,
            updated_at: w.updated_at,
        }
    }
}

/// A new webhook.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"url": "https://hooks.example.com/tessera", "events": ["deployment.ready", "alias.moved"]})))]
pub struct CreateWebhook {
    /// An https URL whose host resolves to public addresses only (http and private
    /// addresses only where a platform admin allowed private targets).
    #[schema(max_length = 2000)]
    pub url: String,
    /// Event types to receive (at least one; `ping` is always received).
    pub events: Vec<WebhookEventType>,
    /// Free text, at most 200 characters.
    #[serde(default)]
    #[schema(max_length = 200)]
    pub description: Option<String>,
}

/// Changes to a webhook; absent fields stay.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"enabled": false})))]
pub struct UpdateWebhook {
    /// New URL (checked as at creation).
    #[serde(default)]
    #[schema(max_length = 2000)]
    pub url: Option<String>,
    /// New event types (at least one).
    #[serde(default)]
    pub events: Option<Vec<WebhookEventType>>,
    /// New description.
    #[serde(default)]
    #[schema(max_length = 200)]
    pub description: Option<String>,
    /// Enable or disable.
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// A webhook with its signing secret: shown at creation and rotation only.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WebhookWithSecret {
    /// The signing secret (`whsec_…`): store it now, it is not shown again.
    pub secret: String,
    /// The webhook.
    pub webhook: Webhook,
}

/// A page of webhooks.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WebhookList {
    /// Oldest first.
    pub webhooks: Vec<Webhook>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// One delivery of an event to a webhook.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WebhookDelivery {
    /// Id (the `Tessera-Delivery` header).
    pub id: Uuid,
    /// The webhook.
    pub webhook_id: Uuid,
    /// The event (the body's `id`; a replay carries the same one).
    pub event_id: Uuid,
    /// The event type (`Tessera-Event`).
    pub event_type: WebhookEventType,
    /// Where it stands.
    pub status: WebhookDeliveryStatus,
    /// Attempts made.
    pub attempts: i64,
    /// When the next attempt is due (pending only).
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_attempt_at: Option<OffsetDateTime>,
    /// When the last attempt ended.
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_attempt_at: Option<OffsetDateTime>,
    /// The receiver's last HTTP status.
    pub last_http_status: Option<i64>,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// The delivery this one replays.
    pub replay_of: Option<Uuid>,
    /// Queued.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Delivered (a 2xx answer).
    #[serde(with = "time::serde::rfc3339::option")]
    pub delivered_at: Option<OffsetDateTime>,
    /// The JSON body sent (exactly the signed bytes).
    pub payload: String,
}

/// The API's view of a delivery; `None` (logged) for a type or status this build does not know,
/// which only a newer build could have written.
fn delivery_view(d: DeliveryRow) -> Option<WebhookDelivery> {
    let (Some(event_type), Some(status)) =
        (WebhookEventType::parse(&d.event_type), WebhookDeliveryStatus::parse(&d.status))
    else {
        tracing::error!(
            delivery = %d.id, event_type = %d.event_type, status = %d.status,
            "delivery of unknown type or status left out"
        );
        return None;
    };
    Some(WebhookDelivery {
        event_type,
        status,
        id: d.id,
        webhook_id: d.webhook_id,
        event_id: d.event_id,
        attempts: d.attempts,
        next_attempt_at: d.next_attempt_at,
        last_attempt_at: d.last_attempt_at,
        last_http_status: d.last_http_status,
        last_error: d.last_error,
        replay_of: d.replay_of,
        created_at: d.created_at,
        delivered_at: d.delivered_at,
        payload: d.payload,
    })
}

/// A delivery's view, or a 500 for one this build cannot show.
fn one_delivery(d: DeliveryRow) -> Result<WebhookDelivery> {
    delivery_view(d).ok_or_else(|| Error::Internal("delivery of an unknown type".into()))
}

/// A page of deliveries.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WebhookDeliveryList {
    /// Newest first.
    pub deliveries: Vec<WebhookDelivery>,
    /// Pass as `cursor` for the next (older) page; absent on the last.
    pub next_cursor: Option<String>,
}

/// Paging and filter of the deliveries list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveryParams {
    /// Most items to return (1 to 200, default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(max_length = 256)]
    pub cursor: Option<String>,
    /// Only deliveries in this status.
    pub status: Option<WebhookDeliveryStatus>,
}

/// A tenant's webhook settings.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"allow_private_targets": true})))]
pub struct WebhookSettings {
    /// Whether hooks may reach loopback, private, link-local and unique-local addresses and
    /// use plain http. Only platform admins change it; the server's
    /// `--webhooks-allow-private` allows it for every tenant.
    pub allow_private_targets: bool,
}

fn parse_id(what: &'static str, id: &str) -> Result<Uuid> {
    // A malformed id names nothing: not found, like any other unknown id.
    id.parse().map_err(|_| Error::NotFound(what))
}

fn check_events(events: &[WebhookEventType]) -> Result<()> {
    if events.is_empty() {
        return Err(Error::invalid("events", "subscribe to at least one event type"));
    }
    Ok(())
}

fn check_description(d: &str) -> Result<()> {
    if d.chars().count() > 200 {
        return Err(Error::invalid("description", "description must be at most 200 characters"));
    }
    Ok(())
}

/// Checks a hook URL for the tenant: scheme, then every address it resolves to.
async fn check_url(app: &App, tenant_id: Uuid, url: &str) -> Result<String> {
    if url.len() > 2000 {
        return Err(Error::invalid("url", "url must be at most 2000 characters"));
    }
    let allow =
        app.config.webhooks_allow_private || app.registry.conn().await?.webhooks_allow_private(tenant_id).await?;
    let target = ssrf::parse_target("url", url, allow)?;
    ssrf::resolve("url", &target, allow).await?;
    Ok(target.url.to_string())
}

async fn hook_for(
    app: &App,
    caller: &Caller,
    tenant: &str,
    id: &str,
    needed: Role,
    action: &'static str,
) -> Result<(TenantRef, WebhookRow)> {
    let t = app.tenant_for(&caller.principal, tenant, needed, action).await?;
    let hook =
        app.registry.conn().await?.webhook(t.id, parse_id("webhook", id)?).await?.ok_or(Error::NotFound("webhook"))?;
    Ok((t, hook))
}

/// Registers a webhook (tenant admins). The response holds the signing secret, once.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/webhooks", operation_id = "create_webhook", tag = "webhooks", request_body = CreateWebhook,
    params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 201, description = "Created; `secret` is shown only now.", body = WebhookWithSecret)))]
pub async fn handle_webhook_create(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiJson(body): ApiJson<CreateWebhook>,
) -> Result<(StatusCode, Json<WebhookWithSecret>)> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "manage webhooks").await?;
    check_events(&body.events)?;
    let description = body.description.unwrap_or_default();
    check_description(&description)?;
    let url = check_url(&app, t.id, &body.url).await?;
    let secret = signing::new_secret();
    let new = NewWebhook { url, description, events: body.events, secret: secret.clone() };
    let row = app.registry.create_webhook(&caller.actor, t.id, new).await?;
    Ok((StatusCode::CREATED, Json(WebhookWithSecret { secret, webhook: row.into() })))
}

/// Lists a tenant's webhooks, oldest first (viewers), without secrets.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/webhooks", operation_id = "list_webhooks", tag = "webhooks",
    params(("tenant" = String, Path, description = "Tenant name"), PageParams),
    responses((status = 200, description = "A page of webhooks.", body = WebhookList)))]
pub async fn handle_webhook_list(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> Result<Json<WebhookList>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Viewer, "list webhooks").await?;
    let limit = page.limit()?;
    let rows = app.registry.conn().await?.webhooks(t.id).await?;
    let key = |w: &WebhookRow| super::keys::creation_key(w.created_at, w.id);
    let (rows, next_cursor) = cursor::page(rows, "webhooks", key, page.cursor.as_deref(), limit)?;
    Ok(Json(WebhookList { webhooks: rows.into_iter().map(Webhook::from).collect(), next_cursor }))
}

/// One webhook (viewers).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/webhooks/{webhook}", operation_id = "get_webhook", tag = "webhooks",
    params(("tenant" = String, Path, description = "Tenant name"), ("webhook" = String, Path, description = "Webhook id")),
    responses((status = 200, description = "The webhook.", body = Webhook)))]
pub async fn handle_webhook_get(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, id)): Path<(String, String)>,
) -> Result<Json<Webhook>> {
    let (_, hook) = hook_for(&app, &caller, &tenant, &id, Role::Viewer, "read webhooks").await?;
    Ok(Json(hook.into()))
}

/// Changes a webhook's URL, events, description or state (tenant admins).
#[utoipa::path(patch, path = "/v1/tenants/{tenant}/webhooks/{webhook}", operation_id = "update_webhook", tag = "webhooks",
    request_body = UpdateWebhook,
    params(("tenant" = String, Path, description = "Tenant name"), ("webhook" = String, Path, description = "Webhook id")),
    responses((status = 200, description = "The webhook.", body = Webhook)))]
pub async fn handle_webhook_update(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, id)): Path<(String, String)>,
    ApiJson(body): ApiJson<UpdateWebhook>,
) -> Result<Json<Webhook>> {
    let (t, hook) = hook_for(&app, &caller, &tenant, &id, Role::TenantAdmin, "manage webhooks").await?;
    if let Some(events) = &body.events {
        check_events(events)?;
    }
    if let Some(d) = &body.description {
        check_description(d)?;
    }
    let url = match &body.url {
        Some(u) => Some(check_url(&app, t.id, u).await?),
        None => None,
    };
    let patch = WebhookPatch { url, description: body.description, events: body.events, enabled: body.enabled };
    let row = app.registry.update_webhook(&caller.actor, t.id, hook.id, patch).await?;
    Ok(Json(row.into()))
}

/// Deletes a webhook with its deliveries (tenant admins).
#[utoipa::path(delete, path = "/v1/tenants/{tenant}/webhooks/{webhook}", operation_id = "delete_webhook", tag = "webhooks",
    params(("tenant" = String, Path, description = "Tenant name"), ("webhook" = String, Path, description = "Webhook id")),
    responses((status = 204, description = "Deleted.")))]
pub async fn handle_webhook_delete(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, id)): Path<(String, String)>,
) -> Result<StatusCode> {
    let (t, hook) = hook_for(&app, &caller, &tenant, &id, Role::TenantAdmin, "manage webhooks").await?;
    app.registry.delete_webhook(&caller.actor, t.id, hook.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Replaces a webhook's signing secret (tenant admins); the response holds the new one,
/// once. Deliveries sent from now on are signed with it.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/webhooks/{webhook}/rotate-secret", operation_id = "rotate_webhook_secret", tag = "webhooks",
    params(("tenant" = String, Path, description = "Tenant name"), ("webhook" = String, Path, description = "Webhook id")),
    responses((status = 200, description = "The new secret, shown only now.", body = WebhookWithSecret)))]
pub async fn handle_webhook_rotate_secret(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, id)): Path<(String, String)>,
) -> Result<Json<WebhookWithSecret>> {
    let (t, hook) = hook_for(&app, &caller, &tenant, &id, Role::TenantAdmin, "manage webhooks").await?;
    let secret = signing::new_secret();
    let row = app.registry.rotate_webhook_secret(&caller.actor, t.id, hook.id, secret.clone()).await?;
    Ok(Json(WebhookWithSecret { secret, webhook: row.into() }))
}

/// Queues a `ping` event to a webhook (tenant admins), to test the receiver.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/webhooks/{webhook}/ping", operation_id = "ping_webhook", tag = "webhooks",
    params(("tenant" = String, Path, description = "Tenant name"), ("webhook" = String, Path, description = "Webhook id")),
    responses((status = 202, description = "Queued; the delivery reports how it went.", body = WebhookDelivery)))]
pub async fn handle_webhook_ping(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, id)): Path<(String, String)>,
) -> Result<(StatusCode, Json<WebhookDelivery>)> {
    let (t, hook) = hook_for(&app, &caller, &tenant, &id, Role::TenantAdmin, "manage webhooks").await?;
    let d = app.registry.ping_webhook(&caller.actor, t.id, hook.id).await?;
    app.signals.wake_webhooks();
    Ok((StatusCode::ACCEPTED, Json(one_delivery(d)?)))
}

/// A webhook's deliveries, newest first, optionally of one status (viewers).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/webhooks/{webhook}/deliveries", operation_id = "list_webhook_deliveries", tag = "webhooks",
    params(("tenant" = String, Path, description = "Tenant name"), ("webhook" = String, Path, description = "Webhook id"),
           DeliveryParams),
    responses((status = 200, description = "A page of deliveries.", body = WebhookDeliveryList)))]
pub async fn handle_delivery_list(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, id)): Path<(String, String)>,
    ApiQuery(params): ApiQuery<DeliveryParams>,
) -> Result<Json<WebhookDeliveryList>> {
    let (t, hook) = hook_for(&app, &caller, &tenant, &id, Role::Viewer, "read webhooks").await?;
    let limit = PageParams { limit: params.limit, cursor: None }.limit()?;
    let before = params.cursor.as_deref().map(|c| cursor::decode_number("deliveries", c)).transpose()?;
    let mut rows =
        app.registry.conn().await?.webhook_deliveries(t.id, hook.id, params.status, before, limit + 1).await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = if more { rows.last().map(|d| cursor::encode("deliveries", &d.seq.to_string())) } else { None };
    Ok(Json(WebhookDeliveryList { deliveries: rows.into_iter().filter_map(delivery_view).collect(), next_cursor }))
}

/// One delivery (viewers).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/webhooks/{webhook}/deliveries/{delivery}", operation_id = "get_webhook_delivery", tag = "webhooks",
    params(("tenant" = String, Path, description = "Tenant name"), ("webhook" = String, Path, description = "Webhook id"),
           ("delivery" = String, Path, description = "Delivery id")),
    responses((status = 200, description = "The delivery.", body = WebhookDelivery)))]
pub async fn handle_delivery_get(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, id, delivery)): Path<(String, String, String)>,
) -> Result<Json<WebhookDelivery>> {
    let (t, hook) = hook_for(&app, &caller, &tenant, &id, Role::Viewer, "read webhooks").await?;
    let d = app
        .registry
        .conn()
        .await?
        .webhook_delivery(t.id, hook.id, parse_id("delivery", &delivery)?)
        .await?
        .ok_or(Error::NotFound("delivery"))?;
    Ok(Json(one_delivery(d)?))
}

/// Sends a delivery's event again, as a new delivery with the same body (tenant admins).
#[utoipa::path(post, path = "/v1/tenants/{tenant}/webhooks/{webhook}/deliveries/{delivery}/replay", operation_id = "replay_webhook_delivery", tag = "webhooks",
    params(("tenant" = String, Path, description = "Tenant name"), ("webhook" = String, Path, description = "Webhook id"),
           ("delivery" = String, Path, description = "Delivery id")),
    responses((status = 202, description = "Queued: the new delivery.", body = WebhookDelivery)))]
pub async fn handle_delivery_replay(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, id, delivery)): Path<(String, String, String)>,
) -> Result<(StatusCode, Json<WebhookDelivery>)> {
    let (t, hook) = hook_for(&app, &caller, &tenant, &id, Role::TenantAdmin, "replay webhook deliveries").await?;
    let delivery = parse_id("delivery", &delivery)?;
    let d = app.registry.replay_webhook_delivery(&caller.actor, t.id, hook.id, delivery).await?;
    app.signals.wake_webhooks();
    Ok((StatusCode::ACCEPTED, Json(one_delivery(d)?)))
}

/// A tenant's webhook settings (viewers).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/webhook-settings", operation_id = "get_webhook_settings", tag = "webhooks",
    params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, description = "The settings.", body = WebhookSettings)))]
pub async fn handle_webhook_settings_get(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<Json<WebhookSettings>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Viewer, "read webhook settings").await?;
    let allowed = app.registry.conn().await?.webhooks_allow_private(t.id).await?;
    Ok(Json(WebhookSettings { allow_private_targets: allowed }))
}

/// Lets a tenant's webhooks reach private targets, or stops it (platform admins; audited).
#[utoipa::path(put, path = "/v1/tenants/{tenant}/webhook-settings", operation_id = "set_webhook_settings", tag = "webhooks",
    request_body = WebhookSettings,
    params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, description = "The settings.", body = WebhookSettings)))]
pub async fn handle_webhook_settings_set(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiJson(body): ApiJson<WebhookSettings>,
) -> Result<Json<WebhookSettings>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::PlatformAdmin, "allow private webhook targets").await?;
    app.registry.set_webhooks_allow_private(&caller.actor, t.id, body.allow_private_targets).await?;
    Ok(Json(body))
}
