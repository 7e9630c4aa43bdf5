//! Scheduling settings of one model version, read from its config: Triton's dynamic batcher
//! fields, or a plain bounded queue when the model does not batch dynamically.

use std::collections::HashMap;
use std::time::Duration;

use tessera_protocol::inference::model_config::SchedulingChoice;
use tessera_protocol::inference::model_queue_policy::TimeoutAction;
use tessera_protocol::inference::{ModelConfig, ModelQueuePolicy};

/// Queue length cap when a config leaves `max_queue_size` at 0 ("unbounded"): large enough never
/// to bite in normal use, small enough that a stuck model cannot exhaust memory.
pub const SAFETY_QUEUE_CAP: usize = 65_536;

/// Most priority levels a model may declare: each level is a queue the batcher scans for every
/// batch (Triton sets one up per level too), so a config asking for millions would exhaust memory
/// at load instead of failing with a reason.
pub const MAX_PRIORITY_LEVELS: u64 = 256;

/// The priority levels a config's dynamic batching has (1 without it), as the batcher
/// sets them up; requests are checked against it when they are validated.
pub fn priority_levels(config: &ModelConfig) -> u64 {
    match &config.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(db)) => db.priority_levels.max(1),
        _ => 1,
    }
}

/// What happens to a request that waited past its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    /// Fail it with "Request timeout expired".
    Reject,
    /// Keep it, behind every request that has not timed out.
    Delay,
}

/// One priority level's queue policy.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuePolicy {
    /// What to do on timeout.
    pub on_timeout: OnTimeout,
    /// Default time a request may wait; `None` = forever.
    pub default_timeout: Option<Duration>,
    /// Whether a request's `timeout` parameter may shorten it.
    pub allow_timeout_override: bool,
    /// Most requests waiting at this level.
    pub max_queue_size: usize,
}

impl Default for QueuePolicy {
    fn default() -> Self {
        Self {
            on_timeout: OnTimeout::Reject,
            default_timeout: None,
            allow_timeout_override: false,
            max_queue_size: SAFETY_QUEUE_CAP,
        }
    }
}

impl QueuePolicy {
    fn from_config(p: &ModelQueuePolicy) -> Self {
        Self {
            on_timeout: match TimeoutAction::try_from(p.timeout_action) {
                Ok(TimeoutAction::Delay) => OnTimeout::Delay,
                _ => OnTimeout::Reject,
            },
            default_timeout: (p.default_timeout_microseconds > 0)
                .then(|| Duration::from_micros(p.default_timeout_microseconds)),
            allow_timeout_override: p.allow_timeout_override,
            max_queue_size: if p.max_queue_size == 0 { SAFETY_QUEUE_CAP } else { p.max_queue_size as usize },
        }
    }

    /// The timeout of a request asking for `requested` µs (0 = none asked).
    pub fn timeout_for(&self, requested_us: u64) -> Option<Duration> {
        let requested = (requested_us > 0 && self.allow_timeout_override).then(|| Duration::from_micros(requested_us));
        match (self.default_timeout, requested) {
            (Some(d), Some(r)) => Some(d.min(r)),
            (d, r) => d.or(r),
        }
    }
}

/// How a model version's requests are queued and grouped into executions.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchingConfig {
    /// Whether requests are combined (dynamic batching on a batching model).
    pub dynamic: bool,
    /// Largest batch an execution may carry (1 when not batching).
    pub max_batch_size: usize,
    /// Preferred batch sizes, ascending.
    pub preferred: Vec<usize>,
    /// How long the oldest request may wait for a fuller batch.
    pub max_queue_delay: Duration,
    /// Responses leave in request order (Triton's `preserve_ordering`).
    pub preserve_ordering: bool,
    /// Number of priority levels (1 = highest).
    pub priority_levels: usize,
    /// Level of requests that do not name one.
    pub default_priority: usize,
    /// Policy per level, index 0 = level 1.
    pub policies: Vec<QueuePolicy>,
}

impl BatchingConfig {
    /// Reads the scheduling fields of a completed config.
    pub fn from_config(config: &ModelConfig) -> Result<Self, String> {
        let max_batch = usize::try_from(config.max_batch_size).unwrap_or(0);
        let Some(SchedulingChoice::DynamicBatching(db)) = &config.scheduling_choice else {
            let mut policy = QueuePolicy::default();
            if let Some(p) = config.parameters.get("max_queue_size") {
                let n: usize = p.string_value.trim().parse().map_err(|_| {
                    format!("parameter max_queue_size must be a whole number, got '{}'", p.string_value)
                })?;
                policy.max_queue_size = if n == 0 { SAFETY_QUEUE_CAP } else { n };
            }
            return Ok(Self::direct(policy));
        };
        if max_batch == 0 {
            return Err("dynamic_batching needs max_batch_size > 0".into());
        }
        let mut preferred = Vec::with_capacity(db.preferred_batch_size.len());
        for p in &db.preferred_batch_size {
            let p = usize::try_from(*p)
                .ok()
                .filter(|p| (1..=max_batch).contains(p))
                .ok_or_else(|| format!("preferred_batch_size {p} must be between 1 and max_batch_size {max_batch}"))?;
            preferred.push(p);
        }
        preferred.sort_unstable();
        preferred.dedup();
        if db.priority_levels > MAX_PRIORITY_LEVELS {
            return Err(format!("priority_levels {} is above the limit of {MAX_PRIORITY_LEVELS}", db.priority_levels));
        }
        let levels = usize::try_from(priority_levels(config)).unwrap_or(1);
        let default_priority = match db.default_priority_level {
            0 if db.priority_levels == 0 => 1,
            0 => return Err("default_priority_level must be set when priority_levels is".into()),
            d => usize::try_from(d)
                .ok()
                .filter(|d| *d <= levels)
                .ok_or_else(|| format!("default_priority_level {d} is above priority_levels {levels}"))?,
        };
        let default_policy = db.default_queue_policy.as_ref().map(QueuePolicy::from_config).unwrap_or_default();
        let overrides: HashMap<u64, QueuePolicy> =
            db.priority_queue_policy.iter().map(|(k, v)| (*k, QueuePolicy::from_config(v))).collect();
        if let Some(bad) = overrides.keys().find(|k| **k == 0 || **k as usize > levels) {
            return Err(format!("priority_queue_policy names level {bad}, outside 1..={levels}"));
        }
        let policies =
            (1..=levels as u64).map(|l| overrides.get(&l).cloned().unwrap_or_else(|| default_policy.clone())).collect();
        Ok(Self {
            dynamic: true,
            max_batch_size: max_batch,
            preferred,
            max_queue_delay: Duration::from_micros(db.max_queue_delay_microseconds),
            preserve_ordering: db.preserve_ordering,
            priority_levels: levels,
            default_priority,
            policies,
        })
    }

    /// One request per execution, one level, bounded by `policy`.
    pub fn direct(policy: QueuePolicy) -> Self {
        Self {
            dynamic: false,
            max_batch_size: 1,
            preferred: Vec::new(),
            max_queue_delay: Duration::ZERO,
            preserve_ordering: false,
            priority_levels: 1,
            default_priority: 1,
            policies: vec![policy],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::model_config::from_pbtxt;

    #[test]
    fn dynamic_batching_fields_are_read() {
        let config = from_pbtxt(
            r#"max_batch_size: 8
dynamic_batching {
  preferred_batch_size: [ 8, 4 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { max_queue_size: 3 default_timeout_microseconds: 500 allow_timeout_override: true }
  priority_queue_policy { key: 1 value: { timeout_action: DELAY } }
}"#,
        )
        .expect("valid config");
        let b = BatchingConfig::from_config(&config).expect("valid batching");
        assert!(b.dynamic);
        assert_eq!(b.preferred, vec![4, 8]);
        assert_eq!(b.max_queue_delay, Duration::from_micros(100));
        assert_eq!((b.priority_levels, b.default_priority), (2, 2));
        assert_eq!(b.policies[0].on_timeout, OnTimeout::Delay);
        assert_eq!(b.policies[1].max_queue_size, 3);
        assert_eq!(b.policies[1].timeout_for(0), Some(Duration::from_micros(500)));
        assert_eq!(b.policies[1].timeout_for(100), Some(Duration::from_micros(100)));
        assert_eq!(b.policies[1].timeout_for(900), Some(Duration::from_micros(500)), "overrides only shorten");
    }

    #[test]
    fn invalid_batching_settings_are_refused() {
        for text in [
            "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 9 ] }",
            "max_batch_size: 0 dynamic_batching { }",
            "max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
            "max_batch_size: 4 dynamic_batching { priority_levels: 2 }",
            // Would allocate a queue per level: billions of them.
            "max_batch_size: 4 dynamic_batching { priority_levels: 1000000000 default_priority_level: 1 }",
            "max_batch_size: 4 dynamic_batching { priority_levels: 18446744073709551615 default_priority_level: 1 }",
        ] {
            let config = from_pbtxt(text).expect("parses");
            assert!(BatchingConfig::from_config(&config).is_err(), "{text}");
        }
        let most = format!(
            "max_batch_size: 4 dynamic_batching {{ priority_levels: {MAX_PRIORITY_LEVELS} default_priority_level: 1 }}"
        );
        let b = BatchingConfig::from_config(&from_pbtxt(&most).expect("parses")).expect("the limit itself is fine");
        assert_eq!(b.policies.len(), MAX_PRIORITY_LEVELS as usize);
    }

    #[test]
    fn models_without_dynamic_batching_get_a_bounded_direct_queue() {
        let config =
            from_pbtxt("max_batch_size: 4 parameters { key: \"max_queue_size\" value: { string_value: \"7\" } }")
                .expect("parses");
        let b = BatchingConfig::from_config(&config).expect("valid");
        assert!(!b.dynamic);
        assert_eq!(b.max_batch_size, 1);
        assert_eq!(b.policies[0].max_queue_size, 7);
    }
}
