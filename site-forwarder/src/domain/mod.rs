//! The forwarder's domain: what a buffered notification is, where a notification stands locally,
//! the pending clears and acknowledgements and their ordering rules, the figures the buffer and the forwarding link
//! report, and a site pair's roles and node views. Plain data built from the validated content
//! types of `outbox_domain`, so holding a [`BufferedNotification`] proves every content rule held
//! when it was accepted. This module knows nothing of tonic, prost or rusqlite; the gRPC edge and
//! the buffer convert to and from it.

mod acknowledgements;
mod central_status;
mod forwarding;
mod pair;

use chrono::{DateTime, Utc};

pub use acknowledgements::{AckActor, MAX_ACTOR_CHARS, PendingAck, PendingAcks};
pub use central_status::{CentralStatus, StatusInterest, StatusSeq, StoredStatus};
pub use forwarding::ForwardSnapshot;
pub use pair::{NodeView, NotActive, PairStatus, Role, RoleState};

pub use outbox_domain::{
    Body, ConditionKey, ContentError, ListName, NotificationContent, NotificationId,
    NotificationType, Priority, Provenance, ScriptOrigin, SiteId, Subject, Submission, TypeData,
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

/// One notification accepted by `Send`: exactly the submission central will get (content,
/// provenance with the site id and the site's clock at enqueue time, priority, condition key,
/// and `cleared_at_site` once a ClearCondition at the site ended it). The buffer stores every
/// field, so each resubmit after a reconnect carries the same content and central answers
/// DUPLICATE; being the submission itself, a field added to it reaches the buffer, the stream
/// to central, the standby and a hand-over without a conversion to forget. Priority and
/// condition key are forwarded unchanged: central, not the site, orders and supersedes by them.
pub type BufferedNotification = Submission;

/// A fresh notification from a script's validated `Send`, with a new id, stamped with this
/// site's id and the enqueue time, scheduled for `deliver_after` if set (checked against that
/// time by the caller, `outbox_domain::schedule`). Times are cut to whole milliseconds, the
/// precision the buffer stores, so the values handed back now equal the ones read back and
/// forwarded later.
pub fn accepted_send(
    content: NotificationContent,
    origin: ScriptOrigin,
    site: SiteId,
    enqueued_at: DateTime<Utc>,
    priority: Priority,
    condition_key: Option<ConditionKey>,
    deliver_after: Option<DateTime<Utc>>,
) -> BufferedNotification {
    Submission {
        id: NotificationId::generate(),
        content,
        provenance: origin.at_site(site, to_buffer_precision(enqueued_at)),
        priority,
        condition_key,
        cleared_at_site: None,
        deliver_after: deliver_after.map(to_buffer_precision),
    }
}

/// `at` cut to whole milliseconds, the precision the buffer keeps times in.
pub fn to_buffer_precision(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap_or(at)
}

/// A ClearCondition committed at this site whose central half is still to do: central must be
/// asked to clear the notifications with this key it already holds. Rows still buffered when
/// the clear was committed were marked then and reach central as cleared; this is for the ones
/// forwarded before. At most one per key: a later clear of the same key moves `up_to` forward
/// (see [`PendingClears`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingClear {
    pub condition_key: ConditionKey,
    /// The newest seq handed out when the clear was committed: every row buffered before it has
    /// a seq up to here, every row buffered after it a higher one.
    pub up_to: Seq,
    /// When the (latest) clear of the key was committed.
    pub cleared_at: DateTime<Utc>,
}

/// The site's pending clears at one moment, oldest watermark first, and the two rules that order
/// a clear among the notifications on the way to central:
///
/// - [`Self::due`]: central is asked to clear a key only once every row with a seq up to the
///   clear's `up_to` has left the buffer (acked or rejected), so no notification buffered before
///   the clear, and possibly sent unmarked before it, can reach central after central applied
///   the clear.
/// - [`Self::holds`]: a notification with the key buffered after the clear (a new occurrence of
///   the condition) is not sent until central has applied the clear, so the clear cannot end it.
///
/// Why one clear per key is enough: while a clear of a key is pending, rows of that key after it
/// are held, so when the key is cleared again every row of it after the first clear is still
/// buffered and is marked by the second; moving `up_to` to the second clear's keeps both rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingClears(Vec<PendingClear>);

impl PendingClears {
    pub fn new(mut clears: Vec<PendingClear>) -> Self {
        clears.sort_by_key(|c| c.up_to);
        Self(clears)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &PendingClear> {
        self.0.iter()
    }

    /// The clears central may apply now, given the oldest seq still buffered (`None`: empty).
    pub fn due(&self, oldest_buffered: Option<Seq>) -> impl Iterator<Item = &PendingClear> {
        self.0
            .iter()
            .filter(move |c| oldest_buffered.is_none_or(|oldest| c.up_to < oldest))
    }

    /// Whether the row at `seq` must wait for a pending clear of its key to reach central. A row
    /// marked cleared never waits: it reaches central as cleared whatever the order.
    pub fn holds(&self, seq: Seq, row: &BufferedNotification) -> bool {
        match &row.condition_key {
            Some(key) if row.cleared_at_site.is_none() => self
                .0
                .iter()
                .any(|c| c.condition_key == *key && c.up_to < seq),
            _ => false,
        }
    }
}

/// What the site knows about a notification without asking central.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalStatus {
    /// Still in the buffer, not yet acked by central.
    Buffered(BufferedStatus),
    /// Central rejected it; it sits in the local `rejected` table and will never be forwarded.
    Rejected { reason: String },
    /// Not here: either central has it (acked and deleted locally) or nobody does.
    NotHere,
}

/// What `GetStatus` shows of a notification still in the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferedStatus {
    pub kind: NotificationType,
    pub list_name: String,
    pub enqueued_at: DateTime<Utc>,
    pub priority: Priority,
    pub condition_key: Option<String>,
    /// Set once a ClearCondition ended it: it reaches central as cleared, never delivered.
    pub cleared_at: Option<DateTime<Utc>>,
    /// When it is scheduled for (central keeps it Pending until then); `None`: at once.
    pub deliver_after: Option<DateTime<Utc>>,
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
    /// Clears whose central half is still to do (see [`PendingClear`]).
    pub pending_clears: u64,
    /// Acknowledgements whose central half is still to do (see [`PendingAck`]).
    pub pending_acks: u64,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> ConditionKey {
        ConditionKey::parse(text.into(), "condition_key").unwrap()
    }

    fn clear(text: &str, up_to: i64) -> PendingClear {
        PendingClear {
            condition_key: key(text),
            up_to: Seq(up_to),
            cleared_at: Utc::now(),
        }
    }

    fn row(condition: Option<&str>, cleared: bool) -> BufferedNotification {
        let origin = ScriptOrigin::parse(String::new(), "t.py".into(), None, None).unwrap();
        let content = NotificationContent::parse(
            NotificationType::Email,
            "ops".into(),
            "s".into(),
            "b".into(),
            String::new(),
        )
        .unwrap();
        let site = SiteId::parse("site-a".into()).unwrap();
        let mut n = accepted_send(
            content,
            origin,
            site,
            Utc::now(),
            Priority::Normal,
            condition.map(key),
            None,
        );
        n.cleared_at_site = cleared.then(Utc::now);
        n
    }

    #[test]
    fn a_clear_is_due_once_every_row_up_to_its_watermark_left() {
        let clears = PendingClears::new(vec![clear("late", 9), clear("early", 4)]);
        let due = |oldest: Option<i64>| -> Vec<String> {
            clears
                .due(oldest.map(Seq))
                .map(|c| c.condition_key.to_string())
                .collect()
        };
        assert_eq!(due(Some(3)), Vec::<String>::new());
        assert_eq!(due(Some(4)), Vec::<String>::new(), "row 4 is still here");
        assert_eq!(due(Some(5)), vec!["early"]);
        assert_eq!(due(Some(10)), vec!["early", "late"], "oldest first");
        assert_eq!(due(None), vec!["early", "late"], "an empty buffer");
    }

    #[test]
    fn only_an_unmarked_row_of_the_key_after_the_clear_waits() {
        let clears = PendingClears::new(vec![clear("k1", 4)]);
        assert!(clears.holds(Seq(5), &row(Some("k1"), false)));
        assert!(!clears.holds(Seq(4), &row(Some("k1"), false)), "before it");
        assert!(
            !clears.holds(Seq(5), &row(Some("k1"), true)),
            "marked: cleared whatever the order"
        );
        assert!(!clears.holds(Seq(5), &row(Some("k2"), false)));
        assert!(!clears.holds(Seq(5), &row(None, false)));
        assert!(!PendingClears::default().holds(Seq(5), &row(Some("k1"), false)));
    }

    #[test]
    fn a_send_is_stamped_at_buffer_precision() {
        let n = row(None, false);
        let at = n.provenance.site_enqueued_at;
        assert_eq!(to_buffer_precision(at), at);
        assert_eq!(at.timestamp_subsec_nanos() % 1_000_000, 0);
    }
}
