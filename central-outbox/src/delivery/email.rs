//! Email delivery over SMTP with lettre: one plain-text message per notification, to every list
//! member through the envelope only (the header says `To: undisclosed-recipients:;`, so
//! recipients never see each other), and a `Message-ID` derived from the NotificationId so a
//! duplicate send after a crash is recognisable as the same message. How the subject and body
//! are encoded is `mail_format`'s job.
//!
//! Transactions go to an [`SmtpPool`], one per distinct settings value (and XOAUTH2 token): a
//! settings change in the database, or a new token, starts a new pool on the next attempt, so no
//! session authenticated the old way is reused. How a transaction goes over a pooled connection
//! (pipelining, and what a lost connection means) is `smtp_lane`'s.
//!
//! Classification: a 5xx reply is permanent; a 4xx reply, or a connect, TLS, I/O or timeout
//! error, is transient; an invalid address or an empty list is permanent. The first refusal in
//! the envelope decides, and the message then goes to nobody: one recipient refused (of several)
//! fails the whole attempt as that reply says, whether the envelope was pipelined or not (see
//! lettre's `send_envelope`, patched in `vendor/lettre`). The server refusing
//! the credentials while authenticating is reported apart ([`EmailError::CredentialsRefused`]),
//! so the caller can renew an XOAUTH2 token; a refusal later in the session never is, whatever
//! its text says.

use std::sync::{Arc, Mutex};

use lettre::address::{Address, Envelope};
use lettre::message::header::{ContentType, MIME_VERSION_1_0};
use lettre::message::{Mailbox, Message};
use lettre::transport::smtp;

use super::mail_format;
use super::smtp_pool::{SessionError, SmtpPool};
use super::turn::Turn;
use crate::domain::channel::{EmailAddress, Secret, SmtpAuth, SmtpSettings};
use crate::domain::delivery::{Delivered, DeliveryError};
use crate::domain::{NotificationContent, NotificationId, Priority};

/// Sends notifications as email. Cheap to share.
// `pub` for the e2e mail tests, through `crate::testing`.
#[derive(Default)]
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub struct EmailAdapter {
    /// The pool for the settings (and XOAUTH2 token) last used. They rarely change, so a plain
    /// mutex around a clone-out is enough; it is never held across an await.
    current: Mutex<Option<Arc<SmtpPool>>>,
    /// The sender and envelope last built, parsed once for every delivery that shares them (see
    /// [`Addresses`]); the same kind of mutex as `current`.
    addresses: Mutex<Option<Arc<Addresses>>>,
}

/// The From mailbox and the envelope for one sender and recipient list. Parsing them (lettre's
/// RFC 5322 mailbox parser and its address checks, per recipient) was a third of the CPU of
/// building a message, and between two deliveries they change only when the settings' sender or
/// the list does, so they are parsed when the pair is new and reused while it is the same.
struct Addresses {
    from_address: EmailAddress,
    recipients: Vec<EmailAddress>,
    from: Mailbox,
    envelope: Envelope,
}

impl Addresses {
    /// Parses `from_address` and `recipients`; the errors are what each delivery would record.
    fn parse(
        from_address: &EmailAddress,
        recipients: &[EmailAddress],
    ) -> Result<Self, DeliveryError> {
        let from: Mailbox = from_address.as_str().parse().map_err(|e| {
            DeliveryError::permanent(format!(
                "from_address {:?} is invalid: {e}",
                from_address.as_str()
            ))
        })?;
        let to = recipients
            .iter()
            .map(|recipient| {
                recipient.as_str().parse::<Address>().map_err(|e| {
                    DeliveryError::permanent(format!(
                        "recipient {:?} is invalid: {e}",
                        recipient.as_str()
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let envelope = Envelope::new(Some(from.email.clone()), to)
            .map_err(|e| DeliveryError::permanent(format!("cannot build the envelope: {e}")))?;
        Ok(Self {
            from_address: from_address.clone(),
            recipients: recipients.to_vec(),
            from,
            envelope,
        })
    }

    fn is_for(&self, from_address: &EmailAddress, recipients: &[EmailAddress]) -> bool {
        self.from_address == *from_address && self.recipients == recipients
    }
}

impl std::fmt::Debug for EmailAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailAdapter").finish_non_exhaustive()
    }
}

impl EmailAdapter {
    #[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends `content` to every recipient using `settings`. `access_token` is the XOAUTH2 bearer
    /// token when the settings use XOAUTH2 (the caller fetches it; see `delivery::oauth`). The
    /// transaction takes its place at the pool's connections in `turn`.
    #[allow(clippy::too_many_arguments)]
    #[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
    pub async fn deliver(
        &self,
        settings: &SmtpSettings,
        id: NotificationId,
        content: &NotificationContent,
        priority: Priority,
        recipients: &[EmailAddress],
        access_token: Option<&Secret>,
        turn: Turn,
    ) -> Result<Delivered, EmailError> {
        if recipients.is_empty() {
            return Err(DeliveryError::permanent("the notification list has no recipients").into());
        }
        let addresses = self.addresses_for(&settings.from_address, recipients)?;
        let message = build_message(settings, &addresses, id, content, priority)?;
        let pool = self.pool_for(settings, access_token)?;
        // The pool's connection owns the timeout (it owns the I/O): this bounds the whole
        // transaction, from waiting for a connection to the last reply, so a server trickling
        // replies cannot hold a delivery slot forever.
        let deadline = tokio::time::Instant::now() + settings.overall_timeout;
        let data = mail_format::smtp_data(message.formatted());
        match pool
            .send(message.envelope().clone(), data, deadline, turn)
            .await
        {
            Ok(()) => Ok(Delivered {
                resolved_targets: recipients.iter().map(ToString::to_string).collect(),
            }),
            Err(SessionError::Smtp(e)) => Err(classify(&e, settings).into()),
            Err(SessionError::CredentialsRefused(e)) => Err(EmailError::CredentialsRefused(
                DeliveryError::Permanent(scrub(describe(&e), settings)),
            )),
            Err(SessionError::Delivery(e)) => Err(e.into()),
        }
    }

    /// The parsed sender and envelope for this pair: the last ones if they are for it, else
    /// parsed now and kept. A pair that does not parse is not kept (its error is recorded on
    /// each attempt, as before).
    fn addresses_for(
        &self,
        from_address: &EmailAddress,
        recipients: &[EmailAddress],
    ) -> Result<Arc<Addresses>, DeliveryError> {
        if let Ok(last) = self.addresses.lock()
            && let Some(addresses) = last.as_ref()
            && addresses.is_for(from_address, recipients)
        {
            return Ok(Arc::clone(addresses));
        }
        let addresses = Arc::new(Addresses::parse(from_address, recipients)?);
        if let Ok(mut last) = self.addresses.lock() {
            *last = Some(Arc::clone(&addresses));
        }
        Ok(addresses)
    }

    fn pool_for(
        &self,
        settings: &SmtpSettings,
        access_token: Option<&Secret>,
    ) -> Result<Arc<SmtpPool>, DeliveryError> {
        let mut current = self
            .current
            .lock()
            .map_err(|_| DeliveryError::transient("email pool lock poisoned"))?;
        if let Some(pool) = current.as_ref()
            && pool.is_for(settings, access_token)
        {
            return Ok(Arc::clone(pool));
        }
        let pool = Arc::new(SmtpPool::new(settings.clone(), access_token.cloned()));
        *current = Some(Arc::clone(&pool));
        Ok(pool)
    }
}

/// The mail for one notification: subject and body encoded by [`mail_format`] so a reader decodes
/// exactly what was sent, `To: undisclosed-recipients:;` and every recipient in the envelope only
/// (BCC). The envelope is built beforehand ([`Addresses`]) rather than derived from headers,
/// since lettre cannot parse the group syntax of that `To:`.
fn build_message(
    s: &SmtpSettings,
    addresses: &Addresses,
    id: NotificationId,
    content: &NotificationContent,
    priority: Priority,
) -> Result<Message, DeliveryError> {
    let mut builder = Message::builder().from(addresses.from.clone());
    for header in mail_format::priority_headers(priority) {
        builder = builder.raw_header(header);
    }
    builder
        .raw_header(mail_format::to_header())
        .raw_header(mail_format::subject_header(content.subject.as_str()))
        .message_id(Some(format!("<{id}@{}>", s.from_address.domain())))
        .header(MIME_VERSION_1_0)
        .header(ContentType::TEXT_PLAIN)
        .envelope(addresses.envelope.clone())
        .body(mail_format::canonical_body(content.body.as_str()))
        .map_err(|e| DeliveryError::permanent(format!("cannot build the message: {e}")))
}

/// Maps a lettre SMTP error to what happens next: a 5xx reply is permanent; a 4xx
/// reply, connect, TLS, I/O and timeout errors may succeed later. A client-side refusal (the
/// server lacks something the settings require, such as STARTTLS or an auth mechanism) is a
/// configuration problem that no retry fixes, so it is permanent too.
fn classify(e: &smtp::Error, settings: &SmtpSettings) -> DeliveryError {
    let message = scrub(describe(e), settings);
    if e.is_permanent() || e.is_client() {
        DeliveryError::Permanent(message)
    } else {
        DeliveryError::Transient(message)
    }
}

/// How an email attempt failed.
#[derive(Debug)]
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub enum EmailError {
    /// A classified failure, recorded as it is.
    Delivery(DeliveryError),
    /// The server refused the credentials while authenticating (see
    /// [`SessionError::CredentialsRefused`]): permanent as it stands, but a caller that can
    /// renew them (a new XOAUTH2 token) may make it transient.
    CredentialsRefused(DeliveryError),
}

impl From<DeliveryError> for EmailError {
    fn from(e: DeliveryError) -> Self {
        Self::Delivery(e)
    }
}

impl EmailError {
    /// The failure to record when nothing can be renewed.
    pub(crate) fn into_delivery_error(self) -> DeliveryError {
        match self {
            Self::Delivery(e) | Self::CredentialsRefused(e) => e,
        }
    }
}

/// Removes anything secret from an error text: a server may echo what it was sent (an AUTH
/// line), and that must not reach LastError or a log.
fn scrub(mut text: String, settings: &SmtpSettings) -> String {
    let secrets: Vec<&str> = match &settings.auth {
        SmtpAuth::None => Vec::new(),
        SmtpAuth::Password { password, .. } => vec![password.expose()],
        SmtpAuth::XOAuth2 { oauth, .. } => vec![oauth.client_secret.expose()],
    };
    for secret in secrets.into_iter().filter(|s| s.len() >= 4) {
        text = text.replace(secret, "***");
    }
    text
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
