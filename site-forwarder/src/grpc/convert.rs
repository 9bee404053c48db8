//! Proto <-> domain conversions for the forwarder and its pair link. Every field of a `Send` is
//! checked here, through the content types' constructors, before anything reaches the buffer;
//! so is every pending clear a peer sends. The first bad field is named in the error.

use chrono::{DateTime, Utc};
use outbox_proto::time::to_timestamp;
use outbox_proto::v1;

use crate::domain::{
    BufferedNotification, BufferedStatus, ConditionKey, ContentError, NodeView,
    NotificationContent, NotificationId, NotificationType, PendingClear, Role, ScriptOrigin, Seq,
    SiteId, accepted_send, to_buffer_precision,
};

/// The `type` of a `Send`: UNSPECIFIED means EMAIL (scripts need not set it); values this build
/// does not know are rejected rather than guessed.
pub fn send_type(value: i32) -> Result<NotificationType, ContentError> {
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

pub fn type_to_proto(kind: NotificationType) -> v1::NotificationType {
    match kind {
        NotificationType::Email => v1::NotificationType::Email,
        NotificationType::Webhook => v1::NotificationType::Webhook,
    }
}

/// Validates a `Send` into a new notification with a fresh id, stamped with `site` and `now`.
pub fn send_request(
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
    Ok(accepted_send(
        content,
        origin,
        site.clone(),
        now,
        priority,
        condition_key,
    ))
}

/// The submit for a buffered notification. Built from the stored row every time, so a resend
/// after a reconnect is identical to the first send (but for `cleared_at_site` once a clear
/// marked it, which is not content).
pub fn submit(n: &BufferedNotification) -> v1::NotificationSubmit {
    outbox_proto::submission::encode(n)
}

/// The status view of a notification still in the local buffer: FORWARDING, or CLEARED once a
/// clear ended it (it reaches central as such and is never delivered).
pub fn buffered_view(
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
        ..Default::default()
    }
}

pub fn role_to_proto(role: Role) -> v1::NodeRole {
    match role {
        Role::Active => v1::NodeRole::Active,
        Role::Standby => v1::NodeRole::Standby,
    }
}

pub fn node_view_to_proto(view: &NodeView) -> v1::NodeRoleView {
    v1::NodeRoleView {
        node_name: view.name.clone(),
        role: role_to_proto(view.role).into(),
        term: view.term,
        send_addr: view.send_addr.clone(),
    }
}

/// A peer's description of itself; `None` when the role is not one this build knows.
pub fn node_view_from_proto(view: v1::NodeRoleView) -> Option<NodeView> {
    let role = match v1::NodeRole::try_from(view.role).ok()? {
        v1::NodeRole::Active => Role::Active,
        v1::NodeRole::Standby => Role::Standby,
        v1::NodeRole::Unspecified => return None,
    };
    Some(NodeView {
        name: view.node_name,
        role,
        term: view.term,
        send_addr: view.send_addr,
    })
}

/// A pending clear as the pair link carries it.
pub fn clear_to_proto(clear: &PendingClear) -> v1::PendingClear {
    v1::PendingClear {
        condition_key: clear.condition_key.as_str().to_owned(),
        up_to_seq: clear.up_to.0,
        cleared_at: Some(outbox_proto::time::to_timestamp(clear.cleared_at)),
    }
}

/// A pending clear from the peer, checked as the buffer would check its own; the error names
/// the field.
pub fn clear_from_proto(clear: v1::PendingClear) -> Result<PendingClear, ContentError> {
    let condition_key = ConditionKey::parse(clear.condition_key, "condition_key")?;
    if clear.up_to_seq < 0 {
        return Err(ContentError::new("up_to_seq", "must not be negative"));
    }
    let cleared_at = clear
        .cleared_at
        .as_ref()
        .ok_or_else(|| ContentError::new("cleared_at", "is required"))?;
    let cleared_at = outbox_proto::time::from_timestamp(cleared_at)
        .ok_or_else(|| ContentError::new("cleared_at", "is not a valid timestamp"))?;
    Ok(PendingClear {
        condition_key,
        up_to: Seq(clear.up_to_seq),
        // The precision the buffer keeps, so what is stored is what was sent.
        cleared_at: to_buffer_precision(cleared_at),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Priority;

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
        };
        let forwarding = buffered_view(id, view.clone(), &site());
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

    #[test]
    fn webhook_is_kept() {
        let mut msg = valid();
        msg.r#type = v1::NotificationType::Webhook.into();
        let n = send_request(msg, &site(), Utc::now()).unwrap();
        assert_eq!(n.content.kind, NotificationType::Webhook);
    }

    #[test]
    fn a_pending_clear_crosses_the_link_unchanged_and_a_bad_one_names_its_field() {
        let at = to_buffer_precision(chrono::Utc::now());
        let clear = PendingClear {
            condition_key: ConditionKey::parse("tank4.level.high".into(), "condition_key").unwrap(),
            up_to: Seq(42),
            cleared_at: at,
        };
        let wire = clear_to_proto(&clear);
        assert_eq!(clear_from_proto(wire.clone()).unwrap(), clear);
        let broken = [
            v1::PendingClear {
                condition_key: "tank 4".into(),
                ..wire.clone()
            },
            v1::PendingClear {
                up_to_seq: -1,
                ..wire.clone()
            },
            v1::PendingClear {
                cleared_at: None,
                ..wire.clone()
            },
            v1::PendingClear {
                cleared_at: Some(prost_types::Timestamp {
                    seconds: 0,
                    nanos: -1,
                }),
                ..wire
            },
        ];
        let fields: Vec<String> = broken
            .into_iter()
            .map(|bad| clear_from_proto(bad).unwrap_err().to_string())
            .collect();
        for (problem, field) in
            fields
                .iter()
                .zip(["condition_key:", "up_to_seq:", "cleared_at:", "cleared_at:"])
        {
            assert!(problem.starts_with(field), "{problem}");
        }
    }
}
