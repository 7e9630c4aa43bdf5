//! Unary gRPC calls over the lean path's connections ([`super::upstream`]). A call alone in
//! flight to its worker goes as an HTTP/1.1 request to the worker's gRPC listener, which
//! answers a call that asks for trailers chunked, its status in the trailers
//! (`serve::grpc::serve`). The answer is decoded here, as it arrives, into the message and the
//! trailers that the gRPC front end sends on over HTTP/2.
//!
//! hyper's client did the same with a task driving each connection, a channel for the answer
//! body and a wake-up between the two per call (a fifth of the gateway's instructions per
//! add_sub call); here the call's own task drives its connection.

use std::io::{self, Write as _};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response, Uri, header};
use http_body::Frame;

use super::head::Framing;
use super::upstream::{Answer, Conn, Listener, Upstreams};
use crate::gateway::forward::CallError;
use crate::gateway::routes::Upstream;

/// Room kept free in the answer's buffer before each read.
const READ_CHUNK: usize = 16 * 1024;
/// Longest chunk-size line read (its size, extensions and CRLF).
const MAX_SIZE_LINE: usize = 1024;
/// Largest trailer section read.
const MAX_TRAILERS: usize = 16 * 1024;
/// Trailer fields read at most.
const MAX_TRAILER_FIELDS: usize = 32;

impl Upstreams {
    /// Sends a unary call to `upstream`'s gRPC listener: `path` is its method's path,
    /// `headers` what the worker is sent (`Host`, the body's length and `te` are set here),
    /// `body` its framed message. Failures follow [`CallError`]'s rule, as for HTTP requests.
    pub async fn call(
        &self,
        upstream: &Arc<Upstream>,
        path: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Response<UnaryAnswer>, CallError> {
        let target = path.path_and_query().map_or("/", |p| p.as_str());
        let mut line = Vec::with_capacity(target.len() + 16);
        line.extend_from_slice(b"POST ");
        line.extend_from_slice(target.as_bytes());
        line.extend_from_slice(b" HTTP/1.1");
        let mut fields = Vec::with_capacity(512);
        for (name, value) in headers {
            if name != header::HOST && name != header::CONTENT_LENGTH && name != header::TE {
                fields.extend_from_slice(name.as_str().as_bytes());
                fields.extend_from_slice(b": ");
                fields.extend_from_slice(value.as_bytes());
                fields.extend_from_slice(b"\r\n");
            }
        }
        // The worker sends the status as trailers only to a call that asks for them.
        // Writing to a Vec cannot fail.
        let _ = write!(fields, "te: trailers\r\ncontent-length: {}\r\n\r\n", body.len());
        let answer = self.exchange(upstream, Listener::Grpc, &line, &fields, body).await?;
        Ok(answer.into_unary())
    }
}

impl Answer {
    /// The answer as a response whose body decodes what follows its head: data frames, then
    /// the trailers, if any. The connection goes back to its pool once the body has ended.
    pub fn into_unary(self) -> Response<UnaryAnswer> {
        let Answer { head, mut conn, upstream, listener } = self;
        let mut headers = HeaderMap::with_capacity(head.headers.len());
        for h in &head.headers {
            let name = &conn.buf[h.name.clone()];
            // The answer's HTTP/1.1 framing and connection headers are not the client's: they
            // are dropped here rather than made into header names the front end drops again.
            if !crate::gateway::http::forwardable_name(name) {
                continue;
            }
            let value = HeaderValue::from_bytes(&conn.buf[h.value.clone()]);
            // httparse checked both; a name `http` refuses is dropped rather than failing.
            if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), value) {
                headers.append(name, value);
            }
        }
        let mut buf = std::mem::take(&mut conn.buf);
        buf.advance(head.len);
        let state = match head.framing {
            Framing::Empty => State::Length(0),
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Size,
            Framing::UntilClose => State::UntilClose,
        };
        let mut body = UnaryAnswer { conn: Some(conn), upstream, listener, keep_alive: head.keep_alive, buf, state };
        if state == State::Length(0) {
            // Nothing follows (a trailers-only answer): the connection is free now, even if the
            // answer is dropped unread, as one naming a stale route is before a retry.
            body.finish();
        }
        let mut response = Response::new(body);
        *response.status_mut() = head.status;
        *response.headers_mut() = headers;
        response
    }
}

/// A worker's answer body, decoded as it is read from its connection.
#[derive(Debug)]
pub struct UnaryAnswer {
    /// The connection, until the body ends (back to the pool) or breaks (closed).
    conn: Option<Conn>,
    upstream: Arc<Upstream>,
    listener: Listener,
    keep_alive: bool,
    /// Bytes read and not yet handed on.
    buf: BytesMut,
    state: State,
}

/// Where the decoding of an answer body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many bytes left (`Content-Length`).
    Length(u64),
    /// At a chunk-size line.
    Size,
    /// In a chunk's data: this many bytes left.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: the trailers, then a blank line.
    Trailers,
    /// Until the worker closes the connection.
    UntilClose,
    /// Ended (or broken).
    Done,
}

impl UnaryAnswer {
    /// Ends the body: its connection goes back to the pool when the worker keeps it and
    /// nothing was read past the body.
    fn finish(&mut self) {
        self.state = State::Done;
        if let Some(mut conn) = self.conn.take()
            && self.keep_alive
            && self.buf.is_empty()
        {
            conn.buf = std::mem::take(&mut self.buf);
            self.upstream.lean_pool(self.listener).give_back(conn);
        }
    }

    /// Ends the body with an error; the connection is closed.
    fn broken(&mut self, why: &str) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.state = State::Done;
        self.conn = None;
        Poll::Ready(Some(Err(io::Error::new(io::ErrorKind::InvalidData, why))))
    }

    /// Up to `left` of the bytes read, as a data frame.
    fn data(&mut self, left: u64) -> Frame<Bytes> {
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(self.buf.len());
        Frame::data(self.buf.split_to(n).freeze())
    }

    /// Takes a whole chunk-size line from the buffer: the chunk's size, `None` when the line is
    /// not all there yet, or why it is malformed.
    fn size_line(&mut self) -> Result<Option<u64>, &'static str> {
        let Some(end) = memchr::memchr(b'\n', &self.buf) else {
            return if self.buf.len() > MAX_SIZE_LINE { Err("a chunk-size line is over 1 KiB") } else { Ok(None) };
        };
        let line = &self.buf[..end];
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits == 0 || digits > 15 {
            return Err("a chunk size is malformed");
        }
        // Hex digits only, at most 15: the parse cannot fail.
        let size = std::str::from_utf8(&line[..digits]).ok().and_then(|d| u64::from_str_radix(d, 16).ok()).unwrap_or(0);
        self.buf.advance(end + 1);
        Ok(Some(size))
    }

    /// Takes the trailer section from the buffer: its fields, `None` when it is not all there
    /// yet, or why it is malformed.
    fn trailers(&mut self) -> Result<Option<HeaderMap>, &'static str> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
        let (len, trailers) = match httparse::parse_headers(&self.buf, &mut fields) {
            Ok(httparse::Status::Complete((len, fields))) => {
                let mut trailers = HeaderMap::with_capacity(fields.len());
                for f in fields.iter() {
                    if let (Ok(name), Ok(value)) =
                        (HeaderName::from_bytes(f.name.as_bytes()), HeaderValue::from_bytes(f.value))
                    {
                        trailers.append(name, value);
                    }
                }
                (len, trailers)
            }
            Ok(httparse::Status::Partial) if self.buf.len() <= MAX_TRAILERS => return Ok(None),
            Ok(httparse::Status::Partial) => return Err("its trailers are over 16 KiB"),
            Err(_) => return Err("its trailers are malformed"),
        };
        self.buf.advance(len);
        Ok(Some(trailers))
    }
}

impl http_body::Body for UnaryAnswer {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        loop {
            match this.state {
                State::Done => return Poll::Ready(None),
                State::Length(0) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                State::Length(left) if !this.buf.is_empty() => {
                    let frame = this.data(left);
                    this.state = State::Length(left - frame.data_ref().map_or(0, |d| d.len() as u64));
                    return Poll::Ready(Some(Ok(frame)));
                }
                State::Data(left) if !this.buf.is_empty() => {
                    let frame = this.data(left);
                    let left = left - frame.data_ref().map_or(0, |d| d.len() as u64);
                    this.state = if left == 0 { State::DataEnd } else { State::Data(left) };
                    return Poll::Ready(Some(Ok(frame)));
                }
                State::UntilClose if !this.buf.is_empty() => {
                    return Poll::Ready(Some(Ok(this.data(u64::MAX))));
                }
                State::Size => match this.size_line() {
                    Ok(Some(0)) => {
                        this.state = State::Trailers;
                        continue;
                    }
                    Ok(Some(size)) => {
                        this.state = State::Data(size);
                        continue;
                    }
                    Ok(None) => {}
                    Err(why) => return this.broken(why),
                },
                State::DataEnd if this.buf.len() >= 2 => {
                    if &this.buf[..2] != b"\r\n" {
                        return this.broken("a chunk does not end in CRLF");
                    }
                    this.buf.advance(2);
                    this.state = State::Size;
                    continue;
                }
                State::Trailers => match this.trailers() {
                    Ok(Some(trailers)) => {
                        this.finish();
                        return Poll::Ready((!trailers.is_empty()).then(|| Ok(Frame::trailers(trailers))));
                    }
                    Ok(None) => {}
                    Err(why) => return this.broken(why),
                },
                State::Length(_) | State::Data(_) | State::DataEnd | State::UntilClose => {}
            }
            // More bytes are needed.
            let Some(conn) = this.conn.as_mut() else { return this.broken("its connection is gone") };
            this.buf.reserve(READ_CHUNK);
            match ready!(tokio_util::io::poll_read_buf(Pin::new(conn.io.as_mut()), cx, &mut this.buf)) {
                Ok(0) if this.state == State::UntilClose => {
                    // The worker's close ends such a body, and its connection.
                    this.state = State::Done;
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => return this.broken("the connection closed inside the body"),
                Ok(_) => {}
                Err(e) => {
                    this.state = State::Done;
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }
}

#[cfg(test)]
mod tests;
