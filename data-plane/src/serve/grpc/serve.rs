//! The gRPC endpoint's connections, each over a buffered `Socket` (under TLS when the listener
//! has a certificate), serving tonic's routes as tonic's own server would (see
//! [`crate::serve::net::accept`] for why it is our own): the caller's address in each request's
//! extensions, a client's `grpc-timeout` enforced, and the crate's codes for requests tonic's
//! codec refuses.
//!
//! gRPC clients speak HTTP/2. HTTP/1.1 is served too, for the unary calls a gateway sends alone
//! to this worker: a call that asks for trailers (`te: trailers`, as every gRPC request does)
//! gets its answer chunked with the status as trailers. One call on a connection costs both
//! sides fewer instructions than HTTP/2's framing, flow control and header compression, and the
//! gateway pools such connections as it does for the HTTP endpoint.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tessera_protocol::stall::{ANSWER_STALL, WriteStall};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::body::Body;
use tonic::service::Routes;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::convert;
use super::socket::Socket;
use crate::serve::net::body_clock::{BodyClock, Watched};
use crate::serve::net::rewake::RewakeExecutor;
use crate::serve::net::tls::TlsAcceptor;

/// Serves `routes` on `listener` until `shutdown`, over TLS when `tls` is given (each connection
/// gets the acceptor's current certificate); then stops accepting, lets every open connection
/// finish its calls in progress, and returns once all are closed.
pub async fn serve(listener: TcpListener, routes: Routes, shutdown: CancellationToken, tls: Option<TlsAcceptor>) {
    serve_with(listener, routes, shutdown, tls, Timeouts::DEFAULT).await;
}

/// How long a client may keep a gRPC connection (a worker's or the gateway's) waiting.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// For its first bytes and, over HTTP/1.1, each request head.
    pub header: Duration,
    /// The interval of each connection's [`BodyClock`]: a unary call whose body sends nothing
    /// through two of them fails (the gateway also pings its clients at this interval).
    pub tick: Duration,
    /// For it to take some of what is written to it (hyper's connections; the gateway's own
    /// HTTP/2 connections end through the clock and their pings).
    pub answer: Duration,
}

impl Timeouts {
    /// Every listener's: 30 s for a head, a clock ticking every 30 s, 30 s for a write.
    pub(crate) const DEFAULT: Self = Self {
        header: crate::serve::http::HEADER_READ_TIMEOUT,
        tick: crate::serve::net::limits::KEEP_ALIVE,
        answer: ANSWER_STALL,
    };
}

/// [`serve`] with the given timeouts.
pub(crate) async fn serve_with(
    listener: TcpListener,
    routes: Routes,
    shutdown: CancellationToken,
    tls: Option<TlsAcceptor>,
    timeouts: Timeouts,
) {
    let routes = routes.prepare();
    crate::serve::net::accept::serve(listener, "grpc", timeouts.header, shutdown, move |tcp, shutdown| {
        connection(tcp, tls.clone(), routes.clone(), shutdown, timeouts)
    })
    .await;
}

/// Serves one connection, after its TLS handshake when `tls` is given; on shutdown it finishes
/// the calls in progress and closes.
async fn connection(
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    routes: Routes,
    shutdown: CancellationToken,
    timeouts: Timeouts,
) {
    let header_timeout = timeouts.header;
    // TLS runs over the buffered socket, so its records are gathered and read ahead as h2's
    // frames are without it.
    let socket = Socket::new(tcp);
    let service = Calls::new(routes, socket.connect_info(), BodyClock::new(timeouts.tick));
    match tls {
        None => serve_connection(socket, service, shutdown, timeouts).await,
        Some(tls) => {
            if let Some(stream) =
                crate::serve::net::accept::tls_handshake(&tls, socket, "grpc", header_timeout, &shutdown).await
            {
                serve_connection(stream, service, shutdown, timeouts).await;
            }
        }
    }
}

/// Serves calls (HTTP/2, or HTTP/1.1 from a gateway) on one connection's stream until it closes
/// or, after `shutdown`, finishes its calls in progress; the calls' clock ticks meanwhile. A
/// client that takes none of what is written to it for `timeouts.answer` is disconnected.
pub(crate) async fn serve_connection<IO>(io: IO, service: Calls, shutdown: CancellationToken, timeouts: Timeouts)
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let clock = service.clock.clone();
    let mut builder = Builder::new(RewakeExecutor);
    builder.http1().timer(TokioTimer::new()).header_read_timeout(timeouts.header);
    crate::serve::net::limits::http2(&mut builder.http2());
    let conn = builder.serve_connection(TokioIo::new(WriteStall::new(io, timeouts.answer)), service);
    let served = crate::serve::net::accept::drive(conn, "grpc", shutdown, |conn| conn.graceful_shutdown());
    tokio::select! {
        biased;
        () = served => {}
        never = clock.run() => match never {},
    }
}

/// The trailers a gRPC answer ends with: its status.
const STATUS_TRAILERS: http::HeaderValue =
    http::HeaderValue::from_static("grpc-status, grpc-message, grpc-status-details-bin");

/// One connection's calls: tonic's routes, with the caller's address and deadline, and unary
/// calls' bodies watched by the connection's clock.
#[derive(Clone)]
pub(crate) struct Calls {
    routes: Routes,
    peer: TcpConnectInfo,
    clock: Arc<BodyClock>,
}

type CallFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl Calls {
    /// The calls of a connection from `peer`, served by `routes` (already prepared), with their
    /// bodies watched by `clock`.
    pub(crate) fn new(routes: Routes, peer: TcpConnectInfo, clock: Arc<BodyClock>) -> Self {
        Self { routes, peer, clock }
    }

    /// The clock watching the calls' bodies, for the connection to tick.
    pub(crate) fn clock(&self) -> &Arc<BodyClock> {
        &self.clock
    }

    /// Serves one call, over whichever HTTP version it came.
    pub(crate) fn call<B>(&self, mut req: Request<B>) -> CallFuture
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<tonic::codegen::StdError>,
    {
        // Where `tonic::Request::remote_addr` looks.
        req.extensions_mut().insert(self.peer.clone());
        let timeout = match grpc_timeout(req.headers()) {
            Ok(timeout) => timeout,
            Err(bad) => return Box::pin(std::future::ready(Ok(Status::invalid_argument(bad).into_http()))),
        };
        let http1 = req.version() == http::Version::HTTP_11;
        // A stream may rightly idle between messages; a unary call's one message must keep coming.
        let req = if req.uri().path().ends_with("/ModelStreamInfer") {
            req.map(Watched::unwatched)
        } else {
            req.map(|body| self.clock.watch(body))
        };
        // Routes are always ready (an axum router), so `call` needs no `poll_ready` first.
        let response = tower::Service::call(&mut self.routes.clone(), req);
        Box::pin(async move {
            let answered = within_deadline(timeout, async { response.await.unwrap_or_else(|e| match e {}) }).await;
            let mut response = with_crate_code(answered);
            if http1 {
                // hyper sends over HTTP/1.1 only the trailers a response declares.
                response.headers_mut().insert(http::header::TRAILER, STATUS_TRAILERS);
            }
            Ok(response)
        })
    }
}

impl hyper::service::Service<Request<Incoming>> for Calls {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = CallFuture;

    fn call(&self, req: Request<Incoming>) -> CallFuture {
        Calls::call(self, req)
    }
}

/// `call`'s answer, or DEADLINE_EXCEEDED once the client's `timeout` (its `grpc-timeout`) has
/// passed.
///
/// Not an `async fn`: one that awaited `call` in one branch and a `Timeout` holding it in the
/// other laid out room for both, twice the call's size, and a caller's future moved that
/// much on its way to the executor.
pub(crate) fn within_deadline<B, F>(timeout: Option<Duration>, call: F) -> impl Future<Output = Response<B>>
where
    F: Future<Output = Response<B>>,
    B: Default,
{
    use futures::FutureExt as _;
    use futures::future::Either;
    let call = match timeout {
        None => Either::Left(call.map(Ok)),
        Some(timeout) => Either::Right(tokio::time::timeout(timeout, call)),
    };
    call.map(move |answered| {
        answered.unwrap_or_else(|_| {
            let timeout = timeout.unwrap_or_default();
            let message = format!("deadline of {timeout:?} (grpc-timeout) expired before the call completed");
            Status::deadline_exceeded(message).into_http()
        })
    })
}

/// `response`, or the crate's code in its place when tonic's codec refused the request with
/// another (see [`convert::codec_error`]). Only a trailers-only answer made from a `Status`
/// carries one in its extensions, so any other response costs one lookup in an empty map.
fn with_crate_code(response: Response<Body>) -> Response<Body> {
    match response.extensions().get::<Status>().and_then(convert::codec_error) {
        Some(err) => Status::from(err).into_http(),
        None => response,
    }
}

/// The client's deadline from the `grpc-timeout` header (gRPC over HTTP/2: up to 8 digits and
/// a unit: H, M, S, m, u or n), or why the header is malformed.
pub(crate) fn grpc_timeout(headers: &HeaderMap) -> Result<Option<Duration>, String> {
    let Some(value) = headers.get("grpc-timeout") else { return Ok(None) };
    let bad =
        || format!("malformed grpc-timeout header {value:?}: expected up to 8 digits and a unit H, M, S, m, u or n");
    let text = value.to_str().map_err(|_| bad())?;
    let Some(unit) = text.chars().last() else { return Err(bad()) };
    let digits = &text[..text.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let timeout = match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return Err(bad()),
    };
    Ok(Some(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &str) -> Result<Option<Duration>, String> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", value.parse().expect("header value"));
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(grpc_timeout(&HeaderMap::new()), Ok(None));
        assert_eq!(parse("2H"), Ok(Some(Duration::from_secs(7200))));
        assert_eq!(parse("3M"), Ok(Some(Duration::from_secs(180))));
        assert_eq!(parse("10S"), Ok(Some(Duration::from_secs(10))));
        assert_eq!(parse("250m"), Ok(Some(Duration::from_millis(250))));
        assert_eq!(parse("99999999u"), Ok(Some(Duration::from_micros(99_999_999))));
        assert_eq!(parse("1n"), Ok(Some(Duration::from_nanos(1))));
    }

    #[test]
    fn codec_refusals_take_the_crates_code_and_other_responses_pass_unchanged() {
        let code = |response: &Response<Body>| response.headers().get("grpc-status").cloned();
        let refused = Status::internal("failed to decode Protobuf message: buffer underflow").into_http();
        let answer = with_crate_code(refused);
        assert_eq!(code(&answer), Some("3".parse().expect("a header value")), "INVALID_ARGUMENT");
        assert!(answer.headers()["grpc-message"].to_str().expect("ASCII").contains("buffer%20underflow"));
        let too_large = Status::out_of_range("Error, decoded message length too large: found 9 bytes").into_http();
        assert_eq!(code(&with_crate_code(too_large)), Some("8".parse().expect("a header value")), "RESOURCE_EXHAUSTED");
        let own = Status::internal("inference failed").into_http();
        assert_eq!(code(&with_crate_code(own)), Some("13".parse().expect("a header value")));
        let ok = Response::new(Body::empty());
        assert_eq!(code(&with_crate_code(ok)), None);
    }

    #[tokio::test]
    async fn http1_calls_get_their_status_as_trailers_when_they_ask_for_them() {
        use http_body_util::BodyExt as _;
        let answer = || async {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            let frames = [
                Ok::<_, Infallible>(hyper::body::Frame::data(bytes::Bytes::from_static(b"\0\0\0\0\x01m"))),
                Ok(hyper::body::Frame::trailers(trailers)),
            ];
            let mut response = Response::new(Body::new(http_body_util::StreamBody::new(futures::stream::iter(frames))));
            response.headers_mut().insert("content-type", http::HeaderValue::from_static("application/grpc"));
            response
        };
        let routes = Routes::from(axum::Router::new().route("/test.Svc/Call", axum::routing::post(answer)));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(listener, routes, shutdown.clone(), None));

        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.expect("HTTP/1.1");
        tokio::spawn(connection);
        for i in 0..2 {
            let request = Request::post("/test.Svc/Call")
                .header("host", addr.to_string())
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(http_body_util::Full::new(bytes::Bytes::from_static(b"\0\0\0\0\0")))
                .expect("request");
            let response = sender.send_request(request).await.expect("answered");
            assert_eq!(response.status(), http::StatusCode::OK);
            assert!(response.headers().contains_key(http::header::TRAILER), "the status trailers are declared");
            let body = response.into_body().collect().await.expect("body");
            let trailers = body.trailers().cloned().expect("trailers over HTTP/1.1");
            assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]), "call {i}");
            assert_eq!(&body.to_bytes()[..], b"\0\0\0\0\x01m");
        }
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_client_that_sends_nothing_or_half_a_head_is_disconnected_after_the_header_timeout() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let timeout = Duration::from_millis(300);
        let routes = Routes::from(axum::Router::new().route("/test.Svc/Call", axum::routing::post(|| async { "" })));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let shutdown = CancellationToken::new();
        let timeouts = Timeouts { header: timeout, ..Timeouts::DEFAULT };
        tokio::spawn(serve_with(listener, routes, shutdown.clone(), None, timeouts));

        for (what, sent) in [("a silent client", &b""[..]), ("half a head", b"POST /test.Svc/Call HTTP/1.1\r\n")] {
            let mut tcp = TcpStream::connect(addr).await.expect("connect");
            tcp.write_all(sent).await.expect("write");
            let started = std::time::Instant::now();
            let mut seen = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut seen)).await;
            assert!(read.is_ok(), "the server kept the connection of {what} open for 10 s");
            let waited = started.elapsed();
            assert!(waited >= timeout - Duration::from_millis(50), "{what}: closed after {waited:?}");
        }
        shutdown.cancel();
    }

    #[test]
    fn malformed_grpc_timeouts_are_refused_with_the_value() {
        for value in ["", "S", "10", "123456789S", "1.5S", "-1S", "10s", "10 S"] {
            let err = parse(value).expect_err(value);
            assert!(err.contains("grpc-timeout"), "{err}");
        }
    }
}
