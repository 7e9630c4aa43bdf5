//! `tessera worker` against an in-process fake control plane: registration, artifact fetch,
//! loading, heartbeats, tenant-scoped authenticated inference (API keys and access tokens),
//! unloading, and serving on while the control plane is gone.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::pkcs8::EncodePrivateKey;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tessera_data_plane::serve::server::BoundAddrs;
use tessera_data_plane::tools::onnx_builder;
use tessera_data_plane::worker::{self, WorkerConfig, WorkerToken};
use tessera_protocol::agent::worker_agent_server::{WorkerAgent, WorkerAgentServer};
use tessera_protocol::agent::{self, control_message, worker_message};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

const TOKEN: &str = "worker-secret";
const TENANT_A: &str = "0190a0a0-0000-7000-8000-00000000000a";
const TENANT_B: &str = "0190a0a0-0000-7000-8000-00000000000b";
/// The fake control plane's token-signing key (seed and id).
const SIGNING_SEED: [u8; 32] = [7; 32];
const SIGNING_KID: &str = "test-key";

/// The control plane as far as one worker can tell.
struct Fake {
    artifacts: HashMap<String, Vec<u8>>,
    registered: watch::Sender<Option<agent::Register>>,
    heartbeat: watch::Sender<Option<agent::Heartbeat>>,
    /// What the fake wants the worker to hold; every change is sent down the session.
    assignments: watch::Sender<agent::Assignments>,
    fetches: AtomicUsize,
    /// Usage stored, each key once (as the control plane's `usage_records` table).
    usage: parking_lot::Mutex<BTreeMap<String, agent::UsageRecord>>,
    /// Usage records received again under a key already stored (replays).
    usage_replays: AtomicUsize,
    /// While set, usage is stored but the answer is an error (the acknowledgment is lost).
    lose_usage_acks: AtomicBool,
    /// Answers lost so.
    usage_acks_lost: AtomicUsize,
    /// While set, `ReportUsage` fails without storing anything (control plane down).
    refuse_usage: AtomicBool,
    /// Capture batches received (as the control plane would store them).
    captures: parking_lot::Mutex<Vec<agent::ReportCaptureRequest>>,
    /// Ends open sessions (so the server can stop).
    stop: CancellationToken,
}

/// The fake's JWKS: the public half of [`SIGNING_SEED`].
fn jwks_json() -> String {
    let x = URL_SAFE_NO_PAD.encode(ed25519_dalek::SigningKey::from_bytes(&SIGNING_SEED).verifying_key().to_bytes());
    json!({ "keys": [{ "kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": SIGNING_KID, "x": x }] })
        .to_string()
}

/// An access token for tenant A, as the control plane issues them, valid from `nbf_in` seconds
/// from now.
fn access_token(nbf_in: i64) -> String {
    let der = ed25519_dalek::SigningKey::from_bytes(&SIGNING_SEED).to_pkcs8_der().expect("an Ed25519 key encodes");
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    let now = i64::try_from(since_epoch.as_secs()).expect("in range");
    let claims = json!({
        "iss": "tessera", "aud": "tessera", "sub": "key-id", "tenant": TENANT_A, "tenant_name": "a",
        "role": "inference", "iat": now, "nbf": now + nbf_in, "exp": now + 900, "jti": "j1",
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    header.kid = Some(SIGNING_KID.into());
    jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_ed_der(der.as_bytes())).expect("signs")
}

fn check_token<T>(request: &Request<T>) -> Result<(), Status> {
    let presented = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
    if presented == Some(&format!("Bearer {TOKEN}")) {
        Ok(())
    } else {
        Err(Status::unauthenticated("a valid worker token is required (--worker-token)"))
    }
}

type Stream<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

type Outbox = mpsc::Sender<Result<agent::ControlMessage, Status>>;

async fn send(tx: &Outbox, kind: control_message::Kind) {
    let _ = tx.send(Ok(agent::ControlMessage { kind: Some(kind) })).await;
}

/// One worker session: answers Register with Registered and the wanted set, records
/// heartbeats, sends every change of the wanted set, ends when the fake stops.
async fn run_session(fake: Arc<Fake>, mut inbound: tonic::Streaming<agent::WorkerMessage>, tx: Outbox) {
    let mut wanted = fake.assignments.subscribe();
    loop {
        tokio::select! {
            () = fake.stop.cancelled() => break,
            message = inbound.message() => {
                let Ok(Some(message)) = message else { break };
                match message.kind {
                    Some(worker_message::Kind::Register(r)) => {
                        let worker_id = r.worker_id.clone();
                        let registered = agent::Registered { worker_id, heartbeat_interval_ms: 100, ..Default::default() };
                        fake.registered.send_replace(Some(r));
                        send(&tx, control_message::Kind::Registered(registered)).await;
                        let set = wanted.borrow_and_update().clone();
                        send(&tx, control_message::Kind::Assignments(set)).await;
                    }
                    Some(worker_message::Kind::Heartbeat(h)) => {
                        fake.heartbeat.send_replace(Some(h));
                    }
                    None => {}
                }
            }
            changed = wanted.changed() => {
                if changed.is_err() {
                    break;
                }
                let set = wanted.borrow_and_update().clone();
                send(&tx, control_message::Kind::Assignments(set)).await;
            }
        }
    }
}

/// The gRPC service over the shared fake.
struct Service(Arc<Fake>);

#[tonic::async_trait]
impl WorkerAgent for Service {
    type SessionStream = ReceiverStream<Result<agent::ControlMessage, Status>>;
    type FetchArtifactStream = Stream<agent::ArtifactChunk>;
    type WatchRoutesStream = Stream<agent::RouteTable>;

    async fn session(
        &self,
        request: Request<tonic::Streaming<agent::WorkerMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        check_token(&request)?;
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(run_session(self.0.clone(), request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn authenticate_key(
        &self,
        request: Request<agent::AuthenticateKeyRequest>,
    ) -> Result<Response<agent::AuthenticateKeyResponse>, Status> {
        check_token(&request)?;
        let tenant = match request.get_ref().api_key.as_str() {
            "tsk_a" => TENANT_A,
            "tsk_b" => TENANT_B,
            _ => return Err(Status::not_found("unknown, revoked or expired API key")),
        };
        Ok(Response::new(agent::AuthenticateKeyResponse {
            tenant_id: tenant.into(),
            tenant_name: "tenant".into(),
            role: "inference".into(),
            expires_at: 0,
            ..Default::default()
        }))
    }

    async fn get_token_keys(
        &self,
        request: Request<agent::GetTokenKeysRequest>,
    ) -> Result<Response<agent::GetTokenKeysResponse>, Status> {
        check_token(&request)?;
        Ok(Response::new(agent::GetTokenKeysResponse {
            jwks_json: jwks_json(),
            issuer: "tessera".into(),
            audience: "tessera".into(),
        }))
    }

    async fn fetch_artifact(
        &self,
        request: Request<agent::FetchArtifactRequest>,
    ) -> Result<Response<Self::FetchArtifactStream>, Status> {
        check_token(&request)?;
        self.0.fetches.fetch_add(1, Ordering::SeqCst);
        let bytes =
            self.0.artifacts.get(&request.get_ref().key).cloned().ok_or_else(|| Status::not_found("no such key"))?;
        let chunks: Vec<Result<agent::ArtifactChunk, Status>> =
            bytes.chunks(100).map(|c| Ok(agent::ArtifactChunk { data: bytes::Bytes::copy_from_slice(c) })).collect();
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn watch_routes(
        &self,
        request: Request<agent::WatchRoutesRequest>,
    ) -> Result<Response<Self::WatchRoutesStream>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("workers do not watch routes"))
    }

    async fn report_usage(
        &self,
        request: Request<agent::ReportUsageRequest>,
    ) -> Result<Response<agent::ReportUsageResponse>, Status> {
        check_token(&request)?;
        if self.0.refuse_usage.load(Ordering::SeqCst) {
            return Err(Status::unavailable("usage ingestion is down"));
        }
        let mut acknowledged = Vec::new();
        let mut stored = self.0.usage.lock();
        for record in request.into_inner().records {
            acknowledged.push(record.key.clone());
            if stored.contains_key(&record.key) {
                self.0.usage_replays.fetch_add(1, Ordering::SeqCst);
            } else {
                stored.insert(record.key.clone(), record);
            }
        }
        if self.0.lose_usage_acks.load(Ordering::SeqCst) {
            self.0.usage_acks_lost.fetch_add(1, Ordering::SeqCst);
            return Err(Status::unavailable("connection reset before the answer"));
        }
        Ok(Response::new(agent::ReportUsageResponse { acknowledged }))
    }

    async fn report_capture(
        &self,
        request: Request<agent::ReportCaptureRequest>,
    ) -> Result<Response<agent::ReportCaptureResponse>, Status> {
        check_token(&request)?;
        let batch = request.into_inner();
        let key = format!("tenants/{}/capture/{}/{}.jsonl", batch.tenant_id, batch.deployment_id, batch.batch_id);
        self.0.captures.lock().push(batch);
        Ok(Response::new(agent::ReportCaptureResponse { key }))
    }
}

struct FakeServer {
    fake: Arc<Fake>,
    url: String,
    task: tokio::task::JoinHandle<()>,
}

async fn start_fake(model: &[u8]) -> FakeServer {
    let fake = Arc::new(Fake {
        artifacts: HashMap::from([(format!("{TENANT_A}/add_sub/1.onnx"), model.to_vec())]),
        registered: watch::channel(None).0,
        heartbeat: watch::channel(None).0,
        assignments: watch::channel(agent::Assignments::default()).0,
        fetches: AtomicUsize::new(0),
        usage: Default::default(),
        usage_replays: AtomicUsize::new(0),
        lose_usage_acks: AtomicBool::new(false),
        usage_acks_lost: AtomicUsize::new(0),
        refuse_usage: AtomicBool::new(false),
        captures: Default::default(),
        stop: CancellationToken::new(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (service, stop) = (WorkerAgentServer::new(Service(fake.clone())), fake.stop.clone());
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stop.cancelled_owned())
            .await
            .expect("fake control plane serves");
    });
    FakeServer { fake, url, task }
}

/// A replica of tenant A's `add_sub` at `version`, all versions built from `model`.
fn replica(model: &[u8], id: &str, version: i64, serving: bool) -> agent::Assignment {
    agent::Assignment {
        replica_id: id.into(),
        deployment_id: "deployment-1".into(),
        tenant_id: TENANT_A.into(),
        tenant_name: "a".into(),
        model_name: "add_sub".into(),
        version,
        slice_id: "cpu-0".into(),
        artifact: Some(agent::Artifact {
            key: format!("{TENANT_A}/add_sub/1.onnx"),
            sha256: hex::encode(Sha256::digest(model)),
            size_bytes: model.len() as u64,
            format: "onnx".into(),
        }),
        config_json: r#"{"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}"#.into(),
        serving,
        capture: None,
        composing: Vec::new(),
    }
}

fn set(generation: u64, assignments: Vec<agent::Assignment>) -> agent::Assignments {
    agent::Assignments { generation, assignments }
}

/// Waits until the latest heartbeat satisfies `done`.
async fn heartbeat_until(fake: &Fake, what: &str, done: impl Fn(&agent::Heartbeat) -> bool) -> agent::Heartbeat {
    let mut rx = fake.heartbeat.subscribe();
    let wait = async {
        loop {
            if let Some(h) = rx.borrow_and_update().as_ref().filter(|h| done(h)) {
                return h.clone();
            }
            rx.changed().await.expect("fake alive");
        }
    };
    match tokio::time::timeout(Duration::from_secs(60), wait).await {
        Ok(h) => h,
        Err(_) => panic!("no heartbeat showed {what}; last: {:?}", rx.borrow()),
    }
}

fn state_of(h: &agent::Heartbeat, replica: &str) -> Option<agent::ReplicaState> {
    h.replicas.iter().find(|r| r.replica_id == replica).map(|r| r.state())
}

fn replica_state(h: &agent::Heartbeat) -> Option<agent::ReplicaState> {
    state_of(h, "replica-1")
}

async fn infer(http: &str, key: Option<&str>) -> (u16, Value) {
    infer_at(http, "/v2/models/add_sub/infer", key).await
}

/// The version that answers `path`, or the HTTP status when it fails.
async fn answering_version(http: &str, path: &str) -> Result<String, u16> {
    match infer_at(http, path, Some("tsk_a")).await {
        (200, body) => Ok(body["model_version"].as_str().unwrap_or_default().to_string()),
        (status, _) => Err(status),
    }
}

/// Polls until `path` answers `want`.
async fn until_answer(http: &str, path: &str, want: Result<&str, u16>) {
    let want = want.map(str::to_string);
    let poll = async {
        while answering_version(http, path).await != want {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), poll)
        .await
        .unwrap_or_else(|_| panic!("{path} never answered {want:?}"));
}

/// One gRPC inference with `key` as the bearer credential.
async fn grpc_infer(grpc: std::net::SocketAddr, key: &str) -> Result<(), tonic::Code> {
    use tessera_protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    use tessera_protocol::inference::model_infer_request::InferInputTensor;
    use tessera_protocol::inference::{InferTensorContents, ModelInferRequest};
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{grpc}")).await.expect("grpc connect");
    let tensor = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "FP32".into(),
        shape: vec![1, 16],
        contents: Some(InferTensorContents { fp32_contents: vec![1.0; 16], ..Default::default() }),
        ..Default::default()
    };
    let message = ModelInferRequest {
        model_name: "add_sub".into(),
        inputs: vec![tensor("INPUT0"), tensor("INPUT1")],
        ..Default::default()
    };
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {key}").parse().expect("ascii"));
    client.model_infer(request).await.map(|_| ()).map_err(|s| s.code())
}

async fn infer_at(http: &str, path: &str, key: Option<&str>) -> (u16, Value) {
    let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let body = json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": a},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
    ]});
    let mut request = reqwest::Client::new().post(format!("{http}{path}")).json(&body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("http request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_registers_loads_serves_unloads_and_outlives_the_control_plane() {
    let model = onnx_builder::add_sub();
    let server = start_fake(&model).await;
    let fake = server.fake.clone();
    fake.assignments.send_replace(set(1, vec![replica(&model, "replica-1", 1, true)]));

    let data = tempfile::tempdir().expect("tempdir");
    let mut config = WorkerConfig::local(&server.url, WorkerToken::new(TOKEN), data.path());
    config.key_cache_ttl = Duration::from_millis(500);
    let shutdown = CancellationToken::new();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<BoundAddrs>();
    let worker = tokio::spawn(worker::run(config, shutdown.clone(), move |b| {
        let _ = bound_tx.send(b);
    }));
    let bound = bound_rx.await.expect("worker bound its listeners");
    let http = format!("http://{}", bound.http.expect("http on"));

    // Registered with its endpoints and CPU slices, then the replica becomes ready.
    let heartbeat =
        heartbeat_until(&fake, "replica READY", |h| replica_state(h) == Some(agent::ReplicaState::Ready)).await;
    assert_eq!(heartbeat.applied_generation, 1);
    let register = fake.registered.borrow().clone().expect("registered");
    assert_eq!(register.http_endpoint, http);
    assert_eq!(register.slices.len(), 2);
    assert!(register.slices.iter().all(|s| s.profile == "cpu" && s.memory_bytes > 0));
    let worker_id = std::fs::read_to_string(data.path().join("worker-id")).expect("worker id kept");
    assert_eq!(worker_id.trim(), register.worker_id);

    // Tenant A's key reaches its model; tenant B's does not see it; no key is refused.
    let (status, body) = infer(&http, Some("tsk_a")).await;
    assert_eq!(status, 200, "{body}");
    let out = body["outputs"].as_array().expect("outputs").iter().find(|o| o["name"] == "OUTPUT0").expect("OUTPUT0");
    assert_eq!(out["data"][3], json!(4.0));
    let (status, body) = infer(&http, Some("tsk_b")).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(infer(&http, None).await.0, 401);
    let grpc = bound.grpc.expect("grpc on");
    assert_eq!(grpc_infer(grpc, "tsk_a").await, Ok(()));
    assert_eq!(grpc_infer(grpc, "tsk_b").await, Err(tonic::Code::NotFound));
    assert_eq!(grpc_infer(grpc, "tsk_nope").await, Err(tonic::Code::Unauthenticated));
    assert_eq!(infer(&http, Some("tsk_nope")).await.0, 401);

    // Access tokens verify offline against the fetched keys; one whose `nbf` is an hour or a
    // day away is refused like any bad token.
    let token = access_token(0);
    assert_eq!(infer(&http, Some(&token)).await.0, 200);
    assert_eq!(grpc_infer(grpc, &token).await, Ok(()));
    for early in [access_token(3600), access_token(86_400)] {
        assert_eq!(infer(&http, Some(&early)).await.0, 401);
        assert_eq!(grpc_infer(grpc, &early).await, Err(tonic::Code::Unauthenticated));
    }

    // An empty set unloads the model.
    fake.assignments.send_replace(agent::Assignments { generation: 2, assignments: Vec::new() });
    heartbeat_until(&fake, "generation 2 with no replicas", |h| h.applied_generation == 2 && h.replicas.is_empty())
        .await;
    let unloaded = async {
        while infer(&http, Some("tsk_a")).await.0 != 404 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), unloaded).await.expect("model unloaded");

    // Assigned again: loaded from the cache, not fetched a second time.
    fake.assignments.send_replace(set(3, vec![replica(&model, "replica-1", 1, true)]));
    heartbeat_until(&fake, "READY at generation 3", |h| {
        h.applied_generation == 3 && replica_state(h) == Some(agent::ReplicaState::Ready)
    })
    .await;
    assert_eq!(fake.fetches.load(Ordering::SeqCst), 1);

    // A rollout: version 2 warms up without taking unversioned traffic, then takes it over
    // while version 1 drains.
    const LATEST: &str = "/v2/models/add_sub/infer";
    let warm = vec![replica(&model, "replica-1", 1, true), replica(&model, "replica-2", 2, false)];
    fake.assignments.send_replace(set(4, warm));
    heartbeat_until(&fake, "version 2 warm", |h| {
        h.applied_generation == 4 && state_of(h, "replica-2") == Some(agent::ReplicaState::Ready)
    })
    .await;
    assert_eq!(answering_version(&http, LATEST).await, Ok("1".into()));
    assert_eq!(answering_version(&http, "/v2/models/add_sub/versions/2/infer").await, Ok("2".into()));
    let switched = vec![replica(&model, "replica-1", 1, false), replica(&model, "replica-2", 2, true)];
    fake.assignments.send_replace(set(5, switched));
    heartbeat_until(&fake, "version 1 draining", |h| {
        h.applied_generation == 5 && replica_state(h) == Some(agent::ReplicaState::Draining)
    })
    .await;
    assert_eq!(answering_version(&http, LATEST).await, Ok("2".into()));

    // A set replaced while its install may still run: the newest set wins.
    let with_three = vec![replica(&model, "replica-2", 2, true), replica(&model, "replica-3", 3, true)];
    fake.assignments.send_replace(set(6, with_three));
    heartbeat_until(&fake, "generation 6", |h| h.applied_generation == 6).await;
    fake.assignments.send_replace(set(7, vec![replica(&model, "replica-2", 2, true)]));
    heartbeat_until(&fake, "only version 2 at generation 7", |h| {
        h.applied_generation == 7
            && h.replicas.len() == 1
            && state_of(h, "replica-2") == Some(agent::ReplicaState::Ready)
    })
    .await;
    until_answer(&http, "/v2/models/add_sub/versions/1/infer", Err(404)).await;
    until_answer(&http, "/v2/models/add_sub/versions/3/infer", Err(404)).await;
    assert_eq!(answering_version(&http, LATEST).await, Ok("2".into()));
    assert_eq!(fake.fetches.load(Ordering::SeqCst), 1);

    // The control plane goes away: the worker keeps serving, with the key it had cached
    // (its re-check fails as unavailable, which keeps the cached answer).
    fake.stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), server.task).await.expect("fake stops").expect("fake task");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (status, body) = infer(&http, Some("tsk_a")).await;
    assert_eq!(status, 200, "{body}");

    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(30), worker).await.expect("worker stops");
    result.expect("worker task").expect("worker exits cleanly");
}

/// Tenant A's `add_sub` version 1 with batching on (up to 8 rows).
fn batching_replica(model: &[u8]) -> agent::Assignment {
    let mut r = replica(model, "replica-1", 1, true);
    r.config_json = r#"{"max_batch_size": 8, "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}"#.into();
    r
}

/// One HTTP inference of `rows` rows of `width` values (16 fits the model; anything else fails).
async fn infer_rows(http: &str, key: &str, rows: usize, width: usize) -> u16 {
    let data = vec![1.0f32; rows * width];
    let body = json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [rows, width], "data": data},
        {"name": "INPUT1", "datatype": "FP32", "shape": [rows, width], "data": data},
    ]});
    let url = format!("{http}/v2/models/add_sub/infer");
    let response = reqwest::Client::new().post(url).bearer_auth(key).json(&body).send().await.expect("http request");
    response.status().as_u16()
}

/// One gRPC inference of `width` values.
async fn grpc_infer_width(grpc: std::net::SocketAddr, key: &str, width: usize) -> Result<(), tonic::Code> {
    use tessera_protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    use tessera_protocol::inference::model_infer_request::InferInputTensor;
    use tessera_protocol::inference::{InferTensorContents, ModelInferRequest};
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{grpc}")).await.expect("grpc connect");
    let tensor = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "FP32".into(),
        shape: vec![1, width as i64],
        contents: Some(InferTensorContents { fp32_contents: vec![1.0; width], ..Default::default() }),
        ..Default::default()
    };
    let message = ModelInferRequest {
        model_name: "add_sub".into(),
        inputs: vec![tensor("INPUT0"), tensor("INPUT1")],
        ..Default::default()
    };
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {key}").parse().expect("ascii"));
    client.model_infer(request).await.map(|_| ()).map_err(|s| s.code())
}

/// One `ModelStreamInfer` stream of requests of these widths; whether each answer succeeded.
async fn grpc_stream(grpc: std::net::SocketAddr, key: &str, widths: &[usize]) -> Vec<bool> {
    use tessera_protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    use tessera_protocol::inference::model_infer_request::InferInputTensor;
    use tessera_protocol::inference::{InferTensorContents, ModelInferRequest};
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{grpc}")).await.expect("grpc connect");
    let message = |width: usize| {
        let tensor = |name: &str| InferInputTensor {
            name: name.into(),
            datatype: "FP32".into(),
            shape: vec![1, width as i64],
            contents: Some(InferTensorContents { fp32_contents: vec![1.0; width], ..Default::default() }),
            ..Default::default()
        };
        ModelInferRequest {
            model_name: "add_sub".into(),
            inputs: vec![tensor("INPUT0"), tensor("INPUT1")],
            ..Default::default()
        }
    };
    let messages: Vec<ModelInferRequest> = widths.iter().map(|w| message(*w)).collect();
    let mut request = tonic::Request::new(futures::stream::iter(messages));
    request.metadata_mut().insert("authorization", format!("Bearer {key}").parse().expect("ascii"));
    let mut answers = client.model_stream_infer(request).await.expect("stream opens").into_inner();
    let mut out = Vec::new();
    while let Some(answer) = answers.message().await.expect("stream answer") {
        out.push(answer.error_message.is_empty());
    }
    out
}

/// What clients saw: successful requests, failed ones, rows of the successful ones.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Seen {
    requests: u64,
    failures: u64,
    inferences: u64,
}

impl Seen {
    fn add(&mut self, other: Seen) {
        self.requests += other.requests;
        self.failures += other.failures;
        self.inferences += other.inferences;
    }
}

/// A mix of requests on `http` and `grpc` (unary and streaming): successes of 1 and 3 rows,
/// wrong shapes (failures), and requests that never reach tenant A's model (another tenant, no
/// key: not billable).
async fn traffic(http: &str, grpc: std::net::SocketAddr, rounds: usize) -> Seen {
    let mut seen = Seen::default();
    for _ in 0..rounds {
        assert_eq!(infer_rows(http, "tsk_a", 1, 16).await, 200);
        assert_eq!(infer_rows(http, "tsk_a", 3, 16).await, 200);
        assert_eq!(infer_rows(http, "tsk_a", 1, 15).await, 400);
        assert_eq!(grpc_infer_width(grpc, "tsk_a", 16).await, Ok(()));
        assert_eq!(grpc_infer_width(grpc, "tsk_a", 7).await, Err(tonic::Code::InvalidArgument));
        assert_eq!(grpc_stream(grpc, "tsk_a", &[16, 5, 16]).await, [true, false, true]);
        assert_eq!(infer_rows(http, "tsk_b", 1, 16).await, 404);
        assert_eq!(infer_rows(http, "tsk_nope", 1, 16).await, 401);
        seen.add(Seen { requests: 5, failures: 3, inferences: 7 });
    }
    seen
}

/// Stored usage of tenant A's `add_sub` version 1.
fn stored(fake: &Fake) -> Seen {
    let usage = fake.usage.lock();
    let mut seen = Seen::default();
    for r in usage.values() {
        assert_eq!((r.tenant_id.as_str(), r.model_name.as_str(), r.version), (TENANT_A, "add_sub", 1), "{r:?}");
        assert_eq!(r.slice_profile, "cpu");
        assert_eq!(r.minute % 60, 0);
        seen.add(Seen { requests: r.requests, failures: r.failures, inferences: r.inferences });
    }
    seen
}

async fn stored_until(fake: &Fake, want: Seen) {
    let wait = async {
        while stored(fake) != want {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(20), wait).await.is_err() {
        panic!("stored usage {:?} never became {want:?}", stored(fake));
    }
}

/// A worker on its own runtime, so it can be stopped abruptly (every task dropped at once, no
/// final shipment), as a SIGKILL would.
struct KillableWorker {
    bound: BoundAddrs,
    kill: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

fn start_killable(
    config: WorkerConfig,
) -> (tokio::sync::oneshot::Receiver<BoundAddrs>, impl FnOnce(BoundAddrs) -> KillableWorker) {
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<BoundAddrs>();
    let (kill, kill_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        runtime.block_on(async move {
            let never = CancellationToken::new();
            tokio::select! {
                result = worker::run(config, never, move |b| { let _ = bound_tx.send(b); }) => {
                    result.expect("worker runs until killed");
                }
                _ = kill_rx => {}
            }
        });
        runtime.shutdown_background();
    });
    (bound_rx, move |bound| KillableWorker { bound, kill, thread })
}

async fn metrics_text(bound: &BoundAddrs) -> String {
    let url = format!("http://{}/metrics", bound.metrics.expect("metrics on"));
    reqwest::get(url).await.expect("scrape").text().await.expect("text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_matches_what_clients_saw_across_an_abrupt_restart() {
    let model = onnx_builder::add_sub();
    let server = start_fake(&model).await;
    let fake = server.fake.clone();
    fake.assignments.send_replace(set(1, vec![batching_replica(&model)]));
    let data = tempfile::tempdir().expect("tempdir");
    let mut config = WorkerConfig::local(&server.url, WorkerToken::new(TOKEN), data.path());
    config.usage_ship_interval = Duration::from_millis(100);

    // First run: usage is delivered as it accrues.
    let (bound_rx, started) = start_killable(config.clone());
    let first = started(bound_rx.await.expect("worker bound"));
    heartbeat_until(&fake, "replica READY", |h| replica_state(h) == Some(agent::ReplicaState::Ready)).await;
    let (http, grpc) = (format!("http://{}", first.bound.http.expect("http")), first.bound.grpc.expect("grpc"));
    let mut seen = traffic(&http, grpc, 4).await;
    stored_until(&fake, seen).await;

    // The control plane stores the next ones but its answers are lost: the worker keeps
    // resending the same range.
    fake.lose_usage_acks.store(true, Ordering::SeqCst);
    seen.add(traffic(&http, grpc, 2).await);
    let lost = async {
        while fake.usage_acks_lost.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), lost).await.expect("usage sent while acks are lost");
    // Then it goes down altogether; what follows stays in the spool.
    fake.refuse_usage.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = stored(&fake);
    seen.add(traffic(&http, grpc, 3).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stored(&fake), before, "nothing reached a control plane that is down");

    // Killed: no drain, no final shipment.
    let _ = first.kill.send(());
    first.thread.join().expect("worker thread");

    // The control plane is back; a new run on the same data directory ships the rest once.
    fake.lose_usage_acks.store(false, Ordering::SeqCst);
    fake.refuse_usage.store(false, Ordering::SeqCst);
    let shutdown = CancellationToken::new();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<BoundAddrs>();
    let second = tokio::spawn(worker::run(config, shutdown.clone(), move |b| {
        let _ = bound_tx.send(b);
    }));
    let bound = bound_rx.await.expect("second worker bound");
    stored_until(&fake, seen).await;
    assert!(fake.usage_replays.load(Ordering::SeqCst) > 0, "the unacknowledged range was replayed under its keys");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(stored(&fake), seen, "nothing counted twice");

    // Executions, compute time and reserved slice time arrive too.
    let http = format!("http://{}", bound.http.expect("http"));
    seen.add(traffic(&http, bound.grpc.expect("grpc"), 1).await);
    stored_until(&fake, seen).await;

    // Worker metrics: every model series carries the tenant, never an empty one.
    let text = metrics_text(&bound).await;
    let labels = format!("{{tenant=\"{TENANT_A}\",model=\"add_sub\",version=\"1\"");
    for family in ["nv_inference_request_success", "nv_inference_count", "nv_inference_request_failure"] {
        assert!(text.contains(&format!("{family}{labels}")), "{family} with tenant labels in\n{text}");
    }
    assert!(text.contains(&format!("tessera_inference_request_duration_us_bucket{labels},le=\"")), "{text}");
    assert!(text.contains(&format!("tessera_inference_batch_size_bucket{labels},le=\"")), "{text}");
    assert!(text.contains("\ntessera_usage_spool_backlog_bytes "), "{text}");
    for line in text.lines().filter(|l| l.contains("model=\"")) {
        assert!(line.contains(&format!("tenant=\"{TENANT_A}\"")), "tenant-less series: {line}");
    }

    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(30), second).await.expect("worker stops");
    result.expect("worker task").expect("worker exits cleanly");
    // The final shipment at shutdown brings the last execution and slice records.
    let usage = fake.usage.lock();
    let executions: u64 = usage.values().map(|r| r.executions).sum();
    let compute: f64 = usage.values().map(|r| r.compute_seconds).sum();
    let slice: f64 = usage.values().map(|r| r.slice_seconds).sum();
    let batches: u64 = usage.values().flat_map(|r| r.batch_size_counts.iter()).sum();
    assert!(
        executions > 0 && compute > 0.0 && slice > 0.0,
        "executions {executions}, compute {compute}, slice {slice}"
    );
    assert_eq!(batches, executions, "every execution has a batch size");
    assert!(usage.values().all(|r| r.latency_counts.len() == 17 && r.batch_size_counts.len() == 10));
    let latencies: u64 = usage.values().flat_map(|r| r.latency_counts.iter()).sum();
    assert_eq!(latencies, seen.requests + seen.failures, "one latency per metered request");
    drop(usage);
    fake.stop.cancel();
}

/// Every captured record the fake received, parsed, in arrival order.
fn captured(fake: &Fake) -> Vec<Value> {
    let batches = fake.captures.lock();
    batches
        .iter()
        .flat_map(|b| {
            b.jsonl
                .split(|c| *c == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice(l).expect("a JSON line"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_requests_ship_in_batches_and_only_for_capturing_deployments() {
    let model = onnx_builder::add_sub();
    let server = start_fake(&model).await;
    let fake = server.fake.clone();
    fake.assignments.send_replace(set(1, vec![replica(&model, "replica-1", 1, true)]));
    let data = tempfile::tempdir().expect("tempdir");
    let mut config = WorkerConfig::local(&server.url, WorkerToken::new(TOKEN), data.path());
    config.usage_ship_interval = Duration::from_millis(100);
    let shutdown = CancellationToken::new();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<BoundAddrs>();
    let worker = tokio::spawn(worker::run(config, shutdown.clone(), move |b| {
        let _ = bound_tx.send(b);
    }));
    let bound = bound_rx.await.expect("worker bound its listeners");
    let http = format!("http://{}", bound.http.expect("http on"));
    heartbeat_until(&fake, "replica READY", |h| replica_state(h) == Some(agent::ReplicaState::Ready)).await;

    // Capture off: nothing is captured.
    assert_eq!(infer(&http, Some("tsk_a")).await.0, 200);

    // Capture on (inputs and outputs, no parameters): HTTP and gRPC requests are captured.
    let mut on = replica(&model, "replica-1", 1, true);
    on.capture = Some(agent::CaptureSettings {
        sample_rate: 1.0,
        inputs: true,
        outputs: true,
        metadata: false,
        max_record_bytes: 1 << 20,
    });
    fake.assignments.send_replace(set(2, vec![on]));
    heartbeat_until(&fake, "generation 2", |h| h.applied_generation == 2).await;
    assert_eq!(infer(&http, Some("tsk_a")).await.0, 200);
    assert_eq!(grpc_infer(bound.grpc.expect("grpc on"), "tsk_a").await, Ok(()));
    let wait = async {
        while captured(&fake).len() < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait).await.expect("two records shipped");
    let records = captured(&fake);
    assert_eq!(records.len(), 2, "the request before capture was on is not there: {records:?}");
    for r in &records {
        assert_eq!(r["model"], "add_sub");
        assert_eq!(r["version"], 1);
        assert_eq!(r["tenant_id"], TENANT_A);
        assert_eq!(r["deployment_id"], "deployment-1");
        assert_eq!(r["status"], "ok");
        assert!(r["request"].get("parameters").is_none(), "metadata off");
        let inputs = r["request"]["inputs"].as_array().expect("inputs kept");
        assert_eq!(inputs.len(), 2);
        let output0 =
            r["response"]["outputs"].as_array().expect("outputs kept").iter().find(|o| o["name"] == "OUTPUT0");
        assert_eq!(output0.expect("OUTPUT0")["shape"], json!([1, 16]));
    }
    assert!(fake.captures.lock().iter().all(|b| !b.worker_id.is_empty() && b.tenant_id == TENANT_A));
    // The fake holds the batch before the worker reads its answer and counts it stored.
    let mut metrics = metrics_text(&bound).await;
    for _ in 0..100 {
        if metrics.contains("tessera_capture_stored_total 2") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        metrics = metrics_text(&bound).await;
    }
    assert!(metrics.contains("tessera_capture_stored_total 2"), "{metrics}");
    assert!(metrics.contains("tessera_capture_dropped_total{reason=\"queue_full\"} 0"), "{metrics}");

    shutdown.cancel();
    worker.await.expect("worker task").expect("worker ran");
    fake.stop.cancel();
    let _ = server.task.await;
}
