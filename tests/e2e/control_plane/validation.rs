//! Values the API used to take although nothing can use them: a page cursor the server never
//! issued, a model config with a path for its file name or a negative batch size, quota slice
//! keys that are not profiles, batch sizes of 2^40, prices finer than their stored precision,
//! dates in year 0. Each is refused naming the field, and the schema states the bound.

use serde_json::{Value, json};

use super::{Resp, TestApp, onnx_bytes};

#[track_caller]
fn refused(r: &Resp, status: u16, field: &str) {
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (status, Some(field)), "{:?}", r.body);
    let message = r.body["error"]["message"].as_str().unwrap_or("");
    let named = field.rsplit('.').next().unwrap_or(field);
    assert!(message.contains(named) || message.contains(field), "'{message}' should name {field}");
}

#[tokio::test]
async fn cursors_must_be_ones_the_server_issued() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    for name in ["a", "b", "c"] {
        app.create_model(&t.deployer, "acme", name).await.expect(201);
    }
    let first = app.get(&t.viewer, "/v1/tenants/acme/models?limit=2").await;
    let cursor = first.expect(200)["next_cursor"].as_str().unwrap().to_string();
    let next = app.get(&t.viewer, &format!("/v1/tenants/acme/models?limit=2&cursor={cursor}")).await;
    assert_eq!(next.expect(200)["models"][0]["name"], "c");
    for bad in ["b", "zzz", "%27%3B--", "..%2Fx", "AAAA"] {
        let r = app.get(&t.viewer, &format!("/v1/tenants/acme/models?cursor={bad}")).await;
        refused(&r, 400, "cursor");
        let r = app.get(&t.viewer, &format!("/v1/tenants/acme/models/a/versions?cursor={bad}")).await;
        refused(&r, 400, "cursor");
        let r = app.get(&t.admin, &format!("/v1/audit?cursor={bad}")).await;
        refused(&r, 400, "cursor");
    }
    // A cursor of one list is not one of another.
    let r = app.get(&t.admin, &format!("/v1/audit?cursor={cursor}")).await;
    refused(&r, 400, "cursor");
}

#[tokio::test]
async fn model_configs_quotas_batching_prices_and_dates_are_bounded() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    app.create_model(&t.deployer, "acme", "m").await.expect(201);
    let upload = |config: Value| {
        let req = app
            .client
            .post(format!("{}/v1/tenants/acme/models/m/versions", app.url))
            .bearer_auth(&t.deployer)
            .header("content-type", "application/octet-stream")
            .header("x-model-config", config.to_string())
            .body(onnx_bytes(100));
        app.raw(req)
    };
    for config in [
        json!({ "default_model_filename": "../x" }),
        json!({ "default_model_filename": "a/b" }),
        json!({ "max_batch_size": -1 }),
        json!({ "max_batch_size": 4, "dynamic_batching": { "preferred_batch_size": [1_i64 << 40] } }),
    ] {
        refused(&upload(config).await, 422, "X-Model-Config");
    }
    assert_eq!(app.stored_files(), 0);
    upload(json!({ "max_batch_size": 8, "default_model_filename": "model.onnx" })).await.expect(201);

    let quotas = |slices: Value| {
        json!({ "models": 10, "versions": 10, "storage_bytes": 1000000, "replicas": 4,
                "requests_per_second": 10, "monthly_spend_cents": 0, "slices": slices })
    };
    let r = app.put(&app.admin_key, "/v1/tenants/acme/quotas", &quotas(json!({ "../x": 1 }))).await;
    refused(&r, 422, "slices");
    let r = app.put(&app.admin_key, "/v1/tenants/acme/quotas", &quotas(json!({ "cpu": -1 }))).await;
    refused(&r, 422, "slices.cpu");
    app.put(&app.admin_key, "/v1/tenants/acme/quotas", &quotas(json!({ "cpu": 2 }))).await.expect(200);

    let deployment = |batching: Value| json!({ "name": "d", "model": "m", "dynamic_batching": batching });
    let path = "/v1/tenants/acme/deployments";
    let r = app.post(&t.deployer, path, &deployment(json!({ "preferred_batch_size": [1_i64 << 40] }))).await;
    refused(&r, 422, "dynamic_batching.preferred_batch_size");
    let r = app.post(&t.deployer, path, &deployment(json!({ "max_queue_delay_microseconds": i64::MAX }))).await;
    refused(&r, 422, "dynamic_batching.max_queue_delay_microseconds");

    let price = |cents: f64, from: &str| {
        json!({ "prices": [{ "slice_profile": "cpu", "per_slice_hour_cents": cents,
                             "per_1000_inferences_cents": 1, "effective_from": from }] })
    };
    let r = app.put(&app.admin_key, "/v1/prices", &price(1e-12, "2026-01-01T00:00:00Z")).await;
    refused(&r, 422, "prices[0].per_slice_hour_cents");
    let r = app.put(&app.admin_key, "/v1/prices", &price(1.0, "0000-01-01T00:00:00Z")).await;
    refused(&r, 422, "prices[0].effective_from");
    let ok = app.put(&app.admin_key, "/v1/prices", &price(0.000001, "2026-01-01T00:00:00Z")).await;
    assert_eq!(ok.expect(200)["prices"][0]["per_slice_hour_cents"], 0.000001);

    let r = app.get(&t.viewer, "/v1/tenants/acme/usage?from=0000-01-01T00:00:00Z").await;
    refused(&r, 422, "from");
    let key = json!({ "name": "k", "role": "viewer", "expires_at": "9999-12-31T23:59:59Z" });
    app.post(&t.admin, "/v1/tenants/acme/api-keys", &key).await.expect(201);
}

#[tokio::test]
async fn the_schema_states_the_bounds() {
    let app = TestApp::spawn().await;
    let doc = app.get("", "/v1/openapi.json").await;
    let schemas = &doc.expect(200)["components"]["schemas"];
    let sizes = &schemas["DynamicBatching"]["properties"]["preferred_batch_size"];
    assert_eq!((sizes["maxItems"].as_u64(), sizes["items"]["maximum"].as_i64()), (Some(16), Some(2147483647)));
    assert_eq!(sizes["items"]["minimum"], 1);
    let slices = &schemas["QuotaLimits"]["properties"]["slices"];
    assert_eq!(slices["propertyNames"]["pattern"], "^(cpu|gpu|mig-[a-z0-9.]{1,32})$");
    assert_eq!(slices["additionalProperties"]["minimum"], 0);
    assert_eq!(schemas["Price"]["properties"]["per_slice_hour_cents"]["maximum"], 1e12);
    let params = doc.body["paths"]["/v1/tenants/{tenant}/models"]["get"]["parameters"].as_array().unwrap().clone();
    let cursor = params.iter().find(|p| p["name"] == "cursor").unwrap();
    assert_eq!(cursor["schema"]["maxLength"], 256);
}
