//! Models: named, per tenant.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::{ApiJson, ApiQuery, AppState, Caller, cursor};
use crate::error::{Error, Result};
use crate::registry::ModelRow;
use crate::types::{Name, Role};

/// A model.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Model {
    /// Id.
    pub id: Uuid,
    /// Name, unique in the tenant.
    pub name: String,
    /// Description.
    pub description: String,
    /// Newest version number (0 before the first upload).
    pub latest_version: i64,
    /// Key that created it.
    pub created_by: Option<Uuid>,
    /// Created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last changed (a version added).
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl From<ModelRow> for Model {
    fn from(m: ModelRow) -> Self {
        Model {
            id: m.id,
            name: m.name,
            description: m.description,
            latest_version: m.next_version - 1,
            created_by: m.created_by,
            created_at: m.created_at,
            updated_at: m.updated_at,
        }
    }
}

/// A new model.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"name": "resnet50", "description": "Image classifier, ImageNet-1k"})))]
pub struct CreateModel {
    /// Name, unique in the tenant: lower-case letters, digits, `-`, `_`, `.`; at most 63.
    #[schema(value_type = String, pattern = "^[a-z0-9][a-z0-9_.-]{0,62}$")]
    pub name: Name,
    /// Description.
    #[serde(default)]
    #[schema(max_length = 2000)]
    pub description: String,
}

/// A page of models.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ModelPage {
    /// Models by name.
    pub models: Vec<Model>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// Paging.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Most items to return (1 to 200, default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page (opaque; anything else is refused with 400).
    #[param(max_length = 256)]
    pub cursor: Option<String>,
}

impl PageParams {
    /// The page size, checked.
    pub fn limit(&self) -> Result<i64> {
        match self.limit {
            None => Ok(50),
            Some(n @ 1..=200) => Ok(n),
            Some(_) => Err(Error::invalid("limit", "limit must be between 1 and 200")),
        }
    }
}

/// Registers a model (deployers).
#[utoipa::path(post, path = "/v1/tenants/{tenant}/models", operation_id = "create_model", tag = "models", request_body = CreateModel,
    params(("tenant" = String, Path, description = "Tenant name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Retry-safe creation key")),
    responses(
        (status = 201, description = "Created.", body = Model),
        (status = 409, description = "The name is taken (`already_exists`) or the model quota is full \
                                      (`quota_exceeded.models`).", body = crate::error::ErrorBody)))]
pub async fn handle_model_create(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiJson(body): ApiJson<CreateModel>,
) -> Result<(StatusCode, Json<Model>)> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Deployer, "register models").await?;
    if body.description.chars().count() > 2000 {
        return Err(Error::invalid("description", "description must be at most 2000 characters"));
    }
    let created = app.registry.create_model(&caller.actor, t.id, &body.name, &body.description).await;
    let model = app.noting_quota(t.id, created).await?;
    Ok((StatusCode::CREATED, Json(model.into())))
}

/// Lists a tenant's models by name.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/models", operation_id = "list_models", tag = "models",
    params(("tenant" = String, Path, description = "Tenant name"), PageParams),
    responses((status = 200, description = "A page of models.", body = ModelPage)))]
pub async fn handle_model_list(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> Result<Json<ModelPage>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Viewer, "list models").await?;
    let limit = page.limit()?;
    let after = page.cursor.as_deref().map(|c| cursor::decode_name("models", c)).transpose()?;
    let rows = app.registry.conn().await?.models(t.id, after.as_ref().map(Name::as_str), limit + 1).await?;
    let more = rows.len() as i64 > limit;
    let models: Vec<Model> = rows.into_iter().take(limit as usize).map(Model::from).collect();
    let next_cursor = if more { models.last().map(|m| cursor::encode("models", &m.name)) } else { None };
    Ok(Json(ModelPage { models, next_cursor }))
}

/// One model.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/models/{model}", operation_id = "get_model", tag = "models",
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name")),
    responses((status = 200, description = "The model.", body = Model)))]
pub async fn handle_model_get(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model)): Path<(String, String)>,
) -> Result<Json<Model>> {
    let m = app.model_for(&caller.principal, &tenant, &model, Role::Viewer, "read models").await?;
    Ok(Json(m.into()))
}

/// Deletes a model with all its versions, aliases and artifacts (deployers); refused while a
/// deployment uses it.
#[utoipa::path(delete, path = "/v1/tenants/{tenant}/models/{model}", operation_id = "delete_model", tag = "models",
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name")),
    responses(
        (status = 204, description = "Deleted."),
        (status = 409, description = "A deployment uses the model (`model_deployed`), or an ensemble version of another model composes one of its versions (`version_in_use`).", body = crate::error::ErrorBody)))]
pub async fn handle_model_delete(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model)): Path<(String, String)>,
) -> Result<StatusCode> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Deployer, "delete models").await?;
    let artifacts = app.registry.delete_model(&caller.actor, t.id, &model).await?;
    app.store.delete_all(&artifacts).await;
    Ok(StatusCode::NO_CONTENT)
}
