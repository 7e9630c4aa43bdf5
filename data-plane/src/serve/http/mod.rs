//! The KServe v2 HTTP/REST endpoint (axum), with Triton's routes, errors and extensions.

mod body;
mod caller;
// `pub(crate)` for `crate::fuzzing`, which hands the request decoder to the fuzz targets.
pub(crate) mod codec;
mod encoding;
mod handlers;
mod logging;
mod nonfinite;
mod raw;
mod serve;
mod shared_memory;
mod trace;
mod url_path;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use bytes::Bytes;
pub use caller::Caller;
use handlers::*;
use logging::*;
pub use serve::serve;
pub(crate) use serve::{BODY_READ_TIMEOUT, HEADER_READ_TIMEOUT, serve_connection, with_body_timeout};
use shared_memory::*;
use trace::*;
use url_path::UrlPath;

use crate::serve::server::ServerState;

type S = State<Arc<ServerState>>;
type Body = std::result::Result<Bytes, axum::extract::rejection::BytesRejection>;

/// Builds the router for the inference HTTP endpoint.
pub fn router(state: Arc<ServerState>) -> Router {
    let limit = state.max_input_size;
    Router::new()
        .route("/v2/health/live", get(handle_health_live))
        .route("/v2/health/ready", get(handle_health_ready))
        .route("/v2", get(handle_server_metadata))
        .route("/v2/models/stats", get(|State(s): S, c: Caller| async move { handle_model_stats(&s, c, None).await }))
        .route(
            "/v2/models/{model}",
            get(|State(s): S, c: Caller, UrlPath(m): UrlPath<String>| async move {
                handle_model_metadata(&s, c, (m, None)).await
            }),
        )
        .route(
            "/v2/models/{model}/versions/{version}",
            get(|State(s): S, c: Caller, UrlPath((m, v)): UrlPath<(String, String)>| async move {
                handle_model_metadata(&s, c, (m, Some(v))).await
            }),
        )
        .route(
            "/v2/models/{model}/ready",
            get(|State(s): S, c: Caller, UrlPath(m): UrlPath<String>| async move {
                handle_model_ready(&s, c, (m, None)).await
            }),
        )
        .route(
            "/v2/models/{model}/versions/{version}/ready",
            get(|State(s): S, c: Caller, UrlPath((m, v)): UrlPath<(String, String)>| async move {
                handle_model_ready(&s, c, (m, Some(v))).await
            }),
        )
        .route(
            "/v2/models/{model}/config",
            get(|State(s): S, c: Caller, UrlPath(m): UrlPath<String>| async move {
                handle_model_config(&s, c, (m, None)).await
            }),
        )
        .route(
            "/v2/models/{model}/versions/{version}/config",
            get(|State(s): S, c: Caller, UrlPath((m, v)): UrlPath<(String, String)>| async move {
                handle_model_config(&s, c, (m, Some(v))).await
            }),
        )
        .route(
            "/v2/models/{model}/stats",
            get(|State(s): S, c: Caller, UrlPath(m): UrlPath<String>| async move {
                handle_model_stats(&s, c, Some((m, None))).await
            }),
        )
        .route(
            "/v2/models/{model}/versions/{version}/stats",
            get(|State(s): S, c: Caller, UrlPath((m, v)): UrlPath<(String, String)>| async move {
                handle_model_stats(&s, c, Some((m, Some(v)))).await
            }),
        )
        .route(
            "/v2/models/{model}/infer",
            post(|State(s): S, c: Caller, UrlPath(m): UrlPath<String>, h: HeaderMap, b: Body| async move {
                handle_infer(&s, c, (m, None), &h, b).await
            }),
        )
        .route(
            "/v2/models/{model}/versions/{version}/infer",
            post(
                |State(s): S, c: Caller, UrlPath((m, v)): UrlPath<(String, String)>, h: HeaderMap, b: Body| async move {
                    handle_infer(&s, c, (m, Some(v)), &h, b).await
                },
            ),
        )
        .route(
            "/v2/systemsharedmemory/status",
            get(|State(s): S, c: Caller| async move { handle_system_shm_status(&s, c, None).await }),
        )
        .route(
            "/v2/systemsharedmemory/region/{region}/status",
            get(|State(s): S, c: Caller, UrlPath(r): UrlPath<String>| async move {
                handle_system_shm_status(&s, c, Some(r)).await
            }),
        )
        .route(
            "/v2/systemsharedmemory/region/{region}/register",
            post(|State(s): S, c: Caller, UrlPath(r): UrlPath<String>, b: Body| async move {
                handle_system_shm_register(&s, c, r, b).await
            }),
        )
        .route(
            "/v2/systemsharedmemory/unregister",
            post(|State(s): S, c: Caller| async move { handle_system_shm_unregister(&s, c, None).await }),
        )
        .route(
            "/v2/systemsharedmemory/region/{region}/unregister",
            post(|State(s): S, c: Caller, UrlPath(r): UrlPath<String>| async move {
                handle_system_shm_unregister(&s, c, Some(r)).await
            }),
        )
        .route(
            "/v2/cudasharedmemory/status",
            get(|State(s): S, c: Caller| async move { handle_cuda_shm_status(&s, c, None).await }),
        )
        .route(
            "/v2/cudasharedmemory/region/{region}/status",
            get(|State(s): S, c: Caller, UrlPath(r): UrlPath<String>| async move {
                handle_cuda_shm_status(&s, c, Some(r)).await
            }),
        )
        .route(
            "/v2/cudasharedmemory/region/{region}/register",
            post(|State(s): S, c: Caller, UrlPath(r): UrlPath<String>, b: Body| async move {
                handle_cuda_shm_register(&s, c, r, b).await
            }),
        )
        .route(
            "/v2/cudasharedmemory/unregister",
            post(|State(s): S, c: Caller| async move { handle_cuda_shm_unregister(&s, c, None).await }),
        )
        .route(
            "/v2/cudasharedmemory/region/{region}/unregister",
            post(|State(s): S, c: Caller, UrlPath(r): UrlPath<String>| async move {
                handle_cuda_shm_unregister(&s, c, Some(r)).await
            }),
        )
        .route(
            "/v2/logging",
            get(handle_log_settings)
                .post(|State(s): S, c: Caller, b: Body| async move { handle_update_log_settings(&s, c, b).await }),
        )
        .route(
            "/v2/trace/setting",
            get(|State(s): S, c: Caller| async move { handle_trace_settings(&s, c, None).await }).post(
                |State(s): S, c: Caller, b: Body| async move { handle_update_trace_settings(&s, c, None, b).await },
            ),
        )
        .route(
            "/v2/models/{model}/trace/setting",
            get(|State(s): S, c: Caller, UrlPath(m): UrlPath<String>| async move {
                handle_trace_settings(&s, c, Some(m)).await
            })
            .post(|State(s): S, c: Caller, UrlPath(m): UrlPath<String>, b: Body| async move {
                handle_update_trace_settings(&s, c, Some(m), b).await
            }),
        )
        // A worker's key for a tenant's model, `<tenant id>/<model>`, as `tritonclient` puts it
        // in the path (it leaves the '/' unescaped).
        .route(
            "/v2/models/{tenant}/{model}/trace/setting",
            get(|State(s): S, c: Caller, UrlPath((t, m)): UrlPath<(String, String)>| async move {
                handle_trace_settings(&s, c, Some(format!("{t}/{m}"))).await
            })
            .post(
                |State(s): S, c: Caller, UrlPath((t, m)): UrlPath<(String, String)>, b: Body| async move {
                    handle_update_trace_settings(&s, c, Some(format!("{t}/{m}")), b).await
                },
            ),
        )
        .route("/v2/repository/index", post(handle_repository_index))
        .route("/v2/repository/models/{model}/load", post(handle_repository_load))
        .route("/v2/repository/models/{model}/unload", post(handle_repository_unload))
        .fallback(handle_not_found)
        .method_not_allowed_fallback(handle_method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(tower_http::decompression::RequestDecompressionLayer::new())
        // Outside decompression, so it sees the coding first.
        .layer(axum::middleware::map_request(encoding::check_content_encoding))
        .with_state(state)
}

#[cfg(test)]
mod tests;
