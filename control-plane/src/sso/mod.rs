//! Single sign-on for console users: OpenID Connect's authorization code flow with PKCE
//! against the tenant's configured issuer, and the server-side console sessions it opens.
//!
//! A sign-in is two browser requests. [`Sso::begin`] stores a fresh `state` (hashed), `nonce`
//! and PKCE verifier in the registry and sends the browser to the provider; [`Sso::finish`]
//! takes that record back exactly once by `state`, trades the code for an ID token, checks the
//! token, finds (or provisions) the user by email in the tenant, and opens a session. The
//! session cookie holds a random token stored only as its hash; each session also has a CSRF
//! token the console echoes in `X-CSRF-Token` on state-changing requests. Everything lives in
//! the registry, so any replica serves any step.

pub mod id_token;
pub mod provider;

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::auth::{Credential, Principal};
use crate::error::{Error, Result};
use crate::registry::{Actor, NewConsoleSession, OidcIssuerRow, OidcLoginRow, Registry, TenantRow, now};
use crate::types::Role;
use provider::ProviderClient;

/// Name of the session cookie.
pub const SESSION_COOKIE: &str = "tessera_session";
/// Header carrying the session's CSRF token on state-changing requests.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// Path of the callback the provider redirects to.
pub const CALLBACK_PATH: &str = "/v1/auth/oidc/callback";
/// How long a user has at the provider between being sent there and coming back.
const LOGIN_TTL: time::Duration = time::Duration::minutes(10);
/// Longest console path a sign-in returns to.
const MAX_RETURN_TO: usize = 512;

/// Session lifetimes.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// A session unused this long ends.
    pub idle_timeout: Duration,
    /// A session ends this long after sign-in, used or not.
    pub max_age: Duration,
}

/// What the provider sends back to the callback.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Callback {
    /// The authorization code.
    pub code: Option<String>,
    /// The state we sent.
    pub state: Option<String>,
    /// The issuer (RFC 9207), when the provider says it.
    pub iss: Option<String>,
    /// An error code instead of a code.
    pub error: Option<String>,
    /// The error's description.
    pub error_description: Option<String>,
}

/// A finished sign-in.
#[derive(Debug)]
pub struct SignedIn {
    /// The session cookie's value.
    pub token: String,
    /// Console path to go to.
    pub return_to: String,
    /// The tenant signed in to.
    pub tenant_name: String,
    /// The user's email.
    pub email: String,
}

/// An open session, resolved from its cookie.
#[derive(Debug, Clone)]
pub struct ActiveSession {
    /// The caller it stands for.
    pub principal: Principal,
    /// The token state-changing requests must echo.
    pub csrf_token: String,
    /// The user's email.
    pub email: String,
    /// Signed in at.
    pub created_at: time::OffsetDateTime,
    /// Absolute end.
    pub expires_at: time::OffsetDateTime,
    /// End if unused from now.
    pub idle_expires_at: time::OffsetDateTime,
}

/// Single sign-on: the provider client and the session limits.
pub struct Sso {
    /// Discovery, keys and code exchange.
    pub provider: ProviderClient,
    /// Session lifetimes.
    pub limits: SessionLimits,
}

/// 32 random bytes, base64url.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// sha256 of `s`, hex.
pub fn hash(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// The PKCE S256 challenge of a verifier (RFC 7636 §4.2).
pub fn pkce_challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// A console path to return to: absolute paths on this server only (no `//host`, no
/// backslashes, no scheme), else `/`.
pub fn safe_return_to(path: Option<&str>) -> String {
    match path {
        Some(p)
            if p.starts_with('/')
                && !p.starts_with("//")
                && !p.contains('\\')
                && p.len() <= MAX_RETURN_TO
                && !p.chars().any(char::is_control) =>
        {
            p.to_string()
        }
        _ => "/".to_string(),
    }
}

/// Whether two secrets are equal, in time independent of where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn fail(message: impl Into<String>) -> Error {
    Error::SignIn(message.into())
}

impl Sso {
    /// Starts a sign-in to `tenant`: records it and returns the provider URL to send the
    /// browser to.
    pub async fn begin(
        &self,
        registry: &Registry,
        tenant: &TenantRow,
        redirect_uri: &str,
        return_to: Option<&str>,
    ) -> Result<String> {
        let not_set_up = || fail(format!("single sign-on is not set up for tenant '{}'", tenant.name));
        let issuer = registry.conn().await?.oidc_issuer(tenant.id).await?.ok_or_else(not_set_up)?;
        let discovery = self.provider.discover(&issuer.issuer).await.map_err(|e| fail(format!("the provider: {e}")))?;
        let (state, nonce, code_verifier) = (random_token(), random_token(), random_token());
        let created_at = now();
        let login = OidcLoginRow {
            state_hash: hash(&state),
            tenant_id: tenant.id,
            nonce: nonce.clone(),
            code_verifier: code_verifier.clone(),
            redirect_uri: redirect_uri.to_string(),
            return_to: safe_return_to(return_to),
            created_at,
            expires_at: created_at + LOGIN_TTL,
            used_at: None,
        };
        registry.conn().await?.insert_oidc_login(&login).await?;
        let mut url = url::Url::parse(&discovery.authorization_endpoint)
            .map_err(|e| fail(format!("the provider's authorization_endpoint: {e}")))?;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &issuer.client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("scope", &issuer.scopes)
            .append_pair("state", &state)
            .append_pair("nonce", &nonce)
            .append_pair("code_challenge", &pkce_challenge(&code_verifier))
            .append_pair("code_challenge_method", "S256");
        Ok(url.into())
    }

    /// Finishes a sign-in from the provider's callback: the session to set, or why not.
    pub async fn finish(&self, registry: &Registry, actor: Actor, cb: Callback) -> Result<SignedIn> {
        let state = cb.state.as_deref().filter(|s| !s.is_empty()).ok_or_else(|| fail("the callback has no state"))?;
        // Taken first, even when the provider reports an error: a state is good once.
        let login = registry.conn().await?.take_oidc_login(&hash(state)).await?.ok_or_else(|| {
            fail("this sign-in link was already used or is unknown (a replayed callback?); start again")
        })?;
        if let Some(error) = &cb.error {
            let detail = cb.error_description.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
            return Err(fail(format!("the provider refused ({error}{detail})")));
        }
        if now() > login.expires_at {
            return Err(fail("the sign-in took longer than 10 minutes; start again"));
        }
        let code = cb.code.as_deref().filter(|c| !c.is_empty()).ok_or_else(|| fail("the callback has no code"))?;
        let mut conn = registry.conn().await?;
        let tenant = conn.tenant_by_id(login.tenant_id).await?.ok_or_else(|| fail("the tenant no longer exists"))?;
        let issuer = conn
            .oidc_issuer(tenant.id)
            .await?
            .ok_or_else(|| fail(format!("single sign-on is no longer set up for tenant '{}'", tenant.name)))?;
        drop(conn);
        if cb.iss.as_deref().is_some_and(|iss| iss != issuer.issuer) {
            return Err(fail("the callback comes from another issuer than the tenant's"));
        }
        let claims = self.verified_claims(&issuer, &login, code).await?;
        let email = id_token::email(&claims, &issuer.email_claim).map_err(fail)?;
        let (user_id, role) = self.user_for(registry, &actor, &tenant, &issuer, &claims, &email).await?;
        let token = random_token();
        let session = NewConsoleSession {
            token_hash: hash(&token),
            csrf_token: random_token(),
            tenant_id: tenant.id,
            user_id,
            role,
            expires_at: now() + time::Duration::try_from(self.limits.max_age).unwrap_or(time::Duration::days(365)),
        };
        let actor = Actor { user_id: Some(user_id), ..actor };
        registry.open_console_session(&actor, session).await?;
        Ok(SignedIn { token, return_to: login.return_to, tenant_name: tenant.name, email: email.to_string() })
    }

    /// Trades the code and checks the ID token it brings.
    async fn verified_claims(
        &self,
        issuer: &OidcIssuerRow,
        login: &OidcLoginRow,
        code: &str,
    ) -> Result<serde_json::Map<String, serde_json::Value>> {
        let discovery = self.provider.discover(&issuer.issuer).await.map_err(|e| fail(format!("the provider: {e}")))?;
        let id_token = self
            .provider
            .exchange_code(
                &discovery.token_endpoint,
                &issuer.client_id,
                &issuer.client_secret,
                code,
                &login.code_verifier,
                &login.redirect_uri,
            )
            .await
            .map_err(fail)?;
        let kid = id_token::key_id(&id_token).map_err(fail)?;
        let keys = self.provider.keys(&discovery.jwks_uri, kid.as_deref()).await.map_err(fail)?;
        id_token::verify(&id_token, &keys, &issuer.issuer, &issuer.client_id, &login.nonce).map_err(fail)
    }

    /// The user the email names in the tenant (provisioned when allowed) and the session's
    /// role: the mapped role, else the user's stored one.
    async fn user_for(
        &self,
        registry: &Registry,
        actor: &Actor,
        tenant: &TenantRow,
        issuer: &OidcIssuerRow,
        claims: &serde_json::Map<String, serde_json::Value>,
        email: &crate::types::Email,
    ) -> Result<(Uuid, Role)> {
        let mapped = id_token::mapped_role(claims, issuer).map(|r| cap_role(r, tenant));
        let existing = registry.conn().await?.user_by_email(tenant.id, &email.to_string()).await?;
        let (user_id, role) = match existing {
            Some(user) if user.disabled_at.is_some() => {
                return Err(fail(format!("user {email} is disabled in tenant '{}'", tenant.name)));
            }
            Some(user) => (user.id, mapped.unwrap_or_else(|| user.role())),
            None if issuer.provision_users => {
                let role = mapped
                    .or_else(|| issuer.default_role.as_deref().and_then(|r| r.parse().ok()))
                    .map(|r| cap_role(r, tenant))
                    .ok_or_else(|| {
                        fail(format!(
                            "no role for {email}: none of their groups is mapped and there is no default role"
                        ))
                    })?;
                let name = id_token::display_name(claims, email);
                let user = registry.provision_user(actor, tenant.id, &email.to_string(), &name, role).await?;
                if user.disabled_at.is_some() {
                    return Err(fail(format!("user {email} is disabled in tenant '{}'", tenant.name)));
                }
                (user.id, role)
            }
            None => {
                return Err(fail(format!(
                    "there is no user {email} in tenant '{}'; ask a tenant admin to add you",
                    tenant.name
                )));
            }
        };
        if !role.allows(Role::Viewer) {
            return Err(fail(format!("the role '{role}' of {email} may not use the console")));
        }
        Ok((user_id, role))
    }

    /// The session a cookie token names, if it is still open; records its use.
    pub async fn resolve(&self, registry: &Registry, token: &str) -> Result<ActiveSession> {
        let mut conn = registry.conn().await?;
        let row = conn.console_session(&hash(token)).await?.ok_or(Error::Unauthenticated)?;
        let at = now();
        let idle = time::Duration::try_from(self.limits.idle_timeout).unwrap_or(time::Duration::MAX);
        if row.revoked_at.is_some() {
            return Err(Error::SessionEnded("the console session was signed out"));
        }
        if row.user_disabled_at.is_some() {
            return Err(Error::SessionEnded("the console session ended: the user was disabled"));
        }
        if at >= row.expires_at {
            return Err(Error::SessionEnded("the console session reached its maximum age"));
        }
        if at - row.last_seen_at > idle {
            return Err(Error::SessionEnded("the console session expired after a time without use"));
        }
        // Record use often enough for the idle timeout, not on every request.
        if at - row.last_seen_at > (idle / 10_i32).min(time::Duration::minutes(1)) {
            conn.touch_console_session(row.id, at).await?;
        }
        let principal = Principal {
            tenant_id: row.tenant_id,
            tenant_name: row.tenant_name.clone(),
            key_id: None,
            user_id: Some(row.user_id),
            role: row.role(),
            credential: Credential::Session,
            session_id: Some(row.id),
        };
        Ok(ActiveSession {
            principal,
            csrf_token: row.csrf_token,
            email: row.email,
            created_at: row.created_at,
            expires_at: row.expires_at,
            idle_expires_at: at.checked_add(idle).map_or(row.expires_at, |t| t.min(row.expires_at)),
        })
    }
}

/// No mapping grants more than tenant admin outside the platform tenant.
fn cap_role(role: Role, tenant: &TenantRow) -> Role {
    if tenant.is_platform { role } else { role.min(Role::TenantAdmin) }
}

/// Name of the session cookie's companion, readable by the console's script: it holds no
/// secret, only says that a session cookie may be there (so API-key users are not asked).
pub const HINT_COOKIE: &str = "tessera_sso";

/// The `Set-Cookie` values that store a session for `max_age`: the HttpOnly session cookie and
/// its hint.
pub fn session_cookies(token: &str, max_age: Duration) -> [String; 2] {
    let age = max_age.as_secs();
    [
        format!("{SESSION_COOKIE}={token}; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age={age}"),
        format!("{HINT_COOKIE}=1; Path=/; Secure; SameSite=Lax; Max-Age={age}"),
    ]
}

/// The `Set-Cookie` values that remove both cookies.
pub fn cleared_cookies() -> [String; 2] {
    [
        format!("{SESSION_COOKIE}=; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age=0"),
        format!("{HINT_COOKIE}=; Path=/; Secure; SameSite=Lax; Max-Age=0"),
    ]
}

/// The session token in a request's `Cookie` headers, if any.
pub fn session_token(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == SESSION_COOKIE && !value.is_empty())
        .map(|(_, value)| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_paths_stay_on_this_server() {
        assert_eq!(safe_return_to(Some("/t/demo/models")), "/t/demo/models");
        assert_eq!(safe_return_to(Some("//evil.example.com/x")), "/");
        assert_eq!(safe_return_to(Some("https://evil.example.com")), "/");
        assert_eq!(safe_return_to(Some("/\\evil.example.com")), "/");
        assert_eq!(safe_return_to(None), "/");
    }

    #[test]
    fn pkce_challenge_matches_rfc_7636() {
        // Appendix B of RFC 7636.
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = http::HeaderMap::new();
        headers.append(http::header::COOKIE, "a=1; tessera_session=abc; b=2".parse().unwrap());
        assert_eq!(session_token(&headers).as_deref(), Some("abc"));
        let mut none = http::HeaderMap::new();
        none.append(http::header::COOKIE, "tessera_session=".parse().unwrap());
        assert_eq!(session_token(&none), None);
        let [cookie, hint] = session_cookies("t", Duration::from_secs(60));
        assert!(hint.starts_with("tessera_sso=1;") && !hint.contains("HttpOnly"), "{hint}");
        for part in ["HttpOnly", "Secure", "SameSite=Lax", "Max-Age=60", "Path=/"] {
            assert!(cookie.contains(part), "{cookie}");
        }
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
    }

    #[test]
    fn roles_are_capped_outside_the_platform() {
        let at = time::OffsetDateTime::UNIX_EPOCH;
        let mut t = TenantRow {
            id: Uuid::nil(),
            name: "acme".into(),
            display_name: "Acme".into(),
            is_platform: false,
            created_at: at,
            updated_at: at,
        };
        assert_eq!(cap_role(Role::PlatformAdmin, &t), Role::TenantAdmin);
        assert_eq!(cap_role(Role::Viewer, &t), Role::Viewer);
        t.is_platform = true;
        assert_eq!(cap_role(Role::PlatformAdmin, &t), Role::PlatformAdmin);
    }
}
