//! The lean path's side towards workers: a request is written on a pooled HTTP/1.1 connection
//! by the task serving the client, and the answer read back on the same task. There is no
//! connection task to hand the request to and no body channel: each exchange costs the two
//! writes and reads it needs and no wake-up between tasks.
//!
//! The rule of [`crate::gateway::forward`] holds: a request is [`CallError::Unsent`] (another
//! replica may be tried) only when no byte of it reached the worker, and a connection the
//! worker closed while idle is passed over before anything is written on it.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;
use tessera_protocol::stall;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_util::either::Either;

use super::head::{self, ChunkedEnd, Framing, ResponseHead};
use crate::gateway::dial::{self, Io};
use crate::gateway::forward::CallError;
use crate::gateway::http_upstream::Reusable;
use crate::gateway::routes::Upstream;

/// Read buffer of a connection to a worker; an answer's head must fit in what is read first
/// or the buffer grows.
const READ_CHUNK: usize = 16 * 1024;

/// A connection to a worker's HTTP listener, idle between exchanges.
#[derive(Debug)]
pub struct Conn {
    /// Boxed: a TLS stream is large, and a connection moves in and out of its pool and
    /// through every exchange's future.
    pub(super) io: Box<Io>,
    pub(super) buf: BytesMut,
}

impl Reusable for Conn {
    fn is_closed(&self) -> bool {
        let (tcp, tls) = match &*self.io {
            Either::Left(tcp) => (tcp, false),
            Either::Right(stream) => (stream.get_ref().0, true),
        };
        // A peek that does not wait: tokio answers from the readiness it holds, so this costs
        // a system call only when the socket may have something to read.
        let mut byte = [0u8; 1];
        let mut peeked = ReadBuf::new(&mut byte);
        match tcp.poll_peek(&mut Context::from_waker(Waker::noop()), &mut peeked) {
            Poll::Pending => false,
            // End of stream: the worker closed it.
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => true,
            // Bytes no request asked for: plain HTTP cannot make sense of them; on TLS they may
            // be the server's session tickets, which the next read handles.
            Poll::Ready(Ok(_)) => !tls,
        }
    }
}

/// Which of a worker's listeners a lean connection goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// KServe v2 over HTTP.
    Http,
    /// KServe v2 over gRPC (unary calls, [`super::unary`]).
    Grpc,
}

/// Sends lean-path requests to workers.
pub struct Upstreams {
    tls: tokio_rustls::TlsConnector,
}

/// A worker's answer whose head has been read; the body follows on its connection.
#[derive(Debug)]
pub struct Answer {
    /// The answer's head (offsets into `conn.buf`).
    pub head: ResponseHead,
    pub(super) conn: Conn,
    pub(super) upstream: Arc<Upstream>,
    /// The listener `conn` goes to, whose pool takes it back.
    pub(super) listener: Listener,
}

impl Upstreams {
    /// Connections trusting `tls` for `https://` workers.
    pub fn new(tls: tokio_rustls::TlsConnector) -> Self {
        Self { tls }
    }

    /// Writes a request to `upstream`'s `listener` and reads its answer's head: `line` is the
    /// request line without its CRLF (`POST /v2/... HTTP/1.1`), `headers` every header but
    /// `Host` (each line ending in CRLF, then the blank line), `body` the body.
    pub async fn exchange(
        &self,
        upstream: &Arc<Upstream>,
        listener: Listener,
        line: &[u8],
        headers: &[u8],
        body: &[u8],
    ) -> Result<Answer, CallError> {
        let pool = upstream.lean_pool(listener);
        let (uri, host) = pool.target()?;
        let mut start = Vec::with_capacity(line.len() + host.len() + 10);
        start.extend_from_slice(line);
        start.extend_from_slice(b"\r\nhost: ");
        start.extend_from_slice(host.as_bytes());
        start.extend_from_slice(b"\r\n");
        loop {
            let (mut conn, fresh) = match pool.take() {
                Some(conn) => (conn, false),
                // Boxed: connecting (TLS state, the handshake) would make every exchange's
                // future larger.
                None => (Box::pin(self.connect(uri)).await?, true),
            };
            let written = match write_all(&mut conn.io, &mut [&start, headers, body]).await {
                // TLS may hold the last record until flushed; plain TCP flushes at once.
                Ok(()) => conn.io.flush().await,
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                // Not all of the request reached the worker, which cannot have run it: a kept
                // connection that broke is passed over, a new one that breaks ends the tries.
                if fresh {
                    return Err(CallError::Unsent(format!("writing to {uri}: {e}")));
                }
                continue;
            }
            conn.buf.clear();
            let head = loop {
                match head::response(&conn.buf) {
                    Ok(Some(head)) => break head,
                    Ok(None) => {}
                    Err(e) => return Err(CallError::Broken(Box::new(e))),
                }
                conn.buf.reserve(READ_CHUNK);
                match conn.io.read_buf(&mut conn.buf).await {
                    Ok(0) => {
                        let e = io::Error::new(io::ErrorKind::UnexpectedEof, "the worker closed before answering");
                        return Err(CallError::Broken(Box::new(e)));
                    }
                    Ok(_) => {}
                    Err(e) => return Err(CallError::Broken(Box::new(e))),
                }
            };
            return Ok(Answer { head, conn, upstream: upstream.clone(), listener });
        }
    }

    async fn connect(&self, uri: &http::Uri) -> Result<Conn, CallError> {
        let (io, _) = dial::dial(uri, &self.tls).await?;
        Ok(Conn { io: Box::new(io), buf: BytesMut::with_capacity(READ_CHUNK) })
    }
}

impl Answer {
    /// Sends the answer to the client on `client`: its head (without the worker's connection
    /// headers, with `Connection: close` when `close`) and its body as the worker frames it.
    /// A connection whose answer was read to its end goes back to the worker's pool. Whether
    /// the client's connection may carry another request: not when `close`, when the answer
    /// ended with the worker's connection, or when the client or the worker broke off (a write
    /// to a client that reads none of it fails as its connection says), or when the worker sent
    /// none of the rest of it for `stall` (it would hold the client, and its tenant's
    /// concurrency slot, for as long as it liked).
    pub async fn relay<W>(mut self, client: &mut W, close: bool, stall: Duration) -> bool
    where
        W: AsyncWrite + Unpin,
    {
        let head_len = self.head.len;
        let close = close || self.head.framing == Framing::UntilClose;
        let mut out = Vec::with_capacity(256);
        let status = self.head.status;
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\n");
        for h in &self.head.headers {
            let name = &self.conn.buf[h.name.clone()];
            if !head::hop_by_hop(name) {
                out.extend_from_slice(name);
                out.extend_from_slice(b": ");
                out.extend_from_slice(&self.conn.buf[h.value.clone()]);
                out.extend_from_slice(b"\r\n");
            }
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");

        let mut body = Body::new(self.head.framing);
        let (taken, mut done) = match body.take(&self.conn.buf[head_len..]) {
            Ok(step) => step,
            Err(e) => {
                tracing::debug!(worker_id = %self.upstream.worker_id, error = %e, "bad answer body");
                return false;
            }
        };
        let first = &self.conn.buf[head_len..head_len + taken];
        if write_all(client, &mut [&out, first]).await.is_err() {
            return false;
        }
        // Anything read past the body's end would be a second answer no request asked for.
        let mut clean = head_len + taken == self.conn.buf.len();
        let mut worker_stall = stall::Stall::new(stall);
        while !done {
            self.conn.buf.clear();
            self.conn.buf.reserve(READ_CHUNK);
            let conn = &mut self.conn;
            let read = std::future::poll_fn(|cx| {
                let polled = tokio_util::io::poll_read_buf(std::pin::Pin::new(&mut conn.io), cx, &mut conn.buf);
                worker_stall.poll(cx, polled)
            });
            match read.await {
                // The worker's close ends such a body; the client's connection closes after it.
                Some(Ok(0)) if matches!(body, Body::UntilClose) => {
                    let _ = client.flush().await;
                    return false;
                }
                Some(Ok(0) | Err(_)) => return false,
                Some(Ok(_)) => {}
                // A worker that stops mid-answer: the client's connection closes on what it has.
                None => {
                    let (worker_id, stall_s) = (&self.upstream.worker_id, stall.as_secs_f64());
                    tracing::debug!(%worker_id, stall_s, "a worker sent no more of its answer; connection closed");
                    return false;
                }
            }
            let Ok((taken, end)) = body.take(&self.conn.buf) else { return false };
            done = end;
            clean = taken == self.conn.buf.len();
            if write_all(client, &mut [&self.conn.buf[..taken]]).await.is_err() {
                return false;
            }
        }
        if client.flush().await.is_err() {
            return false;
        }
        // Whether or not the client's connection closes, the worker's can take the next request.
        if self.head.keep_alive && clean {
            self.conn.buf.clear();
            self.upstream.lean_pool(self.listener).give_back(self.conn);
        }
        !close
    }
}

/// Where an answer body ends, as its pieces arrive.
enum Body {
    /// No body.
    Empty,
    /// This many bytes left.
    Length(u64),
    /// Chunked, its end found by the scanner.
    Chunked(ChunkedEnd),
    /// Until the worker closes the connection.
    UntilClose,
}

impl Body {
    fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty => Self::Empty,
            Framing::Length(n) => Self::Length(n),
            Framing::Chunked => Self::Chunked(ChunkedEnd::default()),
            Framing::UntilClose => Self::UntilClose,
        }
    }

    /// How much of `piece` belongs to the body, and whether the body ends with it.
    fn take(&mut self, piece: &[u8]) -> Result<(usize, bool), head::BadChunk> {
        Ok(match self {
            Self::Empty => (0, true),
            Self::Length(left) => {
                let taken = usize::try_from(*left).unwrap_or(usize::MAX).min(piece.len());
                *left -= taken as u64;
                (taken, *left == 0)
            }
            Self::Chunked(scanner) => match scanner.advance(piece)? {
                Some(end) => (end, true),
                None => (piece.len(), false),
            },
            Self::UntilClose => (piece.len(), false),
        })
    }
}

/// Writes every part, in as few system calls as the connection takes them.
pub async fn write_all<W>(io: &mut W, parts: &mut [&[u8]]) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    const MAX_PARTS: usize = 4;
    let mut first = 0;
    loop {
        while first < parts.len() && parts[first].is_empty() {
            first += 1;
        }
        if first == parts.len() {
            return Ok(());
        }
        let count = (parts.len() - first).min(MAX_PARTS);
        let mut slices = [IoSlice::new(&[]); MAX_PARTS];
        for (slice, part) in slices.iter_mut().zip(&parts[first..first + count]) {
            *slice = IoSlice::new(part);
        }
        let mut written = io.write_vectored(&slices[..count]).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let part = &mut parts[first];
            let n = written.min(part.len());
            *part = &part[n..];
            written -= n;
            if part.is_empty() {
                first += 1;
            }
        }
    }
}
