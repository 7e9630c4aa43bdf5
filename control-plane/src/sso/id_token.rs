//! Checking an ID token (OpenID Connect Core §3.1.3.7) and reading who it names: signature by
//! one of the provider's keys, `iss`, `aud` (and `azp`), `exp`, `iat`, `nonce`; then the email
//! and the role the tenant's mapping gives.

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::registry::OidcIssuerRow;
use crate::types::{Email, Role};

/// Tolerated clock skew between us and the provider, in seconds.
const LEEWAY_SECS: u64 = 60;

/// Algorithms accepted for ID tokens: asymmetric only (never `none`, never HMAC with the
/// client secret).
const ALGORITHMS: [Algorithm; 8] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::EdDSA,
];

/// The `kid` of a token's header, if it parses and names one.
pub fn key_id(token: &str) -> Result<Option<String>, String> {
    let header = jsonwebtoken::decode_header(token).map_err(|e| format!("the ID token is malformed: {e}"))?;
    Ok(header.kid)
}

/// Verifies `token` against `keys` and the expected issuer, client and nonce; returns its
/// claims. The messages say which check failed.
pub fn verify(
    token: &str,
    keys: &JwkSet,
    issuer: &str,
    client_id: &str,
    nonce: &str,
) -> Result<Map<String, Value>, String> {
    let header = jsonwebtoken::decode_header(token).map_err(|e| format!("the ID token is malformed: {e}"))?;
    if !ALGORITHMS.contains(&header.alg) {
        return Err(format!("the ID token is signed with {:?}, which is not accepted", header.alg));
    }
    let jwk = match &header.kid {
        Some(kid) => keys.find(kid),
        // One key and no kid: that key.
        None if keys.keys.len() == 1 => keys.keys.first(),
        None => None,
    }
    .ok_or("the ID token is signed by a key the provider does not publish")?;
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("the provider's key is unusable: {e}"))?;
    let mut validation = Validation::new(header.alg);
    validation.leeway = LEEWAY_SECS;
    validation.set_issuer(&[issuer]);
    validation.set_audience(&[client_id]);
    validation.set_required_spec_claims(&["exp", "iat", "iss", "aud", "sub"]);
    let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation).map_err(describe)?;
    let claims = data.claims;
    if !claims.get("iat").is_some_and(Value::is_number) {
        return Err("the ID token lacks the `iat` claim".into());
    }
    // Several audiences: the authorized party must be us (Core §3.1.3.7 item 5).
    if claims.get("aud").and_then(Value::as_array).is_some_and(|a| a.len() > 1)
        && claims.get("azp").and_then(Value::as_str) != Some(client_id)
    {
        return Err("the ID token names several audiences and its azp is not this client".into());
    }
    if claims.get("nonce").and_then(Value::as_str) != Some(nonce) {
        return Err("the ID token's nonce does not match this sign-in (a replayed or foreign token)".into());
    }
    Ok(claims)
}

fn describe(e: jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::InvalidAudience => "the ID token was issued for another client (wrong audience)".into(),
        K::InvalidIssuer => "the ID token comes from another issuer".into(),
        K::ExpiredSignature => "the ID token has expired".into(),
        K::ImmatureSignature => "the ID token is not valid yet".into(),
        K::InvalidSignature => "the ID token's signature does not verify".into(),
        K::MissingRequiredClaim(c) => format!("the ID token lacks the `{c}` claim"),
        K::InvalidAlgorithm => "the ID token's algorithm does not fit the provider's key".into(),
        _ => format!("the ID token is invalid: {e}"),
    }
}

/// The email address the claims give, lower-cased; refused when the provider says it is not
/// verified.
pub fn email(claims: &Map<String, Value>, email_claim: &str) -> Result<Email, String> {
    let raw = claims
        .get(email_claim)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("the ID token has no `{email_claim}` claim (is the `email` scope granted?)"))?;
    if email_claim == "email" && claims.get("email_verified").and_then(Value::as_bool) == Some(false) {
        return Err(format!("the provider has not verified the email address {raw}"));
    }
    Email::parse(raw).map_err(|e| format!("the `{email_claim}` claim is not a usable email: {e}"))
}

/// The strongest role the tenant's mapping gives the values of its role claim (a string or a
/// list of strings), if any maps.
pub fn mapped_role(claims: &Map<String, Value>, issuer: &OidcIssuerRow) -> Option<Role> {
    let claim = claims.get(issuer.role_claim.as_deref()?)?;
    let values: Vec<&str> = match claim {
        Value::String(s) => vec![s.as_str()],
        Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
        _ => return None,
    };
    let mapping = issuer.mapping();
    values.iter().filter_map(|v| mapping.iter().find(|(k, _)| k == v).map(|(_, r)| *r)).max()
}

/// The name to give a provisioned user: `name`, else the email.
pub fn display_name(claims: &Map<String, Value>, email: &Email) -> String {
    claims
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.trim().is_empty())
        .map(|n| n.trim().chars().take(100).collect())
        .unwrap_or_else(|| email.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn issuer(role_claim: Option<&str>, mapping: Value) -> OidcIssuerRow {
        let at = time::OffsetDateTime::UNIX_EPOCH;
        OidcIssuerRow {
            tenant_id: uuid::Uuid::nil(),
            issuer: "https://id.example.com".into(),
            client_id: "tessera".into(),
            client_secret: "s".into(),
            scopes: "openid email".into(),
            email_claim: "email".into(),
            role_claim: role_claim.map(str::to_string),
            role_mapping: mapping.to_string(),
            default_role: None,
            provision_users: false,
            created_at: at,
            updated_at: at,
        }
    }

    fn claims(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_strongest_mapped_group_wins() {
        let i = issuer(Some("groups"), json!({"ml-viewers": "viewer", "ml-admins": "tenant-admin", "x": "bogus"}));
        let c = claims(json!({"groups": ["other", "ml-viewers", "ml-admins"]}));
        assert_eq!(mapped_role(&c, &i), Some(Role::TenantAdmin));
        assert_eq!(mapped_role(&claims(json!({"groups": "ml-viewers"})), &i), Some(Role::Viewer));
        assert_eq!(mapped_role(&claims(json!({"groups": ["x", "other"]})), &i), None);
        assert_eq!(mapped_role(&claims(json!({})), &i), None);
        assert_eq!(mapped_role(&c, &issuer(None, json!({}))), None);
    }

    #[test]
    fn emails_must_be_present_and_verified() {
        let ok = email(&claims(json!({"email": "Ada@Example.com", "email_verified": true})), "email").unwrap();
        assert_eq!(ok.to_string(), "ada@example.com");
        assert!(
            email(&claims(json!({"email": "a@x", "email_verified": false})), "email").unwrap_err().contains("verified")
        );
        assert!(email(&claims(json!({})), "email").unwrap_err().contains("no `email` claim"));
        assert!(email(&claims(json!({"upn": "a@x"})), "upn").is_ok());
    }

    #[test]
    fn tokens_without_a_known_key_or_with_none_are_refused() {
        let keys = JwkSet { keys: vec![] };
        // alg none: header {"alg":"none"}.
        let none = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.";
        assert!(verify(none, &keys, "i", "c", "n").is_err());
        // HS256 with a kid the set lacks.
        let hs = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &json!({"sub": "x"}),
            &jsonwebtoken::EncodingKey::from_secret(b"k"),
        )
        .unwrap();
        assert!(verify(&hs, &keys, "i", "c", "n").unwrap_err().contains("not accepted"));
    }
}
