//! Deployments (a model version or alias on a slice profile, with replicas), their replicas
//! and placement events. API writes and scheduler ticks both run under
//! [`Conn::lock_scheduling`], so a tick never applies a plan made from a stale deployment.

use serde_json::{Value, json};
use sqlx::FromRow;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{Actor, NewAuditEvent};
use super::{Conn, ConnInner, Registry, exec, now, on_conn, on_unique};
use crate::error::{Error, QuotaName, Result};
use crate::states::ReplicaState;
use crate::types::Name;

/// Key of the Postgres advisory lock that serialises scheduling decisions (ticks and
/// deployment writes); any constant unique to Tessera.
const SCHEDULING_LOCK: i64 = crate::locks::SCHEDULING;

/// A deployment, with its model's name.
#[derive(Debug, Clone, FromRow)]
pub struct DeploymentRow {
    /// Id.
    pub id: Uuid,
    /// Tenant.
    pub tenant_id: Uuid,
    /// Name, unique in the tenant.
    pub name: String,
    /// Model.
    pub model_id: Uuid,
    /// Model name.
    pub model_name: String,
    /// Target version.
    pub version: i64,
    /// Alias followed, if any.
    pub alias: Option<String>,
    /// Slice profile.
    pub profile: String,
    /// Replicas wanted.
    pub replicas: i64,
    /// Model instances per replica.
    pub instance_count: i64,
    /// Max batch size, if set.
    pub max_batch_size: Option<i64>,
    /// Dynamic batching settings, if set.
    pub dynamic_batching: Option<Json<Value>>,
    /// Memory per replica, if set.
    pub memory_bytes: Option<i64>,
    /// Request/response capture settings, if ever set (`crate::capture::CaptureSettings`).
    pub capture: Option<Json<Value>>,
    /// Grows with every change that needs new replicas besides the version.
    pub spec_generation: i64,
    /// The canary's version, if there is a canary (equal to `version` while a promotion rolls
    /// out; the scheduler clears it once the stable replicas serve it).
    pub canary_version: Option<i64>,
    /// Percent (1..99) of unversioned traffic the canary gets; 0 without a canary.
    pub canary_weight: i64,
    /// Canary replicas wanted; 0 without a canary.
    pub canary_replicas: i64,
    /// Creating key.
    pub created_by: Option<Uuid>,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Last changed.
    pub updated_at: OffsetDateTime,
}

impl DeploymentRow {
    pub(super) fn summary(&self) -> Value {
        json!({
            "name": self.name, "model": self.model_name, "version": self.version, "alias": self.alias,
            "profile": self.profile, "replicas": self.replicas, "instance_count": self.instance_count,
            "max_batch_size": self.max_batch_size, "dynamic_batching": self.dynamic_batching.as_ref().map(|j| &j.0),
            "memory_bytes": self.memory_bytes, "capture": self.capture.as_ref().map(|j| &j.0),
            "canary": self.canary_version.map(|v| json!({
                "version": v, "weight": self.canary_weight, "replicas": self.canary_replicas,
            })),
        })
    }
}

/// A replica of a deployment.
#[derive(Debug, Clone, FromRow)]
pub struct ReplicaRow {
    /// Id.
    pub id: Uuid,
    /// Tenant.
    pub tenant_id: Uuid,
    /// Deployment.
    pub deployment_id: Uuid,
    /// Index within the deployment.
    pub replica_index: i64,
    /// Version.
    pub version: i64,
    /// Spec generation it was made for.
    pub spec_generation: i64,
    /// Slice profile.
    pub profile: String,
    /// Memory it needs.
    pub memory_bytes: i64,
    /// Rendered model config.
    pub config: Json<Value>,
    /// Worker, if placed.
    pub worker_id: Option<String>,
    /// Slice, if placed.
    pub slice_id: Option<String>,
    /// Where it is in its life.
    #[sqlx(try_from = "String")]
    pub state: ReplicaState,
    /// Why it is pending or failed.
    pub reason: Option<String>,
    /// The scheduler's intent that unversioned requests reach it (they do only while it is
    /// ready: [`ReplicaState::serves`]).
    pub serving: bool,
    /// End of its drain.
    pub drain_until: Option<OffsetDateTime>,
    /// Times it was moved off a worker where its runner kept dying (0 once ready).
    pub crash_moves: i64,
    /// A canary replica (the deployment's second version), not a stable one.
    pub canary: bool,
    /// The worker generation at which its deployment last changed its assignments on that
    /// worker: it serves as meant once the worker applied this one (a later generation may be
    /// another deployment's change, which it need not wait for).
    pub assigned_generation: i64,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Last changed.
    pub updated_at: OffsetDateTime,
}

/// A placement event.
#[derive(Debug, Clone, FromRow)]
pub struct DeploymentEventRow {
    /// Order.
    pub seq: i64,
    /// When.
    pub at: OffsetDateTime,
    /// Kind.
    pub kind: String,
    /// Replica concerned.
    pub replica_id: Option<Uuid>,
    /// Worker concerned.
    pub worker_id: Option<String>,
    /// Detail.
    pub message: String,
}

/// Which version a deployment runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionRef {
    /// The model's latest version when the deployment is written (then pinned).
    Latest,
    /// A fixed version.
    Pinned(i64),
    /// Whatever an alias points at, followed as it moves.
    Alias(Name),
}

/// A deployment's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentSpec {
    /// Version to run.
    pub version: VersionRef,
    /// Slice profile (checked by the API).
    pub profile: String,
    /// Replicas.
    pub replicas: i64,
    /// Model instances per replica.
    pub instance_count: i64,
    /// Max batch size.
    pub max_batch_size: Option<i64>,
    /// Dynamic batching settings.
    pub dynamic_batching: Option<Value>,
    /// Memory per replica.
    pub memory_bytes: Option<i64>,
    /// Capture settings (checked by the API).
    pub capture: Option<Value>,
}

/// Changes to a deployment; `None` leaves a field as it is, `Some(None)` clears it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeploymentPatch {
    /// New version reference.
    pub version: Option<VersionRef>,
    /// New profile.
    pub profile: Option<String>,
    /// New replica count.
    pub replicas: Option<i64>,
    /// New instance count.
    pub instance_count: Option<i64>,
    /// New max batch size.
    pub max_batch_size: Option<Option<i64>>,
    /// New batching settings.
    pub dynamic_batching: Option<Option<Value>>,
    /// New memory per replica.
    pub memory_bytes: Option<Option<i64>>,
    /// New capture settings (a change reaches the workers without a rollout).
    pub capture: Option<Value>,
}

macro_rules! select_deployments {
    ($rest:literal) => {
        concat!(
            "SELECT d.id, d.tenant_id, d.name, d.model_id, m.name AS model_name, d.version, d.alias, d.profile, ",
            "d.replicas, d.instance_count, d.max_batch_size, d.dynamic_batching, d.memory_bytes, d.capture, d.spec_generation, ",
            "d.canary_version, d.canary_weight, d.canary_replicas, ",
            "d.created_by, d.created_at, d.updated_at FROM deployments d JOIN models m ON m.id = d.model_id ",
            $rest
        )
    };
}

macro_rules! select_replicas {
    ($rest:literal) => {
        concat!(
            "SELECT id, tenant_id, deployment_id, replica_index, version, spec_generation, profile, memory_bytes, ",
            "config, worker_id, slice_id, state, reason, serving, drain_until, crash_moves, canary, ",
            "assigned_generation, created_at, updated_at ",
            "FROM replicas ",
            $rest
        )
    };
}
pub(super) use {select_deployments, select_replicas};

impl Conn {
    /// Serialises scheduling decisions for the rest of the transaction: a Postgres advisory
    /// transaction lock (SQLite's write transaction already excludes every other writer).
    pub async fn lock_scheduling(&mut self) -> Result<()> {
        let started = std::time::Instant::now();
        self.queries += 1;
        let result = match &mut self.inner {
            ConnInner::PostgresTx(tx) => sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(SCHEDULING_LOCK)
                .execute(&mut **tx)
                .await
                .map(|_| ()),
            ConnInner::Postgres(_) => Err(sqlx::Error::Protocol("lock_scheduling outside a transaction".into())),
            ConnInner::Sqlite(_) | ConnInner::SqliteTx(_) => Ok(()),
        };
        crate::metrics::observe_query("scheduling.lock", started.elapsed(), result.is_ok());
        result.map_err(Error::from)
    }

    /// A deployment by name in a tenant.
    pub async fn deployment(&mut self, tenant_id: Uuid, name: &str) -> Result<Option<DeploymentRow>> {
        on_conn!(self, "deployment.get", |c| sqlx::query_as::<_, DeploymentRow>(select_deployments!(
            "WHERE d.tenant_id = $1 AND d.name = $2"
        ))
        .bind(tenant_id)
        .bind(name)
        .fetch_optional(c))
    }

    /// A tenant's deployments by name.
    pub async fn deployments(&mut self, tenant_id: Uuid) -> Result<Vec<DeploymentRow>> {
        on_conn!(self, "deployment.list", |c| sqlx::query_as::<_, DeploymentRow>(select_deployments!(
            "WHERE d.tenant_id = $1 ORDER BY d.name"
        ))
        .bind(tenant_id)
        .fetch_all(c))
    }

    /// The deployment of a model, if any.
    pub async fn deployment_of_model(&mut self, tenant_id: Uuid, model_id: Uuid) -> Result<Option<DeploymentRow>> {
        on_conn!(self, "deployment.of_model", |c| sqlx::query_as::<_, DeploymentRow>(select_deployments!(
            "WHERE d.tenant_id = $1 AND d.model_id = $2"
        ))
        .bind(tenant_id)
        .bind(model_id)
        .fetch_optional(c))
    }

    /// A deployment's replicas by index, then version.
    pub async fn replicas(&mut self, tenant_id: Uuid, deployment_id: Uuid) -> Result<Vec<ReplicaRow>> {
        on_conn!(self, "replica.list", |c| sqlx::query_as::<_, ReplicaRow>(select_replicas!(
            "WHERE tenant_id = $1 AND deployment_id = $2 ORDER BY replica_index, version, created_at"
        ))
        .bind(tenant_id)
        .bind(deployment_id)
        .fetch_all(c))
    }

    /// The replicas of several deployments of a tenant, in one query, by deployment, then as
    /// [`Conn::replicas`] orders them. `deployment_ids` is a page (at most a few hundred).
    pub async fn replicas_of(&mut self, tenant_id: Uuid, deployment_ids: &[Uuid]) -> Result<Vec<ReplicaRow>> {
        if deployment_ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "{}WHERE tenant_id = $1 AND deployment_id IN ({}) ORDER BY deployment_id, replica_index, version, created_at",
            select_replicas!(""),
            super::placeholders(2, deployment_ids.len())
        );
        on_conn!(self, "replica.list_of", |c| {
            let mut query = sqlx::query_as::<_, ReplicaRow>(sqlx::AssertSqlSafe(sql)).bind(tenant_id);
            for id in deployment_ids {
                query = query.bind(*id);
            }
            query.fetch_all(c)
        })
    }

    /// The latest `limit` events of a deployment, oldest first.
    pub async fn deployment_events(
        &mut self,
        tenant_id: Uuid,
        deployment_id: Uuid,
        limit: i64,
    ) -> Result<Vec<DeploymentEventRow>> {
        let mut rows = self.deployment_events_before(tenant_id, deployment_id, None, limit).await?;
        rows.reverse();
        Ok(rows)
    }

    /// At most `limit` events of a deployment older than `before_seq` (all when `None`),
    /// newest first: a page of the events list.
    pub async fn deployment_events_before(
        &mut self,
        tenant_id: Uuid,
        deployment_id: Uuid,
        before_seq: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeploymentEventRow>> {
        on_conn!(self, "deployment_event.list", |c| sqlx::query_as::<_, DeploymentEventRow>(
            "SELECT seq, at, kind, replica_id, worker_id, message FROM deployment_events \
             WHERE tenant_id = $1 AND deployment_id = $2 AND seq < COALESCE($3, 9223372036854775807) \
             ORDER BY seq DESC LIMIT $4"
        )
        .bind(tenant_id)
        .bind(deployment_id)
        .bind(before_seq)
        .bind(limit)
        .fetch_all(c))
    }

    /// Records a placement event.
    pub async fn insert_deployment_event(
        &mut self,
        tenant_id: Uuid,
        deployment_id: Uuid,
        kind: &str,
        replica_id: Option<Uuid>,
        worker_id: Option<&str>,
        message: &str,
    ) -> Result<()> {
        // The API lists kinds as a closed enum: a new one must be added there (tests catch it).
        debug_assert!(
            crate::kinds::DeploymentEventKind::parse(kind).is_some(),
            "deployment event kind {kind} is missing from crate::kinds::DeploymentEventKind"
        );
        exec!(self, "deployment_event.insert", |c| sqlx::query(
            "INSERT INTO deployment_events (tenant_id, deployment_id, at, kind, replica_id, worker_id, message) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)"
        )
        .bind(tenant_id)
        .bind(deployment_id)
        .bind(now())
        .bind(kind)
        .bind(replica_id)
        .bind(worker_id)
        .bind(message)
        .execute(c))?;
        // In the same transaction: the webhook outbox gets the event or neither does.
        self.enqueue_deployment_webhook(tenant_id, deployment_id, kind, replica_id, message).await
    }

    /// Whether a deployment still has replicas of a version (old ones of a rollout).
    pub async fn version_has_replicas(&mut self, tenant_id: Uuid, deployment_id: Uuid, version: i64) -> Result<bool> {
        let n: i64 = on_conn!(self, "replica.count_version", |c| sqlx::query_scalar(
            "SELECT COUNT(*) FROM replicas WHERE tenant_id = $1 AND deployment_id = $2 AND version = $3"
        )
        .bind(tenant_id)
        .bind(deployment_id)
        .bind(version)
        .fetch_one(c))?;
        Ok(n > 0)
    }

    /// Replicas the tenant's deployments ask for, in total (canary replicas count).
    pub async fn replica_usage(&mut self, tenant_id: Uuid) -> Result<i64> {
        on_conn!(self, "deployment.replica_usage", |c| sqlx::query_scalar::<_, i64>(
            "SELECT CAST(COALESCE(SUM(replicas + canary_replicas), 0) AS BIGINT) FROM deployments WHERE tenant_id = $1"
        )
        .bind(tenant_id)
        .fetch_one(c))
    }

    /// Bumps the assignment generation of every worker holding a replica of the deployment.
    async fn touch_workers_of(&mut self, tenant_id: Uuid, deployment_id: Uuid) -> Result<()> {
        exec!(self, "worker.touch_for_deployment", |c| sqlx::query(
            "UPDATE workers SET generation = generation + 1 WHERE id IN \
             (SELECT worker_id FROM replicas WHERE tenant_id = $1 AND deployment_id = $2 AND worker_id IS NOT NULL)"
        )
        .bind(tenant_id)
        .bind(deployment_id)
        .execute(c))?;
        Ok(())
    }

    /// Resolves a version reference of a model to a version number that exists.
    pub(super) async fn resolve_version(
        &mut self,
        tenant_id: Uuid,
        model_id: Uuid,
        version: &VersionRef,
    ) -> Result<i64> {
        match version {
            VersionRef::Latest => {
                let latest = self.versions(tenant_id, model_id, None, 1).await?;
                latest.first().map(|v| v.version).ok_or(Error::NotFound("version"))
            }
            VersionRef::Pinned(n) => {
                self.version(tenant_id, model_id, *n).await?.map(|v| v.version).ok_or(Error::NotFound("version"))
            }
            VersionRef::Alias(alias) => self
                .alias(tenant_id, model_id, alias.as_str())
                .await?
                .map(|a| a.version)
                .ok_or(Error::NotFound("alias")),
        }
    }

    /// Refuses a profile the version's stored config contradicts (a `KIND_GPU` model on `cpu`).
    pub(super) async fn check_profile_fits(
        &mut self,
        tenant_id: Uuid,
        model_id: Uuid,
        version: i64,
        profile: &str,
    ) -> Result<()> {
        let row = self.version(tenant_id, model_id, version).await?;
        crate::model_config::check_profile_json(row.as_ref().and_then(|v| v.config.as_ref()).map(|c| &c.0), profile)
    }

    /// Refuses `delta` more replicas over the replica quota, and any growth (or, with
    /// `creating`, any new deployment) once the month's spend reached its quota.
    pub(super) async fn check_replica_quota(&mut self, tenant_id: Uuid, delta: i64, creating: bool) -> Result<()> {
        if delta <= 0 && !creating {
            return Ok(());
        }
        let limits = self.quota(tenant_id).await?;
        limits.check_spend(self.month_spend_cents(tenant_id, now()).await?)?;
        let used = self.replica_usage(tenant_id).await?;
        if delta <= 0 {
            return Ok(());
        }
        limits.check(QuotaName::Replicas, used.saturating_add(delta))
    }
}

/// What a deployment that followed `alias` and now runs `version` pinned says: moving the
/// alias no longer rolls it.
pub fn unfollowed_alias(alias: &str, version: i64) -> String {
    format!(
        "pinned to version {version}: no longer follows alias '{alias}' (moving the alias will not roll this \
         deployment; set the alias on the deployment to follow it again)"
    )
}

impl Registry {
    /// Creates a deployment: one per model, names unique per tenant, within the replica quota.
    pub async fn create_deployment(
        &self,
        actor: &Actor,
        tenant_id: Uuid,
        name: &Name,
        model: &str,
        spec: DeploymentSpec,
    ) -> Result<DeploymentRow> {
        let mut tx = self.begin().await?;
        tx.lock_tenant(tenant_id).await?;
        tx.lock_scheduling().await?;
        let model = tx.model(tenant_id, model).await?.ok_or(Error::NotFound("model"))?;
        if tx.deployment(tenant_id, name.as_str()).await?.is_some() {
            return Err(Error::conflict(
                crate::error::ErrorCode::AlreadyExists,
                format!("deployment '{name}' already exists"),
            ));
        }
        if let Some(other) = tx.deployment_of_model(tenant_id, model.id).await? {
            let message = format!("model '{}' is already deployed by deployment '{}'", model.name, other.name);
            return Err(Error::conflict(crate::error::ErrorCode::ModelDeployed, message));
        }
        let version = tx.resolve_version(tenant_id, model.id, &spec.version).await?;
        tx.check_profile_fits(tenant_id, model.id, version, &spec.profile).await?;
        tx.check_replica_quota(tenant_id, spec.replicas, true).await?;
        let at = now();
        let row = DeploymentRow {
            id: Uuid::now_v7(),
            tenant_id,
            name: name.to_string(),
            model_id: model.id,
            model_name: model.name.clone(),
            version,
            alias: match &spec.version {
                VersionRef::Alias(a) => Some(a.to_string()),
                _ => None,
            },
            profile: spec.profile,
            replicas: spec.replicas,
            instance_count: spec.instance_count,
            max_batch_size: spec.max_batch_size,
            dynamic_batching: spec.dynamic_batching.map(Json),
            memory_bytes: spec.memory_bytes,
            capture: spec.capture.map(Json),
            spec_generation: 1,
            canary_version: None,
            canary_weight: 0,
            canary_replicas: 0,
            created_by: actor.key_id,
            created_at: at,
            updated_at: at,
        };
        exec!(tx, "deployment.insert", |c| sqlx::query(
            "INSERT INTO deployments (id, tenant_id, name, model_id, version, alias, profile, replicas, instance_count, \
             max_batch_size, dynamic_batching, memory_bytes, spec_generation, created_by, created_at, updated_at, capture) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)"
        )
        .bind(row.id)
        .bind(row.tenant_id)
        .bind(&row.name)
        .bind(row.model_id)
        .bind(row.version)
        .bind(&row.alias)
        .bind(&row.profile)
        .bind(row.replicas)
        .bind(row.instance_count)
        .bind(row.max_batch_size)
        .bind(&row.dynamic_batching)
        .bind(row.memory_bytes)
        .bind(row.spec_generation)
        .bind(row.created_by)
        .bind(row.created_at)
        .bind(row.updated_at)
        .bind(&row.capture)
        .execute(c))
        .map_err(|e| on_unique(e, crate::error::ErrorCode::AlreadyExists, || format!("deployment '{name}' already exists")))?;
        let message = format!("deployment created: version {version}, {} replica(s)", row.replicas);
        tx.insert_deployment_event(tenant_id, row.id, "created", None, None, &message).await?;
        tx.append_audit(actor, audit_event(tenant_id, "deployment.create", &row.name, None, Some(row.summary())))
            .await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Changes a deployment; a new version or spec starts a rollout (the scheduler's part).
    pub async fn update_deployment(
        &self,
        actor: &Actor,
        tenant_id: Uuid,
        name: &str,
        patch: DeploymentPatch,
    ) -> Result<DeploymentRow> {
        let mut tx = self.begin().await?;
        tx.lock_tenant(tenant_id).await?;
        tx.lock_scheduling().await?;
        let before = tx.deployment(tenant_id, name).await?.ok_or(Error::NotFound("deployment"))?;
        let mut after = before.clone();
        if let Some(version) = &patch.version {
            after.version = tx.resolve_version(tenant_id, before.model_id, version).await?;
            after.alias = match version {
                VersionRef::Alias(a) => Some(a.to_string()),
                _ => None,
            };
        }
        after.profile = patch.profile.unwrap_or(after.profile);
        after.replicas = patch.replicas.unwrap_or(after.replicas);
        after.instance_count = patch.instance_count.unwrap_or(after.instance_count);
        after.max_batch_size = patch.max_batch_size.unwrap_or(after.max_batch_size);
        after.dynamic_batching = patch.dynamic_batching.map_or(after.dynamic_batching, |b| b.map(Json));
        after.memory_bytes = patch.memory_bytes.unwrap_or(after.memory_bytes);
        if let Some(capture) = patch.capture {
            after.capture = Some(Json(capture));
        }
        let recapture = after.capture.as_ref().map(|j| &j.0) != before.capture.as_ref().map(|j| &j.0);
        let respec = after.profile != before.profile
            || after.instance_count != before.instance_count
            || after.max_batch_size != before.max_batch_size
            || after.dynamic_batching.as_ref().map(|j| &j.0) != before.dynamic_batching.as_ref().map(|j| &j.0)
            || after.memory_bytes != before.memory_bytes;
        if respec {
            after.spec_generation += 1;
        }
        if after.version != before.version || after.profile != before.profile {
            tx.check_profile_fits(tenant_id, after.model_id, after.version, &after.profile).await?;
        }
        tx.check_replica_quota(tenant_id, after.replicas - before.replicas, false).await?;
        after.updated_at = now();
        exec!(tx, "deployment.update", |c| sqlx::query(
            "UPDATE deployments SET version = $3, alias = $4, profile = $5, replicas = $6, instance_count = $7, \
             max_batch_size = $8, dynamic_batching = $9, memory_bytes = $10, spec_generation = $11, updated_at = $12, \
             capture = $13 WHERE tenant_id = $1 AND id = $2"
        )
        .bind(tenant_id)
        .bind(after.id)
        .bind(after.version)
        .bind(&after.alias)
        .bind(&after.profile)
        .bind(after.replicas)
        .bind(after.instance_count)
        .bind(after.max_batch_size)
        .bind(&after.dynamic_batching)
        .bind(after.memory_bytes)
        .bind(after.spec_generation)
        .bind(after.updated_at)
        .bind(&after.capture)
        .execute(c))?;
        if recapture {
            // Capture needs no new replicas: the workers holding them get new assignments, while
            // the replicas' assigned generation stays (no rollout, so no `progressing`).
            tx.touch_workers_of(tenant_id, after.id).await?;
        }
        if let (Some(alias), None) = (&before.alias, &after.alias) {
            let message = unfollowed_alias(alias, after.version);
            tx.insert_deployment_event(tenant_id, after.id, "alias_unfollowed", None, None, &message).await?;
        }
        if after.version != before.version || respec {
            let message = format!("rollout requested: version {} (spec {})", after.version, after.spec_generation);
            tx.insert_deployment_event(tenant_id, after.id, "updated", None, None, &message).await?;
        } else if after.replicas != before.replicas {
            let message = format!("scaled from {} to {} replica(s)", before.replicas, after.replicas);
            tx.insert_deployment_event(tenant_id, after.id, "scaled", None, None, &message).await?;
        }
        let event =
            audit_event(tenant_id, "deployment.update", &after.name, Some(before.summary()), Some(after.summary()));
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(after)
    }

    /// Deletes a deployment; its replicas leave their workers' assignments.
    pub async fn delete_deployment(&self, actor: &Actor, tenant_id: Uuid, name: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        tx.lock_scheduling().await?;
        let before = tx.deployment(tenant_id, name).await?.ok_or(Error::NotFound("deployment"))?;
        tx.touch_workers_of(tenant_id, before.id).await?;
        exec!(tx, "replica.delete_all", |c| sqlx::query(
            "DELETE FROM replicas WHERE tenant_id = $1 AND deployment_id = $2"
        )
        .bind(tenant_id)
        .bind(before.id)
        .execute(c))?;
        exec!(tx, "deployment_event.delete_all", |c| sqlx::query(
            "DELETE FROM deployment_events WHERE tenant_id = $1 AND deployment_id = $2"
        )
        .bind(tenant_id)
        .bind(before.id)
        .execute(c))?;
        exec!(tx, "deployment.delete", |c| sqlx::query("DELETE FROM deployments WHERE tenant_id = $1 AND id = $2")
            .bind(tenant_id)
            .bind(before.id)
            .execute(c))?;
        tx.append_audit(actor, audit_event(tenant_id, "deployment.delete", name, Some(before.summary()), None)).await?;
        tx.commit().await?;
        Ok(())
    }
}

pub(super) fn audit_event(
    tenant_id: Uuid,
    action: &'static str,
    name: &str,
    before: Option<Value>,
    after: Option<Value>,
) -> NewAuditEvent {
    NewAuditEvent { tenant_id, action, resource_type: "deployment", resource_id: name.to_string(), before, after }
}
