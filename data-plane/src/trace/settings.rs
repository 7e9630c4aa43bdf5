//! Trace settings as Triton's trace extension reads and writes them: the values, a request's
//! changes (parsed with Triton's words for bad values), and how a model's own settings fall back
//! to the global ones key by key.

use std::fmt;

use crate::error::{Error, Result};

/// What a sampled request records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Nothing: tracing is off.
    Off,
    /// Timestamps of the request's steps.
    Timestamps,
}

impl Level {
    /// The names the extension lists for the level.
    pub fn names(self) -> Vec<String> {
        vec![match self {
            Self::Off => "OFF".to_string(),
            Self::Timestamps => "TIMESTAMPS".to_string(),
        }]
    }

    /// Reads the list of level names a request gives.
    pub fn parse(values: &[String]) -> Result<Self> {
        let mut level = Self::Off;
        for value in values {
            match value.as_str() {
                // Triton's words.
                "OFF" if values.len() > 1 => {
                    return Err(Error::invalid("Expect only one trace level 'OFF' is specified"));
                }
                "OFF" => {}
                "TIMESTAMPS" => level = Self::Timestamps,
                "TENSORS" => {
                    return Err(Error::unsupported(
                        "trace level 'TENSORS' is not supported: Tessera traces TIMESTAMPS only",
                    ));
                }
                other => {
                    return Err(Error::invalid(format!(
                        "unknown trace level '{other}'; the levels are OFF, TIMESTAMPS and TENSORS"
                    )));
                }
            }
        }
        Ok(level)
    }
}

/// Where traces go, chosen at start (`--trace-config mode=...`) and fixed for the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Triton's JSON trace file.
    Triton,
    /// OTLP/HTTP spans.
    OpenTelemetry,
}

impl Mode {
    /// The name the extension shows as `trace_mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Triton => "triton",
            Self::OpenTelemetry => "opentelemetry",
        }
    }
}

/// One scope's settings, every key resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// What sampled requests record.
    pub level: Level,
    /// Every `rate`-th request is traced.
    pub rate: u32,
    /// Traces left to take; -1 is unlimited.
    pub count: i64,
    /// Traces per file (`<file>.<n>`); 0 writes them all to `<file>`.
    pub log_frequency: u32,
}

impl Default for Settings {
    /// Triton's defaults.
    fn default() -> Self {
        Self { level: Level::Off, rate: 1000, count: -1, log_frequency: 0 }
    }
}

/// Keys a request may name, in the order responses list them.
pub const KEYS: [&str; 5] = ["trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency"];

/// A change to one key: a new value, or back to the fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<T> {
    /// Set to this.
    Set(T),
    /// JSON `null` (an empty list over gRPC): the model's key falls back to the global one,
    /// a global key to its value at start.
    Clear,
}

impl<T: Copy> Change<T> {
    /// The value after the change, given the fallback.
    pub fn apply(self, fallback: T) -> T {
        match self {
            Self::Set(v) => v,
            Self::Clear => fallback,
        }
    }
}

/// The keys a request changes; absent keys stay as they are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Update {
    /// `trace_level`.
    pub level: Option<Change<Level>>,
    /// `trace_rate`.
    pub rate: Option<Change<u32>>,
    /// `trace_count`.
    pub count: Option<Change<i64>>,
    /// `log_frequency`.
    pub log_frequency: Option<Change<u32>>,
}

/// A setting's value as a request gives it: `None` clears the key (JSON `null`, or an empty
/// list over gRPC), else the strings given (one for every key but `trace_level`).
pub type Value = Option<Vec<String>>;

impl Update {
    /// Reads a request's settings; any bad key or value refuses the whole request, so a change
    /// applies entirely or not at all.
    pub fn parse(pairs: impl IntoIterator<Item = (String, Value)>) -> Result<Self> {
        let mut update = Self::default();
        for (key, value) in pairs {
            let Some(values) = value.filter(|v| !v.is_empty()) else {
                match key.as_str() {
                    "trace_file" => return Err(file_is_fixed()),
                    "trace_level" => update.level = Some(Change::Clear),
                    "trace_rate" => update.rate = Some(Change::Clear),
                    "trace_count" => update.count = Some(Change::Clear),
                    "log_frequency" => update.log_frequency = Some(Change::Clear),
                    _ => return Err(unknown_key(&key)),
                }
                continue;
            };
            match key.as_str() {
                "trace_file" => return Err(file_is_fixed()),
                "trace_level" => update.level = Some(Change::Set(Level::parse(&values)?)),
                "trace_rate" => update.rate = Some(Change::Set(parse_u32(&key, single(&key, &values)?)?)),
                "trace_count" => update.count = Some(Change::Set(parse_count(single(&key, &values)?)?)),
                "log_frequency" => update.log_frequency = Some(Change::Set(parse_u32(&key, single(&key, &values)?)?)),
                _ => return Err(unknown_key(&key)),
            }
        }
        Ok(update)
    }
}

/// Triton's words and code (UNSUPPORTED: 501, UNIMPLEMENTED), whatever the value.
fn file_is_fixed() -> Error {
    Error::unsupported("trace file location can not be updated through network protocol")
}

fn unknown_key(key: &str) -> Error {
    Error::invalid(format!("unknown trace setting '{key}'; the settings are {}", KEYS.join(", ")))
}

fn single<'a>(key: &str, values: &'a [String]) -> Result<&'a str> {
    match values {
        [one] => Ok(one),
        _ => Err(Error::invalid(format!("expect only 1 value for '{key}'"))),
    }
}

fn parse_u32(key: &str, text: &str) -> Result<u32> {
    let n: i128 = text.trim().parse().map_err(|_| Error::invalid(format!("Unable to parse '{key}', got: {text}")))?;
    u32::try_from(n).map_err(|_| {
        Error::invalid(format!("Unable to parse '{key}', value is out of range [ 0, {} ], got: {text}", u32::MAX))
    })
}

fn parse_count(text: &str) -> Result<i64> {
    let n: i128 =
        text.trim().parse().map_err(|_| Error::invalid(format!("Unable to parse 'trace_count', got: {text}")))?;
    if n < -1 {
        return Err(Error::invalid(format!("Unable to parse 'trace_count'. Expecting value >= -1, got:{text}")));
    }
    i64::try_from(n).ok().filter(|n| *n <= i64::from(i32::MAX)).ok_or_else(|| {
        Error::invalid(format!(
            "Unable to parse 'trace_count', value is out of range [ -1, {} ], got: {text}",
            i32::MAX
        ))
    })
}

/// A model's own settings: each key set here overrides the global one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `trace_level`.
    pub level: Option<Level>,
    /// `trace_rate`.
    pub rate: Option<u32>,
    /// `trace_count`.
    pub count: Option<i64>,
    /// `log_frequency`.
    pub log_frequency: Option<u32>,
}

impl Overrides {
    /// Applies a model's update: a set key overrides, a cleared one falls back again.
    pub fn apply(&mut self, update: &Update) {
        fn change<T: Copy>(slot: &mut Option<T>, change: Option<Change<T>>) {
            match change {
                Some(Change::Set(v)) => *slot = Some(v),
                Some(Change::Clear) => *slot = None,
                None => {}
            }
        }
        change(&mut self.level, update.level);
        change(&mut self.rate, update.rate);
        change(&mut self.count, update.count);
        change(&mut self.log_frequency, update.log_frequency);
    }

    /// Whether no key is overridden (the model follows the global settings entirely).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The model's settings over `global`.
    pub fn over(&self, global: &Settings) -> Settings {
        Settings {
            level: self.level.unwrap_or(global.level),
            rate: self.rate.unwrap_or(global.rate),
            count: self.count.unwrap_or(global.count),
            log_frequency: self.log_frequency.unwrap_or(global.log_frequency),
        }
    }
}

impl Settings {
    /// The global settings after `update`; cleared keys return to `defaults` (those at start).
    pub fn updated(&self, update: &Update, defaults: &Settings) -> Settings {
        fn keep<T: Copy>(change: Option<Change<T>>, now: T, default: T) -> T {
            change.map_or(now, |c| c.apply(default))
        }
        Settings {
            level: keep(update.level, self.level, defaults.level),
            rate: keep(update.rate, self.rate, defaults.rate),
            count: keep(update.count, self.count, defaults.count),
            log_frequency: keep(update.log_frequency, self.log_frequency, defaults.log_frequency),
        }
    }

    /// Refuses settings that cannot trace, as Triton does; settings that turn tracing off are
    /// always accepted.
    pub fn check(&self, mode: Mode, file: Option<&str>) -> Result<()> {
        if self.level == Level::Off {
            return Ok(());
        }
        let reason = if mode == Mode::Triton && file.is_none_or(str::is_empty) {
            "trace file name is not given"
        } else if self.rate == 0 {
            "sample rate must be non-zero"
        } else {
            return Ok(());
        };
        Err(Error::invalid(format!("Attempting to set invalid trace setting :{reason}")))
    }
}

impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "level={:?} rate={} count={} log_frequency={}", self.level, self.rate, self.count, self.log_frequency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    /// A key and its values (`None`: null).
    type Pair<'a> = (&'a str, Option<&'a [&'a str]>);

    fn parse(pairs: &[Pair]) -> Result<Update> {
        Update::parse(pairs.iter().map(|(k, v)| (k.to_string(), v.map(|v| v.iter().map(|s| s.to_string()).collect()))))
    }

    fn refused(pairs: &[Pair]) -> (ErrorKind, String) {
        let e = parse(pairs).expect_err("refused");
        (e.kind, e.message)
    }

    #[test]
    fn values_parse_and_null_or_an_empty_list_clears() {
        let update = parse(&[
            ("trace_level", Some(&["TIMESTAMPS"])),
            ("trace_rate", Some(&["5"])),
            ("trace_count", Some(&["-1"])),
            ("log_frequency", None),
        ])
        .expect("valid");
        assert_eq!(
            update,
            Update {
                level: Some(Change::Set(Level::Timestamps)),
                rate: Some(Change::Set(5)),
                count: Some(Change::Set(-1)),
                log_frequency: Some(Change::Clear),
            }
        );
        assert_eq!(parse(&[("trace_level", Some(&[]))]).expect("clears").level, Some(Change::Clear));
        assert_eq!(parse(&[]).expect("empty"), Update::default());
    }

    #[test]
    fn bad_values_are_refused_in_tritons_words() {
        let cases: [(&[Pair], ErrorKind, &str); 9] = [
            (&[("trace_file", Some(&["/tmp/x"]))], ErrorKind::Unsupported, "trace file location can not be updated"),
            (&[("trace_file", None)], ErrorKind::Unsupported, "trace file location can not be updated"),
            (&[("trace_rate", Some(&["abc"]))], ErrorKind::InvalidArg, "Unable to parse 'trace_rate', got: abc"),
            (
                &[("trace_rate", Some(&["99999999999"]))],
                ErrorKind::InvalidArg,
                "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999",
            ),
            (
                &[("trace_count", Some(&["-2"]))],
                ErrorKind::InvalidArg,
                "Unable to parse 'trace_count'. Expecting value >= -1, got:-2",
            ),
            (&[("log_frequency", Some(&["x"]))], ErrorKind::InvalidArg, "Unable to parse 'log_frequency', got: x"),
            (
                &[("trace_level", Some(&["OFF", "TIMESTAMPS"]))],
                ErrorKind::InvalidArg,
                "Expect only one trace level 'OFF' is specified",
            ),
            (&[("trace_rate", Some(&["1", "2"]))], ErrorKind::InvalidArg, "expect only 1 value for 'trace_rate'"),
            (&[("bogus", Some(&["1"]))], ErrorKind::InvalidArg, "unknown trace setting 'bogus'"),
        ];
        for (pairs, kind, message) in cases {
            let (k, m) = refused(pairs);
            assert_eq!(k, kind, "{pairs:?}");
            assert!(m.starts_with(message), "{pairs:?}: {m}");
        }
        assert_eq!(refused(&[("trace_level", Some(&["TENSORS"]))]).0, ErrorKind::Unsupported);
        assert!(refused(&[("trace_level", Some(&["BAD"]))]).1.contains("unknown trace level 'BAD'"));
    }

    #[test]
    fn a_model_falls_back_to_the_global_settings_key_by_key() {
        let global = Settings { level: Level::Timestamps, rate: 9, count: 20, log_frequency: 3 };
        let mut model = Overrides::default();
        model.apply(&parse(&[("trace_rate", Some(&["7"]))]).expect("valid"));
        assert_eq!(model.over(&global), Settings { rate: 7, ..global });
        model.apply(&parse(&[("trace_rate", None)]).expect("valid"));
        assert!(model.is_empty());
        assert_eq!(model.over(&global), global);
    }

    #[test]
    fn cleared_global_keys_return_to_their_start_values() {
        let defaults = Settings { rate: 1, ..Settings::default() };
        let now = Settings { rate: 5, count: 3, ..defaults };
        let update = parse(&[("trace_rate", None), ("trace_count", Some(&["10"]))]).expect("valid");
        assert_eq!(now.updated(&update, &defaults), Settings { rate: 1, count: 10, ..defaults });
    }

    #[test]
    fn tracing_on_needs_a_file_in_triton_mode_and_a_rate() {
        let on = Settings { level: Level::Timestamps, ..Settings::default() };
        let e = on.check(Mode::Triton, None).expect_err("no file");
        assert_eq!(e.message, "Attempting to set invalid trace setting :trace file name is not given");
        on.check(Mode::Triton, Some("/tmp/t.json")).expect("a file");
        on.check(Mode::OpenTelemetry, None).expect("no file needed");
        let e = Settings { rate: 0, ..on }.check(Mode::OpenTelemetry, None).expect_err("rate 0");
        assert_eq!(e.message, "Attempting to set invalid trace setting :sample rate must be non-zero");
        Settings { rate: 0, ..Settings::default() }.check(Mode::Triton, None).expect("off is always fine");
    }
}
