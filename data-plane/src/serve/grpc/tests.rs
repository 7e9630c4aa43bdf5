//! The gRPC rules with authentication on, through a real server and the generated client:
//! health open, `authorization` metadata for everything else (once per stream), models resolved
//! in the caller's tenant, model control refused, statistics for every key of the tenant.

use tessera_protocol::health::health_client::HealthClient;
use tessera_protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tessera_protocol::inference::model_infer_request::InferInputTensor;
use tonic::Code;
use tonic::transport::Channel;

use super::*;
use crate::auth::test_support::*;

/// A server on port 0 over the two-tenant state; stops when dropped.
struct TestServer {
    channel: Channel,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start() -> TestServer {
    let (state, dir) = tenant_state().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("an address");
    let shutdown = CancellationToken::new();
    tokio::spawn(serve(listener, state, shutdown.clone(), None));
    let channel = Channel::from_shared(format!("http://{addr}")).expect("a URI").connect().await.expect("connect");
    TestServer { channel, shutdown, _dir: dir }
}

impl TestServer {
    fn client(&self) -> GrpcInferenceServiceClient<Channel> {
        GrpcInferenceServiceClient::new(self.channel.clone())
    }
}

/// `message` with `authorization: Bearer <key>` when a key is given.
fn with_key<T>(message: T, key: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(key) = key {
        let value = format!("Bearer {key}").parse().expect("ASCII metadata");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

fn infer_request(model: &str) -> ModelInferRequest {
    let tensor = |name: &str, value: f32| InferInputTensor {
        name: name.into(),
        datatype: "FP32".into(),
        shape: vec![1, 16],
        contents: Some(InferTensorContents { fp32_contents: vec![value; 16], ..Default::default() }),
        ..Default::default()
    };
    ModelInferRequest {
        model_name: model.into(),
        inputs: vec![tensor("INPUT0", 1.0), tensor("INPUT1", 2.0)],
        ..Default::default()
    }
}

#[tokio::test]
async fn health_stays_open_and_everything_else_needs_a_credential() {
    let server = start().await;
    let mut client = server.client();
    assert!(client.server_live(ServerLiveRequest {}).await.expect("open").into_inner().live);
    assert!(client.server_ready(ServerReadyRequest {}).await.expect("open").into_inner().ready);
    let health = HealthClient::new(server.channel.clone()).check(HealthCheckRequest::default()).await;
    assert_eq!(health.expect("open").into_inner().status, ServingStatus::Serving as i32);

    for key in [None, Some("tsk_unknown"), Some("not-a-jwt")] {
        let refused = [
            client.server_metadata(with_key(ServerMetadataRequest {}, key)).await.map(drop),
            client
                .model_metadata(with_key(ModelMetadataRequest { name: "add_sub".into(), ..Default::default() }, key))
                .await
                .map(drop),
            client
                .model_ready(with_key(ModelReadyRequest { name: "add_sub".into(), ..Default::default() }, key))
                .await
                .map(drop),
            client
                .model_config(with_key(ModelConfigRequest { name: "add_sub".into(), ..Default::default() }, key))
                .await
                .map(drop),
            client.model_statistics(with_key(ModelStatisticsRequest::default(), key)).await.map(drop),
            client.model_infer(with_key(infer_request("add_sub"), key)).await.map(drop),
        ];
        for (i, result) in refused.into_iter().enumerate() {
            assert_eq!(result.expect_err("refused").code(), Code::Unauthenticated, "call {i} with {key:?}");
        }
    }
    let metadata = client.server_metadata(with_key(ServerMetadataRequest {}, Some(A_INFERENCE))).await;
    assert_eq!(metadata.expect("allowed").into_inner().name, "tessera");
}

#[tokio::test]
async fn models_resolve_in_the_callers_tenant() {
    let server = start().await;
    let mut client = server.client();
    let reply = client.model_infer(with_key(infer_request("add_sub"), Some(A_INFERENCE))).await.expect("infer");
    let reply = reply.into_inner();
    assert_eq!((reply.model_name.as_str(), reply.model_version.as_str()), ("add_sub", "1"));
    let reply = client.model_infer(with_key(infer_request("add_sub"), Some(B_DEPLOYER))).await.expect("infer");
    assert_eq!(reply.into_inner().model_version, "2");

    let metadata = client
        .model_metadata(with_key(
            ModelMetadataRequest { name: "add_sub".into(), ..Default::default() },
            Some(A_INFERENCE),
        ))
        .await
        .expect("metadata")
        .into_inner();
    assert_eq!((metadata.name.as_str(), metadata.versions), ("add_sub", vec!["1".to_string()]));

    let cross = client.model_infer(with_key(infer_request("only_b"), Some(A_INFERENCE))).await.expect_err("404");
    let unknown = client.model_infer(with_key(infer_request("nope"), Some(A_INFERENCE))).await.expect_err("404");
    assert_eq!((cross.code(), unknown.code()), (Code::NotFound, Code::NotFound));
    assert_eq!(cross.message(), unknown.message().replace("nope", "only_b"));
    let config = ModelConfigRequest { name: "only_b".into(), ..Default::default() };
    assert_eq!(client.model_config(with_key(config, Some(A_INFERENCE))).await.expect_err("404").code(), Code::NotFound);
    let ready = client
        .model_ready(with_key(ModelReadyRequest { name: "only_b".into(), ..Default::default() }, Some(A_INFERENCE)))
        .await
        .expect("answered");
    assert!(!ready.into_inner().ready);
}

#[tokio::test]
async fn streams_check_the_credential_once_and_resolve_in_the_callers_tenant() {
    let server = start().await;
    let mut client = server.client();
    let requests = futures::stream::iter([infer_request("add_sub"), infer_request("only_b")]);
    let mut responses =
        client.model_stream_infer(with_key(requests, Some(A_INFERENCE))).await.expect("stream opens").into_inner();
    let first = responses.message().await.expect("a message").expect("a response");
    assert_eq!(first.infer_response.expect("inferred").model_version, "1");
    let second = responses.message().await.expect("a message").expect("a response");
    assert!(second.error_message.starts_with("Request for unknown model: 'only_b'"), "{}", second.error_message);

    let requests = futures::stream::iter([infer_request("add_sub")]);
    let refused = client.model_stream_infer(with_key(requests, None)).await;
    let code = match refused {
        Err(status) => status.code(),
        Ok(stream) => stream.into_inner().message().await.expect_err("refused").code(),
    };
    assert_eq!(code, Code::Unauthenticated);
}

#[tokio::test]
async fn model_control_is_refused_whatever_the_role() {
    let server = start().await;
    let mut client = server.client();
    for key in [None, Some(A_INFERENCE), Some(B_DEPLOYER)] {
        let refused = [
            client.repository_index(with_key(RepositoryIndexRequest::default(), key)).await.map(drop),
            client
                .repository_model_load(with_key(
                    RepositoryModelLoadRequest { model_name: "add_sub".into(), ..Default::default() },
                    key,
                ))
                .await
                .map(drop),
            client
                .repository_model_unload(with_key(
                    RepositoryModelUnloadRequest { model_name: "add_sub".into(), ..Default::default() },
                    key,
                ))
                .await
                .map(drop),
        ];
        for (i, result) in refused.into_iter().enumerate() {
            let status = result.expect_err("refused");
            assert_eq!(status.code(), Code::PermissionDenied, "call {i} with {key:?}");
            assert_eq!(status.message(), "model control is managed by the control plane");
        }
    }
}

#[tokio::test]
async fn statistics_are_for_any_key_of_the_tenant_and_show_only_its_models() {
    let server = start().await;
    let mut client = server.client();
    let all = ModelStatisticsRequest::default;
    let refused = client.model_statistics(with_key(all(), None)).await.expect_err("401");
    assert_eq!(refused.code(), Code::Unauthenticated);

    let names = |stats: ModelStatisticsResponse| -> Vec<(String, String)> {
        stats.model_stats.into_iter().map(|m| (m.name, m.version)).collect()
    };
    // An inference key reads its tenant's statistics, as perf_analyzer does with it.
    for key in [A_INFERENCE, A_VIEWER] {
        let own = client.model_statistics(with_key(all(), Some(key))).await.expect("allowed").into_inner();
        assert_eq!(names(own), [("add_sub".to_string(), "1".to_string())]);
    }
    let other = client.model_statistics(with_key(all(), Some(B_DEPLOYER))).await.expect("allowed").into_inner();
    assert_eq!(names(other), [("add_sub".into(), "2".into()), ("only_b".into(), "1".into())]);
    let cross = ModelStatisticsRequest { name: "only_b".into(), ..Default::default() };
    assert_eq!(client.model_statistics(with_key(cross, Some(A_VIEWER))).await.expect_err("404").code(), Code::NotFound);
}

/// `payload` as one uncompressed gRPC message frame.
fn frame(payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a test message under 4 GiB");
    [&[0u8][..], &len.to_be_bytes(), payload].concat()
}

/// An `add_sub` request with this id, as a frame.
fn request_frame(id: &str) -> Vec<u8> {
    frame(&ModelInferRequest { id: id.into(), ..infer_request("add_sub") }.encode_to_vec())
}

/// What the stream handler answers tenant A for these frames, read by tonic's own decoder.
async fn stream_answers(state: Arc<ServerState>, frames: &[Vec<u8>]) -> Vec<Result<ModelStreamInferResponse, Status>> {
    use tonic::codec::Codec as _;
    let decoder = tonic_prost::ProstCodec::<ModelStreamInferResponse, ModelInferRequest>::new().decoder();
    let body = http_body_util::Full::new(bytes::Bytes::from(frames.concat()));
    let incoming = Streaming::new_request(decoder, body, None, Some(crate::serve::server::DEFAULT_MAX_INPUT_SIZE));
    let service = InferenceService { state };
    let answers = service.model_stream_infer(with_key(incoming, Some(A_INFERENCE))).await.expect("the stream opens");
    answers.into_inner().collect().await
}

#[tokio::test]
async fn an_unreadable_stream_message_ends_the_stream_with_its_code_after_the_answers_before_it() {
    let (state, _dir) = tenant_state().await;
    let too_large = u32::try_from(crate::serve::server::DEFAULT_MAX_INPUT_SIZE + 1).expect("the limit fits a frame");
    let cases = [
        (frame(&[0xff; 4]), Code::InvalidArgument, "failed to decode Protobuf message"),
        ([&[0u8][..], &too_large.to_be_bytes()].concat(), Code::ResourceExhausted, "length too large"),
    ];
    for (bad, code, reason) in cases {
        let answers = stream_answers(state.clone(), &[request_frame("a"), bad, request_frame("b")]).await;
        assert_eq!(answers.len(), 2, "{answers:?}");
        let first = answers[0].as_ref().expect("an answer");
        assert_eq!(first.infer_response.as_ref().map(|r| r.id.as_str()), Some("a"), "{first:?}");
        let status = answers[1].as_ref().expect_err("the stream ends with a status");
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().starts_with("stream message 2 could not be read"), "{}", status.message());
        assert!(status.message().contains(reason), "{}", status.message());
    }
}

#[tokio::test]
async fn in_band_stream_errors_name_the_request_that_failed() {
    let (state, _dir) = tenant_state().await;
    let unknown = ModelInferRequest { id: "x".into(), model_version: "3".into(), ..infer_request("only_b") };
    let answers = stream_answers(state, &[frame(&unknown.encode_to_vec()), request_frame("a")]).await;
    assert_eq!(answers.len(), 2, "{answers:?}");
    let failed = answers[0].as_ref().expect("answered in-band");
    assert!(failed.error_message.starts_with("Request for unknown model: 'only_b'"), "{}", failed.error_message);
    let echo = failed.infer_response.as_ref().expect("the failed request named");
    assert_eq!((echo.id.as_str(), echo.model_name.as_str(), echo.model_version.as_str()), ("x", "only_b", "3"));
    assert!(echo.outputs.is_empty() && echo.raw_output_contents.is_empty());
    let ok = answers[1].as_ref().expect("answered");
    assert!(ok.error_message.is_empty(), "{}", ok.error_message);
}

#[tokio::test]
async fn over_tls_calls_are_served_and_plain_clients_are_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (files, _) = tessera_protocol::tls::local::ensure(dir.path(), &["localhost"]).expect("certificate");
    let tls = crate::serve::net::tls::TlsAcceptor::load(files.pair).expect("loads");
    let (state, _models) = tenant_state().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("an address").port();
    let shutdown = CancellationToken::new();
    tokio::spawn(serve(listener, state, shutdown.clone(), Some(tls)));

    let verifier = tessera_protocol::tls::server_verifier(Some(&files.ca)).expect("verifier");
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .expect("a URI")
        .tls_config_with_verifier(tonic::transport::ClientTlsConfig::new(), verifier)
        .expect("tls")
        .connect()
        .await
        .expect("connect over TLS");
    let mut client = GrpcInferenceServiceClient::new(channel);
    let reply = client.model_infer(with_key(infer_request("add_sub"), Some(A_INFERENCE))).await.expect("infer");
    assert_eq!(reply.into_inner().model_name, "add_sub");

    let plain = Channel::from_shared(format!("http://localhost:{port}")).expect("a URI").connect().await;
    let refused = match plain {
        Ok(channel) => GrpcInferenceServiceClient::new(channel).server_live(ServerLiveRequest {}).await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "a plain client is not served on a TLS listener");
    shutdown.cancel();
}

#[tokio::test]
async fn trace_settings_are_a_platform_admins() {
    let server = start().await;
    let mut client = server.client();
    let request = |model: &str, rate: Option<&str>| TraceSettingRequest {
        model_name: model.into(),
        settings: rate
            .map(|r| {
                let value = trace_setting_request::SettingValue { value: vec![r.to_string()] };
                std::collections::HashMap::from([("trace_rate".to_string(), value)])
            })
            .unwrap_or_default(),
    };
    for key in [None, Some(A_INFERENCE), Some(B_DEPLOYER)] {
        let status = client.trace_setting(with_key(request("", Some("1")), key)).await.expect_err("refused");
        let code = if key.is_none() { Code::Unauthenticated } else { Code::PermissionDenied };
        assert_eq!(status.code(), code, "{key:?}");
    }
    let tenant_model = format!("{TENANT_A}/add_sub");
    let changed = client.trace_setting(with_key(request(&tenant_model, Some("4")), Some(PLATFORM_ADMIN))).await;
    let settings = changed.expect("an admin changes a tenant's model").into_inner().settings;
    assert_eq!(settings["trace_rate"].value, ["4"]);
    let unknown = client.trace_setting(with_key(request("add_sub", None), Some(PLATFORM_ADMIN))).await;
    let status = unknown.expect_err("no such key");
    assert_eq!((status.code(), status.message()), (Code::InvalidArgument, "Request for unknown model : add_sub"));
}

/// A server on port 0 over the two-tenant state whose connections' body clocks tick every
/// `tick`: its address, an HTTP/2 connection to it, its shutdown, and the task serving it.
async fn start_ticking(
    tick: std::time::Duration,
) -> (std::net::SocketAddr, h2::client::SendRequest<bytes::Bytes>, CancellationToken, tokio::task::JoinHandle<()>) {
    let (state, dir) = tenant_state().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("an address");
    let shutdown = CancellationToken::new();
    let timeouts = serve::Timeouts { header: std::time::Duration::from_secs(10), tick, ..serve::Timeouts::DEFAULT };
    let served = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            serve::serve_with(listener, routes(state), shutdown, None, timeouts).await;
            drop(dir);
        }
    });
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
    tokio::spawn(connection);
    (addr, send, shutdown, served)
}

/// Opens a call to `method` as tenant A over `send`; its body is sent by the caller.
fn open_call(
    send: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: std::net::SocketAddr,
    method: &str,
) -> (h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>) {
    let request = http::Request::post(format!("http://{addr}/inference.GRPCInferenceService/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {A_INFERENCE}"))
        .body(())
        .expect("a request");
    send.send_request(request, false).expect("the call opens")
}

/// A call's `grpc-status` and `grpc-message` (from its trailers, or a trailers-only head), and
/// its messages' bytes.
async fn finish(answer: h2::client::ResponseFuture) -> (String, String, bytes::Bytes) {
    let (head, mut body) = answer.await.expect("an answer").into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("the answer's data");
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.expect("the trailers").unwrap_or(head.headers);
    let status = Status::from_header_map(&trailers).expect("a grpc-status");
    (format!("{:?}", status.code()), status.message().to_string(), data.into())
}

#[tokio::test]
async fn a_unary_call_whose_body_stalls_is_refused_and_cannot_hold_shutdown() {
    let tick = std::time::Duration::from_millis(200);
    let (addr, mut send, shutdown, served) = start_ticking(tick).await;

    // Half a message, then nothing.
    let whole = request_frame("stalled");
    let (answer, mut body) = open_call(&mut send, addr, "ModelInfer");
    body.send_data(bytes::Bytes::copy_from_slice(&whole[..whole.len() / 2]), false).expect("half sent");
    let started = std::time::Instant::now();
    let finished = tokio::time::timeout(std::time::Duration::from_secs(5), finish(answer)).await;
    let (code, message, _) = finished.expect("the stalled call was answered within 5 s");
    let waited = started.elapsed();
    assert_eq!(code, "InvalidArgument", "{message}");
    assert!(message.contains("the request's body sent nothing for 0.2 s or more"), "{message}");
    assert!(waited >= tick && waited < tick * 4, "refused after {waited:?}");

    // The connection serves on: a whole call sent slowly, a piece every half interval, is answered.
    let (answer, mut body) = open_call(&mut send, addr, "ModelInfer");
    let mut pieces = whole.chunks(whole.len() / 4 + 1).peekable();
    while let Some(piece) = pieces.next() {
        tokio::time::sleep(tick / 2).await;
        body.send_data(bytes::Bytes::copy_from_slice(piece), pieces.peek().is_none()).expect("a piece sent");
    }
    let (code, message, data) = finish(answer).await;
    assert_eq!(code, "Ok", "{message}");
    let answered = ModelInferResponse::decode(&data[5..]).expect("an answer");
    assert_eq!(answered.id, "stalled");

    // A stalled call in progress does not hold a graceful shutdown.
    let (answer, mut body) = open_call(&mut send, addr, "ModelInfer");
    body.send_data(bytes::Bytes::copy_from_slice(&whole[..3]), false).expect("a piece sent");
    tokio::time::sleep(tick / 2).await;
    shutdown.cancel();
    let (code, _, _) = finish(answer).await;
    assert_eq!(code, "InvalidArgument");
    tokio::time::timeout(std::time::Duration::from_secs(5), served).await.expect("shut down").expect("served");
}

#[tokio::test]
async fn a_stream_may_idle_between_its_messages() {
    let tick = std::time::Duration::from_millis(100);
    let (addr, mut send, shutdown, _served) = start_ticking(tick).await;
    let (answer, mut body) = open_call(&mut send, addr, "ModelStreamInfer");
    // Five intervals without a message, then one.
    tokio::time::sleep(tick * 5).await;
    body.send_data(request_frame("late").into(), true).expect("sent");
    let (code, message, data) = finish(answer).await;
    assert_eq!(code, "Ok", "{message}");
    let answered = ModelStreamInferResponse::decode(&data[5..]).expect("an answer");
    assert!(answered.error_message.is_empty(), "{}", answered.error_message);
    assert_eq!(answered.infer_response.map(|r| r.id).as_deref(), Some("late"));
    shutdown.cancel();
}
