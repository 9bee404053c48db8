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
use crate::domain::escalation::{
    AckMeans, EscalationPolicy, IncidentEvent, IncidentId, IncidentRef, IncidentStatus, PagePlace,
};
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
    /// When it was scheduled for (`domain::schedule`); `None`: not scheduled.
    pub deliver_after: Option<DateTime<Utc>>,
}

impl NotificationState {
    /// Since when it has been waiting to be delivered (`schedule::waiting_since`).
    pub fn waiting_since(&self) -> DateTime<Utc> {
        crate::domain::schedule::waiting_since(self.created_at, self.deliver_after)
    }

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
    /// Incidents past the retention (nothing due for them), with their pages and history.
    pub incidents: u64,
}

/// A final status a notification of a watching site reached, still to reach the site
/// (`SiteStatusStore`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteStatusChange {
    /// The feed's order: a later change of the same notification has a higher one.
    pub seq: i64,
    /// The notification as central decided it: `status`, `resolved_at` (when) and `last_error`
    /// as they were then, the rest as stored.
    pub state: NotificationState,
    /// Delivered: the recipients or endpoint it went to, as the relay accepted them.
    pub delivered_to: Option<String>,
}

/// A final status waiting to be told to its list's status callback endpoint
/// (`StatusCallbackStore`): the notification as the change recorded it, and where to call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueStatusCallback {
    /// The change (its seq is the callback's, ordering the changes of one notification).
    pub change: SiteStatusChange,
    /// The list's endpoint now; `None` when the list no longer has one (or is gone).
    pub endpoint: Option<crate::domain::webhook::WebhookUrl>,
    /// When the change was queued: its retries end `give_up_after` later.
    pub queued_at: DateTime<Utc>,
    /// Calls made so far.
    pub calls: u32,
}

/// What the status callbacks have due, and when the next is due otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusCallbackTurn {
    pub due: Vec<DueStatusCallback>,
    /// How long until the next change waiting is due (`None`: none waits).
    pub next_due_in: Option<Duration>,
}

/// One call of a change, to record: its history entry, and whether the change is done or
/// called again at `retry_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusCallbackCall {
    pub seq: i64,
    pub id: NotificationId,
    pub status: Status,
    pub called_at: DateTime<Utc>,
    pub duration: Option<Duration>,
    pub outcome: crate::domain::status_callback::CallOutcome,
    pub error: Option<String>,
    /// `scheme://host:port` of the endpoint called.
    pub endpoint: Option<String>,
    /// Set for a `Failed` call: when it is called again.
    pub retry_at: Option<DateTime<Utc>>,
}

/// The status callbacks still waiting: what `outbox_status_callbacks_waiting` and its alert
/// show.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusCallbackBacklog {
    pub waiting: u64,
    pub oldest_queued_at: Option<DateTime<Utc>>,
}

/// What one pass of the site status purge dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SiteStatusPurge {
    /// Changes no site confirmed within the retention.
    pub changes: u64,
    /// Watches not renewed within it.
    pub watchers: u64,
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
    /// The incident it belongs to (its alarm, a joined notification, or a page's message),
    /// which its mail or webhook message names so that its reader can acknowledge it.
    pub incident: Option<IncidentRef>,
    /// A digest's: the incidents of the rows it holds, oldest first, each once (one
    /// acknowledgement of the digest covers them all). Empty for any other notification.
    pub digest_incidents: Vec<IncidentId>,
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

/// What one turn of the escalation clock did (`EscalationStore::escalate_due`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EscalationTurn {
    /// Whether the epoch held the lease; nothing fired otherwise.
    pub held: bool,
    /// Pages fired (steps, and reminders' first pages).
    pub pages: u32,
    /// Notifications those pages stored, one per list paged.
    pub messages: u32,
    /// Lists a page could not reach (gone, or the alarm's row gone), each a history row.
    pub skipped: u32,
    /// Pages that fired `LATE_AFTER` or more after their due time.
    pub late: u32,
    pub exhausted: u32,
    /// Whether incidents were left due (more than the turn's limit): call again at once.
    pub more_due: bool,
    /// How long until the next incident is due, by the store's clock; `None`: none waits.
    pub next_due_in: Option<Duration>,
}

/// An incident as the admin API and the console show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentView {
    pub id: IncidentId,
    pub list: String,
    pub site: String,
    pub condition_key: Option<String>,
    pub priority: Priority,
    /// The notification that opened it, and the latest of its condition.
    pub alarm_id: NotificationId,
    pub latest_id: NotificationId,
    pub subject: String,
    pub status: IncidentStatus,
    pub opened_at: DateTime<Utc>,
    /// Pages fired so far (the alarm is the first) and the last one's place.
    pub page_count: u32,
    pub last_page: PagePlace,
    /// Open: the next page (or, `None`, exhaustion) and when; Acknowledged: the reminder.
    pub next: Option<(Option<PagePlace>, DateTime<Utc>)>,
    pub late_pages: u32,
    pub acknowledged: Option<IncidentAck>,
    pub ended_at: Option<DateTime<Utc>>,
    /// The policy it runs under: the list's when it opened.
    pub policy: EscalationPolicy,
}

/// The first acknowledgement of an incident.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentAck {
    pub by: String,
    pub means: AckMeans,
    pub at: DateTime<Utc>,
}

/// One page an incident fired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentPageRecord {
    pub page_no: u32,
    pub cycle: u32,
    pub page: PagePlace,
    pub due_at: DateTime<Utc>,
    pub fired_at: DateTime<Utc>,
    /// How late it fired, if `LATE_AFTER` or more.
    pub late_by: Option<Duration>,
    pub lease_epoch: i64,
}

/// One row of an incident's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentHistoryEntry {
    pub sequence: u32,
    pub at: DateTime<Utc>,
    pub event: IncidentEvent,
    pub actor: String,
    pub means: Option<AckMeans>,
    pub from: Option<String>,
    pub detail: String,
}

/// A notification of an incident: its alarm, a joined one, or a page's message to a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentMessage {
    pub id: NotificationId,
    pub list: String,
    /// 1: the alarm; 2, 3, ...: a page; `None`: a joined notification of its condition.
    pub page_no: Option<u32>,
    pub status: Status,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentDetail {
    pub incident: IncidentView,
    pub pages: Vec<IncidentPageRecord>,
    /// Oldest first.
    pub history: Vec<IncidentHistoryEntry>,
    pub messages: Vec<IncidentMessage>,
}

/// Which incidents to list: newest first, in these statuses (empty: any), only those with a
/// late page when `late_only`, older than `before` (a cursor: the last id of the previous
/// page), at most `limit`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IncidentQuery {
    pub statuses: Vec<IncidentStatus>,
    pub late_only: bool,
    pub before: Option<IncidentId>,
    pub limit: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IncidentList {
    pub incidents: Vec<IncidentView>,
    /// The cursor of the next page, if there may be one.
    pub next_before: Option<IncidentId>,
}
