//! A deployment's state as its owners see it (`pending`, `progressing`, `ready`, `failed`)
//! and the version serving now, derived from its replicas.

use crate::registry::{DeploymentRow, ReplicaRow};
use crate::states::{DeploymentState, ReplicaState};

/// The deployment's state and serving version, from its stable (not canary) replicas:
/// `failed` if a replica of the target failed, `pending` if one cannot be placed (or none exist
/// yet), `ready` when all target replicas are ready and serving on workers that `applied` their
/// assignments, else `progressing`. The canary's replicas show in `traffic` instead.
pub fn deployment_state(
    d: &DeploymentRow,
    replicas: &[ReplicaRow],
    applied: impl Fn(&ReplicaRow) -> bool,
) -> (DeploymentState, Option<i64>) {
    let serving_version = replicas.iter().filter(|r| !r.canary && r.state.serves(r.serving)).map(|r| r.version).max();
    let current: Vec<&ReplicaRow> = replicas
        .iter()
        .filter(|r| {
            !r.canary
                && r.version == d.version
                && r.spec_generation == d.spec_generation
                && r.state != ReplicaState::Draining
        })
        .collect();
    let state = if current.iter().any(|r| r.state == ReplicaState::Failed) {
        DeploymentState::Failed
    } else if current.iter().any(|r| r.state == ReplicaState::Pending) || (current.is_empty() && d.replicas > 0) {
        DeploymentState::Pending
    } else if current.len() as i64 == d.replicas && current.iter().all(|r| r.state.serves(r.serving) && applied(r)) {
        DeploymentState::Ready
    } else {
        DeploymentState::Progressing
    };
    (state, serving_version)
}

#[cfg(test)]
mod tests {
    use sqlx::types::Json as SqlJson;
    use time::OffsetDateTime;
    use uuid::Uuid;

    use super::*;

    fn replica(version: i64, state: ReplicaState, serving: bool) -> ReplicaRow {
        ReplicaRow {
            id: Uuid::now_v7(),
            tenant_id: Uuid::nil(),
            deployment_id: Uuid::nil(),
            replica_index: 0,
            version,
            spec_generation: 1,
            profile: "cpu".into(),
            memory_bytes: 1,
            config: SqlJson(serde_json::json!({})),
            worker_id: None,
            slice_id: None,
            state,
            reason: None,
            serving,
            drain_until: None,
            crash_moves: 0,
            canary: false,
            assigned_generation: 1,
            created_at: OffsetDateTime::UNIX_EPOCH,
            updated_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    fn deployment(version: i64, replicas: i64) -> DeploymentRow {
        DeploymentRow {
            id: Uuid::nil(),
            tenant_id: Uuid::nil(),
            name: "d".into(),
            model_id: Uuid::nil(),
            model_name: "m".into(),
            version,
            alias: None,
            profile: "cpu".into(),
            replicas,
            instance_count: 1,
            max_batch_size: None,
            dynamic_batching: None,
            memory_bytes: None,
            capture: None,
            spec_generation: 1,
            canary_version: None,
            canary_weight: 0,
            canary_replicas: 0,
            created_by: None,
            created_at: OffsetDateTime::UNIX_EPOCH,
            updated_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn states_follow_the_replicas() {
        assert_eq!(deployment_state(&deployment(1, 1), &[], |_| true), (DeploymentState::Pending, None));
        assert_eq!(
            deployment_state(&deployment(1, 1), &[replica(1, ReplicaState::Loading, true)], |_| true),
            (DeploymentState::Progressing, None)
        );
        assert_eq!(
            deployment_state(&deployment(1, 1), &[replica(1, ReplicaState::Ready, true)], |_| true),
            (DeploymentState::Ready, Some(1))
        );
        // A rollout: v1 serves while v2 loads, then v2 fails.
        let rolling = [replica(1, ReplicaState::Ready, true), replica(2, ReplicaState::Loading, false)];
        assert_eq!(deployment_state(&deployment(2, 1), &rolling, |_| true), (DeploymentState::Progressing, Some(1)));
        let failed = [replica(1, ReplicaState::Ready, true), replica(2, ReplicaState::Failed, false)];
        assert_eq!(deployment_state(&deployment(2, 1), &failed, |_| true), (DeploymentState::Failed, Some(1)));
        let switched = [replica(1, ReplicaState::Draining, false), replica(2, ReplicaState::Ready, true)];
        assert_eq!(deployment_state(&deployment(2, 1), &switched, |_| true), (DeploymentState::Ready, Some(2)));
        assert_eq!(deployment_state(&deployment(1, 0), &[], |_| true), (DeploymentState::Ready, None));
        // Not ready until the worker applied the set that made the replica serve.
        let ready = [replica(1, ReplicaState::Ready, true)];
        assert_eq!(deployment_state(&deployment(1, 1), &ready, |_| false), (DeploymentState::Progressing, Some(1)));
        // A serving replica that fails serves nothing: no serving version, and the deployment
        // is failed rather than ready.
        let broken = [replica(1, ReplicaState::Failed, true)];
        assert_eq!(deployment_state(&deployment(1, 1), &broken, |_| true), (DeploymentState::Failed, None));
    }
}
