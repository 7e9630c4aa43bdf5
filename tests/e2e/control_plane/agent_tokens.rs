//! The two agent credentials: the worker token does everything a worker does; the gateway token
//! (`--gateway-token`) follows the routes, resolves keys, reads the token keys and reports
//! refused requests, and nothing else. Workers learn the key gateways sign with from
//! `Registered`, never the token.

use futures::SinkExt;
use futures::channel::mpsc;
use tessera_protocol::agent::{
    AuthenticateKeyRequest, FetchArtifactRequest, GetTokenKeysRequest, Register, Registered, ReportCaptureRequest,
    ReportUsageRequest, Slice, UsageRecord, WatchRoutesRequest, WorkerMessage, control_message, worker_message,
};
use tessera_protocol::usage::{BATCH_SIZE_BUCKETS, GATEWAY_KEY_PREFIX, GATEWAY_PROFILE, LATENCY_BUCKETS_US};

use super::deployments::{Client, TOKEN, client};
use super::{Opts, TestApp};

const GATEWAY_TOKEN: &str = "gateway-secret-for-tests";

fn refused(record: UsageRecord) -> ReportUsageRequest {
    ReportUsageRequest { records: vec![record] }
}

/// A worker's `Register`: one CPU slice, endpoints nobody calls.
pub(super) fn registration(worker_id: &str) -> WorkerMessage {
    let slice = Slice { id: "cpu-0".into(), profile: "cpu".into(), kind: 1, memory_bytes: 1 << 30, ..Slice::default() };
    let register = Register {
        worker_id: worker_id.into(),
        http_endpoint: "http://127.0.0.1:1".into(),
        grpc_endpoint: "127.0.0.1:2".into(),
        slices: vec![slice],
        ..Register::default()
    };
    WorkerMessage { kind: Some(worker_message::Kind::Register(register)) }
}

/// Opens a session as worker `w-1`; answers the control plane's `Registered`.
async fn registered(worker: &mut Client) -> Registered {
    let (mut tx, rx) = mpsc::channel(1);
    tx.send(registration("w-1")).await.expect("queue");
    let mut session = worker.session(rx).await.expect("a session").into_inner();
    let first = session.message().await.expect("a message").expect("not closed").kind;
    let Some(control_message::Kind::Registered(registered)) = first else { panic!("registered first: {first:?}") };
    registered
}

#[tokio::test]
async fn a_gateway_token_calls_only_what_a_gateway_needs() {
    let args = ["--worker-token", TOKEN, "--gateway-token", GATEWAY_TOKEN];
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let acme = app.tenant("acme").await;
    let acme_id = app.get(&acme.viewer, "/v1/tenants/acme").await.expect(200)["id"].as_str().unwrap().to_string();
    let mut gateway = client(&app, GATEWAY_TOKEN).await;
    let mut worker = client(&app, TOKEN).await;

    // What a gateway does.
    let request = WatchRoutesRequest { gateway_id: "gw-1".into(), version: "test".into() };
    let mut routes = gateway.watch_routes(request.clone()).await.expect("routes for the gateway").into_inner();
    routes.message().await.expect("a table").expect("not closed");
    let found = gateway.authenticate_key(AuthenticateKeyRequest { api_key: acme.inference.clone() }).await;
    assert_eq!(found.expect("a key lookup").into_inner().tenant_name, "acme");
    gateway.get_token_keys(GetTokenKeysRequest {}).await.expect("token keys");
    let minute = time::OffsetDateTime::now_utc().unix_timestamp() / 60 * 60;
    let throttled = UsageRecord {
        key: format!("{GATEWAY_KEY_PREFIX}gw-1:boot:0"),
        worker_id: "gw-1".into(),
        tenant_id: acme_id.clone(),
        model_name: "m".into(),
        slice_profile: GATEWAY_PROFILE.into(),
        minute,
        latency_counts: vec![0; LATENCY_BUCKETS_US.len() + 1],
        batch_size_counts: vec![0; BATCH_SIZE_BUCKETS.len() + 1],
        throttled: 3,
        ..UsageRecord::default()
    };
    let acked = gateway.report_usage(refused(throttled.clone())).await.expect("refusals reported");
    assert_eq!(acked.into_inner().acknowledged, vec![throttled.key.clone()]);

    // What it may not: a worker's session, artifacts, captures, served usage, a worker's keys.
    let denied = |e: tonic::Status, what: &str| {
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{what}: {e:?}");
        assert!(e.message().contains("gateway token"), "{what}: {}", e.message());
    };
    let (mut tx, rx) = mpsc::channel(1);
    let register = Register { worker_id: "w-1".into(), ..Register::default() };
    tx.send(WorkerMessage { kind: Some(worker_message::Kind::Register(register)) }).await.expect("queue");
    denied(gateway.session(rx).await.expect_err("no session"), "session");
    let fetch = FetchArtifactRequest { key: "tenants/x/models/m/1/model.onnx".into() };
    denied(gateway.fetch_artifact(fetch).await.expect_err("no artifacts"), "artifact");
    let capture = ReportCaptureRequest { tenant_id: acme_id.clone(), ..ReportCaptureRequest::default() };
    denied(gateway.report_capture(capture).await.expect_err("no captures"), "capture");
    let served = UsageRecord { key: format!("{GATEWAY_KEY_PREFIX}gw-1:boot:1"), requests: 1, ..throttled.clone() };
    denied(gateway.report_usage(refused(served)).await.expect_err("no served usage"), "served usage");
    let workers_key = UsageRecord { key: "w-1:boot:0".into(), ..throttled.clone() };
    denied(gateway.report_usage(refused(workers_key)).await.expect_err("not a worker's key"), "worker key");
    let usage = app.get(&acme.viewer, "/v1/tenants/acme/usage").await.expect(200).clone();
    assert_eq!(usage["usage"][0]["throttled"], 3, "only the refusals were stored: {usage}");
    assert_eq!(usage["usage"][0]["requests"], 0, "{usage}");

    // The worker token no longer follows routes once gateways have their own token.
    let e = worker.watch_routes(request).await.expect_err("routes are the gateway's");
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(e.message().contains("--gateway-token"), "{}", e.message());
    let wrong = client(&app, "neither").await.get_token_keys(GetTokenKeysRequest {}).await.expect_err("no token");
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated);

    // A worker registers and is told the gateways' key: derived from their token, not it.
    let registered = registered(&mut worker).await;
    let expected = tessera_protocol::auth::forwarded_identity_key(GATEWAY_TOKEN);
    assert_eq!(registered.gateway_identity_key, expected.to_vec());
    assert!(!registered.gateway_identity_key.windows(8).any(|w| GATEWAY_TOKEN.as_bytes().windows(8).any(|t| t == w)));
}

#[tokio::test]
async fn without_a_gateway_token_gateways_use_the_worker_token_and_workers_their_own_key() {
    let app = TestApp::spawn_with(Opts { args: &["--worker-token", TOKEN], ..Opts::default() }).await;
    let mut worker = client(&app, TOKEN).await;
    let request = WatchRoutesRequest { gateway_id: "gw-1".into(), version: "test".into() };
    worker.watch_routes(request).await.expect("routes for the worker token").into_inner();
    let registered = registered(&mut worker).await;
    assert!(registered.gateway_identity_key.is_empty(), "no gateway key to send");
}
