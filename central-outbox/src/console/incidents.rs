//! Incidents of escalating lists (ListIncidents, GetIncident): the page of open, acknowledged,
//! exhausted and late ones, one incident with its pages, notifications and history, and its
//! acknowledgement, one at a time or several ticked together (AcknowledgeIncident, operator
//! role; the API records the operator and the browser's address).

use std::net::SocketAddr;

use askama::Template;
use axum::Extension;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use outbox_proto::v1;

use super::display;
use super::reply::{self, Failure, Form, Layout};
use super::session::Flash;
use super::{Shared, Visit, visit_post};
use crate::auth::Role;

/// Incidents per page.
const PAGE_SIZE: u32 = 50;

/// The page's status filters: (value in the query, label, the API's statuses).
const VIEWS: [(&str, &str, &[v1::IncidentStatus]); 5] = [
    ("open", "Open", &[v1::IncidentStatus::Open]),
    (
        "acknowledged",
        "Acknowledged",
        &[v1::IncidentStatus::Acknowledged],
    ),
    ("exhausted", "Exhausted", &[v1::IncidentStatus::Exhausted]),
    (
        "ended",
        "Ended",
        &[v1::IncidentStatus::Cleared, v1::IncidentStatus::Discarded],
    ),
    ("all", "All", &[]),
];

pub(super) struct Row {
    id: i64,
    status: String,
    /// Open or exhausted: somebody may acknowledge it.
    open: bool,
    priority: String,
    site: String,
    list: String,
    subject: String,
    opened: String,
    pages: u32,
    late: u32,
    next: String,
    acknowledged: String,
}

fn status_name(value: i32) -> String {
    v1::IncidentStatus::try_from(value)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("INCIDENT_STATUS_")
                .to_owned()
        })
        .unwrap_or_else(|_| format!("UNKNOWN_{value}"))
}

fn takes_acknowledgement(value: i32) -> bool {
    matches!(
        v1::IncidentStatus::try_from(value),
        Ok(v1::IncidentStatus::Open | v1::IncidentStatus::Exhausted)
    )
}

fn next(i: &v1::Incident) -> String {
    match (&i.next_due_at, &i.next_page) {
        (None, _) => "—".to_owned(),
        (Some(due), Some(page)) => format!(
            "step {} of round {} at {}",
            page.step,
            page.round,
            display::time(Some(due))
        ),
        (Some(due), None) if i.status() == v1::IncidentStatus::Acknowledged => {
            format!("reminder at {}", display::time(Some(due)))
        }
        (Some(due), None) => format!("exhausted at {}", display::time(Some(due))),
    }
}

fn acknowledged(i: &v1::Incident) -> String {
    if i.acknowledged_by.is_empty() {
        "—".to_owned()
    } else {
        format!(
            "{} ({}) at {}",
            i.acknowledged_by,
            i.acknowledged_via,
            display::time(i.acknowledged_at.as_ref())
        )
    }
}

fn row(i: v1::Incident) -> Row {
    Row {
        status: status_name(i.status),
        open: takes_acknowledgement(i.status),
        priority: display::priority(i.priority),
        opened: display::time(i.opened_at.as_ref()),
        next: next(&i),
        acknowledged: acknowledged(&i),
        pages: i.page_count,
        late: i.late_pages,
        site: i.source_site_id,
        list: i.list_name,
        subject: i.subject,
        id: i.id,
    }
}

#[derive(Template)]
#[template(path = "console/incidents.html")]
struct ListPage {
    layout: Layout,
    csrf: String,
    /// The operator may acknowledge (operator or admin role).
    can_acknowledge: bool,
    views: Vec<(&'static str, &'static str)>,
    view: String,
    late: bool,
    error: Option<String>,
    rows: Vec<Row>,
    next_page: Option<String>,
}

/// `GET /incidents?view=open&late=on&page=...`.
pub(super) async fn list(
    State(console): State<Shared>,
    visit: Visit,
    RawQuery(query): RawQuery,
) -> Response {
    let query = Form::parse(query.unwrap_or_default().as_bytes());
    let view = match query.get("view") {
        Some(v) if !v.is_empty() => v.to_owned(),
        _ => "open".to_owned(),
    };
    let late = query.get("late") == Some("on");
    let mut page = ListPage {
        layout: visit.layout("incidents"),
        csrf: visit.session.csrf.clone(),
        can_acknowledge: visit.role() >= Role::Operator,
        views: VIEWS
            .iter()
            .map(|(value, label, _)| (*value, *label))
            .collect(),
        view: view.clone(),
        late,
        error: None,
        rows: Vec::new(),
        next_page: None,
    };
    let Some((_, _, statuses)) = VIEWS.iter().find(|(value, _, _)| *value == view) else {
        page.error = Some(format!(
            "view: {view:?} is not a view; use open, acknowledged, exhausted, ended or all"
        ));
        return reply::page(StatusCode::BAD_REQUEST, &page, visit.set_cookie.as_deref());
    };
    let answer = console
        .outbox
        .list_incidents(visit.request(v1::ListIncidentsRequest {
            statuses: statuses.iter().map(|s| (*s).into()).collect(),
            late_only: late,
            page_size: PAGE_SIZE,
            page_token: query.text("page"),
        }))
        .await;
    match answer {
        Ok(answer) => {
            let answer = answer.into_inner();
            page.rows = answer.incidents.into_iter().map(row).collect();
            page.next_page = (!answer.next_page_token.is_empty()).then(|| {
                format!(
                    "/incidents?view={view}{}&page={}",
                    if late { "&late=on" } else { "" },
                    answer.next_page_token
                )
            });
            reply::page(StatusCode::OK, &page, visit.set_cookie.as_deref())
        }
        Err(status) => {
            let failure = Failure::from(status);
            page.error = Some(failure.message);
            reply::page(failure.status, &page, visit.set_cookie.as_deref())
        }
    }
}

struct PageRow {
    page_no: u32,
    place: String,
    due: String,
    fired: String,
    late_by: String,
}

struct MessageRow {
    page: String,
    list: String,
    status: String,
    id: String,
}

struct HistoryRow {
    sequence: u32,
    at: String,
    kind: String,
    actor: String,
    means: String,
    detail: String,
}

#[derive(Template)]
#[template(path = "console/incident.html")]
struct DetailPage {
    layout: Layout,
    csrf: String,
    id: i64,
    status: String,
    can_acknowledge: bool,
    subject: String,
    facts: Vec<(&'static str, String)>,
    policy: Vec<String>,
    pages: Vec<PageRow>,
    messages: Vec<MessageRow>,
    history: Vec<HistoryRow>,
}

/// The policy, one line per step, as the callout runs.
fn policy_lines(p: &v1::ListEscalation, list: &str) -> Vec<String> {
    let mut lines = vec![format!(
        "Step 1: {list} (the alarm), then wait {}",
        display::duration(p.acknowledge_within.as_ref())
    )];
    for (i, step) in p.steps.iter().enumerate() {
        lines.push(format!(
            "Step {}: {}, then wait {}",
            i + 2,
            step.notify.join(", "),
            display::duration(step.wait.as_ref())
        ));
    }
    if p.repeat > 0 {
        lines.push(format!(
            "Then {} more rounds from step {}",
            p.repeat,
            p.repeat_from_step.max(1)
        ));
    }
    if p.escalate_on_park.unwrap_or(true) {
        lines.push("A page whose delivery parks escalates at once".to_owned());
    }
    if let Some(reminder) = &p.acknowledgement_reminder {
        lines.push(format!(
            "Reminder {} after an acknowledgement, until the condition clears",
            display::duration(Some(reminder))
        ));
    }
    if p.notify_acknowledgement.unwrap_or(false) {
        lines.push("Every list it reached is told who acknowledged it".to_owned());
    }
    lines
}

/// `GET /incidents/<id>`.
pub(super) async fn detail(
    State(console): State<Shared>,
    visit: Visit,
    Path(id): Path<String>,
) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return reply::error_page(
            Some(visit.layout("incidents")),
            Failure::bad_request(format!("incident: {id:?} is not an incident number")),
        );
    };
    let answer = console
        .outbox
        .get_incident(visit.request(v1::GetIncidentRequest { id }))
        .await;
    let detail = match answer {
        Ok(detail) => detail.into_inner(),
        Err(status) => return reply::error_page(Some(visit.layout("incidents")), status.into()),
    };
    let i = detail.incident.unwrap_or_default();
    let optional = |text: String| if text.is_empty() { "—".into() } else { text };
    let facts = vec![
        ("Priority", display::priority(i.priority)),
        ("List", i.list_name.clone()),
        ("Site", i.source_site_id.clone()),
        ("Condition", optional(i.condition_key.clone())),
        ("Opened", display::time(i.opened_at.as_ref())),
        ("Pages", format!("{} ({} late)", i.page_count, i.late_pages)),
        ("Next", next(&i)),
        ("Acknowledged", acknowledged(&i)),
        ("Ended", optional(display::time(i.ended_at.as_ref()))),
        ("Alarm", i.alarm_notification_id.clone()),
        ("Latest", i.latest_notification_id.clone()),
    ];
    let page = DetailPage {
        layout: visit.layout("incidents"),
        csrf: visit.session.csrf.clone(),
        id: i.id,
        status: status_name(i.status),
        can_acknowledge: visit.role() >= Role::Operator && takes_acknowledgement(i.status),
        policy: i
            .policy
            .as_ref()
            .map(|p| policy_lines(p, &i.list_name))
            .unwrap_or_default(),
        subject: i.subject.clone(),
        facts,
        pages: detail
            .pages
            .into_iter()
            .map(|p| PageRow {
                page_no: p.page_no,
                place: p
                    .place
                    .map(|pl| format!("step {} of round {}", pl.step, pl.round))
                    .unwrap_or_default(),
                due: display::time(p.due_at.as_ref()),
                fired: display::time(p.fired_at.as_ref()),
                late_by: p
                    .late_by
                    .as_ref()
                    .map_or_else(String::new, |l| display::duration(Some(l))),
            })
            .collect(),
        messages: detail
            .notifications
            .into_iter()
            .map(|n| MessageRow {
                page: match n.page_no {
                    0 => "joined".to_owned(),
                    p => p.to_string(),
                },
                list: n.list_name,
                status: display::status(n.status),
                id: n.notification_id,
            })
            .collect(),
        history: detail
            .history
            .into_iter()
            .map(|h| HistoryRow {
                sequence: h.sequence,
                at: display::time(h.at.as_ref()),
                kind: h.kind,
                means: match (h.means.is_empty(), h.from_address.is_empty()) {
                    (true, _) => String::new(),
                    (false, true) => h.means,
                    (false, false) => format!("{} from {}", h.means, h.from_address),
                },
                actor: h.actor,
                detail: h.detail,
            })
            .collect(),
    };
    reply::page(StatusCode::OK, &page, visit.set_cookie.as_deref())
}

/// The outcome of one acknowledgement, in words.
fn outcome_text(id: i64, answer: &v1::AcknowledgeIncidentResponse) -> String {
    let by = answer
        .incident
        .as_ref()
        .map(|i| format!("{} ({})", i.acknowledged_by, i.acknowledged_via))
        .unwrap_or_default();
    match answer.outcome() {
        v1::AcknowledgeOutcome::Acknowledged => format!(
            "Incident {id} acknowledged: its escalation stopped ({} unsent pages stopped).",
            answer.stopped
        ),
        v1::AcknowledgeOutcome::AlreadyAcknowledged => {
            format!("Incident {id} was already acknowledged by {by}; yours is recorded too.")
        }
        v1::AcknowledgeOutcome::AlreadyEnded => {
            format!("Incident {id} had already ended; your acknowledgement is recorded.")
        }
        v1::AcknowledgeOutcome::Unspecified => format!("Incident {id}: no outcome."),
    }
}

/// `POST /incidents/<id>/acknowledge`: that incident, then back to it.
pub(super) async fn acknowledge_one(
    State(console): State<Shared>,
    headers: HeaderMap,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let back = format!(
        "/incidents/{}",
        url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
    );
    acknowledge(&console, &headers, peer, vec![id], &body, &back).await
}

/// `POST /incidents/acknowledge` with the ticked `id` fields, then back to the list.
pub(super) async fn acknowledge_ticked(
    State(console): State<Shared>,
    headers: HeaderMap,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    body: Bytes,
) -> Response {
    let ids = Form::from_body(&body)
        .pairs()
        .filter(|(k, _)| *k == "id")
        .map(|(_, v)| v.to_owned())
        .collect();
    acknowledge(&console, &headers, peer, ids, &body, "/incidents").await
}

/// Each of `ids` acknowledged through the API as the session's operator, from the browser's
/// address, with the outcomes as one flash message on `back`.
async fn acknowledge(
    console: &Shared,
    headers: &HeaderMap,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    ids: Vec<String>,
    body: &Bytes,
    back: &str,
) -> Response {
    let form = Form::from_body(body);
    let visit = match visit_post(console, headers, &form) {
        Ok(visit) => visit,
        Err(refused) => return *refused,
    };
    if ids.is_empty() {
        console.flash(
            &visit,
            Flash::error("Tick the incidents to acknowledge first."),
        );
        return reply::redirect(back);
    }
    let from = peer.map(|Extension(ConnectInfo(addr))| addr.to_string());
    let mut outcomes = Vec::with_capacity(ids.len());
    let mut failed = false;
    for text in &ids {
        let Ok(id) = text.parse::<i64>() else {
            return reply::error_page(
                Some(visit.layout("incidents")),
                Failure::bad_request(format!("id: {text:?} is not an incident number")),
            );
        };
        let mut request = visit.request(v1::AcknowledgeIncidentRequest { id });
        if let Some(from) = &from {
            request
                .extensions_mut()
                .insert(crate::grpc::admin::ConsoleClient(from.clone()));
        }
        match console.outbox.acknowledge_incident(request).await {
            Ok(answer) => outcomes.push(outcome_text(id, &answer.into_inner())),
            Err(status) => {
                failed = true;
                outcomes.push(format!("Incident {id}: {}", status.message()));
            }
        }
    }
    let text = outcomes.join(" ");
    console.flash(
        &visit,
        if failed {
            Flash::error(text)
        } else {
            Flash::notice(text)
        },
    );
    reply::redirect(back)
}
