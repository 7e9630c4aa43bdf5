//! The credentials both planes read: roles, the claims of an access token and the format of an
//! API key. The control plane issues them; workers and gateways check them offline.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What a credential may do. Ordered: each role can do everything the roles below it can
/// (`inference` sits at the bottom: it may only exchange its key for a token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Run inference only (through workers and gateways, with a token).
    Inference,
    /// Read the tenant's registry.
    Viewer,
    /// Register models, upload versions, move aliases.
    Deployer,
    /// Everything in the tenant, including keys and the audit trail.
    TenantAdmin,
    /// Everything everywhere: tenants and quotas.
    PlatformAdmin,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 5] = [Role::Inference, Role::Viewer, Role::Deployer, Role::TenantAdmin, Role::PlatformAdmin];

    /// The role's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Inference => "inference",
            Role::Viewer => "viewer",
            Role::Deployer => "deployer",
            Role::TenantAdmin => "tenant-admin",
            Role::PlatformAdmin => "platform-admin",
        }
    }

    /// Whether this role includes `needed`.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is none of [`Role::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role '{0}'")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Self, UnknownRole> {
        Role::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| UnknownRole(s.to_string()))
    }
}

/// What an access token (an EdDSA JWT the control plane signs) says.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AccessClaims {
    /// Issuer.
    pub iss: String,
    /// Audience.
    pub aud: String,
    /// The API key the token was exchanged for.
    pub sub: String,
    /// The user that key belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usr: Option<Uuid>,
    /// Tenant id.
    pub tenant: Uuid,
    /// Tenant name.
    pub tenant_name: String,
    /// Role.
    pub role: Role,
    /// Issued at (Unix seconds).
    pub iat: i64,
    /// Not before (Unix seconds); tokens issued before this claim was added carry none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    /// Expires at (Unix seconds).
    pub exp: i64,
    /// Token id.
    pub jti: String,
}

/// API keys: `tsk_<id>_<secret>`, where `tsk_<id>` is the public prefix (shown in listings,
/// used to find the key's row) and `<secret>` 43 random alphanumerics (~256 bits).
pub mod api_key {
    /// Every key starts with this; a bearer credential without it is taken for an access token.
    pub const PREFIX: &str = "tsk_";
    /// Length of the key's id.
    pub const ID_LEN: usize = 12;
    /// Length of the key's secret.
    pub const SECRET_LEN: usize = 43;
    /// Characters of the id.
    pub const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    /// Characters of the secret.
    pub const SECRET_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

    /// Whether a bearer credential is presented as an API key (rather than an access token).
    pub fn looks_like_key(credential: &str) -> bool {
        credential.starts_with(PREFIX)
    }

    /// The public prefix of a well-formed key, `None` for anything else.
    pub fn prefix_of(key: &str) -> Option<&str> {
        let rest = key.strip_prefix(PREFIX)?;
        let (id, secret) = rest.split_once('_')?;
        let id_ok = id.len() == ID_LEN && id.bytes().all(|b| ID_ALPHABET.contains(&b));
        let secret_ok = secret.len() == SECRET_LEN && secret.bytes().all(|b| b.is_ascii_alphanumeric());
        (id_ok && secret_ok).then(|| &key[..PREFIX.len() + ID_LEN])
    }
}

/// The key a gateway signs the identities it forwards to workers with, derived from the token
/// it presents to the control plane (HMAC-SHA256 of a fixed label), so the token itself never
/// signs anything a worker receives. Gateways holding the workers' own token derive it from
/// that; gateways holding a gateway token derive it from theirs, and the control plane, which
/// knows both, sends workers the key (never the token) when they register.
pub fn forwarded_identity_key(token: &str) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    // HMAC takes keys of any length, so `new_from_slice` cannot fail.
    let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(token.as_bytes()) else {
        unreachable!("HMAC accepts any key length")
    };
    mac.update(b"tessera forwarded identity v1");
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_identity_keys_differ_by_token_and_are_stable() {
        let a = forwarded_identity_key("worker-token");
        assert_eq!(a, forwarded_identity_key("worker-token"));
        assert_ne!(a, forwarded_identity_key("gateway-token"));
        assert_ne!(&a[..12], &b"worker-token"[..], "the token is not the key");
    }

    #[test]
    fn roles_are_ordered_and_round_trip() {
        assert!(Role::PlatformAdmin.allows(Role::TenantAdmin));
        assert!(Role::TenantAdmin.allows(Role::Deployer));
        assert!(Role::Deployer.allows(Role::Viewer));
        assert!(!Role::Viewer.allows(Role::Deployer));
        assert!(!Role::Inference.allows(Role::Viewer));
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>(), Ok(r));
            assert_eq!(serde_json::to_value(r).expect("serializes"), serde_json::json!(r.as_str()));
        }
        assert_eq!("admin".parse::<Role>(), Err(UnknownRole("admin".into())));
    }

    #[test]
    fn key_prefixes() {
        let key = format!("tsk_{}_{}", "a".repeat(api_key::ID_LEN), "B".repeat(api_key::SECRET_LEN));
        assert_eq!(api_key::prefix_of(&key), Some(&key[..16]));
        assert!(api_key::looks_like_key(&key) && !api_key::looks_like_key("eyJhbGciOi"));
        for bad in ["", "tsk_", "Bearer x", &key[..key.len() - 1], &format!("{key}x"), &key.replace("tsk_", "tsx_")] {
            assert_eq!(api_key::prefix_of(bad), None, "{bad}");
        }
    }
}
