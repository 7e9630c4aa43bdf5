//! Usage records: stored once per key (insert-if-absent), read back summed per minute for the
//! usage, metrics and invoice endpoints, and folded into hourly rows by the retention job.
//!
//! Every read takes the tenant id and filters by it here. Only [`Registry::store_usage`] and
//! [`Registry::fold_usage`] cross tenants: workers report for every tenant they serve, and the
//! retention job folds everyone's old minutes.

use std::collections::BTreeMap;

use sqlx::FromRow;
use sqlx::types::Json;
use uuid::Uuid;

use super::{Conn, ConnInner, Registry, exec, now, on_conn};
use crate::error::Result;
use crate::usage::billing::{Period, invoice};

/// Seconds of a usage record as reported (one minute).
pub const MINUTE: i64 = 60;
/// Seconds of a row folded by the retention job (one hour).
pub const HOUR: i64 = 3600;

/// One usage record: as a worker reported it, or an hourly row folded from such records.
#[derive(Debug, Clone, Default, PartialEq, Eq, FromRow)]
pub struct UsageRecordRow {
    /// Idempotency key.
    pub key: String,
    /// Reporting worker (empty for folded rows, which merge workers).
    pub worker_id: String,
    /// Tenant.
    pub tenant_id: Uuid,
    /// Model name clients used.
    pub model_name: String,
    /// Model version.
    pub version: i64,
    /// Slice profile of the replica.
    pub slice_profile: String,
    /// Start, Unix seconds (a multiple of `period_seconds`).
    pub period_start: i64,
    /// 60 (a minute as reported) or 3600 (an hour folded by retention).
    pub period_seconds: i64,
    /// Successful requests.
    pub requests: i64,
    /// Failed requests.
    pub failures: i64,
    /// Inferences (batch rows) in successful requests.
    pub inferences: i64,
    /// Executions (batches run).
    pub executions: i64,
    /// Compute time, microseconds.
    pub compute_us: i64,
    /// Reserved slice time, microseconds.
    pub slice_us: i64,
    /// Request bytes.
    pub bytes_in: i64,
    /// Response bytes.
    pub bytes_out: i64,
    /// Latency bucket counts.
    pub latency_counts: Json<Vec<i64>>,
    /// Sum of latencies, microseconds.
    pub latency_sum_us: i64,
    /// Batch-size bucket counts.
    pub batch_size_counts: Json<Vec<i64>>,
    /// Requests a gateway refused under the tenant's limits.
    pub throttled: i64,
}

/// Usage summed over workers per (model, version, profile, period start).
#[derive(Debug, Clone, Default, PartialEq, Eq, FromRow)]
pub struct UsageTotalsRow {
    /// Model name.
    pub model_name: String,
    /// Version.
    pub version: i64,
    /// Slice profile.
    pub slice_profile: String,
    /// Period start, Unix seconds.
    pub period_start: i64,
    /// Successful requests.
    pub requests: i64,
    /// Failed requests.
    pub failures: i64,
    /// Inferences.
    pub inferences: i64,
    /// Executions.
    pub executions: i64,
    /// Compute time, microseconds.
    pub compute_us: i64,
    /// Reserved slice time, microseconds.
    pub slice_us: i64,
    /// Request bytes.
    pub bytes_in: i64,
    /// Response bytes.
    pub bytes_out: i64,
    /// Requests a gateway refused under the tenant's limits.
    pub throttled: i64,
}

/// Which usage a read covers: `[from, to)` by period start, optionally one model and version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageFilter {
    /// First period start included, Unix seconds.
    pub from: i64,
    /// First period start excluded, Unix seconds.
    pub to: i64,
    /// Only this model.
    pub model: Option<String>,
    /// Only this version.
    pub version: Option<i64>,
}

/// What one delivery did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageStored {
    /// Records stored now.
    pub stored: u64,
    /// Records whose key was already stored (or folded).
    pub duplicates: u64,
}

impl UsageRecordRow {
    /// Adds `other`'s counters and histograms to this row.
    fn absorb(&mut self, other: &UsageRecordRow) {
        self.requests += other.requests;
        self.failures += other.failures;
        self.inferences += other.inferences;
        self.executions += other.executions;
        self.compute_us += other.compute_us;
        self.slice_us += other.slice_us;
        self.bytes_in += other.bytes_in;
        self.bytes_out += other.bytes_out;
        self.throttled += other.throttled;
        self.latency_sum_us += other.latency_sum_us;
        add_counts(&mut self.latency_counts.0, &other.latency_counts.0);
        add_counts(&mut self.batch_size_counts.0, &other.batch_size_counts.0);
    }
}

/// Adds bucket counts element-wise, growing `into` if `from` is longer.
pub fn add_counts(into: &mut Vec<i64>, from: &[i64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from) {
        *a += b;
    }
}

macro_rules! select_usage {
    ($rest:literal) => {
        concat!(
            "SELECT key, worker_id, tenant_id, model_name, version, slice_profile, period_start, period_seconds, ",
            "requests, failures, inferences, executions, compute_us, slice_us, bytes_in, bytes_out, latency_counts, ",
            "latency_sum_us, batch_size_counts, throttled FROM usage_records ",
            $rest
        )
    };
}

/// Key of the Postgres advisory lock between deliveries and folds (any constant unique to Tessera).
const RETENTION_LOCK: i64 = crate::locks::USAGE_RETENTION;

impl Conn {
    /// Takes the retention lock for the rest of the transaction: shared by deliveries, exclusive
    /// for a fold, so a replay cannot slip in while its minute row is being folded (on Postgres;
    /// SQLite's write transaction already excludes every other writer).
    async fn lock_retention(&mut self, exclusive: bool) -> Result<()> {
        let started = std::time::Instant::now();
        let sql =
            if exclusive { "SELECT pg_advisory_xact_lock($1)" } else { "SELECT pg_advisory_xact_lock_shared($1)" };
        self.queries += 1;
        let result = match &mut self.inner {
            ConnInner::PostgresTx(tx) => sqlx::query(sql).bind(RETENTION_LOCK).execute(&mut **tx).await.map(|_| ()),
            ConnInner::Postgres(_) => Err(sqlx::Error::Protocol("lock_retention outside a transaction".into())),
            ConnInner::Sqlite(_) | ConnInner::SqliteTx(_) => Ok(()),
        };
        crate::metrics::observe_query("usage.retention_lock", started.elapsed(), result.is_ok());
        Ok(result?)
    }

    /// Which of `ids` are tenants.
    pub async fn existing_tenants(&mut self, ids: &[Uuid]) -> Result<Vec<Uuid>> {
        let mut found = Vec::new();
        for id in ids {
            if self.tenant_by_id(*id).await?.is_some() {
                found.push(*id);
            }
        }
        Ok(found)
    }

    /// What a tenant has spent in the calendar month holding `at`, cents: the month's invoice
    /// total so far.
    pub async fn month_spend_cents(&mut self, tenant_id: Uuid, at: time::OffsetDateTime) -> Result<i64> {
        let (from, to) = Period::of(at).bounds();
        let usage = self.usage_totals(tenant_id, &UsageFilter { from, to, model: None, version: None }).await?;
        let prices = self.prices().await?;
        Ok(invoice(&usage, &prices).total_cents)
    }

    /// A tenant's usage summed over workers per (model, version, profile, period start).
    pub async fn usage_totals(&mut self, tenant_id: Uuid, f: &UsageFilter) -> Result<Vec<UsageTotalsRow>> {
        on_conn!(self, "usage.totals", |c| sqlx::query_as::<_, UsageTotalsRow>(
            "SELECT model_name, version, slice_profile, period_start, \
             CAST(SUM(requests) AS BIGINT) AS requests, CAST(SUM(failures) AS BIGINT) AS failures, \
             CAST(SUM(inferences) AS BIGINT) AS inferences, CAST(SUM(executions) AS BIGINT) AS executions, \
             CAST(SUM(compute_us) AS BIGINT) AS compute_us, CAST(SUM(slice_us) AS BIGINT) AS slice_us, \
             CAST(SUM(bytes_in) AS BIGINT) AS bytes_in, CAST(SUM(bytes_out) AS BIGINT) AS bytes_out, \
             CAST(SUM(throttled) AS BIGINT) AS throttled \
             FROM usage_records WHERE tenant_id = $1 AND period_start >= $2 AND period_start < $3 \
             AND ($4 IS NULL OR model_name = $4) AND ($5 IS NULL OR version = $5) \
             GROUP BY model_name, version, slice_profile, period_start \
             ORDER BY period_start, model_name, version, slice_profile"
        )
        .bind(tenant_id)
        .bind(f.from)
        .bind(f.to)
        .bind(f.model.as_deref())
        .bind(f.version)
        .fetch_all(c))
    }

    /// A tenant's usage records, histograms included, by period start.
    pub async fn usage_records(&mut self, tenant_id: Uuid, f: &UsageFilter) -> Result<Vec<UsageRecordRow>> {
        on_conn!(self, "usage.records", |c| sqlx::query_as::<_, UsageRecordRow>(select_usage!(
            "WHERE tenant_id = $1 AND period_start >= $2 AND period_start < $3 \
             AND ($4 IS NULL OR model_name = $4) AND ($5 IS NULL OR version = $5) ORDER BY period_start, key"
        ))
        .bind(tenant_id)
        .bind(f.from)
        .bind(f.to)
        .bind(f.model.as_deref())
        .bind(f.version)
        .fetch_all(c))
    }

    /// Stores `r` unless its key is stored or folded already; true when stored.
    async fn insert_usage(&mut self, r: &UsageRecordRow) -> Result<bool> {
        let received_at = now();
        let n = exec!(self, "usage.insert", |c| {
            sqlx::query(
            "INSERT INTO usage_records (key, worker_id, tenant_id, model_name, version, slice_profile, period_start, \
             period_seconds, requests, failures, inferences, executions, compute_us, slice_us, bytes_in, bytes_out, \
             latency_counts, latency_sum_us, batch_size_counts, received_at, throttled) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21 \
             WHERE NOT EXISTS (SELECT 1 FROM usage_folded_keys WHERE key = $1) \
             ON CONFLICT (key) DO NOTHING"
        )
        .bind(&r.key)
        .bind(&r.worker_id)
        .bind(r.tenant_id)
        .bind(&r.model_name)
        .bind(r.version)
        .bind(&r.slice_profile)
        .bind(r.period_start)
        .bind(r.period_seconds)
        .bind(r.requests)
        .bind(r.failures)
        .bind(r.inferences)
        .bind(r.executions)
        .bind(r.compute_us)
        .bind(r.slice_us)
        .bind(r.bytes_in)
        .bind(r.bytes_out)
        .bind(&r.latency_counts)
        .bind(r.latency_sum_us)
        .bind(&r.batch_size_counts)
        .bind(received_at)
        .bind(r.throttled)
        .execute(c)
        })?;
        Ok(n > 0)
    }

    /// Replaces a folded hourly row (or creates it).
    async fn upsert_hour(&mut self, r: &UsageRecordRow) -> Result<()> {
        exec!(self, "usage.delete_hour", |c| sqlx::query("DELETE FROM usage_records WHERE key = $1")
            .bind(&r.key)
            .execute(c))?;
        self.insert_usage(r).await?;
        Ok(())
    }
}

impl Registry {
    /// Stores a batch of validated records in one transaction, each key once: a key already
    /// stored (or folded into an hourly row) is a duplicate and changes nothing.
    pub async fn store_usage(&self, records: &[UsageRecordRow]) -> Result<UsageStored> {
        let mut tx = self.begin().await?;
        tx.lock_retention(false).await?;
        let mut out = UsageStored::default();
        for r in records {
            if tx.insert_usage(r).await? {
                out.stored += 1;
            } else {
                out.duplicates += 1;
            }
        }
        tx.commit().await?;
        Ok(out)
    }

    /// Folds up to `limit` minute rows that start before `cutoff` (Unix seconds) into hourly
    /// rows per (tenant, model, version, profile, hour), keeping every counter and histogram
    /// total, and remembers the folded keys so replays stay duplicates. Returns the rows folded.
    pub async fn fold_usage(&self, cutoff: i64, limit: i64) -> Result<u64> {
        let mut tx = self.begin().await?;
        // Replicas fold one after the other; the second finds what the first left.
        tx.lock_retention(true).await?;
        let minutes = on_conn!(tx, "usage.old_minutes", |c| sqlx::query_as::<_, UsageRecordRow>(select_usage!(
            "WHERE period_seconds = 60 AND period_start < $1 ORDER BY period_start, key LIMIT $2"
        ))
        .bind(cutoff)
        .bind(limit)
        .fetch_all(c))?;
        let mut hours: BTreeMap<String, UsageRecordRow> = BTreeMap::new();
        for m in &minutes {
            let start = m.period_start.div_euclid(HOUR) * HOUR;
            let key = hour_key(m.tenant_id, &m.model_name, m.version, &m.slice_profile, start);
            let hour = match hours.entry(key) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let existing = on_conn!(tx, "usage.get", |c| sqlx::query_as::<_, UsageRecordRow>(select_usage!(
                        "WHERE key = $1"
                    ))
                    .bind(e.key())
                    .fetch_optional(c))?;
                    // Every counter zero, no worker: the minutes are added below.
                    let empty = UsageRecordRow {
                        key: e.key().clone(),
                        tenant_id: m.tenant_id,
                        model_name: m.model_name.clone(),
                        version: m.version,
                        slice_profile: m.slice_profile.clone(),
                        period_start: start,
                        period_seconds: HOUR,
                        ..UsageRecordRow::default()
                    };
                    e.insert(existing.unwrap_or(empty))
                }
            };
            hour.absorb(m);
        }
        for hour in hours.values() {
            tx.upsert_hour(hour).await?;
        }
        for m in &minutes {
            exec!(tx, "usage.fold_key", |c| sqlx::query(
                "INSERT INTO usage_folded_keys (key, period_start) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING"
            )
            .bind(&m.key)
            .bind(m.period_start)
            .execute(c))?;
            exec!(tx, "usage.delete_minute", |c| sqlx::query("DELETE FROM usage_records WHERE key = $1")
                .bind(&m.key)
                .execute(c))?;
        }
        tx.commit().await?;
        Ok(minutes.len() as u64)
    }
}

/// Key of the hourly row a group's minutes fold into; `hour:` cannot collide with a worker's
/// keys, which the API checks do not start with it.
pub fn hour_key(tenant_id: Uuid, model: &str, version: i64, profile: &str, start: i64) -> String {
    format!("hour:{tenant_id}:{start}:{version}:{profile}:{model}")
}
