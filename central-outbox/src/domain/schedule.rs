//! Scheduled delivery at central: what a notification with a `deliver_after` (checked where it
//! is accepted, `outbox_domain::schedule`) becomes here. The whole rule, which both backends'
//! submit statements, the admin views and the KPIs implement:
//!
//! 1. **Stored Pending, due at its time.** NextAttemptAt is `deliver_after`, or the arrival when
//!    that has passed (a row buffered at its site past its time is due like any arriving row).
//!    The claims take only due rows, so nothing claims it before its time; the dispatcher wakes
//!    for the earliest due time ahead (`DispatchStore::next_due_in`), so it goes out within
//!    moments of it, not a poll interval later. DeliverAfter is kept beside it for the views.
//! 2. **Scheduled = still ahead at arrival** ([`is_scheduled`]). Such a row takes part in
//!    neither flood consolidation nor escalation: it is never Held (a digest at its window's end
//!    would send it early) and opens or joins no incident (pages would fire before the
//!    notification itself went out). Both react to what arrives now; a scheduled row arrives
//!    for later, and is delivered on its own when due. A row whose time has passed on arrival
//!    is treated as any other.
//! 3. **Serve order.** It gets its serve turn when stored, as every row does, and keeps it like
//!    a row waiting out a retry delay: once due, priorities and the turns across sites
//!    (`domain::serve_order`) decide when it is claimed among the due rows.
//! 4. **Condition keys.** It is a waiting row like any other: a newer notification of its key
//!    supersedes it, ClearCondition ends it. Being the newest state of its key (by the site's
//!    enqueue time), it supersedes the older waiting ones when it arrives, as any keyed row does.
//! 5. **Waiting is not lateness.** Until its time it counts in the queue depth only: it is not
//!    stuck, not the oldest pending, not waiting out a retry. From its time on, its age counts
//!    from then ([`waiting_since`]).

use chrono::{DateTime, Utc};

use super::status::Status;

/// Whether a row with this `deliver_after`, arriving at `now`, is scheduled (rule 2).
pub fn is_scheduled(deliver_after: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
    deliver_after.is_some_and(|at| at > now)
}

/// Whether a row in `status` with this `deliver_after` is still waiting for its time at `now`:
/// what the "scheduled" filter selects and the views badge (only a Pending row waits so; one
/// retried or ended has had its time).
pub fn waits_for_its_time(
    status: Status,
    deliver_after: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> bool {
    status == Status::Pending && is_scheduled(deliver_after, now)
}

/// Since when a row has been waiting to be delivered (rule 5): its creation, or its
/// `deliver_after` when that is later.
pub fn waiting_since(
    created_at: DateTime<Utc>,
    deliver_after: Option<DateTime<Utc>>,
) -> DateTime<Utc> {
    deliver_after.map_or(created_at, |at| at.max(created_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn a_row_is_scheduled_only_while_its_time_is_ahead() {
        assert!(!is_scheduled(None, at(0)));
        assert!(is_scheduled(Some(at(1)), at(0)));
        assert!(!is_scheduled(Some(at(0)), at(0)), "due at its time");
        assert!(
            !is_scheduled(Some(at(-60)), at(0)),
            "its time passed at the site"
        );
        assert!(waits_for_its_time(Status::Pending, Some(at(1)), at(0)));
        assert!(!waits_for_its_time(Status::Cleared, Some(at(1)), at(0)));
    }

    #[test]
    fn a_scheduled_row_waits_from_its_time() {
        assert_eq!(waiting_since(at(0), None), at(0));
        assert_eq!(waiting_since(at(0), Some(at(3600))), at(3600));
        assert_eq!(
            waiting_since(at(0), Some(at(-60))),
            at(0),
            "arrived after its time"
        );
    }
}
