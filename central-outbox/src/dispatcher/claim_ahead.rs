//! How far ahead a channel claims: enough rows queued that its connections stay busy while the
//! next claim is under way. By Little's law that is the rows the channel starts during one
//! claim's latency: `connections × claim latency / time a delivery holds its slot`.
//!
//! Both times are measured as the channel runs (moving averages), because they differ by
//! orders of magnitude between deployments: a claim commits in about a millisecond on SQLite
//! and takes 5–20 ms on a busy MS SQL server, and a delivery holds its slot for a fraction of a
//! millisecond on a relay next door and for two round trips on one across a WAN. A fixed depth
//! would either starve the connections (a claim slower than a round of deliveries leaves them
//! idle until it answers) or claim far ahead for nothing (each row claimed ahead shows an
//! InFlight attempt if the node dies, and waits behind the queue if it is urgent).
//!
//! Until both have been measured once, the depth is zero: the channel claims when its queue is
//! empty, as a cold channel should.

use std::time::Duration;

/// The deepest the channel claims ahead, in rows: bounds how long a critical row claimed next
/// waits behind the queue, and how many rows a dying node leaves InFlight.
pub(super) const MAX_AHEAD: usize = 256;

/// How many claims' worth of rows to keep queued: the averages say what one claim costs on
/// average, and a claim slower than that (a checkpoint, a busy moment on the server) must not
/// leave the connections idle; two means the queue runs dry only if a claim takes twice its
/// average.
const MARGIN: f64 = 2.0;

/// The weight of a new sample in the moving averages: about the last eight count.
const WEIGHT: f64 = 0.125;

/// A moving average of durations, in seconds.
#[derive(Debug, Default, Clone, Copy)]
struct Average(Option<f64>);

impl Average {
    fn add(&mut self, sample: Duration) {
        let sample = sample.as_secs_f64();
        self.0 = Some(match self.0 {
            None => sample,
            Some(mean) => mean + WEIGHT * (sample - mean),
        });
    }
}

/// The channel's measured claim latency and slot hold time; see the module documentation.
#[derive(Debug, Default)]
pub(super) struct ClaimAhead {
    claim: Average,
    hold: Average,
}

impl ClaimAhead {
    /// A claim answered after `took`.
    pub(super) fn claim_took(&mut self, took: Duration) {
        self.claim.add(took);
    }

    /// A delivery held its slot for `held`.
    pub(super) fn slot_held(&mut self, held: Duration) {
        self.hold.add(held);
    }

    /// Rows to keep queued when the next claim is sent, with `connections` slots delivering
    /// and at most `rate_limit` starts a second: what they start during [`MARGIN`] claims. A
    /// rate-limited channel starts no faster than its limit however quick its relay, and rows
    /// queued beyond that would only make a critical row claimed next wait behind them.
    pub(super) fn rows(&self, connections: usize, rate_limit: Option<f64>) -> usize {
        match (self.claim.0, self.hold.0) {
            (Some(claim), Some(hold)) if hold > 0.0 => {
                let mut per_second = connections as f64 / hold;
                if let Some(limit) = rate_limit {
                    per_second = per_second.min(limit);
                }
                let rows = (MARGIN * per_second * claim).ceil();
                if rows >= MAX_AHEAD as f64 {
                    MAX_AHEAD
                } else {
                    rows as usize
                }
            }
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn nothing_ahead_until_both_times_are_known() {
        let mut ahead = ClaimAhead::default();
        assert_eq!(ahead.rows(4, None), 0);
        ahead.claim_took(ms(10));
        assert_eq!(ahead.rows(4, None), 0);
        ahead.slot_held(ms(1));
        assert_eq!(ahead.rows(4, None), 80);
    }

    #[test]
    fn covers_the_rows_started_during_one_claim() {
        let mut ahead = ClaimAhead::default();
        // SQLite next to a relay 1 ms away: a claim is shorter than a delivery.
        ahead.claim_took(ms(1));
        ahead.slot_held(ms(2));
        assert_eq!(ahead.rows(4, None), 4);
        // Deliveries that finish at once (hold 0) never divide by zero.
        let mut instant = ClaimAhead::default();
        instant.claim_took(ms(5));
        instant.slot_held(Duration::ZERO);
        assert_eq!(instant.rows(4, None), 0);
    }

    #[test]
    fn a_rate_limit_bounds_what_is_queued() {
        let mut ahead = ClaimAhead::default();
        ahead.claim_took(ms(5));
        ahead.slot_held(Duration::from_micros(300));
        // Four quick connections would start 134 rows during two 5 ms claims; at 100 a second
        // the channel starts one.
        assert_eq!(ahead.rows(4, None), 134);
        assert_eq!(ahead.rows(4, Some(100.0)), 1);
    }

    #[test]
    fn follows_a_slower_database_and_stays_bounded() {
        let mut ahead = ClaimAhead::default();
        ahead.claim_took(ms(2));
        ahead.slot_held(ms(1));
        let before = ahead.rows(4, None);
        for _ in 0..20 {
            ahead.claim_took(ms(20));
        }
        assert!(ahead.rows(4, None) > before);
        for _ in 0..20 {
            ahead.claim_took(Duration::from_secs(10));
        }
        assert_eq!(ahead.rows(4, None), MAX_AHEAD);
    }
}
