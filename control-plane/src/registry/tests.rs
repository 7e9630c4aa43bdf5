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
        signature: Some(signature()),
    }
}

fn signature() -> crate::signature::Signature {
    use crate::signature::{Signature, TensorSignature};
    use tessera_protocol::DataType;
    let tensor = |name: &str| TensorSignature { name: name.into(), datatype: DataType::Fp32, shape: vec![-1, 4] };
    Signature {
        inputs: vec![tensor("x")],
        outputs: vec![tensor("y")],
        max_batch_size: 4,
        platform: "onnxruntime_onnx".into(),
    }
}

#[tokio::test]
async fn a_model_made_by_its_first_upload_exists_only_with_it() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits { models: 1, versions: 1, ..QuotaLimits::default() }).await;
        let id = Uuid::now_v7();
        let (m, v) = r.create_model_with_version(&actor(), a, &name("m"), id, version(10)).await.unwrap();
        assert_eq!((m.id, m.next_version, v.version, v.model_id), (id, 2, 1, id));
        let mut c = r.conn().await.unwrap();
        let stored = c.version(a, id, 1).await.unwrap().expect("stored");
        assert_eq!(stored.signature.map(|s| s.0), Some(signature()), "the signature is kept");
        assert_eq!(c.model(a, "m").await.unwrap().map(|m| m.id), Some(id));
        drop(c);
        // The model quota refuses a second model; the version quota a second version of a new
        // one: either way, no model is left behind.
        let refused = r.create_model_with_version(&actor(), a, &name("n"), Uuid::now_v7(), version(10)).await;
        assert!(matches!(refused, Err(Error::QuotaExceeded { .. })), "{refused:?}");
        r.delete_model(&actor(), a, "m").await.unwrap();
        let b = tenant(&r, "b", QuotaLimits { versions: 0, ..QuotaLimits::default() }).await;
        let refused = r.create_model_with_version(&actor(), b, &name("n"), Uuid::now_v7(), version(10)).await;
        assert!(matches!(refused, Err(Error::QuotaExceeded { .. })), "{refused:?}");
        let mut c = r.conn().await.unwrap();
        assert!(c.model(b, "n").await.unwrap().is_none());
        assert!(c.models(a, None, 10).await.unwrap().is_empty());
        drop(c);
        // A name taken is a conflict, as for a created model.
        r.create_model(&actor(), b, &name("taken"), "").await.unwrap();
        let taken = r.create_model_with_version(&actor(), b, &name("taken"), Uuid::now_v7(), version(10)).await;
        assert!(
            matches!(taken, Err(Error::Conflict { code: crate::error::ErrorCode::AlreadyExists, .. })),
            "{taken:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_version_shows_serving_once_a_ready_replica_serves_it() {
    use crate::states::VersionState;
    on_both(|r| async move {
        r.register_worker(&new_worker("w1")).await.unwrap();
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        r.create_version(&actor(), &m, version(10)).await.unwrap();
        r.create_version(&actor(), &m, version(10)).await.unwrap();
        assert!(r.conn().await.unwrap().version_states(a, m.id).await.unwrap().is_empty());
        let d = r.create_deployment(&actor(), a, &name("d"), "m", spec(VersionRef::Pinned(1), 1)).await.unwrap();
        tick(&r).await;
        let states = r.conn().await.unwrap().version_states(a, m.id).await.unwrap();
        assert_eq!((states.get(&1), states.get(&2)), (Some(&VersionState::Deployed), None));
        all_ready(&r, a, d.id).await;
        let states = r.conn().await.unwrap().version_states(a, m.id).await.unwrap();
        assert_eq!(states.get(&1), Some(&VersionState::Serving));
        // A failed replica keeps the scheduler's serving flag but serves nothing.
        let replica = r.conn().await.unwrap().replicas(a, d.id).await.unwrap().remove(0);
        let failed = ReportedState {
            replica_id: replica.id,
            state: crate::states::ReplicaState::Failed,
            reason: Some("oom".into()),
        };
        r.report_states("w1", std::slice::from_ref(&failed)).await.unwrap();
        let states = r.conn().await.unwrap().version_states(a, m.id).await.unwrap();
        assert_eq!(states.get(&1), Some(&VersionState::Deployed));
    })
    .await;
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
        let first = r.set_alias(&actor(), &m, &name("prod"), 2).await.unwrap();
        assert_eq!(first.previous_version, None, "a new alias has no history");
        assert_eq!(r.delete_version(&actor(), &m, 2).await.unwrap_err().code(), "version_in_use");
        assert!(matches!(r.set_alias(&actor(), &m, &name("prod"), 7).await, Err(Error::InvalidInput { .. })));
        let moved = r.set_alias(&actor(), &m, &name("prod"), 1).await.unwrap();
        assert_eq!(moved.previous_version, Some(2), "a move remembers where the alias was");
        let stored = r.conn().await.unwrap().alias(a, m.id, "prod").await.unwrap().unwrap();
        assert_eq!((stored.version, stored.previous_version), (1, Some(2)));
        r.set_alias(&actor(), &m, &name("prod"), 1).await.unwrap();
        let listed = r.conn().await.unwrap().aliases(a, m.id).await.unwrap();
        assert_eq!(listed[0].previous_version, Some(2), "setting the same version keeps the rollback target");
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
async fn audit_chains_extend_their_checkpoints_or_say_where_not() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        let heads = r.audit_heads().await.unwrap();
        let (_, seq, hash) = heads.iter().find(|(t, _, _)| *t == a).cloned().unwrap();
        let first = (seq, hash);
        assert_eq!(r.audit_chain_extends(a, None, &first).await.unwrap(), Ok(()), "from the start");
        r.create_version(&actor(), &m, version(1)).await.unwrap();
        let head = r.conn().await.unwrap().audit_head(a).await.unwrap().unwrap();
        assert_eq!(r.audit_chain_extends(a, Some(first.clone()), &head).await.unwrap(), Ok(()));
        let shorter = r.audit_chain_extends(a, Some(head.clone()), &first).await.unwrap().unwrap_err();
        assert_eq!(shorter.reason, "the chain is shorter than its last checkpoint");

        let mut c = r.conn().await.unwrap();
        exec!(c, "test.tamper", |x| sqlx::query(
            "UPDATE audit_events SET hash = 'f' WHERE tenant_id = $1 AND seq = $2"
        )
        .bind(a)
        .bind(first.0)
        .execute(x))
        .unwrap();
        drop(c);
        let moved = r.audit_chain_extends(a, Some(first.clone()), &head).await.unwrap().unwrap_err();
        assert_eq!((moved.seq, moved.reason), (first.0, "the checkpointed event is gone or has another hash"));
        let broken = r.audit_chain_extends(a, None, &head).await.unwrap().unwrap_err();
        assert_eq!(broken.seq, first.0, "a first checkpoint needs the whole chain to verify");
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
            limits: (25, 4),
        };
        let key = r.create_key(&actor(), a, new.clone()).await.unwrap();
        assert_eq!(r.create_key(&actor(), a, new).await.unwrap_err().code(), "already_exists");
        let mut c = r.conn().await.unwrap();
        let found = c.key_by_prefix("tsk_abc").await.unwrap().unwrap();
        assert_eq!((found.id, found.role()), (key.id, crate::types::Role::Deployer));
        assert_eq!((found.max_requests_per_second, found.max_concurrent_requests), (25, 4));
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
        let me = IdempotencyScope { tenant_id: a, caller: "key-1:tenant-admin".into() };
        let at = now();
        assert_eq!(r.claim_idempotent(&me, "k", "f1", at).await.unwrap(), IdempotencyClaim::New);
        assert_eq!(r.claim_idempotent(&me, "k", "f1", at).await.unwrap(), IdempotencyClaim::InProgress);
        assert_eq!(r.claim_idempotent(&me, "k", "f2", at).await.unwrap(), IdempotencyClaim::Mismatch);
        r.finish_idempotent(&me, "k", 201, b"{}").await.unwrap();
        let replay = IdempotencyClaim::Replay { status: 201, body: b"{}".to_vec() };
        assert_eq!(r.claim_idempotent(&me, "k", "f1", at).await.unwrap(), replay);
        // Another caller of the same tenant never sees this caller's record.
        let other = IdempotencyScope { tenant_id: a, caller: "key-2:viewer".into() };
        assert_eq!(r.claim_idempotent(&other, "k", "f1", at).await.unwrap(), IdempotencyClaim::New);
        r.finish_idempotent(&other, "k", 403, b"{}").await.unwrap();
        assert_eq!(r.claim_idempotent(&me, "k", "f1", at).await.unwrap(), replay);
        assert_eq!(r.claim_idempotent(&me, "k2", "f", at).await.unwrap(), IdempotencyClaim::New);
        r.release_idempotent(&me, "k2").await.unwrap();
        assert_eq!(r.claim_idempotent(&me, "k2", "f", at).await.unwrap(), IdempotencyClaim::New);
        // Expired keys are forgotten.
        let later = at + time::Duration::hours(25);
        assert_eq!(r.claim_idempotent(&me, "k", "f9", later).await.unwrap(), IdempotencyClaim::New);
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
    NewApiKey {
        prefix: prefix.into(),
        secret_hash: "00".into(),
        name: prefix.into(),
        role,
        user_id,
        expires_at: None,
        limits: (0, 0),
    }
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
async fn the_revocation_list_holds_recent_revocations_of_keys_and_users() {
    use crate::auth::revocations::Revocations;
    use crate::types::Role;
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let ada = r.create_user(&actor(), a, new_user("ada@x.io", Role::Deployer)).await.unwrap();
        let of_ada = r.create_key(&actor(), a, user_key("tsk_1", Role::Deployer, Some(ada.id))).await.unwrap();
        let service = r.create_key(&actor(), a, user_key("tsk_2", Role::Viewer, None)).await.unwrap();
        let active = r.create_key(&actor(), a, user_key("tsk_3", Role::Viewer, None)).await.unwrap();
        let revocations = Revocations::new(Duration::from_secs(900));
        revocations.refresh(&r).await.unwrap();
        assert!(revocations.current().is_empty());

        let revoked = r.revoke_key(&actor(), a, service.id).await.unwrap();
        let (disabled, _) = r.disable_user(&actor(), a, ada.id).await.unwrap();
        revocations.refresh(&r).await.unwrap();
        let at = |t: Option<time::OffsetDateTime>| t.unwrap().unix_timestamp();
        let expected = tessera_protocol::revocation::RevocationList::new(
            [(service.id, at(revoked.revoked_at)), (of_ada.id, at(disabled.disabled_at))],
            [(ada.id, at(disabled.disabled_at))],
        );
        assert_eq!(*revocations.current(), expected);
        assert!(!revocations.current().revokes_key(Some(active.id), None));

        // Only revocations since the given time are read.
        let mut c = r.conn().await.unwrap();
        let later = now() + time::Duration::minutes(1);
        assert!(c.keys_revoked_since(later).await.unwrap().is_empty());
        assert!(c.users_disabled_since(later).await.unwrap().is_empty());
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
        let seq = events[0].seq;
        let names = c.audit_actor_names(a, seq, seq).await.unwrap();
        let want = AuditActorRow { seq, key_name: Some("tsk_1".into()), user_email: Some("ada@x.io".into()) };
        assert_eq!(names, vec![want], "the event names its key and the key's user");
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
        capture: None,
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

        let ready =
            ReportedState { replica_id: one.replica_id, state: crate::states::ReplicaState::Ready, reason: None };
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

#[tokio::test]
async fn an_unhealthy_slice_is_stored_and_its_replica_moves_with_an_event() {
    on_both(|r| async move {
        r.register_worker(&new_worker("w1")).await.unwrap();
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        r.create_version(&actor(), &m, version(10)).await.unwrap();
        let d = r.create_deployment(&actor(), a, &name("d"), "m", spec(VersionRef::Latest, 1)).await.unwrap();
        tick(&r).await;
        let slice_of =
            |r: Registry| async move { r.conn().await.unwrap().replicas(a, d.id).await.unwrap()[0].slice_id.clone() };
        let before = slice_of(r.clone()).await.expect("placed");

        let why = "Xid 79 (GPU has fallen off the bus) on GPU-1";
        let unhealthy = std::collections::BTreeMap::from([(before.clone(), why.to_string())]);
        let mut c = r.conn().await.unwrap();
        assert!(c.set_unhealthy_slices("w1", &unhealthy).await.unwrap());
        assert!(!c.set_unhealthy_slices("nobody", &unhealthy).await.unwrap());
        assert_eq!(c.workers().await.unwrap()[0].unhealthy_slices.0, unhealthy);
        drop(c);
        tick(&r).await;
        let after = slice_of(r.clone()).await.expect("placed again");
        assert_ne!(after, before, "it left the unhealthy slice");
        let mut c = r.conn().await.unwrap();
        let events = c.deployment_events(a, d.id, 10).await.unwrap();
        assert!(events.iter().any(|e| e.kind == "slice_unhealthy" && e.message.contains(why)), "{events:?}");
        // A re-registration keeps what the heartbeats said; the next heartbeat's set replaces it.
        drop(c);
        r.register_worker(&new_worker("w1")).await.unwrap();
        let mut c = r.conn().await.unwrap();
        assert_eq!(c.workers().await.unwrap()[0].unhealthy_slices.0, unhealthy);
        c.set_unhealthy_slices("w1", &Default::default()).await.unwrap();
        assert!(c.workers().await.unwrap()[0].unhealthy_slices.0.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_crash_looping_replica_moves_a_bounded_number_of_times_and_ready_resets_the_count() {
    on_both(|r| async move {
        for w in ["w1", "w2", "w3", "w4"] {
            r.register_worker(&new_worker(w)).await.unwrap();
        }
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        r.create_version(&actor(), &m, version(10)).await.unwrap();
        let d = r.create_deployment(&actor(), a, &name("d"), "m", spec(VersionRef::Latest, 1)).await.unwrap();
        tick(&r).await;
        let replica = |r: Registry| async move { r.conn().await.unwrap().replicas(a, d.id).await.unwrap().remove(0) };
        let looping = format!("{}it keeps dying: killed by signal 11", tessera_protocol::CRASH_LOOP_REASON);
        let crash = |worker: String, id: Uuid| {
            let (r, looping) = (r.clone(), looping.clone());
            async move {
                let report =
                    ReportedState { replica_id: id, state: crate::states::ReplicaState::Failed, reason: Some(looping) };
                assert_eq!(r.report_states(&worker, std::slice::from_ref(&report)).await.unwrap().len(), 1);
            }
        };
        let mut visited = Vec::new();
        for moves in 0..=crate::scheduler::plan::MAX_CRASH_MOVES {
            let now = replica(r.clone()).await;
            assert_eq!(now.crash_moves, moves);
            let worker = now.worker_id.clone().expect("placed");
            visited.push(worker.clone());
            crash(worker, now.id).await;
            tick(&r).await;
        }
        // Out of moves: it stays on the last worker, failed, and one event says so.
        let stayed = replica(r.clone()).await;
        assert_eq!(stayed.worker_id.as_deref(), visited.last().map(String::as_str), "visited {visited:?}");
        assert_eq!(
            (stayed.state.as_str(), stayed.crash_moves),
            ("failed", crate::scheduler::plan::MAX_CRASH_MOVES + 1)
        );
        assert!(visited.windows(2).all(|w| w[0] != w[1]), "each move went to another worker: {visited:?}");
        tick(&r).await;
        let mut c = r.conn().await.unwrap();
        let kinds: Vec<String> = c.deployment_events(a, d.id, 50).await.unwrap().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds.iter().filter(|k| *k == "crash_loop").count(), 1, "{kinds:?}");
        drop(c);
        // Once it serves, the count starts over.
        let ready = ReportedState { replica_id: stayed.id, state: crate::states::ReplicaState::Ready, reason: None };
        r.report_states(stayed.worker_id.as_deref().unwrap(), std::slice::from_ref(&ready)).await.unwrap();
        assert_eq!(replica(r.clone()).await.crash_moves, 0);
    })
    .await;
}

fn usage(key: &str, tenant: Uuid, minute: i64, requests: i64, slice_us: i64) -> UsageRecordRow {
    UsageRecordRow {
        key: key.into(),
        worker_id: "w1".into(),
        tenant_id: tenant,
        model_name: "m".into(),
        version: 1,
        slice_profile: "cpu".into(),
        period_start: minute,
        period_seconds: MINUTE,
        requests,
        failures: 1,
        inferences: requests * 2,
        executions: requests,
        compute_us: 7,
        slice_us,
        bytes_in: 10,
        bytes_out: 20,
        latency_counts: sqlx::types::Json(vec![requests, 1, 0]),
        latency_sum_us: 100,
        batch_size_counts: sqlx::types::Json(vec![0, requests]),
        throttled: 0,
    }
}

fn everything(from: i64, to: i64) -> UsageFilter {
    UsageFilter { from, to, model: None, version: None }
}

#[tokio::test]
async fn usage_keys_are_stored_once_and_reads_are_scoped() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        let batch = [usage("k1", a, 60, 3, 1_000_000), usage("k2", a, 60, 4, 2_000_000), usage("k1", a, 60, 99, 0)];
        assert_eq!(r.store_usage(&batch).await.unwrap(), UsageStored { stored: 2, duplicates: 1 });
        assert_eq!(r.store_usage(&batch[..2]).await.unwrap(), UsageStored { stored: 0, duplicates: 2 }, "a replay");
        let mut c = r.conn().await.unwrap();
        let totals = c.usage_totals(a, &everything(0, 120)).await.unwrap();
        assert_eq!(totals.len(), 1);
        assert_eq!((totals[0].requests, totals[0].failures, totals[0].slice_us), (7, 2, 3_000_000));
        assert!(c.usage_totals(b, &everything(0, 120)).await.unwrap().is_empty());
        assert!(c.usage_totals(a, &everything(120, 180)).await.unwrap().is_empty());
        let other_model = UsageFilter { model: Some("x".into()), ..everything(0, 120) };
        assert!(c.usage_totals(a, &other_model).await.unwrap().is_empty());
        let records = c.usage_records(a, &everything(0, 120)).await.unwrap();
        assert_eq!(records.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["k1", "k2"]);
        assert_eq!(records[0].latency_counts.0, [3, 1, 0]);
    })
    .await;
}

#[tokio::test]
async fn retention_folds_old_minutes_into_hours_keeping_totals_and_keys() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let old = [usage("o1", a, 3600, 1, 10), usage("o2", a, 3660, 2, 20), usage("o3", a, 7200, 4, 40)];
        r.store_usage(&old).await.unwrap();
        r.store_usage(&[usage("new", a, 90_000, 8, 80)]).await.unwrap();
        let before = r.conn().await.unwrap().usage_totals(a, &everything(0, 100_000)).await.unwrap();
        let sum = |rows: &[UsageTotalsRow]| {
            rows.iter()
                .fold((0, 0, 0, 0), |s, t| (s.0 + t.requests, s.1 + t.failures, s.2 + t.slice_us, s.3 + t.inferences))
        };
        // Everything before 80,000 s is old; folding in batches of 2 still folds all three.
        assert_eq!(r.fold_usage(80_000, 2).await.unwrap(), 2);
        assert_eq!(r.fold_usage(80_000, 2).await.unwrap(), 1);
        assert_eq!(r.fold_usage(80_000, 2).await.unwrap(), 0);
        let mut c = r.conn().await.unwrap();
        let after = c.usage_totals(a, &everything(0, 100_000)).await.unwrap();
        assert_eq!(sum(&after), sum(&before), "totals are exact");
        let rows = c.usage_records(a, &everything(0, 100_000)).await.unwrap();
        let shape: Vec<_> = rows.iter().map(|r| (r.period_start, r.period_seconds, r.requests)).collect();
        assert_eq!(shape, [(3600, HOUR, 3), (7200, HOUR, 4), (90_000, MINUTE, 8)]);
        assert_eq!(rows[0].latency_counts.0, [3, 2, 0], "histograms merge");
        assert_eq!(rows[0].key, hour_key(a, "m", 1, "cpu", 3600));
        drop(c);
        // A late replay of a folded record is still a duplicate; a late new record folds into its hour.
        assert_eq!(r.store_usage(&[usage("o1", a, 3600, 1, 10)]).await.unwrap().duplicates, 1);
        r.store_usage(&[usage("late", a, 3720, 5, 50)]).await.unwrap();
        assert_eq!(r.fold_usage(80_000, 10).await.unwrap(), 1);
        let rows = r.conn().await.unwrap().usage_records(a, &everything(0, 4000)).await.unwrap();
        assert_eq!((rows.len(), rows[0].requests, rows[0].slice_us), (1, 8, 80));
    })
    .await;
}

#[tokio::test]
async fn prices_are_audited_and_spend_quota_refuses_new_deployments() {
    on_both(|r| async move {
        let platform = r.create_tenant(&actor(), &name("platform"), "P", true, &QuotaLimits::default()).await.unwrap();
        let a = tenant(&r, "a", QuotaLimits { monthly_spend_cents: 100, ..QuotaLimits::default() }).await;
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        r.create_version(&actor(), &m, version(1)).await.unwrap();
        r.create_deployment(&actor(), a, &name("d"), "m", spec(VersionRef::Latest, 1)).await.unwrap();
        let prices = [PriceRow {
            slice_profile: "cpu".into(),
            effective_from: 0,
            per_slice_hour_micro_cents: 100 * 1_000_000,
            per_1000_inferences_micro_cents: 0,
        }];
        assert_eq!(r.set_prices(&actor(), &prices).await.unwrap(), prices);
        let dup = r.set_prices(&actor(), &[prices[0].clone(), prices[0].clone()]).await.unwrap_err();
        assert_eq!(dup.code(), "duplicate_price");
        assert_eq!(r.conn().await.unwrap().prices().await.unwrap(), prices, "a refused write changes nothing");
        let events = r.conn().await.unwrap().audit_events(platform.id, &AuditFilter::default(), 10).await.unwrap();
        assert_eq!(events[0].action, "prices.update");

        // An hour of slice this month at 100 c/h: the quota of 100 c is reached.
        let minute = now().unix_timestamp() / 60 * 60;
        r.store_usage(&[usage("spent", a, minute, 1, 3_600_000_000)]).await.unwrap();
        assert_eq!(r.conn().await.unwrap().month_spend_cents(a, now()).await.unwrap(), 100);
        let grow = DeploymentPatch { replicas: Some(2), ..DeploymentPatch::default() };
        let e = r.update_deployment(&actor(), a, "d", grow).await.unwrap_err();
        assert_eq!(e.code(), "quota_exceeded.monthly_spend_cents");
        let shrink = DeploymentPatch { replicas: Some(0), ..DeploymentPatch::default() };
        r.update_deployment(&actor(), a, "d", shrink).await.unwrap();
        let m2 = r.create_model(&actor(), a, &name("m2"), "").await.unwrap();
        r.create_version(&actor(), &m2, version(1)).await.unwrap();
        let e = r.create_deployment(&actor(), a, &name("d2"), "m2", spec(VersionRef::Latest, 0)).await.unwrap_err();
        assert_eq!(e.code(), "quota_exceeded.monthly_spend_cents");
        let unlimited = QuotaLimits { monthly_spend_cents: 0, ..QuotaLimits::default() };
        r.set_quota(&actor(), a, &unlimited).await.unwrap();
        r.create_deployment(&actor(), a, &name("d2"), "m2", spec(VersionRef::Latest, 1)).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn the_retention_run_folds_only_minutes_past_the_retention() {
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let day = 86_400;
        let now_unix = 100 * day;
        let batch = [usage("old", a, now_unix - 15 * day, 1, 1), usage("recent", a, now_unix - day, 2, 2)];
        r.store_usage(&batch).await.unwrap();
        let retention = Duration::from_secs(14 * day as u64);
        assert_eq!(crate::usage::fold_old_minutes(&r, now_unix, retention).await.unwrap(), 1);
        assert_eq!(crate::usage::fold_old_minutes(&r, now_unix, retention).await.unwrap(), 0);
        let rows = r.conn().await.unwrap().usage_records(a, &everything(0, now_unix)).await.unwrap();
        let kinds: Vec<_> = rows.iter().map(|r| (r.period_seconds, r.requests)).collect();
        assert_eq!(kinds, [(HOUR, 1), (MINUTE, 2)]);
    })
    .await;
}

/// Reports every placed replica of `d` that is not ready yet as ready on its worker.
async fn all_ready(r: &Registry, tenant_id: Uuid, d: Uuid) {
    let replicas = r.conn().await.unwrap().replicas(tenant_id, d).await.unwrap();
    for replica in replicas.iter().filter(|x| {
        x.state == crate::states::ReplicaState::Scheduled || x.state == crate::states::ReplicaState::Loading
    }) {
        let ready = ReportedState { replica_id: replica.id, state: crate::states::ReplicaState::Ready, reason: None };
        let worker = replica.worker_id.as_deref().expect("placed");
        r.report_states(worker, std::slice::from_ref(&ready)).await.unwrap();
    }
}

async fn weights_of(r: &Registry, d: Uuid) -> Vec<(i64, u32)> {
    let all = r.conn().await.unwrap().route_weights().await.unwrap();
    all.into_iter().find(|w| w.deployment_id == d).map(|w| w.weights).unwrap_or_default()
}

#[tokio::test]
async fn a_canary_is_set_weighted_rolled_back_and_promoted_within_quota() {
    on_both(|r| async move {
        r.register_worker(&new_worker("w1")).await.unwrap();
        let a = tenant(&r, "a", QuotaLimits { replicas: 3, ..QuotaLimits::default() }).await;
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        for _ in 0..2 {
            r.create_version(&actor(), &m, version(10)).await.unwrap();
        }
        let gpu = NewVersion {
            config: Some(serde_json::json!({ "instance_group": [{ "kind": "KIND_GPU" }] })),
            ..version(10)
        };
        r.create_version(&actor(), &m, gpu).await.unwrap();
        let d = r.create_deployment(&actor(), a, &name("d"), "m", spec(VersionRef::Pinned(1), 2)).await.unwrap();
        tick(&r).await;
        all_ready(&r, a, d.id).await;
        tick(&r).await;
        assert_eq!(weights_of(&r, d.id).await, [(1, 100)]);

        // Refusals: other tenant, same version, missing version, GPU version on cpu, quota.
        let canary = |v: i64, weight: i64, replicas: i64| CanarySpec { version: VersionRef::Pinned(v), weight, replicas };
        assert!(matches!(r.set_canary(&actor(), b, "d", canary(2, 10, 1)).await, Err(Error::NotFound("deployment"))));
        for (v, field) in [(1, "version"), (9, "version"), (3, "version")] {
            match r.set_canary(&actor(), a, "d", canary(v, 10, 1)).await {
                Err(Error::InvalidInput { field: Some(f), .. }) => assert_eq!(f, field),
                other => panic!("version {v}: {other:?}"),
            }
        }
        let alias = CanarySpec { version: VersionRef::Alias(name("nope")), weight: 10, replicas: 1 };
        assert!(matches!(r.set_canary(&actor(), a, "d", alias).await, Err(Error::InvalidInput { field: Some(f), .. }) if f == "alias"));
        let over = r.set_canary(&actor(), a, "d", canary(2, 10, 2)).await;
        assert_eq!(over.unwrap_err().code(), "quota_exceeded.replicas");
        assert_eq!(r.set_canary_weight(&actor(), a, "d", 20).await.unwrap_err().code(), "no_canary");
        assert_eq!(r.promote_canary(&actor(), a, "d").await.unwrap_err().code(), "no_canary");

        // Set: its replica loads, then serves, and only then takes its share.
        let set = r.set_canary(&actor(), a, "d", canary(2, 10, 1)).await.unwrap();
        assert_eq!((set.canary_version, set.canary_weight, set.canary_replicas), (Some(2), 10, 1));
        assert_eq!(r.conn().await.unwrap().quota_usage(a).await.unwrap().replicas, 3);
        tick(&r).await;
        let replicas = r.conn().await.unwrap().replicas(a, d.id).await.unwrap();
        let canaries: Vec<_> = replicas.iter().filter(|x| x.canary).collect();
        assert_eq!(canaries.len(), 1);
        assert_eq!((canaries[0].version, canaries[0].serving, canaries[0].worker_id.as_deref()), (2, false, Some("w1")));
        assert_eq!(weights_of(&r, d.id).await, [(1, 100)], "no ready canary replica yet");
        all_ready(&r, a, d.id).await;
        tick(&r).await;
        assert_eq!(weights_of(&r, d.id).await, [(1, 90), (2, 10)]);
        r.set_canary_weight(&actor(), a, "d", 25).await.unwrap();
        assert_eq!(weights_of(&r, d.id).await, [(1, 75), (2, 25)]);
        assert_eq!(r.delete_version(&actor(), &m, 2).await.unwrap_err().code(), "version_in_use");

        // Rolled back: all traffic to the stable version, the canary replica drains.
        let back = r.rollback_canary(&actor(), a, "d").await.unwrap();
        assert_eq!((back.canary_version, back.canary_weight, back.canary_replicas), (None, 0, 0));
        assert_eq!(weights_of(&r, d.id).await, [(1, 100)]);
        tick(&r).await;
        let replicas = r.conn().await.unwrap().replicas(a, d.id).await.unwrap();
        let states: Vec<(&str, bool)> = replicas.iter().filter(|x| x.canary).map(|x| (x.state.as_str(), x.serving)).collect();
        assert_eq!(states, [("draining", false)]);
        assert_eq!(r.rollback_canary(&actor(), a, "d").await.unwrap_err().code(), "no_canary");

        // Promoted: the stable replicas roll out to version 2; the canary keeps its share until
        // they serve it, then is cleared.
        // (The rolled-back replica may still be draining: a new canary does not wait for it.)
        r.set_canary(&actor(), a, "d", canary(2, 30, 1)).await.unwrap();
        tick(&r).await;
        all_ready(&r, a, d.id).await;
        tick(&r).await;
        let promoted = r.promote_canary(&actor(), a, "d").await.unwrap();
        assert_eq!((promoted.version, promoted.alias.as_deref(), promoted.canary_version), (2, None, Some(2)));
        assert_eq!(r.set_canary_weight(&actor(), a, "d", 5).await.unwrap_err().code(), "no_canary");
        assert_eq!(weights_of(&r, d.id).await, [(1, 70), (2, 30)], "the split holds while the rollout loads");
        tick(&r).await;
        all_ready(&r, a, d.id).await;
        tick(&r).await; // the stable replicas switch to version 2
        assert_eq!(weights_of(&r, d.id).await, [(2, 100)]);
        tick(&r).await; // the canary is cleared and drains
        let done = r.conn().await.unwrap().deployment(a, "d").await.unwrap().unwrap();
        assert_eq!((done.version, done.canary_version, done.canary_weight, done.canary_replicas), (2, None, 0, 0));
        let replicas = r.conn().await.unwrap().replicas(a, d.id).await.unwrap();
        assert!(replicas.iter().filter(|x| x.canary).all(|x| x.state == crate::states::ReplicaState::Draining && !x.serving), "{replicas:?}");

        let mut c = r.conn().await.unwrap();
        let kinds: Vec<String> = c.deployment_events(a, d.id, 100).await.unwrap().into_iter().map(|e| e.kind).collect();
        for kind in ["canary_set", "canary_weight", "canary_rolled_back", "canary_promoted", "canary_serving", "canary_cleared"] {
            assert!(kinds.iter().any(|k| k == kind), "{kind} missing from {kinds:?}");
        }
        let audit = c.audit_events(a, &AuditFilter::default(), 100).await.unwrap();
        let actions: Vec<&str> = audit.iter().map(|e| e.action.as_str()).collect();
        for action in ["deployment.canary.set", "deployment.canary.weight", "deployment.canary.rollback", "deployment.canary.promote"] {
            assert!(actions.contains(&action), "{action} missing from {actions:?}");
        }
        drop(c);
        assert_eq!(r.verify_audit_chain(a).await.unwrap().first_break, None);
    })
    .await;
}

fn hook(url: &str, events: &[crate::kinds::WebhookEventType]) -> NewWebhook {
    NewWebhook { url: url.into(), description: String::new(), events: events.to_vec(), secret: "whsec_t".into() }
}

#[tokio::test]
async fn webhook_events_are_queued_with_their_change_and_only_to_subscribers() {
    use crate::kinds::{WebhookDeliveryStatus as S, WebhookEventType as E};
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        let aliases = r.create_webhook(&actor(), a, hook("https://a.example/h", &[E::AliasMoved])).await.unwrap();
        let all = r
            .create_webhook(
                &actor(),
                a,
                hook("https://a.example/all", &[E::AliasMoved, E::VersionUploaded, E::DeploymentCreated]),
            )
            .await
            .unwrap();
        let other = r.create_webhook(&actor(), b, hook("https://b.example/h", &[E::AliasMoved])).await.unwrap();
        let m = r.create_model(&actor(), a, &name("m"), "").await.unwrap();
        r.create_version(&actor(), &m, version(1)).await.unwrap();
        r.set_alias(&actor(), &m, &name("prod"), 1).await.unwrap();
        // A change that fails queues nothing (its transaction rolls back with the outbox row).
        assert!(r.set_alias(&actor(), &m, &name("prod"), 9).await.is_err());
        r.create_deployment(&actor(), a, &name("d"), "m", spec(VersionRef::Latest, 1)).await.unwrap();

        let mut c = r.conn().await.unwrap();
        let types = |rows: &[DeliveryRow]| rows.iter().rev().map(|d| d.event_type.clone()).collect::<Vec<_>>();
        let to_aliases = c.webhook_deliveries(a, aliases.id, None, None, 50).await.unwrap();
        assert_eq!(types(&to_aliases), ["alias.moved"]);
        let to_all = c.webhook_deliveries(a, all.id, None, None, 50).await.unwrap();
        assert_eq!(types(&to_all), ["version.uploaded", "alias.moved", "deployment.created"]);
        assert!(c.webhook_deliveries(b, other.id, None, None, 50).await.unwrap().is_empty(), "other tenant");
        assert!(c.webhook_deliveries(b, aliases.id, None, None, 50).await.unwrap().is_empty(), "scoped by tenant");
        let body: serde_json::Value = serde_json::from_str(&to_aliases[0].payload).unwrap();
        assert_eq!(body["type"], "alias.moved");
        assert_eq!(
            body["data"],
            serde_json::json!({"model": "m", "alias": "prod", "version": 1, "previous_version": null})
        );
        let created: serde_json::Value = serde_json::from_str(&to_all[0].payload).unwrap();
        assert_eq!((created["data"]["deployment"].as_str(), created["data"]["model"].as_str()), (Some("d"), Some("m")));

        // The dispatcher's view: every due delivery, across tenants, with its hook's secret.
        let due = c.due_webhook_deliveries(now(), 50).await.unwrap();
        assert_eq!(due.len(), 4);
        assert!(due.iter().all(|d| d.secret == "whsec_t" && !d.allow_private));
        let first = &to_aliases[0];
        let retry_at = now() + std::time::Duration::from_secs(60);
        let failed = AttemptOutcome {
            status: S::Pending,
            http_status: Some(500),
            error: Some("receiver answered 500".into()),
            next_attempt_at: Some(retry_at),
        };
        c.record_webhook_attempt(first.id, &failed).await.unwrap();
        assert_eq!(c.due_webhook_deliveries(now(), 50).await.unwrap().len(), 3, "not due before its retry time");
        let ok = AttemptOutcome { status: S::Delivered, http_status: Some(204), error: None, next_attempt_at: None };
        c.record_webhook_attempt(first.id, &ok).await.unwrap();
        let d = c.webhook_delivery(a, aliases.id, first.id).await.unwrap().unwrap();
        assert_eq!((d.status.as_str(), d.attempts, d.last_http_status), ("delivered", 2, Some(204)));
        assert!(d.delivered_at.is_some());
        // Recorded only while pending: a late duplicate does not undo "delivered".
        c.record_webhook_attempt(first.id, &failed).await.unwrap();
        assert_eq!(c.webhook_delivery(a, aliases.id, first.id).await.unwrap().unwrap().attempts, 2);
        let delivered = c.webhook_deliveries(a, aliases.id, Some(S::Delivered), None, 50).await.unwrap();
        assert_eq!(delivered.len(), 1);
        assert!(c.webhook_deliveries(a, aliases.id, Some(S::Failed), None, 50).await.unwrap().is_empty());
        drop(c);

        // A replay is a new delivery of the same event; a ping reaches a hook that did not
        // subscribe to anything like it; disabled hooks get nothing new.
        let replay = r.replay_webhook_delivery(&actor(), a, aliases.id, first.id).await.unwrap();
        assert_eq!(
            (replay.event_id, replay.replay_of, replay.status.as_str()),
            (first.event_id, Some(first.id), "pending")
        );
        assert!(r.replay_webhook_delivery(&actor(), b, aliases.id, first.id).await.is_err(), "other tenant");
        let ping = r.ping_webhook(&actor(), a, aliases.id).await.unwrap();
        assert_eq!(ping.event_type, "ping");
        let patch = WebhookPatch { enabled: Some(false), ..WebhookPatch::default() };
        r.update_webhook(&actor(), a, aliases.id, patch).await.unwrap();
        r.set_alias(&actor(), &m, &name("staging"), 1).await.unwrap();
        let mut c = r.conn().await.unwrap();
        assert_eq!(
            c.webhook_deliveries(a, aliases.id, None, None, 50).await.unwrap().len(),
            3,
            "disabled: nothing new"
        );
        assert!(c.due_webhook_deliveries(now(), 50).await.unwrap().iter().all(|d| d.webhook_id != aliases.id));
        drop(c);

        let rotated = r.rotate_webhook_secret(&actor(), a, all.id, "whsec_new".into()).await.unwrap();
        assert_eq!(rotated.secret, "whsec_new");
        r.set_webhooks_allow_private(&actor(), a, true).await.unwrap();
        let mut c = r.conn().await.unwrap();
        assert!(c.webhooks_allow_private(a).await.unwrap() && !c.webhooks_allow_private(b).await.unwrap());
        drop(c);
        r.delete_webhook(&actor(), a, aliases.id).await.unwrap();
        let mut c = r.conn().await.unwrap();
        assert!(c.webhook_deliveries(a, aliases.id, None, None, 50).await.unwrap().is_empty());
        let actions: Vec<String> =
            c.audit_events(a, &AuditFilter::default(), 100).await.unwrap().into_iter().map(|e| e.action).collect();
        for action in [
            "webhook.create",
            "webhook.update",
            "webhook.delete",
            "webhook.secret.rotate",
            "webhook.delivery.replay",
            "webhook.ping",
            "webhook_settings.update",
        ] {
            assert!(actions.iter().any(|a| a == action), "{action} audited");
        }
    })
    .await;
}

fn oidc_issuer(tenant_id: Uuid, secret: &str) -> OidcIssuerRow {
    let at = now();
    OidcIssuerRow {
        tenant_id,
        issuer: "https://id.example.com".into(),
        client_id: "tessera".into(),
        client_secret: secret.into(),
        scopes: "openid email".into(),
        email_claim: "email".into(),
        role_claim: Some("groups".into()),
        role_mapping: r#"{"admins": "tenant-admin"}"#.into(),
        default_role: Some("viewer".into()),
        provision_users: true,
        created_at: at,
        updated_at: at,
    }
}

#[tokio::test]
async fn sign_ins_are_single_use_and_sessions_name_their_user() {
    use crate::types::Role;
    on_both(|r| async move {
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        r.set_oidc_issuer(&actor(), oidc_issuer(a, "one")).await.unwrap();
        let replaced = r.set_oidc_issuer(&actor(), oidc_issuer(a, "two")).await.unwrap();
        let mut c = r.conn().await.unwrap();
        let stored = c.oidc_issuer(a).await.unwrap().unwrap();
        assert_eq!(
            (stored.client_secret.as_str(), stored.mapping()),
            ("two", vec![("admins".into(), Role::TenantAdmin)])
        );
        assert_eq!(stored.created_at, replaced.created_at);
        assert!(c.oidc_issuer(b).await.unwrap().is_none(), "issuers are per tenant");

        let at = now();
        let login = OidcLoginRow {
            state_hash: "h1".into(),
            tenant_id: a,
            nonce: "n".into(),
            code_verifier: "v".into(),
            redirect_uri: "https://t.example/cb".into(),
            return_to: "/".into(),
            created_at: at,
            expires_at: at + time::Duration::minutes(10),
            used_at: None,
        };
        c.insert_oidc_login(&login).await.unwrap();
        let taken = c.take_oidc_login("h1").await.unwrap().unwrap();
        assert_eq!((taken.nonce.as_str(), taken.tenant_id), ("n", a));
        assert!(taken.used_at.is_some());
        assert!(c.take_oidc_login("h1").await.unwrap().is_none(), "a state is good once");
        assert!(c.take_oidc_login("unknown").await.unwrap().is_none());
        drop(c);

        let ada = r.provision_user(&actor(), a, "ada@x.io", "Ada", Role::Viewer).await.unwrap();
        let again = r.provision_user(&actor(), a, "ada@x.io", "Ada", Role::Deployer).await.unwrap();
        assert_eq!((again.id, again.role()), (ada.id, Role::Viewer), "a second provisioning finds the first");
        let new = NewConsoleSession {
            token_hash: "t1".into(),
            csrf_token: "c1".into(),
            tenant_id: a,
            user_id: ada.id,
            role: Role::Viewer,
            expires_at: now() + time::Duration::hours(1),
        };
        let id = r.open_console_session(&Actor { user_id: Some(ada.id), key_id: None, ..actor() }, new).await.unwrap();
        let mut c = r.conn().await.unwrap();
        let s = c.console_session("t1").await.unwrap().unwrap();
        assert_eq!((s.id, s.tenant_name.as_str(), s.email.as_str(), s.role()), (id, "a", "ada@x.io", Role::Viewer));
        assert!(s.revoked_at.is_none() && s.user_disabled_at.is_none());
        drop(c);
        // Another tenant cannot revoke it; its own can, once.
        r.revoke_console_session(&actor(), b, id).await.unwrap();
        assert!(r.conn().await.unwrap().console_session("t1").await.unwrap().unwrap().revoked_at.is_none());
        r.revoke_console_session(&actor(), a, id).await.unwrap();
        r.revoke_console_session(&actor(), a, id).await.unwrap();
        assert!(r.conn().await.unwrap().console_session("t1").await.unwrap().unwrap().revoked_at.is_some());
        r.disable_user(&actor(), a, ada.id).await.unwrap();
        assert!(r.conn().await.unwrap().console_session("t1").await.unwrap().unwrap().user_disabled_at.is_some());

        let mut c = r.conn().await.unwrap();
        let events = c.audit_events(a, &AuditFilter::default(), 20).await.unwrap();
        let actions: Vec<&str> = events.iter().map(|e| e.action.as_str()).collect();
        for want in ["oidc_issuer.set", "user.create", "session.sign_in", "session.sign_out", "user.disable"] {
            assert!(actions.contains(&want), "{want} missing from {actions:?}");
        }
        assert_eq!(actions.iter().filter(|a| **a == "session.sign_out").count(), 1, "revoking twice audits once");
        assert!(
            events.iter().all(|e| !e.after_state.as_deref().unwrap_or("").contains("two")),
            "no secret in the trail"
        );
        drop(c);
        r.delete_oidc_issuer(&actor(), a).await.unwrap();
        assert!(matches!(r.delete_oidc_issuer(&actor(), a).await, Err(Error::NotFound(_))));
        let report = r.verify_audit_chain(a).await.unwrap();
        assert_eq!(report.first_break, None);
    })
    .await;
}

/// The statuses of a page of deployments, and the statements they took on their connection.
async fn counted_statuses(
    r: &Registry,
    tenant_id: Uuid,
    rows: Vec<DeploymentRow>,
) -> (usize, Vec<crate::deployments::Deployment>) {
    let mut c = r.conn().await.unwrap();
    let gateway = crate::deployments::status::Gateway::default();
    let statuses = crate::deployments::status::statuses(&mut c, gateway, tenant_id, rows).await.unwrap();
    (c.queries(), statuses)
}

#[tokio::test]
async fn deployment_statuses_take_the_same_queries_for_one_deployment_as_for_many() {
    on_both(|r| async move {
        r.register_worker(&new_worker("w1")).await.unwrap();
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        const MIB: i64 = 1 << 20;
        for i in 0..5 {
            let m = r.create_model(&actor(), a, &name(&format!("m{i}")), "").await.unwrap();
            r.create_version(&actor(), &m, version(MIB)).await.unwrap();
            // The target (latest) version differs in size per deployment, and so its memory.
            r.create_version(&actor(), &m, version((20 + i) * MIB)).await.unwrap();
            let (d, model) = (name(&format!("d{i}")), format!("m{i}"));
            r.create_deployment(&actor(), a, &d, &model, spec(VersionRef::Latest, 2)).await.unwrap();
        }
        // Another tenant's deployment with the same names: none of its replicas may show.
        let other = r.create_model(&actor(), b, &name("m0"), "").await.unwrap();
        r.create_version(&actor(), &other, version(MIB)).await.unwrap();
        r.create_deployment(&actor(), b, &name("d0"), "m0", spec(VersionRef::Latest, 3)).await.unwrap();
        tick(&r).await;

        let rows = r.conn().await.unwrap().deployments(a).await.unwrap();
        assert_eq!(rows.len(), 5);
        let (one, first) = counted_statuses(&r, a, rows[..1].to_vec()).await;
        let (many, all) = counted_statuses(&r, a, rows.clone()).await;
        assert_eq!((one, many), (3, 3), "workers, replicas and version sizes, whatever the page");
        assert_eq!(counted_statuses(&r, a, Vec::new()).await.0, 0);

        assert_eq!(all.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["d0", "d1", "d2", "d3", "d4"]);
        for (i, d) in (0_i64..).zip(&all) {
            assert_eq!(d.version, 2);
            assert_eq!(d.memory_bytes, 4 * (20 + i) * MIB, "{}", d.name);
            assert_eq!(d.replica_status.len(), 2, "{}: its own replicas only", d.name);
            assert!(d.replica_status.iter().all(|s| s.version == 2 && s.worker_id.as_deref() == Some("w1")));
        }
        // A page shows each deployment as reading it alone does.
        let json = |d: &crate::deployments::Deployment| serde_json::to_value(d).unwrap();
        assert_eq!(json(&first[0]), json(&all[0]));
        for (row, shown) in rows.into_iter().zip(&all) {
            let (_, alone) = counted_statuses(&r, a, vec![row]).await;
            assert_eq!(json(&alone[0]), json(shown));
        }
    })
    .await;
}

/// The state tenant `t`'s deployment `d` reads now.
async fn state_of(r: &Registry, t: Uuid, d: &str) -> crate::states::DeploymentState {
    let row = r.conn().await.unwrap().deployment(t, d).await.unwrap().expect("deployment");
    let (_, statuses) = counted_statuses(r, t, vec![row]).await;
    statuses[0].state
}

/// Has worker `w` report its current generation applied (its next heartbeat).
async fn apply(r: &Registry, w: &str) {
    let mut c = r.conn().await.unwrap();
    let generation = c.worker_generation(w).await.unwrap().expect("registered");
    assert!(c.heartbeat(w, now(), generation).await.unwrap());
}

#[tokio::test]
async fn a_deployment_waits_only_for_its_own_changes_to_be_applied() {
    use crate::states::DeploymentState::{Progressing, Ready};
    on_both(|r| async move {
        r.register_worker(&new_worker("w1")).await.unwrap();
        let a = tenant(&r, "a", QuotaLimits::default()).await;
        let b = tenant(&r, "b", QuotaLimits::default()).await;
        for t in [a, b] {
            let m = r.create_model(&actor(), t, &name("m"), "").await.unwrap();
            r.create_version(&actor(), &m, version(1 << 20)).await.unwrap();
        }
        let da = r.create_deployment(&actor(), a, &name("d"), "m", spec(VersionRef::Latest, 1)).await.unwrap();
        tick(&r).await;
        all_ready(&r, a, da.id).await;
        assert_eq!(state_of(&r, a, "d").await, Progressing, "placed and loaded, not yet applied");
        apply(&r, "w1").await;
        assert_eq!(state_of(&r, a, "d").await, Ready);

        // Another tenant deploys onto the same worker: its generation moves, a's does not.
        let db = r.create_deployment(&actor(), b, &name("d"), "m", spec(VersionRef::Latest, 1)).await.unwrap();
        assert_eq!(tick(&r).await.into_iter().collect::<Vec<_>>(), ["w1"]);
        all_ready(&r, b, db.id).await;
        for _ in 0..3 {
            assert_eq!(state_of(&r, a, "d").await, Ready, "b's rollout is no change of a's");
        }
        assert_eq!(state_of(&r, b, "d").await, Progressing, "b's own replica waits for the worker");
        apply(&r, "w1").await;
        assert_eq!(state_of(&r, b, "d").await, Ready);

        // A capture change reaches the worker without a rollout: a stays ready.
        let capture = DeploymentPatch { capture: Some(serde_json::json!({ "enabled": true })), ..Default::default() };
        let before = r.conn().await.unwrap().worker_generation("w1").await.unwrap();
        r.update_deployment(&actor(), a, "d", capture).await.unwrap();
        assert!(r.conn().await.unwrap().worker_generation("w1").await.unwrap() > before, "the worker hears of it");
        assert_eq!(state_of(&r, a, "d").await, Ready);

        // A scale change is a's own: progressing until the worker applied it.
        r.update_deployment(&actor(), a, "d", DeploymentPatch { replicas: Some(2), ..Default::default() })
            .await
            .unwrap();
        tick(&r).await;
        all_ready(&r, a, da.id).await;
        assert_eq!(state_of(&r, a, "d").await, Progressing);
        assert_eq!(state_of(&r, b, "d").await, Ready, "and no change of b's");
        apply(&r, "w1").await;
        assert_eq!(state_of(&r, a, "d").await, Ready);
        // Scaling down deletes a replica from the worker; the one left waits for that too.
        r.update_deployment(&actor(), a, "d", DeploymentPatch { replicas: Some(1), ..Default::default() })
            .await
            .unwrap();
        tick(&r).await;
        assert_eq!(r.conn().await.unwrap().replicas(a, da.id).await.unwrap().len(), 1);
        assert_eq!(state_of(&r, a, "d").await, Progressing);
        apply(&r, "w1").await;
        assert_eq!(state_of(&r, a, "d").await, Ready);

        // A worker that registers again has applied nothing of its new set yet.
        r.register_worker(&new_worker("w1")).await.unwrap();
        assert_eq!(state_of(&r, a, "d").await, Progressing);
        assert_eq!(state_of(&r, b, "d").await, Progressing);
        apply(&r, "w1").await;
        assert_eq!(state_of(&r, a, "d").await, Ready);
    })
    .await;
}
