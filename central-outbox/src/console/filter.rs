//! The notification list's filter as the console's form and URLs carry it (`status=PARKED&
//! site=north&from=2026-05-01T00:00&stuck=on&scheduled=on&page=...`), and its translation into the admin
//! API's `NotificationFilter`. Every field of QueryNotifications' filter has a form field here.
//!
//! Only the shape is checked here (a time that is not a time, a status name that does not
//! exist), each error naming the form field; everything else (lengths, FORWARDING, a page
//! token for another filter) is left to the admin API, whose message the page shows.

use chrono::{DateTime, NaiveDateTime, Utc};
use outbox_proto::time::to_timestamp;
use outbox_proto::v1;

/// A form field that cannot be read, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub(super) struct FieldError {
    pub field: &'static str,
    pub problem: String,
}

fn field_error(field: &'static str, problem: impl Into<String>) -> FieldError {
    FieldError {
        field,
        problem: problem.into(),
    }
}

/// The statuses the form offers (upper-case, as the API names them without the prefix).
/// FORWARDING is left out: it exists only at a site.
pub(super) const STATUSES: [&str; 9] = [
    "PENDING",
    "RETRYING",
    "HELD",
    "DELIVERED",
    "PARKED",
    "DISCARDED",
    "SUPERSEDED",
    "CLEARED",
    "ACKNOWLEDGED",
];

pub(super) const TYPES: [&str; 2] = ["EMAIL", "WEBHOOK"];

pub(super) const PRIORITIES: [&str; 4] = ["CRITICAL", "HIGH", "NORMAL", "LOW"];

/// The filter form's fields as given (text, so a bad value is shown back as typed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct FilterForm {
    pub statuses: Vec<String>,
    pub kind: String,
    pub site: String,
    pub list: String,
    pub from: String,
    pub to: String,
    pub stuck: bool,
    /// Only scheduled notifications still waiting for their time.
    pub scheduled: bool,
    pub subject: String,
    pub priorities: Vec<String>,
    pub condition: String,
    /// The next page's token from the previous page; empty for the first.
    pub page: String,
}

impl FilterForm {
    /// From `key=value` pairs (a query string or a posted form); unknown keys are ignored.
    pub(super) fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut form = Self::default();
        for (key, value) in pairs {
            let value = value.trim();
            match key {
                // A select may send an empty "any" choice: it adds nothing.
                "status" if !value.is_empty() => form.statuses.push(value.to_uppercase()),
                "priority" if !value.is_empty() => form.priorities.push(value.to_uppercase()),
                "type" => form.kind = value.to_uppercase(),
                "site" => form.site = value.to_owned(),
                "list" => form.list = value.to_owned(),
                "from" => form.from = value.to_owned(),
                "to" => form.to = value.to_owned(),
                "stuck" => form.stuck = !value.is_empty(),
                "scheduled" => form.scheduled = !value.is_empty(),
                "subject" => form.subject = value.to_owned(),
                "condition" => form.condition = value.to_owned(),
                "page" => form.page = value.to_owned(),
                _ => {}
            }
        }
        form
    }

    /// The admin API's filter, or the first field that cannot be read.
    pub(super) fn to_proto(&self) -> Result<v1::NotificationFilter, FieldError> {
        let statuses = self
            .statuses
            .iter()
            .map(|name| {
                v1::NotificationStatus::from_str_name(&format!("NOTIFICATION_STATUS_{name}"))
                    .filter(|s| *s != v1::NotificationStatus::Unspecified)
                    .map(i32::from)
                    .ok_or_else(|| {
                        field_error(
                            "status",
                            format!(
                                "{name:?} is not a status; use one of {}",
                                STATUSES.join(", ")
                            ),
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let kind = match self.kind.as_str() {
            "" => v1::NotificationType::Unspecified,
            name => v1::NotificationType::from_str_name(&format!("NOTIFICATION_TYPE_{name}"))
                .filter(|t| *t != v1::NotificationType::Unspecified)
                .ok_or_else(|| {
                    field_error(
                        "type",
                        format!("{name:?} is not a type; use {}", TYPES.join(" or ")),
                    )
                })?,
        };
        let priorities = self
            .priorities
            .iter()
            .map(|name| {
                v1::NotificationPriority::from_str_name(&format!("NOTIFICATION_PRIORITY_{name}"))
                    .filter(|p| *p != v1::NotificationPriority::Unspecified)
                    .map(i32::from)
                    .ok_or_else(|| {
                        field_error(
                            "priority",
                            format!(
                                "{name:?} is not a priority; use one of {}",
                                PRIORITIES.join(", ")
                            ),
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(v1::NotificationFilter {
            statuses,
            r#type: kind.into(),
            source_site_id: self.site.clone(),
            list_name: self.list.clone(),
            created_from: parse_time(&self.from, "from")?.map(to_timestamp),
            created_to: parse_time(&self.to, "to")?.map(to_timestamp),
            stuck_only: self.stuck,
            subject_contains: self.subject.clone(),
            priorities,
            condition_key: self.condition.clone(),
            scheduled_only: self.scheduled,
        })
    }

    /// Whether the filter selects Parked rows only: the bulk actions are offered then.
    pub(super) fn parked_only(&self) -> bool {
        self.statuses.iter().all(|s| s == "PARKED")
            && !self.statuses.is_empty()
            && !self.stuck
            && !self.scheduled
    }

    /// The filter as `key=value` pairs, without the page token.
    pub(super) fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs: Vec<(&'static str, String)> = self
            .statuses
            .iter()
            .map(|s| ("status", s.clone()))
            .collect();
        for (key, value) in [
            ("type", &self.kind),
            ("site", &self.site),
            ("list", &self.list),
            ("from", &self.from),
            ("to", &self.to),
            ("subject", &self.subject),
            ("condition", &self.condition),
        ] {
            if !value.is_empty() {
                pairs.push((key, value.clone()));
            }
        }
        pairs.extend(self.priorities.iter().map(|p| ("priority", p.clone())));
        if self.stuck {
            pairs.push(("stuck", "on".into()));
        }
        if self.scheduled {
            pairs.push(("scheduled", "on".into()));
        }
        pairs
    }

    /// The filter as a query string (without `?`), with `page` when given.
    pub(super) fn query_string(&self, page: Option<&str>) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        for (key, value) in self.pairs() {
            query.append_pair(key, &value);
        }
        if let Some(page) = page {
            query.append_pair("page", page);
        }
        query.finish()
    }

    pub(super) fn has_status(&self, name: &str) -> bool {
        self.statuses.iter().any(|s| s == name)
    }

    pub(super) fn has_priority(&self, name: &str) -> bool {
        self.priorities.iter().any(|p| p == name)
    }
}

/// A time as the form gives it: RFC 3339 (`2026-05-01T08:00:00Z`), or a browser's
/// `datetime-local` value (`2026-05-01T08:00`, with or without seconds) read as UTC.
fn parse_time(text: &str, field: &'static str) -> Result<Option<DateTime<Utc>>, FieldError> {
    if text.is_empty() {
        return Ok(None);
    }
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(Some(at.with_timezone(&Utc)));
    }
    [
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%d %H:%M:%S",
    ]
    .iter()
    .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())
    .map(|naive| Some(naive.and_utc()))
    .ok_or_else(|| {
        field_error(
            field,
            format!(
                "{text:?} is not a time; write it as 2026-05-01T08:00 (UTC) or in RFC 3339 \
                     (2026-05-01T08:00:00+02:00)"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn form(query: &str) -> FilterForm {
        let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        FilterForm::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    #[test]
    fn every_field_reaches_the_api_filter() {
        let filter = form(
            "status=PARKED&status=retrying&type=email&site=north&list=ops&from=2026-05-01T08:00\
             &to=2026-05-02T00:00:00Z&stuck=on&subject=Tank&priority=HIGH&condition=tank4.level\
             &scheduled=on",
        )
        .to_proto()
        .unwrap();
        assert_eq!(
            filter.statuses,
            vec![
                i32::from(v1::NotificationStatus::Parked),
                i32::from(v1::NotificationStatus::Retrying)
            ]
        );
        assert_eq!(filter.r#type, i32::from(v1::NotificationType::Email));
        assert_eq!(
            (filter.source_site_id.as_str(), filter.list_name.as_str()),
            ("north", "ops")
        );
        let from = filter.created_from.unwrap();
        assert_eq!(
            outbox_proto::time::from_timestamp(&from)
                .unwrap()
                .to_rfc3339(),
            "2026-05-01T08:00:00+00:00"
        );
        assert!(filter.created_to.is_some() && filter.stuck_only);
        assert_eq!(filter.subject_contains, "Tank");
        assert_eq!(
            filter.priorities,
            vec![i32::from(v1::NotificationPriority::High)]
        );
        assert_eq!(filter.condition_key, "tank4.level");
        assert!(filter.scheduled_only);
    }

    #[test]
    fn an_empty_form_filters_nothing() {
        assert_eq!(
            form("status=&type=&site=&page=").to_proto().unwrap(),
            v1::NotificationFilter::default()
        );
    }

    #[test]
    fn a_malformed_value_names_its_field() {
        for (query, field) in [
            ("from=notatime", "from"),
            ("to=2026-13-01T00:00", "to"),
            ("status=LOST", "status"),
            ("status=UNSPECIFIED", "status"),
            ("type=FAX", "type"),
            ("priority=URGENT", "priority"),
        ] {
            assert_eq!(form(query).to_proto().unwrap_err().field, field, "{query}");
        }
    }

    #[test]
    fn the_query_string_round_trips_and_bulk_needs_parked_only() {
        let original = form("status=PARKED&site=north%20%26%20co&subject=a+b");
        assert!(original.parked_only());
        let again = form(&original.query_string(Some("tok")));
        assert_eq!(again.page, "tok");
        assert_eq!(
            FilterForm {
                page: String::new(),
                ..again
            },
            original
        );
        assert!(!form("status=PARKED&status=PENDING").parked_only());
        assert!(!form("status=PARKED&scheduled=on").parked_only());
        let scheduled = form("scheduled=on");
        assert_eq!(form(&scheduled.query_string(None)), scheduled);
        assert!(!form("").parked_only());
    }
}
