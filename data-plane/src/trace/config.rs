//! Tracing at start, from tritonserver's `--trace-config` values: `rate=N`, `level=L`
//! (repeatable), `count=N`, `mode=triton|opentelemetry`, `triton,file=PATH`,
//! `triton,log-frequency=N`, `opentelemetry,url=URL`, `opentelemetry,resource=KEY=VALUE`
//! (repeatable) and `opentelemetry,bsp_schedule_delay|bsp_max_export_batch_size|bsp_max_queue_size=N`.

use std::path::PathBuf;

use super::otel::OtelConfig;
use super::settings::{Level, Mode, Settings, Update};

/// Tracing as configured at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceConfig {
    /// Where traces go.
    pub mode: Mode,
    /// The global settings at start; a cleared global key returns to its value here.
    pub settings: Settings,
    /// Triton mode's trace file (`None`: tracing cannot be turned on).
    pub file: Option<PathBuf>,
    /// OpenTelemetry mode's exporter settings.
    pub otel: OtelConfig,
}

impl Default for TraceConfig {
    fn default() -> Self {
        Self { mode: Mode::Triton, settings: Settings::default(), file: None, otel: OtelConfig::default() }
    }
}

impl TraceConfig {
    /// Reads `--trace-config` values; an unknown key or a bad value names itself.
    pub fn parse(values: &[String]) -> Result<Self, String> {
        let mut config = Self::default();
        let mut levels = Vec::new();
        for value in values {
            let (section, setting) = match value.split_once(',') {
                Some((section, rest)) => (Some(section), rest),
                None => (None, value.as_str()),
            };
            let (key, v) = setting
                .split_once('=')
                .ok_or_else(|| format!("--trace-config '{value}': expected [<mode>,]<key>=<value>"))?;
            let bad = |what: &str| format!("--trace-config '{value}': {what}");
            match (section, key) {
                (None, "level") => levels.push(v.to_string()),
                (None, "rate") => config.settings.rate = number(v).ok_or_else(|| bad("rate must be 0 or more"))?,
                (None, "count") => {
                    config.settings.count =
                        v.parse::<i64>().ok().filter(|n| *n >= -1).ok_or_else(|| bad("count must be -1 or more"))?
                }
                (None, "mode") => {
                    config.mode = match v {
                        "triton" => Mode::Triton,
                        "opentelemetry" => Mode::OpenTelemetry,
                        _ => return Err(bad("mode must be triton or opentelemetry")),
                    }
                }
                (Some("triton"), "file") => config.file = Some(PathBuf::from(v)).filter(|p| !p.as_os_str().is_empty()),
                (Some("triton"), "log-frequency") => {
                    config.settings.log_frequency = number(v).ok_or_else(|| bad("log-frequency must be 0 or more"))?
                }
                (Some("opentelemetry"), "url") => config.otel.url = v.to_string(),
                (Some("opentelemetry"), "resource") => {
                    let (k, val) = v.split_once('=').ok_or_else(|| bad("resource must be <key>=<value>"))?;
                    config.otel.resource.retain(|(existing, _)| existing != k);
                    config.otel.resource.push((k.to_string(), val.to_string()));
                }
                (Some("opentelemetry"), "bsp_schedule_delay") => {
                    config.otel.bsp_schedule_delay_ms = number(v).ok_or_else(|| bad("expected milliseconds"))?.into()
                }
                (Some("opentelemetry"), "bsp_max_export_batch_size") => {
                    config.otel.bsp_max_export_batch_size =
                        number(v).filter(|n| *n > 0).ok_or_else(|| bad("expected a positive number"))? as usize
                }
                (Some("opentelemetry"), "bsp_max_queue_size") => {
                    config.otel.bsp_max_queue_size =
                        number(v).filter(|n| *n > 0).ok_or_else(|| bad("expected a positive number"))? as usize
                }
                _ => return Err(bad("unknown setting")),
            }
        }
        if !levels.is_empty() {
            let update = Update::parse([("trace_level".to_string(), Some(levels))]).map_err(|e| e.message)?;
            if let Some(super::settings::Change::Set(level)) = update.level {
                config.settings.level = level;
            }
        }
        if config.settings.level == Level::Off {
            return Ok(config);
        }
        config
            .settings
            .check(config.mode, config.file.as_ref().and_then(|p| p.to_str()))
            .map_err(|e| format!("--trace-config: {}", e.message))?;
        Ok(config)
    }
}

fn number(v: &str) -> Option<u32> {
    v.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(values: &[&str]) -> Result<TraceConfig, String> {
        TraceConfig::parse(&values.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn tritons_keys_are_read() {
        let config =
            parse(&["triton,file=/tmp/t.json", "level=TIMESTAMPS", "rate=1", "count=5", "triton,log-frequency=3"])
                .expect("valid");
        assert_eq!(config.file, Some(PathBuf::from("/tmp/t.json")));
        assert_eq!(config.settings, Settings { level: Level::Timestamps, rate: 1, count: 5, log_frequency: 3 });
        let otel = parse(&[
            "mode=opentelemetry",
            "opentelemetry,url=http://127.0.0.1:1/v1/traces",
            "opentelemetry,resource=service.name=infer",
            "opentelemetry,bsp_schedule_delay=200",
            "level=TIMESTAMPS",
        ])
        .expect("valid");
        assert_eq!(otel.mode, Mode::OpenTelemetry);
        assert_eq!(otel.otel.resource, [("service.name".to_string(), "infer".to_string())]);
        assert_eq!(otel.otel.bsp_schedule_delay_ms, 200);
    }

    #[test]
    fn bad_values_and_impossible_settings_are_refused() {
        assert!(parse(&["rate=x"]).expect_err("bad").contains("rate"));
        assert!(parse(&["triton,bogus=1"]).expect_err("bad").contains("unknown setting"));
        assert!(parse(&["level=TIMESTAMPS"]).expect_err("no file").contains("trace file name is not given"));
        assert!(parse(&["level=TENSORS", "triton,file=/tmp/t"]).expect_err("unsupported").contains("TENSORS"));
        assert!(parse(&["count=-2"]).expect_err("bad").contains("count"));
    }
}
