//! A deployment's canary: a second version with a share of unversioned traffic, set and
//! weighted, then promoted (it rolls out to the stable replicas) or rolled back (its replicas
//! drain). Writes store the desired state and wake the scheduler, like the other deployment
//! routes; the gateway splits the traffic.

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::ToSchema;

use super::deployments::{Deployment, MAX_REPLICAS, check_range, deployment_for, version_ref};
use super::{ApiJson, AppState, Caller};
use crate::deployments::status_of;
use crate::error::{Error, Result};
use crate::registry::{CanarySpec, VersionRef};
use crate::types::{Name, Role};

/// Least and most percent of traffic a canary may take.
const WEIGHTS: (i64, i64) = (1, 99);

/// A canary to set (or to replace the current one with).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"version": 4, "weight": 10, "replicas": 1})))]
pub struct CanarySet {
    /// The canary's version: exactly one of `version` and `alias`; it must differ from the
    /// deployment's version.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub version: Option<i64>,
    /// An alias whose current version becomes the canary (resolved now, not followed).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub alias: Option<Name>,
    /// Percent of unversioned traffic the canary gets once a replica is ready (1 to 99).
    #[schema(minimum = 1, maximum = 99)]
    pub weight: Option<i64>,
    /// Replicas of the canary (1 to 64, default 1); they count against the replica quota.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 64)]
    pub replicas: Option<i64>,
}

/// A new weight for the canary.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"weight": 50})))]
pub struct CanaryWeight {
    /// Percent of unversioned traffic the canary gets (1 to 99).
    #[schema(minimum = 1, maximum = 99)]
    pub weight: Option<i64>,
}

/// The weight, which must be given and within [`WEIGHTS`].
fn check_weight(weight: Option<i64>) -> Result<i64> {
    let (min, max) = WEIGHTS;
    let weight = weight.ok_or_else(|| Error::invalid("weight", format!("weight is required ({min} to {max})")))?;
    check_range("weight", Some(weight), min, max)?;
    Ok(weight)
}

impl CanarySet {
    fn into_spec(self) -> Result<CanarySpec> {
        let weight = check_weight(self.weight)?;
        check_range("replicas", self.replicas, 1, MAX_REPLICAS)?;
        let version: VersionRef = version_ref(self.version, self.alias)?
            .ok_or_else(|| Error::invalid("version", "give the canary's version (or an alias)"))?;
        Ok(CanarySpec { version, weight, replicas: self.replicas.unwrap_or(1) })
    }
}

/// Sets the deployment's canary, or replaces it (deployers): its replicas load beside the
/// stable ones and serve once ready; the gateway then sends it `weight` percent of unversioned
/// requests. Versioned requests reach the version asked for.
#[utoipa::path(put, path = "/v1/tenants/{tenant}/deployments/{deployment}/canary", operation_id = "set_canary", tag = "deployments",
    request_body = CanarySet,
    params(("tenant" = String, Path, description = "Tenant name"), ("deployment" = String, Path, description = "Deployment name")),
    responses(
        (status = 200, description = "The deployment, with the canary.", body = Deployment),
        (status = 409, description = "The replica quota is full (`quota_exceeded.replicas`).", body = crate::error::ErrorBody)))]
pub async fn handle_canary_set(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, name)): Path<(String, String)>,
    ApiJson(body): ApiJson<CanarySet>,
) -> Result<Json<Deployment>> {
    let d = deployment_for(&app, &caller, &tenant, &name, Role::Deployer, "change deployments").await?;
    let spec = body.into_spec()?;
    let set = app.registry.set_canary(&caller.actor, d.tenant_id, &d.name, spec).await;
    let row = app.noting_quota(d.tenant_id, set).await?;
    app.signals.wake_scheduler();
    Ok(Json(status_of(&app, row).await?))
}

/// Changes the canary's share of unversioned traffic (deployers).
#[utoipa::path(patch, path = "/v1/tenants/{tenant}/deployments/{deployment}/canary", operation_id = "update_canary", tag = "deployments",
    request_body = CanaryWeight,
    params(("tenant" = String, Path, description = "Tenant name"), ("deployment" = String, Path, description = "Deployment name")),
    responses(
        (status = 200, description = "The deployment.", body = Deployment),
        (status = 409, description = "The deployment has no canary (`no_canary`).", body = crate::error::ErrorBody)))]
pub async fn handle_canary_update(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, name)): Path<(String, String)>,
    ApiJson(body): ApiJson<CanaryWeight>,
) -> Result<Json<Deployment>> {
    let d = deployment_for(&app, &caller, &tenant, &name, Role::Deployer, "change deployments").await?;
    let weight = check_weight(body.weight)?;
    let row = app.registry.set_canary_weight(&caller.actor, d.tenant_id, &d.name, weight).await?;
    Ok(Json(status_of(&app, row).await?))
}

/// Promotes the canary (deployers): its version becomes the deployment's (pinned: an alias is
/// no longer followed) and rolls out to the stable replicas like any new version (they load
/// beside the old ones and switch when all are ready, so no request fails); the canary keeps its
/// share until then, and is cleared once the stable replicas serve its version.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/deployments/{deployment}/canary/promote", operation_id = "promote_canary", tag = "deployments",
    params(("tenant" = String, Path, description = "Tenant name"), ("deployment" = String, Path, description = "Deployment name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Retry-safe key")),
    responses(
        (status = 200, description = "The deployment, rolling out to the canary's version.", body = Deployment),
        (status = 409, description = "The deployment has no canary (`no_canary`).", body = crate::error::ErrorBody)))]
pub async fn handle_canary_promote(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, name)): Path<(String, String)>,
) -> Result<Json<Deployment>> {
    let d = deployment_for(&app, &caller, &tenant, &name, Role::Deployer, "change deployments").await?;
    let row = app.registry.promote_canary(&caller.actor, d.tenant_id, &d.name).await?;
    app.signals.wake_scheduler();
    Ok(Json(status_of(&app, row).await?))
}

/// Rolls the canary back (deployers): it is cleared, the stable version takes all unversioned
/// traffic at once and the canary's replicas drain.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/deployments/{deployment}/canary/rollback", operation_id = "rollback_canary", tag = "deployments",
    params(("tenant" = String, Path, description = "Tenant name"), ("deployment" = String, Path, description = "Deployment name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Retry-safe key")),
    responses(
        (status = 200, description = "The deployment, without a canary.", body = Deployment),
        (status = 409, description = "The deployment has no canary (`no_canary`).", body = crate::error::ErrorBody)))]
pub async fn handle_canary_rollback(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, name)): Path<(String, String)>,
) -> Result<Json<Deployment>> {
    let d = deployment_for(&app, &caller, &tenant, &name, Role::Deployer, "change deployments").await?;
    let row = app.registry.rollback_canary(&caller.actor, d.tenant_id, &d.name).await?;
    app.signals.wake_scheduler();
    Ok(Json(status_of(&app, row).await?))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn field_of(result: Result<impl std::fmt::Debug>) -> String {
        match result {
            Err(Error::InvalidInput { field: Some(f), .. }) => f,
            other => panic!("expected a complaint naming a field: {other:?}"),
        }
    }

    fn set(v: serde_json::Value) -> Result<CanarySpec> {
        serde_json::from_value::<CanarySet>(v).expect("a body").into_spec()
    }

    #[test]
    fn canary_bodies_are_checked_naming_the_field() {
        let spec = set(json!({ "version": 2, "weight": 10 })).expect("valid");
        assert_eq!(spec, CanarySpec { version: VersionRef::Pinned(2), weight: 10, replicas: 1 });
        let spec = set(json!({ "alias": "staging", "weight": 99, "replicas": 3 })).expect("valid");
        assert_eq!((spec.weight, spec.replicas), (99, 3));
        assert!(matches!(spec.version, VersionRef::Alias(a) if a.as_str() == "staging"));
        for weight in [json!(0), json!(100), json!(-5)] {
            assert_eq!(field_of(set(json!({ "version": 2, "weight": weight }))), "weight");
        }
        assert_eq!(field_of(set(json!({ "version": 2 }))), "weight");
        assert_eq!(field_of(set(json!({ "weight": 10 }))), "version");
        assert_eq!(field_of(set(json!({ "version": 0, "weight": 10 }))), "version");
        assert_eq!(field_of(set(json!({ "version": 2, "alias": "a", "weight": 10 }))), "alias");
        assert_eq!(field_of(set(json!({ "version": 2, "weight": 10, "replicas": 0 }))), "replicas");
        assert_eq!(field_of(set(json!({ "version": 2, "weight": 10, "replicas": 65 }))), "replicas");
        assert_eq!(field_of(check_weight(None)), "weight");
        assert_eq!(check_weight(Some(25)).expect("valid"), 25);
    }
}
