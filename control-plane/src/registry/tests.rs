//! The registry test suite, run on SQLite (a temp file per test) and on Postgres (a fresh
//! database per test, created through the admin URL in `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`, and dropped afterwards).

use std::future::Future;
use std::time::Duration;

use sqlx::Connection;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::*;
use crate::error::Error;
use crate::registry::audit::Actor;
use crate::types::{ArtifactFormat, Name};

struct TestDb {
    registry: Registry,
    postgres: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    async fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("r.db").display());
        let registry = Registry::connect(&url, Duration::from_secs(5), &CancellationToken::new()).await.expect("open");
        TestDb { registry, postgres: None, _dir: Some(dir) }
    }

    async fn postgres() -> Self {
        let admin =
            std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap_or_else(|e| {
            panic!("no PostgreSQL at {admin} ({e}): start one (scripts/test.sh does) or set DATABASE_URL")
        });
        let name = format!("cp_test_{}", Uuid::new_v4().simple());
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await.expect("create");
        let url = match admin.rsplit_once('/') {
            Some((base, _)) if base.len() > "postgres://".len() => format!("{base}/{name}"),
            _ => format!("{admin}/{name}"),
        };
        let registry = Registry::connect(&url, Duration::from_secs(5), &CancellationToken::new()).await.expect("open");
        TestDb { registry, postgres: Some((admin, name)), _dir: None }
    }

    async fn finish(self) {
        self.registry.close().await;
        if let Some((admin, name)) = &self.postgres {
            let mut conn = sqlx::PgConnection::connect(admin).await.expect("admin");
            let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await.expect("drop");
        }
    }
}

async fn on_both<F, Fut>(test: F)
where
    F: Fn(Registry) -> Fut,
    Fut: Future<Output = ()>,
{
    for db in [TestDb::sqlite().await, TestDb::postgres().await] {
        test(db.registry.clone()).await;
        db.finish().await;
    }
}

fn actor() -> Actor {
    Actor {
        key_id: Some(Uuid::now_v7()),
        user_id: None,
        request_id: "test".into(),
        client_addr: Some("127.0.0.1:1".into()),
    }
}

fn name(s: &str) -> Name {
    Name::parse(s).unwrap()
}

async fn tenant(r: &Registry, n: &str, quotas: QuotaLimits) -> Uuid {
    r.create_tenant(&actor(), &name(n), n, false, &quotas).await.unwrap().id
}

fn version(size: i64) -> NewVersion {
    NewVersion {
        artifact_key: format!("k/{}", Uuid::new_v4()),
        sha256: "0".repeat(64),
        size_bytes: size,
        format: ArtifactFormat::Onnx,
        config: Some(serde_json::json!({ "max_batch_size": 4 })),
    }
}

#[tokio::test]
async fn names_are_unique_where_they_should_be() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        let dup = r.create_tenant(&actor(), &name("a"), "again", false, &QuotaLimits::default()).await;
        assert_eq!(dup.unwrap_err().code(), "already_exists");
        r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        r.create_model(&actor(), b, &name("m"), "").await.unwrap();
        let dup = r.create_model(&actor(), a, &name("m"), "").await.unwrap_err();
        assert_eq!(dup.code(), "already_exists");
    })
    .await;
}

#[tokio::test]
async fn queries_are_scoped_by_tenant() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        r.create_version(&actor(), &m, version(5)).await.unwrap();
        r.set_alias(&actor(), &m, &name("prod"), 1).await.unwrap();
        let mut c = r.conn().await.unwrap();
        assert!(c.model(b, "m").await.unwrap().is_none());
        assert!(c.version(b, m.id, 1).await.unwrap().is_none());
        assert!(c.aliases(b, m.id).await.unwrap().is_empty());
        assert!(c.models(b, None, 10).await.unwrap().is_empty());
        let usage = |models, versions, storage_bytes| QuotaUsage { models, versions, storage_bytes, replicas: 0 };
        assert_eq!(c.quota_usage(b).await.unwrap(), usage(0, 0, 0));
        assert_eq!(c.quota_usage(a).await.unwrap(), usage(1, 1, 5));
        drop(c);
        assert!(matches!(r.delete_model(&actor(), b, "m").await, Err(Error::NotFound("model"))));
    })
    .await;
}

#[tokio::test]
async fn versions_count_up_aliases_pin_them() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        for expected in 1..=2 {
            let v = r.create_version(&actor(), &m, version(1)).await.unwrap();
            assert_eq!(v.version, expected);
            assert_eq!(v.config.as_ref().map(|c| c.0["max_batch_size"].clone()), Some(serde_json::json!(4)));
        }
        r.set_alias(&actor(), &m, &name("prod"), 2).await.unwrap();
        assert_eq!(r.delete_version(&actor(), &m, 2).await.unwrap_err().code(), "version_in_use");
        assert!(matches!(r.set_alias(&actor(), &m, &name("prod"), 7).await, Err(Error::InvalidInput { .. })));
        r.set_alias(&actor(), &m, &name("prod"), 1).await.unwrap();
        r.delete_version(&actor(), &m, 2).await.unwrap();
        assert_eq!(r.create_version(&actor(), &m, version(1)).await.unwrap().version, 3, "numbers are not reused");
        let keys = r.delete_model(&actor(), a, "m").await.unwrap();
        assert_eq!(keys.len(), 2);
    })
    .await;
}

#[tokio::test]
async fn quotas_hold_under_concurrent_creates() {
    on_both(|r| async move {
        let quotas = QuotaLimits { models: 3, versions: 2, storage_bytes: 10, ..QuotaLimits::default() };
        let a = tenant(&r, "a", quotas).await;
        let creates = (0..8).map(|i| {
            let r = r.clone();
            async move { r.create_model(&actor(), a, &name(&format!("m{i}")), "").await }
        });
        let results = futures::future::join_all(creates).await;
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 3);
        assert!(results.iter().filter_map(|r| r.as_ref().err()).all(|e| e.code() == "quota_exceeded.models"));

        let m = r.conn().await.unwrap().models(a, None, 1).await.unwrap().remove(0);
        assert_eq!(
            r.create_version(&actor(), &m, version(11)).await.unwrap_err().code(),
            "quota_exceeded.storage_bytes"
        );
        r.create_version(&actor(), &m, version(6)).await.unwrap();
        r.create_version(&actor(), &m, version(4)).await.unwrap();
        assert_eq!(r.create_version(&actor(), &m, version(0)).await.unwrap_err().code(), "quota_exceeded.versions");
    })
    .await;
}

#[tokio::test]
async fn audit_chain_verifies_and_finds_tampering() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        r.create_version(&actor(), &m, version(1)).await.unwrap();
        r.set_alias(&actor(), &m, &name("prod"), 1).await.unwrap();
        let report = r.verify_audit_chain(a).await.unwrap();
        assert_eq!((report.events_checked, report.first_break), (4, None));
        assert_eq!(r.verify_audit_chain(b).await.unwrap().events_checked, 1);

        let mut c = r.conn().await.unwrap();
        let filter = AuditFilter { resource_type: Some("model_version".into()), ..AuditFilter::default() };
        let events = c.audit_events(a, &filter, 10).await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].seq, 3);
        let older = AuditFilter { before_seq: Some(3), ..AuditFilter::default() };
        assert_eq!(c.audit_events(a, &older, 10).await.unwrap().len(), 2);

        exec!(c, "test.tamper", |x| sqlx::query(
            "UPDATE audit_events SET request_id = 'forged' WHERE tenant_id = $1 AND seq = 2"
        )
        .bind(a)
        .execute(x))
        .unwrap();
        drop(c);
        let report = r.verify_audit_chain(a).await.unwrap();
        let broken = report.first_break.unwrap();
        assert_eq!((broken.seq, broken.reason), (2, "event content does not match its hash"));
        assert_eq!(r.verify_audit_chain(b).await.unwrap().first_break, None);
    })
    .await;
}

#[tokio::test]
async fn keys_are_found_by_prefix_and_revoked() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let new = NewApiKey {
            prefix: "tsk_abc".into(),
            secret_hash: "00".into(),
            name: "ci".into(),
            role: crate::types::Role::Deployer,
            user_id: None,
            expires_at: None,
        };
        let key = r.create_key(&actor(), a, new.clone()).await.unwrap();
        assert_eq!(r.create_key(&actor(), a, new).await.unwrap_err().code(), "already_exists");
        let mut c = r.conn().await.unwrap();
        let found = c.key_by_prefix("tsk_abc").await.unwrap().unwrap();
        assert_eq!((found.id, found.role()), (key.id, crate::types::Role::Deployer));
        assert!(found.is_active(now()));
        drop(c);
        let revoked = r.revoke_key(&actor(), a, key.id).await.unwrap();
        assert!(!revoked.is_active(now()));
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        assert!(matches!(r.revoke_key(&actor(), b, key.id).await, Err(Error::NotFound(_))));
    })
    .await;
}

#[tokio::test]
async fn idempotency_keys_replay_and_refuse_reuse() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let at = now();
        assert_eq!(r.claim_idempotent(a, "k", "f1", at).await.unwrap(), IdempotencyClaim::New);
        assert_eq!(r.claim_idempotent(a, "k", "f1", at).await.unwrap(), IdempotencyClaim::InProgress);
        assert_eq!(r.claim_idempotent(a, "k", "f2", at).await.unwrap(), IdempotencyClaim::Mismatch);
        r.finish_idempotent(a, "k", 201, b"{}").await.unwrap();
        let replay = IdempotencyClaim::Replay { status: 201, body: b"{}".to_vec() };
        assert_eq!(r.claim_idempotent(a, "k", "f1", at).await.unwrap(), replay);
        assert_eq!(r.claim_idempotent(a, "k2", "f", at).await.unwrap(), IdempotencyClaim::New);
        r.release_idempotent(a, "k2").await.unwrap();
        assert_eq!(r.claim_idempotent(a, "k2", "f", at).await.unwrap(), IdempotencyClaim::New);
        // Expired keys are forgotten.
        let later = at + time::Duration::hours(25);
        assert_eq!(r.claim_idempotent(a, "k", "f9", later).await.unwrap(), IdempotencyClaim::New);
    })
    .await;
}

#[tokio::test]
async fn signing_keys_rotate_and_stay_published() {
    on_both(|r| async move {
        let first = crate::auth::tokens::new_signing_key().unwrap();
        assert!(r.insert_first_signing_key(&first).await.unwrap());
        assert!(!r.insert_first_signing_key(&crate::auth::tokens::new_signing_key().unwrap()).await.unwrap());
        let second = crate::auth::tokens::new_signing_key().unwrap();
        r.rotate_signing_key(&actor(), None, &second).await.unwrap();
        let mut c = r.conn().await.unwrap();
        let keys = c.signing_keys(now() - time::Duration::minutes(5)).await.unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!((keys[0].kid.as_str(), keys[0].retired_at), (second.kid.as_str(), None));
        assert!(keys[1].retired_at.is_some());
        assert_eq!(c.signing_keys(now() + time::Duration::minutes(5)).await.unwrap().len(), 1);
    })
    .await;
}

#[tokio::test]
async fn connect_gives_up_with_a_clear_message() {
    let err =
        Registry::connect("postgres://nobody@127.0.0.1:1/x", Duration::from_millis(300), &CancellationToken::new())
            .await
            .err()
            .unwrap();
    assert!(format!("{err:#}").contains("connect to the database at postgres://nobody@127.0.0.1:1/x"), "{err:#}");
    let err = Registry::connect("mysql://x", Duration::from_millis(10), &CancellationToken::new()).await.err().unwrap();
    assert!(format!("{err:#}").contains("unsupported database url"));
}

fn new_user(email: &str, role: crate::types::Role) -> NewUser {
    NewUser { email: crate::types::Email::parse(email).unwrap(), name: email.into(), role }
}

fn user_key(prefix: &str, role: crate::types::Role, user_id: Option<Uuid>) -> NewApiKey {
    NewApiKey { prefix: prefix.into(), secret_hash: "00".into(), name: prefix.into(), role, user_id, expires_at: None }
}

#[tokio::test]
async fn users_are_unique_per_tenant_and_scoped() {
    use crate::types::Role;
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        let ada = r.create_user(&actor(), a, new_user("Ada@x.io", Role::Deployer)).await.unwrap();
        assert_eq!((ada.email.as_str(), ada.role()), ("ada@x.io", Role::Deployer));
        let dup = r.create_user(&actor(), a, new_user("ada@X.io", Role::Viewer)).await.unwrap_err();
        assert_eq!(dup.code(), "already_exists");
        r.create_user(&actor(), b, new_user("ada@x.io", Role::Viewer)).await.unwrap();
        let mut c = r.conn().await.unwrap();
        assert_eq!(c.users(a).await.unwrap().len(), 1);
        assert!(c.user(b, ada.id).await.unwrap().is_none());
        drop(c);
        assert!(matches!(r.disable_user(&actor(), b, ada.id).await, Err(Error::NotFound("user"))));
        // A key of another tenant's user cannot be made.
        let e = r.create_key(&actor(), b, user_key("tsk_x", Role::Viewer, Some(ada.id))).await.unwrap_err();
        assert!(matches!(e, Error::InvalidInput { field: Some(ref f), .. } if f == "user_id"), "{e:?}");
    })
    .await;
}

#[tokio::test]
async fn disabling_a_user_revokes_their_keys_only() {
    use crate::types::Role;
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let ada = r.create_user(&actor(), a, new_user("ada@x.io", Role::Deployer)).await.unwrap();
        let e = r.create_key(&actor(), a, user_key("tsk_big", Role::TenantAdmin, Some(ada.id))).await.unwrap_err();
        assert!(matches!(e, Error::InvalidInput { field: Some(ref f), .. } if f == "role"), "{e:?}");
        let k1 = r.create_key(&actor(), a, user_key("tsk_1", Role::Deployer, Some(ada.id))).await.unwrap();
        let k2 = r.create_key(&actor(), a, user_key("tsk_2", Role::Viewer, Some(ada.id))).await.unwrap();
        let service = r.create_key(&actor(), a, user_key("tsk_3", Role::Viewer, None)).await.unwrap();
        assert_eq!(k1.user_id, Some(ada.id));

        let (user, revoked) = r.disable_user(&actor(), a, ada.id).await.unwrap();
        assert!(user.disabled_at.is_some());
        assert_eq!(revoked, 2);
        let mut c = r.conn().await.unwrap();
        for (id, active) in [(k1.id, false), (k2.id, false), (service.id, true)] {
            assert_eq!(c.key(a, id).await.unwrap().unwrap().is_active(now()), active);
        }
        drop(c);
        let (_, again) = r.disable_user(&actor(), a, ada.id).await.unwrap();
        assert_eq!(again, 0, "disabling twice changes nothing");
        let e = r.create_key(&actor(), a, user_key("tsk_4", Role::Viewer, Some(ada.id))).await.unwrap_err();
        assert_eq!(e.code(), "user_disabled");
    })
    .await;
}

#[tokio::test]
async fn audit_events_record_the_acting_user() {
    use crate::types::Role;
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let ada = r.create_user(&actor(), a, new_user("ada@x.io", Role::Deployer)).await.unwrap();
        let key = r.create_key(&actor(), a, user_key("tsk_1", Role::Deployer, Some(ada.id))).await.unwrap();
        let by_ada = Actor { key_id: Some(key.id), user_id: Some(ada.id), ..actor() };
        r.create_model(&by_ada, a, &name("m"), "").await.unwrap();
        let mut c = r.conn().await.unwrap();
        let filter = AuditFilter { actor_user_id: Some(ada.id), ..AuditFilter::default() };
        let events = c.audit_events(a, &filter, 10).await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].actor_key_id, events[0].action.as_str()), (Some(key.id), "model.create"));
        drop(c);
        let report = r.verify_audit_chain(a).await.unwrap();
        assert_eq!((report.events_checked, report.first_break), (4, None));
    })
    .await;
}

fn spec(version: VersionRef, replicas: i64) -> DeploymentSpec {
    DeploymentSpec {
        version,
        profile: "cpu".into(),
        replicas,
        instance_count: 1,
        max_batch_size: None,
        dynamic_batching: None,
        memory_bytes: None,
    }
}

#[tokio::test]
async fn deployments_are_scoped_unique_and_within_quota() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits { replicas: 3, ..QuotaLimits::default() }).await;
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        let other = r.create_model(&actor(), a, &name("other"), "").await.unwrap();
        r.create_version(&actor(), &m, version(1)).await.unwrap();
        r.create_version(&actor(), &m, version(1)).await.unwrap();
        r.create_version(&actor(), &other, version(1)).await.unwrap();
        r.set_alias(&actor(), &m, &name("prod"), 1).await.unwrap();

        let d = r.create_deployment(&actor(), a, &name("d"), "m", spec(VersionRef::Latest, 2)).await.unwrap();
        assert_eq!((d.version, d.alias.as_deref(), d.model_name.as_str()), (2, None, "m"));
        let again = r.create_deployment(&actor(), a, &name("d2"), "m", spec(VersionRef::Latest, 1)).await;
        assert_eq!(again.unwrap_err().code(), "model_deployed");
        let dup = r.create_deployment(&actor(), a, &name("d"), "other", spec(VersionRef::Latest, 1)).await;
        assert_eq!(dup.unwrap_err().code(), "already_exists");
        let over = r.create_deployment(&actor(), a, &name("d3"), "other", spec(VersionRef::Latest, 2)).await;
        assert_eq!(over.unwrap_err().code(), "quota_exceeded.replicas");
        let missing = r.create_deployment(&actor(), a, &name("d4"), "other", spec(VersionRef::Pinned(9), 1)).await;
        assert!(matches!(missing, Err(Error::NotFound("version"))));

        let mut c = r.conn().await.unwrap();
        assert_eq!(c.quota_usage(a).await.unwrap().replicas, 2);
        assert!(c.deployment(b, "d").await.unwrap().is_none());
        assert!(c.deployments(b).await.unwrap().is_empty());
        assert_eq!(c.deployments(a).await.unwrap().len(), 1);
        drop(c);
        let patch = DeploymentPatch { replicas: Some(1), ..DeploymentPatch::default() };
        assert!(matches!(r.update_deployment(&actor(), b, "d", patch).await, Err(Error::NotFound("deployment"))));
        assert!(matches!(r.delete_deployment(&actor(), b, "d").await, Err(Error::NotFound("deployment"))));

        let grow = DeploymentPatch { replicas: Some(4), ..DeploymentPatch::default() };
        assert_eq!(r.update_deployment(&actor(), a, "d", grow).await.unwrap_err().code(), "quota_exceeded.replicas");
        let follow = DeploymentPatch { version: Some(VersionRef::Alias(name("prod"))), ..DeploymentPatch::default() };
        let d = r.update_deployment(&actor(), a, "d", follow).await.unwrap();
        assert_eq!((d.version, d.alias.as_deref(), d.spec_generation), (1, Some("prod"), 1));
        let respec = DeploymentPatch { instance_count: Some(2), ..DeploymentPatch::default() };
        assert_eq!(r.update_deployment(&actor(), a, "d", respec).await.unwrap().spec_generation, 2);

        assert_eq!(r.delete_version(&actor(), &m, 1).await.unwrap_err().code(), "version_in_use");
        assert_eq!(r.delete_model(&actor(), a, "m").await.unwrap_err().code(), "model_deployed");
        r.delete_deployment(&actor(), a, "d").await.unwrap();
        r.delete_model(&actor(), a, "m").await.unwrap();
        let report = r.verify_audit_chain(a).await.unwrap();
        assert_eq!(report.first_break, None);
    })
    .await;
}

fn new_worker(id: &str) -> NewWorker {
    NewWorker {
        id: id.into(),
        http_endpoint: format!("http://{id}:8000"),
        grpc_endpoint: format!("{id}:8001"),
        metrics_endpoint: String::new(),
        slices: (0..2)
            .map(|i| SliceRecord {
                id: format!("cpu-{i}"),
                profile: "cpu".into(),
                kind: "cpu".into(),
                memory_bytes: 1 << 30,
            })
            .collect(),
        labels: Default::default(),
        version: "test".into(),
    }
}

async fn tick(r: &Registry) -> std::collections::BTreeSet<String> {
    let mut tx = r.begin().await.unwrap();
    tx.lock_scheduling().await.unwrap();
    let snapshot = tx.scheduling_snapshot().await.unwrap();
    let settings = crate::scheduler::plan::Settings {
        lost_after: Duration::from_secs(10),
        drain: Duration::from_secs(3),
        leader_since: None,
    };
    let plan = crate::scheduler::plan::plan(&snapshot, now(), &settings, &mut Uuid::now_v7);
    let touched = tx.apply_plan(&plan, &snapshot).await.unwrap();
    tx.commit().await.unwrap();
    touched
}

#[tokio::test]
async fn workers_get_assignments_and_report_states() {
    on_both(|r| async move {
        assert_eq!(r.register_worker(&new_worker("w1")).await.unwrap().generation, 1);
        assert_eq!(r.register_worker(&new_worker("w1")).await.unwrap().generation, 2);
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        let v = r.create_version(&actor(), &m, version(10)).await.unwrap();
        let d = r.create_deployment(&actor(), a, &name("d"), "m", spec(VersionRef::Latest, 1)).await.unwrap();

        assert_eq!(tick(&r).await.into_iter().collect::<Vec<_>>(), ["w1"]);
        let mut c = r.conn().await.unwrap();
        assert_eq!(c.worker_generation("w1").await.unwrap(), Some(3));
        let assigned = c.assignments("w1").await.unwrap();
        assert_eq!(assigned.len(), 1);
        let one = &assigned[0];
        assert_eq!((one.model_name.as_str(), one.version, one.serving), ("m", 1, true));
        assert_eq!((one.artifact_key.as_str(), one.tenant_name.as_str()), (v.artifact_key.as_str(), "a"));
        assert_eq!(one.config.0["name"], "m");
        assert!(c.is_artifact(&v.artifact_key).await.unwrap());
        assert!(!c.is_artifact("tenants/elsewhere").await.unwrap());
        drop(c);
        assert!(tick(&r).await.is_empty(), "a second tick changes nothing");

        let ready = ReportedState { replica_id: one.replica_id, state: "ready", reason: None };
        assert_eq!(r.report_states("w2", std::slice::from_ref(&ready)).await.unwrap().len(), 0, "not its replica");
        assert_eq!(r.report_states("w1", std::slice::from_ref(&ready)).await.unwrap().len(), 1);
        assert_eq!(r.report_states("w1", std::slice::from_ref(&ready)).await.unwrap().len(), 0, "no change");
        let mut c = r.conn().await.unwrap();
        let replicas = c.replicas(a, d.id).await.unwrap();
        assert_eq!((replicas[0].state.as_str(), replicas[0].worker_id.as_deref()), ("ready", Some("w1")));
        let kinds: Vec<String> = c.deployment_events(a, d.id, 10).await.unwrap().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["created", "placed", "ready"]);
        assert!(c.heartbeat("w1", now(), 1).await.unwrap());
        assert!(!c.heartbeat("nobody", now(), 1).await.unwrap());
        drop(c);

        r.delete_deployment(&actor(), a, "d").await.unwrap();
        let mut c = r.conn().await.unwrap();
        assert_eq!(c.worker_generation("w1").await.unwrap(), Some(4));
        assert!(c.assignments("w1").await.unwrap().is_empty());
    })
    .await;
}
