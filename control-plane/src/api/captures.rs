//! Captured requests: a deployment's capture files (list, download) and the tenant's capture
//! retention. Reading needs the roles that read deployments; another tenant's deployment is
//! 404 like any other resource of it.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

use super::deployments::deployment_for;
use super::models::PageParams;
use super::{ApiJson, ApiQuery, AppState, Caller, cursor};
use crate::capture::{self, CaptureFile, MAX_RETENTION_DAYS};
use crate::error::{Error, Result};
use crate::types::Role;

/// Chunk size of a download.
const DOWNLOAD_CHUNK: usize = 256 * 1024;

/// One capture file: a batch of captured requests as JSON Lines.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CaptureFileInfo {
    /// `YYYY-MM-DD/<worker>-<batch>.jsonl` (the date of its first request, UTC): the path
    /// under `.../captures/` that downloads it.
    pub name: String,
    /// Bytes.
    pub size_bytes: u64,
    /// When it was written.
    #[serde(with = "time::serde::rfc3339")]
    pub last_modified: OffsetDateTime,
}

/// A page of a deployment's capture files.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CaptureFileList {
    /// By name (date first, so oldest first).
    pub files: Vec<CaptureFileInfo>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// A tenant's capture retention.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CaptureRetention {
    /// The tenant's own setting in days; `null`: the default applies.
    pub days: Option<i64>,
    /// The control plane's default (`--capture-retention-days`).
    pub default_days: i64,
    /// Days files are kept now: `days`, else `default_days`.
    pub effective_days: i64,
}

/// A new capture retention.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"days": 7})))]
pub struct CaptureRetentionUpdate {
    /// Days to keep capture files (1 to 3650); `null` returns to the default.
    #[schema(minimum = 1, maximum = 3650)]
    pub days: Option<i64>,
}

/// A deployment's capture files, oldest first (viewers).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/deployments/{deployment}/captures", operation_id = "list_captures", tag = "deployments",
    params(("tenant" = String, Path, description = "Tenant name"), ("deployment" = String, Path, description = "Deployment name"),
           PageParams),
    responses((status = 200, description = "A page of capture files.", body = CaptureFileList)))]
pub async fn handle_capture_list(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, name)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> Result<Json<CaptureFileList>> {
    let d = deployment_for(&app, &caller, &tenant, &name, Role::Viewer, "read captures").await?;
    let limit = page.limit()?;
    let files = capture::files(&app.store, d.tenant_id, d.id).await?;
    let key = |f: &CaptureFile| f.name.clone();
    let (files, next_cursor) = cursor::page(files, "captures", key, page.cursor.as_deref(), limit)?;
    let files = files
        .into_iter()
        .map(|f| CaptureFileInfo { name: f.name, size_bytes: f.size, last_modified: f.last_modified })
        .collect();
    Ok(Json(CaptureFileList { files, next_cursor }))
}

/// Downloads one capture file (viewers): JSON Lines, one captured request a line, each with
/// `request_id`, `model`, `version`, `received_at_ms`, `duration_us`, `status`, and the
/// request and response in KServe v2 JSON (tensors without a JSON form as `data_base64`).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/deployments/{deployment}/captures/{date}/{file}", operation_id = "get_capture", tag = "deployments",
    params(("tenant" = String, Path, description = "Tenant name"), ("deployment" = String, Path, description = "Deployment name"),
           ("date" = String, Path, description = "`YYYY-MM-DD` of the file's name"),
           ("file" = String, Path, description = "`<worker>-<batch>.jsonl` of the file's name")),
    responses((status = 200, description = "The file.", content_type = "application/x-ndjson", body = String)))]
pub async fn handle_capture_get(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, name, date, file)): Path<(String, String, String, String)>,
) -> Result<Response> {
    let d = deployment_for(&app, &caller, &tenant, &name, Role::Viewer, "read captures").await?;
    let file_name = format!("{date}/{file}");
    if !capture::is_file_name(&file_name) {
        return Err(Error::NotFound("capture file"));
    }
    let key = format!("{}{file_name}", capture::deployment_prefix(d.tenant_id, d.id));
    let chunks = match app.store.get_chunks(&key, DOWNLOAD_CHUNK).await {
        Ok(chunks) => chunks,
        Err(Error::NotFound(_)) => return Err(Error::NotFound("capture file")),
        Err(e) => return Err(e),
    };
    let body = Body::from_stream(chunks.map(|c| c.map_err(|e| std::io::Error::other(e.to_string()))));
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

/// A tenant's capture retention (viewers).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/capture-retention", operation_id = "get_capture_retention", tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, description = "The retention.", body = CaptureRetention)))]
pub async fn handle_capture_retention_get(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<Json<CaptureRetention>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Viewer, "read capture retention").await?;
    let days = app.registry.conn().await?.capture_retention(t.id).await?;
    Ok(Json(retention(&app, days)))
}

/// Sets how long a tenant's capture files are kept (tenant admins); the leader's periodic
/// sweep deletes older files.
#[utoipa::path(put, path = "/v1/tenants/{tenant}/capture-retention", operation_id = "set_capture_retention", tag = "tenants",
    request_body = CaptureRetentionUpdate,
    params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, description = "The retention.", body = CaptureRetention)))]
pub async fn handle_capture_retention_set(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiJson(body): ApiJson<CaptureRetentionUpdate>,
) -> Result<Json<CaptureRetention>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::TenantAdmin, "set capture retention").await?;
    if body.days.is_some_and(|d| !(1..=MAX_RETENTION_DAYS).contains(&d)) {
        return Err(Error::invalid("days", format!("days must be between 1 and {MAX_RETENTION_DAYS}")));
    }
    app.registry.set_capture_retention(&caller.actor, t.id, body.days).await?;
    Ok(Json(retention(&app, body.days)))
}

fn retention(app: &AppState, days: Option<i64>) -> CaptureRetention {
    let default_days = capture::effective_days(None, app.config.capture_retention_days);
    CaptureRetention { days, default_days, effective_days: days.unwrap_or(default_days) }
}
