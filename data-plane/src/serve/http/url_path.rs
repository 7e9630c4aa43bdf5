//! The `UrlPath` extractor: axum's `Path`, with its rejections (a segment that percent-decodes
//! to invalid UTF-8) as KServe JSON errors instead of axum's plain-text ones.

use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::Error;

/// Path segments of the matched route, deserialized into `T`.
pub struct UrlPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for UrlPath<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        Path::<T>::from_request_parts(parts, state).await.map(|Path(value)| UrlPath(value)).map_err(path_error)
    }
}

/// A client's bad path is 400 with what was wrong; anything else is the route's own mistake.
fn path_error(rejection: PathRejection) -> Error {
    match rejection {
        PathRejection::FailedToDeserializePathParams(e) if e.status().is_client_error() => {
            Error::invalid(format!("invalid URL path: {}", e.kind()))
        }
        other => {
            tracing::error!(error = %other, "route path parameters do not match their extractor");
            Error::internal("internal error")
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::get;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn invalid_utf8_in_a_segment_is_a_json_400_naming_it() {
        let router = Router::new().route("/m/{model}", get(|UrlPath(m): UrlPath<String>| async move { m }));
        let ok = router.clone().oneshot(Request::get("/m/a%20b").body(Body::empty()).expect("request")).await;
        assert_eq!(ok.expect("infallible").status(), StatusCode::OK);
        let response = router.oneshot(Request::get("/m/%ff").body(Body::empty()).expect("request")).await;
        let response = response.expect("infallible");
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(response.headers()["content-type"], "application/json");
        let body = response.into_body().collect().await.expect("body").to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
        assert_eq!(json["error"], "invalid URL path: Invalid UTF-8 in `model`");
    }
}
