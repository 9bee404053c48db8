//! The MS SQL Server backend of [`OutboxStore`](super::OutboxStore): the production central
//! store, shared by every central replica (docs/mssql.md). Also meant to run
//! unchanged on Babelfish for PostgreSQL.
//!
//! Each store operation is one T-SQL batch (see [`sql`]) on a pooled connection: one round trip,
//! one transaction, `SET XACT_ABORT ON`, so a failure leaves nothing half done. A batch chosen
//! as a deadlock victim was rolled back whole and is run again (a few times, with jitter);
//! nothing else is retried here, because a batch that timed out may have committed. Every call
//! is bounded: waiting for a connection, each response, and the whole batch (see
//! [`MsSqlStore::batch`]). Replicas agree on time through the database's clock
//! (`SYSUTCDATETIME()`), which dates claims, leases and CreatedAt.
//!
//! Layout: `options` (connection strings), `pool` (connections and their discard rules), `error`
//! (what an error number means), `sql` (every statement: its files and builders), `migrate` (the
//! numbered schema migrations) and `procedures` (the stored procedures, one living file each),
//! `ingest` (idempotent submit with the condition keys' supersede and flood consolidation's count
//! and hold, and the keys' clear), `dispatch` (leases, claims, digest claims, outcomes), `admin`
//! (queries, operator actions, KPIs, purge), `channel` (lists and SMTP settings), `site_health`
//! (the latest report of each site node), `site_status` (the final statuses going back to the
//! sites), `status_callback` (the calls to the lists' endpoints), `warm` (what a new pooled
//! connection runs before it is handed out), `decode` (rows to domain types), `scratch` (throw-away
//! databases for the test suites and benchmarks).

mod admin;
mod channel;
mod decode;
mod dispatch;
mod error;
mod escalation;
mod ingest;
mod migrate;
mod options;
mod pool;
mod procedures;
mod scratch;
mod site_health;
mod site_status;
mod sql;
mod status_callback;
mod warm;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tiberius::Row;
use tiberius::error::{Error, IoErrorKind};

use self::error::{ErrorClass, classify, to_store_error};
use self::pool::{Manager, Param};
use super::{
    AdminStore, ChannelSettingsStore, DispatchStore, EscalationStore, IngestStore,
    ReadChannelSettings, Result, SiteStatusStore, StoreError,
};
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
use crate::secrets::{Keyring, ResealReport};

pub use self::options::MsSqlOptions;
pub use self::pool::ConnectionsOpened;
pub use self::scratch::ScratchDatabase;

/// Runs of a batch chosen as a deadlock victim, in all. SQL Server picks the cheaper
/// transaction to roll back; run again, it almost always succeeds the second time.
const DEADLOCK_ATTEMPTS: u32 = 3;
/// Idle pooled connections beyond `Min Pool Size` are closed after this (by default there are
/// none: the whole pool is kept).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Connections are replaced after this, so they follow failovers and DNS changes.
const POOL_MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// Central store on an MS SQL Server database.
#[derive(Clone)]
pub struct MsSqlStore {
    pool: bb8::Pool<Manager>,
    /// One connection of its own for the dispatcher lease, so a renewal never waits for a
    /// pooled connection behind ingest, claims and outcomes (the caller bounds each call).
    lease_pool: bb8::Pool<Manager>,
    /// Bounds one whole unit of work: a connection from the pool, then the batch.
    timeout: Duration,
    /// Seals the secrets written and opens those read (see `channel`).
    secrets: Keyring,
    /// The lists this replica has seen consolidate floods, so that a submit sends their rows
    /// through the procedure at once (see `ingest`). Shared by the clones; the lock is held only
    /// to copy or extend the set, never across an await.
    consolidating: Arc<Mutex<ingest::ConsolidatingLists>>,
    /// Connections both pools opened, for `/metrics`.
    opened: ConnectionsOpened,
}

impl std::fmt::Debug for MsSqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MsSqlStore")
            .field("pool", &self.pool.state())
            .finish_non_exhaustive()
    }
}

impl MsSqlStore {
    /// Connects, then brings the schema up to date (serialised between replicas by an
    /// application lock). Fails if the server is unreachable after the connect retries, the
    /// login is refused, or the schema is newer than this binary. Secrets are sealed with a key
    /// that lasts as long as this process (`Keyring::ephemeral`), enough for tests and tools;
    /// the service sets its configured keys with [`Self::with_secrets`].
    pub async fn open(options: MsSqlOptions) -> Result<Self> {
        let secrets = Keyring::ephemeral()?;
        tracing::info!(server = %options.describe(), "opening the MS SQL store");
        // The schema first, on a connection of its own that is not warmed: the statements the
        // warm-up runs may not exist before the migrations.
        let schema = bb8::Pool::builder()
            .max_size(1)
            .connection_timeout(options.connect_timeout * 3)
            .retry_connection(false)
            .build_unchecked(Manager::cold(options.clone()));
        migrate::apply(&schema, options.command_timeout).await?;
        drop(schema);
        let started = std::time::Instant::now();
        let opened = ConnectionsOpened::default();
        // Both pools open their idle connections, warmed (see `warm`), before the store is
        // returned: central serves streams and takes the dispatcher lease only after that, so
        // neither a first stream nor a new leader waits on a cold connection, and by default
        // (see `MsSqlOptions::min_idle`) no burst has to open one. The pools fill at once; on
        // SQL Server that is a few round trips per connection, on Babelfish seconds of a
        // server core each.
        let (pool, lease_pool) = tokio::try_join!(
            bb8::Pool::builder()
                .max_size(options.pool_max_size)
                // Kept open and warm: by default every connection, so the pool never grows
                // under load; with a smaller `Min Pool Size` those are spares, and bb8 opens
                // (and warms) the next one in the background whenever a spare is taken.
                .min_idle(Some(options.min_idle()))
                // Waiting for a free connection, or for a new one (which retries transient
                // failures and warms itself), is bounded by a few connect timeouts.
                .connection_timeout(options.connect_timeout * 3)
                .retry_connection(false)
                .test_on_check_out(true)
                .idle_timeout(Some(POOL_IDLE_TIMEOUT))
                .max_lifetime(Some(POOL_MAX_LIFETIME))
                .build(Manager::warming(
                    options.clone(),
                    warm::Kind::Everything,
                    &opened,
                    "requests",
                )),
            // Kept open (min_idle 1) so a renewal does not pay for a login; not idle-timed out.
            bb8::Pool::builder()
                .max_size(1)
                .min_idle(Some(1))
                .connection_timeout(options.connect_timeout * 3)
                .retry_connection(false)
                .test_on_check_out(true)
                .idle_timeout(None)
                .max_lifetime(Some(POOL_MAX_LIFETIME))
                .build(Manager::warming(
                    options.clone(),
                    warm::Kind::Lease,
                    &opened,
                    "lease",
                )),
        )
        .map_err(|e| to_store_error("connect", &e))?;
        tracing::info!(
            took = ?started.elapsed(),
            idle = options.min_idle(),
            "MS SQL connections open and warmed"
        );
        Ok(Self {
            pool,
            lease_pool,
            // A batch waits for a connection (bounded above) and then for each response (the
            // driver's command timeout); a batch has at most a couple of response waits.
            timeout: options.connect_timeout * 3 + options.command_timeout * 2,
            secrets,
            consolidating: Arc::default(),
            opened,
        })
    }

    /// The count of connections each pool opened, for `/metrics` (see [`ConnectionsOpened`]).
    pub fn connections_opened(&self) -> &ConnectionsOpened {
        &self.opened
    }

    /// Seals and opens secrets with `secrets` from now on.
    #[must_use]
    pub fn with_secrets(mut self, secrets: Keyring) -> Self {
        self.secrets = secrets;
        self
    }

    /// Runs one batch on a pooled connection and returns its result sets. Deadlock victims are
    /// run again; any other error is returned as the driver reported it (a timeout as an IO
    /// `TimedOut`), for the caller to classify.
    async fn batch_raw(
        &self,
        sql: &str,
        params: &[Param],
    ) -> std::result::Result<Vec<Vec<Row>>, Error> {
        self.batch_on(&self.pool, sql, params).await
    }

    /// [`Self::batch_raw`] on the lease's own connection.
    async fn lease_batch_raw(
        &self,
        sql: &str,
        params: &[Param],
    ) -> std::result::Result<Vec<Vec<Row>>, Error> {
        self.batch_on(&self.lease_pool, sql, params).await
    }

    async fn batch_on(
        &self,
        pool: &bb8::Pool<Manager>,
        sql: &str,
        params: &[Param],
    ) -> std::result::Result<Vec<Vec<Row>>, Error> {
        let mut attempt = 1;
        loop {
            let run = async {
                let mut conn = pool.get().await.map_err(|e| match e {
                    bb8::RunError::User(e) => e,
                    bb8::RunError::TimedOut => Error::Io {
                        kind: IoErrorKind::TimedOut,
                        message: "no database connection became available in time".into(),
                    },
                })?;
                conn.batch(sql, params).await
            };
            // Dropping `run` on timeout drops its connection mid-request; the pool discards it.
            let result = tokio::time::timeout(self.timeout, run)
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Io {
                        kind: IoErrorKind::TimedOut,
                        message: format!("the batch did not finish within {:?}", self.timeout),
                    })
                });
            match result {
                Err(e) if classify(&e) == ErrorClass::Deadlock && attempt < DEADLOCK_ATTEMPTS => {
                    tracing::debug!(attempt, "deadlock victim; running the batch again");
                    let pause = 10 * u64::from(attempt) + fastrand::u64(0..40);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// [`Self::batch_raw`], with errors as the store reports them.
    async fn batch(&self, context: &str, sql: &str, params: &[Param]) -> Result<Vec<Vec<Row>>> {
        self.batch_raw(sql, params)
            .await
            .map_err(|e| to_store_error(context, &e))
    }
}

fn millis_i32(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl IngestStore for MsSqlStore {
    async fn ping(&self) -> Result<()> {
        self.batch("health probe", sql::PING, &[]).await.map(drop)
    }

    async fn submit(&self, batch: Vec<NewNotification>) -> Result<Vec<InsertOutcome>> {
        ingest::submit(self, &batch).await
    }

    async fn clear_condition(
        &self,
        site: &SiteId,
        key: &ConditionKey,
        actor: Actor,
    ) -> Result<Vec<NotificationId>> {
        ingest::clear_condition(self, site, key, &actor).await
    }

    async fn record_site_health(&self, report: SiteHealthReport) -> Result<SiteHealthWrite> {
        site_health::record(self, &report).await
    }
}

impl ReadChannelSettings for MsSqlStore {
    async fn list(&self, name: &ListName) -> Result<Option<Stored<NotificationList>>> {
        channel::list(self, name).await
    }

    async fn smtp_settings(&self) -> Result<Option<Stored<SmtpSettings>>> {
        channel::smtp_settings(self).await
    }

    async fn webhook_settings(&self) -> Result<Option<Stored<WebhookSettings>>> {
        channel::webhook_settings(self).await
    }
}

impl DispatchStore for MsSqlStore {
    async fn acquire_lease(
        &self,
        name: &'static str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<LeaseEpoch>> {
        dispatch::acquire_lease(self, name, holder, ttl).await
    }

    async fn release_lease(
        &self,
        name: &'static str,
        holder: &str,
        epoch: LeaseEpoch,
    ) -> Result<bool> {
        dispatch::release_lease(self, name, holder, epoch).await
    }

    async fn read_lease(&self, name: &'static str) -> Result<LeaseReading> {
        dispatch::read_lease(self, name).await
    }

    async fn claim_due(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        kind: NotificationType,
        lanes: ClaimLanes,
        claim_timeout: Duration,
    ) -> Result<Vec<ClaimedNotification>> {
        dispatch::claim_due(self, lease, epoch, kind, lanes, claim_timeout).await
    }

    async fn next_due_in(&self, kind: NotificationType) -> Result<Option<Duration>> {
        dispatch::next_due_in(self, kind).await
    }

    async fn claim_digest(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        kind: NotificationType,
        digest: NotificationId,
        claim_timeout: Duration,
    ) -> Result<Vec<ClaimedNotification>> {
        dispatch::claim_digest(self, lease, epoch, kind, digest, claim_timeout).await
    }

    async fn record_outcomes(
        &self,
        lease: &'static str,
        records: Vec<AttemptRecord>,
    ) -> Result<Vec<bool>> {
        dispatch::record_outcomes(self, lease, &records).await
    }

    async fn purge_terminal(
        &self,
        resolved_before: DateTime<Utc>,
        batch: u32,
    ) -> Result<PurgeReport> {
        admin::purge_terminal(self, resolved_before, batch).await
    }

    async fn forget_silent_nodes(&self, silent_for: Duration) -> Result<Vec<(SiteId, SiteId)>> {
        site_health::forget_silent(self, silent_for).await
    }
}

impl AdminStore for MsSqlStore {
    async fn state(&self, id: NotificationId) -> Result<Option<NotificationState>> {
        admin::state(self, id).await
    }

    async fn query(&self, page: PageRequest) -> Result<Page> {
        admin::query(self, &page).await
    }

    async fn detail(&self, id: NotificationId) -> Result<Option<NotificationDetail>> {
        admin::detail(self, id).await
    }

    async fn act_on_ids(
        &self,
        action: OperatorAction,
        ids: Vec<NotificationId>,
        actor: Actor,
    ) -> Result<Vec<ActionResult>> {
        admin::act_on_ids(self, action, &ids, &actor).await
    }

    async fn act_on_filter(
        &self,
        action: OperatorAction,
        filter: NotificationFilter,
        limit: usize,
        actor: Actor,
    ) -> Result<FilterActionReport> {
        admin::act_on_filter(self, action, &filter, limit, &actor).await
    }

    async fn count_on_filter(
        &self,
        filter: NotificationFilter,
        limit: usize,
    ) -> Result<FilterCount> {
        admin::count_on_filter(self, &filter, limit).await
    }

    async fn kpis(&self, params: KpiParams) -> Result<Kpis> {
        admin::kpis(self, &params).await
    }

    async fn site_health(&self) -> Result<SiteHealthSnapshot> {
        site_health::select(self).await
    }
}

impl ChannelSettingsStore for MsSqlStore {
    async fn lists(&self) -> Result<Vec<Stored<NotificationList>>> {
        channel::lists(self).await
    }

    async fn upsert_list(&self, list: NotificationList) -> Result<()> {
        channel::replace_list(self, &list).await?;
        ingest::note_list(
            self,
            list.name.as_str(),
            list.consolidation.is_some() || list.escalation.is_some(),
        );
        Ok(())
    }

    async fn delete_list(&self, name: &ListName) -> Result<bool> {
        let deleted = channel::delete_list(self, name).await?;
        ingest::note_list(self, name.as_str(), false);
        Ok(deleted)
    }

    async fn put_smtp_settings(&self, settings: SmtpSettings) -> Result<()> {
        channel::write_smtp_settings(self, &settings, sql::ChannelWrite::Replace)
            .await
            .map(drop)
    }

    async fn put_webhook_settings(&self, settings: WebhookSettings) -> Result<()> {
        channel::write_webhook_settings(self, &settings, sql::ChannelWrite::Replace)
            .await
            .map(drop)
    }

    async fn seed_smtp_settings(&self, settings: SmtpSettings) -> Result<bool> {
        channel::write_smtp_settings(self, &settings, sql::ChannelWrite::Seed).await
    }

    async fn seed_webhook_settings(&self, settings: WebhookSettings) -> Result<bool> {
        channel::write_webhook_settings(self, &settings, sql::ChannelWrite::Seed).await
    }

    async fn seed_list(&self, list: NotificationList) -> Result<bool> {
        let stored = channel::seed_list(self, &list).await?;
        if stored {
            ingest::note_list(
                self,
                list.name.as_str(),
                list.consolidation.is_some() || list.escalation.is_some(),
            );
        }
        Ok(stored)
    }

    async fn delete_smtp_settings(&self) -> Result<bool> {
        channel::delete_smtp_settings(self).await
    }

    async fn reseal_secrets(&self) -> Result<ResealReport> {
        channel::reseal_secrets(self).await
    }
}

/// Escalation (`escalation`): an alarm opens its incident in the submit procedure; the clock's
/// turn and the acknowledgements are decided in Rust and applied by guarded batches.
impl EscalationStore for MsSqlStore {
    async fn escalate_due(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        limit: u32,
    ) -> Result<EscalationTurn> {
        escalation::escalate_due(self, lease, epoch, limit).await
    }

    async fn acknowledge_incident(
        &self,
        id: IncidentId,
        ack: Acknowledgement,
    ) -> Result<AckResult> {
        escalation::acknowledge(self, id, &ack).await
    }

    async fn acknowledge_condition(
        &self,
        site: &SiteId,
        key: &ConditionKey,
        ack: Acknowledgement,
    ) -> Result<Vec<(IncidentId, AckResult)>> {
        escalation::acknowledge_condition(self, site.as_str(), key.as_str(), &ack).await
    }

    async fn incidents(&self, query: IncidentQuery) -> Result<IncidentList> {
        escalation::incidents(self, &query).await
    }

    async fn incident(&self, id: IncidentId) -> Result<Option<IncidentDetail>> {
        escalation::incident(self, id).await
    }
}

/// The site status feed (`site_status`): the trigger records the changes; these read and
/// forget them.
impl SiteStatusStore for MsSqlStore {
    async fn watch_site_status(&self, site: &SiteId) -> Result<()> {
        site_status::watch(self, site).await
    }

    async fn site_status_changes(
        &self,
        site: &SiteId,
        limit: u32,
    ) -> Result<Vec<SiteStatusChange>> {
        site_status::changes(self, site, limit).await
    }

    async fn forget_site_status_changes(&self, site: &SiteId, seqs: Vec<i64>) -> Result<()> {
        site_status::forget(self, site, &seqs).await
    }

    async fn site_status_heads(&self, after: i64) -> Result<(Vec<SiteId>, i64)> {
        site_status::heads(self, after).await
    }

    async fn purge_site_status(&self, keep: Duration, batch: u32) -> Result<SiteStatusPurge> {
        site_status::purge(self, keep, batch).await
    }
}

/// The status callbacks (`status_callback`): the trigger queues the changes; these hand them
/// out and record the calls.
impl super::StatusCallbackStore for MsSqlStore {
    async fn due_status_callbacks(&self, limit: u32) -> Result<StatusCallbackTurn> {
        status_callback::due(self, limit).await
    }

    async fn record_status_callback(&self, call: StatusCallbackCall) -> Result<()> {
        status_callback::record(self, &call).await
    }

    async fn status_callback_backlog(&self) -> Result<StatusCallbackBacklog> {
        status_callback::backlog(self).await
    }
}

/// Takes the `index`th result set of a batch; its absence means the statement and this code
/// disagree.
fn result_set(results: &mut [Vec<Row>], index: usize, context: &str) -> Result<Vec<Row>> {
    let count = results.len();
    results.get_mut(index).map(std::mem::take).ok_or_else(|| {
        StoreError::Corrupt(format!(
            "{context}: the batch returned {count} result sets, expected at least {}",
            index + 1
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Far longer than the retries take: reaching it means the open hung.
    const HANG: Duration = Duration::from_secs(60);

    fn options_for(port: u16) -> MsSqlOptions {
        let mut options = MsSqlOptions::parse(&format!(
            "mssql://outbox:secret@127.0.0.1:{port}/Outbox?connect_timeout=1s&command_timeout=1s"
        ))
        .unwrap();
        options.pool_max_size = 1;
        options
    }

    /// Nothing listens: the transient refusal is retried a few times, then open fails with an
    /// error (no panic, no hang).
    #[tokio::test]
    async fn open_fails_in_bounded_time_when_nothing_listens() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let err = tokio::time::timeout(HANG, MsSqlStore::open(options_for(port)))
            .await
            .expect("open must not hang")
            .unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
        assert!(err.to_string().contains("connect"), "{err}");
    }

    /// A peer that accepts the TCP connection and never answers the pre-login: the handshake
    /// timeout ends the wait.
    #[tokio::test]
    async fn a_silent_server_times_out_instead_of_hanging() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let err = tokio::time::timeout(HANG, MsSqlStore::open(options_for(port)))
            .await
            .expect("open must not hang")
            .unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
        hold.abort();
    }
}
