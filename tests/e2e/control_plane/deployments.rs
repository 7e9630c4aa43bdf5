//! Deployments end to end: the real control plane, fake workers speaking the agent protocol
//! over its one listener (registration, assignments, heartbeats, artifact download, key
//! lookups), deployment status through the REST API, roles and tenancy, and a worker that
//! stops heartbeating losing its replica to another worker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tessera_protocol::agent::worker_agent_client::WorkerAgentClient;
use tessera_protocol::agent::{
    Assignment, AuthenticateKeyRequest, ControlMessage, FetchArtifactRequest, GetTokenKeysRequest, Heartbeat, Register,
    ReplicaState, ReplicaStatus, Slice, WorkerMessage, control_message, worker_message,
};
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::{Opts, TestApp};

pub(super) const TOKEN: &str = "worker-secret-for-tests";

/// Adds the worker token to every call.
pub(super) type AddToken = Box<dyn Fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send + Sync>;
pub(super) type Client = WorkerAgentClient<InterceptedService<Channel, AddToken>>;

pub(super) async fn client(app: &TestApp, token: &str) -> Client {
    let channel =
        Channel::from_shared(app.url.clone()).expect("url").connect().await.expect("connect to the agent service");
    let value: MetadataValue<_> = format!("Bearer {token}").parse().expect("header value");
    let auth: AddToken = Box::new(move |mut req: tonic::Request<()>| {
        req.metadata_mut().insert("authorization", value.clone());
        Ok(req)
    });
    WorkerAgentClient::with_interceptor(channel, auth)
}

/// A worker that speaks the protocol and reports every assigned replica ready.
struct FakeWorker {
    id: String,
    http: String,
    /// Control messages, read off the session by a task that also marks each assignment set
    /// applied as it arrives (a real worker applies every set, whether or not a test looks).
    inbound: mpsc::UnboundedReceiver<ControlMessage>,
    /// Replica ids reported ready by the heartbeat task.
    ready: Arc<Mutex<Vec<String>>>,
    beats: tokio::task::JoinHandle<()>,
    _outbound: mpsc::Sender<WorkerMessage>,
}

impl FakeWorker {
    async fn start(app: &TestApp, id: &str, port: u16) -> Self {
        let mut c = client(app, TOKEN).await;
        let (mut tx, rx) = mpsc::channel(16);
        let http = format!("http://127.0.0.1:{port}");
        let slices = (0..2)
            .map(|i| Slice {
                id: format!("cpu-{i}"),
                profile: "cpu".into(),
                kind: 1,
                memory_bytes: 1 << 30,
                cpu_millis: 1000,
                ..Slice::default()
            })
            .collect();
        let register = Register {
            worker_id: id.into(),
            http_endpoint: http.clone(),
            grpc_endpoint: format!("127.0.0.1:{}", port + 1),
            metrics_endpoint: format!("http://127.0.0.1:{}", port + 2),
            slices,
            version: "test".into(),
            ..Register::default()
        };
        tx.send(WorkerMessage { kind: Some(worker_message::Kind::Register(register)) }).await.expect("queue register");
        let mut session = c.session(rx).await.expect("open a session").into_inner();
        let first = session.message().await.expect("a reply").expect("not closed");
        match first.kind {
            Some(control_message::Kind::Registered(r)) => {
                assert_eq!(r.worker_id, id);
                assert_eq!(r.heartbeat_interval_ms, 200);
            }
            other => panic!("expected Registered first, got {other:?}"),
        }
        let ready = Arc::new(Mutex::new(Vec::<String>::new()));
        let applied = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (list, mut beat_tx, seen) = (ready.clone(), tx.clone(), applied.clone());
        let beats = tokio::spawn(async move {
            loop {
                let replicas = list
                    .lock()
                    .expect("lock")
                    .iter()
                    .map(|id| ReplicaStatus {
                        replica_id: id.clone(),
                        state: ReplicaState::Ready as i32,
                        ..ReplicaStatus::default()
                    })
                    .collect();
                let applied_generation = seen.load(std::sync::atomic::Ordering::Relaxed);
                let hb = Heartbeat { applied_generation, replicas, ..Heartbeat::default() };
                if beat_tx.send(WorkerMessage { kind: Some(worker_message::Kind::Heartbeat(hb)) }).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let (forward, inbound) = mpsc::unbounded();
        tokio::spawn(async move {
            while let Ok(Some(message)) = session.message().await {
                if let Some(control_message::Kind::Assignments(a)) = &message.kind {
                    applied.store(a.generation, std::sync::atomic::Ordering::Relaxed);
                }
                if forward.unbounded_send(message).is_err() {
                    break;
                }
            }
        });
        FakeWorker { id: id.into(), http, inbound, ready, beats, _outbound: tx }
    }

    /// Reads assignment sets until one satisfies `want`; returns it.
    async fn assignments_until(&mut self, want: impl Fn(&[Assignment]) -> bool) -> Vec<Assignment> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut last_generation = 0;
        loop {
            let next = tokio::time::timeout_at(deadline, self.inbound.next()).await;
            let message = next.unwrap_or_else(|_| panic!("{}: no matching assignments in time", self.id));
            let message = message.unwrap_or_else(|| panic!("{}: session closed", self.id));
            let ControlMessage { kind: Some(control_message::Kind::Assignments(a)) } = message else {
                continue;
            };
            assert!(a.generation > last_generation, "generations only grow");
            last_generation = a.generation;
            if want(&a.assignments) {
                return a.assignments;
            }
        }
    }

    fn report_ready(&self, replica_id: &str) {
        self.ready.lock().expect("lock").push(replica_id.to_string());
    }
}

/// Polls a deployment until `want` holds; returns it.
pub(super) async fn deployment_until(app: &TestApp, key: &str, path: &str, want: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let d = app.get(key, path).await.expect(200).clone();
        if want(&d) {
            return d;
        }
        assert!(tokio::time::Instant::now() < deadline, "deployment never got there: {d:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn workers_receive_deployments_report_ready_and_lose_replicas_when_silent() {
    let args = args();
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let acme = app.tenant("acme").await;
    let other = app.tenant("umbrella").await;
    app.create_model(&acme.deployer, "acme", "addsub").await.expect(201);
    let model = tessera_data_plane::tools::onnx_builder::add_sub();
    let version = app.upload(&acme.deployer, "acme", "addsub", "", model.clone()).await;
    let sha256 = version.expect(201)["sha256"].as_str().expect("sha256").to_string();

    // Roles and tenancy.
    let body = json!({ "name": "addsub", "model": "addsub", "replicas": 1 });
    let refused = app.post(&acme.inference, "/v1/tenants/acme/deployments", &body).await;
    assert_eq!(refused.status, 403, "{:?}", refused.body);
    app.post(&acme.viewer, "/v1/tenants/acme/deployments", &body).await.expect(403);
    app.post(&other.deployer, "/v1/tenants/acme/deployments", &body).await.expect(404);
    let created = app.post_idempotent(&acme.deployer, "/v1/tenants/acme/deployments", &body, "dep-1").await;
    let created = created.expect(201).clone();
    assert_eq!((created["model"].as_str(), created["version"].as_i64()), (Some("addsub"), Some(1)));
    assert_eq!(created["state"], "pending");
    let replay = app.post_idempotent(&acme.deployer, "/v1/tenants/acme/deployments", &body, "dep-1").await;
    assert_eq!(replay.expect(201)["id"], created["id"], "the idempotent retry replays");
    app.post(&acme.deployer, "/v1/tenants/acme/deployments", &body).await.expect(409);
    let path = "/v1/tenants/acme/deployments/addsub";
    app.get(&other.admin, path).await.expect(404);
    app.get(&acme.inference, path).await.expect(403);
    app.get(&acme.viewer, path).await.expect(200);
    assert_eq!(
        app.get(&acme.viewer, "/v1/tenants/acme/deployments").await.expect(200)["deployments"][0]["name"],
        "addsub"
    );
    app.get(&acme.admin, "/v1/workers").await.expect(403);

    // The agent service shares the REST listener and wants the worker token.
    let mut wrong = client(&app, "not-the-token").await;
    let e = wrong.get_token_keys(GetTokenKeysRequest {}).await.expect_err("wrong token");
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut agent = client(&app, TOKEN).await;
    let keys = agent.get_token_keys(GetTokenKeysRequest {}).await.expect("token keys").into_inner();
    assert_eq!(keys.issuer, "tessera");
    assert!(serde_json::from_str::<Value>(&keys.jwks_json).expect("jwks json")["keys"].is_array());
    let who = agent.authenticate_key(AuthenticateKeyRequest { api_key: acme.inference.clone() }).await;
    let who = who.expect("a tenant key resolves").into_inner();
    assert_eq!((who.tenant_name.as_str(), who.role.as_str(), who.expires_at), ("acme", "inference", 0));
    // Last character changed (to one it is not, or the "forgery" could be the key itself).
    let (head, last) = acme.inference.split_at(acme.inference.len() - 1);
    let forged = format!("{head}{}", if last == "x" { "y" } else { "x" });
    let e = agent.authenticate_key(AuthenticateKeyRequest { api_key: forged }).await.expect_err("forged key");
    assert_eq!(e.code(), tonic::Code::NotFound);

    // A worker registers with two CPU slices and gets the replica.
    let mut w1 = FakeWorker::start(&app, "worker-1", 18000).await;
    let assigned = w1.assignments_until(|a| !a.is_empty()).await;
    assert_eq!(assigned.len(), 1);
    let a = &assigned[0];
    assert_eq!((a.model_name.as_str(), a.version, a.serving, a.tenant_name.as_str()), ("addsub", 1, true, "acme"));
    let config: Value = serde_json::from_str(&a.config_json).expect("config json");
    assert_eq!(config["instance_group"], json!([{ "count": 1, "kind": "KIND_CPU" }]));
    let artifact = a.artifact.clone().expect("artifact");
    assert_eq!(artifact.sha256, sha256);
    let replica_id = a.replica_id.clone();
    w1.report_ready(&replica_id);
    let ready = deployment_until(&app, &acme.viewer, path, |d| d["state"] == "ready").await;
    let status = &ready["replica_status"][0];
    assert_eq!(
        (status["worker_id"].as_str(), status["http_endpoint"].as_str()),
        (Some("worker-1"), Some(w1.http.as_str()))
    );
    assert_eq!((status["state"].as_str(), status["serving"].as_bool()), (Some("ready"), Some(true)));
    assert_eq!(ready["serving_version"], 1);

    // The artifact streams back intact; unknown keys are not found.
    let mut chunks =
        agent.fetch_artifact(FetchArtifactRequest { key: artifact.key.clone() }).await.expect("fetch").into_inner();
    let mut bytes = Vec::new();
    while let Some(chunk) = chunks.next().await {
        bytes.extend_from_slice(&chunk.expect("chunk").data);
    }
    assert_eq!(hex::encode(Sha256::digest(&bytes)), sha256);
    let missing = agent.fetch_artifact(FetchArtifactRequest { key: "tenants/nope/model.onnx".into() }).await;
    assert_eq!(missing.err().map(|e| e.code()), Some(tonic::Code::NotFound));

    // A second worker joins; the first goes silent and is marked lost; its replica moves.
    let mut w2 = FakeWorker::start(&app, "worker-2", 18100).await;
    w2.report_ready(&replica_id);
    w1.beats.abort();
    let moved = w2.assignments_until(|a| a.iter().any(|x| x.replica_id == replica_id)).await;
    assert_eq!(moved.len(), 1);
    w1.assignments_until(|a| a.is_empty()).await;
    let ready = deployment_until(&app, &acme.viewer, path, |d| {
        d["state"] == "ready" && d["replica_status"][0]["worker_id"] == "worker-2"
    })
    .await;
    assert_eq!(ready["replica_status"][0]["http_endpoint"].as_str(), Some(w2.http.as_str()));
    let workers = app.get(&app.admin_key, "/v1/workers").await.expect(200).clone();
    let states: Vec<(&str, &str)> = workers["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| (w["id"].as_str().unwrap_or(""), w["state"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(states, [("worker-1", "lost"), ("worker-2", "ready")]);
    assert_eq!(workers["workers"][1]["replicas"], 1);
    assert!(workers["workers"][1]["slices"].as_array().expect("slices").iter().any(|s| s["tenant_id"].is_string()));
    let events = app.get(&acme.viewer, &format!("{path}/events")).await.expect(200).clone();
    let kinds: Vec<&str> =
        events["events"].as_array().expect("events").iter().filter_map(|e| e["kind"].as_str()).collect();
    for kind in ["created", "placed", "ready", "worker_lost", "rescheduled"] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }

    // Deleting the deployment empties the worker's assignments.
    app.delete(&other.deployer, path).await.expect(404);
    app.delete(&acme.deployer, path).await.expect(204);
    w2.assignments_until(|a| a.is_empty()).await;
    app.get(&acme.viewer, path).await.expect(404);
    w2.beats.abort();
}

pub(super) fn args() -> [&'static str; 10] {
    [
        "--worker-token",
        TOKEN,
        "--heartbeat-interval-ms",
        "200",
        "--worker-lost-after-ms",
        "1500",
        "--scheduler-interval-ms",
        "100",
        "--drain-ms",
        "300",
    ]
}

/// (version, serving) of each assignment, sorted.
fn versions(a: &[Assignment]) -> Vec<(i64, bool)> {
    let mut v: Vec<(i64, bool)> = a.iter().map(|x| (x.version, x.serving)).collect();
    v.sort();
    v
}

#[tokio::test]
async fn moving_an_alias_rolls_out_beside_the_old_version_then_drains_it() {
    let args = args();
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let acme = app.tenant("acme").await;
    app.create_model(&acme.deployer, "acme", "addsub").await.expect(201);
    let model = tessera_data_plane::tools::onnx_builder::add_sub();
    app.upload(&acme.deployer, "acme", "addsub", "", model.clone()).await.expect(201);
    app.set_alias(&acme.deployer, "acme", "addsub", "production", 1).await.expect(200);
    let body =
        json!({ "name": "addsub", "model": "addsub", "alias": "production", "replicas": 2, "instance_count": 2 });
    let created = app.post(&acme.deployer, "/v1/tenants/acme/deployments", &body).await;
    assert_eq!(created.expect(201)["alias"], "production");
    let path = "/v1/tenants/acme/deployments/addsub";

    let mut w = FakeWorker::start(&app, "worker-1", 18200).await;
    let first = w.assignments_until(|a| a.len() == 2).await;
    assert_eq!(versions(&first), [(1, true), (1, true)]);
    for a in &first {
        w.report_ready(&a.replica_id);
    }
    deployment_until(&app, &acme.viewer, path, |d| d["state"] == "ready" && d["serving_version"] == 1).await;

    // v2 arrives and the alias moves: new replicas load next to the old ones, not serving.
    app.upload(&acme.deployer, "acme", "addsub", "", model).await.expect(201);
    app.set_alias(&acme.deployer, "acme", "addsub", "production", 2).await.expect(200);
    let rolling = w.assignments_until(|a| a.len() == 4).await;
    assert_eq!(versions(&rolling), [(1, true), (1, true), (2, false), (2, false)]);
    let slices = |a: &[Assignment], v: i64| {
        let mut s: Vec<String> = a.iter().filter(|x| x.version == v).map(|x| x.slice_id.clone()).collect();
        s.sort();
        s
    };
    assert_eq!(slices(&rolling, 2), slices(&rolling, 1), "new replicas sit beside the old ones");
    let d = app.get(&acme.viewer, path).await.expect(200).clone();
    assert_eq!((d["version"].as_i64(), d["serving_version"].as_i64()), (Some(2), Some(1)));
    assert_eq!(d["state"], "progressing");

    // Ready: traffic switches, the old replicas drain, then leave.
    for a in rolling.iter().filter(|a| a.version == 2) {
        w.report_ready(&a.replica_id);
    }
    let switched = w.assignments_until(|a| a.iter().any(|x| x.version == 2 && x.serving)).await;
    assert_eq!(versions(&switched), [(1, false), (1, false), (2, true), (2, true)]);
    let done = w.assignments_until(|a| a.len() == 2).await;
    assert_eq!(versions(&done), [(2, true), (2, true)]);
    let d = deployment_until(&app, &acme.viewer, path, |d| d["state"] == "ready" && d["serving_version"] == 2).await;
    assert_eq!(d["replica_status"].as_array().map(Vec::len), Some(2));
    let events = app.get(&acme.viewer, &format!("{path}/events")).await.expect(200).clone();
    let kinds: Vec<&str> =
        events["events"].as_array().expect("events").iter().filter_map(|e| e["kind"].as_str()).collect();
    for kind in ["retargeted", "rollout_started", "rollout_switched", "drained"] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }

    // Rolling back is moving the alias back; a PATCH pins a version the same way.
    app.set_alias(&acme.deployer, "acme", "addsub", "production", 1).await.expect(200);
    let back = w.assignments_until(|a| a.iter().any(|x| x.version == 1)).await;
    assert_eq!(versions(&back), [(1, false), (1, false), (2, true), (2, true)]);
    let pinned = app
        .raw(app.client.patch(format!("{}{path}", app.url)).bearer_auth(&acme.deployer).json(&json!({ "version": 2 })));
    let pinned = pinned.await;
    assert_eq!((pinned.body["version"].as_i64(), pinned.body["alias"].is_null()), (Some(2), true), "{:?}", pinned.body);
    // The pin says it stopped following the alias, in the answer and in the events.
    let notice = pinned.body["notice"].as_str().unwrap_or_default();
    assert!(notice.starts_with("pinned to version 2: no longer follows alias 'production'"), "{notice}");
    let events = app.get(&acme.viewer, &format!("{path}/events")).await.expect(200).clone();
    let unfollowed = events["events"].as_array().unwrap().iter().any(|e| e["kind"] == "alias_unfollowed");
    assert!(unfollowed, "{events}");
    let again = app
        .raw(app.client.patch(format!("{}{path}", app.url)).bearer_auth(&acme.deployer).json(&json!({ "replicas": 2 })))
        .await;
    assert!(again.body.get("notice").is_none(), "only the change that unfollowed says so: {:?}", again.body);
    let settled = w.assignments_until(|a| a.len() == 2).await;
    assert_eq!(versions(&settled), [(2, true), (2, true)]);
    w.beats.abort();
}

#[tokio::test]
async fn a_gpu_model_is_refused_on_a_cpu_profile_naming_both() {
    let app = TestApp::spawn().await;
    let acme = app.tenant("acme").await;
    app.create_model(&acme.deployer, "acme", "addsub").await.expect(201);
    let upload = app
        .client
        .post(format!("{}/v1/tenants/acme/models/addsub/versions", app.url))
        .bearer_auth(&acme.deployer)
        .header("content-type", "application/octet-stream")
        .header("x-model-config", r#"{"instance_group": [{"kind": "KIND_GPU", "count": 1}]}"#)
        .body(tessera_data_plane::tools::onnx_builder::add_sub());
    app.raw(upload).await.expect(201);
    let expected = "model config asks for KIND_GPU but the deployment's profile is cpu; deploy with profile gpu or \
                    mig-<profile>";

    // The profile defaults to cpu.
    let body = json!({ "name": "addsub", "model": "addsub" });
    let refused = app.post(&acme.deployer, "/v1/tenants/acme/deployments", &body).await;
    assert_eq!(refused.expect(422)["error"]["message"], expected);
    let body = json!({ "name": "addsub", "model": "addsub", "profile": "mig-1g.10gb" });
    app.post(&acme.deployer, "/v1/tenants/acme/deployments", &body).await.expect(201);

    // Moving it to the CPU is refused the same way, and leaves it as it was.
    let path = format!("{}/v1/tenants/acme/deployments/addsub", app.url);
    let patch = app.client.patch(&path).bearer_auth(&acme.deployer).json(&json!({ "profile": "cpu" }));
    assert_eq!(app.raw(patch).await.expect(422)["error"]["message"], expected);
    let kept = app.get(&acme.viewer, "/v1/tenants/acme/deployments/addsub").await;
    assert_eq!(kept.expect(200)["profile"], "mig-1g.10gb");

    // A version without a device of its own may follow an alias on the CPU, but the alias may
    // not then move to the GPU version under it.
    let model = tessera_data_plane::tools::onnx_builder::add_sub();
    app.upload(&acme.deployer, "acme", "addsub", "", model).await.expect(201);
    app.set_alias(&acme.deployer, "acme", "addsub", "production", 2).await.expect(200);
    let patch = app.client.patch(&path).bearer_auth(&acme.deployer);
    let moved = app.raw(patch.json(&json!({ "profile": "cpu", "alias": "production" }))).await;
    assert_eq!(moved.expect(200)["version"], 2);
    let refused = app.set_alias(&acme.deployer, "acme", "addsub", "production", 1).await;
    let message = refused.expect(422)["error"]["message"].as_str().unwrap_or_default().to_string();
    assert_eq!(message, format!("deployment 'addsub' follows alias 'production': {expected}"));
}

/// A real worker with one (simulated) GPU and runners, on this machine's CPU build of ONNX
/// Runtime: the GPU slice's runner refuses the `KIND_GPU` version naming what is missing, and
/// the deployment shows it.
#[tokio::test]
async fn a_gpu_replica_fails_naming_the_missing_cuda_provider() {
    let args = args();
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let acme = app.tenant("acme").await;
    app.create_model(&acme.deployer, "acme", "addsub").await.expect(201);
    let upload = app
        .client
        .post(format!("{}/v1/tenants/acme/models/addsub/versions", app.url))
        .bearer_auth(&acme.deployer)
        .header("content-type", "application/octet-stream")
        .header("x-model-config", r#"{"instance_group": [{"kind": "KIND_GPU"}]}"#)
        .body(tessera_data_plane::tools::onnx_builder::add_sub());
    app.raw(upload).await.expect(201);
    let body = json!({ "name": "addsub", "model": "addsub", "profile": "gpu" });
    app.post(&acme.deployer, "/v1/tenants/acme/deployments", &body).await.expect(201);

    let dir = tempfile::tempdir().expect("tempdir");
    let inventory = dir.path().join("gpus.json");
    let gpus = json!({ "gpus": [{ "uuid": "GPU-6a1e5c3b-0000-0000-0000-000000000000", "index": 0,
                                   "memory_bytes": 85_899_345_920_u64 }] });
    std::fs::write(&inventory, gpus.to_string()).expect("write the inventory");
    let token = tessera_data_plane::worker::WorkerToken::new(TOKEN);
    let mut config = tessera_data_plane::worker::WorkerConfig::local(&app.url, token, dir.path().join("worker"));
    config.cpu_slices = 0;
    config.inventory = Some(inventory);
    config.runner_exe = Some(env!("CARGO_BIN_EXE_tessera").into());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(tessera_data_plane::worker::run(config, shutdown.clone(), |_| {}));

    let path = "/v1/tenants/acme/deployments/addsub";
    let failed = deployment_until(&app, &acme.viewer, path, |d| d["state"] == "failed").await;
    let replica = &failed["replica_status"][0];
    assert_eq!(replica["slice_id"], "GPU-6a1e5c3b-0000-0000-0000-000000000000", "{failed:#}");
    let reason = replica["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("KIND_GPU needs ONNX Runtime's CUDA execution provider, which this ONNX Runtime build (")
            && reason.contains("scripts/setup-ort.sh --gpu"),
        "{reason}"
    );
    shutdown.cancel();
    worker.await.expect("the worker task").expect("the worker stops cleanly");
}

/// (version, weight, ready replicas) of each entry of a deployment's `traffic`.
fn traffic(d: &Value) -> Vec<(i64, i64, i64)> {
    let entries = d["traffic"].as_array().cloned().unwrap_or_default();
    entries
        .iter()
        .map(|t| {
            let n = |k: &str| t[k].as_i64().unwrap_or(-1);
            (n("version"), n("weight"), n("ready_replicas"))
        })
        .collect()
}

#[tokio::test]
async fn a_canary_gets_its_replicas_and_weight_then_promotion_rolls_out_and_rollback_drains() {
    let args = args();
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let acme = app.tenant("acme").await;
    let other = app.tenant("umbrella").await;
    app.create_model(&acme.deployer, "acme", "addsub").await.expect(201);
    let model = tessera_data_plane::tools::onnx_builder::add_sub();
    app.upload(&acme.deployer, "acme", "addsub", "", model.clone()).await.expect(201);
    let body = json!({ "name": "addsub", "model": "addsub", "version": 1, "replicas": 2 });
    app.post(&acme.deployer, "/v1/tenants/acme/deployments", &body).await.expect(201);
    let path = "/v1/tenants/acme/deployments/addsub";
    let mut w = FakeWorker::start(&app, "worker-1", 18300).await;
    for a in w.assignments_until(|a| a.len() == 2).await {
        w.report_ready(&a.replica_id);
    }
    let d = deployment_until(&app, &acme.viewer, path, |d| d["state"] == "ready").await;
    assert_eq!(traffic(&d), [(1, 100, 2)]);
    assert!(d["canary"].is_null());
    app.upload(&acme.deployer, "acme", "addsub", "", model).await.expect(201);

    // Refusals: roles, tenancy, the weight's range, the stable version, no canary yet.
    let canary = format!("{path}/canary");
    let set = json!({ "version": 2, "weight": 10 });
    app.put(&acme.viewer, &canary, &set).await.expect(403);
    app.put(&other.deployer, &canary, &set).await.expect(404);
    let bad = app.put(&acme.deployer, &canary, &json!({ "version": 2, "weight": 100 })).await;
    assert_eq!(bad.expect(422)["error"]["field"], "weight", "{:?}", bad.body);
    let same = app.put(&acme.deployer, &canary, &json!({ "version": 1, "weight": 10 })).await;
    assert_eq!(same.expect(422)["error"]["field"], "version");
    let none = app.post(&acme.deployer, &format!("{canary}/promote"), &json!({})).await;
    assert_eq!((none.status, none.code()), (409, "no_canary"));

    // Set: its replica loads beside the stable ones and serves once ready.
    let d = app.put(&acme.deployer, &canary, &set).await.expect(200).clone();
    assert_eq!(d["canary"], json!({ "version": 2, "weight": 10, "replicas": 1 }));
    assert_eq!(traffic(&d), [(1, 90, 2), (2, 10, 0)]);
    let loading = w.assignments_until(|a| a.len() == 3).await;
    assert_eq!(versions(&loading), [(1, true), (1, true), (2, false)]);
    for a in loading.iter().filter(|a| a.version == 2) {
        w.report_ready(&a.replica_id);
    }
    let serving = w.assignments_until(|a| a.iter().any(|x| x.version == 2 && x.serving)).await;
    assert_eq!(versions(&serving), [(1, true), (1, true), (2, true)]);
    // The canary leaves the deployment's state and serving version to the stable replicas.
    let d =
        deployment_until(&app, &acme.viewer, path, |d| traffic(d) == [(1, 90, 2), (2, 10, 1)] && d["state"] == "ready")
            .await;
    assert_eq!(d["serving_version"], 1);
    let canary_replicas: Vec<&Value> =
        d["replica_status"].as_array().expect("replicas").iter().filter(|r| r["canary"] == true).collect();
    assert_eq!(canary_replicas.len(), 1);
    let patched = app.raw(
        app.client.patch(format!("{}{canary}", app.url)).bearer_auth(&acme.deployer).json(&json!({ "weight": 20 })),
    );
    assert_eq!(traffic(patched.await.expect(200)), [(1, 80, 2), (2, 20, 1)]);
    // The CLI changes the weight and shows the split.
    let out = cli(&app, &acme.deployer, &["deployments", "canary", "addsub", "--weight", "25"]).await;
    assert!(out.contains("traffic: version 1 75% (2/2 ready), canary version 2 25% (1/1 ready)"), "{out}");
    let out = cli(&app, &acme.viewer, &["deployments", "get", "addsub"]).await;
    assert!(out.contains("canary version 2 25%") && out.lines().any(|l| l.contains("  canary")), "{out}");

    // Promote: the stable replicas roll out to version 2 while the canary keeps its share, then
    // the canary's replica drains and the deployment ends on version 2.
    let out = cli(&app, &acme.deployer, &["deployments", "promote", "addsub", "--output", "json"]).await;
    let promoted: Value = serde_json::from_str(&out).expect("the deployment as JSON");
    assert_eq!((promoted["version"].as_i64(), promoted["canary"].is_null()), (Some(2), true));
    assert_eq!(traffic(&promoted), [(1, 75, 2), (2, 25, 1)]);
    let rolling = w.assignments_until(|a| a.len() == 5).await;
    assert_eq!(versions(&rolling), [(1, true), (1, true), (2, false), (2, false), (2, true)]);
    for a in rolling.iter().filter(|a| a.version == 2 && !a.serving) {
        w.report_ready(&a.replica_id);
    }
    let done = w.assignments_until(|a| a.len() == 2).await;
    assert_eq!(versions(&done), [(2, true), (2, true)]);
    let d = deployment_until(&app, &acme.viewer, path, |d| d["state"] == "ready" && d["serving_version"] == 2).await;
    assert_eq!(traffic(&d), [(2, 100, 2)]);
    assert!(d["canary"].is_null());

    // Roll back: a canary of version 1 serves, then goes; the stable version keeps everything.
    app.put(&acme.deployer, &canary, &json!({ "version": 1, "weight": 50 })).await.expect(200);
    let with_canary = w.assignments_until(|a| a.len() == 3).await;
    for a in with_canary.iter().filter(|a| a.version == 1) {
        w.report_ready(&a.replica_id);
    }
    w.assignments_until(|a| a.iter().any(|x| x.version == 1 && x.serving)).await;
    let back = app.post_idempotent(&acme.deployer, &format!("{canary}/rollback"), &json!({}), "rb-1").await;
    let back = back.expect(200).clone();
    assert_eq!((back["canary"].is_null(), traffic(&back)), (true, vec![(2, 100, 2)]));
    let drained = w.assignments_until(|a| a.len() == 2).await;
    assert_eq!(versions(&drained), [(2, true), (2, true)]);
    let replay = app.post_idempotent(&acme.deployer, &format!("{canary}/rollback"), &json!({}), "rb-1").await;
    assert_eq!(replay.expect(200)["id"], back["id"], "an idempotent retry replays");
    let again = app.post(&acme.deployer, &format!("{canary}/rollback"), &json!({})).await;
    assert_eq!((again.status, again.code()), (409, "no_canary"));

    let events = app.get(&acme.viewer, &format!("{path}/events")).await.expect(200).clone();
    let kinds: Vec<&str> =
        events["events"].as_array().expect("events").iter().filter_map(|e| e["kind"].as_str()).collect();
    for kind in
        ["canary_set", "canary_weight", "canary_serving", "canary_promoted", "canary_cleared", "canary_rolled_back"]
    {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    w.beats.abort();
}

/// Runs the `tessera` CLI against the app as `key` in tenant acme; returns its standard output.
async fn cli(app: &TestApp, key: &str, args: &[&str]) -> String {
    let home = tempfile::tempdir().expect("a home for the CLI");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .args(["--url", &app.url, "--key", key, "--tenant", "acme"])
        .env("HOME", home.path())
        .output()
        .await
        .expect("run the CLI");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "tessera {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// An ensemble's replica carries its composing versions, pinned at upload, each with its
/// artifact and its own config under the replica's instance group; the worker loads them with it.
#[tokio::test]
async fn an_ensemble_replica_carries_its_pinned_composing_versions() {
    use tessera_protocol::archive::test_support::tar_of;

    let args = args();
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let acme = app.tenant("acme").await;
    app.create_model(&acme.deployer, "acme", "addsub").await.expect(201);
    let model = tessera_data_plane::tools::onnx_builder::add_sub();
    let step = app.upload(&acme.deployer, "acme", "addsub", "", model.clone()).await.expect(201).clone();
    const CONFIG: &str = "platform: \"ensemble\"\nmax_batch_size: 0\n\
        input [ { name: \"A\" data_type: TYPE_FP32 dims: [ 16 ] }, { name: \"B\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n\
        output [ { name: \"SUM\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n\
        ensemble_scheduling { step [ { model_name: \"addsub\" model_version: -1 \
        input_map [ { key: \"INPUT0\" value: \"A\" }, { key: \"INPUT1\" value: \"B\" } ] \
        output_map { key: \"OUTPUT0\" value: \"SUM\" } } ] }\n";
    app.create_model(&acme.deployer, "acme", "pipe").await.expect(201);
    let archive = tar_of(&[("pipe/config.pbtxt", CONFIG.as_bytes())], &[]);
    let v = app.upload(&acme.deployer, "acme", "pipe", "?format=tar", archive).await.expect(201).clone();
    assert_eq!(v["config"]["ensemble_scheduling"]["step"][0]["model_version"], 1, "pinned at upload");
    assert_eq!(v["signature"]["platform"], "ensemble");
    // A second addsub version leaves the ensemble's step where it was pinned.
    app.upload(&acme.deployer, "acme", "addsub", "", model).await.expect(201);

    let body = json!({ "name": "pipe", "model": "pipe", "replicas": 1, "instance_count": 2 });
    app.post(&acme.deployer, "/v1/tenants/acme/deployments", &body).await.expect(201);
    let mut w = FakeWorker::start(&app, "worker-e", 18600).await;
    let assigned = w.assignments_until(|a| !a.is_empty()).await;
    let a = &assigned[0];
    assert_eq!((a.model_name.as_str(), a.version), ("pipe", 1));
    assert_eq!(a.composing.len(), 1, "{:?}", a.composing);
    let c = &a.composing[0];
    assert_eq!((c.model_name.as_str(), c.version), ("addsub", 1));
    assert_eq!(c.artifact.as_ref().map(|x| x.sha256.as_str()), step["sha256"].as_str());
    let config: Value = serde_json::from_str(&c.config_json).expect("config json");
    assert_eq!(config["name"], "addsub");
    assert_eq!(config["instance_group"], json!([{ "count": 2, "kind": "KIND_CPU" }]));
    w.report_ready(&a.replica_id);
    deployment_until(&app, &acme.viewer, "/v1/tenants/acme/deployments/pipe", |d| d["state"] == "ready").await;

    // The composed version stays while the ensemble version names it.
    let refused = app.delete(&acme.deployer, "/v1/tenants/acme/models/addsub/versions/1").await;
    assert_eq!(refused.status, 409, "{:?}", refused.body);
    assert_eq!(refused.body["error"]["code"], "version_in_use");
    app.delete(&acme.deployer, "/v1/tenants/acme/models/addsub/versions/2").await.expect(204);
    w.beats.abort();
}
