//! The web console: the built single-page app (`web/dist`, made by `scripts/setup-web.sh`)
//! served at `/`. A path naming a file in the directory gets that file; any other page path
//! gets `index.html`, so the console's own routes (`/t/demo/models/simple`) survive a reload.
//! The API's paths (`/v1`, `/docs`, `/metrics`, `/healthz`, `/readyz`, `/.well-known`) never reach the
//! console: they stay the API's, with its JSON 404.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::Error;

/// Paths the API owns; the console answers none of them.
const API_PREFIXES: [&str; 6] = ["/v1", "/docs", "/metrics", "/healthz", "/readyz", "/.well-known"];

/// Where the console's own code may load from: this server only, no inline script.
const CONSOLE_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                           connect-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; \
                           form-action 'self'";

/// The console directory the control plane uses without `--console-dir`: `web/dist` under
/// the working directory, else the one in the repository this binary was built from — the
/// first that holds an `index.html`.
pub fn default_dir() -> Option<PathBuf> {
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../web/dist");
    [PathBuf::from("web/dist"), built_from].into_iter().find(|dir| dir.join("index.html").is_file())
}

/// The console's files, or nothing when it is off. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Console {
    /// Canonical directory holding `index.html`; `None`: the console is off.
    root: Option<Arc<PathBuf>>,
}

impl Console {
    /// The console served from `dir`, logging once whether it is on. A directory without an
    /// `index.html` leaves the console off (the API serves regardless).
    pub fn open(dir: Option<&Path>) -> Self {
        let Some(dir) = dir else {
            tracing::info!("console off: no --console-dir and no built web/dist (scripts/setup-web.sh builds it)");
            return Console::default();
        };
        match dir.canonicalize() {
            Ok(root) if root.join("index.html").is_file() => {
                tracing::info!(dir = %root.display(), "serving the console");
                Console { root: Some(Arc::new(root)) }
            }
            _ => {
                tracing::warn!(dir = %dir.display(), "console off: no index.html in the console directory");
                Console::default()
            }
        }
    }

    /// Whether the console is served.
    pub fn is_on(&self) -> bool {
        self.root.is_some()
    }

    /// Answers a request no API route matched: a console file or page, else the API's 404.
    pub async fn respond(self, req: Request) -> Response {
        let path = req.uri().path();
        let Some(root) = self.root.as_deref() else { return Error::NotFound("route").into_response() };
        if is_api_path(path) || !matches!(*req.method(), Method::GET | Method::HEAD) {
            return Error::NotFound("route").into_response();
        }
        let Some(relative) = safe_relative(path) else { return plain_not_found() };
        if let Some(file) = existing_file(root, &relative).await {
            return serve_file(&file, relative.starts_with("assets/")).await;
        }
        if looks_like_file(&relative) {
            // A missing script or image must not come back as HTML.
            return plain_not_found();
        }
        serve_file(&root.join("index.html"), false).await
    }
}

/// Whether `path` belongs to the API (`/v1` and `/v1/...`, not `/v1x`).
fn is_api_path(path: &str) -> bool {
    API_PREFIXES.iter().any(|p| path == *p || path.strip_prefix(p).is_some_and(|rest| rest.starts_with('/')))
}

/// The request path as a relative file path, or `None` when a segment could climb out of the
/// directory or name a hidden file.
fn safe_relative(path: &str) -> Option<String> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let safe = segments.iter().all(|s| !s.starts_with('.') && !s.contains(['\\', '\0', '%']));
    safe.then(|| segments.join("/"))
}

/// The last segment has an extension: the client wants a file, not a page.
fn looks_like_file(relative: &str) -> bool {
    relative.rsplit('/').next().is_some_and(|name| name.contains('.'))
}

/// `root/relative` when it is a regular file inside `root` (symbolic links followed, but not
/// out of it).
async fn existing_file(root: &Path, relative: &str) -> Option<PathBuf> {
    if relative.is_empty() {
        return None;
    }
    let file = tokio::fs::canonicalize(root.join(relative)).await.ok()?;
    let meta = tokio::fs::metadata(&file).await.ok()?;
    (file.starts_with(root) && meta.is_file()).then_some(file)
}

async fn serve_file(file: &Path, immutable: bool) -> Response {
    let body = match tokio::fs::read(file).await {
        Ok(body) => body,
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "read a console file");
            return Error::NotFound("route").into_response();
        }
    };
    // Vite names assets by content hash: they never change. Pages must be revalidated so a
    // new build shows at once.
    let cache = if immutable { "public, max-age=31536000, immutable" } else { "no-cache" };
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type(file))),
        (header::CACHE_CONTROL, HeaderValue::from_static(cache)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONSOLE_CSP)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
    ];
    (headers, body).into_response()
}

fn plain_not_found() -> Response {
    (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "not found\n").into_response()
}

/// The media type of a console file, by extension.
fn content_type(file: &Path) -> &'static str {
    match file.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn console_in(dir: &Path) -> Console {
        std::fs::create_dir_all(dir.join("assets")).expect("mkdir");
        std::fs::write(dir.join("index.html"), "<!doctype html><title>console</title>").expect("write");
        std::fs::write(dir.join("assets/app-1234.js"), "console.log(1)").expect("write");
        Console::open(Some(dir))
    }

    async fn get(console: &Console, path: &str) -> (StatusCode, String, String) {
        let req = Request::builder().uri(path).body(Body::empty()).expect("request");
        let res = console.clone().respond(req).await;
        let status = res.status();
        let ct = res.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20).await.expect("body");
        (status, ct, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn pages_fall_back_to_index_and_files_are_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let console = console_in(dir.path());
        assert!(console.is_on());
        let (status, ct, body) = get(&console, "/t/demo/models/simple").await;
        assert_eq!((status, ct.as_str()), (StatusCode::OK, "text/html; charset=utf-8"));
        assert!(body.contains("<title>console</title>"));
        let (status, ct, body) = get(&console, "/assets/app-1234.js").await;
        assert_eq!(
            (status, ct.as_str(), body.as_str()),
            (StatusCode::OK, "text/javascript; charset=utf-8", "console.log(1)")
        );
        assert_eq!(get(&console, "/").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn api_paths_missing_files_and_escapes_are_not_the_console() {
        let dir = tempfile::tempdir().expect("tempdir");
        let console = console_in(&dir.path().join("dist"));
        std::fs::write(dir.path().join("secret.txt"), "no").expect("write");
        for path in ["/v1/nope", "/v1", "/metrics/x", "/.well-known/other", "/healthz/x"] {
            let (status, ct, _) = get(&console, path).await;
            assert_eq!((status, ct.as_str()), (StatusCode::NOT_FOUND, "application/json"), "{path}");
        }
        assert_eq!(get(&console, "/assets/missing.js").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get(&console, "/../secret.txt").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get(&console, "/%2e%2e/secret.txt").await.0, StatusCode::NOT_FOUND);
        // A page path that only starts like an API path is the console's.
        assert_eq!(get(&console, "/v1x").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn without_a_directory_the_console_is_off() {
        let dir = tempfile::tempdir().expect("tempdir");
        let off = Console::open(Some(dir.path()));
        assert!(!off.is_on());
        assert_eq!(get(&off, "/").await.0, StatusCode::NOT_FOUND);
        assert!(!Console::open(None).is_on());
    }
}
