//! Request/response capture on the control plane: a deployment's capture settings (checked
//! here, stored on the deployment, sent to workers with the assignments), the batches workers
//! report (written to the tenant's prefix in the object store), and the retention sweep the
//! scheduler leader runs.
//!
//! Layout: `tenants/<tenant id>/capture/<deployment id>/<YYYY-MM-DD>/<worker>-<batch>.jsonl`,
//! one JSON Lines file per batch, the date that of the batch's first request (UTC). The API
//! names a file by `<YYYY-MM-DD>/<worker>-<batch>.jsonl` under its deployment.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tessera_protocol::agent::{self, ReportCaptureRequest};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::registry::Registry;
use crate::store::{ArtifactStore, ObjectInfo};

/// Default `max_record_bytes`: 64 KiB.
pub const DEFAULT_MAX_RECORD_BYTES: i64 = 64 * 1024;
/// Smallest `max_record_bytes` (room for the bare fields).
const MIN_RECORD_BYTES: i64 = 1024;
/// Largest `max_record_bytes` (a batch must fit a gRPC message).
const MAX_RECORD_BYTES: i64 = 1024 * 1024;
/// Largest batch a worker may report (workers cut theirs at 1 MiB plus one record).
const MAX_BATCH_BYTES: usize = 3 * 1024 * 1024;
/// Longest retention a tenant may set: 10 years.
pub const MAX_RETENTION_DAYS: i64 = 3650;

/// A deployment's request/response capture: off unless `enabled`; `sample_rate` of the
/// requests (0 to 1) are written, with the parts asked for, to the tenant's object storage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"enabled": true, "sample_rate": 0.1, "inputs": true, "outputs": true, "metadata": true, "max_record_bytes": 65536})))]
pub struct CaptureSettings {
    /// Whether requests are captured.
    pub enabled: bool,
    /// Share of requests captured, 0.0 to 1.0 (default 1.0).
    #[serde(default = "one")]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub sample_rate: f64,
    /// Keep the input tensors (default true).
    #[serde(default = "yes")]
    pub inputs: bool,
    /// Keep the output tensors (default true).
    #[serde(default = "yes")]
    pub outputs: bool,
    /// Keep the request's parameters (default true).
    #[serde(default = "yes")]
    pub metadata: bool,
    /// Largest record in bytes, 1 KiB to 1 MiB (default 64 KiB): a larger one keeps its tensors'
    /// names, types and shapes without data, and is marked `truncated`.
    #[serde(default = "default_max_record_bytes")]
    #[schema(minimum = 1024, maximum = 1_048_576)]
    pub max_record_bytes: i64,
}

fn one() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}

fn default_max_record_bytes() -> i64 {
    DEFAULT_MAX_RECORD_BYTES
}

impl CaptureSettings {
    /// Checks the settings and returns them as stored.
    pub fn checked(&self) -> Result<serde_json::Value> {
        if !(0.0..=1.0).contains(&self.sample_rate) {
            return Err(Error::invalid("capture.sample_rate", "capture.sample_rate must be between 0 and 1"));
        }
        if !(MIN_RECORD_BYTES..=MAX_RECORD_BYTES).contains(&self.max_record_bytes) {
            let message = format!("capture.max_record_bytes must be between {MIN_RECORD_BYTES} and {MAX_RECORD_BYTES}");
            return Err(Error::invalid("capture.max_record_bytes", message));
        }
        serde_json::to_value(self).map_err(|e| Error::Internal(e.to_string()))
    }

    /// The settings stored on a deployment, if any.
    pub fn stored(value: Option<&serde_json::Value>) -> Option<Self> {
        value.and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// What a worker is told: `None` while capture is off or samples nothing.
    pub fn for_worker(value: Option<&serde_json::Value>) -> Option<agent::CaptureSettings> {
        let s = Self::stored(value).filter(|s| s.enabled && s.sample_rate > 0.0)?;
        Some(agent::CaptureSettings {
            sample_rate: s.sample_rate,
            inputs: s.inputs,
            outputs: s.outputs,
            metadata: s.metadata,
            max_record_bytes: u64::try_from(s.max_record_bytes).unwrap_or(0),
        })
    }
}

/// The folder of a deployment's capture files (ends in `/`).
pub fn deployment_prefix(tenant_id: Uuid, deployment_id: Uuid) -> String {
    format!("tenants/{tenant_id}/capture/{deployment_id}/")
}

/// The folder of all of a tenant's capture files (ends in `/`).
pub fn tenant_prefix(tenant_id: Uuid) -> String {
    format!("tenants/{tenant_id}/capture/")
}

/// Whether `name` is a capture file's name as the API shows it: `YYYY-MM-DD/<file>.jsonl`,
/// the file name of letters, digits, `-`, `_` and `.` only (so it cannot leave its folder).
pub fn is_file_name(name: &str) -> bool {
    let Some((date, file)) = name.split_once('/') else { return false };
    let date_ok = date.len() == 10
        && date.bytes().enumerate().all(|(i, b)| if i == 4 || i == 7 { b == b'-' } else { b.is_ascii_digit() });
    let file_ok = file.len() <= 200
        && file.ends_with(".jsonl")
        && !file.starts_with('.')
        && file.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    date_ok && file_ok
}

/// Whether a worker id may name a file (workers choose their ids).
fn is_worker_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The UTC date of Unix milliseconds, `YYYY-MM-DD`; `None` when out of range.
fn date_of(ms: i64) -> Option<String> {
    let at = OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000)).ok()?;
    Some(format!("{:04}-{:02}-{:02}", at.year(), u8::from(at.month()), at.day()))
}

/// The object key of a batch, checked: ids that parse, a worker id fit for a file name.
pub fn batch_key(batch: &ReportCaptureRequest, now: OffsetDateTime) -> std::result::Result<String, String> {
    let tenant = Uuid::parse_str(&batch.tenant_id).map_err(|_| "tenant_id is not a UUID".to_string())?;
    let deployment = Uuid::parse_str(&batch.deployment_id).map_err(|_| "deployment_id is not a UUID".to_string())?;
    let id = Uuid::parse_str(&batch.batch_id).map_err(|_| "batch_id is not a UUID".to_string())?;
    if !is_worker_id(&batch.worker_id) {
        return Err("worker_id must be 1 to 128 letters, digits, '-', '_' or '.'".into());
    }
    let now_ms = i64::try_from(now.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    let date = date_of(batch.first_at_ms).or_else(|| date_of(now_ms)).unwrap_or_else(|| "1970-01-01".into());
    Ok(format!("{}{date}/{}-{id}.jsonl", deployment_prefix(tenant, deployment), batch.worker_id))
}

/// Stores a worker's batch under its tenant's prefix; the deployment must be the tenant's.
pub async fn ingest(
    registry: &Registry,
    store: &ArtifactStore,
    batch: ReportCaptureRequest,
) -> std::result::Result<String, tonic::Status> {
    if batch.jsonl.len() > MAX_BATCH_BYTES {
        return Err(tonic::Status::invalid_argument(format!("a capture batch holds at most {MAX_BATCH_BYTES} bytes")));
    }
    let key = batch_key(&batch, crate::registry::now()).map_err(tonic::Status::invalid_argument)?;
    let (tenant, deployment) = (Uuid::parse_str(&batch.tenant_id), Uuid::parse_str(&batch.deployment_id));
    let (Ok(tenant), Ok(deployment)) = (tenant, deployment) else {
        return Err(tonic::Status::invalid_argument("tenant_id and deployment_id must be UUIDs"));
    };
    if !registry.conn().await?.is_deployment_of(tenant, deployment).await? {
        return Err(tonic::Status::not_found("no such deployment in that tenant"));
    }
    store.put(&key, Bytes::from(batch.jsonl)).await?;
    tracing::debug!(key, records = batch.records, worker_id = %batch.worker_id, "stored a capture batch");
    Ok(key)
}

/// One capture file of a deployment, as the API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureFile {
    /// `YYYY-MM-DD/<worker>-<batch>.jsonl`.
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// When it was written.
    pub last_modified: OffsetDateTime,
}

/// Every capture file of a deployment.
pub async fn files(store: &ArtifactStore, tenant_id: Uuid, deployment_id: Uuid) -> Result<Vec<CaptureFile>> {
    let prefix = deployment_prefix(tenant_id, deployment_id);
    let objects = store.list_objects(&prefix).await?;
    Ok(objects
        .into_iter()
        .filter_map(|o: ObjectInfo| {
            let name = o.key.strip_prefix(&prefix)?.to_string();
            is_file_name(&name).then_some(CaptureFile { name, size: o.size, last_modified: o.last_modified })
        })
        .collect())
}

/// The retention in effect for a tenant: its own setting or the default.
pub fn effective_days(own: Option<i64>, default_days: u64) -> i64 {
    own.unwrap_or_else(|| i64::try_from(default_days).unwrap_or(MAX_RETENTION_DAYS))
}

/// Deletes every capture file older than its tenant's retention (else `default_days`) at
/// `now`; returns how many.
pub async fn sweep(registry: &Registry, store: &ArtifactStore, default_days: u64, now: OffsetDateTime) -> Result<u64> {
    let tenants = registry.conn().await?.capture_retentions().await?;
    let mut deleted = 0;
    for (tenant_id, own) in tenants {
        let days = effective_days(own, default_days);
        let cutoff = now - time::Duration::days(days);
        let expired: Vec<String> = store
            .list_objects(&tenant_prefix(tenant_id))
            .await?
            .into_iter()
            .filter(|o| o.last_modified < cutoff)
            .map(|o| o.key)
            .collect();
        for key in &expired {
            store.delete(key).await?;
        }
        if !expired.is_empty() {
            tracing::info!(%tenant_id, files = expired.len(), days, "deleted expired capture files");
        }
        deleted += expired.len() as u64;
    }
    Ok(deleted)
}

/// The retention sweep's parts and when the leader last swept (the scheduler loop asks
/// whether one is due).
pub struct Sweeper {
    registry: Registry,
    store: ArtifactStore,
    /// `--capture-retention-days`: for tenants without their own.
    default_days: u64,
    /// `--capture-sweep-interval-ms`.
    interval: std::time::Duration,
    last: Option<tokio::time::Instant>,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl Sweeper {
    /// A sweeper over `registry` and `store` that has not swept yet.
    pub fn new(registry: Registry, store: ArtifactStore, default_days: u64, interval: std::time::Duration) -> Self {
        Sweeper { registry, store, default_days, interval, last: None, running: None }
    }

    /// Starts a sweep in the background when the interval passed since the last one and none
    /// is running (called by the scheduler while it leads).
    pub fn tick(&mut self) {
        if self.running.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        if self.last.is_some_and(|l| l.elapsed() < self.interval) {
            return;
        }
        self.last = Some(tokio::time::Instant::now());
        let (registry, store, days) = (self.registry.clone(), self.store.clone(), self.default_days);
        self.running = Some(tokio::spawn(async move {
            if let Err(e) = sweep(&registry, &store, days, crate::registry::now()).await {
                tracing::warn!(error = %e, "capture retention sweep failed");
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(v: serde_json::Value) -> CaptureSettings {
        serde_json::from_value(v).expect("settings parse")
    }

    #[test]
    fn settings_take_defaults_and_are_checked() {
        let s = settings(serde_json::json!({ "enabled": true }));
        assert_eq!((s.sample_rate, s.inputs, s.outputs, s.metadata), (1.0, true, true, true));
        assert_eq!(s.max_record_bytes, DEFAULT_MAX_RECORD_BYTES);
        for bad in [
            serde_json::json!({"enabled": true, "sample_rate": 1.5}),
            serde_json::json!({"enabled": true, "sample_rate": -0.1}),
            serde_json::json!({"enabled": true, "max_record_bytes": 10}),
            serde_json::json!({"enabled": true, "max_record_bytes": 1 << 30}),
        ] {
            let e = settings(bad.clone()).checked().expect_err("refused");
            assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument, "{bad}");
        }
        assert!(serde_json::from_value::<CaptureSettings>(serde_json::json!({"enabled": true, "rate": 1})).is_err());
    }

    #[test]
    fn workers_hear_of_capture_only_when_it_samples() {
        let on =
            settings(serde_json::json!({ "enabled": true, "sample_rate": 0.5, "metadata": false })).checked().unwrap();
        let w = CaptureSettings::for_worker(Some(&on)).expect("on");
        assert_eq!((w.sample_rate, w.metadata, w.max_record_bytes), (0.5, false, 65536));
        let off = settings(serde_json::json!({ "enabled": false })).checked().unwrap();
        assert!(CaptureSettings::for_worker(Some(&off)).is_none());
        let zero = settings(serde_json::json!({ "enabled": true, "sample_rate": 0.0 })).checked().unwrap();
        assert!(CaptureSettings::for_worker(Some(&zero)).is_none());
        assert!(CaptureSettings::for_worker(None).is_none());
    }

    #[test]
    fn batch_keys_stay_under_the_tenants_prefix() {
        let tenant = Uuid::now_v7();
        let deployment = Uuid::now_v7();
        let batch = Uuid::now_v7();
        let mut req = ReportCaptureRequest {
            worker_id: "w-1".into(),
            tenant_id: tenant.to_string(),
            deployment_id: deployment.to_string(),
            batch_id: batch.to_string(),
            first_at_ms: 1_764_633_600_000, // 2025-12-02T00:00:00Z
            records: 1,
            jsonl: Vec::new(),
        };
        let now = OffsetDateTime::UNIX_EPOCH;
        let key = batch_key(&req, now).expect("a key");
        assert_eq!(key, format!("tenants/{tenant}/capture/{deployment}/2025-12-02/w-1-{batch}.jsonl"));
        assert!(is_file_name(key.strip_prefix(&deployment_prefix(tenant, deployment)).unwrap()));
        for bad in ["../x", "a/b", "", "w 1"] {
            req.worker_id = bad.into();
            assert!(batch_key(&req, now).is_err(), "{bad:?}");
        }
        req.worker_id = "w".into();
        req.tenant_id = "../../etc".into();
        assert!(batch_key(&req, now).is_err());
    }

    #[test]
    fn file_names_cannot_leave_their_folder() {
        assert!(is_file_name("2026-12-02/w-0190.jsonl"));
        for bad in [
            "2026-12-02/../x.jsonl",
            "2026-12-02/.jsonl",
            "x/y.jsonl",
            "2026-12-02/a/b.jsonl",
            "2026-12-02/a.txt",
            "2026-1-02/a.jsonl",
        ] {
            assert!(!is_file_name(bad), "{bad}");
        }
    }

    #[test]
    fn retention_defaults_to_the_platform_setting() {
        assert_eq!(effective_days(None, 30), 30);
        assert_eq!(effective_days(Some(7), 30), 7);
    }
}
