//! `Idempotency-Key` on POST: a pipeline that retries gets the first result, not a duplicate.
//!
//! The key is scoped to the caller: its tenant, its credential and its role, so a replay only
//! ever returns what that same caller was answered before. The request is fingerprinted (method, path,
//! query and a digest of the JSON body; for streamed uploads the declared length and sha256
//! instead of the body, which is never buffered). The first response below 500 is stored and
//! replayed with `Idempotent-Replayed: true`. Answers from before the request ran (401, 403,
//! 429) and 5xx release the key so a retry runs again, as Stripe does.
//! The same key with a different request is a 422; while the first one runs, a 409.

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::AppState;
use crate::auth::Principal;
use crate::error::Error;
use crate::registry::{IdempotencyClaim, now};

/// The header.
pub const HEADER: &str = "idempotency-key";
/// Largest JSON body fingerprinted (and so accepted) with a key; matches axum's body limit.
const MAX_JSON_BODY: usize = 2 * 1024 * 1024;
/// Largest response stored for replay.
const MAX_STORED_RESPONSE: usize = 1024 * 1024;

/// The middleware.
pub async fn idempotency(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() != http::Method::POST {
        return next.run(req).await;
    }
    let Some(key) = req.headers().get(HEADER).cloned() else {
        return next.run(req).await;
    };
    let Some(principal) = req.extensions().get::<Principal>().cloned() else {
        return next.run(req).await;
    };
    match run(&app, &principal, &key, req, next).await {
        Ok(response) | Err(response) => response,
    }
}

async fn run(
    app: &AppState,
    principal: &Principal,
    key: &HeaderValue,
    req: Request,
    next: Next,
) -> Result<Response, Response> {
    let key = key
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| Error::BadRequest("Idempotency-Key must be 1 to 255 visible ASCII characters".into()))
        .map_err(IntoResponse::into_response)?
        .to_string();
    let (req, fingerprint) = fingerprint(req).await.map_err(IntoResponse::into_response)?;
    let scope = principal.idempotency_scope();
    let claim = app.registry.claim_idempotent(&scope, &key, &fingerprint, now()).await;
    match claim.map_err(IntoResponse::into_response)? {
        IdempotencyClaim::New => {}
        IdempotencyClaim::Replay { status, body } => return Ok(replay(status, body)),
        IdempotencyClaim::InProgress => {
            let e = Error::conflict(
                crate::error::ErrorCode::IdempotencyInProgress,
                "a request with this Idempotency-Key is still running",
            );
            return Err(e.into_response());
        }
        IdempotencyClaim::Mismatch => {
            let e = Error::invalid("Idempotency-Key", "this Idempotency-Key was used for a different request");
            return Err(e.into_response());
        }
    }
    let response = next.run(req).await;
    let status = response.status();
    if !is_stored(status) {
        if let Err(e) = app.registry.release_idempotent(&scope, &key).await {
            tracing::warn!(error = %e, "could not release an idempotency key");
        }
        return Ok(response);
    }
    let (parts, body) = response.into_parts();
    let bytes = to_bytes(body, MAX_STORED_RESPONSE)
        .await
        .map_err(|_| Error::Internal("response too large".into()))
        .map_err(IntoResponse::into_response)?;
    if let Err(e) = app.registry.finish_idempotent(&scope, &key, status.as_u16(), &bytes).await {
        tracing::warn!(error = %e, "could not store an idempotent response");
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}

/// Whether an answer is kept for replay: not when the request never ran (refused credentials,
/// role or rate) nor when a retry may succeed (5xx).
fn is_stored(status: StatusCode) -> bool {
    !(status.is_server_error()
        || matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS))
}

fn replay(status: u16, body: Vec<u8>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}

/// Fingerprints the request, buffering a JSON body (small) but never an upload stream.
async fn fingerprint(req: Request) -> Result<(Request, String), Error> {
    let (parts, body) = req.into_parts();
    let mut sha = Sha256::new();
    sha.update(parts.method.as_str());
    sha.update(b"\n");
    sha.update(parts.uri.path_and_query().map_or("", |p| p.as_str()));
    sha.update(b"\n");
    let body = if is_stream(&parts.headers) {
        for name in [header::CONTENT_LENGTH.as_str(), "x-model-config"] {
            sha.update(parts.headers.get(name).map_or(&b""[..], |v| v.as_bytes()));
            sha.update(b"\n");
        }
        body
    } else {
        let bytes =
            to_bytes(body, MAX_JSON_BODY).await.map_err(|_| Error::BadRequest("request body too large".into()))?;
        sha.update(&bytes);
        Body::from(bytes)
    };
    Ok((Request::from_parts(parts, body), hex::encode(sha.finalize())))
}

fn is_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/octet-stream"))
}
