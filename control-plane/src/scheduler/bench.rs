//! Fixtures of `tessera bench placement`: synthetic fleets and deployments for timing the
//! placer alone and a whole scheduler tick. Kept out of the placer's and the planner's modules.

use std::collections::BTreeMap;
use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use super::plan::{self, DeploymentInfo, Settings, Snapshot, WorkerInfo};
use super::{Placer, ReplicaRequest, SliceSpec, WorkerSpec};
use crate::states::WorkerState;

/// Places `replicas` replicas (`replicas / 20` deployments of 20, 100 tenants) on `workers`
/// workers of `slices` CPU slices each; returns how many were placed and the time it took.
pub fn placement(workers: usize, slices: usize, replicas: u32) -> (usize, std::time::Duration) {
    let specs = (0..workers)
        .map(|i| WorkerSpec {
            id: format!("w{i:05}"),
            slices: (0..slices)
                .map(|s| SliceSpec { id: format!("cpu-{s}"), profile: "cpu".into(), memory_bytes: 16 << 30 })
                .collect(),
        })
        .collect();
    let requests: Vec<ReplicaRequest> = (0..replicas)
        .map(|i| ReplicaRequest {
            deployment: format!("dep{}", i % (replicas / 20).max(1)),
            index: i,
            tenant: format!("tenant{}", i % 100),
            profile: "cpu".into(),
            memory_bytes: 1 << 30,
        })
        .collect();
    let start = std::time::Instant::now();
    let mut placer = Placer::new(specs);
    let placed = requests.iter().filter(|r| placer.place(r).is_ok()).count();
    (placed, start.elapsed())
}

/// Times one whole scheduler tick ([`plan::plan`]: placement, rendered configs, events) that places
/// `replicas` new replicas (deployments of 20, 100 tenants, 1 GiB each) on `workers` workers of
/// `slices` 16 GiB CPU slices; returns how many were placed and the time it took.
pub fn tick(workers: usize, slices: usize, replicas: u32) -> (usize, std::time::Duration) {
    let at = OffsetDateTime::now_utc();
    let snapshot = Snapshot {
        workers: (0..workers)
            .map(|i| WorkerInfo {
                id: format!("w{i:05}"),
                state: WorkerState::Ready.as_str().into(),
                last_heartbeat_at: at,
                slices: (0..slices)
                    .map(|s| SliceSpec { id: format!("cpu-{s}"), profile: "cpu".into(), memory_bytes: 16 << 30 })
                    .collect(),
                unhealthy_slices: BTreeMap::new(),
            })
            .collect(),
        deployments: (0..replicas.div_ceil(20))
            .map(|i| DeploymentInfo {
                id: Uuid::from_u128(u128::from(i) + 1),
                tenant_id: Uuid::from_u128(u128::from(i % 100) + 1 + (1 << 64)),
                model_name: format!("m{i}"),
                model_id: Uuid::from_u128(u128::from(i) + 1 + (2 << 64)),
                version: 1,
                alias: None,
                alias_version: None,
                spec_generation: 1,
                profile: "cpu".into(),
                replicas: i64::from(20.min(replicas - i * 20)),
                instance_count: 1,
                max_batch_size: None,
                dynamic_batching: None,
                memory_bytes: Some(1 << 30),
                canary_version: None,
                canary_replicas: 0,
            })
            .collect(),
        ..Snapshot::default()
    };
    let settings = Settings { lost_after: Duration::from_secs(10), drain: Duration::from_secs(3), leader_since: None };
    let mut n = 0u128;
    let mut new_id = || {
        n += 1;
        Uuid::from_u128((3 << 64) + n)
    };
    let started = std::time::Instant::now();
    let decided = plan::plan(&snapshot, at, &settings, &mut new_id);
    let took = started.elapsed();
    (decided.inserts.iter().filter(|r| r.placement.is_ok()).count(), took)
}
