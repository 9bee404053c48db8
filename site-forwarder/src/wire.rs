//! The site's domain types as the protocol carries them, for every part that talks to central
//! or to the peer: the submit a buffered row becomes (the forwarder, replication, the
//! hand-over), a node's role, and a pending clear or acknowledgement. A bottom module: no transport, no buffer,
//! only `outbox_proto` and the domain, so the forwarder and the pair use it without reaching
//! up into the gRPC edge (`grpc::convert` keeps what only the local API converts). What comes
//! from a peer is checked here as the buffer would check its own; the error names the field.

use std::sync::Arc;

use outbox_proto::v1;

use crate::domain::{
    AckActor, BufferedNotification, CentralStatus, ConditionKey, ContentError, NodeView,
    NotificationId, PendingAck, PendingClear, Role, Seq, to_buffer_precision,
};

/// The submit for a buffered notification. Built from the stored row every time, so a resend
/// after a reconnect is identical to the first send (but for `cleared_at_site` once a clear
/// marked it, which is not content).
pub(crate) fn submit(n: &BufferedNotification) -> v1::NotificationSubmit {
    outbox_proto::submission::encode(n)
}

pub(crate) fn role_to_proto(role: Role) -> v1::NodeRole {
    match role {
        Role::Active => v1::NodeRole::Active,
        Role::Standby => v1::NodeRole::Standby,
    }
}

pub(crate) fn node_view_to_proto(view: &NodeView) -> v1::NodeRoleView {
    v1::NodeRoleView {
        node_name: view.name.clone(),
        role: role_to_proto(view.role).into(),
        term: view.term,
        send_addr: view.send_addr.clone(),
    }
}

/// A peer's description of itself; `None` when the role is not one this build knows.
pub(crate) fn node_view_from_proto(view: v1::NodeRoleView) -> Option<NodeView> {
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
pub(crate) fn clear_to_proto(clear: &PendingClear) -> v1::PendingClear {
    v1::PendingClear {
        condition_key: clear.condition_key.as_str().to_owned(),
        up_to_seq: clear.up_to.0,
        cleared_at: Some(outbox_proto::time::to_timestamp(clear.cleared_at)),
    }
}

/// A pending clear from the peer, checked as the buffer would check its own; the error names
/// the field.
pub(crate) fn clear_from_proto(clear: v1::PendingClear) -> Result<PendingClear, ContentError> {
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

/// A pending acknowledgement as the pair link carries it.
pub(crate) fn ack_to_proto(ack: &PendingAck) -> v1::PendingAck {
    v1::PendingAck {
        condition_key: ack.condition_key.as_str().to_owned(),
        up_to_seq: ack.up_to.0,
        acknowledged_at: Some(outbox_proto::time::to_timestamp(ack.acknowledged_at)),
        actor: ack.actor.as_str().to_owned(),
    }
}

/// A pending acknowledgement from the peer, checked as the buffer checks its own; the error
/// names the field.
pub(crate) fn ack_from_proto(ack: v1::PendingAck) -> Result<PendingAck, ContentError> {
    let condition_key = ConditionKey::parse(ack.condition_key, "condition_key")?;
    if ack.up_to_seq < 0 {
        return Err(ContentError::new("up_to_seq", "must not be negative"));
    }
    let at = ack
        .acknowledged_at
        .as_ref()
        .ok_or_else(|| ContentError::new("acknowledged_at", "is required"))?;
    let at = outbox_proto::time::from_timestamp(at)
        .ok_or_else(|| ContentError::new("acknowledged_at", "is not a valid timestamp"))?;
    let actor = AckActor::parse(&ack.actor, "actor")?;
    Ok(PendingAck {
        condition_key,
        up_to: Seq(ack.up_to_seq),
        acknowledged_at: to_buffer_precision(at),
        actor,
    })
}

/// A final status as central sent it, checked: the view must name a valid notification id and
/// say when central decided it. The view is kept encoded, as central sent it.
pub(crate) fn central_status_from_proto(
    change: v1::SiteStatusChange,
) -> Result<CentralStatus, String> {
    let view = change
        .view
        .ok_or_else(|| format!("status change {}: view: missing", change.seq))?;
    let notification_id = NotificationId::parse(&view.notification_id, "notification_id")
        .map_err(|e| format!("status change {}: {}", change.seq, e.problem))?;
    let decided_at = view
        .resolved_at
        .as_ref()
        .and_then(outbox_proto::time::from_timestamp)
        .ok_or_else(|| {
            format!(
                "status change {} of {notification_id}: resolved_at: missing or out of range",
                change.seq
            )
        })?;
    let condition_key = (!view.condition_key.is_empty()).then(|| view.condition_key.clone());
    Ok(CentralStatus {
        notification_id,
        central_seq: change.seq,
        condition_key,
        decided_at,
        view: Arc::from(prost::Message::encode_to_vec(&view)),
    })
}

/// A stored status as central sent it; `Err` names what is damaged.
pub(crate) fn central_status_to_proto(
    status: &CentralStatus,
) -> Result<v1::SiteStatusChange, String> {
    let view = view_of(status)?;
    Ok(v1::SiteStatusChange {
        seq: status.central_seq,
        view: Some(view),
    })
}

/// Central's view of the notification, decoded from what was stored.
pub(crate) fn view_of(status: &CentralStatus) -> Result<v1::NotificationStatusView, String> {
    <v1::NotificationStatusView as prost::Message>::decode(&status.view[..])
        .map_err(|e| format!("the stored status of {}: {e}", status.notification_id))
}

#[cfg(test)]
mod tests {
    use super::*;

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
