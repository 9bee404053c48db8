//! The active's side of `Replicate`: one task per standby stream that turns the buffer's
//! committed changes into batches.
//!
//! A stream starts from the standby's hello. When the standby copied from this active in this
//! term, it resumes: first the spans saying which of its rows (up to `replicated_through`) are
//! still buffered here, then every row after it. Otherwise it gets a full copy: the same spans
//! (so it drops whatever it holds that is not here), then every row.
//!
//! Rows come from memory while the stream keeps up: the buffer keeps the rows it committed
//! since the stream attached ([`crate::buffer::recent`]), in seq order, and the stream takes
//! those after its cursor. When the cursor is before what memory covers (a resume, a full copy,
//! a standby that fell behind, any change other than a Send) it reads the table instead, which
//! is always right; memory only saves reading back and decoding what was just written.
//!
//! Invariants:
//! - Removals are subscribed to before the first read, and each batch's removals are drained
//!   after its rows were read (from the table or from memory, where a removal is marked under
//!   the same lock it is announced with); the standby applies a batch's adds before its
//!   removes. So a row deleted here is never left on the standby by an add that overtook its
//!   removal.
//! - At most [`WINDOW`] batches are unconfirmed; the rest waits in the buffer, not in memory.
//! - A row a clear marks after the standby got it is copied again at the same seq, which
//!   replaces the standby's unmarked copy: marks are announced like removals (under the same
//!   lock as the recent rows, which a mark empties), and the stream re-reads the marked rows
//!   from the table, draining the announcements after that read. A resumed stream first copies
//!   again every marked row up to where the standby's copy reaches, for the marks it missed.
//!   So a promoted standby never forwards unmarked a row the active had cleared.
//! - The pending clears go as a whole list: on the first batch of the stream, then on the
//!   first batch sent after each change (a batch with nothing else goes when nothing else
//!   does). A clear's list is published before its marks are announced, so the batch that
//!   copies the marked rows again carries it, or an earlier one did; a row committed after the
//!   clear is copied only once its commit is announced (from memory, or from the table up to
//!   the announced head), which is after the list was published. A standby that has a row sent
//!   after the clear therefore has the clear, and so does one that has a row it marked, but for
//!   the moment between the clear's commit and its announcement (a row read from the table then
//!   may already be marked; the list follows with the next batch).
//! - The pending acknowledgements go as a whole list the same way (first batch, then the first
//!   after each change). They mark no rows, so a standby that misses the newest for a moment
//!   only sends it late, once promoted, never wrongly.
//! - A change backlog the stream cannot keep up with ends the stream; the standby reconnects
//!   and resumes from the table, which is always right.
//! - A batch left unconfirmed for `failover_timeout` ends the stream: a standby that confirmed
//!   nothing for that long is as good as gone (stuck disk, frozen process, a link that passes
//!   pings but not data), and `peer_connected` must say so. HTTP/2 pings on the pair endpoint
//!   (see [`super::service`]) find a dead connection sooner.
//! - The standby lag is kept in [`super::Pair`] ([`super::lag`]): this stream tells it what
//!   the standby holds (the hello, each confirmation); the figures are worked out when read.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use outbox_proto::v1::{
    ReplicaMessage, ReplicatedRow, ReplicatedStatus, ReplicationBatch, RetainedSpan as ProtoSpan,
    SeqRange, replica_message,
};
use prost::Message;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

use super::{MAX_PENDING_ACKS, MAX_PENDING_CLEARS, Pair};
use crate::buffer::{BufferError, RecentReader, Replication, RetainedSpan, RowChange};
use crate::domain::{BufferedNotification, PendingAcks, PendingClears, Role, Seq, StatusSeq};
use crate::wire;

/// Unconfirmed batches per stream. The standby applies whatever has arrived in one transaction
/// and confirms it, so under load the lag is about this many batches: 8 keeps it to tens of
/// milliseconds while a standby round trip still moves ~2,000 rows. Each batch is at most
/// [`BATCH_BYTES`] plus one row, which bounds what a slow standby pins (~9 MiB).
pub(crate) const WINDOW: usize = 8;
/// A batch closes once its rows pass this size (a row is at most ~280 KiB, so a batch stays far
/// below the 4 MiB message limit).
pub(crate) const BATCH_BYTES: usize = 1 << 20;
/// Rows read from the buffer (or taken from memory) per page.
const PAGE_ROWS: usize = 256;
/// Shortest gap between two batches. Each batch costs the standby one fsync, on a disk it may
/// share with the active; gathering a few milliseconds of Sends per batch keeps that to at most
/// 200 per second under any load, for a lag that stays in milliseconds. A stream that is behind
/// (its last read was a full page) does not wait: its batches are full anyway.
const LINGER: Duration = Duration::from_millis(5);
/// Seqs per retained span: 64 Ki seqs is at most 1 MiB of ranges even when none are adjacent.
const SPAN_ROWS: usize = 65_536;

/// The first message of a stream, from the standby.
#[derive(Debug, Clone)]
pub(crate) struct Hello {
    pub node_name: String,
    pub term: u64,
    pub replicated_through: Seq,
    /// The highest status seq the standby holds of this active's (0: none).
    pub statuses_through: StatusSeq,
}

/// Streams the buffer to one standby until it goes away, this node stops being active, the
/// stream breaks, or `stop` (shutdown). `out` is the response stream.
pub(crate) async fn stream_to_standby(
    buffer: Replication,
    pair: Arc<Pair>,
    hello: Hello,
    mut inbound: Streaming<ReplicaMessage>,
    out: mpsc::Sender<Result<ReplicationBatch, SourceError>>,
    timing: StreamTiming,
    stop: CancellationToken,
) {
    pair.stream_opened();
    let mut session = Session::new(buffer, Arc::clone(&pair), hello.clone(), timing);
    let outcome = tokio::select! {
        outcome = session.run(&mut inbound, &out) => outcome,
        // Shutting down: the stream ends now rather than holding the server's drain.
        () = stop.cancelled() => Ok(()),
    };
    pair.stream_closed();
    match outcome {
        Ok(()) => tracing::info!(standby = %hello.node_name, "replication stream ended"),
        Err(error) => {
            tracing::info!(standby = %hello.node_name, reason = %error, "replication stream ended");
            let _ = out.send(Err(error)).await;
        }
    }
}

/// Why a replication stream ended early; the standby gets it as the stream's last message
/// (`grpc` maps it to a status: the one place the pair's errors meet the transport).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The buffer could not be read; the standby reconnects and resumes.
    #[error("{0}")]
    Buffer(#[from] BufferError),
    /// The buffer's announcements stopped: the node is shutting down.
    #[error("the buffer closed")]
    BufferClosed,
    /// The stream could not keep up with the buffer's changes; a resume reads the table.
    #[error(
        "the standby fell too far behind the buffer's changes; reconnect to resume from the buffer"
    )]
    FellBehind,
    /// The standby sent something other than a confirmation after its hello.
    #[error("message: after the hello, only applied_batch is expected")]
    UnexpectedMessage,
    /// The standby's side of the stream failed; its own status is passed back.
    #[error("{}", .0.message())]
    Standby(tonic::Status),
    /// This node stepped down while streaming.
    #[error("this node is no longer the active one of its pair")]
    NotActive,
    /// A batch stayed unconfirmed for `failover_timeout`.
    #[error("the standby confirmed no batch for {0:?} (failover_timeout); reconnect to resume")]
    Unconfirmed(Duration),
    /// The response stream was dropped.
    #[error("the standby went away")]
    StandbyGone,
}

/// The pair's timing, from `failover_timeout`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamTiming {
    /// A heartbeat follows this long without a batch.
    pub heartbeat: Duration,
    /// Longest a batch may stay unconfirmed before the stream ends.
    pub confirm_timeout: Duration,
}

/// A batch sent and not yet confirmed.
#[derive(Debug)]
struct Unconfirmed {
    batch: u64,
    /// The stream's cursor when it was sent: once it is confirmed, the standby holds every row
    /// up to here that the active still held when it was read (rows already gone never need
    /// copying).
    through: Seq,
    sent_at: Instant,
}

struct Session {
    buffer: Replication,
    pair: Arc<Pair>,
    hello: Hello,
    timing: StreamTiming,
    /// Set once the hello is taken in: whose confirmations move the lag.
    lag_stream: Option<super::lag::StreamId>,
    next_batch: u64,
    /// Last seq read for this stream.
    cursor: Seq,
    /// Highest seq the standby confirmed.
    confirmed: Seq,
    unconfirmed: VecDeque<Unconfirmed>,
    /// Removals collected and not yet sent.
    removes: Vec<Seq>,
    /// Seqs marked cleared since the standby may have copied them, not yet copied again.
    remarked: BTreeSet<Seq>,
    /// The pending clears; a change not yet seen is a list not yet sent.
    clears: watch::Receiver<PendingClears>,
    /// Whether this stream already warned that it sends only the first [`MAX_PENDING_CLEARS`].
    clears_cut_reported: bool,
    /// The pending acknowledgements, sent like the clears.
    acks: watch::Receiver<PendingAcks>,
    acks_cut_reported: bool,
    /// When the last batch went out: a heartbeat follows one interval of silence.
    last_sent: Instant,
    /// The last status seq sent to the standby (or that it held when it resumed).
    status_cursor: StatusSeq,
}

impl Session {
    fn new(buffer: Replication, pair: Arc<Pair>, hello: Hello, timing: StreamTiming) -> Self {
        Self {
            pair,
            hello,
            timing,
            lag_stream: None,
            next_batch: 1,
            cursor: Seq::START,
            confirmed: Seq::START,
            unconfirmed: VecDeque::new(),
            removes: Vec::new(),
            remarked: BTreeSet::new(),
            clears: buffer.pending_clears(),
            clears_cut_reported: false,
            acks: buffer.pending_acks(),
            acks_cut_reported: false,
            last_sent: Instant::now(),
            status_cursor: StatusSeq::default(),
            buffer,
        }
    }

    async fn run(
        &mut self,
        inbound: &mut Streaming<ReplicaMessage>,
        out: &mpsc::Sender<Result<ReplicationBatch, SourceError>>,
    ) -> Result<(), SourceError> {
        // Before any read, so no removal or mark committed after it can be missed.
        let mut changes = self.buffer.row_changes();
        // Rows committed from now on stay in memory for this stream.
        let recent = self.buffer.recent_rows();
        let mut head = self.buffer.head();
        // Only wakes the loop; `self.clears` tells whether the list was sent since it changed.
        let mut clears_changed = self.buffer.pending_clears();
        let mut acks_changed = self.buffer.pending_acks();
        let mut status_head = self.buffer.status_head();
        let mut role = self.pair.watch_role();
        let term = role.borrow().term;
        let through = self.hello.replicated_through;
        let resume = self.hello.term == term && through > Seq::START;
        if resume {
            self.cursor = through;
            self.confirmed = through;
        }
        // Statuses resume within a term too; after a term change the standby's numbering may
        // not be this node's, so it gets them all (it keeps the newest per notification).
        if self.hello.term == term {
            self.status_cursor = self.hello.statuses_through;
        }
        // A full copy starts from nothing: until it is confirmed the standby holds nothing.
        self.lag_stream = Some(self.pair.standby_attached(self.confirmed));
        tracing::info!(
            standby = %self.hello.node_name, resume, from_seq = self.cursor.0,
            "a standby is following this node"
        );
        self.send_spans(through, out).await?;
        if resume {
            // The standby's copies of rows marked while it was away are unmarked.
            let marked = self.buffer.marked_seqs(through).await?;
            self.remarked.extend(marked);
        }

        let mut more = false;
        loop {
            if self.unconfirmed.len() < WINDOW {
                if !more {
                    tokio::time::sleep_until(self.last_sent + LINGER).await;
                }
                more = self.send_rows(&recent, &mut changes, out).await?;
            }
            if self.unconfirmed.len() < WINDOW && !self.remarked.is_empty() {
                self.send_marked(&mut changes, out).await?;
                more |= !self.remarked.is_empty();
            }
            if self.unconfirmed.len() < WINDOW
                && *status_head.borrow_and_update() > self.status_cursor
            {
                more |= self.send_statuses(out).await?;
            }
            // Removals or pending clears that came without rows, and the heartbeat when nothing
            // else was sent.
            if !self.removes.is_empty()
                || self.clears.has_changed().unwrap_or(false)
                || self.acks.has_changed().unwrap_or(false)
                || Instant::now() >= self.last_sent + self.timing.heartbeat
            {
                self.drain(&mut changes)?;
                self.send(Vec::new(), out).await?;
            }
            if more && self.unconfirmed.len() < WINDOW {
                continue;
            }
            tokio::select! {
                changed = head.changed(), if self.unconfirmed.len() < WINDOW => {
                    if changed.is_err() {
                        return Err(SourceError::BufferClosed);
                    }
                }
                changed = status_head.changed(), if self.unconfirmed.len() < WINDOW => {
                    if changed.is_err() {
                        return Err(SourceError::BufferClosed);
                    }
                }
                change = changes.recv() => match change {
                    Ok(change) => self.note(change),
                    Err(broadcast::error::RecvError::Lagged(_)) => return Err(SourceError::FellBehind),
                    Err(broadcast::error::RecvError::Closed) => {
                        return Err(SourceError::BufferClosed);
                    }
                },
                message = inbound.next() => match message {
                    Some(Ok(ReplicaMessage { message: Some(replica_message::Message::AppliedBatch(n)) })) => {
                        self.confirm(n);
                    }
                    Some(Ok(_)) => return Err(SourceError::UnexpectedMessage),
                    Some(Err(status)) => return Err(SourceError::Standby(status)),
                    None => return Ok(()),
                },
                changed = clears_changed.changed() => {
                    if changed.is_err() {
                        return Err(SourceError::BufferClosed);
                    }
                }
                changed = acks_changed.changed() => {
                    if changed.is_err() {
                        return Err(SourceError::BufferClosed);
                    }
                }
                changed = role.changed() => {
                    if changed.is_err() || role.borrow().role != Role::Active {
                        return Err(SourceError::NotActive);
                    }
                }
                () = tokio::time::sleep_until(self.last_sent + self.timing.heartbeat) => {}
                () = tokio::time::sleep_until(self.confirm_deadline()), if !self.unconfirmed.is_empty() => {
                    return Err(SourceError::Unconfirmed(self.timing.confirm_timeout));
                }
                () = out.closed() => return Ok(()),
            }
        }
    }

    /// The spans of seqs `1..=through` still buffered here, in as many batches as they need;
    /// the first batch also names this node.
    async fn send_spans(
        &mut self,
        through: Seq,
        out: &mpsc::Sender<Result<ReplicationBatch, SourceError>>,
    ) -> Result<(), SourceError> {
        let mut after = Seq::START;
        let mut first = true;
        loop {
            let mut batch = ReplicationBatch::default();
            if first {
                batch.active = Some(wire::node_view_to_proto(&self.pair.view()));
                first = false;
            }
            if after < through {
                let span = self.buffer.retained_span(after, through, SPAN_ROWS).await?;
                after = span.through;
                batch.retained.push(span_to_proto(&span));
            }
            // Spans copy nothing: the cursor they leave confirmed is where the stream starts.
            let cursor = self.cursor;
            self.send_batch(batch, cursor, out).await?;
            if after >= through {
                return Ok(());
            }
        }
    }

    /// Takes the rows after the cursor (from memory, else from the table) and sends them.
    /// `true` when the page was full (there may be more).
    async fn send_rows(
        &mut self,
        recent: &RecentReader,
        changes: &mut broadcast::Receiver<RowChange>,
        out: &mpsc::Sender<Result<ReplicationBatch, SourceError>>,
    ) -> Result<bool, SourceError> {
        let (rows, full) = match recent.after(self.cursor, PAGE_ROWS) {
            Some(page) => {
                self.cursor = self.cursor.max(page.through);
                (page.rows, page.full)
            }
            None => self.read_rows().await?,
        };
        self.send_copies(rows, changes, out).await?;
        Ok(full)
    }

    /// Sends the next page of final statuses after the status cursor, in a batch of their own;
    /// `true` when the page was full (there may be more).
    async fn send_statuses(
        &mut self,
        out: &mpsc::Sender<Result<ReplicationBatch, SourceError>>,
    ) -> Result<bool, SourceError> {
        let (stored, last) = self
            .buffer
            .statuses_after(self.status_cursor, PAGE_ROWS)
            .await?;
        let full = stored.len() == PAGE_ROWS;
        let mut statuses = Vec::with_capacity(stored.len());
        for status in stored {
            match wire::central_status_to_proto(&status.status) {
                Ok(change) => statuses.push(ReplicatedStatus {
                    status_seq: status.seq.0,
                    change: Some(change),
                }),
                Err(problem) => {
                    return Err(SourceError::Buffer(BufferError::Corrupt(problem)));
                }
            }
        }
        self.status_cursor = self.status_cursor.max(last);
        if statuses.is_empty() {
            return Ok(false);
        }
        let batch = ReplicationBatch {
            statuses,
            ..ReplicationBatch::default()
        };
        let cursor = self.cursor;
        self.send_batch(batch, cursor, out).await?;
        Ok(full)
    }

    /// Copies again, as read from the table now, up to a page of the rows marked cleared since
    /// the standby may have copied them (those gone since are left out: their removal is sent).
    async fn send_marked(
        &mut self,
        changes: &mut broadcast::Receiver<RowChange>,
        out: &mpsc::Sender<Result<ReplicationBatch, SourceError>>,
    ) -> Result<(), SourceError> {
        let mut seqs = Vec::with_capacity(PAGE_ROWS.min(self.remarked.len()));
        while seqs.len() < PAGE_ROWS
            && let Some(seq) = self.remarked.pop_first()
        {
            seqs.push(seq);
        }
        let page = self.buffer.rows_at(seqs).await?;
        let rows = page
            .rows
            .into_iter()
            .map(|(seq, row)| (seq, Arc::new(row)))
            .collect();
        self.send_copies(rows, changes, out).await
    }

    /// Sends `rows` in batches of at most [`BATCH_BYTES`], each with the changes drained after
    /// its rows were read.
    async fn send_copies(
        &mut self,
        rows: Vec<(Seq, Arc<BufferedNotification>)>,
        changes: &mut broadcast::Receiver<RowChange>,
        out: &mpsc::Sender<Result<ReplicationBatch, SourceError>>,
    ) -> Result<(), SourceError> {
        let mut adds: Vec<ReplicatedRow> = Vec::new();
        let mut bytes = 0;
        for (seq, row) in rows {
            let notification = wire::submit(&row);
            bytes += notification.encoded_len();
            adds.push(ReplicatedRow {
                seq: seq.0,
                notification: Some(notification),
            });
            if bytes >= BATCH_BYTES {
                self.drain(changes)?;
                let adds = std::mem::take(&mut adds);
                self.send(adds, out).await?;
                bytes = 0;
            }
        }
        if !adds.is_empty() {
            self.drain(changes)?;
            self.send(adds, out).await?;
        }
        Ok(())
    }

    /// The rows after the cursor as read from the table; moves the cursor past them.
    async fn read_rows(
        &mut self,
    ) -> Result<(Vec<(Seq, Arc<BufferedNotification>)>, bool), SourceError> {
        // Every row up to this head is committed, so the read below sees all of them that
        // still exist.
        let head = self.buffer.head_now();
        let page = self.buffer.next_after(self.cursor, PAGE_ROWS).await?;
        // Rows committed after the head was read are left for the next read, once their commit
        // is announced: until then a clear committed before them may not be published, and a
        // row must not reach the standby ahead of the pending clears committed before it.
        let beyond = page.last_seq().is_some_and(|last| last > head);
        let full = page.rows.len() + page.unreadable.len() == PAGE_ROWS && !beyond;
        // Rows that break the content rules are not copied: the forwarder moves them to the
        // rejected table, which announces their removal.
        if let Some(last) = page.last_seq() {
            self.cursor = self.cursor.max(last.min(head));
        }
        if !full {
            // The rest up to the head is gone already (forwarded and deleted before it was
            // read): nothing to copy, and the standby is not behind on it.
            self.cursor = self.cursor.max(head);
        }
        let rows = page
            .rows
            .into_iter()
            .filter(|(seq, _)| *seq <= head)
            .map(|(seq, row)| (seq, Arc::new(row)))
            .collect();
        Ok((rows, full))
    }

    /// Sends `adds` with every removal collected so far.
    async fn send(
        &mut self,
        adds: Vec<ReplicatedRow>,
        out: &mpsc::Sender<Result<ReplicationBatch, SourceError>>,
    ) -> Result<(), SourceError> {
        // A batch cut mid-page covers only up to its own last row.
        let through = adds
            .iter()
            .map(|r| Seq(r.seq))
            .max()
            .map_or(self.cursor, |last| last.min(self.cursor));
        let batch = ReplicationBatch {
            adds,
            removes: std::mem::take(&mut self.removes)
                .into_iter()
                .map(|s| s.0)
                .collect(),
            ..ReplicationBatch::default()
        };
        self.send_batch(batch, through, out).await
    }

    async fn send_batch(
        &mut self,
        mut batch: ReplicationBatch,
        through: Seq,
        out: &mpsc::Sender<Result<ReplicationBatch, SourceError>>,
    ) -> Result<(), SourceError> {
        if self.next_batch == 1 || self.clears.has_changed().unwrap_or(false) {
            let clears = self.clears.borrow_and_update().clone();
            batch.pending_clears = self.clears_to_proto(&clears);
            batch.pending_clears_included = true;
        }
        if self.next_batch == 1 || self.acks.has_changed().unwrap_or(false) {
            let acks = self.acks.borrow_and_update().clone();
            batch.pending_acks = self.acks_to_proto(&acks);
            batch.pending_acks_included = true;
        }
        batch.batch = self.next_batch;
        batch.head_seq = self.buffer.head_now().0;
        self.last_sent = Instant::now();
        self.unconfirmed.push_back(Unconfirmed {
            batch: self.next_batch,
            through,
            sent_at: self.last_sent,
        });
        self.next_batch += 1;
        out.send(Ok(batch))
            .await
            .map_err(|_| SourceError::StandbyGone)
    }

    /// The list a batch carries: the oldest [`MAX_PENDING_CLEARS`] watermarks.
    fn clears_to_proto(&mut self, clears: &PendingClears) -> Vec<outbox_proto::v1::PendingClear> {
        if clears.len() > MAX_PENDING_CLEARS && !self.clears_cut_reported {
            self.clears_cut_reported = true;
            tracing::warn!(
                pending_clears = clears.len(),
                sent = MAX_PENDING_CLEARS,
                "more pending clears than a standby takes; it gets the oldest only, so a \
                 failover now would not ask central for the others"
            );
        }
        clears
            .iter()
            .take(MAX_PENDING_CLEARS)
            .map(wire::clear_to_proto)
            .collect()
    }

    /// The acknowledgements a batch carries: the oldest [`MAX_PENDING_ACKS`] watermarks.
    fn acks_to_proto(&mut self, acks: &PendingAcks) -> Vec<outbox_proto::v1::PendingAck> {
        if acks.len() > MAX_PENDING_ACKS && !self.acks_cut_reported {
            self.acks_cut_reported = true;
            tracing::warn!(
                pending_acks = acks.len(),
                sent = MAX_PENDING_ACKS,
                "more pending acknowledgements than a standby takes; it gets the oldest only, \
                 so a failover now would not send the others to central"
            );
        }
        acks.iter()
            .take(MAX_PENDING_ACKS)
            .map(wire::ack_to_proto)
            .collect()
    }

    /// Collects every change announced so far.
    fn drain(&mut self, changes: &mut broadcast::Receiver<RowChange>) -> Result<(), SourceError> {
        loop {
            match changes.try_recv() {
                Ok(change) => self.note(change),
                Err(
                    broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed,
                ) => return Ok(()),
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    return Err(SourceError::FellBehind);
                }
            }
        }
    }

    fn note(&mut self, change: RowChange) {
        match change {
            RowChange::Removed(seqs) => self.removes.extend(seqs.iter().copied()),
            RowChange::Marked(seqs) => self.remarked.extend(seqs.iter().copied()),
        }
    }

    /// The standby committed every batch up to `n`.
    fn confirm(&mut self, n: u64) {
        while let Some(front) = self.unconfirmed.front() {
            if front.batch > n {
                break;
            }
            self.confirmed = self.confirmed.max(front.through);
            self.unconfirmed.pop_front();
        }
        if let Some(stream) = self.lag_stream {
            self.pair.standby_confirmed(stream, self.confirmed);
        }
    }

    /// When the oldest unconfirmed batch has waited too long (only with one outstanding).
    fn confirm_deadline(&self) -> Instant {
        self.unconfirmed
            .front()
            .map_or(self.last_sent, |oldest| oldest.sent_at)
            + self.timing.confirm_timeout
    }
}

pub(crate) fn span_to_proto(span: &RetainedSpan) -> ProtoSpan {
    ProtoSpan {
        from_seq: span.from.0,
        through_seq: span.through.0,
        kept: span
            .kept
            .iter()
            .map(|(first, last)| SeqRange {
                first: first.0,
                last: last.0,
            })
            .collect(),
    }
}

pub(crate) fn span_from_proto(span: &ProtoSpan) -> RetainedSpan {
    RetainedSpan {
        from: Seq(span.from_seq),
        through: Seq(span.through_seq),
        kept: span
            .kept
            .iter()
            .map(|r| (Seq(r.first), Seq(r.last)))
            .collect(),
    }
}
