//! Unary gRPC calls to workers over HTTP/2, one connection per worker driven with `h2` itself:
//! those sent while other requests are in flight to their worker (a call alone goes over pooled
//! HTTP/1.1, [`super::http_upstream`]), or all of them with `--upstream-http2`.
//!
//! hyper's pooled client costs a unary call a pool checkout, a trip through its dispatch
//! channel and two spawned tasks, and it writes the call's HEADERS and DATA frames in two
//! separate writes (it waits for the new stream's send window before it reads the body, and h2
//! gives no window to a stream still opening). Here a call queues its HEADERS and its whole
//! body together, so the connection task writes both at once, and its answer is read straight
//! from the stream. Streams (`ModelStreamInfer`) stay on hyper's client ([`super::forward`]),
//! which pumps a body of unknown length.
//!
//! A connection lives while its worker answers: it is replaced when it closes or misses a
//! keep-alive ping, and a call that finds it closed before sending anything opens a new one.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use h2::client::SendRequest;
use http::{HeaderMap, Request, Response, Uri};
use http_body::Frame;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::either::Either;

use super::forward::{CallError, PING_EVERY, PING_TIMEOUT};

/// Flow-control windows: large enough that a tensor of a few MiB needs no window update on
/// the way (hyper's defaults for a fixed window).
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;

/// One connection slot per worker (keyed by the URI's authority); callers arriving while it
/// connects wait for it.
type Slot = tokio::sync::OnceCell<SendRequest<Bytes>>;
type Slots = Mutex<HashMap<String, Arc<Slot>>>;

/// The gateway's HTTP/2 connections for unary gRPC calls, keyed by worker address.
pub struct GrpcUpstreams {
    slots: Arc<Slots>,
    tls: tokio_rustls::TlsConnector,
}

impl GrpcUpstreams {
    /// Connections trusting `tls` for `https://` workers (HTTP/2 is asked for by ALPN).
    pub fn new(mut tls: rustls::ClientConfig) -> Self {
        tls.alpn_protocols = vec![b"h2".to_vec()];
        Self { slots: Arc::default(), tls: tokio_rustls::TlsConnector::from(Arc::new(tls)) }
    }

    /// Sends a unary call (`body`: its framed message) to `uri` and returns the answer's head;
    /// the body streams on with its trailers.
    pub async fn call(&self, uri: Uri, headers: &HeaderMap, body: Bytes) -> Result<Response<AnswerBody>, CallError> {
        let Some(key) = uri.authority().map(|a| a.as_str()) else {
            return Err(CallError::Unsent(format!("the worker address {uri} names no host")));
        };
        let mut replaced = false;
        loop {
            let (slot, sender, fresh) = self.connection(key, &uri).await?;
            let mut sender = match sender.ready().await {
                Ok(sender) => sender,
                Err(e) => {
                    self.forget(key, &slot);
                    // A kept connection found closed before the call went out is replaced once.
                    if !fresh && !replaced {
                        replaced = true;
                        continue;
                    }
                    return Err(CallError::Unsent(format!("the connection to {key} closed: {e}")));
                }
            };
            let mut request = Request::new(());
            *request.method_mut() = http::Method::POST;
            *request.uri_mut() = uri.clone();
            *request.headers_mut() = headers.clone();
            let (answer, mut send) = sender.send_request(request, body.is_empty()).map_err(|e| {
                self.forget(key, &slot);
                CallError::Unsent(format!("the connection to {key} could not take the call: {e}"))
            })?;
            if !body.is_empty() {
                // Queued with the HEADERS: the connection task writes both together.
                send.send_data(body, true).map_err(broken)?;
            }
            let answer = answer.await.map_err(broken)?;
            return Ok(answer.map(|stream| AnswerBody { stream, data_done: false, done: false }));
        }
    }

    /// The connection for `key`, made if there is none; its slot, and whether this call made it.
    async fn connection(&self, key: &str, uri: &Uri) -> Result<(Arc<Slot>, SendRequest<Bytes>, bool), CallError> {
        let slot = {
            let mut slots = self.slots.lock();
            match slots.get(key) {
                Some(slot) => slot.clone(),
                None => slots.entry(key.to_string()).or_default().clone(),
            }
        };
        let mut fresh = false;
        let sender = slot
            .get_or_try_init(|| {
                fresh = true;
                // Boxed: connecting (TLS state, HTTP/2 handshake) is large, and every call's
                // future, moved by value on its way to the executor, would carry it inline.
                Box::pin(self.connect(key.to_string(), uri, Arc::downgrade(&slot)))
            })
            .await?
            .clone();
        Ok((slot, sender, fresh))
    }

    /// Drops `slot` from the table (if it is still the one for `key`), so the next call
    /// connects anew.
    fn forget(&self, key: &str, slot: &Arc<Slot>) {
        forget(&self.slots, key, slot);
    }

    async fn connect(&self, key: String, uri: &Uri, slot: Weak<Slot>) -> Result<SendRequest<Bytes>, CallError> {
        let slots = Arc::downgrade(&self.slots);
        let (io, address) = super::dial::dial(uri, &self.tls).await?;
        if let Either::Right(tls) = &io
            && tls.get_ref().1.alpn_protocol() != Some(b"h2")
        {
            return Err(CallError::Unsent(format!("HTTP/2 (ALPN h2) is not offered by {address}'s TLS listener")));
        }
        handshake(io, key, slots, slot).await
    }
}

fn forget(slots: &Slots, key: &str, slot: &Arc<Slot>) {
    let mut slots = slots.lock();
    if slots.get(key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
        slots.remove(key);
    }
}

/// Opens HTTP/2 on `io` and drives the connection on its own task until it closes or misses a
/// ping, then drops its slot.
async fn handshake<T>(
    io: T,
    address: String,
    slots: Weak<Slots>,
    slot: Weak<Slot>,
) -> Result<SendRequest<Bytes>, CallError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, mut connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .enable_push(false)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(|e| CallError::Unsent(format!("HTTP/2 with {address}: {e}")))?;
    let pings = connection.ping_pong();
    tokio::spawn(async move {
        tokio::select! {
            closed = connection => match closed {
                Ok(()) => tracing::debug!(%address, "worker connection closed"),
                Err(e) => tracing::debug!(%address, error = %e, "worker connection failed"),
            },
            () = keep_alive(pings) => tracing::warn!(%address, "worker missed a keep-alive ping; connection closed"),
        }
        if let (Some(slots), Some(slot)) = (slots.upgrade(), slot.upgrade()) {
            forget(&slots, &address, &slot);
        }
    });
    Ok(sender)
}

/// Pings every [`PING_EVERY`]; returns when a ping goes unanswered for [`PING_TIMEOUT`].
async fn keep_alive(pings: Option<h2::PingPong>) {
    let Some(mut pings) = pings else { return std::future::pending().await };
    loop {
        tokio::time::sleep(PING_EVERY).await;
        match tokio::time::timeout(PING_TIMEOUT, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) | Err(_) => return,
        }
    }
}

/// An error on a call that went out: only a stream the worker refused unread
/// (`REFUSED_STREAM`) is known not to have run.
fn broken(e: h2::Error) -> CallError {
    if e.reason() == Some(h2::Reason::REFUSED_STREAM) {
        CallError::Unsent(format!("the worker refused the call unread: {e}"))
    } else {
        CallError::Broken(Box::new(e))
    }
}

/// A unary answer's body: its messages, then its trailers (gRPC's status), with each chunk's
/// flow-control window given back as it is handed on.
#[derive(Debug)]
pub struct AnswerBody {
    stream: h2::RecvStream,
    data_done: bool,
    done: bool,
}

impl http_body::Body for AnswerBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if !self.data_done {
            match ready!(self.stream.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Errors here mean the stream is already gone; the next poll says so.
                    let _ = self.stream.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => self.data_done = true,
            }
        }
        let trailers = ready!(self.stream.poll_trailers(cx));
        self.done = true;
        Poll::Ready(trailers.transpose().map(|t| t.map(Frame::trailers)))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests;
