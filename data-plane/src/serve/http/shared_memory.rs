//! `/v2/systemsharedmemory` and `/v2/cudasharedmemory`: status, register and unregister of
//! system and CUDA shared memory regions, in the caller's name space (see
//! [`crate::serve::shared_memory`]).

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::Caller;
use super::handlers::body_error;
use crate::engine::cuda_ipc::IpcHandle;
use crate::error::{Error, Result};
use crate::serve::server::ServerState;
use crate::serve::shared_memory::Kind;

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
    s.shared_memory().unregister(c.principal(), Kind::System, region.as_deref())?;
    Ok(StatusCode::OK)
}

/// `GET /v2/cudasharedmemory[/region/{r}]/status`.
pub async fn handle_cuda_shm_status(s: &ServerState, c: Caller, region: Option<String>) -> Result<Json<Value>> {
    let regions = s.shared_memory().cuda_status(c.principal(), region.as_deref())?;
    let rows = regions
        .into_iter()
        .map(|r| json!({ "name": r.name, "device_id": r.device_id, "byte_size": r.byte_size }))
        .collect();
    Ok(Json(Value::Array(rows)))
}

/// `POST /v2/cudasharedmemory/region/{r}/register` with `{raw_handle: {b64}, device_id, byte_size}`.
pub async fn handle_cuda_shm_register(
    s: &ServerState,
    c: Caller,
    region: String,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<StatusCode> {
    let body = body.map_err(|e| body_error(e, s.max_input_size))?;
    // Triton refuses a server without shared memory before it reads the body.
    s.shared_memory().check_allowed()?;
    let r = CudaRegisterRequest::parse(&body)?;
    s.shared_memory().register_cuda(c.principal(), &region, r.handle, r.device_id, r.byte_size).await?;
    Ok(StatusCode::OK)
}

/// `POST /v2/cudasharedmemory[/region/{r}]/unregister` (no region: all of the caller's).
pub async fn handle_cuda_shm_unregister(s: &ServerState, c: Caller, region: Option<String>) -> Result<StatusCode> {
    s.shared_memory().unregister(c.principal(), Kind::Cuda, region.as_deref())?;
    Ok(StatusCode::OK)
}

/// The non-negative integer `field` of a register request, when present.
fn number(map: &Map<String, Value>, field: &str) -> Result<Option<u64>> {
    map.get(field)
        .map(|v| {
            v.as_u64().ok_or_else(|| {
                Error::invalid(format!("Shared memory register request: '{field}' must be a non-negative integer"))
            })
        })
        .transpose()
}

/// The required non-negative integer `field` of a register request.
fn required(map: &Map<String, Value>, field: &str) -> Result<u64> {
    number(map, field)?.ok_or_else(|| Error::invalid(format!("Shared memory register request has no '{field}' field")))
}

/// A CUDA register request's body.
#[derive(Debug, PartialEq, Eq)]
struct CudaRegisterRequest {
    handle: IpcHandle,
    device_id: i64,
    byte_size: u64,
}

impl CudaRegisterRequest {
    /// Reads `{raw_handle: {b64}, device_id, byte_size}`; the handle must decode to the 64
    /// bytes of a `cudaIpcMemHandle_t` (Triton's message otherwise).
    fn parse(body: &[u8]) -> Result<Self> {
        let map = super::handlers::optional_object(body)?;
        let b64 = match map.get("raw_handle") {
            None => return Err(Error::invalid("Shared memory register request has no 'raw_handle' field")),
            Some(raw) => raw.get("b64").and_then(Value::as_str).ok_or_else(|| {
                Error::invalid("Shared memory register request: 'raw_handle' must be an object with a string 'b64'")
            })?,
        };
        let handle = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .and_then(|bytes| IpcHandle::from_slice(&bytes))
            .ok_or_else(|| Error::invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"))?;
        let byte_size = required(&map, "byte_size")?;
        let device_id = i64::try_from(required(&map, "device_id")?)
            .map_err(|_| Error::invalid("Shared memory register request: 'device_id' is out of range"))?;
        Ok(Self { handle, device_id, byte_size })
    }
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
        let map = super::handlers::optional_object(body)?;
        let key = match map.get("key") {
            None => return Err(Error::invalid("Shared memory register request has no 'key' field")),
            Some(Value::String(key)) => key.clone(),
            Some(_) => return Err(Error::invalid("Shared memory register request: 'key' must be a string")),
        };
        let offset = number(&map, "offset")?.unwrap_or(0);
        let byte_size = required(&map, "byte_size")?;
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

    #[test]
    fn cuda_register_bodies_need_a_64_byte_handle() {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let body = |raw: &str, rest: &str| format!(r#"{{"raw_handle":{{"b64":"{raw}"}}{rest}}}"#);
        let handle = b64(&[9; 64]);
        let ok =
            CudaRegisterRequest::parse(body(&handle, r#","device_id":1,"byte_size":256"#).as_bytes()).expect("valid");
        assert_eq!(ok, CudaRegisterRequest { handle: IpcHandle([9; 64]), device_id: 1, byte_size: 256 });
        let short = b64(&[9; 63]);
        let cases = [
            (String::new(), "has no 'raw_handle' field"),
            (r#"{"raw_handle":"abc","device_id":0,"byte_size":1}"#.to_string(), "a string 'b64'"),
            (body(&short, r#","device_id":0,"byte_size":1"#), "valid base64 encoded cudaIpcMemHandle_t"),
            (body("not base64!", r#","device_id":0,"byte_size":1"#), "valid base64 encoded cudaIpcMemHandle_t"),
            (body(&handle, r#","device_id":0"#), "has no 'byte_size' field"),
            (body(&handle, r#","byte_size":8"#), "has no 'device_id' field"),
            (body(&handle, r#","device_id":-1,"byte_size":8"#), "'device_id' must be a non-negative integer"),
            (body(&handle, r#","device_id":18446744073709551615,"byte_size":8"#), "'device_id' is out of range"),
        ];
        for (body, words) in cases {
            let e = CudaRegisterRequest::parse(body.as_bytes()).expect_err(words);
            assert_eq!(e.kind, crate::error::ErrorKind::InvalidArg);
            assert!(e.message.contains(words), "{body}: {}", e.message);
        }
    }
}
