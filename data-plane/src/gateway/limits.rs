//! A tenant's rate and concurrency limits at one gateway: a token bucket refilled at the
//! tenant's requests per second divided by the number of gateways, and a count of requests in
//! flight capped at the tenant's concurrency divided the same way (rounded up).
//!
//! Tolerance across gateways: each holds 1/N of the limit locally, so the sum holds the limit
//! when clients spread over the gateways (a load balancer in front does); a client pinned to
//! one gateway gets 1/N of its limit. N is the count of gateways with an open route stream,
//! which the control plane sends with every table.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Seconds of the rate the bucket holds when full: bursts up to a fifth of a second's worth
/// pass at once, so the measured rate over a few seconds stays within a few percent.
const BURST_SECONDS: f64 = 0.2;

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Throttled {
    /// Over the requests-per-second limit; retry after this long.
    Rate(Duration),
    /// Over the concurrency limit.
    Concurrency,
}

impl Throttled {
    /// The metrics label.
    pub fn reason(self) -> &'static str {
        match self {
            Throttled::Rate(_) => "rate",
            Throttled::Concurrency => "concurrency",
        }
    }

    /// The metrics label when an API key's own limit refused.
    pub fn key_reason(self) -> &'static str {
        match self {
            Throttled::Rate(_) => "key_rate",
            Throttled::Concurrency => "key_concurrency",
        }
    }

    /// Whole seconds for `Retry-After` (at least 1).
    pub fn retry_after_secs(self) -> u64 {
        match self {
            Throttled::Rate(wait) => wait.as_secs_f64().ceil().max(1.0) as u64,
            Throttled::Concurrency => 1,
        }
    }
}

/// One tenant's limiter at this gateway.
#[derive(Debug, Default)]
pub struct Limiter {
    bucket: Mutex<Bucket>,
    /// This gateway's concurrency cap; 0 = none.
    max_in_flight: AtomicU64,
    in_flight: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct Bucket {
    /// Tokens per second; 0 = unlimited.
    rate: f64,
    capacity: f64,
    tokens: f64,
    refilled: Option<Instant>,
}

/// A request admitted under the concurrency cap, released when dropped.
pub struct Admitted(Option<Arc<AtomicU64>>);

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(n) = &self.0 {
            n.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Limiter {
    /// Applies the tenant's limits (`0` = unlimited) shared by `gateways` gateways.
    pub fn configure(&self, requests_per_second: u64, concurrent_requests: u64, gateways: u32) {
        let n = u64::from(gateways.max(1));
        let mut b = self.bucket.lock();
        let rate = requests_per_second as f64 / n as f64;
        if rate != b.rate {
            b.rate = rate;
            b.capacity = (rate * BURST_SECONDS).max(1.0);
            b.tokens = b.tokens.min(b.capacity);
            if b.refilled.is_none() {
                b.tokens = b.capacity;
            }
        }
        let cap = if concurrent_requests == 0 { 0 } else { concurrent_requests.div_ceil(n) };
        self.max_in_flight.store(cap, Ordering::Relaxed);
    }

    /// Admits one request at `now`, or says why not.
    pub fn admit(&self, now: Instant) -> Result<Admitted, Throttled> {
        self.take_token(now)?;
        let cap = self.max_in_flight.load(Ordering::Relaxed);
        if cap == 0 {
            return Ok(Admitted(None));
        }
        let previous = self.in_flight.fetch_add(1, Ordering::Relaxed);
        let admitted = Admitted(Some(self.in_flight.clone()));
        if previous >= cap {
            // Dropping `admitted` gives the slot back.
            return Err(Throttled::Concurrency);
        }
        Ok(admitted)
    }

    fn take_token(&self, now: Instant) -> Result<(), Throttled> {
        let mut b = self.bucket.lock();
        if b.rate <= 0.0 {
            return Ok(());
        }
        let last = *b.refilled.get_or_insert(now);
        let elapsed = now.saturating_duration_since(last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * b.rate).min(b.capacity);
        b.refilled = Some(now);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Throttled::Rate(Duration::from_secs_f64((1.0 - b.tokens) / b.rate)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Admitted requests over `secs` seconds when a client offers `offered` per second.
    fn admitted_over(limiter: &Limiter, offered: u32, secs: u32) -> u32 {
        let start = Instant::now();
        let step = Duration::from_secs(1) / offered;
        (0..offered * secs).filter(|i| limiter.admit(start + step * *i).is_ok()).count() as u32
    }

    #[test]
    fn the_rate_holds_within_a_few_percent() {
        let limiter = Limiter::default();
        limiter.configure(100, 0, 1);
        let n = admitted_over(&limiter, 1_000, 10);
        // 100/s for 10 s plus the burst (20).
        assert!((1_000..=1_025).contains(&n), "{n}");
    }

    #[test]
    fn gateways_share_the_limit() {
        let limiter = Limiter::default();
        limiter.configure(100, 0, 4);
        let n = admitted_over(&limiter, 1_000, 10);
        assert!((250..=260).contains(&n), "{n}");
    }

    #[test]
    fn zero_is_unlimited_and_refusals_say_when_to_retry() {
        let limiter = Limiter::default();
        limiter.configure(0, 0, 1);
        assert_eq!(admitted_over(&limiter, 1_000, 2), 2_000);
        limiter.configure(1, 0, 1);
        let now = Instant::now();
        assert!(limiter.admit(now).is_ok());
        let Err(refused) = limiter.admit(now) else { panic!("the second request in the same instant passed") };
        assert_eq!((refused.reason(), refused.retry_after_secs()), ("rate", 1));
    }

    #[test]
    fn concurrency_is_capped_and_released() {
        let limiter = Limiter::default();
        limiter.configure(0, 3, 2);
        let now = Instant::now();
        let a = limiter.admit(now).expect("first");
        let _b = limiter.admit(now).expect("second: ceil(3 / 2) = 2");
        assert_eq!(limiter.admit(now).err(), Some(Throttled::Concurrency));
        drop(a);
        assert!(limiter.admit(now).is_ok(), "a slot came back");
    }
}
