//! The rows of `buffered` and `rejected`: how a notification is written, read back (every
//! content rule checked again) and moved aside, and the seqs AUTOINCREMENT hands out. Every
//! capability that touches a row goes through these functions, inside the job it runs on the
//! writer or a reader.
//!
//! Invariants:
//! - `seq` is AUTOINCREMENT, so it is never reused even after the newest row is deleted. The
//!   forwarder's cursor depends on that: without it, a row enqueued after the buffer drained could
//!   get the seq of an already-sent row and be skipped.
//! - A row read back that no longer passes the content rules is reported with its problem,
//!   never dropped and never fatal ([`Page::unreadable`]).

use chrono::DateTime;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::error::Result;
use crate::domain::{
    Body, BufferedNotification, ConditionKey, ContentError, ListName, NotificationContent,
    NotificationId, NotificationType, Priority, Seq, SiteId, Subject, TypeData,
};

/// Column list shared by the SELECTs that decode a row with [`decode_row`], and by
/// [`move_to_rejected`], which copies these columns from `buffered` to `rejected`.
pub(super) const ROW_COLUMNS: &str = "seq, notification_id, type, list_name, subject, body, type_data, \
     source_site_id, source_instance_id, source_script, origin_execution_id, \
     origin_parent_execution_id, enqueued_at, priority, condition_key, cleared_at, deliver_after";

/// A batch of buffered rows, oldest first, as read for forwarding.
#[derive(Debug, Default)]
pub(crate) struct Page {
    pub rows: Vec<(Seq, BufferedNotification)>,
    /// Rows that no longer pass the content rules (written by an older binary with looser rules,
    /// or edited by hand): `(seq, notification_id as stored, problem)`. They can never be
    /// forwarded, so the forwarder moves them to `rejected` instead of letting them block.
    pub unreadable: Vec<(Seq, String, String)>,
}

impl Page {
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.unreadable.is_empty()
    }

    /// The highest seq in the page (readable or not), where the next read continues from.
    pub(crate) fn last_seq(&self) -> Option<Seq> {
        let rows = self.rows.iter().map(|(seq, _)| *seq);
        let unreadable = self.unreadable.iter().map(|(seq, _, _)| *seq);
        rows.chain(unreadable).max()
    }

    /// Adds the row at `seq`, selected with [`ROW_COLUMNS`]: rebuilt, or set aside with the
    /// rule it breaks.
    fn push_row(&mut self, seq: Seq, row: &rusqlite::Row<'_>) -> rusqlite::Result<()> {
        match decode_row(row)? {
            Ok(n) => self.rows.push((seq, n)),
            Err(problem) => {
                let id: String = row.get(1)?;
                self.unreadable.push((seq, id, problem.to_string()));
            }
        }
        Ok(())
    }
}

/// The newest seq ever handed out: AUTOINCREMENT keeps it in `sqlite_sequence` even after the
/// row is gone (and raises it when a replica inserts a higher explicit seq).
pub(super) fn select_head(conn: &Connection) -> Result<Seq, group_commit::Error> {
    let head: Option<i64> = conn
        .query_row(
            "SELECT seq FROM sqlite_sequence WHERE name = 'buffered'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(Seq(head.unwrap_or(0)))
}

/// Makes AUTOINCREMENT hand out seqs above `seq` from now on (it never goes back).
pub(super) fn raise_head(conn: &Connection, seq: Seq) -> Result<()> {
    if seq <= Seq::START {
        return Ok(());
    }
    let raised = conn
        .prepare_cached("UPDATE sqlite_sequence SET seq = max(seq, ?1) WHERE name = 'buffered'")?
        .execute([seq.0])?;
    if raised == 0 {
        // No row was ever inserted into `buffered`: SQLite has no entry for it yet.
        conn.prepare_cached("INSERT INTO sqlite_sequence (name, seq) VALUES ('buffered', ?1)")?
            .execute([seq.0])?;
    }
    Ok(())
}

pub(super) fn insert_buffered(conn: &Connection, n: &BufferedNotification) -> Result<Seq> {
    insert_row(conn, Insert::New, n)?;
    Ok(Seq(conn.last_insert_rowid()))
}

/// How [`insert_row`] places a row.
#[derive(Debug, Clone, Copy)]
pub(super) enum Insert {
    /// A fresh row with the next seq (a Send).
    New,
    /// A fresh row with the next seq unless the notification is already buffered (an adopted
    /// row); the caller learns which from the changed-row count.
    NewUnlessHeld,
    /// A copy of the active's row at its seq there, unless that seq or that notification is
    /// held already (the caller then replaces it).
    ReplicaUnlessHeld(Seq),
    /// A copy of the active's row at its seq there, replacing whatever held that seq or that
    /// notification (a standby applying a batch).
    Replica(Seq),
}

/// The columns [`insert_row`] binds as `?1` to `?16`, and the seq as `?17` for a replica.
macro_rules! insert_sql {
    ($verb:literal $(, $seq_column:literal, $seq_value:literal)? $(; $tail:literal)?) => {
        concat!(
            $verb,
            " INTO buffered (notification_id, type, list_name, subject, body, type_data, \
             source_site_id, source_instance_id, source_script, origin_execution_id, \
             origin_parent_execution_id, enqueued_at, priority, condition_key, cleared_at, \
             deliver_after",
            $($seq_column,)?
            ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16",
            $($seq_value,)? ")",
            $($tail)?
        )
    };
}

/// Inserts one row; returns how many rows changed (0 when an `...UnlessHeld` insert skipped it).
pub(super) fn insert_row(
    conn: &Connection,
    how: Insert,
    n: &BufferedNotification,
) -> Result<usize> {
    // Fixed texts, so the statement cache finds them without building a string per row.
    let (sql, seq) = match how {
        Insert::New => (insert_sql!("INSERT"), None),
        Insert::NewUnlessHeld => (insert_sql!("INSERT OR IGNORE"), None),
        Insert::ReplicaUnlessHeld(seq) => (
            insert_sql!("INSERT", ", seq", ", ?17"; " ON CONFLICT DO NOTHING"),
            Some(seq.0),
        ),
        Insert::Replica(seq) => (
            insert_sql!("INSERT OR REPLACE", ", seq", ", ?17"),
            Some(seq.0),
        ),
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let p = &n.provenance;
    let mut id = uuid::Uuid::encode_buffer();
    let mut origin = uuid::Uuid::encode_buffer();
    let mut parent = uuid::Uuid::encode_buffer();
    stmt.raw_bind_parameter(1, &*n.id.as_uuid().hyphenated().encode_lower(&mut id))?;
    stmt.raw_bind_parameter(2, n.content.kind.as_str())?;
    stmt.raw_bind_parameter(3, n.content.list_name.as_str())?;
    stmt.raw_bind_parameter(4, n.content.subject.as_str())?;
    stmt.raw_bind_parameter(5, n.content.body.as_str())?;
    stmt.raw_bind_parameter(6, n.content.type_data.as_str())?;
    stmt.raw_bind_parameter(7, p.source_site_id.as_str())?;
    stmt.raw_bind_parameter(8, p.source_instance_id.as_str())?;
    stmt.raw_bind_parameter(9, p.source_script.as_str())?;
    stmt.raw_bind_parameter(
        10,
        p.origin_execution_id
            .as_ref()
            .map(|u| &*u.hyphenated().encode_lower(&mut origin)),
    )?;
    stmt.raw_bind_parameter(
        11,
        p.origin_parent_execution_id
            .as_ref()
            .map(|u| &*u.hyphenated().encode_lower(&mut parent)),
    )?;
    stmt.raw_bind_parameter(12, p.site_enqueued_at.timestamp_millis())?;
    stmt.raw_bind_parameter(13, n.priority.rank())?;
    stmt.raw_bind_parameter(14, n.condition_key.as_ref().map(ConditionKey::as_str))?;
    stmt.raw_bind_parameter(15, n.cleared_at_site.map(|at| at.timestamp_millis()))?;
    stmt.raw_bind_parameter(16, n.deliver_after.map(|at| at.timestamp_millis()))?;
    if let Some(seq) = seq {
        stmt.raw_bind_parameter(17, seq)?;
    }
    Ok(stmt.raw_execute()?)
}

pub(super) fn select_after(conn: &Connection, after: Seq, limit: i64) -> Result<Page> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ROW_COLUMNS} FROM buffered WHERE seq > ?1 ORDER BY seq LIMIT ?2"
    ))?;
    let mut rows = stmt.query(params![after.0, limit])?;
    let mut page = Page::default();
    while let Some(row) = rows.next()? {
        page.push_row(Seq(row.get(0)?), row)?;
    }
    Ok(page)
}

/// Rebuilds a notification from a row selected with [`ROW_COLUMNS`], re-checking every content
/// rule. The outer error is SQLite's, the inner one names the column that broke a rule.
pub(super) fn decode_row(
    row: &Row<'_>,
) -> rusqlite::Result<Result<BufferedNotification, ContentError>> {
    let id: String = row.get(1)?;
    let kind: String = row.get(2)?;
    let list_name: String = row.get(3)?;
    let subject: String = row.get(4)?;
    let body: String = row.get(5)?;
    let type_data: String = row.get(6)?;
    let site: String = row.get(7)?;
    let source_instance_id: String = row.get(8)?;
    let source_script: String = row.get(9)?;
    let origin: Option<String> = row.get(10)?;
    let parent: Option<String> = row.get(11)?;
    let enqueued_ms: i64 = row.get(12)?;
    let rank: i64 = row.get(13)?;
    let condition_key: Option<String> = row.get(14)?;
    let cleared_ms: Option<i64> = row.get(15)?;
    let deliver_after_ms: Option<i64> = row.get(16)?;
    Ok((|| {
        let kind = NotificationType::from_db(&kind)
            .ok_or_else(|| ContentError::new("type", format!("{kind:?} is not a known type")))?;
        let priority = Priority::from_rank(rank).ok_or_else(|| {
            ContentError::new("priority", format!("rank {rank} is not a known priority"))
        })?;
        let site_enqueued_at = DateTime::from_timestamp_millis(enqueued_ms)
            .ok_or_else(|| ContentError::new("site_enqueued_at", "is out of range"))?;
        let at = |column: &'static str, ms: Option<i64>| {
            ms.map(|ms| {
                DateTime::from_timestamp_millis(ms)
                    .ok_or_else(|| ContentError::new(column, "is out of range"))
            })
            .transpose()
        };
        let cleared_at_site = at("cleared_at", cleared_ms)?;
        // The rule the Send checked, again: a row from a hand edit or a looser binary that
        // breaks it is set aside with the reason, as for any other field.
        let deliver_after = outbox_domain::schedule::deliver_after(
            at("deliver_after", deliver_after_ms)?,
            site_enqueued_at,
        )?;
        let origin = crate::domain::ScriptOrigin::parse(
            source_instance_id,
            source_script,
            origin.as_deref(),
            parent.as_deref(),
        )?;
        Ok(BufferedNotification {
            id: NotificationId::parse(&id, "notification_id")?,
            content: NotificationContent {
                kind,
                list_name: ListName::parse(list_name)?,
                subject: Subject::parse(subject)?,
                body: Body::parse(body)?,
                type_data: TypeData::parse(type_data)?,
            },
            provenance: origin.at_site(SiteId::parse(site)?, site_enqueued_at),
            priority,
            condition_key: condition_key
                .map(|key| ConditionKey::parse(key, "condition_key"))
                .transpose()?,
            cleared_at_site,
            deliver_after,
        })
    })())
}

/// Copies the row to `rejected` and deletes it; 0 if it is no longer buffered.
pub(super) fn move_to_rejected(
    conn: &Connection,
    seq: Seq,
    reason: &str,
    now_ms: i64,
) -> Result<usize> {
    let mut copy = conn.prepare_cached(&format!(
        "INSERT OR REPLACE INTO rejected ({ROW_COLUMNS}, reason, rejected_at)
         SELECT {ROW_COLUMNS}, ?2, ?3 FROM buffered WHERE seq = ?1"
    ))?;
    let copied = copy.execute(params![seq.0, reason, now_ms])?;
    if copied == 0 {
        return Ok(0);
    }
    delete_buffered(conn, seq)
}

pub(super) fn delete_buffered(conn: &Connection, seq: Seq) -> Result<usize> {
    let mut stmt = conn.prepare_cached("DELETE FROM buffered WHERE seq = ?1")?;
    Ok(stmt.execute([seq.0])?)
}

/// The rows still buffered at `seqs` (those gone are left out), in the order given.
pub(super) fn select_at(conn: &Connection, seqs: Vec<Seq>) -> Result<Page> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ROW_COLUMNS} FROM buffered WHERE seq = ?1"
    ))?;
    let mut page = Page::default();
    for seq in seqs {
        let mut rows = stmt.query([seq.0])?;
        if let Some(row) = rows.next()? {
            page.push_row(seq, row)?;
        }
    }
    Ok(page)
}

/// An adopted row the active already holds, but marked cleared by the node handing it over:
/// the held copy is marked too (keeping its time if it was marked already). Returns its seq
/// when it changed.
pub(super) fn mark_held_copy(conn: &Connection, row: &BufferedNotification) -> Result<Option<Seq>> {
    let Some(at) = row.cleared_at_site else {
        return Ok(None);
    };
    let seq = conn
        .prepare_cached(
            "UPDATE buffered SET cleared_at = ?2 WHERE notification_id = ?1 AND cleared_at IS NULL
             RETURNING seq",
        )?
        .query_row(params![row.id.to_string(), at.timestamp_millis()], |r| {
            r.get(0).map(Seq)
        })
        .optional()?;
    Ok(seq)
}
