//! What one scheduler tick reads and decides, as plain data: the [`Snapshot`] of workers,
//! deployments, versions and replicas, and the [`Plan`] of changes. The registry reads the one
//! and applies the other ([`crate::registry::Conn::scheduling_snapshot`]), the scheduler
//! computes the plan ([`crate::scheduler::plan`]); the types live here, apart from both, so
//! that storage does not depend on the placer, nor the placer on storage.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::states::ReplicaState;

/// Identifies a worker.
pub type WorkerId = String;

/// A slice a worker offers.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceSpec {
    /// Slice id, unique within the worker (e.g. `cpu-0`, `MIG-<uuid>`).
    pub id: String,
    /// Profile name (`cpu`, `gpu`, `mig-1g.10gb`, ...).
    pub profile: String,
    /// Memory the slice can hold, in bytes.
    pub memory_bytes: u64,
}

/// Where a replica went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Worker chosen.
    pub worker: WorkerId,
    /// Slice chosen on it.
    pub slice: String,
}

/// A worker as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    /// Worker id.
    pub id: String,
    /// `ready` or `lost`.
    pub state: String,
    /// Last heartbeat.
    pub last_heartbeat_at: OffsetDateTime,
    /// Slices offered.
    pub slices: Vec<SliceSpec>,
    /// Slices the worker reports unhealthy, with why: they take no replicas.
    pub unhealthy_slices: BTreeMap<String, String>,
}

/// A deployment as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct DeploymentInfo {
    /// Id.
    pub id: Uuid,
    /// Tenant.
    pub tenant_id: Uuid,
    /// Model name (the name clients use).
    pub model_name: String,
    /// Model id.
    pub model_id: Uuid,
    /// Target version as stored.
    pub version: i64,
    /// Alias followed, if any.
    pub alias: Option<String>,
    /// Where the alias points now (`None`: no alias, or the alias is gone).
    pub alias_version: Option<i64>,
    /// Spec generation.
    pub spec_generation: i64,
    /// Slice profile.
    pub profile: String,
    /// Replicas wanted.
    pub replicas: i64,
    /// Model instances per replica.
    pub instance_count: i64,
    /// Max batch size, if set.
    pub max_batch_size: Option<i64>,
    /// Dynamic batching settings, if set.
    pub dynamic_batching: Option<Value>,
    /// Memory per replica, if set.
    pub memory_bytes: Option<i64>,
    /// The canary's version, if the deployment has a canary.
    pub canary_version: Option<i64>,
    /// Canary replicas wanted (0 without a canary).
    pub canary_replicas: i64,
}

/// What the scheduler needs of a model version.
#[derive(Debug, Clone)]
pub struct VersionInfo {
    /// Artifact size, with the composing versions' for an ensemble (what a replica loads).
    pub size_bytes: i64,
    /// Stored model config, if any.
    pub config: Option<Value>,
}

/// A replica as the scheduler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaInfo {
    /// Id.
    pub id: Uuid,
    /// Deployment.
    pub deployment_id: Uuid,
    /// Index within the deployment.
    pub index: i64,
    /// Version.
    pub version: i64,
    /// Spec generation it was made for.
    pub spec_generation: i64,
    /// Slice profile.
    pub profile: String,
    /// Memory it needs.
    pub memory_bytes: i64,
    /// Worker, if placed.
    pub worker_id: Option<String>,
    /// Slice, if placed.
    pub slice_id: Option<String>,
    /// Registry state.
    pub state: ReplicaState,
    /// Why it is pending or failed.
    pub reason: Option<String>,
    /// Times it was moved off a worker where its runner kept dying (0 once ready).
    pub crash_moves: i64,
    /// Whether unversioned requests reach it.
    pub serving: bool,
    /// End of its drain.
    pub drain_until: Option<OffsetDateTime>,
    /// A canary replica (indexed and rolled apart from the stable ones).
    pub canary: bool,
}

/// Everything one tick looks at.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Workers.
    pub workers: Vec<WorkerInfo>,
    /// Deployments.
    pub deployments: Vec<DeploymentInfo>,
    /// Versions of deployed models, by (model id, version).
    pub versions: HashMap<(Uuid, i64), VersionInfo>,
    /// Replicas.
    pub replicas: Vec<ReplicaInfo>,
    /// Slice quotas per tenant and profile.
    pub slice_quotas: HashMap<Uuid, BTreeMap<String, i64>>,
}

/// A replica to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewReplica {
    /// Id.
    pub id: Uuid,
    /// Tenant.
    pub tenant_id: Uuid,
    /// Deployment.
    pub deployment_id: Uuid,
    /// Index.
    pub index: i64,
    /// Version.
    pub version: i64,
    /// Spec generation.
    pub spec_generation: i64,
    /// Profile.
    pub profile: String,
    /// Memory.
    pub memory_bytes: i64,
    /// Rendered model config.
    pub config: Value,
    /// Placement, or why there is none.
    pub placement: Result<Placement, String>,
    /// Serving from the start (no rollout in progress).
    pub serving: bool,
    /// A canary replica.
    pub canary: bool,
}

/// A change to an existing replica.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplicaChange {
    /// Placed (or moved) onto a worker's slice: state `scheduled`.
    Place {
        /// Replica.
        id: Uuid,
        /// Where.
        placement: Placement,
    },
    /// Moved off a worker where its runner keeps dying: state `scheduled`, one more crash move.
    MoveOffCrashLoop {
        /// Replica.
        id: Uuid,
        /// Where.
        placement: Placement,
    },
    /// Crash-looping wherever it went: it stays where it is, and this is noted once.
    StayInCrashLoop {
        /// Replica.
        id: Uuid,
    },
    /// Cannot be placed: state `pending` with the reason, no worker.
    Unplaced {
        /// Replica.
        id: Uuid,
        /// Why.
        reason: String,
    },
    /// Starts serving.
    Serve {
        /// Replica.
        id: Uuid,
    },
    /// Stops serving and drains until `until`.
    Drain {
        /// Replica.
        id: Uuid,
        /// End of the drain.
        until: OffsetDateTime,
    },
    /// Removed.
    Delete {
        /// Replica.
        id: Uuid,
    },
}

/// An event to record.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedEvent {
    /// Tenant.
    pub tenant_id: Uuid,
    /// Deployment.
    pub deployment_id: Uuid,
    /// Kind (`placed`, `unplaceable`, `worker_lost`, `rollout_started`, ...).
    pub kind: &'static str,
    /// Replica concerned.
    pub replica_id: Option<Uuid>,
    /// Worker concerned.
    pub worker_id: Option<String>,
    /// Human-readable detail.
    pub message: String,
}

/// What one tick decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Workers to mark lost.
    pub lost_workers: Vec<String>,
    /// Deployments whose target version moves (alias moved).
    pub retarget: Vec<(Uuid, i64)>,
    /// Deployments whose promoted canary is done: the stable replicas run its version, so the
    /// canary is cleared (its replicas drain in the same plan).
    pub clear_canary: Vec<Uuid>,
    /// Replicas to create.
    pub inserts: Vec<NewReplica>,
    /// Changes to existing replicas.
    pub changes: Vec<ReplicaChange>,
    /// Events.
    pub events: Vec<PlannedEvent>,
}

impl Plan {
    /// Whether the plan changes nothing.
    pub fn is_empty(&self) -> bool {
        self.lost_workers.is_empty()
            && self.retarget.is_empty()
            && self.clear_canary.is_empty()
            && self.inserts.is_empty()
            && self.changes.is_empty()
            && self.events.is_empty()
    }
}
