//! Model control end to end: reloads that fail leave what was serving in place, in explicit and
//! poll mode, as in Triton.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::TestServer;

async fn post(server: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new().post(format!("{}{path}", server.http)).json(&body).send().await.expect("post");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// One add_sub request; returns the status.
async fn infer(server: &TestServer, model: &str) -> u16 {
    let row = vec![1.0f32; 16];
    let body = json!({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": row},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": row},
    ]});
    post(server, &format!("/v2/models/{model}/infer"), body).await.0
}

async fn index(server: &TestServer) -> Vec<Value> {
    let (status, body) = post(server, "/v2/repository/index", json!({})).await;
    assert_eq!(status, 200, "{body}");
    body.as_array().cloned().unwrap_or_default()
}

fn row<'a>(index: &'a [Value], model: &str, version: &str) -> Option<&'a Value> {
    index.iter().find(|r| r["name"] == model && r["version"] == version)
}

#[tokio::test]
async fn an_explicit_reload_that_fails_leaves_the_serving_version_in_place() {
    let s = TestServer::start(&["--model-control-mode", "explicit", "--load-model", "add_sub"]);
    assert_eq!(infer(&s, "add_sub").await, 200);

    let bad = json!({"parameters": {"config": "{\"name\": \"someone_else\"}"}});
    let (status, body) = post(&s, "/v2/repository/models/add_sub/load", bad).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains("add_sub")), "{body}");
    assert_eq!(infer(&s, "add_sub").await, 200, "the loaded version keeps serving");
    let rows = index(&s).await;
    assert_eq!(row(&rows, "add_sub", "1").map(|r| r["state"].clone()), Some(json!("READY")), "{rows:?}");

    // A model that never served takes the failure as it is.
    let (status, _) = post(&s, "/v2/repository/models/bad_config/load", json!({})).await;
    assert_eq!(status, 400);
    let rows = index(&s).await;
    let bad_row = rows.iter().find(|r| r["name"] == "bad_config").expect("listed");
    assert_eq!(bad_row["state"], "UNAVAILABLE", "{rows:?}");

    // A request to a model whose only version failed says why, not just "not ready".
    let (status, _) = post(&s, "/v2/repository/models/bad_file/load", json!({})).await;
    assert_eq!(status, 400);
    let row = vec![1.0f32; 16];
    let body = json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": row}]});
    let (status, answer) = post(&s, "/v2/models/bad_file/infer", body).await;
    assert_eq!(status, 503, "{answer}");
    let message = answer["error"].as_str().unwrap_or_default();
    assert!(message.contains("no version is ready (version 1:"), "{message}");
}

#[tokio::test]
async fn poll_mode_keeps_serving_through_a_broken_config_and_a_half_copied_version() {
    let s = TestServer::start(&["--model-control-mode", "poll", "--repository-poll-secs", "1"]);
    let model = s.repository().join("add_sub");
    assert_eq!(infer(&s, "add_sub").await, 200);
    let good = std::fs::read(model.join("config.pbtxt")).expect("config");

    // Each change is left in place for several polls; every request meanwhile must succeed.
    let steady = |what: &'static str| {
        let s = &s;
        async move {
            let until = Instant::now() + Duration::from_millis(2_500);
            while Instant::now() < until {
                assert_eq!(infer(s, "add_sub").await, 200, "while {what}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    std::fs::write(model.join("config.pbtxt"), "max_batch_size: [ oops").expect("break the config");
    steady("the config is broken").await;
    std::fs::write(model.join("config.pbtxt"), &good).expect("mend the config");
    // A new version directory whose model file has not arrived yet.
    std::fs::create_dir(model.join("2")).expect("mkdir 2");
    steady("version 2 has no model file").await;
    let rows = index(&s).await;
    assert_eq!(row(&rows, "add_sub", "1").map(|r| r["state"].clone()), Some(json!("READY")), "{rows:?}");

    // Once the file is there, the next poll moves to version 2.
    std::fs::write(model.join("2/model.onnx"), tessera_data_plane::tools::onnx_builder::add_sub()).expect("copy v2");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = index(&s).await;
        if row(&rows, "add_sub", "2").is_some_and(|r| r["state"] == "READY") {
            break;
        }
        assert!(Instant::now() < deadline, "version 2 never became ready: {rows:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(infer(&s, "add_sub").await, 200);
}

#[test]
fn the_wildcard_must_be_the_only_startup_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    super::write_repository(dir.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", "--model-repository"])
        .arg(dir.path())
        .args(["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--model-control-mode", "explicit"])
        .args(["--load-model", "*", "--load-model", "add_sub"])
        .output()
        .expect("run tessera");
    assert!(!out.status.success(), "refused at start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("must be the only --load-model"), "{stderr}");
}
