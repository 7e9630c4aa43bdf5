//! `GET /v1/whoami` answers every authenticated caller (an `inference` key and an access token
//! included) with its tenant, role, key and user; an alias remembers the version it left, so a
//! rollback is one move any deployer can make.

use serde_json::json;

use super::{TestApp, onnx_bytes};

#[tokio::test]
async fn whoami_names_the_tenant_role_key_and_user() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;

    let me = app.get(&t.inference, "/v1/whoami").await;
    let me = me.expect(200).clone();
    assert_eq!((me["tenant"].as_str(), me["role"].as_str()), (Some("acme"), Some("inference")));
    assert_eq!((me["key_name"].as_str(), me["credential"].as_str()), (Some("inference"), Some("api-key")));
    assert!(me["key_prefix"].as_str().is_some_and(|p| t.inference.starts_with(p)), "{me}");
    assert!(me["user"].is_null(), "a service key has no user: {me}");

    let ana = json!({ "email": "ana@example.com", "name": "Ana", "role": "deployer" });
    let user = app.post(&t.admin, "/v1/tenants/acme/users", &ana).await;
    let user_id = user.expect(201)["id"].as_str().expect("an id").to_string();
    let body = json!({ "name": "laptop", "role": "deployer", "user_id": user_id });
    let key = app.post(&t.admin, "/v1/tenants/acme/api-keys", &body).await.expect(201)["key"].clone();
    let token = app.token(key.as_str().expect("a key")).await.expect(200)["access_token"].clone();
    let me = app.get(token.as_str().expect("a token"), "/v1/whoami").await.expect(200).clone();
    assert_eq!((me["role"].as_str(), me["credential"].as_str()), (Some("deployer"), Some("token")));
    assert_eq!((me["user"]["email"].as_str(), me["key_name"].as_str()), (Some("ana@example.com"), Some("laptop")));

    assert_eq!(app.get("tsk_not_a_key", "/v1/whoami").await.status, 401);
}

#[tokio::test]
async fn an_alias_remembers_the_version_it_left() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    app.create_model(&t.deployer, "acme", "resnet").await.expect(201);
    for size in [100, 200] {
        app.upload(&t.deployer, "acme", "resnet", "", onnx_bytes(size)).await.expect(201);
    }
    let first = app.set_alias(&t.deployer, "acme", "resnet", "production", 1).await;
    assert!(first.expect(200)["previous_version"].is_null());
    let moved = app.set_alias(&t.deployer, "acme", "resnet", "production", 2).await;
    assert_eq!(moved.expect(200)["previous_version"], 1);
    // Rolling back is moving to `previous_version`, which then points forward again.
    let back = app.set_alias(&t.deployer, "acme", "resnet", "production", 1).await;
    assert_eq!((back.expect(200)["version"].as_i64(), back.body["previous_version"].as_i64()), (Some(1), Some(2)));
    let listed = app.get(&t.viewer, "/v1/tenants/acme/models/resnet/aliases").await;
    assert_eq!(listed.expect(200)["aliases"][0]["previous_version"], 2);
}
