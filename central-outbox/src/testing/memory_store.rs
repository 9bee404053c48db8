//! A store in memory that keeps the dispatch capability of the store contract (see the `store`
//! module): leases with their epochs, claims only under the epoch that holds the lease, in the
//! serve order of `domain::serve_order`, with an InFlight attempt entry each; outcomes applied
//! only while the row is still claimed by that attempt and no other holder has taken the lease
//! since; the retention purge. The conformance suite runs it through the same dispatch
//! behaviours as the SQL backends, so it keeps that contract as they do.
//!
//! It is what the dispatcher's paused-clock tests run on. Its clock for leases and claims is
//! tokio's, so under a paused clock they expire exactly when the test moves time, and every call
//! answers without another thread: the real SQLite store writes through a thread of its own,
//! which a paused clock does not wait for (tokio advances a paused clock whenever its tasks are
//! idle, so lease and attempt timers would fire while a write is under way). Due times (a
//! retry's NextAttemptAt, as the dispatcher's transitions compute them) and the instants it
//! reports are wall-clock time, as in the real stores.
//!
//! What it does not keep, because ingest does it and this store has no ingest: condition keys
//! (nothing is superseded or cleared) and flood consolidation (no row is ever Held, so
//! [`DispatchStore::claim_digest`] finds nothing). Rows are put in with [`MemoryStore::add`],
//! looked at with [`MemoryStore::row`], [`MemoryStore::state`] and [`MemoryStore::detail`], and
//! Parked rows discarded with [`MemoryStore::discard`], as the conformance suite and the
//! dispatcher's tests need.
//!
//! Calls can be held at a [`Gate`] (a database that stops answering): lease calls, a sweep's
//! calls, list reads.

// A poisoned lock or a malformed fixture is a broken test, and should fail it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_domain::ScriptOrigin;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::domain::channel::{NotificationList, SmtpSettings, Stored, WebhookSettings};
use crate::domain::delivery::AttemptOutcome;
use crate::domain::history::{ActionRefusal, Actor, HistoryEntry, HistoryEvent, OperatorAction};
use crate::domain::serve_order::{ClaimLanes, serve_turn};
use crate::domain::status::Status;
use crate::domain::{
    ListName, NotificationContent, NotificationId, NotificationType, Priority, SiteId, Submission,
};
use crate::records::{
    ActionResult, AttemptRecord, ClaimedNotification, LeaseEpoch, LeaseReading, LeaseRecord,
    NewNotification, NotificationDetail, NotificationState, PurgeReport,
};
use crate::store::{DispatchStore, ReadChannelSettings, Result};

/// Holds callers until opened, counting those waiting.
#[derive(Debug)]
pub struct Gate {
    open: watch::Sender<bool>,
    pub waiting: AtomicUsize,
}

impl Gate {
    pub fn closed() -> Self {
        Self {
            open: watch::Sender::new(false),
            waiting: AtomicUsize::new(0),
        }
    }

    pub fn opened() -> Self {
        let gate = Self::closed();
        gate.open();
        gate
    }

    pub async fn pass(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.subscribe();
        // Err only if the sender is gone, which it is not while `self` lives.
        let _ = open.wait_for(|open| *open).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    pub fn open(&self) {
        self.open.send_replace(true);
    }

    pub fn close(&self) {
        self.open.send_replace(false);
    }
}

/// An email notification to list "ops" with this subject, from a site script.
pub fn email(subject: &str) -> NewNotification {
    notification(NotificationType::Email, "ops", subject)
}

/// A webhook notification to list "hooks" with this subject, from a site script.
pub fn webhook(subject: &str) -> NewNotification {
    notification(NotificationType::Webhook, "hooks", subject)
}

fn notification(kind: NotificationType, list: &str, subject: &str) -> NewNotification {
    let content = NotificationContent::parse(
        kind,
        list.into(),
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
        deliver_after: None,
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
pub struct Row {
    pub submission: Submission,
    pub status: Status,
    /// Every outcome recorded, oldest first.
    pub outcomes: Vec<AttemptRecord>,
    /// History entries written: one per claim (each an attempt) and per operator action, as the
    /// real stores' AttemptCount. The latest claim's attempt number.
    pub attempts: u32,
    /// The insertion-ordered key (the real stores' Id).
    row_id: i64,
    /// Its serve turn (`domain::serve_order::serve_turn`), given when stored.
    serve_turn: i64,
    created_at: DateTime<Utc>,
    /// NextAttemptAt: its creation time when stored, the retry time after a failure.
    due: Option<DateTime<Utc>>,
    retry_count: u32,
    last_error: Option<String>,
    last_attempt_at: Option<DateTime<Utc>>,
    delivered_at: Option<DateTime<Utc>>,
    resolved_at: Option<DateTime<Utc>>,
    resolved_targets: Option<String>,
    history: Vec<HistoryEntry>,
    claim: Option<Claim>,
}

impl Row {
    fn state(&self) -> NotificationState {
        let s = &self.submission;
        NotificationState {
            row_id: self.row_id,
            id: s.id,
            status: self.status,
            kind: s.content.kind,
            list_name: s.content.list_name.as_str().to_owned(),
            subject: s.content.subject.as_str().to_owned(),
            source_site_id: s.provenance.source_site_id.as_str().to_owned(),
            priority: s.priority,
            condition_key: s.condition_key.as_ref().map(|k| k.as_str().to_owned()),
            retry_count: self.retry_count,
            last_error: self.last_error.clone(),
            site_enqueued_at: s.provenance.site_enqueued_at,
            created_at: self.created_at,
            last_attempt_at: self.last_attempt_at,
            next_attempt_at: self.due,
            delivered_at: self.delivered_at,
            resolved_at: self.resolved_at,
            deliver_after: s.deliver_after,
        }
    }

    fn detail(&self) -> NotificationDetail {
        let s = &self.submission;
        let p = &s.provenance;
        NotificationDetail {
            state: self.state(),
            body: s.content.body.as_str().to_owned(),
            type_data: s.content.type_data.as_str().to_owned(),
            source_instance_id: p.source_instance_id.clone(),
            source_script: p.source_script.clone(),
            origin_execution_id: p.origin_execution_id.map(|u| u.to_string()),
            origin_parent_execution_id: p.origin_parent_execution_id.map(|u| u.to_string()),
            resolved_targets: self.resolved_targets.clone(),
            history: self.history.clone(),
        }
    }

    /// Waits in turn, due, and not under a live claim.
    fn claimable(&self, kind: NotificationType, now: DateTime<Utc>, now_i: Instant) -> bool {
        self.status.waits_in_turn()
            && self.submission.content.kind == kind
            && self.due.is_none_or(|due| due <= now)
            && self.claim.is_none_or(|c| c.until <= now_i)
    }
}

#[derive(Debug, Default)]
struct State {
    leases: HashMap<&'static str, Lease>,
    rows: Vec<Row>,
    /// The last row id given (ids are never reused, as the real stores' identity columns).
    last_row_id: i64,
    smtp: Option<SmtpSettings>,
    /// `None`: the webhook channel runs on its defaults, as with nothing stored.
    webhook: Option<WebhookSettings>,
    lists: HashMap<ListName, NotificationList>,
    /// `claim_due` calls that claimed at least one row.
    claims: usize,
    /// `claim_due` calls that found nothing due.
    empty_claims: usize,
}

/// See the module documentation. Clones share the store, as clones of the SQL stores do.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    /// Lease calls (take, renew, release) wait here while it is closed.
    pub leases: Arc<Gate>,
    /// A sweep's calls (claims, SMTP settings reads) wait here while it is closed.
    pub sweeps: Arc<Gate>,
    /// List reads wait here while it is closed.
    pub list_reads: Arc<Gate>,
    /// How long each claim takes to answer, in microseconds of tokio's clock: a database's
    /// latency, for tests of how the dispatcher hides it (0 by default).
    claim_latency_us: Arc<AtomicU64>,
    /// Bumped whenever an outcome is recorded, so a test can wait for one.
    recorded: Arc<watch::Sender<usize>>,
}

impl Default for MemoryStore {
    /// Empty, with no SMTP settings and no lists.
    fn default() -> Self {
        Self {
            state: Arc::default(),
            leases: Arc::new(Gate::opened()),
            sweeps: Arc::new(Gate::opened()),
            list_reads: Arc::new(Gate::opened()),
            claim_latency_us: Arc::new(AtomicU64::new(0)),
            recorded: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl MemoryStore {
    /// Empty, with these channel settings.
    pub fn new(smtp: SmtpSettings, lists: Vec<NotificationList>) -> Self {
        let store = Self::default();
        {
            let mut state = store.lock();
            state.smtp = Some(smtp);
            state.lists = lists.into_iter().map(|l| (l.name.clone(), l)).collect();
        }
        store
    }

    /// Makes every claim from now on take `latency` (on tokio's clock) before it answers.
    pub fn set_claim_latency(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.claim_latency_us.store(micros, Ordering::SeqCst);
    }

    /// Stores the webhook channel's settings, as the admin API does.
    pub fn set_webhook_settings(&self, settings: WebhookSettings) {
        self.lock().webhook = Some(settings);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Stores a new row (its id must be new) as a submit stores one without a condition key or a
    /// consolidating list: Pending, due now (or at its `deliver_after`, when later), with its
    /// serve turn. Returns its id.
    pub fn add(&self, row: NewNotification) -> NotificationId {
        let submission = row.submission;
        let id = submission.id;
        let now = Utc::now();
        let mut state = self.lock();
        let waiting = state.rows.iter().filter(|r| {
            r.status.waits_in_turn()
                && r.submission.content.kind == submission.content.kind
                && r.submission.priority == submission.priority
        });
        let (mut head, mut site_last) = (None::<i64>, None::<i64>);
        for r in waiting {
            head = Some(head.map_or(r.serve_turn, |h| h.min(r.serve_turn)));
            if r.submission.provenance.source_site_id == submission.provenance.source_site_id {
                site_last = Some(site_last.map_or(r.serve_turn, |l| l.max(r.serve_turn)));
            }
        }
        state.last_row_id += 1;
        let row_id = state.last_row_id;
        let due = crate::domain::schedule::waiting_since(now, submission.deliver_after);
        state.rows.push(Row {
            submission,
            status: Status::Pending,
            outcomes: Vec::new(),
            attempts: 0,
            row_id,
            serve_turn: serve_turn(head, site_last),
            created_at: now,
            due: Some(due),
            retry_count: 0,
            last_error: None,
            last_attempt_at: None,
            delivered_at: None,
            resolved_at: None,
            resolved_targets: None,
            history: Vec::new(),
            claim: None,
        });
        id
    }

    pub fn row(&self, id: NotificationId) -> Row {
        self.lock()
            .rows
            .iter()
            .find(|r| r.submission.id == id)
            .cloned()
            .unwrap()
    }

    /// The row's state as the real stores' `state` shows it, if stored.
    pub fn state(&self, id: NotificationId) -> Option<NotificationState> {
        let state = self.lock();
        state
            .rows
            .iter()
            .find(|r| r.submission.id == id)
            .map(Row::state)
    }

    /// The row with its history as the real stores' `detail` shows it, if stored.
    pub fn detail(&self, id: NotificationId) -> Option<NotificationDetail> {
        let state = self.lock();
        state
            .rows
            .iter()
            .find(|r| r.submission.id == id)
            .map(Row::detail)
    }

    /// An operator discards each id, as the real stores' `act_on_ids` does: only Parked rows
    /// change (to Discarded, resolved now, with a history entry naming `actor`).
    pub fn discard(&self, ids: &[NotificationId], actor: &Actor) -> Vec<ActionResult> {
        let now = Utc::now();
        let mut state = self.lock();
        ids.iter()
            .map(|id| {
                let Some(row) = state.rows.iter_mut().find(|r| r.submission.id == *id) else {
                    return Err(ActionRefusal::NotFound);
                };
                if row.status != Status::Parked {
                    return Err(ActionRefusal::WrongStatus(row.status));
                }
                row.status = Status::Discarded;
                row.resolved_at = Some(now);
                row.claim = None;
                row.attempts += 1;
                row.history.push(HistoryEntry {
                    sequence: row.attempts,
                    at: now,
                    error: None,
                    event: HistoryEvent::Operator {
                        action: OperatorAction::Discard,
                        actor: actor.as_str().to_owned(),
                    },
                });
                Ok(row.state())
            })
            .collect()
    }

    /// Waits until the row satisfies `check` after some outcome was recorded (or already does).
    pub async fn until_row(&self, id: NotificationId, check: impl Fn(&Row) -> bool) -> Row {
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
    fn apply_outcome(&self, lease: &str, record: AttemptRecord) -> bool {
        let mut state = self.lock();
        // Lapsed or not, the lease must still be at the claim's epoch.
        if state.leases.get(lease).map(|l| l.epoch) != Some(record.epoch) {
            return false;
        }
        let Some(row) = state.rows.iter_mut().find(|r| r.row_id == record.row_id) else {
            return false;
        };
        let claimed_by_this_attempt = row
            .claim
            .is_some_and(|c| c.epoch == record.epoch && c.attempt_no == record.attempt_no);
        if !claimed_by_this_attempt {
            return false;
        }
        let t = &record.transition;
        row.claim = None;
        row.status = t.status;
        row.retry_count = t.retry_count;
        row.last_error = t.last_error.clone().or(row.last_error.take());
        row.due = t.next_attempt_at;
        row.delivered_at = t.delivered_at().or(row.delivered_at);
        row.resolved_at = t.resolved_at;
        row.resolved_targets = t.resolved_targets.clone().or(row.resolved_targets.take());
        if let Some(entry) = row
            .history
            .iter_mut()
            .find(|e| e.sequence == record.attempt_no)
            && let HistoryEvent::Attempt {
                outcome,
                duration,
                provider,
                ..
            } = &mut entry.event
        {
            *outcome = record.outcome;
            provider.clone_from(&record.provider);
            // Stored in whole milliseconds, as the real stores keep it.
            *duration = Some(Duration::from_millis(
                u64::try_from(record.duration.as_millis()).unwrap_or(u64::MAX),
            ));
            entry.error.clone_from(&record.error);
        }
        row.outcomes.push(record);
        true
    }

    /// How many claims have claimed rows so far.
    pub fn claims(&self) -> usize {
        self.lock().claims
    }

    /// How many claims found nothing due so far.
    pub fn empty_claims(&self) -> usize {
        self.lock().empty_claims
    }

    /// Another node takes lease `name`, bypassing the gate (its own connection to the
    /// database): as if this node's lease had expired there.
    pub fn lease_taken_by(&self, name: &'static str, holder: &str, ttl: Duration) -> LeaseEpoch {
        let mut state = self.lock();
        let epoch = LeaseEpoch(state.leases.get(name).map_or(1, |l| l.epoch.0 + 1));
        state.leases.insert(
            name,
            Lease {
                holder: holder.into(),
                epoch,
                expires: Instant::now() + ttl,
            },
        );
        epoch
    }
}

impl ReadChannelSettings for MemoryStore {
    async fn list(&self, name: &ListName) -> Result<Option<Stored<NotificationList>>> {
        self.list_reads.pass().await;
        Ok(self.lock().lists.get(name).map(|l| Stored {
            value: l.clone(),
            updated_at: Utc::now(),
        }))
    }

    async fn smtp_settings(&self) -> Result<Option<Stored<SmtpSettings>>> {
        self.sweeps.pass().await;
        Ok(self.lock().smtp.clone().map(|s| Stored {
            value: s,
            updated_at: Utc::now(),
        }))
    }

    /// Not gated: the sweep gate's tests count the email channel's reads.
    async fn webhook_settings(&self) -> Result<Option<Stored<WebhookSettings>>> {
        Ok(self.lock().webhook.clone().map(|s| Stored {
            value: s,
            updated_at: Utc::now(),
        }))
    }
}

impl DispatchStore for MemoryStore {
    async fn acquire_lease(
        &self,
        name: &'static str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<LeaseEpoch>> {
        self.leases.pass().await;
        let now = Instant::now();
        let mut state = self.lock();
        let epoch = match state.leases.get(name) {
            None => LeaseEpoch(1),
            Some(l) if l.holder == holder => l.epoch,
            Some(l) if l.expires <= now => LeaseEpoch(l.epoch.0 + 1),
            Some(_) => return Ok(None),
        };
        state.leases.insert(
            name,
            Lease {
                holder: holder.into(),
                epoch,
                expires: now + ttl,
            },
        );
        Ok(Some(epoch))
    }

    async fn release_lease(
        &self,
        name: &'static str,
        holder: &str,
        epoch: LeaseEpoch,
    ) -> Result<bool> {
        self.leases.pass().await;
        let now = Instant::now();
        let mut state = self.lock();
        match state.leases.get_mut(name) {
            Some(l) if l.holder == holder && l.epoch == epoch && l.expires > now => {
                l.expires = now;
                l.epoch = LeaseEpoch(l.epoch.0 + 1);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Not gated, like another node's connection: the lease calls' gate stands for this
    /// node's own link to the database. Expiries are tokio instants here, shown on the wall
    /// clock as the same distance from now.
    async fn read_lease(&self, name: &'static str) -> Result<LeaseReading> {
        let (now_i, now) = (Instant::now(), Utc::now());
        let state = self.lock();
        let record = state.leases.get(name).map(|l| {
            let left = l.expires.saturating_duration_since(now_i);
            let passed = now_i.saturating_duration_since(l.expires);
            let expires_at = now + chrono::Duration::from_std(left).unwrap_or_default()
                - chrono::Duration::from_std(passed).unwrap_or_default();
            LeaseRecord {
                holder: l.holder.clone(),
                epoch: l.epoch,
                expires_at,
            }
        });
        Ok(LeaseReading {
            read_at: now,
            record,
        })
    }

    async fn claim_due(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        kind: NotificationType,
        lanes: ClaimLanes,
        claim_timeout: Duration,
    ) -> Result<Vec<ClaimedNotification>> {
        if lanes.total() == 0 {
            return Ok(Vec::new());
        }
        self.sweeps.pass().await;
        let latency = self.claim_latency_us.load(Ordering::SeqCst);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        let now_i = Instant::now();
        let now = Utc::now();
        let mut state = self.lock();
        if !state
            .leases
            .get(lease)
            .is_some_and(|l| l.epoch == epoch && l.expires > now_i)
        {
            return Ok(Vec::new());
        }
        // The two orders of `domain::serve_order`: the longest-waiting share (due longest
        // first), then the rest by priority and serve turn. Ties go to the older row.
        let mut due: Vec<usize> = (0..state.rows.len())
            .filter(|&i| state.rows[i].claimable(kind, now, now_i))
            .collect();
        due.sort_by_key(|&i| (state.rows[i].due, state.rows[i].row_id));
        let mut picked: Vec<usize> = due.iter().copied().take(lanes.longest_waiting).collect();
        due.retain(|i| !picked.contains(i));
        due.sort_by_key(|&i| {
            let r = &state.rows[i];
            (r.submission.priority.rank(), r.serve_turn, r.row_id)
        });
        picked.extend(due.into_iter().take(lanes.in_turn));

        let mut claimed = Vec::with_capacity(picked.len());
        for i in picked {
            let row = &mut state.rows[i];
            row.attempts += 1;
            row.claim = Some(Claim {
                epoch,
                attempt_no: row.attempts,
                until: now_i + claim_timeout,
            });
            row.last_attempt_at = Some(now);
            row.history.push(HistoryEntry {
                sequence: row.attempts,
                at: now,
                error: None,
                event: HistoryEvent::Attempt {
                    outcome: AttemptOutcome::InFlight,
                    duration: None,
                    lease_epoch: epoch.0,
                    digest: None,
                    provider: None,
                },
            });
            claimed.push(ClaimedNotification {
                row_id: row.row_id,
                id: row.submission.id,
                content: row.submission.content.clone(),
                provenance: row.submission.provenance.clone(),
                priority: row.submission.priority,
                retry_count: row.retry_count,
                attempt_no: row.attempts,
                epoch,
                incident: None,
                digest_incidents: Vec::new(),
            });
        }
        if claimed.is_empty() {
            state.empty_claims += 1;
        } else {
            state.claims += 1;
        }
        Ok(claimed)
    }

    async fn next_due_in(&self, kind: NotificationType) -> Result<Option<Duration>> {
        let (now, now_i) = (Utc::now(), Instant::now());
        let state = self.lock();
        Ok(state
            .rows
            .iter()
            .filter(|r| r.status.waits_in_turn() && r.submission.content.kind == kind)
            .filter(|r| r.claim.is_none_or(|c| c.until <= now_i))
            .filter_map(|r| r.due.filter(|due| *due > now))
            .min()
            .map(|due| (due - now).to_std().unwrap_or(Duration::ZERO)))
    }

    async fn claim_digest(
        &self,
        _lease: &'static str,
        _epoch: LeaseEpoch,
        _kind: NotificationType,
        _digest: NotificationId,
        _claim_timeout: Duration,
    ) -> Result<Vec<ClaimedNotification>> {
        // Rows are Held only by ingest (flood consolidation), which this store does not keep.
        Ok(Vec::new())
    }

    async fn record_outcomes(
        &self,
        lease: &'static str,
        records: Vec<AttemptRecord>,
    ) -> Result<Vec<bool>> {
        let mut applied = Vec::with_capacity(records.len());
        for record in records {
            let done = self.apply_outcome(lease, record);
            if done {
                self.recorded.send_modify(|n| *n += 1);
            }
            applied.push(done);
        }
        Ok(applied)
    }

    async fn purge_terminal(
        &self,
        resolved_before: DateTime<Utc>,
        batch: u32,
    ) -> Result<PurgeReport> {
        let mut state = self.lock();
        let mut doomed: Vec<(DateTime<Utc>, i64)> = state
            .rows
            .iter()
            .filter(|r| r.status.is_terminal())
            .filter_map(|r| r.resolved_at.map(|at| (at, r.row_id)))
            .filter(|(at, _)| *at < resolved_before)
            .collect();
        doomed.sort();
        doomed.truncate(usize::try_from(batch).unwrap_or(usize::MAX));
        let mut report = PurgeReport::default();
        state.rows.retain(|r| {
            if !doomed.iter().any(|(_, id)| *id == r.row_id) {
                return true;
            }
            report.notifications += 1;
            report.parked += u64::from(r.status == Status::Parked);
            report.history_entries += r.history.len() as u64;
            false
        });
        Ok(report)
    }

    /// Keeps no site health (it has no ingest): nothing to forget.
    async fn forget_silent_nodes(&self, _silent_for: Duration) -> Result<Vec<(SiteId, SiteId)>> {
        Ok(Vec::new())
    }
}
