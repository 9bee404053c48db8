//! Which of a channel's providers (its SMTP relays, or a webhook list's endpoints, in the order
//! the admin gave them) the next attempt goes to: the rule behind failover, as a pure state
//! machine. Time is passed in, so the rule is tested without a clock.
//!
//! The rule:
//! - Attempts go to the *active* provider, the first one at the start.
//! - Only a transient failure counts against a provider (it could not be reached, TLS, a
//!   timeout, an SMTP 4xx, HTTP 408, 429 or 5xx). A permanent refusal is an answer from a provider
//!   that works, so it counts as well as a success: failing over would not change it.
//! - After [`FailoverPolicy::after_failures`] transient failures in a row, or transient failures
//!   only for [`FailoverPolicy::after_failing_for`], the channel moves to the next provider in the
//!   order (after the last: the first again).
//! - While it is not on the first, the first is probed every [`FailoverPolicy::probe_every`]
//!   (the adapter's cheapest exchange, e.g. connect, EHLO, QUIT); the first good probe moves the
//!   channel back to it. The first provider is the one the admin prefers, so it is the only one
//!   probed: a channel on its third provider goes straight back to the first, not the second.
//! - An outcome from a provider that is no longer active (an attempt that started before the
//!   move) changes nothing: the decision was already made on newer evidence.
//!
//! The state is kept in memory by the dispatching node: a new leader starts on the first
//! provider and finds out again, at the cost of at most `after_failures` attempts.

use std::time::{Duration, Instant};

use super::delivery::{Delivered, DeliveryError};

/// When a channel leaves a failing provider and when it looks at the first one again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailoverPolicy {
    /// Transient failures in a row that move the channel to the next provider.
    pub after_failures: u32,
    /// A provider failing (every outcome transient) this long is left even before
    /// `after_failures`: a slow relay that times out once a minute would otherwise take minutes.
    pub after_failing_for: Duration,
    /// How often the first provider is probed while the channel is on another.
    pub probe_every: Duration,
}

impl Default for FailoverPolicy {
    /// Three failures in a row or 30 s of failing, and a probe every 30 s: a relay that refuses
    /// connections is left after three attempts (well under the retry delay of the rows that
    /// failed), and a channel is back on its first relay within 30 s of that relay's recovery.
    fn default() -> Self {
        Self {
            after_failures: 3,
            after_failing_for: Duration::from_secs(30),
            probe_every: Duration::from_secs(30),
        }
    }
}

/// How an attempt (or a probe) at one provider ended, as far as failover is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderOutcome {
    /// Accepted, or refused for good: the provider answers.
    Answered,
    /// Unreachable, timed out, or a transient refusal.
    Failed,
}

impl ProviderOutcome {
    /// How a delivery's result counts: a transient failure (throttling included) against the
    /// provider, a delivery or a permanent refusal as an answer.
    pub fn of(result: &Result<Delivered, DeliveryError>) -> Self {
        match result {
            Ok(_) | Err(DeliveryError::Permanent(_)) => Self::Answered,
            Err(DeliveryError::Transient(_) | DeliveryError::Throttled { .. }) => Self::Failed,
        }
    }
}

/// A change of provider, for the caller to log, count and show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub from: usize,
    pub to: usize,
    pub why: MoveReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveReason {
    /// `after_failures` transient failures in a row.
    Failures(u32),
    /// Failing for at least `after_failing_for`.
    FailingFor(Duration),
    /// A probe of the first provider succeeded.
    FirstIsBack,
}

impl MoveReason {
    /// The reason's name in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failures(_) => "failures",
            Self::FailingFor(_) => "failing_for",
            Self::FirstIsBack => "first_is_back",
        }
    }
}

impl std::fmt::Display for MoveReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failures(n) => write!(f, "{n} transient failures in a row"),
            Self::FailingFor(d) => write!(f, "failing for {}s", d.as_secs()),
            Self::FirstIsBack => f.write_str("a probe of the first answered"),
        }
    }
}

/// The failover state of one channel over `providers` providers (at least one).
#[derive(Debug, Clone)]
pub struct ProviderSelector {
    policy: FailoverPolicy,
    providers: usize,
    active: usize,
    /// Transient failures in a row at the active provider.
    streak: u32,
    /// When the active provider's current run of failures began.
    failing_since: Option<Instant>,
    /// When the first provider was last probed (or left, which counts as its last news).
    last_probe: Option<Instant>,
}

impl ProviderSelector {
    /// A channel on its first provider. `providers` below one is taken as one: a channel
    /// always has the provider its settings name.
    pub fn new(policy: FailoverPolicy, providers: usize) -> Self {
        Self {
            policy,
            providers: providers.max(1),
            active: 0,
            streak: 0,
            failing_since: None,
            last_probe: None,
        }
    }

    /// The provider the next attempt goes to.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Whether the channel runs on another provider than its first.
    pub fn on_fallback(&self) -> bool {
        self.active != 0
    }

    /// Records how an attempt at `provider` ended at `now`; says whether the channel moved.
    pub fn record(
        &mut self,
        provider: usize,
        outcome: ProviderOutcome,
        now: Instant,
    ) -> Option<Moved> {
        if provider != self.active {
            return None;
        }
        match outcome {
            ProviderOutcome::Answered => {
                self.streak = 0;
                self.failing_since = None;
                None
            }
            ProviderOutcome::Failed => {
                self.streak = self.streak.saturating_add(1);
                let since = *self.failing_since.get_or_insert(now);
                let failing_for = now.saturating_duration_since(since);
                let why = if self.streak >= self.policy.after_failures {
                    MoveReason::Failures(self.streak)
                } else if failing_for >= self.policy.after_failing_for {
                    MoveReason::FailingFor(failing_for)
                } else {
                    return None;
                };
                if self.providers == 1 {
                    // Nowhere to go: the streak goes on counting for the caller's figures.
                    return None;
                }
                let to = (self.active + 1) % self.providers;
                Some(self.move_to(to, why, now))
            }
        }
    }

    /// Whether the first provider should be probed at `now`: only while the channel is on
    /// another, once per `probe_every`.
    pub fn probe_due(&self, now: Instant) -> bool {
        self.on_fallback()
            && self
                .last_probe
                .is_none_or(|at| now.saturating_duration_since(at) >= self.policy.probe_every)
    }

    /// When the next probe is due, for a timer (`None` on the first provider).
    pub fn next_probe_at(&self) -> Option<Instant> {
        if !self.on_fallback() {
            return None;
        }
        self.last_probe.map(|at| at + self.policy.probe_every)
    }

    /// Records a probe of the first provider; a good one moves the channel back to it.
    pub fn probed(&mut self, outcome: ProviderOutcome, now: Instant) -> Option<Moved> {
        self.last_probe = Some(now);
        if !self.on_fallback() || outcome == ProviderOutcome::Failed {
            return None;
        }
        Some(self.move_to(0, MoveReason::FirstIsBack, now))
    }

    fn move_to(&mut self, to: usize, why: MoveReason, now: Instant) -> Moved {
        let from = self.active;
        self.active = to;
        self.streak = 0;
        self.failing_since = None;
        if from == 0 {
            // The first provider just failed: its next probe is one interval from now.
            self.last_probe = Some(now);
        }
        Moved { from, to, why }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use ProviderOutcome::{Answered, Failed};

    const S: Duration = Duration::from_secs(1);

    fn selector(providers: usize) -> (ProviderSelector, Instant) {
        (
            ProviderSelector::new(FailoverPolicy::default(), providers),
            Instant::now(),
        )
    }

    #[test]
    fn three_failures_in_a_row_move_to_the_next_provider() {
        let (mut s, t0) = selector(2);
        assert_eq!(s.record(0, Failed, t0), None);
        assert_eq!(s.record(0, Failed, t0 + S), None);
        assert_eq!(
            s.record(0, Failed, t0 + 2 * S),
            Some(Moved {
                from: 0,
                to: 1,
                why: MoveReason::Failures(3)
            })
        );
        assert_eq!(s.active(), 1);
        assert!(s.on_fallback());
    }

    #[test]
    fn an_answer_between_failures_starts_the_count_again() {
        let (mut s, t0) = selector(2);
        s.record(0, Failed, t0);
        s.record(0, Failed, t0);
        // A permanent refusal is an answer too: the relay works.
        assert_eq!(s.record(0, Answered, t0), None);
        assert_eq!(s.record(0, Failed, t0), None);
        assert_eq!(s.record(0, Failed, t0), None);
        assert_eq!(s.active(), 0);
    }

    #[test]
    fn failing_for_the_whole_period_moves_even_with_fewer_failures() {
        let (mut s, t0) = selector(3);
        assert_eq!(s.record(0, Failed, t0), None);
        assert_eq!(
            s.record(0, Failed, t0 + 30 * S),
            Some(Moved {
                from: 0,
                to: 1,
                why: MoveReason::FailingFor(30 * S)
            })
        );
    }

    #[test]
    fn outcomes_from_a_provider_no_longer_active_change_nothing() {
        let (mut s, t0) = selector(2);
        for _ in 0..3 {
            s.record(0, Failed, t0);
        }
        assert_eq!(s.active(), 1);
        // Attempts that started at the first relay before the move end now.
        assert_eq!(s.record(0, Answered, t0 + S), None);
        assert_eq!(s.record(0, Failed, t0 + S), None);
        assert_eq!(s.active(), 1);
        // And they do not count against the secondary.
        assert_eq!(s.record(1, Failed, t0 + S), None);
        assert_eq!(s.record(1, Failed, t0 + S), None);
        assert_eq!(s.active(), 1);
    }

    #[test]
    fn the_last_provider_failing_moves_to_the_first_again() {
        let (mut s, t0) = selector(2);
        for _ in 0..3 {
            s.record(0, Failed, t0);
        }
        let moved = (0..3).find_map(|_| s.record(1, Failed, t0 + S));
        assert_eq!(
            moved,
            Some(Moved {
                from: 1,
                to: 0,
                why: MoveReason::Failures(3)
            })
        );
        assert!(!s.on_fallback());
        assert!(!s.probe_due(t0 + 60 * S), "on the first: nothing to probe");
    }

    #[test]
    fn a_single_provider_never_moves() {
        let (mut s, t0) = selector(1);
        for i in 0..10 {
            assert_eq!(s.record(0, Failed, t0 + i * 10 * S), None);
        }
        assert_eq!(s.active(), 0);
        assert!(!s.probe_due(t0 + 100 * S));
        // Nor does a count of zero providers, taken as one.
        let (mut none, t0) = selector(0);
        assert_eq!(none.record(0, Failed, t0 + 60 * S), None);
    }

    #[test]
    fn the_first_is_probed_once_per_interval_and_a_good_probe_moves_back() {
        let (mut s, t0) = selector(3);
        for _ in 0..3 {
            s.record(0, Failed, t0);
        }
        assert_eq!(s.next_probe_at(), Some(t0 + 30 * S));
        assert!(!s.probe_due(t0 + 29 * S));
        assert!(s.probe_due(t0 + 30 * S));
        assert_eq!(s.probed(Failed, t0 + 30 * S), None);
        assert!(!s.probe_due(t0 + 59 * S));
        assert_eq!(s.next_probe_at(), Some(t0 + 60 * S));
        // Meanwhile the second fails too: the third, and the first still probed.
        for _ in 0..3 {
            s.record(1, Failed, t0 + 40 * S);
        }
        assert_eq!(s.active(), 2);
        assert!(s.probe_due(t0 + 60 * S));
        assert_eq!(
            s.probed(Answered, t0 + 60 * S),
            Some(Moved {
                from: 2,
                to: 0,
                why: MoveReason::FirstIsBack
            })
        );
        assert_eq!(s.active(), 0);
        assert_eq!(s.next_probe_at(), None);
    }

    #[test]
    fn after_moving_back_the_first_gets_a_fresh_count() {
        let (mut s, t0) = selector(2);
        for _ in 0..3 {
            s.record(0, Failed, t0);
        }
        s.probed(Answered, t0 + 30 * S);
        assert_eq!(s.record(0, Failed, t0 + 31 * S), None);
        assert_eq!(s.record(0, Failed, t0 + 32 * S), None);
        assert_eq!(s.active(), 0);
    }

    /// Any sequence of outcomes and probes keeps the selector on a provider that exists, on
    /// the first whenever it says it is not on a fallback, and never due a probe on the first.
    #[test]
    fn random_sequences_keep_the_invariants() {
        let mut rng = fastrand::Rng::with_seed(33);
        for _ in 0..200 {
            let providers = rng.usize(1..5);
            let (mut s, t0) = selector(providers);
            let mut now = t0;
            for _ in 0..200 {
                now += Duration::from_millis(rng.u64(0..20_000));
                let outcome = if rng.bool() { Answered } else { Failed };
                let before = s.active();
                let moved = if rng.u8(0..4) == 0 {
                    s.probed(outcome, now)
                } else {
                    s.record(rng.usize(0..providers), outcome, now)
                };
                assert!(s.active() < providers);
                assert_eq!(s.on_fallback(), s.active() != 0);
                assert!(!(s.active() == 0 && s.probe_due(now)));
                match moved {
                    Some(m) => {
                        assert_eq!((m.from, m.to), (before, s.active()));
                        assert_ne!(m.from, m.to);
                    }
                    None => assert_eq!(before, s.active()),
                }
            }
        }
    }
}
