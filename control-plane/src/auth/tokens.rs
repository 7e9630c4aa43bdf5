//! Short-lived access tokens: Ed25519-signed JWTs carrying tenant, role and expiry, and the
//! JWKS that lets workers and gateways verify them without calling the control plane.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::pkcs8::EncodePrivateKey;
use jsonwebtoken::jwk::{
    AlgorithmParameters, CommonParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, OctetKeyPairParameters,
    OctetKeyPairType, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use parking_lot::RwLock;
use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::Principal;
use crate::error::{Error, Result};
use crate::registry::{Actor, Registry, SigningKeyRow, now};

/// Tolerated clock skew when checking `exp`, `nbf` and `iat`, in seconds.
const LEEWAY_SECS: u64 = 30;

/// What a token says: the claims both planes read.
pub use tessera_protocol::auth::AccessClaims as Claims;

/// Token settings.
#[derive(Debug, Clone)]
pub struct TokenConfig {
    /// `iss` claim.
    pub issuer: String,
    /// `aud` claim.
    pub audience: String,
    /// Token lifetime.
    pub ttl: Duration,
}

struct Ring {
    signing: Option<(String, EncodingKey)>,
    verifying: HashMap<String, DecodingKey>,
    jwks: JwkSet,
    loaded_at: tokio::time::Instant,
}

/// Issues and verifies tokens; holds the current signing keys, reloaded from the registry
/// when a token names an unknown key (another replica rotated) or after a rotation here.
pub struct TokenService {
    registry: Registry,
    config: TokenConfig,
    /// Written by `reload`, read by every verification.
    ring: RwLock<Arc<Ring>>,
}

impl TokenService {
    /// Loads the signing keys, creating the first one if there is none.
    pub async fn new(registry: Registry, config: TokenConfig) -> Result<Self> {
        if registry.insert_first_signing_key(&new_signing_key()?).await? {
            tracing::info!("created the first token signing key");
        }
        let service = TokenService { registry, config, ring: RwLock::new(Arc::new(empty_ring())) };
        service.reload().await?;
        Ok(service)
    }

    /// Re-reads the published keys from the registry.
    pub async fn reload(&self) -> Result<()> {
        let publish_since = now() - self.config.ttl - Duration::from_secs(LEEWAY_SECS + 60);
        let rows = self.registry.conn().await?.signing_keys(publish_since).await?;
        let ring = build_ring(&rows)?;
        *self.ring.write() = Arc::new(ring);
        Ok(())
    }

    fn ring(&self) -> Arc<Ring> {
        self.ring.read().clone()
    }

    /// Token lifetime.
    pub fn ttl(&self) -> Duration {
        self.config.ttl
    }

    /// Issues a token for an API-key principal.
    pub fn issue(&self, principal: &Principal) -> Result<String> {
        let key_id = principal.key_id.ok_or(Error::Forbidden {
            role: principal.role.as_str(),
            action: "get an access token without an API key",
        })?;
        let ring = self.ring();
        let (kid, key) = ring.signing.as_ref().ok_or_else(|| Error::Internal("no signing key loaded".into()))?;
        let iat = now().unix_timestamp();
        let claims = Claims {
            iss: self.config.issuer.clone(),
            aud: self.config.audience.clone(),
            sub: key_id.to_string(),
            usr: principal.user_id,
            tenant: principal.tenant_id,
            tenant_name: principal.tenant_name.clone(),
            role: principal.role,
            iat,
            nbf: Some(iat),
            exp: iat + i64::try_from(self.config.ttl.as_secs()).unwrap_or(i64::MAX / 2),
            jti: Uuid::new_v4().to_string(),
        };
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.clone());
        jsonwebtoken::encode(&header, &claims, key).map_err(|e| Error::Internal(format!("sign a token: {e}")))
    }

    /// Checks a token's signature, algorithm, issuer, audience, expiry, `nbf` and `iat`.
    pub async fn verify(&self, token: &str) -> Result<Claims> {
        let kid = token_kid(token)?;
        let mut ring = self.ring();
        if !ring.verifying.contains_key(&kid) && ring.loaded_at.elapsed() > Duration::from_secs(1) {
            self.reload().await?;
            ring = self.ring();
        }
        let key = ring.verifying.get(&kid).ok_or(Error::Unauthenticated)?;
        decode_claims(token, key, &self.config, now().unix_timestamp())
    }

    /// The public keys, as a JWKS document.
    pub fn jwks(&self) -> JwkSet {
        self.ring().jwks.clone()
    }

    /// Starts signing with a new key; the old ones stay published until their tokens expire.
    pub async fn rotate(&self, actor: &Actor, audit_tenant: Uuid) -> Result<String> {
        let key = new_signing_key()?;
        self.registry.rotate_signing_key(actor, Some(audit_tenant), &key).await?;
        self.reload().await?;
        Ok(key.kid)
    }
}

/// The signing key a token's header names. An `alg` outside jsonwebtoken's list (e.g. "none")
/// fails to parse here.
pub(crate) fn token_kid(token: &str) -> Result<String> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| Error::Unauthenticated)?;
    header.kid.ok_or(Error::Unauthenticated)
}

/// Verifies `token` with `key` against `config`. A token is refused while its `nbf` or `iat`
/// lies more than [`LEEWAY_SECS`] ahead: one minted for later (or by a clock far ahead) must not
/// work early. `iat` is compared with `unix_now`; jsonwebtoken reads the system clock for `exp`
/// and `nbf`.
pub(crate) fn decode_claims(token: &str, key: &DecodingKey, config: &TokenConfig, unix_now: i64) -> Result<Claims> {
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.set_audience(&[&config.audience]);
    validation.set_issuer(&[&config.issuer]);
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    // Checked when present: tokens issued before `nbf` was added stay valid until they expire.
    validation.validate_nbf = true;
    validation.leeway = LEEWAY_SECS;
    let claims = jsonwebtoken::decode::<Claims>(token, key, &validation)
        .map_err(|e| {
            tracing::debug!(error = %e, "token refused");
            Error::Unauthenticated
        })?
        .claims;
    // jsonwebtoken never looks at `iat`.
    if claims.iat > unix_now.saturating_add(LEEWAY_SECS as i64) {
        tracing::debug!(iat = claims.iat, unix_now, "token refused: issued in the future");
        return Err(Error::Unauthenticated);
    }
    Ok(claims)
}

fn empty_ring() -> Ring {
    Ring {
        signing: None,
        verifying: HashMap::new(),
        jwks: JwkSet { keys: vec![] },
        loaded_at: tokio::time::Instant::now(),
    }
}

fn build_ring(rows: &[SigningKeyRow]) -> Result<Ring> {
    let mut ring = empty_ring();
    for row in rows {
        let jwk = public_jwk(&row.kid, &row.public_key);
        let decoding =
            DecodingKey::from_jwk(&jwk).map_err(|e| Error::Internal(format!("load key {}: {e}", row.kid)))?;
        ring.verifying.insert(row.kid.clone(), decoding);
        ring.jwks.keys.push(jwk);
        // Rows come newest first: the newest unretired key signs.
        if row.retired_at.is_none() && ring.signing.is_none() {
            ring.signing = Some((row.kid.clone(), EncodingKey::from_ed_der(&row.private_der)));
        }
    }
    Ok(ring)
}

pub(crate) fn public_jwk(kid: &str, public_key: &[u8]) -> Jwk {
    Jwk {
        common: CommonParameters {
            public_key_use: Some(PublicKeyUse::Signature),
            key_algorithm: Some(KeyAlgorithm::EdDSA),
            key_id: Some(kid.to_string()),
            ..Default::default()
        },
        algorithm: AlgorithmParameters::OctetKeyPair(OctetKeyPairParameters {
            key_type: OctetKeyPairType::OctetKeyPair,
            curve: EllipticCurve::Ed25519,
            x: URL_SAFE_NO_PAD.encode(public_key),
        }),
    }
}

/// A new random Ed25519 key; its id is derived from the public key.
pub fn new_signing_key() -> Result<SigningKeyRow> {
    let mut seed = [0u8; 32];
    rand::rng().fill_bytes(&mut seed);
    let signing = ed25519_dalek::SigningKey::from_bytes(&seed);
    let der = signing.to_pkcs8_der().map_err(|e| Error::Internal(format!("encode a signing key: {e}")))?;
    let public_key = signing.verifying_key().to_bytes().to_vec();
    let kid = hex::encode(&Sha256::digest(&public_key)[..8]);
    Ok(SigningKeyRow { kid, private_der: der.as_bytes().to_vec(), public_key, created_at: now(), retired_at: None })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::types::Role;

    fn service_ring(rows: &[SigningKeyRow]) -> Ring {
        build_ring(rows).unwrap()
    }

    #[test]
    fn newest_unretired_key_signs_and_all_verify() {
        let old = SigningKeyRow { retired_at: Some(now()), ..new_signing_key().unwrap() };
        let current = new_signing_key().unwrap();
        let ring = service_ring(&[current.clone(), old.clone()]);
        assert_eq!(ring.signing.as_ref().map(|(k, _)| k.as_str()), Some(current.kid.as_str()));
        assert_eq!(ring.jwks.keys.len(), 2);
        assert!(ring.verifying.contains_key(&old.kid));
    }

    #[test]
    fn signed_token_round_trips_and_forgeries_fail() {
        let row = new_signing_key().unwrap();
        let ring = service_ring(std::slice::from_ref(&row));
        let (kid, enc) = ring.signing.as_ref().unwrap();
        let claims = Claims {
            iss: "t".into(),
            aud: "a".into(),
            sub: "k".into(),
            usr: Some(Uuid::nil()),
            tenant: Uuid::nil(),
            tenant_name: "x".into(),
            role: Role::Viewer,
            iat: now().unix_timestamp(),
            nbf: None,
            exp: now().unix_timestamp() + 60,
            jti: "j".into(),
        };
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.clone());
        let token = jsonwebtoken::encode(&header, &claims, enc).unwrap();
        let mut v = Validation::new(Algorithm::EdDSA);
        v.set_audience(&["a"]);
        v.set_issuer(&["t"]);
        let dec = &ring.verifying[kid];
        assert_eq!(jsonwebtoken::decode::<Claims>(&token, dec, &v).unwrap().claims, claims);

        // A token signed by another key does not verify.
        let other = service_ring(&[new_signing_key().unwrap()]);
        let forged = jsonwebtoken::encode(&header, &claims, &other.signing.as_ref().unwrap().1).unwrap();
        assert!(jsonwebtoken::decode::<Claims>(&forged, dec, &v).is_err());

        // alg: none does not even parse.
        let none_header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap());
        assert!(jsonwebtoken::decode_header(format!("{none_header}.{body}.")).is_err());
    }

    const HOUR: i64 = 3600;
    const DAY: i64 = 24 * HOUR;

    fn config() -> TokenConfig {
        TokenConfig { issuer: "t".into(), audience: "a".into(), ttl: Duration::from_secs(900) }
    }

    /// Claims as the service issues them, at the current time.
    fn claims() -> Value {
        let now = now().unix_timestamp();
        json!({
            "iss": "t", "aud": "a", "sub": "k", "tenant": Uuid::nil(), "tenant_name": "x", "role": "viewer",
            "iat": now, "nbf": now, "exp": now + 900, "jti": "j",
        })
    }

    fn with(mut claims: Value, field: &str, value: Value) -> Value {
        claims[field] = value;
        claims
    }

    fn without(mut claims: Value, field: &str) -> Value {
        claims.as_object_mut().expect("an object").remove(field);
        claims
    }

    /// A token over `claims`, signed with a fresh key, and that key's verifying half.
    fn sign(claims: &Value) -> (String, DecodingKey) {
        let ring = build_ring(&[new_signing_key().expect("a key")]).expect("a ring");
        let (kid, encoding) = ring.signing.as_ref().expect("a signing key");
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.clone());
        let token = jsonwebtoken::encode(&header, claims, encoding).expect("a token signs");
        (token, ring.verifying[kid].clone())
    }

    /// Signs `claims` and verifies them as `TokenService::verify` does.
    fn verify(claims: &Value) -> Result<Claims> {
        let (token, key) = sign(claims);
        decode_claims(&token, &key, &config(), now().unix_timestamp())
    }

    #[test]
    fn tokens_not_yet_valid_are_refused() {
        let now = now().unix_timestamp();
        for (what, claims) in [
            ("nbf in an hour", with(claims(), "nbf", json!(now + HOUR))),
            ("nbf in a day", with(claims(), "nbf", json!(now + DAY))),
            ("nbf just past the leeway", with(claims(), "nbf", json!(now + LEEWAY_SECS as i64 + 5))),
            ("iat in an hour", with(claims(), "iat", json!(now + HOUR))),
            ("iat in a day, without nbf", without(with(claims(), "iat", json!(now + DAY)), "nbf")),
            ("iat just past the leeway", with(claims(), "iat", json!(now + LEEWAY_SECS as i64 + 5))),
        ] {
            assert!(matches!(verify(&claims), Err(Error::Unauthenticated)), "{what}");
        }
    }

    #[test]
    fn small_clock_skew_and_tokens_without_nbf_are_accepted() {
        let now = now().unix_timestamp();
        let skewed = with(with(claims(), "nbf", json!(now + 10)), "iat", json!(now + 10));
        assert_eq!(verify(&skewed).expect("within the leeway").nbf, Some(now + 10));
        assert_eq!(verify(&without(claims(), "nbf")).expect("tokens from before nbf").nbf, None);
        verify(&with(claims(), "nbf", json!(now - HOUR))).expect("nbf in the past");
    }

    #[test]
    fn iat_is_compared_with_the_given_clock() {
        let iat = now().unix_timestamp();
        let (token, key) = sign(&with(claims(), "iat", json!(iat)));
        let at = |unix_now| decode_claims(&token, &key, &config(), unix_now);
        at(iat - LEEWAY_SECS as i64).expect("at the edge of the leeway");
        assert!(matches!(at(iat - LEEWAY_SECS as i64 - 1), Err(Error::Unauthenticated)));
    }
}
