//! The embedded SQLite backend of [`OutboxStore`]: one file, WAL, `synchronous=FULL`, all writes
//! through a group-committing writer thread (so concurrent submits share an fsync) and reads on
//! separate read-only connections.
//!
//! SQLite serialises writers, so a claim (an `UPDATE ... WHERE Id IN (SELECT ... LIMIT n)`) is
//! atomic without row-lock hints; the lease and claim-epoch conditions in the statements are what
//! fence a deposed dispatcher. The database's clock is this process's clock.

mod migrate;

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use group_commit::{Database, Durability, Options};
use rusqlite::{Connection, OptionalExtension, Row, params};
use uuid::Uuid;

use super::{
    AttemptRecord, ClaimedNotification, InsertOutcome, LeaseEpoch, NewNotification,
    NotificationState, OutboxStore, Result, StoreError,
};
use crate::domain::channel::{
    EmailAddress, NotificationList, Secret, SmtpAuth, SmtpSettings, TlsMode,
};
use crate::domain::status::Status;
use crate::domain::{
    Body, ListName, NotificationContent, NotificationId, NotificationType, Subject, TypeData,
};

/// The channel key of the email settings row in `ChannelConfig`.
const EMAIL_CHANNEL: &str = "email";

/// Central store on a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    db: Database,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and applies pending migrations.
    pub fn open(path: &Path, durability: Durability) -> Result<Self> {
        let mut options = Options::new(path);
        options.durability = durability;
        let db = Database::open(&options, migrate::apply)?;
        Ok(Self { db })
    }
}

fn ms(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

fn at_ms(millis: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(millis).unwrap_or_default()
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

impl OutboxStore for SqliteStore {
    async fn submit(&self, batch: Vec<NewNotification>) -> Result<Vec<InsertOutcome>> {
        self.db
            .write(move |conn| insert_idempotently(conn, &batch, Utc::now()))
            .await
    }

    async fn state(&self, id: NotificationId) -> Result<Option<NotificationState>> {
        self.db.read(move |conn| select_state(conn, id)).await
    }

    async fn acquire_lease(
        &self,
        name: &'static str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<LeaseEpoch>> {
        let holder = holder.to_owned();
        self.db
            .write(move |conn| upsert_lease(conn, name, &holder, ttl, Utc::now()))
            .await
    }

    async fn claim_due(
        &self,
        lease: &'static str,
        epoch: LeaseEpoch,
        limit: usize,
        claim_timeout: Duration,
    ) -> Result<Vec<ClaimedNotification>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.db
            .write(move |conn| claim(conn, lease, epoch, limit, claim_timeout, Utc::now()))
            .await
    }

    async fn record_outcome(&self, lease: &'static str, record: AttemptRecord) -> Result<bool> {
        self.db
            .write(move |conn| apply_outcome(conn, lease, &record, Utc::now()))
            .await
    }

    async fn list(&self, name: &ListName) -> Result<Option<NotificationList>> {
        let name = name.clone();
        self.db.read(move |conn| select_list(conn, name)).await
    }

    async fn upsert_list(&self, list: NotificationList) -> Result<()> {
        self.db
            .write(move |conn| replace_list(conn, &list, Utc::now()))
            .await
    }

    async fn smtp_settings(&self) -> Result<Option<SmtpSettings>> {
        self.db.read(select_smtp_settings).await
    }

    async fn put_smtp_settings(&self, settings: SmtpSettings) -> Result<()> {
        self.db
            .write(move |conn| replace_smtp_settings(conn, &settings, Utc::now()))
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
    let mut insert = conn.prepare_cached(
        "INSERT INTO Notifications (
             NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status,
             SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId,
             OriginParentExecutionId, SiteEnqueuedAt, CreatedAt)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'Pending', ?8, ?9, ?10, ?11, ?12, ?13, ?14)
         ON CONFLICT (NotificationId) DO NOTHING",
    )?;
    let mut stored_hash =
        conn.prepare_cached("SELECT ContentHash FROM Notifications WHERE NotificationId = ?1")?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for new in batch {
        let s = &new.submission;
        let p = &s.provenance;
        let id = s.id.to_string();
        let inserted = insert.execute(params![
            id,
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
        ])?;
        let outcome = if inserted == 1 {
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

fn select_state(conn: &Connection, id: NotificationId) -> Result<Option<NotificationState>> {
    let mut stmt = conn.prepare_cached(
        "SELECT Status, Type, ListName, SourceSiteId, RetryCount, LastError, SiteEnqueuedAt,
                CreatedAt, LastAttemptAt, NextAttemptAt, DeliveredAt
         FROM Notifications WHERE NotificationId = ?1",
    )?;
    let row = stmt
        .query_row([id.to_string()], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, u32>(4)?,
                row.get::<_, Option<String>>(5)?,
                row.get::<_, i64>(6)?,
                row.get::<_, i64>(7)?,
                row.get::<_, Option<i64>>(8)?,
                row.get::<_, Option<i64>>(9)?,
                row.get::<_, Option<i64>>(10)?,
            ))
        })
        .optional()?;
    let Some((status, kind, list, site, retries, error, enqueued, created, last, next, delivered)) =
        row
    else {
        return Ok(None);
    };
    Ok(Some(NotificationState {
        id,
        status: Status::from_db(&status).ok_or_else(|| corrupt(format!("status {status:?}")))?,
        kind: NotificationType::from_db(&kind).ok_or_else(|| corrupt(format!("type {kind:?}")))?,
        list_name: list,
        source_site_id: site,
        retry_count: retries,
        last_error: error,
        site_enqueued_at: at_ms(enqueued),
        created_at: at_ms(created),
        last_attempt_at: last.map(at_ms),
        next_attempt_at: next.map(at_ms),
        delivered_at: delivered.map(at_ms),
    }))
}

/// Takes the lease if it is free, expired, or already ours; bumps the epoch unless we are
/// renewing a lease we still hold. Upsert expressions see the row's old values, so the CASE
/// compares against the previous holder.
fn upsert_lease(
    conn: &Connection,
    name: &str,
    holder: &str,
    ttl: Duration,
    now: DateTime<Utc>,
) -> Result<Option<LeaseEpoch>> {
    let now_ms = ms(now);
    let expires = now_ms.saturating_add(duration_ms(ttl));
    let mut stmt = conn.prepare_cached(
        "INSERT INTO Leases (Name, Holder, Epoch, ExpiresAt) VALUES (?1, ?2, 1, ?4)
         ON CONFLICT (Name) DO UPDATE SET
             Epoch = CASE WHEN Leases.Holder = excluded.Holder AND Leases.ExpiresAt > ?3
                          THEN Leases.Epoch ELSE Leases.Epoch + 1 END,
             Holder = excluded.Holder,
             ExpiresAt = excluded.ExpiresAt
         WHERE Leases.Holder = excluded.Holder OR Leases.ExpiresAt <= ?3
         RETURNING Epoch",
    )?;
    let epoch = stmt
        .query_row(params![name, holder, now_ms, expires], |row| row.get(0))
        .optional()?;
    Ok(epoch.map(LeaseEpoch))
}

/// Claims due rows under `epoch` (only while that epoch holds the lease) and writes their
/// InFlight attempt rows. A row whose stored content no longer passes validation cannot be
/// delivered: it is parked here with the reason rather than failing the whole claim.
fn claim(
    conn: &Connection,
    lease: &str,
    epoch: LeaseEpoch,
    limit: usize,
    claim_timeout: Duration,
    now: DateTime<Utc>,
) -> Result<Vec<ClaimedNotification>> {
    let now_ms = ms(now);
    let until = now_ms.saturating_add(duration_ms(claim_timeout));
    let mut stmt = conn.prepare_cached(
        "UPDATE Notifications
         SET ClaimedUntil = ?1, ClaimEpoch = ?2, LastAttemptAt = ?3,
             AttemptCount = AttemptCount + 1
         WHERE Id IN (
                 SELECT Id FROM Notifications
                 WHERE Status IN ('Pending', 'Retrying')
                   AND (NextAttemptAt IS NULL OR NextAttemptAt <= ?3)
                   AND (ClaimedUntil IS NULL OR ClaimedUntil <= ?3)
                 ORDER BY NextAttemptAt, Id
                 LIMIT ?4)
           AND EXISTS (SELECT 1 FROM Leases
                       WHERE Name = ?5 AND Epoch = ?2 AND ExpiresAt > ?3)
         RETURNING Id, NotificationId, Type, ListName, Subject, Body, TypeData, RetryCount,
                   AttemptCount",
    )?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = stmt
        .query_map(params![until, epoch.0, now_ms, limit, lease], |row| {
            Ok(ClaimedRow::read(row))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;

    let mut attempt = conn.prepare_cached(
        "INSERT INTO NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, LeaseEpoch)
         VALUES (?1, ?2, ?3, 'InFlight', ?4)",
    )?;
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        let row = row?;
        match row.decode(epoch) {
            Ok(notification) => {
                attempt.execute(params![
                    row.notification_id,
                    notification.attempt_no,
                    now_ms,
                    epoch.0
                ])?;
                claimed.push(notification);
            }
            Err(problem) => {
                tracing::error!(row_id = row.row_id, %problem, "parking undeliverable stored row");
                conn.execute(
                    "UPDATE Notifications
                     SET Status = 'Parked', LastError = ?2, ResolvedAt = ?3,
                         ClaimedUntil = NULL, ClaimEpoch = NULL
                     WHERE Id = ?1",
                    params![
                        row.row_id,
                        format!("stored row is invalid: {problem}"),
                        now_ms
                    ],
                )?;
            }
        }
    }
    Ok(claimed)
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
        })
    }

    fn decode(&self, epoch: LeaseEpoch) -> std::result::Result<ClaimedNotification, String> {
        let id = Uuid::try_parse(&self.notification_id).map_err(|e| e.to_string())?;
        let kind = NotificationType::from_db(&self.kind)
            .ok_or_else(|| format!("unknown type {:?}", self.kind))?;
        let content = NotificationContent {
            kind,
            list_name: ListName::parse(self.list_name.clone()).map_err(|e| e.to_string())?,
            subject: Subject::parse(self.subject.clone()).map_err(|e| e.to_string())?,
            body: Body::parse(self.body.clone()).map_err(|e| e.to_string())?,
            type_data: TypeData::parse(self.type_data.clone()).map_err(|e| e.to_string())?,
        };
        Ok(ClaimedNotification {
            row_id: self.row_id,
            id: NotificationId::from_uuid(id),
            content,
            retry_count: self.retry_count,
            attempt_no: self.attempt_no,
            epoch,
        })
    }
}

/// Applies an attempt's transition, fenced: only if the row is still claimed under the record's
/// epoch and that epoch still holds the lease. The attempt row is completed only when the
/// transition applied; otherwise it stays InFlight, marking a possible duplicate.
fn apply_outcome(
    conn: &Connection,
    lease: &str,
    record: &AttemptRecord,
    now: DateTime<Utc>,
) -> Result<bool> {
    let now_ms = ms(now);
    let t = &record.transition;
    let delivered_at = (t.status == Status::Delivered).then_some(now_ms);
    let mut update = conn.prepare_cached(
        "UPDATE Notifications
         SET Status = ?1, RetryCount = ?2, LastError = COALESCE(?3, LastError),
             NextAttemptAt = ?4, DeliveredAt = COALESCE(?5, DeliveredAt), ResolvedAt = ?6,
             ResolvedTargets = COALESCE(?7, ResolvedTargets),
             ClaimedUntil = NULL, ClaimEpoch = NULL
         WHERE Id = ?8 AND ClaimEpoch = ?9
           AND EXISTS (SELECT 1 FROM Leases
                       WHERE Name = ?10 AND Epoch = ?9 AND ExpiresAt > ?11)",
    )?;
    let changed = update.execute(params![
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
        now_ms,
    ])?;
    if changed == 0 {
        return Ok(false);
    }
    let mut attempt = conn.prepare_cached(
        "UPDATE NotificationAttempts SET Outcome = ?3, DurationMs = ?4, Error = ?5
         WHERE NotificationId = ?1 AND AttemptNo = ?2",
    )?;
    attempt.execute(params![
        record.id.to_string(),
        record.attempt_no,
        record.outcome.as_str(),
        duration_ms(record.duration),
        record.error,
    ])?;
    Ok(true)
}

fn select_list(conn: &Connection, name: ListName) -> Result<Option<NotificationList>> {
    let kind: Option<String> = conn
        .prepare_cached("SELECT Type FROM NotificationLists WHERE Name = ?1")?
        .query_row([name.as_str()], |row| row.get(0))
        .optional()?;
    let Some(kind) = kind else {
        return Ok(None);
    };
    let kind =
        NotificationType::from_db(&kind).ok_or_else(|| corrupt(format!("list type {kind:?}")))?;
    let mut stmt = conn.prepare_cached(
        "SELECT Address FROM NotificationListRecipients WHERE ListName = ?1 ORDER BY Address",
    )?;
    let recipients = stmt
        .query_map([name.as_str()], |row| row.get::<_, String>(0))?
        .map(|address| {
            let address = address?;
            EmailAddress::parse(&address, "recipients").map_err(corrupt)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(NotificationList {
        name,
        kind,
        recipients,
    }))
}

fn replace_list(conn: &Connection, list: &NotificationList, now: DateTime<Utc>) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO NotificationLists (Name, Type, UpdatedAt) VALUES (?1, ?2, ?3)
         ON CONFLICT (Name) DO UPDATE SET Type = excluded.Type, UpdatedAt = excluded.UpdatedAt",
    )?
    .execute(params![list.name.as_str(), list.kind.as_str(), ms(now)])?;
    conn.prepare_cached("DELETE FROM NotificationListRecipients WHERE ListName = ?1")?
        .execute([list.name.as_str()])?;
    let mut insert = conn.prepare_cached(
        "INSERT OR IGNORE INTO NotificationListRecipients (ListName, Address) VALUES (?1, ?2)",
    )?;
    for recipient in &list.recipients {
        insert.execute([list.name.as_str(), recipient.as_str()])?;
    }
    Ok(())
}

fn select_smtp_settings(conn: &Connection) -> Result<Option<SmtpSettings>> {
    let mut stmt = conn.prepare_cached(
        "SELECT Host, Port, TlsMode, Username, Password, FromAddress, MaxRetries, RetryDelayMs,
                MaxConcurrentConnections, TimeoutMs
         FROM ChannelConfig WHERE Channel = ?1",
    )?;
    let row = stmt
        .query_row([EMAIL_CHANNEL], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, u16>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, Option<String>>(4)?,
                row.get::<_, String>(5)?,
                row.get::<_, i64>(6)?,
                row.get::<_, i64>(7)?,
                row.get::<_, u32>(8)?,
                row.get::<_, i64>(9)?,
            ))
        })
        .optional()?;
    let Some((host, port, tls, user, password, from, retries, delay, conns, timeout)) = row else {
        return Ok(None);
    };
    let auth = match (user, password) {
        (Some(username), Some(password)) => SmtpAuth::Password {
            username,
            password: Secret::new(password),
        },
        _ => SmtpAuth::None,
    };
    let millis = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    Ok(Some(SmtpSettings {
        host,
        port,
        tls: TlsMode::parse(&tls).ok_or_else(|| corrupt(format!("TLS mode {tls:?}")))?,
        auth,
        from_address: EmailAddress::parse(&from, "from_address").map_err(corrupt)?,
        max_retries: retries,
        retry_delay: millis(delay),
        max_concurrent_connections: conns,
        timeout: millis(timeout),
    }))
}

fn replace_smtp_settings(conn: &Connection, s: &SmtpSettings, now: DateTime<Utc>) -> Result<()> {
    let (username, password) = match &s.auth {
        SmtpAuth::None => (None, None),
        SmtpAuth::Password { username, password } => {
            (Some(username.as_str()), Some(password.expose()))
        }
    };
    conn.prepare_cached(
        "INSERT INTO ChannelConfig (Channel, Host, Port, TlsMode, Username, Password, FromAddress,
             MaxRetries, RetryDelayMs, MaxConcurrentConnections, TimeoutMs, UpdatedAt)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT (Channel) DO UPDATE SET
             Host = excluded.Host, Port = excluded.Port, TlsMode = excluded.TlsMode,
             Username = excluded.Username, Password = excluded.Password,
             FromAddress = excluded.FromAddress, MaxRetries = excluded.MaxRetries,
             RetryDelayMs = excluded.RetryDelayMs,
             MaxConcurrentConnections = excluded.MaxConcurrentConnections,
             TimeoutMs = excluded.TimeoutMs, UpdatedAt = excluded.UpdatedAt",
    )?
    .execute(params![
        EMAIL_CHANNEL,
        s.host,
        s.port,
        s.tls.as_str(),
        username,
        password,
        s.from_address.as_str(),
        s.max_retries,
        duration_ms(s.retry_delay),
        s.max_concurrent_connections,
        duration_ms(s.timeout),
        ms(now),
    ])?;
    Ok(())
}
