//! Resolves a bearer credential to a [`Principal`]: API keys (`tsk_...`) through the
//! [`CredentialSource`] behind a cache, access tokens (EdDSA JWTs) offline against the cached
//! signing keys (JWKS).
//!
//! Revocation: the control plane pushes a list of revoked keys and disabled users
//! ([`Authenticator::apply_revocations`]); tokens issued before a listed revocation are refused,
//! and cached answers for listed keys are dropped (and refused if they come back).
//!
//! Static stability: while the control plane is unreachable, a cached API key keeps working
//! until its own expiry (a re-check that cannot reach the control plane keeps the cached
//! answer; one the control plane *rejects* evicts it at once), and tokens keep verifying
//! against the last signing keys fetched and the last revocation list.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};
use tessera_protocol::auth::{AccessClaims, api_key};
use tessera_protocol::revocation::RevocationList;
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use super::forwarded::IdentityKey;
use super::revocations::Revocations;
use super::{CredentialSource, KeyInfo, Principal, SourceError, TokenKeys};
use crate::error::Error;

/// How long a rejected API key is answered from the cache, so a flood of bad keys costs the
/// control plane one lookup per key every few seconds.
const REJECTED_TTL: Duration = Duration::from_secs(5);
/// After a re-check found the control plane unreachable, how long until the next attempt (the
/// cached answer is served meanwhile).
const UNAVAILABLE_RETRY: Duration = Duration::from_secs(5);
/// A re-check in flight pushes the next one this far out, so concurrent requests with the same
/// key serve the cached answer instead of all asking (and a dropped re-check is retried).
const RECHECK_GRACE: Duration = Duration::from_secs(10);
/// Signing keys older than this are refreshed in the background.
const JWKS_MAX_AGE: Duration = Duration::from_secs(300);
/// At most one signing-key fetch per this interval, however many tokens name unknown keys.
const JWKS_MIN_INTERVAL: Duration = Duration::from_secs(5);
/// Tolerated clock skew on `exp`, `nbf` and `iat`, as the control plane allows.
const LEEWAY_SECS: u64 = 30;
/// Longer credentials are refused before any lookup.
const MAX_CREDENTIAL_LEN: usize = 8192;
/// Past this many cached keys, dead entries are purged and new rejections are not cached.
const MAX_CACHED_KEYS: usize = 100_000;

/// The vague answer to every credential that does not check out.
const INVALID: &str = "invalid credential";
/// The answer to a genuine token whose key was revoked or whose user was disabled.
const REVOKED_TOKEN: &str = "access token revoked: its API key was revoked or its user disabled";
/// The answer to an API key the revocation list names.
const REVOKED_KEY: &str = "API key revoked";

/// Checks bearer credentials against a [`CredentialSource`], with caches.
pub struct Authenticator {
    source: Arc<dyn CredentialSource>,
    key_cache_ttl: Duration,
    /// API key answers by the key's sha256 (raw keys are never stored). Request handlers read
    /// and write it; no lock is held across an await.
    keys: Mutex<HashMap<[u8; 32], CachedKey>>,
    jwks: Arc<JwksCache>,
    /// Unix seconds now (key expiry, token `iat`); replaced in tests to move the clock.
    unix_now: fn() -> i64,
    /// Checks identities a gateway forwards, when this server accepts them (replaced when the
    /// control plane names the gateways' key).
    forwarded: Option<RwLock<IdentityKey>>,
    /// The last revocation list the control plane sent.
    revocations: Arc<Revocations>,
}

/// What the cache knows of one API key.
#[derive(Debug, Clone)]
enum CachedKey {
    /// The control plane vouched for the key; ask again from `recheck_at`.
    Valid { info: KeyInfo, recheck_at: Instant },
    /// The control plane rejected the key; refuse it without asking until `until`.
    Rejected { until: Instant },
}

/// The outcome of consulting the key cache.
enum Lookup {
    /// Fresh answer: the key is good.
    Hit(Principal),
    /// Fresh answer: the key is bad.
    Refused,
    /// Nothing usable: ask the control plane.
    Miss,
    /// A good answer that is due for a re-check: ask, and fall back to it if unreachable.
    Recheck,
}

impl Authenticator {
    /// An authenticator over `source`; resolved API keys are re-checked after `key_cache_ttl`.
    pub fn new(source: Arc<dyn CredentialSource>, key_cache_ttl: Duration) -> Self {
        let jwks = Arc::new(JwksCache {
            source: source.clone(),
            ring: RwLock::new(None),
            fetch: Arc::new(tokio::sync::Mutex::new(None)),
        });
        Self {
            source,
            key_cache_ttl,
            keys: Mutex::new(HashMap::new()),
            jwks,
            unix_now: system_unix_now,
            forwarded: None,
            revocations: Arc::default(),
        }
    }

    /// The revocation list held (for its metrics, and to mark it stale when its stream breaks).
    pub fn revocations(&self) -> Arc<Revocations> {
        self.revocations.clone()
    }

    /// Installs a revocation list the control plane sent, replacing the one held, and drops
    /// the cached answers for the keys (and users' keys) it names.
    pub fn apply_revocations(&self, list: RevocationList) {
        let list = self.revocations.replace(list);
        if list.is_empty() {
            return;
        }
        let mut keys = self.keys.lock();
        let before = keys.len();
        keys.retain(|_, entry| match entry {
            CachedKey::Valid { info, .. } => !list.revokes_key(info.key_id, info.user_id),
            CachedKey::Rejected { .. } => true,
        });
        let dropped = before - keys.len();
        if dropped > 0 {
            tracing::info!(dropped, "dropped cached API keys the revocation list names");
        }
    }

    /// Also accepts identities forwarded by gateways, signed with `key` (until
    /// [`Self::replace_forwarded_identity`]).
    pub fn with_forwarded_identity(mut self, key: IdentityKey) -> Self {
        self.forwarded = Some(RwLock::new(key));
        self
    }

    /// Checks forwarded identities with `key` from now on, and with no other (the control plane
    /// named the key its gateways sign with). No effect where forwarded identities are refused.
    pub fn replace_forwarded_identity(&self, key: IdentityKey) {
        if let Some(held) = &self.forwarded {
            *held.write() = key;
        }
    }

    /// Resolves a request's caller: a forwarded identity (`tessera-identity`) when one is
    /// present (then only it counts), else the `Authorization` header.
    pub async fn authenticate_request(
        &self,
        authorization: Option<&str>,
        identity: Option<&str>,
    ) -> Result<Principal, Error> {
        match (identity, &self.forwarded) {
            (Some(value), Some(key)) => key.read().verify(value, (self.unix_now)()),
            (Some(_), None) => Err(Error::unauthenticated("this server does not accept forwarded identities")),
            (None, _) => self.authenticate(authorization).await,
        }
    }

    /// Resolves an `Authorization` header value (`Bearer <API key or access token>`).
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, Error> {
        let credential = bearer_credential(authorization)?;
        if api_key::looks_like_key(credential) {
            self.authenticate_key(credential).await
        } else {
            self.authenticate_token(credential).await
        }
    }

    async fn authenticate_key(&self, key: &str) -> Result<Principal, Error> {
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let recheck = match self.cached_key(&hash, Instant::now()) {
            Lookup::Hit(principal) => return Ok(principal),
            Lookup::Refused => return Err(Error::unauthenticated(INVALID)),
            Lookup::Miss => false,
            Lookup::Recheck => true,
        };
        let answer = self.source.resolve_key(key).await;
        self.store_key_answer(hash, answer, recheck)
    }

    /// Reads the cache; marks a due re-check as started so concurrent requests keep using the
    /// cached answer meanwhile.
    fn cached_key(&self, hash: &[u8; 32], now: Instant) -> Lookup {
        let mut keys = self.keys.lock();
        let Some(entry) = keys.get_mut(hash) else { return Lookup::Miss };
        match entry {
            CachedKey::Rejected { until } if now < *until => Lookup::Refused,
            CachedKey::Rejected { .. } => {
                keys.remove(hash);
                Lookup::Miss
            }
            CachedKey::Valid { info, .. } if self.expired(info) => {
                keys.remove(hash);
                Lookup::Refused
            }
            CachedKey::Valid { info, recheck_at } if now < *recheck_at => Lookup::Hit(info.principal.clone()),
            CachedKey::Valid { recheck_at, .. } => {
                *recheck_at = now + RECHECK_GRACE;
                Lookup::Recheck
            }
        }
    }

    fn store_key_answer(
        &self,
        hash: [u8; 32],
        answer: Result<KeyInfo, SourceError>,
        recheck: bool,
    ) -> Result<Principal, Error> {
        let now = Instant::now();
        let mut keys = self.keys.lock();
        match answer {
            // An answer given before a revocation that arrived meanwhile. Checked under the
            // cache lock, which `apply_revocations` takes after installing a list: an answer
            // stored before that is dropped there, one stored after is refused here.
            Ok(info) if self.revocations.revokes_key(info.key_id, info.user_id) => {
                self.insert_key(&mut keys, hash, CachedKey::Rejected { until: now + REJECTED_TTL });
                Err(Error::unauthenticated(REVOKED_KEY))
            }
            Ok(info) if !self.expired(&info) => {
                let principal = info.principal.clone();
                self.insert_key(&mut keys, hash, CachedKey::Valid { info, recheck_at: now + self.key_cache_ttl });
                Ok(principal)
            }
            Ok(_) | Err(SourceError::Rejected(_)) => {
                self.insert_key(&mut keys, hash, CachedKey::Rejected { until: now + REJECTED_TTL });
                Err(Error::unauthenticated(INVALID))
            }
            Err(SourceError::Unavailable(reason)) => {
                let cached = match keys.get_mut(&hash) {
                    Some(CachedKey::Valid { info, recheck_at }) if recheck && !self.expired(info) => {
                        *recheck_at = now + self.key_cache_ttl.min(UNAVAILABLE_RETRY);
                        Some(info.principal.clone())
                    }
                    _ => None,
                };
                tracing::warn!(%reason, serving_cached = cached.is_some(), "cannot reach the control plane to check an API key");
                cached.ok_or_else(|| {
                    Error::unavailable("cannot check the API key: the control plane is unreachable; try again later")
                })
            }
        }
    }

    /// Inserts an answer; at the size cap, purges dead entries first and drops new rejections
    /// rather than growing without bound.
    fn insert_key(&self, keys: &mut HashMap<[u8; 32], CachedKey>, hash: [u8; 32], entry: CachedKey) {
        if keys.len() >= MAX_CACHED_KEYS && !keys.contains_key(&hash) {
            let now = Instant::now();
            keys.retain(|_, e| match e {
                CachedKey::Valid { info, .. } => !self.expired(info),
                CachedKey::Rejected { until } => now < *until,
            });
            if keys.len() >= MAX_CACHED_KEYS && matches!(entry, CachedKey::Rejected { .. }) {
                return;
            }
        }
        keys.insert(hash, entry);
    }

    fn expired(&self, info: &KeyInfo) -> bool {
        info.expires_at.is_some_and(|at| at <= (self.unix_now)())
    }

    async fn authenticate_token(&self, token: &str) -> Result<Principal, Error> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Error::unauthenticated(INVALID))?;
        // Only EdDSA: refusing other algorithms before any key lookup means an HS* token can
        // never be checked against a public key used as an HMAC secret.
        if header.alg != Algorithm::EdDSA {
            return Err(Error::unauthenticated(INVALID));
        }
        let kid = header.kid.ok_or_else(|| Error::unauthenticated(INVALID))?;
        let mut ring = self.jwks.keys().await?;
        if !ring.keys.contains_key(&kid) {
            // The control plane may have rotated its signing key since the last fetch.
            ring = self.jwks.refresh().await?;
        }
        let key = ring.keys.get(&kid).ok_or_else(|| Error::unauthenticated(INVALID))?;
        let data = jsonwebtoken::decode::<AccessClaims>(token, key, &ring.validation).map_err(|e| {
            tracing::debug!(error = %e, "access token refused");
            match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => Error::unauthenticated("access token has expired"),
                _ => Error::unauthenticated(INVALID),
            }
        })?;
        let claims = data.claims;
        // jsonwebtoken never looks at `iat`; a token issued in the future is refused like one
        // whose `nbf` has not come yet.
        if claims.iat > (self.unix_now)().saturating_add(LEEWAY_SECS as i64) {
            tracing::debug!(iat = claims.iat, "access token refused: issued in the future");
            return Err(Error::unauthenticated(INVALID));
        }
        if self.revocations.revokes_token(&claims) {
            tracing::debug!(sub = %claims.sub, "access token refused: revoked");
            return Err(Error::unauthenticated(REVOKED_TOKEN));
        }
        Ok(Principal {
            tenant_id: claims.tenant.to_string(),
            tenant_name: claims.tenant_name,
            role: claims.role,
            key_id: uuid::Uuid::try_parse(&claims.sub).ok(),
        })
    }
}

/// Unix seconds now.
pub(crate) fn system_unix_now() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
}

/// Extracts the credential from `Bearer <credential>` (scheme case-insensitive, RFC 7235).
/// Surrounding whitespace is ignored: HTTP strips it from header values, gRPC metadata keeps it
/// (`perf_analyzer -H "authorization: Bearer …"` sends ` Bearer …`).
fn bearer_credential(authorization: Option<&str>) -> Result<&str, Error> {
    let header = authorization.ok_or_else(|| {
        Error::unauthenticated("missing Authorization header: send 'Bearer <API key or access token>'")
    })?;
    let credential = header
        .trim()
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, rest)| rest.trim())
        .ok_or_else(|| Error::unauthenticated("the Authorization header must use the Bearer scheme"))?;
    if credential.is_empty() || credential.len() > MAX_CREDENTIAL_LEN {
        return Err(Error::unauthenticated(INVALID));
    }
    Ok(credential)
}

/// Verification keys by `kid`, with the validation rules the control plane's settings imply.
struct KeyRing {
    keys: HashMap<String, DecodingKey>,
    validation: Validation,
    fetched_at: Instant,
}

impl KeyRing {
    /// Parses the JWKS; keys other than Ed25519 (or without a `kid`) are ignored.
    fn parse(keys: &TokenKeys) -> Result<Self, String> {
        let set: JwkSet = serde_json::from_str(&keys.jwks_json).map_err(|e| format!("invalid JWKS: {e}"))?;
        let mut ring = HashMap::new();
        for jwk in &set.keys {
            let ed25519 =
                matches!(&jwk.algorithm, AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519);
            let Some(kid) = jwk.common.key_id.as_ref().filter(|_| ed25519) else { continue };
            match DecodingKey::from_jwk(jwk) {
                Ok(key) => {
                    ring.insert(kid.clone(), key);
                }
                Err(e) => tracing::warn!(kid, error = %e, "ignoring an unusable token-signing key"),
            }
        }
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_issuer(&[&keys.issuer]);
        validation.set_audience(&[&keys.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        // Checked when present: tokens issued before the control plane added `nbf` carry none.
        validation.validate_nbf = true;
        validation.leeway = LEEWAY_SECS;
        Ok(Self { keys: ring, validation, fetched_at: Instant::now() })
    }
}

/// The token-signing keys last fetched from the source.
struct JwksCache {
    source: Arc<dyn CredentialSource>,
    /// Swapped whole by a successful fetch; kept when a fetch fails.
    ring: RwLock<Option<Arc<KeyRing>>>,
    /// Held for the duration of a fetch (one at a time); holds when the last one started.
    fetch: Arc<tokio::sync::Mutex<Option<Instant>>>,
}

impl JwksCache {
    /// The current keys, fetching them if there are none yet; old keys are refreshed in the
    /// background while still being used.
    async fn keys(self: &Arc<Self>) -> Result<Arc<KeyRing>, Error> {
        let Some(ring) = self.ring.read().clone() else { return self.refresh().await };
        if ring.fetched_at.elapsed() >= JWKS_MAX_AGE
            && let Ok(guard) = self.fetch.clone().try_lock_owned()
        {
            let cache = self.clone();
            tokio::spawn(async move {
                let _ = cache.fetch_with(guard).await;
            });
        }
        Ok(ring)
    }

    /// Fetches the keys now unless a fetch started less than [`JWKS_MIN_INTERVAL`] ago; returns
    /// the keys held afterwards.
    async fn refresh(&self) -> Result<Arc<KeyRing>, Error> {
        let guard = self.fetch.clone().lock_owned().await;
        self.fetch_with(guard).await
    }

    async fn fetch_with(&self, mut last: OwnedMutexGuard<Option<Instant>>) -> Result<Arc<KeyRing>, Error> {
        if last.is_none_or(|at| at.elapsed() >= JWKS_MIN_INTERVAL) {
            *last = Some(Instant::now());
            let fetched = match self.source.token_keys().await {
                Ok(keys) => KeyRing::parse(&keys),
                Err(e) => Err(e.to_string()),
            };
            match fetched {
                Ok(ring) => *self.ring.write() = Some(Arc::new(ring)),
                Err(reason) => tracing::warn!(%reason, "cannot fetch the token-signing keys; keeping the old ones"),
            }
        }
        self.ring.read().clone().ok_or_else(|| {
            Error::unavailable("cannot verify the access token: the control plane is unreachable; try again later")
        })
    }
}

#[cfg(test)]
mod tests;
