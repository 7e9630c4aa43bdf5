//! Aliases: movable names (`production`, `staging`) for versions. Moving one is how a rollout
//! or rollback is asked for.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::models::PageParams;
use super::{ApiJson, ApiQuery, AppState, Caller, cursor};
use crate::error::{Error, Result};
use crate::registry::AliasRow;
use crate::types::{Name, Role};

/// An alias.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Alias {
    /// Alias name.
    pub alias: String,
    /// Version it points at.
    pub version: i64,
    /// Version it pointed at before its last move (absent: it never moved). Rolling back is
    /// setting the alias to this version (`tessera aliases rollback`).
    pub previous_version: Option<i64>,
    /// Key that last moved it.
    pub updated_by: Option<Uuid>,
    /// Last moved.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl From<AliasRow> for Alias {
    fn from(a: AliasRow) -> Self {
        Alias {
            alias: a.alias,
            version: a.version,
            previous_version: a.previous_version,
            updated_by: a.updated_by,
            updated_at: a.updated_at,
        }
    }
}

/// A page of a model's aliases.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AliasList {
    /// By name.
    pub aliases: Vec<Alias>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// Where an alias should point.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"version": 3})))]
pub struct SetAlias {
    /// An existing version of the model.
    #[schema(minimum = 1)]
    pub version: i64,
}

/// Lists a model's aliases by name.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/models/{model}/aliases", operation_id = "list_aliases", tag = "models",
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name"),
           PageParams),
    responses((status = 200, description = "A page of aliases.", body = AliasList)))]
pub async fn handle_alias_list(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> Result<Json<AliasList>> {
    let m = app.model_for(&caller.principal, &tenant, &model, Role::Viewer, "list aliases").await?;
    let limit = page.limit()?;
    let rows = app.registry.conn().await?.aliases(m.tenant_id, m.id).await?;
    let (rows, next_cursor) =
        cursor::page(rows, "aliases", |a: &AliasRow| a.alias.clone(), page.cursor.as_deref(), limit)?;
    Ok(Json(AliasList { aliases: rows.into_iter().map(Alias::from).collect(), next_cursor }))
}

/// Points an alias at a version, creating or moving it (deployers).
#[utoipa::path(put, path = "/v1/tenants/{tenant}/models/{model}/aliases/{alias}", operation_id = "set_alias", tag = "models",
    request_body = SetAlias,
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name"),
           ("alias" = String, Path, description = "Alias name")),
    responses((status = 200, description = "The alias.", body = Alias)))]
pub async fn handle_alias_set(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model, alias)): Path<(String, String, String)>,
    ApiJson(body): ApiJson<SetAlias>,
) -> Result<Json<Alias>> {
    let m = app.model_for(&caller.principal, &tenant, &model, Role::Deployer, "move aliases").await?;
    let alias = Name::from_path("alias", &alias)?;
    if body.version < 1 {
        return Err(Error::invalid("version", "version must be at least 1"));
    }
    let row = app.registry.set_alias(&caller.actor, &m, &alias, body.version).await?;
    // A deployment following the alias rolls to the new version.
    app.signals.wake_scheduler();
    Ok(Json(row.into()))
}

/// One alias.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/models/{model}/aliases/{alias}", operation_id = "get_alias", tag = "models",
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name"),
           ("alias" = String, Path, description = "Alias name")),
    responses((status = 200, description = "The alias.", body = Alias)))]
pub async fn handle_alias_get(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model, alias)): Path<(String, String, String)>,
) -> Result<Json<Alias>> {
    let m = app.model_for(&caller.principal, &tenant, &model, Role::Viewer, "read aliases").await?;
    let alias = Name::parse(&alias).map_err(|_| Error::NotFound("alias"))?;
    let row =
        app.registry.conn().await?.alias(m.tenant_id, m.id, alias.as_str()).await?.ok_or(Error::NotFound("alias"))?;
    Ok(Json(row.into()))
}

/// Removes an alias (deployers).
#[utoipa::path(delete, path = "/v1/tenants/{tenant}/models/{model}/aliases/{alias}", operation_id = "delete_alias", tag = "models",
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name"),
           ("alias" = String, Path, description = "Alias name")),
    responses((status = 204, description = "Removed.")))]
pub async fn handle_alias_delete(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model, alias)): Path<(String, String, String)>,
) -> Result<StatusCode> {
    let m = app.model_for(&caller.principal, &tenant, &model, Role::Deployer, "remove aliases").await?;
    let alias = Name::parse(&alias).map_err(|_| Error::NotFound("alias"))?;
    app.registry.delete_alias(&caller.actor, &m, alias.as_str()).await?;
    Ok(StatusCode::NO_CONTENT)
}
