//! Tenants and quotas.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::models::PageParams;
use super::{ApiJson, ApiQuery, AppState, Caller, cursor};
use crate::error::{Error, Result};
use crate::registry::{QuotaLimits, QuotaUsage, TenantRow};
use crate::types::{Name, Role};

/// A tenant.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Tenant {
    /// Id.
    pub id: Uuid,
    /// Unique name, used in paths.
    pub name: String,
    /// Display name.
    pub display_name: String,
    /// Created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

impl From<TenantRow> for Tenant {
    fn from(t: TenantRow) -> Self {
        Tenant { id: t.id, name: t.name, display_name: t.display_name, created_at: t.created_at }
    }
}

/// A new tenant.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"name": "acme", "display_name": "Acme Corp"})))]
pub struct CreateTenant {
    /// Unique name: lower-case letters, digits, `-`, `_`, `.`; at most 63 characters.
    #[schema(value_type = String, pattern = "^[a-z0-9][a-z0-9_.-]{0,62}$")]
    pub name: Name,
    /// Display name (defaults to the name).
    #[serde(default)]
    #[schema(max_length = 200)]
    pub display_name: Option<String>,
    /// Quotas (defaults apply when absent).
    #[serde(default)]
    pub quotas: Option<QuotaLimits>,
}

/// A page of tenants.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantList {
    /// Tenants by name.
    pub tenants: Vec<Tenant>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// A tenant's quotas and current use.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Quotas {
    /// Limits.
    pub limits: QuotaLimits,
    /// Current use of the limits enforced by the registry.
    pub usage: QuotaUsage,
}

fn require_platform_admin(caller: &Caller, action: &'static str) -> Result<()> {
    caller.principal.require(Role::PlatformAdmin, action)
}

/// Creates a tenant (platform admins).
#[utoipa::path(post, path = "/v1/tenants", operation_id = "create_tenant", tag = "tenants", request_body = CreateTenant,
    params(("Idempotency-Key" = Option<String>, Header, description = "Retry-safe creation key")),
    responses(
        (status = 201, description = "Created.", body = Tenant),
        (status = 409, description = "The name is taken (`already_exists`).", body = crate::error::ErrorBody)))]
pub async fn handle_tenant_create(
    State(app): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateTenant>,
) -> Result<(StatusCode, Json<Tenant>)> {
    require_platform_admin(&caller, "create tenants")?;
    let display_name = body.display_name.unwrap_or_else(|| body.name.to_string());
    if display_name.chars().count() > 200 {
        return Err(Error::invalid("display_name", "display_name must be at most 200 characters"));
    }
    let quotas = body.quotas.unwrap_or_default();
    quotas.validate()?;
    let tenant = app.registry.create_tenant(&caller.actor, &body.name, &display_name, false, &quotas).await?;
    Ok((StatusCode::CREATED, Json(tenant.into())))
}

/// Lists tenants by name (platform admins).
#[utoipa::path(get, path = "/v1/tenants", operation_id = "list_tenants", tag = "tenants", params(PageParams),
    responses((status = 200, description = "A page of tenants.", body = TenantList)))]
pub async fn handle_tenant_list(
    State(app): State<AppState>,
    caller: Caller,
    ApiQuery(page): ApiQuery<PageParams>,
) -> Result<Json<TenantList>> {
    require_platform_admin(&caller, "list tenants")?;
    let limit = page.limit()?;
    let tenants = app.registry.conn().await?.tenants().await?;
    let (tenants, next_cursor) =
        cursor::page(tenants, "tenants", |t: &TenantRow| t.name.clone(), page.cursor.as_deref(), limit)?;
    Ok(Json(TenantList { tenants: tenants.into_iter().map(Tenant::from).collect(), next_cursor }))
}

/// A tenant (its own members, or platform admins).
#[utoipa::path(get, path = "/v1/tenants/{tenant}", operation_id = "get_tenant", tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, description = "The tenant.", body = Tenant)))]
pub async fn handle_tenant_get(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<Json<Tenant>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Viewer, "read the tenant").await?;
    let row = app.registry.conn().await?.tenant_by_id(t.id).await?.ok_or(Error::NotFound("tenant"))?;
    Ok(Json(row.into()))
}

/// A tenant's quotas with current use.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/quotas", operation_id = "get_quotas", tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, description = "Quotas and use.", body = Quotas)))]
pub async fn handle_quota_get(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<Json<Quotas>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Viewer, "read quotas").await?;
    let mut conn = app.registry.conn().await?;
    let limits = conn.quota(t.id).await?;
    let usage = conn.quota_usage(t.id).await?;
    Ok(Json(Quotas { limits, usage }))
}

/// Replaces a tenant's quotas (platform admins). Lowering a limit below current use is
/// allowed; creations then fail until use drops.
#[utoipa::path(put, path = "/v1/tenants/{tenant}/quotas", operation_id = "set_quotas", tag = "tenants", request_body = QuotaLimits,
    params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, description = "The new quotas and use.", body = Quotas)))]
pub async fn handle_quota_set(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiJson(limits): ApiJson<QuotaLimits>,
) -> Result<Json<Quotas>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::PlatformAdmin, "set quotas").await?;
    let limits = app.registry.set_quota(&caller.actor, t.id, &limits).await?;
    let usage = app.registry.conn().await?.quota_usage(t.id).await?;
    Ok(Json(Quotas { limits, usage }))
}
