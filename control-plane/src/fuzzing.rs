//! Entry points into the access-token check the token service keeps private, for the fuzz
//! targets in `fuzz/` and their replay in the main workspace's tests. Not an API: nothing else
//! calls these, and they may change with the code they wrap.

use std::time::Duration;

use jsonwebtoken::DecodingKey;

use crate::auth::tokens::{Claims, TokenConfig, decode_claims, public_jwk, token_kid};
use crate::error::{Error, Result};

/// Verifies `token` as [`crate::auth::tokens::TokenService::verify`] does, with one published
/// key: the Ed25519 `public_key` named `kid`. Claims must name `issuer` and `audience`, and the
/// token must not be issued after `unix_now` (beyond the leeway).
pub fn verify_token(
    token: &str,
    kid: &str,
    public_key: &[u8],
    issuer: &str,
    audience: &str,
    unix_now: i64,
) -> Result<Claims> {
    if token_kid(token)? != kid {
        return Err(Error::Unauthenticated);
    }
    let key = DecodingKey::from_jwk(&public_jwk(kid, public_key))
        .map_err(|e| Error::Internal(format!("load key {kid}: {e}")))?;
    let config = TokenConfig { issuer: issuer.into(), audience: audience.into(), ttl: Duration::ZERO };
    decode_claims(token, &key, &config, unix_now)
}
