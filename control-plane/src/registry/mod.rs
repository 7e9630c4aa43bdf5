//! The registry: every table the control plane owns, behind one struct.
//!
//! [`Registry`] runs on Postgres (production) or on an SQLite file (single box, `dev`). Both
//! take the same SQL text (`$1` placeholders work in both) and decode into the same `*Row`
//! structs; the `on_conn!` macro instantiates a query once per driver. Every query that
//! touches tenant data takes the tenant id and filters by it *inside this module*, so a caller
//! cannot forget to scope one. Each query is timed under a label (see [`crate::metrics`]).
//!
//! Deployments, replicas, workers and scheduling follow the same rules; the few queries that
//! cross tenants (the scheduler's snapshot, a worker's assignments) say why.
//!
//! Mutations run in a transaction that also appends their audit event, so a change and its
//! audit record commit together or not at all.

mod audit;
mod canary;
mod capture;
mod deployments;
mod ensembles;
mod idempotency;
mod invoices;
mod keys;
mod models;
mod prices;
mod quotas;
mod routes;
mod scheduling;
mod signing;
mod sso;
mod tenants;
mod usage;
mod users;
mod webhooks;
mod workers;

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, PgPool, Postgres, Sqlite, SqlitePool, Transaction};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

pub use audit::{
    Actor, AuditActorRow, AuditEventRow, AuditFilter, ChainBreak, ChainReport, ChainVerifier, NewAuditEvent,
};
pub use canary::{
    CanarySpec, DeploymentWeights, ServingReplica, SplitSpec, VersionShare, traffic_split, weights_in_effect,
};
pub use deployments::{
    DeploymentEventRow, DeploymentPatch, DeploymentRow, DeploymentSpec, ReplicaRow, VersionRef, unfollowed_alias,
};
pub use ensembles::ComposingRow;
pub use idempotency::{IdempotencyClaim, IdempotencyScope};
pub use invoices::IssuedInvoice;
pub use keys::{ApiKeyRow, NewApiKey};
pub use models::{AliasRow, ModelRow, NewVersion, UploadRow, VersionRow};
pub use prices::PriceRow;
pub use quotas::{QuotaLimits, QuotaRow, QuotaUsage};
pub use routes::{RouteDeploymentRow, RouteKeyRow, RouteReplicaRow, RouteTenantRow};
pub use signing::SigningKeyRow;
pub use sso::{ConsoleSessionRow, NewConsoleSession, OidcIssuerRow, OidcLoginRow};
pub use tenants::TenantRow;
pub use usage::{HOUR, MINUTE, UsageFilter, UsageRecordRow, UsageStored, UsageTotalsRow, add_counts, hour_key};
pub use users::{NewUser, UserRow};
pub use webhooks::{
    AttemptOutcome, DeliveryRow, DueDeliveryRow, MAX_WEBHOOKS_PER_TENANT, NewWebhook, WebhookPatch, WebhookRow,
    event_body,
};
pub use workers::{AssignmentRow, ChangedReplica, NewWorker, ReportedState, SliceRecord, WorkerRow};

use crate::error::{Error, Result};

static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");
static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// Which database a [`Registry`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL.
    Postgres,
    /// An SQLite file.
    Sqlite,
}

#[derive(Clone)]
enum Db {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

/// The registry: one pool, every query.
#[derive(Clone)]
pub struct Registry {
    db: Db,
}

/// One connection, inside or outside a transaction; registry queries are methods on it.
pub struct Conn {
    inner: ConnInner,
    /// Statements run on this connection: lets tests pin how many round trips a read takes
    /// (a plain counter, as every query already holds the connection mutably).
    queries: usize,
}

enum ConnInner {
    Postgres(PoolConnection<Postgres>),
    PostgresTx(Transaction<'static, Postgres>),
    Sqlite(PoolConnection<Sqlite>),
    SqliteTx(Transaction<'static, Sqlite>),
}

/// Runs `$body` (an expression using the connection `$c`, returning a future of
/// `Result<_, sqlx::Error>`) on whichever driver `$conn` holds, times it under `$label`, and
/// maps the error. The body is compiled once per driver, so its output must be one type for
/// both: row types and scalars are; for statements use [`exec!`], which yields rows affected.
macro_rules! on_conn {
    ($conn:expr, $label:literal, |$c:ident| $body:expr) => {
        $crate::registry::on_conn!(@map $conn, $label, |$c| $body, |r| r)
    };
    (@map $conn:expr, $label:literal, |$c:ident| $body:expr, |$r:ident| $map:expr) => {{
        let started = std::time::Instant::now();
        $conn.queries += 1;
        let result = match &mut $conn.inner {
            $crate::registry::ConnInner::Postgres(x) => {
                let $c: &mut sqlx::PgConnection = &mut **x;
                $body.await.map(|$r| $map)
            }
            $crate::registry::ConnInner::PostgresTx(x) => {
                let $c: &mut sqlx::PgConnection = &mut **x;
                $body.await.map(|$r| $map)
            }
            $crate::registry::ConnInner::Sqlite(x) => {
                let $c: &mut sqlx::SqliteConnection = &mut **x;
                $body.await.map(|$r| $map)
            }
            $crate::registry::ConnInner::SqliteTx(x) => {
                let $c: &mut sqlx::SqliteConnection = &mut **x;
                $body.await.map(|$r| $map)
            }
        };
        $crate::metrics::observe_query($label, started.elapsed(), result.is_ok());
        result.map_err($crate::error::Error::from)
    }};
}

/// Like [`on_conn!`] for a statement (`.execute(c)`): yields the number of rows affected.
macro_rules! exec {
    ($conn:expr, $label:literal, |$c:ident| $body:expr) => {
        $crate::registry::on_conn!(@map $conn, $label, |$c| $body, |r| r.rows_affected())
    };
}
pub(crate) use {exec, on_conn};

impl Registry {
    /// Connects to `url` (`postgres://…` or `sqlite://…`), waiting up to `wait` for the
    /// database to answer, then applies the embedded migrations.
    pub async fn connect(url: &str, wait: Duration, shutdown: &CancellationToken) -> anyhow::Result<Self> {
        let shown = redact_url(url);
        let deadline = tokio::time::Instant::now() + wait;
        let mut delay = Duration::from_millis(200);
        let registry = loop {
            match Self::open(url).await {
                Ok(registry) => break registry,
                Err(e) if tokio::time::Instant::now() + delay < deadline => {
                    tracing::warn!(url = %shown, error = format!("{e:#}"), "waiting for the database");
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = shutdown.cancelled() => anyhow::bail!("shut down while waiting for the database"),
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("connect to the database at {shown} (waited {wait:?})"));
                }
            }
        };
        registry.migrate().await.with_context(|| format!("apply migrations to {shown}"))?;
        tracing::info!(url = %shown, backend = ?registry.backend(), "registry ready");
        Ok(registry)
    }

    async fn open(url: &str) -> anyhow::Result<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            // One plain connection first: its error says why (refused, auth, no such
            // database), where a pool would only say that it timed out.
            let probe = sqlx::PgConnection::connect(url).await.context("connect to postgres")?;
            let _ = probe.close().await;
            let pool = PgPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(5))
                .connect(url)
                .await
                .context("connect to postgres")?;
            Ok(Registry { db: Db::Postgres(pool) })
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .context("parse the sqlite url")?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .foreign_keys(true)
                .busy_timeout(Duration::from_secs(10));
            let pool =
                SqlitePoolOptions::new().max_connections(4).connect_with(options).await.context("open sqlite")?;
            Ok(Registry { db: Db::Sqlite(pool) })
        } else {
            anyhow::bail!("unsupported database url (expected postgres://… or sqlite://…)")
        }
    }

    async fn migrate(&self) -> anyhow::Result<()> {
        match &self.db {
            Db::Postgres(pool) => POSTGRES_MIGRATIONS.run(pool).await?,
            Db::Sqlite(pool) => SQLITE_MIGRATIONS.run(pool).await?,
        }
        Ok(())
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        match self.db {
            Db::Postgres(_) => Backend::Postgres,
            Db::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// Whether the database answers a trivial query within `within` (readiness); the error
    /// says what failed.
    pub async fn ping(&self, within: Duration) -> std::result::Result<(), String> {
        let answer = async {
            let mut conn = self.conn().await?;
            on_conn!(conn, "registry.ping", |c| sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(c))
        };
        match tokio::time::timeout(within, answer).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {} ms", within.as_millis())),
        }
    }

    /// A connection for reads.
    pub async fn conn(&self) -> Result<Conn> {
        Ok(Conn::new(match &self.db {
            Db::Postgres(pool) => ConnInner::Postgres(pool.acquire().await?),
            Db::Sqlite(pool) => ConnInner::Sqlite(pool.acquire().await?),
        }))
    }

    /// A write transaction. On SQLite it is `BEGIN IMMEDIATE`: it takes the write lock up
    /// front, so two writers queue on the busy timeout instead of failing on lock upgrade.
    pub async fn begin(&self) -> Result<Conn> {
        Ok(Conn::new(match &self.db {
            Db::Postgres(pool) => ConnInner::PostgresTx(pool.begin().await?),
            Db::Sqlite(pool) => ConnInner::SqliteTx(pool.begin_with("BEGIN IMMEDIATE").await?),
        }))
    }

    /// Closes the pool, waiting for connections in use.
    pub async fn close(&self) {
        match &self.db {
            Db::Postgres(pool) => pool.close().await,
            Db::Sqlite(pool) => pool.close().await,
        }
    }
}

impl Conn {
    fn new(inner: ConnInner) -> Self {
        Conn { inner, queries: 0 }
    }

    /// How many statements ran on this connection so far.
    pub fn queries(&self) -> usize {
        self.queries
    }

    /// Commits the transaction (a no-op outside one).
    pub async fn commit(self) -> Result<()> {
        match self.inner {
            ConnInner::PostgresTx(tx) => tx.commit().await?,
            ConnInner::SqliteTx(tx) => tx.commit().await?,
            ConnInner::Postgres(_) | ConnInner::Sqlite(_) => {}
        }
        Ok(())
    }
}

/// The current time, truncated to microseconds: what both databases store, so a value read
/// back equals the value written (the audit chain hashes it).
pub fn now() -> OffsetDateTime {
    let t = OffsetDateTime::now_utc();
    t.replace_nanosecond(t.nanosecond() / 1_000 * 1_000).unwrap_or(t)
}

/// `$from, $from+1, …`: `n` numbered placeholders for an `IN` list (both databases take
/// `$N`). Only numbers go into the SQL text; the values are bound.
fn placeholders(from: usize, n: usize) -> String {
    (from..from + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// Maps a unique-constraint violation to a 409 with `code` and `message`; passes others on.
pub(crate) fn on_unique(e: Error, code: crate::error::ErrorCode, message: impl FnOnce() -> String) -> Error {
    match &e {
        Error::Database(sqlx::Error::Database(db)) if db.is_unique_violation() => Error::conflict(code, message()),
        _ => e,
    }
}

/// `url` with any password replaced, for logs and errors.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // set_password only fails for URLs that cannot have one, which this one has.
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        assert_eq!(redact_url("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
    }

    #[test]
    fn placeholders_are_numbered_from_the_first() {
        assert_eq!(placeholders(2, 3), "$2, $3, $4");
        assert_eq!(placeholders(1, 1), "$1");
    }

    #[test]
    fn now_is_whole_microseconds() {
        assert_eq!(now().nanosecond() % 1_000, 0);
    }
}
