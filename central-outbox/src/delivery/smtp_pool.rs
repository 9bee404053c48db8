//! SMTP sessions for the email adapter, kept open and reused: one pool per distinct settings
//! value (and XOAUTH2 token), at most `max_concurrent_connections` idle sessions.
//!
//! Nothing is said on an idle session before it is used again: no NOOP, no RSET. A session goes
//! back to the pool only after a transaction that ended with the message accepted (any failure
//! discards it, so a reused session is never mid-transaction), and one the relay hung up on while
//! it was idle, or sent its `421` before closing, is recognised from what has already arrived
//! ([`AsyncSmtpConnection::has_unread_input`], no round trip) and dropped. What that cannot see
//! (the relay closing just as the next transaction goes out) is the caller's to retry:
//! [`Session::reused`] says whether the session served a transaction before.
//!
//! Why not lettre's own pooled transport: it opens its sockets with Nagle's algorithm on, and
//! lettre as published writes a message body and its closing `.` line as two writes (the
//! vendored copy writes one, but anything else written in pieces would meet the same). The kernel then holds
//! the 5-byte terminator until the body is acknowledged, and the relay's delayed ACK makes that
//! about 40 ms per message (seen with strace while benchmarking; any Linux relay acks that way).
//! Here the socket is ours, with TCP_NODELAY, and lettre drives the SMTP conversation on it
//! (EHLO, STARTTLS, AUTH, the transaction). Implicit TLS still uses lettre's own connect, since
//! the TLS handshake must precede the greeting and lettre only upgrades a plain stream after it.

use std::sync::Mutex;

use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::transport::smtp::{self};
use tokio::net::TcpStream;

use crate::domain::channel::{Secret, SmtpAuth, SmtpSettings, TlsMode};
use crate::domain::delivery::DeliveryError;

/// Idle sessions for one settings value.
pub struct SmtpPool {
    settings: SmtpSettings,
    access_token: Option<Secret>,
    idle: Mutex<Vec<AsyncSmtpConnection>>,
}

/// A session for one transaction.
pub struct Session {
    pub connection: AsyncSmtpConnection,
    /// It served a transaction before and waited in the pool since: the relay may have closed
    /// it in the meantime without that having arrived yet.
    pub reused: bool,
}

/// What failed while getting a session: an SMTP error to classify, the server refusing the
/// credentials while authenticating, or our own verdict.
pub enum SessionError {
    Smtp(smtp::Error),
    /// AUTH was answered 535 (credentials invalid), or lettre gave up on the exchange (an
    /// XOAUTH2 error challenge, as Gmail sends for a refused token). Known by the phase it
    /// happened in and the reply code, never by the reply's wording.
    CredentialsRefused(smtp::Error),
    Delivery(DeliveryError),
}

/// RFC 4954: "535 5.7.8 Authentication credentials invalid".
const CREDENTIALS_INVALID: u16 = 535;

impl SmtpPool {
    pub fn new(settings: SmtpSettings, access_token: Option<Secret>) -> Self {
        Self {
            settings,
            access_token,
            idle: Mutex::new(Vec::new()),
        }
    }

    pub fn is_for(&self, settings: &SmtpSettings, access_token: Option<&Secret>) -> bool {
        self.settings == *settings && self.access_token.as_ref() == access_token
    }

    /// An idle session the relay has not hung up on, or a new one.
    pub async fn session(&self) -> Result<Session, SessionError> {
        while let Some(mut connection) = self.take_idle() {
            if !connection.has_unread_input() {
                return Ok(Session {
                    connection,
                    reused: true,
                });
            }
            // Closed, or closing with a 421, while idle: nothing to say to it. Dropping it
            // closes the socket.
        }
        self.fresh_session().await
    }

    /// A new session, never one from the pool.
    pub async fn fresh_session(&self) -> Result<Session, SessionError> {
        Ok(Session {
            connection: self.connect().await?,
            reused: false,
        })
    }

    /// Keeps a session that finished a transaction cleanly, up to the pool's size.
    pub fn give_back(&self, session: AsyncSmtpConnection) {
        if session.has_broken() {
            return;
        }
        let limit = self.settings.policy.max_concurrent_connections.max(1) as usize;
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < limit
        {
            idle.push(session);
        }
    }

    fn take_idle(&self) -> Option<AsyncSmtpConnection> {
        self.idle.lock().ok()?.pop()
    }

    async fn connect(&self) -> Result<AsyncSmtpConnection, SessionError> {
        let s = &self.settings;
        let hello = ClientId::default();
        let tls = || {
            TlsParameters::new(s.host.clone()).map_err(|e| {
                SessionError::Delivery(DeliveryError::permanent(format!(
                    "cannot set up TLS for {}: {e}",
                    s.host
                )))
            })
        };
        let step = |what: &str| {
            SessionError::Delivery(DeliveryError::transient(format!(
                "SMTP {what} with {}:{} took longer than {}s",
                s.host,
                s.port,
                s.timeout.as_secs()
            )))
        };
        let mut session = match s.tls {
            TlsMode::Implicit => tokio::time::timeout(
                s.timeout,
                AsyncSmtpConnection::connect_tokio1(
                    (s.host.as_str(), s.port),
                    Some(s.timeout),
                    &hello,
                    Some(tls()?),
                    None,
                ),
            )
            .await
            .map_err(|_| step("connect"))?
            .map_err(SessionError::Smtp)?,
            TlsMode::None | TlsMode::StartTls => {
                let tcp =
                    tokio::time::timeout(s.timeout, TcpStream::connect((s.host.as_str(), s.port)))
                        .await
                        .map_err(|_| step("connect"))?
                        .map_err(|e| {
                            SessionError::Delivery(DeliveryError::transient(format!(
                                "cannot connect to {}:{}: {e}",
                                s.host, s.port
                            )))
                        })?;
                // See the module doc: without this every message waits for a delayed ACK.
                tcp.set_nodelay(true).map_err(|e| {
                    SessionError::Delivery(DeliveryError::transient(format!(
                        "cannot set TCP_NODELAY: {e}"
                    )))
                })?;
                let mut session = tokio::time::timeout(
                    s.timeout,
                    AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &hello),
                )
                .await
                .map_err(|_| step("greeting"))?
                .map_err(SessionError::Smtp)?;
                if s.tls == TlsMode::StartTls {
                    if !session.can_starttls() {
                        session.abort().await;
                        return Err(SessionError::Delivery(DeliveryError::permanent(format!(
                            "STARTTLS is not supported by {}:{}, and the settings require it \
                             (tls = starttls)",
                            s.host, s.port
                        ))));
                    }
                    tokio::time::timeout(s.timeout, session.starttls(tls()?, &hello))
                        .await
                        .map_err(|_| step("STARTTLS"))?
                        .map_err(SessionError::Smtp)?;
                }
                session
            }
        };
        let login = match &s.auth {
            SmtpAuth::None => None,
            SmtpAuth::Password { username, password } => Some((
                vec![Mechanism::Plain, Mechanism::Login],
                Credentials::new(username.clone(), password.expose().to_owned()),
            )),
            SmtpAuth::XOAuth2 { username, .. } => {
                let token = self.access_token.as_ref().ok_or_else(|| {
                    SessionError::Delivery(DeliveryError::transient(
                        "no XOAUTH2 access token was obtained",
                    ))
                })?;
                Some((
                    vec![Mechanism::Xoauth2],
                    Credentials::new(username.clone(), token.expose().to_owned()),
                ))
            }
        };
        if let Some((mechanisms, credentials)) = login {
            let authenticated =
                tokio::time::timeout(s.timeout, session.auth(&mechanisms, &credentials))
                    .await
                    .map_err(|_| step("authentication"))?;
            if let Err(e) = authenticated {
                session.abort().await;
                let refused =
                    e.is_client() || e.status().map(u16::from) == Some(CREDENTIALS_INVALID);
                return Err(if refused {
                    SessionError::CredentialsRefused(e)
                } else {
                    SessionError::Smtp(e)
                });
            }
        }
        Ok(session)
    }
}
