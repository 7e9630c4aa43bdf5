//! The identity a gateway forwards to a worker: the principal it authenticated, signed with a
//! key derived from the token the gateway presents to the control plane (the workers' agent
//! token, or a gateway token whose key the control plane sends workers), so a worker trusts it
//! without checking the caller's credential again, and no client (who never holds either
//! token) can make one.
//!
//! Header value: `v1.<expires unix seconds>.<role>.<tenant id>.<base64url tenant name>.<base64url
//! HMAC-SHA256 of everything before the last dot>`. A value lives a minute: the gateway signs
//! one per principal and reuses it until it is half spent.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{Principal, Role};
use crate::error::Error;

/// The header gateways set and workers read.
pub const HEADER: &str = "tessera-identity";
/// How long a signed identity is accepted after it was made.
pub const LIFETIME_SECS: i64 = 60;
/// Tolerated clock skew between gateway and worker.
const LEEWAY_SECS: i64 = 30;
/// Longer values are refused before any work.
const MAX_LEN: usize = 1024;

/// The key gateways sign identities with and workers check them with.
#[derive(Clone)]
pub struct IdentityKey {
    /// HMAC-SHA256 with the key already absorbed: each signature or check clones it instead of
    /// hashing the key's inner and outer blocks again (two of the seven a check costs).
    keyed: Hmac<Sha256>,
}

impl std::fmt::Debug for IdentityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdentityKey(..)")
    }
}

impl IdentityKey {
    /// The key derived from a token a gateway presents to the control plane (the workers'
    /// agent token, or a gateway token): [`tessera_protocol::auth::forwarded_identity_key`].
    pub fn from_token(token: &str) -> Self {
        Self::from_key(&tessera_protocol::auth::forwarded_identity_key(token))
    }

    /// A key as the control plane sends it to workers (`Registered.gateway_identity_key`);
    /// `None` unless it is 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(bytes).ok().map(|key| Self::from_key(&key))
    }

    fn from_key(key: &[u8; 32]) -> Self {
        match Hmac::<Sha256>::new_from_slice(key) {
            Ok(keyed) => Self { keyed },
            // HMAC takes keys of any length; this arm never runs.
            Err(_) => unreachable!("HMAC accepts any key length"),
        }
    }

    /// A header value vouching for `who` until `expires_at` (unix seconds).
    pub fn sign(&self, who: &Principal, expires_at: i64) -> String {
        let name = URL_SAFE_NO_PAD.encode(who.tenant_name.as_bytes());
        let body = format!("v1.{expires_at}.{}.{}.{name}", who.role.as_str(), who.tenant_id);
        let mut mac = self.keyed.clone();
        mac.update(body.as_bytes());
        let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{body}.{sig}")
    }

    /// The principal a header value vouches for, if it is genuine and not expired at `now`.
    pub fn verify(&self, value: &str, now: i64) -> Result<Principal, Error> {
        let refused = || Error::unauthenticated("invalid forwarded identity");
        if value.len() > MAX_LEN {
            return Err(refused());
        }
        let (body, sig) = value.rsplit_once('.').ok_or_else(refused)?;
        let sig = URL_SAFE_NO_PAD.decode(sig).map_err(|_| refused())?;
        let mut mac = self.keyed.clone();
        mac.update(body.as_bytes());
        mac.verify_slice(&sig).map_err(|_| refused())?;
        let mut parts = body.split('.');
        let (Some("v1"), Some(expires), Some(role), Some(tenant_id), Some(name), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(refused());
        };
        let expires: i64 = expires.parse().map_err(|_| refused())?;
        if expires + LEEWAY_SECS < now || expires > now + LIFETIME_SECS + LEEWAY_SECS {
            return Err(Error::unauthenticated("forwarded identity expired"));
        }
        let role: Role = role.parse().map_err(|_| refused())?;
        let name = URL_SAFE_NO_PAD.decode(name).ok().and_then(|b| String::from_utf8(b).ok()).ok_or_else(refused)?;
        Ok(Principal { tenant_id: tenant_id.to_string(), tenant_name: name, role, key_id: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Principal {
        Principal {
            tenant_id: "7d9f0a4e-1111-4222-8333-944455556666".into(),
            tenant_name: "acme.io".into(),
            role: Role::Inference,
            key_id: None,
        }
    }

    #[test]
    fn a_signed_identity_verifies_and_round_trips() {
        let key = IdentityKey::from_token("agent-token");
        let value = key.sign(&alice(), 1_000);
        assert_eq!(key.verify(&value, 990).expect("genuine"), alice());
        assert_eq!(key.verify(&value, 1_000 + LEEWAY_SECS).expect("within leeway"), alice());
    }

    #[test]
    fn forged_expired_and_malformed_identities_are_refused() {
        let key = IdentityKey::from_token("agent-token");
        let value = key.sign(&alice(), 1_000);
        let other = IdentityKey::from_token("another-token");
        assert!(other.verify(&value, 990).is_err(), "another key");
        let sent = IdentityKey::from_bytes(&tessera_protocol::auth::forwarded_identity_key("agent-token"));
        assert_eq!(sent.expect("32 bytes").verify(&value, 990).expect("the same key, sent as bytes"), alice());
        assert!(IdentityKey::from_bytes(&[1; 31]).is_none());
        assert!(key.verify(&value, 1_000 + LEEWAY_SECS + 1).is_err(), "expired");
        let far = key.sign(&alice(), 10_000);
        assert!(key.verify(&far, 990).is_err(), "expiry too far ahead");
        // A changed role keeps the signature of the original: refused.
        let escalated = value.replacen(".inference.", ".platform-admin.", 1);
        assert!(key.verify(&escalated, 990).is_err());
        for bad in ["", "v1", "v1.1000.inference", "x.y", &"a".repeat(2000)] {
            assert!(key.verify(bad, 990).is_err(), "{bad}");
        }
    }
}
