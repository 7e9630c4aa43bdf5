//! The artifact store: model files in `object_store` (a local directory by default; S3 or an
//! S3-compatible server, Google Cloud Storage or Azure Blob Storage by URL), under
//! tenant-prefixed keys.
//!
//! Uploads stream: each chunk is hashed and handed to a multipart upload with at most a
//! couple of parts in flight, so memory stays bounded whatever the artifact size. An upload
//! that fails (too large, wrong sha256, wrong format, client gone) is aborted and leaves
//! nothing behind.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use object_store::path::Path;
use object_store::signer::Signer;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, WriteMultipart};
use sha2::{Digest, Sha256};
use uuid::Uuid;

mod location;

use crate::archive::{ArchiveLimits, ArchiveManifest};
use crate::error::{Error, Result};
use crate::onnx::{GraphIo, OnnxError, Seeking, check_model};
use crate::types::ArtifactFormat;

/// Multipart part size (S3's minimum is 5 MiB).
const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts uploading at once; with [`PART_SIZE`] this bounds an upload's buffers to ~24 MiB.
const PARTS_IN_FLIGHT: usize = 2;
/// Bytes kept from the start of an artifact to check its format.
const HEAD_LEN: usize = 512;

/// What a stored artifact turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredArtifact {
    /// Hex sha256.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
}

/// An object's key, size and last change, as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Key.
    pub key: String,
    /// Bytes.
    pub size: u64,
    /// Last written.
    pub last_modified: time::OffsetDateTime,
}

/// Where artifacts live.
#[derive(Clone)]
pub struct ArtifactStore {
    store: Arc<dyn ObjectStore>,
    /// Present for stores that can presign URLs (S3-compatible).
    signer: Option<Arc<dyn Signer>>,
    description: String,
}

impl std::fmt::Debug for ArtifactStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description)
    }
}

impl ArtifactStore {
    /// Opens `spec`: `s3://bucket[/prefix]`, `gs://bucket[/prefix]`, `az://container[/prefix]`
    /// (endpoints and credentials from the provider's usual variables), `file:///dir`, or a
    /// plain directory path (created if missing).
    pub fn open(spec: &str) -> anyhow::Result<Self> {
        let location::Opened { store, signer, description } = location::open(spec)?;
        Ok(ArtifactStore { store, signer, description })
    }

    /// A fresh, tenant-prefixed key for a new artifact of a model.
    pub fn new_key(tenant_id: Uuid, model_id: Uuid, format: ArtifactFormat) -> Path {
        let parts = ["tenants".to_string(), tenant_id.to_string(), "models".to_string(), model_id.to_string()];
        Path::from_iter(parts.into_iter().chain([Uuid::now_v7().to_string(), format.file_name().to_string()]))
    }

    /// Streams `body` to `key`, hashing as it goes; refuses more than `max` bytes, a sha256
    /// other than `expected_sha256`, or content that does not look like `format`. On any
    /// failure the object is not left behind.
    pub async fn put_stream<S, E>(
        &self,
        key: &Path,
        body: S,
        max: u64,
        format: ArtifactFormat,
        expected_sha256: Option<&str>,
    ) -> Result<StoredArtifact>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let upload = self.store.put_multipart(key).await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        let mut hashed = Hashing::default();
        let outcome = copy_into(&mut writer, body, max, &mut hashed).await;
        let verdict = outcome.and_then(|()| hashed.verdict(format, expected_sha256));
        match verdict {
            Ok(artifact) => {
                writer.finish().await?;
                Ok(artifact)
            }
            Err(e) => {
                if let Err(abort) = writer.abort().await {
                    tracing::warn!(key = %key, error = %abort, "could not abort a failed upload");
                }
                Err(e)
            }
        }
    }

    /// Reads an artifact back to verify it (presigned uploads), refusing more than `max`.
    pub async fn digest(&self, key: &Path, max: u64, format: ArtifactFormat, expected: &str) -> Result<StoredArtifact> {
        let get = match self.store.get(key).await {
            Ok(get) => get,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::conflict(
                    crate::error::ErrorCode::UploadMissing,
                    "nothing was uploaded to the presigned URL",
                ));
            }
            Err(e) => return Err(e.into()),
        };
        if get.meta.size > max {
            return Err(Error::PayloadTooLarge { limit: max });
        }
        let mut hashed = Hashing::default();
        let mut stream = get.into_stream();
        while let Some(chunk) = stream.next().await {
            hashed.update(&chunk?);
        }
        hashed.verdict(format, Some(expected))
    }

    /// Inspects a stored archive (tar, gzipped tar, zip): checks its entries, the models in it
    /// and what it expands to, and reads its `config.pbtxt` (see [`crate::archive`]). Reads
    /// the object in ranges on a blocking thread, so neither memory nor the async runtime
    /// holds the artifact.
    pub async fn inspect_archive(
        &self,
        key: &Path,
        format: ArtifactFormat,
        limits: ArchiveLimits,
    ) -> Result<ArchiveManifest> {
        let size = self.store.head(key).await?.size;
        let reader = RangeReader::new(self.store.clone(), key.clone(), size, tokio::runtime::Handle::current());
        tokio::task::spawn_blocking(move || crate::archive::inspect(format, reader, size, limits))
            .await
            .map_err(|e| Error::Internal(format!("archive inspection task: {e}")))?
    }

    /// Checks that a stored plain ONNX artifact is a well-formed model ([`crate::onnx`]) and
    /// returns its graph's interface. Walks the object in ranges on a blocking thread, seeking
    /// over tensors, so a model of any size costs little more than its structure.
    pub async fn check_onnx(&self, key: &Path) -> Result<GraphIo> {
        let size = self.store.head(key).await?.size;
        let reader = RangeReader::new(self.store.clone(), key.clone(), size, tokio::runtime::Handle::current());
        let checked = tokio::task::spawn_blocking(move || check_model(&mut Seeking::new(reader, size), size))
            .await
            .map_err(|e| Error::Internal(format!("onnx check task: {e}")))?;
        checked.map_err(|e| match e {
            OnnxError::Invalid(m) => Error::invalid("body", format!("model.onnx is not a valid ONNX model: {m}")),
            OnnxError::Io(e) => Error::Internal(format!("read the artifact back: {e}")),
        })
    }

    /// Streams a stored object in chunks of `chunk` bytes (the last one shorter), whatever
    /// sizes the store reads in.
    pub async fn get_chunks(
        &self,
        key: &str,
        chunk: usize,
    ) -> Result<impl Stream<Item = Result<Bytes>> + Send + 'static> {
        let get = match self.store.get(&Path::from(key)).await {
            Ok(get) => get,
            Err(object_store::Error::NotFound { .. }) => return Err(Error::NotFound("artifact")),
            Err(e) => return Err(e.into()),
        };
        Ok(rechunk(get.into_stream().map(|r| r.map_err(Error::from)), chunk))
    }

    /// Deletes an artifact; a missing one is fine.
    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.store.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes artifacts after the registry let go of them; failures are logged, not fatal
    /// (an orphaned object costs storage, not correctness).
    pub async fn delete_all(&self, keys: &[String]) {
        for key in keys {
            if let Err(e) = self.delete(key).await {
                tracing::warn!(key, error = %e, "could not delete an artifact");
            }
        }
    }

    /// A URL the client can PUT the artifact to, if this store can presign.
    pub async fn presign_put(&self, key: &Path, ttl: Duration) -> Result<url::Url> {
        let signer = self.signer.as_ref().ok_or_else(|| {
            let message =
                "presigned uploads need an S3-compatible object store (this one is not); upload through the API";
            Error::conflict(crate::error::ErrorCode::PresignUnsupported, message)
        })?;
        Ok(signer.signed_url(object_store::signer::Method::PUT, key, ttl).await?)
    }

    /// Writes a small object unless one is at `key` already (audit checkpoints are never
    /// replaced); `Ok(false)` when one was.
    pub async fn put_if_absent(&self, key: &str, bytes: Bytes) -> Result<bool> {
        let path = Path::from(key);
        let opts = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        match self.store.put_opts(&path, bytes.clone().into(), opts).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            // S3 without conditional puts configured: look first. Two writers racing here
            // write the same head, so the loser's copy is as good.
            Err(object_store::Error::NotImplemented { .. }) => match self.store.head(&path).await {
                Ok(_) => Ok(false),
                Err(object_store::Error::NotFound { .. }) => {
                    self.store.put(&path, bytes.into()).await?;
                    Ok(true)
                }
                Err(e) => Err(e.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// The keys of every object under `prefix` (a folder, ending in `/`), in no order.
    pub async fn list_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let prefix = Path::from(prefix.trim_end_matches('/'));
        let mut listing = self.store.list(Some(&prefix));
        let mut keys = Vec::new();
        while let Some(meta) = listing.next().await {
            keys.push(meta?.location.to_string());
        }
        Ok(keys)
    }

    /// Every object under `prefix` (a folder, ending in `/`) with its size and time, in no order.
    pub async fn list_objects(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let prefix = Path::from(prefix.trim_end_matches('/'));
        let mut listing = self.store.list(Some(&prefix));
        let mut objects = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta?;
            let nanos = meta.last_modified.timestamp_nanos_opt().unwrap_or(0);
            let last_modified = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(nanos))
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
            objects.push(ObjectInfo { key: meta.location.to_string(), size: meta.size, last_modified });
        }
        Ok(objects)
    }

    /// Writes a small object at `key`, replacing one that is there (a retried capture batch).
    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<()> {
        self.store.put(&Path::from(key), bytes.into()).await?;
        Ok(())
    }

    /// A small object's bytes, or `None` when there is none; refuses more than `max` bytes.
    pub async fn get_small(&self, key: &str, max: u64) -> Result<Option<Bytes>> {
        let get = match self.store.get(&Path::from(key)).await {
            Ok(get) => get,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if get.meta.size > max {
            return Err(Error::Internal(format!("{key} is larger than {max} bytes")));
        }
        Ok(Some(get.bytes().await?))
    }
}

/// Blocking `Read + Seek` over a stored object, fetched in ranges of [`RANGE_LEN`]: what the
/// `tar` and `zip` readers need (zip reads its directory from the end). Used only on a
/// blocking thread; `handle` runs the fetches.
struct RangeReader {
    store: Arc<dyn ObjectStore>,
    key: Path,
    size: u64,
    pos: u64,
    /// The last range fetched and where it starts.
    buf: Bytes,
    buf_start: u64,
    handle: tokio::runtime::Handle,
}

/// Bytes fetched per range request.
const RANGE_LEN: u64 = 1024 * 1024;

impl RangeReader {
    fn new(store: Arc<dyn ObjectStore>, key: Path, size: u64, handle: tokio::runtime::Handle) -> Self {
        RangeReader { store, key, size, pos: 0, buf: Bytes::new(), buf_start: 0, handle }
    }
}

impl std::io::Read for RangeReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.size || out.is_empty() {
            return Ok(0);
        }
        let in_buf = self.pos >= self.buf_start && self.pos < self.buf_start + self.buf.len() as u64;
        if !in_buf {
            let end = (self.pos + RANGE_LEN).min(self.size);
            let fetch = self.store.get_range(&self.key, self.pos..end);
            self.buf = self.handle.block_on(fetch).map_err(std::io::Error::other)?;
            self.buf_start = self.pos;
            if self.buf.is_empty() {
                return Ok(0);
            }
        }
        // Both offsets are within the buffer, which is at most RANGE_LEN long.
        let offset = (self.pos - self.buf_start) as usize;
        let n = out.len().min(self.buf.len() - offset);
        out[..n].copy_from_slice(&self.buf[offset..offset + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl std::io::Seek for RangeReader {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let target = match to {
            std::io::SeekFrom::Start(n) => Some(n),
            std::io::SeekFrom::End(d) => self.size.checked_add_signed(d),
            std::io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        let target = target.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before 0"))?;
        self.pos = target;
        Ok(target)
    }
}

/// Regroups a byte stream into pieces of exactly `size` bytes (the last may be shorter). An
/// error ends the stream after it is passed on.
fn rechunk<S>(inner: S, size: usize) -> impl Stream<Item = Result<Bytes>> + Send + 'static
where
    S: Stream<Item = Result<Bytes>> + Send + Unpin + 'static,
{
    let size = size.max(1);
    futures::stream::unfold((inner, bytes::BytesMut::new(), false), move |(mut inner, mut buf, mut done)| async move {
        loop {
            if buf.len() >= size {
                let piece = buf.split_to(size).freeze();
                return Some((Ok(piece), (inner, buf, done)));
            }
            if done {
                return (!buf.is_empty()).then(|| (Ok(buf.split().freeze()), (inner, bytes::BytesMut::new(), true)));
            }
            match inner.next().await {
                Some(Ok(b)) => buf.extend_from_slice(&b),
                Some(Err(e)) => return Some((Err(e), (inner, bytes::BytesMut::new(), true))),
                None => done = true,
            }
        }
    })
}

async fn copy_into<S, E>(writer: &mut WriteMultipart, mut body: S, max: u64, hashed: &mut Hashing) -> Result<()>
where
    S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Error::BadRequest(format!("upload interrupted: {e}")))?;
        if hashed.size + chunk.len() as u64 > max {
            return Err(Error::PayloadTooLarge { limit: max });
        }
        hashed.update(&chunk);
        writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
        writer.put(chunk);
    }
    Ok(())
}

/// Running sha256, size and the first bytes of an artifact.
#[derive(Default)]
struct Hashing {
    sha: Sha256,
    size: u64,
    head: Vec<u8>,
}

impl Hashing {
    fn update(&mut self, chunk: &[u8]) {
        self.sha.update(chunk);
        self.size += chunk.len() as u64;
        let want = HEAD_LEN.saturating_sub(self.head.len()).min(chunk.len());
        self.head.extend_from_slice(&chunk[..want]);
    }

    fn verdict(self, format: ArtifactFormat, expected: Option<&str>) -> Result<StoredArtifact> {
        let sha256 = hex::encode(self.sha.finalize());
        if let Some(expected) = expected
            && !expected.eq_ignore_ascii_case(&sha256)
        {
            return Err(Error::invalid("sha256", format!("content sha256 is {sha256}, the request said {expected}")));
        }
        if self.size == 0 {
            return Err(Error::invalid("body", "the artifact is empty"));
        }
        if !format.matches_head(&self.head) {
            return Err(Error::invalid(
                "format",
                format!("the artifact does not look like a {} file", format.as_str()),
            ));
        }
        Ok(StoredArtifact { sha256, size: self.size })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A well-formed model, `n` bytes long or a few more.
    fn onnx_bytes(n: usize) -> Vec<u8> {
        crate::onnx::tests::model(n)
    }

    fn chunks(data: &[u8], size: usize) -> impl Stream<Item = std::result::Result<Bytes, std::io::Error>> + Unpin {
        let parts: Vec<_> = data.chunks(size).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        futures::stream::iter(parts)
    }

    fn local() -> (tempfile::TempDir, ArtifactStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::open(dir.path().to_str().unwrap()).unwrap();
        (dir, store)
    }

    fn files_under(dir: &std::path::Path) -> usize {
        let mut n = 0;
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                if e.path().is_dir() { stack.push(e.path()) } else { n += 1 }
            }
        }
        n
    }

    #[tokio::test]
    async fn streams_hashes_and_stores() {
        let (dir, store) = local();
        let data = onnx_bytes(20 * 1024 * 1024 + 17);
        let key = ArtifactStore::new_key(Uuid::nil(), Uuid::nil(), ArtifactFormat::Onnx);
        let expected = hex::encode(Sha256::digest(&data));
        let got =
            store.put_stream(&key, chunks(&data, 64 * 1024), u64::MAX, ArtifactFormat::Onnx, Some(&expected)).await;
        assert_eq!(got.unwrap(), StoredArtifact { sha256: expected.clone(), size: data.len() as u64 });
        assert_eq!(files_under(dir.path()), 1);
        let digest = store.digest(&key, u64::MAX, ArtifactFormat::Onnx, &expected).await.unwrap();
        assert_eq!(digest.size, data.len() as u64);
        assert!(key.as_ref().starts_with("tenants/00000000-0000-0000-0000-000000000000/models/"));
    }

    #[tokio::test]
    async fn failed_uploads_leave_nothing() {
        let (dir, store) = local();
        let data = onnx_bytes(10 * 1024 * 1024);
        let key = ArtifactStore::new_key(Uuid::nil(), Uuid::nil(), ArtifactFormat::Onnx);
        let wrong = "0".repeat(64);
        let e = store.put_stream(&key, chunks(&data, 65536), u64::MAX, ArtifactFormat::Onnx, Some(&wrong)).await;
        assert_eq!(e.unwrap_err().code(), "invalid_argument");
        let e = store.put_stream(&key, chunks(&data, 65536), 1024 * 1024, ArtifactFormat::Onnx, None).await;
        assert!(matches!(e, Err(Error::PayloadTooLarge { .. })));
        let e = store.put_stream(&key, chunks(&data, 65536), u64::MAX, ArtifactFormat::Zip, None).await;
        assert!(matches!(e, Err(Error::InvalidInput { .. })));
        assert_eq!(files_under(dir.path()), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn archives_are_inspected_from_the_store() {
        use crate::archive::tests::{CONFIG, gzip, tar_of, zip_of};
        let (_dir, store) = local();
        // Larger than a range, so the readers cross range boundaries and seek.
        let big = onnx_bytes(3 * RANGE_LEN as usize + 5);
        let files: &[(&str, &[u8])] = &[("m/1/model.onnx", &big), ("m/config.pbtxt", CONFIG.as_bytes())];
        let tar = tar_of(files, &[]);
        for (format, data) in [
            (ArtifactFormat::Tar, tar.clone()),
            (ArtifactFormat::Tar, gzip(&tar)),
            (ArtifactFormat::Zip, zip_of(files, &[])),
        ] {
            let key = ArtifactStore::new_key(Uuid::nil(), Uuid::nil(), format);
            store.put_stream(&key, chunks(&data, 65536), u64::MAX, format, None).await.unwrap();
            let limits = ArchiveLimits::for_upload_cap(u64::MAX);
            let manifest = store.inspect_archive(&key, format, limits).await.unwrap();
            assert_eq!(manifest.config.unwrap()["max_batch_size"], 8);
            assert_eq!(manifest.onnx_files, ["1/model.onnx"]);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stored_models_are_checked_across_ranges() {
        let (_dir, store) = local();
        // The doc string spans several ranges: the check seeks over it.
        let data = onnx_bytes(3 * RANGE_LEN as usize + 5);
        for (bytes, ok) in [(&data[..], true), (&data[..RANGE_LEN as usize + 3], false), (&data[..20], false)] {
            let key = ArtifactStore::new_key(Uuid::nil(), Uuid::nil(), ArtifactFormat::Onnx);
            store.put_stream(&key, chunks(bytes, 65536), u64::MAX, ArtifactFormat::Onnx, None).await.unwrap();
            match store.check_onnx(&key).await {
                Ok(_) => assert!(ok, "a {}-byte prefix was accepted", bytes.len()),
                Err(Error::InvalidInput { message, .. }) => {
                    assert!(!ok, "{message}");
                    assert!(
                        message.starts_with(&format!(
                            "model.onnx is not a valid ONNX model: truncated at byte {}",
                            bytes.len()
                        )),
                        "{message}"
                    );
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[tokio::test]
    async fn artifacts_stream_back_in_fixed_chunks() {
        let (_dir, store) = local();
        let data = onnx_bytes(2 * 1024 * 1024 + 10);
        let key = ArtifactStore::new_key(Uuid::nil(), Uuid::nil(), ArtifactFormat::Onnx);
        store.put_stream(&key, chunks(&data, 7_000), u64::MAX, ArtifactFormat::Onnx, None).await.unwrap();
        let pieces: Vec<Bytes> =
            store.get_chunks(key.as_ref(), 1024 * 1024).await.unwrap().map(|c| c.unwrap()).collect().await;
        assert_eq!(
            pieces.iter().map(Bytes::len).collect::<Vec<_>>(),
            [1024 * 1024, 1024 * 1024, data.len() - 2 * 1024 * 1024]
        );
        assert_eq!(pieces.concat(), data);
        let missing = store.get_chunks("tenants/x/nothing", 10).await.err().unwrap();
        assert!(matches!(missing, Error::NotFound(_)));
    }

    #[tokio::test]
    async fn local_store_cannot_presign() {
        let (_dir, store) = local();
        let key = ArtifactStore::new_key(Uuid::nil(), Uuid::nil(), ArtifactFormat::Onnx);
        let e = store.presign_put(&key, Duration::from_secs(60)).await.unwrap_err();
        assert_eq!(e.code(), "presign_unsupported");
    }
}
