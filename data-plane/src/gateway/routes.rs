//! The gateway's view of where models live: the control plane's route table turned into
//! lookups by tenant and model, with the upstream workers' balancing state (requests in flight,
//! failures, ejection) and the tenants' limiters kept across table updates.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_protocol::agent::RouteTable;

use super::limits::Limiter;

/// Failures in a row after which an upstream is ejected.
const EJECT_AFTER: u32 = 3;
/// The first ejection's length; each further one in a row doubles it, up to `MAX_EJECTION`.
const BASE_EJECTION: Duration = Duration::from_secs(5);
const MAX_EJECTION: Duration = Duration::from_secs(60);

/// One worker endpoint requests are forwarded to.
#[derive(Debug)]
pub struct Upstream {
    /// The worker's id.
    pub worker_id: String,
    /// HTTP base URL, e.g. `http://10.0.0.5:8000`.
    pub http: String,
    /// gRPC base URI, e.g. `http://10.0.0.5:8001`.
    pub grpc: String,
    /// Idle hyper HTTP/1.1 connections to its HTTP listener (requests hyper serves).
    http1: super::http_upstream::Pool,
    /// Idle lean connections ([`super::h1::upstream`]) to its HTTP listener...
    h1: super::http_upstream::Pool<super::h1::upstream::Conn>,
    /// ...and to its gRPC listener (unary calls alone in flight).
    h1_grpc: super::http_upstream::Pool<super::h1::upstream::Conn>,
    outstanding: AtomicU32,
    health: Mutex<Health>,
}

#[derive(Debug, Default)]
struct Health {
    failures_in_a_row: u32,
    ejections_in_a_row: u32,
    ejected_until: Option<Instant>,
}

/// What happened to one forwarded request, for outlier detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream answered (whatever the status).
    Answered,
    /// The upstream could not be reached or broke the connection.
    Failed,
    /// The upstream could not even be connected to: ejected at once.
    Unreachable,
}

impl Upstream {
    pub(super) fn new(worker_id: &str, http: &str, grpc: &str) -> Self {
        // A worker serving TLS registers an https HTTP endpoint; its gRPC address (no scheme)
        // speaks TLS too.
        let scheme = if http.starts_with("https://") { "https" } else { "http" };
        let grpc = if grpc.contains("://") { grpc.to_string() } else { format!("{scheme}://{grpc}") };
        let (http, grpc) = (http.trim_end_matches('/'), grpc.trim_end_matches('/'));
        Self {
            worker_id: worker_id.to_string(),
            http1: super::http_upstream::Pool::new(http),
            h1: super::http_upstream::Pool::new(http),
            h1_grpc: super::http_upstream::Pool::new(grpc),
            http: http.to_string(),
            grpc: grpc.to_string(),
            outstanding: AtomicU32::new(0),
            health: Mutex::new(Health::default()),
        }
    }

    /// The idle hyper HTTP/1.1 connections to its HTTP listener.
    pub(super) fn pool(&self) -> &super::http_upstream::Pool {
        &self.http1
    }

    /// The idle lean connections to one of its listeners.
    pub(super) fn lean_pool(
        &self,
        listener: super::h1::upstream::Listener,
    ) -> &super::http_upstream::Pool<super::h1::upstream::Conn> {
        match listener {
            super::h1::upstream::Listener::Http => &self.h1,
            super::h1::upstream::Listener::Grpc => &self.h1_grpc,
        }
    }

    /// Lets go of its idle connections that expired or that the worker closed.
    pub(super) fn sweep_idle(&self) {
        self.http1.sweep();
        self.h1.sweep();
        self.h1_grpc.sweep();
    }

    /// Identifies it among the upstreams of one table (its address).
    pub fn key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Requests forwarded to it and not yet answered.
    pub fn outstanding(&self) -> u32 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Whether it is ejected at `now`.
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.health.lock().ejected_until.is_some_and(|until| until > now)
    }

    /// Counts a request in flight until the guard drops.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Notes how a request went; `true` when this ejected the upstream.
    pub fn record(&self, outcome: Outcome, now: Instant) -> bool {
        let mut h = self.health.lock();
        match outcome {
            Outcome::Answered => {
                h.failures_in_a_row = 0;
                if h.ejected_until.is_none_or(|until| until <= now) {
                    h.ejections_in_a_row = 0;
                    h.ejected_until = None;
                }
                false
            }
            Outcome::Failed | Outcome::Unreachable => {
                h.failures_in_a_row += 1;
                let already = h.ejected_until.is_some_and(|until| until > now);
                if already || (outcome == Outcome::Failed && h.failures_in_a_row < EJECT_AFTER) {
                    return false;
                }
                let factor = 1u32 << h.ejections_in_a_row.min(4);
                h.ejected_until = Some(now + (BASE_EJECTION * factor).min(MAX_EJECTION));
                h.ejections_in_a_row += 1;
                h.failures_in_a_row = 0;
                true
            }
        }
    }
}

/// A request in flight on an upstream (its least-outstanding count).
pub struct InFlight(Arc<Upstream>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One loaded replica of a model.
#[derive(Debug, Clone)]
pub struct Replica {
    /// Version it holds.
    pub version: i64,
    /// Whether unversioned requests may reach it.
    pub serving: bool,
    /// Where it runs.
    pub upstream: Arc<Upstream>,
}

/// One deployed model of a tenant.
#[derive(Debug, Clone, Default)]
pub struct ModelRoutes {
    /// Shares of unversioned requests by version (percent).
    pub weights: Vec<(i64, u32)>,
    /// Loaded replicas.
    pub replicas: Vec<Replica>,
}

/// One tenant's models and limiter.
#[derive(Debug)]
pub struct TenantRoutes {
    /// Tenant name (metrics, logs).
    pub name: String,
    /// Models by the name clients use.
    pub models: HashMap<String, ModelRoutes>,
    /// The tenant's rate and concurrency limits (this gateway's share).
    pub limiter: Arc<Limiter>,
    /// The limits of the tenant's API keys that have their own (this gateway's share), by key id.
    pub keys: HashMap<uuid::Uuid, Arc<Limiter>>,
}

/// The whole table, replaced as a unit on every update.
#[derive(Debug, Default)]
pub struct Routes {
    /// Tenants by id.
    pub tenants: HashMap<String, TenantRoutes>,
    /// Gateways sharing the limits.
    pub gateways: u32,
}

impl Routes {
    /// Builds the table from `table`, reusing `previous`'s upstreams (their counters and
    /// ejections) and limiters (their buckets) where they still apply.
    pub fn from_table(table: &RouteTable, previous: &Routes) -> Routes {
        let mut upstreams: HashMap<(String, String, String), Arc<Upstream>> = HashMap::new();
        for tenant in previous.tenants.values() {
            for model in tenant.models.values() {
                for r in &model.replicas {
                    let u = &r.upstream;
                    upstreams.insert((u.worker_id.clone(), u.http.clone(), u.grpc.clone()), u.clone());
                }
            }
        }
        let gateways = table.gateways.max(1);
        let mut tenants = HashMap::with_capacity(table.tenants.len());
        for t in &table.tenants {
            let limiter = match previous.tenants.get(&t.tenant_id) {
                Some(old) => old.limiter.clone(),
                None => Arc::new(Limiter::default()),
            };
            limiter.configure(t.requests_per_second, t.concurrent_requests, gateways);
            let old_keys = previous.tenants.get(&t.tenant_id).map(|old| &old.keys);
            let mut keys = HashMap::with_capacity(t.keys.len());
            for k in &t.keys {
                // An id that does not parse names no key a caller can hold.
                let Ok(id) = uuid::Uuid::try_parse(&k.key_id) else { continue };
                let key_limiter = old_keys.and_then(|old| old.get(&id)).cloned().unwrap_or_default();
                key_limiter.configure(k.requests_per_second, k.concurrent_requests, gateways);
                keys.insert(id, key_limiter);
            }
            let mut models = HashMap::with_capacity(t.models.len());
            for m in &t.models {
                let replicas = m
                    .replicas
                    .iter()
                    .map(|r| {
                        let probe = Upstream::new(&r.worker_id, &r.http_endpoint, &r.grpc_endpoint);
                        let key = (probe.worker_id.clone(), probe.http.clone(), probe.grpc.clone());
                        let upstream = upstreams.entry(key).or_insert_with(|| Arc::new(probe)).clone();
                        Replica { version: r.version, serving: r.serving, upstream }
                    })
                    .collect();
                let weights = m.weights.iter().map(|w| (w.version, w.weight)).collect();
                models.insert(m.model_name.clone(), ModelRoutes { weights, replicas });
            }
            tenants.insert(t.tenant_id.clone(), TenantRoutes { name: t.tenant_name.clone(), models, limiter, keys });
        }
        Routes { tenants, gateways }
    }

    /// Every distinct upstream (for metrics, and sweeping their idle connections).
    pub fn upstreams(&self) -> Vec<Arc<Upstream>> {
        let mut seen: HashMap<usize, Arc<Upstream>> = HashMap::new();
        for t in self.tenants.values() {
            for m in t.models.values() {
                for r in &m.replicas {
                    seen.entry(r.upstream.key()).or_insert_with(|| r.upstream.clone());
                }
            }
        }
        seen.into_values().collect()
    }
}

impl ModelRoutes {
    /// Picks a replica for a request: of `version` when given, else by the traffic weights
    /// among serving replicas; never one in `tried`; ejected upstreams only when nothing else
    /// is left. Among the candidates, the less loaded of two random ones (power of two
    /// choices). `roll` is a uniform random number; `tried` holds [`Upstream::key`]s.
    pub fn pick(&self, version: Option<i64>, tried: &[usize], now: Instant, roll: u64) -> Option<&Replica> {
        self.pick_for(version, tried, now, roll, None)
    }

    /// [`Self::pick`], except that a request of a sequence (`sequence`: its
    /// [`super::sticky::sequence_key`]) goes to the candidate with the highest rendezvous score,
    /// so all its requests reach the replica holding its state; its version draw uses the key
    /// too, so a canary split keeps a sequence on one version.
    pub fn pick_for(
        &self,
        version: Option<i64>,
        tried: &[usize],
        now: Instant,
        roll: u64,
        sequence: Option<u64>,
    ) -> Option<&Replica> {
        let roll = sequence.unwrap_or(roll);
        let untried = |r: &&Replica| !tried.contains(&r.upstream.key());
        let candidates: Vec<&Replica> = match version {
            Some(v) => self.replicas.iter().filter(|r| r.version == v).filter(untried).collect(),
            None => {
                let serving: Vec<&Replica> = self.replicas.iter().filter(|r| r.serving).filter(untried).collect();
                match self.weighted_version(&serving, roll) {
                    Some(v) => serving.into_iter().filter(|r| r.version == v).collect(),
                    None => serving,
                }
            }
        };
        let healthy: Vec<&Replica> = candidates.iter().copied().filter(|r| !r.upstream.is_ejected(now)).collect();
        let pool = if healthy.is_empty() { candidates } else { healthy };
        if let Some(key) = sequence {
            let score = |r: &&Replica| super::sticky::score(key, &r.upstream.worker_id, &r.upstream.http);
            return pool.into_iter().max_by_key(score);
        }
        match pool.len() {
            0 => None,
            1 => Some(pool[0]),
            n => {
                // Two distinct indices from one roll (its high and low halves).
                let a = ((roll >> 32) as usize) % n;
                let b = (a + 1 + (roll as u32 as usize) % (n - 1)) % n;
                let (ra, rb) = (pool[a], pool[b]);
                Some(if rb.upstream.outstanding() < ra.upstream.outstanding() { rb } else { ra })
            }
        }
    }

    /// The version an unversioned request goes to: drawn by weight among the weighted
    /// versions that have a candidate; `None` when no weighted version has one (then any
    /// serving replica will do, e.g. mid-rollout).
    fn weighted_version(&self, serving: &[&Replica], roll: u64) -> Option<i64> {
        let live: Vec<(i64, u32)> =
            self.weights.iter().copied().filter(|(v, w)| *w > 0 && serving.iter().any(|r| r.version == *v)).collect();
        let total: u64 = live.iter().map(|(_, w)| u64::from(*w)).sum();
        if total == 0 {
            return None;
        }
        // The low 32 bits pick the replica; the weight draw uses a separate mix of the roll.
        let mut point = roll.rotate_left(17).wrapping_mul(0x9E37_79B9_7F4A_7C15) % total;
        for (v, w) in live {
            let w = u64::from(w);
            if point < w {
                return Some(v);
            }
            point -= w;
        }
        None
    }
}

/// A fast per-thread random number (xorshift64*), enough for balancing draws.
pub fn random() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
            // Distinct per thread: mix in the address of the cell's own stack frame.
            let local = 0u8;
            (seed ^ (std::ptr::addr_of!(local) as u64).rotate_left(29)) | 1
        });
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

#[cfg(test)]
mod tests {
    use tessera_protocol::agent::{self, ModelRoute, RouteReplica, VersionWeight};

    use super::*;

    fn table(replicas: Vec<RouteReplica>, weights: Vec<VersionWeight>) -> RouteTable {
        RouteTable {
            tenants: vec![agent::TenantRoutes {
                tenant_id: "t1".into(),
                tenant_name: "acme".into(),
                requests_per_second: 100,
                concurrent_requests: 0,
                models: vec![ModelRoute { model_name: "m".into(), deployment_id: "d".into(), weights, replicas }],
                keys: Vec::new(),
            }],
            gateways: 1,
            revocations: None,
        }
    }

    fn replica(worker: &str, version: i64, serving: bool) -> RouteReplica {
        RouteReplica {
            replica_id: format!("{worker}-{version}"),
            version,
            worker_id: worker.into(),
            http_endpoint: format!("http://{worker}:8000/"),
            grpc_endpoint: format!("{worker}:8001"),
            serving,
        }
    }

    fn model(routes: &Routes) -> &ModelRoutes {
        &routes.tenants["t1"].models["m"]
    }

    #[test]
    fn weights_split_unversioned_requests_and_versioned_ones_go_to_their_version() {
        let t = table(
            vec![replica("a", 1, true), replica("b", 2, true), replica("c", 1, false)],
            vec![VersionWeight { version: 1, weight: 90 }, VersionWeight { version: 2, weight: 10 }],
        );
        let routes = Routes::from_table(&t, &Routes::default());
        let m = model(&routes);
        let now = Instant::now();
        let mut to_v2 = 0;
        for _ in 0..10_000 {
            let r = m.pick(None, &[], now, random()).expect("a replica");
            assert!(r.serving, "unversioned requests go to serving replicas only");
            to_v2 += usize::from(r.version == 2);
        }
        assert!((800..=1200).contains(&to_v2), "about 10% to the canary: {to_v2}");
        // The draining replica `c` still takes requests for its version.
        let workers: std::collections::HashSet<_> =
            (0..200).map(|_| m.pick(Some(1), &[], now, random()).expect("v1").upstream.worker_id.clone()).collect();
        assert_eq!(workers, ["a", "c"].map(String::from).into());
        assert!(m.pick(Some(3), &[], now, random()).is_none());
    }

    #[test]
    fn a_canary_without_serving_replicas_passes_its_share_on() {
        let t = table(
            vec![replica("a", 1, true)],
            vec![VersionWeight { version: 1, weight: 50 }, VersionWeight { version: 2, weight: 50 }],
        );
        let routes = Routes::from_table(&t, &Routes::default());
        for _ in 0..100 {
            assert_eq!(model(&routes).pick(None, &[], Instant::now(), random()).expect("v1").version, 1);
        }
    }

    #[test]
    fn tried_and_ejected_upstreams_are_avoided_and_least_loaded_wins() {
        let t =
            table(vec![replica("a", 1, true), replica("b", 1, true)], vec![VersionWeight { version: 1, weight: 100 }]);
        let routes = Routes::from_table(&t, &Routes::default());
        let m = model(&routes);
        let now = Instant::now();
        let a = m.replicas.iter().find(|r| r.upstream.worker_id == "a").expect("a").upstream.clone();
        let tried = [a.key()];
        for _ in 0..50 {
            assert_eq!(m.pick(None, &tried, now, random()).expect("b").upstream.worker_id, "b");
        }
        // `a` busy: two choices out of two always prefer `b`.
        let _busy: Vec<InFlight> = (0..5).map(|_| a.start()).collect();
        for _ in 0..50 {
            assert_eq!(m.pick(None, &[], now, random()).expect("b").upstream.worker_id, "b");
        }
        assert!(a.record(Outcome::Unreachable, now), "unreachable ejects at once");
        drop(_busy);
        for _ in 0..50 {
            assert_eq!(m.pick(None, &[], now, random()).expect("b").upstream.worker_id, "b");
        }
        // With `b` tried, the ejected `a` is still better than nothing.
        let b = m.replicas.iter().find(|r| r.upstream.worker_id == "b").expect("b").upstream.clone();
        assert_eq!(m.pick(None, &[b.key()], now, random()).expect("a").upstream.worker_id, "a");
        // The ejection ends.
        assert!(!a.is_ejected(now + MAX_EJECTION));
    }

    #[test]
    fn failures_eject_after_a_few_in_a_row_for_growing_spells() {
        let u = Upstream::new("w", "http://w:1", "w:2");
        let now = Instant::now();
        assert!(!u.record(Outcome::Failed, now));
        assert!(!u.record(Outcome::Failed, now));
        assert!(u.record(Outcome::Failed, now), "third failure in a row ejects");
        assert!(u.is_ejected(now + BASE_EJECTION - Duration::from_millis(1)));
        assert!(!u.is_ejected(now + BASE_EJECTION));
        let later = now + BASE_EJECTION;
        assert!(u.record(Outcome::Unreachable, later));
        assert!(u.is_ejected(later + BASE_EJECTION), "the second spell is twice as long");
        // An answer after the spell resets everything.
        let after = later + 2 * BASE_EJECTION;
        u.record(Outcome::Answered, after);
        assert!(u.record(Outcome::Unreachable, after));
        assert!(!u.is_ejected(after + BASE_EJECTION));
    }

    #[test]
    fn updates_keep_upstream_state_and_limiters() {
        let t = table(vec![replica("a", 1, true)], vec![VersionWeight { version: 1, weight: 100 }]);
        let first = Routes::from_table(&t, &Routes::default());
        let a = model(&first).replicas[0].upstream.clone();
        let _in_flight = a.start();
        let second = Routes::from_table(&t, &first);
        assert!(Arc::ptr_eq(&a, &model(&second).replicas[0].upstream));
        assert_eq!(model(&second).replicas[0].upstream.outstanding(), 1);
        assert!(Arc::ptr_eq(&first.tenants["t1"].limiter, &second.tenants["t1"].limiter));
        assert_eq!(a.http, "http://a:8000");
        assert_eq!(a.grpc, "http://a:8001");
    }

    #[test]
    fn a_sequence_sticks_to_one_replica_and_moves_only_when_it_leaves() {
        let replicas: Vec<RouteReplica> = ["a", "b", "c", "d"].iter().map(|w| replica(w, 1, true)).collect();
        let weights = vec![VersionWeight { version: 1, weight: 100 }];
        let routes = Routes::from_table(&table(replicas.clone(), weights.clone()), &Routes::default());
        let m = model(&routes);
        let now = Instant::now();
        let key_of =
            |n: u64| crate::gateway::sticky::sequence_key("t", "m", &crate::gateway::sticky::SequenceId::Num(n));
        let mut owners = HashMap::new();
        for n in 1..=200u64 {
            let first =
                m.pick_for(None, &[], now, random(), Some(key_of(n))).expect("a replica").upstream.worker_id.clone();
            for _ in 0..5 {
                // Load and the random roll change nothing for a sequence.
                let _busy = m.replicas[0].upstream.start();
                let again = m.pick_for(None, &[], now, random(), Some(key_of(n))).expect("a replica");
                assert_eq!(again.upstream.worker_id, first, "sequence {n}");
            }
            owners.insert(n, first);
        }
        let spread: std::collections::HashSet<&String> = owners.values().collect();
        assert_eq!(spread.len(), 4, "sequences spread over every replica");
        // Replica `b` leaves: only its sequences move; a new gateway table agrees with this one.
        let without_b: Vec<RouteReplica> = replicas.into_iter().filter(|r| r.worker_id != "b").collect();
        let after = Routes::from_table(&table(without_b, weights), &Routes::default());
        for (n, owner) in &owners {
            let now_owner = model(&after).pick_for(None, &[], now, random(), Some(key_of(*n))).expect("a replica");
            if owner != "b" {
                assert_eq!(&now_owner.upstream.worker_id, owner, "sequence {n} stays");
            } else {
                assert_ne!(now_owner.upstream.worker_id, "b");
            }
        }
    }
}
