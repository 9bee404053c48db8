//! The page an acknowledgement link opens (`GET /ack/{incident}/{token}`): the incident (or, for
//! a digest's link, each incident it covers), and a button that acknowledges it as the link's
//! recipient (`POST` to the same address, with the PIN when one is configured). A GET never changes anything, so a mail scanner that opens
//! every link (Safe Links and the like) acknowledges nothing.
//!
//! No console session is needed: the link is the credential (`ack_link`). It is served with
//! the console (on its listener) or on a listener of its own (`[acknowledgement] listen`).
//! A link that does not verify and a wrong PIN count as failed logins of the client's address
//! (`auth::throttle`, `via=ack_link`), so links cannot be guessed at speed; an expired link is
//! not a guess and is not counted.
//!
//! Invariants: nothing is acknowledged unless the link verifies for the incident in its path,
//! has not expired, and the PIN (if configured) matches; every acknowledgement records the
//! recipient as its actor, `link` as its means and the client's address; every answer is a
//! page with the security headers of the console (`no-store`, `no-referrer`: the address holds
//! the token).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use askama::Template;
use axum::Extension;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::get;
use futures_util::future::BoxFuture;

use super::reply::{self, Form};
use crate::ack_link::{AckLinks, LinkClaim, Refusal};
use crate::auth::{Authenticator, Via};
use crate::domain::escalation::{AckMeans, AckResult, Acknowledgement, IncidentId, IncidentStatus};
use crate::domain::history::Actor;
use crate::records::IncidentView;
use crate::store::{EscalationStore, StoreError};

/// What the page needs of the store: one incident, and its acknowledgement. A trait of its own
/// so the page is not generic over the store (the store's traits are not object safe).
pub(crate) trait IncidentDesk: Send + Sync + 'static {
    fn summary(&self, id: IncidentId) -> BoxFuture<'_, Result<Option<IncidentView>, StoreError>>;
    fn acknowledge(
        &self,
        id: IncidentId,
        ack: Acknowledgement,
    ) -> BoxFuture<'_, Result<AckResult, StoreError>>;
}

impl<S: EscalationStore> IncidentDesk for S {
    fn summary(&self, id: IncidentId) -> BoxFuture<'_, Result<Option<IncidentView>, StoreError>> {
        Box::pin(async move { Ok(self.incident(id).await?.map(|d| d.incident)) })
    }

    fn acknowledge(
        &self,
        id: IncidentId,
        ack: Acknowledgement,
    ) -> BoxFuture<'_, Result<AckResult, StoreError>> {
        Box::pin(self.acknowledge_incident(id, ack))
    }
}

/// What the page's handlers share.
pub(crate) struct AckPage {
    links: Arc<AckLinks>,
    desk: Arc<dyn IncidentDesk>,
    /// Its failed-login table counts links that do not verify and wrong PINs.
    auth: Authenticator,
}

impl AckPage {
    pub(crate) fn new(
        links: Arc<AckLinks>,
        desk: Arc<dyn IncidentDesk>,
        auth: Authenticator,
    ) -> Self {
        Self { links, desk, auth }
    }
}

type Shared = Arc<AckPage>;

/// The page's route, for the console's router.
pub(crate) fn routes(page: Arc<AckPage>) -> Router {
    Router::new()
        .route("/ack/{incident}/{token}", get(show).post(acknowledge))
        .with_state(page)
}

/// The page's route and the style sheet it uses, alone: for `[acknowledgement] listen`.
pub(crate) fn standalone(page: Arc<AckPage>) -> Router {
    routes(page)
        .route("/assets/console.css", get(reply::stylesheet))
        .route("/assets/console.js", get(reply::script))
        .fallback(not_found)
}

#[derive(Template)]
#[template(path = "ack/incident.html")]
struct IncidentPage {
    layout: reply::Layout,
    /// The incident's subject; for a digest's link, how many incidents it covers.
    title: String,
    incidents: Vec<IncidentRow>,
    /// Some incident is open or exhausted: the button is offered.
    takes_acknowledgement: bool,
    recipient: String,
    expires: String,
    needs_pin: bool,
}

/// One incident a link covers, as the page shows it.
struct IncidentRow {
    id: i64,
    subject: String,
    list: String,
    site: String,
    priority: String,
    status: String,
    opened: String,
    pages: u32,
    /// Who acknowledged it first, and how; empty while nobody has.
    acknowledged: String,
}

impl IncidentRow {
    fn of(view: IncidentView) -> Self {
        let acknowledged = view
            .acknowledged
            .as_ref()
            .map(|a| {
                format!(
                    "by {} ({}) at {} UTC",
                    a.by,
                    a.means.as_str(),
                    a.at.format("%Y-%m-%d %H:%M:%S")
                )
            })
            .unwrap_or_default();
        Self {
            id: view.id.0,
            subject: view.subject,
            list: view.list,
            site: view.site,
            priority: view.priority.to_string(),
            status: view.status.as_str().to_owned(),
            opened: format!("{} UTC", view.opened_at.format("%Y-%m-%d %H:%M:%S")),
            pages: view.page_count,
            acknowledged,
        }
    }
}

#[derive(Template)]
#[template(path = "ack/answer.html")]
struct Answer {
    layout: reply::Layout,
    title: String,
    message: String,
    /// The message reports success (`.notice`) rather than a refusal (`.error`).
    ok: bool,
}

fn layout() -> reply::Layout {
    reply::Layout {
        user: None,
        flash: None,
        nav: "",
    }
}

fn answer(status: StatusCode, title: &str, message: impl Into<String>) -> Response {
    reply::page(
        status,
        &Answer {
            layout: layout(),
            title: title.to_owned(),
            message: message.into(),
            ok: status.is_success(),
        },
        None,
    )
}

async fn not_found() -> Response {
    answer(
        StatusCode::NOT_FOUND,
        "Not found",
        "This address serves acknowledgement links only.",
    )
}

/// `GET /ack/{incident}/{token}`: the incidents the link covers and the button, or why the
/// link is refused.
async fn show(
    State(page): State<Shared>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path((incident, token)): Path<(String, String)>,
) -> Response {
    let peer = peer.map(|Extension(ConnectInfo(addr))| addr);
    let claim = match page.check(peer, &incident, &token) {
        Ok(claim) => claim,
        Err(refused) => return *refused,
    };
    let mut rows = Vec::new();
    let mut takes_acknowledgement = false;
    for id in claim.incidents() {
        match page.desk.summary(id).await {
            // One purged since is left out; all of them gone is said so.
            Ok(Some(view)) => {
                takes_acknowledgement |= matches!(
                    view.status,
                    IncidentStatus::Open | IncidentStatus::Exhausted
                );
                rows.push(IncidentRow::of(view));
            }
            Ok(None) => {}
            Err(e) => return unavailable(&e),
        }
    }
    let title = match rows.as_slice() {
        [] => return gone(claim.incident),
        [one] if claim.also.is_empty() => one.subject.clone(),
        _ => format!("{} incidents of one digest", rows.len()),
    };
    reply::page(
        StatusCode::OK,
        &IncidentPage {
            layout: layout(),
            title,
            incidents: rows,
            takes_acknowledgement,
            recipient: claim.recipient,
            expires: format!("{} UTC", claim.expires.format("%Y-%m-%d %H:%M")),
            needs_pin: page.links.needs_pin(),
        },
        None,
    )
}

/// `POST /ack/{incident}/{token}`: acknowledges the incidents the link covers as its recipient.
async fn acknowledge(
    State(page): State<Shared>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path((incident, token)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let peer = peer.map(|Extension(ConnectInfo(addr))| addr);
    let claim = match page.check(peer, &incident, &token) {
        Ok(claim) => claim,
        Err(refused) => return *refused,
    };
    let form = Form::from_body(&body);
    if !page.links.pin_matches(form.get("pin").unwrap_or_default()) {
        page.auth.failed_logins().failed(
            peer.map(|a| a.ip()),
            Via::AckLink,
            "wrong acknowledgement PIN",
            Instant::now(),
        );
        return answer(
            StatusCode::FORBIDDEN,
            "Wrong PIN",
            "The PIN is not right, so nothing was acknowledged. Go back and try again.",
        );
    }
    let from = peer.map(|a| a.to_string());
    let mut said = Vec::new();
    let mut first = 0;
    for id in claim.incidents() {
        let ack = Acknowledgement::new(
            Actor::new(&claim.recipient),
            AckMeans::Link,
            from.as_deref(),
        );
        match page.desk.acknowledge(id, ack).await {
            Ok(result) => {
                if matches!(result, AckResult::Acknowledged { .. }) {
                    first += 1;
                    tracing::info!(incident = id.0, actor = %claim.recipient, "incident acknowledged by link");
                }
                said.push(outcome(id, &result));
            }
            Err(e) => return unavailable(&e),
        }
    }
    let title = match first {
        0 => "Already acknowledged",
        _ => "Acknowledged",
    };
    answer(StatusCode::OK, title, said.join(" "))
}

/// What acknowledging incident `id` did, as the answer says it.
fn outcome(id: IncidentId, result: &AckResult) -> String {
    match result {
        AckResult::Acknowledged { stopped } => format!(
            "You acknowledged incident {id}: its escalation has stopped ({stopped} page{} not \
             yet sent were ended).",
            if *stopped == 1 { "" } else { "s" }
        ),
        AckResult::AlreadyAcknowledged { by, means, at } => format!(
            "Incident {id} was already acknowledged by {by} ({}) at {} UTC; yours is recorded \
             too.",
            means.as_str(),
            at.format("%Y-%m-%d %H:%M:%S")
        ),
        AckResult::AlreadyEnded { status, at } => format!(
            "Incident {id} had already ended ({}) at {} UTC; your acknowledgement is recorded, \
             and nothing was reopened.",
            status.as_str(),
            at.format("%Y-%m-%d %H:%M:%S")
        ),
        AckResult::NotFound => format!(
            "Incident {id} is no longer kept by central (it ended long ago and was purged)."
        ),
    }
}

impl AckPage {
    /// The claim of a link whose path is `incident`/`token`, from `peer`; or the page that
    /// refuses it (a blocked client, a link that does not verify, one that expired).
    fn check(
        &self,
        peer: Option<SocketAddr>,
        incident: &str,
        token: &str,
    ) -> Result<LinkClaim, Box<Response>> {
        let now = Instant::now();
        let ip = peer.map(|a| a.ip());
        let logins = self.auth.failed_logins();
        if let Err(throttled) = logins.check(ip, Via::AckLink, now) {
            let mut refused = answer(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many attempts",
                format!(
                    "Too many links that are not valid (or wrong PINs) came from {}; try again \
                     in {} seconds.",
                    throttled.client,
                    throttled.retry_after_secs()
                ),
            );
            if let Ok(value) = HeaderValue::from_str(&throttled.retry_after_secs().to_string()) {
                refused.headers_mut().insert(header::RETRY_AFTER, value);
            }
            return Err(Box::new(refused));
        }
        let refusal = match incident.parse::<i64>() {
            Ok(id) => match self.links.verify(IncidentId(id), token, chrono::Utc::now()) {
                Ok(claim) => return Ok(claim),
                Err(refusal) => (Some(id), refusal),
            },
            Err(_) => (None, Refusal::Malformed),
        };
        Err(Box::new(match refusal {
            (Some(id), Refusal::Expired(at)) => answer(
                StatusCode::GONE,
                "Link expired",
                format!(
                    "This link stopped working at {} UTC, so nothing was acknowledged. \
                     Acknowledge incident {id} in the console, or with `outboxctl ack {id}`.",
                    at.format("%Y-%m-%d %H:%M")
                ),
            ),
            (_, refusal) => {
                let why = if refusal == Refusal::Forged {
                    "acknowledgement link whose signature does not verify"
                } else {
                    "malformed acknowledgement link"
                };
                logins.failed(ip, Via::AckLink, why, now);
                answer(
                    StatusCode::FORBIDDEN,
                    "Link not valid",
                    "This acknowledgement link is not valid: it was altered or cut short, it \
                     belongs to another incident, or it was signed with a key central no longer \
                     has. Nothing was acknowledged.",
                )
            }
        }))
    }
}

/// The incident of a valid link is no longer stored (purged with the retention).
fn gone(id: IncidentId) -> Response {
    answer(
        StatusCode::NOT_FOUND,
        "No such incident",
        format!("Incident {id} is no longer kept by central (it ended long ago and was purged)."),
    )
}

fn unavailable(e: &StoreError) -> Response {
    tracing::warn!(error = %e, "acknowledgement page: the store is unavailable");
    answer(
        StatusCode::SERVICE_UNAVAILABLE,
        "Try again",
        "Central cannot reach its database just now, so nothing was acknowledged; try again in \
         a moment.",
    )
}
