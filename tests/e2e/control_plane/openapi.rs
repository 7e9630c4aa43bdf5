//! The OpenAPI document: `tessera openapi` matches the committed `openapi/openapi.json`, and
//! the server serves the same document.

use std::process::Command;

use super::TestApp;

const COMMITTED: &str = include_str!("../../../openapi/openapi.json");

#[test]
fn committed_openapi_matches_the_code() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera")).arg("openapi").output().expect("run tessera openapi");
    assert!(out.status.success(), "tessera openapi failed: {}", String::from_utf8_lossy(&out.stderr));
    let generated = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        generated == COMMITTED,
        "openapi/openapi.json is stale: run `cargo run -- openapi > openapi/openapi.json` and commit it"
    );
}

#[tokio::test]
async fn the_server_publishes_its_document_and_docs_page() {
    let app = TestApp::spawn().await;
    let doc = app.get("", "/v1/openapi.json").await;
    let doc = doc.expect(200);
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc, &serde_json::from_str::<serde_json::Value>(COMMITTED).unwrap());
    for path in ["/v1/tenants/{tenant}/models", "/v1/auth/token", "/v1/audit/verify", "/.well-known/jwks.json"] {
        assert!(doc["paths"][path].is_object(), "{path} documented");
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    let page = app.client.get(format!("{}/docs", app.url)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");
    let html = page.text().await.unwrap();
    assert!(html.contains("/v1/openapi.json"));
    assert_no_external_urls(&html);
}

/// The docs page is self-contained: it loads nothing from anywhere but the server (no CDN,
/// no fonts, no external links); the network the control plane runs on may reach nothing else.
fn assert_no_external_urls(html: &str) {
    for needle in ["http://", "https://", "//cdn", "src=\"//", "href=\"//", "@import", "url("] {
        assert!(!html.contains(needle), "the docs page refers to something external: {needle}");
    }
    // Every src/href that is there points at this server.
    for attr in ["src=\"", "href=\""] {
        for rest in html.split(attr).skip(1) {
            assert!(rest.starts_with('/') && !rest.starts_with("//"), "{attr}{}", &rest[..rest.len().min(40)]);
        }
    }
}
