//! Ensemble versions and the model versions they compose. An ensemble's steps name the
//! tenant's models; when the ensemble version is uploaded each step's version is pinned (`-1`,
//! Triton's "newest", becomes the newest version then), so the version never changes under its
//! callers, and the composing versions (nested ensembles' too) are recorded: a worker loads
//! them beside the ensemble, the scheduler sizes the replica by them, and none of them can be
//! deleted while the ensemble version names it.

use std::collections::BTreeSet;

use serde_json::Value;
use sqlx::FromRow;
use sqlx::types::Json;
use tessera_protocol::inference::model_config::SchedulingChoice;
use uuid::Uuid;

use super::{Conn, ModelRow, exec, on_conn};
use crate::error::{Error, ErrorCode, Result};

/// The composing versions of an ensemble version being added.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Composing {
    /// Their ids, each once.
    pub version_ids: BTreeSet<Uuid>,
    /// Their artifacts' bytes together.
    pub bytes: i64,
}

/// A composing model version as a worker is sent it, with the ensemble version it serves.
#[derive(Debug, Clone, FromRow)]
pub struct ComposingRow {
    /// The ensemble version.
    pub ensemble_version_id: Uuid,
    /// The composing model's name.
    pub model_name: String,
    /// Its version number.
    pub version: i64,
    /// Artifact key.
    pub artifact_key: String,
    /// Artifact sha256.
    pub sha256: String,
    /// Artifact size.
    pub size_bytes: i64,
    /// Artifact format.
    pub format: String,
    /// Its stored model config.
    pub config: Option<Json<Value>>,
}

/// One step's pinned version.
#[derive(Debug, FromRow)]
struct StepVersion {
    id: Uuid,
    version: i64,
    size_bytes: i64,
}

impl Conn {
    /// For an ensemble `config` of `model` (Triton's JSON): pins every step's version in it
    /// and returns the versions it composes. Any other config is left as it is, composing
    /// nothing. A step naming a model or version the tenant does not have is refused.
    pub(super) async fn pin_composing(&mut self, model: &ModelRow, config: &mut Value) -> Result<Composing> {
        let blame = |message: String| Error::invalid("config", message);
        let mut parsed = match tessera_protocol::model_config::from_json(&config.to_string()) {
            Ok(parsed) if tessera_protocol::model_config::is_ensemble(&parsed) => parsed,
            _ => return Ok(Composing::default()),
        };
        let Some(SchedulingChoice::EnsembleScheduling(scheduling)) = &mut parsed.scheduling_choice else {
            return Err(blame("an ensemble needs an ensemble_scheduling section with its steps".into()));
        };
        let mut composing = Composing::default();
        let mut sizes = std::collections::BTreeMap::new();
        for (i, step) in scheduling.step.iter_mut().enumerate() {
            let name = step.model_name.clone();
            if name == model.name {
                return Err(blame(format!("ensemble step {i} names the ensemble itself ('{name}')")));
            }
            let Some(target) = self.model(model.tenant_id, &name).await? else {
                return Err(blame(format!(
                    "ensemble step {i} names model '{name}', which this tenant does not have; upload it first"
                )));
            };
            let found = self.step_version(&target, step.model_version).await?;
            let Some(found) = found else {
                let which = match step.model_version {
                    -1 => "has no version yet".to_string(),
                    v => format!("has no version {v}"),
                };
                return Err(blame(format!("ensemble step {i} names model '{name}', which {which}")));
            };
            step.model_version = found.version;
            sizes.insert(found.id, found.size_bytes);
            for (id, size) in self.composed_by(found.id).await? {
                sizes.insert(id, size);
            }
        }
        composing.bytes = sizes.values().fold(0i64, |sum, size| sum.saturating_add(*size));
        composing.version_ids = sizes.into_keys().collect();
        *config = tessera_protocol::model_config::to_json_value(&parsed);
        Ok(composing)
    }

    /// The version a step runs: `number`, or the newest for `-1`.
    async fn step_version(&mut self, model: &ModelRow, number: i64) -> Result<Option<StepVersion>> {
        on_conn!(self, "version.step", |c| sqlx::query_as::<_, StepVersion>(
            "SELECT id, version, size_bytes FROM model_versions WHERE tenant_id = $1 AND model_id = $2 \
             AND ($3 = -1 OR version = $3) ORDER BY version DESC LIMIT 1"
        )
        .bind(model.tenant_id)
        .bind(model.id)
        .bind(number)
        .fetch_optional(c))
    }

    /// The versions an ensemble version composes, with their sizes.
    async fn composed_by(&mut self, version_id: Uuid) -> Result<Vec<(Uuid, i64)>> {
        on_conn!(self, "version.composed_by", |c| sqlx::query_as::<_, (Uuid, i64)>(
            "SELECT v.id, v.size_bytes FROM version_composing c JOIN model_versions v ON v.id = c.step_version_id \
             WHERE c.version_id = $1"
        )
        .bind(version_id)
        .fetch_all(c))
    }

    /// Records what a new ensemble version composes.
    pub(super) async fn insert_composing(&mut self, tenant_id: Uuid, version_id: Uuid, c: &Composing) -> Result<()> {
        for step in &c.version_ids {
            exec!(self, "version.insert_composing", |c| sqlx::query(
                "INSERT INTO version_composing (version_id, step_version_id, tenant_id) VALUES ($1, $2, $3)"
            )
            .bind(version_id)
            .bind(*step)
            .bind(tenant_id)
            .execute(c))?;
        }
        Ok(())
    }

    /// Refuses deleting model versions an ensemble version of another model composes: the
    /// versions of `model_id` (only `version` of them, when given).
    pub(super) async fn check_not_composed(
        &mut self,
        tenant_id: Uuid,
        model_id: Uuid,
        version: Option<i64>,
    ) -> Result<()> {
        let user: Option<(String, i64, i64)> = on_conn!(self, "version.composed_in", |c| sqlx::query_as(
            "SELECT m.name, e.version, s.version FROM version_composing c \
             JOIN model_versions s ON s.id = c.step_version_id \
             JOIN model_versions e ON e.id = c.version_id JOIN models m ON m.id = e.model_id \
             WHERE c.tenant_id = $1 AND s.model_id = $2 AND ($3 IS NULL OR s.version = $3) AND e.model_id <> $2 \
             ORDER BY m.name, e.version LIMIT 1"
        )
        .bind(tenant_id)
        .bind(model_id)
        .bind(version)
        .fetch_optional(c))?;
        match user {
            None => Ok(()),
            Some((ensemble, ensemble_version, step)) => Err(Error::conflict(
                ErrorCode::VersionInUse,
                format!(
                    "version {step} is composed by ensemble '{ensemble}' version {ensemble_version}; \
                     delete that version first"
                ),
            )),
        }
    }

    /// The composing versions of the ensembles among a worker's assigned replicas, with the
    /// ensemble version each serves.
    pub async fn assigned_composing(&mut self, worker_id: &str) -> Result<Vec<ComposingRow>> {
        on_conn!(self, "worker.assigned_composing", |c| sqlx::query_as::<_, ComposingRow>(
            "SELECT DISTINCT e.id AS ensemble_version_id, m.name AS model_name, v.version, v.artifact_key, v.sha256, \
             v.size_bytes, v.format, v.config \
             FROM replicas r JOIN deployments d ON d.id = r.deployment_id \
             JOIN model_versions e ON e.model_id = d.model_id AND e.version = r.version \
             JOIN version_composing c ON c.version_id = e.id \
             JOIN model_versions v ON v.id = c.step_version_id JOIN models m ON m.id = v.model_id \
             WHERE r.worker_id = $1 AND r.slice_id IS NOT NULL ORDER BY 2, 3"
        )
        .bind(worker_id)
        .fetch_all(c))
    }
}
