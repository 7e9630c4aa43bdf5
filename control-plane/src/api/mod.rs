//! The REST API: `/v1` routes, their OpenAPI document, and the middleware every request
//! passes (request id and span, authentication, idempotency).
//!
//! Handlers are thin: authorize (through [`App::tenant_for`]), parse into validated types,
//! make one domain call, map the result. Errors leave through [`crate::error`].

mod aliases;
mod audit;
mod billing;
mod canary;
mod captures;
mod cursor;
mod deployments;
mod extract;
mod idempotency;
mod keys;
mod models;
mod session;
mod sso;
mod tenants;
mod usage;
mod users;
mod versions;
mod webhooks;
mod whoami;
mod workers;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::server::ServerBuilder;
use utoipa::openapi::{ContentBuilder, OpenApi as OpenApiDoc, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use extract::{ApiJson, ApiQuery, Caller, EndedSession, RequestId, contains_nul};

use crate::app::App;
use crate::error::Error;
use crate::metrics::MetricsToken;

/// Shared state of every handler.
pub type AppState = Arc<App>;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tessera control plane",
        description = "Tenants, API keys, models, versions, aliases, deployments, quotas, usage, invoices and the \
                       audit trail of a Tessera inference service. Every `/v1` route takes \
                       `Authorization: Bearer <API key or access token>`; errors are \
                       `{\"error\": {\"code\", \"message\"}}`; a resource in another tenant is 404.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    servers((url = "/", description = "The server this document was fetched from")),
    security(("bearer" = [])),
    modifiers(&BearerAuth),
    // Types only parameters name (the router registers the rest from the bodies).
    components(schemas(crate::error::ErrorBody, crate::error::ErrorDetail, usage::UsageGrouping, usage::MetricsStep)),
    tags(
        (name = "auth", description = "Access tokens and the keys that verify them"),
        (name = "tenants", description = "Tenants and their quotas (platform admins)"),
        (name = "api-keys", description = "A tenant's API keys"),
        (name = "users", description = "A tenant's users, owners of API keys"),
        (name = "models", description = "Models, versions and aliases"),
        (name = "deployments", description = "Deployments of models onto workers, their replicas and events; workers"),
        (name = "usage", description = "A tenant's usage and metrics, from what workers meter"),
        (name = "billing", description = "Prices (platform admins set them) and a tenant's monthly invoices"),
        (name = "audit", description = "The tenant's audit trail"),
        (name = "webhooks", description = "Signed HTTP callbacks for a tenant's events, their deliveries and replays"),
        (name = "service", description = "Health")
    )
)]
struct ApiDoc;

/// Declares the `bearer` scheme every `/v1` route uses.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut OpenApiDoc) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("API key (tsk_...) or access token (JWT)")
            .build();
        components.add_security_scheme("bearer", SecurityScheme::Http(scheme));
        let cookie = ApiKey::Cookie(ApiKeyValue::with_description(
            crate::sso::SESSION_COOKIE,
            "Console session from single sign-on (`/v1/auth/oidc/{tenant}/login`); state-changing requests \
             must also send the session's `csrf_token` in `X-CSRF-Token`.",
        ));
        components.add_security_scheme("session", SecurityScheme::ApiKey(cookie));
    }
}

/// Adds the error responses every `/v1` operation can give, so each handler lists only its
/// own (409, 413, ...).
struct StandardErrors;

impl Modify for StandardErrors {
    fn modify(&self, openapi: &mut OpenApiDoc) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            if !path.starts_with("/v1/") || path == "/v1/openapi.json" {
                continue;
            }
            let scoped = path.contains("{tenant}") || path.starts_with("/v1/audit");
            let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for (i, op) in ops.into_iter().enumerate() {
                let Some(op) = op else { continue };
                let mut add = |status: &str, description: &str| {
                    op.responses.responses.entry(status.to_string()).or_insert_with(|| error_response(description));
                };
                add("400", "The request could not be read (malformed JSON, bad header).");
                add("401", "Missing or invalid credentials.");
                add("403", "The caller's role may not do this.");
                if scoped {
                    add("404", "Not found in the caller's tenant (other tenants' resources are not found either).");
                }
                add("422", "Invalid input; `field` names the culprit.");
                if i == 2 {
                    add("409", "Conflict, e.g. a request with the same Idempotency-Key is still running.");
                }
                add("500", "Internal error.");
            }
        }
    }
}

fn error_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
    RefOr::T(ResponseBuilder::new().description(description).content("application/json", content).build())
}

fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(session::handle_health))
        .routes(routes!(session::handle_ready))
        .routes(routes!(session::handle_jwks))
        .routes(routes!(session::handle_token_create))
        .routes(routes!(session::handle_signing_key_rotate))
        .routes(routes!(whoami::handle_whoami))
        .routes(routes!(sso::handle_oidc_issuer_get, sso::handle_oidc_issuer_set, sso::handle_oidc_issuer_delete))
        .routes(routes!(sso::handle_oidc_login))
        .routes(routes!(sso::handle_oidc_callback))
        .routes(routes!(sso::handle_session_get))
        .routes(routes!(sso::handle_logout))
        .routes(routes!(tenants::handle_tenant_create, tenants::handle_tenant_list))
        .routes(routes!(tenants::handle_tenant_get))
        .routes(routes!(tenants::handle_quota_get, tenants::handle_quota_set))
        .routes(routes!(keys::handle_key_create, keys::handle_key_list))
        .routes(routes!(keys::handle_key_get, keys::handle_key_revoke, keys::handle_key_update))
        .routes(routes!(users::handle_user_create, users::handle_user_list))
        .routes(routes!(users::handle_user_get, users::handle_user_disable))
        .routes(routes!(models::handle_model_create, models::handle_model_list))
        .routes(routes!(models::handle_model_get, models::handle_model_delete))
        .routes(routes!(versions::handle_version_create, versions::handle_version_list))
        .routes(routes!(versions::handle_version_get, versions::handle_version_delete))
        .routes(routes!(versions::handle_upload_create))
        .routes(routes!(versions::handle_upload_complete))
        .routes(routes!(aliases::handle_alias_list))
        .routes(routes!(aliases::handle_alias_set, aliases::handle_alias_get, aliases::handle_alias_delete))
        .routes(routes!(deployments::handle_deployment_create, deployments::handle_deployment_list))
        .routes(routes!(
            deployments::handle_deployment_get,
            deployments::handle_deployment_update,
            deployments::handle_deployment_delete
        ))
        .routes(routes!(deployments::handle_deployment_events))
        .routes(routes!(captures::handle_capture_list))
        .routes(routes!(captures::handle_capture_get))
        .routes(routes!(captures::handle_capture_retention_get, captures::handle_capture_retention_set))
        .routes(routes!(canary::handle_canary_set, canary::handle_canary_update))
        .routes(routes!(canary::handle_canary_promote))
        .routes(routes!(canary::handle_canary_rollback))
        .routes(routes!(workers::handle_worker_list))
        .routes(routes!(usage::handle_usage))
        .routes(routes!(usage::handle_metrics))
        .routes(routes!(billing::handle_prices_get, billing::handle_prices_set))
        .routes(routes!(billing::handle_invoice_query))
        .routes(routes!(billing::handle_invoice_get))
        .routes(routes!(audit::handle_audit_list))
        .routes(routes!(audit::handle_audit_verify))
        .routes(routes!(audit::handle_checkpoint_key_get))
        .routes(routes!(webhooks::handle_webhook_create, webhooks::handle_webhook_list))
        .routes(routes!(webhooks::handle_webhook_get, webhooks::handle_webhook_update, webhooks::handle_webhook_delete))
        .routes(routes!(webhooks::handle_webhook_rotate_secret))
        .routes(routes!(webhooks::handle_webhook_ping))
        .routes(routes!(webhooks::handle_delivery_list))
        .routes(routes!(webhooks::handle_delivery_get))
        .routes(routes!(webhooks::handle_delivery_replay))
        .routes(routes!(webhooks::handle_webhook_settings_get, webhooks::handle_webhook_settings_set))
}

/// The OpenAPI document of the API (its `servers` entry relative: `/`).
pub fn openapi() -> OpenApiDoc {
    finish_doc(api_router().into_openapi(), None)
}

/// Adds what needs every path to be present (the derive's modifiers run before the router
/// adds them), splits doc comments into summary and description, and names the public URL
/// as the server when there is one.
fn finish_doc(mut doc: OpenApiDoc, public_url: Option<&str>) -> OpenApiDoc {
    StandardErrors.modify(&mut doc);
    for item in doc.paths.paths.values_mut() {
        let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
        for op in ops.into_iter().flatten() {
            let text = [op.summary.take(), op.description.take()].into_iter().flatten().collect::<Vec<_>>();
            let (summary, description) = summary_and_description(&text.join("\n\n"));
            (op.summary, op.description) = (Some(summary), description);
        }
    }
    if let Some(url) = public_url {
        let server = ServerBuilder::new().url(url).description(Some("This control plane")).build();
        doc.servers = Some(vec![server]);
    }
    doc
}

/// A handler's doc comment as an operation's summary (its first sentence, whole) and
/// description (the whole text, when there is more than the summary), with the comment's
/// line wrapping undone so Markdown renderers see paragraphs. utoipa makes the first
/// paragraph the summary, which documentation pages then cut at its first line break.
fn summary_and_description(doc: &str) -> (String, Option<String>) {
    let paragraphs: Vec<String> = doc.split("\n\n").map(unwrap_lines).filter(|p| !p.is_empty()).collect();
    let first = paragraphs.first().cloned().unwrap_or_default();
    let summary = first_sentence(&first).to_string();
    let whole = paragraphs.join("\n\n");
    let description = (whole != summary).then_some(whole);
    (summary, description)
}

/// A paragraph's lines joined with spaces, except before Markdown list items.
fn unwrap_lines(paragraph: &str) -> String {
    let mut out = String::new();
    for line in paragraph.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !out.is_empty() {
            let item = line.starts_with("- ") || line.starts_with("* ");
            out.push(if item { '\n' } else { ' ' });
        }
        out.push_str(line);
    }
    out
}

/// The text up to the first full stop that ends a sentence: followed by a space, outside
/// code spans and parentheses, not an abbreviation such as `e.g.`.
fn first_sentence(text: &str) -> &str {
    let (mut ticks, mut depth) = (0usize, 0i32);
    for (i, c) in text.char_indices() {
        match c {
            '`' => ticks += 1,
            '(' if ticks % 2 == 0 => depth += 1,
            ')' if ticks % 2 == 0 => depth -= 1,
            '.' if ticks % 2 == 0 && depth <= 0 && text[i + 1..].starts_with(' ') => {
                let head = &text[..=i];
                if !["e.g.", "i.e.", "etc.", "vs."].iter().any(|a| head.ends_with(a)) {
                    return head;
                }
            }
            _ => {}
        }
    }
    text
}

/// The OpenAPI document as committed in `openapi/openapi.json` (pretty, newline-terminated).
pub fn openapi_json() -> String {
    to_json(&openapi())
}

fn to_json(doc: &OpenApiDoc) -> String {
    // The document is plain data; serialising it cannot fail.
    let mut text = serde_json::to_string_pretty(doc).expect("openapi document serialises");
    text.push('\n');
    text
}

/// The whole HTTP service.
pub fn router(app: AppState) -> Router {
    let (api, doc) = api_router().split_for_parts();
    let doc_json = Arc::new(to_json(&finish_doc(doc, app.config.public_url.as_deref())));
    let console = crate::console::Console::open(app.config.console_dir.as_deref());
    let body_timeout = app.config.client_timeout;
    // `/metrics` has its own credential, so it stays outside the API's middleware; with
    // `--metrics-listen` it is served there instead.
    let metrics = app.config.metrics_listen.is_none().then(|| metrics_router(app.config.metrics_token.clone()));
    let router = api
        .route("/v1/openapi.json", get(move || serve_openapi(doc_json.clone())))
        .route("/docs", get(serve_docs))
        .fallback(move |req: Request| console.clone().respond(req))
        .layer(middleware::from_fn_with_state(app.clone(), idempotency::idempotency))
        .layer(middleware::from_fn_with_state(app.clone(), authenticate))
        .layer(middleware::from_fn(request_context))
        // A body that stops arriving fails its request instead of holding it forever; each frame
        // resets the clock, so a long upload that keeps sending is fine. (Not on the workers'
        // agent streams, merged beside this router, which are idle for minutes by design.)
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(body_timeout))
        .with_state(app);
    match metrics {
        Some(metrics) => router.merge(metrics),
        None => router,
    }
}

/// `/metrics`, behind `Authorization: Bearer <token>` when a token is configured.
pub fn metrics_router(token: Option<MetricsToken>) -> Router {
    let router = Router::new().route("/metrics", get(|| async { crate::metrics::render() }));
    match token {
        Some(token) => router.layer(middleware::from_fn_with_state(token, require_metrics_token)),
        None => router,
    }
}

/// 401 with a `WWW-Authenticate` challenge unless the request carries the metrics token.
async fn require_metrics_token(State(token): State<MetricsToken>, req: Request, next: Next) -> Response {
    if token.admits(req.headers()) {
        return next.run(req).await;
    }
    let challenge = [(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"metrics\""))];
    (StatusCode::UNAUTHORIZED, challenge, "missing or invalid metrics token\n").into_response()
}

async fn serve_openapi(doc: Arc<String>) -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], doc.as_str().to_owned()).into_response()
}

/// The interactive API page: our own HTML and script, rendering `/v1/openapi.json`. Nothing
/// is fetched from anywhere but this server (the content security policy makes sure).
const DOCS_PAGE: &str = include_str!("docs.html");

/// Inline script and style only, requests only to this server.
const DOCS_CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                        connect-src 'self'; img-src 'self'; form-action 'none'; base-uri 'none'";

async fn serve_docs() -> Response {
    ([(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(DOCS_CSP))], Html(DOCS_PAGE)).into_response()
}

/// Gives every request an id (the client's `x-request-id` if sane, else a new one), a span
/// carrying it, the id echoed in the response, and a metric.
async fn request_context(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string);
    let route = req.extensions().get::<MatchedPath>().map_or("unmatched", |m| m.as_str()).to_string();
    let method = req.method().clone();
    let client = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.to_string());
    req.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %method,
        route = %route,
        client,
        tenant = tracing::field::Empty
    );
    let started = std::time::Instant::now();
    let mut response = tracing::Instrument::instrument(next.run(req), span.clone()).await;
    let status = response.status().as_u16();
    span.in_scope(|| tracing::debug!(status, elapsed_ms = started.elapsed().as_millis() as u64, "request done"));
    crate::metrics::observe_response(method.as_str(), &route, status);
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

/// Resolves `Authorization: Bearer …` into a [`crate::auth::Principal`] extension. A request
/// without the header, or with a credential that does not check out, passes on without one:
/// routes that need a caller refuse it with 401 in [`Caller`]; public routes do not care.
async fn authenticate(State(app): State<AppState>, mut req: Request, next: Next) -> Response {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return authenticate_session(app, req, next).await;
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim().to_string());
    let outcome = match token {
        Some(token) => app.auth.authenticate(&token).await,
        None => Err(Error::Unauthenticated),
    };
    match outcome {
        Ok(principal) => {
            tracing::Span::current().record("tenant", principal.tenant_name.as_str());
            req.extensions_mut().insert(principal);
        }
        // A registry failure is ours, not the caller's: answer it now.
        Err(e @ (Error::Database(_) | Error::Internal(_))) => return e.into_response(),
        // Routes that need a caller say why the token no longer works.
        Err(Error::Revoked) => {
            req.extensions_mut().insert(extract::TokenRevoked);
        }
        Err(_) => {}
    }
    next.run(req).await
}

/// Without `Authorization`, the console's session cookie: an open session becomes the
/// request's principal, but a state-changing request must echo the session's CSRF token in
/// `X-CSRF-Token` (403 otherwise). A session that has ended leaves its reason for [`Caller`].
/// API keys and tokens never reach here, so machines are unaffected.
async fn authenticate_session(app: AppState, mut req: Request, next: Next) -> Response {
    let Some(token) = crate::sso::session_token(req.headers()) else {
        return next.run(req).await;
    };
    match app.sso.resolve(&app.registry, &token).await {
        Ok(session) => {
            let safe = matches!(*req.method(), http::Method::GET | http::Method::HEAD | http::Method::OPTIONS);
            let sent = req.headers().get(crate::sso::CSRF_HEADER).and_then(|v| v.to_str().ok());
            if !safe && !sent.is_some_and(|s| crate::sso::same_secret(s, &session.csrf_token)) {
                tracing::warn!(tenant = %session.principal.tenant_name, "refused a request without its CSRF token");
                return Error::CsrfRejected.into_response();
            }
            tracing::Span::current().record("tenant", session.principal.tenant_name.as_str());
            req.extensions_mut().insert(session.principal.clone());
            req.extensions_mut().insert(session);
        }
        Err(e @ (Error::Database(_) | Error::Internal(_))) => return e.into_response(),
        Err(Error::SessionEnded(reason)) => {
            req.extensions_mut().insert(EndedSession(reason));
        }
        Err(_) => {}
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_whole_first_sentences() {
        let doc = "Uploads a new version as the request body, streamed to the store (deployers). Refused, e.g. when\n\
                   too large (413). `a. b` stays.\n\nA second paragraph\nwrapped.\n- one\n- two";
        let (summary, description) = summary_and_description(doc);
        assert_eq!(summary, "Uploads a new version as the request body, streamed to the store (deployers).");
        assert_eq!(
            description.as_deref(),
            Some(
                "Uploads a new version as the request body, streamed to the store (deployers). Refused, e.g. when \
                 too large (413). `a. b` stays.\n\nA second paragraph wrapped.\n- one\n- two"
            )
        );
        assert_eq!(summary_and_description("Lists models."), ("Lists models.".to_string(), None));
        assert_eq!(first_sentence("Reads it (e.g. `x. y`). Then more."), "Reads it (e.g. `x. y`).");
    }

    #[test]
    fn the_document_serves_generated_clients() {
        let text = openapi_json();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["servers"][0]["url"], "/");
        let schemas = &doc["components"]["schemas"];
        for name in text.split("#/components/schemas/").skip(1) {
            let name: String = name.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            assert!(schemas[&name].is_object(), "{name} is referenced but not defined");
        }
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let summary = op["summary"].as_str().unwrap_or_default();
                assert!(!summary.is_empty() && !summary.contains('\n'), "{method} {path}: summary {summary:?}");
                // Every JSON request body shows an example.
                if let Some(schema) = op.pointer("/requestBody/content/application~1json/schema") {
                    let name = schema["$ref"].as_str().and_then(|r| r.rsplit('/').next()).unwrap_or_default();
                    let examples = &schemas[name]["examples"];
                    assert!(examples.as_array().is_some_and(|e| !e.is_empty()), "{method} {path}: no example");
                }
                // Every list pages with the same cursor.
                let page = op.pointer("/responses/200/content/application~1json/schema/$ref").and_then(|r| r.as_str());
                let body = page.and_then(|r| r.rsplit('/').next()).map(|n| &schemas[n]);
                let is_list = body.is_some_and(|b| {
                    b["properties"].as_object().is_some_and(|p| p.values().any(|v| v["type"] == "array"))
                        && op["operationId"].as_str().is_some_and(|id| id.starts_with("list_"))
                });
                if is_list {
                    let params: Vec<&str> = op["parameters"]
                        .as_array()
                        .map(|ps| ps.iter().filter_map(|p| p["name"].as_str()).collect())
                        .unwrap_or_default();
                    assert!(params.contains(&"cursor") && params.contains(&"limit"), "{method} {path} does not page");
                    assert!(body.unwrap()["properties"]["next_cursor"].is_object(), "{method} {path}: no next_cursor");
                }
            }
        }
        // Closed sets are enums.
        for name in ["ErrorCode", "AuditAction", "DeploymentEventKind", "WorkerState", "InvoiceLineKind", "Role"] {
            assert!(schemas[name]["enum"].as_array().is_some_and(|e| !e.is_empty()), "{name} is no enum");
        }
        assert_eq!(schemas["ErrorDetail"]["properties"]["code"]["$ref"], "#/components/schemas/ErrorCode");
    }

    #[test]
    fn a_public_url_becomes_the_server() {
        let doc = finish_doc(api_router().into_openapi(), Some("https://tessera.example.com"));
        let servers = doc.servers.unwrap();
        assert_eq!(servers.iter().map(|s| s.url.as_str()).collect::<Vec<_>>(), ["https://tessera.example.com"]);
    }
}
