//! Placement tests with fixture builders.

use super::*;

const GIB: u64 = 1 << 30;

fn worker(id: &str, slices: &[(&str, &str, u64)]) -> WorkerSpec {
    WorkerSpec {
        id: id.into(),
        slices: slices
            .iter()
            .map(|(sid, profile, gib)| SliceSpec {
                id: (*sid).into(),
                profile: (*profile).into(),
                memory_bytes: gib * GIB,
            })
            .collect(),
    }
}

fn cpu_workers(n: usize, slices: usize, gib: u64) -> Vec<WorkerSpec> {
    (0..n)
        .map(|i| WorkerSpec {
            id: format!("w{i:04}"),
            slices: (0..slices)
                .map(|s| SliceSpec { id: format!("cpu-{s}"), profile: "cpu".into(), memory_bytes: gib * GIB })
                .collect(),
        })
        .collect()
}

fn replica(deployment: &str, index: u32, tenant: &str, profile: &str, gib: u64) -> ReplicaRequest {
    ReplicaRequest {
        deployment: deployment.into(),
        index,
        tenant: tenant.into(),
        profile: profile.into(),
        memory_bytes: gib * GIB,
    }
}

#[test]
fn a_slice_serves_one_tenant_only() {
    let mut p = Placer::new(vec![worker("w1", &[("s0", "cpu", 8), ("s1", "cpu", 8)])]);
    let a = p.place(&replica("da", 0, "acme", "cpu", 1)).expect("acme fits");
    let b = p.place(&replica("db", 0, "globex", "cpu", 1)).expect("globex fits");
    assert_ne!(a.slice, b.slice, "two tenants never share a slice");
    let err = p.place(&replica("dc", 0, "initech", "cpu", 1)).expect_err("both slices taken");
    assert!(matches!(err, ScheduleError::NoCapacity { .. }), "{err}");
    let again = p.place(&replica("da", 1, "acme", "cpu", 1)).expect("acme shares its own slice");
    assert_eq!(again.slice, a.slice);
}

#[test]
fn memory_must_fit() {
    let mut p = Placer::new(vec![worker("w1", &[("s0", "mig-1g.10gb", 10)])]);
    p.place(&replica("d", 0, "acme", "mig-1g.10gb", 6)).expect("6 of 10 GiB");
    let err = p.place(&replica("d", 1, "acme", "mig-1g.10gb", 6)).expect_err("12 > 10 GiB");
    assert!(err.to_string().contains("mig-1g.10gb"), "{err}");
    p.place(&replica("d", 2, "acme", "mig-1g.10gb", 4)).expect("exactly fills it");
}

#[test]
fn replicas_spread_across_workers() {
    let mut p = Placer::new(cpu_workers(3, 4, 16));
    let workers: Vec<String> =
        (0..3).map(|i| p.place(&replica("d", i, "acme", "cpu", 1)).expect("fits").worker).collect();
    let mut distinct = workers.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "three replicas on three workers: {workers:?}");
    let fourth = p.place(&replica("d", 3, "acme", "cpu", 1)).expect("fits");
    assert_eq!(fourth.worker, "w0000", "ties break on worker id");
}

#[test]
fn replicas_spread_across_the_slices_of_a_worker_and_say_when_they_must_share() {
    let mut p = Placer::new(vec![worker("w1", &[("cpu-0", "cpu", 8), ("cpu-1", "cpu", 8), ("cpu-2", "cpu", 8)])]);
    let mut slices = Vec::new();
    for i in 0..3 {
        let r = replica("d", i, "acme", "cpu", 1);
        let at = p.place(&r).expect("fits");
        assert_eq!(p.colocation(&r, &at), None, "replica {i} has a slice of its own");
        slices.push(at.slice);
    }
    assert_eq!(slices, ["cpu-0", "cpu-1", "cpu-2"], "three replicas on three slices");
    // A fourth must share: the first slice (ties break on slice id), and the placer says why.
    let r = replica("d", 3, "acme", "cpu", 1);
    let at = p.place(&r).expect("fits");
    assert_eq!(at.slice, "cpu-0");
    assert_eq!(
        p.colocation(&r, &at).as_deref(),
        Some(
            "2 replicas share slice cpu-0 on worker w1: no 'cpu' slice with 1073741824 bytes free for the tenant \
             holds fewer of them"
        )
    );
    // Another deployment of the tenant packs onto a slice the tenant holds.
    let e = p.place(&replica("e", 0, "acme", "cpu", 1)).expect("fits");
    assert_eq!(e.slice, "cpu-0", "a held slice (all hold none of e's replicas), the first by id");
    // A rollout's new replica beside the old one with its index is not sharing.
    let new = replica("d", 1, "acme", "cpu", 1);
    let beside = Placement { worker: "w1".into(), slice: "cpu-1".into() };
    assert_eq!(p.place_preferring(&new, Some(&beside)).expect("fits"), beside);
    assert_eq!(p.colocation(&new, &beside), None);
}

#[test]
fn a_slice_quota_makes_replicas_share_and_says_so() {
    let mut p = Placer::new(cpu_workers(1, 4, 8));
    p.set_quota("acme", "cpu", 1);
    let first = replica("d", 0, "acme", "cpu", 1);
    let at = p.place(&first).expect("fits");
    assert_eq!(p.colocation(&first, &at), None);
    let second = replica("d", 1, "acme", "cpu", 1);
    let shared = p.place(&second).expect("fits on its slice");
    assert_eq!(shared, at);
    let why = p.colocation(&second, &shared).expect("shares");
    assert!(why.ends_with("the tenant's quota of 1 'cpu' slice(s) is in use"), "{why}");
}

#[test]
fn profiles_are_matched_and_unknown_ones_refused() {
    let mut p =
        Placer::new(vec![worker("gpu-node", &[("GPU-0", "gpu", 80)]), worker("cpu-node", &[("cpu-0", "cpu", 16)])]);
    assert_eq!(p.place(&replica("d", 0, "acme", "gpu", 10)).expect("gpu").worker, "gpu-node");
    assert_eq!(p.place(&replica("e", 0, "acme", "cpu", 1)).expect("cpu").worker, "cpu-node");
    let err = p.place(&replica("f", 0, "acme", "mig-3g.40gb", 1)).expect_err("nobody has it");
    assert_eq!(err, ScheduleError::UnknownProfile { profile: "mig-3g.40gb".into() });
}

#[test]
fn slice_quotas_hold_but_held_slices_still_take_more() {
    let mut p = Placer::new(cpu_workers(2, 4, 4));
    p.set_quota("acme", "cpu", 1);
    let first = p.place(&replica("d", 0, "acme", "cpu", 1)).expect("first slice");
    let second = p.place(&replica("d", 1, "acme", "cpu", 1)).expect("shares the slice it holds");
    assert_eq!(first.slice, second.slice);
    assert_eq!(first.worker, second.worker, "quota beats spreading");
    let err = p.place(&replica("d", 2, "acme", "cpu", 3)).expect_err("no room and no second slice");
    assert_eq!(err, ScheduleError::QuotaExceeded { tenant: "acme".into(), profile: "cpu".into(), limit: 1 });
}

#[test]
fn a_lost_worker_gives_back_its_replicas_for_replacement_elsewhere() {
    let mut p = Placer::new(cpu_workers(3, 2, 8));
    let placed: Vec<Placement> = (0..6).map(|i| p.place(&replica("d", i, "acme", "cpu", 1)).expect("fits")).collect();
    let lost = p.remove_worker("w0001");
    assert_eq!(lost.len(), placed.iter().filter(|pl| pl.worker == "w0001").count());
    for (deployment, index) in lost {
        let again = p.place(&replica(&deployment, index, "acme", "cpu", 1)).expect("room elsewhere");
        assert_ne!(again.worker, "w0001");
    }
}

#[test]
fn existing_assignments_are_respected() {
    let mut p = Placer::new(vec![worker("w1", &[("s0", "cpu", 2)])]);
    let at = Placement { worker: "w1".into(), slice: "s0".into() };
    p.assign(&replica("d", 0, "acme", "cpu", 2), &at).expect("registry says it runs there");
    assert!(p.place(&replica("e", 0, "globex", "cpu", 1)).is_err(), "slice is acme's and full");
    assert!(p.assign(&replica("e", 0, "globex", "cpu", 1), &at).is_err(), "cannot record an impossible state");
}

#[test]
fn placement_is_deterministic() {
    let run = || {
        let mut p = Placer::new(cpu_workers(20, 4, 8));
        (0..100u32)
            .map(|i| p.place(&replica(&format!("d{}", i % 7), i, &format!("t{}", i % 5), "cpu", 1 + u64::from(i % 3))))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}

#[test]
fn ten_thousand_replicas_fit_on_a_thousand_workers() {
    let mut p = Placer::new(cpu_workers(1_000, 8, 16));
    let mut workers_of: HashMap<String, Vec<String>> = HashMap::new();
    let mut tenant_of: HashMap<(String, String), String> = HashMap::new();
    for i in 0..10_000u32 {
        let (deployment, tenant) = (format!("dep{}", i % 500), format!("tenant{}", i % 100));
        let at = p.place(&replica(&deployment, i, &tenant, "cpu", 1)).unwrap_or_else(|e| panic!("replica {i}: {e}"));
        let owner = tenant_of.entry((at.worker.clone(), at.slice.clone())).or_insert_with(|| tenant.clone());
        assert_eq!(*owner, tenant, "slice {at:?} shared by two tenants");
        workers_of.entry(deployment).or_default().push(at.worker);
    }
    for (deployment, mut workers) in workers_of {
        let n = workers.len();
        workers.sort();
        workers.dedup();
        assert_eq!(workers.len(), n, "{deployment}: its {n} replicas are on {n} different workers");
    }
}

#[test]
fn a_preferred_slice_is_taken_when_it_fits_and_quotas_allow() {
    let mut p = Placer::new(cpu_workers(2, 2, 4));
    let old = p.place(&replica("d", 0, "acme", "cpu", 1)).expect("fits");
    let beside = Placement { worker: "w0001".into(), slice: "cpu-1".into() };
    // Spreading alone would pick w0001/cpu-0; the preference wins.
    assert_eq!(p.place_preferring(&replica("d", 1, "acme", "cpu", 1), Some(&beside)).expect("fits"), beside);
    assert_eq!(p.place_preferring(&replica("d", 2, "acme", "cpu", 1), Some(&old)).expect("fits"), old);
    // Too little memory left there: placed elsewhere, like `place`.
    let full = p.place_preferring(&replica("d", 3, "acme", "cpu", 4), Some(&old)).expect("another slice");
    assert_ne!(full, old);
    // Another tenant's slice or an unknown one is never forced.
    let other = p.place_preferring(&replica("e", 0, "globex", "cpu", 1), Some(&old)).expect("a free slice");
    assert_ne!(other, old);
    let nowhere = Placement { worker: "w9".into(), slice: "cpu-0".into() };
    assert!(p.place_preferring(&replica("d", 4, "acme", "cpu", 1), Some(&nowhere)).is_ok());
    // A full slice quota keeps the tenant off a preferred empty slice.
    let mut q = Placer::new(cpu_workers(1, 2, 4));
    q.set_quota("acme", "cpu", 1);
    let first = q.place(&replica("d", 0, "acme", "cpu", 1)).expect("fits");
    let empty =
        Placement { worker: "w0000".into(), slice: if first.slice == "cpu-0" { "cpu-1" } else { "cpu-0" }.into() };
    assert_eq!(q.place_preferring(&replica("d", 1, "acme", "cpu", 1), Some(&empty)).expect("its own slice"), first);
}

/// The slices of an H200 in MIG mode with seven 1g.18gb instances, `MIG-<id>-<n>`.
pub(super) fn h200_1g_slices(id: &str) -> Vec<SliceSpec> {
    (0..7)
        .map(|i| SliceSpec { id: format!("MIG-{id}-{i}"), profile: "mig-1g.18gb".into(), memory_bytes: 18_432 << 20 })
        .collect()
}

/// An H200 node in MIG mode with seven 1g.18gb instances.
fn h200_1g(id: &str) -> WorkerSpec {
    WorkerSpec { id: id.into(), slices: h200_1g_slices(id) }
}

/// An H200 node with a mixed layout: 3g.71gb + 2g.35gb + 2 × 1g.18gb.
fn h200_mixed(id: &str) -> WorkerSpec {
    let mib = |n: u64| n << 20;
    let slice = |n: &str, profile: &str, bytes| SliceSpec {
        id: format!("MIG-{id}-{n}"),
        profile: profile.into(),
        memory_bytes: bytes,
    };
    WorkerSpec {
        id: id.into(),
        slices: vec![
            slice("a", "mig-3g.71gb", mib(72_704)),
            slice("b", "mig-2g.35gb", mib(35_840)),
            slice("c", "mig-1g.18gb", mib(18_432)),
            slice("d", "mig-1g.18gb", mib(18_432)),
        ],
    }
}

#[test]
fn seven_mig_slices_of_an_h200_serve_seven_tenants_one_each() {
    let mut p = Placer::new(vec![h200_1g("h200-a")]);
    let mut slices = std::collections::BTreeSet::new();
    for t in 0..7 {
        let at =
            p.place(&replica(&format!("d{t}"), 0, &format!("tenant{t}"), "mig-1g.18gb", 10)).expect("a free slice");
        assert!(slices.insert(at.slice.clone()), "{at:?} already serves another tenant");
    }
    let err = p.place(&replica("d7", 0, "tenant7", "mig-1g.18gb", 1)).expect_err("every slice has its tenant");
    assert!(matches!(err, ScheduleError::NoCapacity { .. }), "{err}");
    // A tenant's second replica shares its own slice while memory lasts (18 GiB: 10 + 8).
    let again = p.place(&replica("d0", 1, "tenant0", "mig-1g.18gb", 8)).expect("its own slice");
    assert_eq!(again.slice, "MIG-h200-a-0");
    assert!(p.place(&replica("d0", 2, "tenant0", "mig-1g.18gb", 1)).is_err(), "its slice is full");
}

#[test]
fn a_mixed_h200_layout_matches_profiles_and_counts_quotas_per_profile() {
    let mut p = Placer::new(vec![h200_mixed("h200-a"), h200_mixed("h200-b")]);
    p.set_quota("acme", "mig-1g.18gb", 1);
    let big = p.place(&replica("big", 0, "acme", "mig-3g.71gb", 60)).expect("a 3g.71gb slice");
    assert_eq!(big.slice, "MIG-h200-a-a");
    assert!(p.place(&replica("big", 1, "acme", "mig-3g.71gb", 72)).is_err(), "72 GiB is more than 3g.71gb holds");
    p.place(&replica("big", 2, "acme", "mig-3g.71gb", 71)).expect("the other node's 3g.71gb slice");
    let small = p.place(&replica("small", 0, "acme", "mig-1g.18gb", 10)).expect("first 1g slice");
    let err = p.place(&replica("small", 1, "acme", "mig-1g.18gb", 10)).expect_err("quota of one 1g slice");
    assert_eq!(err, ScheduleError::QuotaExceeded { tenant: "acme".into(), profile: "mig-1g.18gb".into(), limit: 1 });
    // The 1g quota says nothing of other profiles, nor of other tenants.
    p.place(&replica("mid", 0, "acme", "mig-2g.35gb", 30)).expect("2g is not limited");
    let other = p.place(&replica("o", 0, "globex", "mig-1g.18gb", 10)).expect("globex has no quota");
    assert_ne!((other.worker.as_str(), other.slice.as_str()), (small.worker.as_str(), small.slice.as_str()));
}

#[test]
fn unhealthy_slices_take_nothing() {
    let mut p = Placer::new(vec![h200_1g("h200-a")]);
    for i in 0..6 {
        p.set_unhealthy("h200-a", &format!("MIG-h200-a-{i}"));
    }
    p.set_unhealthy("nowhere", "MIG-x");
    let at = p.place(&replica("d", 0, "acme", "mig-1g.18gb", 1)).expect("the one healthy slice");
    assert_eq!(at.slice, "MIG-h200-a-6");
    assert!(p.place(&replica("e", 0, "globex", "mig-1g.18gb", 1)).is_err(), "no other healthy slice");
    let sick = Placement { worker: "h200-a".into(), slice: "MIG-h200-a-0".into() };
    assert!(p.assign(&replica("f", 0, "initech", "mig-1g.18gb", 1), &sick).is_err(), "nothing stays on it");
    assert!(p.place_preferring(&replica("d", 1, "acme", "mig-1g.18gb", 1), Some(&sick)).expect("elsewhere") != sick);
}
