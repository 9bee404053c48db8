//! A store in memory for the dispatcher's paused-clock tests, keeping the parts of the store
//! contract the dispatcher relies on (see the `store` module): the lease with its epochs,
//! claims only under the epoch that holds the lease, and outcomes applied only while the row is
//! still claimed by that attempt and no other holder has taken the lease since.
//!
//! Its clock is tokio's, so under a paused clock leases and claims expire exactly when the test
//! moves time, and every call answers without another thread: the real SQLite store writes
//! through a thread of its own, which a paused clock does not wait for (tokio advances a paused
//! clock whenever its tasks are idle, so lease and attempt timers would fire while a write is
//! under way). The real stores' side of the contract is checked by the conformance suite.
//!
//! Lease calls can be held at a [`Gate`]: a database that stops answering renewals. What the
//! dispatcher does not use (queries, operator actions, the purge) answers with an error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_domain::ScriptOrigin;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::domain::channel::{NotificationList, SmtpSettings, Stored};
use crate::domain::history::{Actor, OperatorAction};
use crate::domain::kpi::{KpiParams, Kpis};
use crate::domain::query::{NotificationFilter, PageRequest};
use crate::domain::serve_order::ClaimLanes;
use crate::domain::site_health::{SiteHealthReport, SiteHealthSnapshot};
use crate::domain::status::Status;
use crate::domain::{
    ListName, NotificationContent, NotificationId, NotificationType, Priority, SiteId, Submission,
};
use crate::store::{
    ActionResult, AttemptRecord, ClaimedNotification, FilterActionReport, FilterCount,
    InsertOutcome, LeaseEpoch, NewNotification, NotificationDetail, NotificationState, OutboxStore,
    Page, PurgeReport, Result, StoreError,
};

/// Holds callers until opened, counting those waiting.
#[derive(Debug)]
pub(super) struct Gate {
    open: watch::Sender<bool>,
    pub(super) waiting: AtomicUsize,
}

impl Gate {
    pub(super) fn closed() -> Self {
        Self {
            open: watch::Sender::new(false),
            waiting: AtomicUsize::new(0),
        }
    }

    pub(super) fn opened() -> Self {
        let gate = Self::closed();
        gate.open();
        gate
    }

    pub(super) async fn pass(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.subscribe();
        // Err only if the sender is gone, which it is not while `self` lives.
        let _ = open.wait_for(|open| *open).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    pub(super) fn open(&self) {
        self.open.send_replace(true);
    }

    pub(super) fn close(&self) {
        self.open.send_replace(false);
    }
}

/// An email notification to list "ops" with this subject, from a site script.
pub(super) fn email(subject: &str) -> NewNotification {
    let content = NotificationContent::parse(
        NotificationType::Email,
        "ops".into(),
        subject.into(),
        "body".into(),
        String::new(),
    )
    .unwrap();
    let origin = ScriptOrigin::parse("node-1".into(), "alarm.py".into(), None, None).unwrap();
    NewNotification::new(Submission {
        id: NotificationId::generate(),
        content,
        provenance: origin.at_site(SiteId::parse("site-a".into()).unwrap(), Utc::now()),
        priority: Priority::Normal,
        condition_key: None,
        cleared_at_site: None,
    })
}

#[derive(Debug)]
struct Lease {
    holder: String,
    epoch: LeaseEpoch,
    expires: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Claim {
    epoch: LeaseEpoch,
    attempt_no: u32,
    until: Instant,
}

/// One stored notification as the tests look at it.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) submission: Submission,
    pub(super) status: Status,
    /// Every outcome recorded, oldest first.
    pub(super) outcomes: Vec<AttemptRecord>,
    /// Claims made, each an attempt (the real stores write an InFlight attempt row for each).
    pub(super) attempts: u32,
    claim: Option<Claim>,
}

#[derive(Debug, Default)]
struct State {
    lease: Option<Lease>,
    rows: Vec<Row>,
    smtp: Option<SmtpSettings>,
    lists: HashMap<ListName, NotificationList>,
    /// `claim_due` calls that claimed at least one row.
    claims: usize,
    /// `claim_due` calls that found nothing due.
    empty_claims: usize,
}

/// See the module documentation.
#[derive(Debug)]
pub(super) struct MemoryStore {
    state: Mutex<State>,
    /// Lease calls (take, renew, release) wait here while it is closed.
    pub(super) leases: Gate,
    /// A sweep's calls (claims, SMTP settings reads) wait here while it is closed.
    pub(super) sweeps: Gate,
    /// List reads wait here while it is closed.
    pub(super) list_reads: Gate,
    /// Bumped whenever an outcome is recorded, so a test can wait for one.
    recorded: watch::Sender<usize>,
}

impl MemoryStore {
    pub(super) fn new(smtp: SmtpSettings, lists: Vec<NotificationList>) -> Self {
        Self {
            state: Mutex::new(State {
                smtp: Some(smtp),
                lists: lists.into_iter().map(|l| (l.name.clone(), l)).collect(),
                ..State::default()
            }),
            leases: Gate::opened(),
            sweeps: Gate::opened(),
            list_reads: Gate::opened(),
            recorded: watch::Sender::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Stores a due Pending row; returns its id.
    pub(super) fn add(&self, row: NewNotification) -> NotificationId {
        let id = row.submission.id;
        self.state().rows.push(Row {
            submission: row.submission,
            status: Status::Pending,
            outcomes: Vec::new(),
            attempts: 0,
            claim: None,
        });
        id
    }

    pub(super) fn row(&self, id: NotificationId) -> Row {
        self.state()
            .rows
            .iter()
            .find(|r| r.submission.id == id)
            .cloned()
            .unwrap()
    }

    /// Waits until the row satisfies `check` after some outcome was recorded (or already does).
    pub(super) async fn until_row(&self, id: NotificationId, check: impl Fn(&Row) -> bool) -> Row {
        let mut recorded = self.recorded.subscribe();
        loop {
            let row = self.row(id);
            if check(&row) {
                return row;
            }
            // Err only if the sender is gone, which it is not while `self` lives.
            let _ = recorded.changed().await;
        }
    }

    /// Applies one outcome if its claim still stands; whether it did.
    fn apply_outcome(&self, record: AttemptRecord) -> bool {
        let mut state = self.state();
        // Lapsed or not, the lease must still be at the claim's epoch.
        if state.lease.as_ref().map(|l| l.epoch) != Some(record.epoch) {
            return false;
        }
        let Some(row) = state.rows.iter_mut().find(|r| r.submission.id == record.id) else {
            return false;
        };
        let claimed_by_this_attempt = row
            .claim
            .is_some_and(|c| c.epoch == record.epoch && c.attempt_no == record.attempt_no);
        if !claimed_by_this_attempt {
            return false;
        }
        row.claim = None;
        row.status = record.transition.status;
        row.outcomes.push(record);
        true
    }

    /// How many claims have claimed rows so far.
    pub(super) fn claims(&self) -> usize {
        self.state().claims
    }

    /// How many claims found nothing due so far.
    pub(super) fn empty_claims(&self) -> usize {
        self.state().empty_claims
    }

    /// Another node takes the lease, bypassing the gate (its own connection to the database):
    /// as if this node's lease had expired there.
    pub(super) fn lease_taken_by(&self, holder: &str, ttl: Duration) -> LeaseEpoch {
        let mut state = self.state();
        let epoch = LeaseEpoch(state.lease.as_ref().map_or(1, |l| l.epoch.0 + 1));
        state.lease = Some(Lease {
            holder: holder.into(),
            epoch,
            expires: Instant::now() + ttl,
        });
        epoch
    }
}

fn kept_elsewhere<T>() -> Result<T> {
    Err(StoreError::Unavailable(
        "not kept by the dispatcher tests' memory store".into(),
    ))
}

impl OutboxStore for MemoryStore {
    async fn ping(&self) -> Result<()> {
        Ok(())
    }

    async fn submit(&self, batch: Vec<NewNotification>) -> Result<Vec<InsertOutcome>> {
        Ok(batch
            .into_iter()
            .map(|row| {
                self.add(row);
                InsertOutcome::Accepted
            })
            .collect())
    }

    async fn state(&self, _id: NotificationId) -> Result<Option<NotificationState>> {
        kept_elsewhere()
    }

    async fn acquire_lease(
        &self,
        _name: &'static str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<LeaseEpoch>> {
        self.leases.pass().await;
        let now = Instant::now();
        let mut state = self.state();
        let epoch = match &state.lease {
            None => LeaseEpoch(1),
            Some(l) if l.holder == holder => l.epoch,
            Some(l) if l.expires <= now => LeaseEpoch(l.epoch.0 + 1),
            Some(_) => return Ok(None),
        };
        state.lease = Some(Lease {
            holder: holder.into(),
            epoch,
            expires: now + ttl,
        });
        Ok(Some(epoch))
    }

    async fn release_lease(
        &self,
        _name: &'static str,
        holder: &str,
        epoch: LeaseEpoch,
    ) -> Result<bool> {
        self.leases.pass().await;
        let now = Instant::now();
        let mut state = self.state();
        match state.lease.as_mut() {
            Some(l) if l.holder == holder && l.epoch == epoch && l.expires > now => {
                l.expires = now;
                l.epoch = LeaseEpoch(l.epoch.0 + 1);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn claim_digest(
        &self,
        _lease: &'static str,
        _epoch: LeaseEpoch,
        _kind: NotificationType,
        _digest: NotificationId,
        _claim_timeout: Duration,
    ) -> Result<Vec<ClaimedNotification>> {
        // Lists are kept elsewhere (`upsert_list`), so none consolidates: nothing is Held.
        Ok(Vec::new())
    }

    async fn claim_due(
        &self,
        _lease: &'static str,
        epoch: LeaseEpoch,
        kind: NotificationType,
        lanes: ClaimLanes,
        claim_timeout: Duration,
    ) -> Result<Vec<ClaimedNotification>> {
        // In stored order whatever the lanes: the dispatcher tests here are about pacing and
        // the lease; the serve order is the real stores' (conformance suite).
        let limit = lanes.total();
        self.sweeps.pass().await;
        let now = Instant::now();
        let mut state = self.state();
        if !state
            .lease
            .as_ref()
            .is_some_and(|l| l.epoch == epoch && l.expires > now)
        {
            return Ok(Vec::new());
        }
        let mut claimed = Vec::new();
        for row in &mut state.rows {
            if claimed.len() == limit {
                break;
            }
            let due = matches!(row.status, Status::Pending | Status::Retrying)
                && row.submission.content.kind == kind
                && row.claim.is_none_or(|c| c.until <= now);
            if !due {
                continue;
            }
            row.attempts += 1;
            row.claim = Some(Claim {
                epoch,
                attempt_no: row.attempts,
                until: now + claim_timeout,
            });
            claimed.push(ClaimedNotification {
                row_id: 0,
                id: row.submission.id,
                content: row.submission.content.clone(),
                provenance: row.submission.provenance.clone(),
                priority: row.submission.priority,
                retry_count: 0,
                attempt_no: row.attempts,
                epoch,
            });
        }
        if claimed.is_empty() {
            state.empty_claims += 1;
        } else {
            state.claims += 1;
        }
        Ok(claimed)
    }

    async fn record_outcomes(
        &self,
        _lease: &'static str,
        records: Vec<AttemptRecord>,
    ) -> Result<Vec<bool>> {
        let mut applied = Vec::with_capacity(records.len());
        for record in records {
            let done = self.apply_outcome(record);
            if done {
                self.recorded.send_modify(|n| *n += 1);
            }
            applied.push(done);
        }
        Ok(applied)
    }

    async fn clear_condition(
        &self,
        _site: &SiteId,
        _key: &crate::domain::ConditionKey,
        _actor: Actor,
    ) -> Result<Vec<NotificationId>> {
        kept_elsewhere()
    }

    async fn query(&self, _page: PageRequest) -> Result<Page> {
        kept_elsewhere()
    }

    async fn detail(&self, _id: NotificationId) -> Result<Option<NotificationDetail>> {
        kept_elsewhere()
    }

    async fn act_on_ids(
        &self,
        _action: OperatorAction,
        _ids: Vec<NotificationId>,
        _actor: Actor,
    ) -> Result<Vec<ActionResult>> {
        kept_elsewhere()
    }

    async fn act_on_filter(
        &self,
        _action: OperatorAction,
        _filter: NotificationFilter,
        _limit: usize,
        _actor: Actor,
    ) -> Result<FilterActionReport> {
        kept_elsewhere()
    }

    async fn count_on_filter(
        &self,
        _filter: NotificationFilter,
        _limit: usize,
    ) -> Result<FilterCount> {
        kept_elsewhere()
    }

    async fn kpis(&self, _params: KpiParams) -> Result<Kpis> {
        kept_elsewhere()
    }

    async fn purge_terminal(
        &self,
        _resolved_before: DateTime<Utc>,
        _batch: u32,
    ) -> Result<PurgeReport> {
        kept_elsewhere()
    }

    async fn list(&self, name: &ListName) -> Result<Option<Stored<NotificationList>>> {
        self.list_reads.pass().await;
        Ok(self.state().lists.get(name).map(|l| Stored {
            value: l.clone(),
            updated_at: Utc::now(),
        }))
    }

    async fn lists(&self) -> Result<Vec<Stored<NotificationList>>> {
        kept_elsewhere()
    }

    async fn upsert_list(&self, _list: NotificationList) -> Result<()> {
        kept_elsewhere()
    }

    async fn delete_list(&self, _name: &ListName) -> Result<bool> {
        kept_elsewhere()
    }

    async fn smtp_settings(&self) -> Result<Option<Stored<SmtpSettings>>> {
        self.sweeps.pass().await;
        Ok(self.state().smtp.clone().map(|s| Stored {
            value: s,
            updated_at: Utc::now(),
        }))
    }

    async fn put_smtp_settings(&self, _settings: SmtpSettings) -> Result<()> {
        kept_elsewhere()
    }

    async fn delete_smtp_settings(&self) -> Result<bool> {
        kept_elsewhere()
    }

    async fn record_site_health(&self, _report: SiteHealthReport) -> Result<()> {
        kept_elsewhere()
    }

    async fn site_health(&self) -> Result<SiteHealthSnapshot> {
        kept_elsewhere()
    }
}
