//! The model manager: which model versions are loaded, their states, and model control
//! (none / poll / explicit) over the repository.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::RwLock;
use tessera_protocol::inference::ModelConfig;
use tracing::Instrument as _;

use crate::engine::device::{Device, ExecutionTarget, available_cores};
use crate::engine::ensemble::{self, is_ensemble};
use crate::engine::load_error::LoadError;
use crate::engine::model::LoadedModel;
use crate::engine::repository::{Repository, select_versions};
use crate::engine::response_cache::ResponseCache;
use crate::error::{Error, Result};
use crate::runner::wire::LoadCall;
use crate::runner::{Placement, Runners};

/// How models get loaded and unloaded (Triton's `--model-control-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ControlMode {
    /// Load everything at start; no changes afterwards.
    #[default]
    None,
    /// Load everything at start and follow repository changes.
    Poll,
    /// Load what `--load-model` names; the load/unload API changes the set.
    Explicit,
}

/// A model version's lifecycle state as the repository index reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    /// Serving.
    Ready,
    /// Failed to load or unloaded; the reason says which.
    Unavailable,
}

impl ModelState {
    /// The string Triton uses.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Ready => "READY",
            ModelState::Unavailable => "UNAVAILABLE",
        }
    }
}

/// One row of the repository index.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexEntry {
    /// Model name.
    pub name: String,
    /// Version, when one is known.
    pub version: Option<i64>,
    /// State, `None` for models never loaded.
    pub state: Option<ModelState>,
    /// Why a model is unavailable.
    pub reason: String,
}

/// A version that was tried: loaded, or failed with a reason.
#[derive(Debug, Clone)]
enum VersionSlot {
    Ready(Arc<LoadedModel>),
    Failed(String),
}

/// What the manager knows of one model.
#[derive(Debug, Clone, Default)]
struct ModelEntry {
    versions: BTreeMap<i64, VersionSlot>,
    /// Set when the model as a whole is unavailable (bad config, no versions, unloaded).
    reason: Option<String>,
    /// Repository fingerprint at load time, for polling.
    fingerprint: Vec<(std::path::PathBuf, Option<std::time::SystemTime>, u64)>,
    /// Version requests without a version reach (set by a worker's agent during rollouts);
    /// `None` or not ready = the latest ready version, Triton's rule.
    default_version: Option<i64>,
}

impl ModelEntry {
    fn unavailable(reason: String) -> Self {
        Self { reason: Some(reason), ..Default::default() }
    }

    fn latest_ready(&self) -> Option<&Arc<LoadedModel>> {
        if let Some(VersionSlot::Ready(m)) = self.default_version.and_then(|v| self.versions.get(&v)) {
            return Some(m);
        }
        self.versions.values().rev().find_map(|s| match s {
            VersionSlot::Ready(m) => Some(m),
            VersionSlot::Failed(_) => None,
        })
    }
}

/// Loads version `.2` of model `.1` under key `.0` from a file with a config. Blocking.
type LoadFnRef =
    dyn Fn(&str, &str, i64, &std::path::Path, ModelConfig) -> std::result::Result<LoadedModel, LoadError> + Send + Sync;
/// A shared [`LoadFnRef`].
type LoadFn = Arc<LoadFnRef>;

/// Owns the loaded models. Cheap to share behind an `Arc`.
pub struct ModelManager {
    repository: Repository,
    mode: ControlMode,
    cores: usize,
    /// Readers are request handlers (and ensembles finding their steps, through a weak
    /// reference); writers swap whole entries after a load finished.
    models: Arc<RwLock<BTreeMap<String, ModelEntry>>>,
    /// Serialises loads and unloads so two changes to one model never interleave.
    control: tokio::sync::Mutex<()>,
    /// Runner processes to load versions into, and the placement of versions that name none;
    /// `None` loads them in this process.
    runners: Option<(Arc<Runners>, Placement)>,
    /// The device of each worker slice for versions loaded in this process (a worker without
    /// runners); a slice not listed, and every repository model, loads on [`Device::Host`].
    slice_devices: HashMap<String, Device>,
    /// The process's response cache, handed to versions whose config enables it.
    response_cache: Option<Arc<ResponseCache>>,
}

/// How deep ensembles may nest (an ensemble step naming an ensemble), so a cycle of ensembles
/// naming each other stops loading instead of recursing.
const MAX_ENSEMBLE_DEPTH: usize = 8;

impl ModelManager {
    /// Creates a manager over `repository`; nothing is loaded yet.
    pub fn new(repository: Repository, mode: ControlMode) -> Self {
        Self {
            repository,
            mode,
            cores: available_cores(),
            models: Arc::new(RwLock::new(BTreeMap::new())),
            control: tokio::sync::Mutex::new(()),
            runners: None,
            slice_devices: HashMap::new(),
            response_cache: None,
        }
    }

    /// Answers repeated requests of versions that enable `response_cache` from `cache`.
    pub fn with_response_cache(mut self, cache: Option<Arc<ResponseCache>>) -> Self {
        self.response_cache = cache;
        self
    }

    /// The process's response cache, if there is one.
    pub fn response_cache(&self) -> Option<&Arc<ResponseCache>> {
        self.response_cache.as_ref()
    }

    /// How an ensemble stored under `key` finds its steps: by name in `key`'s namespace only
    /// (a tenant's ensemble never reaches another tenant's model).
    fn resolver(&self, key: &str) -> ensemble::Resolve {
        resolver_in(Arc::downgrade(&self.models), key)
    }

    /// Sets the devices of a worker's slices, for versions this process loads itself.
    pub fn with_slice_devices(mut self, devices: HashMap<String, Device>) -> Self {
        self.slice_devices = devices;
        self
    }

    /// Loads versions into runner processes; those placed nowhere go to `default`.
    pub fn with_runners(mut self, runners: Arc<Runners>, default: Placement) -> Self {
        self.runners = Some((runners, default));
        self
    }

    /// How this manager loads a version (blocking: call it off the async runtime): in this
    /// process, or in its runner. Must be made inside the async runtime.
    fn loader(&self) -> LoadFn {
        let backend = self.backend_loader();
        let (models, cache) = (Arc::downgrade(&self.models), self.response_cache.clone());
        Arc::new(move |key, name, version, file, config| {
            let model = if is_ensemble(&config) {
                LoadedModel::ensemble(name, version, config, resolver_in(models.clone(), key))?
            } else {
                backend(key, name, version, file, config)?
            };
            Ok(model.with_response_cache(cache.as_ref(), key))
        })
    }

    /// How a model with a file loads: in this process, or in its runner.
    fn backend_loader(&self) -> LoadFn {
        let cores = self.cores;
        match self.runners.clone() {
            None => {
                let target = ExecutionTarget { cores, device: Device::Host };
                Arc::new(move |_, name, version, file, config| LoadedModel::load(name, version, file, config, &target))
            }
            Some((runners, placement)) => {
                let runtime = tokio::runtime::Handle::current();
                Arc::new(move |key, name, version, file, config| {
                    let call = LoadCall { key: key.into(), name: name.into(), version, file: file.into(), config };
                    runtime.block_on(runners.load(&placement, call, cores))
                })
            }
        }
    }

    /// The model control mode.
    pub fn mode(&self) -> ControlMode {
        self.mode
    }

    /// Loads the models to serve at start: all of them, or in explicit mode those named
    /// (`*` = all). Returns the names that failed.
    pub async fn load_startup(&self, names: &[String]) -> Vec<String> {
        let all = self.mode != ControlMode::Explicit || names.iter().any(|n| n == "*");
        let wanted: Vec<String> = if all { self.repository.model_names() } else { names.to_vec() };
        let mut failed = Vec::new();
        for name in wanted {
            // Loaded already as some ensemble's step.
            if self.models.read().contains_key(&name) {
                continue;
            }
            if let Err(e) = self.load_with_steps(&name, None, 0).await {
                tracing::warn!(model = %name, error = %e.message, "model failed to load");
                failed.push(name);
            }
        }
        failed
    }

    /// Looks up a servable version: the given one, or the latest ready one.
    pub fn get(&self, name: &str, version: Option<i64>) -> Result<Arc<LoadedModel>> {
        lookup(&self.models.read(), name, name, version)
    }

    /// Ready versions of a model, ascending; errors as [`Self::get`] does when there are none.
    pub fn ready_versions(&self, name: &str) -> Result<Vec<Arc<LoadedModel>>> {
        let latest = self.get(name, None)?;
        let models = self.models.read();
        let ready: Vec<Arc<LoadedModel>> = models
            .get(name)
            .map(|e| {
                e.versions
                    .values()
                    .filter_map(|s| match s {
                        VersionSlot::Ready(m) => Some(m.clone()),
                        VersionSlot::Failed(_) => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(if ready.is_empty() { vec![latest] } else { ready })
    }

    /// Every ready model version, for statistics.
    pub fn all_ready(&self) -> Vec<Arc<LoadedModel>> {
        let models = self.models.read();
        models
            .values()
            .flat_map(|e| e.versions.values())
            .filter_map(|s| match s {
                VersionSlot::Ready(m) => Some(m.clone()),
                VersionSlot::Failed(_) => None,
            })
            .collect()
    }

    /// True when every model that was asked for is serving (strict readiness).
    pub fn every_model_ready(&self) -> bool {
        let models = self.models.read();
        models.values().all(|e| {
            e.reason.as_deref() == Some(UNLOADED)
                || (e.reason.is_none() && e.versions.values().all(|s| matches!(s, VersionSlot::Ready(_))))
        })
    }

    /// The repository index: every model on disk, with the state of each tried version.
    pub fn index(&self, ready_only: bool) -> Vec<IndexEntry> {
        let models = self.models.read();
        let names: BTreeSet<String> = self.repository.model_names().into_iter().chain(models.keys().cloned()).collect();
        let mut rows = Vec::new();
        for name in names {
            let Some(entry) = models.get(&name) else {
                rows.push(IndexEntry { name, version: None, state: None, reason: String::new() });
                continue;
            };
            if entry.versions.is_empty() {
                let reason = entry.reason.clone().unwrap_or_default();
                rows.push(IndexEntry { name, version: None, state: Some(ModelState::Unavailable), reason });
                continue;
            }
            for (v, slot) in &entry.versions {
                let (state, reason) = match slot {
                    VersionSlot::Ready(_) => (ModelState::Ready, String::new()),
                    VersionSlot::Failed(r) => (ModelState::Unavailable, r.clone()),
                };
                rows.push(IndexEntry { name: name.clone(), version: Some(*v), state: Some(state), reason });
            }
        }
        if ready_only {
            rows.retain(|r| r.state == Some(ModelState::Ready));
        }
        rows
    }

    /// The load API: (re)loads a model, optionally with a config given by the client.
    pub async fn load(&self, name: &str, config: Option<ModelConfig>) -> Result<()> {
        self.require_explicit()?;
        self.load_with_steps(name, config, 0).await
    }

    /// Loads `name`; an ensemble's composing models that are not serving yet load first, as
    /// Triton loads what an ensemble needs.
    fn load_with_steps<'a>(
        &'a self,
        name: &'a str,
        config: Option<ModelConfig>,
        depth: usize,
    ) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let config = config.or_else(|| self.repository.read_config(name).ok());
            if let Some(ensemble) = config.as_ref().filter(|c| is_ensemble(c)) {
                if depth >= MAX_ENSEMBLE_DEPTH {
                    return Err(Error::invalid(format!(
                        "failed to load '{name}': ensembles nest deeper than {MAX_ENSEMBLE_DEPTH} (a cycle?)"
                    )));
                }
                for step in ensemble_steps(ensemble) {
                    if step != name && self.get(&step, None).is_err() && self.repository.contains(&step) {
                        // A step that fails says so in its own row; the ensemble then says why it cannot load.
                        let _ = self.load_with_steps(&step, None, depth + 1).await;
                    }
                }
            }
            self.load_inner(name, config).await
        })
    }

    /// The unload API: stops serving every version of a model.
    pub async fn unload(&self, name: &str) -> Result<()> {
        self.require_explicit()?;
        let _guard = self.control.lock().await;
        let mut models = self.models.write();
        if !models.contains_key(name) && !self.repository.contains(name) {
            return Err(Error::not_found(format!("failed to unload '{name}', no version is available")));
        }
        models.insert(name.to_string(), ModelEntry::unavailable(UNLOADED.into()));
        tracing::info!(model = name, "model unloaded");
        // As Triton: the ensembles that use it go too (they would fail every request).
        let dependents: Vec<String> = models
            .iter()
            .filter(|(_, e)| e.latest_ready().is_some_and(|m| ensemble_steps(&m.spec.config).iter().any(|s| s == name)))
            .map(|(k, _)| k.clone())
            .collect();
        for ensemble in dependents {
            tracing::info!(model = %ensemble, step = name, "ensemble unloaded with its step");
            models.insert(ensemble, ModelEntry::unavailable(UNLOADED.into()));
        }
        Ok(())
    }

    fn require_explicit(&self) -> Result<()> {
        if self.mode == ControlMode::Explicit {
            return Ok(());
        }
        Err(Error::unavailable(
            // Triton's words (it says so in every mode but explicit), then how to get there.
            "explicit model load / unload is not allowed if polling is enabled \
             (start the server with --model-control-mode=explicit)",
        ))
    }

    /// Loads every selected version of `name` off the async runtime, then swaps the entry in:
    /// the old versions keep serving until the new ones are ready.
    async fn load_inner(&self, name: &str, config: Option<ModelConfig>) -> Result<()> {
        self.load_in_span(name, config).instrument(crate::spans::load(name)).await
    }

    /// [`Self::load_inner`] in the load's span, which the blocking load runs in too.
    async fn load_in_span(&self, name: &str, config: Option<ModelConfig>) -> Result<()> {
        if !self.repository.contains(name) {
            return Err(Error::not_found(format!("failed to load '{name}', failed to poll from model repository")));
        }
        let _guard = self.control.lock().await;
        let (repo, owned, load) = (self.repository.clone(), name.to_string(), self.loader());
        let span = tracing::Span::current();
        let loading = move || span.in_scope(|| load_entry(&repo, &owned, config, &*load));
        let entry = match tokio::task::spawn_blocking(loading).await {
            Ok(entry) => entry,
            // A load that panicked (a bug, or ONNX Runtime failing hard) still leaves a row
            // saying why, instead of a model with no state.
            Err(e) => {
                tracing::error!(model = name, error = %e, "model load panicked");
                let reason = format!("model load failed unexpectedly: {e}");
                ModelEntry { fingerprint: self.repository.fingerprint(name), ..ModelEntry::unavailable(reason) }
            }
        };
        let failure = entry_failure(&entry);
        let mut models = self.models.write();
        let merged = merge_reload(models.remove(name), entry, name);
        models.insert(name.to_string(), merged);
        match failure {
            Some(reason) => Err(Error::invalid(format!("failed to load '{name}': {reason}"))),
            None => Ok(()),
        }
    }

    /// Poll mode: loads new or changed models and drops deleted ones.
    pub async fn poll_once(&self) {
        let on_disk = self.repository.model_names();
        let known: Vec<(String, bool)> = {
            let models = self.models.read();
            on_disk
                .iter()
                .map(|n| (n.clone(), models.get(n).is_some_and(|e| e.fingerprint == self.repository.fingerprint(n))))
                .collect()
        };
        for (name, unchanged) in known {
            if !unchanged {
                tracing::info!(model = %name, "repository changed; reloading model");
                if let Err(e) = self.load_inner(&name, None).await {
                    tracing::warn!(model = %name, error = %e.message, "model failed to load");
                }
            }
        }
        let _guard = self.control.lock().await;
        self.models.write().retain(|name, _| {
            let keep = on_disk.contains(name);
            if !keep {
                tracing::info!(model = %name, "model removed from the repository; unloading");
            }
            keep
        });
    }
}

/// Worker-side model control: the agent installs the versions it fetched from the control plane
/// under namespaced keys (see [`scoped_key`]), outside any repository directory.
impl ModelManager {
    /// Loads `file` as `version` of the model clients call `name`, stored under `key`, next to
    /// the versions already there (which keep serving meanwhile). Replaces that version if it
    /// was loaded before. With runners, it loads in the runner of `placement` (or the default).
    pub async fn install_version(
        &self,
        key: &str,
        name: &str,
        version: i64,
        file: std::path::PathBuf,
        config: ModelConfig,
        placement: Option<Placement>,
    ) -> std::result::Result<(), LoadError> {
        let _guard = self.control.lock().await;
        let loaded = if is_ensemble(&config) {
            LoadedModel::ensemble(name, version, config, self.resolver(key))
        } else {
            self.load_backend_version(key, name, version, file, config, placement).await
        };
        let loaded = loaded.map(|m| m.with_response_cache(self.response_cache.as_ref(), key));
        let mut models = self.models.write();
        let entry = models.entry(key.to_string()).or_default();
        entry.reason = None;
        match loaded {
            Ok(m) => {
                entry.versions.insert(version, VersionSlot::Ready(Arc::new(m)));
                Ok(())
            }
            Err(e) => {
                // A reload that fails leaves the version that was serving in place.
                if !matches!(entry.versions.get(&version), Some(VersionSlot::Ready(_))) {
                    entry.versions.insert(version, VersionSlot::Failed(e.message.clone()));
                }
                // The caller knows the version; the message says only what went wrong.
                Err(e)
            }
        }
    }

    /// Loads a version with a model file in its runner (with runners) or in this process on
    /// its slice's device.
    async fn load_backend_version(
        &self,
        key: &str,
        name: &str,
        version: i64,
        file: std::path::PathBuf,
        config: ModelConfig,
        placement: Option<Placement>,
    ) -> std::result::Result<LoadedModel, LoadError> {
        match (&self.runners, placement) {
            (Some((runners, default)), placement) => {
                let call = LoadCall { key: key.into(), name: name.into(), version, file, config };
                runners.load(placement.as_ref().unwrap_or(default), call, self.cores).await
            }
            (None, placement) => {
                let device = placement.and_then(|p| self.slice_devices.get(&p.slice).cloned()).unwrap_or_default();
                let (owned, target) = (name.to_string(), ExecutionTarget { cores: self.cores, device });
                // The load's lines carry the install's span (a worker's reconciler opens one).
                let span = tracing::Span::current();
                let loading = move || span.in_scope(|| LoadedModel::load(&owned, version, &file, config, &target));
                tokio::task::spawn_blocking(loading)
                    .await
                    .map_err(|e| LoadError::runtime(format!("model load task failed: {e}")))?
            }
        }
    }

    /// Stops serving one version under `key`; requests already running finish (they hold the
    /// model). The key disappears with its last version. Returns whether the version was there.
    pub async fn remove_version(&self, key: &str, version: i64) -> bool {
        let _guard = self.control.lock().await;
        let mut models = self.models.write();
        let Some(entry) = models.get_mut(key) else { return false };
        let removed = entry.versions.remove(&version).is_some();
        if entry.versions.is_empty() {
            models.remove(key);
        }
        removed
    }

    /// Sets the version requests without a version reach under `key` (`None`: the latest ready).
    pub fn set_default_version(&self, key: &str, version: Option<i64>) {
        if let Some(entry) = self.models.write().get_mut(key) {
            entry.default_version = version;
        }
    }

    /// Every model key with its loaded or failed versions.
    pub fn installed(&self) -> Vec<(String, Vec<i64>)> {
        self.models.read().iter().map(|(k, e)| (k.clone(), e.versions.keys().copied().collect())).collect()
    }
}

/// The manager key of model `name` in `namespace` (a tenant id on workers; `None` for `serve`,
/// where keys are plain model names). `/` never occurs in a model name taken from a URL path
/// segment, so namespaced keys cannot collide with plain ones or with each other.
pub fn scoped_key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        None => name.to_string(),
        Some(ns) => format!("{ns}/{name}"),
    }
}

/// Parses a `/versions/{v}` segment; Triton only matches numeric versions.
pub fn parse_version(model: &str, version: Option<&str>) -> Result<Option<i64>> {
    match version {
        None | Some("") => Ok(None),
        Some(v) => v.parse::<i64>().ok().filter(|v| *v >= 0).map(Some).ok_or_else(|| {
            Error::not_found(format!("Request for unknown model: '{model}' version '{v}' is not a valid version"))
        }),
    }
}

/// A servable version of the model stored under `key` (`name` in messages): the given one, or
/// the latest ready one.
fn lookup(
    models: &BTreeMap<String, ModelEntry>,
    key: &str,
    name: &str,
    version: Option<i64>,
) -> Result<Arc<LoadedModel>> {
    let entry =
        models.get(key).ok_or_else(|| Error::not_found(format!("Request for unknown model: '{name}' is not found")))?;
    match version {
        None => entry.latest_ready().cloned().ok_or_else(|| {
            let reason = entry.reason.clone().unwrap_or_else(|| match entry_failure(entry) {
                Some(why) => format!("no version is ready ({why})"),
                None => "no version is ready".into(),
            });
            Error::unavailable(format!("model '{name}' is not ready: {reason}"))
        }),
        Some(v) => match entry.versions.get(&v) {
            Some(VersionSlot::Ready(m)) => Ok(m.clone()),
            Some(VersionSlot::Failed(reason)) => {
                Err(Error::unavailable(format!("model '{name}' version {v} is not ready: {reason}")))
            }
            None => Err(Error::not_found(format!("Request for unknown model: '{name}' version {v} is not found"))),
        },
    }
}

/// The model names an ensemble config's steps name.
fn ensemble_steps(config: &ModelConfig) -> Vec<String> {
    tessera_protocol::model_config::ensemble_steps(config).into_iter().map(|(name, _)| name.to_string()).collect()
}

/// The models a manager holds, seen by its ensembles without keeping it alive.
type WeakModels = std::sync::Weak<RwLock<BTreeMap<String, ModelEntry>>>;

/// Finds an ensemble's steps by name in the namespace of its key `key` (`tenant/name` on
/// workers, a plain name in `serve`).
fn resolver_in(models: WeakModels, key: &str) -> ensemble::Resolve {
    let namespace = key.split_once('/').map(|(ns, _)| ns.to_string());
    Arc::new(move |name, version| {
        let models = models.upgrade().ok_or_else(|| Error::unavailable("the server is shutting down"))?;
        let models = models.read();
        lookup(&models, &scoped_key(namespace.as_deref(), name), name, version)
    })
}

/// Reason recorded for models unloaded through the API.
const UNLOADED: &str = "unloaded";

fn entry_failure(entry: &ModelEntry) -> Option<String> {
    if let Some(reason) = &entry.reason {
        return Some(reason.clone());
    }
    entry.versions.iter().find_map(|(v, s)| match s {
        VersionSlot::Failed(r) => Some(format!("version {v}: {r}")),
        VersionSlot::Ready(_) => None,
    })
}

/// The entry to keep after a (re)load of `name` produced `new`: Triton's rule that a reload which
/// fails leaves what was serving unchanged. A new entry with no ready version (bad config, every
/// version failed, a version directory still being copied) keeps the old entry if that one
/// serves; otherwise the new one goes in, with any version that failed to reload but was
/// serving before kept as it was. The new fingerprint is kept either way, so polling retries
/// only once the files change again.
fn merge_reload(old: Option<ModelEntry>, mut new: ModelEntry, name: &str) -> ModelEntry {
    let Some(mut old) = old.filter(|o| o.versions.values().any(|s| matches!(s, VersionSlot::Ready(_)))) else {
        return new;
    };
    new.default_version = old.default_version;
    if !new.versions.values().any(|s| matches!(s, VersionSlot::Ready(_))) {
        tracing::warn!(model = name, "reload failed; the versions that were serving keep serving");
        old.fingerprint = new.fingerprint;
        return old;
    }
    for (v, slot) in &mut new.versions {
        if let (VersionSlot::Failed(reason), Some(VersionSlot::Ready(serving))) = (&*slot, old.versions.get(v)) {
            tracing::warn!(model = name, version = v, %reason, "reload of this version failed; it keeps serving");
            *slot = VersionSlot::Ready(serving.clone());
        }
    }
    new
}

/// Loads one model's selected versions. Blocking: runs ONNX Runtime session creation.
fn load_entry(repo: &Repository, name: &str, config: Option<ModelConfig>, load: &LoadFnRef) -> ModelEntry {
    let fingerprint = repo.fingerprint(name);
    let config = match config.map_or_else(|| repo.read_config(name), Ok) {
        Ok(c) => c,
        Err(reason) => return ModelEntry { fingerprint, ..ModelEntry::unavailable(reason) },
    };
    let versions = select_versions(&config, &repo.versions_on_disk(name));
    if versions.is_empty() {
        let reason = "no version is available on disk for the version policy".to_string();
        return ModelEntry { fingerprint, ..ModelEntry::unavailable(reason) };
    }
    let mut entry = ModelEntry { fingerprint, ..Default::default() };
    for v in versions {
        let file = match repo.model_file(name, v, &config) {
            Ok(file) => file,
            Err(reason) => return ModelEntry { fingerprint: entry.fingerprint, ..ModelEntry::unavailable(reason) },
        };
        let slot = match load(name, name, v, &file, config.clone()) {
            Ok(m) => VersionSlot::Ready(Arc::new(m)),
            Err(e) => {
                tracing::warn!(model = name, version = v, kind = %e.kind, reason = %e.message, "model version failed to load");
                VersionSlot::Failed(e.message)
            }
        };
        entry.versions.insert(v, slot);
    }
    entry
}
