//! Deployments as use cases: create, change, delete, find and show a tenant's deployments.
//! Writes store the desired state in the registry and wake the scheduler, which places
//! replicas and rolls versions; reads assemble each deployment's status ([`status`]) from its
//! replicas, derived state ([`state`]) and replica memory ([`memory`]).
//!
//! The HTTP handlers in `api/` authorize, parse requests into a [`DeploymentSpec`] or
//! [`DeploymentPatch`], call one of these and map the answer; nothing here knows HTTP.

pub mod memory;
pub mod state;
pub mod status;

use uuid::Uuid;

use crate::app::App;
use crate::error::{Error, Result};
use crate::registry::{Actor, DeploymentPatch, DeploymentRow, DeploymentSpec, unfollowed_alias};
use crate::types::Name;
pub use status::Deployment;

/// A tenant's deployment by name.
pub async fn find(app: &App, tenant_id: Uuid, name: &str) -> Result<DeploymentRow> {
    // Not a valid name: no deployment has it (and it never reaches a query).
    if Name::parse(name).is_err() {
        return Err(Error::NotFound("deployment"));
    }
    app.registry.conn().await?.deployment(tenant_id, name).await?.ok_or(Error::NotFound("deployment"))
}

/// Every deployment of a tenant, by name.
pub async fn list(app: &App, tenant_id: Uuid) -> Result<Vec<DeploymentRow>> {
    app.registry.conn().await?.deployments(tenant_id).await
}

/// The statuses of deployments of one tenant, in the order given (a fixed number of queries
/// for any number of them).
pub async fn statuses(app: &App, tenant_id: Uuid, rows: Vec<DeploymentRow>) -> Result<Vec<Deployment>> {
    let mut conn = app.registry.conn().await?;
    status::statuses(&mut conn, gateway(app), tenant_id, rows).await
}

/// One deployment's status.
pub async fn status_of(app: &App, row: DeploymentRow) -> Result<Deployment> {
    let tenant_id = row.tenant_id;
    let mut statuses = statuses(app, tenant_id, vec![row]).await?;
    statuses.pop().ok_or(Error::NotFound("deployment"))
}

/// Deploys `model` as `name` in a tenant; the scheduler places its replicas shortly.
pub async fn create(
    app: &App,
    actor: &Actor,
    tenant_id: Uuid,
    name: &Name,
    model: &Name,
    spec: DeploymentSpec,
) -> Result<Deployment> {
    let created = app.registry.create_deployment(actor, tenant_id, name, model.as_str(), spec).await;
    let row = app.noting_quota(tenant_id, created).await?;
    app.signals.wake_scheduler();
    status_of(app, row).await
}

/// Changes a deployment; a new version, profile, instance count, batching or memory rolls out.
/// The answer carries a notice when pinning a version stopped following an alias.
pub async fn update(app: &App, actor: &Actor, d: &DeploymentRow, patch: DeploymentPatch) -> Result<Deployment> {
    let updated = app.registry.update_deployment(actor, d.tenant_id, &d.name, patch).await;
    let row = app.noting_quota(d.tenant_id, updated).await?;
    app.signals.wake_scheduler();
    let notice = match (&d.alias, &row.alias) {
        (Some(alias), None) => Some(unfollowed_alias(alias, row.version)),
        _ => None,
    };
    Ok(Deployment { notice, ..status_of(app, row).await? })
}

/// Deletes a deployment; workers unload its replicas.
pub async fn delete(app: &App, actor: &Actor, d: &DeploymentRow) -> Result<()> {
    app.registry.delete_deployment(actor, d.tenant_id, &d.name).await?;
    app.signals.assignments_changed();
    app.signals.wake_scheduler();
    Ok(())
}

/// Where the gateways take this deployment's inference, as configured.
fn gateway(app: &App) -> status::Gateway<'_> {
    status::Gateway { url: app.config.gateway_url.as_deref(), grpc_address: app.config.gateway_grpc_address.as_deref() }
}
