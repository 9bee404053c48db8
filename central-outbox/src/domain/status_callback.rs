//! Status callbacks: the rules for telling an IT system's endpoint every final status of a
//! list's notifications (central's `status_callbacks` makes the calls).
//!
//! A change is called until the endpoint answers 2xx. A call that fails for a reason a retry can
//! mend (no connection, a timeout, HTTP 408, 429 or 5xx) is retried after a delay that doubles
//! from [`FIRST_RETRY`] up to [`MAX_RETRY`]; once the change has waited
//! `give_up_after` since it was queued, or at once for a refusal a retry cannot mend (another
//! 4xx, a redirect), it is given up. Every call, and the giving up, is an entry of the
//! notification's history; none of it changes the notification's status.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The delay before the first retry of a change.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest delay between two calls of one change.
pub const MAX_RETRY: Duration = Duration::from_secs(5 * 60);

/// The shortest and longest time a change may be retried for (`status_callbacks.give_up_after`).
pub const MIN_GIVE_UP_AFTER: Duration = Duration::from_secs(1);
pub const MAX_GIVE_UP_AFTER: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How one call of a change ended, as its history entry records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// The endpoint answered 2xx: the change is done.
    Answered,
    /// It did not; the change is called again later.
    Failed,
    /// It did not, and the change is not called again (its time ran out, or the refusal was
    /// permanent, or the list no longer has an endpoint).
    GivenUp,
}

impl CallOutcome {
    pub const ALL: [Self; 3] = [Self::Answered, Self::Failed, Self::GivenUp];

    /// The stored name (`StatusCallbackCalls.Outcome`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "Answered",
            Self::Failed => "Failed",
            Self::GivenUp => "GivenUp",
        }
    }

    pub fn from_db(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == text)
    }
}

/// What one call's answer says about the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallResult {
    Answered,
    /// A retry may succeed (connection, timeout, 408, 429, 5xx); the text says what happened.
    Transient(String),
    /// A retry would be refused the same way (another 4xx, a redirect, no endpoint).
    Permanent(String),
}

/// What becomes of a change after a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Done(CallOutcome),
    RetryAt(DateTime<Utc>),
}

/// The change's next step after its `calls`-th call (1 for the first) ended in `result` at
/// `now`, for a change queued at `queued_at` and retried for at most `give_up_after`.
pub fn after_call(
    result: &CallResult,
    calls: u32,
    queued_at: DateTime<Utc>,
    now: DateTime<Utc>,
    give_up_after: Duration,
) -> Next {
    match result {
        CallResult::Answered => Next::Done(CallOutcome::Answered),
        CallResult::Permanent(_) => Next::Done(CallOutcome::GivenUp),
        CallResult::Transient(_) => {
            let retry_at = now + chrono_duration(retry_delay(calls));
            let deadline = queued_at + chrono_duration(give_up_after);
            if retry_at > deadline {
                // A last call at the deadline itself is worth it only if the deadline is ahead.
                if now < deadline {
                    Next::RetryAt(deadline)
                } else {
                    Next::Done(CallOutcome::GivenUp)
                }
            } else {
                Next::RetryAt(retry_at)
            }
        }
    }
}

/// The delay after the `calls`-th failed call: [`FIRST_RETRY`] doubled per call before it, at
/// most [`MAX_RETRY`].
pub fn retry_delay(calls: u32) -> Duration {
    let doublings = calls.saturating_sub(1).min(20);
    FIRST_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
}

fn chrono_duration(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    #[test]
    fn the_delay_doubles_up_to_its_cap() {
        let delays: Vec<u64> = (1..=12).map(|c| retry_delay(c).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(retry_delay(u32::MAX), MAX_RETRY);
    }

    #[test]
    fn an_answer_ends_the_change_and_a_permanent_refusal_gives_it_up() {
        let hour = Duration::from_secs(3600);
        assert_eq!(
            after_call(&CallResult::Answered, 1, at(0), at(0), hour),
            Next::Done(CallOutcome::Answered)
        );
        assert_eq!(
            after_call(&CallResult::Permanent("410".into()), 1, at(0), at(0), hour),
            Next::Done(CallOutcome::GivenUp)
        );
    }

    #[test]
    fn a_transient_failure_is_retried_until_the_time_runs_out() {
        let give_up = Duration::from_secs(10);
        let failed = CallResult::Transient("503".into());
        assert_eq!(
            after_call(&failed, 1, at(0), at(0), give_up),
            Next::RetryAt(at(1))
        );
        assert_eq!(
            after_call(&failed, 3, at(0), at(3), give_up),
            Next::RetryAt(at(7))
        );
        // The next delay would pass the deadline: one last call at the deadline.
        assert_eq!(
            after_call(&failed, 4, at(0), at(7), give_up),
            Next::RetryAt(at(10))
        );
        assert_eq!(
            after_call(&failed, 5, at(0), at(10), give_up),
            Next::Done(CallOutcome::GivenUp)
        );
    }

    #[test]
    fn outcomes_round_trip_through_their_stored_names() {
        for outcome in CallOutcome::ALL {
            assert_eq!(CallOutcome::from_db(outcome.as_str()), Some(outcome));
        }
        assert_eq!(CallOutcome::from_db("Sent"), None);
    }
}
