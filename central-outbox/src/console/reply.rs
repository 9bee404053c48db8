//! What the console answers with: pages in the common frame, redirects, error pages whose
//! status says whose fault it was (4xx for what the operator sent, 503 when the store is
//! away), the embedded style sheet and script, and the posted forms they send back.
//!
//! Every page goes out with headers that keep it to itself: no framing, no sniffing, no
//! caching, no referrer (list URLs carry filters and page tokens), and a content security
//! policy that runs only the console's own script.

use askama::Template;
use axum::body::Bytes;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::session::Flash;

/// The frame of every page.
pub(super) struct Layout {
    pub user: Option<User>,
    pub flash: Option<Flash>,
    /// Which navigation entry is current.
    pub nav: &'static str,
}

pub(super) struct User {
    /// "<name> (<role>)".
    pub whoami: String,
    /// For the logout form.
    pub csrf: String,
}

/// Why a page could not be shown, as the operator reads it.
#[derive(Debug)]
pub(super) struct Failure {
    pub status: StatusCode,
    pub message: String,
}

impl Failure {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(super) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }

    pub(super) fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    pub(super) fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }
}

/// The admin API's refusals keep their message; the code picks the HTTP status. Anything
/// that is not the request's fault is "try again later" (503): the console never blames
/// itself with a 500 for what the store or the network did.
impl From<tonic::Status> for Failure {
    fn from(status: tonic::Status) -> Self {
        use tonic::Code;
        let http = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(http, status.message())
    }
}

#[derive(Template)]
#[template(path = "console/error.html")]
struct ErrorPage {
    layout: Layout,
    message: String,
    /// Offer the login page (the failure was about the session).
    login: bool,
}

/// A page with `.error` holding the failure's message, under the failure's status.
pub(super) fn error_page(layout: Option<Layout>, failure: Failure) -> Response {
    let layout = layout.unwrap_or(Layout {
        user: None,
        flash: None,
        nav: "",
    });
    let login = failure.status == StatusCode::UNAUTHORIZED;
    page(
        failure.status,
        &ErrorPage {
            layout,
            message: failure.message,
            login,
        },
        None,
    )
}

/// `template` rendered, with the page headers and `set_cookie` when given.
pub(super) fn page<T: Template>(
    status: StatusCode,
    template: &T,
    set_cookie: Option<&str>,
) -> Response {
    let html = match template.render() {
        Ok(html) => html,
        Err(e) => {
            tracing::error!(error = %e, "console page cannot be rendered");
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the console cannot render this page",
            )
                .into_response();
        }
    };
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    protect(headers);
    if let Some(cookie) = set_cookie.and_then(|c| HeaderValue::from_str(c).ok()) {
        headers.append(header::SET_COOKIE, cookie);
    }
    response
}

fn protect(headers: &mut axum::http::HeaderMap) {
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

/// 303 See Other to `location` (after a form post, so a reload does not post again), setting
/// `cookies`.
pub(super) fn redirect_with(location: &str, cookies: &[String]) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(location) {
        headers.insert(header::LOCATION, location);
    }
    for cookie in cookies {
        if let Ok(cookie) = HeaderValue::from_str(cookie) {
            headers.append(header::SET_COOKIE, cookie);
        }
    }
    protect(headers);
    response
}

pub(super) fn redirect(location: &str) -> Response {
    redirect_with(location, &[])
}

/// Any path the console does not serve.
pub(super) async fn not_found() -> Response {
    error_page(
        None,
        Failure::new(
            StatusCode::NOT_FOUND,
            "There is no such page in the console.",
        ),
    )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Small and changed only with the binary: an hour saves requests without making an
    // upgrade's new look wait long.
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

pub(super) async fn stylesheet() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("../../templates/console/assets/console.css"),
    )
}

pub(super) async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("../../templates/console/assets/console.js"),
    )
}

/// A posted `application/x-www-form-urlencoded` body (every console form), or a query string.
#[derive(Debug, Default)]
pub(super) struct Form(Vec<(String, String)>);

impl Form {
    pub(super) fn parse(bytes: &[u8]) -> Self {
        Self(url::form_urlencoded::parse(bytes).into_owned().collect())
    }

    pub(super) fn from_body(body: &Bytes) -> Self {
        Self::parse(body)
    }

    /// The first value of `name`.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The first value of `name`, trimmed; empty when absent.
    pub(super) fn text(&self, name: &str) -> String {
        self.get(name).map(str::trim).unwrap_or_default().to_owned()
    }

    pub(super) fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}
