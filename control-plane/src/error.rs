//! The control plane's one error type, its kinds, and their mapping to HTTP in one place.
//!
//! Every `/v1` failure leaves as `{"error": {"code", "message"}}` (plus `field` when one input
//! field is to blame). 500s say nothing internal; the cause is logged once, here.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Result alias for the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A quota a tenant can exceed; its name is part of the error code (`quota_exceeded.<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaName {
    /// Number of models.
    Models,
    /// Number of model versions, over all models.
    Versions,
    /// Bytes of stored artifacts.
    StorageBytes,
    /// Deployment replicas, over all deployments.
    Replicas,
    /// Spend in the current calendar month, cents.
    MonthlySpendCents,
}

impl QuotaName {
    /// The quota's name as it appears in codes and in the quota document.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaName::Models => "models",
            QuotaName::Versions => "versions",
            QuotaName::StorageBytes => "storage_bytes",
            QuotaName::Replicas => "replicas",
            QuotaName::MonthlySpendCents => "monthly_spend_cents",
        }
    }

    fn code(self) -> ErrorCode {
        match self {
            QuotaName::Models => ErrorCode::QuotaExceededModels,
            QuotaName::Versions => ErrorCode::QuotaExceededVersions,
            QuotaName::StorageBytes => ErrorCode::QuotaExceededStorageBytes,
            QuotaName::Replicas => ErrorCode::QuotaExceededReplicas,
            QuotaName::MonthlySpendCents => ErrorCode::QuotaExceededMonthlySpendCents,
        }
    }
}

/// The stable, machine-readable code of an error body: one closed set, so generated clients
/// get an enum. A kind's default code, a conflict's reason, or the quota that is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 422: input that parsed but is not acceptable (`field` names it).
    InvalidArgument,
    /// 400: a request that could not be read.
    BadRequest,
    /// 401: missing or invalid credentials.
    Unauthenticated,
    /// 403: the caller's role may not do this.
    PermissionDenied,
    /// 404: not found in the caller's tenant.
    NotFound,
    /// 409: a conflict with no more specific code.
    Conflict,
    /// 409: the name (or email, or key prefix) is taken.
    AlreadyExists,
    /// 409: a request with the same `Idempotency-Key` is still running.
    IdempotencyInProgress,
    /// 409: a deployment uses the model.
    ModelDeployed,
    /// 409: an alias or a deployment uses the version.
    VersionInUse,
    /// 409: the deployment has no canary.
    NoCanary,
    /// 409: the object store cannot presign URLs.
    PresignUnsupported,
    /// 409: the upload was completed already.
    UploadCompleted,
    /// 409: nothing was uploaded to the presigned URL.
    UploadMissing,
    /// 409: the user is disabled.
    UserDisabled,
    /// 409: two prices for one profile at one time.
    DuplicatePrice,
    /// 409: a quota is full (only when no quota is named).
    QuotaExceeded,
    /// 409: the model quota is full.
    #[serde(rename = "quota_exceeded.models")]
    QuotaExceededModels,
    /// 409: the version quota is full.
    #[serde(rename = "quota_exceeded.versions")]
    QuotaExceededVersions,
    /// 409: the storage quota is full.
    #[serde(rename = "quota_exceeded.storage_bytes")]
    QuotaExceededStorageBytes,
    /// 409: the replica quota is full.
    #[serde(rename = "quota_exceeded.replicas")]
    QuotaExceededReplicas,
    /// 409: the month's spend reached its quota.
    #[serde(rename = "quota_exceeded.monthly_spend_cents")]
    QuotaExceededMonthlySpendCents,
    /// 413: the artifact is larger than the cap.
    PayloadTooLarge,
    /// 429: too much in progress at once.
    TooManyRequests,
    /// 500: our fault.
    Internal,
    /// 503: the registry is unreachable.
    Unavailable,
}

impl ErrorCode {
    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::IdempotencyInProgress => "idempotency_in_progress",
            ErrorCode::ModelDeployed => "model_deployed",
            ErrorCode::VersionInUse => "version_in_use",
            ErrorCode::NoCanary => "no_canary",
            ErrorCode::PresignUnsupported => "presign_unsupported",
            ErrorCode::UploadCompleted => "upload_completed",
            ErrorCode::UploadMissing => "upload_missing",
            ErrorCode::UserDisabled => "user_disabled",
            ErrorCode::DuplicatePrice => "duplicate_price",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::QuotaExceededModels => "quota_exceeded.models",
            ErrorCode::QuotaExceededVersions => "quota_exceeded.versions",
            ErrorCode::QuotaExceededStorageBytes => "quota_exceeded.storage_bytes",
            ErrorCode::QuotaExceededReplicas => "quota_exceeded.replicas",
            ErrorCode::QuotaExceededMonthlySpendCents => "quota_exceeded.monthly_spend_cents",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::TooManyRequests => "too_many_requests",
            ErrorCode::Internal => "internal",
            ErrorCode::Unavailable => "unavailable",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Everything that can go wrong in the control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Input that parsed but is not acceptable; names the field when one is to blame.
    #[error("{message}")]
    InvalidInput {
        /// The offending field, if any.
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// A request that could not be read at all (malformed JSON, bad header).
    #[error("{0}")]
    BadRequest(String),
    /// A value that cannot be decoded at all, in a named field (a page cursor this server
    /// never issued): 400, where a value that decodes but is not acceptable is 422.
    #[error("{message}")]
    Malformed {
        /// The offending field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// No credentials, or credentials that do not check out. Deliberately vague.
    #[error("missing or invalid credentials")]
    Unauthenticated,
    /// A console session that existed but has ended (expired, signed out, user disabled): 401
    /// with the reason, so the console can say why it signs the user out.
    #[error("{0}; sign in again")]
    SessionEnded(&'static str),
    /// A state-changing request with a console session but without its CSRF token: 403.
    #[error(
        "missing or wrong X-CSRF-Token header: state-changing requests with a console session must send the session's csrf_token"
    )]
    CsrfRejected,
    /// A single sign-on attempt that failed (the provider, the ID token, or the user): 401
    /// with what went wrong; the browser routes turn it into a redirect to the console.
    #[error("sign-in failed: {0}")]
    SignIn(String),
    /// A genuine access token whose API key was revoked or whose user was disabled after it
    /// was issued: 401, saying so (the caller holds a token we issued; nothing leaks).
    #[error("access token revoked: its API key was revoked or its user disabled")]
    Revoked,
    /// The caller's role may not perform this action.
    #[error("role '{role}' may not {action}")]
    Forbidden {
        /// The caller's role.
        role: &'static str,
        /// The refused action, as a verb phrase.
        action: &'static str,
    },
    /// The resource does not exist in the caller's tenant (or the tenant is not the caller's).
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The request conflicts with current state (`code` says how).
    #[error("{message}")]
    Conflict {
        /// Stable machine-readable code, e.g. `already_exists`.
        code: ErrorCode,
        /// Human-readable detail.
        message: String,
    },
    /// A tenant quota would be exceeded.
    #[error("{}", quota_message(*quota, *limit, *requested))]
    QuotaExceeded {
        /// Which quota.
        quota: QuotaName,
        /// The limit.
        limit: i64,
        /// What the request would bring the usage to.
        requested: i64,
    },
    /// An upload larger than the configured cap.
    #[error("artifact larger than the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The cap in bytes.
        limit: u64,
    },
    /// The tenant has as many of something in progress as it may (concurrent uploads): 429,
    /// retrying shortly helps.
    #[error("{0}")]
    Busy(String),
    /// Registry failure.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Artifact store failure.
    #[error("object store error: {0}")]
    Store(#[from] object_store::Error),
    /// Anything else that is our fault.
    #[error("{0}")]
    Internal(String),
}

/// The message of a quota error. Spend is not asked for by a request, so its message says what
/// was spent and what is refused until the month ends or the quota is raised.
fn quota_message(quota: QuotaName, limit: i64, requested: i64) -> String {
    match quota {
        QuotaName::MonthlySpendCents => format!(
            "quota 'monthly_spend_cents' exceeded: {requested} cents spent this month reached the limit of {limit}; \
             new deployments and scale-ups are refused until next month or a higher quota"
        ),
        _ => format!("quota '{}' exceeded: limit {limit}, would be {requested}", quota.as_str()),
    }
}

impl Error {
    /// Invalid input blamed on `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidInput { field: Some(field.into()), message: message.into() }
    }

    /// A conflict with a stable code.
    pub fn conflict(code: ErrorCode, message: impl Into<String>) -> Self {
        Error::Conflict { code, message: message.into() }
    }

    /// The error's kind, which decides status and code.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidInput { .. } => ErrorKind::InvalidArgument,
            Error::BadRequest(_) | Error::Malformed { .. } => ErrorKind::BadRequest,
            Error::Unauthenticated | Error::SessionEnded(_) | Error::SignIn(_) | Error::Revoked => {
                ErrorKind::Unauthenticated
            }
            Error::Forbidden { .. } | Error::CsrfRejected => ErrorKind::PermissionDenied,
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::Conflict { .. } => ErrorKind::Conflict,
            Error::QuotaExceeded { .. } => ErrorKind::QuotaExceeded,
            Error::PayloadTooLarge { .. } => ErrorKind::PayloadTooLarge,
            Error::Busy(_) => ErrorKind::TooManyRequests,
            Error::Database(e) if registry_unreachable(e) => ErrorKind::Unavailable,
            Error::Database(_) | Error::Store(_) | Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// The stable code in the error body.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Conflict { code, .. } => *code,
            Error::QuotaExceeded { quota, .. } => quota.code(),
            other => other.kind().default_code(),
        }
    }

    /// The body clients see; internal errors say nothing internal.
    pub fn body(&self) -> ErrorBody {
        let message = match self.kind() {
            ErrorKind::Internal => "internal error".to_string(),
            ErrorKind::Unavailable => "the registry database is unreachable; try again shortly".to_string(),
            _ => self.to_string(),
        };
        let field = match self {
            Error::InvalidInput { field, .. } => field.clone(),
            Error::Malformed { field, .. } => Some(field.to_string()),
            _ => None,
        };
        ErrorBody { error: ErrorDetail { code: self.code(), message, field } }
    }
}

/// What went wrong, coarsely: decides the HTTP status and the gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 422.
    InvalidArgument,
    /// 400.
    BadRequest,
    /// 401.
    Unauthenticated,
    /// 403.
    PermissionDenied,
    /// 404.
    NotFound,
    /// 409.
    Conflict,
    /// 409 with a `quota_exceeded.*` code.
    QuotaExceeded,
    /// 413.
    PayloadTooLarge,
    /// 429: too much in progress at once (retrying shortly helps).
    TooManyRequests,
    /// 500.
    Internal,
    /// 503: the registry database cannot be reached (retrying later helps).
    Unavailable,
}

impl ErrorKind {
    /// The HTTP status for this kind: the single place statuses are decided.
    pub fn http_status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidArgument => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            // A quota is a conflict with the tenant's current state, not a rate limit: retrying
            // does not help until something is deleted or the quota is raised.
            ErrorKind::Conflict | ErrorKind::QuotaExceeded => StatusCode::CONFLICT,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The gRPC code for this kind (the agent service): the single place codes are decided.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorKind::InvalidArgument | ErrorKind::BadRequest => tonic::Code::InvalidArgument,
            ErrorKind::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorKind::PermissionDenied => tonic::Code::PermissionDenied,
            ErrorKind::NotFound => tonic::Code::NotFound,
            ErrorKind::Conflict => tonic::Code::AlreadyExists,
            ErrorKind::QuotaExceeded | ErrorKind::PayloadTooLarge | ErrorKind::TooManyRequests => {
                tonic::Code::ResourceExhausted
            }
            // A worker treats anything but UNAUTHENTICATED as "control plane unavailable" and
            // keeps its cached answers, which is right for a failing registry too.
            ErrorKind::Internal | ErrorKind::Unavailable => tonic::Code::Unavailable,
        }
    }

    fn default_code(self) -> ErrorCode {
        match self {
            ErrorKind::InvalidArgument => ErrorCode::InvalidArgument,
            ErrorKind::BadRequest => ErrorCode::BadRequest,
            ErrorKind::Unauthenticated => ErrorCode::Unauthenticated,
            ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
            ErrorKind::NotFound => ErrorCode::NotFound,
            ErrorKind::Conflict => ErrorCode::Conflict,
            ErrorKind::QuotaExceeded => ErrorCode::QuotaExceeded,
            ErrorKind::PayloadTooLarge => ErrorCode::PayloadTooLarge,
            ErrorKind::TooManyRequests => ErrorCode::TooManyRequests,
            ErrorKind::Internal => ErrorCode::Internal,
            ErrorKind::Unavailable => ErrorCode::Unavailable,
        }
    }
}

/// Whether a registry error means the database cannot be reached (down, refusing connections,
/// shutting down, out of connections) rather than a bug or bad data.
fn registry_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        // SQLSTATE classes 08 (connection exception), 53 (insufficient resources), 57
        // (operator intervention: shutdown, "cannot connect now"), and 55000 as Postgres raises
        // it for a database that does not allow connections.
        sqlx::Error::Database(db) => {
            db.code().is_some_and(|c| c.starts_with("08") || c.starts_with("53") || c.starts_with("57") || c == "55000")
        }
        _ => false,
    }
}

/// The error document of every `/v1` route.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// One error: a stable code and a human-readable message.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `not_found`, `already_exists`, `quota_exceeded.models`.
    pub code: ErrorCode,
    /// Human-readable explanation.
    pub message: String,
    /// The request field at fault, for invalid input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let code = e.kind().grpc_code();
        match e.kind() {
            ErrorKind::Internal => tracing::error!(error = %e, "agent call failed"),
            ErrorKind::Unavailable => tracing::warn!(error = %e, "agent call failed: registry unreachable"),
            _ => {}
        }
        tonic::Status::new(code, e.body().error.message)
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = self.kind().http_status();
        match self.kind() {
            ErrorKind::Unavailable => tracing::warn!(error = %self, "request failed: registry unreachable"),
            _ if status.is_server_error() => tracing::error!(error = %self, "request failed"),
            _ => {}
        }
        let mut response = (status, Json(self.body())).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_registry_is_503_and_unavailable() {
        let e = Error::Database(sqlx::Error::PoolTimedOut);
        assert_eq!(e.kind().http_status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.kind().grpc_code(), tonic::Code::Unavailable);
        assert_eq!(e.code(), "unavailable");
        let response = e.into_response();
        assert_eq!(response.headers().get(http::header::RETRY_AFTER).map(|v| v.as_bytes()), Some(&b"1"[..]));
        let other = Error::Database(sqlx::Error::RowNotFound);
        assert_eq!(other.kind().http_status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn quota_code_names_the_quota() {
        let e = Error::QuotaExceeded { quota: QuotaName::StorageBytes, limit: 10, requested: 11 };
        assert_eq!(e.code(), "quota_exceeded.storage_bytes");
        assert_eq!(e.kind().http_status(), StatusCode::CONFLICT);
        assert_eq!(e.to_string(), "quota 'storage_bytes' exceeded: limit 10, would be 11");
        let spend = Error::QuotaExceeded { quota: QuotaName::MonthlySpendCents, limit: 100, requested: 120 };
        assert_eq!(spend.code(), "quota_exceeded.monthly_spend_cents");
        assert!(spend.to_string().contains("120 cents spent this month reached the limit of 100"));
    }

    #[test]
    fn codes_serialise_as_their_wire_names() {
        for code in [ErrorCode::AlreadyExists, ErrorCode::QuotaExceededStorageBytes, ErrorCode::NotFound] {
            assert_eq!(serde_json::to_value(code).unwrap(), serde_json::json!(code.as_str()));
            assert_eq!(serde_json::from_value::<ErrorCode>(serde_json::json!(code.as_str())).unwrap(), code);
        }
    }

    #[test]
    fn internal_errors_say_nothing_internal() {
        let e = Error::Internal("connection to 10.0.0.3 refused".into());
        let body = e.body();
        assert_eq!(body.error.message, "internal error");
        assert_eq!(body.error.code, "internal");
    }

    #[test]
    fn invalid_input_names_the_field() {
        let body = Error::invalid("name", "too long").body();
        assert_eq!(body.error.field.as_deref(), Some("name"));
        assert_eq!(Error::invalid("x", "y").kind().http_status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
}
