//! The revocation list this replica holds and pushes: API keys revoked and users disabled
//! within the last token lifetime (plus leeway), so that access tokens already issued stop
//! working everywhere before they expire.
//!
//! The list is re-read from the registry every [`POLL`] (changes made by other replicas) and
//! updated at once by this replica's own revocations ([`Revocations::key_revoked`],
//! [`Revocations::user_disabled`]). Revocations are permanent (keys are never un-revoked, users
//! never re-enabled), so a re-read only adds entries; entries leave when they age out. Agent
//! sessions and route streams watch the list and send it whole whenever it changes.

use std::sync::Arc;
use std::time::Duration;

use tessera_protocol::auth::AccessClaims;
use tessera_protocol::revocation::RevocationList;
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::error::Result;
use crate::registry::{Registry, now};

/// How often the registry is re-read for revocations made by other replicas.
pub const POLL: Duration = Duration::from_secs(1);
/// Kept beyond the token lifetime: the verifiers' clock leeway (30 s) with room to spare.
const KEEP_BEYOND_TTL: Duration = Duration::from_secs(60);

/// The list, shared by token checks, agent sessions and route streams.
pub struct Revocations {
    /// Replaced by `refresh` and the local notes; token checks read it, sessions and route
    /// streams watch it. Never closed while the app lives.
    list: watch::Sender<Arc<RevocationList>>,
    /// How long an entry stays listed.
    keep: Duration,
}

impl Revocations {
    /// An empty list whose entries stay for `token_ttl` plus the leeway.
    pub fn new(token_ttl: Duration) -> Self {
        Revocations { list: watch::Sender::new(Arc::default()), keep: token_ttl + KEEP_BEYOND_TTL }
    }

    /// Whether a token with these claims was issued before its key or user was revoked.
    pub fn revokes_token(&self, claims: &AccessClaims) -> bool {
        self.list.borrow().revokes_token(claims)
    }

    /// The list now.
    pub fn current(&self) -> Arc<RevocationList> {
        self.list.borrow().clone()
    }

    /// A receiver that sees every new list.
    pub fn subscribe(&self) -> watch::Receiver<Arc<RevocationList>> {
        self.list.subscribe()
    }

    /// Lists a key this replica just revoked, at once.
    pub fn key_revoked(&self, key_id: Uuid, at: OffsetDateTime) {
        self.update(|list| list.revoke_key(key_id, at.unix_timestamp()));
    }

    /// Lists a user this replica just disabled, at once (their keys were revoked with them).
    pub fn user_disabled(&self, user_id: Uuid, at: OffsetDateTime) {
        self.update(|list| list.revoke_user(user_id, at.unix_timestamp()));
    }

    /// Re-reads the registry's recent revocations, adds them and drops entries that aged out.
    pub async fn refresh(&self, registry: &Registry) -> Result<()> {
        let since = now() - self.keep;
        let mut conn = registry.conn().await?;
        let keys = conn.keys_revoked_since(since).await?;
        let users = conn.users_disabled_since(since).await?;
        drop(conn);
        let read = RevocationList::new(
            keys.into_iter().map(|(id, at)| (id, at.unix_timestamp())),
            users.into_iter().map(|(id, at)| (id, at.unix_timestamp())),
        );
        let oldest = since.unix_timestamp();
        self.update(|list| {
            list.merge(&read);
            list.prune(oldest);
        });
        Ok(())
    }

    /// Applies `change` to a copy of the list; publishes it only if it differs.
    fn update(&self, change: impl FnOnce(&mut RevocationList)) {
        self.list.send_if_modified(|current| {
            let mut next = RevocationList::clone(current);
            change(&mut next);
            if next == **current {
                return false;
            }
            let (keys, users) = next.counts();
            crate::metrics::observe_revocations(keys, users);
            *current = Arc::new(next);
            true
        });
    }
}

/// Re-reads the revocations every [`POLL`] until `stop`. A registry outage keeps the list held
/// (it is logged once, not every second).
pub async fn run_revocations(revocations: Arc<Revocations>, registry: Registry, stop: CancellationToken) {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match revocations.refresh(&registry).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("revocation list read again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "cannot read the revocation list; keeping the one held");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use tessera_protocol::auth::Role;

    use super::*;

    fn claims(key: Uuid, user: Option<Uuid>, iat: i64) -> AccessClaims {
        AccessClaims {
            iss: "i".into(),
            aud: "a".into(),
            sub: key.to_string(),
            usr: user,
            tenant: Uuid::nil(),
            tenant_name: "t".into(),
            role: Role::Inference,
            iat,
            nbf: None,
            exp: iat + 900,
            jti: "j".into(),
        }
    }

    #[test]
    fn local_revocations_apply_at_once_and_wake_watchers() {
        let revocations = Revocations::new(Duration::from_secs(900));
        let mut watcher = revocations.subscribe();
        let (key, user) = (Uuid::new_v4(), Uuid::new_v4());
        let at = now();
        let token = claims(key, None, at.unix_timestamp() - 5);
        assert!(!revocations.revokes_token(&token));
        revocations.key_revoked(key, at);
        assert!(revocations.revokes_token(&token));
        assert!(watcher.has_changed().expect("open"));
        watcher.borrow_and_update();
        // The same revocation again changes nothing and wakes nobody.
        revocations.key_revoked(key, at);
        assert!(!watcher.has_changed().expect("open"));
        revocations.user_disabled(user, at);
        assert!(revocations.revokes_token(&claims(Uuid::new_v4(), Some(user), at.unix_timestamp())));
        assert_eq!(revocations.current().counts(), (1, 1));
    }
}
