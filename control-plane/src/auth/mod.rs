//! Who is calling: API keys and access tokens resolve to a [`Principal`] (one tenant, one
//! role). Failures are deliberately vague: every bad credential is the same 401.

pub mod keys;
pub mod revocations;
pub mod tokens;

use time::Duration;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::registry::{IdempotencyScope, Registry, now};
use crate::types::Role;
use keys::KeyHasher;
use revocations::Revocations;
use tokens::TokenService;

/// How the caller proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// An API key.
    ApiKey,
    /// An access token obtained from `POST /v1/auth/token`.
    Token,
    /// A console session cookie from single sign-on.
    Session,
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Principal {
    /// The caller's tenant.
    pub tenant_id: Uuid,
    /// The tenant's name.
    pub tenant_name: String,
    /// The API key (for a token: the key it was exchanged for; none for a console session).
    pub key_id: Option<Uuid>,
    /// The user the key belongs to, if any.
    pub user_id: Option<Uuid>,
    /// What the caller may do.
    pub role: Role,
    /// Key, token or session.
    pub credential: Credential,
    /// The console session, for [`Credential::Session`].
    pub session_id: Option<Uuid>,
}

impl Principal {
    /// Fails with 403 unless the caller's role includes `needed`.
    pub fn require(&self, needed: Role, action: &'static str) -> Result<()> {
        if self.role.allows(needed) { Ok(()) } else { Err(Error::Forbidden { role: self.role.as_str(), action }) }
    }

    /// Who owns this caller's Idempotency-Key records: the key (a token stands for the key it
    /// was exchanged for) and the role, so no other credential is ever replayed its answers.
    pub fn idempotency_scope(&self) -> IdempotencyScope {
        let who = match (self.key_id, self.session_id) {
            (Some(key), _) => key.to_string(),
            (None, Some(session)) => format!("session:{session}"),
            (None, None) => "anonymous".to_string(),
        };
        IdempotencyScope { tenant_id: self.tenant_id, caller: format!("{who}:{}", self.role.as_str()) }
    }
}

/// Resolves bearer credentials.
pub struct Authenticator {
    registry: Registry,
    hasher: KeyHasher,
    tokens: std::sync::Arc<TokenService>,
    revocations: std::sync::Arc<Revocations>,
}

impl Authenticator {
    /// An authenticator over the registry's keys, the token service and the revocation list.
    pub fn new(
        registry: Registry,
        hasher: KeyHasher,
        tokens: std::sync::Arc<TokenService>,
        revocations: std::sync::Arc<Revocations>,
    ) -> Self {
        Authenticator { registry, hasher, tokens, revocations }
    }

    /// The key hasher (to store new keys).
    pub fn hasher(&self) -> &KeyHasher {
        &self.hasher
    }

    /// Resolves a bearer credential: an API key (`tsk_…`) or a JWT. A token whose key was
    /// revoked or whose user was disabled after it was issued is [`Error::Revoked`].
    pub async fn authenticate(&self, bearer: &str) -> Result<Principal> {
        if tessera_protocol::auth::api_key::looks_like_key(bearer) {
            self.authenticate_key(bearer).await
        } else {
            let claims = self.tokens.verify(bearer).await?;
            if self.revocations.revokes_token(&claims) {
                return Err(Error::Revoked);
            }
            Ok(Principal {
                tenant_id: claims.tenant,
                tenant_name: claims.tenant_name,
                key_id: Some(claims.sub.parse().map_err(|_| Error::Unauthenticated)?),
                user_id: claims.usr,
                role: claims.role,
                credential: Credential::Token,
                session_id: None,
            })
        }
    }

    async fn authenticate_key(&self, key: &str) -> Result<Principal> {
        self.resolve_key(key).await.map(|(principal, _)| principal)
    }

    /// Resolves an API key (unknown, revoked and expired keys are unauthenticated) to its
    /// principal and expiry: what workers ask for keys presented to them.
    pub async fn resolve_key(&self, key: &str) -> Result<(Principal, Option<time::OffsetDateTime>)> {
        let prefix = keys::prefix_of(key).ok_or(Error::Unauthenticated)?;
        let mut conn = self.registry.conn().await?;
        let row = conn.key_by_prefix(prefix).await?.ok_or(Error::Unauthenticated)?;
        let at = now();
        if !self.hasher.verify(key, &row.secret_hash) || !row.is_active(at) {
            return Err(Error::Unauthenticated);
        }
        let tenant = conn.tenant_by_id(row.tenant_id).await?.ok_or(Error::Unauthenticated)?;
        // Record use at most once a minute: a write per request would be wasteful.
        if row.last_used_at.is_none_or(|t| at - t > Duration::minutes(1)) {
            conn.touch_key(row.id, at).await?;
        }
        let principal = Principal {
            tenant_id: tenant.id,
            tenant_name: tenant.name,
            key_id: Some(row.id),
            user_id: row.user_id,
            role: row.role(),
            credential: Credential::ApiKey,
            session_id: None,
        };
        Ok((principal, row.expires_at))
    }
}
