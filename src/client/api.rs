//! A small typed client of the control plane's REST API `/v1`: bearer auth, JSON in and
//! out, and errors that read as one line (`HTTP 404 Not Found: model not found`).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A failed API call: the status and the API's message, or why no answer came.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The server answered with an error status.
    #[error("HTTP {status}: {message}")]
    Status {
        /// HTTP status.
        status: reqwest::StatusCode,
        /// `error.message` of a `/v1` error body, `error` of a KServe one, or the body.
        message: String,
    },
    /// No answer: connection refused, timeout, bad URL.
    #[error("cannot reach {url}: {reason}")]
    Unreachable {
        /// What was called.
        url: String,
        /// Why it failed.
        reason: String,
    },
    /// An answer that is not the JSON expected.
    #[error("unexpected answer from {url}: {reason}")]
    Decode {
        /// What was called.
        url: String,
        /// What was wrong.
        reason: String,
    },
}

impl ApiError {
    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<reqwest::StatusCode> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether this is a 404.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(reqwest::StatusCode::NOT_FOUND)
    }
}

/// The message in an error body: `{"error": {"message"}}` (`/v1`), `{"error": "..."}`
/// (KServe), or the text itself.
fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        let e = v.get("error")?;
        e.get("message").and_then(Value::as_str).or_else(|| e.as_str()).map(str::to_string)
    });
    message.unwrap_or_else(|| {
        let text = body.trim();
        if text.is_empty() { "(no message)".into() } else { text.chars().take(300).collect() }
    })
}

/// A client bound to one base URL and key.
#[derive(Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient").field("base", &self.base).finish_non_exhaustive()
    }
}

/// How long a plain API call may take (uploads have no overall limit).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

impl ApiClient {
    /// A client of `base` (`http://host:port` or `https://host:port`) authenticating with
    /// `key`; https trusts the system's roots and `ca_cert`.
    pub fn new(base: &str, key: &str, ca_cert: Option<&Path>) -> anyhow::Result<Self> {
        let tls = tessera_protocol::tls::client_config(ca_cert)?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .use_preconfigured_tls(tls)
            .build()
            .context("build the HTTP client")?;
        Ok(ApiClient { http, base: base.trim_end_matches('/').to_string(), key: key.to_string() })
    }

    /// The same connection and key against another base URL (a worker's).
    pub fn with_base(&self, base: &str) -> Self {
        ApiClient { http: self.http.clone(), base: base.trim_end_matches('/').to_string(), key: self.key.clone() }
    }

    /// The same connection and base URL with another key.
    pub fn with_key(&self, key: &str) -> Self {
        ApiClient { http: self.http.clone(), base: self.base.clone(), key: key.to_string() }
    }

    /// A request to `path` (starting with `/`) with the bearer key.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.key)
    }

    /// Sends a request and decodes a JSON answer, mapping error statuses to [`ApiError`].
    pub async fn send<T: DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> Result<T, ApiError> {
        let (url, text) = self.send_raw(request).await?;
        serde_json::from_str(&text).map_err(|e| ApiError::Decode { url, reason: e.to_string() })
    }

    /// Sends a request; the answer's URL and body text when the status is a success.
    pub async fn send_raw(&self, request: reqwest::RequestBuilder) -> Result<(String, String), ApiError> {
        let unreachable = |url: String, e: reqwest::Error| ApiError::Unreachable { url, reason: root_cause(&e) };
        let request = request.build().map_err(|e| unreachable(self.base.clone(), e))?;
        let url = request.url().to_string();
        let response = self.http.execute(request).await.map_err(|e| unreachable(url.clone(), e))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| unreachable(url.clone(), e))?;
        if status.is_success() {
            Ok((url, text))
        } else {
            Err(ApiError::Status { status, message: error_message(&text) })
        }
    }

    /// `GET path` as JSON.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        self.send(self.request(reqwest::Method::GET, path).timeout(CALL_TIMEOUT)).await
    }

    /// `GET path`, `None` on 404.
    pub async fn get_opt<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>, ApiError> {
        match self.get(path).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `method path` with a JSON body, as JSON.
    pub async fn call<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &B,
    ) -> Result<T, ApiError> {
        self.send(self.request(method, path).timeout(CALL_TIMEOUT).json(body)).await
    }

    /// `POST path` with a JSON body.
    pub async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T, ApiError> {
        self.call(reqwest::Method::POST, path, body).await
    }
}

/// The innermost cause of a reqwest error (e.g. `Connection refused`), which says more
/// than "error sending request".
fn root_cause(e: &reqwest::Error) -> String {
    let mut source: &dyn std::error::Error = e;
    while let Some(next) = source.source() {
        source = next;
    }
    if e.is_timeout() { format!("timed out ({source})") } else { source.to_string() }
}

/// Percent-encodes one path segment (names are usually plain, but a user may type anything).
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_come_from_either_body_shape() {
        assert_eq!(
            error_message(r#"{"error": {"code": "not_found", "message": "model not found"}}"#),
            "model not found"
        );
        assert_eq!(error_message(r#"{"error": "unknown model"}"#), "unknown model");
        assert_eq!(error_message("plain text\n"), "plain text");
        assert_eq!(error_message(""), "(no message)");
    }

    #[test]
    fn status_errors_read_as_one_line() {
        let e =
            ApiError::Status { status: reqwest::StatusCode::FORBIDDEN, message: "role 'inference' may not x".into() };
        assert_eq!(e.to_string(), "HTTP 403 Forbidden: role 'inference' may not x");
    }

    #[test]
    fn segments_are_escaped() {
        assert_eq!(segment("simple"), "simple");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }
}
