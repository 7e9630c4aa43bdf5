//! The scheduler loop: one control-plane replica at a time (the leader) reads the registry,
//! [`plan`]s a tick and applies it, every `--scheduler-interval-ms` and whenever a write asks.
//!
//! Leadership on Postgres is a session advisory lock held on a dedicated connection: whoever
//! holds it leads until that connection drops, and the others retry every interval. On SQLite
//! (one process) this replica always leads.

use std::sync::Arc;

use anyhow::Context;
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

use super::plan::{Settings, plan};
use crate::app::App;
use crate::registry::{Backend, now};

/// Key of the leader lock (distinct from the per-transaction scheduling lock).
const LEADER_LOCK: i64 = crate::locks::SCHEDULER_LEADER;

/// Who may run ticks (the webhook dispatcher elects its own leader the same way, under
/// another key).
pub(crate) enum Leadership {
    /// SQLite: the only process.
    Always,
    /// Postgres: leader while `conn` holds the advisory lock.
    Postgres { url: String, key: i64, conn: Option<sqlx::PgConnection> },
}

impl Leadership {
    /// Leadership under the advisory lock `key` on Postgres; always on SQLite.
    pub(crate) fn new(app: &App, key: i64) -> Self {
        match app.registry.backend() {
            Backend::Sqlite => Leadership::Always,
            Backend::Postgres => {
                Leadership::Postgres { url: app.config.database_url.expose().to_string(), key, conn: None }
            }
        }
    }

    /// Whether this replica leads now, taking the lock if it is free.
    pub(crate) async fn check(&mut self) -> bool {
        let Leadership::Postgres { url, key, conn } = self else { return true };
        if let Some(c) = conn {
            // Still holding it, as long as the connection lives.
            if sqlx::query("SELECT 1").execute(&mut *c).await.is_ok() {
                return true;
            }
            tracing::warn!(lock = *key, "lost the leader connection");
            *conn = None;
        }
        match try_lock(url, *key).await {
            Ok(Some(c)) => {
                tracing::info!(lock = *key, "this control plane now leads");
                *conn = Some(c);
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(lock = *key, error = format!("{e:#}"), "could not try the leader lock");
                false
            }
        }
    }
}

async fn try_lock(url: &str, key: i64) -> anyhow::Result<Option<sqlx::PgConnection>> {
    let mut conn = sqlx::PgConnection::connect(url).await.context("connect for the leader lock")?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut conn)
        .await
        .context("try the leader lock")?;
    if locked {
        Ok(Some(conn))
    } else {
        let _ = conn.close().await;
        Ok(None)
    }
}

/// Runs the scheduler until `shutdown`.
pub async fn run_scheduler(app: Arc<App>, shutdown: CancellationToken) {
    let mut leadership = Leadership::new(&app, LEADER_LOCK);
    let mut settings =
        Settings { lost_after: app.config.worker_lost_after, drain: app.config.drain, leader_since: None };
    let mut interval = tokio::time::interval(app.config.scheduler_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The leader also deletes expired capture files, now and then, in the background.
    let mut capture_sweeper = crate::capture::Sweeper::new(
        app.registry.clone(),
        app.store.clone(),
        app.config.capture_retention_days,
        app.config.capture_sweep_interval,
    );
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = interval.tick() => {}
            () = app.signals.scheduler_woken() => {}
        }
        if !leadership.check().await {
            settings.leader_since = None;
            continue;
        }
        if settings.leader_since.is_none() {
            tracing::info!("this control plane schedules (leader)");
            settings.leader_since = Some(now());
        }
        capture_sweeper.tick();
        let started = std::time::Instant::now();
        let outcome = tick(&app, &settings).await;
        let label = match &outcome {
            Ok(t) if t.applied => "applied",
            Ok(_) => "idle",
            Err(_) => "error",
        };
        let seen = outcome.as_ref().ok();
        crate::metrics::observe_tick(
            label,
            started.elapsed(),
            seen.map_or(0, |t| t.placement_failures),
            seen.into_iter().flat_map(|t| t.replica_states.iter().map(|s| s.as_str())),
            seen.into_iter().flat_map(|t| t.worker_states.iter().map(String::as_str)),
        );
        match outcome {
            Ok(t) if t.changed => app.signals.assignments_changed(),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "scheduler tick failed"),
        }
    }
    tracing::info!("scheduler stopped");
}

/// What a tick did and saw, for the loop and the metrics.
#[derive(Debug, Default)]
struct Ticked {
    /// A plan was applied.
    applied: bool,
    /// Some worker's assignments changed.
    changed: bool,
    /// Replicas that found no slice in this tick's plan.
    placement_failures: u64,
    /// Replica states in the snapshot the tick read.
    replica_states: Vec<crate::states::ReplicaState>,
    /// Worker states in the snapshot the tick read.
    worker_states: Vec<String>,
}

/// One tick.
async fn tick(app: &App, settings: &Settings) -> crate::error::Result<Ticked> {
    let mut tx = app.registry.begin().await?;
    tx.lock_scheduling().await?;
    let snapshot = tx.scheduling_snapshot().await?;
    let decided = plan(&snapshot, now(), settings, &mut uuid::Uuid::now_v7);
    let mut ticked = Ticked {
        placement_failures: decided.events.iter().filter(|e| e.kind == "unplaceable").count() as u64,
        replica_states: snapshot.replicas.iter().map(|r| r.state).collect(),
        worker_states: snapshot.workers.iter().map(|w| w.state.clone()).collect(),
        ..Ticked::default()
    };
    if decided.is_empty() {
        return Ok(ticked);
    }
    for id in &decided.lost_workers {
        tracing::warn!(worker_id = %id, "worker lost: no heartbeat");
    }
    let touched = tx.apply_plan(&decided, &snapshot).await?;
    tx.commit().await?;
    tracing::debug!(
        inserts = decided.inserts.len(),
        changes = decided.changes.len(),
        workers = touched.len(),
        "scheduler applied a plan"
    );
    ticked.applied = true;
    ticked.changed = !touched.is_empty();
    Ok(ticked)
}
