//! HTTP/1.1 requests to workers' HTTP listeners, over connections pooled per worker and driven
//! with hyper's connection API directly, for the requests hyper serves on the gateway (those
//! the lean path of [`super::h1`] hands over). The [`Pool`] is shared with the lean path's
//! connections.
//!
//! hyper-util's pooled client costs each request a pool lookup by address, a checkout guard,
//! and a spawned task that waits for the connection to be ready again before pooling it. Here a
//! worker's idle connections live with its [`Upstream`], a request takes the one used last, and
//! a connection goes back when its answer has been read to the end. One whose answer was
//! dropped half-read is closed, since HTTP/1.1 cannot take another request on it.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;

use super::forward::{CONNECT_TIMEOUT, CallError};
use super::routes::Upstream;

/// An idle connection unused this long is closed when the pool is next touched: well within
/// the time a worker lets a keep-alive connection wait for its next request, since a request
/// sent just as the worker closes the connection would fail after being written, and could
/// not be retried.
const IDLE_TIMEOUT: Duration = Duration::from_secs(crate::serve::http::HEADER_READ_TIMEOUT.as_secs() * 2 / 3);
/// Idle connections kept per worker at most.
const MAX_IDLE: usize = 1024;

type Sender = SendRequest<Full<Bytes>>;

/// A connection a [`Pool`] keeps while idle.
pub trait Reusable {
    /// Whether the worker closed it (it cannot take another request).
    fn is_closed(&self) -> bool;
}

impl Reusable for Sender {
    fn is_closed(&self) -> bool {
        SendRequest::is_closed(self)
    }
}

/// The idle HTTP/1.1 connections to one worker's listener.
#[derive(Debug)]
pub struct Pool<C = Sender> {
    idle: Mutex<VecDeque<Idle<C>>>,
    /// Where the worker is, read once from its address, or why the address names no host.
    target: Result<Target, String>,
}

/// A worker's address and the `Host` header its requests carry.
#[derive(Debug)]
struct Target {
    uri: Uri,
    host: HeaderValue,
}

#[derive(Debug)]
struct Idle<C> {
    sender: C,
    since: Instant,
}

impl<C: Reusable> Pool<C> {
    /// An empty pool for the listener at `base` (`http://host:port`).
    pub fn new(base: &str) -> Self {
        let target = base
            .parse::<Uri>()
            .ok()
            .and_then(|uri| {
                let host = HeaderValue::from_str(uri.authority()?.as_str()).ok()?;
                Some(Target { uri, host })
            })
            .ok_or_else(|| format!("the worker address {base} names no host"));
        Self { idle: Mutex::default(), target }
    }

    /// The worker's address and the `Host` value its requests carry; a failure before anything
    /// was sent when the address names no host.
    pub(super) fn target(&self) -> Result<(&Uri, &HeaderValue), CallError> {
        self.target.as_ref().map(|t| (&t.uri, &t.host)).map_err(|why| CallError::Unsent(why.clone()))
    }

    /// The connection given back last that is still open.
    pub(super) fn take(&self) -> Option<C> {
        let mut idle = self.idle.lock();
        expire(&mut idle, Instant::now());
        while let Some(i) = idle.pop_back() {
            if !i.sender.is_closed() {
                return Some(i.sender);
            }
        }
        None
    }

    /// Keeps `sender` for the next request.
    pub(super) fn give_back(&self, sender: C) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.lock();
        expire(&mut idle, now);
        if idle.len() < MAX_IDLE {
            idle.push_back(Idle { sender, since: now });
        }
    }

    /// Lets go of the connections idle too long or closed by the worker, which would otherwise
    /// wait for the next request to this worker: one the worker closed holds its socket in
    /// CLOSE_WAIT, and a descriptor, until then (the lean path's connections are driven by no
    /// task while idle).
    pub(super) fn sweep(&self) {
        let mut idle = self.idle.lock();
        expire(&mut idle, Instant::now());
        idle.retain(|i| !i.sender.is_closed());
    }

    /// Idle connections held (for tests).
    #[cfg(test)]
    pub(super) fn idle(&self) -> usize {
        self.idle.lock().len()
    }
}

/// Closes the connections idle longer than [`IDLE_TIMEOUT`] (the oldest are at the front).
fn expire<C>(idle: &mut VecDeque<Idle<C>>, now: Instant) {
    while idle.front().is_some_and(|i| now.duration_since(i.since) > IDLE_TIMEOUT) {
        idle.pop_front();
    }
}

/// How often the idle connections to every worker are looked over ([`Pool::sweep`]): within
/// [`IDLE_TIMEOUT`] and the worker's own wait for a next request, so they go before the worker
/// closes them.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Sweeps the idle connections to the workers of `gateway`'s current routes every
/// `SWEEP_EVERY`, until `shutdown`.
pub async fn sweep(gateway: Arc<super::Gateway>, shutdown: tokio_util::sync::CancellationToken) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = shutdown.cancelled() => return,
        }
        for upstream in gateway.routes().upstreams() {
            upstream.sweep_idle();
        }
    }
}

/// Makes HTTP/1.1 connections to workers (TLS for `https://` ones) and sends requests on them.
pub struct HttpUpstreams {
    pub(super) tls: tokio_rustls::TlsConnector,
}

impl HttpUpstreams {
    /// Connections trusting `tls` for `https://` workers.
    pub fn new(mut tls: rustls::ClientConfig) -> Self {
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Self { tls: tokio_rustls::TlsConnector::from(Arc::new(tls)) }
    }

    /// Sends `request` (its URI the path and query) to `upstream`'s HTTP listener on an idle
    /// connection or a new one. A kept connection found closed before the request went out is
    /// passed over.
    pub async fn send(
        &self,
        upstream: &Arc<Upstream>,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamBody>, CallError> {
        let pool = upstream.pool();
        let (uri, host) = pool.target()?;
        request.headers_mut().insert(header::HOST, host.clone());
        loop {
            let (mut sender, fresh) = match pool.take() {
                Some(sender) => (sender, false),
                // Boxed: connecting (TLS state, the handshake) would make every request's
                // future larger, and futures are moved by value on their way to the executor.
                None => (Box::pin(self.connect(uri)).await?, true),
            };
            // Bounded, so a connection stuck on its previous exchange cannot hold the request.
            let not_ready = match tokio::time::timeout(CONNECT_TIMEOUT, sender.ready()).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("closed: {e}")),
                Err(_) => Some(format!("not ready within {CONNECT_TIMEOUT:?}")),
            };
            if let Some(why) = not_ready {
                if fresh {
                    return Err(CallError::Unsent(format!("the new connection to {uri} {why}")));
                }
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let pooled = Some((sender, upstream.clone()));
                    return Ok(response.map(|inner| UpstreamBody { inner, pooled, ended: false }));
                }
                Err(mut e) => match e.take_message() {
                    // Not written: the connection closed under it. Try the next one.
                    Some(back) if !fresh => request = back,
                    Some(_) => return Err(CallError::Unsent(format!("the connection to {uri} closed"))),
                    None => return Err(CallError::Broken(Box::new(e.into_error()))),
                },
            }
        }
    }

    async fn connect(&self, uri: &Uri) -> Result<Sender, CallError> {
        let (io, address) = super::dial::dial(uri, &self.tls).await?;
        handshake(io, address).await
    }
}

/// Opens HTTP/1.1 on `io` and drives the connection on its own task until it closes.
async fn handshake(io: super::dial::Io, address: String) -> Result<Sender, CallError> {
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| CallError::Unsent(format!("HTTP/1.1 with {address}: {e}")))?;
    tokio::spawn(async move {
        match connection.await {
            Ok(()) => tracing::debug!(%address, "worker connection closed"),
            Err(e) => tracing::debug!(%address, error = %e, "worker connection failed"),
        }
    });
    Ok(sender)
}

/// A worker's answer body. Read to its end, it gives its HTTP/1.1 connection back to the
/// worker's pool when dropped.
#[derive(Debug)]
pub struct UpstreamBody {
    inner: Incoming,
    pooled: Option<(Sender, Arc<Upstream>)>,
    ended: bool,
}

impl UpstreamBody {
    /// A body with no connection to give back (HTTP/2 answers).
    pub fn unpooled(inner: Incoming) -> Self {
        Self { inner, pooled: None, ended: false }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        // Trailers end a body: a reader (hyper's HTTP/2 server sending them on) may stop there.
        if frame.as_ref().is_none_or(|f| f.as_ref().is_ok_and(Frame::is_trailers)) {
            self.ended = true;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        if let Some((sender, upstream)) = self.pooled.take()
            && self.is_end_stream()
        {
            upstream.pool().give_back(sender);
        }
    }
}

#[cfg(test)]
mod tests;
