//! The gateway's KServe v2 HTTP front end through hyper. Health and server metadata are answered
//! here; the repository index from the route table; every `/v2/models/{name}[/versions/{v}]/...`
//! request is forwarded whole to a replica of that model (the path, query, headers and body as
//! the client sent them, the credential replaced by the signed identity). Most model requests
//! never reach it: [`super::h1`] serves them first and hands the connection here from the first
//! request it does not serve.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tracing::Instrument as _;

use super::Gateway;
use super::forward;
use crate::auth::forwarded;
use crate::error::{Error, ErrorKind};

type S = State<Arc<Gateway>>;

/// The HTTP front end's routes.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2", get(server_metadata))
        .route("/v2/repository/index", post(repository_index))
        .fallback(forward_or_refuse)
        .with_state(gateway)
}

async fn live(State(g): S) -> StatusCode {
    if g.is_live() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
}

async fn ready(State(g): S) -> StatusCode {
    if g.is_ready() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
}

async fn server_metadata() -> Response {
    axum::Json(json!({
        "name": "tessera-gateway",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["model_configuration", "statistics", "binary_tensor_data"],
    }))
    .into_response()
}

async fn repository_index(State(g): S, headers: HeaderMap) -> Response {
    // The index is the gateway's own table: it spends none of the tenant's limits.
    let caller = match g.authenticate(authorization(&headers)).await {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let models: Vec<_> = caller
        .model_names()
        .into_iter()
        .map(|(name, m)| {
            let ready = m.replicas.iter().any(|r| r.serving);
            json!({ "name": name, "state": if ready { "READY" } else { "UNAVAILABLE" } })
        })
        .collect();
    axum::Json(models).into_response()
}

fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

/// Where a `/v2/models/...` path points.
#[derive(Debug, PartialEq, Eq)]
pub struct ModelPath {
    /// The model name, percent-decoded.
    pub name: String,
    /// The version, when the path names one.
    pub version: Option<i64>,
}

/// Reads `/v2/models/{name}[/versions/{v}][/...]`; `Ok(None)` for other paths.
pub fn model_path(path: &str) -> Result<Option<ModelPath>, Error> {
    let Some(rest) = path.strip_prefix("/v2/models/") else { return Ok(None) };
    let mut parts = rest.split('/');
    let Some(raw) = parts.next().filter(|n| !n.is_empty()) else { return Ok(None) };
    let name = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| Error::invalid("the model name in the path is not valid UTF-8"))?
        .into_owned();
    let version = match (parts.next(), parts.next()) {
        (Some("versions"), Some(v)) => Some(v.parse::<i64>().ok().filter(|v| *v > 0).ok_or_else(|| {
            Error::invalid(format!("version '{}' in the path is not a positive integer", v.escape_default()))
        })?),
        _ => None,
    };
    Ok(Some(ModelPath { name, version }))
}

/// Headers that belong to one connection (RFC 9110, 7.6.1) or that the gateway replaces; gRPC
/// keeps `te` (see [`super::grpc`]).
pub(super) fn forwardable(name: &HeaderName) -> bool {
    !UNFORWARDED.contains(&name.as_str())
}

/// [`forwardable`] for a name as a client sent it (any case).
pub(super) fn forwardable_name(name: &[u8]) -> bool {
    !UNFORWARDED.iter().any(|u| name.eq_ignore_ascii_case(u.as_bytes()))
}

/// The headers [`forwardable`] drops.
const UNFORWARDED: [&str; 13] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "authorization",
    forwarded::HEADER,
];

/// Takes out of `headers` what is not forwarded (see [`forwardable`]), in place: a client's
/// request usually has only a few such headers, and removing them costs less than copying the
/// rest into a new map.
pub(super) fn strip_unforwardable(headers: &mut HeaderMap) {
    remove_where(headers, |name| !forwardable(name));
}

/// Removes every header whose name `doomed` picks (all its values).
fn remove_where(headers: &mut HeaderMap, doomed: impl Fn(&HeaderName) -> bool) {
    // Collected first, as the map cannot be changed while its names are walked; none found,
    // nothing is allocated.
    let names: Vec<HeaderName> = headers.keys().filter(|name| doomed(name)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

/// Why trace and log settings are refused here.
pub const SETTINGS_PER_WORKER: &str = "trace and log settings belong to each worker (a platform admin changes them \
     there); the gateway has none to read or change";

async fn forward_or_refuse(State(g): S, request: Request) -> Response {
    let path = request.uri().path();
    if path.starts_with("/v2/systemsharedmemory") || path.starts_with("/v2/cudasharedmemory") {
        return Error::new(
            ErrorKind::Unsupported,
            "shared memory needs a direct connection to a worker; through the gateway, send tensors in the request body",
        )
        .into_response();
    }
    if path.starts_with("/v2/repository/models/") {
        return Error::permission_denied("model control is managed by the control plane").into_response();
    }
    if path == "/v2/logging" || path == "/v2/trace/setting" || path.ends_with("/trace/setting") {
        return Error::new(ErrorKind::Unsupported, SETTINGS_PER_WORKER).into_response();
    }
    let target = match model_path(path) {
        Ok(Some(target)) => target,
        Ok(None) => return Error::not_found(format!("no route {} {path}", request.method())).into_response(),
        Err(e) => return e.into_response(),
    };
    let started = Instant::now();
    match forward(&g, request, &target, started).await {
        Ok(response) => response,
        Err((e, tenant)) => {
            if let Some(tenant) = tenant {
                let version = target.version.map_or_else(|| "".to_string(), |v| v.to_string());
                g.metrics.observe(&tenant, &target.name, &version, "http", e.codes().0.as_str(), started.elapsed());
            }
            e.into_response()
        }
    }
}

/// Forwards one model request; the error carries the tenant once it is known (for metrics).
async fn forward(
    g: &Gateway,
    request: Request,
    target: &ModelPath,
    started: Instant,
) -> Result<Response, (Error, Option<String>)> {
    let caller = g.authenticate(authorization(request.headers())).await.map_err(|e| (e, None))?;
    let tenant = caller.tenant.clone();
    let with_tenant = |e: Error| (e, Some(tenant.clone()));
    let model = caller.model(&target.name).map_err(with_tenant)?;
    let slot = g.admit(&caller, model, &target.name, target.version).map_err(with_tenant)?;
    let identity = g.identity_header(&caller.principal).map_err(with_tenant)?;
    let (mut parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, g.max_request_bytes).await.map_err(|e| {
        with_tenant(Error::new(
            ErrorKind::TooLarge,
            format!("request body over the gateway's limit of {} bytes or unreadable: {e}", g.max_request_bytes),
        ))
    })?;
    // Workers are sent the origin form (path and query), whatever form the client used.
    let origin = parts.uri.path_and_query().cloned().map_or_else(|| Uri::from_static("/"), Uri::from);
    let mut headers = std::mem::take(&mut parts.headers);
    strip_unforwardable(&mut headers);
    headers.insert(forwarded::HEADER, identity);
    let send = |upstream: &Arc<super::routes::Upstream>| {
        let mut upstream_request = http::Request::new(Full::new(body.clone()));
        *upstream_request.method_mut() = parts.method.clone();
        *upstream_request.uri_mut() = origin.clone();
        *upstream_request.headers_mut() = headers.clone();
        let upstream = upstream.clone();
        Ok(async move { g.upstream.send_http(&upstream, upstream_request).await })
    };
    let sequence = super::sticky::http_sequence_id(&headers, &body)
        .map(|id| super::sticky::sequence_key(&tenant, &target.name, &id));
    let not_held = |r: &http::Response<super::http_upstream::UpstreamBody>| r.status() == StatusCode::NOT_FOUND;
    let span = crate::spans::forward("http", &tenant, &target.name, target.version);
    let sending = forward::send(g, &target.name, model, target.version, sequence, send, not_held);
    let answer = sending.instrument(span).await.map_err(with_tenant)?;
    let status = answer.response.status();
    g.metrics.observe(&tenant, &target.name, &answer.version.to_string(), "http", status.as_str(), started.elapsed());
    let (mut head, incoming) = answer.response.into_parts();
    head.headers.retain_forwardable();
    // The guards live until the body is done: least-outstanding and the tenant's concurrency
    // count the whole response.
    let guards = (answer.in_flight, slot);
    let body = incoming.map_frame(move |frame| {
        let _ = &guards;
        frame
    });
    Ok(Response::from_parts(head, Body::new(body)))
}

/// Drops the connection-level headers of an upstream response.
pub(super) trait RetainForwardable {
    /// Removes the hop-by-hop headers.
    fn retain_forwardable(&mut self);
}

impl RetainForwardable for HeaderMap {
    fn retain_forwardable(&mut self) {
        const HOP_BY_HOP: [&str; 6] =
            ["connection", "keep-alive", "transfer-encoding", "upgrade", "trailer", "proxy-connection"];
        remove_where(self, |name| HOP_BY_HOP.contains(&name.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_paths_are_read() {
        let p = |path: &str| model_path(path).expect("valid");
        assert_eq!(p("/v2/models/mlp/infer"), Some(ModelPath { name: "mlp".into(), version: None }));
        assert_eq!(p("/v2/models/mlp"), Some(ModelPath { name: "mlp".into(), version: None }));
        assert_eq!(p("/v2/models/mlp/versions/3/infer"), Some(ModelPath { name: "mlp".into(), version: Some(3) }));
        assert_eq!(p("/v2/models/a%20b/ready"), Some(ModelPath { name: "a b".into(), version: None }));
        assert_eq!(p("/v2/models/"), None);
        assert_eq!(p("/v2/health/live"), None);
        for bad in ["/v2/models/m/versions/x/infer", "/v2/models/m/versions/0", "/v2/models/%ff/infer"] {
            assert_eq!(model_path(bad).expect_err(bad).kind, ErrorKind::InvalidArg, "{bad}");
        }
    }

    #[test]
    fn unforwardable_headers_are_stripped_in_place_however_many() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("host", "gw:8000"),
            ("content-type", "application/json"),
            ("authorization", "Bearer k"),
            ("inference-header-content-length", "42"),
            ("tessera-identity", "forged"),
            ("content-length", "100"),
        ] {
            headers.append(HeaderName::from_static(name), value.parse().expect("value"));
        }
        headers.append(header::CONNECTION, "keep-alive".parse().expect("value"));
        headers.append(header::CONNECTION, "upgrade".parse().expect("value"));
        strip_unforwardable(&mut headers);
        let mut left: Vec<_> = headers.keys().map(|n| n.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "inference-header-content-length"]);

        // More than one pass's worth.
        let mut many = HeaderMap::new();
        for name in UNFORWARDED.into_iter().chain(["accept"]) {
            many.insert(HeaderName::from_static(name), "x".parse().expect("value"));
        }
        strip_unforwardable(&mut many);
        assert_eq!(many.keys().map(|n| n.as_str()).collect::<Vec<_>>(), ["accept"]);
    }

    #[test]
    fn hop_by_hop_headers_of_answers_are_dropped() {
        let mut answer = HeaderMap::new();
        answer.insert(header::CONTENT_TYPE, "application/json".parse().expect("value"));
        answer.insert(header::CONNECTION, "close".parse().expect("value"));
        answer.insert(header::TRANSFER_ENCODING, "chunked".parse().expect("value"));
        answer.retain_forwardable();
        assert_eq!(answer.keys().map(|n| n.as_str()).collect::<Vec<_>>(), ["content-type"]);
    }

    #[test]
    fn connection_headers_and_credentials_are_not_forwarded() {
        for name in ["authorization", "connection", "host", "transfer-encoding", "tessera-identity"] {
            assert!(!forwardable(&HeaderName::from_static(name)), "{name}");
        }
        for name in ["content-type", "inference-header-content-length", "traceparent", "content-encoding"] {
            assert!(forwardable(&HeaderName::from_static(name)), "{name}");
        }
    }
}
