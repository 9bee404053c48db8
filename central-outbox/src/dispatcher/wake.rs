//! When the dispatch loop sweeps: the one place where the timer-only mode differs from the
//! default.
//!
//! The loop reports what woke it as a [`Wake`] and asks its [`WakePolicy`] for the [`Step`] to
//! take. Whatever the policy, the loop always follows the lease and always frees the slots of
//! finished deliveries: the policy decides only whether a wake-up claims (a sweep), only starts
//! rows already claimed, or does nothing.

/// How the dispatch loop reacts to events; `dispatcher.wake_on_events` in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakePolicy {
    /// Sweep on every wake-up: a new row ingested here, a finished delivery, a rate-limit token
    /// coming due, a lease change, and the poll timer (retries coming due, rows other replicas
    /// ingested). The default.
    OnEvents,
    /// Sweep on the poll timer alone, as the system this replaces did (kept for comparison
    /// benchmarks; it adds up to a poll interval of latency). Between sweeps, finished
    /// deliveries and rate-limit tokens only start what the last sweep claimed; ingest is not
    /// listened to.
    TimerOnly,
}

/// What woke the dispatch loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wake {
    /// The lease keeper published (a renewal, a loss, another epoch).
    Lease,
    /// Deliveries finished, freeing their slots.
    Finished,
    /// A claim answered: its rows are queued, and a channel that may have more due can claim
    /// again.
    Claimed,
    /// A row was ingested on this node.
    Ingest,
    /// A rate-limited channel's next token came due.
    Throttle,
    /// The poll interval passed.
    Poll,
}

/// What the loop does about one wake-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// One sweep: claim for free slots and tokens, start deliveries.
    Sweep,
    /// Start rows already claimed, without claiming.
    StartQueued,
    Nothing,
}

impl WakePolicy {
    pub fn from_wake_on_events(wake_on_events: bool) -> Self {
        if wake_on_events {
            Self::OnEvents
        } else {
            Self::TimerOnly
        }
    }

    pub(super) fn step(self, wake: Wake) -> Step {
        match (self, wake) {
            (Self::OnEvents, _) | (Self::TimerOnly, Wake::Poll) => Step::Sweep,
            (Self::TimerOnly, Wake::Finished | Wake::Throttle | Wake::Claimed) => Step::StartQueued,
            (Self::TimerOnly, Wake::Lease | Wake::Ingest) => Step::Nothing,
        }
    }

    /// Whether the loop waits for ingest at all. A wake-up that would do nothing is not waited
    /// for, so a timer-only loop does not spin once per ingested row.
    pub(super) fn hears_ingest(self) -> bool {
        self.step(Wake::Ingest) != Step::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_only_sweeps_on_the_poll_timer_alone() {
        let all = [
            Wake::Lease,
            Wake::Finished,
            Wake::Claimed,
            Wake::Ingest,
            Wake::Throttle,
            Wake::Poll,
        ];
        for wake in all {
            assert_eq!(WakePolicy::OnEvents.step(wake), Step::Sweep, "{wake:?}");
        }
        let timer = WakePolicy::TimerOnly;
        assert_eq!(timer.step(Wake::Poll), Step::Sweep);
        assert_eq!(timer.step(Wake::Finished), Step::StartQueued);
        assert_eq!(timer.step(Wake::Throttle), Step::StartQueued);
        assert_eq!(timer.step(Wake::Claimed), Step::StartQueued);
        assert_eq!(timer.step(Wake::Lease), Step::Nothing);
        assert!(!timer.hears_ingest());
        assert!(WakePolicy::OnEvents.hears_ingest());
    }
}
