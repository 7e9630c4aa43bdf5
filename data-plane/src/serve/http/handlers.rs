//! KServe v2 REST handlers: thin wrappers that parse, call the model manager, and encode.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{Caller, UrlPath, codec, raw};
use crate::auth::Principal;
use crate::engine::manager::parse_version;
use crate::engine::model::LoadedModel;
use crate::error::{Error, ErrorKind, Result};
use crate::serve::capture::Tap;
use crate::serve::facade::{Answered, batch_rows};
use crate::serve::server::ServerState;
use crate::serve::shared_memory::tensors;
use crate::spans::Origin;
use crate::trace::{Event, Trace};

type AppState = State<Arc<ServerState>>;

/// `GET /v2/health/live`.
pub async fn handle_health_live(State(s): AppState) -> StatusCode {
    if s.is_live() { StatusCode::OK } else { StatusCode::BAD_REQUEST }
}

/// `GET /v2/health/ready`.
pub async fn handle_health_ready(State(s): AppState) -> StatusCode {
    if s.is_ready() { StatusCode::OK } else { StatusCode::BAD_REQUEST }
}

/// `GET /v2`.
pub async fn handle_server_metadata(State(s): AppState, _caller: Caller) -> Json<Value> {
    Json(json!({ "name": s.name, "version": s.version, "extensions": s.extensions() }))
}

/// Model path segments: name and optional version.
pub type ModelPath = (String, Option<String>);

/// `GET /v2/models/{m}[/versions/{v}]`.
pub async fn handle_model_metadata(s: &ServerState, c: Caller, (model, version): ModelPath) -> Result<Json<Value>> {
    let v = parse_version(&model, version.as_deref())?;
    Ok(Json(s.model_metadata(c.principal(), &model, v)?))
}

/// `GET /v2/models/{m}[/versions/{v}]/ready`.
pub async fn handle_model_ready(s: &ServerState, c: Caller, (model, version): ModelPath) -> Response {
    let ready = parse_version(&model, version.as_deref()).and_then(|v| s.model(c.principal(), &model, v));
    match ready {
        Ok(_) => StatusCode::OK.into_response(),
        Err(e) if e.kind == ErrorKind::NotFound => e.into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, Json(json!({ "error": e.message }))).into_response(),
    }
}

/// `GET /v2/models/{m}[/versions/{v}]/config`.
pub async fn handle_model_config(s: &ServerState, c: Caller, (model, version): ModelPath) -> Result<Json<Value>> {
    let v = parse_version(&model, version.as_deref())?;
    let loaded = s.model(c.principal(), &model, v)?;
    Ok(Json(tessera_protocol::model_config::to_json_value(&loaded.spec.config)))
}

/// `GET /v2/models[/{m}[/versions/{v}]]/stats`.
pub async fn handle_model_stats(s: &ServerState, c: Caller, path: Option<ModelPath>) -> Result<Json<Value>> {
    let stats = match path {
        None => s.statistics(c.principal(), None, None)?,
        Some((model, version)) => {
            let v = parse_version(&model, version.as_deref())?;
            s.statistics(c.principal(), Some(&model), v)?
        }
    };
    Ok(Json(crate::engine::stats::to_json(&stats)))
}

/// `POST /v2/models/{m}[/versions/{v}]/infer`, through the request facade (which meters it on
/// workers once the model resolved in the caller's tenant).
pub async fn handle_infer(
    s: &ServerState,
    c: Caller,
    (model, version): ModelPath,
    headers: &HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let body = body.map_err(|e| body_error(e, s.max_input_size))?;
    let v = parse_version(&model, version.as_deref())?;
    let caller = c.principal();
    let traceparent = || headers.get("traceparent").and_then(|v| v.to_str().ok());
    let origin = Origin { protocol: "http", traceparent: &traceparent };
    s.infer(
        origin,
        caller,
        &model,
        v,
        || body.len() as u64,
        async |loaded, tap| {
            let trace = s.start_trace(caller, &model, loaded, traceparent);
            run_infer(s, caller, loaded, (headers, &body), tap, trace).await
        },
    )
    .await
}

/// Decodes the body (reading the inputs that are in shared memory), runs it on `loaded` and
/// encodes the answer (writing the outputs that go to shared memory). A traced request's
/// receive steps are its decode (axum has read the body by then), its send steps the encode.
async fn run_infer(
    s: &ServerState,
    caller: Option<&Principal>,
    loaded: &LoadedModel,
    (headers, body): (&HeaderMap, &Bytes),
    tap: &mut Tap,
    trace: Trace,
) -> Result<Answered<Response>> {
    trace.stamp(Event::HttpRecvStart);
    let header_length = headers.get(codec::HEADER_LENGTH).map(|h| h.to_str().unwrap_or("invalid"));
    let (mut request, shm_inputs, choice) = if raw::is_raw(header_length) {
        (raw::decode(body, &loaded.spec)?, Default::default(), codec::BinaryChoice::all_binary())
    } else {
        let (request, shm_inputs) = codec::decode_body(body, header_length)?;
        let choice = codec::BinaryChoice::of(&request)?;
        (request, shm_inputs, choice)
    };
    let shm = tensors::resolve(s.shared_memory(), caller, &mut request, shm_inputs).await?;
    choice.check_json_outputs(&loaded.spec, &request, shm.as_ref())?;
    let rows = batch_rows(&loaded.spec, &request);
    crate::spans::name_request(&request.id);
    trace.stamp(Event::HttpRecvEnd);
    tap.request(&request);
    let mut response = loaded.infer_traced(request, trace.clone()).await?;
    tap.response(&response);
    if let Some(shm) = &shm {
        shm.write(&mut response).await?;
    }
    trace.stamp(Event::HttpSendStart);
    let places = choice.places(&response, shm.as_ref());
    let encoded = codec::encode_response(&response, &places)?;
    let bytes_out = encoded.body.iter().map(|b| b.len() as u64).sum();
    let mut resp = Response::new(Body::new(super::body::ChunkedBytes::new(encoded.body)));
    let headers = resp.headers_mut();
    match encoded.header_length {
        Some(len) => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            headers.insert(codec::HEADER_LENGTH, HeaderValue::from(len));
        }
        None => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
    }
    trace.stamp(Event::HttpSendEnd);
    Ok(Answered { answer: resp, rows, bytes_out })
}

/// Maps a body-reading failure: over the limit is 413, anything else 400.
pub fn body_error(rejection: BytesRejection, limit: usize) -> Error {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        Error::new(
            ErrorKind::TooLarge,
            format!("request body exceeds the limit of {limit} bytes (--http-max-input-size)"),
        )
    } else {
        Error::invalid(format!("failed to read the request body: {rejection}"))
    }
}

/// Parses an optional JSON object body (empty means `{}`, as Triton reads it).
pub(super) fn optional_object(body: &[u8]) -> Result<Map<String, Value>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Error::invalid("the request body must be a JSON object")),
        Err(e) => Err(Error::invalid(format!("failed to parse the request JSON buffer: {e}"))),
    }
}

/// `POST /v2/repository/index`.
pub async fn handle_repository_index(
    State(s): AppState,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<Value>> {
    s.check_model_control()?;
    let body = body.map_err(|e| body_error(e, s.max_input_size))?;
    let ready_only = match optional_object(&body)?.get("ready") {
        None => false,
        Some(Value::Bool(ready)) => *ready,
        Some(_) => return Err(Error::invalid("invalid value for 'ready': expected a boolean")),
    };
    let rows: Vec<Value> = s
        .manager
        .index(ready_only)
        .into_iter()
        .map(|r| {
            let mut row = json!({ "name": r.name });
            if let Some(v) = r.version {
                row["version"] = json!(v.to_string());
            }
            if let Some(state) = r.state {
                row["state"] = json!(state.as_str());
                row["reason"] = json!(r.reason);
            }
            row
        })
        .collect();
    Ok(Json(Value::Array(rows)))
}

/// `POST /v2/repository/models/{m}/load`.
pub async fn handle_repository_load(
    State(s): AppState,
    UrlPath(model): UrlPath<String>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<StatusCode> {
    s.check_model_control()?;
    let body = body.map_err(|e| body_error(e, s.max_input_size))?;
    let params = match optional_object(&body)?.remove("parameters") {
        None => Map::new(),
        Some(Value::Object(params)) => params,
        Some(_) => return Err(Error::invalid("load request 'parameters' must be a JSON object")),
    };
    let pairs = params.iter().map(|(k, v)| (k.as_str(), v.as_str().map(str::to_string)));
    let config = crate::serve::server::load_config_override(pairs)?;
    s.manager.load(&model, config).await?;
    Ok(StatusCode::OK)
}

/// `POST /v2/repository/models/{m}/unload`.
pub async fn handle_repository_unload(
    State(s): AppState,
    UrlPath(model): UrlPath<String>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<StatusCode> {
    s.check_model_control()?;
    let body = body.map_err(|e| body_error(e, s.max_input_size))?;
    optional_object(&body)?;
    s.manager.unload(&model).await?;
    Ok(StatusCode::OK)
}

/// Unknown routes.
pub async fn handle_not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({ "error": "Not Found" }))).into_response()
}

/// Known routes with the wrong method.
pub async fn handle_method_not_allowed() -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, Json(json!({ "error": "Method Not Allowed" }))).into_response()
}
