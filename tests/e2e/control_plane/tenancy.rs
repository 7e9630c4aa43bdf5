//! Tenant isolation and roles: another tenant's resources are 404 on every tenant-scoped
//! route; a role that may not act is 403.

use reqwest::Method;
use serde_json::{Value, json};

use super::{TestApp, onnx_bytes};

fn quota_body() -> Value {
    json!({
        "models": 1000, "versions": 1000, "storage_bytes": 1, "replicas": 1,
        "requests_per_second": 1, "monthly_spend_cents": 1, "slices": {}
    })
}

/// Every tenant-scoped route, with a body where it takes one.
fn scoped_routes(tenant: &str, key_id: &str, user_id: &str, hook_id: &str) -> Vec<(Method, String, Option<Value>)> {
    let t = format!("/v1/tenants/{tenant}");
    let m = format!("{t}/models/resnet");
    let w = format!("{t}/webhooks/{hook_id}");
    vec![
        (Method::GET, t.clone(), None),
        (Method::GET, format!("{t}/quotas"), None),
        (Method::PUT, format!("{t}/quotas"), Some(quota_body())),
        (Method::GET, format!("{t}/api-keys"), None),
        (Method::POST, format!("{t}/api-keys"), Some(json!({ "name": "x", "role": "viewer" }))),
        (Method::GET, format!("{t}/api-keys/{key_id}"), None),
        (Method::PATCH, format!("{t}/api-keys/{key_id}"), Some(json!({ "limits": { "requests_per_second": 1 } }))),
        (Method::DELETE, format!("{t}/api-keys/{key_id}"), None),
        (Method::GET, format!("{t}/users"), None),
        (Method::POST, format!("{t}/users"), Some(json!({ "email": "x@example.com", "name": "x", "role": "viewer" }))),
        (Method::GET, format!("{t}/users/{user_id}"), None),
        (Method::DELETE, format!("{t}/users/{user_id}"), None),
        (Method::GET, format!("{t}/models"), None),
        (Method::POST, format!("{t}/models"), Some(json!({ "name": "stolen" }))),
        (Method::GET, m.clone(), None),
        (Method::DELETE, m.clone(), None),
        (Method::GET, format!("{m}/versions"), None),
        (Method::POST, format!("{m}/versions"), None),
        (Method::GET, format!("{m}/versions/1"), None),
        (Method::DELETE, format!("{m}/versions/1"), None),
        (Method::POST, format!("{m}/uploads"), Some(json!({ "format": "onnx" }))),
        (
            Method::POST,
            format!("{m}/uploads/00000000-0000-0000-0000-000000000000/complete"),
            Some(json!({ "sha256": "0".repeat(64) })),
        ),
        (Method::GET, format!("{m}/aliases"), None),
        (Method::GET, format!("{m}/aliases/production"), None),
        (Method::PUT, format!("{m}/aliases/production"), Some(json!({ "version": 1 }))),
        (Method::DELETE, format!("{m}/aliases/production"), None),
        (Method::GET, format!("{t}/webhooks"), None),
        (Method::POST, format!("{t}/webhooks"), Some(json!({ "url": "https://127.0.0.1/h", "events": ["ping"] }))),
        (Method::GET, w.clone(), None),
        (Method::PATCH, w.clone(), Some(json!({ "enabled": false }))),
        (Method::DELETE, w.clone(), None),
        (Method::POST, format!("{w}/rotate-secret"), Some(json!({}))),
        (Method::POST, format!("{w}/ping"), Some(json!({}))),
        (Method::GET, format!("{w}/deliveries"), None),
        (Method::GET, format!("{w}/deliveries/{hook_id}"), None),
        (Method::POST, format!("{w}/deliveries/{hook_id}/replay"), Some(json!({}))),
        (Method::GET, format!("{t}/webhook-settings"), None),
        (Method::GET, format!("/v1/audit?tenant={tenant}"), None),
        (Method::GET, format!("/v1/audit/verify?tenant={tenant}"), None),
    ]
}

async fn call(app: &TestApp, key: &str, method: Method, path: &str, body: Option<&Value>) -> super::Resp {
    let mut req = app.client.request(method, format!("{}{path}", app.url)).bearer_auth(key);
    req = match body {
        Some(b) => req.json(b),
        None => req.header("content-type", "application/octet-stream").body(onnx_bytes(100)),
    };
    app.raw(req).await
}

#[tokio::test]
async fn other_tenants_get_404_on_every_scoped_route() {
    let app = TestApp::spawn().await;
    let a = app.tenant("acme").await;
    let b = app.tenant("umbrella").await;
    app.create_model(&a.deployer, "acme", "resnet").await.expect(201);
    app.upload(&a.deployer, "acme", "resnet", "", onnx_bytes(100)).await.expect(201);
    app.set_alias(&a.deployer, "acme", "resnet", "production", 1).await.expect(200);
    let keys = app.get(&a.admin, "/v1/tenants/acme/api-keys").await;
    let key_id = keys.expect(200)["api_keys"][0]["id"].as_str().unwrap().to_string();
    let user = json!({ "email": "ada@example.com", "name": "Ada", "role": "deployer" });
    let user = app.post(&a.admin, "/v1/tenants/acme/users", &user).await;
    let user_id = user.expect(201)["id"].as_str().unwrap().to_string();
    let allow = json!({ "allow_private_targets": true });
    app.put(&app.admin_key, "/v1/tenants/acme/webhook-settings", &allow).await.expect(200);
    let hook = json!({ "url": "https://127.0.0.1:9/hook", "events": ["alias.moved"] });
    let hook = app.post(&a.admin, "/v1/tenants/acme/webhooks", &hook).await;
    let hook_id = hook.expect(201)["webhook"]["id"].as_str().unwrap().to_string();

    for probe in [&b.admin, &b.deployer, &b.viewer, &b.inference] {
        for (method, path, body) in scoped_routes("acme", &key_id, &user_id, &hook_id) {
            let r = call(&app, probe, method.clone(), &path, body.as_ref()).await;
            assert_eq!((r.status, r.code()), (404, "not_found"), "{method} {path} answered {:?}", r.body);
        }
    }
    // Nothing changed in acme, and a tenant that does not exist looks the same.
    app.get(&a.viewer, "/v1/tenants/acme/models/resnet/aliases/production").await.expect(200);
    let user = app.get(&a.admin, &format!("/v1/tenants/acme/users/{user_id}")).await;
    assert_eq!(user.expect(200)["disabled"], json!(false));
    let hook = app.get(&a.viewer, &format!("/v1/tenants/acme/webhooks/{hook_id}")).await;
    assert_eq!(hook.expect(200)["enabled"], json!(true));
    assert_eq!(app.get(&b.admin, "/v1/tenants/nope/models").await.status, 404);
    let audit = app.get(&a.admin, "/v1/audit").await;
    assert!(audit.expect(200)["events"].as_array().unwrap().iter().all(|e| e["action"] != "model.delete"));
}

#[tokio::test]
async fn roles_decide_what_a_key_may_do() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    app.create_model(&t.deployer, "acme", "resnet").await.expect(201);

    // Viewer reads, may not write.
    app.get(&t.viewer, "/v1/tenants/acme/models").await.expect(200);
    app.get(&t.viewer, "/v1/tenants/acme/quotas").await.expect(200);
    let r = app.create_model(&t.viewer, "acme", "x").await;
    assert_eq!((r.status, r.code()), (403, "permission_denied"));
    assert_eq!(app.upload(&t.viewer, "acme", "resnet", "", onnx_bytes(100)).await.status, 403);
    assert_eq!(app.set_alias(&t.viewer, "acme", "resnet", "p", 1).await.status, 403);
    assert_eq!(app.get(&t.viewer, "/v1/tenants/acme/api-keys").await.status, 403);
    assert_eq!(app.get(&t.viewer, "/v1/audit").await.status, 403);

    // Inference keys only get tokens.
    assert_eq!(app.get(&t.inference, "/v1/tenants/acme/models").await.status, 403);
    app.token(&t.inference).await.expect(200);

    // Deployers manage models, not keys or tenants.
    app.upload(&t.deployer, "acme", "resnet", "", onnx_bytes(100)).await.expect(201);
    let r = app.post(&t.deployer, "/v1/tenants/acme/api-keys", &json!({ "name": "x", "role": "viewer" })).await;
    assert_eq!(r.status, 403);

    // Tenant admins manage keys, not tenants or quotas, and cannot mint platform admins.
    app.get(&t.admin, "/v1/tenants/acme/api-keys").await.expect(200);
    assert_eq!(app.create_tenant("x").await.status, 201);
    assert_eq!(app.post(&t.admin, "/v1/tenants", &json!({ "name": "y" })).await.status, 403);
    assert_eq!(app.get(&t.admin, "/v1/tenants").await.status, 403);
    let r = app.post(&t.admin, "/v1/tenants/acme/api-keys", &json!({ "name": "x", "role": "platform-admin" })).await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("role")));
    assert_eq!(app.post(&t.admin, "/v1/auth/signing-keys/rotate", &json!({})).await.status, 403);

    // Platform admins reach every tenant.
    app.get(&app.admin_key, "/v1/tenants/acme/models/resnet").await.expect(200);
    let tenants = app.get(&app.admin_key, "/v1/tenants").await;
    let names: Vec<_> = tenants.expect(200)["tenants"].as_array().unwrap().iter().map(|t| t["name"].clone()).collect();
    assert_eq!(names, vec![json!("acme"), json!("platform"), json!("x")]);
}

#[tokio::test]
async fn errors_have_one_shape() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let url = |p: &str| format!("{}{p}", app.url);

    let r = app.get("", "/v1/tenants/acme/models").await;
    assert_eq!((r.status, r.code()), (401, "unauthenticated"));
    assert_eq!(r.headers.get("www-authenticate").map(|v| v.to_str().unwrap()), Some("Bearer"));
    for bad in ["Bearer nonsense", "Basic abc", "Bearer tsk_aaaaaaaaaaaa_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"] {
        let r = app.raw(app.client.get(url("/v1/tenants/acme/models")).header("authorization", bad)).await;
        assert_eq!(r.status, 401, "{bad}");
    }

    let r = app.post(&t.deployer, "/v1/tenants/acme/models", &json!({ "name": "Not Valid" })).await;
    assert_eq!((r.status, r.code(), r.body["error"]["field"].as_str()), (422, "invalid_argument", Some("name")));
    let r = app.post(&t.deployer, "/v1/tenants/acme/models", &json!({})).await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("name")));
    let raw = app.client.post(url("/v1/tenants/acme/models")).bearer_auth(&t.deployer);
    let r = app.raw(raw.header("content-type", "application/json").body("{not json")).await;
    assert_eq!((r.status, r.code()), (400, "bad_request"));
    let r = app.get(&t.viewer, "/v1/tenants/acme/models?limit=0").await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("limit")));
    let r = app.get(&t.viewer, "/v1/nothing-here").await;
    assert_eq!((r.status, r.code()), (404, "not_found"));
    let r = app.create_tenant("acme").await;
    assert_eq!((r.status, r.code()), (409, "already_exists"));
    assert!(r.headers.contains_key("x-request-id"));
    let r = app.raw(app.client.get(url("/healthz")).header("x-request-id", "trace-me")).await;
    assert_eq!(r.headers.get("x-request-id").map(|v| v.to_str().unwrap()), Some("trace-me"));

    // Public routes ignore credentials, even bad ones.
    app.raw(app.client.get(url("/.well-known/jwks.json")).bearer_auth("junk")).await.expect(200);
    // Text Postgres cannot store is refused up front, not a 500.
    let r = app.post(&t.deployer, "/v1/tenants/acme/models", &json!({ "name": "m", "description": "a\u{0}b" })).await;
    assert_eq!(r.status, 422);
    assert_eq!(app.get(&t.admin, "/v1/audit?action=%00").await.status, 422);
    assert_eq!(app.get(&t.viewer, "/v1/tenants/acme/models/%00").await.status, 404);
}

/// `/healthz` is liveness; `/readyz` answers 200 while the registry answers and 503, saying
/// why, while it does not (its database refuses connections), and recovers with it.
#[tokio::test]
async fn readiness_follows_the_registry() {
    use sqlx::Connection;

    let app =
        TestApp::spawn_with(super::Opts { db: Some(super::TestDb::postgres().await), ..Default::default() }).await;
    let readyz = || app.raw(app.client.get(format!("{}/readyz", app.url)));
    assert_eq!(readyz().await.expect(200), &json!({ "status": "ready" }));
    let (admin, name) = app.db.postgres.clone().expect("a Postgres test database");
    let mut c = sqlx::PgConnection::connect(&admin).await.expect("connect as the admin");
    let run = |sql: String| sqlx::raw_sql(sqlx::AssertSqlSafe(sql));
    run(format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false")).execute(&mut c).await.expect("refuse connections");
    run(format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        .execute(&mut c)
        .await
        .expect("end the server's connections");
    let r = readyz().await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(
        (r.body["status"].as_str(), r.body["reason"].as_str()),
        (Some("unavailable"), Some("the registry database does not answer"))
    );
    let health = app.raw(app.client.get(format!("{}/healthz", app.url))).await;
    assert_eq!(health.expect(200), &json!({ "status": "ok" }), "still alive");
    run(format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true")).execute(&mut c).await.expect("allow connections");
    assert_eq!(readyz().await.expect(200), &json!({ "status": "ready" }));
}

#[test]
fn an_unreachable_database_is_a_clear_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["control-plane", "--listen", "127.0.0.1:0", "--database-wait-secs", "1"])
        .args(["--database-url", "postgres://nobody:secret@127.0.0.1:1/registry"])
        .output()
        .expect("run tessera");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("waiting for the database"), "{stderr}");
    assert!(stderr.contains("connect to the database at postgres://nobody:***@127.0.0.1:1/registry"), "{stderr}");
    assert!(!stderr.contains("secret"), "the password is not shown");
}
