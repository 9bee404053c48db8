//! SMTP connections for the email adapter, kept open and reused: one pool per distinct settings
//! value (and XOAUTH2 token), of `max_concurrent_connections` connections. Each connection is a
//! lane ([`super::smtp_lane`]): a task that owns its session and takes transactions from the
//! pool's queue, so a connection that is finishing one message can already send the next one's
//! envelope.
//!
//! A delivery hands its transaction to the pool ([`SmtpPool::send`]) and waits for the answer;
//! the dispatcher keeps one more transaction per connection under way than there are
//! connections (`Deliver::attempts_per_connection`), so a lane usually finds the next one
//! waiting when it writes a message.
//!
//! Nothing is said on an idle session before it is used again: no NOOP, no RSET. A lane keeps
//! its session only after a transaction that ended with the message accepted (any failure
//! drops it, so a reused session is never mid-transaction), and one the relay hung up on while
//! it was idle, or sent its `421` before closing, is recognised from what has already arrived
//! (`AsyncSmtpConnection::has_unread_input`, no round trip) and dropped.
//!
//! Why not lettre's own pooled transport: it opens its sockets with Nagle's algorithm on, and
//! lettre as published writes a message body and its closing `.` line as two writes (the
//! vendored copy writes one, but anything else written in pieces would meet the same). The
//! kernel then holds the 5-byte terminator until the body is acknowledged, and the relay's
//! delayed ACK makes that about 40 ms per message (seen with strace while benchmarking; any
//! Linux relay acks that way). Here the socket is ours, with TCP_NODELAY, and lettre drives the
//! SMTP conversation on it (EHLO, STARTTLS, AUTH, the transaction). Implicit TLS still uses
//! lettre's own connect, since the TLS handshake must precede the greeting and lettre only
//! upgrades a plain stream after it. Lettre's pool also could not pipeline a next envelope.

use std::sync::Arc;

use lettre::address::Envelope;
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::transport::smtp::{self};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::smtp_lane::{Job, Lane, Queue};
use super::turn::Turn;
use crate::domain::channel::{Secret, SmtpAuth, SmtpSettings, TlsMode};
use crate::domain::delivery::DeliveryError;

/// The connections for one settings value, and the queue they take transactions from. Dropping
/// the pool (once no delivery holds it) closes the queue, and each lane then closes its session
/// and ends.
pub(crate) struct SmtpPool {
    connector: Arc<Connector>,
    queue: Queue,
}

/// How a lane opens a session: the settings and the XOAUTH2 token it authenticates with.
pub(crate) struct Connector {
    pub settings: SmtpSettings,
    access_token: Option<Secret>,
}

/// What failed while getting a session or in a transaction: an SMTP error to classify, the
/// server refusing the credentials while authenticating, or our own verdict.
pub(crate) enum SessionError {
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
    /// Starts the pool's lanes (each opens its session when it first has a transaction), so
    /// it must be called on the runtime.
    pub(crate) fn new(settings: SmtpSettings, access_token: Option<Secret>) -> Self {
        let lanes = settings.policy.max_concurrent_connections.max(1) as usize;
        let connector = Arc::new(Connector {
            settings,
            access_token,
        });
        let queue = Queue::new();
        for _ in 0..lanes {
            tokio::spawn(Lane::new(Arc::clone(&connector), queue.clone()).run());
        }
        Self { connector, queue }
    }

    pub(crate) fn is_for(&self, settings: &SmtpSettings, access_token: Option<&Secret>) -> bool {
        self.connector.settings == *settings && self.connector.access_token.as_ref() == access_token
    }

    /// One transaction (`envelope`, then `data`, the message as lettre formats it, without its
    /// last line ending), put in line in `turn`, and answered by the first free lane, or by one that sends its envelope
    /// behind the message it is finishing. It must be over by `deadline`: a lane gives up
    /// then, and closes the connection if it was under way.
    pub(crate) async fn send(
        &self,
        envelope: Envelope,
        data: Vec<u8>,
        deadline: Instant,
        mut turn: Turn,
    ) -> Result<(), SessionError> {
        let (answer, answered) = oneshot::channel();
        let job = Job {
            envelope,
            data,
            deadline,
            answer,
        };
        // In the order the dispatcher started the attempts, so one connection sends a backlog
        // oldest first (see `turn`).
        turn.wait().await;
        let submitted = self.queue.submit(job);
        drop(turn);
        if submitted.is_err() {
            return Err(SessionError::Delivery(DeliveryError::transient(
                "the SMTP connections have stopped",
            )));
        }
        // The lane answers by the deadline itself (it owns the timeout, since it owns the
        // connection); waiting without a bound is safe because a lane that ends, even by a
        // panic, drops the answer's sender.
        answered.await.unwrap_or_else(|_| {
            Err(SessionError::Delivery(DeliveryError::transient(
                "the SMTP connection ended without answering",
            )))
        })
    }
}

impl Drop for SmtpPool {
    fn drop(&mut self) {
        self.queue.close();
    }
}

/// Whether the relay of `settings` takes sessions: connect, greeting, EHLO (and STARTTLS when
/// the settings ask for it), then QUIT; no authentication and no transaction, so a probe
/// costs the relay nothing and uses no credential. Bounded by the settings' overall timeout.
pub(crate) async fn probe(settings: &SmtpSettings) -> Result<(), String> {
    let connector = Connector {
        settings: SmtpSettings {
            auth: SmtpAuth::None,
            ..settings.clone()
        },
        access_token: None,
    };
    let probe = async {
        let mut session = connector.connect().await.map_err(|e| match e {
            SessionError::Smtp(e) | SessionError::CredentialsRefused(e) => e.to_string(),
            SessionError::Delivery(e) => e.message().to_owned(),
        })?;
        session.quit().await.map(drop).map_err(|e| e.to_string())
    };
    tokio::time::timeout(settings.overall_timeout, probe)
        .await
        .map_err(|_| format!("no answer within {}s", settings.overall_timeout.as_secs()))?
}

impl Connector {
    /// The failure a transaction that outlived `overall_timeout` is recorded with.
    pub(crate) fn overall_timeout(&self) -> SessionError {
        let s = &self.settings;
        SessionError::Delivery(DeliveryError::transient(format!(
            "SMTP delivery to {}:{} took longer than {}s",
            s.host,
            s.port,
            s.overall_timeout.as_secs()
        )))
    }

    /// A new, authenticated session.
    pub(crate) async fn connect(&self) -> Result<AsyncSmtpConnection, SessionError> {
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
