//! Model versions: immutable artifacts, uploaded as a stream or through a presigned URL.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::models::PageParams;
use super::{ApiJson, ApiQuery, AppState, Caller, cursor};
use crate::error::{Error, Result};
use crate::registry::VersionRow;
use crate::signature::Signature;
use crate::states::VersionState;
use crate::types::{ArtifactFormat, Role};
use crate::uploads::{UploadRequest, parse_sha256};

/// A model version.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ModelVersion {
    /// Model name.
    pub model: String,
    /// Version number, from 1.
    pub version: i64,
    /// Hex sha256 of the artifact.
    pub sha256: String,
    /// Artifact size in bytes.
    pub size_bytes: i64,
    /// Packaging.
    pub format: ArtifactFormat,
    /// Model configuration (Triton's, as JSON), when given.
    #[schema(value_type = Option<Object>)]
    pub config: Option<serde_json::Value>,
    /// What the version is doing, from the replicas that run it: `uploaded` (none does),
    /// `deployed` (placed, loading or failed, none serving) or `serving`.
    pub status: VersionState,
    /// What the version takes and returns, learned from its ONNX graph and config at upload
    /// (`null` for versions uploaded before signatures were kept, and for archives holding
    /// several candidate models).
    pub signature: Option<Signature>,
    /// Object-store key of the artifact.
    pub artifact_key: String,
    /// Key that uploaded it.
    pub created_by: Option<Uuid>,
    /// Created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

impl ModelVersion {
    fn new(model: &str, v: VersionRow, status: VersionState) -> Self {
        ModelVersion {
            model: model.to_string(),
            version: v.version,
            sha256: v.sha256,
            size_bytes: v.size_bytes,
            format: ArtifactFormat::parse(&v.format).unwrap_or(ArtifactFormat::Onnx),
            config: v.config.map(|c| c.0),
            status,
            signature: v.signature.map(|s| s.0),
            artifact_key: v.artifact_key,
            created_by: v.created_by,
            created_at: v.created_at,
        }
    }
}

/// A page of versions.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VersionPage {
    /// Versions, newest first.
    pub versions: Vec<ModelVersion>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// The artifact bytes.
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct ArtifactBytes(#[allow(dead_code)] Vec<u8>);

/// Upload options.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadParams {
    /// Packaging of the body (default `onnx`).
    pub format: Option<ArtifactFormat>,
    /// Expected hex sha256 of the body; a mismatch refuses the upload. The only way to give it
    /// (an `X-Content-Sha256` header is refused with 400).
    #[param(pattern = "^[0-9a-fA-F]{64}$")]
    pub sha256: Option<String>,
    /// Create the model with this version if it does not exist yet (deployers): the model
    /// exists only if the upload succeeds, so a refused upload leaves no empty model behind.
    #[serde(default)]
    pub create_model: bool,
}

/// Uploads a new version as the request body, streamed to the object store with its sha256
/// computed on the way (deployers); with `create_model=true` a model that does not exist yet is
/// created with it. The ONNX graph is read for the version's `signature`. Refused, leaving
/// nothing behind (no object, no version, no model): bodies over the size cap (413), a sha256
/// other than the one given, content that is not the declared format (422: an `onnx` body must
/// be a well-formed ONNX model; an archive is read through, every `.onnx` in it checked, and
/// refused when truncated or when it expands past the archive limits), a model no worker could
/// serve (422 naming the input or output: one that is not a tensor, such as scikit-learn's
/// ZipMap output, or of an element type KServe cannot carry), a config (`X-Model-Config` or
/// `config.pbtxt`) with values no worker can use or that contradicts the graph (422), a full
/// model, version or storage quota (409).
#[utoipa::path(post, path = "/v1/tenants/{tenant}/models/{model}/versions", operation_id = "upload_version", tag = "models",
    request_body(content = ArtifactBytes, content_type = "application/octet-stream"),
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name"),
           UploadParams,
           ("X-Model-Config" = Option<String>, Header, description = "Model configuration as a JSON object"),
           ("Idempotency-Key" = Option<String>, Header, description = "Retry-safe creation key")),
    responses(
        (status = 201, description = "The new version.", body = ModelVersion),
        (status = 409, description = "A quota is full (`quota_exceeded.versions`, `quota_exceeded.storage_bytes`).",
         body = crate::error::ErrorBody),
        (status = 413, description = "The artifact is larger than the cap.", body = crate::error::ErrorBody),
        (status = 429, description = "The tenant has `--max-concurrent-uploads` uploads in progress already (`too_many_requests`, with `Retry-After`).",
         body = crate::error::ErrorBody)))]
pub async fn handle_version_create(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model)): Path<(String, String)>,
    ApiQuery(params): ApiQuery<UploadParams>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<ModelVersion>)> {
    let mut stream = body.into_data_stream();
    let outcome = async {
        let target = app.upload_target(&caller.principal, &tenant, &model, params.create_model).await?;
        let request = upload_request(params.format, params.sha256, &headers)?;
        let uploaded = app.uploads.upload_version(&caller.actor, &target, request, &mut stream).await;
        let version = app.noting_quota(target.tenant_id(), uploaded).await?;
        Ok((StatusCode::CREATED, Json(ModelVersion::new(target.name(), version, VersionState::Uploaded))))
    }
    .await;
    if outcome.is_err() && content_length(&headers).is_none_or(|n| n <= DRAIN_LIMIT) {
        drain(&mut stream).await;
    }
    outcome
}

/// Most unread body bytes discarded before an error answer (see [`drain`]).
const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;

/// Reads and discards what is left of a refused upload, so an HTTP/1.1 client that is still
/// sending sees the error response instead of a reset connection. Bounded in bytes and time;
/// larger bodies get the answer straight away (clients sending `Expect: 100-continue` never
/// send them).
async fn drain(stream: &mut axum::body::BodyDataStream) {
    use futures::StreamExt;
    let discard = async {
        let mut left = DRAIN_LIMIT;
        while let Some(Ok(chunk)) = stream.next().await {
            left = left.saturating_sub(chunk.len() as u64);
            if left == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), discard).await;
}

/// Lists a model's versions, newest first.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/models/{model}/versions", operation_id = "list_versions", tag = "models",
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name"),
           PageParams),
    responses((status = 200, description = "A page of versions.", body = VersionPage)))]
pub async fn handle_version_list(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> Result<Json<VersionPage>> {
    let m = app.model_for(&caller.principal, &tenant, &model, Role::Viewer, "list versions").await?;
    let limit = page.limit()?;
    let before = page.cursor.as_deref().map(|c| cursor::decode_number("versions", c)).transpose()?;
    let mut conn = app.registry.conn().await?;
    let rows = conn.versions(m.tenant_id, m.id, before, limit + 1).await?;
    let states = conn.version_states(m.tenant_id, m.id).await?;
    drop(conn);
    let more = rows.len() as i64 > limit;
    let versions: Vec<_> = rows
        .into_iter()
        .take(limit as usize)
        .map(|v| {
            let state = states.get(&v.version).copied().unwrap_or(VersionState::Uploaded);
            ModelVersion::new(&m.name, v, state)
        })
        .collect();
    let next_cursor =
        if more { versions.last().map(|v| cursor::encode("versions", &v.version.to_string())) } else { None };
    Ok(Json(VersionPage { versions, next_cursor }))
}

fn parse_version(s: &str) -> Result<i64> {
    // Not a number: no such version.
    s.parse::<i64>().ok().filter(|v| *v > 0).ok_or(Error::NotFound("version"))
}

/// One version.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/models/{model}/versions/{version}", operation_id = "get_version", tag = "models",
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name"),
           ("version" = i64, Path, description = "Version number")),
    responses((status = 200, description = "The version.", body = ModelVersion)))]
pub async fn handle_version_get(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model, version)): Path<(String, String, String)>,
) -> Result<Json<ModelVersion>> {
    let m = app.model_for(&caller.principal, &tenant, &model, Role::Viewer, "read versions").await?;
    let number = parse_version(&version)?;
    let mut conn = app.registry.conn().await?;
    let row = conn.version(m.tenant_id, m.id, number).await?.ok_or(Error::NotFound("version"))?;
    let state = conn.version_states(m.tenant_id, m.id).await?.remove(&number).unwrap_or(VersionState::Uploaded);
    Ok(Json(ModelVersion::new(&m.name, row, state)))
}

/// Deletes a version and its artifact (deployers); refused while an alias points at it or a
/// deployment runs it.
#[utoipa::path(delete, path = "/v1/tenants/{tenant}/models/{model}/versions/{version}", operation_id = "delete_version", tag = "models",
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name"),
           ("version" = i64, Path, description = "Version number")),
    responses(
        (status = 204, description = "Deleted."),
        (status = 409, description = "An alias, a deployment or an ensemble version that composes it uses it (`version_in_use`).", body = crate::error::ErrorBody)))]
pub async fn handle_version_delete(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model, version)): Path<(String, String, String)>,
) -> Result<StatusCode> {
    let m = app.model_for(&caller.principal, &tenant, &model, Role::Deployer, "delete versions").await?;
    let key = app.registry.delete_version(&caller.actor, &m, parse_version(&version)?).await?;
    app.store.delete_all(&[key]).await;
    Ok(StatusCode::NO_CONTENT)
}

/// A presigned upload request.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"format": "onnx"})))]
pub struct CreateUpload {
    /// Packaging of the artifact to upload.
    pub format: ArtifactFormat,
}

crate::kinds::wire_enum! {
    /// The HTTP method a presigned URL takes.
    pub enum UploadMethod {
        /// `PUT` the whole artifact.
        Put = "PUT",
    }
}

/// Where to upload a large artifact.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PresignedUpload {
    /// Upload id, for the completion call.
    pub upload_id: Uuid,
    /// Presigned URL.
    pub url: String,
    /// HTTP method to use with the URL.
    pub method: UploadMethod,
    /// The URL stops working at.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// Largest artifact the completion call accepts.
    pub max_bytes: u64,
}

/// Opens a presigned upload (deployers), for artifacts too large to stream through the API.
/// Needs an S3-compatible object store (409 `presign_unsupported` otherwise).
#[utoipa::path(post, path = "/v1/tenants/{tenant}/models/{model}/uploads", operation_id = "create_upload", tag = "models", request_body = CreateUpload,
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Retry-safe creation key")),
    responses(
        (status = 201, description = "PUT the artifact to `url`, then complete the upload.", body = PresignedUpload),
        (status = 409, description = "The object store cannot presign URLs (`presign_unsupported`).",
         body = crate::error::ErrorBody)))]
pub async fn handle_upload_create(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model)): Path<(String, String)>,
    ApiJson(body): ApiJson<CreateUpload>,
) -> Result<(StatusCode, Json<PresignedUpload>)> {
    let m = app.model_for(&caller.principal, &tenant, &model, Role::Deployer, "upload versions").await?;
    let (upload, url) = app.uploads.presign_upload(&caller.actor, &m, body.format).await?;
    let max_bytes = app.config.max_upload_bytes;
    let out = PresignedUpload {
        upload_id: upload.id,
        url: url.to_string(),
        method: UploadMethod::Put,
        expires_at: upload.expires_at,
        max_bytes,
    };
    Ok((StatusCode::CREATED, Json(out)))
}

/// Completion of a presigned upload.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "config": {"max_batch_size": 8}})))]
pub struct CompleteUpload {
    /// Hex sha256 of what was uploaded; checked against the stored object.
    #[schema(pattern = "^[0-9a-fA-F]{64}$")]
    pub sha256: String,
    /// Model configuration as JSON.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub config: Option<serde_json::Value>,
}

/// Completes a presigned upload (deployers): reads the object back, checks size and sha256,
/// and registers it as the next version. A bad object is deleted.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/models/{model}/uploads/{upload_id}/complete", operation_id = "complete_upload", tag = "models",
    request_body = CompleteUpload,
    params(("tenant" = String, Path, description = "Tenant name"), ("model" = String, Path, description = "Model name"),
           ("upload_id" = String, Path, description = "Upload id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Retry-safe creation key")),
    responses(
        (status = 201, description = "The new version.", body = ModelVersion),
        (status = 413, description = "The artifact is larger than the cap.", body = crate::error::ErrorBody)))]
pub async fn handle_upload_complete(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, model, upload_id)): Path<(String, String, String)>,
    ApiJson(body): ApiJson<CompleteUpload>,
) -> Result<(StatusCode, Json<ModelVersion>)> {
    let m = app.model_for(&caller.principal, &tenant, &model, Role::Deployer, "upload versions").await?;
    let upload_id: Uuid = upload_id.parse().map_err(|_| Error::NotFound("upload"))?;
    let sha256 = parse_sha256("sha256", &body.sha256)?;
    let completed = app.uploads.complete_upload(&caller.actor, &m, upload_id, sha256, body.config).await;
    let version = app.noting_quota(m.tenant_id, completed).await?;
    Ok((StatusCode::CREATED, Json(ModelVersion::new(&m.name, version, VersionState::Uploaded))))
}

/// Reads an upload's query `format`/`sha256` and its `X-Model-Config` and `Content-Length`
/// headers. The sha256 has one place, the query: an `X-Content-Sha256` header (read by earlier
/// versions) is refused with 400 naming it, instead of being ignored.
fn upload_request(
    format: Option<ArtifactFormat>,
    sha256: Option<String>,
    headers: &HeaderMap,
) -> Result<UploadRequest> {
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
            Ok(v @ serde_json::Value::Object(_)) if !super::contains_nul(&v) => {
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
        declared_len: content_length(headers),
    })
}

/// The declared body length, if any.
pub fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}
