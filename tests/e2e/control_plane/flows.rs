//! The registry's main flow, on Postgres and on SQLite: tenant, keys, model, versions,
//! aliases, idempotent retries, quotas.

use serde_json::json;

use super::{MIN_ONNX_BYTES, Opts, Resp, TestApp, TestDb, onnx_bytes};

async fn model_lifecycle(app: TestApp) {
    let t = app.tenant("acme").await;
    let models = "/v1/tenants/acme/models";

    let m = app.create_model(&t.deployer, "acme", "resnet").await;
    assert_eq!(m.expect(201)["latest_version"], 0);
    assert_eq!(app.create_model(&t.deployer, "acme", "resnet").await.code(), "already_exists");

    let v1 = app.upload(&t.deployer, "acme", "resnet", "?format=onnx", onnx_bytes(1000)).await;
    assert_eq!(v1.expect(201)["version"], 1);
    assert_eq!(v1.body["size_bytes"], 1000);
    assert!(v1.body["artifact_key"].as_str().unwrap().starts_with("tenants/"));
    let v2 = app.upload(&t.deployer, "acme", "resnet", "", onnx_bytes(2000)).await;
    assert_eq!(v2.expect(201)["version"], 2);

    let list = app.get(&t.viewer, &format!("{models}/resnet/versions?limit=1")).await;
    assert_eq!(list.expect(200)["versions"][0]["version"], 2);
    let cursor = list.body["next_cursor"].as_str().unwrap().to_string();
    let next = app.get(&t.viewer, &format!("{models}/resnet/versions?limit=1&cursor={cursor}")).await;
    assert_eq!(next.expect(200)["versions"][0]["version"], 1);
    assert!(next.body["next_cursor"].is_null());

    // Aliases pin versions; moving one is a rollout or rollback.
    app.set_alias(&t.deployer, "acme", "resnet", "production", 1).await.expect(200);
    let del = app.delete(&t.deployer, &format!("{models}/resnet/versions/1")).await;
    assert_eq!((del.status, del.code()), (409, "version_in_use"));
    app.set_alias(&t.deployer, "acme", "resnet", "production", 2).await.expect(200);
    let alias = app.get(&t.viewer, &format!("{models}/resnet/aliases/production")).await;
    assert_eq!(alias.expect(200)["version"], 2);
    assert_eq!(app.set_alias(&t.deployer, "acme", "resnet", "production", 9).await.status, 422);
    app.delete(&t.deployer, &format!("{models}/resnet/versions/1")).await.expect(204);
    assert_eq!(app.get(&t.viewer, &format!("{models}/resnet/versions/1")).await.status, 404);
    assert_eq!(app.stored_files(), 1);

    // Version numbers are never reused.
    let v3 = app.upload(&t.deployer, "acme", "resnet", "", onnx_bytes(100)).await;
    assert_eq!(v3.expect(201)["version"], 3);
    let aliases = app.get(&t.viewer, &format!("{models}/resnet/aliases")).await;
    assert_eq!(aliases.expect(200)["aliases"].as_array().unwrap().len(), 1);
    app.delete(&t.deployer, &format!("{models}/resnet/aliases/production")).await.expect(204);

    let page = app.get(&t.viewer, models).await;
    assert_eq!(page.expect(200)["models"][0]["latest_version"], 3);
    app.delete(&t.deployer, &format!("{models}/resnet")).await.expect(204);
    assert_eq!(app.get(&t.viewer, &format!("{models}/resnet")).await.status, 404);
    assert_eq!(app.stored_files(), 0);
}

#[tokio::test]
async fn model_lifecycle_on_postgres() {
    model_lifecycle(TestApp::spawn_with(Opts { db: Some(TestDb::postgres().await), ..Opts::default() }).await).await;
}

#[tokio::test]
async fn model_lifecycle_on_sqlite() {
    model_lifecycle(TestApp::spawn_with(Opts { db: Some(TestDb::sqlite()), ..Opts::default() }).await).await;
}

#[tokio::test]
async fn idempotent_creates_return_the_first_result() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let path = "/v1/tenants/acme/models";
    let first = app.post_idempotent(&t.deployer, path, &json!({ "name": "bert" }), "retry-1").await;
    let again = app.post_idempotent(&t.deployer, path, &json!({ "name": "bert" }), "retry-1").await;
    assert_eq!(again.expect(201)["id"], first.expect(201)["id"]);
    assert_eq!(again.headers.get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"));
    let other = app.post_idempotent(&t.deployer, path, &json!({ "name": "gpt" }), "retry-1").await;
    assert_eq!((other.status, other.body["error"]["field"].as_str()), (422, Some("Idempotency-Key")));
    // Keys are per tenant: another tenant's identical key is a different request.
    let u = app.tenant("umbrella").await;
    let body = json!({ "name": "bert" });
    app.post_idempotent(&u.deployer, "/v1/tenants/umbrella/models", &body, "retry-1").await.expect(201);

    // Uploads are idempotent too (fingerprinted by length and declared sha256, not buffered).
    let upload = |idem: &'static str| {
        let req = app
            .client
            .post(format!("{}/v1/tenants/acme/models/bert/versions", app.url))
            .bearer_auth(&t.deployer)
            .header("content-type", "application/octet-stream")
            .header("Idempotency-Key", idem)
            .body(onnx_bytes(100));
        app.raw(req)
    };
    let a = upload("up-1").await;
    let b = upload("up-1").await;
    assert_eq!(a.expect(201)["version"], 1);
    assert_eq!(b.expect(201)["version"], 1);
    assert_eq!(app.get(&t.viewer, "/v1/tenants/acme/models/bert").await.body["latest_version"], 1);
    assert_eq!(app.stored_files(), 1);
}

/// A replayed answer goes only to the credential that got it first: a weaker key reusing a
/// tenant admin's Idempotency-Key must not read the new key's secret, and a viewer's refusal
/// must not be replayed to the admin.
#[tokio::test]
async fn idempotency_replays_never_cross_credentials() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let path = "/v1/tenants/acme/api-keys";
    let body = json!({ "name": "ci", "role": "deployer" });
    let replayed = |r: &Resp| r.headers.get("idempotent-replayed").is_some();

    let first = app.post_idempotent(&t.admin, path, &body, "K").await;
    let secret = first.expect(201)["key"].as_str().expect("key").to_string();
    for weaker in [&t.deployer, &t.viewer, &t.inference] {
        let r = app.post_idempotent(weaker, path, &body, "K").await;
        assert_eq!((r.status, replayed(&r)), (403, false), "{:?}", r.body);
        assert!(!r.body.to_string().contains(&secret), "a weaker key read the secret");
    }
    let weaker_token = app.token(&t.viewer).await.expect(200)["access_token"].as_str().expect("token").to_string();
    let r = app.post_idempotent(&weaker_token, path, &body, "K").await;
    assert_eq!((r.status, replayed(&r)), (403, false));
    // Another admin key is another caller: its request runs and makes its own key.
    let admin2 = app.create_key(&t.admin, "acme", "tenant-admin").await;
    let other = app.post_idempotent(&admin2, path, &body, "K").await;
    assert!(!replayed(&other));
    assert_ne!(other.expect(201)["key"], first.body["key"]);
    // The same caller retrying gets its own first answer back.
    let again = app.post_idempotent(&t.admin, path, &body, "K").await;
    assert_eq!((again.expect(201)["key"].as_str(), replayed(&again)), (Some(secret.as_str()), true));

    // The reverse: a viewer's refusal is not stored, so the admin's identical request runs.
    let r = app.post_idempotent(&t.viewer, path, &body, "K2").await;
    assert_eq!(r.status, 403);
    let r = app.post_idempotent(&t.viewer, path, &body, "K2").await;
    assert_eq!((r.status, replayed(&r)), (403, false));
    let admin = app.post_idempotent(&t.admin, path, &body, "K2").await;
    assert_eq!((admin.status, replayed(&admin)), (201, false), "{:?}", admin.body);
}

#[tokio::test]
async fn quotas_are_enforced_and_reported() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let limits = json!({
        "models": 1, "versions": 2, "storage_bytes": 1500, "replicas": 2,
        "requests_per_second": 10, "concurrent_requests": 3, "monthly_spend_cents": 500, "slices": { "cpu": 2, "mig-1g.10gb": 1 }
    });
    let set = app.put(&app.admin_key, "/v1/tenants/acme/quotas", &limits).await;
    assert_eq!(set.expect(200)["limits"], limits);
    assert_eq!(app.put(&t.admin, "/v1/tenants/acme/quotas", &limits).await.status, 403);

    app.create_model(&t.deployer, "acme", "a").await.expect(201);
    let over = app.create_model(&t.deployer, "acme", "b").await;
    assert_eq!((over.status, over.code()), (409, "quota_exceeded.models"));

    app.upload(&t.deployer, "acme", "a", "", onnx_bytes(1000)).await.expect(201);
    let big = app.upload(&t.deployer, "acme", "a", "", onnx_bytes(501)).await;
    assert_eq!((big.status, big.code()), (409, "quota_exceeded.storage_bytes"));
    app.upload(&t.deployer, "acme", "a", "", onnx_bytes(449)).await.expect(201);
    let third = app.upload(&t.deployer, "acme", "a", "", onnx_bytes(MIN_ONNX_BYTES)).await;
    assert_eq!((third.status, third.code()), (409, "quota_exceeded.versions"));
    assert_eq!(app.stored_files(), 2, "refused uploads leave nothing behind");

    let q = app.get(&t.viewer, "/v1/tenants/acme/quotas").await;
    assert_eq!(q.expect(200)["usage"], json!({ "models": 1, "versions": 2, "storage_bytes": 1449, "replicas": 0 }));
    let bad = app.put(&app.admin_key, "/v1/tenants/acme/quotas", &json!({ "models": -1 })).await;
    assert_eq!(bad.status, 422);
}

/// Every item of a list, read `limit` at a time through `next_cursor`, with the page count.
async fn walk(app: &TestApp, key: &str, path: &str, field: &str, limit: usize) -> (Vec<serde_json::Value>, usize) {
    let (mut items, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
    loop {
        let sep = if path.contains('?') { '&' } else { '?' };
        let url = match &cursor {
            Some(c) => format!("{path}{sep}limit={limit}&cursor={c}"),
            None => format!("{path}{sep}limit={limit}"),
        };
        let page = app.get(key, &url).await;
        let body = page.expect(200);
        let got = body[field].as_array().unwrap_or_else(|| panic!("{path}: no {field}: {body}"));
        assert!(got.len() <= limit, "{path}: page of {} over {limit}", got.len());
        items.extend(got.iter().cloned());
        pages += 1;
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return (items, pages),
        }
    }
}

#[tokio::test]
async fn every_list_pages_with_cursors() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    for name in ["b", "c"] {
        app.create_tenant(name).await.expect(201);
    }
    let names = |items: &[serde_json::Value], field: &str| -> Vec<String> {
        items.iter().map(|i| i[field].as_str().unwrap_or_default().to_string()).collect()
    };
    let (tenants, pages) = walk(&app, &app.admin_key, "/v1/tenants", "tenants", 2).await;
    assert_eq!((names(&tenants, "name"), pages), (vec!["acme".into(), "b".into(), "c".into(), "platform".into()], 2));

    // Keys oldest first: the four `tenant` made, then two more.
    for name in ["e", "f"] {
        app.post(&t.admin, "/v1/tenants/acme/api-keys", &json!({ "name": name, "role": "viewer" })).await.expect(201);
    }
    let (keys, pages) = walk(&app, &t.admin, "/v1/tenants/acme/api-keys", "api_keys", 4).await;
    assert_eq!(names(&keys, "name"), ["tenant-admin", "deployer", "viewer", "inference", "e", "f"]);
    assert_eq!(pages, 2);
    for email in ["u1@example.com", "u2@example.com", "u3@example.com"] {
        let user = json!({ "email": email, "name": email, "role": "viewer" });
        app.post(&t.admin, "/v1/tenants/acme/users", &user).await.expect(201);
    }
    let (users, _) = walk(&app, &t.admin, "/v1/tenants/acme/users", "users", 1).await;
    assert_eq!(names(&users, "email"), ["u1@example.com", "u2@example.com", "u3@example.com"]);

    // Deployments by name, aliases by name.
    for m in ["m3", "m1", "m2"] {
        app.create_model(&t.deployer, "acme", m).await.expect(201);
        app.upload(&t.deployer, "acme", m, "", onnx_bytes(1000)).await.expect(201);
        let d = json!({ "name": m, "model": m, "replicas": 0 });
        app.post(&t.deployer, "/v1/tenants/acme/deployments", &d).await.expect(201);
    }
    for alias in ["a-m3", "a-m1", "a-m2"] {
        app.set_alias(&t.deployer, "acme", "m1", alias, 1).await.expect(200);
    }
    let (deployments, pages) = walk(&app, &t.viewer, "/v1/tenants/acme/deployments", "deployments", 2).await;
    assert_eq!((names(&deployments, "name"), pages), (vec!["m1".into(), "m2".into(), "m3".into()], 2));
    let (aliases, _) = walk(&app, &t.viewer, "/v1/tenants/acme/models/m1/aliases", "aliases", 2).await;
    assert_eq!(names(&aliases, "alias"), ["a-m1", "a-m2", "a-m3"]);

    // Events: the latest page first, oldest first within a page, older pages after.
    for replicas in [1, 0, 1, 0] {
        let scale = json!({ "replicas": replicas });
        let req = app.client.patch(format!("{}/v1/tenants/acme/deployments/m1", app.url)).bearer_auth(&t.deployer);
        app.raw(req.json(&scale)).await.expect(200);
    }
    let path = "/v1/tenants/acme/deployments/m1/events";
    let (paged, pages) = walk(&app, &t.viewer, path, "events", 2).await;
    assert!(pages >= 3, "{paged:?}");
    // Pages are full but the last, so pages of two, newest page first, put back in order.
    let mut in_order: Vec<serde_json::Value> = Vec::new();
    for chunk in paged.chunks(2).rev() {
        in_order.extend(chunk.iter().cloned());
    }
    // The scheduler may have added events since: what was walked is where the list starts.
    let all = app.get(&t.viewer, path).await.expect(200)["events"].as_array().unwrap().clone();
    assert!(all.starts_with(&in_order), "{in_order:?} vs {all:?}");
    assert_eq!(all[0]["kind"], "created");

    // A cursor is good only for its own list; a bad limit names itself.
    let cursor = app.get(&t.viewer, "/v1/tenants/acme/deployments?limit=1").await.expect(200)["next_cursor"].clone();
    let wrong = app.get(&t.admin, &format!("/v1/tenants/acme/users?cursor={}", cursor.as_str().unwrap())).await;
    assert_eq!((wrong.status, wrong.body["error"]["field"].as_str()), (400, Some("cursor")));
    let r = app.get(&t.admin, "/v1/tenants/acme/api-keys?limit=0").await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("limit")));
}
