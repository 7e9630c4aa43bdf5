//! Converging the loaded models to the control plane's assignments.
//!
//! The model: every assignment names a replica of one model version of one tenant. Replicas on
//! this worker that name the same tenant, model and version share one loaded version, stored in
//! the model manager under `scoped_key(tenant_id, model_name)` with the registry version number;
//! it is built from the artifact and config of one of them (a serving one first, then by
//! replica id), its *fingerprint*. [`plan`] compares that desired set with what is installed
//! and what is in flight and says what to do: install a version that is missing, whose
//! fingerprint changed, or whose failed install is due a retry (when, if ever, is
//! [`super::retry`]'s to say from the kind of failure); remove a version no longer
//! assigned; and point each key's unversioned requests at its highest serving version. A
//! version with an install or removal in flight is left alone until it finishes; the plan is
//! made again after every change, so an assignment set arriving mid-install is never lost.
//!
//! The [`Reconciler`] actor executes plans: installs and removals run as tasks (concurrently
//! across versions, never two for one version) and report back; the replica states it
//! publishes feed the session's heartbeats.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tessera_protocol::agent::{self, ReplicaState};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::cache::ArtifactCache;
use super::retry::retry_delay;
use super::saved::SavedAssignments;
use crate::engine::load_error::{LoadError, LoadErrorKind};
use crate::engine::manager::{ModelManager, scoped_key};
use crate::engine::repository::valid_model_name;
use crate::runner::{Placement, Runners};

/// How often the actor looks for failed installs due a retry.
const RETRY_TICK: Duration = Duration::from_secs(5);

/// One model version on this worker.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VersionKey {
    /// Manager key: `<tenant_id>/<model_name>`.
    pub key: String,
    /// Registry version number.
    pub version: i64,
}

/// What a loaded version was built from; a change means installing it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// Name clients use.
    pub model_name: String,
    /// Artifact sha256.
    pub sha256: String,
    /// Assignment config JSON.
    pub config_json: String,
}

/// What one version should be.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredVersion {
    /// Name clients use.
    pub model_name: String,
    /// Artifact to load.
    pub artifact: agent::Artifact,
    /// Assignment config JSON (empty = auto-complete).
    pub config_json: String,
    /// Whether any replica of this version serves unversioned requests.
    pub serving: bool,
    /// Tenant id (the namespace).
    pub tenant_id: String,
    /// The slice of the first replica (in replica order): the runner that hosts the version.
    pub slice_id: String,
    /// Versions installed before this one: an ensemble's composing models, which its load
    /// looks up (an ensemble installed first would fail and wait for a retry).
    pub after: Vec<VersionKey>,
}

impl DesiredVersion {
    /// The runner that hosts this version.
    pub fn placement(&self) -> Placement {
        Placement { tenant: self.tenant_id.clone(), slice: self.slice_id.clone() }
    }

    /// The fingerprint of what this version is built from.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint {
            model_name: self.model_name.clone(),
            sha256: self.artifact.sha256.clone(),
            config_json: self.config_json.clone(),
        }
    }
}

/// The desired versions of an assignment set, and the replicas that cannot be placed in it
/// (with the reason). An ensemble's composing versions are desired too (not serving
/// unversioned requests unless a replica of their own says so), installed before it.
pub fn desired(assignments: &[agent::Assignment]) -> (BTreeMap<VersionKey, DesiredVersion>, HashMap<String, String>) {
    let mut ordered: Vec<&agent::Assignment> = assignments.iter().collect();
    ordered.sort_by(|a, b| (!a.serving, &a.replica_id).cmp(&(!b.serving, &b.replica_id)));
    let (mut versions, mut invalid) = (BTreeMap::new(), HashMap::new());
    let mut composing = Vec::new();
    for a in ordered {
        let checked = version_key(a).and_then(|(vk, artifact)| {
            let steps = a.composing.iter().map(|c| composing_key(a, c)).collect::<Result<Vec<_>, _>>()?;
            Ok((vk, artifact, steps))
        });
        let (vk, artifact, steps) = match checked {
            Ok(found) => found,
            Err(reason) => {
                invalid.insert(a.replica_id.clone(), reason);
                continue;
            }
        };
        let entry = versions.entry(vk).or_insert_with(|| DesiredVersion {
            model_name: a.model_name.clone(),
            artifact: artifact.clone(),
            config_json: a.config_json.clone(),
            serving: false,
            tenant_id: a.tenant_id.clone(),
            slice_id: a.slice_id.clone(),
            after: steps.iter().map(|(step, _)| step.clone()).collect(),
        });
        entry.serving |= a.serving;
        composing.extend(steps.into_iter().map(|(step, built)| (step, built, a)));
    }
    // A composing version that is itself an ensemble (nested; the list is flattened) waits for
    // the models of the same ensemble that do the work.
    let workers_of = |a: &agent::Assignment| -> Vec<VersionKey> {
        a.composing
            .iter()
            .filter(|c| !ensemble_config(&c.config_json))
            .filter_map(|c| composing_key(a, c).ok().map(|(step, _)| step))
            .collect()
    };
    // A replica of the composing version itself decides how it is built, when there is one.
    for (step, (model_name, artifact, config_json), a) in composing {
        let after = if ensemble_config(&config_json) { workers_of(a) } else { Vec::new() };
        versions.entry(step).or_insert_with(|| DesiredVersion {
            model_name,
            artifact,
            config_json,
            serving: false,
            tenant_id: a.tenant_id.clone(),
            slice_id: a.slice_id.clone(),
            after,
        });
    }
    (versions, invalid)
}

/// Whether a config sent as JSON is an ensemble's (one that does not parse is not).
fn ensemble_config(config_json: &str) -> bool {
    serde_json::from_str(config_json).is_ok_and(|c| tessera_protocol::model_config::is_ensemble_json(&c))
}

/// What a composing model is built from: its name, artifact and config.
type Composing = (String, agent::Artifact, String);

fn version_key(a: &agent::Assignment) -> Result<(VersionKey, &agent::Artifact), String> {
    if a.tenant_id.is_empty() || a.tenant_id.contains('/') {
        return Err(format!("invalid tenant id '{}'", a.tenant_id));
    }
    if !valid_slice_id(&a.slice_id) {
        return Err(format!("invalid slice id '{}'", a.slice_id));
    }
    if !valid_model_name(&a.model_name) {
        return Err(format!("invalid model name '{}'", a.model_name));
    }
    if a.version < 0 {
        return Err(format!("invalid version {}", a.version));
    }
    let artifact = a.artifact.as_ref().ok_or("the assignment names no artifact")?;
    Ok((VersionKey { key: scoped_key(Some(&a.tenant_id), &a.model_name), version: a.version }, artifact))
}

/// The version key of a composing model of `a` (in `a`'s tenant), checked as `a`'s own.
fn composing_key(a: &agent::Assignment, c: &agent::ComposingModel) -> Result<(VersionKey, Composing), String> {
    if !valid_model_name(&c.model_name) {
        return Err(format!("invalid composing model name '{}'", c.model_name));
    }
    if c.version < 0 {
        return Err(format!("invalid version {} of composing model '{}'", c.version, c.model_name));
    }
    let artifact = c.artifact.clone().ok_or_else(|| format!("composing model '{}' names no artifact", c.model_name))?;
    let key = VersionKey { key: scoped_key(Some(&a.tenant_id), &c.model_name), version: c.version };
    Ok((key, (c.model_name.clone(), artifact, c.config_json.clone())))
}

/// Slice ids name runner processes and their cgroups: short, no path or shell characters.
fn valid_slice_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// A version's install outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Loaded and serving.
    Ready,
    /// Could not be fetched or loaded.
    Failed {
        /// Why, and what kind of failure.
        error: LoadError,
        /// Consecutive failed installs of this fingerprint.
        attempts: u32,
        /// When the install may be tried again; `None`: not before the fingerprint changes.
        retry_at: Option<Instant>,
    },
}

/// A version the manager holds (loaded or failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// What it was built from.
    pub fingerprint: Fingerprint,
    /// How it went.
    pub outcome: Outcome,
}

/// An operation running on a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InFlight {
    /// Being fetched and loaded with this fingerprint.
    Installing(Fingerprint),
    /// Being unloaded.
    Removing,
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Fetch and load this version.
    Install(VersionKey, Box<DesiredVersion>),
    /// Unload this version.
    Remove(VersionKey),
}

/// What to do to converge.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Installs and removals to start.
    pub actions: Vec<Action>,
    /// For every desired key: the version unversioned requests reach (`None`: latest ready).
    pub defaults: Vec<(String, Option<i64>)>,
}

/// Compares the desired versions with what is installed and in flight (see the module doc).
pub fn plan(
    desired: &BTreeMap<VersionKey, DesiredVersion>,
    installed: &BTreeMap<VersionKey, Installed>,
    in_flight: &BTreeMap<VersionKey, InFlight>,
    now: Instant,
) -> Plan {
    let mut actions = Vec::new();
    for (vk, want) in desired {
        if in_flight.contains_key(vk) || waits_for_composing(want, desired, installed, in_flight) {
            continue;
        }
        let install = match installed.get(vk) {
            None => true,
            Some(i) if i.fingerprint != want.fingerprint() => true,
            Some(Installed { outcome: Outcome::Failed { retry_at, .. }, .. }) => retry_at.is_some_and(|at| now >= at),
            Some(_) => false,
        };
        if install {
            actions.push(Action::Install(vk.clone(), Box::new(want.clone())));
        }
    }
    for vk in installed.keys() {
        if !desired.contains_key(vk) && !in_flight.contains_key(vk) {
            actions.push(Action::Remove(vk.clone()));
        }
    }
    let mut defaults: BTreeMap<String, Option<i64>> = BTreeMap::new();
    for (vk, want) in desired {
        let slot = defaults.entry(vk.key.clone()).or_default();
        if want.serving {
            *slot = (*slot).max(Some(vk.version));
        }
    }
    Plan { actions, defaults: defaults.into_iter().collect() }
}

/// Whether `want` (an ensemble) must wait: one of its composing versions is being installed
/// or not yet installed as desired. A composing version that failed does not hold it back:
/// its load then fails naming that step.
fn waits_for_composing(
    want: &DesiredVersion,
    desired: &BTreeMap<VersionKey, DesiredVersion>,
    installed: &BTreeMap<VersionKey, Installed>,
    in_flight: &BTreeMap<VersionKey, InFlight>,
) -> bool {
    want.after.iter().any(|step| {
        let fingerprint = desired.get(step).map(DesiredVersion::fingerprint);
        in_flight.contains_key(step)
            || fingerprint.is_some_and(|f| installed.get(step).is_none_or(|i| i.fingerprint != f))
    })
}

/// Every assigned replica's state: loading until its version is installed (or while a failed
/// install is tried again), ready (draining once it stopped serving after having served), failed
/// with the reason and the kind of failure.
pub fn replica_states(
    assignments: &[agent::Assignment],
    invalid: &HashMap<String, String>,
    installed: &BTreeMap<VersionKey, Installed>,
    in_flight: &BTreeMap<VersionKey, InFlight>,
    served: &HashSet<String>,
) -> Vec<agent::ReplicaStatus> {
    let status = |a: &agent::Assignment, state: ReplicaState, reason: String| agent::ReplicaStatus {
        replica_id: a.replica_id.clone(),
        state: state.into(),
        reason,
        failure_kind: agent::LoadFailureKind::Unspecified.into(),
    };
    let failed = |a: &agent::Assignment, error: &LoadError| agent::ReplicaStatus {
        failure_kind: failure_kind(error.kind).into(),
        ..status(a, ReplicaState::Failed, error.message.clone())
    };
    assignments
        .iter()
        .map(|a| {
            if let Some(reason) = invalid.get(&a.replica_id) {
                return failed(a, &LoadError::configuration(reason.clone()));
            }
            let vk = VersionKey { key: scoped_key(Some(&a.tenant_id), &a.model_name), version: a.version };
            let retrying = matches!(in_flight.get(&vk), Some(InFlight::Installing(_)));
            match installed.get(&vk).map(|i| &i.outcome) {
                Some(Outcome::Ready) if !a.serving && served.contains(&a.replica_id) => {
                    status(a, ReplicaState::Draining, String::new())
                }
                Some(Outcome::Ready) => status(a, ReplicaState::Ready, String::new()),
                Some(Outcome::Failed { error, .. }) if !retrying => failed(a, error),
                _ => status(a, ReplicaState::Loading, String::new()),
            }
        })
        .collect()
}

/// Reports the replicas whose runner is in a crash loop as failed, with why it keeps dying, so
/// the deployment shows it (the runner keeps being restarted, with backoff).
fn fail_crash_loops(
    replicas: &mut [agent::ReplicaStatus],
    assignments: &[agent::Assignment],
    loops: &HashMap<Placement, String>,
) {
    if loops.is_empty() {
        return;
    }
    for (status, a) in replicas.iter_mut().zip(assignments) {
        let placement = Placement { tenant: a.tenant_id.clone(), slice: a.slice_id.clone() };
        if let Some(reason) = loops.get(&placement) {
            status.state = ReplicaState::Failed.into();
            // No load kind: the control plane recognises a crash loop by its reason's start.
            status.failure_kind = agent::LoadFailureKind::Unspecified.into();
            status.reason = format!("{}it keeps dying: {reason}", tessera_protocol::CRASH_LOOP_REASON);
        }
    }
}

/// What the worker reports in heartbeats.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerStatus {
    /// Generation of the last assignment set applied.
    pub applied_generation: u64,
    /// Every assigned replica's state.
    pub replicas: Vec<agent::ReplicaStatus>,
}

impl WorkerStatus {
    /// Whether the set of `generation` (or a later one) is applied and none of its replicas is
    /// still loading: each is installed, or failed and reported so.
    pub fn settled(&self, generation: u64) -> bool {
        self.applied_generation >= generation
            && self.replicas.iter().all(|r| r.state != i32::from(ReplicaState::Loading))
    }
}

/// Hears every assignment set the actor applies, before any of its installs start (the worker's
/// usage meter labels versions and times slices from it).
pub type OnApply = Arc<dyn Fn(&[agent::Assignment]) + Send + Sync>;

/// Handle to the reconciling actor.
#[derive(Clone)]
pub struct Reconciler {
    /// Assignment sets, in arrival order; the actor applies the latest one queued.
    commands: mpsc::Sender<agent::Assignments>,
    /// Replaced by the actor after every change.
    status: watch::Receiver<WorkerStatus>,
    /// Where applied sets are kept across restarts.
    saved: Option<SavedAssignments>,
}

impl Reconciler {
    /// Starts the actor, first applying the set saved by the previous run, if any; every set
    /// applied afterwards is saved. `on_apply` hears each set applied. The actor stops when
    /// `shutdown` is cancelled.
    pub fn start(
        manager: Arc<ModelManager>,
        cache: Arc<ArtifactCache>,
        saved: Option<SavedAssignments>,
        on_apply: Option<OnApply>,
        runners: Option<Arc<Runners>>,
        shutdown: CancellationToken,
    ) -> Self {
        let (commands, receiver) = mpsc::channel(8);
        if let Some(set) = saved.as_ref().and_then(SavedAssignments::load) {
            tracing::info!(
                generation = set.generation,
                replicas = set.assignments.len(),
                "restoring saved assignments"
            );
            // The channel is empty and has room: this cannot fail.
            let _ = commands.try_send(set);
        }
        let (status_tx, status) = watch::channel(WorkerStatus::default());
        let executor = Executor {
            manager,
            cache,
            assignments: Vec::new(),
            generation: 0,
            desired: BTreeMap::new(),
            invalid: HashMap::new(),
            installed: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            served: HashSet::new(),
            tasks: JoinSet::new(),
            status: status_tx,
            on_apply,
            runners,
        };
        tokio::spawn(executor.run(receiver, shutdown));
        Self { commands, status, saved }
    }

    /// Hands a complete assignment set to the actor (and saves it for the next start).
    pub async fn apply(&self, assignments: agent::Assignments) {
        if let Some(saved) = &self.saved
            && let Err(e) = saved.save(&assignments)
        {
            tracing::warn!(error = %e, "cannot save the assignments; a restart without the control plane serves nothing");
        }
        if self.commands.send(assignments).await.is_err() {
            tracing::debug!("reconciler stopped; assignments dropped");
        }
    }

    /// The replica states, updated after every change.
    pub fn status(&self) -> watch::Receiver<WorkerStatus> {
        self.status.clone()
    }
}

/// A finished install or removal.
struct Done {
    vk: VersionKey,
    /// `None` for a removal.
    installed: Option<(Fingerprint, Result<(), LoadError>)>,
}

/// The actor's state: the latest assignment set and what is installed.
struct Executor {
    manager: Arc<ModelManager>,
    cache: Arc<ArtifactCache>,
    assignments: Vec<agent::Assignment>,
    generation: u64,
    desired: BTreeMap<VersionKey, DesiredVersion>,
    invalid: HashMap<String, String>,
    installed: BTreeMap<VersionKey, Installed>,
    in_flight: BTreeMap<VersionKey, InFlight>,
    /// Replicas seen serving: they report DRAINING once they stop.
    served: HashSet<String>,
    /// Installs and removals; dropping the set (shutdown) abandons them.
    tasks: JoinSet<Done>,
    status: watch::Sender<WorkerStatus>,
    on_apply: Option<OnApply>,
    /// The runner processes, whose crash loops fail their replicas.
    runners: Option<Arc<Runners>>,
}

impl Executor {
    async fn run(mut self, mut commands: mpsc::Receiver<agent::Assignments>, shutdown: CancellationToken) {
        let mut retry = tokio::time::interval(RETRY_TICK);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut deaths = self.runners.as_ref().map(|r| r.deaths());
        loop {
            let died = async {
                match deaths.as_mut() {
                    Some(d) => d.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                true = died => self.publish(),
                () = shutdown.cancelled() => break,
                received = commands.recv() => {
                    let Some(mut latest) = received else { break };
                    // Each set is complete: only the newest one queued matters.
                    while let Ok(next) = commands.try_recv() {
                        latest = next;
                    }
                    self.apply(latest);
                }
                Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    match joined {
                        Ok(done) => self.finish(done),
                        Err(e) => tracing::error!(error = %e, "reconcile task failed"),
                    }
                }
                _ = retry.tick() => self.reconcile(),
            }
        }
    }

    fn apply(&mut self, set: agent::Assignments) {
        if set.generation < self.generation {
            tracing::warn!(generation = set.generation, applied = self.generation, "assignment generation went back");
        }
        let (desired, invalid) = desired(&set.assignments);
        for (replica, reason) in &invalid {
            tracing::warn!(replica_id = %replica, %reason, "assignment refused");
        }
        let assigned: HashSet<&str> = set.assignments.iter().map(|a| a.replica_id.as_str()).collect();
        self.served.retain(|r| assigned.contains(r.as_str()));
        self.served.extend(set.assignments.iter().filter(|a| a.serving).map(|a| a.replica_id.clone()));
        tracing::info!(
            generation = set.generation,
            replicas = set.assignments.len(),
            versions = desired.len(),
            "assignments received"
        );
        if let Some(hook) = &self.on_apply {
            hook(&set.assignments);
        }
        (self.generation, self.assignments, self.desired, self.invalid) =
            (set.generation, set.assignments, desired, invalid);
        self.reconcile();
    }

    fn finish(&mut self, done: Done) {
        self.in_flight.remove(&done.vk);
        match done.installed {
            None => {
                self.installed.remove(&done.vk);
            }
            Some((fingerprint, result)) => {
                let outcome = match result {
                    Ok(()) => Outcome::Ready,
                    Err(error) => failure(self.installed.get(&done.vk), &fingerprint, error, Instant::now()),
                };
                if let Outcome::Failed { error, attempts, retry_at: None } = &outcome {
                    let (key, version, kind) = (&done.vk.key, done.vk.version, error.kind);
                    tracing::info!(%key, version, %kind, attempts, "not installing again until the assignment changes");
                }
                self.installed.insert(done.vk, Installed { fingerprint, outcome });
            }
        }
        self.reconcile();
    }

    /// Plans and starts what the plan says, then publishes the replica states.
    fn reconcile(&mut self) {
        let plan = plan(&self.desired, &self.installed, &self.in_flight, Instant::now());
        // Defaults first: a removal must find unversioned traffic already moved away.
        for (key, version) in &plan.defaults {
            self.manager.set_default_version(key, *version);
        }
        for action in plan.actions {
            match action {
                Action::Install(vk, want) => self.start_install(vk, *want),
                Action::Remove(vk) => self.start_remove(vk),
            }
        }
        self.publish();
    }

    fn start_install(&mut self, vk: VersionKey, want: DesiredVersion) {
        let fingerprint = want.fingerprint();
        self.in_flight.insert(vk.clone(), InFlight::Installing(fingerprint.clone()));
        let (manager, cache) = (self.manager.clone(), self.cache.clone());
        let span = crate::spans::install(&vk.key, vk.version);
        span.in_scope(|| tracing::info!(sha256 = %want.artifact.sha256, "installing model version"));
        let installing = async move {
            let started = Instant::now();
            let result = AssertUnwindSafe(install(&manager, &cache, &vk, &want))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| Err(LoadError::runtime("the install task panicked")));
            let ms = started.elapsed().as_millis();
            match &result {
                Ok(()) => tracing::info!(ms, "model version ready"),
                Err(e) => {
                    tracing::warn!(kind = %e.kind, reason = %e.message, "model version failed");
                }
            }
            Done { vk, installed: Some((fingerprint, result)) }
        };
        self.tasks.spawn(installing.instrument(span));
    }

    fn start_remove(&mut self, vk: VersionKey) {
        self.in_flight.insert(vk.clone(), InFlight::Removing);
        let manager = self.manager.clone();
        self.tasks.spawn(async move {
            manager.remove_version(&vk.key, vk.version).await;
            tracing::info!(key = %vk.key, version = vk.version, "model version unloaded");
            Done { vk, installed: None }
        });
    }

    fn publish(&self) {
        let mut replicas =
            replica_states(&self.assignments, &self.invalid, &self.installed, &self.in_flight, &self.served);
        if let Some(runners) = &self.runners {
            fail_crash_loops(&mut replicas, &self.assignments, &runners.crash_loops());
        }
        let status = WorkerStatus { applied_generation: self.generation, replicas };
        self.status.send_if_modified(|current| {
            let changed = *current != status;
            if changed {
                *current = status;
            }
            changed
        });
    }
}

/// The outcome of a failed install of `fingerprint` at `now`, counting the attempts since the
/// fingerprint last changed (`before` is what was installed until now).
fn failure(before: Option<&Installed>, fingerprint: &Fingerprint, error: LoadError, now: Instant) -> Outcome {
    let attempts = match before {
        Some(Installed { fingerprint: f, outcome: Outcome::Failed { attempts, .. } }) if f == fingerprint => {
            attempts + 1
        }
        _ => 1,
    };
    let retry_at = retry_delay(error.kind, attempts).map(|delay| now + delay);
    Outcome::Failed { error, attempts, retry_at }
}

/// The agent protocol's word for a kind of load failure.
fn failure_kind(kind: LoadErrorKind) -> agent::LoadFailureKind {
    match kind {
        LoadErrorKind::Fetch => agent::LoadFailureKind::Fetch,
        LoadErrorKind::Artifact => agent::LoadFailureKind::Artifact,
        LoadErrorKind::Configuration => agent::LoadFailureKind::Configuration,
        LoadErrorKind::Runtime => agent::LoadFailureKind::Runtime,
        LoadErrorKind::Resources => agent::LoadFailureKind::Resources,
    }
}

/// Fetches the artifact and loads the version.
async fn install(
    manager: &ModelManager,
    cache: &ArtifactCache,
    vk: &VersionKey,
    want: &DesiredVersion,
) -> Result<(), LoadError> {
    let prepared = cache.prepare(&want.artifact, &want.model_name, vk.version, &want.config_json).await?;
    manager
        .install_version(&vk.key, &want.model_name, vk.version, prepared.file, prepared.config, Some(want.placement()))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_settles_when_its_set_is_applied_and_nothing_loads() {
        let replica = |state: ReplicaState| agent::ReplicaStatus {
            replica_id: "r".into(),
            state: state.into(),
            ..Default::default()
        };
        let status = |generation, states: &[ReplicaState]| WorkerStatus {
            applied_generation: generation,
            replicas: states.iter().map(|s| replica(*s)).collect(),
        };
        assert!(!status(2, &[]).settled(3), "an older set");
        assert!(status(3, &[]).settled(3) && status(4, &[ReplicaState::Ready]).settled(3));
        assert!(!status(3, &[ReplicaState::Ready, ReplicaState::Loading]).settled(3));
        assert!(status(3, &[ReplicaState::Ready, ReplicaState::Failed]).settled(3), "failed is reported, not awaited");
    }

    fn assignment(replica: &str, tenant: &str, model: &str, version: i64, serving: bool) -> agent::Assignment {
        agent::Assignment {
            replica_id: replica.into(),
            deployment_id: "d".into(),
            tenant_id: tenant.into(),
            tenant_name: "acme".into(),
            model_name: model.into(),
            version,
            slice_id: "cpu-0".into(),
            artifact: Some(agent::Artifact {
                key: format!("{tenant}/{model}/{version}"),
                sha256: format!("{version:064}"),
                size_bytes: 1,
                format: "onnx".into(),
            }),
            config_json: String::new(),
            serving,
            capture: None,
            composing: Vec::new(),
        }
    }

    fn vk(key: &str, version: i64) -> VersionKey {
        VersionKey { key: key.into(), version }
    }

    fn ready(want: &DesiredVersion) -> Installed {
        Installed { fingerprint: want.fingerprint(), outcome: Outcome::Ready }
    }

    #[test]
    fn desired_groups_replicas_by_version_and_refuses_bad_ones() {
        let mut r2 = assignment("r2", "t1", "m", 1, true);
        r2.config_json = "{\"max_batch_size\": 2}".into();
        let mut bad = assignment("r4", "t1", "../m", 1, true);
        bad.version = 3;
        let set = [assignment("r1", "t1", "m", 1, false), r2, assignment("r3", "t2", "m", 1, false), bad];
        let (versions, invalid) = desired(&set);
        assert_eq!(versions.keys().cloned().collect::<Vec<_>>(), [vk("t1/m", 1), vk("t2/m", 1)]);
        let shared = &versions[&vk("t1/m", 1)];
        assert!(shared.serving);
        assert_eq!(shared.config_json, "{\"max_batch_size\": 2}", "the serving replica's config wins");
        assert!(!versions[&vk("t2/m", 1)].serving);
        assert!(invalid["r4"].contains("invalid model name"));
    }

    #[test]
    fn an_ensembles_composing_versions_are_desired_and_installed_first() {
        let now = Instant::now();
        let mut ensemble = assignment("e", "t", "pipe", 3, true);
        let step = |model: &str, version: i64| agent::ComposingModel {
            model_name: model.into(),
            version,
            artifact: assignment("x", "t", model, version, false).artifact,
            config_json: "{\"name\": \"step\"}".into(),
        };
        ensemble.composing = vec![step("pre", 1), step("m", 2)];
        // m 2 also has a replica of its own, which decides how it is built and that it serves.
        let mut own = assignment("o", "t", "m", 2, true);
        own.config_json = "{\"max_batch_size\": 8}".into();
        let (want, invalid) = desired(&[ensemble.clone(), own]);
        assert!(invalid.is_empty());
        assert_eq!(want.keys().cloned().collect::<Vec<_>>(), [vk("t/m", 2), vk("t/pipe", 3), vk("t/pre", 1)]);
        assert_eq!(want[&vk("t/pipe", 3)].after, [vk("t/pre", 1), vk("t/m", 2)]);
        assert!(!want[&vk("t/pre", 1)].serving && want[&vk("t/m", 2)].serving);
        assert_eq!(want[&vk("t/m", 2)].config_json, "{\"max_batch_size\": 8}");
        assert_eq!(want[&vk("t/pre", 1)].config_json, "{\"name\": \"step\"}");

        let installs = |p: Plan| -> Vec<VersionKey> {
            p.actions.into_iter().filter_map(|a| if let Action::Install(k, _) = a { Some(k) } else { None }).collect()
        };
        assert_eq!(installs(plan(&want, &BTreeMap::new(), &BTreeMap::new(), now)), [vk("t/m", 2), vk("t/pre", 1)]);
        let mut installed = BTreeMap::from([(vk("t/m", 2), ready(&want[&vk("t/m", 2)]))]);
        let loading = BTreeMap::from([(vk("t/pre", 1), InFlight::Installing(want[&vk("t/pre", 1)].fingerprint()))]);
        assert!(installs(plan(&want, &installed, &loading, now)).is_empty(), "waits for pre");
        // A failed step does not hold the ensemble back: its load names the step.
        let failed = Outcome::Failed { error: LoadError::runtime("bad"), attempts: 1, retry_at: None };
        installed
            .insert(vk("t/pre", 1), Installed { fingerprint: want[&vk("t/pre", 1)].fingerprint(), outcome: failed });
        assert_eq!(installs(plan(&want, &installed, &BTreeMap::new(), now)), [vk("t/pipe", 3)]);

        ensemble.composing[0].model_name = "../x".into();
        let (_, invalid) = desired(&[ensemble]);
        assert!(invalid["e"].contains("invalid composing model name"), "{invalid:?}");
    }

    #[test]
    fn a_nested_ensemble_waits_for_the_models_that_do_the_work() {
        let mut outer = assignment("e", "t", "outer", 1, true);
        let step = |model: &str, config: &str| agent::ComposingModel {
            model_name: model.into(),
            version: 1,
            artifact: assignment("x", "t", model, 1, false).artifact,
            config_json: config.into(),
        };
        // The control plane flattens: the inner ensemble and its step come beside the outer's own step.
        outer.composing = vec![
            step("inner", "{\"platform\": \"ensemble\"}"),
            step("a", "{\"name\": \"a\"}"),
            step("b", "{\"name\": \"b\"}"),
        ];
        let (want, invalid) = desired(&[outer]);
        assert!(invalid.is_empty());
        assert_eq!(want[&vk("t/inner", 1)].after, [vk("t/a", 1), vk("t/b", 1)]);
        assert!(want[&vk("t/a", 1)].after.is_empty());
        let installs: Vec<VersionKey> = plan(&want, &BTreeMap::new(), &BTreeMap::new(), Instant::now())
            .actions
            .into_iter()
            .filter_map(|a| if let Action::Install(k, _) = a { Some(k) } else { None })
            .collect();
        assert_eq!(installs, [vk("t/a", 1), vk("t/b", 1)], "the inner ensemble waits with the outer one");
    }

    #[test]
    fn plan_installs_removes_and_sets_defaults() {
        let now = Instant::now();
        let set = [
            assignment("a", "t", "m", 1, true),
            assignment("b", "t", "m", 2, false),
            assignment("c", "t", "n", 5, false),
        ];
        let (want, _) = desired(&set);
        let fresh = plan(&want, &BTreeMap::new(), &BTreeMap::new(), now);
        let installs: Vec<&VersionKey> = fresh
            .actions
            .iter()
            .map(|a| match a {
                Action::Install(vk, _) => vk,
                Action::Remove(vk) => panic!("nothing to remove, got {vk:?}"),
            })
            .collect();
        assert_eq!(installs, [&vk("t/m", 1), &vk("t/m", 2), &vk("t/n", 5)]);
        assert_eq!(fresh.defaults, [("t/m".to_string(), Some(1)), ("t/n".to_string(), None)]);

        let mut installed: BTreeMap<VersionKey, Installed> = want.iter().map(|(k, w)| (k.clone(), ready(w))).collect();
        installed.insert(vk("t/old", 1), ready(&want[&vk("t/n", 5)]));
        installed.insert(vk("t/going", 1), ready(&want[&vk("t/n", 5)]));
        let in_flight = BTreeMap::from([(vk("t/going", 1), InFlight::Removing)]);
        let steady = plan(&want, &installed, &in_flight, now);
        assert_eq!(steady.actions, [Action::Remove(vk("t/old", 1))]);
    }

    #[test]
    fn plan_reinstalls_changed_versions_retries_failures_and_waits_for_in_flight_work() {
        let now = Instant::now();
        let (want, _) = desired(&[assignment("a", "t", "m", 1, true)]);
        let key = vk("t/m", 1);
        let mut changed = ready(&want[&key]);
        changed.fingerprint.config_json = "{}".into();
        let installed = BTreeMap::from([(key.clone(), changed)]);
        assert_eq!(plan(&want, &installed, &BTreeMap::new(), now).actions.len(), 1);
        let busy = BTreeMap::from([(key.clone(), InFlight::Installing(want[&key].fingerprint()))]);
        assert!(plan(&want, &installed, &busy, now).actions.is_empty());

        let later = Duration::from_secs(5);
        let failed = Installed {
            fingerprint: want[&key].fingerprint(),
            outcome: Outcome::Failed { error: LoadError::fetch("down"), attempts: 1, retry_at: Some(now + later) },
        };
        let installed = BTreeMap::from([(key.clone(), failed)]);
        assert!(plan(&want, &installed, &BTreeMap::new(), now).actions.is_empty());
        assert_eq!(plan(&want, &installed, &BTreeMap::new(), now + later).actions.len(), 1);

        // A permanent failure is never due; a new fingerprint installs afresh.
        let mut stuck = Installed {
            fingerprint: want[&key].fingerprint(),
            outcome: Outcome::Failed { error: LoadError::configuration("bad"), attempts: 1, retry_at: None },
        };
        let installed = BTreeMap::from([(key.clone(), stuck.clone())]);
        assert!(plan(&want, &installed, &BTreeMap::new(), now + Duration::from_secs(86_400)).actions.is_empty());
        stuck.fingerprint.config_json = "{}".into();
        let installed = BTreeMap::from([(key.clone(), stuck)]);
        assert_eq!(plan(&want, &installed, &BTreeMap::new(), now).actions.len(), 1);
    }

    #[test]
    fn failures_count_attempts_per_fingerprint_and_take_their_delay_from_the_kind() {
        let now = Instant::now();
        let (want, _) = desired(&[assignment("a", "t", "m", 1, true)]);
        let fingerprint = want[&vk("t/m", 1)].fingerprint();
        let first = failure(None, &fingerprint, LoadError::fetch("down"), now);
        assert_eq!(
            first,
            Outcome::Failed {
                error: LoadError::fetch("down"),
                attempts: 1,
                retry_at: Some(now + Duration::from_secs(5))
            }
        );
        let before = Installed { fingerprint: fingerprint.clone(), outcome: first };
        let second = failure(Some(&before), &fingerprint, LoadError::fetch("down"), now);
        assert!(
            matches!(second, Outcome::Failed { attempts: 2, retry_at: Some(at), .. } if at == now + Duration::from_secs(10))
        );

        let changed = Fingerprint { config_json: "{}".into(), ..fingerprint.clone() };
        let fresh = failure(Some(&before), &changed, LoadError::artifact("sha256"), now);
        assert!(matches!(fresh, Outcome::Failed { attempts: 1, retry_at: Some(_), .. }), "one more fetch");
        let before = Installed { fingerprint: changed.clone(), outcome: fresh };
        let again = failure(Some(&before), &changed, LoadError::artifact("sha256"), now);
        assert!(matches!(again, Outcome::Failed { attempts: 2, retry_at: None, .. }), "then permanent");
        let config = failure(None, &fingerprint, LoadError::configuration("no valid data_type"), now);
        assert!(matches!(config, Outcome::Failed { retry_at: None, .. }));
    }

    #[test]
    fn failure_kinds_reach_the_protocol_with_the_same_words() {
        for kind in LoadErrorKind::ALL {
            assert_eq!(failure_kind(kind).word(), Some(kind.as_str()));
        }
    }

    #[test]
    fn replicas_of_a_runner_in_a_crash_loop_are_failed_with_the_reason() {
        let set = [assignment("a", "t", "m", 1, true), assignment("b", "u", "m", 1, true)];
        let (want, invalid) = desired(&set);
        let installed = want.iter().map(|(k, w)| (k.clone(), ready(w))).collect();
        let mut states = replica_states(&set, &invalid, &installed, &BTreeMap::new(), &HashSet::new());
        let loops = HashMap::from([(
            Placement { tenant: "t".into(), slice: "cpu-0".into() },
            "killed by signal 6".to_string(),
        )]);
        fail_crash_loops(&mut states, &set, &loops);
        assert_eq!(states[0].state(), ReplicaState::Failed);
        let reason = &states[0].reason;
        assert!(reason.contains("crash loop") && reason.ends_with("killed by signal 6"), "{reason}");
        assert_eq!(states[1].state(), ReplicaState::Ready, "another tenant's runner is not in the loop");
    }

    #[test]
    fn replica_states_follow_installs() {
        let now = Instant::now();
        let set = [
            assignment("new", "t", "m", 2, false),
            assignment("old", "t", "m", 1, false),
            assignment("bad", "t", "n", 1, true),
            assignment("wait", "t", "o", 1, true),
        ];
        let (want, invalid) = desired(&set);
        let mut installed: BTreeMap<VersionKey, Installed> =
            [vk("t/m", 1), vk("t/m", 2)].into_iter().map(|k| (k.clone(), ready(&want[&k]))).collect();
        let failure = Outcome::Failed { error: LoadError::artifact("no such file"), attempts: 1, retry_at: Some(now) };
        installed.insert(vk("t/n", 1), Installed { fingerprint: want[&vk("t/n", 1)].fingerprint(), outcome: failure });
        let served = HashSet::from(["old".to_string()]);
        let states = replica_states(&set, &invalid, &installed, &BTreeMap::new(), &served);
        let summary: Vec<(&str, ReplicaState, &str)> =
            states.iter().map(|s| (s.replica_id.as_str(), s.state(), s.reason.as_str())).collect();
        assert_eq!(
            summary,
            [
                ("new", ReplicaState::Ready, ""),
                ("old", ReplicaState::Draining, ""),
                ("bad", ReplicaState::Failed, "no such file"),
                ("wait", ReplicaState::Loading, ""),
            ]
        );
        assert_eq!(states[2].failure_kind(), agent::LoadFailureKind::Artifact);
        assert_eq!(states[0].failure_kind(), agent::LoadFailureKind::Unspecified);
        // A replica refused before any install is a configuration failure.
        let refused = HashMap::from([("wait".to_string(), "invalid slice id '..'".to_string())]);
        let states = replica_states(&set, &refused, &installed, &BTreeMap::new(), &served);
        assert_eq!((states[3].state(), states[3].reason.as_str()), (ReplicaState::Failed, "invalid slice id '..'"));
        assert_eq!(states[3].failure_kind(), agent::LoadFailureKind::Configuration);
        let retrying = BTreeMap::from([(vk("t/n", 1), InFlight::Installing(want[&vk("t/n", 1)].fingerprint()))]);
        let states = replica_states(&set, &invalid, &installed, &retrying, &served);
        assert_eq!(states[2].state(), ReplicaState::Loading);
    }
}
