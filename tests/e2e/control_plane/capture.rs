//! Request/response capture on the control plane: capture settings on a deployment reach its
//! assignments; a worker's `ReportCapture` batch lands under the tenant's prefix and is listed
//! and downloaded through the API (another tenant: 404; a batch naming another tenant's
//! deployment: NOT_FOUND); the leader's sweep deletes files older than the tenant's retention
//! and keeps those of a tenant on the longer default.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tessera_protocol::agent::ReportCaptureRequest;

use super::deployments::{TOKEN, args, client};
use super::{Opts, TestApp, onnx_bytes};

fn batch(tenant: &str, deployment: &str, lines: &[Value]) -> ReportCaptureRequest {
    let jsonl: Vec<u8> = lines.iter().flat_map(|l| format!("{l}\n").into_bytes()).collect();
    ReportCaptureRequest {
        worker_id: "worker-1".into(),
        tenant_id: tenant.into(),
        deployment_id: deployment.into(),
        batch_id: uuid::Uuid::now_v7().to_string(),
        first_at_ms: 1_764_633_600_000, // 2025-12-02
        records: u32::try_from(lines.len()).expect("few"),
        jsonl,
    }
}

/// Creates a model with one version and a deployment of it (no replicas) with `capture`.
async fn deploy(app: &TestApp, key: &str, tenant: &str, capture: Value) -> String {
    app.create_model(key, tenant, "m").await.expect(201);
    app.upload(key, tenant, "m", "", onnx_bytes(64)).await.expect(201);
    let body = json!({ "name": "d", "model": "m", "replicas": 0, "capture": capture });
    let created = app.post(key, &format!("/v1/tenants/{tenant}/deployments"), &body).await;
    created.expect(201)["id"].as_str().expect("id").to_string()
}

/// Makes every stored file under `dir` look `age` old.
fn age_files(dir: &std::path::Path, age: Duration) {
    let then = SystemTime::now() - age;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                std::fs::File::options().write(true).open(&path).expect("open").set_modified(then).expect("set mtime");
            }
        }
    }
}

async fn files(app: &TestApp, key: &str, tenant: &str) -> Vec<Value> {
    let list = app.get(key, &format!("/v1/tenants/{tenant}/deployments/d/captures")).await;
    list.expect(200)["files"].as_array().expect("files").clone()
}

#[tokio::test]
async fn capture_batches_are_stored_per_tenant_listed_downloaded_and_expire() {
    let mut args = args().to_vec();
    args.extend(["--capture-sweep-interval-ms", "200"]);
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let acme = app.tenant("acme").await;
    let umbrella = app.tenant("umbrella").await;
    let tenant_id = |t: &str| {
        let t = t.to_string();
        let app = &app;
        async move {
            let got = app.get(&app.admin_key, &format!("/v1/tenants/{t}")).await;
            got.expect(200)["id"].as_str().expect("id").to_string()
        }
    };
    let (acme_id, umbrella_id) = (tenant_id("acme").await, tenant_id("umbrella").await);
    let capture = json!({ "enabled": true, "sample_rate": 0.5, "metadata": false });
    let acme_d = deploy(&app, &acme.deployer, "acme", capture.clone()).await;
    let umbrella_d = deploy(&app, &umbrella.deployer, "umbrella", capture).await;
    let shown = app.get(&acme.viewer, "/v1/tenants/acme/deployments/d").await.expect(200)["capture"].clone();
    assert_eq!(
        shown,
        json!({ "enabled": true, "sample_rate": 0.5, "inputs": true, "outputs": true, "metadata": false, "max_record_bytes": 65536 })
    );

    // A worker's batch is stored under the tenant's prefix; naming another tenant's deployment
    // or a malformed id is refused.
    let mut agent = client(&app, TOKEN).await;
    let lines = [json!({ "request_id": "r1", "model": "m" }), json!({ "request_id": "r2", "model": "m" })];
    let stored = agent.report_capture(batch(&acme_id, &acme_d, &lines)).await.expect("stored").into_inner();
    assert!(
        stored.key.starts_with(&format!("tenants/{acme_id}/capture/{acme_d}/2025-12-02/worker-1-")),
        "{}",
        stored.key
    );
    let cross = agent.report_capture(batch(&umbrella_id, &acme_d, &lines)).await.expect_err("not umbrella's");
    assert_eq!(cross.code(), tonic::Code::NotFound);
    let mut bad = batch(&acme_id, &acme_d, &lines);
    bad.worker_id = "../escape".into();
    assert_eq!(agent.report_capture(bad).await.expect_err("bad id").code(), tonic::Code::InvalidArgument);
    agent.report_capture(batch(&umbrella_id, &umbrella_d, &lines[..1])).await.expect("umbrella's batch");

    // Listed and downloaded by the tenant's readers; 404 to another tenant.
    let listed = files(&app, &acme.viewer, "acme").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let name = listed[0]["name"].as_str().expect("name").to_string();
    assert!(name.starts_with("2025-12-02/worker-1-") && name.ends_with(".jsonl"), "{name}");
    let path = format!("/v1/tenants/acme/deployments/d/captures/{name}");
    let got = app.client.get(format!("{}{path}", app.url)).bearer_auth(&acme.viewer).send().await.expect("download");
    assert_eq!(got.status(), 200);
    assert_eq!(got.headers()["content-type"], "application/x-ndjson");
    let text = got.text().await.expect("body");
    let ids: Vec<String> =
        text.lines().map(|l| serde_json::from_str::<Value>(l).expect("json line")["request_id"].to_string()).collect();
    assert_eq!(ids, ["\"r1\"", "\"r2\""]);
    assert_eq!(listed[0]["size_bytes"].as_u64(), Some(text.len() as u64));
    assert_eq!(app.get(&umbrella.admin, "/v1/tenants/acme/deployments/d/captures").await.status, 404);
    assert_eq!(app.get(&umbrella.admin, &path).await.status, 404);
    assert_eq!(
        app.get(&acme.viewer, "/v1/tenants/acme/deployments/d/captures/2025-12-02/nope.jsonl").await.status,
        404
    );
    assert_eq!(files(&app, &umbrella.viewer, "umbrella").await.len(), 1, "umbrella sees its own file only");

    // Retention: acme keeps 1 day, umbrella the 30-day default. Files 3 days old go for acme only.
    app.put(&acme.admin, "/v1/tenants/acme/capture-retention", &json!({ "days": 1 })).await.expect(200);
    let refused = app.put(&acme.viewer, "/v1/tenants/acme/capture-retention", &json!({ "days": 2 })).await;
    assert_eq!(refused.status, 403, "viewers may not set retention");
    age_files(app.store_dir.path(), Duration::from_secs(3 * 86_400));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !files(&app, &acme.viewer, "acme").await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the sweep never deleted acme's expired file");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(files(&app, &umbrella.viewer, "umbrella").await.len(), 1, "within the default retention");
    let audit = app.get(&app.admin_key, "/v1/audit?tenant=acme&action=capture_retention.update").await;
    assert_eq!(audit.expect(200)["events"].as_array().map(Vec::len), Some(1));
}
