//! `KIND_GPU` in `tessera serve` on a machine whose ONNX Runtime has no CUDA provider (the CPU
//! build the tests run with): the model is UNAVAILABLE with a reason that says what is missing
//! and how to get it, a bad accelerator parameter is named, and the server serves the rest.

use serde_json::{Value, json};

use super::TestServer;

const ADD_SUB_IO: &str = r#"max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"#;

async fn index(server: &TestServer) -> Vec<Value> {
    let resp = reqwest::Client::new()
        .post(format!("{}/v2/repository/index", server.http))
        .json(&json!({}))
        .send()
        .await
        .expect("index");
    assert_eq!(resp.status().as_u16(), 200);
    resp.json().await.expect("json")
}

fn reason<'a>(rows: &'a [Value], model: &str) -> &'a str {
    let row = rows.iter().find(|r| r["name"] == model).unwrap_or_else(|| panic!("{model} listed: {rows:?}"));
    assert_eq!(row["state"], "UNAVAILABLE", "{row}");
    row["reason"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn kind_gpu_without_the_cuda_provider_says_what_is_missing() {
    let gpu = format!("{ADD_SUB_IO}instance_group [ {{ kind: KIND_GPU gpus: [ 0 ] }} ]\n");
    let trt = format!(
        "{ADD_SUB_IO}instance_group [ {{ kind: KIND_GPU }} ]\noptimization {{ execution_accelerators {{ \
         gpu_execution_accelerator: [ {{ name: \"tensorrt\" parameters {{ key: \"precision_mode\" value: \"FP8\" }} }} ] }} }}\n"
    );
    let s = TestServer::start_with(&[("add_sub_gpu", &gpu), ("add_sub_trt", &trt)], &[]);
    let rows = index(&s).await;
    let why = reason(&rows, "add_sub_gpu");
    assert!(
        why.contains("KIND_GPU needs ONNX Runtime's CUDA execution provider, which this ONNX Runtime build (")
            && why.contains("libonnxruntime.so")
            && why.contains("install the GPU build with `scripts/setup-ort.sh --gpu`"),
        "{why}"
    );
    let why = reason(&rows, "add_sub_trt");
    assert!(why.contains("tensorrt accelerator parameter precision_mode: 'FP8' is not one of"), "{why}");
    let ready = rows.iter().find(|r| r["name"] == "add_sub").expect("add_sub listed");
    assert_eq!(ready["state"], "READY", "the other models load");
}
