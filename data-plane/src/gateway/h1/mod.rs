//! The gateway's lean HTTP/1.1 path: model requests (`/v2/models/...`, GET or POST, with a
//! `Content-Length` body) are read, checked and forwarded by the task serving the client's
//! connection, and the worker's answer is copied back as it comes, with no HTTP library in
//! between. Measured at concurrency 16 on two cores, hyper's request and response model on
//! both sides (the server, the router, the client's connection task and body channel) took
//! about 60 % of the gateway's CPU (`perf record`; `scripts/bench.sh --gateway`).
//!
//! Everything else on the connection goes to hyper and the [`super::http`] router, from the
//! first request this path does not serve on: other paths, other methods or versions,
//! chunked bodies, `Expect`, upgrades, HTTP/2 and malformed heads. Those bytes are handed over
//! unread ([`rewind::Rewind`]), so hyper serves or refuses them as it would have.
//!
//! In modules: [`head`] (reading heads, framing), [`upstream`] (the workers' side), [`unary`]
//! (unary gRPC calls alone in flight to their worker, sent by the gRPC front end over the same
//! kind of connection).

pub mod head;
pub mod rewind;
pub mod unary;
pub mod upstream;

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::response::IntoResponse as _;
use bytes::{Bytes, BytesMut};
use tessera_protocol::stall::WriteStall;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::Gateway;
use super::http::ModelPath;
use crate::auth::forwarded;
use crate::error::{Error, ErrorKind};
use crate::serve::net::tls::TlsAcceptor;
use head::{Parsed, RequestHead};
use upstream::Listener;

/// Room kept free in a client connection's read buffer before each read.
const READ_ROOM: usize = 8 * 1024;
/// Most room made for a request body at a time (the buffer grows as the body arrives).
const MAX_BODY_READ: usize = 1024 * 1024;

/// Serves the gateway's HTTP listener until `shutdown`: the lean path for model requests,
/// `router` (through hyper) for the rest; over TLS when `tls` is given.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    router: Router,
    shutdown: CancellationToken,
    tls: Option<TlsAcceptor>,
) {
    let header_timeout = crate::serve::http::HEADER_READ_TIMEOUT;
    let router = crate::serve::http::with_body_timeout(router, crate::serve::http::BODY_READ_TIMEOUT);
    crate::serve::net::accept::serve(listener, "http", header_timeout, shutdown, move |tcp, shutdown| {
        let (gateway, router, tls) = (gateway.clone(), router.clone(), tls.clone());
        async move {
            match tls {
                None => connection(tcp, gateway, router, shutdown, header_timeout).await,
                Some(tls) => {
                    if let Some(stream) =
                        crate::serve::net::accept::tls_handshake(&tls, tcp, "http", header_timeout, &shutdown).await
                    {
                        connection(stream, gateway, router, shutdown, header_timeout).await;
                    }
                }
            }
        }
    })
    .await;
}

/// A client's connection and the bytes read from it not yet served.
struct Client<IO> {
    io: IO,
    read: BytesMut,
}

/// Serves one client connection until it closes, hyper takes it over, or (after `shutdown`)
/// its request in progress is answered.
pub async fn connection<IO>(
    io: IO,
    gateway: Arc<Gateway>,
    router: Router,
    shutdown: CancellationToken,
    header_timeout: Duration,
) where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    // Every write to the client (an answer relayed, a refusal, TLS's close) is bounded: one
    // that does not read would hold the worker's connection and its tenant's slot.
    let mut client = Client { io: WriteStall::new(io, gateway.answer_stall), read: BytesMut::with_capacity(READ_ROOM) };
    if !gateway.upstream.lean_http() {
        return hand_over(client, router, shutdown, header_timeout).await;
    }
    let mut stopping = std::pin::pin!(shutdown.clone().cancelled_owned());
    loop {
        let deadline = tokio::time::Instant::now() + header_timeout;
        let head = loop {
            match head::request(&client.read) {
                Parsed::Complete(head) => break head,
                Parsed::Other => {
                    return hand_over(client, router, shutdown, header_timeout).await;
                }
                Parsed::Partial => {}
            }
            client.read.reserve(READ_ROOM);
            let idle = client.read.is_empty();
            let read = tokio::select! {
                biased;
                read = tokio::time::timeout_at(deadline, client.io.read_buf(&mut client.read)) => read,
                // Between requests a shutdown closes the connection at once.
                () = stopping.as_mut(), if idle => return,
            };
            match read {
                Ok(Ok(n)) if n > 0 => {}
                // Closed, failed, or no whole head in time (slowloris): close.
                _ => return,
            }
        };
        let target = {
            let path = &client.read[head.target.clone()];
            let path = path.split(|b| *b == b'?').next().unwrap_or_default();
            match std::str::from_utf8(path).ok().map(|p| (p.ends_with("/trace/setting"), super::http::model_path(p))) {
                Some((false, Ok(Some(target)))) => target,
                // Not a model request, or one the router words the refusal of.
                _ => return hand_over(client, router, shutdown, header_timeout).await,
            }
        };
        let keep = serve_request(&gateway, &mut client, head, &target).await;
        if !keep || shutdown.is_cancelled() {
            let _ = client.io.shutdown().await;
            return;
        }
    }
}

/// Gives the connection, with what was read of it and not served, to hyper and the router
/// (which bound its writes as before).
async fn hand_over<IO>(
    client: Client<WriteStall<IO>>,
    router: Router,
    shutdown: CancellationToken,
    header_timeout: Duration,
) where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let answer_stall = client.io.limit();
    let io = rewind::Rewind::new(client.io.into_inner(), client.read);
    crate::serve::http::serve_connection(io, router, shutdown, header_timeout, answer_stall).await;
}

/// Reads the body of the request whose head is `head`, forwards it and answers the client;
/// whether the connection may carry another request.
async fn serve_request<IO>(g: &Gateway, client: &mut Client<IO>, head: RequestHead, target: &ModelPath) -> bool
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let started = Instant::now();
    let whole = head.len.checked_add(head.content_length).filter(|_| head.content_length <= g.max_request_bytes);
    let Some(whole) = whole else {
        // Boxed: rare, and its authentication would otherwise widen every request's future.
        let e = Box::pin(refusal_of_too_large(g, &client.read, &head, target, started)).await;
        // The body is not read: the connection cannot carry another request.
        write_error(client, e, true).await;
        return false;
    };
    while client.read.len() < whole {
        // Room for what arrives, not for what the head announced: a client that announces a
        // large body and sends none of it holds no memory for it.
        client.read.reserve((whole - client.read.len()).min(MAX_BODY_READ));
        let read = tokio::time::timeout(crate::serve::http::BODY_READ_TIMEOUT, client.io.read_buf(&mut client.read));
        match read.await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(_) => return false,
            Err(_) => {
                let e =
                    Error::new(ErrorKind::InvalidArg, "the request body stalled before its Content-Length was read");
                write_error(client, e, true).await;
                return false;
            }
        }
    }
    let request = client.read.split_to(whole).freeze();
    let close = head.close;
    match forward(g, &request, &head, target).await {
        Ok((answer, tenant, version, guards)) => {
            let status = answer.head.status;
            g.metrics.observe(&tenant, &target.name, &version.to_string(), "http", status.as_str(), started.elapsed());
            let goes_on = answer.relay(&mut client.io, close, g.answer_stall).await;
            drop(guards);
            goes_on
        }
        Err((e, tenant)) => {
            if let Some(tenant) = tenant {
                let version = target.version.map_or_else(String::new, |v| v.to_string());
                g.metrics.observe(&tenant, &target.name, &version, "http", e.codes().0.as_str(), started.elapsed());
            }
            write_error(client, e, close).await && !close
        }
    }
}

/// The refusal of a request whose body is over the gateway's limit, after the checks
/// [`forward`] makes before it reads a body (so a caller without a valid credential hears that
/// instead, as through hyper's path), counted in the tenant's metrics once it is known.
async fn refusal_of_too_large(
    g: &Gateway,
    read: &[u8],
    head: &RequestHead,
    target: &ModelPath,
    started: Instant,
) -> Error {
    let authorization = head.authorization.clone().and_then(|r| std::str::from_utf8(&read[r]).ok());
    let caller = match g.authenticate(authorization).await {
        Ok(caller) => caller,
        Err(e) => return e,
    };
    let e = match caller.model(&target.name) {
        Ok(_) => Error::new(
            ErrorKind::TooLarge,
            format!("request body over the gateway's limit of {} bytes", g.max_request_bytes),
        ),
        Err(e) => e,
    };
    let version = target.version.map_or_else(String::new, |v| v.to_string());
    g.metrics.observe(&caller.tenant, &target.name, &version, "http", e.codes().0.as_str(), started.elapsed());
    e
}

/// What must live until the answer has been relayed: the least-outstanding count of the
/// replica and the tenant's concurrency slots.
type Guards = (crate::gateway::routes::InFlight, super::Slots);

/// Authenticates, admits and forwards one model request (`request`: its head and body as the
/// client sent them); the error carries the tenant once it is known (for metrics).
async fn forward(
    g: &Gateway,
    request: &Bytes,
    head: &RequestHead,
    target: &ModelPath,
) -> Result<(upstream::Answer, String, i64, Guards), (Error, Option<String>)> {
    let authorization = head.authorization.clone().and_then(|r| std::str::from_utf8(&request[r]).ok());
    let caller = g.authenticate(authorization).await.map_err(|e| (e, None))?;
    let tenant = caller.tenant.clone();
    let with_tenant = |e: Error| (e, Some(tenant.clone()));
    let model = caller.model(&target.name).map_err(with_tenant)?;
    let slot = g.admit(&caller, model, &target.name, target.version).map_err(with_tenant)?;
    let identity = g.identity_header(&caller.principal).map_err(with_tenant)?;
    let body = &request[head.len..];
    let line = request_line(request, head);
    let headers = forwarded_headers(request, head, identity.as_bytes());
    let json_length = head.json_length.clone().and_then(|r| std::str::from_utf8(&request[r]).ok());
    let sequence = super::sticky::http_sequence_id_from(json_length, body)
        .map(|id| super::sticky::sequence_key(&tenant, &target.name, &id));
    let send = |upstream: &Arc<super::routes::Upstream>| {
        let (upstream, line, headers) = (upstream.clone(), &line, &headers);
        Ok(async move { g.upstream.h1.exchange(&upstream, Listener::Http, line, headers, body).await })
    };
    let not_held = |a: &upstream::Answer| a.head.status == http::StatusCode::NOT_FOUND;
    let span = crate::spans::forward("http", &tenant, &target.name, target.version);
    let sending = super::forward::send(g, &target.name, model, target.version, sequence, send, not_held);
    let answer = sending.instrument(span).await.map_err(with_tenant)?;
    Ok((answer.response, tenant, answer.version, (answer.in_flight, slot)))
}

/// `METHOD target HTTP/1.1`, as the worker is sent it.
fn request_line(request: &[u8], head: &RequestHead) -> Vec<u8> {
    let target = &request[head.target.clone()];
    let mut line = Vec::with_capacity(head.method.as_str().len() + target.len() + 10);
    line.extend_from_slice(head.method.as_str().as_bytes());
    line.push(b' ');
    line.extend_from_slice(target);
    line.extend_from_slice(b" HTTP/1.1");
    line
}

/// The client's headers a worker is sent (those [`super::http::forwardable`] keeps), the
/// signed identity and the body's length, then the blank line.
fn forwarded_headers(request: &[u8], head: &RequestHead, identity: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len + identity.len() + 64);
    for h in &head.headers {
        let name = &request[h.name.clone()];
        if super::http::forwardable_name(name) {
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(&request[h.value.clone()]);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(forwarded::HEADER.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(identity);
    // Writing to a Vec cannot fail.
    let _ = write!(out, "\r\ncontent-length: {}\r\n\r\n", head.content_length);
    out
}

/// Answers the client with `e`; whether the answer was written.
async fn write_error<IO>(client: &mut Client<IO>, e: Error, close: bool) -> bool
where
    IO: AsyncWrite + Unpin,
{
    let (parts, body) = e.into_response().into_parts();
    // An error's body is a short JSON document held in memory.
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
    let mut out = Vec::with_capacity(256 + body.len());
    let _ = write!(out, "HTTP/1.1 {} {}\r\n", parts.status.as_str(), parts.status.canonical_reason().unwrap_or(""));
    for (name, value) in &parts.headers {
        if name != http::header::CONTENT_LENGTH {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    let _ = write!(out, "content-length: {}\r\n", body.len());
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body);
    client.io.write_all(&out).await.is_ok() && client.io.flush().await.is_ok()
}

#[cfg(test)]
mod tests;
