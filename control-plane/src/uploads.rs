//! Uploads of model versions: streamed through this process or put to a presigned URL and
//! completed later. Either way the artifact's sha256 and size are checked, its contents
//! inspected (a well-formed ONNX model, or an archive read through within limits), its config
//! and signature derived, and the version registered (with its audit and webhook events, in
//! the registry's transaction); a refused upload leaves no object, version or model behind.
//!
//! The HTTP handlers in `api/versions.rs` resolve the caller and target and parse the request
//! into an [`UploadRequest`]; nothing here knows HTTP.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use uuid::Uuid;

use crate::archive::ArchiveLimits;
use crate::config::Config;
use crate::error::{Error, QuotaName, Result};
use crate::registry::{Actor, ModelRow, NewVersion, Registry, UploadRow, VersionRow, now};
use crate::signature::Signature;
use crate::store::ArtifactStore;
use crate::types::{ArtifactFormat, Name};

/// Uploads streaming through this process, by tenant. Shared by the service and the slots it
/// hands out (a slot gives its count back when dropped).
type InProgress = Arc<parking_lot::Mutex<HashMap<Uuid, usize>>>;

/// The limits uploads run under (from [`Config`]).
#[derive(Debug, Clone, Copy)]
pub struct UploadLimits {
    /// Largest artifact, bytes.
    pub max_bytes: u64,
    /// Most uploads one tenant may stream at once.
    pub max_concurrent: usize,
    /// How long a presigned URL is valid.
    pub presign_ttl: Duration,
    /// What an archive may expand to.
    pub archive: ArchiveLimits,
}

impl UploadLimits {
    /// The limits set in `config`.
    pub fn of(config: &Config) -> Self {
        UploadLimits {
            max_bytes: config.max_upload_bytes,
            max_concurrent: config.max_concurrent_uploads,
            presign_ttl: config.presign_ttl,
            archive: config.archive_limits,
        }
    }
}

/// The upload use cases, over the registry and the artifact store.
pub struct Uploads {
    registry: Registry,
    store: ArtifactStore,
    limits: UploadLimits,
    in_progress: InProgress,
}

/// What an API upload declares besides its bytes.
#[derive(Debug, Clone)]
pub struct UploadRequest {
    /// Packaging.
    pub format: ArtifactFormat,
    /// Expected sha256, if the client gave one.
    pub sha256: Option<String>,
    /// Model configuration, if given.
    pub config: Option<serde_json::Value>,
    /// `Content-Length`, if sent.
    pub declared_len: Option<u64>,
}

/// The model an upload adds a version to.
#[derive(Debug, Clone)]
pub enum UploadTarget {
    /// A model that exists.
    Existing(ModelRow),
    /// A model created together with the version (only if the version is).
    New {
        /// Tenant.
        tenant_id: Uuid,
        /// The model's id, chosen now: the artifact's key names it.
        id: Uuid,
        /// The model's name.
        name: Name,
    },
}

impl UploadTarget {
    /// The tenant the upload goes to.
    pub fn tenant_id(&self) -> Uuid {
        match self {
            UploadTarget::Existing(m) => m.tenant_id,
            UploadTarget::New { tenant_id, .. } => *tenant_id,
        }
    }

    fn model_id(&self) -> Uuid {
        match self {
            UploadTarget::Existing(m) => m.id,
            UploadTarget::New { id, .. } => *id,
        }
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        match self {
            UploadTarget::Existing(m) => &m.name,
            UploadTarget::New { name, .. } => name.as_str(),
        }
    }
}

/// One upload in progress, counted against its tenant until dropped.
struct UploadSlot {
    uploads: InProgress,
    tenant: Uuid,
}

impl Drop for UploadSlot {
    fn drop(&mut self) {
        let mut uploads = self.uploads.lock();
        if let Some(n) = uploads.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                uploads.remove(&self.tenant);
            }
        }
    }
}

/// A hex sha256, lower-cased; anything else is invalid input blamed on `field`.
pub fn parse_sha256(field: &str, s: &str) -> Result<String> {
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(Error::invalid(field, format!("{field} must be 64 hex digits")))
    }
}

impl Uploads {
    /// The service over a registry and store, under `limits`.
    pub fn new(registry: Registry, store: ArtifactStore, limits: UploadLimits) -> Self {
        Uploads { registry, store, limits, in_progress: InProgress::default() }
    }

    /// Counts an upload against its tenant's concurrent uploads, or refuses it (429) when the
    /// tenant has `--max-concurrent-uploads` streaming already: one tenant's many slow uploads
    /// must not hold every connection and disk of the control plane.
    fn slot(&self, tenant: Uuid) -> Result<UploadSlot> {
        let limit = self.limits.max_concurrent;
        let mut uploads = self.in_progress.lock();
        let n = uploads.entry(tenant).or_insert(0);
        if *n >= limit {
            return Err(Error::Busy(format!(
                "the tenant already has {limit} uploads in progress (--max-concurrent-uploads); retry when one finishes"
            )));
        }
        *n += 1;
        Ok(UploadSlot { uploads: self.in_progress.clone(), tenant })
    }

    /// Streams an artifact into the store and registers it as the model's next version (with
    /// the model, for a [`UploadTarget::New`]). A failure at any step leaves no object behind,
    /// and no model.
    pub async fn upload_version<S, E>(
        &self,
        actor: &Actor,
        target: &UploadTarget,
        request: UploadRequest,
        body: S,
    ) -> Result<VersionRow>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let tenant_id = target.tenant_id();
        let _slot = self.slot(tenant_id)?;
        let max = self.limits.max_bytes;
        if let Some(len) = request.declared_len {
            if len > max {
                return Err(Error::PayloadTooLarge { limit: max });
            }
            // Fail before receiving gigabytes that cannot be kept (checked again on commit).
            let mut conn = self.registry.conn().await?;
            let (limits, usage) = (conn.quota(tenant_id).await?, conn.quota_usage(tenant_id).await?);
            limits.check(QuotaName::StorageBytes, usage.storage_bytes.saturating_add_unsigned(len))?;
            if matches!(target, UploadTarget::New { .. }) {
                limits.check(QuotaName::Models, usage.models.saturating_add(1))?;
            }
        }
        let key = ArtifactStore::new_key(tenant_id, target.model_id(), request.format);
        let stored = self.store.put_stream(&key, body, max, request.format, request.sha256.as_deref()).await?;
        let created = async {
            let (config, signature) =
                self.artifact_config(&key, request.format, request.config, "X-Model-Config").await?;
            let new = NewVersion {
                artifact_key: key.to_string(),
                sha256: stored.sha256,
                size_bytes: i64::try_from(stored.size).unwrap_or(i64::MAX),
                format: request.format,
                config,
                signature,
            };
            match target {
                UploadTarget::Existing(model) => self.registry.create_version(actor, model, new).await,
                UploadTarget::New { tenant_id, id, name } => {
                    let created = self.registry.create_model_with_version(actor, *tenant_id, name, *id, new).await;
                    created.map(|(_, version)| version)
                }
            }
        }
        .await;
        if created.is_err() {
            self.store.delete_all(&[key.to_string()]).await;
        }
        created
    }

    /// Checks a stored artifact's contents and finds its model config and signature: a plain
    /// model must be a well-formed ONNX file ([`ArtifactStore::check_onnx`]) and keeps what the
    /// client gave (in `given_field`); an archive is read through
    /// ([`ArtifactStore::inspect_archive`]) and its `config.pbtxt` is the config. Both a
    /// `config.pbtxt` and a client config is refused: one of them would be silently ignored.
    /// The signature comes from the graph a worker will load and the config
    /// ([`crate::signature`]), which refuses what no worker could serve.
    async fn artifact_config(
        &self,
        key: &object_store::path::Path,
        format: ArtifactFormat,
        given: Option<serde_json::Value>,
        given_field: &str,
    ) -> Result<(Option<serde_json::Value>, Option<Signature>)> {
        let parse = |c: &serde_json::Value| tessera_protocol::model_config::from_json(&c.to_string()).ok();
        if format == ArtifactFormat::Onnx {
            let parsed = given.as_ref().and_then(parse);
            if parsed.as_ref().is_some_and(tessera_protocol::model_config::is_ensemble) {
                return Err(Error::invalid(
                    given_field,
                    "an ensemble has no model file: upload it as an archive (tar, tar.gz or zip) holding its \
                     config.pbtxt and an empty version directory, as in a Triton model repository",
                ));
            }
            let io = self.store.check_onnx(key).await?;
            let signature = crate::signature::signature("model.onnx", &io, parsed.as_ref(), given_field)?;
            return Ok((given, Some(signature)));
        }
        let manifest = self.store.inspect_archive(key, format, self.limits.archive).await?;
        let (config, field) = match (manifest.config, given) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    "config",
                    "the archive has a config.pbtxt; do not also send a config (X-Model-Config or `config`)",
                ));
            }
            (Some(from_archive), None) => (Some(from_archive), "config.pbtxt"),
            (None, given) => (given, given_field),
        };
        let parsed = config.as_ref().and_then(parse);
        let signature = match (&manifest.model, &parsed) {
            (_, Some(c)) if tessera_protocol::model_config::is_ensemble(c) => {
                Some(crate::signature::of_ensemble(c, field)?)
            }
            (Some((file, io)), _) => Some(crate::signature::signature(file, io, parsed.as_ref(), field)?),
            (None, _) => None,
        };
        Ok((config, signature))
    }

    /// Opens a presigned upload for a model.
    pub async fn presign_upload(
        &self,
        actor: &Actor,
        model: &ModelRow,
        format: ArtifactFormat,
    ) -> Result<(UploadRow, url::Url)> {
        let key = ArtifactStore::new_key(model.tenant_id, model.id, format);
        let url = self.store.presign_put(&key, self.limits.presign_ttl).await?;
        let created_at = now();
        let upload = UploadRow {
            id: Uuid::now_v7(),
            tenant_id: model.tenant_id,
            model_id: model.id,
            artifact_key: key.to_string(),
            format: format.as_str().to_string(),
            created_by: actor.key_id,
            created_at,
            expires_at: created_at + self.limits.presign_ttl,
            completed_at: None,
        };
        self.registry.create_upload(actor, model, &upload).await?;
        Ok((upload, url))
    }

    /// Verifies a presigned upload's object and registers it as the next version; a bad
    /// object is deleted.
    pub async fn complete_upload(
        &self,
        actor: &Actor,
        model: &ModelRow,
        upload_id: Uuid,
        sha256: String,
        config: Option<serde_json::Value>,
    ) -> Result<VersionRow> {
        let upload = self.registry.conn().await?.upload(model.tenant_id, model.id, upload_id).await?;
        let upload = upload.ok_or(Error::NotFound("upload"))?;
        if upload.completed_at.is_some() {
            return Err(Error::conflict(crate::error::ErrorCode::UploadCompleted, "this upload was already completed"));
        }
        if let Some(config) = &config {
            crate::model_config::check_json("config", config)?;
        }
        let format = ArtifactFormat::parse(&upload.format).ok_or_else(|| Error::Internal("stored format".into()))?;
        let key = object_store::path::Path::from(upload.artifact_key.as_str());
        let outcome = match self.store.digest(&key, self.limits.max_bytes, format, &sha256).await {
            Ok(stored) => match self.artifact_config(&key, format, config, "config").await {
                Ok((config, signature)) => {
                    let new = NewVersion {
                        artifact_key: upload.artifact_key.clone(),
                        sha256: stored.sha256,
                        size_bytes: i64::try_from(stored.size).unwrap_or(i64::MAX),
                        format,
                        config,
                        signature,
                    };
                    self.registry.complete_upload(actor, model, upload_id, new).await
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if let Err(e) = &outcome
            && !matches!(
                e,
                Error::Conflict {
                    code: crate::error::ErrorCode::UploadCompleted | crate::error::ErrorCode::UploadMissing,
                    ..
                }
            )
        {
            self.store.delete_all(&[upload.artifact_key]).await;
        }
        outcome
    }
}
