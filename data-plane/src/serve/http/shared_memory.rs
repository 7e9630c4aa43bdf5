//! `/v2/systemsharedmemory`: status, register and unregister of system shared memory regions,
//! in the caller's name space (see [`crate::serve::shared_memory`]).

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::Caller;
use super::handlers::body_error;
use crate::error::{Error, Result};
use crate::serve::server::ServerState;

/// `GET /v2/systemsharedmemory[/region/{r}]/status`.
pub async fn handle_system_shm_status(s: &ServerState, c: Caller, region: Option<String>) -> Result<Json<Value>> {
    let regions = s.shared_memory().status(c.principal(), region.as_deref())?;
    let rows = regions
        .into_iter()
        .map(|r| json!({ "name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size }))
        .collect();
    Ok(Json(Value::Array(rows)))
}

/// `POST /v2/systemsharedmemory/region/{r}/register` with `{key, offset, byte_size}`.
pub async fn handle_system_shm_register(
    s: &ServerState,
    c: Caller,
    region: String,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<StatusCode> {
    let body = body.map_err(|e| body_error(e, s.max_input_size))?;
    let request = RegisterRequest::parse(&body)?;
    s.shared_memory().register(c.principal(), &region, &request.key, request.offset, request.byte_size)?;
    Ok(StatusCode::OK)
}

/// `POST /v2/systemsharedmemory[/region/{r}]/unregister` (no region: all of the caller's).
pub async fn handle_system_shm_unregister(s: &ServerState, c: Caller, region: Option<String>) -> Result<StatusCode> {
    s.shared_memory().unregister(c.principal(), region.as_deref())?;
    Ok(StatusCode::OK)
}

/// A register request's body.
#[derive(Debug, PartialEq, Eq)]
struct RegisterRequest {
    key: String,
    offset: u64,
    byte_size: u64,
}

impl RegisterRequest {
    /// Reads the body as Triton does: an object with `key`, `byte_size` and an optional
    /// `offset` (an empty body is an empty object, and so lacks `key`).
    fn parse(body: &[u8]) -> Result<Self> {
        let map: Map<String, Value> = if body.iter().all(u8::is_ascii_whitespace) {
            Map::new()
        } else {
            match serde_json::from_slice(body) {
                Ok(Value::Object(map)) => map,
                Ok(_) => return Err(Error::invalid("the request body must be a JSON object")),
                Err(e) => return Err(Error::invalid(format!("failed to parse the request JSON buffer: {e}"))),
            }
        };
        let key = match map.get("key") {
            None => return Err(Error::invalid("Shared memory register request has no 'key' field")),
            Some(Value::String(key)) => key.clone(),
            Some(_) => return Err(Error::invalid("Shared memory register request: 'key' must be a string")),
        };
        let number = |field: &str| {
            map.get(field)
                .map(|v| {
                    v.as_u64().ok_or_else(|| {
                        Error::invalid(format!(
                            "Shared memory register request: '{field}' must be a non-negative integer"
                        ))
                    })
                })
                .transpose()
        };
        let offset = number("offset")?.unwrap_or(0);
        let byte_size = number("byte_size")?
            .ok_or_else(|| Error::invalid("Shared memory register request has no 'byte_size' field"))?;
        Ok(Self { key, offset, byte_size })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_bodies_are_read_as_triton_reads_them() {
        let ok = RegisterRequest::parse(br#"{"key":"/k","offset":8,"byte_size":64}"#).expect("valid");
        assert_eq!(ok, RegisterRequest { key: "/k".into(), offset: 8, byte_size: 64 });
        let no_offset = RegisterRequest::parse(br#"{"key":"/k","byte_size":64}"#).expect("offset is optional");
        assert_eq!(no_offset.offset, 0);
        let cases: [(&[u8], &str); 6] = [
            (b"", "has no 'key' field"),
            (br#"{"byte_size":1}"#, "has no 'key' field"),
            (br#"{"key":"/k"}"#, "has no 'byte_size' field"),
            (br#"{"key":3,"byte_size":1}"#, "'key' must be a string"),
            (br#"{"key":"/k","byte_size":-1}"#, "'byte_size' must be a non-negative integer"),
            (br#"{"key":"/k","offset":"1","byte_size":1}"#, "'offset' must be a non-negative integer"),
        ];
        for (body, words) in cases {
            let e = RegisterRequest::parse(body).expect_err(words);
            assert!(e.message.contains(words), "{}: {}", String::from_utf8_lossy(body), e.message);
        }
        assert!(RegisterRequest::parse(b"[1]").expect_err("not an object").message.contains("JSON object"));
    }
}
