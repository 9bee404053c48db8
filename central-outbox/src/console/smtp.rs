//! The email channel's settings (GetSmtpConfig, read by every role) and, for admins, their edit
//! form (UpsertSmtpConfig); others see the same fields read-only. The password and the OAuth
//! client secret are write-only: never put back into the page, and an empty field keeps the
//! stored one (the API's "unset keeps it", with the API's rule: only for the same relay and
//! token endpoint, so a move needs the secret typed again).

use askama::Template;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use outbox_proto::time::to_duration;
use outbox_proto::v1;

use super::display;
use super::reply::{self, Failure, Form, Layout};
use super::session::Flash;
use super::{Shared, Visit, visit_post};
use crate::auth::Role;
use crate::domain::channel::TlsMode;
use crate::domain::smtp_relay::{self, SmtpRelay};

/// The form's fields as text (secrets excepted: only whether one is stored).
#[derive(Default)]
struct SmtpForm {
    host: String,
    port: String,
    tls_mode: String,
    username: String,
    password_set: bool,
    from_address: String,
    max_retries: String,
    retry_delay: String,
    backoff: String,
    max_retry_delay: String,
    max_concurrent_connections: String,
    timeout: String,
    overall_timeout: String,
    rate_limit_per_second: String,
    rate_limit_burst: String,
    auth_mechanism: String,
    oauth_token_url: String,
    oauth_client_id: String,
    oauth_client_secret_set: bool,
    oauth_scope: String,
    /// One relay per line, in the text form (`domain::smtp_relay`).
    fallback_relays: String,
}

fn strip(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_owned()
}

impl SmtpForm {
    fn from_config(c: &v1::SmtpConfig) -> Self {
        Self {
            host: c.host.clone(),
            port: c.port.to_string(),
            tls_mode: v1::SmtpTlsMode::try_from(c.tls_mode)
                .map(|m| strip(m.as_str_name(), "SMTP_TLS_MODE_"))
                .unwrap_or_default(),
            username: c.username.clone(),
            password_set: c.password_set,
            from_address: c.from_address.clone(),
            max_retries: c.max_retries.to_string(),
            retry_delay: display::duration(c.retry_delay.as_ref()),
            backoff: v1::RetryBackoff::try_from(c.backoff)
                .map(|b| strip(b.as_str_name(), "RETRY_BACKOFF_"))
                .unwrap_or_default(),
            max_retry_delay: display::duration(c.max_retry_delay.as_ref()),
            max_concurrent_connections: c.max_concurrent_connections.to_string(),
            timeout: display::duration(c.timeout.as_ref()),
            overall_timeout: display::duration(c.overall_timeout.as_ref()),
            rate_limit_per_second: c
                .rate_limit_per_second
                .map(|r| r.to_string())
                .unwrap_or_default(),
            rate_limit_burst: c.rate_limit_burst.to_string(),
            auth_mechanism: v1::SmtpAuthMechanism::try_from(c.auth_mechanism)
                .map(|m| strip(m.as_str_name(), "SMTP_AUTH_MECHANISM_"))
                .unwrap_or_default(),
            oauth_token_url: c.oauth_token_url.clone(),
            oauth_client_id: c.oauth_client_id.clone(),
            oauth_client_secret_set: c.oauth_client_secret_set,
            oauth_scope: c.oauth_scope.clone(),
            fallback_relays: c
                .fallback_relays
                .iter()
                .map(|r| {
                    let tls = v1::SmtpTlsMode::try_from(r.tls_mode)
                        .map(|m| strip(m.as_str_name(), "SMTP_TLS_MODE_").to_lowercase())
                        .unwrap_or_default();
                    let port = u16::try_from(r.port).unwrap_or_default();
                    format!("{} {tls}", smtp_relay::address(&r.host, port))
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    fn from_form(form: &Form) -> Self {
        Self {
            host: form.text("host"),
            port: form.text("port"),
            tls_mode: form.text("tls_mode").to_uppercase(),
            username: form.text("username"),
            password_set: false,
            from_address: form.text("from_address"),
            max_retries: form.text("max_retries"),
            retry_delay: form.text("retry_delay"),
            backoff: form.text("backoff").to_uppercase(),
            max_retry_delay: form.text("max_retry_delay"),
            max_concurrent_connections: form.text("max_concurrent_connections"),
            timeout: form.text("timeout"),
            overall_timeout: form.text("overall_timeout"),
            rate_limit_per_second: form.text("rate_limit_per_second"),
            rate_limit_burst: form.text("rate_limit_burst"),
            auth_mechanism: form.text("auth_mechanism").to_uppercase(),
            oauth_token_url: form.text("oauth_token_url"),
            oauth_client_id: form.text("oauth_client_id"),
            oauth_client_secret_set: false,
            oauth_scope: form.text("oauth_scope"),
            fallback_relays: form.text("fallback_relays"),
        }
    }
}

#[derive(Template)]
#[template(path = "console/smtp.html")]
struct SmtpPage {
    layout: Layout,
    form: SmtpForm,
    /// Nothing stored yet.
    missing: bool,
    updated: String,
    /// An admin's page: the form can be saved (others see it disabled).
    editable: bool,
    csrf: String,
    error: Option<String>,
}

/// `GET /smtp`.
pub(super) async fn show(State(console): State<Shared>, visit: Visit) -> Response {
    let answer = console
        .outbox
        .get_smtp_config(visit.request(v1::GetSmtpConfigRequest {}))
        .await;
    let (form, missing, updated) = match answer {
        Ok(config) => {
            let config = config.into_inner();
            (
                SmtpForm::from_config(&config),
                false,
                display::time(config.updated_at.as_ref()),
            )
        }
        Err(status) if status.code() == tonic::Code::NotFound => (
            SmtpForm {
                port: "25".into(),
                tls_mode: "STARTTLS".into(),
                ..SmtpForm::default()
            },
            true,
            String::new(),
        ),
        Err(status) => return reply::error_page(Some(visit.layout("smtp")), status.into()),
    };
    let page = SmtpPage {
        layout: visit.layout("smtp"),
        form,
        missing,
        updated,
        editable: visit.role() >= Role::Admin,
        csrf: visit.session.csrf.clone(),
        error: None,
    };
    reply::page(StatusCode::OK, &page, visit.set_cookie.as_deref())
}

fn number<T: std::str::FromStr + Default>(form: &Form, field: &str) -> Result<T, Failure> {
    let text = form.text(field);
    if text.is_empty() {
        return Ok(T::default());
    }
    text.parse()
        .map_err(|_| Failure::bad_request(format!("{field}: {text:?} is not a number")))
}

fn duration(form: &Form, field: &str) -> Result<Option<prost_types::Duration>, Failure> {
    let text = form.text(field);
    if text.is_empty() {
        return Ok(None);
    }
    humantime::parse_duration(&text)
        .map(|d| Some(to_duration(d)))
        .map_err(|e| {
            Failure::bad_request(format!(
                "{field}: {text:?} is not a duration such as 30s or 5m ({e})"
            ))
        })
}

/// An upper-case choice among the API enum's names (without their prefix); empty is
/// UNSPECIFIED, which the API reads as its default.
fn choice(
    form: &Form,
    field: &str,
    prefix: &str,
    parse: fn(&str) -> Option<i32>,
) -> Result<i32, Failure> {
    let text = form.text(field).to_uppercase();
    if text.is_empty() {
        return Ok(0);
    }
    parse(&format!("{prefix}{text}"))
        .filter(|v| *v != 0)
        .ok_or_else(|| Failure::bad_request(format!("{field}: {text:?} is not a choice here")))
}

fn to_request(form: &Form) -> Result<v1::UpsertSmtpConfigRequest, Failure> {
    // Write-only: an empty field keeps what is stored.
    let secret = |field: &str| Some(form.text(field)).filter(|s| !s.is_empty());
    let rate = form.text("rate_limit_per_second");
    Ok(v1::UpsertSmtpConfigRequest {
        host: form.text("host"),
        port: number(form, "port")?,
        tls_mode: choice(form, "tls_mode", "SMTP_TLS_MODE_", |n| {
            v1::SmtpTlsMode::from_str_name(n).map(i32::from)
        })?,
        username: form.text("username"),
        password: secret("password"),
        from_address: form.text("from_address"),
        max_retries: number(form, "max_retries")?,
        retry_delay: duration(form, "retry_delay")?,
        max_concurrent_connections: number(form, "max_concurrent_connections")?,
        timeout: duration(form, "timeout")?,
        auth_mechanism: choice(form, "auth_mechanism", "SMTP_AUTH_MECHANISM_", |n| {
            v1::SmtpAuthMechanism::from_str_name(n).map(i32::from)
        })?,
        oauth_token_url: form.text("oauth_token_url"),
        oauth_client_id: form.text("oauth_client_id"),
        oauth_client_secret: secret("oauth_client_secret"),
        oauth_scope: form.text("oauth_scope"),
        backoff: choice(form, "backoff", "RETRY_BACKOFF_", |n| {
            v1::RetryBackoff::from_str_name(n).map(i32::from)
        })?,
        max_retry_delay: duration(form, "max_retry_delay")?,
        rate_limit_per_second: if rate.is_empty() {
            None
        } else {
            Some(number(form, "rate_limit_per_second")?)
        },
        rate_limit_burst: number(form, "rate_limit_burst")?,
        overall_timeout: duration(form, "overall_timeout")?,
        fallback_relays: fallback_relays(form)?,
    })
}

/// The fallback relays field, read by the text form's one parser.
fn fallback_relays(form: &Form) -> Result<Vec<v1::SmtpRelay>, Failure> {
    let relays = SmtpRelay::parse_list(&form.text("fallback_relays"))
        .map_err(|e| Failure::bad_request(format!("{}: {}", e.field, e.problem)))?;
    Ok(relays
        .iter()
        .map(|r| v1::SmtpRelay {
            host: r.host().to_owned(),
            port: u32::from(r.port()),
            tls_mode: match r.tls() {
                TlsMode::None => v1::SmtpTlsMode::None,
                TlsMode::StartTls => v1::SmtpTlsMode::Starttls,
                TlsMode::Implicit => v1::SmtpTlsMode::Tls,
            }
            .into(),
        })
        .collect())
}

/// `POST /smtp`: UpsertSmtpConfig; back to the page, or the form again with the API's message.
pub(super) async fn save(
    State(console): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = Form::from_body(&body);
    let visit = match visit_post(&console, &headers, &form) {
        Ok(visit) => visit,
        Err(refused) => return *refused,
    };
    let failure = match to_request(&form) {
        Ok(request) => {
            match console
                .outbox
                .upsert_smtp_config(visit.request(request))
                .await
            {
                Ok(_) => {
                    console.flash(&visit, Flash::notice("SMTP settings saved."));
                    return reply::redirect("/smtp");
                }
                Err(status) => Failure::from(status),
            }
        }
        Err(failure) => failure,
    };
    form_again(&visit, &form, failure)
}

fn form_again(visit: &Visit, form: &Form, failure: Failure) -> Response {
    let page = SmtpPage {
        layout: visit.layout("smtp"),
        form: SmtpForm::from_form(form),
        missing: false,
        updated: String::new(),
        editable: visit.role() >= Role::Admin,
        csrf: visit.session.csrf.clone(),
        error: Some(failure.message),
    };
    reply::page(failure.status, &page, visit.set_cookie.as_deref())
}
