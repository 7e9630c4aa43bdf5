//! The response cache (Triton's `response_cache { enable: true }`): a model version's outputs
//! kept for the exact request that produced them, so the same request again is answered
//! without running the model.
//!
//! One cache per process (a worker, or `serve`), bounded in bytes twice: in all, and per
//! tenant, each by least-recently-used eviction. Tenants are separate maps, so a tenant never
//! sees another's entries even on a hash collision. The key is the model key (which carries the
//! tenant's namespace), the load of the version (a reloaded version never answers from the
//! files it replaced), and a 128-bit hash of the inputs (name, datatype, shape, bytes) and the
//! requested outputs; request parameters such as priority or timeout change no answer and are
//! left out, as in Triton.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::engine::infer::ValidInferRequest;
use crate::engine::tensor::OutputTensor;

/// Default bytes the cache may hold in all (`--response-cache-bytes`).
pub const DEFAULT_TOTAL_BYTES: u64 = 64 << 20;
/// Default bytes one tenant's entries may hold (`--response-cache-tenant-bytes`) on workers.
pub const DEFAULT_TENANT_BYTES: u64 = 16 << 20;
/// Bookkeeping charged per entry beyond its tensors' bytes, so many tiny entries stay bounded.
const ENTRY_OVERHEAD: u64 = 128;

/// The cache's byte limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Bytes in all; 0 turns the cache off.
    pub total_bytes: u64,
    /// Bytes per tenant (at most `total_bytes`).
    pub tenant_bytes: u64,
}

/// Identifies one answer: which load of which model, and what was asked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    model: Arc<str>,
    load: u64,
    digest: u128,
}

/// What one model version needs to use the cache: the cache, its tenant and its own key part.
#[derive(Clone)]
pub struct CacheSlot {
    cache: Arc<ResponseCache>,
    tenant: Arc<str>,
    model: Arc<str>,
    load: u64,
}

/// Numbers every load of a version gets, so keys of a reloaded version never match.
static LOADS: AtomicU64 = AtomicU64::new(0);

impl CacheSlot {
    /// A slot for the version loaded under manager key `model` (`tenant/name` on workers).
    pub fn new(cache: Arc<ResponseCache>, model: &str) -> Self {
        let tenant = model.split_once('/').map_or("", |(tenant, _)| tenant);
        Self { cache, tenant: tenant.into(), model: model.into(), load: LOADS.fetch_add(1, Ordering::Relaxed) }
    }

    /// The key of `request`.
    pub fn key(&self, request: &ValidInferRequest) -> CacheKey {
        CacheKey { model: self.model.clone(), load: self.load, digest: digest(request) }
    }

    /// The cached outputs of `key`, marking them recently used.
    pub fn lookup(&self, key: &CacheKey) -> Option<Arc<[OutputTensor]>> {
        self.cache.lookup(&self.tenant, key)
    }

    /// Keeps `outputs` as the answer to `key`.
    pub fn insert(&self, key: CacheKey, outputs: &[OutputTensor]) {
        self.cache.insert(&self.tenant, key, outputs);
    }
}

/// Hashes what decides the answer: each input slot (name, datatype, shape, bytes, or its
/// absence) and the requested outputs, twice with different prefixes for 128 bits.
fn digest(request: &ValidInferRequest) -> u128 {
    let half = |seed: u8| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        seed.hash(&mut h);
        for input in &request.inputs {
            match input {
                None => 0u8.hash(&mut h),
                Some(t) => {
                    1u8.hash(&mut h);
                    t.name.hash(&mut h);
                    t.datatype.as_wire().hash(&mut h);
                    t.shape.hash(&mut h);
                    t.data.as_ref().hash(&mut h);
                }
            }
        }
        request.outputs.hash(&mut h);
        h.finish()
    };
    (u128::from(half(0)) << 64) | u128::from(half(1))
}

/// One cached answer.
struct Entry {
    outputs: Arc<[OutputTensor]>,
    bytes: u64,
    /// Its place in the LRU order.
    tick: u64,
}

/// One tenant's entries.
#[derive(Default)]
struct TenantEntries {
    entries: HashMap<CacheKey, Entry>,
    /// Ticks in use order, oldest first.
    order: BTreeMap<u64, CacheKey>,
    bytes: u64,
}

/// Everything behind the lock.
#[derive(Default)]
struct Inner {
    tenants: HashMap<Arc<str>, TenantEntries>,
    /// Every entry's tick with its tenant, oldest first: the whole cache's LRU order.
    order: BTreeMap<u64, Arc<str>>,
    bytes: u64,
    tick: u64,
}

/// The process's response cache. Held briefly per lookup or insert; never across a run.
pub struct ResponseCache {
    limits: CacheLimits,
    inner: Mutex<Inner>,
}

impl ResponseCache {
    /// An empty cache with these limits (the tenant limit capped at the total).
    pub fn new(limits: CacheLimits) -> Self {
        let limits = CacheLimits { tenant_bytes: limits.tenant_bytes.min(limits.total_bytes), ..limits };
        Self { limits, inner: Mutex::new(Inner::default()) }
    }

    /// A cache with these limits, or none when they allow no bytes.
    pub fn enabled(limits: CacheLimits) -> Option<Arc<Self>> {
        (limits.total_bytes > 0 && limits.tenant_bytes > 0).then(|| Arc::new(Self::new(limits)))
    }

    /// The limits in force.
    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    /// Entries and bytes held, in all.
    pub fn usage(&self) -> (usize, u64) {
        let inner = self.inner.lock();
        (inner.order.len(), inner.bytes)
    }

    /// Bytes held for `tenant`.
    pub fn tenant_bytes(&self, tenant: &str) -> u64 {
        self.inner.lock().tenants.get(tenant).map_or(0, |t| t.bytes)
    }

    fn lookup(&self, tenant: &str, key: &CacheKey) -> Option<Arc<[OutputTensor]>> {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        inner.tick += 1;
        let tick = inner.tick;
        let entries = inner.tenants.get_mut(tenant)?;
        let entry = entries.entries.get_mut(key)?;
        let old = std::mem::replace(&mut entry.tick, tick);
        let outputs = entry.outputs.clone();
        entries.order.remove(&old);
        entries.order.insert(tick, key.clone());
        if let Some(owner) = inner.order.remove(&old) {
            inner.order.insert(tick, owner);
        }
        Some(outputs)
    }

    fn insert(&self, tenant: &str, key: CacheKey, outputs: &[OutputTensor]) {
        let bytes = outputs.iter().map(|o| o.data.len() as u64 + o.name.len() as u64).sum::<u64>() + ENTRY_OVERHEAD;
        if bytes > self.limits.tenant_bytes {
            return;
        }
        // Copies, before the lock: an output may be a slice of a whole batch's buffer or of a
        // runner's shared memory arena, which a cached reference would keep alive (uncounted, or
        // starving the arena).
        let owned: Vec<OutputTensor> = outputs
            .iter()
            .map(|o| OutputTensor { data: bytes::Bytes::copy_from_slice(&o.data), ..o.clone() })
            .collect();
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let tenant: Arc<str> = match inner.tenants.get_key_value(tenant) {
            Some((t, _)) => t.clone(),
            None => tenant.into(),
        };
        inner.remove(&tenant, &key);
        while inner.tenants.get(&tenant).is_some_and(|t| t.bytes + bytes > self.limits.tenant_bytes) {
            inner.evict_oldest_of(&tenant);
        }
        while inner.bytes + bytes > self.limits.total_bytes {
            inner.evict_oldest();
        }
        inner.tick += 1;
        let tick = inner.tick;
        let entries = inner.tenants.entry(tenant.clone()).or_default();
        entries.order.insert(tick, key.clone());
        entries.entries.insert(key, Entry { outputs: owned.into(), bytes, tick });
        entries.bytes += bytes;
        inner.order.insert(tick, tenant);
        inner.bytes += bytes;
    }
}

impl Inner {
    fn remove(&mut self, tenant: &str, key: &CacheKey) {
        let Some(entries) = self.tenants.get_mut(tenant) else { return };
        let Some(entry) = entries.entries.remove(key) else { return };
        entries.order.remove(&entry.tick);
        entries.bytes -= entry.bytes;
        self.order.remove(&entry.tick);
        self.bytes -= entry.bytes;
        if entries.entries.is_empty() {
            self.tenants.remove(tenant);
        }
    }

    fn evict_oldest_of(&mut self, tenant: &str) {
        let oldest = self.tenants.get(tenant).and_then(|t| t.order.first_key_value().map(|(_, k)| k.clone()));
        match oldest {
            Some(key) => self.remove(tenant, &key),
            None => {
                self.tenants.remove(tenant);
            }
        }
    }

    fn evict_oldest(&mut self) {
        let Some((_, tenant)) = self.order.first_key_value().map(|(t, o)| (*t, o.clone())) else {
            // Nothing left to evict: the byte count must be zero.
            self.bytes = 0;
            return;
        };
        self.evict_oldest_of(&tenant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tensor::InputTensor;
    use bytes::Bytes;
    use tessera_protocol::DataType;

    fn request(value: u8) -> ValidInferRequest {
        let input = InputTensor {
            name: "X".into(),
            datatype: DataType::Uint8,
            shape: vec![4],
            data: Bytes::from(vec![value; 4]),
        };
        ValidInferRequest {
            id: String::new(),
            parameters: Default::default(),
            priority: 0,
            timeout_us: 0,
            batch_size: 1,
            inputs: vec![Some(input)],
            outputs: vec![0],
            cuda: Default::default(),
            trace: Default::default(),
        }
    }

    fn outputs(bytes: usize) -> Vec<OutputTensor> {
        vec![OutputTensor {
            name: "Y".into(),
            datatype: DataType::Uint8,
            shape: vec![bytes as i64],
            data: vec![7; bytes].into(),
        }]
    }

    fn cache(total: u64, tenant: u64) -> Arc<ResponseCache> {
        Arc::new(ResponseCache::new(CacheLimits { total_bytes: total, tenant_bytes: tenant }))
    }

    #[test]
    fn the_same_request_hits_and_a_different_one_misses() {
        let slot = CacheSlot::new(cache(1 << 20, 1 << 20), "m");
        let key = slot.key(&request(1));
        assert!(slot.lookup(&key).is_none());
        slot.insert(key.clone(), &outputs(8));
        assert_eq!(slot.lookup(&slot.key(&request(1))).expect("a hit")[0].data.len(), 8);
        assert!(slot.lookup(&slot.key(&request(2))).is_none(), "other bytes, other key");
        let mut other_outputs = request(1);
        other_outputs.outputs = vec![1];
        assert!(slot.lookup(&slot.key(&other_outputs)).is_none(), "other outputs asked, other key");
    }

    #[test]
    fn tenants_and_reloads_never_share_entries() {
        let shared = cache(1 << 20, 1 << 20);
        let a = CacheSlot::new(shared.clone(), "tenant-a/m");
        let b = CacheSlot::new(shared.clone(), "tenant-b/m");
        a.insert(a.key(&request(1)), &outputs(8));
        assert!(b.lookup(&b.key(&request(1))).is_none(), "another tenant's model of the same name misses");
        // Even a key forged to be equal stays in its tenant's map.
        assert!(b.lookup(&a.key(&request(1))).is_none());
        let reloaded = CacheSlot::new(shared, "tenant-a/m");
        assert!(reloaded.lookup(&reloaded.key(&request(1))).is_none(), "a new load starts empty");
    }

    #[test]
    fn bytes_stay_under_both_limits_evicting_the_least_recently_used() {
        let entry = 100 + ENTRY_OVERHEAD + 1;
        let shared = cache(entry * 3, entry * 2);
        let a = CacheSlot::new(shared.clone(), "a/m");
        let b = CacheSlot::new(shared.clone(), "b/m");
        for v in 0..3 {
            a.insert(a.key(&request(v)), &outputs(100));
        }
        assert!(shared.tenant_bytes("a") <= entry * 2, "tenant a holds at most two");
        assert!(a.lookup(&a.key(&request(0))).is_none(), "the oldest went first");
        assert!(a.lookup(&a.key(&request(1))).is_some());
        // Used just now, request 1 outlives request 2 when the whole cache runs full.
        b.insert(b.key(&request(0)), &outputs(100));
        b.insert(b.key(&request(1)), &outputs(100));
        let (entries, bytes) = shared.usage();
        assert!(bytes <= entry * 3 && entries == 3, "{entries} entries, {bytes} bytes");
        assert!(a.lookup(&a.key(&request(2))).is_none(), "a's least recently used entry was evicted");
        assert!(a.lookup(&a.key(&request(1))).is_some());
        let too_big = CacheSlot::new(shared.clone(), "c/m");
        too_big.insert(too_big.key(&request(0)), &outputs(1 << 16));
        assert_eq!(shared.tenant_bytes("c"), 0, "an answer above the tenant limit is not kept");
    }
}
