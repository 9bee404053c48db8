//! Incidents of escalating lists, in both forms: a table and `key  value` blocks for people,
//! JSON for scripts (the conventions of [`super::json`]: proto field names, short lower-case
//! enum names, RFC 3339 instants, `null` for what is unset).

use chrono::{DateTime, Utc};
use outbox_proto::v1;
use serde_json::{Value, json};

use super::table::{Table, truncate};
use super::{
    age_since, duration_human, duration_json, priority_name, status_name, time_human, time_json,
};

/// `INCIDENT_STATUS_OPEN` -> `open`.
pub(crate) fn incident_status_name(value: i32) -> String {
    let full = v1::IncidentStatus::try_from(value).ok();
    super::short_name(
        full.as_ref().map(|s| s.as_str_name()),
        "INCIDENT_STATUS_",
        value,
    )
}

fn place(p: Option<&v1::IncidentPagePlace>) -> String {
    p.map_or_else(
        || "-".to_owned(),
        |p| format!("step {} of round {}", p.step, p.round),
    )
}

/// What an open incident waits for, in words.
fn next(i: &v1::Incident) -> String {
    match (&i.next_due_at, &i.next_page) {
        (None, _) => "-".to_owned(),
        (Some(due), Some(page)) => format!("{} at {}", place(Some(page)), time_human(Some(due))),
        (Some(due), None) if i.status() == v1::IncidentStatus::Acknowledged => {
            format!("reminder at {}", time_human(Some(due)))
        }
        (Some(due), None) => format!("exhausted at {}", time_human(Some(due))),
    }
}

pub(crate) fn list_text(r: &v1::ListIncidentsResponse, now: DateTime<Utc>) -> String {
    if r.incidents.is_empty() {
        return "no incidents match\n".to_owned();
    }
    let mut table = Table::new(&[
        "ID", "STATUS", "PRIORITY", "SITE", "LIST", "PAGES", "LATE", "OPENED", "NEXT", "SUBJECT",
    ]);
    for i in &r.incidents {
        table.row(vec![
            i.id.to_string(),
            incident_status_name(i.status),
            priority_name(i.priority),
            i.source_site_id.clone(),
            i.list_name.clone(),
            i.page_count.to_string(),
            i.late_pages.to_string(),
            format!("{} ago", age_since(now, i.opened_at.as_ref())),
            next(i),
            truncate(&i.subject, 60),
        ]);
    }
    let mut out = table.render();
    if !r.next_page_token.is_empty() {
        out.push_str(&format!("more: --page-token {}\n", r.next_page_token));
    }
    out
}

pub(crate) fn detail_text(d: &v1::IncidentDetail) -> String {
    let Some(i) = &d.incident else {
        return "the answer held no incident\n".to_owned();
    };
    let mut out = String::new();
    let fields = [
        ("incident", i.id.to_string()),
        ("status", incident_status_name(i.status)),
        ("priority", priority_name(i.priority)),
        ("site", i.source_site_id.clone()),
        ("list", i.list_name.clone()),
        ("condition key", or_dash(&i.condition_key)),
        ("subject", i.subject.clone()),
        ("alarm", i.alarm_notification_id.clone()),
        ("latest", i.latest_notification_id.clone()),
        ("opened", time_human(i.opened_at.as_ref())),
        ("pages", format!("{} ({} late)", i.page_count, i.late_pages)),
        ("next", next(i)),
        (
            "acknowledged",
            if i.acknowledged_by.is_empty() {
                "-".to_owned()
            } else {
                format!(
                    "by {} via {} at {}",
                    i.acknowledged_by,
                    i.acknowledged_via,
                    time_human(i.acknowledged_at.as_ref())
                )
            },
        ),
        ("ended", time_human(i.ended_at.as_ref())),
    ];
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in fields {
        out.push_str(&format!("{key:<width$}  {value}\n"));
    }
    if let Some(p) = &i.policy {
        out.push_str(&format!("\npolicy\n{}", policy_text(p, &i.list_name)));
    }
    out.push_str("\npages\n");
    let mut pages = Table::new(&["PAGE", "CYCLE", "PLACE", "DUE", "FIRED", "LATE BY", "EPOCH"]);
    for p in &d.pages {
        pages.row(vec![
            p.page_no.to_string(),
            p.cycle.to_string(),
            place(p.place.as_ref()),
            time_human(p.due_at.as_ref()),
            time_human(p.fired_at.as_ref()),
            duration_human(p.late_by.as_ref()),
            p.lease_epoch.to_string(),
        ]);
    }
    out.push_str(&pages.render());
    out.push_str("\nnotifications\n");
    let mut rows = Table::new(&["PAGE", "LIST", "STATUS", "ID"]);
    for n in &d.notifications {
        rows.row(vec![
            match n.page_no {
                0 => "joined".to_owned(),
                page => page.to_string(),
            },
            n.list_name.clone(),
            status_name(n.status),
            n.notification_id.clone(),
        ]);
    }
    out.push_str(&rows.render());
    out.push_str("\nhistory\n");
    for h in &d.history {
        let means = if h.means.is_empty() {
            String::new()
        } else if h.from_address.is_empty() {
            format!(" via {}", h.means)
        } else {
            format!(" via {} from {}", h.means, h.from_address)
        };
        out.push_str(&format!(
            "{:>3}  {}  {:<17}  {}{}: {}\n",
            h.sequence,
            time_human(h.at.as_ref()),
            h.kind,
            h.actor,
            means,
            h.detail
        ));
    }
    out
}

/// The policy as a callout: one line per step.
pub(crate) fn policy_text(p: &v1::ListEscalation, list: &str) -> String {
    let priorities: Vec<String> = p.priorities.iter().map(|v| priority_name(*v)).collect();
    let mut out = format!("  alarms at {}\n", priorities.join(", "));
    out.push_str(&format!(
        "  step 1: {list} (the alarm), then wait {}\n",
        duration_human(p.acknowledge_within.as_ref())
    ));
    for (i, step) in p.steps.iter().enumerate() {
        out.push_str(&format!(
            "  step {}: {}, then wait {}\n",
            i + 2,
            step.notify.join(", "),
            duration_human(step.wait.as_ref())
        ));
    }
    if p.repeat > 0 {
        out.push_str(&format!(
            "  repeat {} more times from step {}\n",
            p.repeat,
            p.repeat_from_step.max(1)
        ));
    }
    out.push_str(&format!(
        "  a parked page escalates at once: {}\n",
        if p.escalate_on_park.unwrap_or(true) {
            "yes"
        } else {
            "no"
        }
    ));
    if let Some(reminder) = &p.acknowledgement_reminder {
        out.push_str(&format!(
            "  reminder {} after an acknowledgement, until cleared\n",
            duration_human(Some(reminder))
        ));
    }
    if p.notify_acknowledgement.unwrap_or(false) {
        out.push_str("  every list it reached is told who acknowledged it\n");
    }
    out
}

pub(crate) fn acknowledged_text(r: &v1::AcknowledgeIncidentResponse) -> String {
    let Some(i) = &r.incident else {
        return "the answer held no incident\n".to_owned();
    };
    match r.outcome() {
        v1::AcknowledgeOutcome::Acknowledged => format!(
            "acknowledged incident {}: its escalation stopped ({} page notifications not yet \
             sent were stopped)\n",
            i.id, r.stopped
        ),
        v1::AcknowledgeOutcome::AlreadyAcknowledged => format!(
            "incident {} was already acknowledged by {} via {} at {} (yours is recorded too)\n",
            i.id,
            i.acknowledged_by,
            i.acknowledged_via,
            time_human(i.acknowledged_at.as_ref())
        ),
        v1::AcknowledgeOutcome::AlreadyEnded => format!(
            "incident {} had already ended ({} at {}); your acknowledgement is recorded\n",
            i.id,
            incident_status_name(i.status),
            time_human(i.ended_at.as_ref())
        ),
        v1::AcknowledgeOutcome::Unspecified => {
            format!("incident {}: central gave no outcome\n", i.id)
        }
    }
}

fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".to_owned()
    } else {
        text.to_owned()
    }
}

fn place_json(p: Option<&v1::IncidentPagePlace>) -> Value {
    p.map_or(Value::Null, |p| json!({ "round": p.round, "step": p.step }))
}

pub(crate) fn policy_json(p: &v1::ListEscalation) -> Value {
    json!({
        "priorities": p.priorities.iter().map(|v| priority_name(*v)).collect::<Vec<_>>(),
        "acknowledge_within": duration_json(p.acknowledge_within.as_ref()),
        "steps": p.steps.iter().map(|s| json!({
            "notify": s.notify,
            "wait": duration_json(s.wait.as_ref()),
        })).collect::<Vec<_>>(),
        "repeat": p.repeat,
        "repeat_from_step": p.repeat_from_step.max(1),
        "escalate_on_park": p.escalate_on_park.unwrap_or(true),
        "acknowledgement_reminder": duration_json(p.acknowledgement_reminder.as_ref()),
        "notify_acknowledgement": p.notify_acknowledgement.unwrap_or(false),
    })
}

pub(crate) fn incident_json(i: &v1::Incident) -> Value {
    json!({
        "id": i.id,
        "status": incident_status_name(i.status),
        "priority": priority_name(i.priority),
        "list_name": i.list_name,
        "source_site_id": i.source_site_id,
        "condition_key": i.condition_key,
        "subject": i.subject,
        "alarm_notification_id": i.alarm_notification_id,
        "latest_notification_id": i.latest_notification_id,
        "opened_at": time_json(i.opened_at.as_ref()),
        "page_count": i.page_count,
        "last_page": place_json(i.last_page.as_ref()),
        "next_due_at": time_json(i.next_due_at.as_ref()),
        "next_page": place_json(i.next_page.as_ref()),
        "late_pages": i.late_pages,
        "acknowledged_by": i.acknowledged_by,
        "acknowledged_via": i.acknowledged_via,
        "acknowledged_at": time_json(i.acknowledged_at.as_ref()),
        "ended_at": time_json(i.ended_at.as_ref()),
        "policy": i.policy.as_ref().map_or(Value::Null, policy_json),
    })
}

pub(crate) fn list_json(r: &v1::ListIncidentsResponse) -> Value {
    json!({
        "incidents": r.incidents.iter().map(incident_json).collect::<Vec<_>>(),
        "next_page_token": r.next_page_token,
    })
}

pub(crate) fn detail_json(d: &v1::IncidentDetail) -> Value {
    json!({
        "incident": d.incident.as_ref().map_or(Value::Null, incident_json),
        "pages": d.pages.iter().map(|p| json!({
            "page_no": p.page_no,
            "cycle": p.cycle,
            "place": place_json(p.place.as_ref()),
            "due_at": time_json(p.due_at.as_ref()),
            "fired_at": time_json(p.fired_at.as_ref()),
            "late_by": duration_json(p.late_by.as_ref()),
            "lease_epoch": p.lease_epoch,
        })).collect::<Vec<_>>(),
        "history": d.history.iter().map(|h| json!({
            "sequence": h.sequence,
            "at": time_json(h.at.as_ref()),
            "kind": h.kind,
            "actor": h.actor,
            "means": h.means,
            "from_address": h.from_address,
            "detail": h.detail,
        })).collect::<Vec<_>>(),
        "notifications": d.notifications.iter().map(|n| json!({
            "notification_id": n.notification_id,
            "list_name": n.list_name,
            "page_no": n.page_no,
            "status": status_name(n.status),
        })).collect::<Vec<_>>(),
    })
}

pub(crate) fn acknowledged_json(r: &v1::AcknowledgeIncidentResponse) -> Value {
    let outcome = super::short_name(
        Some(r.outcome().as_str_name()),
        "ACKNOWLEDGE_OUTCOME_",
        r.outcome,
    );
    json!({
        "outcome": outcome,
        "stopped": r.stopped,
        "incident": r.incident.as_ref().map_or(Value::Null, incident_json),
    })
}
