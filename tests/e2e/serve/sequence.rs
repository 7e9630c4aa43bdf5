//! Stateful models through the sequence batcher, end to end: a sequence's state carried from
//! request to request over gRPC and HTTP, numeric and string ids, and Triton's refusal of a
//! request that does not start its sequence. `scripts/test.sh` also runs this with
//! `TESSERA_RUNNER=true` (the model in a runner process).

use serde_json::{Value, json};
use tessera_data_plane::tools::onnx_builder as onnx;
use tessera_protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tessera_protocol::inference::infer_parameter::ParameterChoice;
use tessera_protocol::inference::model_infer_request::InferInputTensor;
use tessera_protocol::inference::{InferParameter, ModelInferRequest};

use super::TestServer;

fn request(value: i32, id: ParameterChoice, start: bool, end: bool) -> ModelInferRequest {
    let param = |c| InferParameter { parameter_choice: Some(c) };
    let mut r = ModelInferRequest {
        model_name: "accumulator".into(),
        inputs: vec![InferInputTensor {
            name: "INPUT".into(),
            datatype: "INT32".into(),
            shape: vec![1, 1],
            ..Default::default()
        }],
        raw_input_contents: vec![value.to_le_bytes().to_vec().into()],
        ..Default::default()
    };
    r.parameters.insert("sequence_id".into(), param(id));
    r.parameters.insert("sequence_start".into(), param(ParameterChoice::BoolParam(start)));
    r.parameters.insert("sequence_end".into(), param(ParameterChoice::BoolParam(end)));
    r
}

async fn start_server() -> TestServer {
    let s = TestServer::start(&["--model-control-mode", "explicit"]);
    let dir = s.repository().join("accumulator");
    std::fs::create_dir_all(dir.join("1")).expect("mkdir");
    std::fs::write(dir.join("1/model.onnx"), onnx::accumulator()).expect("write model");
    std::fs::write(dir.join("config.pbtxt"), onnx::ACCUMULATOR_CONFIG).expect("write config");
    let url = format!("{}/v2/repository/models/accumulator/load", s.http);
    let resp = reqwest::Client::new().post(url).send().await.expect("load");
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap_or_default());
    s
}

#[tokio::test]
async fn a_sequence_carries_its_state_and_a_finished_one_needs_a_start() {
    let s = start_server().await;
    let mut client = GrpcInferenceServiceClient::connect(s.grpc.clone()).await.expect("connect");
    let num = || ParameterChoice::Uint64Param(42);
    let mut totals = Vec::new();
    for (i, v) in [3, 4, 10].into_iter().enumerate() {
        let answer = client.model_infer(request(v, num(), i == 0, i == 2)).await.expect("infer").into_inner();
        let bytes: [u8; 4] = answer.raw_output_contents[0][..4].try_into().expect("one INT32");
        totals.push(i32::from_le_bytes(bytes));
    }
    assert_eq!(totals, vec![3, 7, 17]);
    let err = client.model_infer(request(1, num(), false, false)).await.expect_err("ended");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        err.message(),
        "inference request for sequence 42 to model 'accumulator' must specify the START flag on the first request of the sequence"
    );

    let http = reqwest::Client::new();
    let url = format!("{}/v2/models/accumulator/infer", s.http);
    let body = |v: i32, start: bool| {
        json!({
            "parameters": {"sequence_id": "text-id", "sequence_start": start},
            "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [v]}]
        })
    };
    let mut outputs = Vec::new();
    for (v, start) in [(5, true), (6, false)] {
        let resp = http.post(&url).json(&body(v, start)).send().await.expect("infer");
        assert_eq!(resp.status(), 200);
        let answer: Value = resp.json().await.expect("json");
        outputs.push(answer["outputs"][0]["data"][0].clone());
    }
    assert_eq!(outputs, vec![json!(5), json!(11)]);
    let resp = http
        .post(&url)
        .json(&json!({"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}))
        .send()
        .await
        .expect("infer");
    assert_eq!(resp.status(), 400);
    let answer: Value = resp.json().await.expect("json");
    assert_eq!(
        answer["error"],
        "inference request to model 'accumulator' must specify a non-zero or non-empty correlation ID"
    );
}
