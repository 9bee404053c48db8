//! A small, real SMTP server that runs inside a tokio runtime and records every
//! message it accepts, so integration tests and the demo can check what the
//! notification outbox actually delivered. It can be told to misbehave
//! ([`Behaviour`], for ever or for the next N transactions), to answer slowly or
//! not at all until released ([`SmtpSink::set_reply_delay`],
//! [`SmtpSink::pause_replies`]), and to require authentication
//! ([`AuthRequirement`]).
//!
//! Invariants:
//! - A message is recorded only after the final "." of DATA was answered with 250;
//!   refused or dropped transactions are never recorded, only counted.
//! - Memory per session is bounded: command lines are capped at
//!   [`MAX_COMMAND_LINE`] bytes (AUTH lines at [`MAX_AUTH_LINE`]), a message at
//!   [`MAX_MESSAGE_BYTES`] and an envelope at [`MAX_RECIPIENTS`] recipients,
//!   whatever the client sends.
//! - Nothing the network does can panic the server: a broken or hostile client ends
//!   only its own session.
//! - When authentication is required, no transaction starts before a successful
//!   AUTH on that session, and every recorded message names the user it was
//!   authenticated as.
//! - When the last clone of a [`SmtpSink`] is dropped (or [`SmtpSink::stop`] is
//!   called) the listener closes and every open session is cut off, including
//!   sessions waiting on a paused or delayed reply.
//!
//! For long or fast runs (the benchmark) the sink can keep only a [`Receipt`] per message
//! ([`SmtpSink::discard_messages`]): when it arrived and its Message-ID, so memory stays a few
//! dozen bytes per message instead of the whole text. Receipts are kept in either mode.
//!
//! It speaks plain SMTP only: it never advertises STARTTLS (and answers it with
//! 500), so a client that requires STARTTLS must fail against it.
//!
//! # Pipelining and the wire (RFC 2920)
//!
//! EHLO advertises PIPELINING unless told not to ([`SmtpSink::advertise_pipelining`]); the sink
//! answers commands one by one in the order they came either way, as a pipelining server
//! does. Every accepted message carries how its commands arrived ([`ReceivedMail::wire`]):
//! grouped into *batches*, a batch being the commands that had already arrived together when
//! the sink turned to the first of them. A client that waits for each reply shows one command
//! per batch; one that pipelines shows `MAIL`, every `RCPT` and `DATA` in one (behind
//! [`END_OF_PREVIOUS_MESSAGE`] when they came with the previous message's end). On loopback a
//! single write of a few hundred bytes arrives in one read, so the grouping is what the
//! client wrote.
//!
//! Relay behaviour around pooled connections: [`Behaviour::RejectRcptTo`] refuses one
//! recipient of a transaction and accepts the others, [`Behaviour::DropAtData`] hangs up on
//! receiving DATA (after answering MAIL and RCPT), and [`SmtpSink::close_idle_sessions`] hangs
//! up on every session that sits between transactions, as a relay's idle timeout does.
//!
//! # Authentication (RFC 4954)
//!
//! With [`SinkOptions::auth`] set, EHLO advertises `AUTH PLAIN LOGIN XOAUTH2` and
//! MAIL before a successful AUTH gets `530 5.7.0 Authentication required`.
//! - PLAIN (RFC 4616): `authzid NUL authcid NUL password`, as an initial response
//!   or after an empty `334` challenge; a non-empty authzid must equal authcid.
//! - LOGIN: `334 VXNlcm5hbWU6` ("Username:") and `334 UGFzc3dvcmQ6` ("Password:")
//!   challenges; a username given as initial response skips the first.
//! - XOAUTH2 (Google's format): base64 of
//!   `user=<user>\x01auth=Bearer <token>\x01\x01`. A wrong user or a token the
//!   [`TokenCheck`] refuses is answered as [`BadTokenReply`] says: by default as
//!   Gmail does, with a `334` challenge carrying base64 JSON
//!   (`{"status":"401","schemes":"bearer","scope":"https://mail.google.com/"}`)
//!   and, after whatever the client sends next (an empty line, by the protocol),
//!   `535 5.7.8`; or with `535 5.7.8` at once, as Office 365 does. lettre 0.11
//!   does not answer the error challenge: it fails with a *client* error ("This
//!   mechanism does not expect a challenge") and drops the connection.
//!
//! Success is `235 2.7.0`; wrong credentials `535 5.7.8 Authentication credentials
//! invalid` (counted by [`SmtpSink::auth_failures`], at the moment the sink decides,
//! so a client that hangs up on the error challenge is counted too). Undecodable
//! base64 or a `*` cancel get 501, an unknown mechanism 504, AUTH before EHLO,
//! during a transaction or after a successful AUTH 503; none of these count as
//! failures. Authentication survives RSET and a repeated EHLO.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Longest command line accepted, CRLF included. RFC 5321 allows 512; clients in
/// the wild send longer parameter lists, so be generous but finite.
pub const MAX_COMMAND_LINE: usize = 1000;
/// Longest AUTH command or SASL response line accepted, CRLF included: the limit
/// RFC 4954 §4 sets, because OAuth2 access tokens (Microsoft's JWTs especially)
/// are far longer than an ordinary command.
pub const MAX_AUTH_LINE: usize = 12288;
/// Largest message accepted (advertised as SIZE); larger ones get 552.
pub const MAX_MESSAGE_BYTES: usize = 10 * 1024 * 1024;
/// Most recipients accepted in one transaction; more get 452 (RFC 5321 §4.5.3.1.8).
pub const MAX_RECIPIENTS: usize = 1000;
/// A session that sends nothing for this long is closed, so a stuck client cannot
/// hold a task forever in the long-running demo binary. Longer than lettre's pool
/// idle timeout, so pooled connections are never cut by us first.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Pause after a failed accept (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// How deep `body_text` descends into nested multiparts before giving up.
const MAX_MIME_DEPTH: usize = 8;

/// How the sink answers from now on ([`SmtpSink::set_behaviour`]) or for the next
/// N transactions ([`SmtpSink::set_behaviour_for`]). Read afresh at every point
/// where a fault can fire, so a change also affects sessions that are already
/// open; a transaction whose RCPT was refused keeps refusing its later RCPTs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Behaviour {
    /// Behave like a well-running mail server.
    #[default]
    Accept,
    /// Answer MAIL FROM with this reply (e.g. 451 "4.3.0 try later", 550 "5.1.1 no such user").
    RejectMail { code: u16, text: String },
    /// Answer every RCPT TO with this reply.
    RejectRcpt { code: u16, text: String },
    /// Accept the DATA body, then answer the final "." with this reply (message NOT recorded).
    RejectData { code: u16, text: String },
    /// Close the TCP connection in the middle of receiving DATA (after the 354 and
    /// the first body line; message NOT recorded).
    DropMidData,
    /// Answer RCPT TO this address (compared without regard to case) with this reply, and
    /// accept the transaction's other recipients: a partial refusal.
    RejectRcptTo {
        address: String,
        code: u16,
        text: String,
    },
    /// Close the TCP connection on receiving DATA, without answering it. MAIL and RCPT were
    /// answered, so a pipelining client loses the connection right after its group.
    DropAtData,
}

/// In [`ReceivedMail::wire`]: the previous message's end of data, which this batch arrived
/// with.
pub const END_OF_PREVIOUS_MESSAGE: &str = "<end of previous message>";

/// One message the sink accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedMail {
    /// Address inside `<>` of MAIL FROM (empty for the null sender).
    pub mail_from: String,
    /// Addresses inside `<>` of each accepted RCPT TO, in order.
    pub rcpt_to: Vec<String>,
    /// The DATA content after dot-unstuffing, line endings as sent (CRLF for any
    /// conforming client), without the terminating ".\r\n". Bytes that are not
    /// UTF-8 are replaced with U+FFFD.
    pub raw: String,
    /// The user the session authenticated as (PLAIN/LOGIN username or XOAUTH2
    /// `user=`), or None when the sink does not require authentication.
    pub authenticated_as: Option<String>,
    /// The SMTP session (connection) it arrived on, numbered from 1 in order of connection.
    pub session: usize,
    /// Everything the session received since its previous accepted message (or since it
    /// began, EHLO included), as batches of what arrived together (see the module doc): the
    /// command verbs in upper case, and `<message>` for the message content. When commands
    /// arrived together with the previous message's end of data (a client pipelining the next
    /// envelope behind it), their batch starts with [`END_OF_PREVIOUS_MESSAGE`].
    pub wire: Vec<Vec<String>>,
}

/// When a message was accepted and what it called itself: all the benchmark needs to time a
/// delivery, and all the sink keeps once told to [`SmtpSink::discard_messages`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// Taken just before the final 250 is written, on this process's monotonic clock.
    pub at: Instant,
    /// The Message-ID header, angle brackets included (None if the message had none).
    pub message_id: Option<String>,
}

/// How a sink is set up; `SinkOptions::default()` is what [`SmtpSink::start`] uses.
#[derive(Clone, Debug, Default)]
pub struct SinkOptions {
    /// When set, EHLO advertises AUTH and every transaction needs a successful
    /// AUTH on its session first.
    pub auth: Option<AuthRequirement>,
}

/// The credentials a sink requires. Whatever the requirement, all three
/// mechanisms are advertised; one that cannot carry the required credentials
/// (PLAIN against an XOAuth2 requirement, say) fails as wrong credentials do.
#[derive(Clone, Debug)]
pub enum AuthRequirement {
    /// AUTH PLAIN or AUTH LOGIN with exactly this username and password.
    Password { username: String, password: String },
    /// AUTH XOAUTH2 for `username` with a bearer token that `tokens` accepts.
    XOAuth2 {
        username: String,
        tokens: TokenCheck,
        on_bad_token: BadTokenReply,
    },
}

impl AuthRequirement {
    /// PLAIN/LOGIN with these credentials.
    pub fn password(username: impl Into<String>, password: impl Into<String>) -> Self {
        AuthRequirement::Password {
            username: username.into(),
            password: password.into(),
        }
    }

    /// XOAUTH2 for `username` with any token `tokens` accepts; a bad token is
    /// answered the way Gmail does ([`BadTokenReply::ErrorChallenge`]).
    pub fn xoauth2(username: impl Into<String>, tokens: TokenCheck) -> Self {
        AuthRequirement::XOAuth2 {
            username: username.into(),
            tokens,
            on_bad_token: BadTokenReply::default(),
        }
    }
}

/// How a failed AUTH XOAUTH2 is answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BadTokenReply {
    /// Gmail: `334 <base64 JSON error>`, then `535 5.7.8` once the client answers.
    #[default]
    ErrorChallenge,
    /// Office 365: `535 5.7.8` at once.
    Immediate,
}

/// Decides whether a bearer token is currently valid. Shared, so the sink can
/// accept exactly the tokens a test's OAuth2 server issued
/// (`OAuthServer::token_check`).
#[derive(Clone)]
pub struct TokenCheck(Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl TokenCheck {
    /// Accepts this one token only.
    pub fn fixed(token: impl Into<String>) -> Self {
        let token = token.into();
        TokenCheck(Arc::new(move |candidate| candidate == token))
    }

    /// Accepts whatever `check` accepts at the moment of the AUTH.
    pub fn from_fn(check: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        TokenCheck(Arc::new(check))
    }

    pub fn accepts(&self, token: &str) -> bool {
        (self.0)(token)
    }
}

impl fmt::Debug for TokenCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenCheck(..)")
    }
}

impl ReceivedMail {
    /// Case-insensitive lookup of the first header called `name`, with folded
    /// continuation lines unfolded and surrounding whitespace trimmed. The value is
    /// returned as sent (RFC 2047 encoded words are left alone; see [`Self::subject`]).
    pub fn header(&self, name: &str) -> Option<String> {
        let (headers, _) = split_entity(&self.raw);
        find_header(headers, name)
    }

    /// The Subject header, with RFC 2047 encoded words (`=?utf-8?b?...?=`, which
    /// lettre uses for non-ASCII subjects) decoded. Identical to
    /// `header("Subject")` for plain ASCII subjects.
    pub fn subject(&self) -> Option<String> {
        self.header("Subject").map(|v| decode_encoded_words(&v))
    }

    /// The Message-ID header, angle brackets included.
    pub fn message_id(&self) -> Option<String> {
        self.header("Message-ID")
    }

    /// The body after the blank line, decoded from quoted-printable or base64 when
    /// Content-Transfer-Encoding says so, with CRLF normalised to LF and trailing
    /// line breaks trimmed. For a multipart message, the first text/plain part
    /// (searching nested multiparts) is returned instead.
    pub fn body_text(&self) -> String {
        entity_text(&self.raw, 0)
    }
}

/// Handle to a running sink. Clones share the same server; it stops when the last
/// clone is dropped.
#[derive(Clone)]
pub struct SmtpSink {
    shared: Arc<Shared>,
    lifetime: Arc<Lifetime>,
    addr: SocketAddr,
}

/// State shared between the handle and the session tasks.
struct Shared {
    /// Fixed at start; sessions only read it.
    auth: Option<AuthRequirement>,
    /// Whether EHLO advertises PIPELINING; read at each EHLO.
    pipelining: AtomicBool,
    /// Sessions started so far; each session's number is the count when it began.
    sessions_started: AtomicUsize,
    /// Bumped by [`SmtpSink::close_idle_sessions`]; a watch so sessions waiting for a command
    /// see it at once.
    close_idle: watch::Sender<usize>,
    messages: Mutex<Recorded>,
    /// While true, accepted messages are counted and get a [`Receipt`] but are not kept whole.
    discard: AtomicBool,
    /// Number of recorded messages; waiters watch it instead of polling `messages`.
    accepted: watch::Sender<usize>,
    faults: Mutex<Faults>,
    /// Slept before every reply; a Mutex because tests change it while sessions run.
    reply_delay: Mutex<Duration>,
    /// While true every reply waits (after `reply_delay`) until it turns false.
    /// A watch so waiting sessions wake the moment a test resumes them.
    paused: watch::Sender<bool>,
    /// Sessions waiting right now on a paused reply; a watch so a test can wait
    /// for a count instead of polling.
    held: watch::Sender<usize>,
    active_sessions: AtomicUsize,
    max_sessions: AtomicUsize,
    refused: AtomicUsize,
    auth_failures: AtomicUsize,
}

/// What the sink kept of the accepted messages. One lock for all three, so the published count
/// and the lists always agree.
#[derive(Default)]
struct Recorded {
    /// Whole messages, unless discarding.
    mails: Vec<ReceivedMail>,
    receipts: Vec<Receipt>,
    /// Every accepted message, kept whole or not.
    total: usize,
}

/// The configured fault and how many more transactions it applies to. Kept under
/// one lock so two sessions cannot both consume the last counted fault.
struct Faults {
    behaviour: Behaviour,
    /// None: until changed. Some(n): n more transactions (n > 0), then Accept.
    remaining: Option<usize>,
}

/// Where in a transaction a fault may fire; each behaviour fires at exactly one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Mail,
    Rcpt,
    Data,
    EndOfData,
}

/// Owned only by the `SmtpSink` handles (never by the tasks), so its Drop runs
/// exactly when the last handle goes away.
struct Lifetime {
    shutdown: watch::Sender<bool>,
    accept_task: JoinHandle<()>,
}

impl Drop for Lifetime {
    fn drop(&mut self) {
        // Dropping the sender would already wake every receiver with an error;
        // sending explicitly makes the intent obvious and covers `stop()` too.
        self.shutdown.send_replace(true);
        self.accept_task.abort();
    }
}

impl SmtpSink {
    /// Binds 127.0.0.1:0 and serves in a background tokio task until dropped/stopped.
    pub async fn start() -> io::Result<SmtpSink> {
        Self::start_with(SinkOptions::default()).await
    }

    /// Like [`Self::start`], set up by `options` (e.g. to require AUTH).
    pub async fn start_with(options: SinkOptions) -> io::Result<SmtpSink> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        Ok(Self::serve_with(listener, options))
    }

    /// Serves on an already-bound listener (the demo binary uses this with a fixed
    /// port). Must be called inside a tokio runtime.
    pub fn serve(listener: TcpListener) -> SmtpSink {
        Self::serve_with(listener, SinkOptions::default())
    }

    /// Like [`Self::serve`], set up by `options`.
    pub fn serve_with(listener: TcpListener, options: SinkOptions) -> SmtpSink {
        let addr = listener.local_addr().unwrap_or_else(|err| {
            // Cannot happen for a bound TCP listener; keep serving rather than panic.
            tracing::warn!(%err, "smtp sink: cannot read listener address");
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
        });
        let shared = Arc::new(Shared {
            auth: options.auth,
            pipelining: AtomicBool::new(true),
            sessions_started: AtomicUsize::new(0),
            close_idle: watch::Sender::new(0),
            messages: Mutex::new(Recorded::default()),
            discard: AtomicBool::new(false),
            accepted: watch::Sender::new(0),
            faults: Mutex::new(Faults {
                behaviour: Behaviour::Accept,
                remaining: None,
            }),
            reply_delay: Mutex::new(Duration::ZERO),
            paused: watch::Sender::new(false),
            held: watch::Sender::new(0),
            active_sessions: AtomicUsize::new(0),
            max_sessions: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            auth_failures: AtomicUsize::new(0),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let accept_task = tokio::spawn(accept_loop(listener, Arc::clone(&shared), shutdown_rx));
        SmtpSink {
            shared,
            lifetime: Arc::new(Lifetime {
                shutdown,
                accept_task,
            }),
            addr,
        }
    }

    /// The address the sink listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every message accepted so far and kept whole (not while discarding), in arrival order.
    pub fn messages(&self) -> Vec<ReceivedMail> {
        lock(&self.shared.messages).mails.clone()
    }

    /// From now on keep only a [`Receipt`] of each accepted message (`true`), or whole
    /// messages again (`false`). Messages already kept stay.
    pub fn discard_messages(&self, discard: bool) {
        self.shared.discard.store(discard, Ordering::SeqCst);
    }

    /// When each accepted message arrived and its Message-ID, in arrival order, whether or
    /// not it was kept whole.
    pub fn receipts(&self) -> Vec<Receipt> {
        lock(&self.shared.messages).receipts.clone()
    }

    /// Number of messages accepted so far, kept whole or not.
    pub fn accepted_count(&self) -> usize {
        lock(&self.shared.messages).total
    }

    /// Waits until at least `n` messages were accepted (kept whole or not), or `timeout`
    /// passes; returns the number accepted so far either way.
    pub async fn wait_for_count(&self, n: usize, timeout: Duration) -> usize {
        let mut count = self.shared.accepted.subscribe();
        // As in `wait_for_messages`: only the timeout can end the wait early.
        let _ = tokio::time::timeout(timeout, count.wait_for(|accepted| *accepted >= n)).await;
        self.accepted_count()
    }

    /// Waits until at least `n` messages were accepted, or `timeout` passes;
    /// returns all messages accepted so far either way.
    pub async fn wait_for_messages(&self, n: usize, timeout: Duration) -> Vec<ReceivedMail> {
        let mut count = self.shared.accepted.subscribe();
        // The sender lives in `self.shared`, so `wait_for` cannot fail with
        // "closed" here; a timeout simply falls through to the snapshot.
        let _ = tokio::time::timeout(timeout, count.wait_for(|accepted| *accepted >= n)).await;
        self.messages()
    }

    /// Changes how the sink answers from now on (applies to new commands on
    /// existing sessions too), until changed again.
    pub fn set_behaviour(&self, b: Behaviour) {
        *lock(&self.shared.faults) = Faults {
            behaviour: b,
            remaining: None,
        };
    }

    /// Applies `b` to the next `transactions` transactions in which it fires
    /// (each refused MAIL, refused RCPT set, rejected or dropped DATA counts one),
    /// then goes back to [`Behaviour::Accept`] by itself: "451 once, then
    /// accept" without racing the client. Replaces any earlier setting; `0`
    /// means Accept at once.
    pub fn set_behaviour_for(&self, transactions: usize, b: Behaviour) {
        *lock(&self.shared.faults) = if transactions == 0 || b == Behaviour::Accept {
            Faults {
                behaviour: Behaviour::Accept,
                remaining: None,
            }
        } else {
            Faults {
                behaviour: b,
                remaining: Some(transactions),
            }
        };
    }

    /// Waits this long before every reply (greeting included) from now on, on
    /// every session; `Duration::ZERO` (the default) turns it off. For holding
    /// sessions open without sleeping in the test.
    pub fn set_reply_delay(&self, delay: Duration) {
        *lock(&self.shared.reply_delay) = delay;
    }

    /// Holds every reply (greeting included) on every session until
    /// [`Self::resume_replies`]. With [`Self::held_replies`] a test can wait until
    /// N sessions are stuck mid-conversation, assert, then release them.
    pub fn pause_replies(&self) {
        self.shared.paused.send_replace(true);
    }

    /// Releases every held reply and stops holding new ones.
    pub fn resume_replies(&self) {
        self.shared.paused.send_replace(false);
    }

    /// Number of sessions waiting right now on a paused reply.
    pub fn held_replies(&self) -> usize {
        *self.shared.held.borrow()
    }

    /// Waits until at least `n` sessions are held by [`Self::pause_replies`], or
    /// `timeout` passes; returns whether they were.
    pub async fn wait_for_held_replies(&self, n: usize, timeout: Duration) -> bool {
        let mut held = self.shared.held.subscribe();
        // The sender lives in `self.shared`, so only the timeout can end this early.
        matches!(
            tokio::time::timeout(timeout, held.wait_for(|held| *held >= n)).await,
            Ok(Ok(_))
        )
    }

    /// Highest number of simultaneously open SMTP sessions seen so far.
    pub fn max_concurrent_sessions(&self) -> usize {
        self.shared.max_sessions.load(Ordering::SeqCst)
    }

    /// Number of SMTP sessions open right now.
    pub fn active_sessions(&self) -> usize {
        self.shared.active_sessions.load(Ordering::SeqCst)
    }

    /// Number of transactions the sink refused or dropped (any non-Accept
    /// behaviour that fired; a RejectRcpt transaction counts once however many
    /// recipients it refused).
    pub fn refused_count(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Number of AUTH exchanges that failed on wrong credentials (answered 535,
    /// or given the XOAUTH2 error challenge). Cancelled or undecodable exchanges
    /// are not counted.
    pub fn auth_failures(&self) -> usize {
        self.shared.auth_failures.load(Ordering::SeqCst)
    }

    /// Whether EHLO advertises PIPELINING from now on (it does from the start, as Postfix,
    /// Exchange and Microsoft 365 do); sessions that already said EHLO keep what they saw.
    pub fn advertise_pipelining(&self, advertise: bool) {
        self.shared.pipelining.store(advertise, Ordering::SeqCst);
    }

    /// Hangs up on every session that is between transactions and has nothing unread, as a
    /// relay's idle timeout does: first `421 4.4.2` when `say_421` (Postfix's way), or without
    /// a word. Sessions in a transaction, or with a command already arrived, go on. A client
    /// sees the close when it next reads.
    pub fn close_idle_sessions(&self, say_421: bool) {
        let code = usize::from(say_421);
        // Even values: silent; odd: with a 421. Only a change wakes the sessions.
        self.shared
            .close_idle
            .send_modify(|generation| *generation = (*generation & !1) + 2 + code);
    }

    /// Stops accepting connections and cuts every open session, for all clones.
    pub fn stop(&self) {
        self.lifetime.shutdown.send_replace(true);
        self.lifetime.accept_task.abort();
    }
}

/// Locks a mutex, ignoring poisoning: the data behind these locks (a Vec that is
/// only pushed to, a plain enum) is never left half-updated by a panic.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// The fault to apply at `stage`, if the configured behaviour fires there.
    /// Firing consumes one counted transaction and counts one refusal, so each
    /// transaction must ask at most once per stage (RCPT asks only for its first
    /// recipient).
    fn take_fault(&self, stage: Stage) -> Option<Behaviour> {
        let mut faults = lock(&self.faults);
        let fires_at = match faults.behaviour {
            Behaviour::Accept => return None,
            Behaviour::RejectMail { .. } => Stage::Mail,
            Behaviour::RejectRcpt { .. } => Stage::Rcpt,
            Behaviour::DropMidData | Behaviour::DropAtData => Stage::Data,
            Behaviour::RejectData { .. } => Stage::EndOfData,
            // Fires per recipient: see `take_recipient_refusal`.
            Behaviour::RejectRcptTo { .. } => return None,
        };
        if fires_at != stage {
            return None;
        }
        let fault = faults.behaviour.clone();
        if let Some(remaining) = faults.remaining {
            if remaining <= 1 {
                *faults = Faults {
                    behaviour: Behaviour::Accept,
                    remaining: None,
                };
            } else {
                faults.remaining = Some(remaining - 1);
            }
        }
        self.refused.fetch_add(1, Ordering::SeqCst);
        Some(fault)
    }

    /// The reply for RCPT TO `address` when [`Behaviour::RejectRcptTo`] names it, consuming one
    /// counted transaction and counting one refusal.
    fn take_recipient_refusal(&self, address: &str) -> Option<(u16, String)> {
        let mut faults = lock(&self.faults);
        let Behaviour::RejectRcptTo {
            address: refused,
            code,
            text,
        } = &faults.behaviour
        else {
            return None;
        };
        if !refused.eq_ignore_ascii_case(address) {
            return None;
        }
        let reply = (*code, text.clone());
        if let Some(remaining) = faults.remaining {
            if remaining <= 1 {
                *faults = Faults {
                    behaviour: Behaviour::Accept,
                    remaining: None,
                };
            } else {
                faults.remaining = Some(remaining - 1);
            }
        }
        self.refused.fetch_add(1, Ordering::SeqCst);
        Some(reply)
    }

    /// Records an accepted message (whole, or only its receipt while discarding) and
    /// returns its number, counting from 1.
    fn record(&self, mail: ReceivedMail) -> usize {
        let receipt = Receipt {
            at: Instant::now(),
            message_id: mail.message_id(),
        };
        let keep = !self.discard.load(Ordering::SeqCst);
        let mut recorded = lock(&self.messages);
        recorded.receipts.push(receipt);
        if keep {
            recorded.mails.push(mail);
        }
        recorded.total += 1;
        // Published under the lock so concurrent sessions cannot publish counts
        // out of order (a waiter must never see the count go backwards).
        self.accepted.send_replace(recorded.total);
        recorded.total
    }

    /// Waits as configured before a reply is written: the delay, then any pause.
    async fn pace_reply(&self) {
        let delay = *lock(&self.reply_delay);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut paused = self.paused.subscribe();
        if *paused.borrow_and_update() {
            let _held = HeldGuard::enter(self);
            // The sender lives in `self`, so this cannot fail with "closed".
            let _ = paused.wait_for(|paused| !*paused).await;
        }
    }
}

/// Counts a session as held for as long as it waits on a paused reply, also
/// when the wait is cancelled by shutdown.
struct HeldGuard<'a> {
    shared: &'a Shared,
}

impl<'a> HeldGuard<'a> {
    fn enter(shared: &'a Shared) -> Self {
        shared.held.send_modify(|held| *held += 1);
        HeldGuard { shared }
    }
}

impl Drop for HeldGuard<'_> {
    fn drop(&mut self) {
        self.shared
            .held
            .send_modify(|held| *held = held.saturating_sub(1));
    }
}

/// Counts a session as open for as long as it lives; decrementing in Drop keeps
/// the count right even when the session task is cancelled at shutdown.
struct SessionGuard<'a> {
    shared: &'a Shared,
}

impl<'a> SessionGuard<'a> {
    fn enter(shared: &'a Shared) -> Self {
        let now = shared.active_sessions.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_sessions.fetch_max(now, Ordering::SeqCst);
        SessionGuard { shared }
    }
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        self.shared.active_sessions.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // Err means every handle is gone, which is a shutdown as well.
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let shared = Arc::clone(&shared);
                let mut shutdown = shutdown.clone();
                tokio::spawn(async move {
                    // Counted before the greeting is written, so a client that has
                    // read the 220 knows its session is already counted.
                    let _guard = SessionGuard::enter(&shared);
                    tokio::select! {
                        result = run_session(stream, &shared) => {
                            if let Err(err) = result {
                                tracing::debug!(%peer, %err, "smtp sink: session ended with error");
                            }
                        }
                        _ = shutdown.wait_for(|stop| *stop) => {}
                    }
                });
            }
            Err(err) => {
                tracing::warn!(%err, "smtp sink: accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// The envelope of the transaction in progress (between MAIL and the end of DATA).
struct Envelope {
    mail_from: String,
    rcpt_to: Vec<String>,
    /// Set when the first RCPT of this transaction was refused by a fault: later
    /// RCPTs get the same answer, and the transaction counts as one refusal.
    rcpt_refusal: Option<(u16, String)>,
}

enum Flow {
    Continue,
    Close,
}

enum LineRead {
    Complete,
    TooLong,
    Eof,
}

enum DataRead {
    Complete(Vec<u8>),
    TooBig,
    Dropped,
    Eof,
}

struct Session<'a> {
    shared: &'a Shared,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    envelope: Option<Envelope>,
    /// EHLO was seen: AUTH is an ESMTP extension and needs it first.
    extended: bool,
    /// Who the session authenticated as; kept across RSET and EHLO.
    authenticated_as: Option<String>,
    line: Vec<u8>,
    /// This session's number (see [`ReceivedMail::session`]).
    number: usize,
    /// What arrived since the last accepted message, in batches (see [`ReceivedMail::wire`]).
    wire: Vec<Vec<String>>,
    /// Replies not written yet because the next command had already arrived.
    held_replies: Vec<u8>,
}

async fn run_session(stream: TcpStream, shared: &Shared) -> io::Result<()> {
    let (read_half, writer) = stream.into_split();
    let mut session = Session {
        shared,
        reader: BufReader::new(read_half),
        writer,
        envelope: None,
        extended: false,
        authenticated_as: None,
        line: Vec::new(),
        number: shared.sessions_started.fetch_add(1, Ordering::SeqCst) + 1,
        wire: Vec::new(),
        held_replies: Vec::new(),
    };
    let mut close_idle = shared.close_idle.subscribe();
    close_idle.mark_unchanged();
    session.reply(220, "outbox-sink ESMTP").await?;
    loop {
        // Nothing unread: whatever comes next arrives on its own, so it starts a batch.
        let new_batch = session.reader.buffer().is_empty();
        if new_batch {
            // Wait for input here (fill_buf consumes nothing, so giving up on it loses
            // nothing), where an idle session can also be told to hang up.
            tokio::select! {
                ready = tokio::time::timeout(IDLE_TIMEOUT, session.reader.fill_buf()) => {
                    if ready.is_err() {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "client idle for too long"));
                    }
                }
                changed = close_idle.changed() => {
                    if changed.is_ok() && session.envelope.is_none() {
                        if *close_idle.borrow_and_update() & 1 == 1 {
                            session.reply(421, "4.4.2 outbox-sink closing idle connection").await?;
                        }
                        return Ok(());
                    }
                    continue;
                }
            }
        }
        // Read up to the AUTH limit, then hold every other command to the
        // ordinary one: only AUTH may carry a long (token) argument.
        match next_line(&mut session.reader, &mut session.line, MAX_AUTH_LINE).await? {
            LineRead::Eof => return Ok(()),
            LineRead::TooLong => {
                session.reply(500, "5.5.2 Line too long").await?;
                continue;
            }
            LineRead::Complete => {}
        }
        let command = String::from_utf8_lossy(strip_line_ending(&session.line)).into_owned();
        session.note_arrival(new_batch, verb_of(&command));
        let is_auth = command
            .get(..5)
            .is_some_and(|verb| verb.eq_ignore_ascii_case("AUTH "));
        if session.line.len() > MAX_COMMAND_LINE && !is_auth {
            session.reply(500, "5.5.2 Line too long").await?;
            continue;
        }
        if let Flow::Close = session.handle(&command).await? {
            // A QUIT pipelined behind other commands still gets its 221.
            return session.flush_replies().await;
        }
    }
}

/// The verb of a command line, in upper case, as [`ReceivedMail::wire`] shows it.
fn verb_of(command: &str) -> String {
    command
        .split(' ')
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase()
}

/// The outcome of one SASL step that did not yield client data: the exchange is
/// over and has been answered already (or the client is gone).
struct ExchangeOver(Flow);

impl Session<'_> {
    /// Adds what just arrived to the wire record: to a new batch, or to the current one.
    fn note_arrival(&mut self, new_batch: bool, what: String) {
        match self.wire.last_mut() {
            Some(batch) if !new_batch => batch.push(what),
            _ => self.wire.push(vec![what]),
        }
    }

    async fn reply(&mut self, code: u16, text: &str) -> io::Result<()> {
        // Configured texts must not be able to break the reply framing.
        let text = text.replace(['\r', '\n'], " ");
        self.write_reply(format!("{code} {text}\r\n").as_bytes())
            .await
    }

    /// Writes a complete (possibly multi-line) reply after the configured pacing. While the
    /// next command has already arrived (a pipelined group), the reply waits for the others and
    /// they go in one write once the group is answered, as Postfix does (RFC 2920 §3.2 lets a
    /// server hold replies until its input is empty). Written one by one, every reply after
    /// the first would wait under Nagle's algorithm for the client's delayed ACK (~40 ms).
    async fn write_reply(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.shared.pace_reply().await;
        self.held_replies.extend_from_slice(bytes);
        if self.reader.buffer().contains(&b'\n') {
            return Ok(());
        }
        self.flush_replies().await
    }

    /// Writes the replies held back by [`Self::write_reply`].
    async fn flush_replies(&mut self) -> io::Result<()> {
        if self.held_replies.is_empty() {
            return Ok(());
        }
        self.writer.write_all(&self.held_replies).await?;
        self.held_replies.clear();
        Ok(())
    }

    async fn handle(&mut self, command: &str) -> io::Result<Flow> {
        let (verb, arg) = command.split_once(' ').unwrap_or((command, ""));
        let arg = arg.trim();
        match verb.to_ascii_uppercase().as_str() {
            "EHLO" | "HELO" if arg.is_empty() => {
                self.reply(501, "5.5.4 Domain name required").await?;
            }
            "EHLO" => {
                self.envelope = None;
                self.extended = true;
                let auth = if self.shared.auth.is_some() {
                    "250-AUTH PLAIN LOGIN XOAUTH2\r\n"
                } else {
                    ""
                };
                let pipelining = if self.shared.pipelining.load(Ordering::SeqCst) {
                    "250-PIPELINING\r\n"
                } else {
                    ""
                };
                let extensions = format!(
                    "250-outbox-sink greets {arg}\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n{pipelining}{auth}250 SIZE {MAX_MESSAGE_BYTES}\r\n"
                );
                self.write_reply(extensions.as_bytes()).await?;
            }
            "HELO" => {
                self.envelope = None;
                self.reply(250, "outbox-sink").await?;
            }
            "AUTH" if self.shared.auth.is_some() => return self.auth(arg).await,
            "MAIL" => self.mail(arg).await?,
            "RCPT" => self.rcpt(arg).await?,
            "DATA" => return self.data().await,
            "RSET" => {
                self.envelope = None;
                self.reply(250, "2.0.0 Ok").await?;
            }
            "NOOP" => self.reply(250, "2.0.0 Ok").await?,
            "VRFY" => {
                self.reply(252, "2.5.0 Cannot VRFY user, but will accept message")
                    .await?;
            }
            "QUIT" => {
                self.reply(221, "2.0.0 Bye").await?;
                return Ok(Flow::Close);
            }
            _ => self.reply(500, "5.5.2 Command not recognized").await?,
        }
        Ok(Flow::Continue)
    }

    async fn mail(&mut self, arg: &str) -> io::Result<()> {
        if self.shared.auth.is_some() && self.authenticated_as.is_none() {
            return self.reply(530, "5.7.0 Authentication required").await;
        }
        let Some((address, params)) = parse_path(arg, "FROM:") else {
            return self.reply(501, "5.5.4 Syntax: MAIL FROM:<address>").await;
        };
        for param in params.split_whitespace() {
            let (key, value) = param.split_once('=').unwrap_or((param, ""));
            // BODY=, AUTH= and SMTPUTF8 need no action: the body is stored as received.
            if key.eq_ignore_ascii_case("SIZE") {
                match value.parse::<u64>() {
                    Err(_) => return self.reply(501, "5.5.4 Invalid SIZE parameter").await,
                    Ok(size) if size > MAX_MESSAGE_BYTES as u64 => {
                        return self
                            .reply(552, "5.3.4 Message size exceeds fixed maximum")
                            .await;
                    }
                    Ok(_) => {}
                }
            }
        }
        if let Some(Behaviour::RejectMail { code, text }) = self.shared.take_fault(Stage::Mail) {
            self.envelope = None;
            return self.reply(code, &text).await;
        }
        // A new MAIL starts a new transaction, dropping any unfinished one.
        self.envelope = Some(Envelope {
            mail_from: address.to_string(),
            rcpt_to: Vec::new(),
            rcpt_refusal: None,
        });
        self.reply(250, "2.1.0 Ok").await
    }

    async fn rcpt(&mut self, arg: &str) -> io::Result<()> {
        let Some(envelope) = self.envelope.as_mut() else {
            return self.reply(503, "5.5.1 Need MAIL before RCPT").await;
        };
        let Some((address, _params)) = parse_path(arg, "TO:") else {
            return self.reply(501, "5.5.4 Syntax: RCPT TO:<address>").await;
        };
        if let Some((code, text)) = self.shared.take_recipient_refusal(address) {
            return self.reply(code, &text).await;
        }
        if envelope.rcpt_refusal.is_none()
            && let Some(Behaviour::RejectRcpt { code, text }) = self.shared.take_fault(Stage::Rcpt)
        {
            envelope.rcpt_refusal = Some((code, text));
        }
        if let Some((code, text)) = envelope.rcpt_refusal.clone() {
            return self.reply(code, &text).await;
        }
        if envelope.rcpt_to.len() >= MAX_RECIPIENTS {
            return self.reply(452, "4.5.3 Too many recipients").await;
        }
        envelope.rcpt_to.push(address.to_string());
        self.reply(250, "2.1.5 Ok").await
    }

    async fn data(&mut self) -> io::Result<Flow> {
        let envelope = match self.envelope.take() {
            None => {
                self.reply(503, "5.5.1 Need MAIL before DATA").await?;
                return Ok(Flow::Continue);
            }
            Some(envelope) if envelope.rcpt_to.is_empty() => {
                // The sender is still valid; the client may yet add recipients.
                self.envelope = Some(envelope);
                self.reply(503, "5.5.1 Need RCPT before DATA").await?;
                return Ok(Flow::Continue);
            }
            Some(envelope) => envelope,
        };
        // From here on the transaction is over whatever happens: `envelope` is
        // no longer in the session. The drop is decided (and counted) here, so a
        // client that sees the close can already observe the refusal.
        let drop_mid_data = match self.shared.take_fault(Stage::Data) {
            Some(Behaviour::DropAtData) => {
                // MAIL and RCPT are answered; DATA never is.
                self.flush_replies().await?;
                return Ok(Flow::Close);
            }
            fault => fault.is_some(),
        };
        self.reply(354, "End data with <CR><LF>.<CR><LF>").await?;
        // As in `run_session`: content already here came with DATA.
        let new_batch = self.reader.buffer().is_empty();
        self.note_arrival(new_batch, "<message>".to_owned());
        match read_data(&mut self.reader, &mut self.line, drop_mid_data).await? {
            DataRead::Eof | DataRead::Dropped => return Ok(Flow::Close),
            DataRead::TooBig => {
                self.reply(552, "5.3.4 Message size exceeds fixed maximum")
                    .await?;
            }
            DataRead::Complete(body) => {
                if let Some(Behaviour::RejectData { code, text }) =
                    self.shared.take_fault(Stage::EndOfData)
                {
                    self.reply(code, &text).await?;
                } else {
                    let number = self.shared.record(ReceivedMail {
                        mail_from: envelope.mail_from,
                        rcpt_to: envelope.rcpt_to,
                        raw: String::from_utf8_lossy(&body).into_owned(),
                        authenticated_as: self.authenticated_as.clone(),
                        session: self.number,
                        wire: std::mem::take(&mut self.wire),
                    });
                    if !self.reader.buffer().is_empty() {
                        // What follows arrived with this end of data: the next transaction's
                        // first batch starts here.
                        self.wire.push(vec![END_OF_PREVIOUS_MESSAGE.to_owned()]);
                    }
                    self.reply(250, &format!("2.0.0 Ok: queued as {number}"))
                        .await?;
                }
            }
        }
        Ok(Flow::Continue)
    }

    // ---- AUTH (RFC 4954) ----------------------------------------------------------

    async fn auth(&mut self, arg: &str) -> io::Result<Flow> {
        if !self.extended {
            self.reply(503, "5.5.1 EHLO first").await?;
            return Ok(Flow::Continue);
        }
        if self.authenticated_as.is_some() {
            self.reply(503, "5.5.1 Already authenticated").await?;
            return Ok(Flow::Continue);
        }
        if self.envelope.is_some() {
            self.reply(503, "5.5.1 AUTH not permitted during a mail transaction")
                .await?;
            return Ok(Flow::Continue);
        }
        let mut words = arg.split_whitespace();
        let mechanism = words.next().unwrap_or("").to_ascii_uppercase();
        let initial = words.next();
        if words.next().is_some() {
            self.reply(501, "5.5.4 Syntax: AUTH mechanism [initial-response]")
                .await?;
            return Ok(Flow::Continue);
        }
        let outcome = match mechanism.as_str() {
            "PLAIN" => self.auth_plain(initial).await?,
            "LOGIN" => self.auth_login(initial).await?,
            "XOAUTH2" => self.auth_xoauth2(initial).await?,
            _ => {
                self.reply(504, "5.5.4 Unrecognized authentication type")
                    .await?;
                return Ok(Flow::Continue);
            }
        };
        match outcome {
            Ok(username) => {
                self.authenticated_as = Some(username);
                self.reply(235, "2.7.0 Authentication successful").await?;
                Ok(Flow::Continue)
            }
            Err(ExchangeOver(flow)) => Ok(flow),
        }
    }

    /// RFC 4616: `authzid NUL authcid NUL passwd`.
    async fn auth_plain(
        &mut self,
        initial: Option<&str>,
    ) -> io::Result<Result<String, ExchangeOver>> {
        let response = match self.client_response(initial, "").await? {
            Ok(response) => response,
            Err(over) => return Ok(Err(over)),
        };
        let mut fields = response.split(|&b| b == 0);
        let (Some(authzid), Some(authcid), Some(password), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return self.credentials_invalid().await.map(Err);
        };
        let (authzid, username, password) = (
            String::from_utf8_lossy(authzid),
            String::from_utf8_lossy(authcid).into_owned(),
            String::from_utf8_lossy(password),
        );
        // Acting as somebody else (a different authzid) is never granted.
        if (authzid.is_empty() || authzid == username) && self.password_ok(&username, &password) {
            Ok(Ok(username))
        } else {
            self.credentials_invalid().await.map(Err)
        }
    }

    /// The LOGIN mechanism (draft-murchison-sasl-login): username, then password,
    /// each prompted by a base64 challenge.
    async fn auth_login(
        &mut self,
        initial: Option<&str>,
    ) -> io::Result<Result<String, ExchangeOver>> {
        const USERNAME_PROMPT: &str = "VXNlcm5hbWU6"; // "Username:"
        const PASSWORD_PROMPT: &str = "UGFzc3dvcmQ6"; // "Password:"
        let username = match self.client_response(initial, USERNAME_PROMPT).await? {
            Ok(username) => String::from_utf8_lossy(&username).into_owned(),
            Err(over) => return Ok(Err(over)),
        };
        let password = match self.client_response(None, PASSWORD_PROMPT).await? {
            Ok(password) => String::from_utf8_lossy(&password).into_owned(),
            Err(over) => return Ok(Err(over)),
        };
        if self.password_ok(&username, &password) {
            Ok(Ok(username))
        } else {
            self.credentials_invalid().await.map(Err)
        }
    }

    /// Google's XOAUTH2: `user=U ^A auth=Bearer T ^A ^A`.
    async fn auth_xoauth2(
        &mut self,
        initial: Option<&str>,
    ) -> io::Result<Result<String, ExchangeOver>> {
        let response = match self.client_response(initial, "").await? {
            Ok(response) => response,
            Err(over) => return Ok(Err(over)),
        };
        let (user, token) = parse_xoauth2(&String::from_utf8_lossy(&response));
        let (valid, on_bad_token) = match &self.shared.auth {
            Some(AuthRequirement::XOAuth2 {
                username,
                tokens,
                on_bad_token,
            }) => (
                user.as_deref() == Some(username.as_str())
                    && token.as_deref().is_some_and(|token| tokens.accepts(token)),
                *on_bad_token,
            ),
            _ => (false, BadTokenReply::default()),
        };
        if valid && let Some(user) = user {
            return Ok(Ok(user));
        }
        match on_bad_token {
            BadTokenReply::Immediate => self.credentials_invalid().await.map(Err),
            BadTokenReply::ErrorChallenge => {
                // What Gmail sends for an invalid or expired token.
                const ERROR: &str =
                    r#"{"status":"401","schemes":"bearer","scope":"https://mail.google.com/"}"#;
                self.shared.auth_failures.fetch_add(1, Ordering::SeqCst);
                let challenge = BASE64.encode(ERROR);
                self.write_reply(format!("334 {challenge}\r\n").as_bytes())
                    .await?;
                // The client is meant to answer with an empty line; whatever it
                // sends, the exchange fails.
                match next_line(&mut self.reader, &mut self.line, MAX_AUTH_LINE).await? {
                    LineRead::Eof => Ok(Err(ExchangeOver(Flow::Close))),
                    LineRead::Complete | LineRead::TooLong => {
                        self.reply(535, "5.7.8 Authentication credentials invalid")
                            .await?;
                        Ok(Err(ExchangeOver(Flow::Continue)))
                    }
                }
            }
        }
    }

    fn password_ok(&self, username: &str, password: &str) -> bool {
        matches!(
            &self.shared.auth,
            Some(AuthRequirement::Password { username: u, password: p })
                if u == username && p == password
        )
    }

    /// Answers 535 and counts the failure.
    async fn credentials_invalid(&mut self) -> io::Result<ExchangeOver> {
        self.shared.auth_failures.fetch_add(1, Ordering::SeqCst);
        self.reply(535, "5.7.8 Authentication credentials invalid")
            .await?;
        Ok(ExchangeOver(Flow::Continue))
    }

    /// The client's next SASL response, decoded: the initial response if the
    /// AUTH command carried one (`=` means empty), else the answer to a `334`
    /// `challenge`. A cancel (`*`), undecodable base64 or an over-long line
    /// ends the exchange with the RFC 4954 reply.
    async fn client_response(
        &mut self,
        initial: Option<&str>,
        challenge: &str,
    ) -> io::Result<Result<Vec<u8>, ExchangeOver>> {
        let encoded = match initial {
            Some(initial) => initial.to_string(),
            None => {
                self.write_reply(format!("334 {challenge}\r\n").as_bytes())
                    .await?;
                match next_line(&mut self.reader, &mut self.line, MAX_AUTH_LINE).await? {
                    LineRead::Eof => return Ok(Err(ExchangeOver(Flow::Close))),
                    LineRead::TooLong => {
                        self.reply(500, "5.5.6 Authentication exchange line is too long")
                            .await?;
                        return Ok(Err(ExchangeOver(Flow::Continue)));
                    }
                    LineRead::Complete => {
                        String::from_utf8_lossy(strip_line_ending(&self.line)).into_owned()
                    }
                }
            }
        };
        let encoded = encoded.trim();
        if encoded == "*" {
            self.reply(501, "5.7.0 Authentication cancelled").await?;
            return Ok(Err(ExchangeOver(Flow::Continue)));
        }
        if encoded == "=" {
            return Ok(Ok(Vec::new()));
        }
        match BASE64.decode(encoded) {
            Ok(decoded) => Ok(Ok(decoded)),
            Err(_) => {
                self.reply(501, "5.5.2 Cannot decode response").await?;
                Ok(Err(ExchangeOver(Flow::Continue)))
            }
        }
    }
}

/// The `user=` and the bearer token of an XOAUTH2 initial response (fields
/// separated by ^A); either is None if missing or malformed.
fn parse_xoauth2(response: &str) -> (Option<String>, Option<String>) {
    let mut user = None;
    let mut token = None;
    for field in response.split('\x01') {
        if let Some(value) = field.strip_prefix("user=") {
            user = Some(value.to_string());
        } else if let Some(value) = field.strip_prefix("auth=") {
            // The scheme is case-insensitive (RFC 6750 §2.1), the token is not.
            token = value
                .split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("Bearer"))
                .map(|(_, token)| token.trim().to_string());
        }
    }
    (user, token)
}

/// Reads the DATA lines up to the lone "." line, undoing dot-stuffing. Oversized
/// messages are read to the end but not kept, so the session can answer 552 and
/// stay in sync with the client.
async fn read_data<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    drop_mid_data: bool,
) -> io::Result<DataRead> {
    let mut body = Vec::new();
    let mut too_big = false;
    loop {
        match next_line(reader, line, MAX_MESSAGE_BYTES).await? {
            LineRead::Eof => return Ok(DataRead::Eof),
            LineRead::TooLong => {
                too_big = true;
                continue;
            }
            LineRead::Complete => {}
        }
        if drop_mid_data {
            return Ok(DataRead::Dropped);
        }
        if strip_line_ending(line) == b"." {
            break;
        }
        // RFC 5321 §4.5.2: a leading period on any other line was added by the
        // client and is removed.
        let content = line.strip_prefix(b".").unwrap_or(line);
        if too_big || body.len() + content.len() > MAX_MESSAGE_BYTES {
            too_big = true;
            body = Vec::new();
        } else {
            body.extend_from_slice(content);
        }
    }
    Ok(if too_big {
        DataRead::TooBig
    } else {
        DataRead::Complete(body)
    })
}

/// `read_line_bounded` with the idle timeout applied.
async fn next_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    limit: usize,
) -> io::Result<LineRead> {
    match tokio::time::timeout(IDLE_TIMEOUT, read_line_bounded(reader, buf, limit)).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "client idle for too long",
        )),
    }
}

/// Reads one LF-terminated line (line ending included) into `buf`, never holding
/// more than `limit` bytes. A longer line is consumed up to its end and reported
/// as `TooLong` with `buf` empty. A final line without LF means the peer closed.
async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    limit: usize,
) -> io::Result<LineRead> {
    let mut too_long = false;
    loop {
        buf.clear();
        let n = (&mut *reader)
            .take(limit as u64)
            .read_until(b'\n', buf)
            .await?;
        if buf.ends_with(b"\n") {
            if too_long {
                buf.clear();
                return Ok(LineRead::TooLong);
            }
            return Ok(LineRead::Complete);
        }
        if n < limit {
            // Fewer bytes than allowed and no LF: the stream ended.
            return Ok(LineRead::Eof);
        }
        // Hit the limit mid-line: drop what we have and skip to the line's end.
        too_long = true;
    }
}

fn strip_line_ending(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Parses `FROM:<address> PARAMS` (keyword matched case-insensitively, a space
/// after the colon tolerated). Returns the address, with any RFC 5321 source route
/// (`@a,@b:`) removed, and the parameter string.
fn parse_path<'a>(arg: &'a str, keyword: &str) -> Option<(&'a str, &'a str)> {
    let prefix = arg.get(..keyword.len())?;
    if !prefix.eq_ignore_ascii_case(keyword) {
        return None;
    }
    let rest = arg[keyword.len()..].trim_start().strip_prefix('<')?;
    let (path, params) = rest.split_once('>')?;
    let address = match path.split_once(':') {
        Some((route, mailbox)) if route.starts_with('@') => mailbox,
        _ => path,
    };
    Some((address, params.trim()))
}

// ---- Message parsing for ReceivedMail's accessors -------------------------------

/// Splits an entity (a message or a MIME part) at its first empty line into the
/// header block and the body.
fn split_entity(raw: &str) -> (&str, &str) {
    let mut pos = 0;
    for line in raw.split_inclusive('\n') {
        if line.trim_end_matches(['\r', '\n']).is_empty() {
            return (&raw[..pos], &raw[pos + line.len()..]);
        }
        pos += line.len();
    }
    (raw, "")
}

fn find_header(headers: &str, name: &str) -> Option<String> {
    let mut found: Option<String> = None;
    for line in headers.lines() {
        if line.starts_with([' ', '\t']) {
            // Unfolding (RFC 5322 §2.2.3) removes only the line break, keeping
            // the whitespace that starts the continuation line.
            if let Some(value) = found.as_mut() {
                value.push_str(line);
            }
            continue;
        }
        if found.is_some() {
            break;
        }
        if let Some((field, value)) = line.split_once(':')
            && field.trim().eq_ignore_ascii_case(name)
        {
            found = Some(value.to_string());
        }
    }
    found.map(|value| value.trim().to_string())
}

/// Looks up a `key=value` parameter of a structured header such as Content-Type.
fn header_param(value: &str, key: &str) -> Option<String> {
    value.split(';').skip(1).find_map(|param| {
        let (k, v) = param.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(key)
            .then(|| v.trim().trim_matches('"').to_string())
    })
}

fn entity_text(raw: &str, depth: usize) -> String {
    let (headers, body) = split_entity(raw);
    let content_type = find_header(headers, "Content-Type").unwrap_or_default();
    if depth < MAX_MIME_DEPTH
        && content_type.to_ascii_lowercase().starts_with("multipart/")
        && let Some(boundary) = header_param(&content_type, "boundary")
    {
        let parts = multipart_parts(body, &boundary);
        let readable = parts.iter().find(|part| {
            let part_type = find_header(split_entity(part).0, "Content-Type")
                .unwrap_or_default()
                .to_ascii_lowercase();
            // No Content-Type means text/plain (RFC 2045 §5.2).
            part_type.is_empty()
                || part_type.starts_with("text/plain")
                || part_type.starts_with("multipart/")
        });
        if let Some(part) = readable.or(parts.first()) {
            return entity_text(part, depth + 1);
        }
    }
    let encoding = find_header(headers, "Content-Transfer-Encoding")
        .unwrap_or_default()
        .to_ascii_lowercase();
    let bytes = match encoding.as_str() {
        "quoted-printable" => decode_quoted_printable(body.as_bytes()),
        "base64" => decode_base64(body.as_bytes()),
        _ => body.as_bytes().to_vec(),
    };
    String::from_utf8_lossy(&bytes)
        .replace("\r\n", "\n")
        .trim_end_matches(['\r', '\n'])
        .to_string()
}

/// The parts of a multipart body, each still with its own headers.
fn multipart_parts<'a>(body: &'a str, boundary: &str) -> Vec<&'a str> {
    let delimiter = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut part_start: Option<usize> = None;
    let mut pos = 0;
    for line in body.split_inclusive('\n') {
        let line_start = pos;
        pos += line.len();
        let Some(tail) = line.trim_end().strip_prefix(delimiter.as_str()) else {
            continue;
        };
        let closing = tail == "--";
        if !tail.is_empty() && !closing {
            continue; // a longer boundary that merely starts with ours
        }
        if let Some(start) = part_start.take() {
            // The line break before a delimiter belongs to the delimiter
            // (RFC 2046 §5.1.1), not to the part.
            let part = &body[start..line_start];
            let part = part
                .strip_suffix("\r\n")
                .or_else(|| part.strip_suffix('\n'))
                .unwrap_or(part);
            parts.push(part);
        }
        if closing {
            break;
        }
        part_start = Some(pos);
    }
    parts
}

/// Quoted-printable (RFC 2045 §6.7): `=XX` is a byte, `=` at a line end is a soft
/// line break. Malformed escapes are kept literally, as the RFC recommends.
fn decode_quoted_printable(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] != b'=' {
            out.push(input[i]);
            i += 1;
            continue;
        }
        let rest = &input[i + 1..];
        // Encoders may leave trailing whitespace between "=" and the line break.
        let spaces = rest
            .iter()
            .take_while(|b| matches!(b, b' ' | b'\t'))
            .count();
        let after = &rest[spaces..];
        if after.starts_with(b"\r\n") {
            i += 1 + spaces + 2;
        } else if after.starts_with(b"\n") {
            i += 1 + spaces + 1;
        } else if after.is_empty() {
            i = input.len();
        } else if let (Some(high), Some(low)) = (
            rest.first().and_then(hex_digit),
            rest.get(1).and_then(hex_digit),
        ) {
            out.push((high << 4) | low);
            i += 3;
        } else {
            out.push(b'=');
            i += 1;
        }
    }
    out
}

fn hex_digit(c: &u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Standard-alphabet base64, skipping line breaks and any other stray
/// characters, stopping at padding.
fn decode_base64(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len() / 4 * 3);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &c in input {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => continue,
        };
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// Decodes RFC 2047 encoded words in a header value. Whitespace between two
/// adjacent encoded words is dropped, as the RFC requires, so a long subject that
/// lettre split into several words comes back whole.
fn decode_encoded_words(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    let mut after_word = false;
    while let Some(start) = rest.find("=?") {
        let (before, candidate) = rest.split_at(start);
        match decode_encoded_word(candidate) {
            Some((decoded, consumed)) => {
                if !(after_word && before.trim().is_empty()) {
                    out.push_str(before);
                }
                out.push_str(&decoded);
                rest = &candidate[consumed..];
                after_word = true;
            }
            None => {
                out.push_str(before);
                out.push_str("=?");
                rest = &candidate[2..];
                after_word = false;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Decodes one `=?charset?B|Q?text?=` word at the start of `s`; returns the text
/// and how many bytes of `s` it spanned.
fn decode_encoded_word(s: &str) -> Option<(String, usize)> {
    let inner = s.strip_prefix("=?")?;
    let (charset, rest) = inner.split_once('?')?;
    let (encoding, rest) = rest.split_once('?')?;
    let end = rest.find("?=")?;
    let text = &rest[..end];
    if charset.is_empty()
        || charset.contains(char::is_whitespace)
        || text.contains(char::is_whitespace)
    {
        return None;
    }
    let bytes = match encoding {
        "B" | "b" => decode_base64(text.as_bytes()),
        // In the Q encoding "_" stands for a space; a literal "_" is sent as =5F.
        "Q" | "q" => decode_quoted_printable(text.replace('_', " ").as_bytes()),
        _ => return None,
    };
    let consumed = "=?".len() + charset.len() + 1 + encoding.len() + 1 + end + "?=".len();
    // RFC 2231 allows a language suffix: "iso-8859-1*de".
    let charset = charset.split('*').next().unwrap_or(charset);
    let decoded =
        if charset.eq_ignore_ascii_case("iso-8859-1") || charset.eq_ignore_ascii_case("latin1") {
            // Latin-1 bytes are exactly the first 256 code points.
            bytes.iter().map(|&b| char::from(b)).collect()
        } else {
            // Anything else is treated as UTF-8, which is what lettre sends.
            String::from_utf8_lossy(&bytes).into_owned()
        };
    Some((decoded, consumed))
}

#[cfg(test)]
#[allow(
    clippy::expect_used,
    reason = "a failed expectation in a test should stop it with a clear message"
)]
mod tests {
    use super::*;

    /// Upper bound for any single network step in these tests; only reached if
    /// something is broken.
    const STEP: Duration = Duration::from_secs(10);

    struct Client {
        reader: BufReader<OwnedReadHalf>,
        writer: OwnedWriteHalf,
    }

    impl Client {
        async fn connect(addr: SocketAddr) -> Client {
            let stream = tokio::time::timeout(STEP, TcpStream::connect(addr))
                .await
                .expect("connect timed out")
                .expect("connect");
            let (read_half, writer) = stream.into_split();
            let mut client = Client {
                reader: BufReader::new(read_half),
                writer,
            };
            let (code, lines) = client.read_reply().await;
            assert_eq!(code, 220, "greeting: {lines:?}");
            assert_eq!(lines, ["outbox-sink ESMTP"]);
            client
        }

        async fn send(&mut self, bytes: &[u8]) {
            self.writer.write_all(bytes).await.expect("write");
        }

        /// Reads one (possibly multi-line) reply: its code and the text of each line.
        async fn read_reply(&mut self) -> (u16, Vec<String>) {
            let mut texts = Vec::new();
            loop {
                let mut line = String::new();
                let n = tokio::time::timeout(STEP, self.reader.read_line(&mut line))
                    .await
                    .expect("reply timed out")
                    .expect("read reply");
                assert!(n > 0, "connection closed while waiting for a reply");
                assert!(
                    line.len() >= 5 && line.ends_with("\r\n"),
                    "bad reply line {line:?}"
                );
                let code = line[..3].parse().expect("reply code");
                texts.push(line[4..].trim_end().to_string());
                if line.as_bytes()[3] == b' ' {
                    return (code, texts);
                }
            }
        }

        async fn command(&mut self, line: &str) -> u16 {
            self.send(format!("{line}\r\n").as_bytes()).await;
            self.read_reply().await.0
        }

        /// Runs MAIL/RCPT/DATA and returns the reply to the final ".".
        async fn send_mail(&mut self, from: &str, to: &[&str], data: &str) -> u16 {
            assert_eq!(self.command(&format!("MAIL FROM:<{from}>")).await, 250);
            for rcpt in to {
                assert_eq!(self.command(&format!("RCPT TO:<{rcpt}>")).await, 250);
            }
            assert_eq!(self.command("DATA").await, 354);
            self.send(data.as_bytes()).await;
            self.send(b".\r\n").await;
            self.read_reply().await.0
        }

        /// Waits until the server closes the connection (EOF or reset).
        async fn expect_closed(&mut self) {
            let mut rest = Vec::new();
            let read = tokio::time::timeout(STEP, self.reader.read_to_end(&mut rest))
                .await
                .expect("connection was not closed");
            if let Ok(n) = read {
                assert_eq!(n, 0, "unexpected data before close: {rest:?}");
            }
        }
    }

    async fn sink_and_client() -> (SmtpSink, Client) {
        let sink = SmtpSink::start().await.expect("start sink");
        let mut client = Client::connect(sink.addr()).await;
        assert_eq!(client.command("EHLO client.test").await, 250);
        (sink, client)
    }

    #[tokio::test]
    async fn full_transaction_is_recorded_with_dot_unstuffing() {
        let sink = SmtpSink::start().await.expect("start sink");
        assert!(sink.addr().ip().is_loopback());
        let mut client = Client::connect(sink.addr()).await;

        client.send(b"EHLO client.test\r\n").await;
        let (code, lines) = client.read_reply().await;
        assert_eq!(code, 250);
        assert!(lines.iter().any(|l| l == "8BITMIME"), "{lines:?}");
        assert!(lines.iter().any(|l| l == "SMTPUTF8"), "{lines:?}");
        assert!(
            !lines
                .iter()
                .any(|l| l.contains("STARTTLS") || l.contains("AUTH"))
        );

        assert_eq!(
            client
                .command("MAIL FROM:<notifications@example.test> SIZE=300 BODY=8BITMIME")
                .await,
            250
        );
        assert_eq!(client.command("RCPT TO:<alice@example.test>").await, 250);
        assert_eq!(client.command("rcpt to: <bob@example.test>").await, 250);
        assert_eq!(client.command("DATA").await, 354);
        client
            .send(
                b"Subject: Tank 4\r\n  high level\r\nmessage-id: <m1@example.test>\r\n\r\n\
                  Level is 97%.\r\n..leading dot\r\n...\r\nlast\r\n.\r\n",
            )
            .await;
        let (code, lines) = client.read_reply().await;
        assert_eq!(code, 250, "{lines:?}");
        assert_eq!(client.command("QUIT").await, 221);
        client.expect_closed().await;

        let messages = sink.messages();
        assert_eq!(messages.len(), 1);
        let mail = &messages[0];
        assert_eq!(mail.mail_from, "notifications@example.test");
        assert_eq!(mail.rcpt_to, ["alice@example.test", "bob@example.test"]);
        assert_eq!(
            mail.raw,
            "Subject: Tank 4\r\n  high level\r\nmessage-id: <m1@example.test>\r\n\r\n\
             Level is 97%.\r\n.leading dot\r\n..\r\nlast\r\n"
        );
        assert_eq!(mail.subject().as_deref(), Some("Tank 4  high level"));
        assert_eq!(mail.message_id().as_deref(), Some("<m1@example.test>"));
        assert_eq!(mail.header("X-Missing"), None);
        assert_eq!(mail.body_text(), "Level is 97%.\n.leading dot\n..\nlast");
        assert_eq!(sink.refused_count(), 0);
    }

    #[tokio::test]
    async fn discarding_keeps_only_receipts_and_counts() {
        let (sink, mut client) = sink_and_client().await;
        let mail = |id: &str| format!("Message-ID: <{id}@example.test>\r\n\r\nbody\r\n");
        let before = Instant::now();
        assert_eq!(
            client
                .send_mail("a@example.test", &["b@example.test"], &mail("kept"))
                .await,
            250
        );
        sink.discard_messages(true);
        assert_eq!(
            client
                .send_mail("a@example.test", &["b@example.test"], &mail("gone"))
                .await,
            250
        );
        assert_eq!(sink.wait_for_count(2, STEP).await, 2);
        assert_eq!(sink.accepted_count(), 2);
        let messages = sink.messages();
        assert_eq!(messages.len(), 1);
        assert_eq!(
            messages[0].message_id().as_deref(),
            Some("<kept@example.test>")
        );
        let receipts = sink.receipts();
        let ids: Vec<_> = receipts.iter().map(|r| r.message_id.as_deref()).collect();
        assert_eq!(
            ids,
            [Some("<kept@example.test>"), Some("<gone@example.test>")]
        );
        assert!(receipts[0].at >= before && receipts[1].at >= receipts[0].at);
    }

    #[tokio::test]
    async fn two_messages_on_one_session_keep_their_own_envelopes() {
        let (sink, mut client) = sink_and_client().await;
        let waiter = sink.clone();
        let (messages, ()) = tokio::join!(waiter.wait_for_messages(2, STEP), async {
            let first = client
                .send_mail(
                    "a@example.test",
                    &["x@example.test", "y@example.test"],
                    "Subject: one\r\n\r\nfirst\r\n",
                )
                .await;
            assert_eq!(first, 250);
            assert_eq!(client.command("NOOP").await, 250);
            assert_eq!(client.command("RSET").await, 250);
            let second = client
                .send_mail(
                    "b@example.test",
                    &["z@example.test"],
                    "Subject: two\r\n\r\nsecond\r\n",
                )
                .await;
            assert_eq!(second, 250);
        });
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].mail_from, "a@example.test");
        assert_eq!(messages[0].rcpt_to, ["x@example.test", "y@example.test"]);
        assert_eq!(messages[0].subject().as_deref(), Some("one"));
        assert_eq!(messages[1].mail_from, "b@example.test");
        assert_eq!(messages[1].rcpt_to, ["z@example.test"]);
        assert_eq!(messages[1].body_text(), "second");
        assert_eq!(sink.max_concurrent_sessions(), 1);
    }

    #[tokio::test]
    async fn wait_for_messages_returns_what_it_has_at_the_deadline() {
        let sink = SmtpSink::start().await.expect("start sink");
        let messages = sink.wait_for_messages(1, Duration::from_millis(20)).await;
        assert!(messages.is_empty());
    }

    #[tokio::test]
    async fn sequencing_and_syntax_errors() {
        let (sink, mut client) = sink_and_client().await;
        assert_eq!(client.command("RCPT TO:<x@example.test>").await, 503);
        assert_eq!(client.command("DATA").await, 503);
        assert_eq!(client.command("MAIL FROM:x@example.test").await, 501);
        assert_eq!(
            client
                .command("MAIL FROM:<a@example.test> SIZE=99999999999")
                .await,
            552
        );
        assert_eq!(client.command("MAIL FROM:<>").await, 250);
        assert_eq!(client.command("DATA").await, 503);
        assert_eq!(client.command("VRFY alice").await, 252);
        assert_eq!(client.command("STARTTLS").await, 500);
        assert_eq!(client.command("").await, 500);
        let long = "NOOP ".to_string() + &"x".repeat(2 * MAX_COMMAND_LINE);
        assert_eq!(client.command(&long).await, 500);
        // The session is still in sync after the over-long line.
        assert_eq!(client.command("HELO client.test").await, 250);
        assert_eq!(client.command("QUIT").await, 221);
        client.expect_closed().await;
        assert!(sink.messages().is_empty());
    }

    #[tokio::test]
    async fn oversized_message_gets_552_and_is_not_recorded() {
        let (sink, mut client) = sink_and_client().await;
        assert_eq!(client.command("MAIL FROM:<a@example.test>").await, 250);
        assert_eq!(client.command("RCPT TO:<b@example.test>").await, 250);
        assert_eq!(client.command("DATA").await, 354);
        let line = format!("{}\r\n", "y".repeat(998));
        let chunk = line.repeat(1024); // ~1 MiB
        for _ in 0..(MAX_MESSAGE_BYTES / chunk.len() + 1) {
            client.send(chunk.as_bytes()).await;
        }
        client.send(b".\r\n").await;
        assert_eq!(client.read_reply().await.0, 552);
        // Still usable afterwards.
        assert_eq!(
            client
                .send_mail("a@example.test", &["b@example.test"], "small\r\n")
                .await,
            250
        );
        assert_eq!(sink.messages().len(), 1);
    }

    #[tokio::test]
    async fn reject_mail_returns_configured_code() {
        let (sink, mut client) = sink_and_client().await;
        sink.set_behaviour(Behaviour::RejectMail {
            code: 451,
            text: "4.3.0 try later".into(),
        });
        client.send(b"MAIL FROM:<a@example.test>\r\n").await;
        assert_eq!(
            client.read_reply().await,
            (451, vec!["4.3.0 try later".to_string()])
        );
        // No transaction was opened.
        assert_eq!(client.command("RCPT TO:<b@example.test>").await, 503);
        assert!(sink.messages().is_empty());
        assert_eq!(sink.refused_count(), 1);
    }

    #[tokio::test]
    async fn reject_rcpt_returns_configured_code_and_counts_once() {
        let (sink, mut client) = sink_and_client().await;
        sink.set_behaviour(Behaviour::RejectRcpt {
            code: 550,
            text: "5.1.1 no such user".into(),
        });
        assert_eq!(client.command("MAIL FROM:<a@example.test>").await, 250);
        client.send(b"RCPT TO:<b@example.test>\r\n").await;
        assert_eq!(
            client.read_reply().await,
            (550, vec!["5.1.1 no such user".to_string()])
        );
        assert_eq!(client.command("RCPT TO:<c@example.test>").await, 550);
        assert_eq!(client.command("DATA").await, 503);
        assert!(sink.messages().is_empty());
        assert_eq!(sink.refused_count(), 1);
    }

    #[tokio::test]
    async fn reject_data_returns_configured_code_and_behaviour_changes_apply_to_open_sessions() {
        let (sink, mut client) = sink_and_client().await;
        sink.set_behaviour(Behaviour::RejectData {
            code: 554,
            text: "5.6.0 content rejected".into(),
        });
        let code = client
            .send_mail(
                "a@example.test",
                &["b@example.test"],
                "Subject: no\r\n\r\nbody\r\n",
            )
            .await;
        assert_eq!(code, 554);
        assert!(sink.messages().is_empty());
        assert_eq!(sink.refused_count(), 1);

        // Same session, new behaviour.
        sink.set_behaviour(Behaviour::Accept);
        let code = client
            .send_mail(
                "a@example.test",
                &["b@example.test"],
                "Subject: yes\r\n\r\nbody\r\n",
            )
            .await;
        assert_eq!(code, 250);
        let messages = sink.messages();
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].subject().as_deref(), Some("yes"));
        assert_eq!(sink.refused_count(), 1);
    }

    #[tokio::test]
    async fn drop_mid_data_closes_the_connection_and_records_nothing() {
        let (sink, mut client) = sink_and_client().await;
        sink.set_behaviour(Behaviour::DropMidData);
        assert_eq!(client.command("MAIL FROM:<a@example.test>").await, 250);
        assert_eq!(client.command("RCPT TO:<b@example.test>").await, 250);
        assert_eq!(client.command("DATA").await, 354);
        client.send(b"Subject: lost\r\n").await;
        client.expect_closed().await;
        assert!(sink.messages().is_empty());
        assert_eq!(sink.refused_count(), 1);
    }

    #[tokio::test]
    async fn pipelined_commands_are_answered_in_order_and_recorded_as_one_batch() {
        let (sink, mut client) = sink_and_client().await;
        // What a pipelining client writes: the envelope in one write, then the message.
        client
            .send(b"MAIL FROM:<a@example.test>\r\nRCPT TO:<b@example.test>\r\nRCPT TO:<c@example.test>\r\nDATA\r\n")
            .await;
        for expected in [250, 250, 250, 354] {
            assert_eq!(client.read_reply().await.0, expected);
        }
        client.send(b"Subject: one\r\n\r\nbody\r\n.\r\n").await;
        assert_eq!(client.read_reply().await.0, 250);
        // Then one command at a time.
        assert_eq!(
            client
                .send_mail("a@example.test", &["b@example.test"], "x\r\n")
                .await,
            250
        );
        let mails = sink.messages();
        assert_eq!(mails[0].rcpt_to, ["b@example.test", "c@example.test"]);
        assert_eq!(
            mails[0].wire,
            [
                vec!["EHLO"],
                vec!["MAIL", "RCPT", "RCPT", "DATA"],
                vec!["<message>"]
            ]
        );
        assert_eq!(
            mails[1].wire,
            [vec!["MAIL"], vec!["RCPT"], vec!["DATA"], vec!["<message>"]]
        );
        assert_eq!(mails[0].session, mails[1].session);
    }

    #[tokio::test]
    async fn pipelining_is_advertised_unless_turned_off() {
        let (sink, mut client) = sink_and_client().await;
        client.send(b"EHLO client.test\r\n").await;
        let (_, lines) = client.read_reply().await;
        assert!(lines.iter().any(|l| l == "PIPELINING"), "{lines:?}");
        sink.advertise_pipelining(false);
        client.send(b"EHLO client.test\r\n").await;
        let (_, lines) = client.read_reply().await;
        assert!(!lines.iter().any(|l| l == "PIPELINING"), "{lines:?}");
    }

    #[tokio::test]
    async fn reject_rcpt_to_refuses_only_that_recipient() {
        let (sink, mut client) = sink_and_client().await;
        sink.set_behaviour_for(
            1,
            Behaviour::RejectRcptTo {
                address: "C@example.test".into(),
                code: 550,
                text: "5.1.1 no such user".into(),
            },
        );
        assert_eq!(client.command("MAIL FROM:<a@example.test>").await, 250);
        assert_eq!(client.command("RCPT TO:<b@example.test>").await, 250);
        assert_eq!(client.command("RCPT TO:<c@example.test>").await, 550);
        assert_eq!(client.command("RCPT TO:<d@example.test>").await, 250);
        assert_eq!(client.command("DATA").await, 354);
        client.send(b"x\r\n.\r\n").await;
        assert_eq!(client.read_reply().await.0, 250);
        assert_eq!(
            sink.messages()[0].rcpt_to,
            ["b@example.test", "d@example.test"]
        );
        assert_eq!(sink.refused_count(), 1);
        // Counted: the next transaction accepts the same recipient.
        assert_eq!(
            client
                .send_mail("a@example.test", &["c@example.test"], "x\r\n")
                .await,
            250
        );
    }

    #[tokio::test]
    async fn drop_at_data_hangs_up_after_answering_the_envelope() {
        let (sink, mut client) = sink_and_client().await;
        sink.set_behaviour_for(1, Behaviour::DropAtData);
        client
            .send(b"MAIL FROM:<a@example.test>\r\nRCPT TO:<b@example.test>\r\nDATA\r\n")
            .await;
        assert_eq!(client.read_reply().await.0, 250);
        assert_eq!(client.read_reply().await.0, 250);
        client.expect_closed().await;
        assert!(sink.messages().is_empty());
        assert_eq!(sink.refused_count(), 1);
    }

    #[tokio::test]
    async fn idle_sessions_are_closed_on_request_and_busy_ones_go_on() {
        let sink = SmtpSink::start().await.expect("start sink");
        let mut idle = Client::connect(sink.addr()).await;
        assert_eq!(idle.command("EHLO client.test").await, 250);
        let mut quiet = Client::connect(sink.addr()).await;
        assert_eq!(quiet.command("EHLO client.test").await, 250);
        let mut busy = Client::connect(sink.addr()).await;
        assert_eq!(busy.command("EHLO client.test").await, 250);
        assert_eq!(busy.command("MAIL FROM:<a@example.test>").await, 250);

        sink.close_idle_sessions(true);
        for client in [&mut idle, &mut quiet] {
            assert_eq!(client.read_reply().await.0, 421);
            client.expect_closed().await;
        }
        // Between MAIL and DATA: not idle, so it finishes its transaction.
        assert_eq!(busy.command("RCPT TO:<b@example.test>").await, 250);
        assert_eq!(busy.command("DATA").await, 354);
        busy.send(b"x\r\n.\r\n").await;
        assert_eq!(busy.read_reply().await.0, 250);

        let mut silent = Client::connect(sink.addr()).await;
        assert_eq!(silent.command("EHLO client.test").await, 250);
        sink.close_idle_sessions(false);
        silent.expect_closed().await;
    }

    #[tokio::test]
    async fn max_concurrent_sessions_counts_open_sessions() {
        let sink = SmtpSink::start().await.expect("start sink");
        assert_eq!(sink.max_concurrent_sessions(), 0);
        // Each client has read its greeting, so its session is already counted.
        let clients = [
            Client::connect(sink.addr()).await,
            Client::connect(sink.addr()).await,
            Client::connect(sink.addr()).await,
        ];
        assert_eq!(sink.active_sessions(), 3);
        assert_eq!(sink.max_concurrent_sessions(), 3);
        drop(clients);
        assert_eq!(sink.max_concurrent_sessions(), 3);
    }

    #[tokio::test]
    async fn dropping_the_sink_ends_open_sessions() {
        let (sink, mut client) = sink_and_client().await;
        let clone = sink.clone();
        drop(sink);
        // A clone keeps the server alive.
        assert_eq!(client.command("NOOP").await, 250);
        drop(clone);
        client.expect_closed().await;
    }

    // ---- AUTH ---------------------------------------------------------------------

    const USER: &str = "relay-user";
    const PASSWORD: &str = "s3cret pass";

    fn b64(text: &str) -> String {
        BASE64.encode(text)
    }

    async fn auth_sink(requirement: AuthRequirement) -> (SmtpSink, Client) {
        let sink = SmtpSink::start_with(SinkOptions {
            auth: Some(requirement),
        })
        .await
        .expect("start sink");
        let mut client = Client::connect(sink.addr()).await;
        client.send(b"EHLO client.test\r\n").await;
        let (code, lines) = client.read_reply().await;
        assert_eq!(code, 250);
        assert!(
            lines.iter().any(|l| l == "AUTH PLAIN LOGIN XOAUTH2"),
            "{lines:?}"
        );
        assert!(!lines.iter().any(|l| l.contains("STARTTLS")), "{lines:?}");
        (sink, client)
    }

    fn xoauth2_response(user: &str, token: &str) -> String {
        b64(&format!("user={user}\x01auth=Bearer {token}\x01\x01"))
    }

    #[tokio::test]
    async fn auth_required_refuses_mail_until_plain_succeeds() {
        let (sink, mut client) = auth_sink(AuthRequirement::password(USER, PASSWORD)).await;
        client.send(b"MAIL FROM:<a@example.test>\r\n").await;
        assert_eq!(
            client.read_reply().await,
            (530, vec!["5.7.0 Authentication required".to_string()])
        );
        let plain = b64(&format!("\0{USER}\0{PASSWORD}"));
        client
            .send(format!("AUTH PLAIN {plain}\r\n").as_bytes())
            .await;
        assert_eq!(
            client.read_reply().await,
            (235, vec!["2.7.0 Authentication successful".to_string()])
        );
        assert_eq!(client.command(&format!("AUTH PLAIN {plain}")).await, 503);
        // Authentication survives RSET and a new EHLO.
        assert_eq!(client.command("RSET").await, 250);
        assert_eq!(client.command("EHLO client.test").await, 250);
        assert_eq!(
            client
                .send_mail(
                    "a@example.test",
                    &["b@example.test"],
                    "Subject: s\r\n\r\nx\r\n"
                )
                .await,
            250
        );
        let messages = sink.messages();
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].authenticated_as.as_deref(), Some(USER));
        assert_eq!(sink.auth_failures(), 0);
        assert_eq!(sink.refused_count(), 0);
    }

    #[tokio::test]
    async fn plain_with_wrong_credentials_gets_535_and_is_counted() {
        let (sink, mut client) = auth_sink(AuthRequirement::password(USER, PASSWORD)).await;
        let wrong = b64(&format!("\0{USER}\0not it"));
        client
            .send(format!("AUTH PLAIN {wrong}\r\n").as_bytes())
            .await;
        assert_eq!(
            client.read_reply().await,
            (
                535,
                vec!["5.7.8 Authentication credentials invalid".to_string()]
            )
        );
        // An authzid naming someone else is refused even with the right password.
        let other = b64(&format!("admin\0{USER}\0{PASSWORD}"));
        assert_eq!(client.command(&format!("AUTH PLAIN {other}")).await, 535);
        // Malformed (no NUL separators).
        assert_eq!(
            client.command(&format!("AUTH PLAIN {}", b64("junk"))).await,
            535
        );
        assert_eq!(sink.auth_failures(), 3);
        assert_eq!(client.command("MAIL FROM:<a@example.test>").await, 530);

        // Without an initial response: empty challenge, then the response; an
        // authzid equal to the user is fine.
        client.send(b"AUTH PLAIN\r\n").await;
        assert_eq!(client.read_reply().await, (334, vec![String::new()]));
        let good = b64(&format!("{USER}\0{USER}\0{PASSWORD}"));
        assert_eq!(client.command(&good).await, 235);
        assert_eq!(client.command("MAIL FROM:<a@example.test>").await, 250);
        assert_eq!(sink.auth_failures(), 3);
    }

    #[tokio::test]
    async fn login_prompts_for_username_and_password() {
        let (sink, mut client) = auth_sink(AuthRequirement::password(USER, PASSWORD)).await;
        client.send(b"AUTH LOGIN\r\n").await;
        let (code, lines) = client.read_reply().await;
        assert_eq!(
            (code, BASE64.decode(&lines[0]).expect("b64")),
            (334, b"Username:".to_vec())
        );
        client.send(format!("{}\r\n", b64(USER)).as_bytes()).await;
        let (code, lines) = client.read_reply().await;
        assert_eq!(
            (code, BASE64.decode(&lines[0]).expect("b64")),
            (334, b"Password:".to_vec())
        );
        assert_eq!(client.command(&b64("wrong")).await, 535);
        assert_eq!(sink.auth_failures(), 1);

        // Username as initial response: only the password is prompted for.
        assert_eq!(
            client.command(&format!("AUTH LOGIN {}", b64(USER))).await,
            334
        );
        assert_eq!(client.command(&b64(PASSWORD)).await, 235);
        assert_eq!(
            client
                .send_mail("a@example.test", &["b@example.test"], "x\r\n")
                .await,
            250
        );
        assert_eq!(sink.messages()[0].authenticated_as.as_deref(), Some(USER));
        assert_eq!(sink.auth_failures(), 1);
    }

    #[tokio::test]
    async fn auth_protocol_errors_are_not_counted_as_failures() {
        let sink = SmtpSink::start_with(SinkOptions {
            auth: Some(AuthRequirement::password(USER, PASSWORD)),
        })
        .await
        .expect("start sink");
        let mut client = Client::connect(sink.addr()).await;
        // AUTH needs EHLO (HELO is not enough).
        assert_eq!(client.command("HELO client.test").await, 250);
        assert_eq!(client.command("AUTH PLAIN =").await, 503);
        assert_eq!(client.command("EHLO client.test").await, 250);
        assert_eq!(client.command("AUTH CRAM-MD5").await, 504);
        assert_eq!(client.command("AUTH").await, 504);
        assert_eq!(client.command("AUTH PLAIN not!base64").await, 501);
        assert_eq!(client.command("AUTH PLAIN a b").await, 501);
        assert_eq!(client.command("AUTH LOGIN").await, 334);
        client.send(b"*\r\n").await;
        assert_eq!(
            client.read_reply().await,
            (501, vec!["5.7.0 Authentication cancelled".to_string()])
        );
        assert_eq!(sink.auth_failures(), 0);
        // An over-long SASL line is refused without losing sync.
        assert_eq!(client.command("AUTH PLAIN").await, 334);
        assert_eq!(client.command(&"A".repeat(2 * MAX_AUTH_LINE)).await, 500);
        assert_eq!(client.command("NOOP").await, 250);
        // Still usable: a correct AUTH goes through.
        let plain = b64(&format!("\0{USER}\0{PASSWORD}"));
        assert_eq!(client.command(&format!("AUTH PLAIN {plain}")).await, 235);
        assert_eq!(sink.auth_failures(), 0);
    }

    #[tokio::test]
    async fn auth_is_unknown_when_not_required() {
        let (sink, mut client) = sink_and_client().await;
        assert_eq!(client.command("AUTH PLAIN =").await, 500);
        assert_eq!(
            client
                .send_mail("a@example.test", &["b@example.test"], "x\r\n")
                .await,
            250
        );
        assert_eq!(sink.messages()[0].authenticated_as, None);
    }

    #[tokio::test]
    async fn xoauth2_accepts_the_right_user_and_token_including_long_tokens() {
        let token = format!("ya29.{}", "t".repeat(2500)); // JWT-sized, beyond MAX_COMMAND_LINE
        let check = TokenCheck::fixed(token.clone());
        let (sink, mut client) = auth_sink(AuthRequirement::xoauth2(USER, check)).await;
        // PLAIN cannot satisfy an XOAUTH2 requirement.
        let plain = b64(&format!("\0{USER}\0{token}"));
        assert_eq!(client.command(&format!("AUTH PLAIN {plain}")).await, 535);
        assert_eq!(sink.auth_failures(), 1);
        client
            .send(format!("AUTH XOAUTH2 {}\r\n", xoauth2_response(USER, &token)).as_bytes())
            .await;
        assert_eq!(
            client.read_reply().await,
            (235, vec!["2.7.0 Authentication successful".to_string()])
        );
        assert_eq!(
            client
                .send_mail("a@example.test", &["b@example.test"], "x\r\n")
                .await,
            250
        );
        assert_eq!(sink.messages()[0].authenticated_as.as_deref(), Some(USER));
        assert_eq!(sink.auth_failures(), 1);
    }

    #[tokio::test]
    async fn xoauth2_bad_token_gets_gmail_style_error_challenge_then_535() {
        let (sink, mut client) =
            auth_sink(AuthRequirement::xoauth2(USER, TokenCheck::fixed("good"))).await;
        client
            .send(format!("AUTH XOAUTH2 {}\r\n", xoauth2_response(USER, "stale")).as_bytes())
            .await;
        let (code, lines) = client.read_reply().await;
        assert_eq!(code, 334);
        let error: serde_json::Value =
            serde_json::from_slice(&BASE64.decode(&lines[0]).expect("b64")).expect("json");
        assert_eq!(error["status"], "401");
        assert_eq!(error["schemes"], "bearer");
        // Counted as soon as the sink decided, before the client's empty line.
        assert_eq!(sink.auth_failures(), 1);
        client.send(b"\r\n").await;
        assert_eq!(
            client.read_reply().await,
            (
                535,
                vec!["5.7.8 Authentication credentials invalid".to_string()]
            )
        );
        // Right token, wrong user: same failure. Without an initial response the
        // client first gets an empty challenge.
        assert_eq!(client.command("AUTH XOAUTH2").await, 334);
        assert_eq!(
            client.command(&xoauth2_response("mallory", "good")).await,
            334
        );
        assert_eq!(client.command("").await, 535);
        assert_eq!(sink.auth_failures(), 2);
        assert_eq!(client.command("MAIL FROM:<a@example.test>").await, 530);
        // The session is still usable.
        assert_eq!(
            client
                .command(&format!("AUTH XOAUTH2 {}", xoauth2_response(USER, "good")))
                .await,
            235
        );
        // A client that hangs up on the error challenge is counted too.
        let mut quitter = Client::connect(sink.addr()).await;
        assert_eq!(quitter.command("EHLO client.test").await, 250);
        assert_eq!(
            quitter
                .command(&format!("AUTH XOAUTH2 {}", xoauth2_response(USER, "bad")))
                .await,
            334
        );
        drop(quitter);
        assert_eq!(sink.auth_failures(), 3);
    }

    #[tokio::test]
    async fn xoauth2_bad_token_can_get_535_at_once() {
        let requirement = AuthRequirement::XOAuth2 {
            username: USER.into(),
            tokens: TokenCheck::from_fn(|token| token.starts_with("valid-")),
            on_bad_token: BadTokenReply::Immediate,
        };
        let (sink, mut client) = auth_sink(requirement).await;
        assert_eq!(
            client
                .command(&format!(
                    "AUTH XOAUTH2 {}",
                    xoauth2_response(USER, "expired")
                ))
                .await,
            535
        );
        // Bearer scheme is case-insensitive.
        let response = b64(&format!("user={USER}\x01auth=bearer valid-1\x01\x01"));
        assert_eq!(
            client.command(&format!("AUTH XOAUTH2 {response}")).await,
            235
        );
        assert_eq!(sink.auth_failures(), 1);
    }

    #[test]
    fn xoauth2_responses_are_parsed_field_by_field() {
        assert_eq!(
            parse_xoauth2("user=u@x\x01auth=Bearer t.k\x01\x01"),
            (Some("u@x".into()), Some("t.k".into()))
        );
        assert_eq!(
            parse_xoauth2("user=u\x01auth=Basic abc\x01\x01"),
            (Some("u".into()), None)
        );
        assert_eq!(parse_xoauth2("garbage"), (None, None));
        assert_eq!(parse_xoauth2(""), (None, None));
    }

    // ---- lettre against the sink ------------------------------------------------------

    mod with_lettre {
        use super::*;
        use lettre::transport::smtp::authentication::{Credentials, Mechanism};
        use lettre::transport::smtp::client::{Tls, TlsParameters};
        use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

        fn transport(
            sink: &SmtpSink,
            credentials: (&str, &str),
            mechanism: Mechanism,
        ) -> AsyncSmtpTransport<Tokio1Executor> {
            AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
                .port(sink.addr().port())
                .timeout(Some(STEP))
                .credentials(Credentials::new(credentials.0.into(), credentials.1.into()))
                .authentication(vec![mechanism])
                .build()
        }

        fn message() -> Message {
            Message::builder()
                .from("notifications@example.test".parse().expect("from"))
                .to("ops@example.test".parse().expect("to"))
                .subject("Tank 4")
                .body(String::from("Level 97%"))
                .expect("message")
        }

        #[tokio::test]
        async fn lettre_authenticates_with_plain_and_login() {
            for mechanism in [Mechanism::Plain, Mechanism::Login] {
                let sink = SmtpSink::start_with(SinkOptions {
                    auth: Some(AuthRequirement::password(USER, PASSWORD)),
                })
                .await
                .expect("start sink");
                transport(&sink, (USER, PASSWORD), mechanism)
                    .send(message())
                    .await
                    .expect("send");
                let messages = sink.messages();
                assert_eq!(messages.len(), 1, "{mechanism}");
                assert_eq!(messages[0].authenticated_as.as_deref(), Some(USER));

                let error = transport(&sink, (USER, "wrong"), mechanism)
                    .send(message())
                    .await
                    .expect_err("wrong password");
                assert!(error.is_permanent(), "{mechanism}: {error}");
                assert!(error.to_string().contains("5.7.8"), "{error}");
                assert_eq!(sink.auth_failures(), 1);
            }
        }

        #[tokio::test]
        async fn lettre_xoauth2_succeeds_and_fails_as_documented() {
            let sink = SmtpSink::start_with(SinkOptions {
                auth: Some(AuthRequirement::xoauth2(USER, TokenCheck::fixed("tok-1"))),
            })
            .await
            .expect("start sink");
            transport(&sink, (USER, "tok-1"), Mechanism::Xoauth2)
                .send(message())
                .await
                .expect("send");
            assert_eq!(sink.messages()[0].authenticated_as.as_deref(), Some(USER));

            // Gmail-style error challenge: lettre gives up with a client error.
            let error = transport(&sink, (USER, "stale"), Mechanism::Xoauth2)
                .send(message())
                .await
                .expect_err("stale token");
            assert!(error.is_client(), "{error}");
            assert_eq!(sink.auth_failures(), 1);
            assert_eq!(sink.messages().len(), 1);
        }

        #[tokio::test]
        async fn lettre_xoauth2_immediate_refusal_is_a_permanent_535() {
            let sink = SmtpSink::start_with(SinkOptions {
                auth: Some(AuthRequirement::XOAuth2 {
                    username: USER.into(),
                    tokens: TokenCheck::fixed("tok-1"),
                    on_bad_token: BadTokenReply::Immediate,
                }),
            })
            .await
            .expect("start sink");
            let error = transport(&sink, (USER, "stale"), Mechanism::Xoauth2)
                .send(message())
                .await
                .expect_err("stale token");
            assert!(error.is_permanent(), "{error}");
            assert!(error.to_string().contains("535"), "{error}");
            assert_eq!(sink.auth_failures(), 1);
        }

        #[tokio::test]
        async fn lettre_without_credentials_gets_530() {
            let sink = SmtpSink::start_with(SinkOptions {
                auth: Some(AuthRequirement::password(USER, PASSWORD)),
            })
            .await
            .expect("start sink");
            let transport = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
                .port(sink.addr().port())
                .timeout(Some(STEP))
                .build();
            let error = transport.send(message()).await.expect_err("no credentials");
            assert!(error.is_permanent(), "{error}");
            assert!(error.to_string().contains("5.7.0"), "{error}");
            assert!(sink.messages().is_empty());
        }

        #[tokio::test]
        async fn lettre_requiring_starttls_fails_clearly() {
            let sink = SmtpSink::start().await.expect("start sink");
            let tls = TlsParameters::new("localhost".into()).expect("tls parameters");
            let transport = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
                .port(sink.addr().port())
                .timeout(Some(STEP))
                .tls(Tls::Required(tls))
                .build();
            let error = transport.send(message()).await.expect_err("no STARTTLS");
            assert!(error.to_string().contains("STARTTLS"), "{error}");
            assert!(sink.messages().is_empty());
        }
    }

    // ---- Sequenced faults and pacing ----------------------------------------------

    #[tokio::test]
    async fn counted_fault_applies_to_the_next_transactions_then_accepts() {
        let (sink, mut client) = sink_and_client().await;
        sink.set_behaviour_for(
            2,
            Behaviour::RejectMail {
                code: 451,
                text: "4.3.0 try later".into(),
            },
        );
        assert_eq!(client.command("MAIL FROM:<a@example.test>").await, 451);
        assert_eq!(client.command("MAIL FROM:<a@example.test>").await, 451);
        assert_eq!(
            client
                .send_mail("a@example.test", &["b@example.test"], "x\r\n")
                .await,
            250
        );
        assert_eq!(sink.refused_count(), 2);
        assert_eq!(sink.messages().len(), 1);

        // A refused RCPT set is one transaction, however many recipients.
        sink.set_behaviour_for(
            1,
            Behaviour::RejectRcpt {
                code: 450,
                text: "4.2.0 mailbox busy".into(),
            },
        );
        assert_eq!(client.command("MAIL FROM:<a@example.test>").await, 250);
        assert_eq!(client.command("RCPT TO:<b@example.test>").await, 450);
        assert_eq!(client.command("RCPT TO:<c@example.test>").await, 450);
        assert_eq!(client.command("RSET").await, 250);
        assert_eq!(
            client
                .send_mail(
                    "a@example.test",
                    &["b@example.test", "c@example.test"],
                    "y\r\n"
                )
                .await,
            250
        );
        assert_eq!(sink.refused_count(), 3);

        // Zero transactions means accept at once.
        sink.set_behaviour_for(0, Behaviour::DropMidData);
        assert_eq!(
            client
                .send_mail("a@example.test", &["b@example.test"], "z\r\n")
                .await,
            250
        );
        assert_eq!(sink.messages().len(), 3);
    }

    #[tokio::test]
    async fn counted_data_faults_fire_once_each() {
        let sink = SmtpSink::start().await.expect("start sink");
        sink.set_behaviour_for(1, Behaviour::DropMidData);
        let mut client = Client::connect(sink.addr()).await;
        assert_eq!(client.command("EHLO client.test").await, 250);
        assert_eq!(client.command("MAIL FROM:<a@example.test>").await, 250);
        assert_eq!(client.command("RCPT TO:<b@example.test>").await, 250);
        assert_eq!(client.command("DATA").await, 354);
        client.send(b"Subject: lost\r\n").await;
        client.expect_closed().await;

        sink.set_behaviour_for(
            1,
            Behaviour::RejectData {
                code: 451,
                text: "4.3.0 queue full".into(),
            },
        );
        let mut client = Client::connect(sink.addr()).await;
        assert_eq!(client.command("EHLO client.test").await, 250);
        assert_eq!(
            client
                .send_mail("a@example.test", &["b@example.test"], "x\r\n")
                .await,
            451
        );
        assert_eq!(
            client
                .send_mail(
                    "a@example.test",
                    &["b@example.test"],
                    "Subject: k\r\n\r\nkept\r\n"
                )
                .await,
            250
        );
        assert_eq!(sink.refused_count(), 2);
        let messages = sink.messages();
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].body_text(), "kept");
    }

    #[tokio::test]
    async fn paused_replies_hold_sessions_until_resumed() {
        let sink = SmtpSink::start().await.expect("start sink");
        sink.pause_replies();
        let addr = sink.addr();
        let clients: Vec<_> = (0..3)
            .map(|_| tokio::spawn(async move { Client::connect(addr).await }))
            .collect();
        assert!(sink.wait_for_held_replies(3, STEP).await);
        assert_eq!(sink.active_sessions(), 3);
        assert_eq!(sink.held_replies(), 3);
        sink.resume_replies();
        for client in clients {
            // Each one got its greeting (checked inside connect).
            let mut client = client.await.expect("client task");
            assert_eq!(client.command("NOOP").await, 250);
        }
        assert_eq!(sink.held_replies(), 0);
        assert!(
            !sink
                .wait_for_held_replies(1, Duration::from_millis(10))
                .await
        );
    }

    #[tokio::test]
    async fn stopping_the_sink_releases_held_sessions() {
        let (sink, mut client) = sink_and_client().await;
        sink.pause_replies();
        client.send(b"NOOP\r\n").await;
        assert!(sink.wait_for_held_replies(1, STEP).await);
        sink.stop();
        client.expect_closed().await;
        assert_eq!(sink.held_replies(), 0);
    }

    #[tokio::test]
    async fn reply_delay_slows_every_reply() {
        let (sink, mut client) = sink_and_client().await;
        let delay = Duration::from_millis(30);
        sink.set_reply_delay(delay);
        let started = tokio::time::Instant::now();
        assert_eq!(client.command("NOOP").await, 250);
        assert_eq!(client.command("NOOP").await, 250);
        // A lower bound only: sleeping never ends early.
        assert!(started.elapsed() >= 2 * delay);
        sink.set_reply_delay(Duration::ZERO);
        assert_eq!(client.command("NOOP").await, 250);
    }

    fn mail(raw: &str) -> ReceivedMail {
        ReceivedMail {
            mail_from: "a@example.test".into(),
            rcpt_to: vec!["b@example.test".into()],
            raw: raw.into(),
            authenticated_as: None,
            session: 1,
            wire: Vec::new(),
        }
    }

    #[test]
    fn quoted_printable_body_is_decoded() {
        let m = mail(
            "Content-Type: text/plain; charset=utf-8\r\n\
             Content-Transfer-Encoding: quoted-printable\r\n\r\n\
             Tank =C3=A9 level is very=\r\n high, a=3Db =\r\n\r\nsecond line =ZZ\r\n\r\n",
        );
        assert_eq!(
            m.body_text(),
            "Tank \u{e9} level is very high, a=b \nsecond line =ZZ"
        );
    }

    #[test]
    fn base64_body_is_decoded() {
        let m = mail(
            "content-transfer-encoding: BASE64\r\n\r\n\
             R3LDvMOfZSBhdXMgVGFu\r\nayA0DQpaZWlsZSAyIG1p\r\ndCDDpA0K\r\n",
        );
        assert_eq!(
            m.body_text(),
            "Gr\u{fc}\u{df}e aus Tank 4\nZeile 2 mit \u{e4}"
        );
        assert_eq!(decode_base64(b"YQ=="), b"a");
        assert_eq!(decode_base64(b"YWI="), b"ab");
        assert_eq!(decode_base64(b"YWJj"), b"abc");
    }

    #[test]
    fn headers_are_unfolded_and_encoded_subjects_decoded() {
        let m = mail(
            "From: Outbox <notifications@example.test>\r\n\
             Subject: =?utf-8?b?8J+mhiBFdmVyeXdo?=\r\n =?utf-8?b?ZXJl?= and\r\n\tmore\r\n\
             X-Q: =?ISO-8859-1?Q?caf=E9_au_lait?=\r\n\r\nSubject: not a header\r\n",
        );
        assert_eq!(
            m.subject().as_deref(),
            Some("\u{1f986} Everywhere and\tmore")
        );
        assert_eq!(
            m.header("subject").as_deref(),
            Some("=?utf-8?b?8J+mhiBFdmVyeXdo?= =?utf-8?b?ZXJl?= and\tmore")
        );
        assert_eq!(
            decode_encoded_words(&m.header("x-q").expect("X-Q")),
            "caf\u{e9} au lait"
        );
        assert_eq!(decode_encoded_words("a =?bogus b"), "a =?bogus b");
        assert_eq!(m.body_text(), "Subject: not a header");
    }

    #[test]
    fn multipart_body_yields_the_plain_text_part() {
        let m = mail(
            "MIME-Version: 1.0\r\n\
             Content-Type: multipart/alternative;\r\n boundary=\"Bnd1\"\r\n\r\n\
             --Bnd1\r\nContent-Type: text/html; charset=utf-8\r\n\r\n<p>html</p>\r\n\
             --Bnd1\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Transfer-Encoding: quoted-printable\r\n\r\nplain =C3=A4\r\n\
             --Bnd1--\r\n",
        );
        assert_eq!(m.body_text(), "plain \u{e4}");
    }
}
