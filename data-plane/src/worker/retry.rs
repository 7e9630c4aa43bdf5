//! When a failed install is tried again, decided by the kind of failure: what may pass (a
//! fetch, a shortage) is retried with exponential backoff; a bad artifact gets one fresh fetch;
//! a configuration or ONNX Runtime failure would fail the same way again, so it waits until
//! the assignment changes the version or its config (a new fingerprint installs afresh).

use std::time::Duration;

use crate::engine::load_error::LoadErrorKind;

/// The longest wait between two tries of a transient failure.
pub const MAX_DELAY: Duration = Duration::from_secs(300);

/// How long to wait after the `attempts`-th consecutive failure (1 for the first) of one
/// fingerprint before trying again; `None`: not until the assignment changes.
pub fn retry_delay(kind: LoadErrorKind, attempts: u32) -> Option<Duration> {
    match kind {
        LoadErrorKind::Fetch => Some(backoff(Duration::from_secs(5), attempts)),
        // Memory and slices free up more slowly than a network comes back.
        LoadErrorKind::Resources => Some(backoff(Duration::from_secs(15), attempts)),
        // The cache dropped the bad copy: one more fetch, in case it was damaged on the way.
        LoadErrorKind::Artifact => (attempts <= 1).then_some(Duration::from_secs(5)),
        LoadErrorKind::Configuration | LoadErrorKind::Runtime => None,
    }
}

/// `first`, doubled for every attempt after the first, at most [`MAX_DELAY`].
fn backoff(first: Duration, attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    first.saturating_mul(1 << doublings).min(MAX_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(kind: LoadErrorKind, attempts: std::ops::RangeInclusive<u32>) -> Vec<Option<u64>> {
        attempts.map(|n| retry_delay(kind, n).map(|d| d.as_secs())).collect()
    }

    #[test]
    fn transient_failures_back_off_up_to_the_cap() {
        assert_eq!(secs(LoadErrorKind::Fetch, 1..=8), [5, 10, 20, 40, 80, 160, 300, 300].map(Some));
        assert_eq!(secs(LoadErrorKind::Resources, 1..=5), [15, 30, 60, 120, 240].map(Some));
        assert_eq!(retry_delay(LoadErrorKind::Fetch, u32::MAX), Some(MAX_DELAY), "no overflow");
        assert_eq!(retry_delay(LoadErrorKind::Fetch, 0), Some(Duration::from_secs(5)));
    }

    #[test]
    fn a_bad_artifact_is_fetched_once_more_and_permanent_failures_wait() {
        assert_eq!(secs(LoadErrorKind::Artifact, 1..=3), [Some(5), None, None]);
        assert_eq!(secs(LoadErrorKind::Configuration, 1..=2), [None, None]);
        assert_eq!(secs(LoadErrorKind::Runtime, 1..=2), [None, None]);
    }
}
