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

/// Applies the limits to a connection's HTTP/2 settings.
pub fn http2<E>(h2: &mut Http2Builder<'_, E>) {
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .keep_alive_interval(KEEP_ALIVE)
        .keep_alive_timeout(KEEP_ALIVE);
}
