//! Single sign-on routes: platform admins set a tenant's OpenID Connect issuer; browsers sign
//! in through it (`login` redirects to the provider, `callback` comes back and sets the
//! session cookie); the console reads its session and signs out.
//!
//! The two browser routes answer with redirects, also on failure: to the console's
//! `/?sso_error=<message>`, which shows the message on the sign-in page.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{ConnectInfo, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{Extensions, HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};

use super::{ApiJson, ApiQuery, AppState, Caller, RequestId};
use crate::app::App;
use crate::error::{Error, Result};
use crate::registry::{Actor, OidcIssuerRow, now};
use crate::sso::{self, ActiveSession, CALLBACK_PATH, Callback};
use crate::types::Role;

/// Scopes asked for when the spec names none.
const DEFAULT_SCOPES: [&str; 3] = ["openid", "email", "profile"];

/// A tenant's OpenID Connect issuer, as set by a platform admin.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({
    "issuer": "https://login.example.com",
    "client_id": "tessera",
    "client_secret": "s3cr3t",
    "scopes": ["openid", "email", "profile", "groups"],
    "email_claim": "email",
    "role_claim": "groups",
    "role_mapping": {"ml-admins": "tenant-admin", "ml-engineers": "deployer", "staff": "viewer"},
    "default_role": "viewer",
    "provision_users": true
})))]
pub struct OidcIssuerSpec {
    /// Issuer URL, exactly as the provider's discovery document names it (https; plain http
    /// only with `--oidc-allow-http-issuers`). It is fetched to check it.
    pub issuer: String,
    /// Client id registered at the provider for this tenant's console sign-ins.
    #[schema(max_length = 200)]
    pub client_id: String,
    /// Client secret (`client_secret_basic`). Required when the tenant has no issuer yet;
    /// omitted: the stored one is kept. Never returned.
    #[serde(default)]
    #[schema(max_length = 1000)]
    pub client_secret: Option<String>,
    /// Scopes to ask for; must include `openid`. Default: `openid email profile`.
    #[serde(default)]
    pub scopes: Option<Vec<String>>,
    /// Claim holding the user's email address. Default: `email`.
    #[serde(default)]
    pub email_claim: Option<String>,
    /// Claim holding the user's groups or roles (a string or a list of strings), e.g. `groups`.
    #[serde(default)]
    pub role_claim: Option<String>,
    /// Values of `role_claim` to roles; a user with several mapped values gets the strongest.
    /// Without a match, a known user keeps their stored role.
    #[serde(default)]
    pub role_mapping: BTreeMap<String, Role>,
    /// Role of a provisioned user whose groups map to none.
    #[serde(default)]
    pub default_role: Option<Role>,
    /// Whether a sign-in with an email the tenant does not know creates the user.
    #[serde(default)]
    pub provision_users: bool,
}

/// A tenant's OpenID Connect issuer (without the secret).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OidcIssuer {
    /// Issuer URL.
    pub issuer: String,
    /// Client id.
    pub client_id: String,
    /// Whether a client secret is stored (it is never shown).
    pub client_secret_set: bool,
    /// Scopes asked for.
    pub scopes: Vec<String>,
    /// Claim holding the email address.
    pub email_claim: String,
    /// Claim holding groups or roles.
    pub role_claim: Option<String>,
    /// Values of `role_claim` to roles.
    pub role_mapping: BTreeMap<String, Role>,
    /// Role of provisioned users without a mapped group.
    pub default_role: Option<Role>,
    /// Whether unknown emails create users.
    pub provision_users: bool,
    /// The redirect URI to register at the provider.
    pub redirect_uri: String,
    /// Where the console sends users to sign in: `/v1/auth/oidc/<tenant>/login`.
    pub login_url: String,
    /// Created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last changed.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl OidcIssuer {
    fn from_row(row: &OidcIssuerRow, base: &str, tenant: &str) -> Self {
        OidcIssuer {
            issuer: row.issuer.clone(),
            client_id: row.client_id.clone(),
            client_secret_set: !row.client_secret.is_empty(),
            scopes: row.scopes.split_whitespace().map(str::to_string).collect(),
            email_claim: row.email_claim.clone(),
            role_claim: row.role_claim.clone(),
            role_mapping: row.mapping().into_iter().collect(),
            default_role: row.default_role.as_deref().and_then(|r| r.parse().ok()),
            provision_users: row.provision_users,
            redirect_uri: format!("{base}{CALLBACK_PATH}"),
            login_url: format!("{base}/v1/auth/oidc/{tenant}/login"),
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

/// The signed-in console session.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ConsoleSession {
    /// Tenant name.
    pub tenant: String,
    /// The user's email.
    pub email: String,
    /// Role granted at sign-in.
    pub role: Role,
    /// Send this in `X-CSRF-Token` on every state-changing request (POST, PUT, PATCH, DELETE).
    pub csrf_token: String,
    /// Signed in at.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// The session ends then if unused until then.
    #[serde(with = "time::serde::rfc3339")]
    pub idle_expires_at: OffsetDateTime,
    /// The session ends then whatever happens.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// Where to go after signing in.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LoginParams {
    /// A console path (`/t/acme/models`); default `/`.
    pub return_to: Option<String>,
}

/// What the provider sends back.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CallbackParams {
    /// Authorization code.
    pub code: Option<String>,
    /// The state sent with the sign-in.
    pub state: Option<String>,
    /// The provider's issuer (RFC 9207).
    pub iss: Option<String>,
    /// An OAuth error code instead of a code.
    pub error: Option<String>,
    /// The error's description.
    pub error_description: Option<String>,
}

/// The session the request's cookie opened, put in the request by the authentication
/// middleware; other credentials have none (401).
pub struct SessionCaller(pub ActiveSession);

impl<S: Send + Sync> FromRequestParts<S> for SessionCaller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        match parts.extensions.get::<ActiveSession>() {
            Some(s) => Ok(SessionCaller(s.clone())),
            // Whatever the reason (no cookie, an ended session, another credential).
            None => Caller::from_request_parts(parts, state).await.and(Err(Error::Unauthenticated)),
        }
    }
}

/// This server's base URL as the browser sees it: `--public-url`, else the request's host.
fn base_url(app: &App, headers: &HeaderMap, uri: &Uri) -> String {
    if let Some(url) = &app.config.public_url {
        return url.clone();
    }
    let scheme = if app.config.tls.is_some() { "https" } else { "http" };
    let host = uri
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| headers.get(header::HOST).and_then(|h| h.to_str().ok()).map(str::to_string))
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b)))
        .unwrap_or_else(|| app.config.listen.to_string());
    format!("{scheme}://{host}")
}

fn check_len(field: &str, value: &str, max: usize) -> Result<()> {
    if value.trim().is_empty() || value.len() > max || value.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            format!("{field} must be 1 to {max} characters, without control characters"),
        ));
    }
    Ok(())
}

/// Checks a spec and turns it into the row to store (`secret`: the one to keep when the spec
/// names none).
async fn issuer_row(
    app: &App,
    tenant: &crate::registry::TenantRow,
    spec: OidcIssuerSpec,
    kept_secret: Option<String>,
) -> Result<OidcIssuerRow> {
    check_len("client_id", &spec.client_id, 200)?;
    let client_secret = match (spec.client_secret, kept_secret) {
        (Some(s), _) => s,
        (None, Some(kept)) => kept,
        (None, None) => return Err(Error::invalid("client_secret", "client_secret is required for a new issuer")),
    };
    check_len("client_secret", &client_secret, 1000)?;
    let scopes = spec.scopes.unwrap_or_else(|| DEFAULT_SCOPES.map(str::to_string).to_vec());
    if !scopes.iter().any(|s| s == "openid") {
        return Err(Error::invalid("scopes", "scopes must include openid"));
    }
    if scopes.iter().any(|s| s.is_empty() || s.len() > 100 || !s.bytes().all(|b| b.is_ascii_graphic() && b != b'"')) {
        return Err(Error::invalid("scopes", "each scope must be 1 to 100 printable characters without spaces"));
    }
    let email_claim = spec.email_claim.unwrap_or_else(|| "email".into());
    check_len("email_claim", &email_claim, 100)?;
    if let Some(claim) = &spec.role_claim {
        check_len("role_claim", claim, 100)?;
    }
    let too_strong = |r: &Role| *r == Role::PlatformAdmin && !tenant.is_platform;
    if spec.role_mapping.values().any(too_strong) || spec.default_role.as_ref().is_some_and(too_strong) {
        return Err(Error::invalid("role_mapping", "platform-admin can only be granted in the platform tenant"));
    }
    if spec.role_mapping.len() > 100 || spec.role_mapping.keys().any(|k| k.is_empty() || k.len() > 200) {
        return Err(Error::invalid("role_mapping", "at most 100 entries, each key 1 to 200 characters"));
    }
    app.sso.provider.check_url("issuer", &spec.issuer).map_err(|m| Error::invalid("issuer", m))?;
    // The issuer must answer now: a typo is better caught here than at a user's sign-in.
    app.sso.provider.discover(&spec.issuer).await.map_err(|m| Error::invalid("issuer", m))?;
    let at = now();
    Ok(OidcIssuerRow {
        tenant_id: tenant.id,
        issuer: spec.issuer,
        client_id: spec.client_id,
        client_secret,
        scopes: scopes.join(" "),
        email_claim,
        role_claim: spec.role_claim,
        role_mapping: serde_json::to_string(&spec.role_mapping).map_err(|e| Error::Internal(e.to_string()))?,
        default_role: spec.default_role.map(|r| r.as_str().to_string()),
        provision_users: spec.provision_users,
        created_at: at,
        updated_at: at,
    })
}

/// A tenant's OpenID Connect issuer, without its secret (tenant admins).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/oidc-issuer", operation_id = "get_oidc_issuer", tag = "auth",
    params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, description = "The issuer.", body = OidcIssuer)))]
pub async fn handle_oidc_issuer_get(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Json<OidcIssuer>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "read the sign-on settings").await?;
    let row = app.registry.conn().await?.oidc_issuer(t.id).await?.ok_or(Error::NotFound("oidc issuer"))?;
    Ok(Json(OidcIssuer::from_row(&row, &base_url(&app, &headers, &uri), &t.name)))
}

/// Sets a tenant's OpenID Connect issuer for console sign-in (platform admins; audited
/// without the secret). The issuer's discovery document is fetched to check it.
#[utoipa::path(put, path = "/v1/tenants/{tenant}/oidc-issuer", operation_id = "set_oidc_issuer", tag = "auth",
    request_body = OidcIssuerSpec,
    params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, description = "The issuer.", body = OidcIssuer)))]
pub async fn handle_oidc_issuer_set(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    ApiJson(spec): ApiJson<OidcIssuerSpec>,
) -> Result<Json<OidcIssuer>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::PlatformAdmin, "configure single sign-on").await?;
    let mut conn = app.registry.conn().await?;
    let tenant_row = conn.tenant_by_id(t.id).await?.ok_or(Error::NotFound("tenant"))?;
    let kept_secret = conn.oidc_issuer(t.id).await?.map(|i| i.client_secret);
    drop(conn);
    let row = issuer_row(&app, &tenant_row, spec, kept_secret).await?;
    let row = app.registry.set_oidc_issuer(&caller.actor, row).await?;
    Ok(Json(OidcIssuer::from_row(&row, &base_url(&app, &headers, &uri), &t.name)))
}

/// Removes a tenant's OpenID Connect issuer (platform admins; audited). Open sessions run on
/// until they end.
#[utoipa::path(delete, path = "/v1/tenants/{tenant}/oidc-issuer", operation_id = "delete_oidc_issuer", tag = "auth",
    params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 204, description = "Removed.")))]
pub async fn handle_oidc_issuer_delete(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<StatusCode> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::PlatformAdmin, "configure single sign-on").await?;
    app.registry.delete_oidc_issuer(&caller.actor, t.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A redirect (303) to `location`, setting `cookies`.
fn see_other(location: &str, cookies: &[String]) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(location) {
        headers.insert(header::LOCATION, v);
    }
    for v in cookies.iter().filter_map(|c| HeaderValue::from_str(c).ok()) {
        headers.append(header::SET_COOKIE, v);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Back to the console's sign-in page with the reason a sign-in failed.
fn failed(error: &Error) -> Response {
    let message = error.body().error.message;
    let query: String =
        url::form_urlencoded::Serializer::new(String::new()).append_pair("sso_error", &message).finish();
    see_other(&format!("/?{query}"), &[])
}

/// Starts a console sign-in to the tenant: redirects the browser to the tenant's OpenID
/// provider. Failures redirect to `/?sso_error=<message>`.
#[utoipa::path(get, path = "/v1/auth/oidc/{tenant}/login", operation_id = "start_oidc_login", tag = "auth",
    security(()),
    params(("tenant" = String, Path, description = "Tenant name"), LoginParams),
    responses((status = 303, description = "To the provider's sign-in page (or back to the console with `sso_error`).")))]
pub async fn handle_oidc_login(
    State(app): State<AppState>,
    Path(tenant): Path<String>,
    ApiQuery(params): ApiQuery<LoginParams>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let started = async {
        // An unknown tenant reads like one without sign-on: no existence leak.
        let not_set_up = || Error::SignIn(format!("single sign-on is not set up for tenant '{tenant}'"));
        if crate::types::Name::parse(&tenant).is_err() {
            return Err(not_set_up());
        }
        let row = app.registry.conn().await?.tenant_by_name(&tenant).await?.ok_or_else(not_set_up)?;
        let redirect_uri = format!("{}{CALLBACK_PATH}", base_url(&app, &headers, &uri));
        app.sso.begin(&app.registry, &row, &redirect_uri, params.return_to.as_deref()).await
    };
    match started.await {
        Ok(location) => see_other(&location, &[]),
        Err(e) => {
            tracing::warn!(tenant = %tenant, error = %e, "sign-in not started");
            failed(&e)
        }
    }
}

/// Where the OpenID provider sends the browser back: checks the sign-in, opens a console
/// session (an HttpOnly, Secure, SameSite cookie) and redirects to the console. Failures
/// redirect to `/?sso_error=<message>`.
#[utoipa::path(get, path = "/v1/auth/oidc/callback", operation_id = "finish_oidc_login", tag = "auth",
    security(()),
    params(CallbackParams),
    responses((status = 303, description = "Signed in: to the console, with the session cookie set (or back with `sso_error`).")))]
pub async fn handle_oidc_callback(
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<CallbackParams>,
    extensions: Extensions,
) -> Response {
    let actor = Actor {
        key_id: None,
        user_id: None,
        request_id: extensions.get::<RequestId>().map(|r| r.0.clone()).unwrap_or_default(),
        client_addr: extensions.get::<ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.to_string()),
    };
    let callback = Callback {
        code: params.code,
        state: params.state,
        iss: params.iss,
        error: params.error,
        error_description: params.error_description,
    };
    match app.sso.finish(&app.registry, actor, callback).await {
        Ok(signed_in) => {
            tracing::info!(tenant = %signed_in.tenant_name, email = %signed_in.email, "signed in");
            let cookies = sso::session_cookies(&signed_in.token, app.sso.limits.max_age);
            see_other(&signed_in.return_to, &cookies)
        }
        Err(e) => {
            tracing::warn!(error = %e, "sign-in refused");
            failed(&e)
        }
    }
}

/// The console session of the request's cookie: who is signed in, until when, and the CSRF
/// token to send with state-changing requests. 401 (with the reason) once it has ended.
#[utoipa::path(get, path = "/v1/auth/session", operation_id = "get_console_session", tag = "auth",
    security(("session" = [])),
    responses((status = 200, description = "The session.", body = ConsoleSession)))]
pub async fn handle_session_get(SessionCaller(s): SessionCaller) -> Json<ConsoleSession> {
    Json(ConsoleSession {
        tenant: s.principal.tenant_name.clone(),
        email: s.email,
        role: s.principal.role,
        csrf_token: s.csrf_token,
        created_at: s.created_at,
        idle_expires_at: s.idle_expires_at,
        expires_at: s.expires_at,
    })
}

/// Signs out: revokes the console session and clears its cookie (needs `X-CSRF-Token`).
/// Without an open session it only clears the cookie.
#[utoipa::path(post, path = "/v1/auth/logout", operation_id = "logout", tag = "auth",
    security(("session" = [])),
    responses((status = 204, description = "Signed out; the cookie is cleared.")))]
pub async fn handle_logout(State(app): State<AppState>, mut parts: Parts) -> Result<Response> {
    let session = parts.extensions.get::<ActiveSession>().cloned();
    if let Some(s) = session
        && let Some(id) = s.principal.session_id
    {
        let caller = Caller::from_request_parts(&mut parts, &()).await?;
        app.registry.revoke_console_session(&caller.actor, s.principal.tenant_id, id).await?;
        tracing::info!(tenant = %s.principal.tenant_name, email = %s.email, "signed out");
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    for v in sso::cleared_cookies().iter().filter_map(|c| HeaderValue::from_str(c).ok()) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    Ok(response)
}
