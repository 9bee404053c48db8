//! A token bucket: the per-channel rate limit. `per_second` tokens are added continuously up to
//! `burst`; each delivery takes one. Time is passed in, so the rule is tested without a clock.
//!
//! Nothing here can panic or stop a channel: the rate is within `channel::bounds` by
//! construction (`RateLimit::parse`, `RateLimit::stored`), and the wait for a token is
//! computed without a conversion that could overflow, capped at [`MAX_WAIT`] besides.

use std::time::{Duration, Instant};

use super::channel::RateLimit;

/// The longest [`TokenBucket::wait_for_one`] answers: the slowest allowed rate's interval. A
/// channel waiting for a token looks again after at most this long whatever the arithmetic.
pub const MAX_WAIT: Duration = Duration::from_secs(1000);

#[derive(Debug, Clone)]
pub struct TokenBucket {
    limit: RateLimit,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket: a channel that was idle may send its burst at once.
    pub fn new(limit: RateLimit, now: Instant) -> Self {
        Self {
            limit,
            tokens: f64::from(limit.burst()),
            updated: now,
        }
    }

    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens =
            (self.tokens + elapsed * self.limit.per_second()).min(f64::from(self.limit.burst()));
        self.updated = now;
    }

    /// Whole tokens available now.
    pub fn available(&mut self, now: Instant) -> usize {
        self.refill(now);
        // Truncation is the point: only whole deliveries can start.
        self.tokens.floor().max(0.0) as usize
    }

    /// Takes `n` tokens (the caller took no more than [`Self::available`]).
    pub fn take(&mut self, n: usize, now: Instant) {
        self.refill(now);
        self.tokens = (self.tokens - n as f64).max(0.0);
    }

    /// How long until one whole token is available.
    pub fn wait_for_one(&mut self, now: Instant) -> Duration {
        self.refill(now);
        let missing = (1.0 - self.tokens).max(0.0);
        // `try_from` refuses what `from_secs_f64` would panic on (an infinite or huge wait).
        Duration::try_from_secs_f64(missing / self.limit.per_second())
            .map_or(MAX_WAIT, |wait| wait.min(MAX_WAIT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(per_second: f64, burst: u32) -> RateLimit {
        RateLimit::parse(Some(per_second), Some(burst))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn a_full_bucket_allows_the_burst_then_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(limit(10.0, 5), start);
        assert_eq!(bucket.available(start), 5);
        bucket.take(5, start);
        assert_eq!(bucket.available(start), 0);
        assert_eq!(bucket.wait_for_one(start), Duration::from_millis(100));
        assert_eq!(bucket.available(start + Duration::from_millis(350)), 3);
        // Never more than the burst, however long it was idle.
        assert_eq!(bucket.available(start + Duration::from_secs(3600)), 5);
    }

    #[test]
    fn over_any_window_no_more_than_burst_plus_rate_times_window() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(limit(4.0, 2), start);
        let mut sent = 0;
        for step in 0..=100 {
            let now = start + Duration::from_millis(step * 10);
            let n = bucket.available(now);
            bucket.take(n, now);
            sent += n;
        }
        // One second: 2 (burst) + 4 (rate).
        assert_eq!(sent, 6);
    }

    #[test]
    fn the_slowest_stored_rate_waits_a_bounded_time_and_never_panics() {
        // The rate an admin once stored (issue 33): brought within the bounds when read.
        let (slow, changed) = RateLimit::stored(1e-30, Some(1));
        assert!(changed);
        let start = Instant::now();
        let mut bucket = TokenBucket::new(slow, start);
        bucket.take(1, start);
        assert_eq!(bucket.wait_for_one(start), MAX_WAIT);
        for (rate, burst) in [
            (f64::NAN, None),
            (f64::INFINITY, Some(0)),
            (-5.0, Some(u32::MAX)),
        ] {
            let (limit, _) = RateLimit::stored(rate, burst);
            let mut bucket = TokenBucket::new(limit, start);
            bucket.take(usize::MAX, start);
            assert!(bucket.wait_for_one(start) <= MAX_WAIT, "{rate} {burst:?}");
        }
    }
}
