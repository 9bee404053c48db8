//! The status callbacks on SQLite (migration 0015): the triggers on `Notifications` queue each
//! final status of a notification whose list has an endpoint in `StatusCallbacks`; these
//! functions hand out the due changes, record each call in `StatusCallbackCalls` with what
//! becomes of its change, and read the calls back as history entries.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, params};

use super::admin::read_state;
use super::site_status::STATE_COLUMNS;
use super::{at_ms, corrupt, ms};
use crate::domain::NotificationId;
use crate::domain::history::{HistoryEntry, HistoryEvent};
use crate::domain::status::Status;
use crate::domain::status_callback::CallOutcome;
use crate::domain::webhook::WebhookUrl;
use crate::records::{
    DueStatusCallback, SiteStatusChange, StatusCallbackBacklog, StatusCallbackCall,
    StatusCallbackTurn,
};
use crate::store::Result;

/// The changes due at `now` (at most `limit`), and how long until the next otherwise.
pub(super) fn due(conn: &Connection, limit: u32, now: DateTime<Utc>) -> Result<StatusCallbackTurn> {
    let mut stmt = conn.prepare_cached(include_str!("sql/select_due_status_callbacks.sql"))?;
    let rows = stmt.query_map(params![ms(now), limit], |row| {
        Ok((
            read_state(row)?,
            row.get::<_, i64>(STATE_COLUMNS)?,
            row.get::<_, Option<String>>(STATE_COLUMNS + 1)?,
            row.get::<_, Option<String>>(STATE_COLUMNS + 2)?,
            row.get::<_, i64>(STATE_COLUMNS + 3)?,
            row.get::<_, u32>(STATE_COLUMNS + 4)?,
        ))
    })?;
    let mut due = Vec::new();
    for row in rows {
        let (state, seq, delivered_to, endpoint, queued_at, calls) = row?;
        due.push(DueStatusCallback {
            change: SiteStatusChange {
                seq,
                state: state.decode()?,
                delivered_to,
            },
            endpoint: endpoint
                .map(|u| {
                    WebhookUrl::parse(&u)
                        .map_err(|e| corrupt(format!("StatusCallbackUrl: {}", e.problem)))
                })
                .transpose()?,
            queued_at: at_ms("StatusCallbacks.QueuedAt", queued_at)?,
            calls,
        });
    }
    let next: Option<i64> = conn
        .prepare_cached(include_str!("sql/select_next_status_callback.sql"))?
        .query_row([], |row| row.get(0))?;
    let next_due_in = next
        .map(|at| Duration::from_millis(u64::try_from(at.saturating_sub(ms(now))).unwrap_or(0)));
    Ok(StatusCallbackTurn { due, next_due_in })
}

/// Records `call` and forgets or reschedules its change, in the caller's transaction.
pub(super) fn record(conn: &Connection, call: &StatusCallbackCall) -> Result<()> {
    conn.prepare_cached(include_str!("sql/insert_status_callback_call.sql"))?
        .execute(params![
            call.id.to_string(),
            ms(call.called_at),
            call.duration
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            call.status.as_str(),
            call.outcome.as_str(),
            call.error,
            call.endpoint,
        ])?;
    match (call.outcome, call.retry_at) {
        (CallOutcome::Failed, Some(retry_at)) => {
            conn.prepare_cached(include_str!("sql/reschedule_status_callback.sql"))?
                .execute(params![call.seq, ms(retry_at)])?;
        }
        _ => {
            conn.prepare_cached(include_str!("sql/delete_status_callback.sql"))?
                .execute([call.seq])?;
        }
    }
    Ok(())
}

/// How many changes wait, and since when the oldest.
pub(super) fn backlog(conn: &Connection) -> Result<StatusCallbackBacklog> {
    let (waiting, oldest): (i64, Option<i64>) = conn
        .prepare_cached(include_str!("sql/select_status_callback_backlog.sql"))?
        .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    Ok(StatusCallbackBacklog {
        waiting: u64::try_from(waiting).unwrap_or(0),
        oldest_queued_at: oldest
            .map(|at| at_ms("StatusCallbacks.QueuedAt", at))
            .transpose()?,
    })
}

/// The calls made for `id`, oldest first, as history entries (numbered by the caller when it
/// merges them with the attempts).
pub(super) fn history(conn: &Connection, id: NotificationId) -> Result<Vec<HistoryEntry>> {
    let mut stmt = conn.prepare_cached(include_str!("sql/select_status_callback_calls.sql"))?;
    let rows = stmt.query_map([id.to_string()], |row| {
        Ok((
            row.get::<_, u32>(0)?,
            row.get::<_, i64>(1)?,
            row.get::<_, Option<i64>>(2)?,
            row.get::<_, String>(3)?,
            row.get::<_, String>(4)?,
            row.get::<_, Option<String>>(5)?,
            row.get::<_, Option<String>>(6)?,
        ))
    })?;
    let mut entries = Vec::new();
    for row in rows {
        let (number, at, duration, status, outcome, error, endpoint) = row?;
        entries.push(HistoryEntry {
            sequence: number,
            at: at_ms("StatusCallbackCalls.CalledAt", at)?,
            error,
            event: HistoryEvent::StatusCallback {
                outcome: CallOutcome::from_db(&outcome)
                    .ok_or_else(|| corrupt(format!("status callback outcome {outcome:?}")))?,
                status: Status::from_db(&status)
                    .ok_or_else(|| corrupt(format!("status callback status {status:?}")))?,
                endpoint,
                duration: duration.map(|d| Duration::from_millis(u64::try_from(d).unwrap_or(0))),
            },
        });
    }
    Ok(entries)
}
