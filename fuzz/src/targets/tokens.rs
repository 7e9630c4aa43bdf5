//! Credentials: access tokens (EdDSA JWTs) as the control plane and the workers verify them,
//! and the API key format.
//!
//! Input: a selector byte, then either (even) a credential as is, or (odd) a header length byte,
//! a JWT header and a claims payload that the target signs with the one published key, so the
//! fuzzer reaches the claim checks behind the signature. A token the control plane accepts must
//! be accepted by a worker for the same tenant and role (workers verify offline what the control
//! plane issued); a token a worker accepts must, read here by hand, be an EdDSA token signed by
//! the published key, for the expected issuer and audience, and not expired.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};
use serde_json::Value;
use tessera_control_plane::auth::keys::prefix_of;
use tessera_control_plane::fuzzing::verify_token;
use tessera_data_plane::auth::{Authenticator, CredentialSource, KeyInfo, SourceError, TokenKeys};

const ISSUER: &str = "tessera-fuzz";
const AUDIENCE: &str = "tessera-workers";
const KID: &str = "fuzz-key";
/// What a worker accepts at most (its `MAX_CREDENTIAL_LEN`); the control plane only ever
/// issues far shorter tokens.
const MAX_CREDENTIAL_LEN: usize = 8192;
/// Clock skew both sides tolerate.
const LEEWAY_SECS: i64 = 30;

type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, SourceError>> + Send + 'a>>;

/// The control plane as a worker's authenticator sees it: no API key is valid, and the
/// fuzz key is the one signing key.
struct Source;

impl CredentialSource for Source {
    fn resolve_key<'a>(&'a self, _api_key: &'a str) -> Answer<'a, KeyInfo> {
        Box::pin(async { Err(SourceError::Rejected("unknown key".into())) })
    }

    fn token_keys(&self) -> Answer<'_, TokenKeys> {
        let jwk = serde_json::json!({
            "kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": KID,
            "x": URL_SAFE_NO_PAD.encode(signing_key().verifying_key().as_bytes()),
        });
        let keys = TokenKeys {
            jwks_json: serde_json::json!({ "keys": [jwk] }).to_string(),
            issuer: ISSUER.into(),
            audience: AUDIENCE.into(),
        };
        Box::pin(async move { Ok(keys) })
    }
}

fn signing_key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

fn authenticator() -> &'static (tokio::runtime::Runtime, Authenticator) {
    static AUTH: OnceLock<(tokio::runtime::Runtime, Authenticator)> = OnceLock::new();
    AUTH.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
        (runtime, Authenticator::new(Arc::new(Source), Duration::from_secs(60)))
    })
}

/// Checks `data` as a bearer credential.
pub fn run(data: &[u8]) {
    let Some((selector, rest)) = data.split_first() else { return };
    let token = if selector & 1 == 0 { String::from_utf8_lossy(rest).into_owned() } else { signed(rest) };
    let now = unix_now();
    let public = signing_key().verifying_key().to_bytes();
    let by_control_plane = verify_token(&token, KID, &public, ISSUER, AUDIENCE, now);
    let (runtime, auth) = authenticator();
    let by_worker = runtime.block_on(auth.authenticate(Some(&format!("Bearer {token}"))));

    if let Ok(claims) = &by_control_plane
        && token.trim().len() <= MAX_CREDENTIAL_LEN
    {
        let principal = by_worker.as_ref().expect("a worker accepts what the control plane accepts");
        assert_eq!(principal.tenant_id, claims.tenant.to_string());
        assert_eq!(principal.tenant_name, claims.tenant_name);
        assert_eq!(principal.role.as_str(), claims.role.as_str());
    }
    if by_worker.is_ok() {
        check_by_hand(token.trim(), now);
    }
    if let Some(prefix) = prefix_of(&token) {
        assert!(token.starts_with(prefix) && prefix.starts_with("tsk_") && prefix.len() == 16, "prefix '{prefix}'");
        assert_eq!(token.len(), 16 + 1 + 43, "a well-formed key is 60 characters");
    }
}

/// `header_len, header, payload` signed as a compact JWS with the fuzz key.
fn signed(rest: &[u8]) -> String {
    let Some((&header_len, rest)) = rest.split_first() else { return String::new() };
    let (header, payload) = rest.split_at(usize::from(header_len).min(rest.len()));
    let input = format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(payload));
    let signature = signing_key().sign(input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes()))
}

/// What an accepted token must be, read without jsonwebtoken.
fn check_by_hand(token: &str, now: i64) {
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "a compact JWS has three parts");
    let signature: [u8; 64] = URL_SAFE_NO_PAD
        .decode(parts[2])
        .expect("an accepted signature is base64url")
        .try_into()
        .expect("an Ed25519 signature is 64 bytes");
    let signed = format!("{}.{}", parts[0], parts[1]);
    signing_key()
        .verifying_key()
        .verify(signed.as_bytes(), &Signature::from_bytes(&signature))
        .expect("an accepted token is signed by the published key");
    let json = |part: &str| -> Option<Value> {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).expect("base64url")).ok()
    };
    // serde skips fields a struct does not name without checking their string escapes, so a
    // token may carry e.g. a lone surrogate in a claim nobody reads: strict JSON then refuses
    // it. The signature held, and the claims that matter were read by jsonwebtoken.
    let (Some(header), Some(claims)) = (json(parts[0]), json(parts[1])) else { return };
    assert_eq!(header["alg"], "EdDSA");
    assert_eq!(header["kid"], KID);
    // jsonwebtoken takes `iss` and `aud` as a string or a list that holds the expected one.
    let names = |claim: &Value, expected: &str| {
        *claim == expected || claim.as_array().is_some_and(|a| a.iter().any(|v| v == expected))
    };
    assert!(names(&claims["iss"], ISSUER), "issuer {}", claims["iss"]);
    assert!(names(&claims["aud"], AUDIENCE), "audience {}", claims["aud"]);
    let exp = claims["exp"].as_f64().expect("an accepted token has a numeric exp");
    assert!(exp + LEEWAY_SECS as f64 >= now as f64, "an expired token is accepted: exp {exp}, now {now}");
}

fn unix_now() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
}
