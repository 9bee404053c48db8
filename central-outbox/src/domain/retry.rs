//! The retry policy and the state transition an attempt's result causes.
//!
//! Fixed interval, as in the system this replaces: a transient failure increments RetryCount and
//! schedules the next attempt `delay` later, until RetryCount reaches `max_retries`, which parks
//! the notification. A permanent failure parks at once. Misconfigured (non-positive) settings are
//! clamped to safe fallbacks so a typo cannot park everything on the first hiccup.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::delivery::{Delivered, DeliveryError};
use super::status::Status;

/// Retries used when the configured value is not positive.
pub const FALLBACK_MAX_RETRIES: u32 = 10;
/// Delay used when the configured value is not positive.
pub const FALLBACK_RETRY_DELAY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub delay: Duration,
}

impl RetryPolicy {
    /// Builds a policy from configured values, clamping non-positive ones. Returns the policy and
    /// a warning per clamped value, for the caller to log.
    pub fn clamped(max_retries: i64, delay: Duration) -> (Self, Vec<String>) {
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
        let delay = if delay.is_zero() {
            warnings.push(format!(
                "retry_delay is zero; using {}s",
                FALLBACK_RETRY_DELAY.as_secs()
            ));
            FALLBACK_RETRY_DELAY
        } else {
            delay
        };
        (Self { max_retries, delay }, warnings)
    }

    /// The row's new state after an attempt that started with `retry_count` retries so far.
    pub fn transition(
        &self,
        retry_count: u32,
        result: &Result<Delivered, DeliveryError>,
        now: DateTime<Utc>,
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
            Err(DeliveryError::Transient(message)) => {
                let retry_count = retry_count.saturating_add(1);
                if retry_count >= self.max_retries {
                    Transition::parked(
                        retry_count,
                        &format!("retries exhausted ({retry_count}): {message}"),
                        now,
                    )
                } else {
                    let delay = chrono::Duration::from_std(self.delay)
                        .unwrap_or(chrono::Duration::seconds(60));
                    Transition {
                        status: Status::Retrying,
                        retry_count,
                        next_attempt_at: Some(now + delay),
                        last_error: Some(message.clone()),
                        resolved_at: None,
                        resolved_targets: None,
                    }
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
        }
    }

    #[test]
    fn transient_failures_retry_then_park_when_exhausted() {
        let now = Utc::now();
        let t = policy(3).transition(0, &Err(DeliveryError::transient("451 later")), now);
        assert_eq!(t.status, Status::Retrying);
        assert_eq!(t.retry_count, 1);
        assert_eq!(t.next_attempt_at, Some(now + chrono::Duration::seconds(30)));
        let t = policy(3).transition(2, &Err(DeliveryError::transient("451 later")), now);
        assert_eq!(t.status, Status::Parked);
        assert_eq!(t.retry_count, 3);
        assert!(t.last_error.unwrap().contains("retries exhausted"));
    }

    #[test]
    fn permanent_failure_parks_at_once_and_success_delivers() {
        let now = Utc::now();
        let t = policy(3).transition(0, &Err(DeliveryError::permanent("550 no such user")), now);
        assert_eq!(t.status, Status::Parked);
        assert_eq!(t.retry_count, 0);
        assert_eq!(t.last_error.as_deref(), Some("550 no such user"));
        let ok = Delivered {
            resolved_targets: vec!["a@x.test".into(), "b@x.test".into()],
        };
        let t = policy(3).transition(1, &Ok(ok), now);
        assert_eq!(t.status, Status::Delivered);
        assert_eq!(t.resolved_targets.as_deref(), Some("a@x.test, b@x.test"));
        assert_eq!(t.resolved_at, Some(now));
    }

    #[test]
    fn non_positive_settings_are_clamped_with_warnings() {
        let (p, warnings) = RetryPolicy::clamped(0, Duration::ZERO);
        assert_eq!(p.max_retries, FALLBACK_MAX_RETRIES);
        assert_eq!(p.delay, FALLBACK_RETRY_DELAY);
        assert_eq!(warnings.len(), 2);
        let (p, warnings) = RetryPolicy::clamped(-5, Duration::from_secs(5));
        assert_eq!(p.max_retries, FALLBACK_MAX_RETRIES);
        assert_eq!(warnings.len(), 1);
        let (p, warnings) = RetryPolicy::clamped(4, Duration::from_secs(5));
        assert_eq!(p, policy(4).with_delay(Duration::from_secs(5)));
        assert!(warnings.is_empty());
    }

    impl RetryPolicy {
        fn with_delay(mut self, delay: Duration) -> Self {
            self.delay = delay;
            self
        }
    }
}
