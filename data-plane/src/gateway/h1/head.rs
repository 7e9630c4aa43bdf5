//! HTTP/1.1 message heads as the lean path reads and writes them: a client's request head
//! (kept as offsets into its bytes, which are forwarded as they came), a worker's response
//! head, how each body is framed, and a scanner that finds where a chunked body ends without
//! decoding it.

use std::mem::MaybeUninit;
use std::ops::Range;

use http::StatusCode;

/// Headers read at most in one head; a head with more goes to hyper, which answers it.
pub const MAX_HEADERS: usize = 96;
/// Largest head read here; a longer one goes to hyper, which answers it.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// One header of a head, as offsets into the head's bytes.
#[derive(Debug, Clone)]
pub struct HeaderAt {
    /// The name.
    pub name: Range<usize>,
    /// The value.
    pub value: Range<usize>,
}

/// What reading a head from the bytes so far found.
#[derive(Debug)]
pub enum Parsed<T> {
    /// The head is not all there yet.
    Partial,
    /// A head this path does not serve (another version, a malformed or oversized head): the
    /// connection goes to hyper, which answers it.
    Other,
    /// The head.
    Complete(T),
}

/// A client's request head that the lean path serves: HTTP/1.1, GET or POST, an origin-form
/// target, a body framed by `Content-Length` (or none) and no upgrade or `Expect`.
#[derive(Debug)]
pub struct RequestHead {
    /// Bytes of the head, its final blank line included.
    pub len: usize,
    /// GET or POST.
    pub method: http::Method,
    /// The request target (path and query) as sent.
    pub target: Range<usize>,
    /// Every header, in order.
    pub headers: Vec<HeaderAt>,
    /// The body's length.
    pub content_length: usize,
    /// The client asked to close the connection after this exchange.
    pub close: bool,
    /// The `Authorization` value, when there is one.
    pub authorization: Option<Range<usize>>,
    /// The `Inference-Header-Content-Length` value, when there is one.
    pub json_length: Option<Range<usize>>,
}

/// The offsets of `part` (a slice of `whole`) in `whole`.
fn offsets(whole: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    start..start + part.len()
}

/// Whether a comma-separated header value holds `token` (case-insensitive).
fn has_token(value: &[u8], token: &str) -> bool {
    value.split(|b| *b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// A `Content-Length` value: digits only (no sign, no spaces), within a `u64`.
fn length_of(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Reads a request head from the start of `bytes`. Heads this path does not serve come back
/// as [`Parsed::Other`]: the connection then goes to hyper, which serves or refuses them.
pub fn request(bytes: &[u8]) -> Parsed<RequestHead> {
    if bytes.is_empty() {
        return Parsed::Partial;
    }
    // Left uninitialized: setting every slot would cost more than reading a small head.
    let mut raw = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let len = match parsed.parse_with_uninit_headers(bytes, &mut raw) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if bytes.len() < MAX_HEAD_BYTES => return Parsed::Partial,
        Ok(httparse::Status::Partial) | Err(_) => return Parsed::Other,
    };
    let method = match parsed.method {
        Some("POST") => http::Method::POST,
        Some("GET") => http::Method::GET,
        _ => return Parsed::Other,
    };
    let (Some(1), Some(target)) = (parsed.version, parsed.path) else { return Parsed::Other };
    if !target.starts_with('/') {
        return Parsed::Other;
    }
    let mut head = RequestHead {
        len,
        method,
        target: offsets(bytes, target.as_bytes()),
        headers: Vec::with_capacity(parsed.headers.len()),
        content_length: 0,
        close: false,
        authorization: None,
        json_length: None,
    };
    let mut content_length = None;
    for header in parsed.headers.iter() {
        let (name, value) = (header.name, header.value);
        if name.eq_ignore_ascii_case("content-length") {
            let Some(n) = length_of(value).and_then(|n| usize::try_from(n).ok()) else { return Parsed::Other };
            if content_length.is_some_and(|seen| seen != n) {
                return Parsed::Other;
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("upgrade")
        {
            return Parsed::Other;
        } else if name.eq_ignore_ascii_case("connection") {
            if has_token(value, "upgrade") {
                return Parsed::Other;
            }
            head.close |= has_token(value, "close");
        } else if name.eq_ignore_ascii_case("authorization") {
            head.authorization = Some(offsets(bytes, value));
        } else if name.eq_ignore_ascii_case("inference-header-content-length") {
            head.json_length = Some(offsets(bytes, value));
        }
        head.headers.push(HeaderAt { name: offsets(bytes, name.as_bytes()), value: offsets(bytes, value) });
    }
    head.content_length = content_length.unwrap_or(0);
    Parsed::Complete(head)
}

/// How a worker's answer body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked: passed on as it is, chunk sizes and trailers included.
    Chunked,
    /// Until the worker closes the connection.
    UntilClose,
}

/// A worker's response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// Bytes of the head, its final blank line included.
    pub len: usize,
    /// The status.
    pub status: StatusCode,
    /// Every header, in order.
    pub headers: Vec<HeaderAt>,
    /// How the body is delimited.
    pub framing: Framing,
    /// The worker keeps the connection open after this answer.
    pub keep_alive: bool,
}

/// Why a worker's response head could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the worker's answer head {0}")]
pub struct BadHead(pub &'static str);

/// Reads a worker's response head from the start of `bytes`.
pub fn response(bytes: &[u8]) -> Result<Option<ResponseHead>, BadHead> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let mut raw = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let config = httparse::ParserConfig::default();
    let len = match config.parse_response_with_uninit_headers(&mut parsed, bytes, &mut raw) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if bytes.len() < MAX_HEAD_BYTES => return Ok(None),
        Ok(httparse::Status::Partial) => return Err(BadHead("is over 64 KiB")),
        Err(_) => return Err(BadHead("is malformed")),
    };
    let status = parsed.code.and_then(|c| StatusCode::from_u16(c).ok()).ok_or(BadHead("has no valid status"))?;
    if status.is_informational() {
        return Err(BadHead("is informational (1xx), which the gateway never asks for"));
    }
    let mut keep_alive = parsed.version == Some(1);
    let (mut chunked, mut other_coding, mut length) = (false, false, None);
    let mut headers = Vec::with_capacity(parsed.headers.len());
    for header in parsed.headers.iter() {
        let (name, value) = (header.name, header.value);
        if name.eq_ignore_ascii_case("content-length") {
            let n = length_of(value).ok_or(BadHead("has an invalid Content-Length"))?;
            if length.is_some_and(|seen| seen != n) {
                return Err(BadHead("has two different Content-Lengths"));
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Only the last coding frames the body.
            let last = value.rsplit(|b| *b == b',').next().unwrap_or_default().trim_ascii();
            chunked = last.eq_ignore_ascii_case(b"chunked");
            other_coding |= !chunked;
        } else if name.eq_ignore_ascii_case("connection") {
            if has_token(value, "close") {
                keep_alive = false;
            } else if has_token(value, "keep-alive") {
                keep_alive = true;
            }
        }
        headers.push(HeaderAt { name: offsets(bytes, name.as_bytes()), value: offsets(bytes, value) });
    }
    let framing = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        Framing::Empty
    } else if chunked && !other_coding {
        Framing::Chunked
    } else if other_coding {
        Framing::UntilClose
    } else {
        length.map_or(Framing::UntilClose, Framing::Length)
    };
    if framing == Framing::UntilClose {
        keep_alive = false;
    }
    Ok(Some(ResponseHead { len, status, headers, framing, keep_alive }))
}

/// Headers of a worker's answer that belong to its connection, not to the client's.
pub fn hop_by_hop(name: &[u8]) -> bool {
    ["connection", "keep-alive", "proxy-connection", "upgrade"].iter().any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
}

/// Finds the end of a chunked body in the bytes it is given piece by piece, checking its
/// framing as it goes (sizes in hex, CRLF after each chunk, a blank line after the trailers).
#[derive(Debug, Default, Clone)]
pub struct ChunkedEnd {
    state: ChunkState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// In a chunk-size line's hex digits.
    Size { size: u64, digits: u8 },
    /// In a chunk-size line after its digits (extensions), up to its LF.
    SizeLine { size: u64 },
    /// In a chunk's data: this many bytes left.
    Data(u64),
    /// Expecting the CR after a chunk's data.
    DataCr,
    /// Expecting the LF after a chunk's data.
    DataLf,
    /// At the start of a trailer line (or the final blank line).
    TrailerStart,
    /// Within a trailer line, up to its LF.
    TrailerLine,
    /// After the final blank line's CR.
    LastLf,
    /// The body has ended.
    Done,
}

impl Default for ChunkState {
    fn default() -> Self {
        Self::Size { size: 0, digits: 0 }
    }
}

/// Why a chunked body's framing is broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the worker's chunked answer is malformed ({0})")]
pub struct BadChunk(pub &'static str);

impl ChunkedEnd {
    /// Reads `bytes`, the body's next piece; `Some(n)` when the body ends after its first `n`
    /// bytes.
    pub fn advance(&mut self, bytes: &[u8]) -> Result<Option<usize>, BadChunk> {
        let mut at = 0;
        while at < bytes.len() {
            let b = bytes[at];
            self.state = match self.state {
                ChunkState::Size { size, digits } => match (b as char).to_digit(16) {
                    Some(_) if digits >= 15 => return Err(BadChunk("a chunk size is too long")),
                    Some(d) => ChunkState::Size { size: size * 16 + u64::from(d), digits: digits + 1 },
                    None if digits == 0 => return Err(BadChunk("a chunk size has no digits")),
                    None if b == b'\n' => Self::after_size(size),
                    None => ChunkState::SizeLine { size },
                },
                ChunkState::SizeLine { size } if b == b'\n' => Self::after_size(size),
                ChunkState::SizeLine { size } => ChunkState::SizeLine { size },
                ChunkState::Data(left) => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len() - at);
                    at += take;
                    let left = left - take as u64;
                    self.state = if left == 0 { ChunkState::DataCr } else { ChunkState::Data(left) };
                    continue;
                }
                ChunkState::DataCr if b == b'\r' => ChunkState::DataLf,
                ChunkState::DataLf if b == b'\n' => ChunkState::default(),
                ChunkState::DataCr | ChunkState::DataLf => return Err(BadChunk("a chunk does not end in CRLF")),
                ChunkState::TrailerStart => match b {
                    b'\r' => ChunkState::LastLf,
                    b'\n' => ChunkState::Done,
                    _ => ChunkState::TrailerLine,
                },
                ChunkState::TrailerLine if b == b'\n' => ChunkState::TrailerStart,
                ChunkState::TrailerLine => ChunkState::TrailerLine,
                ChunkState::LastLf if b == b'\n' => ChunkState::Done,
                ChunkState::LastLf => return Err(BadChunk("the trailers do not end in a blank line")),
                ChunkState::Done => return Ok(Some(at)),
            };
            at += 1;
            if self.state == ChunkState::Done {
                return Ok(Some(at));
            }
        }
        Ok(None)
    }

    /// The state after a chunk-size line: the last chunk's trailers, or the chunk's data.
    fn after_size(size: u64) -> ChunkState {
        if size == 0 { ChunkState::TrailerStart } else { ChunkState::Data(size) }
    }
}

#[cfg(test)]
mod tests;
