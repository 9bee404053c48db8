//! Proto <-> domain conversions for escalation: a list's policy (both ways, every inbound field
//! checked and named as the proto spells it, e.g. `list.escalation.steps`), and the incidents,
//! their pages and history, and an acknowledgement's outcome (out only).

use outbox_proto::submission::{priority, priority_to_proto};
use outbox_proto::time::{from_duration, to_duration, to_timestamp};
use outbox_proto::v1;

use super::convert::status_to_proto;
use crate::domain::ContentError;
use crate::domain::escalation::{
    EscalationPolicy, IncidentId, IncidentStatus, PagePlace, PolicyInput,
};
use crate::records::{IncidentDetail, IncidentQuery, IncidentView};

/// Most incidents one `ListIncidents` page holds, and how many an unset size means.
pub(crate) const MAX_INCIDENT_PAGE: u32 = 500;
const DEFAULT_INCIDENT_PAGE: u32 = 50;

/// The policy as the admin API shows it.
pub(crate) fn policy_view(policy: &EscalationPolicy) -> v1::ListEscalation {
    v1::ListEscalation {
        priorities: policy
            .priorities()
            .iter()
            .map(|p| priority_to_proto(*p).into())
            .collect(),
        acknowledge_within: Some(to_duration(policy.acknowledge_within())),
        steps: policy
            .steps()
            .iter()
            .map(|s| v1::EscalationStep {
                notify: s.notify.iter().map(|l| l.as_str().to_owned()).collect(),
                wait: Some(to_duration(s.wait)),
            })
            .collect(),
        repeat: policy.repeat(),
        repeat_from_step: policy.repeat_from_step(),
        escalate_on_park: Some(policy.escalate_on_park()),
        acknowledgement_reminder: policy.acknowledgement_reminder().map(to_duration),
        notify_acknowledgement: Some(policy.notify_acknowledgement()),
    }
}

/// Checks a list's policy from a request; errors name `list.escalation.<field>`.
pub(crate) fn policy_from_proto(msg: v1::ListEscalation) -> Result<EscalationPolicy, ContentError> {
    let duration = |d: Option<prost_types::Duration>, field: &'static str| {
        d.as_ref()
            .and_then(from_duration)
            .ok_or_else(|| ContentError::new(field, "is required (a non-negative duration)"))
    };
    let mut priorities = Vec::with_capacity(msg.priorities.len());
    for value in msg.priorities {
        if value == i32::from(v1::NotificationPriority::Unspecified) {
            return Err(ContentError::new(
                "list.escalation.priorities",
                "NOTIFICATION_PRIORITY_UNSPECIFIED is not a priority: name CRITICAL, HIGH or NORMAL",
            ));
        }
        priorities.push(priority(value, "list.escalation.priorities")?);
    }
    let mut steps = Vec::with_capacity(msg.steps.len());
    for (i, step) in msg.steps.into_iter().enumerate() {
        let wait = step.wait.as_ref().and_then(from_duration).ok_or_else(|| {
            ContentError::new(
                "list.escalation.steps",
                format!("step {}: wait is required", i + 2),
            )
        })?;
        steps.push((step.notify, wait));
    }
    let reminder = msg
        .acknowledgement_reminder
        .map(|d| duration(Some(d), "list.escalation.acknowledgement_reminder"))
        .transpose()?;
    EscalationPolicy::parse(PolicyInput {
        priorities,
        acknowledge_within: duration(msg.acknowledge_within, "list.escalation.acknowledge_within")?,
        steps,
        repeat: msg.repeat,
        repeat_from_step: (msg.repeat_from_step != 0).then_some(msg.repeat_from_step),
        escalate_on_park: msg.escalate_on_park,
        acknowledgement_reminder: reminder,
        notify_acknowledgement: msg.notify_acknowledgement,
    })
    .map_err(|e| ContentError::new(request_field(e.field), e.problem))
}

/// The request's name of a policy field the domain names.
fn request_field(field: &'static str) -> &'static str {
    match field {
        "escalation.priorities" => "list.escalation.priorities",
        "escalation.acknowledge_within" => "list.escalation.acknowledge_within",
        "escalation.steps" => "list.escalation.steps",
        "escalation.repeat" => "list.escalation.repeat",
        "escalation.repeat_from_step" => "list.escalation.repeat_from_step",
        "escalation.acknowledgement_reminder" => "list.escalation.acknowledgement_reminder",
        _ => "list.escalation",
    }
}

fn status_to_proto_incident(status: IncidentStatus) -> v1::IncidentStatus {
    match status {
        IncidentStatus::Open => v1::IncidentStatus::Open,
        IncidentStatus::Acknowledged => v1::IncidentStatus::Acknowledged,
        IncidentStatus::Exhausted => v1::IncidentStatus::Exhausted,
        IncidentStatus::Cleared => v1::IncidentStatus::Cleared,
        IncidentStatus::Discarded => v1::IncidentStatus::Discarded,
    }
}

fn place(page: PagePlace) -> v1::IncidentPagePlace {
    v1::IncidentPagePlace {
        round: page.round + 1,
        step: page.step,
    }
}

pub(crate) fn incident_view(incident: IncidentView) -> v1::Incident {
    let (next_page, next_due_at) = match incident.next {
        Some((page, due)) => (page.map(place), Some(to_timestamp(due))),
        None => (None, None),
    };
    let (acknowledged_by, acknowledged_via, acknowledged_at) = match incident.acknowledged {
        Some(ack) => (
            ack.by,
            ack.means.as_str().to_owned(),
            Some(to_timestamp(ack.at)),
        ),
        None => (String::new(), String::new(), None),
    };
    v1::Incident {
        id: incident.id.0,
        list_name: incident.list,
        source_site_id: incident.site,
        condition_key: incident.condition_key.unwrap_or_default(),
        priority: priority_to_proto(incident.priority).into(),
        alarm_notification_id: incident.alarm_id.to_string(),
        latest_notification_id: incident.latest_id.to_string(),
        subject: incident.subject,
        status: status_to_proto_incident(incident.status).into(),
        opened_at: Some(to_timestamp(incident.opened_at)),
        page_count: incident.page_count,
        last_page: Some(place(incident.last_page)),
        next_due_at,
        next_page,
        late_pages: incident.late_pages,
        acknowledged_by,
        acknowledged_via,
        acknowledged_at,
        ended_at: incident.ended_at.map(to_timestamp),
        policy: Some(policy_view(&incident.policy)),
    }
}

pub(crate) fn detail_view(detail: IncidentDetail) -> v1::IncidentDetail {
    v1::IncidentDetail {
        incident: Some(incident_view(detail.incident)),
        pages: detail
            .pages
            .into_iter()
            .map(|p| v1::IncidentPage {
                page_no: p.page_no,
                cycle: p.cycle,
                place: Some(place(p.page)),
                due_at: Some(to_timestamp(p.due_at)),
                fired_at: Some(to_timestamp(p.fired_at)),
                late_by: p.late_by.map(to_duration),
                lease_epoch: p.lease_epoch,
            })
            .collect(),
        history: detail
            .history
            .into_iter()
            .map(|h| v1::IncidentHistoryEntry {
                sequence: h.sequence,
                at: Some(to_timestamp(h.at)),
                kind: h.event.as_str().to_owned(),
                actor: h.actor,
                means: h.means.map(|m| m.as_str().to_owned()).unwrap_or_default(),
                from_address: h.from.unwrap_or_default(),
                detail: h.detail,
            })
            .collect(),
        notifications: detail
            .messages
            .into_iter()
            .map(|m| v1::IncidentNotification {
                notification_id: m.id.to_string(),
                list_name: m.list,
                page_no: m.page_no.unwrap_or(0),
                status: status_to_proto(m.status).into(),
            })
            .collect(),
    }
}

/// A `ListIncidents` request as a store query; errors name the field.
pub(crate) fn incident_query(msg: v1::ListIncidentsRequest) -> Result<IncidentQuery, ContentError> {
    let mut statuses = Vec::with_capacity(msg.statuses.len());
    for value in msg.statuses {
        let status = match v1::IncidentStatus::try_from(value) {
            Ok(v1::IncidentStatus::Open) => IncidentStatus::Open,
            Ok(v1::IncidentStatus::Acknowledged) => IncidentStatus::Acknowledged,
            Ok(v1::IncidentStatus::Exhausted) => IncidentStatus::Exhausted,
            Ok(v1::IncidentStatus::Cleared) => IncidentStatus::Cleared,
            Ok(v1::IncidentStatus::Discarded) => IncidentStatus::Discarded,
            Ok(v1::IncidentStatus::Unspecified) | Err(_) => {
                return Err(ContentError::new(
                    "statuses",
                    format!("{value} is not an incident status"),
                ));
            }
        };
        if !statuses.contains(&status) {
            statuses.push(status);
        }
    }
    let limit = match msg.page_size {
        0 => DEFAULT_INCIDENT_PAGE,
        n if n <= MAX_INCIDENT_PAGE => n,
        n => {
            return Err(ContentError::new(
                "page_size",
                format!("{n} is over the limit of {MAX_INCIDENT_PAGE}"),
            ));
        }
    };
    let before = match msg.page_token.as_str() {
        "" => None,
        token => Some(IncidentId(token.parse::<i64>().map_err(|_| {
            ContentError::new("page_token", "is not a token this service gave out")
        })?)),
    };
    Ok(IncidentQuery {
        statuses,
        late_only: msg.late_only,
        before,
        limit,
    })
}
