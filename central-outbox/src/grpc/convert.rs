//! Proto <-> domain conversions for central. Every inbound field is checked here (through the
//! content types' constructors) before anything reaches the store.

use outbox_proto::time::to_timestamp;
use outbox_proto::v1;

use crate::domain::status::Status;
use crate::records::{InsertOutcome, NotificationState, SiteStatusChange};

pub(crate) use outbox_proto::submission::{
    notification_type_to_proto, parse as submission, priority_to_proto,
};

pub(crate) fn ack(notification_id: String, outcome: InsertOutcome) -> v1::NotificationSubmitAck {
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

pub(crate) fn rejected(notification_id: String, reason: String) -> v1::NotificationSubmitAck {
    v1::NotificationSubmitAck {
        notification_id,
        outcome: v1::SubmitOutcome::Rejected.into(),
        reason,
    }
}

pub(crate) fn status_to_proto(status: Status) -> v1::NotificationStatus {
    match status {
        Status::Pending => v1::NotificationStatus::Pending,
        Status::Retrying => v1::NotificationStatus::Retrying,
        Status::Delivered => v1::NotificationStatus::Delivered,
        Status::Parked => v1::NotificationStatus::Parked,
        Status::Discarded => v1::NotificationStatus::Discarded,
        Status::Superseded => v1::NotificationStatus::Superseded,
        Status::Cleared => v1::NotificationStatus::Cleared,
        Status::Held => v1::NotificationStatus::Held,
        Status::Acknowledged => v1::NotificationStatus::Acknowledged,
    }
}

/// The status view of a row; `stuck` is the caller's judgement (it depends on the configured
/// threshold and the time of the answer).
pub(crate) fn state_view(state: NotificationState, stuck: bool) -> v1::NotificationStatusView {
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
        priority: priority_to_proto(state.priority).into(),
        condition_key: state.condition_key.unwrap_or_default(),
        deliver_after: state.deliver_after.map(to_timestamp),
        // What the row's detail shows as its targets; the status answer leaves it to the
        // detail, a site's status feed fills it (`site_status_change`).
        delivered_to: String::new(),
    }
}

/// A final status as the site status feed sends it.
pub(crate) fn site_status_change(change: SiteStatusChange) -> v1::SiteStatusChange {
    let mut view = state_view(change.state, false);
    view.delivered_to = change.delivered_to.unwrap_or_default();
    v1::SiteStatusChange {
        seq: change.seq,
        view: Some(view),
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
            priority: v1::NotificationPriority::High.into(),
            condition_key: "tank4.level.high".into(),
            cleared_at_site: None,
            deliver_after: None,
        }
    }

    #[test]
    fn accepts_a_valid_submit() {
        let accepted = submission(valid()).unwrap();
        assert_eq!(accepted.priority, crate::domain::Priority::High);
        let mut unspecified = valid();
        unspecified.priority = v1::NotificationPriority::Unspecified.into();
        let accepted = submission(unspecified).unwrap();
        assert_eq!(accepted.priority, crate::domain::Priority::Normal);
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
            ("priority", |m| m.priority = 9),
            ("condition_key", |m| m.condition_key = "tank 4".into()),
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
