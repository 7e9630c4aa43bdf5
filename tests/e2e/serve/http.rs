//! The KServe v2 REST endpoint through reqwest.

use serde_json::{Value, json};

use super::{TestServer, f32_bytes, f32_values};

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

fn add_sub_json(a: &[f32], b: &[f32]) -> Value {
    json!({
        "id": "req-1",
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": a},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": b},
        ]
    })
}

async fn post(server: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let resp = client().post(format!("{}{path}", server.http)).json(&body).send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn health_metadata_and_config_answer_like_triton() {
    let s = TestServer::start(&[]);
    let live = client().get(format!("{}/v2/health/live", s.http)).send().await.expect("live");
    assert_eq!(live.status(), 200);
    assert!(live.bytes().await.expect("body").is_empty(), "health bodies are empty");
    let meta: Value = client().get(format!("{}/v2", s.http)).send().await.expect("meta").json().await.expect("json");
    let extensions = meta["extensions"].as_array().expect("extensions");
    assert!(extensions.contains(&json!("binary_tensor_data")) && extensions.contains(&json!("statistics")));
    let model: Value =
        client().get(format!("{}/v2/models/add_sub", s.http)).send().await.expect("model").json().await.expect("json");
    assert_eq!(model["inputs"][0], json!({"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}));
    assert_eq!(model["versions"], json!(["1"]));
    let auto: Value = client()
        .get(format!("{}/v2/models/add_sub_auto/config", s.http))
        .send()
        .await
        .expect("config")
        .json()
        .await
        .expect("json");
    assert_eq!(auto["max_batch_size"], 4, "auto-complete picks Triton's default batch size: {auto}");
    assert_eq!(auto["input"][1]["dims"], json!([16]));
    assert_eq!(auto["input"][1]["data_type"], "TYPE_FP32");
    let all: Value = client()
        .get(format!("{}/v2/models/identity_fp32", s.http))
        .send()
        .await
        .expect("versions")
        .json()
        .await
        .expect("json");
    assert_eq!(all["versions"], json!(["3", "5"]));
    let ready = client().get(format!("{}/v2/models/identity_fp32/versions/4/ready", s.http)).send().await.expect("r");
    assert_ne!(ready.status(), 200);
}

#[tokio::test]
async fn json_infer_computes_and_echoes_the_id() {
    let s = TestServer::start(&[]);
    let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let b = vec![1.0f32; 16];
    let (status, body) = post(&s, "/v2/models/add_sub/infer", add_sub_json(&a, &b)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], "req-1");
    assert_eq!(body["model_version"], "1");
    let sum: Vec<f64> = body["outputs"][0]["data"].as_array().expect("data").iter().filter_map(Value::as_f64).collect();
    assert_eq!(sum, (0..16).map(|i| i as f64 + 1.0).collect::<Vec<_>>());
    assert_eq!(body["outputs"][1]["shape"], json!([1, 16]));
}

#[tokio::test]
async fn binary_tensors_travel_both_ways() {
    let s = TestServer::start(&[]);
    let a: Vec<f32> = (0..32).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let header = json!({
        "inputs": [
            {"name": "INPUT0", "shape": [2, 16], "datatype": "FP32", "parameters": {"binary_data_size": 128}},
            {"name": "INPUT1", "shape": [2, 16], "datatype": "FP32", "parameters": {"binary_data_size": 128}},
        ],
        "outputs": [{"name": "OUTPUT1", "parameters": {"binary_data": true}}]
    })
    .to_string();
    let mut body = header.clone().into_bytes();
    body.extend(f32_bytes(&a));
    body.extend(f32_bytes(&b));
    let resp = client()
        .post(format!("{}/v2/models/add_sub/infer", s.http))
        .header("Inference-Header-Content-Length", header.len())
        .body(body)
        .send()
        .await
        .expect("infer");
    assert_eq!(resp.status(), 200);
    let json_len: usize =
        resp.headers()["inference-header-content-length"].to_str().expect("ascii").parse().expect("n");
    let bytes = resp.bytes().await.expect("body");
    let head: Value = serde_json::from_slice(&bytes[..json_len]).expect("json header");
    assert_eq!(head["outputs"].as_array().map(Vec::len), Some(1), "only the requested output: {head}");
    assert_eq!(head["outputs"][0]["parameters"]["binary_data_size"], 128);
    let diff = f32_values(&bytes[json_len..]);
    assert_eq!(diff, a.iter().zip(&b).map(|(x, y)| x - y).collect::<Vec<_>>());
}

#[tokio::test]
async fn bytes_survive_nul_and_non_utf8_values() {
    let s = TestServer::start(&[]);
    let elements: [&[u8]; 3] = [b"a\0b", b"\xff\xfe", b""];
    let mut tail = Vec::new();
    for e in elements {
        tail.extend((e.len() as u32).to_le_bytes());
        tail.extend(e);
    }
    let header = json!({
        "inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "BYTES", "parameters": {"binary_data_size": tail.len()}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": true}}]
    })
    .to_string();
    let mut body = header.clone().into_bytes();
    body.extend(&tail);
    let resp = client()
        .post(format!("{}/v2/models/identity_bytes/infer", s.http))
        .header("Inference-Header-Content-Length", header.len())
        .body(body)
        .send()
        .await
        .expect("infer");
    assert_eq!(resp.status(), 200);
    let json_len: usize =
        resp.headers()["inference-header-content-length"].to_str().expect("ascii").parse().expect("n");
    let bytes = resp.bytes().await.expect("body");
    assert_eq!(&bytes[json_len..], &tail[..]);
}

#[tokio::test]
async fn bad_requests_get_triton_status_codes_and_messages() {
    let s = TestServer::start(&["--http-max-input-size", "4096"]);
    let a = vec![0.0f32; 16];
    let wrong_shape = json!({"inputs": [
        {"name": "INPUT0", "shape": [1, 15], "datatype": "FP32", "data": vec![0.0f32; 15]},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": a},
    ]});
    let wrong_type = json!({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": vec![0; 16]},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": a},
    ]});
    let missing = json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": a}]});
    let count = json!({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": vec![0.0f32; 15]},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": a},
    ]});
    let overflow = json!({"inputs": [
        {"name": "INPUT0", "shape": [4294967296i64, 4294967296i64], "datatype": "FP32", "data": []},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": a},
    ]});
    let mut unknown_output = add_sub_json(&a, &a);
    unknown_output["outputs"] = json!([{"name": "NOPE"}]);
    let cases = [
        ("/v2/models/add_sub/infer", wrong_shape, 400, "shape"),
        ("/v2/models/add_sub/infer", wrong_type, 400, "expects 'FP32'"),
        ("/v2/models/add_sub/infer", missing, 400, "'INPUT1'"),
        ("/v2/models/add_sub/infer", count, 400, "needs 16"),
        ("/v2/models/add_sub/infer", overflow, 400, "INPUT0"),
        ("/v2/models/add_sub/infer", unknown_output, 400, "'NOPE'"),
        ("/v2/models/nope/infer", add_sub_json(&a, &a), 404, "'nope'"),
        ("/v2/models/add_sub/versions/9/infer", add_sub_json(&a, &a), 404, "version 9"),
        ("/v2/models/bad_config/infer", add_sub_json(&a, &a), 503, "not ready"),
        (
            "/v2/models/add_sub/infer",
            json!({"inputs": [{"name": "INPUT0", "shape": [1, 1024], "datatype": "FP32", "data": vec![0.0f32; 1024]}]}),
            413,
            "limit",
        ),
    ];
    for (path, body, status, needle) in cases {
        let (got, json) = post(&s, path, body).await;
        assert_eq!(got, status, "{path}: {json}");
        let message = json["error"].as_str().unwrap_or_else(|| panic!("error body for {path}: {json}"));
        assert!(message.contains(needle), "{path}: '{message}' lacks '{needle}'");
    }
    let malformed = client().post(format!("{}/v2/models/add_sub/infer", s.http)).body("{oops").send().await.expect("r");
    assert_eq!(malformed.status(), 400);
    let header = json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}]})
        .to_string();
    let short = client()
        .post(format!("{}/v2/models/add_sub/infer", s.http))
        .header("Inference-Header-Content-Length", header.len())
        .body([header.as_bytes(), &[0u8; 10]].concat())
        .send()
        .await
        .expect("r");
    assert_eq!(short.status(), 400);
    let method = client().delete(format!("{}/v2/models/add_sub/infer", s.http)).send().await.expect("r");
    assert_eq!(method.status(), 405);
}

#[tokio::test]
async fn repository_index_shows_broken_models_with_reasons_and_stats_count_requests() {
    let s = TestServer::start(&[]);
    let (status, index) = post(&s, "/v2/repository/index", json!({})).await;
    assert_eq!(status, 200);
    let rows = index.as_array().expect("array");
    let row = |name: &str| rows.iter().find(|r| r["name"] == name).cloned().unwrap_or(Value::Null);
    assert_eq!(row("add_sub")["state"], "READY");
    assert_eq!(row("bad_config")["state"], "UNAVAILABLE");
    assert!(row("bad_file")["reason"].as_str().is_some_and(|r| !r.is_empty()));
    let a = vec![1.0f32; 16];
    for _ in 0..3 {
        assert_eq!(post(&s, "/v2/models/add_sub/infer", add_sub_json(&a, &a)).await.0, 200);
    }
    let stats: Value =
        client().get(format!("{}/v2/models/add_sub/stats", s.http)).send().await.expect("s").json().await.expect("j");
    let m = &stats["model_stats"][0];
    assert_eq!(m["inference_count"], 3);
    assert_eq!(m["execution_count"], 3);
    assert_eq!(m["inference_stats"]["success"]["count"], 3);
    assert_eq!(m["batch_stats"][0]["batch_size"], 1);
    let metrics = client().get(format!("{}/metrics", s.metrics)).send().await.expect("m").text().await.expect("t");
    assert!(metrics.contains("nv_inference_request_success{model=\"add_sub\",version=\"1\"} 3"), "{metrics}");
}

#[tokio::test]
async fn explicit_mode_loads_and_unloads_and_other_modes_refuse() {
    let s = TestServer::start(&["--model-control-mode", "explicit", "--load-model", "add_sub"]);
    let ready = |m: &str| client().get(format!("{}/v2/models/{m}/ready", s.http)).send();
    assert_eq!(ready("add_sub").await.expect("r").status(), 200);
    assert_ne!(ready("add_sub_auto").await.expect("r").status(), 200);
    assert_eq!(post(&s, "/v2/repository/models/add_sub_auto/load", json!({})).await.0, 200);
    assert_eq!(ready("add_sub_auto").await.expect("r").status(), 200);
    assert_eq!(post(&s, "/v2/repository/models/add_sub/unload", json!({})).await.0, 200);
    assert_ne!(ready("add_sub").await.expect("r").status(), 200);
    let a = vec![1.0f32; 16];
    assert_eq!(post(&s, "/v2/models/add_sub/infer", add_sub_json(&a, &a)).await.0, 503);
    let config = json!({"parameters": {"config": "{\"max_batch_size\": 2}"}});
    assert_eq!(post(&s, "/v2/repository/models/add_sub/load", config).await.0, 200);
    let cfg: Value =
        client().get(format!("{}/v2/models/add_sub/config", s.http)).send().await.expect("c").json().await.expect("j");
    assert_eq!(cfg["max_batch_size"], 2);
    let (status, _) =
        post(&s, "/v2/repository/models/add_sub/load", json!({"parameters": {"file:1/model.onnx": "AAAA"}})).await;
    assert_eq!(status, 501, "file overrides are refused");

    let none = TestServer::start(&[]);
    let (status, body) = post(&none, "/v2/repository/models/add_sub/unload", json!({})).await;
    assert_eq!(status, 503, "{body}");
}

#[tokio::test]
async fn empty_tensors_run_and_come_back_empty() {
    let s = TestServer::start(&[]);
    let body = json!({"inputs": [{"name": "INPUT0", "shape": [1, 0], "datatype": "FP32", "data": []}]});
    let (status, out) = post(&s, "/v2/models/identity_fp32/infer", body).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["outputs"][0]["shape"], json!([1, 0]));
    assert_eq!(out["outputs"][0]["data"], json!([]));
}

/// The `data` tokens of output `name` in a JSON response, as written (serde_json cannot read
/// `NaN` or `Infinity`, which is what these tests are about).
fn data_tokens(body: &str, name: &str) -> Vec<String> {
    let output = &body[body.find(&format!("\"name\":\"{name}\"")).unwrap_or_else(|| panic!("no {name}: {body}"))..];
    let data = &output[output.find("\"data\":[").unwrap_or_else(|| panic!("no data: {body}")) + 8..];
    data[..data.find(']').expect("closing bracket")].split(',').map(str::to_string).collect()
}

async fn post_text(server: &TestServer, path: &str, body: String) -> (u16, String) {
    let resp = client()
        .post(format!("{}{path}", server.http))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request");
    (resp.status().as_u16(), resp.text().await.expect("body"))
}

#[tokio::test]
async fn nan_and_infinity_round_trip_through_json_like_triton() {
    let s = TestServer::start(&[]);
    let rest = vec!["1"; 13].join(",");
    let body = |outputs: &str| {
        format!(
            r#"{{"inputs":[{{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":[Infinity,-Infinity,NaN,{rest}]}},
                {{"name":"INPUT1","shape":[1,16],"datatype":"FP32","data":[1,1,1,{rest}]}}]{outputs}}}"#
        )
    };
    let (status, text) = post_text(&s, "/v2/models/add_sub/infer", body("")).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(data_tokens(&text, "OUTPUT0")[..4], ["Infinity", "-Infinity", "NaN", "2.0"], "{text}");
    assert_eq!(data_tokens(&text, "OUTPUT1")[..4], ["Infinity", "-Infinity", "NaN", "0.0"], "{text}");

    // The input side alone: JSON tokens in, exact bits out.
    let binary_out = body(r#","outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]"#);
    let resp = client().post(format!("{}/v2/models/add_sub/infer", s.http)).body(binary_out).send().await.expect("r");
    assert_eq!(resp.status(), 200);
    let json_len: usize =
        resp.headers()["inference-header-content-length"].to_str().expect("ascii").parse().expect("n");
    let sum = f32_values(&resp.bytes().await.expect("body")[json_len..]);
    assert!(sum[0] == f32::INFINITY && sum[1] == f32::NEG_INFINITY && sum[2].is_nan(), "{sum:?}");

    // The output side alone: binary non-finite values in, JSON tokens out.
    let header = json!({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}},
    ]})
    .to_string();
    let mut a = vec![0.0f32; 16];
    a[..3].copy_from_slice(&[f32::NAN, 3e38, -3e38]);
    let b = [0.0f32, 3e38, -3e38].iter().copied().chain([0.0; 13]).collect::<Vec<_>>();
    let resp = client()
        .post(format!("{}/v2/models/add_sub/infer", s.http))
        .header("Inference-Header-Content-Length", header.len())
        .body([header.as_bytes(), &f32_bytes(&a), &f32_bytes(&b)].concat())
        .send()
        .await
        .expect("binary in");
    let text = resp.text().await.expect("body");
    assert_eq!(data_tokens(&text, "OUTPUT0")[..3], ["NaN", "Infinity", "-Infinity"], "{text}");

    // Anywhere but in tensor data the tokens stay invalid.
    let (status, text) =
        post_text(&s, "/v2/models/add_sub/infer", body("").replacen("\"shape\":[1,16]", "\"shape\":[1,NaN]", 1)).await;
    assert_eq!(status, 400, "{text}");
    let elsewhere = body(r#","parameters":{"priority":NaN}"#);
    let (status, text) = post_text(&s, "/v2/models/add_sub/infer", elsewhere).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("may only appear in the 'data'"), "{text}");
}

#[tokio::test]
async fn mistyped_and_unsupported_parameters_are_refused_by_name() {
    let s = TestServer::start(&[]);
    let a = vec![1.0f32; 16];
    let with = |params: Value, outputs: Value| {
        let mut body = add_sub_json(&a, &a);
        body["parameters"] = params;
        body["outputs"] = outputs;
        body
    };
    let out0 = |params: Value| json!([{"name": "OUTPUT0", "parameters": params}]);
    let mut zero_batch = add_sub_json(&[], &[]);
    zero_batch["inputs"][0]["shape"] = json!([0, 16]);
    zero_batch["inputs"][1]["shape"] = json!([0, 16]);
    let cases = [
        (with(json!({"binary_data_output": "true"}), json!([])), "'binary_data_output' must be a bool"),
        (with(json!({"binary_data_output": 1}), json!([])), "'binary_data_output' must be a bool"),
        (with(json!({}), out0(json!({"binary_data": "false"}))), "'binary_data' of output 'OUTPUT0' must be a bool"),
        (with(json!({"sequence_id": -1}), json!([])), "'sequence_id' must be an unsigned integer or a string"),
        (with(json!({"sequence_start": "yes"}), json!([])), "'sequence_start' must be a bool"),
        (with(json!({"sequence_end": 1}), json!([])), "'sequence_end' must be a bool"),
        (with(json!({}), out0(json!({"classification": "x"}))), "'classification' of output 'OUTPUT0'"),
        (zero_batch, "batch-size must be at least 1"),
    ];
    for (body, needle) in cases {
        let (status, json) = post(&s, "/v2/models/add_sub/infer", body.clone()).await;
        assert_eq!(status, 400, "{body}: {json}");
        let message = json["error"].as_str().unwrap_or_else(|| panic!("error body for {body}: {json}"));
        assert!(message.contains(needle), "'{message}' lacks '{needle}'");
    }
    let fine = with(
        json!({"binary_data_output": false, "sequence_id": "s1", "sequence_start": true}),
        out0(json!({"classification": 0, "binary_data": false})),
    );
    let (status, json) = post(&s, "/v2/models/add_sub/infer", fine).await;
    assert_eq!(status, 200, "{json}");

    let (status, json) = post(&s, "/v2/repository/index", json!({"ready": "yes"})).await;
    assert_eq!((status, json["error"].as_str()), (400, Some("invalid value for 'ready': expected a boolean")));
    assert_eq!(post(&s, "/v2/repository/index", json!({"ready": true})).await.0, 200);
    let (status, json) = post(&s, "/v2/repository/models/add_sub/load", json!({"parameters": [1]})).await;
    assert_eq!(status, 400, "{json}");
    assert!(json["error"].as_str().is_some_and(|m| m.contains("'parameters' must be a JSON object")), "{json}");
}

#[tokio::test]
async fn transport_level_errors_are_kserve_json_too() {
    let s = TestServer::start(&[]);
    let a = vec![1.0f32; 16];
    let resp = client().post(format!("{}/v2/models/%ff/infer", s.http)).json(&add_sub_json(&a, &a)).send().await;
    let resp = resp.expect("r");
    assert_eq!(resp.status(), 400);
    let json: Value = resp.json().await.expect("a JSON body");
    assert!(json["error"].as_str().is_some_and(|m| m.contains("Invalid UTF-8 in `model`")), "{json}");

    let resp = client()
        .post(format!("{}/v2/models/add_sub/infer", s.http))
        .header("Content-Encoding", "br")
        .body(add_sub_json(&a, &a).to_string())
        .send()
        .await
        .expect("r");
    assert_eq!(resp.status(), 501, "Triton answers an unknown coding with 501");
    assert_eq!(resp.headers()["accept-encoding"], "gzip, deflate");
    let json: Value = resp.json().await.expect("a JSON body");
    let message = json["error"].as_str().unwrap_or_default();
    assert!(message.contains("'br'") && message.contains("gzip, deflate"), "{json}");

    // What is accepted still works, in any case.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, add_sub_json(&a, &a).to_string().as_bytes()).expect("gzip");
    let resp = client()
        .post(format!("{}/v2/models/add_sub/infer", s.http))
        .header("Content-Encoding", "GZIP")
        .body(gz.finish().expect("gzip"))
        .send()
        .await
        .expect("r");
    assert_eq!(resp.status(), 200);

    // A body with binary data but no Inference-Header-Content-Length gets a hint.
    let header = json!({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}},
    ]})
    .to_string();
    let body = [header.as_bytes(), &f32_bytes(&a), &f32_bytes(&a)].concat();
    let resp = client().post(format!("{}/v2/models/add_sub/infer", s.http)).body(body).send().await.expect("r");
    assert_eq!(resp.status(), 400);
    let json: Value = resp.json().await.expect("a JSON body");
    assert!(json["error"].as_str().is_some_and(|m| m.contains("Inference-Header-Content-Length")), "{json}");
}
