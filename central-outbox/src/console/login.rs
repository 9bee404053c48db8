//! Logging in and out. An operator pastes a bearer token; the [`Authenticator`] checks it by the
//! API's own rules (the same tokens, names and roles) and the console starts a session for
//! that identity. The login form is tied to its browser by a one-off nonce (cookie and hidden
//! field), so another site cannot log a browser in under its own token. A refused token counts
//! as a failed login of the browser's address, with the API's bad tokens; a client with too many
//! is answered 429 with `Retry-After` (see `auth::throttle`).
//!
//! [`Authenticator`]: crate::auth::Authenticator

use std::net::SocketAddr;

use askama::Template;
use axum::Extension;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::reply::{self, Failure, Form, Layout};
use super::session::{self, LOGIN_COOKIE, SESSION_COOKIE};
use super::{Peer, Shared, visit_post};

/// How long a login form stays good: ample to find and paste a token.
const LOGIN_FORM_SECONDS: u64 = 600;

#[derive(Template)]
#[template(path = "console/login.html")]
struct LoginPage {
    layout: Layout,
    nonce: String,
    error: Option<String>,
    /// The Common Name of the client certificate the browser presented, offered as a login.
    certificate: Option<String>,
}

/// The login form, with a fresh nonce; `error` explains why it is shown again.
fn login_page(
    console: &Shared,
    peer: Option<&Peer>,
    status: StatusCode,
    error: Option<String>,
) -> Response {
    let nonce = match session::login_nonce(console.sessions.rng()) {
        Ok(nonce) => nonce,
        Err(e) => return reply::error_page(None, Failure::unavailable(e.to_string())),
    };
    let cookie = session::set_cookie(
        LOGIN_COOKIE,
        &nonce,
        "/login",
        console.secure,
        Some(LOGIN_FORM_SECONDS),
    );
    reply::page(
        status,
        &LoginPage {
            layout: Layout {
                user: None,
                flash: None,
                nav: "login",
            },
            nonce,
            error,
            certificate: peer.and_then(|p| p.client_cn.clone()),
        },
        Some(&cookie),
    )
}

/// `GET /login`: the form, or the dashboard for someone already logged in (and for everyone
/// when authentication is off).
pub(super) async fn form(
    State(console): State<Shared>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let peer = peer.map(|Extension(peer)| peer);
    if console.auth.is_open() || console.visit(&headers).is_ok() {
        return reply::redirect("/");
    }
    let expired = Form::parse(query.unwrap_or_default().as_bytes())
        .get("expired")
        .is_some();
    let error = expired.then(|| "Your session has expired; log in again.".to_owned());
    login_page(&console, peer.as_ref(), StatusCode::OK, error)
}

/// `POST /login`: checks the token (or, with `method=certificate`, the connection's client
/// certificate) and starts a session.
pub(super) async fn submit(
    State(console): State<Shared>,
    peer: Option<Extension<Peer>>,
    remote: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let peer = peer.map(|Extension(peer)| peer);
    let from = remote.map(|Extension(ConnectInfo(addr))| addr.ip());
    let form = Form::from_body(&body);
    let nonce = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| session::cookie(v, LOGIN_COOKIE));
    let paired = match (nonce, form.get("csrf")) {
        (Some(cookie), Some(field)) => session::same_secret(cookie, field),
        _ => false,
    };
    if !paired {
        return login_page(
            &console,
            peer.as_ref(),
            StatusCode::FORBIDDEN,
            Some("The login form had expired; paste your token again.".into()),
        );
    }
    let (field, checked) = if form.get("method") == Some("certificate") {
        let cn = peer.as_ref().and_then(|p| p.client_cn.as_deref());
        (
            "certificate",
            match cn {
                Some(cn) => console.auth.certificate_login(cn),
                None => Err(tonic::Status::unauthenticated(
                    "your browser presented no client certificate on this connection",
                )),
            },
        )
    } else {
        (
            "token",
            console
                .auth
                .login(form.get("token").unwrap_or_default(), from),
        )
    };
    let caller = match checked {
        Ok(caller) => caller,
        Err(status) => {
            tracing::info!(
                client = ?from,
                reason = status.message(),
                "console login refused"
            );
            let wait = crate::auth::retry_after(&status);
            let code = match wait {
                Some(_) => StatusCode::TOO_MANY_REQUESTS,
                None => StatusCode::UNAUTHORIZED,
            };
            let mut page = login_page(
                &console,
                peer.as_ref(),
                code,
                Some(format!("{field}: {}", status.message())),
            );
            if let Some(seconds) = wait {
                page.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            return page;
        }
    };
    tracing::info!(
        name = caller.name(),
        role = %caller.role(),
        "console login"
    );
    match console.start_session(caller) {
        Ok(visit) => {
            let mut cookies: Vec<String> = visit.set_cookie.into_iter().collect();
            cookies.push(session::set_cookie(
                LOGIN_COOKIE,
                "",
                "/login",
                console.secure,
                Some(0),
            ));
            reply::redirect_with("/", &cookies)
        }
        Err(failure) => reply::error_page(None, failure),
    }
}

/// `POST /logout`: ends the session.
pub(super) async fn logout(
    State(console): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = Form::from_body(&body);
    let visit = match visit_post(&console, &headers, &form) {
        Ok(visit) => visit,
        Err(refused) => return *refused,
    };
    console.sessions.end(&visit.session.id);
    tracing::info!(name = visit.session.caller.name(), "console logout");
    let gone = session::set_cookie(SESSION_COOKIE, "", "/", console.secure, Some(0));
    reply::redirect_with("/login", &[gone])
}
