//! The notification list (QueryNotifications with every filter, keyset paging by the API's
//! page token, stuck and scheduled badges), a notification's detail with its history (GetNotificationDetail),
//! and Retry/Discard of one notification (RetryNotification/DiscardNotification).

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use outbox_proto::v1;

use super::display;
use super::filter::{FilterForm, PRIORITIES, STATUSES, TYPES};
use super::reply::{self, Failure, Form, Layout};
use super::session::Flash;
use super::{Shared, Visit, visit_post};

/// Rows per page: a screenful, and well inside the API's 500.
const PAGE_SIZE: u32 = 50;

/// One row of the list.
pub(super) struct Row {
    id: String,
    created: String,
    status: String,
    stuck: bool,
    /// Still waiting for its scheduled time.
    scheduled: bool,
    /// When it was scheduled for; empty when it was not.
    deliver_after: String,
    priority: String,
    kind: String,
    site: String,
    list: String,
    subject: String,
    retries: u32,
    last_error: String,
}

fn row(view: v1::NotificationStatusView) -> Row {
    Row {
        created: display::time(view.created_at.as_ref()),
        status: display::status(view.status),
        stuck: view.stuck,
        scheduled: display::waits_for_its_time(&view),
        deliver_after: display::time(view.deliver_after.as_ref()),
        priority: display::priority(view.priority),
        kind: display::kind(view.r#type),
        site: view.source_site_id,
        list: view.list_name,
        subject: view.subject,
        retries: view.retry_count,
        last_error: view.last_error,
        id: view.notification_id,
    }
}

#[derive(Template)]
#[template(path = "console/notifications.html")]
struct ListPage {
    layout: Layout,
    filter: FilterForm,
    statuses: &'static [&'static str],
    types: &'static [&'static str],
    priorities: &'static [&'static str],
    /// Why the filter could not be used (the page then lists nothing).
    error: Option<String>,
    rows: Vec<Row>,
    /// The link to the next page, when there is one.
    next_page: Option<String>,
    /// The first page's link, when this is a later one.
    first_page: Option<String>,
    /// The filter as hidden fields for the bulk forms, offered when it selects Parked only.
    bulk: Option<Vec<(&'static str, String)>>,
}

/// `GET /notifications?status=...&page=...`.
pub(super) async fn list(
    State(console): State<Shared>,
    visit: Visit,
    RawQuery(query): RawQuery,
) -> Response {
    let query = Form::parse(query.unwrap_or_default().as_bytes());
    let filter = FilterForm::from_pairs(query.pairs());
    let mut page = ListPage {
        layout: visit.layout("notifications"),
        statuses: &STATUSES,
        types: &TYPES,
        priorities: &PRIORITIES,
        error: None,
        rows: Vec::new(),
        next_page: None,
        first_page: (!filter.page.is_empty())
            .then(|| format!("/notifications?{}", filter.query_string(None))),
        bulk: filter.parked_only().then(|| filter.pairs()),
        filter,
    };
    let proto = match page.filter.to_proto() {
        Ok(proto) => proto,
        Err(e) => {
            page.error = Some(e.to_string());
            page.bulk = None;
            return reply::page(StatusCode::BAD_REQUEST, &page, visit.set_cookie.as_deref());
        }
    };
    let answer = console
        .outbox
        .query_notifications(visit.request(v1::QueryNotificationsRequest {
            filter: Some(proto),
            page_size: PAGE_SIZE,
            page_token: page.filter.page.clone(),
        }))
        .await;
    match answer {
        Ok(answer) => {
            let answer = answer.into_inner();
            page.rows = answer.notifications.into_iter().map(row).collect();
            page.next_page = (!answer.next_page_token.is_empty()).then(|| {
                format!(
                    "/notifications?{}",
                    page.filter.query_string(Some(&answer.next_page_token))
                )
            });
            reply::page(StatusCode::OK, &page, visit.set_cookie.as_deref())
        }
        Err(status) => {
            let failure = Failure::from(status);
            page.error = Some(failure.message);
            page.bulk = None;
            reply::page(failure.status, &page, visit.set_cookie.as_deref())
        }
    }
}

struct HistoryRow {
    sequence: u32,
    kind: String,
    outcome: String,
    at: String,
    duration: String,
    error: String,
    actor: String,
    note: String,
}

#[derive(Template)]
#[template(path = "console/detail.html")]
struct DetailPage {
    layout: Layout,
    id: String,
    status: String,
    stuck: bool,
    /// Still waiting for its scheduled time (the facts say when).
    scheduled: bool,
    parked: bool,
    csrf: String,
    /// Label and value pairs of the row's facts.
    facts: Vec<(&'static str, String)>,
    subject: String,
    body: String,
    type_data: String,
    history: Vec<HistoryRow>,
}

fn history_row(entry: v1::HistoryEntry) -> HistoryRow {
    let mut notes = Vec::new();
    if !entry.superseded_by.is_empty() {
        notes.push(format!("superseded by {}", entry.superseded_by));
    }
    if !entry.digest_id.is_empty() {
        notes.push(format!("in digest {}", entry.digest_id));
    }
    // The relay the attempt went to: a fallback's name here shows a failover.
    if !entry.provider.is_empty() {
        notes.push(format!("via {}", entry.provider));
    }
    let note = notes.join(", ");
    HistoryRow {
        sequence: entry.sequence,
        kind: display::history_kind(entry.kind),
        outcome: if entry.kind == i32::from(v1::HistoryEntryKind::StatusCallback) {
            display::callback_outcome(entry.callback_outcome, entry.callback_status)
        } else {
            display::outcome(entry.outcome)
        },
        at: display::time(entry.at.as_ref()),
        duration: entry
            .duration_ms
            .map(|ms| format!("{ms} ms"))
            .unwrap_or_default(),
        error: entry.error,
        actor: entry.actor,
        note,
    }
}

/// `GET /notifications/<id>`.
pub(super) async fn detail(
    State(console): State<Shared>,
    visit: Visit,
    Path(id): Path<String>,
) -> Response {
    let answer = console
        .outbox
        .get_notification_detail(visit.request(v1::GetNotificationDetailRequest {
            notification_id: id,
        }))
        .await;
    let detail = match answer {
        Ok(detail) => detail.into_inner(),
        Err(status) => {
            return reply::error_page(Some(visit.layout("notifications")), status.into());
        }
    };
    let n = detail.notification.unwrap_or_default();
    let status = display::status(n.status);
    let optional = |text: String| if text.is_empty() { "—".into() } else { text };
    let facts = vec![
        ("Type", display::kind(n.r#type)),
        ("Priority", display::priority(n.priority)),
        ("List", n.list_name.clone()),
        ("Site", n.source_site_id.clone()),
        ("Instance", optional(detail.source_instance_id)),
        ("Script", optional(detail.source_script)),
        ("Condition", optional(n.condition_key.clone())),
        ("Retries", n.retry_count.to_string()),
        ("Last error", optional(n.last_error.clone())),
        (
            "Enqueued at the site",
            display::time(n.site_enqueued_at.as_ref()),
        ),
        ("Created", display::time(n.created_at.as_ref())),
        (
            "Deliver after",
            optional(display::time(n.deliver_after.as_ref())),
        ),
        (
            "Last attempt",
            optional(display::time(n.last_attempt_at.as_ref())),
        ),
        (
            "Next attempt",
            optional(display::time(n.next_attempt_at.as_ref())),
        ),
        (
            "Delivered",
            optional(display::time(n.delivered_at.as_ref())),
        ),
        ("Resolved", optional(display::time(n.resolved_at.as_ref()))),
        ("Delivered to", optional(detail.resolved_targets)),
        ("Execution", optional(detail.origin_execution_id)),
        (
            "Parent execution",
            optional(detail.origin_parent_execution_id),
        ),
    ];
    let page = DetailPage {
        layout: visit.layout("notifications"),
        parked: n.status == i32::from(v1::NotificationStatus::Parked),
        stuck: n.stuck,
        scheduled: display::waits_for_its_time(&n),
        csrf: visit.session.csrf.clone(),
        facts,
        subject: n.subject,
        body: detail.body,
        type_data: detail.type_data,
        history: detail.history.into_iter().map(history_row).collect(),
        status,
        id: n.notification_id,
    };
    reply::page(StatusCode::OK, &page, visit.set_cookie.as_deref())
}

/// `POST /notifications/<id>/retry` or `/discard`: the action, then back to the detail with
/// the outcome as a flash message (the API's refusal word for word).
pub(super) async fn act(
    State(console): State<Shared>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let form = Form::from_body(&body);
    let visit = match visit_post(&console, &headers, &form) {
        Ok(visit) => visit,
        Err(refused) => return *refused,
    };
    let answer = match action.as_str() {
        "retry" => {
            console
                .outbox
                .retry_notification(visit.request(v1::RetryNotificationRequest {
                    notification_id: id.clone(),
                }))
                .await
        }
        "discard" => {
            console
                .outbox
                .discard_notification(visit.request(v1::DiscardNotificationRequest {
                    notification_id: id.clone(),
                }))
                .await
        }
        other => {
            return reply::error_page(
                Some(visit.layout("notifications")),
                Failure::new(
                    StatusCode::NOT_FOUND,
                    format!("action: {other:?} is not an action; use retry or discard"),
                ),
            );
        }
    };
    let flash = match answer {
        Ok(view) => Flash::notice(format!(
            "{} by {}: now {}.",
            if action == "retry" {
                "Retried"
            } else {
                "Discarded"
            },
            visit.session.caller.name(),
            display::status(view.into_inner().status)
        )),
        // An id the API cannot parse or find has no detail page to return to.
        Err(status)
            if matches!(
                status.code(),
                tonic::Code::InvalidArgument | tonic::Code::NotFound
            ) =>
        {
            return reply::error_page(Some(visit.layout("notifications")), status.into());
        }
        Err(status) => Flash::error(status.message()),
    };
    console.flash(&visit, flash);
    let target = format!(
        "/notifications/{}",
        url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
    );
    reply::redirect(&target)
}
