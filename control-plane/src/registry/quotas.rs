//! Tenant quotas: limits set by platform admins, usage counted from the registry.
//!
//! Models, versions, storage bytes and replicas are enforced here, inside the creating transaction
//! after [`Conn::lock_tenant`]; so is monthly spend (on deployment creates and scale-ups, from the
//! month's invoice so far). Slices are enforced by the scheduler's placer; requests per second are
//! stored for the gateway to enforce.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::FromRow;
use sqlx::types::Json;
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::audit::{Actor, NewAuditEvent};
use super::{Conn, Registry, exec, now, on_conn};
use crate::error::{Error, QuotaName, Result};
use crate::types::is_slice_profile;

/// Most slice profiles a quota may name.
pub const MAX_SLICE_PROFILES: usize = 64;

/// A tenant's limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"models": 100, "versions": 1000, "storage_bytes": 107374182400_i64, "replicas": 32, "requests_per_second": 500, "concurrent_requests": 64, "monthly_spend_cents": 500000, "slices": {"cpu": 16, "mig-1g.10gb": 4}})))]
pub struct QuotaLimits {
    /// Most models.
    #[schema(minimum = 0)]
    pub models: i64,
    /// Most model versions, over all models.
    #[schema(minimum = 0)]
    pub versions: i64,
    /// Most bytes of stored artifacts.
    #[schema(minimum = 0)]
    pub storage_bytes: i64,
    /// Most deployment replicas.
    #[schema(minimum = 0)]
    pub replicas: i64,
    /// Most inference requests per second through the gateways; 0 is unlimited. Past it the
    /// gateway answers 429 (`RESOURCE_EXHAUSTED` on gRPC) with `Retry-After`.
    #[schema(minimum = 0)]
    pub requests_per_second: i64,
    /// Most inference requests in flight at once through the gateways; 0 (the default) is
    /// unlimited.
    #[serde(default)]
    #[schema(minimum = 0, default = 0)]
    pub concurrent_requests: i64,
    /// Most spend per calendar month (UTC), in cents; 0 is unlimited. Once the month's invoice
    /// reaches it, new deployments and scale-ups are refused (`quota_exceeded.monthly_spend_cents`).
    #[schema(minimum = 0)]
    pub monthly_spend_cents: i64,
    /// Most slices per slice profile (e.g. `{"cpu": 8, "mig-1g.10gb": 2}`): at most 64 profiles,
    /// each `cpu`, `gpu` or `mig-<profile>` (`^(cpu|gpu|mig-[a-z0-9.]{1,32})$`), each limit at
    /// least 0.
    #[schema(schema_with = slices_schema)]
    pub slices: BTreeMap<String, i64>,
}

/// The schema of [`QuotaLimits::slices`]: profile names as keys, limits of at least 0.
fn slices_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
    let limit = ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .minimum(Some(0));
    let name = ObjectBuilder::new().schema_type(Type::String).pattern(Some(crate::types::SLICE_PROFILE_PATTERN));
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some("Most slices per slice profile (e.g. `{\"cpu\": 8, \"mig-1g.10gb\": 2}`)."))
        .property_names(Some(name))
        .additional_properties(Some(limit))
        .max_properties(Some(MAX_SLICE_PROFILES))
        .build()
}

impl Default for QuotaLimits {
    /// Limits a new tenant gets unless the platform admin says otherwise.
    fn default() -> Self {
        QuotaLimits {
            models: 100,
            versions: 1_000,
            storage_bytes: 50 * 1024 * 1024 * 1024,
            replicas: 16,
            requests_per_second: 1_000,
            concurrent_requests: 0,
            monthly_spend_cents: 100_000,
            slices: BTreeMap::from([("cpu".to_string(), 16)]),
        }
    }
}

impl QuotaLimits {
    /// Refuses negative limits, naming the field.
    pub fn validate(&self) -> Result<()> {
        let fields = [
            ("models", self.models),
            ("versions", self.versions),
            ("storage_bytes", self.storage_bytes),
            ("replicas", self.replicas),
            ("requests_per_second", self.requests_per_second),
            ("concurrent_requests", self.concurrent_requests),
            ("monthly_spend_cents", self.monthly_spend_cents),
        ];
        for (field, v) in fields {
            if v < 0 {
                return Err(Error::invalid(field, format!("{field} must not be negative")));
            }
        }
        if self.slices.len() > MAX_SLICE_PROFILES {
            return Err(Error::invalid("slices", format!("slices may name at most {MAX_SLICE_PROFILES} profiles")));
        }
        if let Some(profile) = self.slices.keys().find(|p| !is_slice_profile(p)) {
            // The key is the caller's text: say what it must be without echoing it as a path.
            return Err(Error::invalid(
                "slices",
                format!("slices key '{}' is not a slice profile (cpu, gpu or mig-<profile>)", profile.escape_default()),
            ));
        }
        if let Some((profile, _)) = self.slices.iter().find(|(_, v)| **v < 0) {
            return Err(Error::invalid(format!("slices.{profile}"), format!("slices.{profile} must not be negative")));
        }
        Ok(())
    }

    /// Fails with `quota_exceeded.monthly_spend_cents` when `spent` (this month, cents) has
    /// reached a non-zero monthly spend limit.
    pub fn check_spend(&self, spent: i64) -> Result<()> {
        let limit = self.monthly_spend_cents;
        if limit > 0 && spent >= limit {
            return Err(Error::QuotaExceeded { quota: QuotaName::MonthlySpendCents, limit, requested: spent });
        }
        Ok(())
    }

    /// Fails with the quota's code if `requested` goes over the limit of `quota`.
    pub fn check(&self, quota: QuotaName, requested: i64) -> Result<()> {
        let limit = match quota {
            QuotaName::Models => self.models,
            QuotaName::Versions => self.versions,
            QuotaName::StorageBytes => self.storage_bytes,
            QuotaName::Replicas => self.replicas,
            // Spend is refused once it *reaches* the limit (0 = unlimited): see `check_spend`.
            QuotaName::MonthlySpendCents => return self.check_spend(requested),
        };
        if requested > limit {
            return Err(Error::QuotaExceeded { quota, limit, requested });
        }
        Ok(())
    }
}

/// Current use of the enforced quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QuotaUsage {
    /// Models.
    pub models: i64,
    /// Versions.
    pub versions: i64,
    /// Stored artifact bytes.
    pub storage_bytes: i64,
    /// Replicas asked for by the tenant's deployments.
    pub replicas: i64,
}

/// A stored quota row.
#[derive(Debug, Clone, FromRow)]
pub struct QuotaRow {
    /// Tenant.
    pub tenant_id: Uuid,
    /// Limit.
    pub max_models: i64,
    /// Limit.
    pub max_versions: i64,
    /// Limit.
    pub max_storage_bytes: i64,
    /// Limit.
    pub max_replicas: i64,
    /// Limit.
    pub max_requests_per_second: i64,
    /// Limit.
    pub max_concurrent_requests: i64,
    /// Limit.
    pub max_monthly_spend_cents: i64,
    /// Limits per slice profile.
    pub max_slices: Json<BTreeMap<String, i64>>,
    /// Last change.
    pub updated_at: OffsetDateTime,
}

impl From<QuotaRow> for QuotaLimits {
    fn from(r: QuotaRow) -> Self {
        QuotaLimits {
            models: r.max_models,
            versions: r.max_versions,
            storage_bytes: r.max_storage_bytes,
            replicas: r.max_replicas,
            requests_per_second: r.max_requests_per_second,
            concurrent_requests: r.max_concurrent_requests,
            monthly_spend_cents: r.max_monthly_spend_cents,
            slices: r.max_slices.0,
        }
    }
}

impl Conn {
    /// A tenant's limits.
    pub async fn quota(&mut self, tenant_id: Uuid) -> Result<QuotaLimits> {
        let row = on_conn!(self, "quota.get", |c| {
            sqlx::query_as::<_, QuotaRow>(
            "SELECT tenant_id, max_models, max_versions, max_storage_bytes, max_replicas, max_requests_per_second, \
             max_concurrent_requests, max_monthly_spend_cents, max_slices, updated_at FROM tenant_quotas WHERE tenant_id = $1"
        )
        .bind(tenant_id)
        .fetch_optional(c)
        })?;
        row.map(QuotaLimits::from).ok_or(Error::NotFound("tenant"))
    }

    /// A tenant's current usage.
    pub async fn quota_usage(&mut self, tenant_id: Uuid) -> Result<QuotaUsage> {
        let (models, versions, storage_bytes, replicas) = on_conn!(self, "quota.usage", |c| {
            sqlx::query_as::<_, (i64, i64, i64, i64)>(
                "SELECT (SELECT COUNT(*) FROM models WHERE tenant_id = $1), \
             (SELECT COUNT(*) FROM model_versions WHERE tenant_id = $1), \
             (SELECT CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) FROM model_versions WHERE tenant_id = $1), \
             (SELECT CAST(COALESCE(SUM(replicas + canary_replicas), 0) AS BIGINT) FROM deployments WHERE tenant_id = $1)"
            )
            .bind(tenant_id)
            .fetch_one(c)
        })?;
        Ok(QuotaUsage { models, versions, storage_bytes, replicas })
    }

    pub(super) async fn insert_quota(&mut self, tenant_id: Uuid, q: &QuotaLimits) -> Result<()> {
        exec!(self, "quota.upsert", |c| sqlx::query(
            "INSERT INTO tenant_quotas (tenant_id, max_models, max_versions, max_storage_bytes, max_replicas, \
             max_requests_per_second, max_monthly_spend_cents, max_slices, updated_at, max_concurrent_requests) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (tenant_id) DO UPDATE SET max_models = $2, max_versions = $3, max_storage_bytes = $4, \
             max_replicas = $5, max_requests_per_second = $6, max_monthly_spend_cents = $7, max_slices = $8, \
             updated_at = $9, max_concurrent_requests = $10"
        )
        .bind(tenant_id)
        .bind(q.models)
        .bind(q.versions)
        .bind(q.storage_bytes)
        .bind(q.replicas)
        .bind(q.requests_per_second)
        .bind(q.monthly_spend_cents)
        .bind(Json(&q.slices))
        .bind(now())
        .bind(q.concurrent_requests)
        .execute(c))?;
        Ok(())
    }
}

impl Registry {
    /// Replaces a tenant's limits; lowering one below current use is allowed (new creates fail).
    pub async fn set_quota(&self, actor: &Actor, tenant_id: Uuid, limits: &QuotaLimits) -> Result<QuotaLimits> {
        limits.validate()?;
        let mut tx = self.begin().await?;
        tx.lock_tenant(tenant_id).await?;
        let before = tx.quota(tenant_id).await?;
        tx.insert_quota(tenant_id, limits).await?;
        let event = NewAuditEvent {
            tenant_id,
            action: "quota.update",
            resource_type: "quota",
            resource_id: tenant_id.to_string(),
            before: Some(json!(before)),
            after: Some(json!(limits)),
        };
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(limits.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_quota() {
        let q = QuotaLimits { models: 2, ..QuotaLimits::default() };
        assert!(q.check(QuotaName::Models, 2).is_ok());
        let e = q.check(QuotaName::Models, 3).unwrap_err();
        assert_eq!(e.code(), "quota_exceeded.models");
    }

    #[test]
    fn spend_is_refused_once_it_reaches_the_limit_and_zero_is_unlimited() {
        let q = QuotaLimits { monthly_spend_cents: 100, ..QuotaLimits::default() };
        assert!(q.check_spend(99).is_ok());
        assert_eq!(q.check_spend(100).unwrap_err().code(), "quota_exceeded.monthly_spend_cents");
        let unlimited = QuotaLimits { monthly_spend_cents: 0, ..QuotaLimits::default() };
        assert!(unlimited.check_spend(i64::MAX).is_ok());
    }

    #[test]
    fn slice_keys_must_be_profiles() {
        for bad in ["../x", "", "CPU", "mig-", "tpu", "cpu/../gpu"] {
            let q = QuotaLimits { slices: BTreeMap::from([(bad.to_string(), 1)]), ..QuotaLimits::default() };
            match q.validate() {
                Err(Error::InvalidInput { field, .. }) => assert_eq!(field.as_deref(), Some("slices"), "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        let many = (0..65).map(|i| (format!("mig-{i}g"), 1)).collect();
        assert!(QuotaLimits { slices: many, ..QuotaLimits::default() }.validate().is_err());
        let ok = BTreeMap::from([("cpu".to_string(), 8), ("mig-1g.10gb".to_string(), 2)]);
        assert!(QuotaLimits { slices: ok, ..QuotaLimits::default() }.validate().is_ok());
        let negative = QuotaLimits { slices: BTreeMap::from([("gpu".to_string(), -1)]), ..QuotaLimits::default() };
        assert!(negative.validate().is_err());
    }

    #[test]
    fn negative_limits_are_refused_by_field() {
        let q = QuotaLimits { storage_bytes: -1, ..QuotaLimits::default() };
        match q.validate() {
            Err(Error::InvalidInput { field, .. }) => assert_eq!(field.as_deref(), Some("storage_bytes")),
            other => panic!("unexpected {other:?}"),
        }
    }
}
