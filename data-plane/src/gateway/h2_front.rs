//! The gateway's gRPC listener, served on `h2` directly: each connection's calls run on the
//! connection's own task, beside the connection they came on.
//!
//! hyper's server gave every call a task of its own and a channel for its body, and a unary
//! model call went on through axum's router and tonic's routes: per call the connection's
//! task woke the call's, and the call's woke the connection's again to send its answer. Here a
//! unary model call (`grpc::forwards_unary`) is read from its stream and handed to
//! `grpc::unary` in place; every other method goes through the same routes as before
//! (`Calls`), its body read from the stream as it comes. Answers are written back with
//! h2's flow control (`respond`).
//!
//! A client that does not open with HTTP/2's preface (HTTP/1.1) is served by hyper as before.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt as _;
use hyper::body::Frame;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic::transport::server::Connected as _;

use super::Gateway;
use super::forward::BoxError;
use super::grpc;
use super::h1::rewind::Rewind;
use crate::error::Error;
use crate::serve::grpc::serve::{Calls, Timeouts, grpc_timeout, within_deadline};
use crate::serve::grpc::socket::Socket;
use crate::serve::net::body_clock::{BodyClock, Stalled};
use crate::serve::net::limits;
use crate::serve::net::tls::TlsAcceptor;

/// What every HTTP/2 connection opens with.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Serves the gateway's gRPC listener until `shutdown`, over TLS when `tls` is given; then stops
/// accepting, lets every connection finish its calls in progress, and returns once all are closed.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    routes: Routes,
    shutdown: CancellationToken,
    tls: Option<TlsAcceptor>,
) {
    serve_with(listener, gateway, routes, shutdown, tls, Timeouts::DEFAULT).await;
}

/// [`serve`] with the given timeouts.
async fn serve_with(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    routes: Routes,
    shutdown: CancellationToken,
    tls: Option<TlsAcceptor>,
    timeouts: Timeouts,
) {
    let header_timeout = timeouts.header;
    let routes = routes.prepare();
    crate::serve::net::accept::serve(listener, "grpc", header_timeout, shutdown, move |tcp, shutdown| {
        let (gateway, routes, tls) = (gateway.clone(), routes.clone(), tls.clone());
        async move {
            // TLS runs over the buffered socket, as on workers.
            let socket = Socket::new(tcp);
            let calls = Calls::new(routes, socket.connect_info(), BodyClock::new(timeouts.tick));
            match tls {
                None => connection(socket, gateway, calls, shutdown, timeouts).await,
                Some(tls) => {
                    if let Some(stream) =
                        crate::serve::net::accept::tls_handshake(&tls, socket, "grpc", header_timeout, &shutdown).await
                    {
                        connection(stream, gateway, calls, shutdown, timeouts).await;
                    }
                }
            }
        }
    })
    .await;
}

/// Serves one connection: over HTTP/2 here, or by hyper when it does not open with the preface.
async fn connection<IO>(
    mut io: IO,
    gateway: Arc<Gateway>,
    calls: Calls,
    shutdown: CancellationToken,
    timeouts: Timeouts,
) where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let header_timeout = timeouts.header;
    let mut read = BytesMut::with_capacity(1024);
    let opening = async {
        while read.len() < PREFACE.len() && PREFACE.starts_with(&read) {
            if io.read_buf(&mut read).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(header_timeout, opening).await {
        Ok(Ok(())) => {}
        // Closed, failed, or silent: nothing to answer.
        _ => return,
    }
    let http2 = read.starts_with(PREFACE);
    let io = Rewind::new(io, read);
    if !http2 {
        return crate::serve::grpc::serve::serve_connection(io, calls, shutdown, timeouts).await;
    }
    let handshake = limits::h2_server().handshake::<_, Bytes>(io);
    let conn = match tokio::time::timeout(header_timeout, handshake).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return tracing::debug!(endpoint = "grpc", error = %e, "HTTP/2 handshake failed"),
        Err(_) => return tracing::trace!(endpoint = "grpc", "no HTTP/2 settings in time"),
    };
    serve_calls(conn, &gateway, &calls, shutdown, timeouts.tick).await;
}

/// Drives an HTTP/2 connection and its calls until it closes or, after `shutdown`, its calls in
/// progress are answered. A connection that does not answer a ping within `keep_alive` is
/// closed; the same timer ticks the clock watching the calls' bodies.
async fn serve_calls<IO>(
    mut conn: h2::server::Connection<IO, Bytes>,
    gateway: &Gateway,
    calls: &Calls,
    shutdown: CancellationToken,
    keep_alive_every: Duration,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let clock = calls.clock();
    let mut running = FuturesUnordered::new();
    let mut ping = conn.ping_pong();
    let keep_alive = tokio::time::sleep(keep_alive_every);
    let mut keep_alive = std::pin::pin!(keep_alive);
    let mut awaiting_pong = false;
    let mut draining = false;
    loop {
        tokio::select! {
            biased;
            Some(()) = running.next(), if !running.is_empty() => {}
            accepted = conn.accept() => match accepted {
                Some(Ok((request, respond))) => running.push(call(gateway, calls, clock, request, respond)),
                Some(Err(e)) => return tracing::trace!(endpoint = "grpc", error = %e, "connection ended with an error"),
                None => return,
            },
            Some(()) = poll_fn(|cx| pong(ping.as_mut(), cx)), if awaiting_pong => awaiting_pong = false,
            () = keep_alive.as_mut() => {
                if awaiting_pong {
                    return tracing::debug!(endpoint = "grpc", "closing a connection that did not answer a ping");
                }
                awaiting_pong = ping.as_mut().is_some_and(|p| p.send_ping(h2::Ping::opaque()).is_ok());
                keep_alive.as_mut().reset(tokio::time::Instant::now() + keep_alive_every);
                clock.tick();
            }
            () = shutdown.cancelled(), if !draining => {
                // Tells the client to open no more calls; `accept` ends once those in progress are done.
                conn.graceful_shutdown();
                draining = true;
            }
        }
    }
}

/// Ready once the peer answered the ping sent (`None` when it cannot: the connection is gone).
fn pong(ping: Option<&mut h2::PingPong>, cx: &mut Context<'_>) -> Poll<Option<()>> {
    match ping {
        Some(ping) => ping.poll_pong(cx).map(|pong| pong.ok().map(drop)),
        None => Poll::Ready(None),
    }
}

/// Serves one call and writes its answer back.
async fn call(
    gateway: &Gateway,
    calls: &Calls,
    clock: &BodyClock,
    request: Request<RecvStream>,
    respond: SendResponse<Bytes>,
) {
    if !grpc::forwards_unary(request.uri().path()) {
        let answer = calls.call(request.map(|body| RequestBody { body, trailers: false }));
        let Ok(response) = answer.await;
        return self::respond(response, respond, clock).await;
    }
    let started = Instant::now();
    let timeout = match grpc_timeout(request.headers()) {
        Ok(timeout) => timeout,
        Err(bad) => {
            let refused = tonic::Status::invalid_argument(bad).into_http::<axum::body::Body>();
            return self::respond(refused, respond, clock).await;
        }
    };
    let (parts, mut body) = request.into_parts();
    let answered = within_deadline(timeout, async {
        match read_body(&mut body, gateway, clock).await {
            Ok(bytes) => grpc::unary(gateway, parts, bytes, started).await,
            Err(e) => grpc::error_response(e),
        }
    });
    self::respond(answered.await, respond, clock).await;
}

/// A call's body, whole, if it is not over the gateway's limit and does not stall (`clock`);
/// the stream's window is given back as it is read, so a client can send up to its end.
async fn read_body(body: &mut RecvStream, gateway: &Gateway, clock: &BodyClock) -> Result<Bytes, Error> {
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    let stalled = |e: Stalled| Error::invalid(e.to_string());
    while let Some(chunk) = clock.next(body.data()).await.map_err(stalled)? {
        let chunk = chunk.map_err(|e| grpc::over_limit(gateway, e))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        let len = first.as_ref().map_or(0, Bytes::len) + rest.len() + chunk.len();
        if len > gateway.max_request_bytes {
            return Err(grpc::over_limit(gateway, format!("{len} bytes read and more to come")));
        }
        match &first {
            // A body that came in one frame, the common case, is not copied.
            None if rest.is_empty() => first = Some(chunk),
            _ => {
                if let Some(first) = first.take() {
                    rest.extend_from_slice(&first);
                }
                rest.extend_from_slice(&chunk);
            }
        }
    }
    Ok(first.unwrap_or_else(|| rest.freeze()))
}

/// A call's body read from its stream as the routes ask for it.
struct RequestBody {
    body: RecvStream,
    /// Whether the data has ended (the trailers are next).
    trailers: bool,
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if !self.trailers {
            match std::task::ready!(self.body.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.body.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => self.trailers = true,
            }
        }
        match std::task::ready!(self.body.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
}

/// Writes `response` to the call's stream: its head, its data within the client's windows, and
/// its trailers. A client that resets the call ends it, and so does one that gives no window
/// back through two ticks of `clock` (the call is reset).
async fn respond<B>(response: Response<B>, mut respond: SendResponse<Bytes>, clock: &BodyClock)
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (mut head, body) = response.into_parts();
    strip_connection_headers(&mut head.headers);
    let mut body = std::pin::pin!(body);
    let ended = body.is_end_stream();
    let mut stream = match respond.send_response(Response::from_parts(head, ()), ended) {
        Ok(stream) => stream,
        Err(e) => return tracing::trace!(endpoint = "grpc", error = %e, "the answer's head could not be sent"),
    };
    if ended {
        return;
    }
    loop {
        let frame = tokio::select! {
            biased;
            frame = body.frame() => frame,
            _ = poll_fn(|cx| stream.poll_reset(cx)) => return,
        };
        let sent = match frame {
            None => stream.send_data(Bytes::new(), true),
            Some(Err(e)) => {
                let e: BoxError = e.into();
                tracing::debug!(endpoint = "grpc", error = %e, "an answer broke off");
                return stream.send_reset(Reason::INTERNAL_ERROR);
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    let ended = body.is_end_stream();
                    match send_data(&mut stream, data, ended, clock).await {
                        Ok(()) if !ended => continue,
                        sent => sent,
                    }
                }
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => stream.send_trailers(trailers),
                    Err(_) => continue,
                },
            },
        };
        if let Err(e) = sent {
            tracing::trace!(endpoint = "grpc", error = %e, "an answer could not be sent");
        }
        return;
    }
}

/// Sends `data` as the client's windows allow, the last piece ending the stream when `ended`.
/// A client that takes none of it through two ticks of `clock` has the call reset: it would
/// hold the answer, and its tenant's concurrency slot, for as long as its connection lives.
async fn send_data(
    stream: &mut SendStream<Bytes>,
    mut data: Bytes,
    ended: bool,
    clock: &BodyClock,
) -> Result<(), h2::Error> {
    if data.is_empty() {
        return if ended { stream.send_data(data, true) } else { Ok(()) };
    }
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let capacity = loop {
            match stream.capacity() {
                0 => match clock.next(poll_fn(|cx| stream.poll_capacity(cx))).await {
                    Ok(Some(Ok(_))) => {}
                    Ok(Some(Err(e))) => return Err(e),
                    // The stream closed under us (the client reset it).
                    Ok(None) => return Err(h2::Error::from(Reason::CANCEL)),
                    Err(_) => {
                        tracing::debug!(
                            endpoint = "grpc",
                            "a client took none of its answer through two ticks; call reset"
                        );
                        stream.send_reset(Reason::CANCEL);
                        return Err(h2::Error::from(Reason::CANCEL));
                    }
                },
                capacity => break capacity,
            }
        };
        let piece = data.split_to(capacity.min(data.len()));
        stream.send_data(piece, ended && data.is_empty())?;
    }
    Ok(())
}

/// Drops the headers HTTP/2 forbids (RFC 9113 §8.2.2), which h2 would refuse the answer for.
/// An answer's few headers are scanned once; removing by name would hash each of six names.
fn strip_connection_headers(headers: &mut HeaderMap) {
    use http::header::{CONNECTION, TE, TRANSFER_ENCODING, UPGRADE};
    let forbidden = |name: &http::HeaderName| {
        [CONNECTION, TRANSFER_ENCODING, UPGRADE, TE].contains(name)
            || name.as_str() == "keep-alive"
            || name.as_str() == "proxy-connection"
    };
    let found: Vec<http::HeaderName> = headers.keys().filter(|name| forbidden(name)).cloned().collect();
    for name in found {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests;
