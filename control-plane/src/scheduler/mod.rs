//! Placement of deployment replicas onto worker slices: a pure, synchronous, deterministic
//! function the scheduler loop calls with the registry's desired state.
//!
//! # Placement model
//! - A **worker** offers **slices**: a whole GPU, a MIG instance or a CPU share, each with a
//!   profile (`cpu`, `gpu`, `mig-1g.10gb`, ...) and a memory size.
//! - A **replica** asks for one slice of a profile and an amount of memory; several replicas may
//!   share a slice when memory allows.
//! - **Tenant exclusivity**: a slice serves one tenant at a time. A slice already holding a
//!   tenant's replicas only takes more of that tenant's; an empty slice takes anyone.
//! - **Memory fit**: the replicas on a slice never need more than its memory.
//! - **Spreading**: replicas of one deployment go to workers holding the fewest of its replicas
//!   so far, so losing a worker loses as few of them as possible; on the chosen worker, to the
//!   slice holding the fewest of them, so one slice's fault (or its memory) is not all of them.
//! - **Packing**: among the slices holding equally few of the deployment's replicas, one the
//!   tenant already occupies is preferred over an empty one, keeping empty slices free for other
//!   tenants and the tenant's slice quota low.
//! - **Saying so**: when replicas of a deployment must share a slice (no other slice has room,
//!   or the tenant's slice quota is used up), [`Placer::colocation`] says why, and the plan
//!   records it as a `replicas_colocated` event.
//! - **Quotas**: a tenant may occupy at most its quota of slices per profile.
//! - **Health**: a slice its worker reports unhealthy (a critical Xid error or a lost GPU)
//!   takes no replicas; the ones it held are placed again elsewhere, like a lost worker's.
//! - **Lost workers** give back their replicas, which the caller places again.
//! - **Rollouts** place a new replica beside the old one with the same index when it fits
//!   ([`Placer::place_preferring`]).
//! - **Determinism**: ties break on worker id, then slice id; the same input gives the same
//!   placement.

pub mod bench;
pub mod plan;
pub mod run;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

pub use crate::tick::{Placement, SliceSpec, WorkerId};

/// Identifies a tenant.
pub type TenantId = String;

/// A worker and its slices.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    /// Worker id.
    pub id: WorkerId,
    /// Slices offered.
    pub slices: Vec<SliceSpec>,
}

/// One replica to place.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaRequest {
    /// Deployment the replica belongs to (spreading is per deployment).
    pub deployment: String,
    /// Replica index within the deployment.
    pub index: u32,
    /// Owning tenant.
    pub tenant: TenantId,
    /// Slice profile wanted.
    pub profile: String,
    /// Memory the replica needs, in bytes.
    pub memory_bytes: u64,
}

/// Why a replica could not be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// No worker offers a slice of this profile at all.
    #[error("no worker offers slice profile '{profile}'")]
    UnknownProfile {
        /// The profile asked for.
        profile: String,
    },
    /// The tenant already occupies its quota of slices of this profile.
    #[error("tenant '{tenant}' already uses its quota of {limit} '{profile}' slice(s)")]
    QuotaExceeded {
        /// Tenant.
        tenant: TenantId,
        /// Profile.
        profile: String,
        /// The quota.
        limit: usize,
    },
    /// Every slice of the profile is full or held by another tenant.
    #[error("no '{profile}' slice has {memory_bytes} bytes free for tenant '{tenant}'")]
    NoCapacity {
        /// Tenant.
        tenant: TenantId,
        /// Profile.
        profile: String,
        /// Memory asked for.
        memory_bytes: u64,
    },
}

/// A slice's current use.
#[derive(Debug, Clone)]
struct SliceState {
    spec: SliceSpec,
    tenant: Option<TenantId>,
    used_bytes: u64,
    replicas: Vec<(String, u32)>,
    /// Reported unhealthy by its worker: takes nothing.
    unhealthy: bool,
}

impl SliceState {
    /// Replicas of `deployment` on this slice.
    fn count_of(&self, deployment: &str) -> usize {
        self.replicas.iter().filter(|(d, _)| d == deployment).count()
    }

    fn fits(&self, replica: &ReplicaRequest) -> bool {
        !self.unhealthy
            && self.spec.profile == replica.profile
            && self.tenant.as_ref().is_none_or(|t| *t == replica.tenant)
            && self.spec.memory_bytes - self.used_bytes >= replica.memory_bytes
    }
}

#[derive(Debug, Clone)]
struct WorkerState {
    id: WorkerId,
    slices: Vec<SliceState>,
}

/// The placer: current occupancy plus quotas. Feed it the existing placements with
/// [`Placer::assign`], then [`Placer::place`] new replicas.
#[derive(Debug, Clone, Default)]
pub struct Placer {
    /// Sorted by worker id (determinism).
    workers: Vec<WorkerState>,
    /// Worker id -> index into `workers`.
    index: HashMap<WorkerId, usize>,
    /// Slices a tenant occupies, per profile.
    occupied: HashMap<(TenantId, String), usize>,
    /// Slice quota per (tenant, profile); absent = unlimited.
    quotas: HashMap<(TenantId, String), usize>,
    /// Replicas of each deployment per worker index.
    spread: HashMap<String, BTreeMap<usize, u32>>,
    /// Workers offering each profile (indices, ascending).
    by_profile: HashMap<String, Vec<usize>>,
}

impl Placer {
    /// A placer over these workers (order does not matter) with no replicas placed yet.
    pub fn new(mut workers: Vec<WorkerSpec>) -> Self {
        workers.sort_by(|a, b| a.id.cmp(&b.id));
        let mut placer = Placer::default();
        for (i, w) in workers.into_iter().enumerate() {
            let mut slices: Vec<SliceState> = w
                .slices
                .into_iter()
                .map(|spec| SliceState { spec, tenant: None, used_bytes: 0, replicas: Vec::new(), unhealthy: false })
                .collect();
            slices.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
            for s in &slices {
                let list = placer.by_profile.entry(s.spec.profile.clone()).or_default();
                if list.last() != Some(&i) {
                    list.push(i);
                }
            }
            placer.index.insert(w.id.clone(), i);
            placer.workers.push(WorkerState { id: w.id, slices });
        }
        placer
    }

    /// Marks a slice unhealthy: nothing is placed or recorded on it from now on. Call before
    /// [`Placer::assign`]ing existing replicas, so the ones on it come back for placement.
    pub fn set_unhealthy(&mut self, worker: &str, slice: &str) {
        let Some(&w) = self.index.get(worker) else { return };
        if let Some(s) = self.workers[w].slices.iter_mut().find(|s| s.spec.id == slice) {
            s.unhealthy = true;
        }
    }

    /// Sets a tenant's slice quota for a profile.
    pub fn set_quota(&mut self, tenant: &str, profile: &str, slices: usize) {
        self.quotas.insert((tenant.to_string(), profile.to_string()), slices);
    }

    /// Records a replica already running at `placement` (from the registry).
    pub fn assign(&mut self, replica: &ReplicaRequest, placement: &Placement) -> Result<(), ScheduleError> {
        let no_room = || ScheduleError::NoCapacity {
            tenant: replica.tenant.clone(),
            profile: replica.profile.clone(),
            memory_bytes: replica.memory_bytes,
        };
        let w = *self.index.get(&placement.worker).ok_or_else(no_room)?;
        let s = self.workers[w].slices.iter().position(|s| s.spec.id == placement.slice).ok_or_else(no_room)?;
        if !self.workers[w].slices[s].fits(replica) {
            return Err(no_room());
        }
        self.commit(w, s, replica);
        Ok(())
    }

    /// Places one replica, or says why it cannot be placed. Deterministic.
    pub fn place(&mut self, replica: &ReplicaRequest) -> Result<Placement, ScheduleError> {
        self.place_avoiding(replica, None)
    }

    /// Places one replica on any worker but `avoid` (one where it keeps failing), or says why
    /// it cannot be placed. Deterministic.
    pub fn place_avoiding(
        &mut self,
        replica: &ReplicaRequest,
        avoid: Option<&str>,
    ) -> Result<Placement, ScheduleError> {
        let avoid = avoid.and_then(|w| self.index.get(w).copied());
        let candidates = self
            .by_profile
            .get(&replica.profile)
            .ok_or_else(|| ScheduleError::UnknownProfile { profile: replica.profile.clone() })?;
        let key = (replica.tenant.clone(), replica.profile.clone());
        let quota_full =
            self.quotas.get(&key).is_some_and(|limit| self.occupied.get(&key).copied().unwrap_or(0) >= *limit);
        let spread = self.spread.get(&replica.deployment);
        // (deployment replicas on the worker, on the slice, !shares, worker, slice)
        let mut best: Option<(u32, usize, bool, usize, usize)> = None;
        for &w in candidates {
            if Some(w) == avoid {
                continue;
            }
            let load = spread.and_then(|m| m.get(&w)).copied().unwrap_or(0);
            if best.is_some_and(|b| b.0 < load) {
                continue; // cannot beat a less-loaded worker already found
            }
            let Some((s, on_slice, shares)) = self.pick_slice(w, replica, quota_full) else { continue };
            let candidate = (load, on_slice, !shares, w, s);
            if best.is_none_or(|b| candidate < b) {
                best = Some(candidate);
            }
            if load == 0 && shares {
                break; // nothing beats an empty-of-this-deployment worker with a shared slice
            }
        }
        let Some((_, _, _, w, s)) = best else {
            if quota_full {
                let limit = self.quotas.get(&key).copied().unwrap_or(0);
                return Err(ScheduleError::QuotaExceeded {
                    tenant: replica.tenant.clone(),
                    profile: replica.profile.clone(),
                    limit,
                });
            }
            return Err(ScheduleError::NoCapacity {
                tenant: replica.tenant.clone(),
                profile: replica.profile.clone(),
                memory_bytes: replica.memory_bytes,
            });
        };
        self.commit(w, s, replica);
        Ok(Placement { worker: self.workers[w].id.clone(), slice: self.workers[w].slices[s].spec.id.clone() })
    }

    /// Places one replica on `preferred` when it fits there (a rollout's new replica beside the
    /// old one it replaces, so the worker keeps its cache and the slice its tenant), else like
    /// [`Placer::place`].
    pub fn place_preferring(
        &mut self,
        replica: &ReplicaRequest,
        preferred: Option<&Placement>,
    ) -> Result<Placement, ScheduleError> {
        if let Some(p) = preferred
            && let Some(&w) = self.index.get(&p.worker)
            && let Some(s) = self.workers[w].slices.iter().position(|s| s.spec.id == p.slice)
        {
            let slice = &self.workers[w].slices[s];
            let key = (replica.tenant.clone(), replica.profile.clone());
            let quota_full =
                self.quotas.get(&key).is_some_and(|limit| self.occupied.get(&key).copied().unwrap_or(0) >= *limit);
            if slice.fits(replica) && (slice.tenant.is_some() || !quota_full) {
                self.commit(w, s, replica);
                return Ok(p.clone());
            }
        }
        self.place(replica)
    }

    /// The best slice on worker `w`: the one holding the fewest replicas of the deployment,
    /// then one the tenant already holds over an empty one (none when the tenant's quota is
    /// used up), then the first. Returns the slice, the deployment's replicas on it and whether
    /// it is shared with the tenant.
    fn pick_slice(&self, w: usize, replica: &ReplicaRequest, quota_full: bool) -> Option<(usize, usize, bool)> {
        self.workers[w]
            .slices
            .iter()
            .enumerate()
            .filter(|(_, s)| s.fits(replica))
            .filter_map(|(i, s)| {
                let held = s.tenant.is_some();
                (held || !quota_full).then(|| (s.count_of(&replica.deployment), !held, i))
            })
            .min()
            .map(|(on_slice, not_held, i)| (i, on_slice, !not_held))
    }

    /// Why `replica`, just placed at `placement`, shares its slice with other replicas of its
    /// deployment, or `None` when it does not. Replicas with the same index (a rollout's new
    /// replica beside the old one it replaces) do not count as sharing.
    pub fn colocation(&self, replica: &ReplicaRequest, placement: &Placement) -> Option<String> {
        let &w = self.index.get(&placement.worker)?;
        let slice = self.workers[w].slices.iter().find(|s| s.spec.id == placement.slice)?;
        let mut indices: Vec<u32> =
            slice.replicas.iter().filter(|(d, _)| *d == replica.deployment).map(|(_, i)| *i).collect();
        indices.sort_unstable();
        indices.dedup();
        if indices.len() < 2 {
            return None;
        }
        let key = (replica.tenant.clone(), replica.profile.clone());
        let why = match self.quotas.get(&key) {
            Some(limit) if self.occupied.get(&key).copied().unwrap_or(0) >= *limit => {
                format!("the tenant's quota of {limit} '{}' slice(s) is in use", replica.profile)
            }
            _ => format!(
                "no '{}' slice with {} bytes free for the tenant holds fewer of them",
                replica.profile, replica.memory_bytes
            ),
        };
        Some(format!(
            "{} replicas share slice {} on worker {}: {why}",
            indices.len(),
            placement.slice,
            placement.worker
        ))
    }

    fn commit(&mut self, w: usize, s: usize, replica: &ReplicaRequest) {
        let slice = &mut self.workers[w].slices[s];
        if slice.tenant.is_none() {
            slice.tenant = Some(replica.tenant.clone());
            *self.occupied.entry((replica.tenant.clone(), replica.profile.clone())).or_default() += 1;
        }
        slice.used_bytes += replica.memory_bytes;
        slice.replicas.push((replica.deployment.clone(), replica.index));
        *self.spread.entry(replica.deployment.clone()).or_default().entry(w).or_default() += 1;
    }

    /// Removes a lost worker; returns its replicas `(deployment, index)` for re-placement.
    pub fn remove_worker(&mut self, worker: &str) -> Vec<(String, u32)> {
        let Some(&w) = self.index.get(worker) else { return Vec::new() };
        let mut lost = Vec::new();
        for slice in &mut self.workers[w].slices {
            if let Some(tenant) = slice.tenant.take()
                && let Some(n) = self.occupied.get_mut(&(tenant, slice.spec.profile.clone()))
            {
                *n = n.saturating_sub(1);
            }
            slice.used_bytes = 0;
            lost.append(&mut slice.replicas);
        }
        for counts in self.spread.values_mut() {
            counts.remove(&w);
        }
        for list in self.by_profile.values_mut() {
            list.retain(|i| *i != w);
        }
        lost.sort();
        lost
    }
}
