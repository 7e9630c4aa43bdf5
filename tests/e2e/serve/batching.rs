//! Dynamic batching, queue policy and their statistics and metrics, end to end.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_protocol::inference::ModelInferRequest;
use tessera_protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;

use super::{TestServer, raw_infer_request};

const BATCHING: &str = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 30000 }\n";
const TINY_QUEUE: &str = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 400000 default_queue_policy { max_queue_size: 2 } }\n";
/// Batches wait a minute for company: a request that leaves this queue sooner was let go, not run.
const LONG_DELAY: &str = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 60000000 }\n";
const SHORT_TIMEOUT: &str = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 5000000 default_queue_policy { default_timeout_microseconds: 50000 } }\n";

fn request(i: usize) -> Value {
    let a: Vec<f32> = (0..16).map(|j| (i * 100 + j) as f32).collect();
    json!({
        "id": i.to_string(),
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": a},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": vec![1.0f32; 16]},
        ]
    })
}

/// A one-row gRPC request of zeros for the two-input test models.
fn grpc_request(model: &str) -> ModelInferRequest {
    raw_infer_request(model, "", &[0.0; 16], &[0.0; 16])
}

async fn infer_many(server: &TestServer, model: &str, n: usize) -> Vec<(u16, Value)> {
    let client = reqwest::Client::new();
    let calls = (0..n).map(|i| {
        let (client, url) = (client.clone(), format!("{}/v2/models/{model}/infer", server.http));
        async move {
            let resp = client.post(url).json(&request(i)).send().await.expect("request");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    });
    futures::future::join_all(calls).await
}

async fn stats(server: &TestServer, model: &str) -> Value {
    let url = format!("{}/v2/models/{model}/stats", server.http);
    let body: Value = reqwest::get(url).await.expect("stats").json().await.expect("json");
    body["model_stats"][0].clone()
}

#[tokio::test]
async fn concurrent_requests_are_batched_and_each_gets_its_own_rows() {
    let s = TestServer::start_with(&[("batch_add", BATCHING)], &[]);
    let results = infer_many(&s, "batch_add", 16).await;
    for (i, (status, body)) in results.iter().enumerate() {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(body["id"], i.to_string());
        assert_eq!(body["outputs"][0]["shape"], json!([1, 16]));
        let first = body["outputs"][0]["data"][0].as_f64().expect("number");
        assert_eq!(first, (i * 100) as f64 + 1.0, "request {i} got its own row");
    }
    let m = stats(&s, "batch_add").await;
    assert_eq!(m["inference_count"], 16);
    let executions = m["execution_count"].as_u64().expect("count");
    assert!(executions < 16, "requests were batched: {executions} executions for 16 requests");
    assert_eq!(m["inference_stats"]["success"]["count"], 16);
    assert_eq!(m["inference_stats"]["queue"]["count"], 16);
    assert!(m["batch_stats"].as_array().is_some_and(|b| b.iter().any(|b| b["batch_size"].as_u64() > Some(1))));
    let metrics = reqwest::get(format!("{}/metrics", s.metrics)).await.expect("m").text().await.expect("t");
    let labels = "model=\"batch_add\",version=\"1\"";
    assert!(metrics.contains(&format!("nv_inference_request_success{{{labels}}} 16")), "{metrics}");
    assert!(metrics.contains(&format!("nv_inference_count{{{labels}}} 16")));
    assert!(metrics.contains(&format!("nv_inference_exec_count{{{labels}}} {executions}")));
    assert!(metrics.contains(&format!("tessera_inference_batch_size_count{{{labels}}} {executions}")));
}

#[tokio::test]
async fn a_full_queue_rejects_at_once_with_503() {
    let s = TestServer::start_with(&[("tiny_queue", TINY_QUEUE)], &[]);
    let results = infer_many(&s, "tiny_queue", 5).await;
    let ok = results.iter().filter(|(s, _)| *s == 200).count();
    let rejected: Vec<&Value> = results.iter().filter(|(s, _)| *s == 503).map(|(_, b)| b).collect();
    assert_eq!(ok + rejected.len(), 5, "{results:?}");
    assert!(rejected.len() >= 3, "a queue of 2 holds at most 2 of 5 simultaneous requests: {results:?}");
    for body in rejected {
        assert!(body["error"].as_str().is_some_and(|e| e.contains("Exceeds maximum queue size")), "{body}");
    }
    let metrics = reqwest::get(format!("{}/metrics", s.metrics)).await.expect("m").text().await.expect("t");
    let line = "nv_inference_request_failure{model=\"tiny_queue\",version=\"1\",reason=\"REJECTED\"}";
    assert!(metrics.lines().any(|l| l.starts_with(line) && !l.ends_with(" 0")), "{metrics}");
}

#[tokio::test]
async fn a_request_that_waits_past_its_timeout_is_rejected_over_http_and_grpc() {
    let s = TestServer::start_with(&[("short_timeout", SHORT_TIMEOUT)], &[]);
    let started = Instant::now();
    let results = infer_many(&s, "short_timeout", 2).await;
    for (status, body) in &results {
        assert_eq!(*status, 503, "{body}");
        assert!(body["error"].as_str().is_some_and(|e| e.contains("Request timeout expired")), "{body}");
    }
    assert!(started.elapsed() < Duration::from_secs(4), "rejected at the timeout, not the delay");
    let mut client = GrpcInferenceServiceClient::connect(s.grpc.clone()).await.expect("connect");
    let err = client.model_infer(grpc_request("short_timeout")).await.expect_err("times out");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("Request timeout expired"));
}

#[tokio::test]
async fn a_client_that_leaves_before_its_request_runs_is_dropped_from_the_queue() {
    use tokio::io::AsyncWriteExt;

    let s = TestServer::start_with(&[("long_delay", LONG_DELAY)], &[]);
    // HTTP: a raw connection that sends a whole request, then closes while the batcher waits
    // out its one-minute delay for more.
    let addr = s.http.trim_start_matches("http://").to_string();
    let body = request(0).to_string();
    let head = format!(
        "POST /v2/models/long_delay/infer HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut http = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    http.write_all(format!("{head}{body}").as_bytes()).await.expect("send");
    // gRPC: a call whose future is dropped (the client cancels the stream).
    let mut client = GrpcInferenceServiceClient::connect(s.grpc.clone()).await.expect("connect");
    let call = tokio::time::timeout(Duration::from_millis(300), client.model_infer(grpc_request("long_delay"))).await;
    assert!(call.is_err(), "the call waits in the queue, so the client gives up first: {call:?}");
    drop(http);

    // Both leave the queue as cancelled as soon as their clients leave, not when the delay
    // ends, and neither runs.
    // The failure is counted as the request leaves; the queue's gauge drops a moment later.
    let failure = "nv_inference_request_failure{model=\"long_delay\",version=\"1\",reason=\"CANCELED\"} 2";
    let drained = "nv_inference_pending_request_count{model=\"long_delay\",version=\"1\"} 0";
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let metrics = reqwest::get(format!("{}/metrics", s.metrics)).await.expect("m").text().await.expect("t");
        if (metrics.contains(failure) && metrics.contains(drained)) || Instant::now() > deadline {
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(metrics.contains(failure), "{metrics}");
    assert!(metrics.contains(drained), "{metrics}");
    let m = stats(&s, "long_delay").await;
    assert_eq!(m["inference_count"], 0, "{m}");
    assert_eq!(m["execution_count"], 0, "{m}");
    assert_eq!(m["inference_stats"]["fail"]["count"], 2, "{m}");
}

/// A unary ModelInfer call over a bare HTTP/2 connection with the given `grpc-timeout` header;
/// returns the `grpc-status` and `grpc-message` of the trailers-only answer. (tonic's client
/// enforces `grpc-timeout` itself, so it could not show that the server does.)
async fn infer_with_grpc_timeout(server: &TestServer, timeout: &str) -> (String, String) {
    use http_body_util::{BodyExt, Full};
    use prost::Message;

    let (mut sender, addr) = super::grpc_connection(server).await;
    let message = grpc_request("long_delay").encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let request = http::Request::post(format!("http://{addr}/inference.GRPCInferenceService/ModelInfer"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", timeout)
        .body(Full::new(bytes::Bytes::from(frame)))
        .expect("a request");
    let response = sender.send_request(request).await.expect("an answer");
    let mut headers = response.headers().clone();
    let body = response.into_body().collect().await.expect("the body");
    if let Some(trailers) = body.trailers() {
        headers.extend(trailers.clone());
    }
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    (text("grpc-status"), text("grpc-message"))
}

#[tokio::test]
async fn a_grpc_deadline_ends_the_call_on_the_server_and_frees_its_queue_place() {
    let s = TestServer::start_with(&[("long_delay", LONG_DELAY)], &[]);

    // The request waits for its batch's one-minute delay; the server ends it at 200 ms.
    let started = Instant::now();
    let (status, message) = infer_with_grpc_timeout(&s, "200m").await;
    assert_eq!(status, "4", "DEADLINE_EXCEEDED: {message}");
    assert!(message.contains("grpc-timeout"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10), "answered at the deadline, not at the batch delay");

    // A malformed deadline is refused up front (INVALID_ARGUMENT), naming the header.
    let (status, message) = infer_with_grpc_timeout(&s, "soon").await;
    assert_eq!(status, "3", "INVALID_ARGUMENT: {message}");
    assert!(message.contains("grpc-timeout"), "{message}");

    // The expired request left the queue (the batcher sweeps it out just after) and never ran.
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = stats(&s, "long_delay").await;
        if m["inference_stats"]["fail"]["count"] == 1 || Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(m["inference_stats"]["fail"]["count"], 1, "{m}");
    assert_eq!(m["inference_count"], 0, "{m}");
    let metrics = reqwest::get(format!("{}/metrics", s.metrics)).await.expect("m").text().await.expect("t");
    assert!(metrics.contains("nv_inference_pending_request_count{model=\"long_delay\",version=\"1\"} 0"), "{metrics}");
}

/// Threads of a process by name (`comm`), each with its nice value.
fn thread_nice_values(pid: u32) -> Vec<(String, i64)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the server's threads");
    tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("stat")).ok()?;
            // `pid (comm) state ...`: comm may hold spaces, so split after its closing parenthesis;
            // nice is the 19th field, the 17th after the comm.
            let (head, rest) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1.to_string();
            let nice = rest.split_whitespace().nth(16)?.parse().ok()?;
            Some((comm, nice))
        })
        .collect()
}

#[test]
fn instance_and_intra_op_threads_take_the_configured_nice_value_and_network_threads_do_not() {
    let config = "max_batch_size: 8\ninstance_group [{ count: 2, kind: KIND_CPU }]\n\
                  parameters { key: \"intra_op_thread_count\" value: { string_value: \"2\" } }\n";
    // A higher nice value needs no privilege, so this runs as any user.
    let s = TestServer::start_with(&[("niced", config)], &["--instance-nice", "7"]);
    // Models load after the listeners open, and a new thread sets its priority as it starts:
    // wait until both instances of the model are up and every thread has settled.
    let settled = |threads: &[(String, i64)]| {
        let instances = threads.iter().filter(|(comm, _)| comm.starts_with("niced-v1-")).count();
        let network = |comm: &str| matches!(comm, "tessera" | "tokio-rt-worker");
        instances == 2 && threads.iter().filter(|(comm, _)| !network(comm)).all(|(_, nice)| *nice == 7)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut threads = thread_nice_values(s.child.id());
    while !settled(&threads) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        threads = thread_nice_values(s.child.id());
    }
    let instances: Vec<_> = threads.iter().filter(|(comm, _)| comm.starts_with("niced-v1-")).collect();
    assert_eq!(instances.len(), 2, "{threads:?}");
    assert!(instances.iter().all(|(_, nice)| *nice == 7), "{threads:?}");
    // Each instance runs with one pool thread of ONNX Runtime's beside it.
    let pool: Vec<_> = threads.iter().filter(|(comm, _)| comm == "ort-intra-op").collect();
    assert!(pool.len() >= 2, "{threads:?}");
    assert!(pool.iter().all(|(_, nice)| *nice == 7), "{threads:?}");
    let workers: Vec<_> = threads.iter().filter(|(comm, _)| comm == "tokio-rt-worker").collect();
    assert!(!workers.is_empty(), "{threads:?}");
    assert!(workers.iter().all(|(_, nice)| *nice != 7), "{threads:?}");
}

#[tokio::test]
async fn malformed_priority_and_timeout_parameters_are_refused_over_http_and_grpc() {
    use tessera_protocol::inference::InferParameter;
    use tessera_protocol::inference::infer_parameter::ParameterChoice;

    let s = TestServer::start_with(&[("batch_add", BATCHING)], &[]);
    let client = reqwest::Client::new();
    let url = format!("{}/v2/models/batch_add/infer", s.http);
    let bad = [
        ("timeout", json!(-5), "parameter 'timeout'"),
        ("timeout", json!("soon"), "parameter 'timeout'"),
        ("timeout", json!(1.5), "parameter 'timeout'"),
        ("priority", json!(-1), "parameter 'priority'"),
        ("priority", json!(2), "priority 2 is out of range"),
    ];
    for (name, value, message) in &bad {
        let mut body = request(0);
        body["parameters"] = json!({ *name: value });
        let resp = client.post(&url).json(&body).send().await.expect("request");
        let status = resp.status().as_u16();
        let answer: Value = resp.json().await.expect("json");
        assert_eq!(status, 400, "{name}={value}: {answer}");
        assert!(answer["error"].as_str().is_some_and(|e| e.contains(message)), "{name}={value}: {answer}");
    }

    let mut grpc = GrpcInferenceServiceClient::connect(s.grpc.clone()).await.expect("connect");
    let mut call = grpc_request("batch_add");
    let choice = ParameterChoice::StringParam("soon".into());
    call.parameters.insert("timeout".into(), InferParameter { parameter_choice: Some(choice) });
    let err = grpc.model_infer(call).await.expect_err("a malformed timeout");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("parameter 'timeout'"), "{}", err.message());

    // A well-formed timeout still runs; the refusals are the client's mistakes (OTHER), not
    // queue rejections.
    let mut body = request(1);
    body["parameters"] = json!({ "timeout": 1_000_000 });
    let resp = client.post(&url).json(&body).send().await.expect("request");
    assert_eq!(resp.status().as_u16(), 200);
    let m = stats(&s, "batch_add").await;
    assert_eq!(m["inference_stats"]["fail"]["count"], bad.len() + 1, "{m}");
    assert_eq!(m["inference_stats"]["success"]["count"], 1, "{m}");
    let metrics = reqwest::get(format!("{}/metrics", s.metrics)).await.expect("m").text().await.expect("t");
    let failures =
        |reason: &str| format!("nv_inference_request_failure{{model=\"batch_add\",version=\"1\",reason=\"{reason}\"}}");
    assert!(metrics.contains(&format!("{} {}", failures("OTHER"), bad.len() + 1)), "{metrics}");
    assert!(metrics.contains(&format!("{} 0", failures("REJECTED"))), "{metrics}");
}

/// Writes `onnx_builder::busy` as model `name` with `config` into a running explicit-mode server's
/// repository and loads it.
async fn load_busy(server: &TestServer, name: &str, config: &str) {
    let dir = server.repository().join(name);
    std::fs::create_dir_all(dir.join("1")).expect("mkdir");
    std::fs::write(dir.join("1/model.onnx"), tessera_data_plane::tools::onnx_builder::busy(BUSY_COPIES, BUSY_ROUNDS))
        .expect("write model");
    std::fs::write(dir.join("config.pbtxt"), config).expect("write config");
    let url = format!("{}/v2/repository/models/{name}/load", server.http);
    let resp = reqwest::Client::new().post(url).json(&json!({})).send().await.expect("load");
    assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text().await);
}

/// Work per row of the busy test model: a run of `rows` rows takes about `rows` times as long.
const BUSY_COPIES: i64 = 4_000;
const BUSY_ROUNDS: usize = 400;

/// One request of `rows` rows to a one-input [-1, 16] model, with `id`; returns (status, id, when
/// the answer came, relative to `t0`).
async fn timed_request(
    server: &TestServer,
    model: &str,
    rows: usize,
    id: &str,
    t0: Instant,
) -> (u16, String, Duration) {
    let data: Vec<f32> = (0..rows * 16).map(|i| i as f32).collect();
    let body = json!({"id": id, "inputs": [{"name": "INPUT0", "shape": [rows, 16], "datatype": "FP32", "data": data}]});
    let url = format!("{}/v2/models/{model}/infer", server.http);
    let resp = reqwest::Client::new().post(url).json(&body).send().await.expect("infer");
    let at = t0.elapsed();
    let status = resp.status().as_u16();
    let answer: Value = resp.json().await.unwrap_or(Value::Null);
    if status == 200 {
        assert_eq!(answer["outputs"][0]["data"][15], 15.0, "the busy model gives its input back: {answer}");
    }
    (status, answer["id"].as_str().unwrap_or_default().to_string(), at)
}

#[tokio::test]
async fn preserve_ordering_answers_in_batch_order_when_instances_finish_out_of_order() {
    let s = TestServer::start(&["--model-control-mode", "explicit"]);
    let two = "max_batch_size: 8\ninstance_group [{ count: 2, kind: KIND_CPU }]\n";
    load_busy(&s, "unordered", &format!("{two}dynamic_batching {{ }}\n")).await;
    load_busy(&s, "ordered", &format!("{two}dynamic_batching {{ preserve_ordering: true }}\n")).await;
    // A long run on one instance, then, once it is under way, a short one on the other.
    let race = |model: &'static str| {
        let s = &s;
        async move {
            let t0 = Instant::now();
            let long = timed_request(s, model, 8, "long", t0);
            // Late enough for the long run to be under way, early enough that the short one
            // (an eighth of its work) ends first even on a fast machine: the long run takes
            // about 60 ms here, the short one about 8 ms.
            let short = async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                timed_request(s, model, 1, "short", t0).await
            };
            let (long, short) = tokio::join!(long, short);
            assert_eq!((long.0, long.1.as_str(), short.0, short.1.as_str()), (200, "long", 200, "short"));
            (long.2, short.2)
        }
    };
    // Without ordering the short run answers first. That only shows the setup can tell the two
    // apart, and two busy cores shared with other tests' servers can starve the short run's
    // thread once, so it has three tries.
    let mut unordered = Vec::new();
    for _ in 0..3 {
        let (long, short) = race("unordered").await;
        unordered.push((short, long));
        if short < long {
            break;
        }
    }
    assert!(
        unordered.iter().any(|(short, long)| short < long),
        "without ordering the short run answers first (short, long: {unordered:?})"
    );
    let (long, short) = race("ordered").await;
    // The server releases the short answer only after the long one; the two connections then
    // write their responses independently, so allow the clients a little skew.
    let skew = Duration::from_millis(30);
    assert!(
        short + skew >= long,
        "with preserve_ordering the short run waits for the long one ({short:?} vs {long:?})"
    );
}

#[tokio::test]
async fn sub_millisecond_queue_delays_are_kept_to_the_microsecond() {
    let config = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 100 }\n";
    let s = TestServer::start_with(&[("short_delay", config)], &[]);
    let queue_ns = |m: &Value| m["inference_stats"]["queue"]["ns"].as_u64().unwrap_or(0);
    let mut waits = Vec::new();
    let mut before = queue_ns(&stats(&s, "short_delay").await);
    for i in 0..20 {
        let (status, body) = infer_many(&s, "short_delay", 1).await.remove(0);
        assert_eq!(status, 200, "request {i}: {body}");
        let after = queue_ns(&stats(&s, "short_delay").await);
        waits.push(Duration::from_nanos(after - before));
        before = after;
    }
    // Each lone request waits out the 100 µs delay, never less. A millisecond timer makes every
    // wait 1-2 ms; the fastest of these shows the resolution even on a busy test machine.
    assert!(waits.iter().all(|w| *w >= Duration::from_micros(100)), "{waits:?}");
    let fastest = waits.iter().min().copied().unwrap_or_default();
    assert!(fastest < Duration::from_micros(700), "fastest queue wait {fastest:?} of {waits:?}");
}
