//! Per-connection HTTP/2 limits both endpoints set explicitly, so a hyper upgrade that moves
//! its defaults cannot loosen them.

use std::time::Duration;

use hyper_util::rt::TokioTimer;
use hyper_util::server::conn::auto::Http2Builder;

/// Requests one HTTP/2 connection may have open at once (a client that opens more waits).
pub const MAX_STREAMS: u32 = 200;
/// Largest header list a client may send on an HTTP/2 request.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;
/// How often an idle HTTP/2 connection is pinged; one that does not answer in as long is closed.
pub const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// Flow-control window of each HTTP/2 stream and of the whole connection (hyper's default; the
/// protocol's 64 KiB would hold a large tensor to a round trip per 64 KiB).
pub const WINDOW: u32 = 1 << 20;
/// Largest frame either side sends (the protocol's default).
pub const MAX_FRAME: u32 = 16 << 10;
/// Answer bytes queued per HTTP/2 stream before its writer waits (hyper's default).
pub const MAX_SEND_BUFFER: usize = 400 << 10;
/// Streams a client may make the server reset for its errors before the connection is closed
/// (hyper's default, against rapid-reset floods).
pub const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// An HTTP/2 server with the limits, and hyper's settings otherwise, for a connection served on
/// h2 directly.
pub fn h2_server() -> h2::server::Builder {
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .max_frame_size(MAX_FRAME)
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .max_concurrent_streams(MAX_STREAMS)
        .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .max_send_buffer_size(MAX_SEND_BUFFER);
    builder
}

/// Applies the limits to a connection's HTTP/2 settings.
pub fn http2<E>(h2: &mut Http2Builder<'_, E>) {
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .keep_alive_interval(KEEP_ALIVE)
        .keep_alive_timeout(KEEP_ALIVE);
}
