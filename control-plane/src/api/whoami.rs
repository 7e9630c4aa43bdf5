//! `GET /v1/whoami`: who the caller is (tenant, role, key, user), for `tessera whoami` and any
//! client that wants to show or check its own identity before acting.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::{AppState, Caller};
use crate::auth::Credential;
use crate::error::Result;
use crate::types::Role;

/// How the caller authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CredentialKind {
    /// An API key (`tsk_…`).
    ApiKey,
    /// An access token from `POST /v1/auth/token`.
    Token,
    /// A console session cookie from single sign-on.
    Session,
}

/// The user an API key belongs to.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WhoAmIUser {
    /// Id.
    pub id: Uuid,
    /// Email address.
    pub email: String,
    /// Display name.
    pub name: String,
}

/// The caller.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WhoAmI {
    /// Tenant name.
    pub tenant: String,
    /// Tenant id.
    pub tenant_id: Uuid,
    /// Role: what the caller may do.
    pub role: Role,
    /// How the caller authenticated.
    pub credential: CredentialKind,
    /// The API key (for a token: the key it was exchanged for); absent for a console session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<Uuid>,
    /// The key's label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_name: Option<String>,
    /// The key's public prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// The user the key belongs to (absent for service keys).
    pub user: Option<WhoAmIUser>,
}

/// Who the caller is: tenant, role, key and user. Any authenticated caller, `inference` keys
/// included, may ask.
#[utoipa::path(get, path = "/v1/whoami", operation_id = "whoami", tag = "auth",
    responses((status = 200, description = "The caller.", body = WhoAmI)))]
pub async fn handle_whoami(State(app): State<AppState>, caller: Caller) -> Result<Json<WhoAmI>> {
    let p = &caller.principal;
    let mut conn = app.registry.conn().await?;
    // The key authenticated this request (or issued its token) a moment ago; a key revoked or
    // deleted since is reported as unauthenticated, as its next request would be.
    let key = match p.key_id {
        Some(id) => Some(conn.key(p.tenant_id, id).await?.ok_or(crate::error::Error::Unauthenticated)?),
        None => None,
    };
    let user = match p.user_id {
        Some(id) => conn.user(p.tenant_id, id).await?.map(|u| WhoAmIUser { id: u.id, email: u.email, name: u.name }),
        None => None,
    };
    let credential = match p.credential {
        Credential::ApiKey => CredentialKind::ApiKey,
        Credential::Token => CredentialKind::Token,
        Credential::Session => CredentialKind::Session,
    };
    Ok(Json(WhoAmI {
        tenant: p.tenant_name.clone(),
        tenant_id: p.tenant_id,
        role: p.role,
        credential,
        key_id: p.key_id,
        key_name: key.as_ref().map(|k| k.name.clone()),
        key_prefix: key.map(|k| k.prefix),
        user,
    }))
}
