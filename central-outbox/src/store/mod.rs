//! The central store: one trait per capability, [`OutboxStore`] as their sum, and one module per
//! backend. Everything the services persist goes through it, in domain types and the records
//! of `crate::records`; backends hold the SQL.
//!
//! Each user asks for the capabilities it uses and no more, so a test store (or a wrapper) keeps
//! only those, and what a part of the service may touch shows in its bounds:
//!
//! - [`IngestStore`] (`ping`, `submit`, `clear_condition`, `record_site_health`): the ingest
//!   service (`grpc::ingest`) and the health probe (`health`).
//! - [`DispatchStore`] (`acquire_lease`, `release_lease`, `read_lease`, `claim_due`,
//!   `next_due_in`, `claim_digest`, `record_outcomes`, `record_outcome`, `purge_terminal`,
//!   `forget_silent_nodes`): the dispatcher with its lease keeper, channel loops, attempts and
//!   recorder (`dispatcher`), the purge (`purge`), which runs under the dispatcher's lease, and
//!   the self-alerts' watch for a missing leader (`self_alerts`).
//! - [`ReadChannelSettings`] (`list`, `smtp_settings`, `webhook_settings`): what a delivery
//!   reads, through
//!   `config_cache`. Both [`DispatchStore`] and [`ChannelSettingsStore`] require it, so the
//!   dispatcher and the admin service read settings the same way without either needing the
//!   other's capability.
//! - [`AdminStore`] (`state`, `query`, `detail`, `act_on_ids`, `act_on_filter`,
//!   `count_on_filter`, `kpis`, `site_health`): the admin service (`grpc::admin`, which the web
//!   console calls in-process) and the KPI gauges of `/metrics` (`kpi_gauges`, set up in `run`).
//! - [`ChannelSettingsStore`] (`lists`, `upsert_list`, `delete_list`, `put_smtp_settings`,
//!   `delete_smtp_settings`, `put_webhook_settings`, the `seed_*` trio, `reseal_secrets`): the
//!   admin service, and start-up (`run` reseals the stored secrets, and `bootstrap` seeds, or
//!   on request replaces, the configured channels and lists).
//!
//! The SQL backends implement all of them ([`OutboxStore`], a blanket sum); the dispatcher's
//! in-memory test store (`crate::testing`) only [`DispatchStore`]. Purging runs under the
//! dispatcher's lease, so it is part of the dispatch capability.
//!
//! Contract every backend keeps (checked by the shared conformance tests):
//! - `submit` commits before it returns; an id is stored at most once; a resubmit with the same
//!   content hash is `Duplicate`, with another hash `Conflict`, and the stored row is unchanged.
//! - `submit` gives each new row its serve turn (`domain::serve_order::serve_turn`); a new row
//!   with a condition key supersedes the waiting (unclaimed Pending/Retrying) rows of its site,
//!   list and key enqueued at the site no later than it, each with a history entry naming it;
//!   a row the site cleared before forwarding it is stored Cleared, never due. A new row of a
//!   list that consolidates floods counts as an arrival of the list's current window and, if it
//!   is over the threshold and not critical, is stored Held, due at the window's end
//!   (`domain::consolidation`). Supersede and clear end Held rows like the other waiting ones.
//! - `claim_digest` claims the due Held rows of one list together, as `claim_due` claims (same
//!   fence, an InFlight attempt row each, naming the digest); an outcome that would make a Held
//!   row Retrying leaves it Held (due again at the retry time, in a digest again).
//! - `claim_due` hands a due row to at most one live claim, stamps the lease epoch and writes an
//!   InFlight attempt row in the same transaction; it takes rows in the orders of
//!   `domain::serve_order`. A row is due at its NextAttemptAt: a scheduled row
//!   (`domain::schedule`) is stored Pending, due at its `deliver_after`, and is never claimed
//!   before it; `next_due_in` says how long until the next such time.
//! - `submit` stores a scheduled row's `deliver_after` and neither holds it (consolidation) nor
//!   opens or joins an incident for it (`domain::schedule`, rule 2).
//! - `record_outcomes` applies each outcome only if the row is still claimed by that attempt (epoch and
//!   attempt number) and no other holder has taken the lease since (it is still at that epoch,
//!   lapsed or not); otherwise it changes nothing and returns false.
//! - `acquire_lease` bumps the epoch only when the holder changes: a holder re-taking its own
//!   lapsed lease keeps its epoch. `read_lease` answers what is stored, with the clock leases
//!   are judged by (the database's, or on SQLite this process's). Lease calls are served ahead of bulk work, so a renewal
//!   never queues behind ingest, claims or a purge.
//! - `query` pages newest first by (CreatedAt, row id) with a keyset cursor, so concurrent inserts
//!   never make a row appear twice or not at all in pages after the first.
//! - Operator actions change only Parked rows, and write a history entry in the same transaction.
//! - `purge_terminal` deletes only terminal rows resolved before the cutoff, with their history.
//! - The `seed_*` calls store a value only where none is stored, atomically: of two replicas
//!   seeding the same missing item at once, one stores it and the other is told it was there.
//!   The stored channel settings and lists are the authority; only the `put_*`/`upsert_*`
//!   calls (the admin API, or start-up asked to replace) overwrite them.
//! - `record_site_health` keeps one row per (site, node): the latest report, stamped with the
//!   database's clock; `site_health` reads every row with that clock's reading at the same time,
//!   so the offline rule (`domain::site_health`) is applied to one clock on every replica. A
//!   report from a new node of a site that already has `MAX_NODES_PER_SITE` nodes is not stored
//!   (`SiteHealthWrite::SiteFull`); `forget_silent_nodes` deletes the nodes whose latest report
//!   is older than the retention, by the same clock.
//!
//! The conformance suite also holds the in-memory store to the dispatch part of this contract
//! (leases, claims and their serve order, fenced outcomes, the purge), so the dispatcher's
//! paused-clock tests run against a store that behaves like the real ones.

mod claimed;
pub mod mssql;
mod page_source;
pub mod sqlite;
mod stored_list;
pub(crate) mod stored_policy;

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::channel::{NotificationList, SmtpSettings, Stored, WebhookSettings};
use crate::domain::escalation::{AckResult, Acknowledgement, IncidentId};
use crate::domain::history::{Actor, OperatorAction};
use crate::domain::kpi::{KpiParams, Kpis};
use crate::domain::query::{NotificationFilter, PageRequest};
use crate::domain::serve_order::ClaimLanes;
use crate::domain::site_health::{SiteHealthReport, SiteHealthSnapshot, SiteHealthWrite};
use crate::domain::{ConditionKey, ListName, NotificationId, NotificationType, SiteId};
use crate::records::{
    ActionResult, AttemptRecord, ClaimedNotification, EscalationTurn, FilterActionReport,
    FilterCount, IncidentDetail, IncidentList, IncidentQuery, InsertOutcome, LeaseEpoch,
    LeaseReading, NewNotification, NotificationDetail, NotificationState, Page, PurgeReport,
    SiteStatusChange, SiteStatusPurge, StatusCallbackBacklog, StatusCallbackCall,
    StatusCallbackTurn,
};
use crate::secrets::ResealReport;

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
    /// This backend cannot store what was asked (the message says what, and what to use
    /// instead); retrying does not help.
    #[error("{0}")]
    Unsupported(String),
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

/// The whole store: every capability. What the service runs on (`run`) and what the SQL
/// backends are; a part of the service asks only for the capabilities it uses (module docs).
pub trait OutboxStore:
    IngestStore
    + DispatchStore
    + AdminStore
    + ChannelSettingsStore
    + EscalationStore
    + SiteStatusStore
    + StatusCallbackStore
{
}

impl<
    S: IngestStore
        + DispatchStore
        + AdminStore
        + ChannelSettingsStore
        + EscalationStore
        + SiteStatusStore
        + StatusCallbackStore,
> OutboxStore for S
{
}

/// What the sites' ingest needs: storing submissions, clearing conditions, node health reports,
/// and the probe the health service answers with. Methods return `Send` futures so the services
/// can run them on any worker (so do every capability's).
pub trait IngestStore: Send + Sync + 'static {
    /// Succeeds if the store can take a write now (an empty transaction): the health probe.
    fn ping(&self) -> impl Future<Output = Result<()>> + Send;

    /// Idempotently inserts each notification; one outcome per input, in order. Returns only
    /// after the accepted rows are committed.
    fn submit(
        &self,
        batch: Vec<NewNotification>,
    ) -> impl Future<Output = Result<Vec<InsertOutcome>>> + Send;

    /// Ends every notification of `site` with condition key `key` that is waiting (Pending,
    /// Retrying or Held, and not claimed) or Parked as Cleared, with a history entry naming
    /// `actor`; returns their ids. Delivered rows are never touched; a row being delivered is
    /// marked, and ends Cleared when its attempt does not deliver it (or its claim expires).
    fn clear_condition(
        &self,
        site: &SiteId,
        key: &ConditionKey,
        actor: Actor,
    ) -> impl Future<Output = Result<Vec<NotificationId>>> + Send;

    /// Stores `report` as the latest of its (site, node), replacing the one before, received
    /// now by the database's clock; unless the node is new and its site already has
    /// `domain::site_health::MAX_NODES_PER_SITE` nodes (`SiteFull`, nothing stored).
    fn record_site_health(
        &self,
        report: SiteHealthReport,
    ) -> impl Future<Output = Result<SiteHealthWrite>> + Send;
}

/// The channel settings a delivery reads: one list by name and each channel's settings.
/// Both the dispatcher (through `config_cache`) and the admin service read them, so both
/// [`DispatchStore`] and [`ChannelSettingsStore`] build on it.
pub trait ReadChannelSettings: Send + Sync + 'static {
    /// The named list, if configured.
    fn list(
        &self,
        name: &ListName,
    ) -> impl Future<Output = Result<Option<Stored<NotificationList>>>> + Send;

    /// The email channel's settings, if configured.
    fn smtp_settings(&self) -> impl Future<Output = Result<Option<Stored<SmtpSettings>>>> + Send;

    /// The webhook channel's settings, if stored (until then it runs on the defaults,
    /// `WebhookSettings::default`).
    fn webhook_settings(
        &self,
    ) -> impl Future<Output = Result<Option<Stored<WebhookSettings>>>> + Send;
}

/// What the dispatcher needs: the leader lease, claims, fenced outcomes, and the retention
/// purge (which runs under the dispatcher's lease), besides the channel settings it reads.
pub trait DispatchStore: ReadChannelSettings {
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

    /// The named lease as stored (holder, epoch, expiry) and the store's clock at the read, so
    /// every replica judges whether it is held alike. Changes nothing.
    fn read_lease(&self, name: &'static str) -> impl Future<Output = Result<LeaseReading>> + Send;

    /// Claims due rows of one channel for `claim_timeout` under `epoch`, writing an InFlight
    /// attempt row for each: up to `lanes.longest_waiting` rows due longest, then up to
    /// `lanes.in_turn` more by priority and serve turn (`domain::serve_order`), returned in that
    /// order. Claims nothing if `epoch` does not hold the lease.
    fn claim_due(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        kind: NotificationType,
        lanes: ClaimLanes,
        claim_timeout: Duration,
    ) -> impl Future<Output = Result<Vec<ClaimedNotification>>> + Send;

    /// How long, by the store's clock, until the earliest waiting row of channel `kind` that is
    /// not due yet comes due (a scheduled row's time, a retry's): the unclaimed Pending and
    /// Retrying rows whose NextAttemptAt is ahead. `None` when no such row waits. Changes
    /// nothing. What the dispatcher sleeps for after a claim that took every due row, so that a
    /// row coming due between polls is claimed at its time.
    fn next_due_in(
        &self,
        kind: NotificationType,
    ) -> impl Future<Output = Result<Option<Duration>>> + Send;

    /// Claims the due Held rows of one list of channel `kind` for `claim_timeout` under `epoch`
    /// as digest `digest`: the list of the longest-due Held row, up to its `max_per_digest`
    /// rows (`consolidation::limits::MAX_PER_DIGEST` if it no longer consolidates), longest due
    /// first, each with an InFlight attempt row naming the digest. Empty when no Held row is
    /// due or `epoch` does not hold the lease.
    fn claim_digest(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        kind: NotificationType,
        digest: NotificationId,
        claim_timeout: Duration,
    ) -> impl Future<Output = Result<Vec<ClaimedNotification>>> + Send;

    /// Applies each attempt's outcome whose claim still stands (see the module contract), all
    /// committed before it returns. One answer per record, in order: whether it was applied.
    /// The dispatcher writes the outcomes that finished together in one call, because a call
    /// costs a server far more than a row does.
    fn record_outcomes(
        &self,
        lease: &'static str,
        records: Vec<AttemptRecord>,
    ) -> impl Future<Output = Result<Vec<bool>>> + Send;

    /// [`Self::record_outcomes`] of one record.
    fn record_outcome(
        &self,
        lease: &'static str,
        record: AttemptRecord,
    ) -> impl Future<Output = Result<bool>> + Send {
        async move {
            let applied = self.record_outcomes(lease, vec![record]).await?;
            Ok(applied.first().copied().unwrap_or(false))
        }
    }

    /// Deletes up to `batch` terminal rows resolved before `resolved_before`, with their
    /// history. Call again until it deletes fewer than `batch`.
    fn purge_terminal(
        &self,
        resolved_before: DateTime<Utc>,
        batch: u32,
    ) -> impl Future<Output = Result<PurgeReport>> + Send;

    /// Deletes the site health of every node whose latest report is `silent_for` old or older
    /// by the database's clock (the clock that stamped it); returns those nodes as (site,
    /// node). The table holds at most `MAX_NODES_PER_SITE` rows per site, so one statement.
    fn forget_silent_nodes(
        &self,
        silent_for: Duration,
    ) -> impl Future<Output = Result<Vec<(SiteId, SiteId)>>> + Send;
}

/// What operators look at and act on: notifications, their history, the KPIs, site health.
pub trait AdminStore: Send + Sync + 'static {
    /// The current state of one notification, if stored.
    fn state(
        &self,
        id: NotificationId,
    ) -> impl Future<Output = Result<Option<NotificationState>>> + Send;

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

    /// How many rows [`act_on_filter`](Self::act_on_filter) with the same `filter` and `limit`
    /// would act on now, changing nothing: the Parked matches, counted up to `limit`, and
    /// whether more match. What a bulk action's confirmation shows (`dry_run`).
    fn count_on_filter(
        &self,
        filter: NotificationFilter,
        limit: usize,
    ) -> impl Future<Output = Result<FilterCount>> + Send;

    /// The KPIs at `params.now`.
    fn kpis(&self, params: KpiParams) -> impl Future<Output = Result<Kpis>> + Send;

    /// Every node's latest report, by site then node, and the database's clock at the read.
    fn site_health(&self) -> impl Future<Output = Result<SiteHealthSnapshot>> + Send;
}

/// Changing the channel settings: the lists and each channel's settings, seeding what is
/// missing at start-up, and keeping their stored secrets sealed with the current key.
pub trait ChannelSettingsStore: ReadChannelSettings {
    /// Every list, by name.
    fn lists(&self) -> impl Future<Output = Result<Vec<Stored<NotificationList>>>> + Send;

    /// Creates or replaces a list and its recipients.
    fn upsert_list(&self, list: NotificationList) -> impl Future<Output = Result<()>> + Send;

    /// Deletes a list; false if there was none.
    fn delete_list(&self, name: &ListName) -> impl Future<Output = Result<bool>> + Send;

    /// Creates or replaces the email channel's settings.
    fn put_smtp_settings(&self, settings: SmtpSettings) -> impl Future<Output = Result<()>> + Send;

    /// Removes the email channel's settings; false if there were none.
    fn delete_smtp_settings(&self) -> impl Future<Output = Result<bool>> + Send;

    /// Creates or replaces the webhook channel's settings.
    fn put_webhook_settings(
        &self,
        settings: WebhookSettings,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Stores the email channel's settings unless some are stored; true if these were stored.
    fn seed_smtp_settings(
        &self,
        settings: SmtpSettings,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Stores the webhook channel's settings unless some are stored; true if these were stored.
    fn seed_webhook_settings(
        &self,
        settings: WebhookSettings,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Stores a list unless one of its name is stored; true if this one was stored.
    fn seed_list(&self, list: NotificationList) -> impl Future<Output = Result<bool>> + Send;

    /// Re-seals every stored secret not sealed with the current key (clear text from older
    /// releases, or an earlier key) and checks that the rest open; run at start-up. Fails,
    /// naming the key id, if one was sealed with a key that is not configured.
    fn reseal_secrets(&self) -> impl Future<Output = Result<ResealReport>> + Send;
}

/// Escalation (`domain::escalation`): the clock that fires due pages under the dispatcher's
/// lease, acknowledgements, and the incidents operators look at. Incidents open in `submit`'s
/// transaction and end in `clear_condition`'s (and a Discard's), so those stay with their
/// capabilities; this one holds what only escalation does.
pub trait EscalationStore: Send + Sync + 'static {
    /// Fires what is due by the store's clock for up to `limit` incidents, only while `epoch`
    /// holds `lease`, each in the same transaction as its incident's new place: a page stores
    /// one Pending notification per list it pages (linked to the incident, at its priority)
    /// and a page row keyed by incident, cycle, round and step, so no page fires twice; an
    /// incident with no page left is exhausted; an acknowledged incident whose reminder is due
    /// pages again from step 1. Every one is a history row; a page `LATE_AFTER` or more after
    /// its due time says how late, and the next wait counts from when it fired.
    fn escalate_due(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        limit: u32,
    ) -> impl Future<Output = Result<EscalationTurn>> + Send;

    /// Acknowledges an incident (see `AckResult`): the first acknowledgement stops its
    /// escalation in the same transaction, ending its page notifications not yet claimed as
    /// Acknowledged and marking the claimed ones to end so unless their attempt delivers them.
    /// A later one is recorded, as a duplicate or (after the incident ended) as late.
    fn acknowledge_incident(
        &self,
        id: IncidentId,
        ack: Acknowledgement,
    ) -> impl Future<Output = Result<AckResult>> + Send;

    /// Acknowledges every incident of `site`'s condition `key` that is not final, on every
    /// list, as [`Self::acknowledge_incident`] does; returns each with what it did (none: no
    /// incident of that condition was open, which is recorded nowhere).
    fn acknowledge_condition(
        &self,
        site: &SiteId,
        key: &ConditionKey,
        ack: Acknowledgement,
    ) -> impl Future<Output = Result<Vec<(IncidentId, AckResult)>>> + Send;

    /// One page of incidents, newest first.
    fn incidents(&self, query: IncidentQuery) -> impl Future<Output = Result<IncidentList>> + Send;

    /// One incident with its pages, history and notifications.
    fn incident(
        &self,
        id: IncidentId,
    ) -> impl Future<Output = Result<Option<IncidentDetail>>> + Send;
}

/// The final statuses going back to the sites (`grpc::site_status`, `status_feed`, `purge`).
/// The backends record a change in the transaction that sets the status (a trigger on the
/// notifications), for every site that watches; this capability reads and forgets them.
pub trait SiteStatusStore: Send + Sync + 'static {
    /// Records that `site` watches its notifications' final statuses from now on (or renews
    /// its watch): every change after this is kept for it until it confirms it.
    fn watch_site_status(&self, site: &SiteId) -> impl Future<Output = Result<()>> + Send;

    /// The oldest `limit` changes of `site` it has not confirmed, oldest first.
    fn site_status_changes(
        &self,
        site: &SiteId,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<SiteStatusChange>>> + Send;

    /// Forgets the changes `seqs` of `site`: it stored them.
    fn forget_site_status_changes(
        &self,
        site: &SiteId,
        seqs: Vec<i64>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The sites with a change recorded after seq `after` (oldest first, each once), and the
    /// highest seq recorded: what wakes the watching streams.
    fn site_status_heads(
        &self,
        after: i64,
    ) -> impl Future<Output = Result<(Vec<SiteId>, i64)>> + Send;

    /// Drops the changes decided before `now - keep` and the watches not renewed since, at
    /// most `batch` rows of each per call.
    fn purge_site_status(
        &self,
        keep: Duration,
        batch: u32,
    ) -> impl Future<Output = Result<SiteStatusPurge>> + Send;
}

/// The status callbacks (`status_callbacks`, on the dispatcher lease holder). The backends
/// queue a change in the transaction that sets a final status of a notification whose list has
/// a status callback endpoint (a trigger, as for the site status feed); this capability hands
/// out the due ones and records each call.
pub trait StatusCallbackStore: Send + Sync + 'static {
    /// At most `limit` changes due by the store's clock, oldest due first, each only once
    /// every earlier change of its notification is done (so an endpoint hears a notification's
    /// changes in order); and when the next is due otherwise.
    fn due_status_callbacks(
        &self,
        limit: u32,
    ) -> impl Future<Output = Result<StatusCallbackTurn>> + Send;

    /// Records `call` on its notification's history and, in the same transaction, forgets its
    /// change (answered or given up) or makes it due again at `call.retry_at`.
    fn record_status_callback(
        &self,
        call: StatusCallbackCall,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The changes still waiting, and the oldest one's queueing time.
    fn status_callback_backlog(&self)
    -> impl Future<Output = Result<StatusCallbackBacklog>> + Send;
}

/// A rate limit as a backend read it, brought within the bounds (`RateLimit::stored`) with a
/// warning: the one rule both backends decode with.
pub(crate) fn stored_rate_limit(
    per_second: f64,
    burst: Option<u32>,
) -> crate::domain::channel::RateLimit {
    let (limit, changed) = crate::domain::channel::RateLimit::stored(per_second, burst);
    if changed {
        tracing::warn!(
            per_second,
            ?burst,
            used_per_second = limit.per_second(),
            used_burst = limit.burst(),
            "a stored rate limit is out of bounds; using the nearest allowed values (store it again to silence this)"
        );
    }
    limit
}
