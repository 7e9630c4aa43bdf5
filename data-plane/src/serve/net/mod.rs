//! The network under the endpoints: listener flags and binding, the accept loop, TLS, stalled
//! request bodies, in-place re-polling of connection tasks, and busy-polling of connections
//! before a thread sleeps.

pub mod accept;
pub mod body_clock;
pub mod busy_poll;
pub mod limits;
pub mod listen;
pub mod rewake;
pub mod tls;
