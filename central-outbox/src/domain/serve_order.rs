//! Who goes first when a channel has more due notifications than it can deliver at once (a
//! rate-limited relay, a backlog replayed after an outage). The whole rule, which both backends'
//! claim statements and the in-memory test store implement:
//!
//! 1. **Priority.** A claim takes due rows most urgent first (critical, high, normal, low).
//! 2. **Turns across sites.** Within a priority, rows are taken in *serve turn* order. A row's
//!    turn is given when it is stored, by [`serve_turn`]: one past the later of the channel's
//!    head turn (the smallest turn still waiting at that priority) and the newest turn its own
//!    site has waiting at that priority. So a site's rows follow each other one turn apart,
//!    while a site with nothing waiting joins just behind the head: its fresh notification
//!    waits for about one row of each site with work due, never behind another site's whole
//!    backlog. This is start-time fair queuing with the rows as the unit; a retried row keeps
//!    its turn, so when it comes due again it goes ahead of rows stored after it.
//! 3. **Longest waiting, one in ten.** Strict priority alone would starve low rows while
//!    urgent ones keep coming, so one claimed row in [`LONGEST_WAITING_SHARE`] (counted per
//!    channel across claims, see [`LongestWaitingShare`]) is the row that has been due longest,
//!    whatever its priority: lower priorities get at least a tenth of a saturated channel.
//!
//! Ties (rows stored together) go to the older row. The indexes that serve these orders are
//! described with each backend's migrations.

/// One claimed row in this many is the longest-waiting due row, whatever its priority. Ten: a
/// saturated channel still gives nine of ten deliveries to the most urgent rows, and a low
/// row behind a long critical backlog still moves at a tenth of the channel's rate.
pub const LONGEST_WAITING_SHARE: u64 = 10;

/// The serve turn of a row stored now (rule 2): `head` is the smallest turn still waiting in
/// its channel at its priority, `site_last` the largest one its site has waiting there (`None`:
/// nothing waits).
pub fn serve_turn(head: Option<i64>, site_last: Option<i64>) -> i64 {
    head.unwrap_or(0)
        .max(site_last.unwrap_or(0))
        .saturating_add(1)
}

/// How many rows one claim takes in each order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClaimLanes {
    /// Taken by priority, then serve turn (rules 1 and 2).
    pub in_turn: usize,
    /// Taken by how long they have been due (rule 3), before the others.
    pub longest_waiting: usize,
}

impl ClaimLanes {
    /// Only by priority and turn (a test's or a tool's claim).
    pub fn in_turn(rows: usize) -> Self {
        Self {
            in_turn: rows,
            longest_waiting: 0,
        }
    }

    pub fn total(self) -> usize {
        self.in_turn + self.longest_waiting
    }
}

/// Counts a channel's claimed rows so that every [`LONGEST_WAITING_SHARE`]th one is taken by
/// waiting time (rule 3), however the rows are split into claims: with a slow rate limit a
/// claim takes one row, and every tenth claim is then the longest-waiting one.
#[derive(Debug, Clone, Copy, Default)]
pub struct LongestWaitingShare {
    claimed: u64,
}

impl LongestWaitingShare {
    /// How a claim of `wanted` rows splits between the two orders.
    pub fn split(&self, wanted: usize) -> ClaimLanes {
        let wanted_u64 = u64::try_from(wanted).unwrap_or(u64::MAX);
        let before = self.claimed / LONGEST_WAITING_SHARE;
        let after = self.claimed.saturating_add(wanted_u64) / LONGEST_WAITING_SHARE;
        let longest_waiting = usize::try_from(after - before)
            .unwrap_or(wanted)
            .min(wanted);
        ClaimLanes {
            in_turn: wanted - longest_waiting,
            longest_waiting,
        }
    }

    /// A claim took `rows` rows. Only rows actually taken count, so a share that found nothing
    /// due is asked for again by the next claim.
    pub fn claimed(&mut self, rows: usize) {
        self.claimed = self
            .claimed
            .saturating_add(u64::try_from(rows).unwrap_or(u64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_joins_behind_the_head_and_follows_its_own_rows() {
        // Nothing waiting: the first turn.
        assert_eq!(serve_turn(None, None), 1);
        // Site A has turns 5..=500 waiting; B has nothing: B goes right behind A's head.
        assert_eq!(serve_turn(Some(5), None), 6);
        // A's next row goes after its own last one.
        assert_eq!(serve_turn(Some(5), Some(500)), 501);
        // A site whose rows fell behind the head (served meanwhile) rejoins at the head.
        assert_eq!(serve_turn(Some(40), Some(7)), 41);
    }

    #[test]
    fn one_row_in_ten_is_the_longest_waiting_however_the_claims_split() {
        let mut share = LongestWaitingShare::default();
        let mut longest = 0;
        for _ in 0..100 {
            let lanes = share.split(1);
            assert_eq!(lanes.total(), 1);
            longest += lanes.longest_waiting;
            share.claimed(1);
        }
        assert_eq!(longest, 10);

        let mut share = LongestWaitingShare::default();
        let lanes = share.split(12);
        assert_eq!(
            lanes,
            ClaimLanes {
                in_turn: 11,
                longest_waiting: 1
            }
        );
        share.claimed(12);
        assert_eq!(share.split(12).longest_waiting, 1);
        assert_eq!(share.split(8).longest_waiting, 1);
        assert_eq!(share.split(7).longest_waiting, 0);
    }

    #[test]
    fn a_short_claim_does_not_use_up_the_share() {
        let mut share = LongestWaitingShare::default();
        share.claimed(9);
        assert_eq!(share.split(1).longest_waiting, 1);
        // Nothing was due: the next claim asks again.
        share.claimed(0);
        assert_eq!(share.split(1).longest_waiting, 1);
    }
}
