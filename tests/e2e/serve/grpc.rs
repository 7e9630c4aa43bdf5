//! The gRPC endpoint through the generated tonic client.

use tessera_protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tessera_protocol::inference::model_infer_request::InferInputTensor;
use tessera_protocol::inference::*;
use tonic::transport::Channel;

use super::{TestServer, f32_values, raw_infer_request};

async fn connect(s: &TestServer) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::connect(s.grpc.clone()).await.expect("connect")
}

fn input(name: &str, values: &[f32]) -> InferInputTensor {
    InferInputTensor { name: name.into(), datatype: "FP32".into(), shape: vec![1, 16], ..Default::default() }
        .with_contents(values)
}

trait WithContents {
    fn with_contents(self, values: &[f32]) -> Self;
}

impl WithContents for InferInputTensor {
    fn with_contents(mut self, values: &[f32]) -> Self {
        self.contents = Some(InferTensorContents { fp32_contents: values.to_vec(), ..Default::default() });
        self
    }
}

fn raw_request(id: &str, a: &[f32], b: &[f32]) -> ModelInferRequest {
    raw_infer_request("add_sub", id, a, b)
}

#[tokio::test]
async fn typed_and_raw_requests_answer_with_raw_outputs() {
    let s = TestServer::start(&[]);
    let mut client = connect(&s).await;
    let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let b = vec![2.0f32; 16];
    let typed = ModelInferRequest {
        model_name: "add_sub".into(),
        inputs: vec![input("INPUT0", &a), input("INPUT1", &b)],
        ..Default::default()
    };
    for request in [typed, raw_request("r", &a, &b)] {
        let resp = client.model_infer(request).await.expect("infer").into_inner();
        assert_eq!(resp.raw_output_contents.len(), 2);
        assert!(resp.outputs.iter().all(|o| o.contents.is_none()));
        assert_eq!(f32_values(&resp.raw_output_contents[1]), a.iter().map(|x| x - 2.0).collect::<Vec<_>>());
    }
    let live = client.server_live(ServerLiveRequest {}).await.expect("live").into_inner();
    assert!(live.live);
    let ready = client
        .model_ready(ModelReadyRequest { name: "nope".into(), version: String::new() })
        .await
        .expect("ready")
        .into_inner();
    assert!(!ready.ready);
}

#[tokio::test]
async fn errors_carry_grpc_codes() {
    let s = TestServer::start(&[]);
    let mut client = connect(&s).await;
    let a = vec![0.0f32; 16];
    let mut unknown = raw_request("", &a, &a);
    unknown.model_name = "nope".into();
    let err = client.model_infer(unknown).await.expect_err("unknown model");
    assert_eq!(err.code(), tonic::Code::NotFound);
    let mut short = raw_request("", &a, &a);
    short.raw_input_contents[0] = vec![0u8; 8].into();
    let err = client.model_infer(short).await.expect_err("short");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("INPUT0"), "{}", err.message());
    let mut broken = raw_request("", &a, &a);
    broken.model_name = "bad_file".into();
    assert_eq!(client.model_infer(broken).await.expect_err("unavailable").code(), tonic::Code::Unavailable);
}

#[tokio::test]
async fn stream_answers_every_request_in_order_with_errors_in_band() {
    let s = TestServer::start(&[]);
    let mut client = connect(&s).await;
    let requests: Vec<ModelInferRequest> = (0..20)
        .map(|i| {
            let a = vec![i as f32; 16];
            let mut r = raw_request(&i.to_string(), &a, &a);
            if i == 7 {
                r.model_name = "nope".into();
            }
            r
        })
        .collect();
    let stream = client.model_stream_infer(futures::stream::iter(requests)).await.expect("stream").into_inner();
    let responses: Vec<ModelStreamInferResponse> =
        futures::StreamExt::collect::<Vec<_>>(stream).await.into_iter().map(|r| r.expect("message")).collect();
    assert_eq!(responses.len(), 20);
    for (i, r) in responses.iter().enumerate() {
        if i == 7 {
            assert!(r.error_message.contains("nope"), "{}", r.error_message);
            continue;
        }
        let resp = r.infer_response.as_ref().expect("response");
        assert_eq!(resp.id, i.to_string(), "in order");
        assert_eq!(f32_values(&resp.raw_output_contents[0])[0], 2.0 * i as f32);
    }
    let stats = client
        .model_statistics(ModelStatisticsRequest { name: "add_sub".into(), version: String::new() })
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats.model_stats[0].inference_count, 19);
}
