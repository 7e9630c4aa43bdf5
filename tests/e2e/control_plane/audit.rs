//! The audit trail: every change recorded with who, what, before/after, request id and
//! client address; filters and cursor pagination; the chain verifies, and tampering is found.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use tessera_control_plane::audit_checkpoints::CheckpointKey;
use tessera_control_plane::registry::AuditEventRow;

use super::{Opts, TestApp, TestDb, onnx_bytes};

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
    assert!(ok.body["checkpoints"].is_null(), "no signing key, no checkpoints");
    assert_eq!(app.get(&t.admin, "/v1/audit/checkpoints/key").await.status, 404);

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

/// A control plane on Postgres that signs audit checkpoints every second, and its key file's
/// directory.
async fn spawn_signing() -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = dir.path().join("audit-signing-key.pem");
    std::fs::write(&key, CheckpointKey::generate().to_pem().expect("pem")).expect("write the key");
    let key = key.display().to_string();
    let args = ["--audit-signing-key-file", key.as_str(), "--audit-checkpoint-secs", "1"];
    let app = TestApp::spawn_with(Opts { db: Some(TestDb::postgres().await), args: &args, ..Opts::default() }).await;
    (app, dir)
}

/// Verifies `tenant`'s chain once a checkpoint covers its whole chain; returns the answer.
async fn verified_and_checkpointed(app: &TestApp, tenant: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = app.get(&app.admin_key, &format!("/v1/audit/verify?tenant={tenant}")).await;
        let body = r.expect(200).clone();
        let c = &body["checkpoints"];
        if c["latest"]["seq"] == body["events_checked"] && c["events_after_checkpoint"] == 0 {
            assert_eq!(body["ok"], true, "{body}");
            return body;
        }
        assert!(Instant::now() < deadline, "no checkpoint covered the chain: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn verify(app: &TestApp, tenant: &str) -> Value {
    app.get(&app.admin_key, &format!("/v1/audit/verify?tenant={tenant}")).await.expect(200).clone()
}

/// `WHERE` of one event of a tenant, by sequence number.
fn event_of(tenant: &str, seq: i64) -> String {
    format!("tenant_id = (SELECT id FROM tenants WHERE name = '{tenant}') AND seq = {seq}")
}

/// Moves a tenant's recorded head to `(seq, hash)`, as an attacker covering their tracks would.
async fn move_head(app: &TestApp, tenant: &str, seq: i64, hash: &str) {
    let sql = format!(
        "UPDATE audit_heads SET seq = {seq}, hash = '{hash}' WHERE tenant_id = (SELECT id FROM tenants WHERE name = '{tenant}')"
    );
    assert_eq!(app.db.execute(&sql).await, 1);
}

/// Appends a correctly hashed event after `chain`'s last one (a copy of it with a forged
/// `after` and a new id), moving the head: what someone who can write the database and knows
/// the hash rule can do.
async fn append_forged(app: &TestApp, tenant: &str, chain: &[AuditEventRow]) {
    let last = chain.last().expect("a chain");
    let mut forged = AuditEventRow {
        id: uuid::Uuid::new_v4(),
        seq: last.seq + 1,
        after_state: Some(r#"{"role":"platform-admin"}"#.into()),
        prev_hash: last.hash.clone(),
        ..last.clone()
    };
    forged.hash = forged.compute_hash();
    let sql = format!(
        "INSERT INTO audit_events (id, tenant_id, seq, actor_key_id, actor_user_id, action, resource_type, resource_id, \
         before_state, after_state, request_id, client_addr, created_at, prev_hash, hash) \
         SELECT '{}', tenant_id, {}, actor_key_id, actor_user_id, action, resource_type, resource_id, before_state, \
         '{}', request_id, client_addr, created_at, '{}', '{}' FROM audit_events WHERE {}",
        forged.id,
        forged.seq,
        forged.after_state.as_deref().unwrap_or_default(),
        forged.prev_hash,
        forged.hash,
        event_of(tenant, last.seq)
    );
    assert_eq!(app.db.execute(&sql).await, 1);
    move_head(app, tenant, forged.seq, &forged.hash).await;
}

#[tokio::test]
async fn checkpoints_catch_what_the_chain_alone_cannot() {
    let (app, _key) = spawn_signing().await;
    for name in ["trunc", "rechain", "forge", "append"] {
        app.tenant(name).await; // tenant.create and four api_key.create: events 1 to 5
    }
    let before = verified_and_checkpointed(&app, "trunc").await;
    let checkpoint = before["checkpoints"]["latest"]["object"].as_str().expect("object").to_string();
    assert!(checkpoint.ends_with("/00000000000000000005.json"), "{checkpoint}");

    // Truncate the tail and move the head: every remaining link holds, so the chain alone
    // verifies; the checkpoint at 5 does not.
    let tail = "DELETE FROM audit_events WHERE tenant_id = (SELECT id FROM tenants WHERE name = 'trunc') AND seq > 3";
    assert_eq!(app.db.execute(tail).await, 2);
    let chain = app.db.audit_chain("trunc").await;
    move_head(&app, "trunc", 3, &chain[2].hash).await;
    let body = verify(&app, "trunc").await;
    assert_eq!(body["ok"], false, "{body}");
    assert_eq!(body["events_checked"], 3);
    assert_eq!(body["checkpoints"]["violation"]["kind"], "truncated");
    assert_eq!(body["checkpoints"]["violation"]["checkpoint"], checkpoint.as_str());
    assert_eq!(body["first_break"]["seq"], 5);
    // The checkpointer does not sign the shortened chain: the evidence stays.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let later = verify(&app, "trunc").await;
    assert_eq!(later["checkpoints"]["latest"]["seq"], 5, "{later}");
    assert!(app.stderr.lock().expect("log").iter().any(|l| l.contains("not signing")));

    // Edit event 2 and re-chain everything after it, head included: links and hashes all
    // check out, but event 5 is no longer the event that was signed.
    verified_and_checkpointed(&app, "rechain").await;
    let mut chain = app.db.audit_chain("rechain").await;
    chain[1].after_state = Some(r#"{"role":"platform-admin"}"#.into());
    for i in 1..chain.len() {
        chain[i].prev_hash = chain[i - 1].hash.clone();
        chain[i].hash = chain[i].compute_hash();
        let e = &chain[i];
        let sql = format!(
            "UPDATE audit_events SET after_state = '{}', prev_hash = '{}', hash = '{}' WHERE {}",
            e.after_state.as_deref().unwrap_or_default(),
            e.prev_hash,
            e.hash,
            event_of("rechain", e.seq)
        );
        assert_eq!(app.db.execute(&sql).await, 1);
    }
    move_head(&app, "rechain", 5, &chain[4].hash).await;
    let body = verify(&app, "rechain").await;
    assert_eq!(body["ok"], false, "{body}");
    assert_eq!(body["events_checked"], 5, "the chain itself is intact");
    assert_eq!(body["checkpoints"]["violation"]["kind"], "rewritten");
    assert_eq!(body["checkpoints"]["violation"]["seq"], 5);
    assert_eq!(body["first_break"]["seq"], 5);

    // Replace the last event with a correctly hashed forgery.
    verified_and_checkpointed(&app, "forge").await;
    assert_eq!(app.db.execute(&format!("DELETE FROM audit_events WHERE {}", event_of("forge", 5))).await, 1);
    let chain = app.db.audit_chain("forge").await;
    append_forged(&app, "forge", &chain).await;
    let body = verify(&app, "forge").await;
    assert_eq!(body["ok"], false, "{body}");
    assert_eq!(body["checkpoints"]["violation"]["kind"], "rewritten");

    // What a checkpoint cannot catch: a correctly hashed event appended after the newest one
    // is indistinguishable from a real one, and is then signed like one.
    verified_and_checkpointed(&app, "append").await;
    let chain = app.db.audit_chain("append").await;
    append_forged(&app, "append", &chain).await;
    let body = verify(&app, "append").await;
    assert_eq!(body["ok"], true, "{body}");
    assert!(body["checkpoints"]["proves"].as_str().expect("text").contains("events_after_checkpoint"));
}

#[tokio::test]
async fn checkpoints_verify_offline_and_forged_files_are_reported() {
    let (app, _key) = spawn_signing().await;
    let t = app.tenant("acme").await;
    let body = verified_and_checkpointed(&app, "acme").await;
    let latest = &body["checkpoints"]["latest"];
    let object = latest["object"].as_str().expect("object");

    // An auditor's check: the public key from the API, the file from the store, the signed
    // message rebuilt as the README says.
    let key = app.get(&t.viewer, "/v1/audit/checkpoints/key").await.expect(200).clone();
    assert_eq!(key["algorithm"], "Ed25519");
    assert_eq!(key["key_id"], body["checkpoints"]["key_id"]);
    let raw: [u8; 32] =
        BASE64.decode(key["public_key"].as_str().expect("b64")).expect("base64").try_into().expect("32 bytes");
    let public = ed25519_dalek::VerifyingKey::from_bytes(&raw).expect("a public key");
    let file: Value =
        serde_json::from_slice(&std::fs::read(app.store_dir.path().join(object)).expect("the file")).expect("json");
    assert_eq!(file["seq"], latest["seq"]);
    let message = format!(
        "tessera-audit-checkpoint-v1\n{}\n{}\n{}\n{}\n",
        file["tenant_id"].as_str().expect("tenant"),
        file["seq"],
        file["head_hash"].as_str().expect("hash"),
        file["signed_at"].as_str().expect("time")
    );
    let signature = BASE64.decode(file["signature"].as_str().expect("sig")).expect("base64");
    let signature = ed25519_dalek::Signature::from_slice(&signature).expect("64 bytes");
    public.verify_strict(message.as_bytes(), &signature).expect("the signature verifies offline");

    // A newer file that does not verify is reported, and the valid one is still used.
    let mut forged = file.clone();
    forged["seq"] = json!(99);
    let forged_object = object.replace("00000000000000000005", "00000000000000000099");
    std::fs::write(app.store_dir.path().join(&forged_object), forged.to_string()).expect("write");
    let body = verify(&app, "acme").await;
    assert_eq!(body["ok"], false, "{body}");
    assert_eq!(body["checkpoints"]["invalid"][0]["object"], forged_object.as_str());
    assert_eq!(body["checkpoints"]["invalid"][0]["reason"], "signature does not verify");
    assert_eq!(body["checkpoints"]["latest"]["seq"], 5);
    assert!(body["first_break"].is_null());
}
