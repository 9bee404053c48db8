//! A token bucket: the per-channel rate limit. `per_second` tokens are added continuously up to
//! `burst`; each delivery takes one. Time is passed in, so the rule is tested without a clock.

use std::time::{Duration, Instant};

use super::channel::RateLimit;

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
            tokens: f64::from(limit.burst),
            updated: now,
        }
    }

    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens =
            (self.tokens + elapsed * self.limit.per_second).min(f64::from(self.limit.burst));
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
        Duration::from_secs_f64(missing / self.limit.per_second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(per_second: f64, burst: u32) -> RateLimit {
        RateLimit { per_second, burst }
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
}
