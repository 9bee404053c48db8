//! Scheduled delivery: a notification may say when it is to be delivered at the earliest
//! (`deliver_after`). The rule, checked wherever a notification is accepted (a site's `Send`,
//! central's ingest), against the site's enqueue time so that both ends judge the same value
//! alike whatever their clocks say:
//!
//! - unset, or at or before the enqueue time: not scheduled, due at once (`None`);
//! - up to [`MAX_DELIVER_AFTER`] after the enqueue time: scheduled for that instant;
//! - further ahead: refused, naming the field and the limit.
//!
//! Not content: a resubmit that differs only in it is the same notification, and the stored
//! time stands (as for the priority).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::limits::MAX_DELIVER_AFTER;
use crate::{ContentError, Result};

/// The wire field the rule is about.
pub const FIELD: &str = "deliver_after";

/// `deliver_after` as a notification enqueued at `enqueued_at` may carry it (see the module
/// documentation): `None` when it is due at once.
pub fn deliver_after(
    at: Option<DateTime<Utc>>,
    enqueued_at: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>> {
    let Some(at) = at.filter(|at| *at > enqueued_at) else {
        return Ok(None);
    };
    let ahead = (at - enqueued_at).to_std().unwrap_or(Duration::MAX);
    if ahead > MAX_DELIVER_AFTER {
        return Err(ContentError::new(
            FIELD,
            format!(
                "is {} ahead, the limit is {}",
                span(ahead),
                span(MAX_DELIVER_AFTER)
            ),
        ));
    }
    Ok(Some(at))
}

/// A span as people read it, rounded up to whole seconds so that a value just past the limit
/// never reads as the limit itself: `45 days`, `30 days 1 s`, `2 h 5 min`.
fn span(d: Duration) -> String {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let (days, hours, mins, secs) = (
        secs / 86_400,
        secs % 86_400 / 3600,
        secs % 3600 / 60,
        secs % 60,
    );
    let mut parts = Vec::new();
    match days {
        0 => {}
        1 => parts.push("1 day".to_owned()),
        n => parts.push(format!("{n} days")),
    }
    for (value, unit) in [(hours, "h"), (mins, "min"), (secs, "s")] {
        if value > 0 {
            parts.push(format!("{value} {unit}"));
        }
    }
    if parts.is_empty() {
        return "0 s".to_owned();
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn unset_or_not_after_the_enqueue_time_is_due_at_once() {
        assert_eq!(deliver_after(None, at(0)), Ok(None));
        assert_eq!(deliver_after(Some(at(0)), at(0)), Ok(None));
        assert_eq!(deliver_after(Some(at(-3600)), at(0)), Ok(None));
        assert_eq!(deliver_after(Some(at(3)), at(0)), Ok(Some(at(3))));
    }

    #[test]
    fn up_to_the_limit_ahead_is_kept_and_further_is_refused_naming_both() {
        let limit = i64::try_from(MAX_DELIVER_AFTER.as_secs()).unwrap();
        assert_eq!(
            deliver_after(Some(at(limit)), at(0)),
            Ok(Some(at(limit))),
            "the limit itself is allowed"
        );
        let err = deliver_after(Some(at(45 * 86_400)), at(0)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "deliver_after: is 45 days ahead, the limit is 30 days"
        );
        let err = deliver_after(Some(at(limit + 1)), at(0)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "deliver_after: is 30 days 1 s ahead, the limit is 30 days"
        );
        // Just under 41 days (the sender's clock read a moment before the site's) reads as 41.
        let just_under = at(41 * 86_400) - chrono::Duration::milliseconds(3);
        let err = deliver_after(Some(just_under), at(0)).unwrap_err();
        assert!(err.to_string().contains("is 41 days ahead"), "{err}");
    }

    #[test]
    fn spans_read_as_people_write_them() {
        assert_eq!(span(Duration::from_secs(86_400)), "1 day");
        assert_eq!(span(Duration::from_secs(7_500)), "2 h 5 min");
        assert_eq!(span(Duration::from_millis(1)), "1 s");
        assert_eq!(span(Duration::ZERO), "0 s");
    }
}
