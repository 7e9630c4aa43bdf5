//! A tenant's users: created, listed and disabled by tenant admins (platform admins in any
//! tenant). A user's role caps the keys they hold; disabling a user revokes their keys.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::keys::creation_key;
use super::models::PageParams;
use super::{ApiJson, ApiQuery, AppState, Caller, cursor};
use crate::error::{Error, Result};
use crate::registry::{NewUser, UserRow};
use crate::types::{Email, Role};

/// A user of a tenant.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct User {
    /// Id.
    pub id: Uuid,
    /// Email address (lower-cased), unique within the tenant.
    pub email: String,
    /// Display name.
    pub name: String,
    /// The most any key of the user may do.
    pub role: Role,
    /// Whether the user is disabled (their keys were revoked then).
    pub disabled: bool,
    /// Key that created the user.
    pub created_by: Option<Uuid>,
    /// Created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Disabled at.
    #[serde(with = "time::serde::rfc3339::option")]
    pub disabled_at: Option<OffsetDateTime>,
}

impl From<UserRow> for User {
    fn from(u: UserRow) -> Self {
        User {
            role: u.role(),
            id: u.id,
            email: u.email,
            name: u.name,
            disabled: u.disabled_at.is_some(),
            created_by: u.created_by,
            created_at: u.created_at,
            disabled_at: u.disabled_at,
        }
    }
}

/// A new user.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"email": "ada@example.com", "name": "Ada Lovelace", "role": "deployer"})))]
pub struct CreateUser {
    /// Email address, unique within the tenant (compared lower-cased).
    #[schema(value_type = String, max_length = 254, example = "ada@example.com")]
    pub email: Email,
    /// Display name, 1 to 100 characters.
    #[schema(min_length = 1, max_length = 100)]
    pub name: String,
    /// Role: the most any key of the user may do. `platform-admin` only in the platform tenant.
    pub role: Role,
}

/// A page of a tenant's users.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UserList {
    /// Users, oldest first (disabled ones included).
    pub users: Vec<User>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// A disabled user.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DisabledUser {
    /// The user.
    pub user: User,
    /// Keys revoked by this call (0 when the user was already disabled).
    pub keys_revoked: u64,
}

impl CreateUser {
    fn into_new(self, tenant_is_platform: bool) -> Result<NewUser> {
        let len = self.name.chars().count();
        if len == 0 || len > 100 {
            return Err(Error::invalid("name", "name must be 1 to 100 characters"));
        }
        if self.role == Role::PlatformAdmin && !tenant_is_platform {
            return Err(Error::invalid("role", "platform-admin users exist only in the platform tenant"));
        }
        Ok(NewUser { email: self.email, name: self.name, role: self.role })
    }
}

fn parse_user_id(id: &str) -> Result<Uuid> {
    // A malformed id names no user: not found, like any other unknown id.
    id.parse().map_err(|_| Error::NotFound("user"))
}

/// Creates a user (tenant admins). Keys are then created for the user through
/// `POST /v1/tenants/{tenant}/api-keys` with `user_id`.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/users", operation_id = "create_user", tag = "users", request_body = CreateUser,
    params(("tenant" = String, Path, description = "Tenant name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Retry-safe creation key")),
    responses(
        (status = 201, description = "Created.", body = User),
        (status = 409, description = "A user with this email exists (`already_exists`).", body = crate::error::ErrorBody)))]
pub async fn handle_user_create(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiJson(body): ApiJson<CreateUser>,
) -> Result<(StatusCode, Json<User>)> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "manage users").await?;
    let new = body.into_new(t.name == crate::app::PLATFORM_TENANT)?;
    if new.role == Role::PlatformAdmin {
        caller.principal.require(Role::PlatformAdmin, "create platform-admin users")?;
    }
    let row = app.registry.create_user(&caller.actor, t.id, new).await?;
    Ok((StatusCode::CREATED, Json(row.into())))
}

/// Lists a tenant's users, oldest first (tenant admins).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/users", operation_id = "list_users", tag = "users",
    params(("tenant" = String, Path, description = "Tenant name"), PageParams),
    responses((status = 200, description = "A page of users.", body = UserList)))]
pub async fn handle_user_list(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> Result<Json<UserList>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "list users").await?;
    let limit = page.limit()?;
    let rows = app.registry.conn().await?.users(t.id).await?;
    let key = |u: &UserRow| creation_key(u.created_at, u.id);
    let (rows, next_cursor) = cursor::page(rows, "users", key, page.cursor.as_deref(), limit)?;
    Ok(Json(UserList { users: rows.into_iter().map(User::from).collect(), next_cursor }))
}

/// One user (tenant admins).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/users/{user_id}", operation_id = "get_user", tag = "users",
    params(("tenant" = String, Path, description = "Tenant name"), ("user_id" = String, Path, description = "User id")),
    responses((status = 200, description = "The user.", body = User)))]
pub async fn handle_user_get(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, user_id)): Path<(String, String)>,
) -> Result<Json<User>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "read users").await?;
    let row = app.registry.conn().await?.user(t.id, parse_user_id(&user_id)?).await?.ok_or(Error::NotFound("user"))?;
    Ok(Json(row.into()))
}

/// Disables a user (tenant admins) and revokes all their keys at once. The user's record
/// stays (the audit trail names it); disabling twice is harmless. Access tokens already issued
/// for the user's keys are refused at once by this control plane and within 2 s by the others,
/// the workers and the gateways (through the revocation list they are sent).
#[utoipa::path(delete, path = "/v1/tenants/{tenant}/users/{user_id}", operation_id = "disable_user", tag = "users",
    params(("tenant" = String, Path, description = "Tenant name"), ("user_id" = String, Path, description = "User id")),
    responses((status = 200, description = "The disabled user and how many keys were revoked.", body = DisabledUser)))]
pub async fn handle_user_disable(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, user_id)): Path<(String, String)>,
) -> Result<Json<DisabledUser>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "disable users").await?;
    let (row, keys_revoked) = app.registry.disable_user(&caller.actor, t.id, parse_user_id(&user_id)?).await?;
    if let Some(at) = row.disabled_at {
        app.revocations.user_disabled(row.id, at);
    }
    Ok(Json(DisabledUser { user: row.into(), keys_revoked }))
}
