//! The embedded SQLite backend of [`OutboxStore`](super::OutboxStore): one file, WAL,
//! `synchronous=FULL`, all writes through a group-committing writer thread (so concurrent
//! submits share an fsync) and reads on separate read-only connections.
//!
//! SQLite serialises writers, so a claim (an `UPDATE ... WHERE Id IN (SELECT ... LIMIT n)`) is
//! atomic without row-lock hints; the lease and claim-epoch conditions in the statements are what
//! fence a deposed dispatcher. The database's clock is this process's clock.
//!
//! Every fixed statement is one file under `sql/`, compiled in with `include_str!` where it runs;
//! those run per request are prepared once per connection (`prepare_cached`). A file's leading
//! comment, where it has one, says why the statement is written as it is. Only the operator's
//! filter queries, whose text depends on the filter (`admin::query`, which starts from
//! `query_states.sql`, `admin::act_on_filter` and `admin::count_on_filter`), are built in Rust
//! from `admin::push_filter`'s fragments. `statement_files` prepares every file against the
//! migrated schema and fails on a file nothing includes.

mod admin;
mod channel;
mod consolidate;
mod escalation;
mod migrate;
mod site_health;
mod site_status;
#[cfg(test)]
mod statement_files;
mod status_callback;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use group_commit::{Database, Durability, Options};
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::claimed::{StoredClaim, invalid_row_error};
use super::{
    AdminStore, ChannelSettingsStore, DispatchStore, EscalationStore, IngestStore,
    ReadChannelSettings, Result, SiteStatusStore, StatusCallbackStore, StoreError,
};
use crate::domain::channel::{NotificationList, SmtpSettings, Stored, WebhookSettings};
use crate::domain::consolidation::Consolidation;
use crate::domain::escalation::{AckResult, Acknowledgement, IncidentId, IncidentRef};
use crate::domain::history::{
    Actor, CLEARED_ENTRY, OperatorAction, SUPERSEDED_ENTRY, ending_entry, site_actor,
};
use crate::domain::kpi::{KpiParams, Kpis};
use crate::domain::query::{NotificationFilter, PageRequest};
use crate::domain::schedule;
use crate::domain::serve_order::{ClaimLanes, serve_turn};
use crate::domain::site_health::{SiteHealthReport, SiteHealthSnapshot, SiteHealthWrite};
use crate::domain::status::Status;
use crate::domain::{ConditionKey, ListName, NotificationId, NotificationType, SiteId, Submission};
use crate::records::{
    ActionResult, AttemptRecord, ClaimedNotification, EscalationTurn, FilterActionReport,
    FilterCount, IncidentDetail, IncidentList, IncidentQuery, InsertOutcome, LeaseEpoch,
    LeaseReading, LeaseRecord, NewNotification, NotificationDetail, NotificationState, Page,
    PurgeReport, SiteStatusChange, SiteStatusPurge, StatusCallbackBacklog, StatusCallbackCall,
    StatusCallbackTurn,
};
use crate::secrets::{Keyring, ResealReport};

/// The write connection's page cache: with a year of history (millions of terminal rows) the
/// table's indexes are deep, and SQLite's 2 MiB default let the pages every outcome and insert
/// touches fall out between commits, to be read again from the kernel (BENCHMARKS.md, "A year
/// of history"). 48 MiB holds the upper levels and the newest leaves of every index.
const WRITER_CACHE_BYTES: u64 = 48 * 1024 * 1024;
/// Each read connection's: a reader's cache is emptied whenever the writer commits, so it only
/// needs what one query reads.
const READER_CACHE_BYTES: u64 = 4 * 1024 * 1024;

/// Central store on a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    db: Database,
    /// Seals the secrets written and opens those read (see `channel`).
    secrets: Keyring,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and applies pending migrations.
    /// Secrets are sealed with a key that lasts as long as this process (`Keyring::ephemeral`),
    /// enough for tests and tools; the service sets its configured keys with
    /// [`Self::with_secrets`].
    pub fn open(path: &Path, durability: Durability) -> Result<Self> {
        let options = options(path, durability);
        let db = Database::open(&options, migrate::apply)?;
        Ok(Self {
            db,
            secrets: Keyring::ephemeral()?,
        })
    }

    /// Seals and opens secrets with `secrets` from now on.
    #[must_use]
    pub fn with_secrets(mut self, secrets: Keyring) -> Self {
        self.secrets = secrets;
        self
    }
}

/// The database's settings: durability as asked, the page caches above (with the four readers,
/// at most 64 MiB in all: docs/limits.md).
fn options(path: &Path, durability: Durability) -> Options {
    let mut options = Options::new(path);
    options.durability = durability;
    options.writer_cache_bytes = Some(WRITER_CACHE_BYTES);
    options.reader_cache_bytes = Some(READER_CACHE_BYTES);
    options
}

fn ms(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

/// A stored timestamp (Unix milliseconds). One outside chrono's range can only come from a
/// damaged or hand-edited file: an error naming the column, never a made-up date.
fn at_ms(column: &str, millis: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(millis)
        .ok_or_else(|| corrupt(format!("{column} = {millis} is not a valid timestamp")))
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

impl IngestStore for SqliteStore {
    async fn ping(&self) -> Result<()> {
        // Through the writer: a wedged writer thread or a read-only file fails the probe.
        self.db.write(|_| Ok(())).await
    }

    async fn submit(&self, batch: Vec<NewNotification>) -> Result<Vec<InsertOutcome>> {
        self.db
            .write(move |conn| insert_idempotently(conn, &batch, Utc::now()))
            .await
    }

    async fn clear_condition(
        &self,
        site: &SiteId,
        key: &ConditionKey,
        actor: Actor,
    ) -> Result<Vec<NotificationId>> {
        let (site, key) = (site.clone(), key.clone());
        self.db
            .write(move |conn| clear_condition(conn, &site, &key, &actor, Utc::now()))
            .await
    }

    async fn record_site_health(&self, report: SiteHealthReport) -> Result<SiteHealthWrite> {
        self.db
            .write(move |conn| site_health::record(conn, &report, Utc::now()))
            .await
    }
}

impl ReadChannelSettings for SqliteStore {
    async fn list(&self, name: &ListName) -> Result<Option<Stored<NotificationList>>> {
        let name = name.clone();
        let secrets = self.secrets.clone();
        self.db
            .read(move |conn| channel::select_list(conn, &name, &secrets))
            .await
    }

    async fn smtp_settings(&self) -> Result<Option<Stored<SmtpSettings>>> {
        let secrets = self.secrets.clone();
        self.db
            .read(move |conn| channel::select_smtp_settings(conn, &secrets))
            .await
    }

    async fn webhook_settings(&self) -> Result<Option<Stored<WebhookSettings>>> {
        self.db.read(channel::select_webhook_settings).await
    }
}

impl DispatchStore for SqliteStore {
    async fn acquire_lease(
        &self,
        name: &'static str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<LeaseEpoch>> {
        let holder = holder.to_owned();
        // Ahead of queued ingest, claims and purges: see group_commit's priority lane.
        self.db
            .write_first(move |conn| upsert_lease(conn, name, &holder, ttl, Utc::now()))
            .await
    }

    async fn release_lease(
        &self,
        name: &'static str,
        holder: &str,
        epoch: LeaseEpoch,
    ) -> Result<bool> {
        let holder = holder.to_owned();
        self.db
            .write_first(move |conn| {
                let released = conn
                    .prepare_cached(include_str!("sql/release_lease.sql"))?
                    .execute(params![name, holder, epoch.0, ms(Utc::now())])?;
                Ok(released > 0)
            })
            .await
    }

    async fn read_lease(&self, name: &'static str) -> Result<LeaseReading> {
        self.db
            .read(move |conn| select_lease(conn, name, Utc::now()))
            .await
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
        self.db
            .write(move |conn| claim(conn, lease, epoch, kind, lanes, claim_timeout, Utc::now()))
            .await
    }

    async fn next_due_in(&self, kind: NotificationType) -> Result<Option<Duration>> {
        self.db
            .read(move |conn| select_next_due_in(conn, kind, Utc::now()))
            .await
    }

    async fn claim_digest(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        kind: NotificationType,
        digest: NotificationId,
        claim_timeout: Duration,
    ) -> Result<Vec<ClaimedNotification>> {
        self.db
            .write(move |conn| {
                consolidate::claim_digest(
                    conn,
                    lease,
                    epoch,
                    kind,
                    digest,
                    claim_timeout,
                    Utc::now(),
                )
            })
            .await
    }

    async fn record_outcomes(
        &self,
        lease: &'static str,
        records: Vec<AttemptRecord>,
    ) -> Result<Vec<bool>> {
        self.db
            .write(move |conn| {
                records
                    .iter()
                    .map(|record| apply_outcome(conn, lease, record))
                    .collect()
            })
            .await
    }

    async fn purge_terminal(
        &self,
        resolved_before: DateTime<Utc>,
        batch: u32,
    ) -> Result<PurgeReport> {
        self.db
            .write(move |conn| admin::purge_terminal(conn, resolved_before, batch))
            .await
    }

    async fn forget_silent_nodes(&self, silent_for: Duration) -> Result<Vec<(SiteId, SiteId)>> {
        self.db
            .write(move |conn| site_health::forget_silent(conn, silent_for, Utc::now()))
            .await
    }
}

impl AdminStore for SqliteStore {
    async fn state(&self, id: NotificationId) -> Result<Option<NotificationState>> {
        self.db
            .read(move |conn| admin::select_state(conn, id))
            .await
    }

    async fn query(&self, page: PageRequest) -> Result<Page> {
        self.db.read(move |conn| admin::query(conn, &page)).await
    }

    async fn detail(&self, id: NotificationId) -> Result<Option<NotificationDetail>> {
        self.db.read(move |conn| admin::detail(conn, id)).await
    }

    async fn act_on_ids(
        &self,
        action: OperatorAction,
        ids: Vec<NotificationId>,
        actor: Actor,
    ) -> Result<Vec<ActionResult>> {
        self.db
            .write(move |conn| admin::act_on_ids(conn, action, &ids, &actor, Utc::now()))
            .await
    }

    async fn act_on_filter(
        &self,
        action: OperatorAction,
        filter: NotificationFilter,
        limit: usize,
        actor: Actor,
    ) -> Result<FilterActionReport> {
        self.db
            .write(move |conn| {
                admin::act_on_filter(conn, action, &filter, limit, &actor, Utc::now())
            })
            .await
    }

    async fn count_on_filter(
        &self,
        filter: NotificationFilter,
        limit: usize,
    ) -> Result<FilterCount> {
        self.db
            .read(move |conn| admin::count_on_filter(conn, &filter, limit))
            .await
    }

    async fn kpis(&self, params: KpiParams) -> Result<Kpis> {
        self.db.read(move |conn| admin::kpis(conn, &params)).await
    }

    async fn site_health(&self) -> Result<SiteHealthSnapshot> {
        self.db
            .read(|conn| site_health::select(conn, Utc::now()))
            .await
    }
}

impl SiteStatusStore for SqliteStore {
    async fn watch_site_status(&self, site: &SiteId) -> Result<()> {
        let site = site.clone();
        self.db
            .write(move |conn| site_status::watch(conn, &site, Utc::now()))
            .await
    }

    async fn site_status_changes(
        &self,
        site: &SiteId,
        limit: u32,
    ) -> Result<Vec<SiteStatusChange>> {
        let site = site.clone();
        self.db
            .read(move |conn| site_status::changes(conn, &site, limit))
            .await
    }

    async fn forget_site_status_changes(&self, site: &SiteId, seqs: Vec<i64>) -> Result<()> {
        let site = site.clone();
        self.db
            .write(move |conn| site_status::forget(conn, &site, &seqs))
            .await
    }

    async fn site_status_heads(&self, after: i64) -> Result<(Vec<SiteId>, i64)> {
        self.db
            .read(move |conn| site_status::heads(conn, after))
            .await
    }

    async fn purge_site_status(&self, keep: Duration, batch: u32) -> Result<SiteStatusPurge> {
        self.db
            .write(move |conn| site_status::purge(conn, keep, batch, Utc::now()))
            .await
    }
}

impl StatusCallbackStore for SqliteStore {
    async fn due_status_callbacks(&self, limit: u32) -> Result<StatusCallbackTurn> {
        self.db
            .read(move |conn| status_callback::due(conn, limit, Utc::now()))
            .await
    }

    async fn record_status_callback(&self, call: StatusCallbackCall) -> Result<()> {
        self.db
            .write(move |conn| status_callback::record(conn, &call))
            .await
    }

    async fn status_callback_backlog(&self) -> Result<StatusCallbackBacklog> {
        self.db.read(status_callback::backlog).await
    }
}

impl EscalationStore for SqliteStore {
    async fn escalate_due(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        limit: u32,
    ) -> Result<EscalationTurn> {
        self.db
            .write(move |conn| escalation::escalate_due(conn, lease, epoch, limit, Utc::now()))
            .await
    }

    async fn acknowledge_incident(
        &self,
        id: IncidentId,
        ack: Acknowledgement,
    ) -> Result<AckResult> {
        self.db
            .write(move |conn| escalation::acknowledge(conn, id, &ack, Utc::now()))
            .await
    }

    async fn acknowledge_condition(
        &self,
        site: &SiteId,
        key: &ConditionKey,
        ack: Acknowledgement,
    ) -> Result<Vec<(IncidentId, AckResult)>> {
        let (site, key) = (site.clone(), key.clone());
        self.db
            .write(move |conn| {
                escalation::acknowledge_condition(conn, &site, key.as_str(), &ack, Utc::now())
            })
            .await
    }

    async fn incidents(&self, query: IncidentQuery) -> Result<IncidentList> {
        self.db
            .read(move |conn| escalation::incidents(conn, &query))
            .await
    }

    async fn incident(&self, id: IncidentId) -> Result<Option<IncidentDetail>> {
        self.db
            .read(move |conn| escalation::incident(conn, id))
            .await
    }
}

impl ChannelSettingsStore for SqliteStore {
    async fn lists(&self) -> Result<Vec<Stored<NotificationList>>> {
        let secrets = self.secrets.clone();
        self.db
            .read(move |conn| channel::select_lists(conn, &secrets))
            .await
    }

    async fn upsert_list(&self, list: NotificationList) -> Result<()> {
        let secrets = self.secrets.clone();
        self.db
            .write(move |conn| channel::replace_list(conn, &list, &secrets, Utc::now()))
            .await
    }

    async fn delete_list(&self, name: &ListName) -> Result<bool> {
        let name = name.clone();
        self.db
            .write(move |conn| channel::delete_list(conn, &name))
            .await
    }

    async fn put_smtp_settings(&self, settings: SmtpSettings) -> Result<()> {
        let secrets = self.secrets.clone();
        self.db
            .write(move |conn| {
                channel::replace_smtp_settings(conn, &settings, &secrets, Utc::now())
            })
            .await
    }

    async fn delete_smtp_settings(&self) -> Result<bool> {
        self.db.write(channel::delete_smtp_settings).await
    }

    async fn put_webhook_settings(&self, settings: WebhookSettings) -> Result<()> {
        self.db
            .write(move |conn| channel::replace_webhook_settings(conn, &settings, Utc::now()))
            .await
    }

    async fn seed_smtp_settings(&self, settings: SmtpSettings) -> Result<bool> {
        let secrets = self.secrets.clone();
        self.db
            .write(move |conn| channel::seed_smtp_settings(conn, &settings, &secrets, Utc::now()))
            .await
    }

    async fn seed_webhook_settings(&self, settings: WebhookSettings) -> Result<bool> {
        self.db
            .write(move |conn| channel::seed_webhook_settings(conn, &settings, Utc::now()))
            .await
    }

    async fn seed_list(&self, list: NotificationList) -> Result<bool> {
        let secrets = self.secrets.clone();
        self.db
            .write(move |conn| channel::seed_list(conn, &list, &secrets, Utc::now()))
            .await
    }

    async fn reseal_secrets(&self) -> Result<ResealReport> {
        let secrets = self.secrets.clone();
        self.db
            .write(move |conn| channel::reseal_secrets(conn, &secrets))
            .await
    }
}

/// Inserts each row unless its id exists; an existing id is a duplicate when its stored content
/// hash matches and a conflict otherwise. `ON CONFLICT DO NOTHING` keeps the stored row untouched.
fn insert_idempotently(
    conn: &Connection,
    batch: &[NewNotification],
    now: DateTime<Utc>,
) -> Result<Vec<InsertOutcome>> {
    let mut stored_hash = conn.prepare_cached(include_str!("sql/select_content_hash.sql"))?;
    // Each list's consolidation settings and escalation policy, read once per batch.
    let mut consolidating: HashMap<&str, Option<Consolidation>> = HashMap::new();
    let mut policies = escalation::Policies::default();
    let mut outcomes = Vec::with_capacity(batch.len());
    for new in batch {
        let s = &new.submission;
        let p = &s.provenance;
        let id = s.id.to_string();
        let outcome = if insert_row(conn, new, now)? {
            // A row stored already ended (cleared at the site, or stale on arrival) neither
            // supersedes others nor counts towards its list's flood window, nor escalates.
            let ended_on_arrival = match (&s.cleared_at_site, &s.condition_key) {
                (Some(cleared_at), _) => {
                    // The history says who ended it and when: the site, before forwarding it.
                    let actor = site_actor(p.source_site_id.as_str());
                    let first = [(id.clone(), 1)];
                    record_endings(conn, &first, ms(*cleared_at), CLEARED_ENTRY, actor.as_str())?;
                    true
                }
                (None, Some(key)) => {
                    let stale = superseded_on_arrival(conn, &id, now)?;
                    if !stale {
                        supersede_older(conn, s, key, now)?;
                    }
                    stale
                }
                (None, None) => false,
            };
            // A scheduled row is delivered on its own when due: never held for a digest, and
            // no incident (domain::schedule, rule 2).
            if !ended_on_arrival && !schedule::is_scheduled(s.deliver_after, now) {
                let list = s.content.list_name.as_str();
                let rules = match consolidating.get(list) {
                    Some(rules) => *rules,
                    None => *consolidating
                        .entry(list)
                        .or_insert(consolidate::settings(conn, list)?),
                };
                if let Some(rules) = rules {
                    consolidate::count_and_hold(conn, s, rules, now)?;
                }
                if let Some(policy) = policies.of(conn, list)? {
                    escalation::open_or_join(conn, s, policy, now)?;
                }
            }
            InsertOutcome::Accepted
        } else {
            let hash: Vec<u8> = stored_hash.query_row([&id], |row| row.get(0))?;
            if hash == new.hash.0 {
                InsertOutcome::Duplicate
            } else {
                InsertOutcome::Conflict
            }
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// Inserts one notification with its serve turn (`serve_turn`) unless its id is stored;
/// returns whether it was inserted. What a submit stores, and an incident's page messages.
fn insert_row(conn: &Connection, new: &NewNotification, now: DateTime<Utc>) -> Result<bool> {
    let mut insert = conn.prepare_cached(include_str!("sql/insert_notification.sql"))?;
    // The two reads of `serve_turn`.
    let mut head_turn = conn.prepare_cached(include_str!("sql/select_head_turn.sql"))?;
    let mut site_turn = conn.prepare_cached(include_str!("sql/select_site_turn.sql"))?;
    let s = &new.submission;
    let p = &s.provenance;
    let rank = s.priority.rank();
    let head: Option<i64> =
        head_turn.query_row(params![s.content.kind.as_str(), rank], |row| row.get(0))?;
    let site_last: Option<i64> = site_turn.query_row(
        params![s.content.kind.as_str(), rank, p.source_site_id.as_str()],
        |row| row.get(0),
    )?;
    let inserted = insert.execute(params![
        s.id.to_string(),
        s.content.kind.as_str(),
        s.content.list_name.as_str(),
        s.content.subject.as_str(),
        s.content.body.as_str(),
        s.content.type_data.as_str(),
        &new.hash.0[..],
        p.source_site_id.as_str(),
        p.source_instance_id,
        p.source_script,
        p.origin_execution_id.map(|u| u.to_string()),
        p.origin_parent_execution_id.map(|u| u.to_string()),
        ms(p.site_enqueued_at),
        ms(now),
        rank,
        serve_turn(head, site_last),
        s.condition_key.as_ref().map(|k| k.as_str()),
        if s.cleared_at_site.is_some() {
            Status::Cleared
        } else {
            Status::Pending
        }
        .as_str(),
        s.cleared_at_site.map(|_| ms(now)),
        s.deliver_after.map(ms),
    ])?;
    Ok(inserted == 1)
}

/// Stores the keyed row `id`, just inserted, as Superseded when its site, key and list already
/// have a row enqueued at the site after it (in any status): the latest state wins by the site's
/// time, whatever order the rows arrive in. Its history entry names the newest such row.
fn superseded_on_arrival(conn: &Connection, id: &str, now: DateTime<Utc>) -> Result<bool> {
    let now_ms = ms(now);
    let key: Option<(String, String, String, i64)> = conn
        .prepare_cached(include_str!("sql/supersede_on_arrival.sql"))?
        .query_row(params![id, now_ms], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })
        .optional()?;
    let Some((site, key, list, enqueued)) = key else {
        return Ok(false);
    };
    let newer: String = conn
        .prepare_cached(include_str!("sql/select_newest_of_key.sql"))?
        .query_row(params![site, key, list, enqueued], |row| row.get(0))?;
    record_endings(
        conn,
        &[(id.to_owned(), 1)],
        now_ms,
        SUPERSEDED_ENTRY,
        &newer,
    )?;
    Ok(true)
}

/// Ends the waiting rows that `newer` (just stored, with condition key `key`) supersedes: the
/// unclaimed Pending/Retrying/Held rows of its site, list and key enqueued at the site no later
/// than it. Each gets a history entry naming `newer`. The claimed ones (being delivered) are
/// marked instead: they end Superseded when their attempt does not deliver them.
fn supersede_older(
    conn: &Connection,
    newer: &Submission,
    key: &ConditionKey,
    now: DateTime<Utc>,
) -> Result<()> {
    let now_ms = ms(now);
    let newer_id = newer.id.to_string();
    let ended = conn
        .prepare_cached(include_str!("sql/supersede_older.sql"))?
        .query_map(
            params![
                now_ms,
                newer.provenance.source_site_id.as_str(),
                key.as_str(),
                newer.content.list_name.as_str(),
                ms(newer.provenance.site_enqueued_at),
                newer_id,
            ],
            |row| Ok((row.get::<_, String>(0)?, row.get::<_, u32>(1)?)),
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    conn.prepare_cached(include_str!("sql/mark_in_flight_superseded.sql"))?
        .execute(params![
            now_ms,
            newer.provenance.source_site_id.as_str(),
            key.as_str(),
            newer.content.list_name.as_str(),
            ms(newer.provenance.site_enqueued_at),
            newer_id,
        ])?;
    record_endings(conn, &ended, now_ms, SUPERSEDED_ENTRY, &newer_id)
}

/// Writes the history entry of each row a supersede or clear ended: `(id, sequence)` as the
/// ending UPDATE returned them, `entry` the stored name, `by` the Actor column (who or what
/// ended it).
fn record_endings(
    conn: &Connection,
    ended: &[(String, u32)],
    at_ms: i64,
    entry: &str,
    by: &str,
) -> Result<()> {
    let mut insert = conn.prepare_cached(include_str!("sql/insert_history_entry.sql"))?;
    for (id, sequence) in ended {
        insert.execute(params![id, sequence, at_ms, entry, by])?;
    }
    Ok(())
}

/// Ends the waiting rows of `site` with condition key `key` as Cleared (see
/// `IngestStore::clear_condition`); returns their ids.
fn clear_condition(
    conn: &Connection,
    site: &SiteId,
    key: &ConditionKey,
    actor: &Actor,
    now: DateTime<Utc>,
) -> Result<Vec<NotificationId>> {
    let now_ms = ms(now);
    let ended = conn
        .prepare_cached(include_str!("sql/clear_condition.sql"))?
        .query_map(params![now_ms, site.as_str(), key.as_str()], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, u32>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    record_endings(conn, &ended, now_ms, CLEARED_ENTRY, actor.as_str())?;
    conn.prepare_cached(include_str!("sql/mark_in_flight_cleared.sql"))?
        .execute(params![now_ms, site.as_str(), key.as_str(), actor.as_str()])?;
    escalation::end_for_clear(conn, site, key.as_str(), actor, now)?;
    ended
        .iter()
        .map(|(id, _)| {
            NotificationId::parse(id, "NotificationId")
                .map_err(|e| StoreError::Corrupt(e.to_string()))
        })
        .collect()
}

/// How long after `now` the earliest waiting row of `kind` not due yet comes due (see
/// `DispatchStore::next_due_in`). Counted from `now` cut to the stored milliseconds, so a
/// sleep of that long ends at or after the due time, never before it.
fn select_next_due_in(
    conn: &Connection,
    kind: NotificationType,
    now: DateTime<Utc>,
) -> Result<Option<Duration>> {
    let now_ms = ms(now);
    let next: Option<i64> = conn
        .prepare_cached(include_str!("sql/select_next_due.sql"))?
        .query_row(params![kind.as_str(), now_ms], |row| row.get(0))?;
    Ok(next.map(|due| Duration::from_millis(u64::try_from(due - now_ms).unwrap_or(0))))
}

/// Takes the lease if it is free, expired, or already ours; bumps the epoch only when the
/// holder changes. A holder re-taking its own lapsed lease keeps the epoch: nobody else held it
/// in between, so its claims and outcomes under that epoch are still its own.
fn upsert_lease(
    conn: &Connection,
    name: &str,
    holder: &str,
    ttl: Duration,
    now: DateTime<Utc>,
) -> Result<Option<LeaseEpoch>> {
    let now_ms = ms(now);
    let expires = now_ms.saturating_add(duration_ms(ttl));
    let mut stmt = conn.prepare_cached(include_str!("sql/acquire_lease.sql"))?;
    let epoch = stmt
        .query_row(params![name, holder, now_ms, expires], |row| row.get(0))
        .optional()?;
    Ok(epoch.map(LeaseEpoch))
}

/// The lease `name` as stored, read at `now` (this process's clock is the database's here).
fn select_lease(conn: &Connection, name: &str, now: DateTime<Utc>) -> Result<LeaseReading> {
    let row = conn
        .prepare_cached(include_str!("sql/select_lease.sql"))?
        .query_row(params![name], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })
        .optional()?;
    let record = match row {
        Some((holder, epoch, expires)) => Some(LeaseRecord {
            holder,
            epoch: LeaseEpoch(epoch),
            expires_at: at_ms("Leases.ExpiresAt", expires)?,
        }),
        None => None,
    };
    Ok(LeaseReading {
        read_at: now,
        record,
    })
}

/// Claims due rows under `epoch` (only while that epoch holds the lease) and writes their
/// InFlight attempt rows: the longest-waiting share first, then the rest in turn (see
/// `DispatchStore::claim_due`). A row whose stored content no longer passes validation cannot
/// be delivered: it is parked here with the reason rather than failing the whole claim.
fn claim(
    conn: &Connection,
    lease: &str,
    epoch: LeaseEpoch,
    kind: NotificationType,
    lanes: ClaimLanes,
    claim_timeout: Duration,
    now: DateTime<Utc>,
) -> Result<Vec<ClaimedNotification>> {
    let now_ms = ms(now);
    settle_pending_ends(conn, now_ms)?;
    let until = now_ms.saturating_add(duration_ms(claim_timeout));
    let mut rows = Vec::with_capacity(lanes.total());
    for (sql, limit, in_turn) in [
        // Two fixed texts, one per order of `domain::serve_order`, so the statement cache
        // finds each.
        (
            include_str!("sql/claim_longest_waiting.sql"),
            lanes.longest_waiting,
            false,
        ),
        (include_str!("sql/claim_in_turn.sql"), lanes.in_turn, true),
    ] {
        if limit == 0 {
            continue;
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut lane = conn
            .prepare_cached(sql)?
            .query_map(
                params![until, epoch.0, now_ms, limit, lease, kind.as_str()],
                ClaimedRow::read,
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        // RETURNING gives rows in no particular order: put them back in the lane's.
        if in_turn {
            lane.sort_by_key(|r| (r.priority, r.serve_turn, r.row_id));
        } else {
            lane.sort_by_key(|r| (r.due_ms, r.row_id));
        }
        rows.extend(lane);
    }
    stamp_claims(conn, rows, epoch, now_ms, None)
}

/// Ends the rows superseded or cleared while claimed whose claim expired without an outcome (see
/// `settle_pending_ends.sql`), each with its history entry, so that no claim delivers them again.
pub(super) fn settle_pending_ends(conn: &Connection, now_ms: i64) -> Result<()> {
    let ended = conn
        .prepare_cached(include_str!("sql/settle_pending_ends.sql"))?
        .query_map([now_ms], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, u32>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, Option<String>>(3)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for (id, sequence, ending, by) in ended {
        let entry = ending_entry(&ending)
            .ok_or_else(|| corrupt(format!("Notifications.PendingEnd = {ending:?}")))?;
        record_endings(
            conn,
            &[(id, sequence)],
            now_ms,
            entry,
            by.as_deref().unwrap_or_default(),
        )?;
    }
    Ok(())
}

/// Writes the InFlight attempt row of each claimed row (naming `digest`, for the rows of one)
/// and re-validates its content: a row that no longer passes is parked here with the reason
/// rather than failing the whole claim.
fn stamp_claims(
    conn: &Connection,
    rows: Vec<ClaimedRow>,
    epoch: LeaseEpoch,
    now_ms: i64,
    digest: Option<NotificationId>,
) -> Result<Vec<ClaimedNotification>> {
    let digest = digest.map(|d| d.to_string());
    let mut attempt = conn.prepare_cached(include_str!("sql/insert_in_flight_attempt.sql"))?;
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        attempt.execute(params![
            row.notification_id,
            row.attempt_no,
            now_ms,
            epoch.0,
            digest
        ])?;
        match row.decode(epoch) {
            Ok(notification) => claimed.push(notification),
            Err(problem) => park_invalid(conn, &row, &problem, now_ms)?,
        }
    }
    Ok(claimed)
}

/// Parks a claimed row whose stored content no longer validates, and completes its attempt row
/// with the reason (see `store::claimed`).
fn park_invalid(conn: &Connection, row: &ClaimedRow, problem: &str, now_ms: i64) -> Result<()> {
    tracing::error!(row_id = row.row_id, %problem, "parking undeliverable stored row");
    let error = invalid_row_error(problem);
    conn.prepare_cached(include_str!("sql/park_invalid.sql"))?
        .execute(params![row.row_id, error, now_ms])?;
    conn.prepare_cached(include_str!("sql/park_invalid_attempt.sql"))?
        .execute(params![row.notification_id, row.attempt_no, error])?;
    Ok(())
}

/// A claimed row as stored, before its content is re-validated.
struct ClaimedRow {
    row_id: i64,
    notification_id: String,
    kind: String,
    list_name: String,
    subject: String,
    body: String,
    type_data: String,
    retry_count: u32,
    attempt_no: u32,
    source_site_id: String,
    source_instance_id: String,
    source_script: String,
    origin_execution_id: Option<String>,
    origin_parent_execution_id: Option<String>,
    site_enqueued_at: i64,
    priority: i64,
    serve_turn: i64,
    /// NextAttemptAt, 0 when NULL: the longest-waiting order.
    due_ms: i64,
    /// The incident it belongs to and its page there (`escalation`), if any.
    incident: Option<i64>,
    incident_page: Option<u32>,
}

impl ClaimedRow {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            row_id: row.get(0)?,
            notification_id: row.get(1)?,
            kind: row.get(2)?,
            list_name: row.get(3)?,
            subject: row.get(4)?,
            body: row.get(5)?,
            type_data: row.get(6)?,
            retry_count: row.get(7)?,
            attempt_no: row.get(8)?,
            source_site_id: row.get(9)?,
            source_instance_id: row.get(10)?,
            source_script: row.get(11)?,
            origin_execution_id: row.get(12)?,
            origin_parent_execution_id: row.get(13)?,
            site_enqueued_at: row.get(14)?,
            priority: row.get(15)?,
            serve_turn: row.get(16)?,
            due_ms: row.get(17)?,
            incident: row.get(18)?,
            incident_page: row.get(19)?,
        })
    }

    fn decode(&self, epoch: LeaseEpoch) -> std::result::Result<ClaimedNotification, String> {
        let id = NotificationId::parse(&self.notification_id, "NotificationId")
            .map_err(|e| e.to_string())?;
        StoredClaim {
            row_id: self.row_id,
            id,
            kind: self.kind.clone(),
            list_name: self.list_name.clone(),
            subject: self.subject.clone(),
            body: self.body.clone(),
            type_data: self.type_data.clone(),
            retry_count: self.retry_count,
            attempt_no: self.attempt_no,
            source_site_id: self.source_site_id.clone(),
            source_instance_id: self.source_instance_id.clone(),
            source_script: self.source_script.clone(),
            origin_execution_id: self.origin_execution_id.clone(),
            origin_parent_execution_id: self.origin_parent_execution_id.clone(),
            site_enqueued_at: DateTime::from_timestamp_millis(self.site_enqueued_at),
            priority: self.priority,
            incident: self.incident.map(|id| IncidentRef {
                id: IncidentId(id),
                page_no: self.incident_page,
            }),
        }
        .validate(epoch)
    }
}

/// Applies an attempt's transition, fenced: only if the row is still claimed by this attempt
/// (the record's epoch and attempt number) and no other node has taken the lease since (the
/// lease is still at that epoch, even if it has lapsed: then nobody can have claimed the row
/// again). The attempt row is completed only when the transition applied; otherwise it stays
/// InFlight, marking a possible duplicate.
fn apply_outcome(conn: &Connection, lease: &str, record: &AttemptRecord) -> Result<bool> {
    let t = &record.transition;
    let delivered_at = t.delivered_at().map(ms);
    let now_ms = ms(Utc::now());
    let mut update = conn.prepare_cached(include_str!("sql/record_outcome.sql"))?;
    let applied = update
        .query_row(
            params![
                t.status.as_str(),
                t.retry_count,
                t.last_error,
                t.next_attempt_at.map(ms),
                delivered_at,
                t.resolved_at.map(ms),
                t.resolved_targets,
                record.row_id,
                record.epoch.0,
                lease,
                record.attempt_no,
                now_ms,
            ],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, u32>(1)?,
                    row.get::<_, Option<String>>(2)?,
                ))
            },
        )
        .optional()?;
    let Some((status, sequence, ended_by)) = applied else {
        return Ok(false);
    };
    // Superseded, cleared or stopped by its incident while this attempt was under way, and
    // not delivered by it: its ending follows the attempt in its history.
    if status != t.status.as_str()
        && let Some(entry) = ending_entry(&status)
    {
        let id = record.id.to_string();
        let by = ended_by.unwrap_or_default();
        record_endings(conn, &[(id, sequence)], now_ms, entry, &by)?;
    }
    if status == Status::Parked.as_str() {
        escalation::parked(conn, record.row_id, record.id, now_ms)?;
    }
    let mut attempt = conn.prepare_cached(include_str!("sql/complete_attempt.sql"))?;
    attempt.execute(params![
        record.id.to_string(),
        record.attempt_no,
        record.outcome.as_str(),
        duration_ms(record.duration),
        record.error,
        record.provider,
    ])?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound docs/limits.md states for central's SQLite page caches.
    #[test]
    fn the_page_caches_take_at_most_64_mib() {
        let options = options(Path::new("central.db"), Durability::Full);
        assert_eq!(options.page_cache_bound(), 64 * 1024 * 1024);
    }
}
