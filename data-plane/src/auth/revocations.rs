//! The revocation list a worker or gateway holds: the last one the control plane sent (on the
//! worker's session, with the gateway's route table). It is kept when the stream breaks and
//! replaced whole by the next one; see [`tessera_protocol::revocation`] for what it refuses.

use std::fmt::Write as _;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tessera_protocol::auth::AccessClaims;
use tessera_protocol::revocation::RevocationList;
use tokio::time::Instant;
use uuid::Uuid;

use crate::serve::metrics::{MetricsSource, header};

/// The list held, read on every token check.
#[derive(Default)]
pub struct Revocations {
    /// Replaced by the session or route stream; read (without cloning) by every check.
    list: RwLock<Arc<RevocationList>>,
    /// Whether the stream that delivers lists is up, for the staleness gauge.
    freshness: Mutex<Freshness>,
}

/// Whether the list held is current.
#[derive(Debug, Default, Clone, Copy)]
enum Freshness {
    /// No list received yet.
    #[default]
    Never,
    /// The stream that delivered the list is up: a change would arrive on it.
    Current,
    /// That stream broke at this instant; revocations made since have not reached us.
    StaleSince(Instant),
}

impl Revocations {
    /// Whether a token with these claims was issued before its key or user was revoked. The
    /// request path: a read lock and, when the list is not empty, two hash lookups.
    pub fn revokes_token(&self, claims: &AccessClaims) -> bool {
        self.list.read().revokes_token(claims)
    }

    /// Whether a key (or its user) is on the list.
    pub fn revokes_key(&self, key_id: Option<Uuid>, user_id: Option<Uuid>) -> bool {
        let list = self.list.read();
        !list.is_empty() && list.revokes_key(key_id, user_id)
    }

    /// Installs a list the control plane sent; returns it.
    pub(super) fn replace(&self, list: RevocationList) -> Arc<RevocationList> {
        let list = Arc::new(list);
        *self.list.write() = list.clone();
        *self.freshness.lock() = Freshness::Current;
        list
    }

    /// The stream that delivers lists broke: the list held is kept (and goes on being
    /// enforced) but may miss revocations until the stream is back.
    pub fn stream_lost(&self) {
        let mut freshness = self.freshness.lock();
        if matches!(*freshness, Freshness::Current) {
            *freshness = Freshness::StaleSince(Instant::now());
        }
    }
}

impl MetricsSource for Revocations {
    fn render_metrics(&self, out: &mut String) {
        let (keys, users) = self.list.read().counts();
        let name = "tessera_revocation_list_entries";
        header(out, name, "Revoked API keys and disabled users on the revocation list held, by kind.", "gauge");
        let _ = writeln!(out, "{name}{{kind=\"key\"}} {keys}");
        let _ = writeln!(out, "{name}{{kind=\"user\"}} {users}");
        let name = "tessera_revocation_list_stale_seconds";
        let help = "Seconds since the stream that delivers the revocation list broke (0 while it is up, -1 before \
                    the first list): revocations made meanwhile are not enforced here yet.";
        header(out, name, help, "gauge");
        let stale = match *self.freshness.lock() {
            Freshness::Never => -1.0,
            Freshness::Current => 0.0,
            Freshness::StaleSince(at) => at.elapsed().as_secs_f64(),
        };
        let _ = writeln!(out, "{name} {stale}");
    }
}
