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

    /// What to do next, by status: `on_404` for a missing resource (e.g. "`tessera models list`
    /// shows your models"), general advice for the statuses every verb can meet.
    pub fn next_step(&self, on_404: &str) -> Option<String> {
        use reqwest::StatusCode;
        let advice = match self {
            ApiError::Unreachable { .. } => {
                "is the control plane running there? check --url / TESSERA_URL (`tessera login` saves it)"
            }
            ApiError::Decode { .. } => "is --url the control plane's address (not a worker's or the gateway's)?",
            ApiError::Status { status, .. } => match *status {
                StatusCode::NOT_FOUND if !on_404.is_empty() => on_404,
                StatusCode::UNAUTHORIZED => {
                    "the key was refused: check it, or run `tessera login --url URL --key KEY` with a valid one"
                }
                StatusCode::FORBIDDEN => {
                    "`tessera whoami` shows your key's role; ask a tenant admin for a key whose role allows this"
                }
                StatusCode::TOO_MANY_REQUESTS => "slow down and retry in a moment",
                _ => return None,
            },
        };
        Some(advice.to_string())
    }

    /// This error as one line ending in what to do next ([`ApiError::next_step`]).
    pub fn advise(self, on_404: &str) -> anyhow::Error {
        match self.next_step(on_404) {
            Some(next) => anyhow::anyhow!("{self} ({next})"),
            None => anyhow::Error::new(self),
        }
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

    /// `GET path` with `query`, as JSON.
    pub async fn get_query<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> Result<T, ApiError> {
        self.send(self.request(reqwest::Method::GET, path).timeout(CALL_TIMEOUT).query(query)).await
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

    /// `DELETE path`; the answer's body as JSON, `null` when empty (204).
    pub async fn delete(&self, path: &str) -> Result<Value, ApiError> {
        let (url, text) = self.send_raw(self.request(reqwest::Method::DELETE, path).timeout(CALL_TIMEOUT)).await?;
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| ApiError::Decode { url, reason: e.to_string() })
    }

    /// Every item of a paged list: `GET path` with `query`, the array under `field` of each
    /// page, following `next_cursor` until a page has none.
    pub async fn get_all(&self, path: &str, query: &[(&str, String)], field: &str) -> Result<Vec<Value>, ApiError> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut request = self.request(reqwest::Method::GET, path).timeout(CALL_TIMEOUT).query(query);
            if let Some(c) = &cursor {
                request = request.query(&[("cursor", c)]);
            }
            let (url, text) = self.send_raw(request).await?;
            let page: Value = serde_json::from_str(&text)
                .map_err(|e| ApiError::Decode { url: url.clone(), reason: e.to_string() })?;
            let (mut got, next) = page_items(page, field)
                .ok_or_else(|| ApiError::Decode { url, reason: format!("no \"{field}\" array in the answer") })?;
            items.append(&mut got);
            match next {
                Some(next) => cursor = Some(next),
                None => return Ok(items),
            }
        }
        Err(ApiError::Decode { url: path.to_string(), reason: format!("more than {MAX_PAGES} pages") })
    }
}

/// Most pages [`ApiClient::get_all`] follows (a server that always answers a cursor would
/// otherwise keep it forever).
const MAX_PAGES: usize = 10_000;

/// A page's items (under `field`, else `items`) and its `next_cursor`.
fn page_items(page: Value, field: &str) -> Option<(Vec<Value>, Option<String>)> {
    let Value::Object(mut page) = page else { return None };
    let next = page.get("next_cursor").and_then(Value::as_str).filter(|c| !c.is_empty()).map(str::to_string);
    let items = match page.remove(field).or_else(|| page.remove("items"))? {
        Value::Array(items) => items,
        _ => return None,
    };
    Some((items, next))
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
    fn errors_say_what_to_do_next() {
        let status = |code: u16| ApiError::Status {
            status: reqwest::StatusCode::from_u16(code).expect("a status"),
            message: "m".into(),
        };
        let missing = status(404).advise("`tessera models list` shows your models").to_string();
        assert_eq!(missing, "HTTP 404 Not Found: m (`tessera models list` shows your models)");
        assert!(status(403).advise("").to_string().contains("tessera whoami"));
        assert!(status(401).advise("").to_string().contains("tessera login"));
        assert_eq!(status(409).advise("x").to_string(), "HTTP 409 Conflict: m", "no advice where none helps");
        assert_eq!(status(404).next_step(""), None);
        let down = ApiError::Unreachable { url: "http://x".into(), reason: "refused".into() };
        assert!(down.advise("").to_string().contains("TESSERA_URL"));
    }

    #[test]
    fn pages_give_their_items_and_cursor() {
        let page = serde_json::json!({"models": [{"name": "a"}], "next_cursor": "c1"});
        let (items, next) = page_items(page, "models").expect("a page");
        assert_eq!((items.len(), next.as_deref()), (1, Some("c1")));
        let last = serde_json::json!({"items": [], "next_cursor": null});
        assert_eq!(page_items(last, "models"), Some((Vec::new(), None)), "items is the generic field");
        assert_eq!(page_items(serde_json::json!({"other": []}), "models"), None);
        assert_eq!(page_items(serde_json::json!([]), "models"), None);
    }

    #[test]
    fn segments_are_escaped() {
        assert_eq!(segment("simple"), "simple");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }
}
