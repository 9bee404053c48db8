//! The retry policy and the state transition an attempt's result causes.
//!
//! A transient failure schedules a retry and counts it in RetryCount, until `max_retries` retries
//! have been made: the failure of the last one parks the notification, so a notification gets at
//! most `max_retries + 1` attempts. A permanent failure parks at once. The
//! delay is fixed (the default, as in the system this replaces) or exponential with a cap and
//! full jitter (a random delay between zero and the capped exponential, so retries from many
//! failures at once spread out instead of hammering a recovering relay together). A server that
//! says when to come back (HTTP Retry-After) is never retried sooner. Misconfigured
//! (non-positive) settings are clamped to safe fallbacks so a typo cannot park everything on the
//! first hiccup.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::delivery::{Delivered, DeliveryError};
use super::status::Status;

/// Retries used when the configured value is not positive: the channels' default.
pub const FALLBACK_MAX_RETRIES: u32 = super::channel::defaults::MAX_RETRIES;
/// Delay used when the configured value is not positive: the channels' default.
pub const FALLBACK_RETRY_DELAY: Duration = super::channel::defaults::RETRY_DELAY;

use super::channel::bounds::{MAX_RETRIES, MAX_RETRY_DELAY};

/// How the delay grows from one retry to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    /// Every retry waits the base delay.
    Fixed,
    /// Retry n waits a random time in [0, min(cap, base * 2^(n-1))].
    Exponential { cap: Duration },
}

impl Backoff {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fixed => "fixed",
            Self::Exponential { .. } => "exponential",
        }
    }

    /// The longest wait between retries (stored as `MaxRetryDelayMs`); `None` for fixed delays.
    pub fn cap(self) -> Option<Duration> {
        match self {
            Self::Fixed => None,
            Self::Exponential { cap } => Some(cap),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub delay: Duration,
    pub backoff: Backoff,
}

impl RetryPolicy {
    /// Builds a policy from configured values, clamping non-positive ones. Returns the policy and
    /// a warning per clamped value, for the caller to log.
    pub fn clamped(max_retries: i64, delay: Duration, backoff: Backoff) -> (Self, Vec<String>) {
        let mut warnings = Vec::new();
        let max_retries = match u32::try_from(max_retries) {
            Ok(n) if n > 0 => n,
            _ => {
                warnings.push(format!(
                    "max_retries = {max_retries} is not positive; using {FALLBACK_MAX_RETRIES}"
                ));
                FALLBACK_MAX_RETRIES
            }
        };
        let max_retries = if i64::from(max_retries) > MAX_RETRIES {
            warnings.push(format!(
                "max_retries = {max_retries} is above {MAX_RETRIES}; using {MAX_RETRIES}"
            ));
            MAX_RETRIES as u32
        } else {
            max_retries
        };
        let delay = if delay.is_zero() {
            warnings.push(format!(
                "retry_delay is zero; using {}s",
                FALLBACK_RETRY_DELAY.as_secs()
            ));
            FALLBACK_RETRY_DELAY
        } else if delay > MAX_RETRY_DELAY {
            warnings.push(format!(
                "retry_delay is above {}s; using {}s",
                MAX_RETRY_DELAY.as_secs(),
                MAX_RETRY_DELAY.as_secs()
            ));
            MAX_RETRY_DELAY
        } else {
            delay
        };
        let backoff = match backoff {
            Backoff::Exponential { cap } if cap > MAX_RETRY_DELAY => {
                warnings.push(format!(
                    "max_retry_delay is above {}s; using {}s",
                    MAX_RETRY_DELAY.as_secs(),
                    MAX_RETRY_DELAY.as_secs()
                ));
                Backoff::Exponential {
                    cap: MAX_RETRY_DELAY,
                }
            }
            other => other,
        };
        let backoff = match backoff {
            Backoff::Exponential { cap } if cap < delay => {
                warnings.push(format!(
                    "max_retry_delay ({}ms) is below retry_delay; using retry_delay as the cap",
                    cap.as_millis()
                ));
                Backoff::Exponential { cap: delay }
            }
            other => other,
        };
        (
            Self {
                max_retries,
                delay,
                backoff,
            },
            warnings,
        )
    }

    /// The wait before retry number `retry` (1 for the first retry). `jitter` is a uniform
    /// random number in [0, 1); it only matters for exponential backoff.
    pub fn delay_before(&self, retry: u32, jitter: f64) -> Duration {
        match self.backoff {
            Backoff::Fixed => self.delay,
            Backoff::Exponential { cap } => {
                let doublings = retry.saturating_sub(1).min(31);
                let ceiling = self
                    .delay
                    .checked_mul(1u32 << doublings)
                    .map_or(cap, |d| d.min(cap));
                ceiling.mul_f64(jitter.clamp(0.0, 1.0))
            }
        }
    }

    /// The row's new state after an attempt that started with `retry_count` retries so far (0 for
    /// the first attempt).
    /// `jitter` is a uniform random number in [0, 1) (see [`Self::delay_before`]).
    pub fn transition(
        &self,
        retry_count: u32,
        result: &Result<Delivered, DeliveryError>,
        now: DateTime<Utc>,
        jitter: f64,
    ) -> Transition {
        match result {
            Ok(delivered) => Transition {
                status: Status::Delivered,
                retry_count,
                next_attempt_at: None,
                last_error: None,
                resolved_at: Some(now),
                resolved_targets: Some(delivered.resolved_targets.join(", ")),
            },
            Err(DeliveryError::Permanent(message)) => Transition::parked(retry_count, message, now),
            Err(e @ (DeliveryError::Transient(_) | DeliveryError::Throttled { .. })) => {
                let message = e.message();
                if retry_count >= self.max_retries {
                    return Transition::parked(
                        retry_count,
                        &format!(
                            "retries exhausted ({retry_count} retries, {} attempts): {message}",
                            u64::from(retry_count) + 1
                        ),
                        now,
                    );
                }
                let retry_count = retry_count + 1;
                let mut delay = self.delay_before(retry_count, jitter);
                if let DeliveryError::Throttled { retry_after, .. } = e {
                    // A server's Retry-After is honoured up to the longest retry delay: a
                    // far-future answer must not hide the row for years (or overflow a store's
                    // timestamp).
                    delay = delay.max((*retry_after).min(MAX_RETRY_DELAY));
                }
                let delay = chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
                Transition {
                    status: Status::Retrying,
                    retry_count,
                    next_attempt_at: Some(now.checked_add_signed(delay).unwrap_or(now)),
                    last_error: Some(message.to_owned()),
                    resolved_at: None,
                    resolved_targets: None,
                }
            }
        }
    }
}

/// The columns an attempt's outcome sets on the notification row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub status: Status,
    pub retry_count: u32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// `None` keeps the previous LastError (a success leaves the last failure visible).
    pub last_error: Option<String>,
    /// Set when the new status is terminal; drives the retention purge.
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolved_targets: Option<String>,
}

impl Transition {
    /// When the notification was delivered, if this transition delivers it (DeliveredAt is
    /// ResolvedAt for a delivery): the one rule both stores write.
    pub fn delivered_at(&self) -> Option<DateTime<Utc>> {
        self.resolved_at
            .filter(|_| self.status == Status::Delivered)
    }

    fn parked(retry_count: u32, message: &str, now: DateTime<Utc>) -> Self {
        Self {
            status: Status::Parked,
            retry_count,
            next_attempt_at: None,
            last_error: Some(message.to_owned()),
            resolved_at: Some(now),
            resolved_targets: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max: u32) -> RetryPolicy {
        RetryPolicy {
            max_retries: max,
            delay: Duration::from_secs(30),
            backoff: Backoff::Fixed,
        }
    }

    #[test]
    fn transient_failures_retry_then_park_when_exhausted() {
        let now = Utc::now();
        let t = policy(3).transition(0, &Err(DeliveryError::transient("451 later")), now, 0.5);
        assert_eq!(t.status, Status::Retrying);
        assert_eq!(t.retry_count, 1);
        assert_eq!(t.next_attempt_at, Some(now + chrono::Duration::seconds(30)));
        let t = policy(3).transition(2, &Err(DeliveryError::transient("451 later")), now, 0.5);
        assert_eq!(t.status, Status::Retrying);
        assert_eq!(t.retry_count, 3);
        let t = policy(3).transition(3, &Err(DeliveryError::transient("451 later")), now, 0.5);
        assert_eq!(t.status, Status::Parked);
        assert_eq!(t.retry_count, 3);
        assert_eq!(
            t.last_error.as_deref(),
            Some("retries exhausted (3 retries, 4 attempts): 451 later")
        );
    }

    /// `max_retries = n` means n retries after the first attempt: n + 1 attempts in all.
    #[test]
    fn max_retries_counts_retries_after_the_first_attempt() {
        for max in [0, 1, 2, 5] {
            let mut retries = 0;
            let mut attempts = 0;
            loop {
                attempts += 1;
                let failure = Err(DeliveryError::transient("451 later"));
                let t = policy(max).transition(retries, &failure, Utc::now(), 0.5);
                retries = t.retry_count;
                if t.status == Status::Parked {
                    break;
                }
            }
            assert_eq!((attempts, retries), (max + 1, max), "max_retries = {max}");
        }
    }

    #[test]
    fn permanent_failure_parks_at_once_and_success_delivers() {
        let now = Utc::now();
        let t = policy(3).transition(
            0,
            &Err(DeliveryError::permanent("550 no such user")),
            now,
            0.5,
        );
        assert_eq!(t.status, Status::Parked);
        assert_eq!(t.retry_count, 0);
        assert_eq!(t.last_error.as_deref(), Some("550 no such user"));
        let ok = Delivered {
            resolved_targets: vec!["a@x.test".into(), "b@x.test".into()],
        };
        let t = policy(3).transition(1, &Ok(ok), now, 0.5);
        assert_eq!(t.status, Status::Delivered);
        assert_eq!(t.resolved_targets.as_deref(), Some("a@x.test, b@x.test"));
        assert_eq!(t.resolved_at, Some(now));
    }

    #[test]
    fn non_positive_settings_are_clamped_with_warnings() {
        let (p, warnings) = RetryPolicy::clamped(0, Duration::ZERO, Backoff::Fixed);
        assert_eq!(p.max_retries, FALLBACK_MAX_RETRIES);
        assert_eq!(p.delay, FALLBACK_RETRY_DELAY);
        assert_eq!(warnings.len(), 2);
        let (p, warnings) = RetryPolicy::clamped(-5, Duration::from_secs(5), Backoff::Fixed);
        assert_eq!(p.max_retries, FALLBACK_MAX_RETRIES);
        assert_eq!(warnings.len(), 1);
        let (p, warnings) = RetryPolicy::clamped(4, Duration::from_secs(5), Backoff::Fixed);
        assert_eq!(p, policy(4).with_delay(Duration::from_secs(5)));
        assert!(warnings.is_empty());
    }

    #[test]
    fn exponential_backoff_doubles_up_to_the_cap_with_full_jitter() {
        let p = RetryPolicy {
            max_retries: 20,
            delay: Duration::from_secs(2),
            backoff: Backoff::Exponential {
                cap: Duration::from_secs(60),
            },
        };
        // At full jitter the ceiling shows: 2, 4, 8, 16, 32, then capped at 60.
        let ceilings: Vec<u64> = (1..=7).map(|n| p.delay_before(n, 1.0).as_secs()).collect();
        assert_eq!(ceilings, [2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(p.delay_before(5, 0.0), Duration::ZERO);
        assert_eq!(p.delay_before(5, 0.25), Duration::from_secs(8));
        // Absurd retry numbers stay at the cap instead of overflowing.
        assert_eq!(p.delay_before(u32::MAX, 1.0), Duration::from_secs(60));
    }

    #[test]
    fn a_cap_below_the_base_delay_is_clamped_with_a_warning() {
        let (p, warnings) = RetryPolicy::clamped(
            3,
            Duration::from_secs(10),
            Backoff::Exponential {
                cap: Duration::from_secs(1),
            },
        );
        assert_eq!(
            p.backoff,
            Backoff::Exponential {
                cap: Duration::from_secs(10)
            }
        );
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn retry_after_is_never_undercut() {
        let now = Utc::now();
        let throttled = DeliveryError::Throttled {
            message: "429 Too Many Requests".into(),
            retry_after: Duration::from_secs(120),
        };
        let t = policy(5).transition(0, &Err(throttled), now, 0.5);
        assert_eq!(t.status, Status::Retrying);
        assert_eq!(
            t.next_attempt_at,
            Some(now + chrono::Duration::seconds(120))
        );
        let short = DeliveryError::Throttled {
            message: "429".into(),
            retry_after: Duration::from_secs(1),
        };
        let t = policy(5).transition(0, &Err(short), now, 0.5);
        assert_eq!(t.next_attempt_at, Some(now + chrono::Duration::seconds(30)));
    }

    impl RetryPolicy {
        fn with_delay(mut self, delay: Duration) -> Self {
            self.delay = delay;
            self
        }
    }
}
