//! The HTTP rules with authentication on: health open, a credential for everything else,
//! models resolved in the caller's tenant, model control refused, statistics for every key of the tenant.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::Service;

use super::*;
use crate::auth::test_support::*;

struct Reply {
    status: StatusCode,
    www_authenticate: Option<String>,
    body: Value,
}

async fn call(router: &Router, method: Method, path: &str, key: Option<&str>, body: Option<Value>) -> Reply {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(key) = key {
        request = request.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let response = router.clone().call(request.body(body).expect("a request")).await.expect("infallible");
    let status = response.status();
    let www_authenticate =
        response.headers().get(header::WWW_AUTHENTICATE).map(|v| v.to_str().expect("ascii").to_string());
    let bytes = response.into_body().collect().await.expect("a body").to_bytes();
    let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("a JSON body") };
    Reply { status, www_authenticate, body }
}

async fn get(router: &Router, path: &str, key: Option<&str>) -> Reply {
    call(router, Method::GET, path, key, None).await
}

#[tokio::test]
async fn health_stays_open_and_everything_else_needs_a_credential() {
    let (state, _dir) = tenant_state().await;
    let router = router(state);
    assert_eq!(get(&router, "/v2/health/live", None).await.status, StatusCode::OK);
    assert_eq!(get(&router, "/v2/health/ready", None).await.status, StatusCode::OK);
    for path in
        ["/v2", "/v2/models/add_sub", "/v2/models/add_sub/ready", "/v2/models/add_sub/config", "/v2/models/stats"]
    {
        for key in [None, Some("tsk_unknown"), Some("not-a-jwt")] {
            let reply = get(&router, path, key).await;
            assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{path} {key:?}");
            assert_eq!(reply.www_authenticate.as_deref(), Some("Bearer"), "{path}");
            assert!(reply.body["error"].is_string(), "{path}: {}", reply.body);
        }
    }
    let infer = call(&router, Method::POST, "/v2/models/add_sub/infer", None, Some(add_sub_request())).await;
    assert_eq!(infer.status, StatusCode::UNAUTHORIZED);
    assert_eq!(get(&router, "/v2", Some(A_INFERENCE)).await.status, StatusCode::OK);
}

#[tokio::test]
async fn models_resolve_in_the_callers_tenant_and_keep_their_plain_names() {
    let (state, _dir) = tenant_state().await;
    let router = router(state);
    let reply =
        call(&router, Method::POST, "/v2/models/add_sub/infer", Some(A_INFERENCE), Some(add_sub_request())).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["model_name"], "add_sub");
    assert_eq!(reply.body["model_version"], "1");
    assert_eq!(reply.body["outputs"][0]["data"][0], 3.0);

    // The same name in tenant B is B's own model.
    let reply =
        call(&router, Method::POST, "/v2/models/add_sub/infer", Some(B_DEPLOYER), Some(add_sub_request())).await;
    assert_eq!((reply.status, &reply.body["model_version"]), (StatusCode::OK, &json!("2")));

    let metadata = get(&router, "/v2/models/add_sub", Some(A_INFERENCE)).await;
    assert_eq!((metadata.body["name"].clone(), metadata.body["versions"].clone()), (json!("add_sub"), json!(["1"])));
    assert_eq!(get(&router, "/v2/models/add_sub/versions/1/ready", Some(A_INFERENCE)).await.status, StatusCode::OK);
    assert_eq!(get(&router, "/v2/models/add_sub/config", Some(A_INFERENCE)).await.body["name"], "add_sub");
}

#[tokio::test]
async fn another_tenants_model_is_as_unknown_as_a_missing_one() {
    let (state, _dir) = tenant_state().await;
    let router = router(state);
    let unknown = get(&router, "/v2/models/nope", Some(A_INFERENCE)).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.body["error"], "Request for unknown model: 'nope' is not found");
    for (method, path) in [
        (Method::GET, "/v2/models/only_b"),
        (Method::GET, "/v2/models/only_b/ready"),
        (Method::GET, "/v2/models/only_b/config"),
        (Method::GET, "/v2/models/only_b/versions/1"),
        (Method::POST, "/v2/models/only_b/infer"),
        (Method::POST, "/v2/models/only_b/versions/1/infer"),
    ] {
        let body = (method == Method::POST).then(add_sub_request);
        let reply = call(&router, method, path, Some(A_INFERENCE), body).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}");
        let message = reply.body["error"].as_str().expect("a message");
        assert!(message.starts_with("Request for unknown model: 'only_b'"), "{path}: {message}");
    }
    // Tenant A's version 1 is not tenant B's version 1.
    assert_eq!(get(&router, "/v2/models/add_sub/versions/1", Some(B_DEPLOYER)).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn errors_name_models_without_the_namespace() {
    let (state, _dir) = tenant_state().await;
    let router = router(state);
    let reply = get(&router, "/v2/models/broken", Some(A_INFERENCE)).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    let message = reply.body["error"].as_str().expect("a message");
    assert!(message.starts_with("model 'broken' is not ready"), "{message}");
    assert!(!message.contains(TENANT_A), "{message}");
}

#[tokio::test]
async fn model_control_is_refused_whatever_the_role() {
    let (state, _dir) = tenant_state().await;
    let router = router(state);
    for path in ["/v2/repository/index", "/v2/repository/models/add_sub/load", "/v2/repository/models/add_sub/unload"] {
        for key in [None, Some(A_INFERENCE), Some(B_DEPLOYER)] {
            let reply = call(&router, Method::POST, path, key, Some(json!({}))).await;
            assert_eq!(reply.status, StatusCode::FORBIDDEN, "{path} {key:?}");
            assert_eq!(reply.body["error"], "model control is managed by the control plane");
        }
    }
}

#[tokio::test]
async fn statistics_are_for_any_key_of_the_tenant_and_show_only_its_models() {
    let (state, _dir) = tenant_state().await;
    let router = router(state);
    assert_eq!(get(&router, "/v2/models/stats", None).await.status, StatusCode::UNAUTHORIZED);

    let names = |reply: &Reply| -> Vec<(String, String)> {
        reply.body["model_stats"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|m| (m["name"].as_str().unwrap_or("").to_string(), m["version"].as_str().unwrap_or("").to_string()))
            .collect()
    };
    // An inference key reads its tenant's statistics, as perf_analyzer does with it.
    for key in [A_INFERENCE, A_VIEWER] {
        let own = get(&router, "/v2/models/stats", Some(key)).await;
        assert_eq!(names(&own), [("add_sub".to_string(), "1".to_string())]);
    }
    assert_eq!(get(&router, "/v2/models/only_b/stats", Some(A_INFERENCE)).await.status, StatusCode::NOT_FOUND);
    let other = get(&router, "/v2/models/stats", Some(B_DEPLOYER)).await;
    assert_eq!(names(&other), [("add_sub".into(), "2".into()), ("only_b".into(), "1".into())]);
    assert_eq!(get(&router, "/v2/models/only_b/stats", Some(A_VIEWER)).await.status, StatusCode::NOT_FOUND);
    let one = get(&router, "/v2/models/add_sub/versions/1/stats", Some(A_VIEWER)).await;
    assert_eq!(names(&one), [("add_sub".to_string(), "1".to_string())]);
}

#[tokio::test]
async fn log_settings_are_a_platform_admins_whatever_the_tenant_role() {
    let (state, _dir) = tenant_state().await;
    let router = router(state);
    assert_eq!(get(&router, "/v2/logging", None).await.status, StatusCode::UNAUTHORIZED);
    for key in [A_INFERENCE, A_VIEWER, B_DEPLOYER] {
        let read = get(&router, "/v2/logging", Some(key)).await;
        assert_eq!(read.status, StatusCode::FORBIDDEN, "{key}");
        let change = call(&router, Method::POST, "/v2/logging", Some(key), Some(json!({"log_info": false}))).await;
        assert_eq!(change.status, StatusCode::FORBIDDEN, "{key}");
        assert!(change.body["error"].as_str().is_some_and(|m| m.contains("platform")), "{}", change.body);
    }
}

#[tokio::test]
async fn trace_settings_are_a_platform_admins_who_names_a_tenants_model_by_its_key() {
    let (state, _dir) = tenant_state().await;
    let router = router(state);
    let tenant_model = format!("/v2/models/{TENANT_A}%2Fadd_sub/trace/setting");
    for path in ["/v2/trace/setting", "/v2/models/add_sub/trace/setting", tenant_model.as_str()] {
        assert_eq!(get(&router, path, None).await.status, StatusCode::UNAUTHORIZED, "{path}");
        for key in [A_INFERENCE, A_VIEWER, B_DEPLOYER] {
            assert_eq!(get(&router, path, Some(key)).await.status, StatusCode::FORBIDDEN, "{path} {key}");
            let change = call(&router, Method::POST, path, Some(key), Some(json!({"trace_rate": "1"}))).await;
            assert_eq!(change.status, StatusCode::FORBIDDEN, "{path} {key}");
            assert!(change.body["error"].as_str().is_some_and(|m| m.contains("platform")), "{}", change.body);
        }
    }
    let global = get(&router, "/v2/trace/setting", Some(PLATFORM_ADMIN)).await;
    assert_eq!((global.status, &global.body["trace_level"]), (StatusCode::OK, &json!(["OFF"])));
    let changed =
        call(&router, Method::POST, &tenant_model, Some(PLATFORM_ADMIN), Some(json!({"trace_rate": "3"}))).await;
    assert_eq!((changed.status, &changed.body["trace_rate"]), (StatusCode::OK, &json!("3")));
    assert_eq!(get(&router, "/v2/trace/setting", Some(PLATFORM_ADMIN)).await.body["trace_rate"], "1000");
    // The '/' unescaped, as tritonclient sends the name.
    let unescaped = get(&router, &format!("/v2/models/{TENANT_A}/add_sub/trace/setting"), Some(PLATFORM_ADMIN)).await;
    assert_eq!((unescaped.status, &unescaped.body["trace_rate"]), (StatusCode::OK, &json!("3")));
    // A model name without its tenant names no model on a worker.
    let plain = get(&router, "/v2/models/add_sub/trace/setting", Some(PLATFORM_ADMIN)).await;
    assert_eq!(plain.status, StatusCode::BAD_REQUEST);
    assert_eq!(plain.body["error"], "Request for unknown model : add_sub");
}
