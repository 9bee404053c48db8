//! Email delivery over SMTP with lettre: one plain-text message per notification, every list
//! member in BCC (recipients never see each other), and a `Message-ID` derived from the
//! NotificationId so a duplicate send after a crash is recognisable as the same message.
//!
//! The SMTP transport (and its connection pool) is built once per distinct settings value and
//! reused; a settings change in the database builds a new one on the next attempt.
//!
//! Classification (DESIGN §5): a 5xx reply is permanent; a 4xx reply, or a connect, TLS, I/O or
//! timeout error, is transient; an invalid address or an empty list is permanent.

use std::sync::{Arc, Mutex};

use lettre::message::header::ContentType;
use lettre::message::{Mailbox, Message};
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::transport::smtp::{self, PoolConfig};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use crate::domain::channel::{NotificationList, SmtpAuth, SmtpSettings, TlsMode};
use crate::domain::delivery::{Delivered, DeliveryError};
use crate::domain::{NotificationContent, NotificationId};

type Transport = AsyncSmtpTransport<Tokio1Executor>;

/// Sends notifications as email. Cheap to share; clones of the transport share its pool.
#[derive(Default)]
pub struct EmailAdapter {
    /// The transport for the settings last used. Settings rarely change, so a plain mutex around
    /// a clone-out is enough; it is never held across an await.
    current: Mutex<Option<(SmtpSettings, Arc<Transport>)>>,
}

impl std::fmt::Debug for EmailAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailAdapter").finish_non_exhaustive()
    }
}

impl EmailAdapter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends `content` to every member of `list` using `settings`.
    pub async fn deliver(
        &self,
        settings: &SmtpSettings,
        id: NotificationId,
        content: &NotificationContent,
        list: &NotificationList,
    ) -> Result<Delivered, DeliveryError> {
        if list.recipients.is_empty() {
            return Err(DeliveryError::permanent(format!(
                "notification list {:?} has no recipients",
                list.name.as_str()
            )));
        }
        let message = build_message(settings, id, content, list)?;
        let transport = self.transport_for(settings)?;
        match transport.send(message).await {
            Ok(_) => Ok(Delivered {
                resolved_targets: list.recipients.iter().map(ToString::to_string).collect(),
            }),
            Err(e) => Err(classify(&e)),
        }
    }

    fn transport_for(&self, settings: &SmtpSettings) -> Result<Arc<Transport>, DeliveryError> {
        let mut current = self
            .current
            .lock()
            .map_err(|_| DeliveryError::transient("email transport lock poisoned"))?;
        if let Some((used, transport)) = current.as_ref()
            && used == settings
        {
            return Ok(Arc::clone(transport));
        }
        let transport = Arc::new(build_transport(settings)?);
        *current = Some((settings.clone(), Arc::clone(&transport)));
        Ok(transport)
    }
}

fn build_transport(s: &SmtpSettings) -> Result<Transport, DeliveryError> {
    let tls_parameters = || {
        TlsParameters::new(s.host.clone())
            .map_err(|e| DeliveryError::permanent(format!("cannot set up TLS for {}: {e}", s.host)))
    };
    let tls = match s.tls {
        TlsMode::None => Tls::None,
        TlsMode::StartTls => Tls::Required(tls_parameters()?),
        TlsMode::Implicit => Tls::Wrapper(tls_parameters()?),
    };
    let mut builder = Transport::builder_dangerous(s.host.as_str())
        .port(s.port)
        .tls(tls)
        .timeout(Some(s.timeout))
        .pool_config(PoolConfig::new().max_size(s.max_concurrent_connections.max(1)));
    if let SmtpAuth::Password { username, password } = &s.auth {
        builder = builder
            .credentials(Credentials::new(
                username.clone(),
                password.expose().to_owned(),
            ))
            .authentication(vec![Mechanism::Plain, Mechanism::Login]);
    }
    Ok(builder.build())
}

fn build_message(
    s: &SmtpSettings,
    id: NotificationId,
    content: &NotificationContent,
    list: &NotificationList,
) -> Result<Message, DeliveryError> {
    let from: Mailbox = s.from_address.as_str().parse().map_err(|e| {
        DeliveryError::permanent(format!(
            "from_address {:?} is invalid: {e}",
            s.from_address.as_str()
        ))
    })?;
    let mut builder = Message::builder()
        .from(from)
        .subject(content.subject.as_str())
        .message_id(Some(format!("<{id}@{}>", s.from_address.domain())))
        .header(ContentType::TEXT_PLAIN);
    for recipient in &list.recipients {
        let mailbox: Mailbox = recipient.as_str().parse().map_err(|e| {
            DeliveryError::permanent(format!(
                "recipient {:?} is invalid: {e}",
                recipient.as_str()
            ))
        })?;
        builder = builder.bcc(mailbox);
    }
    builder
        .body(content.body.as_str().to_owned())
        .map_err(|e| DeliveryError::permanent(format!("cannot build the message: {e}")))
}

/// Maps a lettre SMTP error to what happens next. Only reply codes decide permanence; anything
/// without a reply (connect refused, TLS, I/O, timeout) may succeed later.
fn classify(e: &smtp::Error) -> DeliveryError {
    let message = describe(e);
    if e.is_permanent() {
        DeliveryError::Permanent(message)
    } else {
        DeliveryError::Transient(message)
    }
}

/// The error text with its reply code, and without anything lettre might echo from the
/// connection URL or credentials.
fn describe(e: &smtp::Error) -> String {
    let mut text = e.to_string();
    if let Some(source) = std::error::Error::source(e) {
        let source = source.to_string();
        if !text.contains(&source) {
            text = format!("{text}: {source}");
        }
    }
    match e.status() {
        Some(code) if !text.contains(&code.to_string()) => format!("SMTP {code}: {text}"),
        _ => text,
    }
}
