//! The records passed between the services and the store: what a submission inserts and what
//! the insert did, a notification's state and detail as queries show them, the lease epoch, a
//! claimed row and the attempt record that ends it, and what bulk actions and the purge report.
//!
//! They live outside `store` so that the code that only handles them (delivery adapters take a
//! [`ClaimedNotification`], metrics count [`InsertOutcome`]s and [`PurgeReport`]s) does not
//! depend on the store; the store traits (`store` module) take and return them. Plain data;
//! every rule about them lives in `domain` or in the store contract (`store` module docs).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::delivery::AttemptOutcome;
use crate::domain::history::{ActionRefusal, HistoryEntry};
use crate::domain::query::Cursor;
use crate::domain::retry::Transition;
use crate::domain::status::Status;
use crate::domain::{
    ContentHash, NotificationContent, NotificationId, NotificationType, Priority, Provenance,
    Submission,
};

/// A validated submission with its content hash, ready to insert.
#[derive(Debug, Clone)]
pub struct NewNotification {
    pub submission: Submission,
    pub hash: ContentHash,
}

impl NewNotification {
    pub fn new(submission: Submission) -> Self {
        let hash = ContentHash::of(&submission.content);
        Self { submission, hash }
    }
}

/// What an idempotent insert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    Accepted,
    Duplicate,
    /// The id exists with other content; nothing was changed.
    Conflict,
}

/// A notification's current state, as status queries and lists show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationState {
    /// The store's insertion-ordered key: the tie-breaker of the newest-first order.
    pub row_id: i64,
    pub id: NotificationId,
    pub status: Status,
    pub kind: NotificationType,
    pub list_name: String,
    pub subject: String,
    pub source_site_id: String,
    pub priority: Priority,
    pub condition_key: Option<String>,
    pub retry_count: u32,
    pub last_error: Option<String>,
    pub site_enqueued_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub delivered_at: Option<DateTime<Utc>>,
    pub resolved_at: Option<DateTime<Utc>>,
}

impl NotificationState {
    /// This row's position in the newest-first order.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            created_at: self.created_at,
            row_id: self.row_id,
        }
    }
}

/// Everything stored about one notification, with its history oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationDetail {
    pub state: NotificationState,
    pub body: String,
    pub type_data: String,
    pub source_instance_id: String,
    pub source_script: String,
    pub origin_execution_id: Option<String>,
    pub origin_parent_execution_id: Option<String>,
    pub resolved_targets: Option<String>,
    pub history: Vec<HistoryEntry>,
}

/// One page of a query.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub rows: Vec<NotificationState>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<Cursor>,
}

/// The result of an operator action on one notification: its new state, or why it was left.
pub type ActionResult = std::result::Result<NotificationState, ActionRefusal>;

/// What a bulk action by filter did.
#[derive(Debug, Clone, Default)]
pub struct FilterActionReport {
    pub changed: Vec<NotificationId>,
    /// More Parked rows match than the call's limit.
    pub more_matching: bool,
}

/// How many Parked rows a bulk action by filter would change (a dry run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilterCount {
    /// Parked rows matching, at most the call's limit.
    pub matching: usize,
    /// More Parked rows match than the call's limit.
    pub more_matching: bool,
}

/// What one purge batch deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    pub notifications: u64,
    /// Of `notifications`, those that were Parked: failures no operator retried or discarded
    /// within the retention, reported apart because they were never resolved by anyone.
    pub parked: u64,
    pub history_entries: u64,
}

/// The fencing token: the lease epoch a dispatcher holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LeaseEpoch(pub i64);

/// A lease as stored, and the store's clock when it was read: what any replica reads to tell
/// whether some node holds the dispatcher lease (`self_alerts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseReading {
    pub read_at: DateTime<Utc>,
    /// `None` when the lease has never been taken.
    pub record: Option<LeaseRecord>,
}

/// The stored row of a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    pub holder: String,
    pub epoch: LeaseEpoch,
    pub expires_at: DateTime<Utc>,
}

impl LeaseReading {
    /// Whether some node held the lease when it was read.
    pub fn is_held(&self) -> bool {
        self.record
            .as_ref()
            .is_some_and(|r| r.expires_at > self.read_at)
    }
}

/// A row handed to the dispatcher for one delivery attempt.
#[derive(Debug, Clone)]
pub struct ClaimedNotification {
    pub row_id: i64,
    pub id: NotificationId,
    pub content: NotificationContent,
    pub provenance: Provenance,
    pub priority: Priority,
    pub retry_count: u32,
    pub attempt_no: u32,
    pub epoch: LeaseEpoch,
}

/// The end of one attempt, to be recorded under the claim's epoch.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub row_id: i64,
    pub id: NotificationId,
    pub attempt_no: u32,
    pub epoch: LeaseEpoch,
    pub outcome: AttemptOutcome,
    pub error: Option<String>,
    pub duration: Duration,
    pub transition: Transition,
    /// The relay the attempt was handed to (`host:port`); `None` when it reached none.
    pub provider: Option<String>,
}
