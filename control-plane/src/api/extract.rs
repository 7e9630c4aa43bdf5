//! Extractors that turn a request into validated input, failing in the `/v1` error format.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use crate::auth::Principal;
use crate::error::Error;
use crate::registry::Actor;

/// The request's id, set by the request-context middleware.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// The authenticated caller and what the audit trail records about the request.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Who.
    pub principal: Principal,
    /// Key, request id and client address for audit events.
    pub actor: Actor,
}

/// Why the request's console session is no longer open, when its cookie named one that ended.
#[derive(Debug, Clone, Copy)]
pub struct EndedSession(pub &'static str);

/// Set by the authentication middleware when the request's access token was revoked, so that
/// the 401 says so instead of the usual vague refusal.
#[derive(Debug, Clone, Copy)]
pub struct TokenRevoked;

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Error> {
        let Some(principal) = parts.extensions.get::<Principal>().cloned() else {
            return Err(match (parts.extensions.get::<EndedSession>(), parts.extensions.get::<TokenRevoked>()) {
                (Some(ended), _) => Error::SessionEnded(ended.0),
                (None, Some(_)) => Error::Revoked,
                (None, None) => Error::Unauthenticated,
            });
        };
        let request_id = parts.extensions.get::<RequestId>().map(|r| r.0.clone()).unwrap_or_default();
        let client_addr = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.to_string());
        let actor = Actor { key_id: principal.key_id, user_id: principal.user_id, request_id, client_addr };
        Ok(Caller { principal, actor })
    }
}

/// A JSON body; a body that does not fit its type is a 422 naming the field.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let is_json =
            req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
                v.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
            });
        if !is_json {
            return Err(Error::BadRequest("expected a JSON body (Content-Type: application/json)".into()));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| match e.status() {
            StatusCode::PAYLOAD_TOO_LARGE => Error::BadRequest("request body too large".into()),
            _ => Error::BadRequest(e.body_text()),
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Whether any string (or key) in `v` holds a NUL character, which Postgres text cannot store.
pub fn contains_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(contains_nul),
        serde_json::Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

/// Deserialises JSON, naming the field at fault.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| Error::BadRequest(format!("malformed JSON: {e}")))?;
    if contains_nul(&value) {
        return Err(Error::InvalidInput { field: None, message: "text must not contain NUL characters".into() });
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return Error::BadRequest(format!("malformed JSON: {inner}"));
        }
        let message = inner.to_string();
        let field = if path != "." {
            Some(path)
        } else {
            // "missing field `name`" carries the field in the message only.
            message.split('`').nth(1).map(str::to_string)
        };
        let message = match &field {
            Some(f) => format!("{f}: {message}"),
            None => message,
        };
        Error::InvalidInput { field, message }
    })
}

/// Query parameters; ones that do not fit their type are a 422.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        if parts.uri.query().is_some_and(|q| q.to_ascii_lowercase().contains("%00")) {
            return Err(Error::InvalidInput { field: None, message: "text must not contain NUL characters".into() });
        }
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(ApiQuery(v)),
            Err(QueryRejection::FailedToDeserializeQueryString(e)) => {
                Err(Error::InvalidInput { field: None, message: e.body_text() })
            }
            Err(e) => Err(Error::BadRequest(e.body_text())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Body {
        name: crate::types::Name,
        count: u32,
    }

    fn field_of(text: &str) -> Option<String> {
        match parse_json::<Body>(text.as_bytes()) {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn json_errors_name_the_field() {
        assert_eq!(field_of(r#"{"name": "Bad Name", "count": 1}"#).as_deref(), Some("name"));
        assert_eq!(field_of(r#"{"name": "ok", "count": -1}"#).as_deref(), Some("count"));
        assert_eq!(field_of(r#"{"count": 1}"#).as_deref(), Some("name"));
        assert!(matches!(parse_json::<Body>(b"{"), Err(Error::BadRequest(_))));
    }
}
