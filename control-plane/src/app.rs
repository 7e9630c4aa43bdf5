//! The control plane's shared state and the few domain steps handlers share: resolving the
//! tenant a request may act on, and the first-start bootstrap.

use std::sync::Arc;

use axum::http::HeaderMap;
use bytes::Bytes;
use futures::Stream;
use uuid::Uuid;

use crate::auth::keys::{self, KeyHasher};
use crate::auth::revocations::Revocations;
use crate::auth::tokens::{TokenConfig, TokenService};
use crate::auth::{Authenticator, Principal};
use crate::config::Config;
use crate::error::{Error, QuotaName, Result};
use crate::registry::{Actor, ModelRow, NewApiKey, NewVersion, QuotaLimits, Registry, UploadRow, VersionRow, now};
use crate::signature::Signature;
use crate::store::ArtifactStore;
use crate::types::{ArtifactFormat, Name, Role};

/// Name of the platform's own tenant, home of platform-admin keys.
pub const PLATFORM_TENANT: &str = "platform";

/// Everything a handler can reach.
pub struct App {
    /// The registry.
    pub registry: Registry,
    /// Artifacts.
    pub store: ArtifactStore,
    /// Credential checks.
    pub auth: Authenticator,
    /// Token issue and verification.
    pub tokens: Arc<TokenService>,
    /// Single sign-on for console users and their sessions.
    pub sso: crate::sso::Sso,
    /// Keys revoked and users disabled recently: refused in tokens, pushed to workers and
    /// gateways.
    pub revocations: Arc<Revocations>,
    /// Settings.
    pub config: Config,
    /// Wake-ups between the API, the scheduler and agent sessions.
    pub signals: Signals,
    /// Uploads streaming through this process, by tenant.
    uploads: Arc<parking_lot::Mutex<std::collections::HashMap<Uuid, usize>>>,
    /// When this process last queued a `quota.exceeded` webhook event, by tenant and quota:
    /// a client retrying a refused request sends one event per window, not one per retry.
    quota_events: parking_lot::Mutex<std::collections::HashMap<(Uuid, QuotaName), std::time::Instant>>,
}

/// Shortest time between two `quota.exceeded` events of one tenant and quota (per process).
const QUOTA_EVENT_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

/// One upload in progress, counted against its tenant until dropped.
struct UploadSlot {
    uploads: Arc<parking_lot::Mutex<std::collections::HashMap<Uuid, usize>>>,
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

/// In-process wake-ups. Other control-plane replicas notice changes by polling the registry
/// (the scheduler every interval, sessions every second); these only make this one faster.
#[derive(Debug)]
pub struct Signals {
    /// Notified by writes that need a scheduling decision; the scheduler loop waits on it. A
    /// notification while the loop is busy is kept as a permit, so none is lost.
    scheduler: tokio::sync::Notify,
    /// Bumped by the scheduler after it changed assignments; every agent session watches it
    /// and re-reads its worker's generation. Never closed while the app lives.
    assignments: tokio::sync::watch::Sender<u64>,
    /// Notified when deliveries were queued for now (a ping, a replay); the webhook
    /// dispatcher waits on it besides its poll interval.
    webhooks: tokio::sync::Notify,
}

impl Default for Signals {
    fn default() -> Self {
        Signals {
            scheduler: tokio::sync::Notify::new(),
            assignments: tokio::sync::watch::Sender::new(0),
            webhooks: tokio::sync::Notify::new(),
        }
    }
}

impl Signals {
    /// Asks the scheduler to run now.
    pub fn wake_scheduler(&self) {
        self.scheduler.notify_one();
    }

    /// Waits for [`Signals::wake_scheduler`].
    pub async fn scheduler_woken(&self) {
        self.scheduler.notified().await;
    }

    /// Asks the webhook dispatcher to look for due deliveries now.
    pub fn wake_webhooks(&self) {
        self.webhooks.notify_one();
    }

    /// Waits for [`Signals::wake_webhooks`].
    pub async fn webhooks_woken(&self) {
        self.webhooks.notified().await;
    }

    /// Tells agent sessions that assignments changed.
    pub fn assignments_changed(&self) {
        self.assignments.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that sees [`Signals::assignments_changed`].
    pub fn watch_assignments(&self) -> tokio::sync::watch::Receiver<u64> {
        self.assignments.subscribe()
    }
}

/// A tenant a request may act on.
#[derive(Debug, Clone)]
pub struct TenantRef {
    /// Id.
    pub id: Uuid,
    /// Name.
    pub name: String,
}

impl App {
    /// Builds the state over an open registry and store.
    pub async fn new(registry: Registry, store: ArtifactStore, config: Config) -> Result<Arc<Self>> {
        let token_config = TokenConfig {
            issuer: config.token_issuer.clone(),
            audience: config.token_audience.clone(),
            ttl: config.token_ttl,
        };
        let tokens = Arc::new(TokenService::new(registry.clone(), token_config).await?);
        if config.api_key_pepper.expose().is_empty() {
            // Keys are still random and hashed, but a copied database alone then suffices to
            // check guesses offline; production deployments should set a pepper.
            tracing::warn!("TESSERA_API_KEY_PEPPER is empty: set a secret pepper outside development");
        }
        let hasher = KeyHasher::new(config.api_key_pepper.expose().as_bytes());
        let revocations = Arc::new(Revocations::new(config.token_ttl));
        // Before serving: a restarted replica refuses revoked tokens from its first request.
        revocations.refresh(&registry).await?;
        let auth = Authenticator::new(registry.clone(), hasher, tokens.clone(), revocations.clone());
        let uploads = Arc::default();
        let sso = crate::sso::Sso {
            provider: crate::sso::provider::ProviderClient::new(config.oidc_allow_http_issuers)?,
            limits: config.session_limits,
        };
        Ok(Arc::new(App {
            registry,
            store,
            auth,
            tokens,
            sso,
            revocations,
            config,
            signals: Signals::default(),
            uploads,
            quota_events: Default::default(),
        }))
    }

    /// The tenant named in a path, if the caller may see it, and only if the caller's role
    /// includes `needed`. Another tenant is "not found" (never "forbidden": no existence
    /// leak); platform admins reach every tenant.
    pub async fn tenant_for(
        &self,
        p: &Principal,
        tenant: &str,
        needed: Role,
        action: &'static str,
    ) -> Result<TenantRef> {
        // Not a valid name: no tenant has it (and it never reaches a query).
        let found = if Name::parse(tenant).is_err() {
            return Err(Error::NotFound("tenant"));
        } else if p.role == Role::PlatformAdmin {
            let row = self.registry.conn().await?.tenant_by_name(tenant).await?.ok_or(Error::NotFound("tenant"))?;
            TenantRef { id: row.id, name: row.name }
        } else if p.tenant_name == tenant {
            TenantRef { id: p.tenant_id, name: p.tenant_name.clone() }
        } else {
            return Err(Error::NotFound("tenant"));
        };
        p.require(needed, action)?;
        Ok(found)
    }

    /// Passes `result` on; when a quota refused it, first queues a `quota.exceeded` webhook
    /// event for the tenant, in a transaction of its own (the refused change rolled back with
    /// its transaction). At most one per tenant and quota per [`QUOTA_EVENT_WINDOW`].
    pub async fn noting_quota<T>(&self, tenant_id: Uuid, result: Result<T>) -> Result<T> {
        let Err(Error::QuotaExceeded { quota, limit, requested }) = &result else { return result };
        let due = {
            let mut sent = self.quota_events.lock();
            let now = std::time::Instant::now();
            match sent.get(&(tenant_id, *quota)) {
                Some(at) if now.duration_since(*at) < QUOTA_EVENT_WINDOW => false,
                _ => {
                    sent.insert((tenant_id, *quota), now);
                    true
                }
            }
        };
        if due {
            let data = serde_json::json!({ "quota": quota.as_str(), "limit": limit, "requested": requested });
            let queued = async {
                let mut tx = self.registry.begin().await?;
                tx.enqueue_webhook_event(tenant_id, crate::kinds::WebhookEventType::QuotaExceeded, data).await?;
                tx.commit().await
            };
            if let Err(e) = queued.await {
                tracing::warn!(tenant = %tenant_id, error = %e, "could not queue a quota.exceeded webhook event");
            }
        }
        result
    }

    /// A model of a tenant the caller may act on.
    pub async fn model_for(
        &self,
        p: &Principal,
        tenant: &str,
        model: &str,
        needed: Role,
        action: &'static str,
    ) -> Result<ModelRow> {
        let tenant = self.tenant_for(p, tenant, needed, action).await?;
        if Name::parse(model).is_err() {
            return Err(Error::NotFound("model"));
        }
        self.registry.conn().await?.model(tenant.id, model).await?.ok_or(Error::NotFound("model"))
    }

    /// Where an upload goes: an existing model of a tenant the caller may upload to, or, when
    /// `create` is set and the model does not exist yet, a model created with the version.
    pub async fn upload_target(&self, p: &Principal, tenant: &str, model: &str, create: bool) -> Result<UploadTarget> {
        match self.model_for(p, tenant, model, Role::Deployer, "upload versions").await {
            Ok(m) => Ok(UploadTarget::Existing(m)),
            Err(Error::NotFound("model")) if create => {
                let t = self.tenant_for(p, tenant, Role::Deployer, "register models").await?;
                let name = Name::from_path("model", model)?;
                Ok(UploadTarget::New { tenant_id: t.id, id: Uuid::now_v7(), name })
            }
            Err(e) => Err(e),
        }
    }

    /// First start: creates the platform tenant and makes sure a platform-admin key exists,
    /// installing `--bootstrap-admin-key` or generating one. Returns a generated key (to be
    /// shown once), if one was generated.
    pub async fn bootstrap(&self) -> Result<Option<String>> {
        let actor = Actor { key_id: None, user_id: None, request_id: "bootstrap".into(), client_addr: None };
        let platform = match self.registry.conn().await?.platform_tenant().await? {
            Some(t) => t,
            None => {
                let name = Name::parse(PLATFORM_TENANT).map_err(Error::Internal)?;
                let limits = QuotaLimits { models: 0, versions: 0, storage_bytes: 0, ..QuotaLimits::default() };
                match self.registry.create_tenant(&actor, &name, "Platform", true, &limits).await {
                    Ok(t) => t,
                    // Another replica won the race.
                    Err(Error::Conflict { .. }) => {
                        self.registry.conn().await?.platform_tenant().await?.ok_or(Error::NotFound("tenant"))?
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        if let Some(key) = &self.config.bootstrap_admin_key {
            self.install_admin_key(&actor, platform.id, key.expose()).await?;
            return Ok(None);
        }
        if self.registry.conn().await?.has_platform_admin_key(now()).await? {
            return Ok(None);
        }
        let generated = keys::generate();
        self.install_admin_key(&actor, platform.id, &generated.key).await?;
        Ok(Some(generated.key))
    }

    async fn install_admin_key(&self, actor: &Actor, platform: Uuid, key: &str) -> Result<()> {
        let prefix = keys::prefix_of(key)
            .ok_or_else(|| Error::invalid("bootstrap_admin_key", "not a Tessera API key (tsk_<12>_<43>)"))?;
        if self.registry.conn().await?.key_by_prefix(prefix).await?.is_some() {
            return Ok(());
        }
        let new = NewApiKey {
            prefix: prefix.to_string(),
            secret_hash: self.auth.hasher().hash(key),
            name: "bootstrap platform admin".into(),
            role: Role::PlatformAdmin,
            user_id: None,
            expires_at: None,
        };
        self.registry.create_key(actor, platform, new).await?;
        tracing::info!(prefix, "installed the bootstrap platform-admin key");
        Ok(())
    }
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

impl UploadRequest {
    /// Reads the query's `format`/`sha256` and the `X-Model-Config` and `Content-Length`
    /// headers. The sha256 has one place, the query: an `X-Content-Sha256` header (read by
    /// earlier versions) is refused with 400 naming it, instead of being ignored.
    pub fn from_parts(format: Option<ArtifactFormat>, sha256: Option<String>, headers: &HeaderMap) -> Result<Self> {
        let header_text = |name: &str| -> Result<Option<&str>> {
            headers
                .get(name)
                .map(|v| v.to_str().map_err(|_| Error::invalid(name, format!("{name} is not valid text"))))
                .transpose()
        };
        if headers.contains_key("x-content-sha256") {
            return Err(Error::Malformed {
                field: "X-Content-Sha256",
                message: "give the expected sha256 as the `sha256` query parameter (?sha256=<64 hex digits>); \
                          the X-Content-Sha256 header is not read"
                    .into(),
            });
        }
        let sha256 = sha256.as_deref().map(|s| parse_sha256("sha256", s)).transpose()?;
        let config = match header_text("x-model-config")? {
            None => None,
            Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
                Ok(v @ serde_json::Value::Object(_)) if !crate::api::contains_nul(&v) => {
                    crate::model_config::check_json("X-Model-Config", &v)?;
                    Some(v)
                }
                _ => return Err(Error::invalid("X-Model-Config", "X-Model-Config must be a JSON object")),
            },
        };
        Ok(UploadRequest {
            format: format.unwrap_or(ArtifactFormat::Onnx),
            sha256,
            config,
            declared_len: crate::api::content_length(headers),
        })
    }
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

/// A hex sha256, lower-cased; anything else is invalid input blamed on `field`.
pub fn parse_sha256(field: &str, s: &str) -> Result<String> {
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(Error::invalid(field, format!("{field} must be 64 hex digits")))
    }
}

impl App {
    /// Counts an upload against its tenant's concurrent uploads, or refuses it (429) when the
    /// tenant has `--max-concurrent-uploads` streaming already: one tenant's many slow uploads
    /// must not hold every connection and disk of the control plane.
    fn upload_slot(&self, tenant: Uuid) -> Result<UploadSlot> {
        let limit = self.config.max_concurrent_uploads;
        let mut uploads = self.uploads.lock();
        let n = uploads.entry(tenant).or_insert(0);
        if *n >= limit {
            return Err(Error::Busy(format!(
                "the tenant already has {limit} uploads in progress (--max-concurrent-uploads); retry when one finishes"
            )));
        }
        *n += 1;
        Ok(UploadSlot { uploads: self.uploads.clone(), tenant })
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
        let _slot = self.upload_slot(tenant_id)?;
        let max = self.config.max_upload_bytes;
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
            let io = self.store.check_onnx(key).await?;
            let parsed = given.as_ref().and_then(parse);
            let signature = crate::signature::signature("model.onnx", &io, parsed.as_ref(), given_field)?;
            return Ok((given, Some(signature)));
        }
        let manifest = self.store.inspect_archive(key, format, self.config.archive_limits).await?;
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
        let signature = match &manifest.model {
            Some((file, io)) => {
                let parsed = config.as_ref().and_then(parse);
                Some(crate::signature::signature(file, io, parsed.as_ref(), field)?)
            }
            None => None,
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
        let url = self.store.presign_put(&key, self.config.presign_ttl).await?;
        let created_at = now();
        let upload = UploadRow {
            id: Uuid::now_v7(),
            tenant_id: model.tenant_id,
            model_id: model.id,
            artifact_key: key.to_string(),
            format: format.as_str().to_string(),
            created_by: actor.key_id,
            created_at,
            expires_at: created_at + self.config.presign_ttl,
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
        let outcome = match self.store.digest(&key, self.config.max_upload_bytes, format, &sha256).await {
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
