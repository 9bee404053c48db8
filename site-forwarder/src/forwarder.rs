//! Forwards the buffer to central over one long-lived `SubmitNotifications` stream.
//!
//! Oldest first, at most `forward_window` submits unacked (tracked by [`ForwardWindow`]); the
//! window is refilled as acks arrive or when an enqueue wakes the forwarder. Acks may come in any
//! order; whatever acks are ready together are settled in one buffer write job.
//!
//! Invariants:
//! - A row is deleted only after central acked it ACCEPTED or DUPLICATE, i.e. after central
//!   committed it. A REJECTED row moves to the local `rejected` table: it would be rejected again,
//!   so it is never retried and never holds up the rows behind it.
//! - After any break (connect failure, stream error or end, a dead link, a stalled stream, a
//!   buffer write failure) the forwarder reconnects and resends everything still buffered from
//!   the oldest row. Rows acked just before the break may be sent twice; central answers
//!   DUPLICATE and nothing is stored twice.
//! - Connection attempts start at least `forward_retry_interval` apart, and no further: a stream
//!   that was open longer than that reconnects at once when it breaks (it was declared dead, or
//!   central ended it; either way the next attempt tells more than waiting does), and an
//!   attempt that hung until a timeout is followed at once by the next. So an outage costs
//!   central one attempt per interval, and a healed link is used within about one interval.
//! - A silent link is declared dead within `central.keepalive_interval +
//!   central.keepalive_timeout` (HTTP/2 pings, on the stream and on a connection still waiting
//!   for the stream to open), and a stream with submits outstanding and no ack for
//!   `central.ack_timeout` is abandoned; `central_reachable` turns false at that moment.
//! - Every wait also watches the shutdown token, so shutdown stops sending at once.
//! - Central ending a stream with PERMISSION_DENIED (with client certificates required, this
//!   node's certificate names another site than `site_id`) is not an answer about any row: it is
//!   "cannot forward". Every row stays buffered (none moves to the rejected table), the refusal
//!   is shown (`GetBufferStats.forward_refused_reason`, `outbox_site_forward_refused` for an
//!   alert rule, a WARN line when it starts or its reason changes) until central acks again,
//!   and the forwarder retries after `forward_retry_interval`, doubling up to
//!   [`MAX_REFUSED_BACKOFF`] while refusals go on, so a certificate fixed at either end is
//!   noticed within a minute without hammering central meanwhile.
//! - A row a pending clear holds (`PendingClears::holds`: an unmarked row buffered after a clear
//!   of its condition key that central has not applied yet) stops the stream at that row until
//!   central has; the [`crate::clears`] task, run here beside the stream, sends the clears.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_proto::v1::{NotificationSubmit, NotificationSubmitAck, SubmitOutcome};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tonic::transport::Endpoint;

use crate::acks::AckSender;
use crate::buffer::{Acks, BufferError, Clears, Forwarding, Page, Statuses};
use crate::clears::ClearSender;
use crate::config::Config;
use crate::domain::{ForwardSnapshot, NotificationId, Seq};
use crate::link::{LinkError, central_endpoint, error_chain};
use crate::metrics::SiteMetrics;
use crate::statuses::StatusFollower;
use crate::wire;

/// Rows read from the buffer per refill query. Small enough that one read holds little memory
/// (rows can be up to ~280 KiB each), large enough that refilling a whole window takes a few
/// queries.
const PAGE_ROWS: usize = 128;
/// Most acks settled in one buffer write job; bounds the job's duration in the writer.
const MAX_ACK_BATCH: usize = 1024;
/// The longest wait between two attempts while central refuses this node's submits
/// (PERMISSION_DENIED). A refusal is a configuration to fix (a certificate, or central's CA),
/// which nothing here can heal by retrying fast; once an operator fixes it at central, the
/// backlog should move within a minute. Never shorter than `forward_retry_interval`.
pub(crate) const MAX_REFUSED_BACKOFF: Duration = Duration::from_secs(60);

/// Why a forwarding session ended (the forwarder then reconnects; see the module comment for
/// when it waits first).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("central did not open the submit stream: {0}")]
    Open(tonic::Status),
    #[error("central did not answer the stream request within {0:?}")]
    OpenTimeout(Duration),
    #[error("the submit stream broke: {0}")]
    Stream(tonic::Status),
    #[error("central closed the submit stream")]
    Closed,
    #[error("no ack from central for {0:?} with submits outstanding")]
    Stalled(Duration),
    #[error(transparent)]
    Buffer(#[from] BufferError),
}

impl ForwardError {
    /// Central's refusal of this node's submits (PERMISSION_DENIED, when the stream is opened or
    /// as the status that ends it), as opposed to a link or server failure.
    pub(crate) fn refusal(&self) -> Option<&tonic::Status> {
        match self {
            Self::Open(status) | Self::Stream(status)
                if status.code() == tonic::Code::PermissionDenied =>
            {
                Some(status)
            }
            _ => None,
        }
    }
}

/// The wait before attempt `refusals + 1` after `refusals` refusals in a row: `base`, doubling,
/// at most [`MAX_REFUSED_BACKOFF`] (or `base`, if that is longer).
pub(crate) fn refused_backoff(base: Duration, refusals: u32) -> Duration {
    let cap = MAX_REFUSED_BACKOFF.max(base);
    let doublings = refusals.saturating_sub(1).min(16);
    base.saturating_mul(1 << doublings).min(cap)
}

pub(crate) type Result<T, E = ForwardError> = std::result::Result<T, E>;

/// The forwarder's live figures, shared with `GetBufferStats` and `/metrics`. Atomics: written by
/// the forwarder task only, read by any request, and no reader needs two of them to be consistent.
#[derive(Debug, Default)]
pub(crate) struct ForwardState {
    central_reachable: AtomicBool,
    in_flight: AtomicU64,
    /// Unix milliseconds of the last ACCEPTED/DUPLICATE ack; 0 = none since start.
    last_forward_at_ms: AtomicI64,
    /// Central's reason while it refuses this node's submits (see [`ForwardError::refusal`]).
    refused: Mutex<Option<String>>,
}

impl ForwardState {
    pub(crate) fn snapshot(&self) -> ForwardSnapshot {
        let last = self.last_forward_at_ms.load(Ordering::Relaxed);
        ForwardSnapshot {
            central_reachable: self.central_reachable.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            last_forward_at: (last != 0)
                .then(|| DateTime::from_timestamp_millis(last))
                .flatten(),
            refused: self.refused().clone(),
        }
    }

    fn refused(&self) -> MutexGuard<'_, Option<String>> {
        self.refused.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records central's refusal (`Some(reason)`) or its end (`None`); returns the reason
    /// recorded before.
    fn set_refused(&self, reason: Option<String>) -> Option<String> {
        std::mem::replace(&mut *self.refused(), reason)
    }

    fn set_reachable(&self, reachable: bool) -> bool {
        self.central_reachable.swap(reachable, Ordering::Relaxed)
    }

    fn set_in_flight(&self, n: usize) {
        self.in_flight
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn forwarded_at(&self, at: DateTime<Utc>) {
        self.last_forward_at_ms
            .store(at.timestamp_millis(), Ordering::Relaxed);
    }
}

/// The submits sent on the current stream and not yet acked, and how far the stream has read
/// the buffer. The cursor only moves forward within a stream; [`Self::restart`] rewinds it for
/// the next stream, which is how "resend everything still buffered" happens.
#[derive(Debug)]
pub(crate) struct ForwardWindow {
    capacity: usize,
    unacked: HashMap<NotificationId, Seq>,
    cursor: Seq,
}

impl ForwardWindow {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            unacked: HashMap::with_capacity(capacity.max(1)),
            cursor: Seq::START,
        }
    }

    /// How many more submits may be sent now.
    pub(crate) fn free(&self) -> usize {
        self.capacity.saturating_sub(self.unacked.len())
    }

    pub(crate) fn len(&self) -> usize {
        self.unacked.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.unacked.is_empty()
    }

    /// The last buffer row handed to this stream (sent or skipped).
    pub(crate) fn cursor(&self) -> Seq {
        self.cursor
    }

    /// Records a submit put on the stream.
    pub(crate) fn sent(&mut self, id: NotificationId, seq: Seq) {
        self.unacked.insert(id, seq);
        self.skip_to(seq);
    }

    /// Moves the cursor past a row that is not sent (e.g. unreadable).
    pub(crate) fn skip_to(&mut self, seq: Seq) {
        self.cursor = self.cursor.max(seq);
    }

    /// Takes the ack for `id` off the window; `None` if it is not in flight on this stream.
    pub(crate) fn acked(&mut self, id: &NotificationId) -> Option<Seq> {
        self.unacked.remove(id)
    }

    /// Forgets the stream: nothing in flight, next read from the oldest row.
    pub(crate) fn restart(&mut self) {
        self.unacked.clear();
        self.cursor = Seq::START;
    }
}

/// The forwarding task. Build with [`Forwarder::new`], run with [`Forwarder::run`].
#[derive(Debug)]
pub(crate) struct Forwarder {
    buffer: Forwarding,
    endpoint: Endpoint,
    central_url: String,
    retry_interval: Duration,
    open_timeout: Duration,
    /// `central.ack_timeout`: see [`crate::config::CentralLinkConfig`].
    ack_timeout: Duration,
    window_size: usize,
    state: Arc<ForwardState>,
    metrics: Arc<SiteMetrics>,
    clears: ClearSender,
    acks: AckSender,
    statuses: StatusFollower,
}

/// What one batch of acks asks of the buffer.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Settlement {
    /// Rows central acked ACCEPTED or DUPLICATE: delete them.
    pub acked: Vec<Seq>,
    /// How many of `acked` were DUPLICATE (for the forwarded counter).
    pub duplicates: usize,
    pub rejected: Vec<(Seq, String)>,
}

impl Forwarder {
    pub(crate) fn new(
        buffer: Forwarding,
        clears: Clears,
        acks: Acks,
        statuses: Statuses,
        config: &Config,
        state: Arc<ForwardState>,
        metrics: Arc<SiteMetrics>,
    ) -> Result<Self> {
        let endpoint = central_endpoint(config)?;
        Ok(Self {
            statuses: StatusFollower::new(statuses, &endpoint, config, Arc::clone(&metrics)),
            clears: ClearSender::new(clears, &endpoint, config),
            acks: AckSender::new(acks, &endpoint, config),
            buffer,
            endpoint,
            central_url: config.central_url.clone(),
            retry_interval: config.forward_retry_interval,
            open_timeout: config.request_timeout,
            ack_timeout: config.central.ack_timeout,
            window_size: config.forward_window,
            state,
            metrics,
        })
    }

    /// Forwards, sends the pending clears and acknowledgements, and follows the final
    /// statuses central sends back, until `shutdown` is cancelled.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        tokio::join!(
            self.forward(&shutdown),
            self.clears.run(&shutdown),
            self.acks.run(&shutdown),
            self.statuses.run(&shutdown)
        );
    }

    /// Forwards until `shutdown` is cancelled, reconnecting after every break.
    async fn forward(&self, shutdown: &CancellationToken) {
        let mut window = ForwardWindow::new(self.window_size);
        // Whether the last failure was already reported as a warning.
        let mut reported = false;
        // Sessions in a row that central refused (PERMISSION_DENIED).
        let mut refusals: u32 = 0;
        loop {
            window.restart();
            let attempt_started = Instant::now();
            let outcome = self.session(&mut window, shutdown).await;
            let was_reachable = self.state.set_reachable(false);
            self.state.set_in_flight(0);
            let refusal = outcome.as_ref().err().and_then(ForwardError::refusal);
            let next_attempt = match refusal {
                Some(_) => {
                    refusals = refusals.saturating_add(1);
                    Instant::now() + refused_backoff(self.retry_interval, refusals)
                }
                None => {
                    refusals = 0;
                    attempt_started + self.retry_interval
                }
            };
            let retry_in = next_attempt.saturating_duration_since(Instant::now());
            if let Some(status) = refusal {
                let reason = status.message().to_owned();
                let before = self.state.set_refused(Some(reason.clone()));
                // When it starts or its reason changes; repeats go to debug.
                if before.as_ref() == Some(&reason) {
                    tracing::debug!(%reason, ?retry_in, "central still refuses this node's submits");
                } else {
                    tracing::warn!(
                        central = %self.central_url, %reason, ?retry_in,
                        "central refuses this node's submits (PERMISSION_DENIED): every \
                         notification stays buffered until it accepts them; check that this \
                         node's client certificate names site_id. Retrying with a backoff"
                    );
                }
                reported = true;
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep_until(next_attempt) => {}
                }
                continue;
            }
            match outcome {
                Ok(()) => return,
                // The first failure (at start or after being connected) is worth a warning;
                // repeats during a long outage would flood the log, so they go to debug.
                Err(error) if was_reachable || !reported => {
                    reported = true;
                    tracing::warn!(
                        central = %self.central_url, %error, ?retry_in,
                        "cannot forward to central; will reconnect"
                    );
                }
                Err(error) => tracing::debug!(
                    central = %self.central_url, %error, ?retry_in,
                    "central still unreachable"
                ),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(next_attempt) => {}
            }
        }
    }

    /// One stream's life: connect, open, then send and settle until it breaks. `Ok` only when
    /// shutdown was requested.
    async fn session(
        &self,
        window: &mut ForwardWindow,
        shutdown: &CancellationToken,
    ) -> Result<()> {
        let channel = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            connected = self.endpoint.connect() => connected
                .map_err(|e| ForwardError::Connect(error_chain(&e)))?,
        };
        let mut client = NotificationIngestClient::new(channel);
        // Capacity = window: at most `window` submits are unacked, so sends never wait here.
        let (submits, outbound) = mpsc::channel(self.window_size.max(1));
        let opened = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            opened = tokio::time::timeout(
                self.open_timeout,
                client.submit_notifications(ReceiverStream::new(outbound)),
            ) => opened,
        };
        let mut acks = opened
            .map_err(|_| ForwardError::OpenTimeout(self.open_timeout))?
            .map_err(ForwardError::Open)?
            .into_inner();
        self.state.set_reachable(true);
        tracing::info!(central = %self.central_url, "forwarding stream to central is open");

        let wake = Arc::clone(self.buffer.enqueued());
        // A clear reaching central may release a held row.
        let mut clears = self.buffer.pending_clears();
        let mut clears_open = true;
        // When the stream last made progress; only meaningful while submits are outstanding.
        let mut last_progress = Instant::now();
        loop {
            if window.is_empty() {
                last_progress = Instant::now();
            }
            self.fill(window, &submits).await?;
            self.state.set_in_flight(window.len());
            let stall_at = last_progress + self.ack_timeout;
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                first = acks.next() => {
                    let (batch, end) = take_ready(&mut acks, first);
                    if !batch.is_empty() && self.state.set_refused(None).is_some() {
                        tracing::info!("central accepts this node's submits again");
                    }
                    let settlement = apply_acks(window, batch);
                    self.settle(settlement).await?;
                    self.state.set_in_flight(window.len());
                    last_progress = Instant::now();
                    if let Some(end) = end {
                        return Err(end);
                    }
                }
                () = wake.notified(), if window.free() > 0 => {}
                changed = clears.changed(), if clears_open && window.free() > 0 => {
                    // Cannot fail while this forwarder holds the buffer; never spin on it.
                    clears_open = changed.is_ok();
                }
                () = tokio::time::sleep_until(stall_at), if !window.is_empty() => {
                    return Err(ForwardError::Stalled(self.ack_timeout));
                }
            }
        }
    }

    /// Sends buffered rows after the cursor until the window is full, the buffer has no more,
    /// or a row must wait for a pending clear (the cursor then stays before it).
    async fn fill(
        &self,
        window: &mut ForwardWindow,
        submits: &mpsc::Sender<NotificationSubmit>,
    ) -> Result<()> {
        while window.free() > 0 {
            let limit = window.free().min(PAGE_ROWS);
            let (page, clears) = self.buffer.next_to_forward(window.cursor(), limit).await?;
            if page.is_empty() {
                return Ok(());
            }
            let held = page
                .rows
                .iter()
                .find(|(seq, row)| clears.holds(*seq, row))
                .map(|(seq, _)| *seq);
            self.reject_unreadable(window, &page, held).await?;
            for (seq, notification) in page.rows {
                if held.is_some_and(|held| seq >= held) {
                    return Ok(());
                }
                submits
                    .send(wire::submit(&notification))
                    .await
                    .map_err(|_| ForwardError::Closed)?;
                window.sent(notification.id, seq);
            }
        }
        Ok(())
    }

    /// Rows that fail the content rules can never be accepted; set them aside like a rejection.
    /// Only those before `held` (a row that waits): the cursor must not pass it.
    async fn reject_unreadable(
        &self,
        window: &mut ForwardWindow,
        page: &Page,
        held: Option<Seq>,
    ) -> Result<()> {
        let unreadable = page
            .unreadable
            .iter()
            .filter(|(seq, _, _)| held.is_none_or(|held| *seq < held));
        let mut rejected = Vec::new();
        for (seq, id, problem) in unreadable {
            tracing::warn!(
                notification_id = %id, %problem,
                "buffered notification breaks the content rules; moved to the rejected table"
            );
            rejected.push((*seq, format!("invalid in the site buffer: {problem}")));
            window.skip_to(*seq);
        }
        if !rejected.is_empty() {
            self.buffer.settle(Vec::new(), rejected).await?;
        }
        Ok(())
    }

    async fn settle(&self, settlement: Settlement) -> Result<()> {
        let acked = settlement.acked.len();
        let rejected = settlement.rejected.len();
        self.buffer
            .settle(settlement.acked, settlement.rejected)
            .await?;
        if acked > 0 {
            self.state.forwarded_at(Utc::now());
        }
        // Counted once the buffer (and the stamp above) reflect the acks, so the counters never
        // run ahead of them.
        self.metrics.forwarded(
            acked.saturating_sub(settlement.duplicates),
            settlement.duplicates,
            rejected,
        );
        Ok(())
    }
}

type AckItem = Option<std::result::Result<NotificationSubmitAck, tonic::Status>>;

/// The first ack plus every further ack already received, so a burst of acks is settled by one
/// write job. The second value is set when the stream ended or broke after those acks.
fn take_ready(
    acks: &mut Streaming<NotificationSubmitAck>,
    first: AckItem,
) -> (Vec<NotificationSubmitAck>, Option<ForwardError>) {
    let mut batch = Vec::new();
    let mut next = Some(first);
    while let Some(item) = next {
        match item {
            Some(Ok(ack)) => batch.push(ack),
            Some(Err(status)) => return (batch, Some(ForwardError::Stream(status))),
            None => return (batch, Some(ForwardError::Closed)),
        }
        if batch.len() >= MAX_ACK_BATCH {
            break;
        }
        // `now_or_never` polls once: an ack not yet here waits for the next round.
        next = acks.next().now_or_never();
    }
    (batch, None)
}

/// Matches acks to the window and decides what happens to each row.
pub(crate) fn apply_acks(
    window: &mut ForwardWindow,
    acks: Vec<NotificationSubmitAck>,
) -> Settlement {
    let mut settlement = Settlement::default();
    for ack in acks {
        let seq = NotificationId::parse(&ack.notification_id, "notification_id")
            .ok()
            .and_then(|id| window.acked(&id));
        let Some(seq) = seq else {
            tracing::warn!(
                notification_id = %ack.notification_id,
                "central acked a notification that is not in flight on this stream; ignored"
            );
            continue;
        };
        match SubmitOutcome::try_from(ack.outcome) {
            Ok(SubmitOutcome::Accepted) => settlement.acked.push(seq),
            Ok(SubmitOutcome::Duplicate) => {
                settlement.acked.push(seq);
                settlement.duplicates += 1;
            }
            Ok(SubmitOutcome::Rejected) => {
                let reason = if ack.reason.is_empty() {
                    "no reason given".to_owned()
                } else {
                    ack.reason
                };
                tracing::warn!(
                    notification_id = %ack.notification_id, %reason,
                    "central rejected a notification; moved to the local rejected table"
                );
                settlement.rejected.push((seq, reason));
            }
            Ok(SubmitOutcome::Unspecified) | Err(_) => {
                // Not an ack we understand: keep the row; it is resent on the next stream.
                tracing::warn!(
                    notification_id = %ack.notification_id, outcome = ack.outcome,
                    "ack with an unknown outcome; the notification stays buffered"
                );
            }
        }
    }
    settlement
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(id: &NotificationId, outcome: SubmitOutcome, reason: &str) -> NotificationSubmitAck {
        NotificationSubmitAck {
            notification_id: id.to_string(),
            outcome: outcome.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn refusals_back_off_doubling_up_to_a_minute() {
        let base = Duration::from_millis(500);
        let waits: Vec<Duration> = (1..=9).map(|n| refused_backoff(base, n)).collect();
        assert_eq!(
            waits,
            [500, 1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000]
                .map(Duration::from_millis)
        );
        assert_eq!(refused_backoff(base, u32::MAX), MAX_REFUSED_BACKOFF);
        // A retry interval longer than the cap is never shortened.
        let slow = Duration::from_secs(90);
        assert_eq!(refused_backoff(slow, 3), slow);
    }

    #[test]
    fn only_permission_denied_is_a_refusal() {
        let denied = tonic::Status::permission_denied("certificate for site-b");
        assert!(ForwardError::Stream(denied.clone()).refusal().is_some());
        assert!(ForwardError::Open(denied).refusal().is_some());
        for other in [
            ForwardError::Stream(tonic::Status::unavailable("down")),
            ForwardError::Closed,
            ForwardError::Stalled(Duration::from_secs(1)),
        ] {
            assert!(other.refusal().is_none(), "{other}");
        }
    }

    #[test]
    fn window_bounds_in_flight_and_moves_the_cursor_forward() {
        let mut window = ForwardWindow::new(2);
        let (a, b) = (NotificationId::generate(), NotificationId::generate());
        assert_eq!(window.free(), 2);
        window.sent(a, Seq(5));
        window.sent(b, Seq(9));
        assert_eq!((window.free(), window.cursor()), (0, Seq(9)));
        assert_eq!(window.acked(&a), Some(Seq(5)));
        assert_eq!(window.acked(&a), None, "an ack counts once");
        assert_eq!((window.free(), window.cursor()), (1, Seq(9)));
        window.skip_to(Seq(3));
        assert_eq!(
            window.cursor(),
            Seq(9),
            "the cursor never moves back within a stream"
        );
        window.restart();
        assert_eq!((window.free(), window.cursor()), (2, Seq::START));
    }

    #[test]
    fn acks_become_deletes_rejections_or_nothing() {
        let mut window = ForwardWindow::new(8);
        let ids: Vec<_> = (0..5).map(|_| NotificationId::generate()).collect();
        for (i, id) in ids.iter().enumerate() {
            window.sent(*id, Seq(i as i64 + 1));
        }
        let stranger = NotificationId::generate();
        let settlement = apply_acks(
            &mut window,
            vec![
                ack(&ids[2], SubmitOutcome::Duplicate, ""),
                ack(&ids[0], SubmitOutcome::Accepted, ""),
                ack(&ids[1], SubmitOutcome::Rejected, "conflict"),
                ack(&ids[3], SubmitOutcome::Unspecified, ""),
                ack(&stranger, SubmitOutcome::Accepted, ""),
                NotificationSubmitAck {
                    notification_id: "garbage".into(),
                    outcome: SubmitOutcome::Accepted.into(),
                    reason: String::new(),
                },
            ],
        );
        assert_eq!(
            settlement,
            Settlement {
                acked: vec![Seq(3), Seq(1)],
                duplicates: 1,
                rejected: vec![(Seq(2), "conflict".into())],
            }
        );
        // ids[4] was never acked and stays in flight; ids[3] left the window but stays buffered.
        assert_eq!(window.len(), 1);
    }
}
