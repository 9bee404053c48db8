//! One SMTP connection of a pool ([`super::smtp_pool`]): a task that owns its session and
//! serves the pool's transactions one after another.
//!
//! When the relay advertises PIPELINING and another transaction is waiting as a message goes
//! out, that transaction's envelope (MAIL, every RCPT, DATA) goes in the same write as the
//! message's end of data (RFC 2920 lets message content start a pipelined group), and its
//! replies are read after the message's. A connection with work waiting therefore waits for one
//! round trip per message instead of two, and sends nothing between messages.
//!
//! What a failure means, and so what is done after it:
//! - Until a transaction's message is written the relay cannot have accepted anything. So when
//!   the connection fails during its envelope on a session that served a transaction before
//!   (the relay closed it while it sat idle, or the connection broke behind the previous
//!   message), the envelope is sent again, once, on a new session, and no failure is recorded.
//! - Once the message is on its way, a lost connection may hide an accepted message: the
//!   attempt fails as transient and the dispatcher decides. It is never resent here.
//! - Any failure drops the session. A transaction whose envelope rode behind a message that then
//!   failed is not answered with that failure: it starts again on a new session.
//! - A transaction not over by its deadline, or whose delivery stopped waiting for it (its
//!   attempt timed out, or the dispatcher stopped), drops the session at once, without a QUIT.
//!   A waiting transaction whose delivery stopped waiting is skipped.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use lettre::address::Envelope;
use lettre::transport::smtp::client::AsyncSmtpConnection;
use lettre::transport::smtp::extension::Extension;
use lettre::transport::smtp::{self};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::smtp_pool::{Connector, SessionError};
use crate::domain::delivery::DeliveryError;

/// One transaction for a lane, and where its outcome goes.
pub(super) struct Job {
    pub envelope: Envelope,
    /// The message as lettre formats it, without its last line ending.
    pub data: Vec<u8>,
    /// When the delivery gives up on it.
    pub deadline: Instant,
    pub answer: oneshot::Sender<Result<(), SessionError>>,
}

/// The pool's transactions and its idle lanes. A transaction goes to the lane that went idle
/// last (its session is the one most recently used, so the least likely to have been closed by
/// the relay, and a trickle of mail keeps using one connection rather than opening them all), or
/// waits in line when every lane is busy. So a transaction is waiting, for a lane to send
/// behind its message, only when no lane is idle.
#[derive(Clone)]
pub(super) struct Queue(Arc<Mutex<Line>>);

#[derive(Default)]
struct Line {
    jobs: VecDeque<Job>,
    /// Idle lanes, the last to go idle on top.
    idle: Vec<oneshot::Sender<Job>>,
    /// The pool is gone: no new transactions; lanes end once the line is empty.
    closed: bool,
}

impl Queue {
    pub(super) fn new() -> Self {
        Self(Arc::new(Mutex::new(Line::default())))
    }

    fn line(&self) -> MutexGuard<'_, Line> {
        // A panic elsewhere while holding it cannot leave the line half-changed: every change
        // under the lock is a single push or pop.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `job` to the lane that went idle last, or puts it in line; gives it back once the
    /// pool is closed.
    pub(super) fn submit(&self, mut job: Job) -> Result<(), Job> {
        let mut line = self.line();
        if line.closed {
            return Err(job);
        }
        while let Some(lane) = line.idle.pop() {
            match lane.send(job) {
                Ok(()) => return Ok(()),
                // That lane has ended: try the next.
                Err(back) => job = back,
            }
        }
        line.jobs.push_back(job);
        Ok(())
    }

    /// No new transactions; idle lanes end now, busy ones once the line is empty.
    pub(super) fn close(&self) {
        let mut line = self.line();
        line.closed = true;
        line.idle.clear();
    }

    /// The next transaction, once there is one; `None` once the pool is closed and the line is
    /// empty.
    async fn next(&self) -> Option<Job> {
        let handed = {
            let mut line = self.line();
            if let Some(job) = line.jobs.pop_front() {
                return Some(job);
            }
            if line.closed {
                return None;
            }
            let (lane, handed) = oneshot::channel();
            line.idle.push(lane);
            handed
        };
        handed.await.ok()
    }

    /// A transaction waiting in line.
    fn waiting(&self) -> Option<Job> {
        self.line().jobs.pop_front()
    }
}

/// A transaction taken behind the message before it.
struct Carried {
    job: Job,
    /// Its envelope went out on the current session and its replies are still to be read.
    envelope_sent: bool,
}

/// One connection; see the module documentation.
pub(super) struct Lane {
    connector: Arc<Connector>,
    queue: Queue,
    session: Option<AsyncSmtpConnection>,
    carried: Option<Carried>,
}

impl Lane {
    pub(super) fn new(connector: Arc<Connector>, queue: Queue) -> Self {
        Self {
            connector,
            queue,
            session: None,
            carried: None,
        }
    }

    /// Serves transactions until the pool is closed, then says goodbye to the relay.
    pub(super) async fn run(mut self) {
        loop {
            let (job, envelope_sent) = match self.carried.take() {
                Some(carried) => (carried.job, carried.envelope_sent),
                None => match self.queue.next().await {
                    Some(job) => (job, false),
                    None => break,
                },
            };
            self.serve(job, envelope_sent).await;
        }
        if let Some(mut session) = self.session.take() {
            // Polite but bounded: a relay that does not answer QUIT is not waited for.
            let _ = tokio::time::timeout(self.connector.settings.timeout, session.quit()).await;
        }
    }

    /// Runs one transaction and answers it, unless its delivery stopped waiting.
    async fn serve(&mut self, job: Job, envelope_sent: bool) {
        let Job {
            envelope,
            data,
            deadline,
            mut answer,
        } = job;
        if answer.is_closed() {
            if envelope_sent {
                // Its envelope is open on the session, which cannot be used without it.
                self.cut();
            }
            return;
        }
        let outcome = tokio::select! {
            outcome = tokio::time::timeout_at(
                deadline,
                self.transaction(&envelope, &data, envelope_sent),
            ) => Some(outcome),
            () = answer.closed() => None,
        };
        let result = match outcome {
            Some(Ok(result)) => result,
            Some(Err(_elapsed)) => {
                self.cut();
                Err(self.connector.overall_timeout())
            }
            None => {
                self.cut();
                return;
            }
        };
        let _ = answer.send(result);
    }

    /// The envelope (unless it was sent behind the previous message: then its replies), then
    /// the message, with a waiting transaction's envelope behind it when the relay pipelines.
    async fn transaction(
        &mut self,
        envelope: &Envelope,
        data: &[u8],
        envelope_sent: bool,
    ) -> Result<(), SessionError> {
        if envelope_sent {
            self.envelope_replies(envelope, data).await?;
        } else {
            self.envelope(envelope, data).await?;
        }
        let next = self.take_waiting();
        let Some(session) = self.session.as_mut() else {
            return Err(session_gone());
        };
        let written = session
            .message_then(data, next.as_deref().unwrap_or_default())
            .await;
        match written {
            Ok(_) => {
                if let Some(carried) = &mut self.carried {
                    carried.envelope_sent = next.is_some();
                }
                Ok(())
            }
            Err(e) => {
                if next.is_some() {
                    // The relay may be reading the next message's content now: a QUIT would
                    // be taken as such. Hanging up without an end of data abandons it.
                    self.cut();
                } else {
                    self.drop_session().await;
                }
                Err(SessionError::Smtp(e))
            }
        }
    }

    /// Sends the envelope on the session if it is still open (see the module documentation
    /// for the one resend on a new session), or on a new one.
    async fn envelope(&mut self, envelope: &Envelope, data: &[u8]) -> Result<(), SessionError> {
        let reused = match self.session.as_mut().map(|s| s.has_unread_input()) {
            Some(false) => true,
            Some(true) => {
                // Closed, or closing with a 421, while idle: nothing to say to it. Dropping it
                // closes the socket.
                self.session = None;
                false
            }
            None => false,
        };
        if !reused {
            return self.envelope_on_new_session(envelope, data).await;
        }
        match self.send_envelope(envelope, data).await {
            Err(SessionError::Smtp(e)) if connection_lost(&e) => {
                self.envelope_on_new_session(envelope, data).await
            }
            other => other,
        }
    }

    /// Drops the session, if any, and sends the envelope on a new one.
    async fn envelope_on_new_session(
        &mut self,
        envelope: &Envelope,
        data: &[u8],
    ) -> Result<(), SessionError> {
        self.drop_session().await;
        self.session = Some(self.connector.connect().await?);
        self.send_envelope(envelope, data).await
    }

    /// Reads the replies to an envelope sent behind the previous message. A connection that
    /// failed before they came is treated as a reused session's: once more on a new session.
    async fn envelope_replies(
        &mut self,
        envelope: &Envelope,
        data: &[u8],
    ) -> Result<(), SessionError> {
        let Some(session) = self.session.as_mut() else {
            return self.envelope(envelope, data).await;
        };
        match session.envelope_replies(envelope.to().len()).await {
            Ok(_) => Ok(()),
            Err(e) if connection_lost(&e) => self.envelope_on_new_session(envelope, data).await,
            Err(e) => {
                self.drop_session().await;
                Err(SessionError::Smtp(e))
            }
        }
    }

    async fn send_envelope(
        &mut self,
        envelope: &Envelope,
        data: &[u8],
    ) -> Result<(), SessionError> {
        let Some(session) = self.session.as_mut() else {
            return Err(session_gone());
        };
        match session.send_envelope(envelope, data).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.drop_session().await;
                Err(SessionError::Smtp(e))
            }
        }
    }

    /// Takes a transaction waiting in line (so every lane is busy) to send behind the current
    /// message, when the relay pipelines; returns its envelope group. It is kept as carried,
    /// not yet sent, so whatever happens to this transaction it is served next. One the relay
    /// could never take (lettre's client-side refusals: SMTPUTF8, 8BITMIME) is answered at once
    /// with that, as sending it alone would have been.
    fn take_waiting(&mut self) -> Option<Vec<u8>> {
        let session = self.session.as_ref()?;
        if self.carried.is_some()
            || !session
                .server_info()
                .supports_feature(Extension::Pipelining)
        {
            return None;
        }
        loop {
            let job = self.queue.waiting()?;
            if job.answer.is_closed() {
                continue;
            }
            match session.next_envelope_group(&job.envelope, &job.data) {
                Ok(group) => {
                    self.carried = Some(Carried {
                        job,
                        envelope_sent: false,
                    });
                    return group;
                }
                Err(e) => {
                    let _ = job.answer.send(Err(SessionError::Smtp(e)));
                }
            }
        }
    }

    /// Ends the session with a QUIT (if it is not broken already), within the transaction's
    /// deadline.
    async fn drop_session(&mut self) {
        if let Some(mut session) = self.session.take() {
            session.abort().await;
        }
        self.unsend_carried();
    }

    /// Drops the session without a word: closing the socket.
    fn cut(&mut self) {
        self.session = None;
        self.unsend_carried();
    }

    /// A carried transaction's envelope was on the session just dropped: it starts afresh.
    fn unsend_carried(&mut self) {
        if let Some(carried) = &mut self.carried {
            carried.envelope_sent = false;
        }
    }
}

/// The connection failed (closed, reset, unreadable) rather than the server refusing something
/// with a 4xx/5xx reply or us refusing to send (SMTPUTF8, 8BITMIME).
fn connection_lost(e: &smtp::Error) -> bool {
    e.status().is_none() && !e.is_client()
}

/// A lane lost its session between two steps of one transaction; not expected, but answered
/// rather than assumed away.
fn session_gone() -> SessionError {
    SessionError::Delivery(DeliveryError::transient(
        "the SMTP session closed in the middle of the transaction",
    ))
}
