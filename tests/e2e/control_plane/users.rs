//! Users: tenant admins create, list, read and disable them; keys belong to users and are
//! capped by their role; the audit trail names the acting key and its user; disabling a user
//! revokes their keys at once.

use serde_json::{Value, json};

use super::TestApp;

async fn create_user(app: &TestApp, by: &str, tenant: &str, email: &str, role: &str) -> super::Resp {
    let body = json!({ "email": email, "name": "Ada Lovelace", "role": role });
    app.post(by, &format!("/v1/tenants/{tenant}/users"), &body).await
}

async fn create_user_key(app: &TestApp, by: &str, tenant: &str, user_id: &str, role: &str) -> super::Resp {
    let body = json!({ "name": "laptop", "role": role, "user_id": user_id });
    app.post(by, &format!("/v1/tenants/{tenant}/api-keys"), &body).await
}

#[tokio::test]
async fn users_own_keys_and_disabling_revokes_them() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let r = create_user(&app, &t.admin, "acme", "Ada@Example.com", "deployer").await;
    let user = r.expect(201).clone();
    let user_id = user["id"].as_str().unwrap().to_string();
    assert_eq!(
        (user["email"].as_str(), user["role"].as_str(), &user["disabled"]),
        (Some("ada@example.com"), Some("deployer"), &json!(false))
    );

    let dup = create_user(&app, &t.admin, "acme", "ada@example.com", "viewer").await;
    assert_eq!((dup.status, dup.code()), (409, "already_exists"));
    let bad = create_user(&app, &t.admin, "acme", "not-an-email", "viewer").await;
    assert_eq!((bad.status, bad.body["error"]["field"].as_str()), (422, Some("email")));
    let bad = create_user(&app, &t.admin, "acme", "b@example.com", "platform-admin").await;
    assert_eq!((bad.status, bad.body["error"]["field"].as_str()), (422, Some("role")));

    // A user's key may not exceed the user's role.
    let r = create_user_key(&app, &t.admin, "acme", &user_id, "tenant-admin").await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("role")));
    let r = create_user_key(&app, &t.admin, "acme", "00000000-0000-0000-0000-000000000000", "viewer").await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("user_id")));
    let created = create_user_key(&app, &t.admin, "acme", &user_id, "deployer").await;
    let created = created.expect(201).clone();
    let key = created["key"].as_str().unwrap().to_string();
    let key_id = created["api_key"]["id"].as_str().unwrap().to_string();
    assert_eq!(created["api_key"]["user_id"].as_str(), Some(user_id.as_str()));

    // Changes through the user's key, or a token for it, name the key and the user.
    app.create_model(&key, "acme", "by-key").await.expect(201);
    let token = app.token(&key).await.expect(200)["access_token"].as_str().unwrap().to_string();
    app.create_model(&token, "acme", "by-token").await.expect(201);
    let events = app.get(&t.admin, &format!("/v1/audit?actor_user_id={user_id}")).await;
    let events = events.expect(200)["events"].as_array().unwrap().clone();
    assert_eq!(events.len(), 2);
    for e in &events {
        assert_eq!(
            (e["actor_key_id"].as_str(), e["actor_user_id"].as_str()),
            (Some(key_id.as_str()), Some(user_id.as_str()))
        );
        // The console shows people by name: the key's label and its user's email.
        assert_eq!(
            (e["actor_key_name"].as_str(), e["actor_user_email"].as_str()),
            (Some("laptop"), Some("ada@example.com"))
        );
    }
    // Service keys have no user.
    let service = app.get(&t.admin, "/v1/audit?action=user.create").await;
    let service = &service.expect(200)["events"][0];
    assert_eq!(service["actor_user_id"], Value::Null);
    assert_eq!(service["actor_user_email"], Value::Null);
    assert!(service["actor_key_name"].as_str().is_some_and(|n| !n.is_empty()), "a service key is named: {service}");

    let list = app.get(&t.admin, "/v1/tenants/acme/users").await;
    assert_eq!(list.expect(200)["users"].as_array().unwrap().len(), 1);
    app.get(&t.admin, &format!("/v1/tenants/acme/users/{user_id}")).await.expect(200);

    // Disabling revokes the user's keys at once; their other data stays.
    let r = app.delete(&t.admin, &format!("/v1/tenants/acme/users/{user_id}")).await;
    assert_eq!((&r.expect(200)["keys_revoked"], &r.body["user"]["disabled"]), (&json!(1), &json!(true)));
    assert_eq!(app.get(&key, "/v1/tenants/acme/models").await.status, 401);
    let k = app.get(&t.admin, &format!("/v1/tenants/acme/api-keys/{key_id}")).await;
    assert!(k.expect(200)["revoked_at"].is_string());
    let r = create_user_key(&app, &t.admin, "acme", &user_id, "viewer").await;
    assert_eq!((r.status, r.code()), (409, "user_disabled"));
    let again = app.delete(&t.admin, &format!("/v1/tenants/acme/users/{user_id}")).await;
    assert_eq!(again.expect(200)["keys_revoked"], json!(0));
    let audit = app.get(&t.admin, "/v1/audit?action=user.disable").await;
    assert_eq!(audit.expect(200)["events"][0]["after"]["keys_revoked"], json!(1));
    app.get(&t.admin, "/v1/audit/verify").await.expect(200);
}

#[tokio::test]
async fn only_tenant_admins_manage_users() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    for key in [&t.deployer, &t.viewer, &t.inference] {
        assert_eq!(create_user(&app, key, "acme", "x@example.com", "viewer").await.status, 403);
        assert_eq!(app.get(key, "/v1/tenants/acme/users").await.status, 403);
    }
    // Platform admins manage users in any tenant.
    let r = create_user(&app, &app.admin_key, "acme", "ops@example.com", "tenant-admin").await;
    let id = r.expect(201)["id"].as_str().unwrap().to_string();
    app.get(&app.admin_key, &format!("/v1/tenants/acme/users/{id}")).await.expect(200);
    assert_eq!(app.get(&t.admin, "/v1/tenants/acme/users/not-a-uuid").await.status, 404);
}
