//! Turns a [`Report`](crate::commands::Report) into what the operator sees: aligned tables and
//! `key: value` blocks for people ([`human`]), or one JSON document for scripts ([`json`]).
//!
//! Both forms share the vocabulary defined here, so they never disagree: enum values by their
//! short lower-case names (`parked`, `delivery_attempt`, `starttls`), instants in RFC 3339 UTC.

pub(crate) mod human;
pub(crate) mod incident;
pub(crate) mod json;
pub(crate) mod table;

use chrono::{DateTime, SecondsFormat, Utc};
use outbox_proto::time::from_timestamp;
use outbox_proto::v1;

/// `NOTIFICATION_STATUS_PARKED` -> `parked`. A value this build does not know (a newer central)
/// shows as `unknown_<n>` rather than failing the whole command.
fn short_name(full: Option<&str>, prefix: &str, value: i32) -> String {
    match full {
        Some(full) => full
            .strip_prefix(prefix)
            .unwrap_or(full)
            .to_ascii_lowercase(),
        None => format!("unknown_{value}"),
    }
}

pub(crate) fn status_name(value: i32) -> String {
    let full = v1::NotificationStatus::try_from(value).ok();
    short_name(
        full.as_ref().map(|s| s.as_str_name()),
        "NOTIFICATION_STATUS_",
        value,
    )
}

pub(crate) fn channel_name(value: i32) -> String {
    let full = v1::NotificationType::try_from(value).ok();
    short_name(
        full.as_ref().map(|s| s.as_str_name()),
        "NOTIFICATION_TYPE_",
        value,
    )
}

/// UNSPECIFIED reads as normal: it is what a central that predates priorities answers, and it
/// treats every notification as normal.
pub(crate) fn priority_name(value: i32) -> String {
    match v1::NotificationPriority::try_from(value) {
        Ok(v1::NotificationPriority::Unspecified) => "normal".to_owned(),
        full => short_name(
            full.ok().as_ref().map(|p| p.as_str_name()),
            "NOTIFICATION_PRIORITY_",
            value,
        ),
    }
}

pub(crate) fn history_kind_name(value: i32) -> String {
    let full = v1::HistoryEntryKind::try_from(value).ok();
    short_name(
        full.as_ref().map(|s| s.as_str_name()),
        "HISTORY_ENTRY_KIND_",
        value,
    )
}

/// `None` for UNSPECIFIED: operator actions have no outcome.
pub(crate) fn outcome_name(value: i32) -> Option<String> {
    if value == i32::from(v1::AttemptOutcome::Unspecified) {
        return None;
    }
    let full = v1::AttemptOutcome::try_from(value).ok();
    Some(short_name(
        full.as_ref().map(|s| s.as_str_name()),
        "ATTEMPT_OUTCOME_",
        value,
    ))
}

/// A status callback entry's outcome (`ANSWERED`); `None` for any other entry.
pub(crate) fn callback_outcome_name(value: i32) -> Option<String> {
    if value == i32::from(v1::StatusCallbackOutcome::Unspecified) {
        return None;
    }
    let full = v1::StatusCallbackOutcome::try_from(value).ok();
    Some(short_name(
        full.as_ref().map(|s| s.as_str_name()),
        "STATUS_CALLBACK_OUTCOME_",
        value,
    ))
}

pub(crate) fn tls_name(value: i32) -> String {
    let full = v1::SmtpTlsMode::try_from(value).ok();
    short_name(
        full.as_ref().map(|s| s.as_str_name()),
        "SMTP_TLS_MODE_",
        value,
    )
}

/// The SMTP authentication; UNSPECIFIED reads as the contract's default for it (password with a
/// username, none without), which is what central would have applied.
pub(crate) fn auth_name(value: i32, username: &str) -> String {
    match v1::SmtpAuthMechanism::try_from(value) {
        Ok(v1::SmtpAuthMechanism::Unspecified) if username.is_empty() => "none".to_owned(),
        Ok(v1::SmtpAuthMechanism::Unspecified) => "password".to_owned(),
        full => short_name(
            full.ok().as_ref().map(|m| m.as_str_name()),
            "SMTP_AUTH_MECHANISM_",
            value,
        ),
    }
}

/// The retry backoff; UNSPECIFIED is FIXED, as the contract says.
pub(crate) fn backoff_name(value: i32) -> String {
    match v1::RetryBackoff::try_from(value) {
        Ok(v1::RetryBackoff::Unspecified) => "fixed".to_owned(),
        full => short_name(
            full.ok().as_ref().map(|b| b.as_str_name()),
            "RETRY_BACKOFF_",
            value,
        ),
    }
}

/// A webhook list's body format; UNSPECIFIED is GENERIC, as the contract says.
pub(crate) fn webhook_format_name(value: i32) -> String {
    match v1::WebhookFormat::try_from(value) {
        Ok(v1::WebhookFormat::Unspecified) => "generic".to_owned(),
        full => short_name(
            full.ok().as_ref().map(|f| f.as_str_name()),
            "WEBHOOK_FORMAT_",
            value,
        ),
    }
}

/// Whether a list delivers by webhook (endpoints, format, secret) rather than by email.
/// A site node's role: `active`, `standby`.
pub(crate) fn role_name(value: i32) -> String {
    let full = v1::NodeRole::try_from(value).ok();
    short_name(full.as_ref().map(|r| r.as_str_name()), "NODE_ROLE_", value)
}

pub(crate) fn is_webhook(list: &v1::NotificationList) -> bool {
    list.r#type == i32::from(v1::NotificationType::Webhook)
}

fn instant(ts: Option<&prost_types::Timestamp>) -> Option<DateTime<Utc>> {
    ts.and_then(from_timestamp)
}

/// Whether the notification is still waiting for its scheduled time at `now`: PENDING, with
/// its deliver_after ahead (central's "scheduled" filter selects the same rows).
pub(crate) fn waits_for_its_time(v: &v1::NotificationStatusView, now: DateTime<Utc>) -> bool {
    v.status == i32::from(v1::NotificationStatus::Pending)
        && instant(v.deliver_after.as_ref()).is_some_and(|at| at > now)
}

/// RFC 3339 UTC to the second, for tables; `-` when unset.
pub(crate) fn time_human(ts: Option<&prost_types::Timestamp>) -> String {
    instant(ts).map_or_else(
        || "-".to_owned(),
        |at| at.to_rfc3339_opts(SecondsFormat::Secs, true),
    )
}

/// RFC 3339 UTC with as many fractional digits as needed (proto3 JSON's form), for JSON.
pub(crate) fn time_json(ts: Option<&prost_types::Timestamp>) -> Option<String> {
    instant(ts).map(|at| at.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

/// "3m 12s", "2h 5m", "4d 1h": two units are plenty to judge how old something is.
pub(crate) fn age(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "0s".to_owned();
    }
    // Whole seconds: sub-second precision means nothing for an age shown to a person. The cast
    // saturates for absurd values, which is fine for display.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let s = seconds as u64;
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{sec}s"),
        (0, 0, _) => format!("{m}m {sec}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

/// How long ago `ts` was, humanised; `-` when unset.
pub(crate) fn age_since(now: DateTime<Utc>, ts: Option<&prost_types::Timestamp>) -> String {
    instant(ts).map_or_else(
        || "-".to_owned(),
        |at| {
            let millis = now.signed_duration_since(at).num_milliseconds();
            // i64 milliseconds to f64 seconds: exact far beyond any real age.
            #[allow(clippy::cast_precision_loss)]
            age(millis as f64 / 1000.0)
        },
    )
}

fn std_duration(d: Option<&prost_types::Duration>) -> Option<std::time::Duration> {
    let d = d?;
    let seconds = u64::try_from(d.seconds).ok()?;
    let nanos = u32::try_from(d.nanos).ok()?;
    Some(std::time::Duration::new(seconds, nanos))
}

/// `1m`, `300ms`, `1h 30m`: humantime's syntax, the one the flags take; `-` when unset.
pub(crate) fn duration_human(d: Option<&prost_types::Duration>) -> String {
    std_duration(d).map_or_else(
        || "-".to_owned(),
        |d| humantime::format_duration(d).to_string(),
    )
}

/// `60s`, `0.300s`: proto3 JSON's form for a Duration, which grpcurl prints too.
pub(crate) fn duration_json(d: Option<&prost_types::Duration>) -> Option<String> {
    std_duration(d).map(|d| {
        if d.subsec_nanos() == 0 {
            format!("{}s", d.as_secs())
        } else if d.subsec_nanos().is_multiple_of(1_000_000) {
            format!("{}.{:03}s", d.as_secs(), d.subsec_millis())
        } else {
            format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_values_have_short_lower_case_names() {
        assert_eq!(status_name(v1::NotificationStatus::Parked.into()), "parked");
        assert_eq!(channel_name(v1::NotificationType::Email.into()), "email");
        assert_eq!(
            history_kind_name(v1::HistoryEntryKind::OperatorRetry.into()),
            "operator_retry"
        );
        assert_eq!(
            outcome_name(v1::AttemptOutcome::TransientFailure.into()).as_deref(),
            Some("transient_failure")
        );
        assert_eq!(outcome_name(0), None);
        assert_eq!(tls_name(v1::SmtpTlsMode::Starttls.into()), "starttls");
        assert_eq!(status_name(99), "unknown_99");
        assert_eq!(
            auth_name(v1::SmtpAuthMechanism::Xoauth2.into(), "u"),
            "xoauth2"
        );
        assert_eq!(auth_name(0, "u"), "password");
        assert_eq!(auth_name(0, ""), "none");
        assert_eq!(
            backoff_name(v1::RetryBackoff::Exponential.into()),
            "exponential"
        );
        assert_eq!(backoff_name(0), "fixed");
        assert_eq!(
            webhook_format_name(v1::WebhookFormat::Teams.into()),
            "teams"
        );
        assert_eq!(webhook_format_name(0), "generic");
        assert_eq!(webhook_format_name(42), "unknown_42");
        assert_eq!(
            priority_name(v1::NotificationPriority::Critical.into()),
            "critical"
        );
        assert_eq!(priority_name(v1::NotificationPriority::Low.into()), "low");
        assert_eq!(priority_name(0), "normal");
        assert_eq!(priority_name(9), "unknown_9");
    }

    #[test]
    fn ages_use_two_units() {
        assert_eq!(age(0.4), "0s");
        assert_eq!(age(59.0), "59s");
        assert_eq!(age(192.0), "3m 12s");
        assert_eq!(age(7_500.0), "2h 5m");
        assert_eq!(age(4.0 * 86_400.0 + 3_700.0), "4d 1h");
        assert_eq!(age(-5.0), "0s");
    }

    #[test]
    fn instants_are_rfc3339_utc() {
        let ts = prost_types::Timestamp {
            seconds: 1_795_255_200,
            nanos: 250_000_000,
        };
        assert_eq!(time_human(Some(&ts)), "2026-11-21T10:00:00Z");
        assert_eq!(
            time_json(Some(&ts)).as_deref(),
            Some("2026-11-21T10:00:00.250Z")
        );
        assert_eq!(time_human(None), "-");
    }

    #[test]
    fn durations_match_the_flag_syntax_and_proto3_json() {
        let d = prost_types::Duration {
            seconds: 60,
            nanos: 0,
        };
        assert_eq!(duration_human(Some(&d)), "1m");
        assert_eq!(duration_json(Some(&d)).as_deref(), Some("60s"));
        let d = prost_types::Duration {
            seconds: 0,
            nanos: 300_000_000,
        };
        assert_eq!(duration_json(Some(&d)).as_deref(), Some("0.300s"));
    }
}
