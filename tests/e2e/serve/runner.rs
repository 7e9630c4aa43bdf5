//! `tessera serve --runner`: the models run in a runner process behind the socket a worker
//! uses; answers, statistics and metrics are the same, and a runner that dies is replaced.
//! (`scripts/test.sh` also runs every serve test with `TESSERA_RUNNER=true`.)

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;

use tessera_protocol::inference::ModelInferRequest;
use tessera_protocol::inference::model_infer_request::InferInputTensor;

use super::{TestServer, f32_values, raw_infer_request};

/// The runner processes started by `parent`: (pid, command line words).
fn runners_of(parent: u32) -> Vec<(u32, Vec<String>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let (Ok(cmdline), Ok(stat)) =
            (std::fs::read(entry.path().join("cmdline")), std::fs::read_to_string(entry.path().join("stat")))
        else {
            continue;
        };
        let ppid = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1)).and_then(|p| p.parse().ok());
        let words: Vec<String> =
            cmdline.split(|b| *b == 0).filter(|w| !w.is_empty()).map(|w| String::from_utf8_lossy(w).into()).collect();
        if ppid == Some(parent) && words.get(1).is_some_and(|w| w == "runner") {
            found.push((pid, words));
        }
    }
    found
}

async fn infer(s: &TestServer) -> (u16, Value) {
    let body = json!({
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": vec![2.0f32; 16]},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": vec![1.0f32; 16]},
        ]
    });
    let resp = reqwest::Client::new()
        .post(format!("{}/v2/models/add_sub/infer", s.http))
        .json(&body)
        .send()
        .await
        .expect("request");
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn successes(s: &TestServer) -> u64 {
    let stats: Value =
        reqwest::get(format!("{}/v2/models/add_sub/stats", s.http)).await.expect("stats").json().await.expect("json");
    stats["model_stats"][0]["inference_stats"]["success"]["count"].as_u64().expect("a count")
}

#[tokio::test]
async fn models_run_in_a_runner_that_is_replaced_when_killed_with_statistics_kept() {
    let s = TestServer::start(&["--runner"]);
    let runners = runners_of(s.pid());
    assert_eq!(runners.len(), 1, "{runners:?}");
    let (old_pid, words) = &runners[0];
    assert_eq!(words[2..6], ["--tenant", "serve", "--slice", "local"], "ps shows whose it is: {words:?}");
    assert!(words.contains(&"--instance-nice=-10".to_string()), "the server's settings pass on: {words:?}");

    for _ in 0..3 {
        let (status, body) = infer(&s).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["outputs"][0]["data"][0], 3.0);
    }
    let mut grpc = GrpcInferenceServiceClient::connect(s.grpc.clone()).await.expect("connect");
    let answer = grpc.model_infer(raw_infer_request("add_sub", "g", &[5.0; 16], &[1.0; 16])).await.expect("infer");
    assert_eq!(f32_values(&answer.get_ref().raw_output_contents[1])[0], 4.0);
    assert_eq!(successes(&s).await, 4, "the runner's statistics reach the server with each answer");

    let kill = std::process::Command::new("kill").args(["-9", &old_pid.to_string()]).status().expect("kill");
    assert!(kill.success());
    let killed = Instant::now();
    // A request sent while it restarts waits for the new runner and succeeds. It goes once the
    // worker has counted the death: one written before the kernel closed the dying runner's
    // socket is lost with it (503, retry), as tests/python_deploy/test_isolation.py checks.
    let metrics_url = format!("{}/metrics", s.metrics);
    let counted = "tessera_runner_restarts_total{tenant=\"serve\",slice=\"local\",reason=\"killed\"} 1";
    loop {
        let text = reqwest::get(&metrics_url).await.expect("metrics").text().await.expect("text");
        if text.contains(counted) {
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(10), "the worker never saw its runner die:\n{text}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, body) = infer(&s).await;
    assert_eq!(status, 200, "{body}");
    let recovery = killed.elapsed();
    assert!(recovery < Duration::from_secs(10), "served again after {recovery:?}");
    let now = runners_of(s.pid());
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0].0, *old_pid, "a new runner took over");
    assert_eq!(successes(&s).await, 5, "what the dead runner counted is kept");

    let metrics = reqwest::get(&metrics_url).await.expect("m").text().await.expect("t");
    for line in [
        "tessera_runner_restarts_total{tenant=\"serve\",slice=\"local\",reason=\"killed\"} 1",
        "tessera_runner_up{tenant=\"serve\",slice=\"local\"} 1",
        "nv_inference_request_success{model=\"add_sub\",version=\"1\"} 5",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
}

/// FP32 elements of one large test tensor: 1 MiB.
const LARGE: usize = 1 << 18;

/// A 1 MiB tensor no other request sends: its values name the request.
fn large_tensor(seed: usize) -> Vec<u8> {
    (0..LARGE).flat_map(|i| ((seed * LARGE + i) as f32).to_le_bytes()).collect()
}

/// Sends `tensor` to `identity_fp32` with the binary extension and returns the output's bytes.
async fn http_identity(client: &reqwest::Client, http: &str, tensor: Vec<u8>) -> Vec<u8> {
    let header = json!({
        "inputs": [{"name": "INPUT0", "shape": [1, LARGE], "datatype": "FP32", "parameters": {"binary_data_size": tensor.len()}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": true}}]
    })
    .to_string();
    let header_len = header.len();
    let mut body = header.into_bytes();
    body.extend_from_slice(&tensor);
    let resp = client
        .post(format!("{http}/v2/models/identity_fp32/infer"))
        .header("Inference-Header-Content-Length", header_len)
        .body(body)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    let json_len: usize =
        resp.headers()["inference-header-content-length"].to_str().expect("ascii").parse().expect("a length");
    let bytes = resp.bytes().await.expect("body");
    bytes[json_len..].to_vec()
}

#[tokio::test]
async fn large_tensors_cross_in_the_runners_shared_memory_intact() {
    let s = TestServer::start(&["--runner"]);
    let runners = runners_of(s.pid());
    assert_eq!(runners.len(), 1, "{runners:?}");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", runners[0].0)).expect("the runner's maps");
    for arena in ["/memfd:tessera-requests", "/memfd:tessera-responses"] {
        assert!(maps.contains(arena), "the runner maps {arena}:\n{maps}");
    }
    assert!(runners[0].1.iter().any(|w| w == "--shm-fds=4,5"), "{:?}", runners[0].1);

    let metrics_url = format!("{}/metrics", s.metrics);
    // Tensor bytes the runner exchanged: (direction, path) → bytes.
    let traffic = || async {
        let text = reqwest::get(&metrics_url).await.expect("metrics").text().await.expect("text");
        let mut bytes = std::collections::BTreeMap::new();
        for line in text.lines().filter(|l| l.starts_with("tessera_runner_tensor_bytes_total{")) {
            let (labels, n) = line.rsplit_once(' ').expect("a sample");
            let label = |name: &str| labels.split(&format!("{name}=\"")).nth(1).and_then(|v| v.split('"').next());
            let key = (label("direction").expect("direction").to_string(), label("path").expect("path").to_string());
            bytes.insert(key, n.parse::<u64>().expect("a count"));
        }
        bytes
    };
    let before = traffic().await;
    // 96 MiB each way through 32 MiB arenas, 12 requests at a time over both protocols: the
    // arenas fill, wrap and hand space back, and every answer is its own request's tensor.
    let mut tasks = Vec::new();
    for worker in 0..12 {
        let (http, grpc) = (s.http.clone(), s.grpc.clone());
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut grpc = GrpcInferenceServiceClient::connect(grpc).await.expect("connect");
            for round in 0..8 {
                let seed = worker * 8 + round;
                let tensor = large_tensor(seed);
                let out = if worker % 2 == 0 {
                    http_identity(&client, &http, tensor.clone()).await
                } else {
                    let request = ModelInferRequest {
                        model_name: "identity_fp32".into(),
                        inputs: vec![InferInputTensor {
                            name: "INPUT0".into(),
                            datatype: "FP32".into(),
                            shape: vec![1, LARGE as i64],
                            ..Default::default()
                        }],
                        raw_input_contents: vec![tensor.clone().into()],
                        ..Default::default()
                    };
                    let answer = grpc.model_infer(request).await.expect("gRPC infer");
                    answer.into_inner().raw_output_contents[0].to_vec()
                };
                assert!(out == tensor, "request {seed} got back another tensor");
            }
        }));
    }
    for task in tasks {
        task.await.expect("no request failed");
    }
    assert_eq!(runners_of(s.pid())[0].0, runners[0].0, "the runner never died");
    let after = traffic().await;
    let moved = |direction: &str, path: &str| {
        let key = (direction.to_string(), path.to_string());
        after.get(&key).copied().unwrap_or(0) - before.get(&key).copied().unwrap_or(0)
    };
    for direction in ["request", "response"] {
        let (shared, inline) = (moved(direction, "shared_memory"), moved(direction, "inline"));
        assert_eq!(shared + inline, 96 << 20, "{direction}: every tensor byte is counted once: {after:?}");
        assert!(shared >= 64 << 20, "{direction}: most of it went through shared memory: {after:?}");
    }
}
