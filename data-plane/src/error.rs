//! The data plane's one error type and its single mapping to HTTP status and gRPC code.

use axum::http::{HeaderValue, StatusCode, header};

/// What kind of failure an [`Error`] is; decides the HTTP status and gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or does not match the model (400 / INVALID_ARGUMENT).
    InvalidArg,
    /// The model, version or route does not exist (404 / NOT_FOUND).
    NotFound,
    /// The model is not ready, the queue is full or the server is shutting down (503 / UNAVAILABLE).
    Unavailable,
    /// The request asks for something this server does not do (501 / UNIMPLEMENTED).
    Unsupported,
    /// The request body exceeds the configured limit (413 / RESOURCE_EXHAUSTED).
    TooLarge,
    /// The client went away before the request ran (400 / CANCELLED).
    Cancelled,
    /// Something failed inside the server; the message stays vague (500 / INTERNAL).
    Internal,
    /// No credential, or one that does not check out (401 / UNAUTHENTICATED).
    Unauthenticated,
    /// The caller is known but its role does not allow this (403 / PERMISSION_DENIED).
    PermissionDenied,
    /// The caller's tenant has as many requests in flight as it may (429 / RESOURCE_EXHAUSTED).
    TooManyRequests,
    /// The thing to create exists already, e.g. a shared memory region's name (400 /
    /// ALREADY_EXISTS, Triton's mapping: HTTP has no closer status it uses).
    AlreadyExists,
    /// A gateway's worker did not begin its answer in time, or stopped sending it (504 /
    /// DEADLINE_EXCEEDED).
    UpstreamTimeout,
}

/// A data-plane error: a kind plus a message meant for the client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    /// Decides the status code.
    pub kind: ErrorKind,
    /// Human-readable message returned to the client.
    pub message: String,
    /// Seconds after which a retry may succeed (HTTP `Retry-After`), for a passing unavailability.
    pub retry_after_s: Option<u32>,
}

/// Result alias for the data plane.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Creates an error of the given kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), retry_after_s: None }
    }

    /// Adds a `Retry-After` hint (seconds).
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    /// A 400 / INVALID_ARGUMENT error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArg, message)
    }

    /// A 404 / NOT_FOUND error.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// A 503 / UNAVAILABLE error.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// A 501 / UNIMPLEMENTED error.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }

    /// A 500 / INTERNAL error.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// A 401 / UNAUTHENTICATED error.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthenticated, message)
    }

    /// A 403 / PERMISSION_DENIED error.
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }

    /// The HTTP status and gRPC code for this error, decided in one place.
    pub fn codes(&self) -> (StatusCode, tonic::Code) {
        codes_for(self.kind)
    }
}

/// Maps an error kind to its HTTP status and gRPC code (Triton's mapping).
pub fn codes_for(kind: ErrorKind) -> (StatusCode, tonic::Code) {
    match kind {
        ErrorKind::InvalidArg => (StatusCode::BAD_REQUEST, tonic::Code::InvalidArgument),
        ErrorKind::NotFound => (StatusCode::NOT_FOUND, tonic::Code::NotFound),
        ErrorKind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, tonic::Code::Unavailable),
        ErrorKind::Unsupported => (StatusCode::NOT_IMPLEMENTED, tonic::Code::Unimplemented),
        ErrorKind::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, tonic::Code::ResourceExhausted),
        ErrorKind::Cancelled => (StatusCode::BAD_REQUEST, tonic::Code::Cancelled),
        ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, tonic::Code::Internal),
        ErrorKind::Unauthenticated => (StatusCode::UNAUTHORIZED, tonic::Code::Unauthenticated),
        ErrorKind::PermissionDenied => (StatusCode::FORBIDDEN, tonic::Code::PermissionDenied),
        ErrorKind::TooManyRequests => (StatusCode::TOO_MANY_REQUESTS, tonic::Code::ResourceExhausted),
        ErrorKind::AlreadyExists => (StatusCode::BAD_REQUEST, tonic::Code::AlreadyExists),
        ErrorKind::UpstreamTimeout => (StatusCode::GATEWAY_TIMEOUT, tonic::Code::DeadlineExceeded),
    }
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        tonic::Status::new(err.codes().1, err.message)
    }
}

impl axum::response::IntoResponse for Error {
    fn into_response(self) -> axum::response::Response {
        let status = self.codes().0;
        let body = serde_json::json!({ "error": self.message });
        let mut response = (status, axum::Json(body)).into_response();
        if self.kind == ErrorKind::Unauthenticated {
            // RFC 6750: a 401 names the scheme the client should use.
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after_s {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_maps_to_matching_http_and_grpc_codes() {
        let cases = [
            (ErrorKind::InvalidArg, 400, tonic::Code::InvalidArgument),
            (ErrorKind::NotFound, 404, tonic::Code::NotFound),
            (ErrorKind::Unavailable, 503, tonic::Code::Unavailable),
            (ErrorKind::Unsupported, 501, tonic::Code::Unimplemented),
            (ErrorKind::TooLarge, 413, tonic::Code::ResourceExhausted),
            (ErrorKind::Internal, 500, tonic::Code::Internal),
            (ErrorKind::Unauthenticated, 401, tonic::Code::Unauthenticated),
            (ErrorKind::PermissionDenied, 403, tonic::Code::PermissionDenied),
            (ErrorKind::TooManyRequests, 429, tonic::Code::ResourceExhausted),
            (ErrorKind::AlreadyExists, 400, tonic::Code::AlreadyExists),
            (ErrorKind::UpstreamTimeout, 504, tonic::Code::DeadlineExceeded),
        ];
        for (kind, http, grpc) in cases {
            let (status, code) = codes_for(kind);
            assert_eq!(status.as_u16(), http, "{kind:?}");
            assert_eq!(code, grpc, "{kind:?}");
        }
    }

    #[test]
    fn grpc_status_carries_the_message() {
        let status: tonic::Status = Error::not_found("Request for unknown model: 'x' is not found").into();
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert!(status.message().contains("'x'"));
    }

    #[test]
    fn unauthenticated_responses_name_the_bearer_scheme() {
        use axum::response::IntoResponse;
        let response = Error::unauthenticated("missing credential").into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let forbidden = Error::permission_denied("no").into_response();
        assert!(forbidden.headers().get(header::WWW_AUTHENTICATE).is_none());
    }

    #[test]
    fn passing_unavailability_says_when_to_retry() {
        use axum::response::IntoResponse;
        let response = Error::unavailable("restarting").retry_after(1).into_response();
        assert_eq!(
            (response.status(), &response.headers()[header::RETRY_AFTER]),
            (StatusCode::SERVICE_UNAVAILABLE, &HeaderValue::from(1u32))
        );
        assert!(Error::unavailable("queue full").into_response().headers().get(header::RETRY_AFTER).is_none());
    }
}
