//! The agent gRPC service workers call (`tessera.agent.v1.WorkerAgent`), served on the REST
//! listener: sessions (registration, heartbeats, assignments), API key lookups for workers'
//! inference endpoints, the token keys, artifact downloads, usage reports, capture batches, and
//! gateways' route streams.
//!
//! Every call must carry `authorization: Bearer <worker token>` (`--worker-token`), checked in
//! constant time by an interceptor before any method runs.

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
    let check = WorkerTokenCheck::new(app.config.worker_token.as_ref());
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

/// Compares presented worker tokens with the configured one in constant time: both are
/// MACed with a per-process random key and the MACs compared by `verify_slice`, so neither
/// the content nor the length of the token leaks through timing.
#[derive(Clone)]
struct WorkerTokenCheck {
    key: Arc<[u8; 32]>,
    expected: Option<Arc<Vec<u8>>>,
}

impl WorkerTokenCheck {
    fn new(token: Option<&Secret>) -> Self {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        let key = Arc::new(key);
        let expected = token.map(|t| Arc::new(mac(&key, t.expose().as_bytes()).finalize().into_bytes().to_vec()));
        WorkerTokenCheck { key, expected }
    }

    fn check(&self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            return Err(Status::unauthenticated("this control plane has no --worker-token; agent calls are refused"));
        };
        let presented = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim().to_string());
        let ok = presented.is_some_and(|p| mac(&self.key, p.as_bytes()).verify_slice(expected).is_ok());
        if ok { Ok(req) } else { Err(Status::unauthenticated("missing or invalid worker token")) }
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
        let stream = session::start(self.app.clone(), request.into_inner(), self.shutdown.clone()).await?;
        Ok(Response::new(stream))
    }

    async fn authenticate_key(
        &self,
        request: Request<AuthenticateKeyRequest>,
    ) -> Result<Response<AuthenticateKeyResponse>, Status> {
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
        _request: Request<GetTokenKeysRequest>,
    ) -> Result<Response<GetTokenKeysResponse>, Status> {
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
        let records = request.into_inner().records;
        let acknowledged = crate::usage::ingest(&self.app.registry, &records).await?;
        Ok(Response::new(ReportUsageResponse { acknowledged }))
    }

    async fn report_capture(
        &self,
        request: Request<ReportCaptureRequest>,
    ) -> Result<Response<ReportCaptureResponse>, Status> {
        let key = crate::capture::ingest(&self.app.registry, &self.app.store, request.into_inner()).await?;
        Ok(Response::new(ReportCaptureResponse { key }))
    }

    async fn watch_routes(
        &self,
        request: Request<WatchRoutesRequest>,
    ) -> Result<Response<Self::WatchRoutesStream>, Status> {
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

    #[test]
    fn worker_tokens_are_checked() {
        let check = WorkerTokenCheck::new(Some(&Secret::new("s3cret")));
        assert!(check.check(with_auth("Bearer s3cret")).is_ok());
        assert!(check.check(with_auth("bearer s3cret")).is_ok());
        for bad in ["Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret", "Bearer "] {
            let e = check.check(with_auth(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad}");
        }
        assert_eq!(check.check(Request::new(())).unwrap_err().code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn without_a_configured_token_every_call_is_refused() {
        let e = WorkerTokenCheck::new(None).check(with_auth("Bearer anything")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(e.message().contains("--worker-token"));
    }
}
