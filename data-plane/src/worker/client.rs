//! The worker's gRPC client to the control plane's agent service: one lazily connected channel
//! (TLS for an `https://` control plane), the worker token attached to every call.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tessera_protocol::agent::worker_agent_client::WorkerAgentClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::config::WorkerToken;

/// How long establishing a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// HTTP/2 pings find a dead control plane even while the session is quiet.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// A ping unanswered this long closes the connection (and so the session).
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest message accepted (artifact chunks are 1 MiB).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// The agent client every worker component shares (cheap to clone: one HTTP/2 connection).
pub type AgentClient = WorkerAgentClient<InterceptedService<Channel, BearerToken>>;

/// Adds `authorization: Bearer <worker token>` to every request.
#[derive(Clone)]
pub struct BearerToken(MetadataValue<Ascii>);

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        request.metadata_mut().insert("authorization", self.0.clone());
        Ok(request)
    }
}

/// A client for `url` that connects on first use and reconnects after failures, so a worker
/// starts (and keeps serving) while the control plane is down. An `https://` URL is reached
/// over TLS, trusting the system's roots and `ca_cert`.
pub fn connect(url: &str, token: &WorkerToken, ca_cert: Option<&Path>) -> anyhow::Result<AgentClient> {
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .with_context(|| format!("parse the control plane URL {url}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    if url.starts_with("https://") {
        let verifier = tessera_protocol::tls::server_verifier(ca_cert)?;
        endpoint = endpoint
            .tls_config_with_verifier(ClientTlsConfig::new(), verifier)
            .context("configure TLS to the control plane")?;
    }
    let mut value: MetadataValue<Ascii> =
        format!("Bearer {}", token.expose()).parse().context("the worker token must be printable ASCII")?;
    value.set_sensitive(true);
    Ok(WorkerAgentClient::with_interceptor(endpoint.connect_lazy(), BearerToken(value))
        .max_decoding_message_size(MAX_MESSAGE))
}
