//! Signed audit checkpoints: the head of each tenant's audit chain, signed with an Ed25519 key
//! the database never holds, written to the artifact store as
//! `audit/checkpoints/<tenant id>/<seq, 20 digits>.json` (as CloudTrail writes signed digest
//! files), and checked by `/v1/audit/verify`.
//!
//! What a checkpoint proves: when it was signed, the chain's event `seq` had hash `head_hash`,
//! and since every hash covers the previous one, events 1..=`seq` were exactly what they are
//! now only if the chain still links up to an event `seq` with that hash. So whoever can write
//! the database cannot afterwards truncate the chain below a checkpoint, edit or replace an
//! event at or before it (even re-hashing and re-chaining everything), without verification
//! naming the checkpoint. What it cannot prove: anything about events after the newest
//! checkpoint (they can be appended, removed or re-chained undetected until a checkpoint
//! covers them, and a well-formed event appended by someone with database access is then
//! signed like any other); that an event was genuine when it was signed; and that no newer
//! checkpoint file was deleted from the store (use the store's versioning or object lock).
//!
//! The checkpointer only signs a head that extends its previous checkpoint (the first one: a
//! chain that verifies from its start), so tampering is never laundered into a fresh
//! signature; it logs an error instead and the old checkpoint stays as evidence.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::error::Result;
use crate::registry::{ChainBreak, Registry};
use crate::store::ArtifactStore;

/// Where checkpoints live in the artifact store.
pub const PREFIX: &str = "audit/checkpoints";
/// First line of the signed message and the `format` of a checkpoint file.
pub const FORMAT: &str = "tessera-audit-checkpoint-v1";
/// Default `--audit-checkpoint-secs`.
pub const DEFAULT_INTERVAL_SECS: u64 = 300;
/// Checkpoint files verification reads, newest first, looking for one that verifies: forged
/// files cannot make it read the whole store.
const MAX_EXAMINED: usize = 16;
/// Largest checkpoint file read (they are a few hundred bytes).
const MAX_FILE_BYTES: u64 = 64 * 1024;
/// How long the last checkpoint at shutdown may take.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(10);

/// The Ed25519 key that signs checkpoints (PKCS#8 PEM on disk); `Debug` shows only its id.
#[derive(Clone)]
pub struct CheckpointKey {
    signing: SigningKey,
    key_id: String,
}

impl fmt::Debug for CheckpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CheckpointKey({})", self.key_id)
    }
}

/// A public key's id: hex of the first 8 bytes of the sha256 of its 32 raw bytes.
pub fn key_id(key: &VerifyingKey) -> String {
    hex::encode(&Sha256::digest(key.as_bytes())[..8])
}

impl CheckpointKey {
    fn from_signing(signing: SigningKey) -> Self {
        let key_id = key_id(&signing.verifying_key());
        CheckpointKey { signing, key_id }
    }

    /// A new random key (`tessera dev`).
    pub fn generate() -> Self {
        let mut seed = [0u8; 32];
        rand::fill(&mut seed[..]);
        Self::from_signing(SigningKey::from_bytes(&seed))
    }

    /// Parses a PKCS#8 PEM private key (`openssl genpkey -algorithm ed25519`).
    pub fn from_pem(pem: &str) -> anyhow::Result<Self> {
        let signing = SigningKey::from_pkcs8_pem(pem.trim())
            .map_err(|e| anyhow::anyhow!("not an Ed25519 private key in PKCS#8 PEM: {e}"))?;
        Ok(Self::from_signing(signing))
    }

    /// Reads a key file written by [`CheckpointKey::to_pem`] or openssl.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let pem = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        Self::from_pem(&pem).with_context(|| format!("read {}", path.display()))
    }

    /// The private key as PKCS#8 PEM.
    pub fn to_pem(&self) -> anyhow::Result<String> {
        let pem = self.signing.to_pkcs8_pem(LineEnding::LF).map_err(|e| anyhow::anyhow!("encode the key: {e}"))?;
        Ok(pem.as_str().to_owned())
    }

    /// The public half.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.signing.verifying_key()
    }

    /// The public key's id, named in every checkpoint it signs.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The public key as SPKI PEM (`openssl pkeyutl -verify -pubin -inkey` reads it).
    pub fn public_pem(&self) -> String {
        // A 32-byte Ed25519 key always encodes.
        self.verifying_key().to_public_key_pem(LineEnding::LF).expect("an Ed25519 public key encodes as SPKI")
    }

    /// Signs `(tenant, seq, head_hash)` as of `now` (kept to the second).
    pub fn sign(&self, tenant_id: Uuid, seq: i64, head_hash: &str, now: OffsetDateTime) -> Checkpoint {
        let signed_at = now.replace_nanosecond(0).unwrap_or(now).format(&Rfc3339).unwrap_or_else(|_| now.to_string());
        let message = signed_message(tenant_id, seq, head_hash, &signed_at);
        let signature = BASE64.encode(self.signing.sign(message.as_bytes()).to_bytes());
        Checkpoint {
            format: FORMAT.to_string(),
            tenant_id,
            seq,
            head_hash: head_hash.to_string(),
            signed_at,
            key_id: self.key_id.clone(),
            signature,
        }
    }
}

/// The exact bytes a checkpoint's signature covers: five lines, each ending in `\n`.
pub fn signed_message(tenant_id: Uuid, seq: i64, head_hash: &str, signed_at: &str) -> String {
    format!("{FORMAT}\n{tenant_id}\n{seq}\n{head_hash}\n{signed_at}\n")
}

/// One checkpoint file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Always [`FORMAT`].
    pub format: String,
    /// The tenant whose chain this is.
    pub tenant_id: Uuid,
    /// Sequence number of the chain's head when signed.
    pub seq: i64,
    /// Hash of that event.
    pub head_hash: String,
    /// When it was signed (RFC 3339, whole seconds), exactly as signed.
    pub signed_at: String,
    /// Id of the signing key ([`key_id`]).
    pub key_id: String,
    /// Base64 Ed25519 signature of [`signed_message`].
    pub signature: String,
}

impl Checkpoint {
    /// Checks the signature with `key`.
    pub fn verify(&self, key: &VerifyingKey) -> std::result::Result<(), &'static str> {
        if self.format != FORMAT {
            return Err("unknown checkpoint format");
        }
        if self.key_id != key_id(key) {
            return Err("signed by another key than this control plane's");
        }
        let bytes = BASE64.decode(&self.signature).map_err(|_| "signature is not base64")?;
        let signature = Signature::from_slice(&bytes).map_err(|_| "signature has the wrong length")?;
        let message = signed_message(self.tenant_id, self.seq, &self.head_hash, &self.signed_at);
        key.verify_strict(message.as_bytes(), &signature).map_err(|_| "signature does not verify")
    }
}

/// The object key of a tenant's checkpoint at `seq`; zero-padded so names sort by sequence.
pub fn object_key(tenant_id: Uuid, seq: i64) -> String {
    format!("{PREFIX}/{tenant_id}/{seq:020}.json")
}

/// A checkpoint file that does not check out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCheckpoint {
    /// Its object key.
    pub object: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The newest checkpoint of a tenant that verifies, and the newer files that do not.
#[derive(Debug, Clone, Default)]
pub struct LatestCheckpoint {
    /// The newest valid checkpoint and its object key.
    pub valid: Option<(String, Checkpoint)>,
    /// Files newer than it (or all examined, if none verifies) that do not verify.
    pub invalid: Vec<InvalidCheckpoint>,
}

/// Finds a tenant's newest checkpoint that verifies with `key`, reading at most
/// `MAX_EXAMINED` files newest first.
pub async fn latest(store: &ArtifactStore, key: &VerifyingKey, tenant_id: Uuid) -> Result<LatestCheckpoint> {
    let mut objects = store.list_keys(&format!("{PREFIX}/{tenant_id}/")).await?;
    objects.sort_unstable_by(|a, b| b.cmp(a));
    let mut found = LatestCheckpoint::default();
    for object in objects.into_iter().take(MAX_EXAMINED) {
        let Some(bytes) = store.get_small(&object, MAX_FILE_BYTES).await? else { continue };
        match check_file(&object, &bytes, key, tenant_id) {
            Ok(checkpoint) => {
                found.valid = Some((object, checkpoint));
                break;
            }
            Err(reason) => found.invalid.push(InvalidCheckpoint { object, reason }),
        }
    }
    Ok(found)
}

/// Parses and checks one file: well-formed, for this tenant, at the sequence its name says,
/// signed by `key`.
fn check_file(
    object: &str,
    bytes: &[u8],
    key: &VerifyingKey,
    tenant_id: Uuid,
) -> std::result::Result<Checkpoint, String> {
    let checkpoint: Checkpoint = serde_json::from_slice(bytes).map_err(|e| format!("not a checkpoint file: {e}"))?;
    if checkpoint.tenant_id != tenant_id || object_key(tenant_id, checkpoint.seq) != object {
        return Err("its tenant or sequence number does not match its name".into());
    }
    checkpoint.verify(key).map_err(str::to_string)?;
    Ok(checkpoint)
}

/// How a chain no longer matches a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = CheckpointViolationKind)]
pub enum Violation {
    /// The chain ends before the checkpointed event.
    Truncated,
    /// The checkpointed event has another hash now: it or an event before it was rewritten.
    Rewritten,
}

impl Violation {
    /// Stable name in API answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Violation::Truncated => "truncated",
            Violation::Rewritten => "rewritten",
        }
    }

    /// What it means, for people.
    pub fn reason(self) -> &'static str {
        match self {
            Violation::Truncated => {
                "the chain is shorter than a signed checkpoint: events were deleted after it was signed"
            }
            Violation::Rewritten => {
                "the checkpointed event's hash changed since it was signed: it or an earlier event was rewritten"
            }
        }
    }
}

/// Compares a checkpoint with the chain: its recorded head's sequence number and the hash of
/// the event now at the checkpoint's sequence (`None`: no such event).
pub fn compare(checkpoint: &Checkpoint, head_seq: i64, hash_at_seq: Option<&str>) -> Option<Violation> {
    match hash_at_seq {
        _ if head_seq < checkpoint.seq => Some(Violation::Truncated),
        None => Some(Violation::Truncated),
        Some(hash) if hash != checkpoint.head_hash => Some(Violation::Rewritten),
        Some(_) => None,
    }
}

/// What the checkpointer did for one tenant.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Wrote a new checkpoint.
    Signed,
    /// The head is already signed (by us before, or by another replica).
    Unchanged,
    /// The chain no longer extends the previous checkpoint: not signed.
    Refused(ChainBreak),
}

/// The checkpointer's parts and memory: the last head signed or found signed, per tenant.
struct Checkpointer {
    registry: Registry,
    store: ArtifactStore,
    key: CheckpointKey,
    signed: HashMap<Uuid, (i64, String)>,
}

/// Signs every tenant's chain head at start-up, every `--audit-checkpoint-secs` when it moved,
/// and once more at shutdown. Off without `--audit-signing-key-file` (`key` is `None`).
pub async fn run_checkpoints(
    registry: Registry,
    store: ArtifactStore,
    key: Option<CheckpointKey>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let Some(key) = key else {
        tracing::warn!("no --audit-signing-key-file: audit checkpoints are off");
        return;
    };
    tracing::info!(key_id = key.key_id(), "signing audit checkpoints");
    let mut checkpointer = Checkpointer { registry, store, key, signed: HashMap::new() };
    loop {
        checkpointer.tick().await;
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(interval) => {}
        }
    }
    // A clean stop leaves the final head signed.
    if tokio::time::timeout(SHUTDOWN_BUDGET, checkpointer.tick()).await.is_err() {
        tracing::warn!("the last audit checkpoint did not finish before shutdown");
    }
}

impl Checkpointer {
    async fn tick(&mut self) {
        let heads = match self.registry.audit_heads().await {
            Ok(heads) => heads,
            Err(e) => {
                tracing::warn!(error = %e, "could not read audit heads for checkpoints");
                crate::metrics::observe_checkpoint("error");
                return;
            }
        };
        for (tenant, seq, hash) in heads {
            if seq == 0 || self.signed.get(&tenant).is_some_and(|(s, h)| *s == seq && *h == hash) {
                continue;
            }
            match self.checkpoint(tenant, (seq, hash)).await {
                Ok(Outcome::Signed) => crate::metrics::observe_checkpoint("signed"),
                Ok(Outcome::Unchanged) => {}
                Ok(Outcome::Refused(b)) => {
                    crate::metrics::observe_checkpoint("refused");
                    tracing::error!(tenant = %tenant, seq = b.seq, reason = b.reason,
                        "audit chain no longer extends its last checkpoint; not signing it");
                }
                Err(e) => {
                    crate::metrics::observe_checkpoint("error");
                    tracing::warn!(tenant = %tenant, error = %e, "could not write an audit checkpoint");
                }
            }
        }
    }

    async fn checkpoint(&mut self, tenant: Uuid, head: (i64, String)) -> Result<Outcome> {
        let previous = match self.signed.get(&tenant) {
            Some(p) => Some(p.clone()),
            None => {
                latest(&self.store, &self.key.verifying_key(), tenant).await?.valid.map(|(_, c)| (c.seq, c.head_hash))
            }
        };
        if previous.as_ref() == Some(&head) {
            self.signed.insert(tenant, head);
            return Ok(Outcome::Unchanged);
        }
        if let Err(b) = self.registry.audit_chain_extends(tenant, previous, &head).await? {
            return Ok(Outcome::Refused(b));
        }
        let checkpoint = self.key.sign(tenant, head.0, &head.1, crate::registry::now());
        // Plain data; serialising it cannot fail.
        let body = serde_json::to_vec_pretty(&checkpoint).expect("a checkpoint serialises");
        let written = self.store.put_if_absent(&object_key(tenant, head.0), body.into()).await?;
        self.signed.insert(tenant, head);
        Ok(if written { Outcome::Signed } else { Outcome::Unchanged })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(secs).expect("valid time")
    }

    #[test]
    fn checkpoints_verify_and_tampering_does_not() {
        let key = CheckpointKey::generate();
        let tenant = Uuid::from_u128(9);
        let c = key.sign(tenant, 42, &"ab".repeat(32), at(1_700_000_000) + time::Duration::milliseconds(250));
        assert_eq!(c.signed_at, "2023-11-14T22:13:20Z", "kept to the second");
        assert_eq!(c.verify(&key.verifying_key()), Ok(()));
        let json = serde_json::to_vec(&c).expect("serialises");
        let object = object_key(tenant, 42);
        assert_eq!(object, format!("audit/checkpoints/{tenant}/00000000000000000042.json"));
        assert_eq!(check_file(&object, &json, &key.verifying_key(), tenant), Ok(c.clone()));

        let forged = Checkpoint { seq: 43, ..c.clone() };
        assert_eq!(forged.verify(&key.verifying_key()), Err("signature does not verify"));
        let moved = Checkpoint { head_hash: "cd".repeat(32), ..c.clone() };
        assert_eq!(moved.verify(&key.verifying_key()), Err("signature does not verify"));
        let other = CheckpointKey::generate();
        assert_eq!(c.verify(&other.verifying_key()), Err("signed by another key than this control plane's"));
        let resigned = Checkpoint { key_id: other.key_id().to_string(), ..c.clone() };
        assert_eq!(resigned.verify(&other.verifying_key()), Err("signature does not verify"));
        assert!(check_file(&object_key(tenant, 41), &json, &key.verifying_key(), tenant).is_err(), "renamed file");
        assert!(check_file(&object, b"{", &key.verifying_key(), tenant).is_err());
    }

    #[test]
    fn keys_round_trip_through_pem() {
        let key = CheckpointKey::generate();
        let pem = key.to_pem().expect("encodes");
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let back = CheckpointKey::from_pem(&pem).expect("parses");
        assert_eq!(back.key_id(), key.key_id());
        assert!(key.public_pem().starts_with("-----BEGIN PUBLIC KEY-----"));
        assert!(CheckpointKey::from_pem("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----").is_err());
        assert!(!format!("{key:?}").contains(&pem));
    }

    #[test]
    fn openssl_keys_are_read() {
        // `openssl genpkey -algorithm ed25519` (PKCS#8 v1).
        let pem = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIOhazNTFV7OjvlPKLPsMbEgRUzgxPnwOgAEU9dfi59JG\n-----END PRIVATE KEY-----\n";
        let key = CheckpointKey::from_pem(pem).expect("openssl's format parses");
        assert_eq!(key.key_id().len(), 16);
    }

    #[test]
    fn comparison_names_truncation_and_rewrites() {
        let key = CheckpointKey::generate();
        let c = key.sign(Uuid::from_u128(1), 5, "h5", at(0));
        assert_eq!(compare(&c, 5, Some("h5")), None);
        assert_eq!(compare(&c, 9, Some("h5")), None, "events appended after it are fine");
        assert_eq!(compare(&c, 4, None), Some(Violation::Truncated));
        assert_eq!(compare(&c, 4, Some("h5")), Some(Violation::Truncated), "head moved back");
        assert_eq!(compare(&c, 9, None), Some(Violation::Truncated), "event deleted");
        assert_eq!(compare(&c, 5, Some("x")), Some(Violation::Rewritten));
    }
}
