//! What a deployment looks like to its owners: its settings, state, traffic split and every
//! replica with its worker's endpoints, assembled from the registry for the list and the
//! single reads (and the answers to changes).
//!
//! A page of deployments takes three queries whatever its length: the workers, the replicas of
//! every deployment on the page, and the sizes of their target versions.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::memory::replica_memory;
use super::state::deployment_state;
use crate::capture::CaptureSettings;
use crate::error::Result;
use crate::registry::{Conn, DeploymentRow, ReplicaRow, ServingReplica, WorkerRow, traffic_split};
use crate::states::{DeploymentState, ReplicaState};

/// Most preferred batch sizes.
pub const MAX_PREFERRED_SIZES: usize = 16;
/// Largest batch size (Triton's `int32`).
pub const MAX_BATCH: i64 = i32::MAX as i64;

/// Triton's dynamic batcher settings for the deployment's model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DynamicBatching {
    /// Longest a request waits for a batch to fill, in microseconds (at most 60 s).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 60_000_000)]
    pub max_queue_delay_microseconds: i64,
    /// Batch sizes the batcher prefers to form: at most 16, each 1 to 2^31-1 and at most
    /// `max_batch_size` when that is set.
    #[serde(default)]
    #[schema(schema_with = preferred_sizes_schema)]
    pub preferred_batch_size: Vec<i64>,
}

/// The schema of [`DynamicBatching::preferred_batch_size`].
fn preferred_sizes_schema() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, KnownFormat, ObjectBuilder, SchemaFormat, Type};
    let size = ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .minimum(Some(1))
        .maximum(Some(MAX_BATCH));
    ArrayBuilder::new()
        .items(size)
        .max_items(Some(MAX_PREFERRED_SIZES))
        .description(Some("Batch sizes the batcher prefers to form: each at most `max_batch_size` when that is set."))
        .build()
}

/// One replica's status.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReplicaStatus {
    /// Replica id.
    pub id: Uuid,
    /// Index within the deployment (a rollout's new replica has its old one's index).
    pub index: i64,
    /// Version it runs.
    pub version: i64,
    /// Worker, once placed.
    pub worker_id: Option<String>,
    /// The worker's KServe HTTP endpoint.
    pub http_endpoint: Option<String>,
    /// The worker's KServe gRPC endpoint.
    pub grpc_endpoint: Option<String>,
    /// Slice on the worker.
    pub slice_id: Option<String>,
    /// Where it is in its life.
    pub state: ReplicaState,
    /// Why it is pending or failed.
    pub reason: Option<String>,
    /// Whether requests without a version reach it: only ever while it is `ready` (a failed
    /// replica serves nothing).
    pub serving: bool,
    /// A replica of the canary (indexed apart from the stable replicas).
    pub canary: bool,
    /// Last change.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// One version's share of the deployment's unversioned traffic.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TrafficShare {
    /// Model version.
    pub version: i64,
    /// Percent of unversioned requests it gets (the shares sum to 100).
    pub weight: i64,
    /// Whether this is the canary.
    pub canary: bool,
    /// Its replicas that are ready and serving.
    pub ready_replicas: i64,
    /// Its replicas wanted.
    pub replicas: i64,
}

/// A deployment's canary as set.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CanaryStatus {
    /// The canary's version.
    pub version: i64,
    /// Percent of unversioned traffic it gets (1 to 99) once a replica is ready.
    pub weight: i64,
    /// Its replicas wanted.
    pub replicas: i64,
}

/// Where applications call a deployed model: the gateways' address for it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct InferenceEndpoint {
    /// KServe v2 HTTP base of the model, e.g. `https://infer.example.com/v2/models/mlp`
    /// (append `/infer`, `/ready`, `/versions/{v}/infer`, ...).
    pub http: String,
    /// KServe v2 gRPC address (`host:port`), when the control plane knows it.
    pub grpc: Option<String>,
    /// The model name requests use.
    pub model: String,
}

/// A deployment and its replicas.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Deployment {
    /// Id.
    pub id: Uuid,
    /// Name.
    pub name: String,
    /// Model name.
    pub model: String,
    /// Target version.
    pub version: i64,
    /// Alias followed, if any.
    pub alias: Option<String>,
    /// Where applications call the model through the gateways (`null` when the control plane
    /// was started without `--gateway-url`).
    pub endpoint: Option<InferenceEndpoint>,
    /// Highest stable (not canary) version ready and serving, if any.
    pub serving_version: Option<i64>,
    /// How unversioned traffic splits between the stable version (the one serving now) and the
    /// canary, with each one's replicas; one entry with weight 100 without a canary. The
    /// canary's share is as set: a gateway sends it nothing until one of its replicas is ready.
    pub traffic: Vec<TrafficShare>,
    /// The canary, if one is set (`null` also while a promoted one rolls out to the stable
    /// replicas: `traffic` still shows its share until they serve it).
    pub canary: Option<CanaryStatus>,
    /// Slice profile.
    pub profile: String,
    /// Replicas wanted.
    pub replicas: i64,
    /// Model instances per replica.
    pub instance_count: i64,
    /// Max batch size, if set.
    pub max_batch_size: Option<i64>,
    /// Dynamic batching, if set.
    pub dynamic_batching: Option<DynamicBatching>,
    /// Memory per replica (given, or the default for the target version).
    pub memory_bytes: i64,
    /// Request/response capture, if ever set.
    pub capture: Option<CaptureSettings>,
    /// `pending` (a replica cannot be placed yet), `progressing`, `ready` or `failed`.
    pub state: DeploymentState,
    /// Every replica, old and new, by index.
    pub replica_status: Vec<ReplicaStatus>,
    /// In the answer to a change only: what the change did that the caller may not expect,
    /// e.g. that pinning a version stopped following an alias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
    /// Created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last changed.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// Where applications reach deployed models through the gateways, as configured (both
/// `None` without `--gateway-url`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Gateway<'a> {
    /// The gateways' HTTP base URL.
    pub url: Option<&'a str>,
    /// The gateways' gRPC address.
    pub grpc_address: Option<&'a str>,
}

/// The statuses of deployments of one tenant, in the order given, in three queries whatever
/// their number (none for no deployments).
pub async fn statuses(
    conn: &mut Conn,
    gateway: Gateway<'_>,
    tenant_id: Uuid,
    rows: Vec<DeploymentRow>,
) -> Result<Vec<Deployment>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let workers: HashMap<String, WorkerRow> = conn.workers().await?.into_iter().map(|w| (w.id.clone(), w)).collect();
    let ids: Vec<Uuid> = rows.iter().map(|d| d.id).collect();
    let mut replicas: HashMap<Uuid, Vec<ReplicaRow>> = HashMap::new();
    for r in conn.replicas_of(tenant_id, &ids).await? {
        replicas.entry(r.deployment_id).or_default().push(r);
    }
    let targets: Vec<(Uuid, i64)> = rows.iter().map(|d| (d.model_id, d.version)).collect();
    let sizes = conn.version_sizes(tenant_id, &targets).await?;
    let statuses = rows.into_iter().map(|d| {
        let size = sizes.get(&(d.model_id, d.version)).copied().unwrap_or(0);
        let replicas = replicas.remove(&d.id).unwrap_or_default();
        status(d, replicas, size, &workers, gateway)
    });
    Ok(statuses.collect())
}

/// One deployment's status from its row, its replicas, its target version's artifact size and
/// the workers.
fn status(
    d: DeploymentRow,
    replicas: Vec<ReplicaRow>,
    size: i64,
    workers: &HashMap<String, WorkerRow>,
    gateway: Gateway<'_>,
) -> Deployment {
    // "Ready" waits until each worker has applied the set that last changed this deployment on
    // it: before that, unversioned requests may still reach what the worker served before the
    // switch. Later sets (another deployment's, a capture change) are no reason to wait.
    let applied = |r: &ReplicaRow| {
        let worker = r.worker_id.as_ref().and_then(|w| workers.get(w));
        worker.is_some_and(|w| w.applied_generation >= r.assigned_generation)
    };
    let (state, serving_version) = deployment_state(&d, &replicas, applied);
    let traffic = traffic_split((&d).into(), &ServingReplica::of(&replicas), false)
        .into_iter()
        .map(|s| TrafficShare {
            version: s.version,
            weight: s.weight,
            canary: s.canary,
            ready_replicas: s.ready_replicas,
            replicas: s.replicas,
        })
        .collect();
    let canary = d.canary_version.filter(|v| *v != d.version).map(|version| CanaryStatus {
        version,
        weight: d.canary_weight,
        replicas: d.canary_replicas,
    });
    let replica_status = replicas.into_iter().map(|r| replica_status(r, workers)).collect();
    let dynamic_batching = d.dynamic_batching.and_then(|j| serde_json::from_value(j.0).ok());
    let capture = CaptureSettings::stored(d.capture.as_ref().map(|j| &j.0));
    let endpoint = gateway.url.map(|url| InferenceEndpoint {
        http: format!("{url}/v2/models/{}", url_segment(&d.model_name)),
        grpc: gateway.grpc_address.map(str::to_string),
        model: d.model_name.clone(),
    });
    Deployment {
        endpoint,
        id: d.id,
        memory_bytes: replica_memory(d.memory_bytes, size),
        name: d.name,
        model: d.model_name,
        version: d.version,
        alias: d.alias,
        serving_version,
        traffic,
        canary,
        profile: d.profile,
        replicas: d.replicas,
        instance_count: d.instance_count,
        max_batch_size: d.max_batch_size,
        dynamic_batching,
        capture,
        state,
        replica_status,
        notice: None,
        created_at: d.created_at,
        updated_at: d.updated_at,
    }
}

/// A replica as shown, with its worker's endpoints once placed.
fn replica_status(r: ReplicaRow, workers: &HashMap<String, WorkerRow>) -> ReplicaStatus {
    let worker = r.worker_id.as_ref().and_then(|w| workers.get(w));
    ReplicaStatus {
        id: r.id,
        index: r.replica_index,
        version: r.version,
        http_endpoint: worker.map(|w| w.http_endpoint.clone()),
        grpc_endpoint: worker.map(|w| w.grpc_endpoint.clone()),
        worker_id: r.worker_id,
        slice_id: r.slice_id,
        state: r.state,
        reason: r.reason,
        serving: r.state.serves(r.serving),
        canary: r.canary,
        updated_at: r.updated_at,
    }
}

/// A path segment with everything but unreserved characters percent-encoded.
fn url_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
