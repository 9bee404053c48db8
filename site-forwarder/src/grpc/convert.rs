//! Proto <-> domain conversions of the local `SiteNotify` API. Every field of a `Send` is checked
//! here, through the content types' constructors, before anything reaches the buffer. The first
//! bad field is named in the error. What the forwarder and the pair link convert too (the submit,
//! a role, a pending clear) is in `crate::wire`, below the edge.

use chrono::{DateTime, Utc};
use outbox_domain::schedule;
use outbox_proto::submission::optional_time;
use outbox_proto::time::to_timestamp;
use outbox_proto::v1;

use crate::domain::{
    BufferedNotification, BufferedStatus, ConditionKey, ContentError, NotificationContent,
    NotificationId, NotificationType, ScriptOrigin, SiteId, accepted_send, to_buffer_precision,
};

/// The `type` of a `Send`: UNSPECIFIED means EMAIL (scripts need not set it); values this build
/// does not know are rejected rather than guessed.
pub(crate) fn send_type(value: i32) -> Result<NotificationType, ContentError> {
    match v1::NotificationType::try_from(value) {
        Ok(v1::NotificationType::Unspecified | v1::NotificationType::Email) => {
            Ok(NotificationType::Email)
        }
        Ok(v1::NotificationType::Webhook) => Ok(NotificationType::Webhook),
        Err(_) => Err(ContentError::new(
            "type",
            format!("{value} is not a known notification type"),
        )),
    }
}

pub(crate) fn type_to_proto(kind: NotificationType) -> v1::NotificationType {
    match kind {
        NotificationType::Email => v1::NotificationType::Email,
        NotificationType::Webhook => v1::NotificationType::Webhook,
    }
}

/// Validates a `Send` into a new notification with a fresh id, stamped with `site` and `now`.
pub(crate) fn send_request(
    msg: v1::SendRequest,
    site: &SiteId,
    now: DateTime<Utc>,
) -> Result<BufferedNotification, ContentError> {
    let content = NotificationContent::parse(
        send_type(msg.r#type)?,
        msg.list_name,
        msg.subject,
        msg.body,
        msg.type_data,
    )?;
    let origin = ScriptOrigin::parse(
        msg.source_instance_id,
        msg.source_script,
        msg.origin_execution_id.as_deref(),
        msg.origin_parent_execution_id.as_deref(),
    )?;
    // The rule central applies to a submit: UNSPECIFIED is normal, a value this build does not
    // know is refused rather than buffered as something it is not.
    let priority = outbox_proto::submission::priority(msg.priority, "priority")?;
    let condition_key = ConditionKey::parse_optional(msg.condition_key, "condition_key")?;
    // Judged against the enqueue time as the buffer keeps it, as central judges it against the
    // forwarded one: a value the site accepts, central accepts.
    let enqueued_at = to_buffer_precision(now);
    let deliver_after = schedule::deliver_after(
        optional_time(msg.deliver_after.as_ref(), schedule::FIELD)?.map(to_buffer_precision),
        enqueued_at,
    )?;
    Ok(accepted_send(
        content,
        origin,
        site.clone(),
        enqueued_at,
        priority,
        condition_key,
        deliver_after,
    ))
}

/// The status view of a notification still in the local buffer: FORWARDING, or CLEARED once a
/// clear ended it (it reaches central as such and is never delivered).
pub(crate) fn buffered_view(
    id: NotificationId,
    view: BufferedStatus,
    site: &SiteId,
) -> v1::NotificationStatusView {
    let status = match view.cleared_at {
        Some(_) => v1::NotificationStatus::Cleared,
        None => v1::NotificationStatus::Forwarding,
    };
    v1::NotificationStatusView {
        notification_id: id.to_string(),
        status: status.into(),
        r#type: type_to_proto(view.kind).into(),
        list_name: view.list_name,
        source_site_id: site.as_str().to_owned(),
        site_enqueued_at: Some(to_timestamp(view.enqueued_at)),
        priority: outbox_proto::submission::priority_to_proto(view.priority).into(),
        condition_key: view.condition_key.unwrap_or_default(),
        deliver_after: view.deliver_after.map(to_timestamp),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Priority;
    use crate::wire::submit;

    fn valid() -> v1::SendRequest {
        v1::SendRequest {
            r#type: v1::NotificationType::Unspecified.into(),
            list_name: "ops".into(),
            subject: "Tank 4 high level".into(),
            body: "Level 97%".into(),
            type_data: String::new(),
            source_instance_id: "node-1".into(),
            source_script: "tank.py".into(),
            origin_execution_id: Some(uuid::Uuid::new_v4().to_string()),
            origin_parent_execution_id: None,
            priority: v1::NotificationPriority::Unspecified.into(),
            condition_key: String::new(),
            deliver_after: None,
        }
    }

    fn site() -> SiteId {
        SiteId::parse("site-a".into()).unwrap()
    }

    #[test]
    fn unspecified_type_means_email_and_fields_are_kept() {
        let now = Utc::now();
        let msg = valid();
        let origin = msg.origin_execution_id.clone();
        let n = send_request(msg, &site(), now).unwrap();
        assert_eq!(n.content.kind, NotificationType::Email);
        assert_eq!(n.content.subject.as_str(), "Tank 4 high level");
        assert_eq!(n.provenance.source_site_id.as_str(), "site-a");
        assert_eq!(
            n.provenance.site_enqueued_at.timestamp_millis(),
            now.timestamp_millis()
        );
        assert_eq!(n.priority, Priority::Normal, "unspecified means normal");
        assert_eq!(n.condition_key, None, "empty means none");
        assert_eq!(n.cleared_at_site, None);

        let submit = submit(&n);
        assert_eq!(submit.notification_id, n.id.to_string());
        assert_eq!(submit.r#type, i32::from(v1::NotificationType::Email));
        assert_eq!(submit.source_site_id, "site-a");
        assert_eq!(submit.origin_execution_id, origin);
        assert_eq!(submit.origin_parent_execution_id, None);
        assert_eq!(submit.priority(), v1::NotificationPriority::Normal);
        assert_eq!(submit.condition_key, "");
        assert_eq!(submit.cleared_at_site, None);
    }

    #[test]
    fn each_bad_field_is_named() {
        type Breaker = Box<dyn Fn(&mut v1::SendRequest)>;
        let cases: Vec<(&str, Breaker)> = vec![
            ("type", Box::new(|m| m.r#type = 99)),
            ("list_name", Box::new(|m| m.list_name.clear())),
            ("list_name", Box::new(|m| m.list_name = "l".repeat(129))),
            ("subject", Box::new(|m| m.subject.clear())),
            (
                "subject",
                Box::new(|m| m.subject = "a\r\nBcc: x@example.com".into()),
            ),
            ("subject", Box::new(|m| m.subject = "s".repeat(501))),
            ("body", Box::new(|m| m.body.clear())),
            ("body", Box::new(|m| m.body = "b".repeat(256 * 1024 + 1))),
            ("type_data", Box::new(|m| m.type_data = "[1]".into())),
            (
                "source_script",
                Box::new(|m| m.source_script = "a\nb".into()),
            ),
            (
                "origin_execution_id",
                Box::new(|m| m.origin_execution_id = Some("nope".into())),
            ),
            (
                "origin_parent_execution_id",
                Box::new(|m| m.origin_parent_execution_id = Some("nope".into())),
            ),
            ("priority", Box::new(|m| m.priority = 99)),
            ("priority", Box::new(|m| m.priority = -1)),
            (
                "condition_key",
                Box::new(|m| m.condition_key = "tank 4".into()),
            ),
            (
                "condition_key",
                Box::new(|m| m.condition_key = "k".repeat(129)),
            ),
        ];
        for (field, break_it) in cases {
            let mut msg = valid();
            break_it(&mut msg);
            let err = send_request(msg, &site(), Utc::now()).unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.to_string().starts_with(&format!("{field}: ")), "{err}");
        }
    }

    /// Each priority is kept from the `Send` through the submit central gets, and through the
    /// conversion a standby (replication) and an adopting active (hand-over) apply to the
    /// submits their peer sends: the row they store is the one the sender buffered.
    #[test]
    fn each_priority_survives_send_submit_and_the_peers_parse() {
        for (proto, priority) in [
            (v1::NotificationPriority::Critical, Priority::Critical),
            (v1::NotificationPriority::High, Priority::High),
            (v1::NotificationPriority::Normal, Priority::Normal),
            (v1::NotificationPriority::Low, Priority::Low),
        ] {
            let mut msg = valid();
            msg.priority = proto.into();
            let n = send_request(msg, &site(), Utc::now()).unwrap();
            assert_eq!(n.priority, priority);
            let submit = submit(&n);
            assert_eq!(submit.priority(), proto);
            let copied = outbox_proto::submission::parse(submit).unwrap();
            assert_eq!(copied, n);
        }
    }

    /// The condition key, and the clear mark a ClearCondition adds, reach central's submit and
    /// survive the peer's parse (a standby's copy, an adopted row) unchanged.
    #[test]
    fn the_condition_key_and_the_clear_mark_survive_send_submit_and_the_peers_parse() {
        let mut msg = valid();
        msg.condition_key = "tank4.level.high".into();
        let mut n = send_request(msg, &site(), Utc::now()).unwrap();
        assert_eq!(
            n.condition_key.as_ref().map(ConditionKey::as_str),
            Some("tank4.level.high")
        );
        let sent = submit(&n);
        assert_eq!(sent.condition_key, "tank4.level.high");
        assert_eq!(sent.cleared_at_site, None);
        assert_eq!(outbox_proto::submission::parse(sent).unwrap(), n);

        n.cleared_at_site = Some(crate::domain::to_buffer_precision(Utc::now()));
        let sent = submit(&n);
        assert!(sent.cleared_at_site.is_some());
        assert_eq!(outbox_proto::submission::parse(sent).unwrap(), n);
    }

    #[test]
    fn the_buffered_view_shows_priority_key_and_whether_it_was_cleared() {
        let id = NotificationId::generate();
        let view = BufferedStatus {
            kind: NotificationType::Email,
            list_name: "ops".into(),
            enqueued_at: Utc::now(),
            priority: Priority::High,
            condition_key: None,
            cleared_at: None,
            deliver_after: None,
        };
        let forwarding = buffered_view(id, view.clone(), &site());
        assert_eq!(forwarding.deliver_after, None);
        let due = Utc::now() + chrono::Duration::hours(1);
        let scheduled = buffered_view(
            id,
            BufferedStatus {
                deliver_after: Some(due),
                ..view.clone()
            },
            &site(),
        );
        assert_eq!(scheduled.status(), v1::NotificationStatus::Forwarding);
        assert_eq!(scheduled.deliver_after, Some(to_timestamp(due)));
        assert_eq!(forwarding.notification_id, id.to_string());
        assert_eq!(forwarding.priority(), v1::NotificationPriority::High);
        assert_eq!(forwarding.status(), v1::NotificationStatus::Forwarding);
        assert_eq!(forwarding.condition_key, "");

        let cleared = buffered_view(
            id,
            BufferedStatus {
                condition_key: Some("tank4.level.high".into()),
                cleared_at: Some(Utc::now()),
                ..view
            },
            &site(),
        );
        assert_eq!(cleared.status(), v1::NotificationStatus::Cleared);
        assert_eq!(cleared.condition_key, "tank4.level.high");
    }

    /// A scheduled Send keeps its time (at the buffer's precision) through the submit and the
    /// peer's parse; one in the past is due at once; one too far ahead is refused by name.
    #[test]
    fn deliver_after_is_kept_checked_and_survives_the_submit() {
        let now = Utc::now();
        let mut msg = valid();
        let due = now + chrono::Duration::hours(8);
        msg.deliver_after = Some(to_timestamp(due));
        let n = send_request(msg, &site(), now).unwrap();
        assert_eq!(n.deliver_after, Some(to_buffer_precision(due)));
        let sent = submit(&n);
        assert_eq!(
            sent.deliver_after,
            Some(to_timestamp(to_buffer_precision(due)))
        );
        assert_eq!(outbox_proto::submission::parse(sent).unwrap(), n);

        let mut past = valid();
        past.deliver_after = Some(to_timestamp(now - chrono::Duration::minutes(5)));
        assert_eq!(
            send_request(past, &site(), now).unwrap().deliver_after,
            None
        );

        let mut far = valid();
        far.deliver_after = Some(to_timestamp(now + chrono::Duration::days(41)));
        let err = send_request(far, &site(), now).unwrap_err();
        assert_eq!(err.field, "deliver_after");
        assert_eq!(
            err.to_string(),
            "deliver_after: is 41 days ahead, the limit is 30 days"
        );
    }

    #[test]
    fn webhook_is_kept() {
        let mut msg = valid();
        msg.r#type = v1::NotificationType::Webhook.into();
        let n = send_request(msg, &site(), Utc::now()).unwrap();
        assert_eq!(n.content.kind, NotificationType::Webhook);
    }
}
