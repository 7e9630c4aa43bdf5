//! A tenant's API keys: shown once at creation, then only by prefix.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::models::PageParams;
use super::{ApiJson, ApiQuery, AppState, Caller, cursor};
use crate::auth::keys;
use crate::error::{Error, Result};
use crate::registry::{ApiKeyRow, NewApiKey, now};
use crate::types::Role;

/// An API key, without its secret.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApiKey {
    /// Id.
    pub id: Uuid,
    /// Public prefix: the start of the key, enough to recognise it.
    pub prefix: String,
    /// Label.
    pub name: String,
    /// Role.
    pub role: Role,
    /// The user the key belongs to (absent for service keys).
    pub user_id: Option<Uuid>,
    /// Key that created it.
    pub created_by: Option<Uuid>,
    /// Created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Stops working at.
    #[serde(with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
    /// Revoked at.
    #[serde(with = "time::serde::rfc3339::option")]
    pub revoked_at: Option<OffsetDateTime>,
    /// Last used (to the minute).
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_used_at: Option<OffsetDateTime>,
    /// The key's own limits at the gateways.
    pub limits: KeyLimits,
}

/// An API key's own limits at the gateways, applied beside its tenant's quotas
/// (`requests_per_second`, `concurrent_requests`): a request must pass both. 0 = only the
/// tenant's limit. Like the tenant's, each of N gateways enforces 1/N of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KeyLimits {
    /// Most inference requests per second with this key; 0 = no limit of its own.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1_000_000_000)]
    pub requests_per_second: i64,
    /// Most inference requests in flight at once with this key; 0 = no limit of its own.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1_000_000_000)]
    pub concurrent_requests: i64,
}

impl KeyLimits {
    /// Largest limit accepted.
    const MAX: i64 = 1_000_000_000;

    fn validate(&self, field: &str) -> Result<(i64, i64)> {
        for (name, v) in
            [("requests_per_second", self.requests_per_second), ("concurrent_requests", self.concurrent_requests)]
        {
            if !(0..=Self::MAX).contains(&v) {
                return Err(Error::invalid(
                    format!("{field}.{name}"),
                    format!("{field}.{name} must be 0 (no limit of its own) to {}", Self::MAX),
                ));
            }
        }
        Ok((self.requests_per_second, self.concurrent_requests))
    }
}

/// A change to a key: its limits (the only thing about a key that changes; rotate a key by
/// creating a new one and revoking the old).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"limits": {"requests_per_second": 50, "concurrent_requests": 8}})))]
pub struct UpdateApiKey {
    /// The key's new limits.
    pub limits: KeyLimits,
}

impl From<ApiKeyRow> for ApiKey {
    fn from(k: ApiKeyRow) -> Self {
        ApiKey {
            role: k.role(),
            id: k.id,
            prefix: k.prefix,
            name: k.name,
            user_id: k.user_id,
            created_by: k.created_by,
            created_at: k.created_at,
            expires_at: k.expires_at,
            revoked_at: k.revoked_at,
            last_used_at: k.last_used_at,
            limits: KeyLimits {
                requests_per_second: k.max_requests_per_second,
                concurrent_requests: k.max_concurrent_requests,
            },
        }
    }
}

/// A new key.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"name": "ci-pipeline", "role": "deployer", "expires_at": "2027-06-30T00:00:00Z"})))]
pub struct CreateApiKey {
    /// Label, 1 to 100 characters.
    #[schema(min_length = 1, max_length = 100)]
    pub name: String,
    /// Role. `platform-admin` only in the platform tenant; for a user's key, at most the
    /// user's role.
    pub role: Role,
    /// The user of this tenant the key belongs to; disabling the user revokes it. Absent: a
    /// service key, owned by no user.
    #[serde(default)]
    pub user_id: Option<Uuid>,
    /// Expiry (RFC 3339); must be in the future, and before 9999-12-31T23:59:59Z. Absent:
    /// never expires.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
    /// The key's own limits at the gateways. Absent: only the tenant's.
    #[serde(default)]
    pub limits: Option<KeyLimits>,
}

/// A created key: the only time its secret is shown.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedApiKey {
    /// The secret key (`tsk_…`): store it now, it is not shown again.
    pub key: String,
    /// The key's record.
    pub api_key: ApiKey,
}

/// A page of a tenant's keys.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyList {
    /// Keys, oldest first (revoked and expired ones included).
    pub api_keys: Vec<ApiKey>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// Where a key or user sits in an oldest-first list: creation time, then id.
pub(super) fn creation_key(created_at: OffsetDateTime, id: Uuid) -> String {
    format!("{:024}.{id}", created_at.unix_timestamp_nanos())
}

fn parse_key_id(id: &str) -> Result<Uuid> {
    // A malformed id names no key: not found, like any other unknown id.
    id.parse().map_err(|_| Error::NotFound("api key"))
}

impl CreateApiKey {
    fn validate(&self, tenant_is_platform: bool) -> Result<()> {
        let len = self.name.chars().count();
        if len == 0 || len > 100 {
            return Err(Error::invalid("name", "name must be 1 to 100 characters"));
        }
        if self.role == Role::PlatformAdmin && !tenant_is_platform {
            return Err(Error::invalid("role", "platform-admin keys exist only in the platform tenant"));
        }
        if let Some(t) = self.expires_at {
            if t <= now() {
                return Err(Error::invalid("expires_at", "expires_at must be in the future"));
            }
            crate::types::check_time("expires_at", t)?;
        }
        self.limits.unwrap_or_default().validate("limits")?;
        Ok(())
    }
}

/// Creates a key (tenant admins). The response holds the secret, once.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/api-keys", operation_id = "create_api_key", tag = "api-keys", request_body = CreateApiKey,
    params(("tenant" = String, Path, description = "Tenant name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Retry-safe creation key")),
    responses(
        (status = 201, description = "Created; `key` is shown only now.", body = CreatedApiKey),
        (status = 409, description = "The user is disabled (`user_disabled`).", body = crate::error::ErrorBody)))]
pub async fn handle_key_create(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiJson(body): ApiJson<CreateApiKey>,
) -> Result<(StatusCode, Json<CreatedApiKey>)> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "manage API keys").await?;
    body.validate(t.name == crate::app::PLATFORM_TENANT)?;
    if body.role == Role::PlatformAdmin {
        caller.principal.require(Role::PlatformAdmin, "create platform-admin keys")?;
    }
    let generated = keys::generate();
    let new = NewApiKey {
        prefix: generated.prefix.clone(),
        secret_hash: app.auth.hasher().hash(&generated.key),
        name: body.name,
        role: body.role,
        user_id: body.user_id,
        expires_at: body.expires_at,
        limits: body.limits.unwrap_or_default().validate("limits")?,
    };
    let row = app.registry.create_key(&caller.actor, t.id, new).await?;
    Ok((StatusCode::CREATED, Json(CreatedApiKey { key: generated.key, api_key: row.into() })))
}

/// Lists a tenant's keys, oldest first (tenant admins), without secrets.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/api-keys", operation_id = "list_api_keys", tag = "api-keys",
    params(("tenant" = String, Path, description = "Tenant name"), PageParams),
    responses((status = 200, description = "A page of keys.", body = ApiKeyList)))]
pub async fn handle_key_list(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> Result<Json<ApiKeyList>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "list API keys").await?;
    let limit = page.limit()?;
    let rows = app.registry.conn().await?.keys(t.id).await?;
    let key = |k: &ApiKeyRow| creation_key(k.created_at, k.id);
    let (rows, next_cursor) = cursor::page(rows, "api-keys", key, page.cursor.as_deref(), limit)?;
    Ok(Json(ApiKeyList { api_keys: rows.into_iter().map(ApiKey::from).collect(), next_cursor }))
}

/// One key (tenant admins).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/api-keys/{key_id}", operation_id = "get_api_key", tag = "api-keys",
    params(("tenant" = String, Path, description = "Tenant name"), ("key_id" = String, Path, description = "Key id")),
    responses((status = 200, description = "The key.", body = ApiKey)))]
pub async fn handle_key_get(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, key_id)): Path<(String, String)>,
) -> Result<Json<ApiKey>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "read API keys").await?;
    let row = app.registry.conn().await?.key(t.id, parse_key_id(&key_id)?).await?.ok_or(Error::NotFound("api key"))?;
    Ok(Json(row.into()))
}

/// Changes a key's own limits (tenant admins). Gateways apply them within about a second.
#[utoipa::path(patch, path = "/v1/tenants/{tenant}/api-keys/{key_id}", operation_id = "update_api_key", tag = "api-keys",
    request_body = UpdateApiKey,
    params(("tenant" = String, Path, description = "Tenant name"), ("key_id" = String, Path, description = "Key id")),
    responses((status = 200, description = "The key.", body = ApiKey)))]
pub async fn handle_key_update(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, key_id)): Path<(String, String)>,
    ApiJson(body): ApiJson<UpdateApiKey>,
) -> Result<Json<ApiKey>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "change API keys").await?;
    let limits = body.limits.validate("limits")?;
    let row = app.registry.set_key_limits(&caller.actor, t.id, parse_key_id(&key_id)?, limits).await?;
    Ok(Json(row.into()))
}

/// Revokes a key (tenant admins); it stops working at once. Access tokens already issued for
/// it are refused at once by this control plane and within 2 s by the others, the workers and
/// the gateways (through the revocation list they are sent).
#[utoipa::path(delete, path = "/v1/tenants/{tenant}/api-keys/{key_id}", operation_id = "revoke_api_key", tag = "api-keys",
    params(("tenant" = String, Path, description = "Tenant name"), ("key_id" = String, Path, description = "Key id")),
    responses((status = 200, description = "The revoked key.", body = ApiKey)))]
pub async fn handle_key_revoke(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, key_id)): Path<(String, String)>,
) -> Result<Json<ApiKey>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "revoke API keys").await?;
    let row = app.registry.revoke_key(&caller.actor, t.id, parse_key_id(&key_id)?).await?;
    if let Some(at) = row.revoked_at {
        app.revocations.key_revoked(row.id, at);
    }
    Ok(Json(row.into()))
}
