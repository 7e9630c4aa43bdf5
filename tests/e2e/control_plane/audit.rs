//! The audit trail: every change recorded with who, what, before/after, request id and
//! client address; filters and cursor pagination; the chain verifies, and tampering is found.

use serde_json::json;

use super::{TestApp, onnx_bytes};

#[tokio::test]
async fn changes_are_audited_filtered_paged_and_verified() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    app.create_model(&t.deployer, "acme", "m").await.expect(201);
    app.upload(&t.deployer, "acme", "m", "", onnx_bytes(100)).await.expect(201);
    let req = app
        .client
        .put(format!("{}/v1/tenants/acme/models/m/aliases/production", app.url))
        .bearer_auth(&t.deployer)
        .header("x-request-id", "rollout-42")
        .json(&json!({ "version": 1 }));
    app.raw(req).await.expect(200);

    let all = app.get(&t.admin, "/v1/audit").await;
    let events = all.expect(200)["events"].as_array().unwrap().clone();
    let actions: Vec<_> = events.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(
        actions,
        [
            "alias.set",
            "version.create",
            "model.create",
            "api_key.create",
            "api_key.create",
            "api_key.create",
            "api_key.create",
            "tenant.create"
        ]
    );
    let alias = &events[0];
    assert_eq!(alias["request_id"], "rollout-42");
    assert_eq!(alias["after"], json!({ "version": 1 }));
    assert!(alias["client_addr"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert!(alias["actor_key_id"].is_string());
    assert_eq!(alias["prev_hash"], events[1]["hash"]);

    let filtered = app.get(&t.admin, "/v1/audit?resource_type=model&action=model.create").await;
    assert_eq!(filtered.expect(200)["events"].as_array().unwrap().len(), 1);
    let page1 = app.get(&t.admin, "/v1/audit?limit=3").await;
    let cursor = page1.expect(200)["next_cursor"].as_str().unwrap().to_string();
    let page2 = app.get(&t.admin, &format!("/v1/audit?limit=3&cursor={cursor}")).await;
    assert_eq!(page2.expect(200)["events"][0]["seq"].as_i64(), Some(5));

    let ok = app.get(&t.admin, "/v1/audit/verify").await;
    assert_eq!(ok.expect(200)["ok"], true);
    assert_eq!(ok.body["events_checked"], 8);

    // Tamper with event 3 straight in the database: the verifier names it.
    let sql = "UPDATE audit_events SET after_state = '{\"role\":\"tenant-admin\"}' WHERE seq = 3 AND resource_type = 'api_key'";
    assert_eq!(app.db.execute(sql).await, 1);
    let broken = app.get(&app.admin_key, "/v1/audit/verify?tenant=acme").await;
    let body = broken.expect(200);
    assert_eq!(body["ok"], false);
    assert_eq!(body["first_break"]["seq"], 3);
    assert_eq!(body["first_break"]["reason"], "event content does not match its hash");
    assert_eq!(body["events_checked"], 2);

    let platform = app.get(&app.admin_key, "/v1/audit/verify").await;
    assert_eq!(platform.expect(200)["ok"], true, "other tenants' chains are untouched");
}
