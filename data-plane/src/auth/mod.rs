//! Who is calling a worker's inference endpoints: bearer credentials (API keys or access
//! tokens) resolved to a tenant and role, with caches that keep working while the control plane
//! is unreachable.
//!
//! The worker agent supplies a [`CredentialSource`] backed by the control plane; `serve` runs
//! without authentication.

use futures::future::BoxFuture;

/// What a credential may do: the control plane's roles, shared through the protocol crate.
pub use tessera_protocol::auth::Role;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Tenant id (UUID text): the namespace the caller's model names resolve in.
    pub tenant_id: String,
    /// Tenant name, for logs.
    pub tenant_name: String,
    /// Role.
    pub role: Role,
    /// The API key the credential is (or was exchanged for): what a gateway applies the key's
    /// own limits by. `None` for identities forwarded by a gateway and callers without one.
    pub key_id: Option<uuid::Uuid>,
}

/// An API key the control plane resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// Whose key it is.
    pub principal: Principal,
    /// Unix seconds after which the key is invalid; `None` = never.
    pub expires_at: Option<i64>,
    /// The key's id, what a revocation list names (`None` from control planes that do not say).
    pub key_id: Option<uuid::Uuid>,
    /// The key's user, if it has one.
    pub user_id: Option<uuid::Uuid>,
}

/// The token-signing public keys and the claims tokens must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenKeys {
    /// JWKS document (RFC 7517), EdDSA keys.
    pub jwks_json: String,
    /// Expected `iss`.
    pub issuer: String,
    /// Expected `aud`.
    pub audience: String,
}

/// Why a [`CredentialSource`] gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The control plane answered: the credential is unknown, revoked or expired.
    #[error("{0}")]
    Rejected(String),
    /// The control plane could not be asked (down, unreachable, timed out).
    #[error("{0}")]
    Unavailable(String),
}

/// Where credentials are checked: the control plane, reached by the worker agent.
pub trait CredentialSource: Send + Sync + 'static {
    /// Resolves an API key.
    fn resolve_key<'a>(&'a self, api_key: &'a str) -> BoxFuture<'a, Result<KeyInfo, SourceError>>;
    /// Fetches the current token-signing keys.
    fn token_keys(&self) -> BoxFuture<'_, Result<TokenKeys, SourceError>>;
}

mod authenticator;
pub mod forwarded;
pub mod revocations;

pub use authenticator::Authenticator;
pub(crate) use authenticator::system_unix_now;
pub use forwarded::IdentityKey;
pub use revocations::Revocations;

#[cfg(test)]
pub(crate) mod test_support;
