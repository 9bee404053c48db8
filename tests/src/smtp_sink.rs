//! A small, real SMTP server that runs inside a tokio runtime and records every
//! message it accepts, so integration tests and the demo can check what the
//! notification outbox actually delivered. It can be told to misbehave
//! ([`Behaviour`]) to exercise the outbox's retry and parking paths.
//!
//! Invariants:
//! - A message is recorded only after the final "." of DATA was answered with 250;
//!   refused or dropped transactions are never recorded, only counted.
//! - Memory per session is bounded: command lines are capped at
//!   [`MAX_COMMAND_LINE`] bytes, a message at [`MAX_MESSAGE_BYTES`] and an envelope
//!   at [`MAX_RECIPIENTS`] recipients, whatever the client sends.
//! - Nothing the network does can panic the server: a broken or hostile client ends
//!   only its own session.
//! - When the last clone of a [`SmtpSink`] is dropped (or [`SmtpSink::stop`] is
//!   called) the listener closes and every open session is cut off.
//!
//! It speaks plain SMTP only (no STARTTLS, no AUTH), which is what the outbox's
//! lettre transport is configured for in tests.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Longest command line accepted, CRLF included. RFC 5321 allows 512; clients in
/// the wild send longer parameter lists, so be generous but finite.
pub const MAX_COMMAND_LINE: usize = 1000;
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

/// How the sink answers from now on. Read afresh for every command, so a change
/// also affects sessions that are already open.
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
}

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
    messages: Mutex<Vec<ReceivedMail>>,
    /// Number of recorded messages; waiters watch it instead of polling `messages`.
    accepted: watch::Sender<usize>,
    behaviour: Mutex<Behaviour>,
    active_sessions: AtomicUsize,
    max_sessions: AtomicUsize,
    refused: AtomicUsize,
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
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        Ok(Self::serve(listener))
    }

    /// Serves on an already-bound listener (the demo binary uses this with a fixed
    /// port). Must be called inside a tokio runtime.
    pub fn serve(listener: TcpListener) -> SmtpSink {
        let addr = listener.local_addr().unwrap_or_else(|err| {
            // Cannot happen for a bound TCP listener; keep serving rather than panic.
            tracing::warn!(%err, "smtp sink: cannot read listener address");
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
        });
        let shared = Arc::new(Shared {
            messages: Mutex::new(Vec::new()),
            accepted: watch::Sender::new(0),
            behaviour: Mutex::new(Behaviour::Accept),
            active_sessions: AtomicUsize::new(0),
            max_sessions: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
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

    /// Every message accepted so far, in arrival order.
    pub fn messages(&self) -> Vec<ReceivedMail> {
        lock(&self.shared.messages).clone()
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
    /// existing sessions too).
    pub fn set_behaviour(&self, b: Behaviour) {
        *lock(&self.shared.behaviour) = b;
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
    fn behaviour(&self) -> Behaviour {
        lock(&self.behaviour).clone()
    }

    fn record(&self, mail: ReceivedMail) -> usize {
        let mut messages = lock(&self.messages);
        messages.push(mail);
        // Published under the lock so concurrent sessions cannot publish counts
        // out of order (a waiter must never see the count go backwards).
        self.accepted.send_replace(messages.len());
        messages.len()
    }

    fn count_refusal(&self) {
        self.refused.fetch_add(1, Ordering::SeqCst);
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
    /// A RejectRcpt transaction is counted once, not once per recipient.
    refusal_counted: bool,
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
    line: Vec<u8>,
}

async fn run_session(stream: TcpStream, shared: &Shared) -> io::Result<()> {
    let (read_half, writer) = stream.into_split();
    let mut session = Session {
        shared,
        reader: BufReader::new(read_half),
        writer,
        envelope: None,
        line: Vec::new(),
    };
    session.reply(220, "outbox-sink ESMTP").await?;
    loop {
        match next_line(&mut session.reader, &mut session.line, MAX_COMMAND_LINE).await? {
            LineRead::Eof => return Ok(()),
            LineRead::TooLong => {
                session.reply(500, "5.5.2 Line too long").await?;
                continue;
            }
            LineRead::Complete => {}
        }
        let command = String::from_utf8_lossy(strip_line_ending(&session.line)).into_owned();
        if let Flow::Close = session.handle(&command).await? {
            return Ok(());
        }
    }
}

impl Session<'_> {
    async fn reply(&mut self, code: u16, text: &str) -> io::Result<()> {
        // Configured texts must not be able to break the reply framing.
        let text = text.replace(['\r', '\n'], " ");
        self.writer
            .write_all(format!("{code} {text}\r\n").as_bytes())
            .await
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
                let extensions = format!(
                    "250-outbox-sink greets {arg}\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 SIZE {MAX_MESSAGE_BYTES}\r\n"
                );
                self.writer.write_all(extensions.as_bytes()).await?;
            }
            "HELO" => {
                self.envelope = None;
                self.reply(250, "outbox-sink").await?;
            }
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
        let Some((address, params)) = parse_path(arg, "FROM:") else {
            return self.reply(501, "5.5.4 Syntax: MAIL FROM:<address>").await;
        };
        for param in params.split_whitespace() {
            let (key, value) = param.split_once('=').unwrap_or((param, ""));
            // BODY= and SMTPUTF8 need no action: the body is stored as received.
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
        if let Behaviour::RejectMail { code, text } = self.shared.behaviour() {
            self.envelope = None;
            self.shared.count_refusal();
            return self.reply(code, &text).await;
        }
        // A new MAIL starts a new transaction, dropping any unfinished one.
        self.envelope = Some(Envelope {
            mail_from: address.to_string(),
            rcpt_to: Vec::new(),
            refusal_counted: false,
        });
        self.reply(250, "2.1.0 Ok").await
    }

    async fn rcpt(&mut self, arg: &str) -> io::Result<()> {
        let behaviour = self.shared.behaviour();
        let Some(envelope) = self.envelope.as_mut() else {
            return self.reply(503, "5.5.1 Need MAIL before RCPT").await;
        };
        let Some((address, _params)) = parse_path(arg, "TO:") else {
            return self.reply(501, "5.5.4 Syntax: RCPT TO:<address>").await;
        };
        if let Behaviour::RejectRcpt { code, text } = behaviour {
            if !envelope.refusal_counted {
                envelope.refusal_counted = true;
                self.shared.count_refusal();
            }
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
        // no longer in the session.
        let drop_mid_data = matches!(self.shared.behaviour(), Behaviour::DropMidData);
        self.reply(354, "End data with <CR><LF>.<CR><LF>").await?;
        match read_data(&mut self.reader, &mut self.line, drop_mid_data).await? {
            DataRead::Eof => return Ok(Flow::Close),
            DataRead::Dropped => {
                // Counted before the socket closes, so a client that sees the
                // close can already observe the refusal.
                self.shared.count_refusal();
                return Ok(Flow::Close);
            }
            DataRead::TooBig => {
                self.reply(552, "5.3.4 Message size exceeds fixed maximum")
                    .await?;
            }
            DataRead::Complete(body) => {
                if let Behaviour::RejectData { code, text } = self.shared.behaviour() {
                    self.shared.count_refusal();
                    self.reply(code, &text).await?;
                } else {
                    let number = self.shared.record(ReceivedMail {
                        mail_from: envelope.mail_from,
                        rcpt_to: envelope.rcpt_to,
                        raw: String::from_utf8_lossy(&body).into_owned(),
                    });
                    self.reply(250, &format!("2.0.0 Ok: queued as {number}"))
                        .await?;
                }
            }
        }
        Ok(Flow::Continue)
    }
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

    fn mail(raw: &str) -> ReceivedMail {
        ReceivedMail {
            mail_from: "a@example.test".into(),
            rcpt_to: vec!["b@example.test".into()],
            raw: raw.into(),
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
