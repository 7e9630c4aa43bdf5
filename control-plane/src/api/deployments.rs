//! Deployments over HTTP: a model's version (pinned or through an alias) on a slice profile
//! with a number of replicas. The handlers check and parse requests into a [`DeploymentSpec`]
//! or [`DeploymentPatch`] and call the use cases in [`crate::deployments`], which store the
//! desired state, wake the scheduler and assemble what reads show.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Deserializer, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::models::PageParams;
use super::{ApiJson, ApiQuery, AppState, Caller, cursor};
use crate::capture::CaptureSettings;
use crate::deployments;
pub use crate::deployments::status::{Deployment, DynamicBatching};
use crate::deployments::status::{MAX_BATCH, MAX_PREFERRED_SIZES};
use crate::error::{Error, Result};
use crate::kinds::DeploymentEventKind;
use crate::registry::{DeploymentPatch, DeploymentRow, DeploymentSpec, VersionRef};
use crate::types::{Name, Role, is_slice_profile};

/// Most replicas of one deployment (and of its canary).
pub(super) const MAX_REPLICAS: i64 = 64;
/// Most model instances per replica.
const MAX_INSTANCES: i64 = 16;

/// Longest queue delay a deployment may ask for: 60 s, in microseconds.
const MAX_QUEUE_DELAY_US: i64 = 60_000_000;
/// Most memory a replica may ask for: 1 TiB.
const MAX_MEMORY_BYTES: i64 = 1 << 40;

/// A new deployment.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"name": "resnet50", "model": "resnet50", "alias": "production", "profile": "cpu", "replicas": 2, "instance_count": 1, "max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 100, "preferred_batch_size": [4, 8]}})))]
pub struct DeploymentCreate {
    /// Name, unique in the tenant.
    #[schema(value_type = String, pattern = "^[a-z0-9][a-z0-9_.-]{0,62}$")]
    pub name: Name,
    /// Model to deploy (one deployment per model).
    #[schema(value_type = String, pattern = "^[a-z0-9][a-z0-9_.-]{0,62}$")]
    pub model: Name,
    /// Version to pin. At most one of `version` and `alias`; neither pins the latest version.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub version: Option<i64>,
    /// Alias to follow: moving it rolls the deployment to the alias's new version.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub alias: Option<Name>,
    /// Slice profile: `cpu` (default), `gpu` or `mig-<profile>` (e.g. `mig-1g.10gb`).
    #[serde(default)]
    #[schema(pattern = "^(cpu|gpu|mig-[a-z0-9.]{1,32})$")]
    pub profile: Option<String>,
    /// Replicas (0 to 64, default 1).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 64)]
    pub replicas: Option<i64>,
    /// Model instances per replica (1 to 16, default 1).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 16)]
    pub instance_count: Option<i64>,
    /// Dynamic batching; absent: the model's own config decides.
    #[serde(default)]
    pub dynamic_batching: Option<DynamicBatching>,
    /// Max batch size; absent: the model's own config decides.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 2147483647)]
    pub max_batch_size: Option<i64>,
    /// Memory per replica in bytes (at most 1 TiB); absent: four times the artifact, at least
    /// 64 MiB.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1_099_511_627_776_i64)]
    pub memory_bytes: Option<i64>,
    /// Request/response capture; absent: off.
    #[serde(default)]
    pub capture: Option<CaptureSettings>,
}

/// Changes to a deployment; absent fields stay as they are, `null` clears an optional
/// setting. A new version, alias, profile, instance count, batching or memory rolls out.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"replicas": 3})))]
pub struct DeploymentUpdate {
    /// Pin this version (stops following an alias).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub version: Option<i64>,
    /// Follow this alias.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub alias: Option<Name>,
    /// Slice profile: `cpu`, `gpu` or `mig-<profile>`.
    #[serde(default)]
    #[schema(pattern = "^(cpu|gpu|mig-[a-z0-9.]{1,32})$")]
    pub profile: Option<String>,
    /// Replicas (0 to 64).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 64)]
    pub replicas: Option<i64>,
    /// Model instances per replica (1 to 16).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 16)]
    pub instance_count: Option<i64>,
    /// Dynamic batching (`null` clears it).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<DynamicBatching>)]
    pub dynamic_batching: Option<Option<DynamicBatching>>,
    /// Max batch size (`null` clears it).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>, minimum = 0, maximum = 2147483647)]
    pub max_batch_size: Option<Option<i64>>,
    /// Memory per replica, at most 1 TiB (`null` returns to the default).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 1_099_511_627_776_i64)]
    pub memory_bytes: Option<Option<i64>>,
    /// Request/response capture (replaces the settings; `{"enabled": false}` turns it off). Takes
    /// effect on the workers without a rollout.
    #[serde(default)]
    pub capture: Option<CaptureSettings>,
}

/// A field that is present (possibly `null`), as opposed to absent (`#[serde(default)]`).
fn present<'de, T: Deserialize<'de>, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A page of a tenant's deployments.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeploymentList {
    /// By name.
    pub deployments: Vec<Deployment>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// A placement decision or replica state change.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeploymentEvent {
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// What happened.
    pub kind: DeploymentEventKind,
    /// Replica concerned.
    pub replica_id: Option<Uuid>,
    /// Worker concerned.
    pub worker_id: Option<String>,
    /// Detail.
    pub message: String,
}

/// A page of a deployment's events: the latest first page, older ones after.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeploymentEventList {
    /// Oldest first within the page.
    pub events: Vec<DeploymentEvent>,
    /// Pass as `cursor` for the events before these; absent on the last page.
    pub next_cursor: Option<String>,
}

/// Checks a slice profile name: `cpu`, `gpu` or `mig-<profile>`.
pub(super) fn check_profile(profile: &str) -> Result<()> {
    if is_slice_profile(profile) {
        Ok(())
    } else {
        Err(Error::invalid("profile", "profile must be cpu, gpu or mig-<profile> (e.g. mig-1g.10gb)"))
    }
}

pub(super) fn check_range(field: &str, value: Option<i64>, min: i64, max: i64) -> Result<()> {
    match value {
        Some(v) if v < min || v > max => Err(Error::invalid(field, format!("{field} must be between {min} and {max}"))),
        _ => Ok(()),
    }
}

/// Checks batching settings; `max_batch_size` is the one asked for with them, if any.
fn check_batching(b: Option<&DynamicBatching>, max_batch_size: Option<i64>) -> Result<Option<serde_json::Value>> {
    let Some(b) = b else { return Ok(None) };
    check_range(
        "dynamic_batching.max_queue_delay_microseconds",
        Some(b.max_queue_delay_microseconds),
        0,
        MAX_QUEUE_DELAY_US,
    )?;
    let field = "dynamic_batching.preferred_batch_size";
    if b.preferred_batch_size.len() > MAX_PREFERRED_SIZES {
        return Err(Error::invalid(field, format!("{field} may list at most {MAX_PREFERRED_SIZES} sizes")));
    }
    let ceiling = max_batch_size.filter(|m| *m > 0).unwrap_or(MAX_BATCH);
    if b.preferred_batch_size.iter().any(|n| !(1..=ceiling).contains(n)) {
        return Err(Error::invalid(field, format!("{field} entries must be between 1 and {ceiling}")));
    }
    serde_json::to_value(b).map(Some).map_err(|e| Error::Internal(e.to_string()))
}

pub(super) fn version_ref(version: Option<i64>, alias: Option<Name>) -> Result<Option<VersionRef>> {
    match (version, alias) {
        (Some(_), Some(_)) => Err(Error::invalid("alias", "give at most one of version and alias")),
        (Some(v), None) if v < 1 => Err(Error::invalid("version", "version must be at least 1")),
        (Some(v), None) => Ok(Some(VersionRef::Pinned(v))),
        (None, Some(a)) => Ok(Some(VersionRef::Alias(a))),
        (None, None) => Ok(None),
    }
}

impl DeploymentCreate {
    fn into_spec(self) -> Result<(Name, Name, DeploymentSpec)> {
        let profile = self.profile.unwrap_or_else(|| "cpu".into());
        check_profile(&profile)?;
        check_range("replicas", self.replicas, 0, MAX_REPLICAS)?;
        check_range("instance_count", self.instance_count, 1, MAX_INSTANCES)?;
        check_range("max_batch_size", self.max_batch_size, 0, MAX_BATCH)?;
        check_range("memory_bytes", self.memory_bytes, 1, MAX_MEMORY_BYTES)?;
        let spec = DeploymentSpec {
            version: version_ref(self.version, self.alias)?.unwrap_or(VersionRef::Latest),
            profile,
            replicas: self.replicas.unwrap_or(1),
            instance_count: self.instance_count.unwrap_or(1),
            max_batch_size: self.max_batch_size,
            dynamic_batching: check_batching(self.dynamic_batching.as_ref(), self.max_batch_size)?,
            memory_bytes: self.memory_bytes,
            capture: self.capture.as_ref().map(CaptureSettings::checked).transpose()?,
        };
        Ok((self.name, self.model, spec))
    }
}

impl DeploymentUpdate {
    fn into_patch(self) -> Result<DeploymentPatch> {
        if let Some(p) = &self.profile {
            check_profile(p)?;
        }
        check_range("replicas", self.replicas, 0, MAX_REPLICAS)?;
        check_range("instance_count", self.instance_count, 1, MAX_INSTANCES)?;
        check_range("max_batch_size", self.max_batch_size.flatten(), 0, MAX_BATCH)?;
        check_range("memory_bytes", self.memory_bytes.flatten(), 1, MAX_MEMORY_BYTES)?;
        let dynamic_batching = match self.dynamic_batching {
            None => None,
            Some(b) => Some(check_batching(b.as_ref(), self.max_batch_size.flatten())?),
        };
        Ok(DeploymentPatch {
            version: version_ref(self.version, self.alias)?,
            profile: self.profile,
            replicas: self.replicas,
            instance_count: self.instance_count,
            max_batch_size: self.max_batch_size,
            dynamic_batching,
            memory_bytes: self.memory_bytes,
            capture: self.capture.as_ref().map(CaptureSettings::checked).transpose()?,
        })
    }
}

/// Deploys a model (deployers): the scheduler places its replicas on workers' slices.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/deployments", operation_id = "create_deployment", tag = "deployments",
    request_body = DeploymentCreate,
    params(("tenant" = String, Path, description = "Tenant name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Retry-safe creation key")),
    responses(
        (status = 201, description = "Created; replicas are placed shortly.", body = Deployment),
        (status = 409, description = "The name is taken (`already_exists`), the model is already deployed \
                                      (`model_deployed`), the replica quota is full (`quota_exceeded.replicas`) \
                                      or the month's spend reached its quota (`quota_exceeded.monthly_spend_cents`).",
         body = crate::error::ErrorBody)))]
pub async fn handle_deployment_create(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiJson(body): ApiJson<DeploymentCreate>,
) -> Result<(StatusCode, Json<Deployment>)> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Deployer, "create deployments").await?;
    let (name, model, spec) = body.into_spec()?;
    let created = deployments::create(&app, &caller.actor, t.id, &name, &model, spec).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Lists a tenant's deployments by name.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/deployments", operation_id = "list_deployments", tag = "deployments",
    params(("tenant" = String, Path, description = "Tenant name"), PageParams),
    responses((status = 200, description = "A page of deployments.", body = DeploymentList)))]
pub async fn handle_deployment_list(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> Result<Json<DeploymentList>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Viewer, "list deployments").await?;
    let limit = page.limit()?;
    let rows = deployments::list(&app, t.id).await?;
    let key = |d: &DeploymentRow| d.name.clone();
    let (rows, next_cursor) = cursor::page(rows, "deployments", key, page.cursor.as_deref(), limit)?;
    let deployments = deployments::statuses(&app, t.id, rows).await?;
    Ok(Json(DeploymentList { deployments, next_cursor }))
}

pub(super) async fn deployment_for(
    app: &AppState,
    caller: &Caller,
    tenant: &str,
    name: &str,
    needed: Role,
    action: &'static str,
) -> Result<DeploymentRow> {
    let t = app.tenant_for(&caller.principal, tenant, needed, action).await?;
    deployments::find(app, t.id, name).await
}

/// One deployment with its replicas.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/deployments/{deployment}", operation_id = "get_deployment", tag = "deployments",
    params(("tenant" = String, Path, description = "Tenant name"), ("deployment" = String, Path, description = "Deployment name")),
    responses((status = 200, description = "The deployment.", body = Deployment)))]
pub async fn handle_deployment_get(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, name)): Path<(String, String)>,
) -> Result<Json<Deployment>> {
    let d = deployment_for(&app, &caller, &tenant, &name, Role::Viewer, "read deployments").await?;
    Ok(Json(deployments::status_of(&app, d).await?))
}

/// Changes a deployment (deployers). A new version (or alias), profile, instance count,
/// batching or memory rolls out: new replicas load beside the old ones, traffic switches when
/// all are ready, then the old ones drain.
#[utoipa::path(patch, path = "/v1/tenants/{tenant}/deployments/{deployment}", operation_id = "update_deployment", tag = "deployments",
    request_body = DeploymentUpdate,
    params(("tenant" = String, Path, description = "Tenant name"), ("deployment" = String, Path, description = "Deployment name")),
    responses(
        (status = 200, description = "The deployment.", body = Deployment),
        (status = 409, description = "The replica quota is full (`quota_exceeded.replicas`), or more replicas were \
                                      asked for after the month's spend reached its quota \
                                      (`quota_exceeded.monthly_spend_cents`).", body = crate::error::ErrorBody)))]
pub async fn handle_deployment_update(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, name)): Path<(String, String)>,
    ApiJson(body): ApiJson<DeploymentUpdate>,
) -> Result<Json<Deployment>> {
    let d = deployment_for(&app, &caller, &tenant, &name, Role::Deployer, "change deployments").await?;
    let patch = body.into_patch()?;
    Ok(Json(deployments::update(&app, &caller.actor, &d, patch).await?))
}

/// Deletes a deployment (deployers); workers unload its replicas.
#[utoipa::path(delete, path = "/v1/tenants/{tenant}/deployments/{deployment}", operation_id = "delete_deployment", tag = "deployments",
    params(("tenant" = String, Path, description = "Tenant name"), ("deployment" = String, Path, description = "Deployment name")),
    responses((status = 204, description = "Deleted.")))]
pub async fn handle_deployment_delete(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, name)): Path<(String, String)>,
) -> Result<StatusCode> {
    let d = deployment_for(&app, &caller, &tenant, &name, Role::Deployer, "delete deployments").await?;
    deployments::delete(&app, &caller.actor, &d).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A deployment's placement events: the latest page first (oldest first within it), then
/// older pages through `next_cursor`.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/deployments/{deployment}/events", operation_id = "list_deployment_events", tag = "deployments",
    params(("tenant" = String, Path, description = "Tenant name"), ("deployment" = String, Path, description = "Deployment name"),
           PageParams),
    responses((status = 200, description = "A page of events.", body = DeploymentEventList)))]
pub async fn handle_deployment_events(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, name)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> Result<Json<DeploymentEventList>> {
    let d = deployment_for(&app, &caller, &tenant, &name, Role::Viewer, "read deployments").await?;
    let limit = page.limit()?;
    let before = page.cursor.as_deref().map(|c| cursor::decode_number("events", c)).transpose()?;
    let mut rows = app.registry.conn().await?.deployment_events_before(d.tenant_id, d.id, before, limit + 1).await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = if more { rows.last().map(|e| cursor::encode("events", &e.seq.to_string())) } else { None };
    let events = rows.into_iter().rev().filter_map(event_view).collect();
    Ok(Json(DeploymentEventList { events, next_cursor }))
}

/// The API's view of an event; `None` (logged) for a kind this build does not know, which
/// the registry's assertion keeps from happening.
fn event_view(e: crate::registry::DeploymentEventRow) -> Option<DeploymentEvent> {
    let Some(kind) = DeploymentEventKind::parse(&e.kind) else {
        tracing::error!(kind = %e.kind, seq = e.seq, "deployment event of unknown kind left out");
        return None;
    };
    Some(DeploymentEvent { at: e.at, kind, replica_id: e.replica_id, worker_id: e.worker_id, message: e.message })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: serde_json::Value) -> DeploymentCreate {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn create_bodies_are_checked() {
        let (name, model, spec) = body(serde_json::json!({ "name": "d", "model": "m" })).into_spec().unwrap();
        assert_eq!((name.as_str(), model.as_str()), ("d", "m"));
        assert_eq!((spec.version, spec.replicas, spec.instance_count), (VersionRef::Latest, 1, 1));
        assert_eq!(spec.profile, "cpu");
        let fails = |v: serde_json::Value, field: &str| match body(v).into_spec() {
            Err(Error::InvalidInput { field: Some(f), .. }) => assert_eq!(f, field),
            other => panic!("expected a complaint about {field}: {other:?}"),
        };
        fails(serde_json::json!({ "name": "d", "model": "m", "version": 1, "alias": "prod" }), "alias");
        fails(serde_json::json!({ "name": "d", "model": "m", "replicas": 65 }), "replicas");
        fails(serde_json::json!({ "name": "d", "model": "m", "instance_count": 0 }), "instance_count");
        fails(serde_json::json!({ "name": "d", "model": "m", "profile": "tpu" }), "profile");
        fails(serde_json::json!({ "name": "d", "model": "m", "profile": "mig-" }), "profile");
        let (_, _, mig) =
            body(serde_json::json!({ "name": "d", "model": "m", "profile": "mig-1g.10gb" })).into_spec().unwrap();
        assert_eq!(mig.profile, "mig-1g.10gb");
        let batching = |b: serde_json::Value| serde_json::json!({ "name": "d", "model": "m", "dynamic_batching": b });
        let sizes = "dynamic_batching.preferred_batch_size";
        fails(batching(serde_json::json!({ "preferred_batch_size": [1_i64 << 40] })), sizes);
        fails(batching(serde_json::json!({ "preferred_batch_size": [0] })), sizes);
        fails(batching(serde_json::json!({ "preferred_batch_size": vec![1; 17] })), sizes);
        fails(
            serde_json::json!({ "name": "d", "model": "m", "max_batch_size": 4,
                                "dynamic_batching": { "preferred_batch_size": [8] } }),
            sizes,
        );
        fails(
            batching(serde_json::json!({ "max_queue_delay_microseconds": 60_000_001 })),
            "dynamic_batching.max_queue_delay_microseconds",
        );
        fails(serde_json::json!({ "name": "d", "model": "m", "max_batch_size": 1_i64 << 31 }), "max_batch_size");
        fails(serde_json::json!({ "name": "d", "model": "m", "memory_bytes": (1_i64 << 40) + 1 }), "memory_bytes");
        let ok = batching(serde_json::json!({ "preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 100 }));
        assert!(body(ok).into_spec().is_ok());
        // The model is a name, like the deployment's.
        assert!(
            serde_json::from_value::<DeploymentCreate>(serde_json::json!({ "name": "d", "model": "../m" })).is_err()
        );
    }

    #[test]
    fn patches_tell_absent_from_null() {
        let p: DeploymentUpdate =
            serde_json::from_value(serde_json::json!({ "max_batch_size": null, "replicas": 2 })).unwrap();
        let patch = p.into_patch().unwrap();
        assert_eq!(patch.max_batch_size, Some(None));
        assert_eq!(patch.memory_bytes, None);
        assert_eq!(patch.replicas, Some(2));
    }
}
