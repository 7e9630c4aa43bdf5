//! The canary track of a deployment: replicas of a second version that take a weighted share of
//! unversioned traffic (the gateway splits it; see `registry::canary`).
//!
//! - While `canary_version` is set, the deployment wants `canary_replicas` replicas of
//!   `(canary_version, spec_generation)`, marked `canary`, indexed `0..canary_replicas`, with the
//!   stable replicas' profile, instances and batching, and memory sized for the canary's artifact.
//! - A canary replica serves as soon as it is ready (each on its own: there is nothing to switch
//!   from, the weight decides its share).
//! - Canary replicas of another key (the canary moved to another version or spec) keep serving
//!   until every current one is ready, then drain; with no canary wanted (rolled back) they
//!   drain at once, like a rollout's old replicas.
//! - A promotion makes the canary version the stable target and leaves the canary set: the
//!   stable replicas roll out as usual while the canary keeps its share, and once they all serve
//!   the canary version the canary is cleared and its replicas drain.

use std::collections::BTreeMap;

use time::OffsetDateTime;
use uuid::Uuid;

use super::{
    DeploymentInfo, Placement, Plan, PlannedEvent, ReplicaChange, ReplicaInfo, Settings, Snapshot, Sorted, Start,
    sort_out, start_replicas,
};
use crate::states::ReplicaState;

/// What the canary track needs to know of the stable one.
pub(super) struct Track {
    /// The stable target version this tick (after an alias move).
    pub target: i64,
    /// Every stable replica of the target is ready and serving, with nothing rolling.
    pub stable_settled: bool,
    /// The tick's time.
    pub now: OffsetDateTime,
}

/// Decides a deployment's canary replicas; returns the ones kept and the indices of the ones
/// created in `out.inserts` (with the placement to prefer), like the stable track.
pub(super) fn decide<'a>(
    d: &DeploymentInfo,
    replicas: Vec<&'a ReplicaInfo>,
    track: Track,
    snapshot: &Snapshot,
    settings: &Settings,
    new_id: &mut dyn FnMut() -> Uuid,
    out: &mut Plan,
) -> (Vec<&'a ReplicaInfo>, Vec<(usize, Option<Placement>)>) {
    let event = |kind: &'static str, message: String| PlannedEvent {
        tenant_id: d.tenant_id,
        deployment_id: d.id,
        kind,
        replica_id: None,
        worker_id: None,
        message,
    };
    let mut canary_version = d.canary_version;
    if canary_version == Some(track.target) && track.stable_settled {
        // A promotion is done: the stable replicas now run the canary's version.
        out.clear_canary.push(d.id);
        let message = format!("version {} promoted: the stable replicas serve it; canary replicas drain", track.target);
        out.events.push(event("canary_cleared", message));
        canary_version = None;
    }
    let wanted = canary_version.map_or(0, |_| d.canary_replicas.max(0));
    // No canary: no key matches, so every canary replica is old.
    let key = canary_version.map_or((i64::MIN, i64::MIN), |v| (v, d.spec_generation));
    let Sorted { current, mut old_serving, mut draining } = sort_out(d, replicas, key, wanted, track.now, out);
    let created = create_missing(d, &current, &old_serving, key.0, wanted, snapshot, new_id, out);
    serve_ready(d, &current, out);
    let all_ready = created.is_empty()
        && current.len() as i64 == wanted
        && current.values().all(|r| r.state == ReplicaState::Ready);
    if all_ready && !old_serving.is_empty() {
        let until = track.now + settings.drain;
        for r in &old_serving {
            out.changes.push(ReplicaChange::Drain { id: r.id, until });
        }
        let versions: Vec<String> = old_serving.iter().map(|r| r.version.to_string()).collect();
        let message = format!("{} canary replica(s) of version {} draining", old_serving.len(), versions.join(", "));
        out.events.push(event("canary_draining", message));
        draining.append(&mut old_serving);
    }
    let mut kept: Vec<&ReplicaInfo> = current.into_values().collect();
    kept.extend(old_serving);
    kept.extend(draining);
    (kept, created)
}

/// Creates the canary replicas missing from `current`, not serving until ready, each preferring
/// the place of the old canary replica with its index.
#[allow(clippy::too_many_arguments)]
fn create_missing(
    d: &DeploymentInfo,
    current: &BTreeMap<i64, &ReplicaInfo>,
    old_serving: &[&ReplicaInfo],
    version: i64,
    wanted: i64,
    snapshot: &Snapshot,
    new_id: &mut dyn FnMut() -> Uuid,
    out: &mut Plan,
) -> Vec<(usize, Option<Placement>)> {
    let missing: Vec<i64> = (0..wanted).filter(|i| !current.contains_key(i)).collect();
    if missing.is_empty() {
        return Vec::new();
    }
    if current.is_empty() {
        out.events.push(PlannedEvent {
            tenant_id: d.tenant_id,
            deployment_id: d.id,
            kind: "canary_started",
            replica_id: None,
            worker_id: None,
            message: format!("starting {} canary replica(s) of version {version}", missing.len()),
        });
    }
    let version_info = snapshot.versions.get(&(d.model_id, version));
    start_replicas(d, version_info, version, missing, old_serving, Start::Canary, new_id, out)
}

/// Current canary replicas serve once ready, each on its own.
fn serve_ready(d: &DeploymentInfo, current: &BTreeMap<i64, &ReplicaInfo>, out: &mut Plan) {
    for r in current.values().filter(|r| r.state == ReplicaState::Ready && !r.serving) {
        out.changes.push(ReplicaChange::Serve { id: r.id });
        out.events.push(PlannedEvent {
            tenant_id: d.tenant_id,
            deployment_id: d.id,
            kind: "canary_serving",
            replica_id: Some(r.id),
            worker_id: r.worker_id.clone(),
            message: format!("canary replica {} of version {} serving", r.index, r.version),
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{deployment, now, replica, run, settings, snapshot, tenant, worker};
    use super::super::{VersionInfo, plan};
    use super::*;

    /// Deployment 1 of tenant 1: `replicas` stable replicas of `version`, and a canary.
    fn with_canary(replicas: i64, version: i64, canary: Option<i64>, canary_replicas: i64) -> DeploymentInfo {
        DeploymentInfo { canary_version: canary, canary_replicas, ..deployment(1, tenant(1), replicas, version) }
    }

    fn canary_replica(
        d: &DeploymentInfo,
        n: u128,
        index: i64,
        version: i64,
        at: Option<(&str, &str)>,
        state: ReplicaState,
    ) -> ReplicaInfo {
        ReplicaInfo { canary: true, serving: state == ReplicaState::Ready, ..replica(d, n, index, version, at, state) }
    }

    fn stable(d: &DeploymentInfo, version: i64) -> Vec<ReplicaInfo> {
        vec![
            replica(d, 1, 0, version, Some(("w1", "cpu-0")), ReplicaState::Ready),
            replica(d, 2, 1, version, Some(("w2", "cpu-0")), ReplicaState::Ready),
        ]
    }

    fn workers() -> Vec<super::super::WorkerInfo> {
        vec![worker("w1", 2, 4), worker("w2", 2, 4)]
    }

    fn kinds(p: &Plan) -> Vec<&'static str> {
        p.events.iter().map(|e| e.kind).collect()
    }

    #[test]
    fn a_canary_loads_beside_the_stable_replicas_sized_for_its_artifact_and_serves_once_ready() {
        let mut d = with_canary(2, 1, Some(2), 1);
        d.memory_bytes = None;
        let mut s = snapshot(workers(), vec![d.clone()], stable(&d, 1));
        s.versions.insert((d.model_id, 1), VersionInfo { size_bytes: 100 << 20, config: None });
        s.versions.insert((d.model_id, 2), VersionInfo { size_bytes: 300 << 20, config: None });
        let p = run(&s);
        assert!(p.changes.is_empty(), "the stable replicas are left alone: {p:?}");
        let [new] = p.inserts.as_slice() else { panic!("one canary replica: {p:?}") };
        assert_eq!((new.version, new.index, new.canary, new.serving), (2, 0, true, false));
        assert_eq!(new.memory_bytes, 1200 << 20, "four times the canary's artifact");
        assert_eq!(new.config["instance_group"], serde_json::json!([{ "count": 1, "kind": "KIND_CPU" }]));
        assert!(new.placement.is_ok(), "{new:?}");
        assert_eq!(kinds(&p), ["canary_started", "placed"]);
        assert!(p.events[1].message.starts_with("canary replica 0 placed"), "{:?}", p.events[1]);

        // Loading: nothing changes. Ready: it serves, on its own.
        let mut replicas = stable(&d, 1);
        replicas.push(canary_replica(&d, 3, 0, 2, Some(("w1", "cpu-0")), ReplicaState::Loading));
        assert!(run(&snapshot(workers(), vec![d.clone()], replicas.clone())).is_empty());
        replicas[2].state = ReplicaState::Ready;
        replicas[2].serving = false;
        let p = run(&snapshot(workers(), vec![d.clone()], replicas.clone()));
        assert_eq!(p.changes, [ReplicaChange::Serve { id: replicas[2].id }]);
        assert_eq!(kinds(&p), ["canary_serving"]);
        // Serving beside the stable replicas is a steady state, not a rollout.
        replicas[2].serving = true;
        assert!(run(&snapshot(workers(), vec![d], replicas)).is_empty());
    }

    #[test]
    fn a_canary_counts_against_the_tenants_slice_quota() {
        let d = with_canary(2, 1, Some(2), 1);
        let mut s =
            snapshot(vec![worker("w1", 1, 4), worker("w2", 1, 4), worker("w3", 1, 4)], vec![d.clone()], stable(&d, 1));
        s.slice_quotas.insert(tenant(1), std::collections::BTreeMap::from([("cpu".to_string(), 2)]));
        let p = run(&s);
        let placement = p.inserts[0].placement.clone().expect("placed on a slice the tenant holds");
        assert_ne!(placement.worker, "w3", "a third slice would pass the quota");
    }

    #[test]
    fn rolling_back_drains_the_canary_replicas_then_removes_them() {
        let d = with_canary(2, 1, None, 0);
        let mut replicas = stable(&d, 1);
        replicas.push(canary_replica(&d, 3, 0, 2, Some(("w1", "cpu-0")), ReplicaState::Ready));
        let p = run(&snapshot(workers(), vec![d.clone()], replicas.clone()));
        let until = now() + Duration::from_secs(3);
        assert_eq!(p.changes, [ReplicaChange::Drain { id: replicas[2].id, until }]);
        assert!(p.inserts.is_empty());
        assert_eq!(kinds(&p), ["canary_draining"]);
        replicas[2] = ReplicaInfo {
            state: ReplicaState::Draining,
            serving: false,
            drain_until: Some(until),
            ..replicas[2].clone()
        };
        assert!(run(&snapshot(workers(), vec![d.clone()], replicas.clone())).is_empty(), "still draining");
        let later =
            plan(&snapshot(workers(), vec![d], replicas.clone()), until, &settings(), &mut super::super::tests::ids());
        assert_eq!(later.changes, [ReplicaChange::Delete { id: replicas[2].id }]);
    }

    #[test]
    fn a_canary_that_never_served_goes_at_once_and_a_new_canary_version_takes_over_when_ready() {
        // Rolled back while loading: nothing to drain.
        let d = with_canary(2, 1, None, 0);
        let mut replicas = stable(&d, 1);
        replicas.push(canary_replica(&d, 3, 0, 2, Some(("w1", "cpu-0")), ReplicaState::Loading));
        let p = run(&snapshot(workers(), vec![d], replicas.clone()));
        assert_eq!(p.changes, [ReplicaChange::Delete { id: replicas[2].id }]);

        // Canary 2 serves; the canary moves to 3: 2 serves until 3 is ready, then drains.
        let d = with_canary(2, 1, Some(3), 1);
        replicas[2].state = ReplicaState::Ready;
        replicas[2].serving = true;
        let p = run(&snapshot(workers(), vec![d.clone()], replicas.clone()));
        assert!(p.changes.is_empty(), "{p:?}");
        let new = &p.inserts[0];
        assert_eq!((new.version, new.canary), (3, true));
        assert_eq!(
            new.placement,
            Ok(Placement { worker: "w1".into(), slice: "cpu-0".into() }),
            "beside the old canary"
        );
        let mut next = replicas.clone();
        next.push(ReplicaInfo {
            serving: false,
            ..canary_replica(&d, 4, 0, 3, Some(("w1", "cpu-0")), ReplicaState::Ready)
        });
        let p = run(&snapshot(workers(), vec![d], next.clone()));
        let until = now() + Duration::from_secs(3);
        assert_eq!(
            p.changes,
            [ReplicaChange::Serve { id: next[3].id }, ReplicaChange::Drain { id: next[2].id, until }]
        );
    }

    #[test]
    fn a_stable_rollout_with_a_canary_leaves_the_canary_alone() {
        let d = with_canary(2, 3, Some(2), 1);
        let mut replicas = stable(&d, 1);
        replicas.push(canary_replica(&d, 3, 0, 2, Some(("w1", "cpu-0")), ReplicaState::Ready));
        let p = run(&snapshot(workers(), vec![d], replicas));
        assert_eq!(
            p.inserts.iter().map(|r| (r.version, r.canary, r.serving)).collect::<Vec<_>>(),
            [(3, false, false); 2]
        );
        assert!(p.changes.is_empty(), "{p:?}");
        assert_eq!(kinds(&p)[0], "rollout_started");
    }

    #[test]
    fn a_promotion_rolls_the_stable_replicas_out_then_clears_the_canary_and_drains_it() {
        // Promoted: the target is the canary's version and the canary is still set.
        let d = with_canary(2, 2, Some(2), 1);
        let mut replicas = stable(&d, 1);
        replicas.push(canary_replica(&d, 3, 0, 2, Some(("w1", "cpu-0")), ReplicaState::Ready));
        // Step 1: new stable replicas of version 2 load beside the old ones; the canary serves on.
        let p = run(&snapshot(workers(), vec![d.clone()], replicas.clone()));
        assert_eq!(
            p.inserts.iter().map(|r| (r.version, r.canary, r.serving)).collect::<Vec<_>>(),
            [(2, false, false); 2]
        );
        assert!(p.changes.is_empty() && p.clear_canary.is_empty(), "{p:?}");
        // Step 2: all ready: the stable replicas switch; the canary stays until that is done.
        let new: Vec<ReplicaInfo> = p
            .inserts
            .iter()
            .map(|r| {
                let at = r.placement.clone().expect("placed");
                let at = (at.worker.as_str(), at.slice.as_str());
                ReplicaInfo { id: r.id, serving: false, ..replica(&d, 0, r.index, 2, Some(at), ReplicaState::Ready) }
            })
            .collect();
        let all: Vec<ReplicaInfo> = replicas.iter().chain(&new).cloned().collect();
        let p = run(&snapshot(workers(), vec![d.clone()], all));
        assert!(kinds(&p).contains(&"rollout_switched") && p.clear_canary.is_empty(), "{p:?}");
        // Step 3: the stable replicas serve version 2: the canary is cleared and drains.
        let switched: Vec<ReplicaInfo> = new.iter().map(|r| ReplicaInfo { serving: true, ..r.clone() }).collect();
        let all: Vec<ReplicaInfo> = switched.iter().chain(&replicas[2..]).cloned().collect();
        let p = run(&snapshot(workers(), vec![d.clone()], all));
        assert_eq!(p.clear_canary, [d.id]);
        let until = now() + Duration::from_secs(3);
        assert_eq!(p.changes, [ReplicaChange::Drain { id: replicas[2].id, until }]);
        assert_eq!(kinds(&p), ["canary_cleared", "canary_draining"]);
    }
}
