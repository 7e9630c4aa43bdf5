//! Canaries: a deployment's second version taking a weighted share of unversioned traffic.
//! Writes (set, weight, promote, roll back) store the desired split under the scheduling lock
//! like every deployment write; [`traffic_split`] says which split is in effect given the
//! replicas, and [`Conn::route_weights`] gives it for every deployment, for the gateway.
//!
//! The columns: `canary_version` (NULL: no canary), `canary_weight` (1..99 while set, else 0)
//! and `canary_replicas` (while set, else 0). A promotion makes the canary's version the
//! deployment's and leaves the canary set while the stable replicas roll out, so the canary
//! keeps its share until they serve; the scheduler then clears it (`canary_version = version`
//! means "promotion rolling out").

use std::collections::HashMap;

use sqlx::FromRow;
use uuid::Uuid;

use super::deployments::{DeploymentRow, ReplicaRow, VersionRef, audit_event, select_deployments};
use super::{Conn, Registry, exec, now, on_conn};
use crate::error::{Error, Result};
use crate::registry::audit::Actor;
use crate::states::ReplicaState;

/// A canary to set: its version, its share of traffic and its replicas.
#[derive(Debug, Clone, PartialEq)]
pub struct CanarySpec {
    /// Version (pinned, or an alias resolved once: the canary does not follow it).
    pub version: VersionRef,
    /// Percent of unversioned traffic, 1..99 (checked by the API).
    pub weight: i64,
    /// Replicas of the canary version.
    pub replicas: i64,
}

/// One version's share of a deployment's unversioned traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionShare {
    /// Model version.
    pub version: i64,
    /// Percent of unversioned requests.
    pub weight: i64,
    /// Whether this is the canary.
    pub canary: bool,
    /// Its replicas that are ready and serving.
    pub ready_replicas: i64,
    /// Its replicas wanted.
    pub replicas: i64,
}

/// A deployment's traffic split as the gateway routes it: the versions and their weights
/// (percent, summing to 100), only versions with a ready, serving replica weighted unless none
/// is (then the stable target alone, with 100).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentWeights {
    /// Tenant.
    pub tenant_id: Uuid,
    /// Deployment.
    pub deployment_id: Uuid,
    /// The model name clients use.
    pub model_name: String,
    /// `(version, weight)`, stable first.
    pub weights: Vec<(i64, u32)>,
}

/// A ready, serving replica as [`traffic_split`] counts it: its version and whether it is a
/// canary replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct ServingReplica {
    /// Version it runs.
    pub version: i64,
    /// A canary replica.
    pub canary: bool,
}

impl ServingReplica {
    /// The replicas of `replicas` that are ready and serving.
    pub fn of(replicas: &[ReplicaRow]) -> Vec<ServingReplica> {
        replicas
            .iter()
            .filter(|r| r.state.serves(r.serving))
            .map(|r| ServingReplica { version: r.version, canary: r.canary })
            .collect()
    }
}

/// What of a deployment decides its traffic split: the deployment columns the gateway's route
/// query reads (`version`, `replicas`, `canary_version`, `canary_weight`, `canary_replicas`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitSpec {
    /// Stable target version.
    pub version: i64,
    /// Stable replicas wanted.
    pub replicas: i64,
    /// The canary's version, if set.
    pub canary_version: Option<i64>,
    /// The canary's percent of unversioned traffic.
    pub canary_weight: i64,
    /// Canary replicas wanted.
    pub canary_replicas: i64,
}

impl From<&DeploymentRow> for SplitSpec {
    fn from(d: &DeploymentRow) -> Self {
        SplitSpec {
            version: d.version,
            replicas: d.replicas,
            canary_version: d.canary_version,
            canary_weight: d.canary_weight,
            canary_replicas: d.canary_replicas,
        }
    }
}

/// The split the gateway routes by: `(version, weight)` pairs, stable first, summing to 100
/// ([`traffic_split`] in effect: the canary counts once one of its replicas serves).
pub fn weights_in_effect(d: SplitSpec, serving: &[ServingReplica]) -> Vec<(i64, u32)> {
    traffic_split(d, serving, true).into_iter().map(|s| (s.version, u32::try_from(s.weight).unwrap_or(0))).collect()
}

/// The traffic split of a deployment with these ready, serving replicas, stable first, weights
/// summing to 100.
///
/// The stable version is the one its (non-canary) ready, serving replicas run: during a
/// rollout the old version until the switch, then the new one; the target when none serves yet.
/// The canary shows while it is set and runs another version than that; its configured weight
/// is shown as is, and with `effective` it counts only once a canary replica is ready and
/// serving (until then the stable version gets 100). A deployment without a canary has one
/// entry with weight 100.
pub fn traffic_split(d: SplitSpec, serving: &[ServingReplica], effective: bool) -> Vec<VersionShare> {
    let ready = |canary: bool, version: i64| {
        serving.iter().filter(|r| r.canary == canary && r.version == version).count() as i64
    };
    let stable_version = serving.iter().filter(|r| !r.canary).map(|r| r.version).max().unwrap_or(d.version);
    let mut stable = VersionShare {
        version: stable_version,
        weight: 100,
        canary: false,
        ready_replicas: ready(false, stable_version),
        replicas: d.replicas,
    };
    let Some(canary_version) = d.canary_version.filter(|v| *v != stable_version) else {
        return vec![stable];
    };
    let canary = VersionShare {
        version: canary_version,
        weight: d.canary_weight.clamp(0, 100),
        canary: true,
        ready_replicas: ready(true, canary_version),
        replicas: d.canary_replicas,
    };
    if effective && (canary.ready_replicas == 0 || canary.weight == 0) {
        return vec![stable];
    }
    stable.weight = 100 - canary.weight;
    vec![stable, canary]
}

impl Conn {
    /// The traffic split in effect for every deployment of every tenant (for the gateway's
    /// route table): [`weights_in_effect`] of each, by deployment id. The canary's weight counts
    /// only once one of its replicas is ready and serving; the gateway still has to pass the
    /// share of a version whose replicas it cannot reach to the others.
    pub async fn route_weights(&mut self) -> Result<Vec<DeploymentWeights>> {
        let deployments = on_conn!(self, "route.deployments", |c| sqlx::query_as::<_, DeploymentRow>(
            select_deployments!("ORDER BY d.id")
        )
        .fetch_all(c))?;
        let replicas = on_conn!(self, "route.replicas", |c| sqlx::query_as::<_, RouteReplica>(
            "SELECT deployment_id, version, canary FROM replicas WHERE serving AND state = $1"
        )
        .bind(ReplicaState::Ready.as_str())
        .fetch_all(c))?;
        let mut by_deployment: HashMap<Uuid, Vec<ServingReplica>> = HashMap::new();
        for r in replicas {
            by_deployment
                .entry(r.deployment_id)
                .or_default()
                .push(ServingReplica { version: r.version, canary: r.canary });
        }
        Ok(deployments
            .into_iter()
            .map(|d| {
                let replicas = by_deployment.remove(&d.id).unwrap_or_default();
                let weights = weights_in_effect(SplitSpec::from(&d), &replicas);
                DeploymentWeights { tenant_id: d.tenant_id, deployment_id: d.id, model_name: d.model_name, weights }
            })
            .collect())
    }

    /// The deployment with an active canary (set, and not a promotion rolling out), or why not.
    async fn with_canary(&mut self, tenant_id: Uuid, name: &str) -> Result<(DeploymentRow, i64)> {
        let d = self.deployment(tenant_id, name).await?.ok_or(Error::NotFound("deployment"))?;
        match d.canary_version {
            Some(v) if v != d.version => Ok((d, v)),
            Some(v) => {
                let message = format!("deployment '{name}' has no canary: version {v} was promoted and is rolling out");
                Err(Error::conflict(crate::error::ErrorCode::NoCanary, message))
            }
            None => {
                Err(Error::conflict(crate::error::ErrorCode::NoCanary, format!("deployment '{name}' has no canary")))
            }
        }
    }

    /// Stores the canary columns (and the target version and alias, which a promotion changes).
    async fn store_canary(&mut self, d: &DeploymentRow) -> Result<()> {
        exec!(self, "deployment.canary", |c| sqlx::query(
            "UPDATE deployments SET version = $3, alias = $4, canary_version = $5, canary_weight = $6, \
             canary_replicas = $7, updated_at = $8 WHERE tenant_id = $1 AND id = $2"
        )
        .bind(d.tenant_id)
        .bind(d.id)
        .bind(d.version)
        .bind(&d.alias)
        .bind(d.canary_version)
        .bind(d.canary_weight)
        .bind(d.canary_replicas)
        .bind(d.updated_at)
        .execute(c))?;
        Ok(())
    }

    /// Stores `after`, records the deployment event and the audit event of the change.
    async fn record_canary_change(
        &mut self,
        actor: &Actor,
        before: &DeploymentRow,
        after: &DeploymentRow,
        kind: &str,
        action: &'static str,
        message: &str,
    ) -> Result<()> {
        self.store_canary(after).await?;
        self.insert_deployment_event(after.tenant_id, after.id, kind, None, None, message).await?;
        let event = audit_event(after.tenant_id, action, &after.name, Some(before.summary()), Some(after.summary()));
        self.append_audit(actor, event).await.map(|_| ())
    }
}

/// A ready, serving replica as the route query reads it.
#[derive(FromRow)]
struct RouteReplica {
    deployment_id: Uuid,
    version: i64,
    canary: bool,
}

impl Registry {
    /// Sets (or replaces) a deployment's canary: its version must exist, fit the deployment's
    /// profile and differ from the stable target; its replicas count against the replica quota.
    pub async fn set_canary(
        &self,
        actor: &Actor,
        tenant_id: Uuid,
        name: &str,
        spec: CanarySpec,
    ) -> Result<DeploymentRow> {
        let mut tx = self.begin().await?;
        tx.lock_tenant(tenant_id).await?;
        tx.lock_scheduling().await?;
        let before = tx.deployment(tenant_id, name).await?.ok_or(Error::NotFound("deployment"))?;
        let version = tx.resolve_version(tenant_id, before.model_id, &spec.version).await.map_err(|e| match e {
            Error::NotFound(what) => Error::invalid(
                if what == "alias" { "alias" } else { "version" },
                format!("model '{}' has no such {what} to run as a canary", before.model_name),
            ),
            other => other,
        })?;
        if version == before.version {
            let message = format!("version {version} is already the deployment's version; a canary runs another one");
            return Err(Error::invalid("version", message));
        }
        tx.check_profile_fits(tenant_id, before.model_id, version, &before.profile).await.map_err(|e| match e {
            Error::InvalidInput { message, .. } => Error::invalid("version", message),
            other => other,
        })?;
        let had = if before.canary_version.is_some() { before.canary_replicas } else { 0 };
        tx.check_replica_quota(tenant_id, spec.replicas - had, false).await?;
        let mut after = before.clone();
        (after.canary_version, after.canary_weight, after.canary_replicas) =
            (Some(version), spec.weight, spec.replicas);
        after.updated_at = now();
        let message =
            format!("canary set: version {version} takes {}% of traffic on {} replica(s)", spec.weight, spec.replicas);
        tx.record_canary_change(actor, &before, &after, "canary_set", "deployment.canary.set", &message).await?;
        tx.commit().await?;
        Ok(after)
    }

    /// Changes the share of traffic of a deployment's canary.
    pub async fn set_canary_weight(
        &self,
        actor: &Actor,
        tenant_id: Uuid,
        name: &str,
        weight: i64,
    ) -> Result<DeploymentRow> {
        let mut tx = self.begin().await?;
        tx.lock_scheduling().await?;
        let (before, version) = tx.with_canary(tenant_id, name).await?;
        let mut after = before.clone();
        after.canary_weight = weight;
        after.updated_at = now();
        let message = format!("canary version {version}: weight {}% -> {weight}%", before.canary_weight);
        tx.record_canary_change(actor, &before, &after, "canary_weight", "deployment.canary.weight", &message).await?;
        tx.commit().await?;
        Ok(after)
    }

    /// Promotes the canary: its version becomes the deployment's (pinned; an alias is no longer
    /// followed) and rolls out to the stable replicas as any new version does, the canary
    /// keeping its share until they serve it; the scheduler then clears the canary.
    pub async fn promote_canary(&self, actor: &Actor, tenant_id: Uuid, name: &str) -> Result<DeploymentRow> {
        let mut tx = self.begin().await?;
        tx.lock_scheduling().await?;
        let (before, version) = tx.with_canary(tenant_id, name).await?;
        let mut after = before.clone();
        (after.version, after.alias) = (version, None);
        after.updated_at = now();
        let message = format!(
            "canary version {version} promoted: the stable replicas roll out from version {} to it",
            before.version
        );
        tx.record_canary_change(actor, &before, &after, "canary_promoted", "deployment.canary.promote", &message)
            .await?;
        tx.commit().await?;
        Ok(after)
    }

    /// Rolls the canary back: it is cleared and its replicas drain; the stable version takes
    /// all traffic.
    pub async fn rollback_canary(&self, actor: &Actor, tenant_id: Uuid, name: &str) -> Result<DeploymentRow> {
        let mut tx = self.begin().await?;
        tx.lock_scheduling().await?;
        let (before, version) = tx.with_canary(tenant_id, name).await?;
        let mut after = before.clone();
        (after.canary_version, after.canary_weight, after.canary_replicas) = (None, 0, 0);
        after.updated_at = now();
        let message = format!("canary version {version} rolled back: its replicas drain");
        tx.record_canary_change(actor, &before, &after, "canary_rolled_back", "deployment.canary.rollback", &message)
            .await?;
        tx.commit().await?;
        Ok(after)
    }
}

#[cfg(test)]
mod tests {
    use time::OffsetDateTime;

    use super::*;

    fn deployment(version: i64, canary: Option<(i64, i64)>) -> DeploymentRow {
        DeploymentRow {
            id: Uuid::nil(),
            tenant_id: Uuid::nil(),
            name: "d".into(),
            model_id: Uuid::nil(),
            model_name: "m".into(),
            version,
            alias: None,
            profile: "cpu".into(),
            replicas: 2,
            instance_count: 1,
            max_batch_size: None,
            dynamic_batching: None,
            memory_bytes: None,
            capture: None,
            spec_generation: 1,
            canary_version: canary.map(|(v, _)| v),
            canary_weight: canary.map_or(0, |(_, w)| w),
            canary_replicas: canary.map_or(0, |_| 1),
            created_by: None,
            created_at: OffsetDateTime::UNIX_EPOCH,
            updated_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    fn serving(list: &[(i64, bool)]) -> Vec<ServingReplica> {
        list.iter().map(|&(version, canary)| ServingReplica { version, canary }).collect()
    }

    fn weights(d: &DeploymentRow, list: &[(i64, bool)], effective: bool) -> Vec<(i64, i64, i64)> {
        traffic_split(d.into(), &serving(list), effective)
            .into_iter()
            .map(|s| (s.version, s.weight, s.ready_replicas))
            .collect()
    }

    #[test]
    fn without_a_canary_the_stable_version_takes_everything() {
        let d = deployment(1, None);
        assert_eq!(weights(&d, &[(1, false), (1, false)], true), [(1, 100, 2)]);
        assert_eq!(weights(&d, &[], false), [(1, 100, 0)], "nothing serves yet: the target");
        // A rollout before its switch: the old version still serves.
        assert_eq!(weights(&deployment(2, None), &[(1, false)], true), [(1, 100, 1)]);
    }

    #[test]
    fn a_canary_takes_its_weight_once_a_replica_of_it_serves() {
        let d = deployment(1, Some((2, 10)));
        assert_eq!(weights(&d, &[(1, false)], false), [(1, 90, 1), (2, 10, 0)], "as set");
        assert_eq!(weights(&d, &[(1, false)], true), [(1, 100, 1)], "in effect");
        assert_eq!(weights(&d, &[(1, false), (2, true)], true), [(1, 90, 1), (2, 10, 1)]);
        let shares = traffic_split((&d).into(), &serving(&[(1, false), (2, true)]), true);
        assert_eq!(weights_in_effect((&d).into(), &serving(&[(1, false), (2, true)])), [(1, 90), (2, 10)]);
        assert_eq!((shares[0].canary, shares[1].canary, shares[1].replicas), (false, true, 1));
    }

    #[test]
    fn a_promotion_keeps_the_split_until_the_stable_replicas_serve_the_canary_version() {
        let d = deployment(2, Some((2, 30)));
        assert_eq!(weights(&d, &[(1, false), (2, true)], true), [(1, 70, 1), (2, 30, 1)]);
        assert_eq!(weights(&d, &[(2, false), (2, true)], true), [(2, 100, 1)]);
    }
}
