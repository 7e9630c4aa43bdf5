//! Request tracing, Triton's trace extension (`GET`/`POST v2/trace/setting`, per model
//! `v2/models/{m}/trace/setting`, gRPC `TraceSetting`): which requests are sampled, and where
//! their timestamps go (Triton's JSON trace file, or OpenTelemetry spans over OTLP/HTTP).
//!
//! The [`Tracer`] holds the global settings and each model's own (a model's key falls back to
//! the global one until it sets it). While every level is OFF (the default) a request's trace
//! decision is one relaxed atomic load, and an unsampled request carries a [`Trace`] that holds
//! nothing. A sampled request's steps stamp its [`Trace`]; when the last of them lets go, the
//! trace goes to the sink without waiting (see [`sink`]).

pub mod config;
pub mod file;
pub mod otel;
pub mod record;
pub mod settings;
pub mod sink;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

pub use config::TraceConfig;
pub use record::{Event, Trace};
use record::{Lineage, Parent, Record, RecordState};
use settings::{Change, Level, Mode, Overrides, Settings, Update};
use sink::Sink;

use crate::error::Result;

/// The process's trace settings and sink.
pub struct Tracer {
    /// Some scope's level is on; read by every request, so it is the only thing they read
    /// while tracing is off.
    armed: AtomicBool,
    config: TraceConfig,
    scopes: RwLock<Scopes>,
    /// The last trace id given; ids count from 1.
    last_id: Arc<AtomicU64>,
    sink: Sink,
}

/// The global settings and each model's own, by the model's manager key.
struct Scopes {
    global: Scope,
    models: HashMap<String, ModelScope>,
}

/// A scope's sampling state: a new setting restarts its count of requests, as in Triton.
struct Scope {
    settings: Settings,
    /// Requests seen since the settings last changed.
    seen: AtomicU64,
    /// Traces left; -1 is unlimited.
    remaining: AtomicI64,
}

struct ModelScope {
    overrides: Overrides,
    seen: AtomicU64,
    /// The model's own count when it set `trace_count`, else it shares the global one.
    remaining: Option<AtomicI64>,
}

impl Tracer {
    /// A tracer that never samples and has nowhere to write (no `--trace-config`).
    pub fn disabled() -> Self {
        Self::with_sink(TraceConfig::default(), Sink::None)
    }

    /// Starts the sink `config` names (the file's writer thread, or the exporter task on the
    /// current Tokio runtime).
    pub fn start(config: TraceConfig) -> anyhow::Result<Self> {
        let sink = match config.mode {
            Mode::Triton => match &config.file {
                Some(path) => {
                    let (tx, rx) = crossbeam_channel::bounded(QUEUE);
                    let path = path.clone();
                    std::thread::Builder::new()
                        .name("trace-writer".into())
                        .spawn(move || file::run_writer(path, rx))
                        .map_err(|e| anyhow::anyhow!("start the trace file writer: {e}"))?;
                    Sink::File(tx, Default::default())
                }
                None => Sink::None,
            },
            Mode::OpenTelemetry => {
                let (tx, rx) = tokio::sync::mpsc::channel(config.otel.bsp_max_queue_size.max(1));
                let tls = tessera_protocol::tls::client_config(None)
                    .map_err(|e| anyhow::anyhow!("trust roots for the OpenTelemetry collector: {e}"))?;
                tokio::spawn(otel::export_task(config.otel.clone(), tls, rx));
                Sink::Otel(tx, Default::default())
            }
        };
        let tracer = Self::with_sink(config, sink);
        let settings = tracer.scopes.read().global.settings;
        settings.check(tracer.config.mode, tracer.file_name().as_deref()).map_err(|e| anyhow::anyhow!(e.message))?;
        tracing::info!(mode = tracer.config.mode.as_str(), %settings, "tracing configured");
        Ok(tracer)
    }

    fn with_sink(config: TraceConfig, sink: Sink) -> Self {
        let settings = config.settings;
        let global = Scope { settings, seen: AtomicU64::new(0), remaining: AtomicI64::new(settings.count) };
        Self {
            armed: AtomicBool::new(settings.level != Level::Off),
            config,
            scopes: RwLock::new(Scopes { global, models: HashMap::new() }),
            last_id: Arc::new(AtomicU64::new(0)),
            sink,
        }
    }

    /// Whether any request may be sampled (some level is on).
    #[inline]
    pub fn armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed)
    }

    /// The trace of a request to `key` (the model's manager key): off unless the request is
    /// sampled. `parent` reads the request's `traceparent`; it is asked only in OpenTelemetry
    /// mode, where a request that carries one is always traced, as in Triton.
    pub fn sample<'h>(&self, key: &str, model: &str, version: i64, parent: impl FnOnce() -> Option<&'h str>) -> Trace {
        if !self.armed() {
            return Trace::off();
        }
        let parent = match self.config.mode {
            Mode::OpenTelemetry => parent().and_then(Parent::parse),
            Mode::Triton => None,
        };
        let scopes = self.scopes.read();
        let global = &scopes.global;
        let (settings, seen, remaining) = match scopes.models.get(key) {
            Some(m) => (m.overrides.over(&global.settings), &m.seen, m.remaining.as_ref().unwrap_or(&global.remaining)),
            None => (global.settings, &global.seen, &global.remaining),
        };
        if settings.level == Level::Off || !self.sampled(settings.rate, seen, parent.is_some()) || !take(remaining) {
            return Trace::off();
        }
        drop(scopes);
        Trace::on(Record {
            id: self.last_id.fetch_add(1, Ordering::Relaxed) + 1,
            model: model.to_string(),
            version,
            lineage: Lineage::root(parent),
            log_frequency: settings.log_frequency,
            state: Mutex::new(RecordState::default()),
            sink: self.sink.clone(),
            ids: self.last_id.clone(),
        })
    }

    /// Every `rate`-th request of the scope (the `rate`-th, the `2 rate`-th, ...), and every
    /// request that joins a caller's trace.
    fn sampled(&self, rate: u32, seen: &AtomicU64, propagated: bool) -> bool {
        let n = seen.fetch_add(1, Ordering::Relaxed) + 1;
        propagated || (rate != 0 && n.is_multiple_of(u64::from(rate)))
    }

    /// The settings of the global scope (`model` `None`) or of a model, as the extension lists
    /// them: key and values, in Triton's order.
    pub fn listed(&self, model: Option<&str>) -> Vec<(&'static str, Vec<String>)> {
        let scopes = self.scopes.read();
        let global = &scopes.global;
        let current = |s: &Scope| Settings { count: s.remaining.load(Ordering::Relaxed), ..s.settings };
        let settings = match model.and_then(|m| scopes.models.get(m)) {
            Some(m) => {
                let mut s = m.overrides.over(&current(global));
                if let Some(own) = &m.remaining {
                    s.count = own.load(Ordering::Relaxed);
                }
                s
            }
            None => current(global),
        };
        drop(scopes);
        let mut out = vec![
            ("trace_level", settings.level.names()),
            ("trace_rate", vec![settings.rate.to_string()]),
            ("trace_count", vec![settings.count.to_string()]),
        ];
        match self.config.mode {
            Mode::Triton => {
                out.push(("log_frequency", vec![settings.log_frequency.to_string()]));
                out.push(("trace_file", vec![self.file_name().unwrap_or_default()]));
            }
            Mode::OpenTelemetry => {}
        }
        out.push(("trace_mode", vec![self.config.mode.as_str().to_string()]));
        if self.config.mode == Mode::OpenTelemetry {
            out.extend(self.config.otel.listed().into_iter().map(|(k, v)| (k, vec![v])));
        }
        out
    }

    /// Applies a change to the global scope or to a model's (the caller checked the model
    /// exists); refused changes apply nothing.
    pub fn update(&self, model: Option<&str>, update: &Update) -> Result<()> {
        let mut scopes = self.scopes.write();
        let file = self.file_name();
        let global = &mut scopes.global;
        let current = Settings { count: global.remaining.load(Ordering::Relaxed), ..global.settings };
        match model {
            None => {
                let next = current.updated(update, &self.config.settings);
                next.check(self.config.mode, file.as_deref())?;
                global.settings = next;
                global.remaining.store(next.count, Ordering::Relaxed);
                global.seen.store(0, Ordering::Relaxed);
            }
            Some(key) => {
                let mut overrides = scopes.models.get(key).map(|m| m.overrides).unwrap_or_default();
                overrides.apply(update);
                overrides.over(&current).check(self.config.mode, file.as_deref())?;
                let own_count = match (update.count, scopes.models.get_mut(key)) {
                    (Some(Change::Set(n)), _) => Some(AtomicI64::new(n)),
                    (Some(Change::Clear), _) | (None, None) => None,
                    (None, Some(m)) => m.remaining.take(),
                };
                if overrides.is_empty() {
                    scopes.models.remove(key);
                } else {
                    let scope = ModelScope { overrides, seen: AtomicU64::new(0), remaining: own_count };
                    scopes.models.insert(key.to_string(), scope);
                }
            }
        }
        let on = scopes.global.settings.level != Level::Off
            || scopes.models.values().any(|m| m.overrides.level == Some(Level::Timestamps));
        self.armed.store(on, Ordering::Relaxed);
        tracing::info!(model = model.unwrap_or(""), armed = on, "trace settings changed");
        Ok(())
    }

    /// The trace file as the extension shows it (empty without one).
    fn file_name(&self) -> Option<String> {
        self.config.file.as_ref().map(|p| p.display().to_string())
    }
}

/// Finished traces waiting for the file writer at most.
const QUEUE: usize = 4096;

/// Takes one trace from a count (-1: unlimited); false when none is left.
fn take(remaining: &AtomicI64) -> bool {
    remaining
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| match n {
            -1 => Some(-1),
            n if n > 0 => Some(n - 1),
            _ => None,
        })
        .is_ok()
}

#[cfg(test)]
mod tests;
