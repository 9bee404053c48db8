//! Notification lists: every list (ListNotificationLists), one list's targets and flood
//! consolidation (GetNotificationList), and for admins an edit form saved with
//! UpsertNotificationList. A webhook signing secret is write-only: the page says whether one is
//! stored, never what it is; an empty secret field keeps the stored one.

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use outbox_proto::time::to_duration;
use outbox_proto::v1;

use super::display;
use super::reply::{self, Failure, Form, Layout};
use super::session::Flash;
use super::{Shared, Visit, visit_post};
use crate::auth::Role;

struct ListRow {
    name: String,
    kind: String,
    targets: usize,
    consolidation: String,
    updated: String,
}

#[derive(Template)]
#[template(path = "console/lists.html")]
struct ListsPage {
    layout: Layout,
    lists: Vec<ListRow>,
    admin: bool,
}

fn path_of(name: &str) -> String {
    format!(
        "/lists/{}",
        url::form_urlencoded::byte_serialize(name.as_bytes()).collect::<String>()
    )
}

fn consolidation_text(c: Option<&v1::ListConsolidation>) -> String {
    c.map(|c| {
        format!(
            "more than {} per {} → digests of up to {}",
            c.threshold,
            display::duration(c.window.as_ref()),
            c.max_per_digest
        )
    })
    .unwrap_or_default()
}

/// `GET /lists` (and `?new=<name>`, the new-list form's way to a list's page).
pub(super) async fn index(
    State(console): State<Shared>,
    visit: Visit,
    RawQuery(query): RawQuery,
) -> Response {
    let query = Form::parse(query.unwrap_or_default().as_bytes());
    let new = query.text("new");
    if !new.is_empty() {
        return reply::redirect(&path_of(&new));
    }
    let answer = console
        .outbox
        .list_notification_lists(visit.request(v1::ListNotificationListsRequest {}))
        .await;
    let lists = match answer {
        Ok(answer) => answer.into_inner().lists,
        Err(status) => return reply::error_page(Some(visit.layout("lists")), status.into()),
    };
    let page = ListsPage {
        layout: visit.layout("lists"),
        admin: visit.role() >= Role::Admin,
        lists: lists
            .into_iter()
            .map(|l| ListRow {
                kind: display::kind(l.r#type),
                targets: l.recipients.len() + l.endpoints.len(),
                consolidation: consolidation_text(l.consolidation.as_ref()),
                updated: display::time(l.updated_at.as_ref()),
                name: l.name,
            })
            .collect(),
    };
    reply::page(StatusCode::OK, &page, visit.set_cookie.as_deref())
}

/// The list form's fields as text.
#[derive(Default)]
struct ListForm {
    kind: String,
    recipients: String,
    endpoints: String,
    /// Fallback URLs, one per line, in order.
    fallback_urls: String,
    /// The status callback endpoint; empty: none.
    status_callback_url: String,
    webhook_format: String,
    secret_set: bool,
    threshold: String,
    window: String,
    max_per_digest: String,
    /// Escalation: empty `escalate_after` means none. Steps one per line, `lists: wait`.
    escalate_after: String,
    escalation_steps: String,
    escalation_repeat: String,
    escalation_repeat_from: String,
    escalation_priorities: String,
    escalate_on_park: bool,
    escalation_reminder: String,
    notify_acknowledgement: bool,
}

impl ListForm {
    fn from_list(list: &v1::NotificationList) -> Self {
        let c = list.consolidation.as_ref();
        Self {
            kind: display::kind(list.r#type),
            recipients: list.recipients.join("\n"),
            endpoints: list.endpoints.join("\n"),
            fallback_urls: list.fallback_urls.join("\n"),
            status_callback_url: list.status_callback_url.clone(),
            webhook_format: match v1::WebhookFormat::try_from(list.webhook_format) {
                Ok(v1::WebhookFormat::Teams) => "TEAMS".into(),
                Ok(v1::WebhookFormat::Slack) => "SLACK".into(),
                _ => "GENERIC".into(),
            },
            secret_set: list.webhook_secret_set,
            threshold: c.map(|c| c.threshold.to_string()).unwrap_or_default(),
            window: c
                .map(|c| display::duration(c.window.as_ref()))
                .unwrap_or_default(),
            max_per_digest: c.map(|c| c.max_per_digest.to_string()).unwrap_or_default(),
            ..Self::escalation_of(list.escalation.as_ref())
        }
    }

    /// The escalation fields of a stored policy (all empty, and parking escalating, for none).
    fn escalation_of(e: Option<&v1::ListEscalation>) -> Self {
        let Some(e) = e else {
            return Self {
                escalate_on_park: true,
                ..Self::default()
            };
        };
        Self {
            escalate_after: display::duration(e.acknowledge_within.as_ref()),
            escalation_steps: e
                .steps
                .iter()
                .map(|s| {
                    format!(
                        "{}: {}",
                        s.notify.join(", "),
                        display::duration(s.wait.as_ref())
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"),
            escalation_repeat: e.repeat.to_string(),
            escalation_repeat_from: e.repeat_from_step.max(1).to_string(),
            escalation_priorities: e
                .priorities
                .iter()
                .map(|p| display::priority(*p))
                .collect::<Vec<_>>()
                .join(", "),
            escalate_on_park: e.escalate_on_park.unwrap_or(true),
            escalation_reminder: e
                .acknowledgement_reminder
                .as_ref()
                .map(|r| display::duration(Some(r)))
                .unwrap_or_default(),
            notify_acknowledgement: e.notify_acknowledgement.unwrap_or(false),
            ..Self::default()
        }
    }

    fn from_form(form: &Form, secret_set: bool) -> Self {
        Self {
            kind: form.text("type").to_uppercase(),
            recipients: form.text("recipients"),
            endpoints: form.text("endpoints"),
            fallback_urls: form.text("fallback_urls"),
            status_callback_url: form.text("status_callback_url"),
            webhook_format: form.text("webhook_format").to_uppercase(),
            secret_set,
            threshold: form.text("consolidation_threshold"),
            window: form.text("consolidation_window"),
            max_per_digest: form.text("consolidation_max_per_digest"),
            escalate_after: form.text("escalate_after"),
            escalation_steps: form.text("escalation_steps"),
            escalation_repeat: form.text("escalation_repeat"),
            escalation_repeat_from: form.text("escalation_repeat_from"),
            escalation_priorities: form.text("escalation_priorities"),
            escalate_on_park: form.get("escalate_on_park").is_some(),
            escalation_reminder: form.text("escalation_reminder"),
            notify_acknowledgement: form.get("notify_acknowledgement").is_some(),
        }
    }
}

#[derive(Template)]
#[template(path = "console/list.html")]
struct ListPage {
    layout: Layout,
    name: String,
    /// Not stored yet: the form creates it.
    new: bool,
    updated: String,
    consolidation: String,
    form: ListForm,
    /// Admins get the form; everyone else reads.
    editable: bool,
    csrf: String,
    error: Option<String>,
}

/// `GET /lists/<name>`.
pub(super) async fn show(
    State(console): State<Shared>,
    visit: Visit,
    Path(name): Path<String>,
) -> Response {
    let answer = console
        .outbox
        .get_notification_list(visit.request(v1::GetNotificationListRequest { name: name.clone() }))
        .await;
    let editable = visit.role() >= Role::Admin;
    let page = match answer {
        Ok(list) => {
            let list = list.into_inner();
            ListPage {
                layout: visit.layout("lists"),
                new: false,
                updated: display::time(list.updated_at.as_ref()),
                consolidation: consolidation_text(list.consolidation.as_ref()),
                form: ListForm::from_list(&list),
                editable,
                csrf: visit.session.csrf.clone(),
                error: None,
                name: list.name,
            }
        }
        // An admin may create it here.
        Err(status) if status.code() == tonic::Code::NotFound && editable => ListPage {
            layout: visit.layout("lists"),
            new: true,
            updated: String::new(),
            consolidation: String::new(),
            form: ListForm {
                kind: "EMAIL".into(),
                webhook_format: "GENERIC".into(),
                escalate_on_park: true,
                ..ListForm::default()
            },
            editable,
            csrf: visit.session.csrf.clone(),
            error: None,
            name,
        },
        Err(status) => return reply::error_page(Some(visit.layout("lists")), status.into()),
    };
    reply::page(StatusCode::OK, &page, visit.set_cookie.as_deref())
}

/// Lines (or commas) of a text area, trimmed, without empty ones.
fn lines(text: &str) -> Vec<String> {
    text.split(['\n', ','])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The API's list from the form; the shape only (numbers are numbers), the rules are the
/// API's.
fn to_proto(name: &str, form: &Form) -> Result<v1::NotificationList, Failure> {
    let kind = match form.text("type").to_uppercase().as_str() {
        "" | "EMAIL" => v1::NotificationType::Email,
        "WEBHOOK" => v1::NotificationType::Webhook,
        other => {
            return Err(Failure::bad_request(format!(
                "type: {other:?} is not a list type; use EMAIL or WEBHOOK"
            )));
        }
    };
    let webhook_format = match form.text("webhook_format").to_uppercase().as_str() {
        "" => v1::WebhookFormat::Unspecified,
        "GENERIC" => v1::WebhookFormat::Generic,
        "TEAMS" => v1::WebhookFormat::Teams,
        "SLACK" => v1::WebhookFormat::Slack,
        other => {
            return Err(Failure::bad_request(format!(
                "webhook_format: {other:?} is not a format; use GENERIC, TEAMS or SLACK"
            )));
        }
    };
    // Write-only: empty keeps the stored secret, the remove box removes it.
    let secret = form.text("webhook_secret");
    let webhook_secret = if form.get("remove_webhook_secret").is_some() {
        Some(String::new())
    } else if secret.is_empty() {
        None
    } else {
        Some(secret)
    };
    let (threshold, window, max) = (
        form.text("consolidation_threshold"),
        form.text("consolidation_window"),
        form.text("consolidation_max_per_digest"),
    );
    let consolidation = if threshold.is_empty() && window.is_empty() && max.is_empty() {
        None
    } else {
        let number = |text: &str, field: &str| {
            text.parse::<u32>().map_err(|_| {
                Failure::bad_request(format!("{field}: {text:?} is not a whole number"))
            })
        };
        let window = humantime::parse_duration(&window).map_err(|e| {
            Failure::bad_request(format!(
                "consolidation_window: {window:?} is not a duration such as 60s or 5m ({e})"
            ))
        })?;
        Some(v1::ListConsolidation {
            threshold: number(&threshold, "consolidation_threshold")?,
            window: Some(to_duration(window)),
            max_per_digest: number(&max, "consolidation_max_per_digest")?,
        })
    };
    Ok(v1::NotificationList {
        name: name.to_owned(),
        r#type: kind.into(),
        recipients: lines(&form.text("recipients")),
        updated_at: None,
        endpoints: lines(&form.text("endpoints")),
        fallback_urls: lines(&form.text("fallback_urls")),
        webhook_format: webhook_format.into(),
        webhook_secret,
        webhook_secret_set: false,
        consolidation,
        escalation: escalation(form)?,
        status_callback_url: form.text("status_callback_url").trim().to_owned(),
    })
}

/// The form's escalation, in the API's terms (the rules are the API's); none when "escalate
/// after" is empty.
fn escalation(form: &Form) -> Result<Option<v1::ListEscalation>, Failure> {
    let after = form.text("escalate_after");
    if after.is_empty() {
        return Ok(None);
    }
    let duration = |text: &str, field: &str| {
        humantime::parse_duration(text.trim()).map_err(|e| {
            Failure::bad_request(format!(
                "{field}: {text:?} is not a duration such as 10m or 1h ({e})"
            ))
        })
    };
    let number = |text: String, field: &str| -> Result<u32, Failure> {
        if text.trim().is_empty() {
            return Ok(0);
        }
        text.trim()
            .parse::<u32>()
            .map_err(|_| Failure::bad_request(format!("{field}: {text:?} is not a whole number")))
    };
    let mut steps = Vec::new();
    for (i, line) in form
        .text("escalation_steps")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        let Some((lists, wait)) = line.rsplit_once(':') else {
            return Err(Failure::bad_request(format!(
                "escalation_steps: line {}: {line:?} is not `lists: wait` (e.g. supervisors: 15m)",
                i + 1
            )));
        };
        steps.push(v1::EscalationStep {
            notify: lists
                .split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
            wait: Some(to_duration(duration(wait, "escalation_steps")?)),
        });
    }
    let mut priorities = Vec::new();
    for name in form
        .text("escalation_priorities")
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let priority = v1::NotificationPriority::from_str_name(&format!(
            "NOTIFICATION_PRIORITY_{}",
            name.to_uppercase()
        ))
        .ok_or_else(|| {
            Failure::bad_request(format!(
                "escalation_priorities: {name:?} is not a priority (critical, high, normal)"
            ))
        })?;
        priorities.push(priority.into());
    }
    let reminder = form.text("escalation_reminder");
    Ok(Some(v1::ListEscalation {
        priorities,
        acknowledge_within: Some(to_duration(duration(&after, "escalate_after")?)),
        steps,
        repeat: number(form.text("escalation_repeat"), "escalation_repeat")?,
        repeat_from_step: number(
            form.text("escalation_repeat_from"),
            "escalation_repeat_from",
        )?,
        escalate_on_park: Some(form.get("escalate_on_park").is_some()),
        acknowledgement_reminder: if reminder.trim().is_empty() {
            None
        } else {
            Some(to_duration(duration(&reminder, "escalation_reminder")?))
        },
        notify_acknowledgement: Some(form.get("notify_acknowledgement").is_some()),
    }))
}

/// `POST /lists/<name>`: UpsertNotificationList; back to the list, or the form again with
/// the API's message.
pub(super) async fn save(
    State(console): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let form = Form::from_body(&body);
    let visit = match visit_post(&console, &headers, &form) {
        Ok(visit) => visit,
        Err(refused) => return *refused,
    };
    let failure = match to_proto(&name, &form) {
        Ok(list) => {
            let answer = console
                .outbox
                .upsert_notification_list(
                    visit.request(v1::UpsertNotificationListRequest { list: Some(list) }),
                )
                .await;
            match answer {
                Ok(saved) => {
                    let saved = saved.into_inner();
                    console.flash(&visit, Flash::notice(format!("List {} saved.", saved.name)));
                    return reply::redirect(&path_of(&saved.name));
                }
                Err(status) => Failure::from(status),
            }
        }
        Err(failure) => failure,
    };
    form_again(&visit, name, &form, failure)
}

/// The form as posted (without the secret), with the reason it was not saved.
fn form_again(visit: &Visit, name: String, form: &Form, failure: Failure) -> Response {
    let page = ListPage {
        layout: visit.layout("lists"),
        new: false,
        updated: String::new(),
        consolidation: String::new(),
        form: ListForm::from_form(form, false),
        editable: true,
        csrf: visit.session.csrf.clone(),
        error: Some(failure.message),
        name,
    };
    reply::page(failure.status, &page, visit.set_cookie.as_deref())
}
