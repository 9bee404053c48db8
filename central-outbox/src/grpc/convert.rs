//! Proto <-> domain conversions for central. Every inbound field is checked here (through the
//! content types' constructors) before anything reaches the store.

use outbox_proto::content::{ContentError, ScriptOrigin};
use outbox_proto::time::{from_timestamp, to_timestamp};
use outbox_proto::v1;

use crate::domain::status::Status;
use crate::domain::{NotificationContent, NotificationId, NotificationType, SiteId, Submission};
use crate::store::{InsertOutcome, NotificationState};

/// Checks a proto enum value for the `type` field. UNSPECIFIED and unknown values are rejected.
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

/// Validates a submit into a domain [`Submission`]; the error names the first bad field.
pub fn submission(msg: v1::NotificationSubmit) -> Result<Submission, ContentError> {
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
            from_timestamp(ts)
                .ok_or_else(|| ContentError::new("site_enqueued_at", "is not a valid timestamp"))
        })?;
    let origin = ScriptOrigin::parse(
        msg.source_instance_id,
        msg.source_script,
        msg.origin_execution_id.as_deref(),
        msg.origin_parent_execution_id.as_deref(),
    )?;
    Ok(Submission {
        id,
        content,
        provenance: origin.at_site(site, enqueued_at),
    })
}

pub fn ack(notification_id: String, outcome: InsertOutcome) -> v1::NotificationSubmitAck {
    match outcome {
        InsertOutcome::Accepted => v1::NotificationSubmitAck {
            notification_id,
            outcome: v1::SubmitOutcome::Accepted.into(),
            reason: String::new(),
        },
        InsertOutcome::Duplicate => v1::NotificationSubmitAck {
            notification_id,
            outcome: v1::SubmitOutcome::Duplicate.into(),
            reason: String::new(),
        },
        InsertOutcome::Conflict => rejected(
            notification_id,
            "conflict: this notification_id is already stored with different content".into(),
        ),
    }
}

pub fn rejected(notification_id: String, reason: String) -> v1::NotificationSubmitAck {
    v1::NotificationSubmitAck {
        notification_id,
        outcome: v1::SubmitOutcome::Rejected.into(),
        reason,
    }
}

pub fn status_to_proto(status: Status) -> v1::NotificationStatus {
    match status {
        Status::Pending => v1::NotificationStatus::Pending,
        Status::Retrying => v1::NotificationStatus::Retrying,
        Status::Delivered => v1::NotificationStatus::Delivered,
        Status::Parked => v1::NotificationStatus::Parked,
        Status::Discarded => v1::NotificationStatus::Discarded,
    }
}

/// The status view of a row; `stuck` is the caller's judgement (it depends on the configured
/// threshold and the time of the answer).
pub fn state_view(state: NotificationState, stuck: bool) -> v1::NotificationStatusView {
    v1::NotificationStatusView {
        notification_id: state.id.to_string(),
        status: status_to_proto(state.status).into(),
        r#type: notification_type_to_proto(state.kind).into(),
        list_name: state.list_name,
        source_site_id: state.source_site_id,
        retry_count: state.retry_count,
        last_error: state.last_error.unwrap_or_default(),
        created_at: Some(to_timestamp(state.created_at)),
        last_attempt_at: state.last_attempt_at.map(to_timestamp),
        next_attempt_at: state.next_attempt_at.map(to_timestamp),
        delivered_at: state.delivered_at.map(to_timestamp),
        site_enqueued_at: Some(to_timestamp(state.site_enqueued_at)),
        subject: state.subject,
        resolved_at: state.resolved_at.map(to_timestamp),
        stuck,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> v1::NotificationSubmit {
        v1::NotificationSubmit {
            notification_id: uuid::Uuid::new_v4().to_string(),
            r#type: v1::NotificationType::Email.into(),
            list_name: "ops".into(),
            subject: "Tank 4 high level".into(),
            body: "Level 97%".into(),
            type_data: String::new(),
            source_site_id: "site-a".into(),
            source_instance_id: "node-1".into(),
            source_script: "tank.py".into(),
            site_enqueued_at: Some(to_timestamp(chrono::Utc::now())),
            origin_execution_id: None,
            origin_parent_execution_id: None,
        }
    }

    #[test]
    fn accepts_a_valid_submit() {
        assert!(submission(valid()).is_ok());
    }

    #[test]
    fn each_bad_field_is_named() {
        type Breaker = fn(&mut v1::NotificationSubmit);
        let cases: Vec<(&str, Breaker)> = vec![
            ("notification_id", |m| m.notification_id = "x".into()),
            ("type", |m| m.r#type = 99),
            ("type", |m| m.r#type = 0),
            ("list_name", |m| m.list_name.clear()),
            ("subject", |m| m.subject = "a\nb".into()),
            ("body", |m| m.body.clear()),
            ("source_site_id", |m| m.source_site_id.clear()),
            ("site_enqueued_at", |m| m.site_enqueued_at = None),
            ("origin_execution_id", |m| {
                m.origin_execution_id = Some("nope".into())
            }),
        ];
        for (field, break_it) in cases {
            let mut msg = valid();
            break_it(&mut msg);
            assert_eq!(submission(msg).unwrap_err().field, field);
        }
    }
}
