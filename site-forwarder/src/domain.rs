//! The forwarder's domain: what a buffered notification is, where a notification stands locally,
//! and the figures the buffer reports. Plain data built from the validated content types of
//! `outbox_domain`, so holding a [`BufferedNotification`] proves every content rule held
//! when it was accepted. This module knows nothing of tonic, prost or rusqlite; the gRPC edge and
//! the buffer convert to and from it.

use chrono::{DateTime, Utc};

pub use outbox_domain::{
    Body, ContentError, ListName, NotificationContent, NotificationId, NotificationType, Priority,
    Provenance, ScriptOrigin, SiteId, Subject, Submission, TypeData,
};

/// Position of a row in the buffer. Strictly increasing in enqueue order and never reused (the
/// table uses AUTOINCREMENT), which is what lets the forwarder keep a simple "sent up to here"
/// cursor: a row enqueued later always sorts after every row already sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Seq(pub i64);

impl Seq {
    /// Before the first row: `next_after(Seq::START, ..)` reads from the oldest row.
    pub const START: Seq = Seq(0);
}

/// One notification accepted by `Send`: content, provenance (including the site id and the
/// site's clock at enqueue time), priority and the id the caller was given. Stored verbatim, so
/// every resubmit after a reconnect carries exactly the same content and central answers
/// DUPLICATE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferedNotification {
    pub id: NotificationId,
    pub content: NotificationContent,
    pub provenance: Provenance,
    /// Forwarded unchanged: central, not the site, orders delivery by it. The forwarder still
    /// sends the buffer oldest first, since its cursor relies on seq order.
    pub priority: Priority,
}

impl BufferedNotification {
    /// A fresh notification from a script's validated request, stamped with this site's id and
    /// the enqueue time. The time is cut to whole milliseconds, the precision the buffer stores,
    /// so the value handed back now equals the one read back and forwarded later.
    pub fn new(
        content: NotificationContent,
        origin: ScriptOrigin,
        site: SiteId,
        enqueued_at: DateTime<Utc>,
        priority: Priority,
    ) -> Self {
        let enqueued_at =
            DateTime::from_timestamp_millis(enqueued_at.timestamp_millis()).unwrap_or(enqueued_at);
        Self {
            id: NotificationId::generate(),
            content,
            provenance: origin.at_site(site, enqueued_at),
            priority,
        }
    }

    pub fn enqueued_at(&self) -> DateTime<Utc> {
        self.provenance.site_enqueued_at
    }
}

/// A notification the peer node sent (a replicated or adopted row), checked by
/// `outbox_proto::submission::parse`: the same id, content, provenance and priority.
impl From<Submission> for BufferedNotification {
    fn from(s: Submission) -> Self {
        Self {
            id: s.id,
            content: s.content,
            provenance: s.provenance,
            priority: s.priority,
        }
    }
}

/// What the site knows about a notification without asking central.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalStatus {
    /// Still in the buffer, not yet acked by central.
    Buffered {
        kind: NotificationType,
        list_name: String,
        enqueued_at: DateTime<Utc>,
        priority: Priority,
    },
    /// Central rejected it; it sits in the local `rejected` table and will never be forwarded.
    Rejected { reason: String },
    /// Not here: either central has it (acked and deleted locally) or nobody does.
    NotHere,
}

/// Figures about the buffer itself (the forwarder adds its own for `GetBufferStats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BufferStats {
    /// Rows waiting for central's ack.
    pub depth: u64,
    /// Enqueue time of the oldest waiting row.
    pub oldest_enqueued_at: Option<DateTime<Utc>>,
    /// Rows central rejected, kept for inspection.
    pub rejected: u64,
}

impl BufferStats {
    /// Seconds since the oldest waiting row was enqueued, 0 when the buffer is empty (or the
    /// clock went back). `GetBufferStats` and `/metrics` both report this figure.
    pub fn oldest_age_seconds(&self, now: DateTime<Utc>) -> f64 {
        self.oldest_enqueued_at.map_or(0.0, |at| {
            (now - at).num_milliseconds().max(0) as f64 / 1000.0
        })
    }
}
