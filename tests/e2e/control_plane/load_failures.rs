//! Load failures by kind, end to end: a real worker (in this process) against the real control
//! plane. A configuration failure is reported with its kind and left alone until the
//! assignment changes; a failed artifact fetch is reported as such and tried again until it
//! works.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tessera_data_plane::worker::{WorkerConfig, WorkerToken};
use tokio_util::sync::CancellationToken;

use super::deployments::{TOKEN, args, deployment_until};
use super::{Opts, TestApp};

/// The deployment's events of `kind`, with their messages.
async fn events(app: &TestApp, key: &str, path: &str, kind: &str) -> Vec<String> {
    let events = app.get(key, &format!("{path}/events")).await.expect(200).clone();
    let all = events["events"].as_array().cloned().unwrap_or_default();
    all.iter().filter(|e| e["kind"] == kind).map(|e| e["message"].as_str().unwrap_or_default().to_string()).collect()
}

fn reason(deployment: &Value) -> String {
    deployment["replica_status"][0]["reason"].as_str().unwrap_or_default().to_string()
}

/// Every file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let (mut found, mut stack) = (Vec::new(), vec![dir.to_path_buf()]);
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(d).expect("read dir").flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                found.push(e.path());
            }
        }
    }
    found
}

/// `KIND_GPU` on a worker whose ONNX Runtime has no CUDA provider: a configuration failure.
/// The worker used to try it again every 15 s (each try a new `failed` event); now the one
/// failure stands until the assignment changes.
#[tokio::test]
async fn a_configuration_failure_names_its_kind_and_is_not_retried() {
    let args = args();
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let acme = app.tenant("acme").await;
    app.create_model(&acme.deployer, "acme", "addsub").await.expect(201);
    let upload = app
        .client
        .post(format!("{}/v1/tenants/acme/models/addsub/versions", app.url))
        .bearer_auth(&acme.deployer)
        .header("content-type", "application/octet-stream")
        .header("x-model-config", r#"{"instance_group": [{"kind": "KIND_GPU"}]}"#)
        .body(tessera_data_plane::tools::onnx_builder::add_sub());
    app.raw(upload).await.expect(201);
    let body = json!({ "name": "addsub", "model": "addsub", "profile": "gpu" });
    app.post(&acme.deployer, "/v1/tenants/acme/deployments", &body).await.expect(201);

    let dir = tempfile::tempdir().expect("tempdir");
    let inventory = dir.path().join("gpus.json");
    let gpus = json!({ "gpus": [{ "uuid": "GPU-7b2f6d4c-0000-0000-0000-000000000000", "index": 0,
                                   "memory_bytes": 85_899_345_920_u64 }] });
    std::fs::write(&inventory, gpus.to_string()).expect("write the inventory");
    let mut config = WorkerConfig::local(&app.url, WorkerToken::new(TOKEN), dir.path().join("worker"));
    config.cpu_slices = 0;
    config.inventory = Some(inventory);
    config.runner_exe = Some(env!("CARGO_BIN_EXE_tessera").into());
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(tessera_data_plane::worker::run(config, shutdown.clone(), |_| {}));

    let path = "/v1/tenants/acme/deployments/addsub";
    let failed = deployment_until(&app, &acme.viewer, path, |d| d["state"] == "failed").await;
    let why = reason(&failed);
    assert!(why.starts_with("configuration: KIND_GPU needs ONNX Runtime's CUDA execution provider"), "{why}");
    let first = events(&app, &acme.viewer, path, "failed").await;
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].contains(": configuration: KIND_GPU needs"), "the event names the kind: {}", first[0]);

    // Past the old 15 s retry and the 5 s tick that notices it is due.
    tokio::time::sleep(Duration::from_secs(21)).await;
    let later = app.get(&acme.viewer, path).await.expect(200).clone();
    assert_eq!((later["state"].as_str(), reason(&later)), (Some("failed"), why));
    assert_eq!(events(&app, &acme.viewer, path, "failed").await, first, "no second try, so no second failure");
    shutdown.cancel();
    worker.await.expect("the worker task").expect("the worker stops cleanly");
}

/// An artifact the control plane cannot serve (gone from its object store): a fetch failure,
/// tried again with backoff, which succeeds once the artifact is back.
#[tokio::test]
async fn a_fetch_failure_names_its_kind_and_is_retried_until_it_works() {
    let args = args();
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let acme = app.tenant("acme").await;
    app.create_model(&acme.deployer, "acme", "addsub").await.expect(201);
    let upload = app
        .client
        .post(format!("{}/v1/tenants/acme/models/addsub/versions", app.url))
        .bearer_auth(&acme.deployer)
        .header("content-type", "application/octet-stream")
        .body(tessera_data_plane::tools::onnx_builder::add_sub());
    app.raw(upload).await.expect(201);
    let stored = files(app.store_dir.path());
    assert_eq!(stored.len(), 1, "one artifact: {stored:?}");
    let aside = app.store_dir.path().join("aside");
    std::fs::rename(&stored[0], &aside).expect("take the artifact away");
    let body = json!({ "name": "addsub", "model": "addsub" });
    app.post(&acme.deployer, "/v1/tenants/acme/deployments", &body).await.expect(201);

    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = WorkerConfig::local(&app.url, WorkerToken::new(TOKEN), dir.path().join("worker"));
    config.cpu_slices = 1;
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(tessera_data_plane::worker::run(config, shutdown.clone(), |_| {}));

    let path = "/v1/tenants/acme/deployments/addsub";
    let failed = deployment_until(&app, &acme.viewer, path, |d| d["state"] == "failed").await;
    let why = reason(&failed);
    assert!(why.starts_with("fetch: fetching artifact "), "{why}");
    let failures = events(&app, &acme.viewer, path, "failed").await;
    assert!(failures.iter().any(|m| m.contains(": fetch: fetching artifact ")), "{failures:?}");

    std::fs::rename(&aside, &stored[0]).expect("put the artifact back");
    let ready = deployment_until(&app, &acme.viewer, path, |d| d["state"] == "ready").await;
    assert_eq!(ready["replica_status"][0]["state"], "ready", "{ready:#}");
    assert!(!events(&app, &acme.viewer, path, "ready").await.is_empty());
    shutdown.cancel();
    worker.await.expect("the worker task").expect("the worker stops cleanly");
}
