//! Service health, access tokens, and the JWKS that verifies them.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{AppState, Caller};
use crate::app::PLATFORM_TENANT;
use crate::auth::Credential;
use crate::error::{Error, Result};
use crate::kinds::wire_enum;
use crate::types::Role;

wire_enum! {
    /// What the health check says.
    pub enum HealthStatus {
        /// The service answers.
        Ok = "ok",
    }
}

wire_enum! {
    /// Whether the service can take requests.
    pub enum ReadinessStatus {
        /// Its registry answers.
        Ready = "ready",
        /// Its registry does not answer (`reason` says why).
        Unavailable = "unavailable",
    }
}

wire_enum! {
    /// How an access token is presented.
    pub enum TokenType {
        /// `Authorization: Bearer <token>`.
        Bearer = "Bearer",
    }
}

/// Health.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok` when the service answers.
    pub status: HealthStatus,
}

/// Liveness.
#[utoipa::path(get, path = "/healthz", operation_id = "health", tag = "service", security(()),
    responses((status = 200, description = "The service is up.", body = Health)))]
pub async fn handle_health() -> Json<Health> {
    Json(Health { status: HealthStatus::Ok })
}

/// How long the readiness check waits for the registry.
const READINESS_TIMEOUT: Duration = Duration::from_secs(2);

/// Readiness.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    /// `ready`, or `unavailable`.
    pub status: ReadinessStatus,
    /// Why it is not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Readiness: whether the registry answers (`/healthz` only says the process is up).
#[utoipa::path(get, path = "/readyz", operation_id = "ready", tag = "service", security(()),
    responses((status = 200, description = "The service can take requests.", body = Readiness),
              (status = 503, description = "The registry does not answer; `reason` says so.", body = Readiness)))]
pub async fn handle_ready(State(app): State<AppState>) -> (StatusCode, Json<Readiness>) {
    match app.registry.ping(READINESS_TIMEOUT).await {
        Ok(()) => (StatusCode::OK, Json(Readiness { status: ReadinessStatus::Ready, reason: None })),
        Err(error) => {
            tracing::warn!(%error, "not ready: the registry does not answer");
            // The cause stays in the log: it may name hosts and users.
            let reason = Some("the registry database does not answer".to_string());
            (StatusCode::SERVICE_UNAVAILABLE, Json(Readiness { status: ReadinessStatus::Unavailable, reason }))
        }
    }
}

/// A JSON Web Key Set (RFC 7517) of Ed25519 public keys.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Jwks {
    /// The keys (`kty` `OKP`, `crv` `Ed25519`, `alg` `EdDSA`, `kid`, `x`).
    #[schema(value_type = Vec<Object>)]
    pub keys: Vec<serde_json::Value>,
}

/// Public keys that verify access tokens; workers and gateways fetch them to check tokens
/// offline. Keys retired by a rotation stay listed until their tokens have expired.
#[utoipa::path(get, path = "/.well-known/jwks.json", operation_id = "get_jwks", tag = "auth", security(()),
    responses((status = 200, description = "The key set.", body = Jwks)))]
pub async fn handle_jwks(State(app): State<AppState>) -> Result<Json<Jwks>> {
    let set = serde_json::to_value(app.tokens.jwks()).map_err(|e| Error::Internal(e.to_string()))?;
    let keys = set.get("keys").and_then(|k| k.as_array()).cloned().unwrap_or_default();
    Ok(Json(Jwks { keys }))
}

/// An access token.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenResponse {
    /// The JWT (EdDSA): claims `iss`, `aud`, `sub` (key id), `tenant`, `tenant_name`, `role`,
    /// `iat`, `exp`, `jti`.
    pub access_token: String,
    /// Always `Bearer`.
    pub token_type: TokenType,
    /// Seconds until it expires.
    pub expires_in: u64,
}

/// Exchanges the API key in `Authorization` for a short-lived access token carrying the
/// key's tenant and role. Tokens cannot be exchanged for tokens.
#[utoipa::path(post, path = "/v1/auth/token", operation_id = "create_token", tag = "auth",
    responses((status = 200, description = "A token.", body = TokenResponse)))]
pub async fn handle_token_create(State(app): State<AppState>, caller: Caller) -> Result<Json<TokenResponse>> {
    if caller.principal.credential != Credential::ApiKey {
        return Err(Error::Forbidden { role: caller.principal.role.as_str(), action: "exchange a token for a token" });
    }
    let access_token = app.tokens.issue(&caller.principal)?;
    Ok(Json(TokenResponse { access_token, token_type: TokenType::Bearer, expires_in: app.tokens.ttl().as_secs() }))
}

/// The new signing key.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RotatedKey {
    /// Its key id (`kid`).
    pub kid: String,
}

/// Starts signing tokens with a new key (platform admins). Tokens signed by the old key stay
/// valid until they expire; its public half stays in the JWKS until then.
#[utoipa::path(post, path = "/v1/auth/signing-keys/rotate", operation_id = "rotate_signing_key", tag = "auth",
    responses((status = 200, description = "The new key.", body = RotatedKey)))]
pub async fn handle_signing_key_rotate(State(app): State<AppState>, caller: Caller) -> Result<Json<RotatedKey>> {
    let platform = app.tenant_for(&caller.principal, PLATFORM_TENANT, Role::PlatformAdmin, "rotate signing keys");
    // Only platform admins get past; everyone else is refused with 403, not 404: the route
    // names no tenant, so there is nothing to leak.
    let platform = match platform.await {
        Err(Error::NotFound(_)) => {
            return Err(Error::Forbidden { role: caller.principal.role.as_str(), action: "rotate signing keys" });
        }
        other => other?,
    };
    let kid = app.tokens.rotate(&caller.actor, platform.id).await?;
    Ok(Json(RotatedKey { kid }))
}
