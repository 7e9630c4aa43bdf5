//! API key format, generation and hashing.
//!
//! The key format ([`tessera_protocol::auth::api_key`]) is shared with the workers, which tell
//! keys from tokens by it. The registry stores
//! HMAC-SHA256(pepper, key). A slow password hash (argon2) exists to make guessing
//! low-entropy passwords expensive; these secrets are random and too long to guess, so a
//! fast keyed hash loses nothing, and it keeps authentication cheap on every request. The
//! optional pepper (kept out of the database) makes a stolen table useless on its own.

use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::Sha256;

pub use tessera_protocol::auth::api_key::prefix_of;
use tessera_protocol::auth::api_key::{ID_ALPHABET, ID_LEN, PREFIX as KEY_PREFIX, SECRET_ALPHABET, SECRET_LEN};

/// A freshly generated key: shown to its creator once, then only its hash is kept.
#[derive(Clone)]
pub struct GeneratedKey {
    /// The whole key.
    pub key: String,
    /// Its public prefix (`tsk_<id>`).
    pub prefix: String,
}

impl std::fmt::Debug for GeneratedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedKey").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

fn random_string(alphabet: &[u8], len: usize) -> String {
    let mut rng = rand::rng();
    (0..len).map(|_| char::from(alphabet[rng.random_range(0..alphabet.len())])).collect()
}

/// Generates a new key.
pub fn generate() -> GeneratedKey {
    let prefix = format!("{KEY_PREFIX}{}", random_string(ID_ALPHABET, ID_LEN));
    let key = format!("{prefix}_{}", random_string(SECRET_ALPHABET, SECRET_LEN));
    GeneratedKey { key, prefix }
}

/// Hashes and checks keys with the deployment's pepper.
#[derive(Clone)]
pub struct KeyHasher {
    pepper: Vec<u8>,
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher(..)")
    }
}

impl KeyHasher {
    /// A hasher keyed with `pepper` (may be empty).
    pub fn new(pepper: &[u8]) -> Self {
        KeyHasher { pepper: pepper.to_vec() }
    }

    fn mac(&self, key: &str) -> Hmac<Sha256> {
        // HMAC accepts keys of any length.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.pepper).expect("hmac takes any key length");
        mac.update(key.as_bytes());
        mac
    }

    /// The stored form of `key` (hex).
    pub fn hash(&self, key: &str) -> String {
        hex::encode(self.mac(key).finalize().into_bytes())
    }

    /// Whether `key` matches the stored hash, compared in constant time.
    pub fn verify(&self, key: &str, stored_hex: &str) -> bool {
        match hex::decode(stored_hex) {
            Ok(stored) => self.mac(key).verify_slice(&stored).is_ok(),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_parse_and_verify() {
        let k = generate();
        assert_eq!(prefix_of(&k.key), Some(k.prefix.as_str()));
        assert!(k.key.starts_with("tsk_"));
        let h = KeyHasher::new(b"pepper");
        let stored = h.hash(&k.key);
        assert!(h.verify(&k.key, &stored));
        assert!(!KeyHasher::new(b"other").verify(&k.key, &stored));
        assert!(!h.verify(&generate().key, &stored));
        assert_ne!(generate().key, k.key);
    }

    #[test]
    fn malformed_keys_have_no_prefix() {
        let k = generate().key;
        for bad in ["", "tsk_", "Bearer x", &k[..k.len() - 1], &format!("{k}x"), &k.replace("tsk_", "tsx_")] {
            assert_eq!(prefix_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn debug_does_not_show_the_secret() {
        let k = generate();
        assert!(!format!("{k:?}").contains(&k.key));
    }
}
