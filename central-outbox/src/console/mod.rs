//! The operators' web console: server-rendered HTML pages over HTTP, served by central itself
//! when `[console] listen` is set, with every template, style sheet and script compiled into
//! the binary.
//!
//! The console is a client of the admin API that happens to live in the same process: every
//! read and every change is a call of the `NotificationOutbox` service (the very instance the
//! gRPC port serves) with a `tonic::Request` carrying the logged-in operator as an
//! [`auth::ConsoleCaller`](crate::auth::ConsoleCaller). So validation, role checks, the actor
//! recorded in the history and the configuration cache's invalidation are exactly the API's;
//! the console only turns forms into requests and answers into pages. A refusal is shown with
//! the API's own message.
//!
//! Pages work without JavaScript; a small script refreshes the live parts (elements marked
//! `data-live`) every few seconds. Markup follows the contract the browser test relies on
//! (ids, classes and data attributes named in each template).
//!
//! Invariants: every POST carries the session's CSRF token (checked before anything else);
//! input the console cannot read is a 4xx page naming the field, never a 5xx; the store being
//! unavailable is a 503 page.

pub(crate) mod ack_page;
mod bulk;
mod dashboard;
mod display;
mod filter;
mod incidents;
mod listener;
mod lists;
mod login;
mod notifications;
mod reply;
pub(crate) mod session;
mod smtp;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use metrics_endpoint::ListenerStats;
use outbox_proto::v1::notification_outbox_server::NotificationOutbox;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{Authenticator, ConsoleCaller, Role};
use crate::config::ConsoleSettings;
use crate::grpc::ingest::SiteIdentity;
use reply::Failure;
use session::{ActiveSession, Flash, Lookup, SESSION_COOKIE, Sessions, Use};

/// The request header the pages' refresh script sends: such a request reads the session
/// without counting as the operator's use of it.
const REFRESH_HEADER: &str = "x-console-refresh";

/// What every handler shares.
pub(crate) struct Console {
    /// The admin service the gRPC port serves, called in-process.
    outbox: Arc<dyn NotificationOutbox>,
    auth: Authenticator,
    sessions: Sessions,
    /// Served over TLS: cookies are marked `Secure`.
    secure: bool,
    /// Whether ingest tells sites apart; the dashboard warns when it does not.
    site_identity: SiteIdentity,
    /// The acknowledgement links' page, served with the console unless it has a listener of
    /// its own.
    ack_page: Option<Arc<ack_page::AckPage>>,
}

/// For the e2e listener tests, through `crate::testing`.
#[cfg(any(test, feature = "test-support"))]
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub use listener::CONSOLE_LIMITS;

pub(crate) use listener::Peer;

type Shared = Arc<Console>;

impl Console {
    pub(crate) fn new(
        outbox: Arc<dyn NotificationOutbox>,
        auth: Authenticator,
        settings: &ConsoleSettings,
        secure: bool,
    ) -> Self {
        Self {
            outbox,
            auth,
            sessions: Sessions::new(settings.idle_timeout, settings.lifetime),
            secure,
            site_identity: SiteIdentity::default(),
            ack_page: None,
        }
    }

    /// Serves the acknowledgement links' page too (`/ack/...`).
    pub(crate) fn with_ack_page(mut self, page: Option<Arc<ack_page::AckPage>>) -> Self {
        self.ack_page = page;
        self
    }

    /// What ingest holds callers to (see `grpc::ingest::SiteIdentity`), for the dashboard.
    pub(crate) fn with_site_identity(mut self, site_identity: SiteIdentity) -> Self {
        self.site_identity = site_identity;
        self
    }

    /// The session of a request, if it has a live one. With authentication off, a visitor
    /// without one gets a new session as the console's open identity.
    fn visit(&self, headers: &HeaderMap) -> Result<Visit, NoSession> {
        let usage = if headers.contains_key(REFRESH_HEADER) {
            Use::Refresh
        } else {
            Use::Active
        };
        let found = headers
            .get_all(axum::http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|v| session::cookie(v, SESSION_COOKIE))
            .map_or(Lookup::Unknown, |id| {
                self.sessions.lookup(id, Instant::now(), usage)
            });
        match found {
            Lookup::Active(session) => Ok(Visit {
                session,
                set_cookie: None,
            }),
            _ if self.auth.is_open() => {
                let caller = self.auth.login("", None).map_err(|_| NoSession::Unknown)?;
                self.start_session(caller).map_err(|_| NoSession::Unknown)
            }
            Lookup::Expired => Err(NoSession::Expired),
            Lookup::Unknown => Err(NoSession::Unknown),
        }
    }

    /// A new session for `caller`, with the cookie that carries it.
    fn start_session(&self, caller: ConsoleCaller) -> Result<Visit, Failure> {
        let id = self
            .sessions
            .create(caller, Instant::now())
            .map_err(|e| Failure::unavailable(e.to_string()))?;
        let set_cookie = session::set_cookie(SESSION_COOKIE, &id, "/", self.secure, None);
        match self.sessions.lookup(&id, Instant::now(), Use::Active) {
            Lookup::Active(session) => Ok(Visit {
                session,
                set_cookie: Some(set_cookie),
            }),
            _ => Err(Failure::unavailable(
                "the new session vanished; log in again",
            )),
        }
    }

    fn flash(&self, visit: &Visit, flash: Flash) {
        self.sessions.set_flash(&visit.session.id, flash);
    }
}

/// Why a request has no session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoSession {
    Expired,
    Unknown,
}

/// One request's logged-in operator.
struct Visit {
    session: ActiveSession,
    /// A cookie to set with the answer (a session started by this request).
    set_cookie: Option<String>,
}

impl Visit {
    /// `msg` as a call to the admin service by this operator.
    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(msg);
        request.extensions_mut().insert(self.session.caller.clone());
        request
    }

    fn role(&self) -> Role {
        self.session.caller.role()
    }

    /// The page frame: who is logged in, the logout form's token and the flash message.
    fn layout(&self, nav: &'static str) -> reply::Layout {
        reply::Layout {
            user: Some(reply::User {
                whoami: format!(
                    "{} ({})",
                    self.session.caller.name(),
                    self.session.caller.role()
                ),
                csrf: self.session.csrf.clone(),
            }),
            flash: self.session.flash.clone(),
            nav,
        }
    }
}

/// Every page and action of the console, and the acknowledgement links' page when it is
/// served here.
pub(crate) fn router(console: Arc<Console>) -> Router {
    let links_page = console.ack_page.clone();
    let router = Router::new()
        .route("/", get(dashboard::show))
        .route("/login", get(login::form).post(login::submit))
        .route("/logout", post(login::logout))
        .route("/notifications", get(notifications::list))
        .route("/notifications/bulk", get(bulk::confirm).post(bulk::apply))
        .route("/notifications/{id}", get(notifications::detail))
        .route("/notifications/{id}/{action}", post(notifications::act))
        .route("/incidents", get(incidents::list))
        .route(
            "/incidents/acknowledge",
            post(incidents::acknowledge_ticked),
        )
        .route("/incidents/{id}", get(incidents::detail))
        .route(
            "/incidents/{id}/acknowledge",
            post(incidents::acknowledge_one),
        )
        .route("/lists", get(lists::index))
        .route("/lists/{name}", get(lists::show).post(lists::save))
        .route("/smtp", get(smtp::show).post(smtp::save))
        .route("/assets/console.css", get(reply::stylesheet))
        .route("/assets/console.js", get(reply::script))
        .fallback(reply::not_found)
        .with_state(console);
    match links_page {
        Some(page) => router.merge(ack_page::routes(page)),
        None => router,
    }
}

/// Serves the console on `listener` until `shutdown`: over TLS with `tls` (see
/// [`crate::tls::TlsSettings::console_config`]; the console must then have been made with
/// `secure`), else plaintext. Connections are bounded by [`listener::CONSOLE_LIMITS`] and
/// counted in `connections`.
pub(crate) async fn serve(
    listener: TcpListener,
    console: Console,
    tls: Option<Arc<rustls::ServerConfig>>,
    connections: ListenerStats,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    tracing::info!(
        addr = ?listener.local_addr().ok(),
        tls = tls.is_some(),
        "serving the web console"
    );
    serve_router(
        listener,
        router(Arc::new(console)),
        tls,
        connections,
        shutdown,
    )
    .await
}

/// Serves the acknowledgement links' page alone on `listener` (`[acknowledgement] listen`)
/// until `shutdown`, over TLS with `tls`, within the console's connection limits.
pub(crate) async fn serve_ack_page(
    listener: TcpListener,
    page: Arc<ack_page::AckPage>,
    tls: Option<Arc<rustls::ServerConfig>>,
    connections: ListenerStats,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    tracing::info!(
        addr = ?listener.local_addr().ok(),
        tls = tls.is_some(),
        "serving the acknowledgement links"
    );
    serve_router(
        listener,
        ack_page::standalone(page),
        tls,
        connections,
        shutdown,
    )
    .await
}

/// Serves `router` on `listener` within the console's connection limits until `shutdown`, over
/// TLS with `tls`, else plaintext.
async fn serve_router(
    listener: TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    connections: ListenerStats,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let limits = listener::CONSOLE_LIMITS;
    match tls {
        Some(config) => {
            listener::serve_tls(listener, router, config, limits, connections, shutdown).await
        }
        None => listener::serve_plain(listener, router, limits, connections, shutdown).await,
    }
}

/// The answer to a request without a session: a page asks to log in (a GET is sent to the
/// login page, a form post is answered with a message, so the operator knows the action did
/// not happen).
fn no_session(why: NoSession, posted: bool) -> Response {
    match (why, posted) {
        (NoSession::Expired, false) => reply::redirect("/login?expired=1"),
        (NoSession::Unknown, false) => reply::redirect("/login"),
        (NoSession::Expired, true) => reply::error_page(
            None,
            Failure::unauthenticated(
                "Your session has expired, so nothing was changed; log in again and repeat the \
                 action.",
            ),
        ),
        (NoSession::Unknown, true) => reply::error_page(
            None,
            Failure::unauthenticated(
                "You are not logged in (or the console restarted), so nothing was changed; log \
                 in and repeat the action.",
            ),
        ),
    }
}

/// A page's visitor, taken by a GET handler as an argument: the handler runs only for a visitor
/// with a session, anyone else is sent to log in.
impl axum::extract::FromRequestParts<Shared> for Visit {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        console: &Shared,
    ) -> Result<Self, Response> {
        console
            .visit(&parts.headers)
            .map_err(|why| no_session(why, false))
    }
}

/// The session of a form post whose `csrf` field is the session's token, or the refusal.
fn visit_post(
    console: &Console,
    headers: &HeaderMap,
    form: &reply::Form,
) -> Result<Visit, Box<Response>> {
    let visit = console
        .visit(headers)
        .map_err(|why| Box::new(no_session(why, true)))?;
    if visit.session.csrf_matches(form.get("csrf")) {
        Ok(visit)
    } else {
        Err(Box::new(reply::error_page(
            Some(visit.layout("")),
            Failure::forbidden(
                "This form is stale or did not come from this console page (its CSRF token does \
                 not match your session), so nothing was changed. Reload the page and try again.",
            ),
        )))
    }
}
