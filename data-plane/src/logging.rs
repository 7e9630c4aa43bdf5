//! Log switches that change at run time: Triton's logging extension (`GET`/`POST v2/logging`,
//! gRPC `LogSettings`) reads and sets them. The `tracing` subscriber is process-wide, so its
//! switches are too: [`init`] installs the subscriber with them, and the extension's handlers
//! call [`settings`] and [`update`].
//!
//! Triton's keys map onto `tracing` levels: `log_error`, `log_warning` and `log_info` turn the
//! ERROR, WARN and INFO events on and off; `log_verbose_level` 1 adds Tessera's DEBUG events and
//! 2 or more its TRACE events (on top of `RUST_LOG`, which still chooses targets); `log_format`
//! `ISO8601` prints second-resolution UTC timestamps as Triton's option does, `default` keeps
//! Tessera's RFC 3339 timestamps with microseconds. Logs go to standard error, so `log_file` is
//! always empty and, as in Triton, cannot be set over the network.

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use parking_lot::Mutex;
use tracing::Level;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::prelude::*;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

use crate::error::{Error, Result};

/// The timestamp form of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeFormat {
    /// RFC 3339 UTC with microseconds (Tessera's own form).
    Default,
    /// `YYYY-MM-DDThh:mm:ssZ`, Triton's `--log-format ISO8601`.
    Iso8601,
}

impl TimeFormat {
    /// The name the logging extension uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Iso8601 => "ISO8601",
        }
    }
}

/// The logging extension's settings, as `GET v2/logging` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// Always empty: logs go to standard error.
    pub file: String,
    /// INFO events on.
    pub info: bool,
    /// WARN events on.
    pub warning: bool,
    /// ERROR events on.
    pub error: bool,
    /// 0 quiet, 1 DEBUG, 2+ TRACE (Tessera's targets).
    pub verbose_level: u32,
    /// Timestamp form.
    pub format: TimeFormat,
}

/// One setting's value as a protocol carries it.
#[derive(Debug, Clone, PartialEq)]
pub enum SettingValue {
    /// A JSON boolean or gRPC `bool_param`.
    Bool(bool),
    /// A non-negative JSON integer or gRPC `uint32_param`.
    Uint(u64),
    /// A JSON string or gRPC `string_param`.
    Str(String),
    /// Anything else a JSON body can hold (negative or fractional numbers, null, arrays, objects).
    Other(String),
}

impl fmt::Display for SettingValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bool(b) => write!(f, "{b}"),
            Self::Uint(n) => write!(f, "{n}"),
            Self::Str(s) => write!(f, "\"{s}\""),
            Self::Other(s) => f.write_str(s),
        }
    }
}

/// The settings a request asks to change; absent keys stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogUpdate {
    info: Option<bool>,
    warning: Option<bool>,
    error: Option<bool>,
    verbose_level: Option<u32>,
    format: Option<TimeFormat>,
}

/// The keys the extension knows, in the order responses list them.
pub const KEYS: [&str; 6] = ["log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"];

impl LogUpdate {
    /// Reads a request's settings; any bad key or value refuses the whole request, so a change
    /// applies entirely or not at all.
    pub fn parse(pairs: impl IntoIterator<Item = (String, SettingValue)>) -> Result<Self> {
        let mut update = Self::default();
        for (key, value) in pairs {
            let boolean = |value: &SettingValue| match value {
                SettingValue::Bool(b) => Ok(*b),
                other => Err(Error::invalid(format!("log setting '{key}' must be a boolean, got {other}"))),
            };
            match key.as_str() {
                // Triton's words and code (UNSUPPORTED: 501, UNIMPLEMENTED), whatever the value.
                "log_file" => {
                    return Err(Error::unsupported("log file location can not be updated through network protocol"));
                }
                "log_info" => update.info = Some(boolean(&value)?),
                "log_warning" => update.warning = Some(boolean(&value)?),
                "log_error" => update.error = Some(boolean(&value)?),
                "log_verbose_level" => {
                    let level = match value {
                        SettingValue::Uint(n) => u32::try_from(n).ok(),
                        _ => None,
                    };
                    update.verbose_level = Some(level.ok_or_else(|| {
                        Error::invalid(format!(
                            "log setting 'log_verbose_level' must be an unsigned 32-bit integer, got {value}"
                        ))
                    })?);
                }
                "log_format" => {
                    update.format = Some(match &value {
                        SettingValue::Str(s) if s == "default" => TimeFormat::Default,
                        SettingValue::Str(s) if s == "ISO8601" => TimeFormat::Iso8601,
                        other => {
                            return Err(Error::invalid(format!(
                                "log setting 'log_format' must be \"default\" or \"ISO8601\", got {other}"
                            )));
                        }
                    });
                }
                _ => {
                    return Err(Error::invalid(format!(
                        "unknown log setting '{key}'; the settings are {}",
                        KEYS.join(", ")
                    )));
                }
            }
        }
        Ok(update)
    }
}

/// The process's switches: read per event by the filters and the timer.
struct Switches {
    info: AtomicBool,
    warning: AtomicBool,
    error: AtomicBool,
    verbose_level: AtomicU32,
    iso8601: AtomicBool,
    /// Rebuilds the level filter for a verbose level (absent until [`init`] ran).
    reload: Mutex<Option<Reloader>>,
}

/// The filter `RUST_LOG` (or the default) chose, and the handle that swaps it.
struct Reloader {
    base: String,
    handle: reload::Handle<EnvFilter, Registry>,
}

impl Switches {
    fn allows(&self, level: &Level) -> bool {
        match *level {
            Level::ERROR => self.error.load(Ordering::Relaxed),
            Level::WARN => self.warning.load(Ordering::Relaxed),
            Level::INFO => self.info.load(Ordering::Relaxed),
            // DEBUG and TRACE are chosen by the level filter (RUST_LOG plus the verbose level).
            _ => true,
        }
    }
}

fn switches() -> &'static Switches {
    static SWITCHES: OnceLock<Switches> = OnceLock::new();
    SWITCHES.get_or_init(|| Switches {
        info: AtomicBool::new(true),
        warning: AtomicBool::new(true),
        error: AtomicBool::new(true),
        verbose_level: AtomicU32::new(0),
        iso8601: AtomicBool::new(false),
        reload: Mutex::new(None),
    })
}

/// The level filter for `base` at a verbose level: Tessera's own targets gain DEBUG or TRACE.
fn level_filter(base: &str, verbose_level: u32) -> EnvFilter {
    let extra = match verbose_level {
        0 => None,
        1 => Some("tessera=debug"),
        _ => Some("tessera=trace"),
    };
    let directives = match extra {
        Some(extra) if !base.is_empty() => format!("{base},{extra}"),
        Some(extra) => extra.to_string(),
        None => base.to_string(),
    };
    EnvFilter::new(directives)
}

/// Timestamps in the form the switches choose.
struct SwitchedTime;

impl FormatTime for SwitchedTime {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        if !switches().iso8601.load(Ordering::Relaxed) {
            return SystemTime.format_time(w);
        }
        let now = time::OffsetDateTime::now_utc();
        let format = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
        match now.format(&format) {
            Ok(text) => w.write_str(&text),
            Err(_) => SystemTime.format_time(w),
        }
    }
}

/// Installs the process's `tracing` subscriber on standard error: the level filter from
/// `RUST_LOG` (else `default_filter`), the run-time switches, lines as text or JSON.
pub fn init(json: bool, default_filter: &str) {
    let base = std::env::var(EnvFilter::DEFAULT_ENV)
        .ok()
        .filter(|v| EnvFilter::try_new(v).is_ok())
        .unwrap_or_else(|| default_filter.to_string());
    let (filter, handle) = reload::Layer::new(level_filter(&base, 0));
    *switches().reload.lock() = Some(Reloader { base, handle });
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi).with_timer(SwitchedTime);
    let lines = if json { lines.json().flatten_event(true).boxed() } else { lines.boxed() };
    let severity = filter_fn(|meta| switches().allows(meta.level()));
    tracing_subscriber::registry().with(filter).with(lines.with_filter(severity)).init();
}

/// The settings now.
pub fn settings() -> LogSettings {
    let s = switches();
    LogSettings {
        file: String::new(),
        info: s.info.load(Ordering::Relaxed),
        warning: s.warning.load(Ordering::Relaxed),
        error: s.error.load(Ordering::Relaxed),
        verbose_level: s.verbose_level.load(Ordering::Relaxed),
        format: if s.iso8601.load(Ordering::Relaxed) { TimeFormat::Iso8601 } else { TimeFormat::Default },
    }
}

/// Applies a change and answers the settings after it.
pub fn update(change: &LogUpdate) -> Result<LogSettings> {
    let s = switches();
    // One change at a time, so the level filter and the verbose level agree.
    let reload = s.reload.lock();
    if let Some(level) = change.verbose_level
        && level != s.verbose_level.load(Ordering::Relaxed)
    {
        if let Some(r) = reload.as_ref() {
            r.handle
                .reload(level_filter(&r.base, level))
                .map_err(|e| Error::internal(format!("the log filter could not be changed: {e}")))?;
        }
        s.verbose_level.store(level, Ordering::Relaxed);
    }
    for (switch, value) in [(&s.info, change.info), (&s.warning, change.warning), (&s.error, change.error)] {
        if let Some(on) = value {
            switch.store(on, Ordering::Relaxed);
        }
    }
    if let Some(format) = change.format {
        s.iso8601.store(format == TimeFormat::Iso8601, Ordering::Relaxed);
    }
    drop(reload);
    // The filters decide per call site once and cache it; a change must clear that cache.
    tracing::callsite::rebuild_interest_cache();
    let now = settings();
    tracing::warn!(
        info = now.info,
        warning = now.warning,
        error = now.error,
        verbose_level = now.verbose_level,
        format = now.format.as_str(),
        "log settings changed"
    );
    Ok(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn parse(pairs: &[(&str, SettingValue)]) -> Result<LogUpdate> {
        LogUpdate::parse(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())))
    }

    fn message(result: Result<LogUpdate>) -> (ErrorKind, String) {
        let e = result.expect_err("refused");
        (e.kind, e.message)
    }

    #[test]
    fn known_settings_parse_and_absent_ones_stay_unset() {
        let update = parse(&[
            ("log_info", SettingValue::Bool(false)),
            ("log_verbose_level", SettingValue::Uint(2)),
            ("log_format", SettingValue::Str("ISO8601".into())),
        ])
        .expect("valid");
        assert_eq!(
            update,
            LogUpdate {
                info: Some(false),
                verbose_level: Some(2),
                format: Some(TimeFormat::Iso8601),
                ..LogUpdate::default()
            }
        );
        assert_eq!(parse(&[]).expect("empty"), LogUpdate::default());
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let (kind, msg) = message(parse(&[("log_info", SettingValue::Str("yes".into()))]));
        assert_eq!(kind, ErrorKind::InvalidArg);
        assert_eq!(msg, "log setting 'log_info' must be a boolean, got \"yes\"");
        let (_, msg) = message(parse(&[("log_verbose_level", SettingValue::Other("-1".into()))]));
        assert_eq!(msg, "log setting 'log_verbose_level' must be an unsigned 32-bit integer, got -1");
        let (_, msg) = message(parse(&[("log_verbose_level", SettingValue::Uint(1 << 32))]));
        assert!(msg.contains("unsigned 32-bit"), "{msg}");
        let (_, msg) = message(parse(&[("log_format", SettingValue::Str("json".into()))]));
        assert_eq!(msg, "log setting 'log_format' must be \"default\" or \"ISO8601\", got \"json\"");
        let (_, msg) = message(parse(&[("bogus", SettingValue::Bool(true))]));
        assert!(msg.starts_with("unknown log setting 'bogus'"), "{msg}");
    }

    #[test]
    fn the_log_file_cannot_be_set_over_the_network() {
        let (kind, msg) = message(parse(&[("log_file", SettingValue::Str(String::new()))]));
        assert_eq!(kind, ErrorKind::Unsupported);
        assert_eq!(msg, "log file location can not be updated through network protocol");
    }

    #[test]
    fn verbose_levels_add_debug_then_trace_to_the_base_filter() {
        assert_eq!(level_filter("info,ort=warn", 0).to_string(), "ort=warn,info");
        assert!(level_filter("info,ort=warn", 1).to_string().contains("tessera=debug"));
        assert!(level_filter("info", 3).to_string().contains("tessera=trace"));
        assert_eq!(level_filter("", 1).to_string(), "tessera=debug");
    }
}
