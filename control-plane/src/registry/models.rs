//! Models, their immutable versions, aliases that point at versions, and presigned upload
//! sessions. A model's name is unique within its tenant; version numbers count up per model
//! and are never reused.

use serde_json::json;
use sqlx::FromRow;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{Actor, NewAuditEvent};
use super::{Conn, Registry, exec, now, on_conn, on_unique};
use crate::error::{Error, QuotaName, Result};
use crate::signature::Signature;
use crate::states::{ReplicaState, VersionState};
use crate::types::{ArtifactFormat, Name};

/// A model.
#[derive(Debug, Clone, FromRow)]
pub struct ModelRow {
    /// Id.
    pub id: Uuid,
    /// Tenant.
    pub tenant_id: Uuid,
    /// Name, unique in the tenant.
    pub name: String,
    /// Description.
    pub description: String,
    /// Number the next version gets.
    pub next_version: i64,
    /// Creating key.
    pub created_by: Option<Uuid>,
    /// Created.
    pub created_at: OffsetDateTime,
    /// Last changed.
    pub updated_at: OffsetDateTime,
}

/// An immutable model version.
#[derive(Debug, Clone, FromRow)]
pub struct VersionRow {
    /// Id.
    pub id: Uuid,
    /// Tenant.
    pub tenant_id: Uuid,
    /// Model.
    pub model_id: Uuid,
    /// Version number, from 1.
    pub version: i64,
    /// Object-store key of the artifact (tenant-prefixed).
    pub artifact_key: String,
    /// Hex sha256 of the artifact.
    pub sha256: String,
    /// Artifact size.
    pub size_bytes: i64,
    /// Packaging.
    pub format: String,
    /// Model configuration (Triton's, as JSON), when given.
    pub config: Option<Json<serde_json::Value>>,
    /// Stored status: always `uploaded` (what the version is doing is derived from the
    /// replicas that run it, [`Conn::version_states`]).
    pub status: String,
    /// What it takes and returns, learned at upload (`None` for versions stored before).
    pub signature: Option<Json<Signature>>,
    /// For an ensemble: the artifact bytes of the versions it composes (0 for other models).
    pub composing_bytes: i64,
    /// Creating key.
    pub created_by: Option<Uuid>,
    /// Created.
    pub created_at: OffsetDateTime,
}

impl VersionRow {
    fn summary(&self) -> serde_json::Value {
        json!({
            "version": self.version, "sha256": self.sha256, "size_bytes": self.size_bytes,
            "format": self.format, "artifact_key": self.artifact_key,
        })
    }
}

/// An alias: a movable name for one version of a model.
#[derive(Debug, Clone, FromRow)]
pub struct AliasRow {
    /// Model.
    pub model_id: Uuid,
    /// Tenant.
    pub tenant_id: Uuid,
    /// Alias name.
    pub alias: String,
    /// Version it points at.
    pub version: i64,
    /// Version it pointed at before its last move (`None`: never moved); a rollback's target.
    pub previous_version: Option<i64>,
    /// Key that last moved it.
    pub updated_by: Option<Uuid>,
    /// Last moved.
    pub updated_at: OffsetDateTime,
}

impl AliasRow {
    /// What `previous_version` becomes when the alias is pointed at `number`: the version it
    /// leaves, or, when it stays where it is, the history it already had (so setting an alias
    /// twice to the same version does not make the rollback target itself).
    fn previous_after_move(before: Option<&AliasRow>, number: i64) -> Option<i64> {
        let before = before?;
        if before.version == number { before.previous_version } else { Some(before.version) }
    }
}

/// A presigned upload session.
#[derive(Debug, Clone, FromRow)]
pub struct UploadRow {
    /// Id.
    pub id: Uuid,
    /// Tenant.
    pub tenant_id: Uuid,
    /// Model.
    pub model_id: Uuid,
    /// Where the client puts the artifact.
    pub artifact_key: String,
    /// Declared packaging.
    pub format: String,
    /// Creating key.
    pub created_by: Option<Uuid>,
    /// Created.
    pub created_at: OffsetDateTime,
    /// The URL stops working at.
    pub expires_at: OffsetDateTime,
    /// Completed (a version was created) at.
    pub completed_at: Option<OffsetDateTime>,
}

/// A verified artifact to register as the next version of a model.
#[derive(Debug, Clone)]
pub struct NewVersion {
    /// Object-store key, already written.
    pub artifact_key: String,
    /// Verified hex sha256.
    pub sha256: String,
    /// Verified size.
    pub size_bytes: i64,
    /// Packaging.
    pub format: ArtifactFormat,
    /// Model configuration, if given.
    pub config: Option<serde_json::Value>,
    /// What the version takes and returns.
    pub signature: Option<Signature>,
}

macro_rules! select_models {
    ($rest:literal) => {
        concat!(
            "SELECT id, tenant_id, name, description, next_version, created_by, created_at, updated_at FROM models ",
            $rest
        )
    };
}

macro_rules! select_versions {
    ($rest:literal) => {
        concat!(
            "SELECT id, tenant_id, model_id, version, artifact_key, sha256, size_bytes, format, config, status, ",
            "signature, composing_bytes, created_by, created_at FROM model_versions ",
            $rest
        )
    };
}

impl Conn {
    /// A model by name in a tenant.
    pub async fn model(&mut self, tenant_id: Uuid, name: &str) -> Result<Option<ModelRow>> {
        on_conn!(self, "model.get", |c| sqlx::query_as::<_, ModelRow>(select_models!(
            "WHERE tenant_id = $1 AND name = $2"
        ))
        .bind(tenant_id)
        .bind(name)
        .fetch_optional(c))
    }

    /// A page of a tenant's models by name, after `after` (the cursor).
    pub async fn models(&mut self, tenant_id: Uuid, after: Option<&str>, limit: i64) -> Result<Vec<ModelRow>> {
        on_conn!(self, "model.list", |c| sqlx::query_as::<_, ModelRow>(select_models!(
            "WHERE tenant_id = $1 AND ($2 IS NULL OR name > $2) ORDER BY name LIMIT $3"
        ))
        .bind(tenant_id)
        .bind(after)
        .bind(limit)
        .fetch_all(c))
    }

    /// One version of a tenant's model.
    pub async fn version(&mut self, tenant_id: Uuid, model_id: Uuid, version: i64) -> Result<Option<VersionRow>> {
        on_conn!(self, "version.get", |c| sqlx::query_as::<_, VersionRow>(select_versions!(
            "WHERE tenant_id = $1 AND model_id = $2 AND version = $3"
        ))
        .bind(tenant_id)
        .bind(model_id)
        .bind(version)
        .fetch_optional(c))
    }

    /// The artifact sizes (an ensemble's with its composing versions') of several versions of a tenant's models, in one query, by (model id,
    /// version); versions that do not exist are left out. `versions` is a page (at most a few
    /// hundred).
    pub async fn version_sizes(
        &mut self,
        tenant_id: Uuid,
        versions: &[(Uuid, i64)],
    ) -> Result<std::collections::HashMap<(Uuid, i64), i64>> {
        if versions.is_empty() {
            return Ok(Default::default());
        }
        // Row values in an IN list are not SQLite's; a chain of ORs is both databases'.
        let pairs: Vec<String> =
            (0..versions.len()).map(|i| format!("(model_id = ${} AND version = ${})", 2 * i + 2, 2 * i + 3)).collect();
        let sql = format!(
            "SELECT model_id, version, size_bytes + composing_bytes FROM model_versions WHERE tenant_id = $1 AND ({})",
            pairs.join(" OR ")
        );
        let rows = on_conn!(self, "version.sizes", |c| {
            let mut query = sqlx::query_as::<_, (Uuid, i64, i64)>(sqlx::AssertSqlSafe(sql)).bind(tenant_id);
            for (model_id, version) in versions {
                query = query.bind(*model_id).bind(*version);
            }
            query.fetch_all(c)
        })?;
        Ok(rows.into_iter().map(|(model, version, size)| ((model, version), size)).collect())
    }

    /// A model's versions, newest first, before `before` (the cursor).
    pub async fn versions(
        &mut self,
        tenant_id: Uuid,
        model_id: Uuid,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<VersionRow>> {
        on_conn!(self, "version.list", |c| sqlx::query_as::<_, VersionRow>(select_versions!(
            "WHERE tenant_id = $1 AND model_id = $2 AND ($3 IS NULL OR version < $3) ORDER BY version DESC LIMIT $4"
        ))
        .bind(tenant_id)
        .bind(model_id)
        .bind(before)
        .bind(limit)
        .fetch_all(c))
    }

    /// Artifact keys of every version of a model.
    async fn artifact_keys(&mut self, tenant_id: Uuid, model_id: Uuid) -> Result<Vec<String>> {
        on_conn!(self, "version.artifact_keys", |c| sqlx::query_scalar::<_, String>(
            "SELECT artifact_key FROM model_versions WHERE tenant_id = $1 AND model_id = $2"
        )
        .bind(tenant_id)
        .bind(model_id)
        .fetch_all(c))
    }

    /// A model's aliases by name.
    pub async fn aliases(&mut self, tenant_id: Uuid, model_id: Uuid) -> Result<Vec<AliasRow>> {
        on_conn!(self, "alias.list", |c| sqlx::query_as::<_, AliasRow>(
            "SELECT model_id, tenant_id, alias, version, previous_version, updated_by, updated_at \
             FROM model_aliases \
             WHERE tenant_id = $1 AND model_id = $2 ORDER BY alias"
        )
        .bind(tenant_id)
        .bind(model_id)
        .fetch_all(c))
    }

    /// One alias of a model.
    pub async fn alias(&mut self, tenant_id: Uuid, model_id: Uuid, alias: &str) -> Result<Option<AliasRow>> {
        on_conn!(self, "alias.get", |c| sqlx::query_as::<_, AliasRow>(
            "SELECT model_id, tenant_id, alias, version, previous_version, updated_by, updated_at \
             FROM model_aliases \
             WHERE tenant_id = $1 AND model_id = $2 AND alias = $3"
        )
        .bind(tenant_id)
        .bind(model_id)
        .bind(alias)
        .fetch_optional(c))
    }

    /// A presigned upload session of a tenant's model.
    pub async fn upload(&mut self, tenant_id: Uuid, model_id: Uuid, id: Uuid) -> Result<Option<UploadRow>> {
        on_conn!(self, "upload.get", |c| sqlx::query_as::<_, UploadRow>(
            "SELECT id, tenant_id, model_id, artifact_key, format, created_by, created_at, expires_at, completed_at \
             FROM uploads WHERE tenant_id = $1 AND model_id = $2 AND id = $3"
        )
        .bind(tenant_id)
        .bind(model_id)
        .bind(id)
        .fetch_optional(c))
    }

    async fn check_quota(&mut self, tenant_id: Uuid, quota: QuotaName, added: i64) -> Result<()> {
        let limits = self.quota(tenant_id).await?;
        let usage = self.quota_usage(tenant_id).await?;
        let current = match quota {
            QuotaName::Models => usage.models,
            QuotaName::Versions => usage.versions,
            QuotaName::StorageBytes => usage.storage_bytes,
            QuotaName::Replicas => usage.replicas,
            QuotaName::MonthlySpendCents => return limits.check_spend(self.month_spend_cents(tenant_id, now()).await?),
        };
        limits.check(quota, current.saturating_add(added))
    }
}

impl Registry {
    /// Creates a model, within the tenant's model quota.
    pub async fn create_model(
        &self,
        actor: &Actor,
        tenant_id: Uuid,
        name: &Name,
        description: &str,
    ) -> Result<ModelRow> {
        let mut tx = self.begin().await?;
        let model = tx.add_model(actor, tenant_id, Uuid::now_v7(), name, description).await?;
        tx.commit().await?;
        Ok(model)
    }

    /// Creates a model with id `model_id` (the artifact's key was made with it) and its first
    /// version in one transaction (an upload that names a model not created yet): the model
    /// exists only if the version does, so a refused upload leaves no empty model behind.
    pub async fn create_model_with_version(
        &self,
        actor: &Actor,
        tenant_id: Uuid,
        name: &Name,
        model_id: Uuid,
        new: NewVersion,
    ) -> Result<(ModelRow, VersionRow)> {
        let mut tx = self.begin().await?;
        let mut model = tx.add_model(actor, tenant_id, model_id, name, "").await?;
        let version = tx.add_version(actor, &model, new).await?;
        model.next_version = version.version + 1;
        tx.commit().await?;
        Ok((model, version))
    }

    /// Deletes a model with its versions and aliases; returns the artifact keys to remove.
    pub async fn delete_model(&self, actor: &Actor, tenant_id: Uuid, name: &str) -> Result<Vec<String>> {
        let mut tx = self.begin().await?;
        let model = tx.model(tenant_id, name).await?.ok_or(Error::NotFound("model"))?;
        if let Some(d) = tx.deployment_of_model(tenant_id, model.id).await? {
            let message = format!("model '{name}' is deployed by deployment '{}'; delete the deployment first", d.name);
            return Err(Error::conflict(crate::error::ErrorCode::ModelDeployed, message));
        }
        tx.check_not_composed(tenant_id, model.id, None).await?;
        let keys = tx.artifact_keys(tenant_id, model.id).await?;
        // Aliases first: they reference versions.
        exec!(tx, "alias.delete_all", |c| sqlx::query(
            "DELETE FROM model_aliases WHERE tenant_id = $1 AND model_id = $2"
        )
        .bind(tenant_id)
        .bind(model.id)
        .execute(c))?;
        exec!(tx, "model.delete", |c| sqlx::query("DELETE FROM models WHERE tenant_id = $1 AND id = $2")
            .bind(tenant_id)
            .bind(model.id)
            .execute(c))?;
        let before = json!({ "name": model.name, "versions": keys.len() });
        tx.append_audit(actor, audit_event(tenant_id, "model.delete", "model", name, Some(before), None)).await?;
        tx.commit().await?;
        Ok(keys)
    }

    /// Registers a stored, verified artifact as the model's next version, within the version
    /// and storage quotas.
    pub async fn create_version(&self, actor: &Actor, model: &ModelRow, new: NewVersion) -> Result<VersionRow> {
        let mut tx = self.begin().await?;
        let version = tx.add_version(actor, model, new).await?;
        tx.commit().await?;
        Ok(version)
    }

    /// Deletes a version no alias points at; returns its artifact key to remove.
    pub async fn delete_version(&self, actor: &Actor, model: &ModelRow, number: i64) -> Result<String> {
        let tenant_id = model.tenant_id;
        let mut tx = self.begin().await?;
        let version = tx.version(tenant_id, model.id, number).await?.ok_or(Error::NotFound("version"))?;
        let pinned: Vec<String> = tx
            .aliases(tenant_id, model.id)
            .await?
            .into_iter()
            .filter(|a| a.version == number)
            .map(|a| a.alias)
            .collect();
        if let Some(d) = tx.deployment_of_model(tenant_id, model.id).await?
            && (d.version == number
                || d.canary_version == Some(number)
                || tx.version_has_replicas(tenant_id, d.id, number).await?)
        {
            let message = format!("version {number} is in use by deployment '{}'", d.name);
            return Err(Error::conflict(crate::error::ErrorCode::VersionInUse, message));
        }
        tx.check_not_composed(tenant_id, model.id, Some(number)).await?;
        if !pinned.is_empty() {
            let list = pinned.join(", ");
            return Err(Error::conflict(
                crate::error::ErrorCode::VersionInUse,
                format!("version {number} is the target of alias(es) {list}"),
            ));
        }
        exec!(tx, "version.delete", |c| sqlx::query("DELETE FROM model_versions WHERE tenant_id = $1 AND id = $2")
            .bind(tenant_id)
            .bind(version.id)
            .execute(c))?;
        let resource = format!("{}/{}", model.name, number);
        let event = audit_event(tenant_id, "version.delete", "model_version", &resource, Some(version.summary()), None);
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(version.artifact_key)
    }

    /// Points an alias at a version (creating or moving it): how rollouts and rollbacks are
    /// asked for.
    pub async fn set_alias(&self, actor: &Actor, model: &ModelRow, alias: &Name, number: i64) -> Result<AliasRow> {
        let tenant_id = model.tenant_id;
        let mut tx = self.begin().await?;
        let Some(version) = tx.version(tenant_id, model.id, number).await? else {
            return Err(Error::invalid("version", format!("model '{}' has no version {number}", model.name)));
        };
        // The deployment following the alias would roll to this version on its profile.
        let following =
            tx.deployment_of_model(tenant_id, model.id).await?.filter(|d| d.alias.as_deref() == Some(alias.as_str()));
        if let Some(d) = following {
            crate::model_config::check_profile_json(version.config.as_ref().map(|c| &c.0), &d.profile).map_err(
                |e| Error::invalid("version", format!("deployment '{}' follows alias '{alias}': {e}", d.name)),
            )?;
        }
        let before = tx.alias(tenant_id, model.id, alias.as_str()).await?;
        let row = AliasRow {
            model_id: model.id,
            tenant_id,
            alias: alias.to_string(),
            version: number,
            previous_version: AliasRow::previous_after_move(before.as_ref(), number),
            updated_by: actor.key_id,
            updated_at: now(),
        };
        exec!(tx, "alias.upsert", |c| sqlx::query(
            "INSERT INTO model_aliases (model_id, tenant_id, alias, version, previous_version, updated_by, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (model_id, alias) DO UPDATE SET version = $4, previous_version = $5, updated_by = $6, \
             updated_at = $7"
        )
        .bind(row.model_id)
        .bind(row.tenant_id)
        .bind(&row.alias)
        .bind(row.version)
        .bind(row.previous_version)
        .bind(row.updated_by)
        .bind(row.updated_at)
        .execute(c))?;
        let resource = format!("{}@{}", model.name, alias);
        let before = before.map(|b| json!({ "version": b.version }));
        let after = Some(json!({ "version": number }));
        tx.append_audit(actor, audit_event(tenant_id, "alias.set", "model_alias", &resource, before, after)).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Removes an alias.
    pub async fn delete_alias(&self, actor: &Actor, model: &ModelRow, alias: &str) -> Result<()> {
        let tenant_id = model.tenant_id;
        let mut tx = self.begin().await?;
        let before = tx.alias(tenant_id, model.id, alias).await?.ok_or(Error::NotFound("alias"))?;
        exec!(tx, "alias.delete", |c| sqlx::query(
            "DELETE FROM model_aliases WHERE tenant_id = $1 AND model_id = $2 AND alias = $3"
        )
        .bind(tenant_id)
        .bind(model.id)
        .bind(alias)
        .execute(c))?;
        let resource = format!("{}@{}", model.name, alias);
        let before = Some(json!({ "version": before.version }));
        tx.append_audit(actor, audit_event(tenant_id, "alias.delete", "model_alias", &resource, before, None)).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Opens a presigned upload session.
    pub async fn create_upload(&self, actor: &Actor, model: &ModelRow, upload: &UploadRow) -> Result<()> {
        let mut tx = self.begin().await?;
        exec!(tx, "upload.insert", |c| sqlx::query(
            "INSERT INTO uploads (id, tenant_id, model_id, artifact_key, format, created_by, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        )
        .bind(upload.id)
        .bind(upload.tenant_id)
        .bind(upload.model_id)
        .bind(&upload.artifact_key)
        .bind(&upload.format)
        .bind(upload.created_by)
        .bind(upload.created_at)
        .bind(upload.expires_at)
        .execute(c))?;
        let resource = format!("{}/uploads/{}", model.name, upload.id);
        let after = Some(json!({ "artifact_key": upload.artifact_key, "format": upload.format }));
        tx.append_audit(actor, audit_event(model.tenant_id, "upload.create", "upload", &resource, None, after)).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Closes a presigned upload by registering its verified artifact as a version.
    pub async fn complete_upload(
        &self,
        actor: &Actor,
        model: &ModelRow,
        upload_id: Uuid,
        new: NewVersion,
    ) -> Result<VersionRow> {
        let mut tx = self.begin().await?;
        let done = exec!(tx, "upload.complete", |c| sqlx::query(
            "UPDATE uploads SET completed_at = $4 WHERE tenant_id = $1 AND model_id = $2 AND id = $3 \
             AND completed_at IS NULL"
        )
        .bind(model.tenant_id)
        .bind(model.id)
        .bind(upload_id)
        .bind(now())
        .execute(c))?;
        if done == 0 {
            return Err(Error::conflict(crate::error::ErrorCode::UploadCompleted, "this upload was already completed"));
        }
        let version = tx.add_version(actor, model, new).await?;
        tx.commit().await?;
        Ok(version)
    }
}

impl Conn {
    /// Inside a transaction: creates a model within the tenant's model quota, audits it.
    async fn add_model(
        &mut self,
        actor: &Actor,
        tenant_id: Uuid,
        id: Uuid,
        name: &Name,
        description: &str,
    ) -> Result<ModelRow> {
        let at = now();
        let model = ModelRow {
            id,
            tenant_id,
            name: name.to_string(),
            description: description.to_string(),
            next_version: 1,
            created_by: actor.key_id,
            created_at: at,
            updated_at: at,
        };
        self.lock_tenant(tenant_id).await?;
        if self.model(tenant_id, name.as_str()).await?.is_some() {
            return Err(Error::conflict(
                crate::error::ErrorCode::AlreadyExists,
                format!("model '{name}' already exists"),
            ));
        }
        self.check_quota(tenant_id, QuotaName::Models, 1).await?;
        exec!(self, "model.insert", |c| sqlx::query(
            "INSERT INTO models (id, tenant_id, name, description, next_version, created_by, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        )
        .bind(model.id)
        .bind(model.tenant_id)
        .bind(&model.name)
        .bind(&model.description)
        .bind(model.next_version)
        .bind(model.created_by)
        .bind(model.created_at)
        .bind(model.updated_at)
        .execute(c))
        .map_err(|e| {
            on_unique(e, crate::error::ErrorCode::AlreadyExists, || format!("model '{name}' already exists"))
        })?;
        let after = json!({ "name": model.name, "description": model.description });
        let event = audit_event(tenant_id, "model.create", "model", &model.name, None, Some(after));
        self.append_audit(actor, event).await?;
        Ok(model)
    }

    /// What each version of a model is doing, from the replicas that run it (versions no
    /// replica runs are absent: they are [`VersionState::Uploaded`]).
    pub async fn version_states(
        &mut self,
        tenant_id: Uuid,
        model_id: Uuid,
    ) -> Result<std::collections::HashMap<i64, VersionState>> {
        let rows: Vec<(i64, String, bool)> = on_conn!(self, "version.states", |c| sqlx::query_as(
            "SELECT r.version, r.state, r.serving FROM replicas r JOIN deployments d ON d.id = r.deployment_id \
             WHERE r.tenant_id = $1 AND d.tenant_id = $1 AND d.model_id = $2"
        )
        .bind(tenant_id)
        .bind(model_id)
        .fetch_all(c))?;
        let mut by_version: std::collections::HashMap<i64, Vec<(ReplicaState, bool)>> = Default::default();
        for (version, state, serving) in rows {
            // A state this build does not know is shown as not serving.
            let state = state.parse().unwrap_or(ReplicaState::Pending);
            by_version.entry(version).or_default().push((state, serving));
        }
        Ok(by_version.into_iter().map(|(v, replicas)| (v, VersionState::of(replicas))).collect())
    }

    /// Inside a transaction: checks quotas, numbers and inserts the version, audits it.
    async fn add_version(&mut self, actor: &Actor, model: &ModelRow, new: NewVersion) -> Result<VersionRow> {
        let tenant_id = model.tenant_id;
        self.lock_tenant(tenant_id).await?;
        self.check_quota(tenant_id, QuotaName::Versions, 1).await?;
        self.check_quota(tenant_id, QuotaName::StorageBytes, new.size_bytes).await?;
        let at = now();
        let number: Option<i64> = on_conn!(self, "model.next_version", |c| sqlx::query_scalar(
            "UPDATE models SET next_version = next_version + 1, updated_at = $3 WHERE tenant_id = $1 AND id = $2 \
             RETURNING next_version - 1"
        )
        .bind(tenant_id)
        .bind(model.id)
        .bind(at)
        .fetch_optional(c))?;
        let mut config = new.config;
        let composing = match config.as_mut() {
            Some(c) => self.pin_composing(model, c).await?,
            None => Default::default(),
        };
        let version = VersionRow {
            id: Uuid::now_v7(),
            tenant_id,
            model_id: model.id,
            version: number.ok_or(Error::NotFound("model"))?,
            artifact_key: new.artifact_key,
            sha256: new.sha256,
            size_bytes: new.size_bytes,
            format: new.format.as_str().to_string(),
            config: config.map(Json),
            status: VersionState::Uploaded.as_str().to_string(),
            signature: new.signature.map(Json),
            composing_bytes: composing.bytes,
            created_by: actor.key_id,
            created_at: at,
        };
        self.insert_version(&version).await?;
        self.insert_composing(tenant_id, version.id, &composing).await?;
        let resource = format!("{}/{}", model.name, version.version);
        let event = audit_event(tenant_id, "version.create", "model_version", &resource, None, Some(version.summary()));
        self.append_audit(actor, event).await?;
        Ok(version)
    }

    async fn insert_version(&mut self, v: &VersionRow) -> Result<()> {
        exec!(self, "version.insert", |c| sqlx::query(
            "INSERT INTO model_versions (id, tenant_id, model_id, version, artifact_key, sha256, size_bytes, format, \
             config, status, signature, composing_bytes, created_by, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
        )
        .bind(v.id)
        .bind(v.tenant_id)
        .bind(v.model_id)
        .bind(v.version)
        .bind(&v.artifact_key)
        .bind(&v.sha256)
        .bind(v.size_bytes)
        .bind(&v.format)
        .bind(&v.config)
        .bind(&v.status)
        .bind(&v.signature)
        .bind(v.composing_bytes)
        .bind(v.created_by)
        .bind(v.created_at)
        .execute(c))?;
        Ok(())
    }
}

fn audit_event(
    tenant_id: Uuid,
    action: &'static str,
    resource_type: &'static str,
    resource_id: &str,
    before: Option<serde_json::Value>,
    after: Option<serde_json::Value>,
) -> NewAuditEvent {
    NewAuditEvent { tenant_id, action, resource_type, resource_id: resource_id.to_string(), before, after }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alias(version: i64, previous_version: Option<i64>) -> AliasRow {
        AliasRow {
            model_id: Uuid::nil(),
            tenant_id: Uuid::nil(),
            alias: "production".into(),
            version,
            previous_version,
            updated_by: None,
            updated_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_move_remembers_the_version_it_leaves() {
        assert_eq!(AliasRow::previous_after_move(None, 1), None, "a new alias");
        assert_eq!(AliasRow::previous_after_move(Some(&alias(1, None)), 2), Some(1));
        assert_eq!(AliasRow::previous_after_move(Some(&alias(2, Some(1))), 1), Some(2), "a rollback can be undone");
        assert_eq!(AliasRow::previous_after_move(Some(&alias(2, Some(1))), 2), Some(1), "no move, same history");
    }
}
