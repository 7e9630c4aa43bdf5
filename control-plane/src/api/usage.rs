//! Usage and metrics of a tenant's models, from the records workers report: usage summed by
//! the groups asked for, and per-minute or per-hour metrics points for charts (viewers and up).

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::{IntoParams, ToSchema};

use super::{ApiQuery, AppState, Caller};
use crate::error::{Error, Result};
use crate::kinds::wire_enum;
use crate::registry::{UsageFilter, now};
use crate::types::Role;
use crate::usage::billing::Period;
use crate::usage::rollup::{GroupBy, UsageGroup, group_usage, points};

/// Longest time range a usage query covers, seconds (about 13 months).
const MAX_USAGE_RANGE: i64 = 400 * 86_400;
/// Most points a metrics query returns.
const MAX_POINTS: i64 = 10_080;

wire_enum! {
    /// What usage can be summed by (`group_by`, comma-separated; at most one of the times).
    pub enum UsageGrouping {
        /// Per model.
        Model = "model",
        /// Per model version.
        Version = "version",
        /// Per slice profile.
        Profile = "profile",
        /// Per minute.
        Minute = "minute",
        /// Per hour.
        Hour = "hour",
        /// Per day (UTC).
        Day = "day",
    }
}

wire_enum! {
    /// The width of a metrics point.
    pub enum MetricsStep {
        /// One minute.
        Minute = "minute",
        /// One hour.
        Hour = "hour",
    }
}

/// Which usage.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Start (RFC 3339, 2000 to 9999), inclusive; default: the start of the current month (UTC).
    #[param(format = DateTime)]
    pub from: Option<String>,
    /// End (RFC 3339, 2000 to 9999), exclusive; default: the end of the current month (UTC).
    #[param(format = DateTime)]
    pub to: Option<String>,
    /// Only this model.
    #[param(pattern = "^[a-z0-9][a-z0-9_.-]{0,62}$")]
    pub model: Option<String>,
    /// Only this version.
    #[param(minimum = 0)]
    pub version: Option<i64>,
    /// Comma-separated (`group_by=model,hour`): `model`, `version`, `profile` and at most one
    /// of `minute`, `hour`, `day`. Absent: one total.
    #[param(value_type = Option<Vec<UsageGrouping>>, style = Form, explode = false)]
    pub group_by: Option<String>,
}

/// Usage of one group; keys not grouped by are null.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UsageEntry {
    /// Model (when grouped by model).
    pub model: Option<String>,
    /// Version (when grouped by version).
    pub version: Option<i64>,
    /// Slice profile (when grouped by profile).
    pub slice_profile: Option<String>,
    /// Start of the minute, hour or day (when grouped by time). Usage older than the minute
    /// retention is kept per hour and shows at the hour's start.
    #[serde(with = "time::serde::rfc3339::option")]
    pub start: Option<OffsetDateTime>,
    /// Requests answered successfully.
    pub requests: i64,
    /// Requests answered with an error.
    pub failures: i64,
    /// Inferences (batch rows) in successful requests.
    pub inferences: i64,
    /// Compute time, seconds.
    pub compute_seconds: f64,
    /// Slice time reserved, seconds.
    pub slice_seconds: f64,
    /// GPU-seconds: the part of `slice_seconds` held on a whole GPU or a MIG instance (a MIG
    /// instance's second counts once, whatever its size; prices per profile weigh them).
    pub gpu_seconds: f64,
    /// The part of `compute_seconds` spent on GPU and MIG slices.
    pub gpu_compute_seconds: f64,
    /// Request bytes.
    pub bytes_in: i64,
    /// Response bytes.
    pub bytes_out: i64,
    /// Requests a gateway refused under the tenant's rate or concurrency limit (429 /
    /// `RESOURCE_EXHAUSTED`); not in `requests` or `failures`. Gateways report them under the
    /// model the client named, version 0 when it named none, and slice profile `gateway`.
    pub throttled: i64,
}

/// Usage by group.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    /// By time, then model, version and profile.
    pub usage: Vec<UsageEntry>,
}

/// Which metrics.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MetricsParams {
    /// Only this model (default: all of the tenant's).
    #[param(pattern = "^[a-z0-9][a-z0-9_.-]{0,62}$")]
    pub model: Option<String>,
    /// Only this version.
    #[param(minimum = 0)]
    pub version: Option<i64>,
    /// Start (RFC 3339, 2000 to 9999), aligned down to the step; default: 60 steps before `to`.
    #[param(format = DateTime)]
    pub from: Option<String>,
    /// End (RFC 3339, 2000 to 9999), exclusive; default: now.
    #[param(format = DateTime)]
    pub to: Option<String>,
    /// Width of a point (default `minute`).
    #[param(value_type = Option<MetricsStep>)]
    pub step: Option<String>,
}

/// Metrics of one step.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MetricsPoint {
    /// Step start.
    #[serde(with = "time::serde::rfc3339")]
    pub start: OffsetDateTime,
    /// Requests answered successfully.
    pub requests: i64,
    /// Requests answered with an error.
    pub failures: i64,
    /// Requests (successful and failed) per second over the step.
    pub request_rate: f64,
    /// Failed requests per second over the step.
    pub error_rate: f64,
    /// Requests a gateway refused under the tenant's limits in the step (not in the rates).
    pub throttled: i64,
    /// Median latency, microseconds: linear interpolation inside the histogram bucket holding
    /// the rank (the largest finite bound for the overflow bucket); null without requests.
    pub p50_us: Option<u64>,
    /// 95th percentile latency, microseconds.
    pub p95_us: Option<u64>,
    /// 99th percentile latency, microseconds.
    pub p99_us: Option<u64>,
    /// Mean executed batch size from the batch-size histogram (each bucket at the mean of its
    /// sizes); null without executions.
    pub mean_batch_size: Option<f64>,
}

/// Metrics points, one per step.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MetricsReport {
    /// Every step of the range, oldest first (steps without traffic are zero).
    pub points: Vec<MetricsPoint>,
}

/// An RFC 3339 time as Unix seconds, blaming `field`.
pub(super) fn parse_time(field: &str, s: Option<&str>) -> Result<Option<i64>> {
    s.map(|s| {
        let t = OffsetDateTime::parse(s, &Rfc3339).map_err(|_| {
            Error::invalid(field, format!("{field} must be an RFC 3339 time, e.g. 2026-11-30T12:00:00Z"))
        })?;
        crate::types::check_time(field, t)?;
        Ok(t.unix_timestamp())
    })
    .transpose()
}

/// Unix seconds as a time (out-of-range values clamp to the epoch).
pub(super) fn to_time(unix: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(unix).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// Checks the model and version filters of a usage or metrics query.
fn check_filter(model: Option<&str>, version: Option<i64>) -> Result<()> {
    if let Some(m) = model {
        crate::types::Name::from_path("model", m)?;
    }
    match version {
        Some(v) if v < 0 => Err(Error::invalid("version", "version must not be negative")),
        _ => Ok(()),
    }
}

impl From<UsageGroup> for UsageEntry {
    fn from(g: UsageGroup) -> Self {
        UsageEntry {
            model: g.model,
            version: g.version,
            slice_profile: g.slice_profile,
            start: g.start.map(to_time),
            requests: g.requests,
            failures: g.failures,
            inferences: g.inferences,
            compute_seconds: g.compute_us as f64 / 1e6,
            slice_seconds: g.slice_us as f64 / 1e6,
            gpu_seconds: g.gpu_slice_us as f64 / 1e6,
            gpu_compute_seconds: g.gpu_compute_us as f64 / 1e6,
            bytes_in: g.bytes_in,
            bytes_out: g.bytes_out,
            throttled: g.throttled,
        }
    }
}

/// A tenant's usage over a time range, optionally of one model or version, summed by the
/// groups asked for (viewers and up).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/usage", operation_id = "get_usage", tag = "usage",
    params(("tenant" = String, Path, description = "Tenant name"), UsageParams),
    responses((status = 200, description = "Usage by group.", body = UsageReport)))]
pub async fn handle_usage(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiQuery(params): ApiQuery<UsageParams>,
) -> Result<Json<UsageReport>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Viewer, "read usage").await?;
    let group_by = GroupBy::parse(params.group_by.as_deref())?;
    check_filter(params.model.as_deref(), params.version)?;
    let month = Period::of(now()).bounds();
    let to = parse_time("to", params.to.as_deref())?.unwrap_or(month.1);
    let from = parse_time("from", params.from.as_deref())?.unwrap_or(month.0);
    if from >= to || to - from > MAX_USAGE_RANGE {
        return Err(Error::invalid("from", "from must be before to, at most 400 days apart"));
    }
    let filter = UsageFilter { from, to, model: params.model, version: params.version };
    let rows = app.registry.conn().await?.usage_totals(t.id, &filter).await?;
    Ok(Json(UsageReport { usage: group_usage(&rows, group_by).into_iter().map(UsageEntry::from).collect() }))
}

/// Per-step metrics of a tenant's models (optionally one model or version): request and
/// error rates, latency percentiles and mean batch size (viewers and up).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/metrics", operation_id = "get_metrics", tag = "usage",
    params(("tenant" = String, Path, description = "Tenant name"), MetricsParams),
    responses((status = 200, description = "One point per step.", body = MetricsReport)))]
pub async fn handle_metrics(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiQuery(params): ApiQuery<MetricsParams>,
) -> Result<Json<MetricsReport>> {
    let t = app.tenant_for(&caller.principal, &tenant, Role::Viewer, "read metrics").await?;
    let step = match params.step.as_deref().map(MetricsStep::parse) {
        None | Some(Some(MetricsStep::Minute)) => 60,
        Some(Some(MetricsStep::Hour)) => 3600,
        Some(None) => return Err(Error::invalid("step", "step must be minute or hour")),
    };
    check_filter(params.model.as_deref(), params.version)?;
    let to = parse_time("to", params.to.as_deref())?.unwrap_or_else(|| now().unix_timestamp() + 1);
    let from = parse_time("from", params.from.as_deref())?.unwrap_or(to - 60 * step).div_euclid(step) * step;
    if from >= to || (to - from) / step > MAX_POINTS {
        return Err(Error::invalid("from", format!("from must be before to, at most {MAX_POINTS} steps apart")));
    }
    let filter = UsageFilter { from, to, model: params.model, version: params.version };
    let rows = app.registry.conn().await?.usage_records(t.id, &filter).await?;
    let points = points(&rows, from, to, step)
        .into_iter()
        .map(|p| MetricsPoint {
            start: to_time(p.start),
            requests: p.requests,
            failures: p.failures,
            request_rate: p.request_rate,
            error_rate: p.error_rate,
            throttled: p.throttled,
            p50_us: p.p50_us,
            p95_us: p.p95_us,
            p99_us: p.p99_us,
            mean_batch_size: p.mean_batch_size,
        })
        .collect();
    Ok(Json(MetricsReport { points }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_grouping_and_step_is_accepted() {
        for g in UsageGrouping::ALL {
            assert!(GroupBy::parse(Some(g.as_str())).is_ok(), "{g}");
        }
        let all_but_time = "model,version,profile";
        assert!(GroupBy::parse(Some(&format!("{all_but_time},day"))).is_ok());
        assert!(GroupBy::parse(Some("week")).is_err());
        assert_eq!(MetricsStep::parse("hour"), Some(MetricsStep::Hour));
        assert_eq!(MetricsStep::parse("day"), None);
    }
}
