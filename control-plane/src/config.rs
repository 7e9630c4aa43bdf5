//! `tessera control-plane` flags and the [`Config`] they become.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;

use crate::archive::ArchiveLimits;
use crate::audit_checkpoints::CheckpointKey;
use crate::metrics::MetricsToken;
use tessera_protocol::tls::{CertFiles, TlsArgs};

/// Default `--max-upload-bytes`: 4 GiB.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// A string that never shows in logs or `Debug` output.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The value, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"[redacted]\"" })
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_string()))
    }
}

/// Default of `--max-concurrent-uploads`.
pub const DEFAULT_MAX_CONCURRENT_UPLOADS: usize = 4;

/// `tessera control-plane` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ControlPlaneArgs {
    /// Address the REST API listens on; port 0 picks a free one.
    #[arg(long, env = "TESSERA_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Registry database: `postgres://user:pass@host/db` or `sqlite://path/file.db`.
    #[arg(long, env = "TESSERA_DATABASE_URL", default_value = "sqlite://tessera.db")]
    pub database_url: Secret,
    /// How long to wait for the database to answer at start, in seconds.
    #[arg(long, env = "TESSERA_DATABASE_WAIT_SECS", default_value_t = 60)]
    pub database_wait_secs: u64,
    /// Artifact store: a directory, `file:///dir`, `s3://bucket/prefix` (endpoint and
    /// credentials from the usual `AWS_*` variables, e.g. `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`),
    /// `gs://bucket/prefix` (`GOOGLE_*`, or the instance's credentials) or
    /// `az://container/prefix` (`AZURE_STORAGE_ACCOUNT_NAME` and a key, token or identity).
    #[arg(long, env = "TESSERA_OBJECT_STORE", default_value = "tessera-artifacts")]
    pub object_store: String,
    /// Largest model artifact accepted, in bytes.
    #[arg(long, env = "TESSERA_MAX_UPLOAD_BYTES", default_value_t = DEFAULT_MAX_UPLOAD_BYTES)]
    pub max_upload_bytes: u64,
    /// Seconds a client has to send a request's head, a request body may send nothing, and a
    /// client may take none of its answer, before the connection or the request is given up.
    #[arg(long, env = "TESSERA_CLIENT_TIMEOUT_SECS", default_value_t = 30)]
    pub client_timeout_secs: u64,
    /// Uploads one tenant may stream through the control plane at once; one more gets 429.
    #[arg(long, env = "TESSERA_MAX_CONCURRENT_UPLOADS", default_value_t = DEFAULT_MAX_CONCURRENT_UPLOADS)]
    pub max_concurrent_uploads: usize,
    /// Most entries (files, directories) a tar or zip upload may hold.
    #[arg(long, env = "TESSERA_MAX_ARCHIVE_ENTRIES", default_value_t = crate::archive::DEFAULT_MAX_ENTRIES)]
    pub max_archive_entries: usize,
    /// Most bytes the files of a tar or zip upload may hold in all, unpacked. Default: twice
    /// `--max-upload-bytes`, at least 8 GiB.
    #[arg(long, env = "TESSERA_MAX_ARCHIVE_EXPANDED_BYTES")]
    pub max_archive_expanded_bytes: Option<u64>,
    /// Most bytes the files of a tar or zip upload may hold per byte of the upload (an
    /// archive may always expand to 64 MiB): refuses gzip and zip bombs.
    #[arg(long, env = "TESSERA_MAX_ARCHIVE_EXPANSION_RATIO", default_value_t = crate::archive::DEFAULT_MAX_EXPANSION_RATIO)]
    pub max_archive_expansion_ratio: u64,
    /// Lifetime of access tokens from `POST /v1/auth/token`, in seconds.
    #[arg(long, env = "TESSERA_TOKEN_TTL_SECS", default_value_t = 900)]
    pub token_ttl_secs: u64,
    /// `iss` claim of access tokens.
    #[arg(long, env = "TESSERA_TOKEN_ISSUER", default_value = "tessera")]
    pub token_issuer: String,
    /// `aud` claim of access tokens (what workers and gateways expect).
    #[arg(long, env = "TESSERA_TOKEN_AUDIENCE", default_value = "tessera")]
    pub token_audience: String,
    /// Secret mixed into API key hashes; keep it out of the database. Changing it invalidates
    /// every key.
    #[arg(long, env = "TESSERA_API_KEY_PEPPER", default_value = "")]
    pub api_key_pepper: Secret,
    /// Platform-admin API key to install at first start (`tsk_…`); without it, one is
    /// generated and printed once.
    #[arg(long, env = "TESSERA_BOOTSTRAP_ADMIN_KEY")]
    pub bootstrap_admin_key: Option<Secret>,
    /// Lifetime of presigned upload URLs, in seconds.
    #[arg(long, env = "TESSERA_PRESIGN_TTL_SECS", default_value_t = 3600)]
    pub presign_ttl_secs: u64,
    /// Shared secret workers present (`authorization: Bearer <token>`) on every agent call;
    /// without it every agent call is refused.
    #[arg(long, env = "TESSERA_WORKER_TOKEN")]
    pub worker_token: Option<Secret>,
    /// Shared secret gateways present on agent calls: it allows only what a gateway needs (the
    /// route stream, key lookups, token keys, throttled counts), never a worker's session or
    /// artifacts. Without it, gateways present the worker token.
    #[arg(long, env = "TESSERA_GATEWAY_TOKEN")]
    pub gateway_token: Option<Secret>,
    /// How often workers send heartbeats, in milliseconds.
    #[arg(long, env = "TESSERA_HEARTBEAT_INTERVAL_MS", default_value_t = 1000)]
    pub heartbeat_interval_ms: u64,
    /// A worker silent this long (milliseconds) is marked lost and its replicas move.
    #[arg(long, env = "TESSERA_WORKER_LOST_AFTER_MS", default_value_t = 10_000)]
    pub worker_lost_after_ms: u64,
    /// How long replicas of the previous version keep loaded after a rollout switches, in
    /// milliseconds (requests already sent to them finish).
    #[arg(long, env = "TESSERA_DRAIN_MS", default_value_t = 3000)]
    pub drain_ms: u64,
    /// How often the scheduler runs, in milliseconds (it also runs on every change).
    #[arg(long, env = "TESSERA_SCHEDULER_INTERVAL_MS", default_value_t = 500)]
    pub scheduler_interval_ms: u64,
    /// Let every tenant's webhooks reach loopback, private and link-local addresses and use
    /// plain http (trusted networks and tests only; a platform admin can allow it per tenant).
    #[arg(long, env = "TESSERA_WEBHOOKS_ALLOW_PRIVATE")]
    pub webhooks_allow_private: bool,
    /// First wait before a failed webhook delivery is retried, in milliseconds (doubling up to
    /// an hour, for about a day).
    #[arg(long, env = "TESSERA_WEBHOOK_RETRY_BASE_MS", default_value_t = 10_000)]
    pub webhook_retry_base_ms: u64,
    /// How long one webhook delivery attempt may take, in milliseconds.
    #[arg(long, env = "TESSERA_WEBHOOK_TIMEOUT_MS", default_value_t = 10_000)]
    pub webhook_timeout_ms: u64,
    /// How often the webhook dispatcher looks for due deliveries, in milliseconds.
    #[arg(long, env = "TESSERA_WEBHOOK_POLL_MS", default_value_t = 1000)]
    pub webhook_poll_ms: u64,
    /// Seconds after a month ends before its invoices are issued (`invoice.issued` webhook
    /// events): the grace for usage that workers deliver late.
    #[arg(long, env = "TESSERA_INVOICE_ISSUE_DELAY_SECS", default_value_t = 3600)]
    pub invoice_issue_delay_secs: u64,
    /// How often the closed month is checked again for tenants whose invoice is not issued
    /// (usage that arrived after the rest was issued), in milliseconds.
    #[arg(long, env = "TESSERA_INVOICE_CHECK_INTERVAL_MS", default_value_t = 60_000)]
    pub invoice_check_interval_ms: u64,
    /// Days usage is kept per minute; older minutes are folded into hourly rows (totals kept).
    #[arg(long, env = "TESSERA_USAGE_MINUTE_RETENTION_DAYS", default_value_t = 14)]
    pub usage_minute_retention_days: u64,
    /// Days captured requests are kept for a tenant that set no retention of its own.
    #[arg(long, env = "TESSERA_CAPTURE_RETENTION_DAYS", default_value_t = 30)]
    pub capture_retention_days: u64,
    /// How often the scheduler leader deletes expired capture files, in milliseconds.
    #[arg(long, env = "TESSERA_CAPTURE_SWEEP_INTERVAL_MS", default_value_t = 600_000)]
    pub capture_sweep_interval_ms: u64,
    /// Let tenants' OpenID Connect issuers (and their endpoints) use plain http (tests and
    /// trusted networks only; real providers are https).
    #[arg(long, env = "TESSERA_OIDC_ALLOW_HTTP_ISSUERS")]
    pub oidc_allow_http_issuers: bool,
    /// A console session unused for this many seconds ends.
    #[arg(long, env = "TESSERA_SESSION_IDLE_TIMEOUT_SECS", default_value_t = 1800)]
    pub session_idle_timeout_secs: u64,
    /// A console session ends this many seconds after sign-in, used or not.
    #[arg(long, env = "TESSERA_SESSION_MAX_AGE_SECS", default_value_t = 43_200)]
    pub session_max_age_secs: u64,
    /// Directory of the built web console (`web/dist`), served at `/`. Default: `web/dist`
    /// under the working directory or in the source tree, if built; else the console is off.
    #[arg(long, env = "TESSERA_CONSOLE_DIR")]
    pub console_dir: Option<PathBuf>,
    /// Address `/metrics` listens on, apart from the API; default: the API listener serves it.
    #[arg(long, env = "TESSERA_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Address the agent service (workers' and gateways' gRPC) listens on, apart from the API,
    /// so a network policy can open it to workers and gateways only; default: the API
    /// listener serves it too. Workers and gateways then take this address as
    /// `--control-plane`.
    #[arg(long, env = "TESSERA_AGENT_LISTEN")]
    pub agent_listen: Option<SocketAddr>,
    /// Public base URL of this API (e.g. `https://tessera.example.com`), named in the served
    /// OpenAPI document's `servers` so generated clients default to it. Default: `/`, the
    /// server the document was fetched from.
    #[arg(long, env = "TESSERA_PUBLIC_URL", value_parser = parse_base_url)]
    pub public_url: Option<String>,
    /// Public base URL of the gateways' KServe v2 HTTP endpoint (e.g. `https://infer.example.com`):
    /// each deployment shows `<url>/v2/models/<model>` as its endpoint.
    #[arg(long, env = "TESSERA_GATEWAY_URL", value_parser = parse_base_url)]
    pub gateway_url: Option<String>,
    /// Public address of the gateways' KServe v2 gRPC endpoint (`host:port`), shown beside it.
    #[arg(long, env = "TESSERA_GATEWAY_GRPC_ADDRESS")]
    pub gateway_grpc_address: Option<String>,
    /// File holding the bearer token `/metrics` requires (Prometheus: `authorization: {
    /// credentials_file: FILE }`); without it or `--metrics-token`, `/metrics` is open.
    #[arg(long, env = "TESSERA_METRICS_TOKEN_FILE", conflicts_with = "metrics_token")]
    pub metrics_token_file: Option<PathBuf>,
    /// The bearer token `/metrics` requires, given directly (prefer the variable or the file:
    /// a flag shows in `ps`).
    #[arg(long, env = "TESSERA_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<Secret>,
    /// Ed25519 private key (PKCS#8 PEM, `openssl genpkey -algorithm ed25519`) that signs the
    /// audit checkpoints written to the object store; keep it away from the database. Without
    /// it there are no checkpoints.
    #[arg(long, env = "TESSERA_AUDIT_SIGNING_KEY_FILE")]
    pub audit_signing_key_file: Option<PathBuf>,
    /// Seconds between audit checkpoints (there is one at start and at shutdown too).
    #[arg(long, env = "TESSERA_AUDIT_CHECKPOINT_SECS", default_value_t = crate::audit_checkpoints::DEFAULT_INTERVAL_SECS)]
    pub audit_checkpoint_secs: u64,
    /// Certificate and key of the API listener (REST, agent gRPC, console) and of the metrics
    /// and agent listeners; workers and clients then use `https://`.
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// Everything the control plane needs to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// REST API listen address.
    pub listen: SocketAddr,
    /// Registry database URL.
    pub database_url: Secret,
    /// How long to wait for the database at start.
    pub database_wait: Duration,
    /// Artifact store spec.
    pub object_store: String,
    /// Upload cap.
    pub max_upload_bytes: u64,
    /// Uploads per tenant at once.
    pub max_concurrent_uploads: usize,
    /// How long a request head may take, and a request body or an answer's reader may stall.
    pub client_timeout: Duration,
    /// What an archive upload may expand to.
    pub archive_limits: ArchiveLimits,
    /// Access token lifetime.
    pub token_ttl: Duration,
    /// Token issuer.
    pub token_issuer: String,
    /// Token audience.
    pub token_audience: String,
    /// API key pepper.
    pub api_key_pepper: Secret,
    /// Platform-admin key to install at first start.
    pub bootstrap_admin_key: Option<Secret>,
    /// Presigned URL lifetime.
    pub presign_ttl: Duration,
    /// Worker credential; `None` refuses every agent call.
    pub worker_token: Option<Secret>,
    /// Gateway credential; `None` lets gateways use the worker credential.
    pub gateway_token: Option<Secret>,
    /// Heartbeat interval asked of workers.
    pub heartbeat_interval: Duration,
    /// Silence after which a worker is lost.
    pub worker_lost_after: Duration,
    /// Drain time of replaced replicas.
    pub drain: Duration,
    /// Scheduler period.
    pub scheduler_interval: Duration,
    /// Webhooks may reach private targets in every tenant.
    pub webhooks_allow_private: bool,
    /// First retry wait of a failed webhook delivery.
    pub webhook_retry_base: Duration,
    /// Limit of one webhook delivery attempt.
    pub webhook_timeout: Duration,
    /// Webhook dispatcher period.
    pub webhook_poll: Duration,
    /// Grace after a month ends before its invoices are issued.
    pub invoice_issue_delay: Duration,
    /// How often the closed month is checked again once issued.
    pub invoice_check_interval: Duration,
    /// How long usage is kept per minute before the retention job folds it into hours.
    pub usage_minute_retention: Duration,
    /// Days capture files are kept for tenants without their own retention.
    pub capture_retention_days: u64,
    /// Time between the leader's capture retention sweeps.
    pub capture_sweep_interval: Duration,
    /// Plain-http OpenID issuers are allowed.
    pub oidc_allow_http_issuers: bool,
    /// Console session lifetimes.
    pub session_limits: crate::sso::SessionLimits,
    /// Web console directory; `None`: the console is off.
    pub console_dir: Option<PathBuf>,
    /// Separate `/metrics` listen address; `None`: the API listener serves it.
    pub metrics_listen: Option<SocketAddr>,
    /// Separate agent-service listen address; `None`: the API listener serves it.
    pub agent_listen: Option<SocketAddr>,
    /// Public base URL of the API, without a trailing `/`; `None`: relative.
    pub public_url: Option<String>,
    /// Public base URL of the gateways' HTTP endpoint, without a trailing `/`.
    pub gateway_url: Option<String>,
    /// Public `host:port` of the gateways' gRPC endpoint.
    pub gateway_grpc_address: Option<String>,
    /// Bearer token `/metrics` requires; `None`: open.
    pub metrics_token: Option<MetricsToken>,
    /// Key that signs audit checkpoints; `None`: no checkpoints.
    pub audit_signing_key: Option<CheckpointKey>,
    /// Time between audit checkpoints.
    pub audit_checkpoint_interval: Duration,
    /// Certificate and key the listeners present; `None`: plain HTTP.
    pub tls: Option<CertFiles>,
}

/// An `http(s)://host[:port]` URL without a path, trailing `/` dropped.
fn parse_base_url(url: &str) -> Result<String, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    let bare = uri.path_and_query().is_none_or(|p| p.as_str() == "/");
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) if bare => Ok(url.trim_end_matches('/').to_string()),
        _ => Err("expected http(s)://HOST[:PORT] without a path".into()),
    }
}

impl ControlPlaneArgs {
    /// The configuration these flags describe, with the key and token files they name read.
    pub fn into_config(self) -> anyhow::Result<Config> {
        let metrics_token = match (&self.metrics_token_file, self.metrics_token.filter(|t| !t.expose().is_empty())) {
            (Some(path), _) => Some(MetricsToken::from_file(path)?),
            (None, Some(token)) => Some(MetricsToken::new(token.expose())?),
            (None, None) => None,
        };
        let audit_signing_key = self
            .audit_signing_key_file
            .as_deref()
            .map(CheckpointKey::load)
            .transpose()
            .context("load the audit signing key")?;
        Ok(Config {
            listen: self.listen,
            database_url: self.database_url,
            database_wait: Duration::from_secs(self.database_wait_secs),
            object_store: self.object_store,
            max_upload_bytes: self.max_upload_bytes,
            max_concurrent_uploads: self.max_concurrent_uploads.max(1),
            client_timeout: Duration::from_secs(self.client_timeout_secs.max(1)),
            archive_limits: ArchiveLimits {
                max_entries: self.max_archive_entries.max(1),
                max_expanded_bytes: self
                    .max_archive_expanded_bytes
                    .unwrap_or(ArchiveLimits::for_upload_cap(self.max_upload_bytes).max_expanded_bytes),
                max_expansion_ratio: self.max_archive_expansion_ratio.max(1),
            },
            token_ttl: Duration::from_secs(self.token_ttl_secs.max(1)),
            token_issuer: self.token_issuer,
            token_audience: self.token_audience,
            api_key_pepper: self.api_key_pepper,
            bootstrap_admin_key: self.bootstrap_admin_key.filter(|k| !k.expose().is_empty()),
            presign_ttl: Duration::from_secs(self.presign_ttl_secs.max(1)),
            worker_token: self.worker_token.filter(|k| !k.expose().is_empty()),
            gateway_token: self.gateway_token.filter(|k| !k.expose().is_empty()),
            heartbeat_interval: Duration::from_millis(self.heartbeat_interval_ms.clamp(50, 60_000)),
            worker_lost_after: Duration::from_millis(self.worker_lost_after_ms.max(100)),
            drain: Duration::from_millis(self.drain_ms),
            scheduler_interval: Duration::from_millis(self.scheduler_interval_ms.max(10)),
            webhooks_allow_private: self.webhooks_allow_private,
            webhook_retry_base: Duration::from_millis(self.webhook_retry_base_ms.max(10)),
            webhook_timeout: Duration::from_millis(self.webhook_timeout_ms.clamp(100, 120_000)),
            webhook_poll: Duration::from_millis(self.webhook_poll_ms.clamp(10, 60_000)),
            invoice_issue_delay: Duration::from_secs(self.invoice_issue_delay_secs),
            invoice_check_interval: Duration::from_millis(self.invoice_check_interval_ms.max(10)),
            usage_minute_retention: Duration::from_secs(self.usage_minute_retention_days.max(1) * 86_400),
            capture_retention_days: self.capture_retention_days.clamp(1, crate::capture::MAX_RETENTION_DAYS as u64),
            capture_sweep_interval: Duration::from_millis(self.capture_sweep_interval_ms.max(100)),
            oidc_allow_http_issuers: self.oidc_allow_http_issuers,
            session_limits: crate::sso::SessionLimits {
                idle_timeout: Duration::from_secs(self.session_idle_timeout_secs.clamp(1, 365 * 86_400)),
                max_age: Duration::from_secs(self.session_max_age_secs.clamp(1, 365 * 86_400)),
            },
            console_dir: self.console_dir.filter(|d| !d.as_os_str().is_empty()).or_else(crate::console::default_dir),
            metrics_listen: self.metrics_listen,
            agent_listen: self.agent_listen,
            public_url: self.public_url,
            gateway_url: self.gateway_url,
            gateway_grpc_address: self.gateway_grpc_address.filter(|a| !a.is_empty()),
            metrics_token,
            audit_signing_key,
            audit_checkpoint_interval: Duration::from_secs(self.audit_checkpoint_secs.max(1)),
            tls: self.tls.files(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted() {
        let s = Secret::new("hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert_eq!(s.expose(), "hunter2");
    }
}
