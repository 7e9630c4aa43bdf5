//! Single sign-on: a tenant's OpenID Connect issuer, the sign-ins in flight between the redirect
//! to the provider and its callback, and the console sessions they open. All of it lives here,
//! not in process memory, so any control-plane replica can finish a sign-in another started
//! and serve a session another opened.

use serde_json::json;
use sqlx::FromRow;
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{Actor, NewAuditEvent};
use super::users::UserRow;
use super::{Conn, Registry, exec, now, on_conn};
use crate::error::{Error, Result};
use crate::types::Role;

/// A tenant's OpenID Connect issuer.
#[derive(Debug, Clone, FromRow)]
pub struct OidcIssuerRow {
    /// The tenant.
    pub tenant_id: Uuid,
    /// Issuer URL (`iss` of its ID tokens; discovery lives under it).
    pub issuer: String,
    /// Client id registered at the provider (the ID tokens' audience).
    pub client_id: String,
    /// Client secret; never returned by the API.
    pub client_secret: String,
    /// Scopes asked for, space-separated.
    pub scopes: String,
    /// Claim holding the user's email address.
    pub email_claim: String,
    /// Claim holding the user's groups or role, if roles come from the provider.
    pub role_claim: Option<String>,
    /// JSON object from a value of `role_claim` to a role name.
    pub role_mapping: String,
    /// Role of users provisioned when no mapping matches.
    pub default_role: Option<String>,
    /// Whether a sign-in with an unknown email creates the user.
    pub provision_users: bool,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Last changed.
    pub updated_at: OffsetDateTime,
}

impl OidcIssuerRow {
    /// The role mapping, value to role; entries that do not parse are left out.
    pub fn mapping(&self) -> Vec<(String, Role)> {
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&self.role_mapping).unwrap_or_default();
        map.into_iter().filter_map(|(k, v)| Some((k, v.as_str()?.parse().ok()?))).collect()
    }

    /// What the audit trail records (never the secret).
    fn summary(&self) -> serde_json::Value {
        let mapping: serde_json::Value = serde_json::from_str(&self.role_mapping).unwrap_or_default();
        json!({
            "issuer": self.issuer, "client_id": self.client_id, "scopes": self.scopes,
            "email_claim": self.email_claim, "role_claim": self.role_claim, "role_mapping": mapping,
            "default_role": self.default_role, "provision_users": self.provision_users,
        })
    }
}

/// A sign-in in flight.
#[derive(Debug, Clone, FromRow)]
pub struct OidcLoginRow {
    /// sha256 (hex) of the `state` sent to the provider.
    pub state_hash: String,
    /// The tenant signing in.
    pub tenant_id: Uuid,
    /// The `nonce` the ID token must carry.
    pub nonce: String,
    /// The PKCE verifier, sent with the code.
    pub code_verifier: String,
    /// The redirect URI the provider was given (the code exchange repeats it).
    pub redirect_uri: String,
    /// Console path to return to once signed in.
    pub return_to: String,
    /// Started.
    pub created_at: OffsetDateTime,
    /// Must be finished before.
    pub expires_at: OffsetDateTime,
    /// Finished (or failed) at: a state is good for one callback.
    pub used_at: Option<OffsetDateTime>,
}

/// A console session, with what checking it needs from its user and tenant.
#[derive(Debug, Clone, FromRow)]
pub struct ConsoleSessionRow {
    /// Id.
    pub id: Uuid,
    /// The token the console must echo in `X-CSRF-Token` on state-changing requests.
    pub csrf_token: String,
    /// Tenant.
    pub tenant_id: Uuid,
    /// The tenant's name.
    pub tenant_name: String,
    /// User.
    pub user_id: Uuid,
    /// The user's email.
    pub email: String,
    /// Role granted at sign-in.
    pub role: String,
    /// Opened.
    pub created_at: OffsetDateTime,
    /// Last request seen (written at most every few seconds).
    pub last_seen_at: OffsetDateTime,
    /// Absolute end.
    pub expires_at: OffsetDateTime,
    /// Signed out at.
    pub revoked_at: Option<OffsetDateTime>,
    /// The user was disabled at.
    pub user_disabled_at: Option<OffsetDateTime>,
}

impl ConsoleSessionRow {
    /// The session's role; a stored role that no longer parses counts as the weakest.
    pub fn role(&self) -> Role {
        self.role.parse().unwrap_or(Role::Inference)
    }
}

/// A session to open.
#[derive(Debug, Clone)]
pub struct NewConsoleSession {
    /// sha256 (hex) of the cookie's token.
    pub token_hash: String,
    /// CSRF token.
    pub csrf_token: String,
    /// Tenant.
    pub tenant_id: Uuid,
    /// User.
    pub user_id: Uuid,
    /// Role.
    pub role: Role,
    /// Absolute end.
    pub expires_at: OffsetDateTime,
}

/// Sign-ins older than this are deleted when a new one starts (they expire much sooner).
const LOGIN_RETENTION: time::Duration = time::Duration::days(1);

const SELECT_ISSUER: &str = "SELECT tenant_id, issuer, client_id, client_secret, scopes, email_claim, role_claim, \
                             role_mapping, default_role, provision_users, created_at, updated_at FROM oidc_issuers \
                             WHERE tenant_id = $1";

macro_rules! select_sessions {
    ($rest:literal) => {
        concat!(
            "SELECT s.id, s.csrf_token, s.tenant_id, t.name AS tenant_name, s.user_id, u.email, s.role, ",
            "s.created_at, s.last_seen_at, s.expires_at, s.revoked_at, u.disabled_at AS user_disabled_at ",
            "FROM console_sessions s JOIN users u ON u.id = s.user_id JOIN tenants t ON t.id = s.tenant_id ",
            $rest
        )
    };
}

impl Conn {
    /// A tenant's issuer, if it has one.
    pub async fn oidc_issuer(&mut self, tenant_id: Uuid) -> Result<Option<OidcIssuerRow>> {
        on_conn!(self, "oidc_issuer.get", |c| sqlx::query_as::<_, OidcIssuerRow>(SELECT_ISSUER)
            .bind(tenant_id)
            .fetch_optional(c))
    }

    /// A tenant's user by (lower-cased) email.
    pub async fn user_by_email(&mut self, tenant_id: Uuid, email: &str) -> Result<Option<UserRow>> {
        on_conn!(self, "user.by_email", |c| sqlx::query_as::<_, UserRow>(
            "SELECT id, tenant_id, email, name, role, created_by, created_at, disabled_at FROM users \
             WHERE tenant_id = $1 AND email = $2"
        )
        .bind(tenant_id)
        .bind(email)
        .fetch_optional(c))
    }

    /// Records a sign-in in flight, deleting long-dead ones.
    pub async fn insert_oidc_login(&mut self, login: &OidcLoginRow) -> Result<()> {
        exec!(self, "oidc_login.expire", |c| sqlx::query("DELETE FROM oidc_logins WHERE created_at < $1")
            .bind(login.created_at - LOGIN_RETENTION)
            .execute(c))?;
        exec!(self, "oidc_login.insert", |c| sqlx::query(
            "INSERT INTO oidc_logins (state_hash, tenant_id, nonce, code_verifier, redirect_uri, return_to, \
             created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        )
        .bind(&login.state_hash)
        .bind(login.tenant_id)
        .bind(&login.nonce)
        .bind(&login.code_verifier)
        .bind(&login.redirect_uri)
        .bind(&login.return_to)
        .bind(login.created_at)
        .bind(login.expires_at)
        .execute(c))?;
        Ok(())
    }

    /// Marks the sign-in with this state used and returns it, if it was unused: a second
    /// callback with the same state (a replayed redirect) finds nothing. Expiry is the
    /// caller's to check.
    pub async fn take_oidc_login(&mut self, state_hash: &str) -> Result<Option<OidcLoginRow>> {
        on_conn!(self, "oidc_login.take", |c| sqlx::query_as::<_, OidcLoginRow>(
            "UPDATE oidc_logins SET used_at = $2 WHERE state_hash = $1 AND used_at IS NULL \
             RETURNING state_hash, tenant_id, nonce, code_verifier, redirect_uri, return_to, created_at, \
             expires_at, used_at"
        )
        .bind(state_hash)
        .bind(now())
        .fetch_optional(c))
    }

    /// The session whose cookie token hashes to `token_hash`, whatever its state.
    pub async fn console_session(&mut self, token_hash: &str) -> Result<Option<ConsoleSessionRow>> {
        on_conn!(self, "console_session.get", |c| sqlx::query_as::<_, ConsoleSessionRow>(select_sessions!(
            "WHERE s.token_hash = $1"
        ))
        .bind(token_hash)
        .fetch_optional(c))
    }

    /// Records that a session was used at `at`.
    pub async fn touch_console_session(&mut self, id: Uuid, at: OffsetDateTime) -> Result<()> {
        exec!(self, "console_session.touch", |c| sqlx::query(
            "UPDATE console_sessions SET last_seen_at = $2 WHERE id = $1"
        )
        .bind(id)
        .bind(at)
        .execute(c))?;
        Ok(())
    }
}

impl Registry {
    /// Sets (creates or replaces) a tenant's issuer; audited without the secret.
    pub async fn set_oidc_issuer(&self, actor: &Actor, row: OidcIssuerRow) -> Result<OidcIssuerRow> {
        let mut tx = self.begin().await?;
        let before = tx.oidc_issuer(row.tenant_id).await?;
        let created_at = before.as_ref().map_or(row.updated_at, |b| b.created_at);
        let row = OidcIssuerRow { created_at, ..row };
        exec!(tx, "oidc_issuer.delete", |c| sqlx::query("DELETE FROM oidc_issuers WHERE tenant_id = $1")
            .bind(row.tenant_id)
            .execute(c))?;
        exec!(tx, "oidc_issuer.insert", |c| sqlx::query(
            "INSERT INTO oidc_issuers (tenant_id, issuer, client_id, client_secret, scopes, email_claim, role_claim, \
             role_mapping, default_role, provision_users, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        )
        .bind(row.tenant_id)
        .bind(&row.issuer)
        .bind(&row.client_id)
        .bind(&row.client_secret)
        .bind(&row.scopes)
        .bind(&row.email_claim)
        .bind(&row.role_claim)
        .bind(&row.role_mapping)
        .bind(&row.default_role)
        .bind(row.provision_users)
        .bind(row.created_at)
        .bind(row.updated_at)
        .execute(c))?;
        let mut after = row.summary();
        // Whether the secret changed, without the secret.
        after["client_secret_changed"] = json!(before.as_ref().is_none_or(|b| b.client_secret != row.client_secret));
        let event = NewAuditEvent {
            tenant_id: row.tenant_id,
            action: "oidc_issuer.set",
            resource_type: "oidc_issuer",
            resource_id: row.issuer.clone(),
            before: before.as_ref().map(OidcIssuerRow::summary),
            after: Some(after),
        };
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Removes a tenant's issuer (sessions already open stay until they end).
    pub async fn delete_oidc_issuer(&self, actor: &Actor, tenant_id: Uuid) -> Result<()> {
        let mut tx = self.begin().await?;
        let before = tx.oidc_issuer(tenant_id).await?.ok_or(Error::NotFound("oidc issuer"))?;
        exec!(tx, "oidc_issuer.delete", |c| sqlx::query("DELETE FROM oidc_issuers WHERE tenant_id = $1")
            .bind(tenant_id)
            .execute(c))?;
        let event = NewAuditEvent {
            tenant_id,
            action: "oidc_issuer.delete",
            resource_type: "oidc_issuer",
            resource_id: before.issuer.clone(),
            before: Some(before.summary()),
            after: None,
        };
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Creates a user on first sign-in (audited as a `user.create` by the sign-in). Two
    /// concurrent first sign-ins of one email: the second finds the first's user.
    pub async fn provision_user(
        &self,
        actor: &Actor,
        tenant_id: Uuid,
        email: &str,
        name: &str,
        role: Role,
    ) -> Result<UserRow> {
        let user = UserRow {
            id: Uuid::now_v7(),
            tenant_id,
            email: email.to_string(),
            name: name.to_string(),
            role: role.as_str().to_string(),
            created_by: None,
            created_at: now(),
            disabled_at: None,
        };
        let mut tx = self.begin().await?;
        if let Some(existing) = tx.user_by_email(tenant_id, email).await? {
            return Ok(existing);
        }
        tx.insert_user(&user).await?;
        let event = NewAuditEvent {
            tenant_id,
            action: "user.create",
            resource_type: "user",
            resource_id: user.id.to_string(),
            before: None,
            after: Some(json!({
                "id": user.id, "email": user.email, "name": user.name, "role": user.role,
                "disabled": false, "provisioned_by": "oidc",
            })),
        };
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(user)
    }

    /// Opens a session (audited as a sign-in by its user).
    pub async fn open_console_session(&self, actor: &Actor, new: NewConsoleSession) -> Result<Uuid> {
        let id = Uuid::now_v7();
        let at = now();
        let mut tx = self.begin().await?;
        exec!(tx, "console_session.insert", |c| sqlx::query(
            "INSERT INTO console_sessions (id, token_hash, csrf_token, tenant_id, user_id, role, created_at, \
             last_seen_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8)"
        )
        .bind(id)
        .bind(&new.token_hash)
        .bind(&new.csrf_token)
        .bind(new.tenant_id)
        .bind(new.user_id)
        .bind(new.role.as_str())
        .bind(at)
        .bind(new.expires_at)
        .execute(c))?;
        let event = NewAuditEvent {
            tenant_id: new.tenant_id,
            action: "session.sign_in",
            resource_type: "session",
            resource_id: id.to_string(),
            before: None,
            after: Some(json!({ "user_id": new.user_id, "role": new.role.as_str(), "method": "oidc" })),
        };
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Revokes a session (sign-out; idempotent, audited the first time).
    pub async fn revoke_console_session(&self, actor: &Actor, tenant_id: Uuid, id: Uuid) -> Result<()> {
        let mut tx = self.begin().await?;
        let revoked = exec!(tx, "console_session.revoke", |c| sqlx::query(
            "UPDATE console_sessions SET revoked_at = $3 WHERE tenant_id = $1 AND id = $2 AND revoked_at IS NULL"
        )
        .bind(tenant_id)
        .bind(id)
        .bind(now())
        .execute(c))?;
        if revoked > 0 {
            let event = NewAuditEvent {
                tenant_id,
                action: "session.sign_out",
                resource_type: "session",
                resource_id: id.to_string(),
                before: None,
                after: None,
            };
            tx.append_audit(actor, event).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
