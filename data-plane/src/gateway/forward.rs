//! Sending a request to a replica: pooled HTTP/1.1 connections for HTTP requests (the lean
//! path's, [`super::h1::upstream`], or hyper's, [`super::http_upstream`]; HTTP/2 with
//! `--upstream-http2`), unary gRPC calls over the lean path's HTTP/1.1 too when alone in flight
//! to their worker ([`super::h1::unary`]) and over HTTP/2 ([`super::grpc_upstream`]) otherwise,
//! gRPC streams over HTTP/2 through hyper's client, and the retry rule shared by all.
//!
//! A request is sent again, to another replica, only when none of it can have run there: the
//! worker could not be connected to, it refused a gRPC call unread (HTTP/2 `REFUSED_STREAM`),
//! or it answered that it does not hold the model (its route was stale: the replica was just
//! moved or unloaded). Anything else, including a
//! connection that broke after the request was sent, is answered as it came.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Response, Uri};
use http_body_util::Full;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::Gateway;
use super::http_upstream::UpstreamBody;
use super::routes::{InFlight, ModelRoutes, Outcome, Upstream, random};
use crate::error::{Error, ErrorKind};

/// Replicas tried for one request at most.
const MAX_ATTEMPTS: usize = 3;
/// How long connecting to a worker may take before the next replica is tried.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 connections to workers are pinged this often...
pub(super) const PING_EVERY: Duration = Duration::from_secs(10);
/// ...and closed when a ping goes unanswered this long.
pub(super) const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Error type of streamed upstream bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A gRPC request body: buffered (unary calls) or streamed on (streams).
pub type GrpcBody = UnsyncBoxBody<Bytes, BoxError>;

/// A connector for `http://` and (workers serving TLS) `https://` upstreams.
pub type Connector = HttpsConnector<WatchedConnector>;

/// TCP connections to workers, each also watched by the busy-poller: at low concurrency a
/// worker's answer then finds a gateway thread awake instead of paying for a wake-up, as
/// clients' requests do on the listeners.
#[derive(Clone)]
pub struct WatchedConnector(HttpConnector);

impl tower::Service<http::Uri> for WatchedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = <HttpConnector as tower::Service<http::Uri>>::Error;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let io = connecting.await?;
            crate::serve::net::busy_poll::watch(io.inner());
            Ok(io)
        })
    }
}

/// A unary gRPC call's answer body, from either kind of connection.
pub type UnaryBody = http_body_util::Either<super::h1::unary::UnaryAnswer, super::grpc_upstream::AnswerBody>;

/// The upstream clients.
pub struct Clients {
    /// hyper's HTTP/1.1 keep-alive connections, pooled per worker, for the HTTP requests that
    /// hyper serves on the gateway.
    http1: super::http_upstream::HttpUpstreams,
    /// With `--upstream-http2`, HTTP requests go over HTTP/2 instead (boxed: rarely there, and
    /// large).
    http2: Option<Box<Client<Connector, Full<Bytes>>>>,
    /// HTTP/2, one connection per worker, for unary gRPC calls sent while others are in flight
    /// to their worker (all of them with `--upstream-http2`).
    grpc_unary: super::grpc_upstream::GrpcUpstreams,
    /// Whether every unary gRPC call goes over `grpc_unary` (`--upstream-http2`).
    unary_over_h2: bool,
    /// HTTP/2 only, one connection per worker, for gRPC streams.
    pub grpc: Client<Connector, GrpcBody>,
    /// The lean path's connections (see [`super::h1`]): for HTTP requests, and for unary gRPC
    /// calls sent while no other request is in flight to their worker.
    pub h1: super::h1::upstream::Upstreams,
}

impl Clients {
    /// Clients with Nagle off and a short connect timeout; https trusts the system's roots and
    /// `tls` (a client config from [`tessera_protocol::tls::client_config`]); `over_h2`: HTTP
    /// requests and every unary gRPC call over one multiplexed HTTP/2 connection per worker.
    pub fn new(tls: rustls::ClientConfig, over_h2: bool) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.enforce_http(false);
        let connector = WatchedConnector(connector);
        let http1 = super::http_upstream::HttpUpstreams::new(tls.clone());
        let h2_connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http()
            .enable_http2()
            .wrap_connector(connector);
        let http2 = over_h2.then(|| {
            // Requests in flight together share writes.
            Box::new(
                Client::builder(TokioExecutor::new())
                    .http2_only(true)
                    .timer(TokioTimer::new())
                    .pool_timer(TokioTimer::new())
                    .http2_adaptive_window(true)
                    .build(h2_connector.clone()),
            )
        });
        let grpc_unary = super::grpc_upstream::GrpcUpstreams::new(tls);
        let grpc = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .http2_keep_alive_interval(PING_EVERY)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_adaptive_window(true)
            .build(h2_connector);
        let h1 = super::h1::upstream::Upstreams::new(http1.tls.clone());
        Self { http1, http2, grpc_unary, unary_over_h2: over_h2, grpc, h1 }
    }

    /// Whether HTTP requests may take the lean path ([`super::h1`]), which speaks HTTP/1.1 to
    /// workers: not with `--upstream-http2`.
    pub fn lean_http(&self) -> bool {
        self.http2.is_none()
    }

    /// Sends an HTTP request (its URI the path and query) to `upstream`.
    pub async fn send_http(
        &self,
        upstream: &Arc<Upstream>,
        mut request: http::Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamBody>, CallError> {
        let Some(h2) = &self.http2 else { return self.http1.send(upstream, request).await };
        *request.uri_mut() = worker_uri(&upstream.http, request.uri().path_and_query().map_or("/", |p| p.as_str()))?;
        match h2.request(request).await {
            Ok(response) => Ok(response.map(UpstreamBody::unpooled)),
            Err(e) if e.is_connect() => Err(CallError::Unsent(error_chain(&e))),
            Err(e) => Err(CallError::Broken(Box::new(e))),
        }
    }

    /// Sends a unary gRPC call (`path`: its method's path; `body`: its framed message) to
    /// `upstream`'s gRPC listener.
    ///
    /// A call alone in flight to its worker (this one counted) goes over a pooled HTTP/1.1
    /// connection, which costs both sides the fewest instructions. With others in flight it
    /// goes over the worker's HTTP/2 connection, where calls together share each write and read
    /// on both sides: at concurrency 16 that took less CPU from a loaded machine than one
    /// connection per call.
    pub async fn send_unary_grpc(
        &self,
        upstream: &Arc<Upstream>,
        path: &Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<UnaryBody>, CallError> {
        if !self.unary_over_h2 && upstream.outstanding() <= 1 {
            let answer = self.h1.call(upstream, path, headers, &body).await?;
            return Ok(answer.map(http_body_util::Either::Left));
        }
        let uri = worker_uri(&upstream.grpc, path.path_and_query().map_or("/", |p| p.as_str()))?;
        let answer = self.grpc_unary.call(uri, headers, body).await?;
        Ok(answer.map(http_body_util::Either::Right))
    }
}

/// The absolute URI of `path` (with its query) on the worker listener at `base`; a bad address
/// is a failure before anything was sent.
pub(super) fn worker_uri(base: &str, path: &str) -> Result<Uri, CallError> {
    format!("{base}{path}").parse().map_err(|e| CallError::Unsent(format!("bad worker address {base}: {e}")))
}

/// Why a request to a worker failed, and whether any of it can have reached the worker.
#[derive(Debug)]
pub enum CallError {
    /// Nothing of the request was sent (no connection, a connection closed before the request
    /// went out, or a gRPC call the worker refused unread).
    Unsent(String),
    /// The request was sent, or may have been, and then failed: it may have run.
    Broken(BoxError),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unsent(why) => f.write_str(why),
            Self::Broken(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CallError {
    // Transparent: the chain goes on with the failure's own causes.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unsent(_) => None,
            Self::Broken(e) => e.source(),
        }
    }
}

/// A stream's frames, read on by whichever attempt holds them.
type Frames = std::pin::Pin<Box<dyn futures::Stream<Item = Result<http_body::Frame<Bytes>, BoxError>> + Send>>;

/// A streamed request body that can be offered to one replica after another: every attempt's
/// body reads from the same source, and the source remembers whether any attempt read from
/// it. An attempt that failed to connect never read, so the next replica gets the stream
/// whole; once one has read, the stream is committed to it.
#[derive(Clone)]
pub struct SharedStream {
    frames: Arc<parking_lot::Mutex<Frames>>,
    read: Arc<std::sync::atomic::AtomicBool>,
}

impl SharedStream {
    /// Shares `frames`.
    pub fn new(
        frames: impl futures::Stream<Item = Result<http_body::Frame<Bytes>, BoxError>> + Send + 'static,
    ) -> Self {
        Self { frames: Arc::new(parking_lot::Mutex::new(Box::pin(frames))), read: Arc::default() }
    }

    /// Whether an attempt has read from the stream (it may then have reached a worker).
    pub fn was_read(&self) -> bool {
        self.read.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A body for one attempt.
    pub fn body(&self) -> GrpcBody {
        http_body_util::BodyExt::boxed_unsync(self.clone())
    }
}

impl http_body::Body for SharedStream {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        self.read.store(true, std::sync::atomic::Ordering::Release);
        futures::Stream::poll_next(self.frames.lock().as_mut(), cx)
    }
}

/// A failed attempt to send a request to a replica.
pub trait Failure: std::error::Error {
    /// Whether none of the request reached the worker, so another replica may be tried.
    fn nothing_sent(&self) -> bool;
}

impl Failure for hyper_util::client::legacy::Error {
    fn nothing_sent(&self) -> bool {
        self.is_connect()
    }
}

impl Failure for CallError {
    fn nothing_sent(&self) -> bool {
        matches!(self, Self::Unsent(_))
    }
}

/// An upstream's answer, with what must live as long as its body.
pub struct Answer<R = Response<Incoming>> {
    /// The response head and streaming body.
    pub response: R,
    /// The version of the replica that answered.
    pub version: i64,
    /// Counts the request against the upstream until the body is done.
    pub in_flight: InFlight,
}

/// Records a failed attempt on `upstream`, noting its ejection when this failure ejects it.
fn record_failure(gateway: &Gateway, upstream: &Upstream, outcome: Outcome, error: &dyn std::fmt::Display) {
    if upstream.record(outcome, Instant::now()) {
        gateway.metrics.ejected(&upstream.worker_id);
        tracing::warn!(worker_id = %upstream.worker_id, error = %error, "worker ejected");
    }
}

/// Sends a request with `send` to a replica of `model` (of `version` when given), trying
/// another replica when the rule above allows; `stale` tells an answer that says the worker
/// does not hold the model. A request of a sequence (`sequence`: its routing key) goes to the
/// sequence's replica.
#[allow(clippy::too_many_arguments)]
pub async fn send<F, Fut, R, E>(
    gateway: &Gateway,
    model_name: &str,
    model: &ModelRoutes,
    version: Option<i64>,
    sequence: Option<u64>,
    mut send: F,
    stale: fn(&R) -> bool,
) -> Result<Answer<R>, Error>
where
    F: FnMut(&Arc<Upstream>) -> Result<Fut, Error>,
    Fut: Future<Output = Result<R, E>>,
    E: Failure,
{
    if let Some(v) = version
        && !model.replicas.iter().any(|r| r.version == v)
    {
        return Err(Error::not_found(format!("Request for unknown model: '{model_name}' version {v} is not deployed")));
    }
    // Counted until the answer's head is back: busy polling stops once several are in flight.
    let _counted = crate::engine::in_flight::InFlight::start();
    let mut tried = Vec::with_capacity(MAX_ATTEMPTS);
    let mut last_stale = None;
    let mut last_error = None;
    for _ in 0..MAX_ATTEMPTS {
        let Some(replica) = model.pick_for(version, &tried, Instant::now(), random(), sequence) else { break };
        let upstream = &replica.upstream;
        tried.push(upstream.key());
        let in_flight = upstream.start();
        // One timer per forward, armed once the worker is waited on.
        let Ok(sent) = tokio::time::timeout(gateway.upstream_timeout, send(upstream)?).await else {
            let secs = gateway.upstream_timeout.as_secs_f64();
            let message = format!("did not begin its answer within {secs} s");
            record_failure(gateway, upstream, Outcome::Failed, &message);
            tracing::info!(worker_id = %upstream.worker_id, error = %message, "worker failed a request");
            return Err(Error::new(
                ErrorKind::UpstreamTimeout,
                format!("the worker serving '{model_name}' {message}; the request may have run"),
            ));
        };
        match sent {
            Ok(response) => {
                upstream.record(Outcome::Answered, Instant::now());
                let answer = Answer { response, version: replica.version, in_flight };
                if stale(&answer.response) {
                    gateway.metrics.retried("stale_route");
                    last_stale = Some(answer);
                    continue;
                }
                return Ok(answer);
            }
            Err(e) => {
                let unreachable = e.nothing_sent();
                let outcome = if unreachable { Outcome::Unreachable } else { Outcome::Failed };
                record_failure(gateway, upstream, outcome, &e);
                if !unreachable {
                    tracing::info!(worker_id = %upstream.worker_id, error = %e, "worker failed a request");
                    return Err(Error::unavailable(format!(
                        "the worker serving '{model_name}' failed before answering ({}); the request may have run",
                        error_chain(&e)
                    )));
                }
                gateway.metrics.retried("unreachable");
                tracing::debug!(worker_id = %upstream.worker_id, error = %e, "worker unreachable; trying another replica");
                last_error = Some(error_chain(&e));
            }
        }
    }
    if let Some(answer) = last_stale {
        return Ok(answer);
    }
    let which = version.map_or_else(String::new, |v| format!(" version {v}"));
    let message = match last_error {
        Some(e) => format!("no replica of model '{model_name}'{which} could be reached (last: {e})"),
        None => format!("model '{model_name}'{which} has no ready replica"),
    };
    Err(Error::unavailable(message).retry_after(1))
}

/// The error and its sources on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn a_shared_stream_stays_whole_until_an_attempt_reads_it() {
        let frames = futures::stream::iter(
            ["a", "b"].map(|s| Ok::<_, BoxError>(http_body::Frame::data(Bytes::from_static(s.as_bytes())))),
        );
        let stream = SharedStream::new(frames);
        // An attempt that failed to connect dropped its body unread.
        drop(stream.body());
        assert!(!stream.was_read());
        let mut second = stream.body();
        let first = second.frame().await.expect("a frame").expect("data").into_data().expect("bytes");
        assert_eq!(&first[..], b"a");
        assert!(stream.was_read(), "committed to the attempt that read");
        // The rest of the stream follows on whichever body reads next.
        let rest = stream.body().collect().await.expect("the rest").to_bytes();
        assert_eq!(&rest[..], b"b");
    }
}
