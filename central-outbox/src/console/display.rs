//! How the console writes the admin API's values for people: upper-case enum names without
//! their prefix (as the contract and outboxctl show them), UTC times to the second, and ages
//! in the largest two units ("3m 12s").

use outbox_proto::time::from_timestamp;
use outbox_proto::v1;

/// A timestamp as `2026-05-01 08:00:03Z`; empty when unset.
pub(super) fn time(ts: Option<&prost_types::Timestamp>) -> String {
    ts.and_then(from_timestamp)
        .map(|at| at.format("%Y-%m-%d %H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// Whether the notification is still waiting for its scheduled time (PENDING with its
/// deliver_after ahead, `domain::schedule::waits_for_its_time`): the "scheduled" badge.
pub(super) fn waits_for_its_time(view: &v1::NotificationStatusView) -> bool {
    let deliver_after = view.deliver_after.as_ref().and_then(from_timestamp);
    let status = v1::NotificationStatus::try_from(view.status).ok();
    status == Some(v1::NotificationStatus::Pending)
        && crate::domain::schedule::is_scheduled(deliver_after, chrono::Utc::now())
}

/// An age in seconds as "2h 5m", "3m 12s" or "42s"; "—" when there is none.
pub(super) fn age(seconds: Option<f64>) -> String {
    let Some(seconds) = seconds.filter(|s| s.is_finite() && *s >= 0.0) else {
        return "—".into();
    };
    // Whole seconds: sub-second precision is noise on a dashboard. The cast saturates.
    let total = seconds.floor() as u64;
    let (d, h, m, s) = (
        total / 86_400,
        total / 3600 % 24,
        total / 60 % 60,
        total % 60,
    );
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

/// A duration as humantime writes it ("1m", "30s"); empty when unset.
pub(super) fn duration(d: Option<&prost_types::Duration>) -> String {
    d.and_then(outbox_proto::time::from_duration)
        .map(|d| humantime::format_duration(d).to_string())
        .unwrap_or_default()
}

fn strip(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_owned()
}

pub(super) fn status(value: i32) -> String {
    v1::NotificationStatus::try_from(value).map_or_else(
        |_| value.to_string(),
        |s| strip(s.as_str_name(), "NOTIFICATION_STATUS_"),
    )
}

pub(super) fn kind(value: i32) -> String {
    v1::NotificationType::try_from(value).map_or_else(
        |_| value.to_string(),
        |t| strip(t.as_str_name(), "NOTIFICATION_TYPE_"),
    )
}

pub(super) fn priority(value: i32) -> String {
    v1::NotificationPriority::try_from(value).map_or_else(
        |_| value.to_string(),
        |p| strip(p.as_str_name(), "NOTIFICATION_PRIORITY_"),
    )
}

pub(super) fn history_kind(value: i32) -> String {
    v1::HistoryEntryKind::try_from(value).map_or_else(
        |_| value.to_string(),
        |k| strip(k.as_str_name(), "HISTORY_ENTRY_KIND_"),
    )
}

pub(super) fn outcome(value: i32) -> String {
    match v1::AttemptOutcome::try_from(value) {
        Ok(v1::AttemptOutcome::Unspecified) => String::new(),
        Ok(o) => strip(o.as_str_name(), "ATTEMPT_OUTCOME_"),
        Err(_) => value.to_string(),
    }
}

/// A status callback entry's outcome and the status it told (`ANSWERED DELIVERED`); empty for
/// any other entry.
pub(super) fn callback_outcome(outcome: i32, status: i32) -> String {
    match v1::StatusCallbackOutcome::try_from(outcome) {
        Ok(v1::StatusCallbackOutcome::Unspecified) => String::new(),
        Ok(o) => format!(
            "{} {}",
            strip(o.as_str_name(), "STATUS_CALLBACK_OUTCOME_"),
            v1::NotificationStatus::try_from(status).map_or_else(
                |_| status.to_string(),
                |s| strip(s.as_str_name(), "NOTIFICATION_STATUS_")
            )
        ),
        Err(_) => outcome.to_string(),
    }
}

pub(super) fn role(value: i32) -> String {
    v1::NodeRole::try_from(value).map_or_else(
        |_| value.to_string(),
        |r| strip(r.as_str_name(), "NODE_ROLE_"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(age(None), "—");
        assert_eq!(age(Some(42.9)), "42s");
        assert_eq!(age(Some(192.0)), "3m 12s");
        assert_eq!(age(Some(7500.0)), "2h 5m");
        assert_eq!(age(Some(90_000.0)), "1d 1h");
        assert_eq!(age(Some(f64::NAN)), "—");
    }

    #[test]
    fn enum_names_lose_their_prefix() {
        assert_eq!(status(v1::NotificationStatus::Parked.into()), "PARKED");
        assert_eq!(kind(v1::NotificationType::Webhook.into()), "WEBHOOK");
        assert_eq!(
            history_kind(v1::HistoryEntryKind::OperatorRetry.into()),
            "OPERATOR_RETRY"
        );
        assert_eq!(outcome(0), "");
        assert_eq!(status(99), "99");
    }
}
