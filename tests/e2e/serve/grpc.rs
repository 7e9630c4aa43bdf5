//! The gRPC endpoint through the generated tonic client, and over bare HTTP/2 for what that
//! client cannot send (messages that do not decode, or over the size limit).

use std::io::Write as _;

use prost::Message as _;
use tessera_protocol::health::HealthCheckRequest;
use tessera_protocol::health::health_client::HealthClient;
use tessera_protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tessera_protocol::inference::model_infer_request::InferInputTensor;
use tessera_protocol::inference::*;
use tonic::codec::CompressionEncoding;
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
            let failed = r.infer_response.as_ref().expect("the failed request named");
            assert_eq!((failed.id.as_str(), failed.model_name.as_str()), ("7", "nope"));
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

#[tokio::test]
async fn gzip_and_deflate_compressed_requests_are_answered() {
    let s = TestServer::start(&[]);
    let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
    for encoding in [CompressionEncoding::Gzip, CompressionEncoding::Deflate] {
        let mut client = connect(&s).await.send_compressed(encoding);
        let resp = client.model_infer(raw_request("z", &a, &a)).await.expect("a compressed call").into_inner();
        assert_eq!(f32_values(&resp.raw_output_contents[0]), a.iter().map(|x| 2.0 * x).collect::<Vec<_>>());
        let requests = futures::stream::iter([raw_request("s1", &a, &a), raw_request("s2", &a, &a)]);
        let stream = client.model_stream_infer(requests).await.expect("a compressed stream").into_inner();
        let ids: Vec<String> = futures::StreamExt::collect::<Vec<_>>(stream)
            .await
            .into_iter()
            .map(|r| r.expect("message").infer_response.expect("response").id)
            .collect();
        assert_eq!(ids, ["s1", "s2"], "{encoding:?}");
        let mut health = HealthClient::new(Channel::from_shared(s.grpc.clone()).expect("a URI").connect_lazy())
            .send_compressed(encoding);
        health.check(HealthCheckRequest::default()).await.expect("a compressed health check");
    }
}

/// One call over a bare HTTP/2 connection: the response's messages (compressed flag and
/// payload), its `grpc-encoding`, and its `grpc-status` and `grpc-message` (percent-decoded
/// spaces).
struct RawAnswer {
    messages: Vec<(u8, Vec<u8>)>,
    encoding: Option<String>,
    status: String,
    message: String,
}

/// Calls `method` of GRPCInferenceService with `body` as the request body, as is.
async fn raw_call(s: &TestServer, method: &str, encoding: Option<&str>, body: Vec<u8>) -> RawAnswer {
    use http_body_util::{BodyExt, Full};

    let (mut sender, addr) = super::grpc_connection(s).await;
    let mut request = http::Request::post(format!("http://{addr}/inference.GRPCInferenceService/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-accept-encoding", "gzip,deflate,identity");
    if let Some(encoding) = encoding {
        request = request.header("grpc-encoding", encoding);
    }
    let request = request.body(Full::new(bytes::Bytes::from(body))).expect("a request");
    let response = sender.send_request(request).await.expect("an answer");
    let mut headers = response.headers().clone();
    let body = response.into_body().collect().await.expect("the body");
    if let Some(trailers) = body.trailers() {
        headers.extend(trailers.clone());
    }
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(|v| v.replace("%20", " "));
    RawAnswer {
        messages: messages(&body.to_bytes()),
        encoding: text("grpc-encoding"),
        status: text("grpc-status").unwrap_or_default(),
        message: text("grpc-message").unwrap_or_default(),
    }
}

/// The gRPC messages of a response body.
fn messages(mut data: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while data.len() >= 5 {
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        out.push((data[0], data[5..5 + len].to_vec()));
        data = &data[5 + len..];
    }
    out
}

/// `payload` as one gRPC message frame with the given compressed flag.
fn frame(compressed: u8, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a test message under 4 GiB");
    [&[compressed][..], &len.to_be_bytes(), payload].concat()
}

/// A request for one row of add_sub, as an uncompressed frame.
fn request_frame(id: &str) -> Vec<u8> {
    frame(0, &raw_request(id, &[1.0; 16], &[2.0; 16]).encode_to_vec())
}

/// A request larger than the 4 KiB limit the tests below start the server with.
fn oversized_frame() -> Vec<u8> {
    frame(0, &raw_request(&"x".repeat(5000), &[1.0; 16], &[2.0; 16]).encode_to_vec())
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).expect("compress");
    encoder.finish().expect("compress")
}

#[tokio::test]
async fn a_stream_message_that_cannot_be_read_ends_the_stream_with_its_code_after_the_answers_before_it() {
    let s = TestServer::start(&["--http-max-input-size", "4096"]);
    let cases = [
        (frame(0, &[0xff; 4]), "3", "failed to decode Protobuf message"),
        (oversized_frame(), "8", "decoded message length too large"),
    ];
    for (bad, status, reason) in cases {
        let body = [request_frame("a"), bad, request_frame("b"), request_frame("c")].concat();
        let answer = raw_call(&s, "ModelStreamInfer", None, body).await;
        let responses: Vec<ModelStreamInferResponse> = answer
            .messages
            .iter()
            .map(|(_, m)| ModelStreamInferResponse::decode(m.as_slice()).expect("a stream response"))
            .collect();
        assert_eq!(responses.len(), 1, "{responses:?}");
        assert_eq!(responses[0].infer_response.as_ref().map(|r| r.id.as_str()), Some("a"));
        assert_eq!(answer.status, status, "{}", answer.message);
        assert!(answer.message.starts_with("stream message 2 could not be read"), "{}", answer.message);
        assert!(answer.message.contains(reason), "{}", answer.message);
    }
}

#[tokio::test]
async fn unreadable_unary_requests_are_invalid_arguments_and_oversized_ones_resource_exhausted() {
    let s = TestServer::start(&["--http-max-input-size", "4096"]);
    let cases = [
        ("ModelInfer", None, frame(0, &[0xff; 4]), "3", "failed to decode Protobuf message"),
        ("ModelMetadata", None, frame(0, &[0xff; 4]), "3", "failed to decode Protobuf message"),
        ("ModelInfer", Some("gzip"), frame(1, b"not gzip"), "3", "Error decompressing"),
        ("ModelInfer", None, request_frame("a")[..20].to_vec(), "3", "Unexpected EOF"),
        ("ModelInfer", None, Vec::new(), "3", "Missing request message"),
        ("ModelInfer", None, oversized_frame(), "8", "decoded message length too large"),
    ];
    for (method, encoding, body, status, reason) in cases {
        let answer = raw_call(&s, method, encoding, body).await;
        assert_eq!(answer.status, status, "{method} {reason}: {}", answer.message);
        assert!(answer.message.contains(reason), "{}", answer.message);
    }
}

#[tokio::test]
async fn compressed_requests_get_uncompressed_answers() {
    let s = TestServer::start(&[]);
    let request = raw_request("g", &[1.0; 16], &[2.0; 16]).encode_to_vec();
    let answer = raw_call(&s, "ModelInfer", Some("gzip"), frame(1, &gzip(&request))).await;
    assert_eq!(answer.status, "0", "{}", answer.message);
    assert_eq!(answer.encoding, None);
    let [(flag, response)] = answer.messages.as_slice() else { panic!("one message: {:?}", answer.messages) };
    assert_eq!(*flag, 0, "not compressed");
    let response = ModelInferResponse::decode(response.as_slice()).expect("a response");
    assert_eq!((response.id.as_str(), f32_values(&response.raw_output_contents[0])[0]), ("g", 3.0));
}
