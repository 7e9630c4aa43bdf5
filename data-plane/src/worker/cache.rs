//! The worker's artifact cache, `<data-dir>/cache/`: artifacts fetched from the control plane,
//! verified by sha256, kept across restarts.
//!
//! A download streams into a hidden temporary file while it is hashed, off the async runtime;
//! only a file whose size and sha256 match the assignment is renamed to `<sha256>.<ext>`
//! (`onnx`, `tar` or `zip`), so a file with that name is complete. A cached file is hashed
//! again the first time this process uses it (a restart does not trust the disk blindly) and
//! fetched again if it no longer matches. Archives are unpacked once into `<sha256>.d/` (see
//! [`super::archive`]), through a temporary directory renamed into place.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use parking_lot::Mutex;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tessera_protocol::agent;
use tessera_protocol::inference::ModelConfig;
use tessera_protocol::model_config;

use super::archive::{self, ArchiveKind};
use super::client::AgentClient;
use crate::engine::load_error::{LoadError, LoadErrorKind};

/// How long the control plane may take to start streaming an artifact.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the stream may stall between two chunks.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(60);
/// Chunks buffered between the network and the writer thread.
const WRITE_QUEUE: usize = 4;

/// A stream of artifact bytes.
pub type ByteStream = BoxStream<'static, Result<Bytes, String>>;

/// Where artifact bytes come from (the control plane; a fake in tests).
pub trait ArtifactSource: Send + Sync + 'static {
    /// Starts streaming the object stored under `key`.
    fn open(&self, key: &str) -> BoxFuture<'static, Result<ByteStream, String>>;
}

impl ArtifactSource for AgentClient {
    fn open(&self, key: &str) -> BoxFuture<'static, Result<ByteStream, String>> {
        let (mut client, key) = (self.clone(), key.to_string());
        async move {
            let request = agent::FetchArtifactRequest { key: key.clone() };
            let response = tokio::time::timeout(OPEN_TIMEOUT, client.fetch_artifact(request))
                .await
                .map_err(|_| format!("the control plane did not start sending artifact {key} in time"))?
                .map_err(|s| format!("fetching artifact {key} failed ({:?}): {}", s.code(), s.message()))?;
            let stream = response
                .into_inner()
                .map(move |chunk| chunk.map(|c| c.data).map_err(|s| format!("artifact stream broke: {}", s.message())));
            Ok(stream.boxed())
        }
        .boxed()
    }
}

/// The formats an artifact comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactFormat {
    /// One ONNX file.
    Onnx,
    /// A Triton model directory archive.
    Archive(ArchiveKind),
}

impl ArtifactFormat {
    /// Parses the assignment's `format`.
    pub fn parse(format: &str) -> Result<Self, String> {
        match format {
            "onnx" => Ok(Self::Onnx),
            "tar" => Ok(Self::Archive(ArchiveKind::Tar)),
            "zip" => Ok(Self::Archive(ArchiveKind::Zip)),
            other => Err(format!("unsupported artifact format '{other}' (expected onnx, tar or zip)")),
        }
    }

    /// File name extension in the cache.
    fn extension(self) -> &'static str {
        match self {
            Self::Onnx => "onnx",
            Self::Archive(ArchiveKind::Tar) => "tar",
            Self::Archive(ArchiveKind::Zip) => "zip",
        }
    }
}

/// A model ready to load: its ONNX file and its complete configuration.
#[derive(Debug, Clone)]
pub struct PreparedModel {
    /// The ONNX file.
    pub file: PathBuf,
    /// The archive's `config.pbtxt` under the assignment's config, named after the model.
    pub config: ModelConfig,
}

/// The artifact cache. Shared by every install; cheap to clone behind an `Arc`.
pub struct ArtifactCache {
    dir: PathBuf,
    source: Arc<dyn ArtifactSource>,
    /// sha256s whose cached files this process wrote or hashed; others are hashed before use.
    verified: Mutex<HashSet<String>>,
    /// One lock per sha256: replicas sharing an artifact fetch and unpack it once.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl ArtifactCache {
    /// Opens (creating) the cache directory and removes what an interrupted run left behind.
    pub fn open(dir: impl Into<PathBuf>, source: Arc<dyn ArtifactSource>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(&dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && (name.ends_with(".part") || name.ends_with(".tmp")) {
                let path = entry.path();
                let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
                if let Err(e) = removed {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a leftover temporary file");
                }
            }
        }
        Ok(Self { dir, source, verified: Mutex::default(), locks: Mutex::default() })
    }

    /// Fetches (or reuses) the artifact and finds the model to load for `version` of
    /// `model_name`, with `config_json` (the assignment's) over the archive's own config.
    pub async fn prepare(
        &self,
        artifact: &agent::Artifact,
        model_name: &str,
        version: i64,
        config_json: &str,
    ) -> Result<PreparedModel, LoadError> {
        let format = ArtifactFormat::parse(&artifact.format).map_err(LoadError::artifact)?;
        let sha = checked_sha256(&artifact.sha256).map_err(LoadError::artifact)?;
        let lock = self.locks.lock().entry(sha.clone()).or_default().clone();
        let _guard = lock.lock().await;
        let file = self.fetch(artifact, &sha, format).await?;
        let (file, base) = match format {
            ArtifactFormat::Onnx => (file, None),
            ArtifactFormat::Archive(kind) => {
                let found = match self.unpacked(&file, &sha, kind).await {
                    Ok(dir) => blocking(move || archive::find_model(&dir, version).map_err(LoadError::artifact)).await,
                    Err(e) => Err(e),
                };
                match found {
                    Ok(found) => (found.model_file, found.config),
                    Err(e) => {
                        // The next try fetches the artifact afresh instead of trusting this copy.
                        if e.kind == LoadErrorKind::Artifact {
                            self.forget(&file, &sha);
                        }
                        return Err(e);
                    }
                }
            }
        };
        let config = merged_config(base.as_ref(), config_json, model_name).map_err(LoadError::configuration)?;
        Ok(PreparedModel { file, config })
    }

    /// The verified cached file of an artifact, downloading it when missing or damaged.
    async fn fetch(&self, artifact: &agent::Artifact, sha: &str, format: ArtifactFormat) -> Result<PathBuf, LoadError> {
        let path = self.dir.join(format!("{sha}.{}", format.extension()));
        if path.is_file() {
            if self.verified.lock().contains(sha) {
                return Ok(path);
            }
            let (check, size) = (path.clone(), artifact.size_bytes);
            match blocking(move || hash_file(&check).map_err(LoadError::resources)).await {
                Ok((digest, len)) if digest == sha && (size == 0 || len == size) => {
                    tracing::info!(sha256 = sha, key = %artifact.key, "artifact reused from the cache");
                    self.verified.lock().insert(sha.to_string());
                    return Ok(path);
                }
                result => {
                    tracing::warn!(sha256 = sha, ?result, "cached artifact does not match; fetching it again");
                    self.forget(&path, sha);
                }
            }
        }
        self.download(artifact, sha, &path).await?;
        self.verified.lock().insert(sha.to_string());
        Ok(path)
    }

    /// Removes a cached file and what was unpacked from it.
    fn forget(&self, path: &Path, sha: &str) {
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_dir_all(self.dir.join(format!("{sha}.d")));
        self.verified.lock().remove(sha);
    }

    /// Streams the artifact to a temporary file, checks it, renames it to `path`.
    async fn download(&self, artifact: &agent::Artifact, sha: &str, path: &Path) -> Result<(), LoadError> {
        let started = std::time::Instant::now();
        let temp = self.dir.join(format!(".{sha}.{}.part", uuid::Uuid::new_v4().simple()));
        let result = self.download_to(artifact, sha, &temp, path).await;
        if result.is_err() {
            let _ = std::fs::remove_file(&temp);
        } else {
            let ms = started.elapsed().as_millis();
            tracing::info!(sha256 = sha, key = %artifact.key, bytes = artifact.size_bytes, ms, "artifact fetched");
        }
        result
    }

    /// Failing to reach the source or a broken stream is a fetch error (worth trying again),
    /// bytes that do not match the assignment an artifact error, a full disk a resource error.
    async fn download_to(
        &self,
        artifact: &agent::Artifact,
        sha: &str,
        temp: &Path,
        path: &Path,
    ) -> Result<(), LoadError> {
        let limit = (artifact.size_bytes > 0).then_some(artifact.size_bytes);
        let mut stream = self.source.open(&artifact.key).await.map_err(LoadError::fetch)?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(WRITE_QUEUE);
        let writer = {
            let temp = temp.to_path_buf();
            tokio::task::spawn_blocking(move || write_hashing(&temp, rx, limit))
        };
        let failure = loop {
            match tokio::time::timeout(CHUNK_TIMEOUT, stream.next()).await {
                Err(_) => {
                    break Some(LoadError::fetch(format!("artifact {} stalled for {CHUNK_TIMEOUT:?}", artifact.key)));
                }
                Ok(None) => break None,
                Ok(Some(Err(e))) => break Some(LoadError::fetch(e)),
                Ok(Some(Ok(chunk))) => {
                    // A closed channel means the writer stopped; its own error says why.
                    if tx.send(chunk).await.is_err() {
                        break None;
                    }
                }
            }
        };
        drop(tx);
        let written = writer.await.map_err(|e| LoadError::resources(format!("artifact writer failed: {e}")))?;
        if let Some(failure) = failure {
            return Err(failure);
        }
        let (digest, size) = written?;
        if let Some(expected) = limit.filter(|l| *l != size) {
            return Err(LoadError::artifact(format!("artifact {} is {size} bytes, expected {expected}", artifact.key)));
        }
        if digest != sha {
            let why = format!("artifact {} failed verification: sha256 is {digest}, expected {sha}", artifact.key);
            return Err(LoadError::artifact(why));
        }
        std::fs::rename(temp, path)
            .map_err(|e| LoadError::resources(format!("cannot move the artifact into the cache: {e}")))
    }

    /// The directory an archive is unpacked into, unpacking it the first time.
    async fn unpacked(&self, file: &Path, sha: &str, kind: ArchiveKind) -> Result<PathBuf, LoadError> {
        let dir = self.dir.join(format!("{sha}.d"));
        if dir.is_dir() {
            return Ok(dir);
        }
        let temp = self.dir.join(format!(".{sha}.d.{}.tmp", uuid::Uuid::new_v4().simple()));
        let (archive, into, target) = (file.to_path_buf(), temp.clone(), dir.clone());
        let result = blocking(move || {
            std::fs::create_dir(&into)
                .map_err(|e| LoadError::resources(format!("cannot create {}: {e}", into.display())))?;
            archive::unpack(kind, &archive, &into).map_err(LoadError::artifact)?;
            std::fs::rename(&into, &target)
                .map_err(|e| LoadError::resources(format!("cannot move the unpacked model into place: {e}")))
        })
        .await;
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&temp);
        }
        result.map(|()| dir)
    }
}

/// Runs blocking file work off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, LoadError> + Send + 'static,
) -> Result<T, LoadError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| LoadError::resources(format!("file task failed: {e}")))?
}

/// Writes chunks to `path` while hashing them; stops past `limit` bytes. Blocking.
fn write_hashing(
    path: &Path,
    mut chunks: tokio::sync::mpsc::Receiver<Bytes>,
    limit: Option<u64>,
) -> Result<(String, u64), LoadError> {
    let mut file = std::fs::File::create(path)
        .map_err(|e| LoadError::resources(format!("cannot create {}: {e}", path.display())))?;
    let (mut hasher, mut size) = (Sha256::new(), 0u64);
    while let Some(chunk) = chunks.blocking_recv() {
        size += chunk.len() as u64;
        if let Some(limit) = limit.filter(|l| size > *l) {
            return Err(LoadError::artifact(format!("artifact is larger than the {limit} bytes announced")));
        }
        hasher.update(&chunk);
        file.write_all(&chunk).map_err(|e| LoadError::resources(format!("cannot write the artifact: {e}")))?;
    }
    file.sync_all().map_err(|e| LoadError::resources(format!("cannot write the artifact: {e}")))?;
    Ok((hex::encode(hasher.finalize()), size))
}

/// sha256 and size of a file. Blocking.
fn hash_file(path: &Path) -> Result<(String, u64), String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let (mut hasher, mut size, mut buf) = (Sha256::new(), 0u64, vec![0u8; 1 << 20]);
    loop {
        let n = file.read(&mut buf).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if n == 0 {
            return Ok((hex::encode(hasher.finalize()), size));
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
}

/// The sha256 as it is used in file names: 64 lower-case hex digits, nothing else.
fn checked_sha256(sha: &str) -> Result<String, String> {
    let sha = sha.to_ascii_lowercase();
    if sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(sha)
    } else {
        Err(format!("artifact sha256 '{sha}' is not 64 hex digits"))
    }
}

/// The configuration a replica loads with: the archive's `config.pbtxt` (if any) under the
/// assignment's JSON config, named `name`. The assignment wins field by field (objects merge,
/// lists and scalars replace); its empty lists and default scalars (`0`, `""`, `false`) leave
/// the archive's values alone, since a config rendered with every field printed carries them.
pub fn merged_config(base: Option<&ModelConfig>, config_json: &str, name: &str) -> Result<ModelConfig, String> {
    let overlay = config_json.trim();
    let mut config = match (base, overlay.is_empty()) {
        (None, true) => ModelConfig::default(),
        (None, false) => model_config::from_json(overlay).map_err(|e| format!("invalid assignment config: {e}"))?,
        (Some(base), true) => base.clone(),
        (Some(base), false) => {
            let overlay: Value =
                serde_json::from_str(overlay).map_err(|e| format!("invalid assignment config: {e}"))?;
            let mut merged = model_config::to_json_value(base);
            merge(&mut merged, overlay);
            model_config::from_json(&merged.to_string()).map_err(|e| format!("invalid merged model config: {e}"))?
        }
    };
    config.name = name.to_string();
    Ok(config)
}

/// Merges `overlay` into `base` (see [`merged_config`]).
fn merge(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Object(base), Value::Object(overlay)) => {
            for (key, value) in overlay {
                match base.get_mut(&key) {
                    Some(existing) if existing.is_object() && value.is_object() => merge(existing, value),
                    _ if is_default(&value) => {}
                    _ => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, overlay) => {
            if !is_default(&overlay) {
                *base = overlay;
            }
        }
    }
}

/// Values a fully printed config carries for fields nobody set.
fn is_default(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::archive::test_support::tar_of;

    /// Serves fixed bytes per key and counts fetches.
    #[derive(Default)]
    struct Fake {
        objects: Mutex<HashMap<String, Vec<u8>>>,
        fetches: std::sync::atomic::AtomicUsize,
    }

    impl ArtifactSource for Fake {
        fn open(&self, key: &str) -> BoxFuture<'static, Result<ByteStream, String>> {
            self.fetches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let found = self.objects.lock().get(key).cloned();
            async move {
                let bytes = found.ok_or("not found")?;
                let chunks: Vec<Result<Bytes, String>> =
                    bytes.chunks(3).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
                Ok(futures::stream::iter(chunks).boxed())
            }
            .boxed()
        }
    }

    fn artifact(key: &str, bytes: &[u8], format: &str) -> agent::Artifact {
        agent::Artifact {
            key: key.into(),
            sha256: hex::encode(Sha256::digest(bytes)),
            size_bytes: bytes.len() as u64,
            format: format.into(),
        }
    }

    fn cache(dir: &Path, fake: &Arc<Fake>) -> ArtifactCache {
        ArtifactCache::open(dir, fake.clone()).expect("cache opens")
    }

    #[tokio::test]
    async fn fetches_verifies_and_reuses_across_restarts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = Arc::new(Fake::default());
        fake.objects.lock().insert("t/m/1".into(), b"model bytes".to_vec());
        let a = artifact("t/m/1", b"model bytes", "onnx");

        let prepared = cache(dir.path(), &fake).prepare(&a, "m", 1, "").await.expect("prepared");
        assert_eq!(prepared.file, dir.path().join(format!("{}.onnx", a.sha256)));
        assert_eq!(std::fs::read(&prepared.file).expect("read"), b"model bytes");
        assert_eq!(prepared.config.name, "m");

        // A new process (new cache) re-hashes and reuses the file without fetching.
        let again = cache(dir.path(), &fake);
        again.prepare(&a, "m", 1, "").await.expect("reused");
        again.prepare(&a, "m", 1, "").await.expect("reused");
        assert_eq!(fake.fetches.load(std::sync::atomic::Ordering::SeqCst), 1);

        // A damaged file is fetched again.
        std::fs::write(&prepared.file, b"model bytez").expect("damage");
        cache(dir.path(), &fake).prepare(&a, "m", 1, "").await.expect("refetched");
        assert_eq!(fake.fetches.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(std::fs::read(&prepared.file).expect("read"), b"model bytes");
    }

    #[tokio::test]
    async fn a_mismatch_fails_and_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = Arc::new(Fake::default());
        fake.objects.lock().insert("k".into(), b"tampered".to_vec());
        let mut a = artifact("k", b"original", "onnx");
        a.size_bytes = 8;
        let err = cache(dir.path(), &fake).prepare(&a, "m", 1, "").await.expect_err("mismatch");
        assert_eq!(err.kind, LoadErrorKind::Artifact);
        assert!(err.message.contains("failed verification"), "{err}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("ls").flatten().collect();
        assert!(left.is_empty(), "{left:?}");

        let long = artifact("k", b"tamp", "onnx");
        let err = cache(dir.path(), &fake).prepare(&long, "m", 1, "").await.expect_err("too long");
        assert_eq!(err.kind, LoadErrorKind::Artifact);
        assert!(err.message.contains("larger than"), "{err}");
        let bad = agent::Artifact { sha256: "../../etc".into(), ..long.clone() };
        let err = cache(dir.path(), &fake).prepare(&bad, "m", 1, "").await.expect_err("bad sha");
        assert!(err.kind == LoadErrorKind::Artifact && err.message.contains("hex"), "{err:?}");
        let fmt = agent::Artifact { format: "rar".into(), ..long.clone() };
        let err = cache(dir.path(), &fake).prepare(&fmt, "m", 1, "").await.expect_err("format");
        assert!(err.kind == LoadErrorKind::Artifact && err.message.contains("rar"), "{err:?}");
        let config = cache(dir.path(), &fake).prepare(&long, "m", 1, "{nope").await.expect_err("bad config");
        assert_eq!(config.kind, LoadErrorKind::Artifact, "the bytes are checked before the config");
    }

    #[tokio::test]
    async fn failures_are_classified_by_what_went_wrong() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = Arc::new(Fake::default());
        let missing = artifact("nowhere", b"bytes", "onnx");
        let err = cache(dir.path(), &fake).prepare(&missing, "m", 1, "").await.expect_err("no such object");
        assert_eq!((err.kind, err.message.as_str()), (LoadErrorKind::Fetch, "not found"));

        fake.objects.lock().insert("k".into(), b"bytes".to_vec());
        let a = artifact("k", b"bytes", "onnx");
        let err = cache(dir.path(), &fake).prepare(&a, "m", 1, "{nope").await.expect_err("bad config");
        assert_eq!(err.kind, LoadErrorKind::Configuration, "{err}");

        // An archive with no model for the version: the cached copy is dropped, so the one
        // retry an artifact error gets fetches it again.
        let bytes = tar_of(&[("m/config.pbtxt", b"max_batch_size: 0\n")], &[]);
        fake.objects.lock().insert("k.tar".into(), bytes.clone());
        let archive = artifact("k.tar", &bytes, "tar");
        let err = cache(dir.path(), &fake).prepare(&archive, "m", 1, "").await.expect_err("no model");
        assert_eq!(err.kind, LoadErrorKind::Artifact, "{err}");
        assert!(!dir.path().join(format!("{}.tar", archive.sha256)).exists(), "the copy is forgotten");
        cache(dir.path(), &fake).prepare(&archive, "m", 1, "").await.expect_err("still no model");
        assert_eq!(fake.fetches.load(std::sync::atomic::Ordering::SeqCst), 4, "fetched again");
    }

    #[tokio::test]
    async fn archives_are_unpacked_once_and_their_config_merged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = Arc::new(Fake::default());
        let pbtxt: &[u8] = b"name: \"orig\"\nmax_batch_size: 8\ninstance_group [ { count: 1 } ]\n";
        let bytes = tar_of(&[("m/config.pbtxt", pbtxt), ("m/1/model.onnx", b"onnx")], &[]);
        fake.objects.lock().insert("k.tar".into(), bytes.clone());
        let a = artifact("k.tar", &bytes, "tar");
        let overlay = r#"{"instance_group": [{"count": 3, "kind": "KIND_CPU"}], "max_batch_size": 0, "input": []}"#;

        let prepared = cache(dir.path(), &fake).prepare(&a, "resnet", 4, overlay).await.expect("prepared");
        assert!(prepared.file.ends_with(format!("{}.d/m/1/model.onnx", a.sha256)), "{:?}", prepared.file);
        assert_eq!(prepared.config.name, "resnet");
        assert_eq!(prepared.config.max_batch_size, 8, "a default in the overlay keeps the archive's value");
        assert_eq!(prepared.config.instance_group[0].count, 3, "the assignment wins");
        cache(dir.path(), &fake).prepare(&a, "resnet", 4, "").await.expect("reused");
        assert_eq!(fake.fetches.load(std::sync::atomic::Ordering::SeqCst), 1);

        let evil = tar_of(&[("m/1/model.onnx", b"onnx"), ("../evil", b"x")], &[]);
        fake.objects.lock().insert("evil.tar".into(), evil.clone());
        let err = cache(dir.path(), &fake).prepare(&artifact("evil.tar", &evil, "tar"), "m", 1, "").await;
        assert!(err.expect_err("refused").message.contains("'..'"));
        assert!(!dir.path().join("evil").exists());
    }

    #[test]
    fn merged_config_cases() {
        assert_eq!(merged_config(None, "", "m").expect("empty").name, "m");
        let c = merged_config(None, r#"{"name": "x", "max_batch_size": 2}"#, "m").expect("overlay only");
        assert_eq!((c.name.as_str(), c.max_batch_size), ("m", 2));
        assert!(merged_config(None, "{nope", "m").is_err());
        let base = model_config::from_pbtxt("max_batch_size: 4\ndynamic_batching { }\n").expect("base");
        let c = merged_config(Some(&base), r#"{"dynamic_batching": {"max_queue_delay_microseconds": 50}}"#, "m")
            .expect("merged");
        let Some(tessera_protocol::inference::model_config::SchedulingChoice::DynamicBatching(db)) =
            c.scheduling_choice
        else {
            panic!("dynamic batching kept");
        };
        assert_eq!((c.max_batch_size, db.max_queue_delay_microseconds), (4, 50));
    }
}
