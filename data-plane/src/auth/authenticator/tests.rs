use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::pkcs8::EncodePrivateKey;
use futures::future::BoxFuture;
use jsonwebtoken::jwk::{CommonParameters, Jwk, KeyAlgorithm, OctetKeyPairParameters, OctetKeyPairType, PublicKeyUse};
use jsonwebtoken::{EncodingKey, Header};
use serde_json::json;

use super::*;
use crate::auth::Role;
use crate::error::ErrorKind;

const ISSUER: &str = "https://cp.test";
const AUDIENCE: &str = "tessera-workers";
const TENANT: &str = "6f1c2b1e-7a4d-4a8e-9b1f-0c2d3e4f5a6b";
const KEY: &str = "tsk_abc_secret";
const TTL: Duration = Duration::from_secs(60);

/// A control plane stand-in: answers from tables the test edits, and counts the calls.
#[derive(Default)]
struct FakeSource {
    keys: Mutex<HashMap<String, Result<KeyInfo, SourceError>>>,
    /// `None`: the control plane is unreachable.
    jwks: Mutex<Option<Vec<Jwk>>>,
    key_calls: AtomicUsize,
    jwks_calls: AtomicUsize,
}

impl FakeSource {
    fn answer_key(&self, key: &str, answer: Result<KeyInfo, SourceError>) {
        self.keys.lock().insert(key.to_string(), answer);
    }

    fn publish(&self, keys: Option<Vec<Jwk>>) {
        *self.jwks.lock() = keys;
    }

    fn key_calls(&self) -> usize {
        self.key_calls.load(Ordering::SeqCst)
    }

    fn jwks_calls(&self) -> usize {
        self.jwks_calls.load(Ordering::SeqCst)
    }
}

impl CredentialSource for FakeSource {
    fn resolve_key<'a>(&'a self, api_key: &'a str) -> BoxFuture<'a, Result<KeyInfo, SourceError>> {
        self.key_calls.fetch_add(1, Ordering::SeqCst);
        let answer =
            self.keys.lock().get(api_key).cloned().unwrap_or_else(|| Err(SourceError::Rejected("unknown".into())));
        Box::pin(async move { answer })
    }

    fn token_keys(&self) -> BoxFuture<'_, Result<TokenKeys, SourceError>> {
        self.jwks_calls.fetch_add(1, Ordering::SeqCst);
        let answer = match self.jwks.lock().clone() {
            Some(keys) => Ok(TokenKeys {
                jwks_json: serde_json::to_string(&JwkSet { keys }).expect("a JWKS serialises"),
                issuer: ISSUER.into(),
                audience: AUDIENCE.into(),
            }),
            None => Err(SourceError::Unavailable("connection refused".into())),
        };
        Box::pin(async move { answer })
    }
}

fn principal(role: Role) -> Principal {
    Principal { tenant_id: TENANT.into(), tenant_name: "acme".into(), role, key_id: None }
}

/// The id of [`KEY`] and of its user, as the control plane names them.
const KEY_ID: uuid::Uuid = uuid::Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0001);
const USER_ID: uuid::Uuid = uuid::Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0002);

fn key_info(expires_at: Option<i64>) -> KeyInfo {
    KeyInfo { principal: principal(Role::Inference), expires_at, key_id: Some(KEY_ID), user_id: Some(USER_ID) }
}

fn setup() -> (Arc<FakeSource>, Authenticator) {
    let source = Arc::new(FakeSource::default());
    let auth = Authenticator::new(source.clone(), TTL);
    (source, auth)
}

fn bearer(credential: &str) -> String {
    format!("Bearer {credential}")
}

async fn check(auth: &Authenticator, credential: &str) -> Result<Principal, Error> {
    auth.authenticate(Some(&bearer(credential))).await
}

#[tokio::test]
async fn missing_or_malformed_headers_are_unauthenticated() {
    let (source, auth) = setup();
    for header in [None, Some("Basic dXNlcjpwdw=="), Some("Bearer"), Some("Bearer   "), Some("tsk_abc")] {
        let err = auth.authenticate(header).await.expect_err("refused");
        assert_eq!(err.kind, ErrorKind::Unauthenticated, "{header:?}");
    }
    assert_eq!(source.key_calls(), 0);
    let long = format!("Bearer tsk_{}", "x".repeat(MAX_CREDENTIAL_LEN));
    assert_eq!(auth.authenticate(Some(&long)).await.expect_err("refused").kind, ErrorKind::Unauthenticated);
    assert_eq!(source.key_calls(), 0);
}

#[tokio::test]
async fn the_scheme_is_case_insensitive() {
    let (source, auth) = setup();
    source.answer_key(KEY, Ok(key_info(None)));
    let principal = auth.authenticate(Some(&format!("bearer {KEY}"))).await.expect("accepted");
    assert_eq!(principal.tenant_id, TENANT);
    // gRPC metadata keeps a leading space that HTTP strips (perf_analyzer's `-H "k: v"`).
    let principal = auth.authenticate(Some(&format!(" Bearer {KEY} "))).await.expect("accepted");
    assert_eq!(principal.tenant_id, TENANT);
}

#[tokio::test(start_paused = true)]
async fn api_keys_are_cached_for_the_ttl_then_rechecked() {
    let (source, auth) = setup();
    source.answer_key(KEY, Ok(key_info(None)));
    assert_eq!(check(&auth, KEY).await.expect("valid"), principal(Role::Inference));
    assert_eq!(check(&auth, KEY).await.expect("cached"), principal(Role::Inference));
    assert_eq!(source.key_calls(), 1);

    tokio::time::advance(TTL + Duration::from_secs(1)).await;
    check(&auth, KEY).await.expect("rechecked");
    assert_eq!(source.key_calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_cache_stores_hashes_not_keys() {
    let (source, auth) = setup();
    source.answer_key(KEY, Ok(key_info(None)));
    check(&auth, KEY).await.expect("valid");
    let keys = auth.keys.lock();
    let hash: [u8; 32] = Sha256::digest(KEY.as_bytes()).into();
    assert!(keys.contains_key(&hash));
    assert!(!format!("{:?}", keys.values().collect::<Vec<_>>()).contains("secret"));
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_control_plane_keeps_the_cached_answer() {
    let (source, auth) = setup();
    source.answer_key(KEY, Ok(key_info(None)));
    check(&auth, KEY).await.expect("valid");

    source.answer_key(KEY, Err(SourceError::Unavailable("down".into())));
    tokio::time::advance(TTL + Duration::from_secs(1)).await;
    assert_eq!(check(&auth, KEY).await.expect("still served"), principal(Role::Inference));
    assert_eq!(source.key_calls(), 2);
    // The next attempt waits a little instead of asking on every request.
    check(&auth, KEY).await.expect("still served");
    assert_eq!(source.key_calls(), 2);
    tokio::time::advance(UNAVAILABLE_RETRY).await;
    check(&auth, KEY).await.expect("still served");
    assert_eq!(source.key_calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_control_plane_with_nothing_cached_is_unavailable() {
    let (source, auth) = setup();
    source.answer_key(KEY, Err(SourceError::Unavailable("down".into())));
    let err = check(&auth, KEY).await.expect_err("cannot check");
    assert_eq!(err.kind, ErrorKind::Unavailable);
    assert!(err.message.contains("control plane is unreachable"), "{}", err.message);
}

#[tokio::test(start_paused = true)]
async fn a_rejected_recheck_evicts_at_once_and_is_cached_briefly() {
    let (source, auth) = setup();
    source.answer_key(KEY, Ok(key_info(None)));
    check(&auth, KEY).await.expect("valid");

    source.answer_key(KEY, Err(SourceError::Rejected("revoked".into())));
    tokio::time::advance(TTL + Duration::from_secs(1)).await;
    assert_eq!(check(&auth, KEY).await.expect_err("revoked").kind, ErrorKind::Unauthenticated);
    // Even were the control plane to go down now, the revoked key stays refused.
    source.answer_key(KEY, Err(SourceError::Unavailable("down".into())));
    assert_eq!(check(&auth, KEY).await.expect_err("refused from the cache").kind, ErrorKind::Unauthenticated);
    assert_eq!(source.key_calls(), 2);
    tokio::time::advance(REJECTED_TTL).await;
    assert_eq!(check(&auth, KEY).await.expect_err("nothing cached").kind, ErrorKind::Unavailable);
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_bad_keys_asks_once_per_key() {
    let (source, auth) = setup();
    for _ in 0..100 {
        assert_eq!(check(&auth, "tsk_bad").await.expect_err("unknown").kind, ErrorKind::Unauthenticated);
    }
    assert_eq!(source.key_calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_key_past_its_expiry_is_refused_even_from_the_cache() {
    let (source, mut auth) = setup();
    auth.unix_now = || 1_000;
    source.answer_key(KEY, Ok(key_info(Some(1_500))));
    check(&auth, KEY).await.expect("not yet expired");

    auth.unix_now = || 2_000;
    assert_eq!(check(&auth, KEY).await.expect_err("expired").kind, ErrorKind::Unauthenticated);
    assert_eq!(source.key_calls(), 1);
    // The control plane still vouching for an expired key does not help either.
    tokio::time::advance(REJECTED_TTL).await;
    assert_eq!(check(&auth, KEY).await.expect_err("expired").kind, ErrorKind::Unauthenticated);
}

#[tokio::test(start_paused = true)]
async fn an_expired_key_survives_no_outage() {
    let (source, mut auth) = setup();
    auth.unix_now = || 1_000;
    source.answer_key(KEY, Ok(key_info(Some(1_100))));
    check(&auth, KEY).await.expect("valid");
    source.answer_key(KEY, Err(SourceError::Unavailable("down".into())));
    auth.unix_now = || 1_200;
    tokio::time::advance(TTL + Duration::from_secs(1)).await;
    assert_eq!(check(&auth, KEY).await.expect_err("expired").kind, ErrorKind::Unauthenticated);
}

/// An Ed25519 signing key and its public JWK.
struct Signer {
    kid: String,
    encoding: EncodingKey,
    jwk: Jwk,
}

fn signing_key(seed: u8, kid: &str) -> Signer {
    let key = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]);
    let der = key.to_pkcs8_der().expect("an Ed25519 key encodes");
    let jwk = Jwk {
        common: CommonParameters {
            public_key_use: Some(PublicKeyUse::Signature),
            key_algorithm: Some(KeyAlgorithm::EdDSA),
            key_id: Some(kid.to_string()),
            ..Default::default()
        },
        algorithm: AlgorithmParameters::OctetKeyPair(OctetKeyPairParameters {
            key_type: OctetKeyPairType::OctetKeyPair,
            curve: EllipticCurve::Ed25519,
            x: URL_SAFE_NO_PAD.encode(key.verifying_key().to_bytes()),
        }),
    };
    Signer { kid: kid.to_string(), encoding: EncodingKey::from_ed_der(der.as_bytes()), jwk }
}

impl Signer {
    fn sign(&self, claims: &serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("a token signs")
    }
}

fn claims() -> serde_json::Value {
    let now = system_unix_now();
    json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "key-id", "tenant": TENANT, "tenant_name": "acme",
        "role": "viewer", "iat": now, "nbf": now, "exp": now + 300, "jti": "j1",
    })
}

fn with(mut claims: serde_json::Value, field: &str, value: serde_json::Value) -> serde_json::Value {
    claims[field] = value;
    claims
}

fn without(mut claims: serde_json::Value, field: &str) -> serde_json::Value {
    claims.as_object_mut().expect("an object").remove(field);
    claims
}

fn token_setup() -> (Arc<FakeSource>, Authenticator, Signer) {
    let (source, auth) = setup();
    let signer = signing_key(7, "k1");
    source.publish(Some(vec![signer.jwk.clone()]));
    (source, auth, signer)
}

#[tokio::test(start_paused = true)]
async fn a_valid_token_resolves_offline_after_the_first_fetch() {
    let (source, auth, signer) = token_setup();
    let token = signer.sign(&claims());
    assert_eq!(check(&auth, &token).await.expect("valid"), principal(Role::Viewer));
    source.publish(None);
    assert_eq!(check(&auth, &token).await.expect("still valid"), principal(Role::Viewer));
    assert_eq!(source.jwks_calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_tenant_id_is_normalised_to_lowercase_uuid_text() {
    let (_source, auth, signer) = token_setup();
    let token = signer.sign(&with(claims(), "tenant", json!(TENANT.to_uppercase())));
    assert_eq!(check(&auth, &token).await.expect("valid").tenant_id, TENANT);
}

#[tokio::test(start_paused = true)]
async fn bad_tokens_are_unauthenticated() {
    let (_source, auth, signer) = token_setup();
    let now = system_unix_now();
    let forged = signing_key(9, "k1").sign(&claims());
    let none_header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT","kid":"k1"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims().to_string());
    let alg_none = format!("{none_header}.{body}.");
    let mut hs_header = Header::new(Algorithm::HS256);
    hs_header.kid = Some("k1".into());
    let AlgorithmParameters::OctetKeyPair(params) = &signer.jwk.algorithm else { unreachable!() };
    let hs256 = jsonwebtoken::encode(&hs_header, &claims(), &EncodingKey::from_secret(params.x.as_bytes()))
        .expect("an HMAC token signs");
    let mut no_kid = Header::new(Algorithm::EdDSA);
    no_kid.kid = None;
    let without_kid = jsonwebtoken::encode(&no_kid, &claims(), &signer.encoding).expect("signs");
    let cases = [
        ("forged", forged),
        ("alg none", alg_none),
        ("hs256", hs256),
        ("no kid", without_kid),
        ("garbage", "not.a.jwt".to_string()),
        ("wrong issuer", signer.sign(&with(claims(), "iss", json!("https://evil.test")))),
        ("wrong audience", signer.sign(&with(claims(), "aud", json!("someone-else")))),
        ("no exp", signer.sign(&with(claims(), "exp", serde_json::Value::Null))),
        ("bad tenant", signer.sign(&with(claims(), "tenant", json!("acme")))),
        ("bad role", signer.sign(&with(claims(), "role", json!("root")))),
        ("tampered", {
            let token = signer.sign(&claims());
            let mut parts: Vec<&str> = token.split('.').collect();
            let elevated = URL_SAFE_NO_PAD.encode(with(claims(), "role", json!("platform-admin")).to_string());
            parts[1] = &elevated;
            parts.join(".")
        }),
    ];
    for (what, token) in cases {
        let err = check(&auth, &token).await.expect_err(what);
        assert_eq!(err.kind, ErrorKind::Unauthenticated, "{what}: {}", err.message);
    }
    let expired = signer.sign(&with(claims(), "exp", json!(now - 120)));
    let err = check(&auth, &expired).await.expect_err("expired");
    assert_eq!((err.kind, err.message.as_str()), (ErrorKind::Unauthenticated, "access token has expired"));
}

#[tokio::test(start_paused = true)]
async fn tokens_not_yet_valid_are_unauthenticated() {
    let (_source, auth, signer) = token_setup();
    let now = system_unix_now();
    let past_leeway = now + LEEWAY_SECS as i64 + 5;
    let cases = [
        ("nbf in an hour", with(claims(), "nbf", json!(now + 3600))),
        ("nbf in a day", with(claims(), "nbf", json!(now + 86_400))),
        ("nbf past the leeway", with(claims(), "nbf", json!(past_leeway))),
        ("iat in an hour", with(claims(), "iat", json!(now + 3600))),
        ("iat in a day, without nbf", without(with(claims(), "iat", json!(now + 86_400)), "nbf")),
        ("iat past the leeway", with(claims(), "iat", json!(past_leeway))),
    ];
    for (what, claims) in cases {
        let err = check(&auth, &signer.sign(&claims)).await.expect_err(what);
        assert_eq!((err.kind, err.message.as_str()), (ErrorKind::Unauthenticated, INVALID), "{what}");
    }
}

#[tokio::test(start_paused = true)]
async fn small_clock_skew_and_tokens_without_nbf_are_accepted() {
    let (_source, auth, signer) = token_setup();
    let soon = system_unix_now() + 10;
    let skewed = with(with(claims(), "nbf", json!(soon)), "iat", json!(soon));
    assert_eq!(check(&auth, &signer.sign(&skewed)).await.expect("within the leeway"), principal(Role::Viewer));
    let older = signer.sign(&without(claims(), "nbf"));
    assert_eq!(check(&auth, &older).await.expect("issued before nbf"), principal(Role::Viewer));
}

#[tokio::test(start_paused = true)]
async fn iat_is_compared_with_the_authenticators_clock() {
    let (_source, mut auth, signer) = token_setup();
    let token = signer.sign(&claims());
    auth.unix_now = || system_unix_now() - LEEWAY_SECS as i64 + 5;
    check(&auth, &token).await.expect("within the leeway");
    auth.unix_now = || system_unix_now() - 3600;
    assert_eq!(check(&auth, &token).await.expect_err("issued in the future").kind, ErrorKind::Unauthenticated);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_kid_refreshes_the_keys_at_most_every_few_seconds() {
    let (source, auth, old) = token_setup();
    check(&auth, &old.sign(&claims())).await.expect("valid");
    assert_eq!(source.jwks_calls(), 1);

    // The control plane rotated: a token names a key this worker has not seen yet.
    tokio::time::advance(JWKS_MIN_INTERVAL).await;
    let new = signing_key(8, "k2");
    source.publish(Some(vec![new.jwk.clone(), old.jwk.clone()]));
    check(&auth, &new.sign(&claims())).await.expect("valid after a refresh");
    assert_eq!(source.jwks_calls(), 2);

    // Made-up kids cannot make the worker hammer the control plane.
    let stranger = signing_key(10, "k3");
    for _ in 0..20 {
        check(&auth, &stranger.sign(&claims())).await.expect_err("unknown key");
    }
    assert_eq!(source.jwks_calls(), 2);
    tokio::time::advance(JWKS_MIN_INTERVAL).await;
    check(&auth, &stranger.sign(&claims())).await.expect_err("unknown key");
    assert_eq!(source.jwks_calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn old_keys_are_refreshed_in_the_background_and_kept_when_that_fails() {
    let (source, auth, signer) = token_setup();
    let token = signer.sign(&claims());
    check(&auth, &token).await.expect("valid");

    source.publish(None);
    tokio::time::advance(JWKS_MAX_AGE).await;
    check(&auth, &token).await.expect("old keys still verify");
    // Let the background refresh run.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(source.jwks_calls(), 2);
    check(&auth, &token).await.expect("kept after the failed refresh");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(source.jwks_calls(), 2, "failed refreshes are rate limited too");

    // A successful refresh replaces the keys: a retired key stops verifying.
    let new = signing_key(8, "k2");
    source.publish(Some(vec![new.jwk.clone()]));
    tokio::time::advance(JWKS_MIN_INTERVAL).await;
    check(&auth, &token).await.expect("verified while the refresh runs");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(source.jwks_calls(), 3);
    check(&auth, &new.sign(&claims())).await.expect("the new key verifies");
    assert_eq!(check(&auth, &token).await.expect_err("retired key").kind, ErrorKind::Unauthenticated);
}

#[tokio::test(start_paused = true)]
async fn tokens_with_no_keys_fetchable_are_unavailable() {
    let (source, auth) = setup();
    let token = signing_key(7, "k1").sign(&claims());
    let err = check(&auth, &token).await.expect_err("no keys");
    assert_eq!(err.kind, ErrorKind::Unavailable);
    assert!(err.message.contains("control plane is unreachable"), "{}", err.message);
    check(&auth, &token).await.expect_err("no keys");
    assert_eq!(source.jwks_calls(), 1, "retries are rate limited");
}

#[tokio::test(start_paused = true)]
async fn non_ed25519_keys_in_the_jwks_are_ignored() {
    let (source, auth, signer) = token_setup();
    let hmac: Jwk = serde_json::from_value(json!({"kty": "oct", "kid": "k1", "k": "c2VjcmV0"})).expect("a JWK");
    source.publish(Some(vec![hmac, signer.jwk.clone()]));
    check(&auth, &signer.sign(&claims())).await.expect("the Ed25519 key is used");
}

/// A list naming `keys` and `users`, revoked at `at`.
fn revoked(keys: &[uuid::Uuid], users: &[uuid::Uuid], at: i64) -> RevocationList {
    RevocationList::new(keys.iter().map(|k| (*k, at)), users.iter().map(|u| (*u, at)))
}

#[tokio::test(start_paused = true)]
async fn tokens_issued_before_a_revocation_of_their_key_or_user_are_refused() {
    let (_source, auth, signer) = token_setup();
    let now = system_unix_now();
    let issued = with(claims(), "iat", json!(now));
    let of_key = signer.sign(&with(issued.clone(), "sub", json!(KEY_ID)));
    let of_user = signer.sign(&with(with(issued.clone(), "sub", json!(uuid::Uuid::new_v4())), "usr", json!(USER_ID)));
    let other = signer.sign(&with(issued.clone(), "sub", json!(uuid::Uuid::new_v4())));
    for token in [&of_key, &of_user, &other] {
        check(&auth, token).await.expect("valid before any revocation");
    }

    auth.apply_revocations(revoked(&[KEY_ID], &[USER_ID], now));
    for token in [&of_key, &of_user] {
        let err = check(&auth, token).await.expect_err("revoked");
        assert_eq!(err.kind, ErrorKind::Unauthenticated);
        assert!(err.message.contains("revoked"), "{}", err.message);
    }
    check(&auth, &other).await.expect("a token of another key and user");

    // A token issued after the revocation (a key id reused by nobody, but a user's later key
    // could be) is not refused by it.
    let later = signer.sign(&with(with(issued, "sub", json!(KEY_ID)), "iat", json!(now + 1)));
    check(&auth, &later).await.expect("issued after the revocation");

    // Each list replaces the one before.
    auth.apply_revocations(RevocationList::default());
    check(&auth, &of_key).await.expect("no longer listed");
}

#[tokio::test(start_paused = true)]
async fn cached_api_keys_named_by_a_revocation_list_are_dropped() {
    let (source, auth) = setup();
    source.answer_key(KEY, Ok(key_info(None)));
    check(&auth, KEY).await.expect("valid");
    check(&auth, KEY).await.expect("cached");
    assert_eq!(source.key_calls(), 1);

    // Another key's revocation leaves the cached answer alone.
    auth.apply_revocations(revoked(&[uuid::Uuid::new_v4()], &[], system_unix_now()));
    check(&auth, KEY).await.expect("still cached");
    assert_eq!(source.key_calls(), 1);

    // The key's own revocation drops it: the next request asks the control plane, which now
    // says no.
    source.answer_key(KEY, Err(SourceError::Rejected("revoked".into())));
    auth.apply_revocations(revoked(&[KEY_ID], &[], system_unix_now()));
    let err = check(&auth, KEY).await.expect_err("revoked");
    assert_eq!(err.kind, ErrorKind::Unauthenticated);
    assert_eq!(source.key_calls(), 2, "the cached answer was dropped");
}

#[tokio::test(start_paused = true)]
async fn a_key_answer_that_raced_its_revocation_is_refused() {
    let (source, auth) = setup();
    // The control plane vouched for the key before the user was disabled; the answer arrives
    // after the list naming the user.
    source.answer_key(KEY, Ok(key_info(None)));
    auth.apply_revocations(revoked(&[], &[USER_ID], system_unix_now()));
    let err = check(&auth, KEY).await.expect_err("the user is disabled");
    assert!(err.message.contains("revoked"), "{}", err.message);
    check(&auth, KEY).await.expect_err("and stays refused");
    assert_eq!(source.key_calls(), 1, "the refusal is cached");
}

#[tokio::test(start_paused = true)]
async fn the_revocation_metrics_show_the_list_and_its_staleness() {
    let (_source, auth) = setup();
    let revocations = auth.revocations();
    let render = || {
        let mut out = String::new();
        crate::serve::metrics::MetricsSource::render_metrics(&*revocations, &mut out);
        out
    };
    assert!(render().contains("tessera_revocation_list_stale_seconds -1"), "{}", render());
    auth.apply_revocations(revoked(&[KEY_ID, uuid::Uuid::new_v4()], &[USER_ID], 1));
    let text = render();
    assert!(text.contains("tessera_revocation_list_entries{kind=\"key\"} 2"), "{text}");
    assert!(text.contains("tessera_revocation_list_entries{kind=\"user\"} 1"), "{text}");
    assert!(text.contains("tessera_revocation_list_stale_seconds 0"), "{text}");
    revocations.stream_lost();
    tokio::time::advance(Duration::from_secs(3)).await;
    assert!(render().contains("tessera_revocation_list_stale_seconds 3"), "{}", render());
    auth.apply_revocations(RevocationList::default());
    assert!(render().contains("tessera_revocation_list_stale_seconds 0"), "{}", render());
}

#[tokio::test]
async fn forwarded_identities_are_checked_with_the_key_named_last() {
    let (_, auth) = setup();
    let now = system_unix_now();
    let own = IdentityKey::from_token("worker-token");
    let gateways = IdentityKey::from_token("gateway-token");
    let signed_own = own.sign(&principal(Role::Inference), now + 30);
    let signed_gateway = gateways.sign(&principal(Role::Inference), now + 30);
    let refused = auth.authenticate_request(None, Some(&signed_own)).await.expect_err("not accepted by default");
    assert_eq!(refused.kind, ErrorKind::Unauthenticated);
    // Without forwarded identities accepted, replacing the key changes nothing.
    auth.replace_forwarded_identity(own.clone());
    assert!(auth.authenticate_request(None, Some(&signed_own)).await.is_err());

    let (_, auth) = setup();
    let auth = auth.with_forwarded_identity(own.clone());
    assert_eq!(auth.authenticate_request(None, Some(&signed_own)).await.expect("own key"), principal(Role::Inference));
    assert!(auth.authenticate_request(None, Some(&signed_gateway)).await.is_err(), "not yet the gateways' key");
    // The control plane named the gateways' key: it, and only it, counts from now on.
    auth.replace_forwarded_identity(gateways);
    assert!(auth.authenticate_request(None, Some(&signed_gateway)).await.is_ok());
    assert!(auth.authenticate_request(None, Some(&signed_own)).await.is_err(), "the worker token's key no longer");
}
