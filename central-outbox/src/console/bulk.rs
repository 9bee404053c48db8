//! Retry or Discard every Parked notification the list's current filter selects, in two steps:
//! a confirmation page that asks the API how many rows it would touch (a `dry_run` bulk call,
//! which changes nothing), then the real calls, repeated while more match.
//!
//! The confirmation fixes `parked_before` to the moment it was shown, so confirming acts on the
//! rows that were Parked then and never on rows that park again after being retried by this
//! very action (the loop ends).

use askama::Template;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::{DateTime, Utc};
use outbox_proto::time::to_timestamp;
use outbox_proto::v1;
use outbox_proto::v1::bulk_action_request::Selector;

use super::filter::FilterForm;
use super::reply::{self, Failure, Form, Layout};
use super::session::Flash;
use super::{Shared, Visit, visit_post};
use crate::grpc::admin::MAX_BULK;

/// Calls one confirmation may make, each acting on up to [`MAX_BULK`] rows: a bound on how
/// long the request runs (100,000 rows); more is "run it again".
const MAX_CALLS: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Retry,
    Discard,
}

impl Action {
    fn parse(text: Option<&str>) -> Result<Self, Failure> {
        match text {
            Some("retry") => Ok(Self::Retry),
            Some("discard") => Ok(Self::Discard),
            _ => Err(Failure::bad_request("action: must be retry or discard")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Discard => "discard",
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Self::Retry => "retried",
            Self::Discard => "discarded",
        }
    }
}

#[derive(Template)]
#[template(path = "console/bulk.html")]
struct ConfirmPage {
    layout: Layout,
    action: &'static str,
    /// "12", or "more than 1000".
    count: String,
    /// No row to touch: nothing to confirm.
    none: bool,
    csrf: String,
    /// The filter and `parked_before`, as hidden fields.
    fields: Vec<(&'static str, String)>,
    back: String,
}

/// The action and filter a bulk form names, checked.
fn read(form: &Form) -> Result<(Action, FilterForm, v1::NotificationFilter), Failure> {
    let action = Action::parse(form.get("action"))?;
    let filter = FilterForm::from_pairs(form.pairs());
    if !filter.parked_only() {
        return Err(Failure::bad_request(
            "status: bulk actions apply to PARKED notifications only; filter by status PARKED \
             alone first",
        ));
    }
    let proto = filter
        .to_proto()
        .map_err(|e| Failure::bad_request(e.to_string()))?;
    Ok((action, filter, proto))
}

async fn call(
    console: &Shared,
    visit: &Visit,
    action: Action,
    request: v1::BulkActionRequest,
) -> Result<v1::BulkActionResponse, tonic::Status> {
    let answer = match action {
        Action::Retry => {
            console
                .outbox
                .retry_notifications(visit.request(request))
                .await
        }
        Action::Discard => {
            console
                .outbox
                .discard_notifications(visit.request(request))
                .await
        }
    };
    answer.map(tonic::Response::into_inner)
}

/// `GET /notifications/bulk?action=retry&status=PARKED&...`: how many rows it would touch.
pub(super) async fn confirm(
    State(console): State<Shared>,
    visit: Visit,
    RawQuery(query): RawQuery,
) -> Response {
    let form = Form::parse(query.unwrap_or_default().as_bytes());
    let (action, filter, proto) = match read(&form) {
        Ok(read) => read,
        Err(failure) => return reply::error_page(Some(visit.layout("notifications")), failure),
    };
    let now = Utc::now();
    let counted = call(
        &console,
        &visit,
        action,
        v1::BulkActionRequest {
            selector: Some(Selector::Filter(proto)),
            limit: 0,
            parked_before: Some(to_timestamp(now)),
            dry_run: true,
        },
    )
    .await;
    let counted = match counted {
        Ok(counted) => counted,
        Err(status) => {
            return reply::error_page(Some(visit.layout("notifications")), status.into());
        }
    };
    let count = if counted.more_matching {
        format!("more than {MAX_BULK}")
    } else {
        counted.changed.to_string()
    };
    let mut fields = filter.pairs();
    // In UTC with a "Z": no "+" for a form to carry.
    fields.push((
        "parked_before",
        now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    ));
    let page = ConfirmPage {
        layout: visit.layout("notifications"),
        action: action.name(),
        none: counted.changed == 0,
        count,
        csrf: visit.session.csrf.clone(),
        fields,
        back: format!("/notifications?{}", filter.query_string(None)),
    };
    reply::page(StatusCode::OK, &page, visit.set_cookie.as_deref())
}

/// `POST /notifications/bulk`: acts, then back to the list with how many changed.
pub(super) async fn apply(
    State(console): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = Form::from_body(&body);
    let visit = match visit_post(&console, &headers, &form) {
        Ok(visit) => visit,
        Err(refused) => return *refused,
    };
    let (action, filter, proto) = match read(&form) {
        Ok(read) => read,
        Err(failure) => return reply::error_page(Some(visit.layout("notifications")), failure),
    };
    let parked_before = match form.get("parked_before").map(DateTime::parse_from_rfc3339) {
        Some(Ok(at)) => at.with_timezone(&Utc),
        _ => {
            return reply::error_page(
                Some(visit.layout("notifications")),
                Failure::bad_request(
                    "parked_before: missing or not a time; open the confirmation again",
                ),
            );
        }
    };
    let mut changed: u64 = 0;
    let mut outcome = None;
    for _ in 0..MAX_CALLS {
        let answer = call(
            &console,
            &visit,
            action,
            v1::BulkActionRequest {
                selector: Some(Selector::Filter(proto.clone())),
                limit: 0,
                parked_before: Some(to_timestamp(parked_before)),
                dry_run: false,
            },
        )
        .await;
        match answer {
            Ok(answer) => {
                changed += u64::from(answer.changed);
                // No progress with more matching would loop for nothing: stop either way.
                if !answer.more_matching || answer.changed == 0 {
                    outcome = Some(Ok(()));
                    break;
                }
            }
            Err(status) => {
                outcome = Some(Err(status));
                break;
            }
        }
    }
    let flash = match outcome {
        Some(Ok(())) => Flash::notice(format!(
            "{changed} notification{} {}.",
            if changed == 1 { "" } else { "s" },
            action.verb()
        )),
        Some(Err(status)) => Flash::error(format!(
            "{changed} notifications {} before the console was refused: {}",
            action.verb(),
            status.message()
        )),
        None => Flash::notice(format!(
            "{changed} notifications {}; more match, confirm again to go on.",
            action.verb()
        )),
    };
    console.flash(&visit, flash);
    reply::redirect(&format!("/notifications?{}", filter.query_string(None)))
}
