//! The central store: one trait, [`OutboxStore`], and one module per backend. Everything the
//! services persist goes through it, in domain types; backends hold the SQL.
//!
//! Contract every backend keeps (checked by the shared conformance tests):
//! - `submit` commits before it returns; an id is stored at most once; a resubmit with the same
//!   content hash is `Duplicate`, with another hash `Conflict`, and the stored row is unchanged.
//! - `claim_due` hands a due row to at most one live claim, stamps the lease epoch and writes an
//!   InFlight attempt row in the same transaction.
//! - `record_outcome` applies only if the row is still claimed by that attempt (epoch and
//!   attempt number) and no other holder has taken the lease since (it is still at that epoch,
//!   lapsed or not); otherwise it changes nothing and returns false.
//! - `acquire_lease` bumps the epoch only when the holder changes: a holder re-taking its own
//!   lapsed lease keeps its epoch. Lease calls are served ahead of bulk work, so a renewal
//!   never queues behind ingest, claims or a purge.
//! - `query` pages newest first by (CreatedAt, row id) with a keyset cursor, so concurrent inserts
//!   never make a row appear twice or not at all in pages after the first.
//! - Operator actions change only Parked rows, and write a history entry in the same transaction.
//! - `purge_terminal` deletes only terminal rows resolved before the cutoff, with their history.

pub mod claimed;
pub mod mssql;
pub mod sqlite;

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::channel::{NotificationList, SmtpSettings, Stored};
use crate::domain::delivery::AttemptOutcome;
use crate::domain::history::{ActionRefusal, Actor, HistoryEntry, OperatorAction};
use crate::domain::kpi::{KpiParams, Kpis};
use crate::domain::query::{Cursor, NotificationFilter, PageRequest};
use crate::domain::retry::Transition;
use crate::domain::status::Status;
use crate::domain::{
    ContentHash, ListName, NotificationContent, NotificationId, NotificationType, Provenance,
    Submission,
};

/// A store operation failed. None of these are the caller's fault; the request may be retried,
/// except `Secrets`, which needs a `[secrets]` key configured (or names damaged data).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// A secret could not be sealed or opened (no key, a key not configured, damaged data).
    #[error("{0}")]
    Secrets(#[from] crate::secrets::SecretsError),
}

impl From<group_commit::Error> for StoreError {
    fn from(e: group_commit::Error) -> Self {
        Self::Unavailable(e.to_string())
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Unavailable(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

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

/// A row handed to the dispatcher for one delivery attempt.
#[derive(Debug, Clone)]
pub struct ClaimedNotification {
    pub row_id: i64,
    pub id: NotificationId,
    pub content: NotificationContent,
    pub provenance: Provenance,
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
}

/// The central store. Methods return `Send` futures so the services can run them on any worker.
pub trait OutboxStore: Send + Sync + 'static {
    /// Succeeds if the store can take a write now (an empty transaction): the health probe.
    fn ping(&self) -> impl Future<Output = Result<()>> + Send;

    /// Idempotently inserts each notification; one outcome per input, in order. Returns only
    /// after the accepted rows are committed.
    fn submit(
        &self,
        batch: Vec<NewNotification>,
    ) -> impl Future<Output = Result<Vec<InsertOutcome>>> + Send;

    /// The current state of one notification, if stored.
    fn state(
        &self,
        id: NotificationId,
    ) -> impl Future<Output = Result<Option<NotificationState>>> + Send;

    /// Takes or renews the named lease for `holder` for `ttl`. Returns the epoch held, or `None`
    /// if another holder's lease has not expired. The epoch increases whenever the holder
    /// changes; the last holder re-taking its lapsed lease keeps it.
    fn acquire_lease(
        &self,
        name: &'static str,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<LeaseEpoch>>> + Send;

    /// Gives the lease up (expires it now and moves its epoch on) if `holder` still holds it at
    /// `epoch`, so a successor need not wait for the TTL. Returns whether it was released.
    fn release_lease(
        &self,
        name: &'static str,
        holder: &str,
        epoch: LeaseEpoch,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Claims up to `limit` due rows of one channel (oldest due first) for `claim_timeout` under
    /// `epoch`, writing an InFlight attempt row for each. Claims nothing if `epoch` does not hold
    /// the lease.
    fn claim_due(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        kind: NotificationType,
        limit: usize,
        claim_timeout: Duration,
    ) -> impl Future<Output = Result<Vec<ClaimedNotification>>> + Send;

    /// Applies an attempt's outcome if its claim still stands (see the module contract). Returns
    /// whether it was applied.
    fn record_outcome(
        &self,
        lease: &'static str,
        record: AttemptRecord,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// One page of notifications matching the filter, newest first.
    fn query(&self, page: PageRequest) -> impl Future<Output = Result<Page>> + Send;

    /// The row with its full history, if stored.
    fn detail(
        &self,
        id: NotificationId,
    ) -> impl Future<Output = Result<Option<NotificationDetail>>> + Send;

    /// Applies `action` to each id (each must be Parked), recording `actor` in its history. One
    /// result per id, in order; all in one transaction.
    fn act_on_ids(
        &self,
        action: OperatorAction,
        ids: Vec<NotificationId>,
        actor: Actor,
    ) -> impl Future<Output = Result<Vec<ActionResult>>> + Send;

    /// Applies `action` to the oldest `limit` Parked rows matching `filter` (its statuses are
    /// ignored: only Parked rows are acted on).
    fn act_on_filter(
        &self,
        action: OperatorAction,
        filter: NotificationFilter,
        limit: usize,
        actor: Actor,
    ) -> impl Future<Output = Result<FilterActionReport>> + Send;

    /// The KPIs at `params.now`.
    fn kpis(&self, params: KpiParams) -> impl Future<Output = Result<Kpis>> + Send;

    /// Deletes up to `batch` terminal rows resolved before `resolved_before`, with their
    /// history. Call again until it deletes fewer than `batch`.
    fn purge_terminal(
        &self,
        resolved_before: DateTime<Utc>,
        batch: u32,
    ) -> impl Future<Output = Result<PurgeReport>> + Send;

    /// The named list, if configured.
    fn list(
        &self,
        name: &ListName,
    ) -> impl Future<Output = Result<Option<Stored<NotificationList>>>> + Send;

    /// Every list, by name.
    fn lists(&self) -> impl Future<Output = Result<Vec<Stored<NotificationList>>>> + Send;

    /// Creates or replaces a list and its recipients.
    fn upsert_list(&self, list: NotificationList) -> impl Future<Output = Result<()>> + Send;

    /// Deletes a list; false if there was none.
    fn delete_list(&self, name: &ListName) -> impl Future<Output = Result<bool>> + Send;

    /// The email channel's settings, if configured.
    fn smtp_settings(&self) -> impl Future<Output = Result<Option<Stored<SmtpSettings>>>> + Send;

    /// Creates or replaces the email channel's settings.
    fn put_smtp_settings(&self, settings: SmtpSettings) -> impl Future<Output = Result<()>> + Send;

    /// Removes the email channel's settings; false if there were none.
    fn delete_smtp_settings(&self) -> impl Future<Output = Result<bool>> + Send;
}
