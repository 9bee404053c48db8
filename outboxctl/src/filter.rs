//! Turns the filter flags into a `NotificationFilter`: status and priority names, channel, site,
//! list, creation-time bounds and subject keyword.
//!
//! Relative ages (`--since 1h`) are resolved against one `now` taken when the filter is built, so
//! every page of a listing and every call of a bulk action uses the same bounds (a page token is
//! only valid with the same filter).

use chrono::{DateTime, Utc};
use outbox_proto::time::to_timestamp;
use outbox_proto::v1;

use crate::args::SelectArgs;

/// The statuses an operator can filter on; FORWARDING exists only at a site.
const STATUSES: [(&str, v1::NotificationStatus); 9] = [
    ("pending", v1::NotificationStatus::Pending),
    ("held", v1::NotificationStatus::Held),
    ("retrying", v1::NotificationStatus::Retrying),
    ("delivered", v1::NotificationStatus::Delivered),
    ("parked", v1::NotificationStatus::Parked),
    ("discarded", v1::NotificationStatus::Discarded),
    ("superseded", v1::NotificationStatus::Superseded),
    ("cleared", v1::NotificationStatus::Cleared),
    ("acknowledged", v1::NotificationStatus::Acknowledged),
];

/// `parked`, `Parked` or `NOTIFICATION_STATUS_PARKED` (as grpcurl prints it).
pub(crate) fn parse_status(text: &str) -> Result<v1::NotificationStatus, String> {
    let lower = text.trim().to_ascii_lowercase();
    let short = lower.strip_prefix("notification_status_").unwrap_or(&lower);
    STATUSES
        .iter()
        .find(|(name, _)| *name == short)
        .map(|(_, status)| *status)
        .ok_or_else(|| {
            let names: Vec<&str> = STATUSES.iter().map(|(name, _)| *name).collect();
            format!(
                "unknown status {text:?} (expected one of {})",
                names.join(", ")
            )
        })
}

/// The priorities, most urgent first; UNSPECIFIED is not one (central refuses it in a filter).
const PRIORITIES: [(&str, v1::NotificationPriority); 4] = [
    ("critical", v1::NotificationPriority::Critical),
    ("high", v1::NotificationPriority::High),
    ("normal", v1::NotificationPriority::Normal),
    ("low", v1::NotificationPriority::Low),
];

/// `high`, `High` or `NOTIFICATION_PRIORITY_HIGH` (as grpcurl prints it).
pub(crate) fn parse_priority(text: &str) -> Result<v1::NotificationPriority, String> {
    let lower = text.trim().to_ascii_lowercase();
    let short = lower
        .strip_prefix("notification_priority_")
        .unwrap_or(&lower);
    PRIORITIES
        .iter()
        .find(|(name, _)| *name == short)
        .map(|(_, priority)| *priority)
        .ok_or_else(|| {
            let names: Vec<&str> = PRIORITIES.iter().map(|(name, _)| *name).collect();
            format!(
                "unknown priority {text:?} (expected one of {})",
                names.join(", ")
            )
        })
}

/// A `--since`/`--until` value: an instant, or an age to subtract from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeBound {
    At(DateTime<Utc>),
    Ago(std::time::Duration),
}

impl TimeBound {
    pub(crate) fn resolve(self, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
        match self {
            Self::At(at) => Ok(at),
            Self::Ago(age) => chrono::Duration::from_std(age)
                .ok()
                .and_then(|age| now.checked_sub_signed(age))
                .ok_or_else(|| format!("age {} is too large", humantime::format_duration(age))),
        }
    }
}

/// RFC 3339 (`2026-11-21T10:00:00Z`) or a humantime age (`90m`, `1h`, `2days`).
pub(crate) fn parse_time_bound(text: &str) -> Result<TimeBound, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(TimeBound::At(at.with_timezone(&Utc)));
    }
    humantime::parse_duration(text)
        .map(TimeBound::Ago)
        .map_err(|_| {
            format!(
                "{text:?} is neither an RFC 3339 timestamp (2026-11-21T10:00:00Z) \
                 nor an age such as 1h or 30m"
            )
        })
}

/// `list`'s flags that narrow to the rows waiting in a way (the bulk forms select Parked rows,
/// which wait in neither, and leave both off).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Only {
    /// `--stuck`: waiting longer than central's stuck threshold.
    pub stuck: bool,
    /// `--scheduled`: scheduled, still waiting for their time.
    pub scheduled: bool,
}

/// Builds the filter central applies. `statuses` and `only` come from `list` only; the bulk
/// forms select Parked rows and leave `only` off.
pub(crate) fn build(
    select: &SelectArgs,
    statuses: &[v1::NotificationStatus],
    only: Only,
    now: DateTime<Utc>,
) -> Result<v1::NotificationFilter, String> {
    let created_from = select
        .since
        .map(|bound| bound.resolve(now))
        .transpose()
        .map_err(|e| format!("--since: {e}"))?;
    let created_to = select
        .until
        .map(|bound| bound.resolve(now))
        .transpose()
        .map_err(|e| format!("--until: {e}"))?;
    if let (Some(from), Some(to)) = (created_from, created_to)
        && from >= to
    {
        return Err(format!(
            "--since ({}) must be before --until ({})",
            from.to_rfc3339(),
            to.to_rfc3339()
        ));
    }
    let mut statuses: Vec<i32> = statuses.iter().map(|s| i32::from(*s)).collect();
    statuses.sort_unstable();
    statuses.dedup();
    let mut priorities: Vec<i32> = select.priority.iter().map(|p| i32::from(*p)).collect();
    priorities.sort_unstable();
    priorities.dedup();
    Ok(v1::NotificationFilter {
        statuses,
        r#type: select
            .kind
            .map_or(v1::NotificationType::Unspecified, |k| k.proto())
            .into(),
        source_site_id: select.site.clone().unwrap_or_default(),
        list_name: select.list.clone().unwrap_or_default(),
        created_from: created_from.map(to_timestamp),
        created_to: created_to.map(to_timestamp),
        stuck_only: only.stuck,
        subject_contains: select.subject.clone().unwrap_or_default(),
        priorities,
        condition_key: select.condition_key.clone().unwrap_or_default(),
        scheduled_only: only.scheduled,
    })
}

/// One line saying what a filter selects, for the confirmation prompt.
pub(crate) fn describe(select: &SelectArgs) -> String {
    let mut parts = Vec::new();
    if let Some(kind) = select.kind {
        parts.push(format!(
            "type {}",
            crate::render::channel_name(kind.proto().into())
        ));
    }
    if !select.priority.is_empty() {
        // Most urgent first, each once, whatever order the flags came in: the proto values
        // run from CRITICAL (1) to LOW (4).
        let priorities: std::collections::BTreeSet<i32> =
            select.priority.iter().map(|p| i32::from(*p)).collect();
        let names: Vec<String> = priorities
            .into_iter()
            .map(crate::render::priority_name)
            .collect();
        parts.push(format!("priority {}", names.join(" or ")));
    }
    if let Some(site) = &select.site {
        parts.push(format!("site {site}"));
    }
    if let Some(key) = &select.condition_key {
        parts.push(format!("condition {key}"));
    }
    if let Some(list) = &select.list {
        parts.push(format!("list {list}"));
    }
    if select.since.is_some() {
        parts.push("created since the given time".into());
    }
    if select.until.is_some() {
        parts.push("created before the given time".into());
    }
    if let Some(subject) = &select.subject {
        parts.push(format!("subject containing {subject:?}"));
    }
    if parts.is_empty() {
        "all parked notifications".into()
    } else {
        format!("parked notifications with {}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn status_names_are_case_insensitive_and_accept_proto_names() {
        assert_eq!(parse_status("parked"), Ok(v1::NotificationStatus::Parked));
        assert_eq!(parse_status("PENDING"), Ok(v1::NotificationStatus::Pending));
        assert_eq!(
            parse_status("NOTIFICATION_STATUS_DISCARDED"),
            Ok(v1::NotificationStatus::Discarded)
        );
        assert_eq!(parse_status("held"), Ok(v1::NotificationStatus::Held));
        assert_eq!(
            parse_status("NOTIFICATION_STATUS_HELD"),
            Ok(v1::NotificationStatus::Held)
        );
        let err = parse_status("forwarding").unwrap_err();
        assert!(
            err.contains("pending, held, retrying, delivered, parked, discarded"),
            "{err}"
        );
        assert!(parse_status("bogus").is_err());
    }

    #[test]
    fn priority_names_are_case_insensitive_and_accept_proto_names() {
        assert_eq!(
            parse_priority("critical"),
            Ok(v1::NotificationPriority::Critical)
        );
        assert_eq!(parse_priority("LOW"), Ok(v1::NotificationPriority::Low));
        assert_eq!(
            parse_priority("NOTIFICATION_PRIORITY_HIGH"),
            Ok(v1::NotificationPriority::High)
        );
        let err = parse_priority("unspecified").unwrap_err();
        assert!(
            err.starts_with("unknown priority \"unspecified\"")
                && err.contains("critical, high, normal, low"),
            "{err}"
        );
        assert!(parse_priority("urgent").is_err());
    }

    #[test]
    fn time_bounds_are_rfc3339_or_an_age() {
        let at = parse_time_bound("2026-11-21T10:00:00+01:00").unwrap();
        assert_eq!(
            at,
            TimeBound::At("2026-11-21T09:00:00Z".parse::<DateTime<Utc>>().unwrap())
        );
        let now = "2026-11-21T12:00:00Z".parse::<DateTime<Utc>>().unwrap();
        let ago = parse_time_bound("1h").unwrap();
        assert_eq!(ago, TimeBound::Ago(Duration::from_secs(3600)));
        assert_eq!(
            ago.resolve(now).unwrap(),
            "2026-11-21T11:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        assert!(parse_time_bound("yesterday-ish").is_err());
    }

    #[test]
    fn builds_the_filter_from_flags() {
        let now = "2026-11-21T12:00:00Z".parse::<DateTime<Utc>>().unwrap();
        let select = SelectArgs {
            kind: Some(crate::args::ChannelArg::Email),
            site: Some("site-b".into()),
            condition_key: Some("tank4.level.high".into()),
            list: Some("ops".into()),
            since: Some(TimeBound::Ago(Duration::from_secs(7200))),
            until: None,
            subject: Some("tank".into()),
            priority: vec![
                v1::NotificationPriority::Low,
                v1::NotificationPriority::Critical,
                v1::NotificationPriority::Low,
            ],
        };
        let filter = build(
            &select,
            &[
                v1::NotificationStatus::Parked,
                v1::NotificationStatus::Pending,
                v1::NotificationStatus::Parked,
            ],
            Only {
                stuck: true,
                scheduled: true,
            },
            now,
        )
        .unwrap();
        assert_eq!(
            filter.statuses,
            vec![
                i32::from(v1::NotificationStatus::Pending),
                i32::from(v1::NotificationStatus::Parked)
            ]
        );
        assert_eq!(filter.r#type(), v1::NotificationType::Email);
        assert_eq!(filter.source_site_id, "site-b");
        assert_eq!(filter.condition_key, "tank4.level.high");
        assert_eq!(filter.list_name, "ops");
        assert_eq!(filter.created_from.unwrap().seconds, now.timestamp() - 7200);
        assert!(filter.created_to.is_none());
        assert!(filter.stuck_only && filter.scheduled_only);
        assert_eq!(filter.subject_contains, "tank");
        assert_eq!(
            filter.priorities,
            vec![
                i32::from(v1::NotificationPriority::Critical),
                i32::from(v1::NotificationPriority::Low)
            ]
        );
        assert_eq!(
            describe(&select),
            "parked notifications with type email, priority critical or low, \
             site site-b, condition tank4.level.high, list ops, created since the given time, \
             subject containing \"tank\""
        );
    }

    #[test]
    fn no_priority_flag_selects_every_priority() {
        let filter = build(&SelectArgs::default(), &[], Only::default(), Utc::now()).unwrap();
        assert!(filter.priorities.is_empty());
        assert!(!filter.scheduled_only && !filter.stuck_only);
    }

    #[test]
    fn an_empty_time_range_is_refused() {
        let now = Utc::now();
        let select = SelectArgs {
            since: Some(TimeBound::Ago(Duration::from_secs(60))),
            until: Some(TimeBound::Ago(Duration::from_secs(3600))),
            ..SelectArgs::default()
        };
        assert!(build(&select, &[], Only::default(), now).is_err());
    }
}
