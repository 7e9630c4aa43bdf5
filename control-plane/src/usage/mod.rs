//! Usage metering on the control plane: checking the records workers report, the retention
//! job that folds old minutes into hours, roll-ups ([`rollup`]) and invoices ([`billing`]).

pub mod billing;
pub mod issue;
pub mod rollup;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use sqlx::types::Json;
use tessera_protocol::agent::UsageRecord;
use tessera_protocol::usage::{BATCH_SIZE_BUCKETS, LATENCY_BUCKETS_US};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::app::App;
use crate::error::{Error, Result};
use crate::registry::{MINUTE, Registry, UsageRecordRow};

/// Most records one `ReportUsage` call may carry.
pub const MAX_BATCH: usize = 10_000;
/// Longest record key accepted.
const MAX_KEY_LEN: usize = 256;
/// How often the retention job runs.
const RETENTION_EVERY: Duration = Duration::from_secs(300);
/// Minute rows one retention transaction folds at most (it loops until none are left).
const FOLD_BATCH: i64 = 5_000;

/// Checks a reported record and converts it to a row; the error names the record's key.
pub fn check_record(r: &UsageRecord) -> Result<(UsageRecordRow, Uuid)> {
    let bad = |why: &str| Error::invalid("records", format!("usage record '{}': {why}", r.key));
    if r.key.is_empty() || r.key.len() > MAX_KEY_LEN || r.key.starts_with("hour:") || r.key.contains('\0') {
        return Err(bad("the key must be 1 to 256 characters, not starting with 'hour:'"));
    }
    let tenant_id = Uuid::parse_str(&r.tenant_id).map_err(|_| bad("tenant_id is not a UUID"))?;
    let text_ok = |s: &str| !s.is_empty() && s.len() <= 256 && !s.contains('\0');
    if !text_ok(&r.model_name) || !text_ok(&r.slice_profile) || r.worker_id.len() > 256 || r.worker_id.contains('\0') {
        return Err(bad("model_name and slice_profile must be 1 to 256 characters, worker_id at most 256"));
    }
    if r.version < 0 {
        return Err(bad("version must not be negative"));
    }
    if r.minute < 0 || r.minute % MINUTE != 0 {
        return Err(bad("minute must be a non-negative multiple of 60 (Unix seconds)"));
    }
    if r.latency_counts.len() != LATENCY_BUCKETS_US.len() + 1 {
        return Err(bad(&format!("latency_counts must have {} buckets", LATENCY_BUCKETS_US.len() + 1)));
    }
    if r.batch_size_counts.len() != BATCH_SIZE_BUCKETS.len() + 1 {
        return Err(bad(&format!("batch_size_counts must have {} buckets", BATCH_SIZE_BUCKETS.len() + 1)));
    }
    let int = |name: &str, v: u64| i64::try_from(v).map_err(|_| bad(&format!("{name} is too large")));
    let micros = |name: &str, secs: f64| {
        if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
            return Err(bad(&format!("{name} must be a finite, non-negative number of seconds")));
        }
        // Integer microseconds: sums and downsampling stay exact from here on.
        Ok((secs * 1e6).round() as i64)
    };
    let counts = |name: &str, v: &[u64]| v.iter().map(|c| int(name, *c)).collect::<Result<Vec<i64>>>();
    let row = UsageRecordRow {
        key: r.key.clone(),
        worker_id: r.worker_id.clone(),
        tenant_id,
        model_name: r.model_name.clone(),
        version: r.version,
        slice_profile: r.slice_profile.clone(),
        period_start: r.minute,
        period_seconds: MINUTE,
        requests: int("requests", r.requests)?,
        failures: int("failures", r.failures)?,
        inferences: int("inferences", r.inferences)?,
        executions: int("executions", r.executions)?,
        compute_us: micros("compute_seconds", r.compute_seconds)?,
        slice_us: micros("slice_seconds", r.slice_seconds)?,
        bytes_in: int("bytes_in", r.bytes_in)?,
        bytes_out: int("bytes_out", r.bytes_out)?,
        latency_counts: Json(counts("latency_counts", &r.latency_counts)?),
        latency_sum_us: int("latency_sum_us", r.latency_sum_us)?,
        batch_size_counts: Json(counts("batch_size_counts", &r.batch_size_counts)?),
        throttled: int("throttled", r.throttled)?,
    };
    Ok((row, tenant_id))
}

/// Checks and stores a batch: every record valid and of a known tenant, or nothing is stored.
/// Returns the keys now stored (new or duplicate), in the order given.
pub async fn ingest(registry: &Registry, records: &[UsageRecord]) -> Result<Vec<String>> {
    if records.len() > MAX_BATCH {
        return Err(Error::invalid("records", format!("at most {MAX_BATCH} records per call")));
    }
    let mut rows = Vec::with_capacity(records.len());
    let mut tenants = BTreeSet::new();
    for r in records {
        let (row, tenant) = check_record(r)?;
        tenants.insert(tenant);
        rows.push(row);
    }
    let tenants: Vec<Uuid> = tenants.into_iter().collect();
    let known: BTreeSet<Uuid> = registry.conn().await?.existing_tenants(&tenants).await?.into_iter().collect();
    if let Some(r) = rows.iter().find(|r| !known.contains(&r.tenant_id)) {
        return Err(Error::invalid("records", format!("usage record '{}': unknown tenant {}", r.key, r.tenant_id)));
    }
    let stored = registry.store_usage(&rows).await?;
    crate::metrics::observe_usage(stored.stored, stored.duplicates);
    Ok(rows.into_iter().map(|r| r.key).collect())
}

/// Folds every minute row that started more than `retention` before `now_unix` into hourly
/// rows. Returns the rows folded.
pub async fn fold_old_minutes(registry: &Registry, now_unix: i64, retention: Duration) -> Result<u64> {
    let cutoff = now_unix - i64::try_from(retention.as_secs()).unwrap_or(i64::MAX / 2);
    let mut total = 0;
    loop {
        let n = registry.fold_usage(cutoff, FOLD_BATCH).await?;
        total += n;
        if n < FOLD_BATCH as u64 {
            return Ok(total);
        }
    }
}

/// Runs the retention job every few minutes until `shutdown`. Every control-plane replica runs
/// it; on Postgres each fold takes an exclusive advisory transaction lock, so they fold one
/// after the other and a later one finds nothing left to fold.
pub async fn run_retention(app: Arc<App>, shutdown: CancellationToken) {
    let mut interval = tokio::time::interval(RETENTION_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = interval.tick() => {}
        }
        let now = crate::registry::now().unix_timestamp();
        match fold_old_minutes(&app.registry, now, app.config.usage_minute_retention).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, "folded old usage minutes into hours"),
            Err(e) => tracing::warn!(error = %e, "usage retention run failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record(key: &str, tenant: Uuid, minute: i64) -> UsageRecord {
        UsageRecord {
            key: key.into(),
            worker_id: "w1".into(),
            tenant_id: tenant.to_string(),
            model_name: "m".into(),
            version: 1,
            slice_profile: "cpu".into(),
            minute,
            requests: 3,
            failures: 1,
            inferences: 6,
            executions: 2,
            compute_seconds: 0.25,
            slice_seconds: 60.0,
            bytes_in: 10,
            bytes_out: 20,
            latency_counts: vec![1; LATENCY_BUCKETS_US.len() + 1],
            latency_sum_us: 1000,
            batch_size_counts: vec![0; BATCH_SIZE_BUCKETS.len() + 1],
            throttled: 0,
        }
    }

    #[test]
    fn records_are_checked_and_errors_name_the_key() {
        let t = Uuid::now_v7();
        let (row, tenant) = check_record(&record("k1", t, 120)).unwrap();
        assert_eq!((tenant, row.compute_us, row.slice_us, row.period_seconds), (t, 250_000, 60_000_000, 60));
        let fails = |r: UsageRecord| {
            let e = check_record(&r).unwrap_err();
            assert!(e.to_string().contains(&format!("'{}'", r.key)), "{e}");
            assert_eq!(e.kind().grpc_code(), tonic::Code::InvalidArgument);
        };
        fails(record("odd-minute", t, 90));
        fails(UsageRecord { latency_counts: vec![1], ..record("short", t, 60) });
        fails(UsageRecord { batch_size_counts: vec![], ..record("short-batches", t, 60) });
        fails(UsageRecord { compute_seconds: -1.0, ..record("negative", t, 60) });
        fails(UsageRecord { slice_seconds: f64::NAN, ..record("nan", t, 60) });
        fails(UsageRecord { requests: u64::MAX, ..record("huge", t, 60) });
        fails(UsageRecord { throttled: u64::MAX, ..record("huge-throttled", t, 60) });
        fails(UsageRecord { tenant_id: "acme".into(), ..record("no-uuid", t, 60) });
        fails(UsageRecord { version: -1, ..record("neg-version", t, 60) });
        fails(record("hour:forged", t, 60));
    }
}
