//! When a failed delivery is tried again: exponential backoff from a base delay, capped at an
//! hour, with ±20 % jitter so hooks that failed together do not retry together; after about a
//! day of attempts the delivery is marked failed.

use std::time::Duration;

/// Longest wait between two attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(3600);

/// Attempts before a delivery is marked failed: with the default 10 s base, the waits add up
/// to about 22 hours.
pub const MAX_ATTEMPTS: i64 = 30;

/// The wait after the `attempts`-th failed attempt (1 for the first), given `jitter` in
/// [0, 1) (a random draw; 0.5 means none).
pub fn delay(attempts: i64, base: Duration, jitter: f64) -> Duration {
    let exponent = attempts.clamp(1, 32) as u32 - 1;
    let raw = base.saturating_mul(2u32.saturating_pow(exponent)).min(MAX_DELAY);
    raw.mul_f64(0.8 + 0.4 * jitter.clamp(0.0, 1.0))
}

/// Whether a delivery that failed `attempts` times gets another.
pub fn retries_left(attempts: i64) -> bool {
    attempts < MAX_ATTEMPTS
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_secs(10);

    #[test]
    fn doubles_then_caps() {
        assert_eq!(delay(1, BASE, 0.5), Duration::from_secs(10));
        assert_eq!(delay(2, BASE, 0.5), Duration::from_secs(20));
        assert_eq!(delay(5, BASE, 0.5), Duration::from_secs(160));
        assert_eq!(delay(9, BASE, 0.5), Duration::from_secs(2560));
        assert_eq!(delay(10, BASE, 0.5), MAX_DELAY);
        assert_eq!(delay(1_000, BASE, 0.5), MAX_DELAY, "no overflow");
    }

    #[test]
    fn jitter_stays_within_a_fifth() {
        assert_eq!(delay(1, BASE, 0.0), Duration::from_secs(8));
        assert_eq!(delay(1, BASE, 1.0), Duration::from_secs(12));
        assert_eq!(delay(30, BASE, 0.0), MAX_DELAY.mul_f64(0.8));
    }

    #[test]
    fn gives_up_after_about_a_day() {
        let total: Duration = (1..MAX_ATTEMPTS).map(|n| delay(n, BASE, 0.5)).sum();
        assert!(total > Duration::from_secs(20 * 3600) && total < Duration::from_secs(26 * 3600), "{total:?}");
        assert!(retries_left(MAX_ATTEMPTS - 1));
        assert!(!retries_left(MAX_ATTEMPTS));
    }
}
