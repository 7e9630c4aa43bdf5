//! The agent gRPC service workers call (`tessera.agent.v1.WorkerAgent`), served on the REST
//! listener: sessions (registration, heartbeats, assignments), API key lookups for workers'
//! inference endpoints, the token keys, artifact downloads, usage reports, capture batches, and
//! gateways' route streams.
//!
//! Every call must carry `authorization: Bearer <token>`, checked in constant time by an
//! interceptor before any method runs: the worker token (`--worker-token`) allows every call;
//! the gateway token (`--gateway-token`), when the control plane has one, allows only what a
//! gateway needs ([`AgentCaller::Gateway`]), and gateways must then present it.

mod routes;
mod session;

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use tessera_protocol::agent::worker_agent_server::{WorkerAgent, WorkerAgentServer};
use tessera_protocol::agent::{
    ArtifactChunk, AuthenticateKeyRequest, AuthenticateKeyResponse, ControlMessage, FetchArtifactRequest,
    GetTokenKeysRequest, GetTokenKeysResponse, ReportCaptureRequest, ReportCaptureResponse, ReportUsageRequest,
    ReportUsageResponse, RouteTable, WatchRoutesRequest, WorkerMessage,
};
use tessera_protocol::auth::api_key;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::{Request, Response, Status, Streaming};

use crate::app::App;
use crate::config::Secret;

/// Size of the chunks `FetchArtifact` streams.
pub const ARTIFACT_CHUNK_BYTES: usize = 1024 * 1024;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The service: shared state plus the shutdown token that ends open sessions.
pub struct AgentService {
    app: Arc<App>,
    shutdown: CancellationToken,
}

/// The agent service as axum routes (`/tessera.agent.v1.WorkerAgent/*`), to merge with the
/// REST router on one listener. Sessions end when `shutdown` is cancelled.
pub fn routes(app: Arc<App>, shutdown: CancellationToken) -> axum::Router {
    let check = AgentTokenCheck::new(app.config.worker_token.as_ref(), app.config.gateway_token.as_ref());
    let server = WorkerAgentServer::new(AgentService { app, shutdown });
    let service = tonic::service::interceptor::InterceptedService::new(server, move |req| check.check(req));
    let path = format!("/{}/{{*rest}}", WorkerAgentServer::<AgentService>::NAME);
    axum::Router::new().route_service(&path, service)
}

/// What the API port answers to agent calls when the agent service has a listener of its own
/// (`--agent-listen`): a gRPC `UNIMPLEMENTED` that says where to go, so a worker pointed at the
/// wrong port logs a reason instead of failing to decode an HTTP 404 page.
pub fn elsewhere_routes() -> axum::Router {
    let path = format!("/{}/{{*rest}}", WorkerAgentServer::<AgentService>::NAME);
    axum::Router::new().route(
        &path,
        axum::routing::any(|| async {
            let status = Status::unimplemented(
                "the agent service listens on the control plane's agent port (--agent-listen), not its API port",
            );
            status.into_http::<axum::body::Body>()
        }),
    )
}

/// Whose token an agent call carried; the interceptor puts it in the request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentCaller {
    /// The worker token: every call.
    Worker,
    /// The gateway token: `AuthenticateKey`, `GetTokenKeys`, `WatchRoutes` and `ReportUsage` of
    /// refused requests only.
    Gateway,
}

/// Compares presented tokens with the configured ones in constant time: each is MACed with a
/// per-process random key and the MACs compared by `verify_slice`, so neither the content nor
/// the length of a token leaks through timing (both are always compared).
#[derive(Clone)]
struct AgentTokenCheck {
    key: Arc<[u8; 32]>,
    worker: Option<Arc<Vec<u8>>>,
    gateway: Option<Arc<Vec<u8>>>,
}

impl AgentTokenCheck {
    fn new(worker: Option<&Secret>, gateway: Option<&Secret>) -> Self {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        let key = Arc::new(key);
        let expected = |t: &Secret| Arc::new(mac(&key, t.expose().as_bytes()).finalize().into_bytes().to_vec());
        AgentTokenCheck { worker: worker.map(expected), gateway: gateway.map(expected), key }
    }

    fn check(&self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if self.worker.is_none() {
            return Err(Status::unauthenticated("this control plane has no --worker-token; agent calls are refused"));
        }
        let presented = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            // The presented token is MACed once; each configured one is compared against it.
            .map(|(_, token)| mac(&self.key, token.trim().as_bytes()));
        let Some(presented) = presented else {
            return Err(Status::unauthenticated("missing or invalid worker or gateway token"));
        };
        let matches = |expected: &Option<Arc<Vec<u8>>>| {
            expected.as_ref().is_some_and(|e| presented.clone().verify_slice(e).is_ok())
        };
        let caller = match (matches(&self.worker), matches(&self.gateway)) {
            (true, _) => AgentCaller::Worker,
            (false, true) => AgentCaller::Gateway,
            (false, false) => return Err(Status::unauthenticated("missing or invalid worker or gateway token")),
        };
        req.extensions_mut().insert(caller);
        Ok(req)
    }
}

/// The caller the interceptor found; a request that did not pass it is refused.
fn caller_of<T>(request: &Request<T>) -> Result<AgentCaller, Status> {
    request.extensions().get::<AgentCaller>().copied().ok_or_else(|| Status::unauthenticated("no agent credential"))
}

/// Refuses a gateway's token for a worker's call.
fn workers_only<T>(request: &Request<T>, what: &str) -> Result<(), Status> {
    match caller_of(request)? {
        AgentCaller::Worker => Ok(()),
        AgentCaller::Gateway => Err(Status::permission_denied(format!("a gateway token may not {what}"))),
    }
}

fn mac(key: &[u8; 32], data: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length.
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("hmac takes any key length");
    m.update(data);
    m
}

#[tonic::async_trait]
impl WorkerAgent for AgentService {
    type SessionStream = BoxStream<ControlMessage>;
    type FetchArtifactStream = BoxStream<ArtifactChunk>;
    type WatchRoutesStream = BoxStream<RouteTable>;

    async fn session(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        workers_only(&request, "open a worker session")?;
        let stream = session::start(self.app.clone(), request.into_inner(), self.shutdown.clone()).await?;
        Ok(Response::new(stream))
    }

    async fn authenticate_key(
        &self,
        request: Request<AuthenticateKeyRequest>,
    ) -> Result<Response<AuthenticateKeyResponse>, Status> {
        caller_of(&request)?;
        let key = request.into_inner().api_key;
        // NOT_FOUND, not UNAUTHENTICATED: that code means the worker's own token was refused,
        // and a worker must not evict the keys it cached because of its own misconfiguration.
        if !api_key::looks_like_key(&key) {
            return Err(Status::not_found("not an API key"));
        }
        let (principal, expires_at) = self.app.auth.resolve_key(&key).await.map_err(|e| match e {
            crate::error::Error::Unauthenticated => Status::not_found("unknown, revoked or expired API key"),
            other => Status::from(other),
        })?;
        Ok(Response::new(AuthenticateKeyResponse {
            tenant_id: principal.tenant_id.to_string(),
            tenant_name: principal.tenant_name,
            role: principal.role.as_str().to_string(),
            expires_at: expires_at.map_or(0, |t| t.unix_timestamp()),
            // An API key always names its key; only console sessions have none.
            key_id: principal.key_id.map(|k| k.to_string()).unwrap_or_default(),
            user_id: principal.user_id.map(|u| u.to_string()).unwrap_or_default(),
        }))
    }

    async fn get_token_keys(
        &self,
        request: Request<GetTokenKeysRequest>,
    ) -> Result<Response<GetTokenKeysResponse>, Status> {
        caller_of(&request)?;
        // Another replica may have rotated; a failed reload still answers with the keys held.
        if let Err(e) = self.app.tokens.reload().await {
            tracing::warn!(error = %e, "could not reload token keys for a worker");
        }
        let jwks = serde_json::to_string(&self.app.tokens.jwks()).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(GetTokenKeysResponse {
            jwks_json: jwks,
            issuer: self.app.config.token_issuer.clone(),
            audience: self.app.config.token_audience.clone(),
        }))
    }

    async fn fetch_artifact(
        &self,
        request: Request<FetchArtifactRequest>,
    ) -> Result<Response<Self::FetchArtifactStream>, Status> {
        workers_only(&request, "fetch artifacts")?;
        let key = request.into_inner().key;
        // Only registered artifacts: the worker token must not read arbitrary objects.
        if key.is_empty() || !self.app.registry.conn().await?.is_artifact(&key).await? {
            return Err(Status::not_found(format!("no artifact '{key}'")));
        }
        let chunks = self.app.store.get_chunks(&key, ARTIFACT_CHUNK_BYTES).await?;
        let stream = chunks.map(|c| c.map(|data| ArtifactChunk { data }).map_err(Status::from));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn report_usage(
        &self,
        request: Request<ReportUsageRequest>,
    ) -> Result<Response<ReportUsageResponse>, Status> {
        let caller = caller_of(&request)?;
        let records = request.into_inner().records;
        if caller == AgentCaller::Gateway
            && let Some(r) = records.iter().find(|r| !tessera_protocol::usage::is_gateway_record(r))
        {
            return Err(Status::permission_denied(format!(
                "a gateway token may report only refused requests (profile '{}', keys under '{}', no served \
                 counters); record '{}' is not one",
                tessera_protocol::usage::GATEWAY_PROFILE,
                tessera_protocol::usage::GATEWAY_KEY_PREFIX,
                r.key
            )));
        }
        let acknowledged = crate::usage::ingest(&self.app.registry, &records).await?;
        Ok(Response::new(ReportUsageResponse { acknowledged }))
    }

    async fn report_capture(
        &self,
        request: Request<ReportCaptureRequest>,
    ) -> Result<Response<ReportCaptureResponse>, Status> {
        workers_only(&request, "store captured requests")?;
        let key = crate::capture::ingest(&self.app.registry, &self.app.store, request.into_inner()).await?;
        Ok(Response::new(ReportCaptureResponse { key }))
    }

    async fn watch_routes(
        &self,
        request: Request<WatchRoutesRequest>,
    ) -> Result<Response<Self::WatchRoutesStream>, Status> {
        // With a gateway token configured, only it may follow the routes: the worker token is
        // for workers.
        if caller_of(&request)? == AgentCaller::Worker && self.app.config.gateway_token.is_some() {
            return Err(Status::permission_denied(
                "this control plane has a gateway token: gateways present it (--gateway-token), not the worker token",
            ));
        }
        let stream = routes::start(self.app.clone(), request.into_inner(), self.shutdown.clone())?;
        Ok(Response::new(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_auth(value: &str) -> Request<()> {
        let mut req = Request::new(());
        req.metadata_mut().insert("authorization", value.parse().unwrap());
        req
    }

    fn caller(check: &AgentTokenCheck, value: &str) -> Result<AgentCaller, tonic::Code> {
        check.check(with_auth(value)).map(|r| caller_of(&r).expect("marked")).map_err(|e| e.code())
    }

    #[test]
    fn worker_tokens_are_checked() {
        let check = AgentTokenCheck::new(Some(&Secret::new("s3cret")), None);
        assert_eq!(caller(&check, "Bearer s3cret"), Ok(AgentCaller::Worker));
        assert_eq!(caller(&check, "bearer s3cret"), Ok(AgentCaller::Worker));
        for bad in ["Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret", "Bearer "] {
            assert_eq!(caller(&check, bad), Err(tonic::Code::Unauthenticated), "{bad}");
        }
        assert_eq!(check.check(Request::new(())).unwrap_err().code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn a_gateway_token_is_told_from_the_worker_token() {
        let check = AgentTokenCheck::new(Some(&Secret::new("w0rker")), Some(&Secret::new("g4teway")));
        assert_eq!(caller(&check, "Bearer w0rker"), Ok(AgentCaller::Worker));
        assert_eq!(caller(&check, "Bearer g4teway"), Ok(AgentCaller::Gateway));
        assert_eq!(caller(&check, "Bearer g4tewa"), Err(tonic::Code::Unauthenticated));
        let denied = workers_only(&check.check(with_auth("Bearer g4teway")).unwrap(), "fetch artifacts").unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(denied.message().contains("fetch artifacts"), "{}", denied.message());
        assert!(workers_only(&Request::new(()), "x").is_err(), "an unchecked request has no caller");
    }

    #[test]
    fn without_a_configured_token_every_call_is_refused() {
        let e = AgentTokenCheck::new(None, Some(&Secret::new("g"))).check(with_auth("Bearer g")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(e.message().contains("--worker-token"));
    }
}
