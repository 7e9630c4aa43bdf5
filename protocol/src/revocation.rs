//! The revocation list both planes read: API keys revoked and users disabled recently, each with
//! the time it took effect. The control plane builds it from its registry and pushes it to
//! workers (on their session) and gateways (with the route table); every verifier then refuses
//! access tokens issued before a revocation of their key or user, and drops cached answers for
//! revoked keys.
//!
//! Lookups are meant for the request path: two small hash maps, no allocation, and nothing at
//! all while the list is empty.

use std::collections::HashMap;

use uuid::Uuid;

use crate::agent;
use crate::auth::AccessClaims;

/// Revoked keys and disabled users, by id, with the Unix second each took effect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RevocationList {
    keys: HashMap<Uuid, i64>,
    users: HashMap<Uuid, i64>,
}

impl RevocationList {
    /// A list of these revoked keys and disabled users.
    pub fn new(keys: impl IntoIterator<Item = (Uuid, i64)>, users: impl IntoIterator<Item = (Uuid, i64)>) -> Self {
        RevocationList { keys: keys.into_iter().collect(), users: users.into_iter().collect() }
    }

    /// Whether nothing is revoked.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.users.is_empty()
    }

    /// Entries (keys plus users).
    pub fn len(&self) -> usize {
        self.keys.len() + self.users.len()
    }

    /// Revoked keys and disabled users listed.
    pub fn counts(&self) -> (usize, usize) {
        (self.keys.len(), self.users.len())
    }

    /// Adds every entry of `other` (the earlier time wins where both list one).
    pub fn merge(&mut self, other: &RevocationList) {
        for (id, at) in &other.keys {
            self.revoke_key(*id, *at);
        }
        for (id, at) in &other.users {
            self.revoke_user(*id, *at);
        }
    }

    /// Records a key revoked at `at` (Unix seconds); an earlier time already listed stays.
    pub fn revoke_key(&mut self, key_id: Uuid, at: i64) {
        self.keys.entry(key_id).and_modify(|t| *t = (*t).min(at)).or_insert(at);
    }

    /// Records a user disabled at `at` (Unix seconds); an earlier time already listed stays.
    pub fn revoke_user(&mut self, user_id: Uuid, at: i64) {
        self.users.entry(user_id).and_modify(|t| *t = (*t).min(at)).or_insert(at);
    }

    /// Drops the entries that took effect before `before` (Unix seconds): every token issued
    /// before them has expired.
    pub fn prune(&mut self, before: i64) {
        self.keys.retain(|_, at| *at >= before);
        self.users.retain(|_, at| *at >= before);
    }

    /// Whether an access token with these claims was revoked: its key or its user has an entry
    /// at or after the token's `iat`. Both are whole seconds, so a token issued within the same
    /// second as the revocation counts as issued before it (the safe side).
    pub fn revokes_token(&self, claims: &AccessClaims) -> bool {
        if self.is_empty() {
            return false;
        }
        let by_key = || Uuid::try_parse(&claims.sub).ok().and_then(|id| self.keys.get(&id));
        let by_user = || claims.usr.and_then(|id| self.users.get(&id));
        by_key().is_some_and(|at| claims.iat <= *at) || by_user().is_some_and(|at| claims.iat <= *at)
    }

    /// Whether an API key (or its user) is on the list: a cached answer for it must go.
    pub fn revokes_key(&self, key_id: Option<Uuid>, user_id: Option<Uuid>) -> bool {
        key_id.is_some_and(|id| self.keys.contains_key(&id)) || user_id.is_some_and(|id| self.users.contains_key(&id))
    }

    /// The list as sent on the wire, ordered by id so that equal lists encode equally.
    pub fn to_proto(&self) -> agent::Revocations {
        let entries = |map: &HashMap<Uuid, i64>| {
            let mut v: Vec<_> = map.iter().map(|(id, at)| agent::Revoked { id: id.to_string(), at: *at }).collect();
            v.sort_by(|a, b| a.id.cmp(&b.id));
            v
        };
        agent::Revocations { keys: entries(&self.keys), users: entries(&self.users) }
    }

    /// The list a message carries; entries whose id is not a UUID are skipped (they could
    /// never match a key or a user).
    pub fn from_proto(message: &agent::Revocations) -> Self {
        let entries = |v: &[agent::Revoked]| -> HashMap<Uuid, i64> {
            v.iter().filter_map(|r| Some((Uuid::try_parse(&r.id).ok()?, r.at))).collect()
        };
        RevocationList { keys: entries(&message.keys), users: entries(&message.users) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;

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
            nbf: Some(iat),
            exp: iat + 900,
            jti: "j".into(),
        }
    }

    #[test]
    fn tokens_issued_up_to_the_revocation_are_refused() {
        let (key, user, other) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let list = RevocationList::new([(key, 1_000)], [(user, 2_000)]);
        assert!(list.revokes_token(&claims(key, None, 999)));
        assert!(list.revokes_token(&claims(key, None, 1_000)), "same second counts as before");
        assert!(!list.revokes_token(&claims(key, None, 1_001)), "issued after the revocation");
        assert!(list.revokes_token(&claims(other, Some(user), 1_500)), "by the user");
        assert!(!list.revokes_token(&claims(other, Some(user), 2_001)));
        assert!(!list.revokes_token(&claims(other, None, 1)), "neither key nor user listed");
        assert!(!list.revokes_token(&claims(other, Some(other), 1)));
        let mut odd = claims(key, None, 1);
        odd.sub = "not-a-uuid".into();
        assert!(!list.revokes_token(&odd));
        assert!(!RevocationList::default().revokes_token(&claims(key, Some(user), 1)));
    }

    #[test]
    fn cached_keys_of_listed_keys_or_users_are_revoked() {
        let (key, user, other) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let list = RevocationList::new([(key, 1_000)], [(user, 2_000)]);
        assert!(list.revokes_key(Some(key), None));
        assert!(list.revokes_key(Some(other), Some(user)));
        assert!(!list.revokes_key(Some(other), Some(other)));
        assert!(!list.revokes_key(None, None), "an answer without ids (an older control plane)");
    }

    #[test]
    fn entries_keep_the_earliest_time_and_age_out() {
        let (a, b, u) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let mut list = RevocationList::default();
        list.revoke_key(a, 100);
        list.revoke_key(a, 300);
        list.revoke_key(b, 200);
        list.revoke_user(u, 150);
        assert_eq!(list.len(), 3);
        assert!(list.revokes_token(&claims(a, None, 100)) && !list.revokes_token(&claims(a, None, 101)));
        list.prune(151);
        assert_eq!(list, RevocationList::new([(b, 200)], []));
        list.prune(1_000);
        assert!(list.is_empty());
    }

    #[test]
    fn the_wire_form_round_trips_in_a_stable_order() {
        let ids: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
        let list = RevocationList::new(ids[..3].iter().map(|id| (*id, 7)), ids[3..].iter().map(|id| (*id, 9)));
        let wire = list.to_proto();
        assert_eq!(wire.keys.len(), 3);
        assert!(wire.keys.windows(2).all(|w| w[0].id < w[1].id));
        assert_eq!(RevocationList::from_proto(&wire), list);
        let reversed =
            RevocationList::new(ids[..3].iter().rev().map(|id| (*id, 7)), ids[3..].iter().map(|id| (*id, 9)));
        assert_eq!(reversed.to_proto(), wire, "equal lists encode equally");
        let mut junk = wire.clone();
        junk.keys.push(agent::Revoked { id: "nope".into(), at: 1 });
        assert_eq!(RevocationList::from_proto(&junk), list);
    }

    #[test]
    fn a_check_against_a_large_list_stays_cheap() {
        // 20,000 revocations within one token lifetime is far beyond any real list.
        let list = RevocationList::new(
            (0..10_000u128).map(|i| (Uuid::from_u128(i), 1)),
            (0..10_000u128).map(|i| (Uuid::from_u128(i << 64), 1)),
        );
        let token = claims(Uuid::new_v4(), Some(Uuid::new_v4()), 5);
        let rounds: u32 = 100_000;
        let start = std::time::Instant::now();
        let revoked = (0..rounds).filter(|_| list.revokes_token(std::hint::black_box(&token))).count();
        let each = start.elapsed() / rounds;
        assert_eq!(revoked, 0);
        // A few microseconds unoptimised (parsing `sub` and two SipHash lookups; about a tenth
        // of that optimised), against the Ed25519 signature check every token costs (tens of
        // microseconds optimised, milliseconds unoptimised). The bound leaves room for a loaded
        // test machine.
        assert!(each < std::time::Duration::from_micros(50), "{each:?} per check");
        println!("revokes_token on {} entries: {each:?} per check", list.len());
    }
}
