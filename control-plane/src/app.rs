//! The control plane's shared state and the few domain steps handlers share: resolving the
//! tenant a request may act on, and the first-start bootstrap.

use std::sync::Arc;

use uuid::Uuid;

use crate::auth::keys::{self, KeyHasher};
use crate::auth::revocations::Revocations;
use crate::auth::tokens::{TokenConfig, TokenService};
use crate::auth::{Authenticator, Principal};
use crate::config::Config;
use crate::error::{Error, QuotaName, Result};
use crate::registry::{Actor, ModelRow, NewApiKey, QuotaLimits, Registry, now};
use crate::store::ArtifactStore;
use crate::types::{Name, Role};
use crate::uploads::{UploadLimits, UploadTarget, Uploads};

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
    /// Model version uploads (streamed and presigned).
    pub uploads: Uploads,
    /// When this process last queued a `quota.exceeded` webhook event, by tenant and quota:
    /// a client retrying a refused request sends one event per window, not one per retry.
    quota_events: parking_lot::Mutex<std::collections::HashMap<(Uuid, QuotaName), std::time::Instant>>,
}

/// Shortest time between two `quota.exceeded` events of one tenant and quota (per process).
const QUOTA_EVENT_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

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
        let uploads = Uploads::new(registry.clone(), store.clone(), UploadLimits::of(&config));
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
    /// its transaction). At most one per tenant and quota per `QUOTA_EVENT_WINDOW`.
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
            limits: (0, 0),
        };
        self.registry.create_key(actor, platform, new).await?;
        tracing::info!(prefix, "installed the bootstrap platform-admin key");
        Ok(())
    }
}
