//! A `NotificationSubmit` on the wire <-> a validated [`Submission`]. One home for both
//! directions: central decodes what sites forward, a site encodes its buffer rows for central,
//! and the two nodes of a site pair exchange rows in the same message, so a row crosses every
//! hop byte for byte and re-passes every content rule wherever it lands.

use chrono::{DateTime, Utc};

use crate::time::{from_timestamp, to_timestamp};
use crate::v1;
use outbox_domain::schedule;
use outbox_domain::{
    ConditionKey, ContentError, NotificationContent, NotificationId, NotificationType, Priority,
    ScriptOrigin, SiteId, Submission,
};

/// Checks a proto enum value for the `type` field. UNSPECIFIED and unknown values are rejected:
/// a submit always says what it is (a script's `Send` may leave it unset; the site fills it in).
pub fn notification_type(value: i32) -> Result<NotificationType, ContentError> {
    match v1::NotificationType::try_from(value) {
        Ok(v1::NotificationType::Email) => Ok(NotificationType::Email),
        Ok(v1::NotificationType::Webhook) => Ok(NotificationType::Webhook),
        Ok(v1::NotificationType::Unspecified) => Err(ContentError::new(
            "type",
            "must be set (NOTIFICATION_TYPE_EMAIL or NOTIFICATION_TYPE_WEBHOOK)",
        )),
        Err(_) => Err(ContentError::new(
            "type",
            format!("{value} is not a known notification type"),
        )),
    }
}

pub fn notification_type_to_proto(kind: NotificationType) -> v1::NotificationType {
    match kind {
        NotificationType::Email => v1::NotificationType::Email,
        NotificationType::Webhook => v1::NotificationType::Webhook,
    }
}

/// Checks a proto enum value for a `priority` field: UNSPECIFIED is NORMAL, an unknown value is
/// refused (a newer sender's priority this build cannot order must not pass as normal).
pub fn priority(value: i32, field: &'static str) -> Result<Priority, ContentError> {
    match v1::NotificationPriority::try_from(value) {
        Ok(v1::NotificationPriority::Unspecified | v1::NotificationPriority::Normal) => {
            Ok(Priority::Normal)
        }
        Ok(v1::NotificationPriority::Critical) => Ok(Priority::Critical),
        Ok(v1::NotificationPriority::High) => Ok(Priority::High),
        Ok(v1::NotificationPriority::Low) => Ok(Priority::Low),
        Err(_) => Err(ContentError::new(
            field,
            format!("{value} is not a known priority"),
        )),
    }
}

pub fn priority_to_proto(priority: Priority) -> v1::NotificationPriority {
    match priority {
        Priority::Critical => v1::NotificationPriority::Critical,
        Priority::High => v1::NotificationPriority::High,
        Priority::Normal => v1::NotificationPriority::Normal,
        Priority::Low => v1::NotificationPriority::Low,
    }
}

/// Validates a submit; the error names the first bad field.
pub fn parse(msg: v1::NotificationSubmit) -> Result<Submission, ContentError> {
    let id = NotificationId::parse(&msg.notification_id, "notification_id")?;
    let kind = notification_type(msg.r#type)?;
    let content =
        NotificationContent::parse(kind, msg.list_name, msg.subject, msg.body, msg.type_data)?;
    let site = SiteId::parse(msg.source_site_id)?;
    let enqueued_at = msg
        .site_enqueued_at
        .as_ref()
        .ok_or_else(|| ContentError::new("site_enqueued_at", "is required"))
        .and_then(|ts| {
            from_timestamp(ts).ok_or_else(|| {
                ContentError::new(
                    "site_enqueued_at",
                    "is not a valid timestamp (years 1 to 9999, nanos 0 to 999999999)",
                )
            })
        })?;
    let origin = ScriptOrigin::parse(
        msg.source_instance_id,
        msg.source_script,
        msg.origin_execution_id.as_deref(),
        msg.origin_parent_execution_id.as_deref(),
    )?;
    let priority = priority(msg.priority, "priority")?;
    let condition_key = ConditionKey::parse_optional(msg.condition_key, "condition_key")?;
    let cleared_at_site = optional_time(msg.cleared_at_site.as_ref(), "cleared_at_site")?;
    let deliver_after = schedule::deliver_after(
        optional_time(msg.deliver_after.as_ref(), schedule::FIELD)?,
        enqueued_at,
    )?;
    Ok(Submission {
        id,
        content,
        provenance: origin.at_site(site, enqueued_at),
        priority,
        condition_key,
        cleared_at_site,
        deliver_after,
    })
}

/// An optional timestamp field, checked; `field` names it for the error.
pub fn optional_time(
    ts: Option<&prost_types::Timestamp>,
    field: &'static str,
) -> Result<Option<DateTime<Utc>>, ContentError> {
    ts.map(|ts| {
        from_timestamp(ts).ok_or_else(|| ContentError::new(field, "is not a valid timestamp"))
    })
    .transpose()
}

/// The submit for a notification; [`parse`] gives back the same submission.
pub fn encode(submission: &Submission) -> v1::NotificationSubmit {
    let Submission {
        id,
        content,
        provenance: p,
        priority,
        condition_key,
        cleared_at_site,
        deliver_after,
    } = submission;
    v1::NotificationSubmit {
        notification_id: id.to_string(),
        r#type: notification_type_to_proto(content.kind).into(),
        list_name: content.list_name.as_str().to_owned(),
        subject: content.subject.as_str().to_owned(),
        body: content.body.as_str().to_owned(),
        type_data: content.type_data.as_str().to_owned(),
        source_site_id: p.source_site_id.as_str().to_owned(),
        source_instance_id: p.source_instance_id.clone(),
        source_script: p.source_script.clone(),
        site_enqueued_at: Some(to_timestamp(p.site_enqueued_at)),
        origin_execution_id: p.origin_execution_id.map(|u| u.hyphenated().to_string()),
        origin_parent_execution_id: p
            .origin_parent_execution_id
            .map(|u| u.hyphenated().to_string()),
        priority: priority_to_proto(*priority).into(),
        condition_key: condition_key
            .as_ref()
            .map(|k| k.as_str().to_owned())
            .unwrap_or_default(),
        cleared_at_site: cleared_at_site.map(to_timestamp),
        deliver_after: deliver_after.map(to_timestamp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submit(enqueued_at: DateTime<Utc>) -> v1::NotificationSubmit {
        v1::NotificationSubmit {
            notification_id: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
            r#type: v1::NotificationType::Email.into(),
            list_name: "ops".into(),
            subject: "Shift handover".into(),
            body: "Check the log book.".into(),
            source_site_id: "site-a".into(),
            site_enqueued_at: Some(to_timestamp(enqueued_at)),
            priority: v1::NotificationPriority::Normal.into(),
            ..Default::default()
        }
    }

    #[test]
    fn deliver_after_is_judged_against_the_sites_enqueue_time_and_round_trips() {
        let enqueued = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let mut msg = submit(enqueued);
        msg.deliver_after = Some(to_timestamp(enqueued + chrono::Duration::hours(8)));
        let parsed = parse(msg.clone()).unwrap();
        assert_eq!(
            parsed.deliver_after,
            Some(enqueued + chrono::Duration::hours(8))
        );
        assert_eq!(encode(&parsed), msg);

        // In the past of the enqueue time: due at once, and forwarded as such.
        msg.deliver_after = Some(to_timestamp(enqueued - chrono::Duration::hours(1)));
        let parsed = parse(msg).unwrap();
        assert_eq!(parsed.deliver_after, None);
        assert_eq!(encode(&parsed).deliver_after, None);

        let mut far = submit(enqueued);
        far.deliver_after = Some(to_timestamp(enqueued + chrono::Duration::days(45)));
        assert_eq!(
            parse(far).unwrap_err().to_string(),
            "deliver_after: is 45 days ahead, the limit is 30 days"
        );
        let mut bad = submit(enqueued);
        bad.deliver_after = Some(prost_types::Timestamp {
            seconds: 0,
            nanos: -1,
        });
        assert_eq!(parse(bad).unwrap_err().field, "deliver_after");
    }
}
