//! The buffer's side of `SiteNotify.Acknowledge`, as SQL over `pending_acks`: recording an
//! acknowledgement at the current watermark, forgetting it once central applied it, what a
//! standby takes of them and what a hand-over gives. The capabilities run these inside their
//! write jobs (`super::intake`, `super::acks`, `super::replica`, `super::handover`).
//!
//! Invariants:
//! - An acknowledgement is one write job: the key's pending acknowledgement is recorded with
//!   `up_to_seq` = the newest seq handed out so far, read inside the job, so every Send
//!   committed before it (the alarm it answers) is at or below it.
//! - `pending_acks` holds at most one row per key; a later acknowledgement of the key moves its
//!   `up_to_seq` forward and takes its time and actor (central needs to hear the key once; the
//!   latest is who answered last). A row is deleted only once central applied that very
//!   watermark and time, so one recorded while central was applying an earlier one stays.
//! - Every change to `pending_acks` is published after its commit (`super::announce`).
//! - A standby's pending acknowledgements are the active's, replaced as a whole by each list
//!   the active sends ([`replace_pending`]); its head is raised to their watermarks, as for the
//!   clears. One handed over by a former active ([`adopt_acks`]) is recorded at seq 0: due at
//!   once (the rows it came after were handed over with it, and are forwarded by this node in
//!   any order anyway; central joins a late alarm to the acknowledged incident).

use chrono::DateTime;
use rusqlite::{Connection, params};

use super::error::{BufferError, Result};
use super::rows;
use crate::domain::{AckActor, ConditionKey, PendingAck, PendingAcks, Seq};

/// Records the key's pending acknowledgement at the newest seq handed out; returns it and every
/// pending acknowledgement as the job leaves them.
pub(super) fn record_ack(
    conn: &Connection,
    key: &ConditionKey,
    at_ms: i64,
    actor: &AckActor,
) -> Result<(PendingAck, PendingAcks)> {
    let up_to = rows::select_head(conn)?;
    conn.prepare_cached(
        "INSERT INTO pending_acks (condition_key, up_to_seq, acknowledged_at, actor)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (condition_key) DO UPDATE SET
             up_to_seq = max(up_to_seq, excluded.up_to_seq),
             acknowledged_at = excluded.acknowledged_at,
             actor = excluded.actor",
    )?
    .execute(params![key.as_str(), up_to.0, at_ms, actor.as_str()])?;
    let acks = select_pending(conn)?;
    let pending = acks
        .iter()
        .find(|a| &a.condition_key == key)
        .cloned()
        .ok_or_else(|| {
            BufferError::Corrupt(format!(
                "the pending acknowledgement of {key} was written but does not read back"
            ))
        })?;
    Ok((pending, acks))
}

/// Deletes `ack` once central applied it, unless a later acknowledgement of the key moved it
/// meanwhile. Returns whether it was deleted.
pub(super) fn delete_applied(conn: &Connection, ack: &PendingAck) -> Result<bool> {
    let deleted = conn
        .prepare_cached(
            "DELETE FROM pending_acks
             WHERE condition_key = ?1 AND up_to_seq = ?2 AND acknowledged_at = ?3",
        )?
        .execute(params![
            ack.condition_key.as_str(),
            ack.up_to.0,
            ack.acknowledged_at.timestamp_millis()
        ])?;
    Ok(deleted > 0)
}

/// Every pending acknowledgement, oldest watermark first. A row that no longer passes the rules
/// (edited by hand) could never be sent: it is left out and logged, not fatal.
pub(super) fn select_pending(conn: &Connection) -> Result<PendingAcks, group_commit::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT condition_key, up_to_seq, acknowledged_at, actor FROM pending_acks
         ORDER BY up_to_seq",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, String>(3)?,
        ))
    })?;
    let mut acks = Vec::new();
    for row in rows {
        let (key, up_to, at_ms, actor) = row?;
        let parsed = (
            ConditionKey::parse(key.clone(), "condition_key").ok(),
            DateTime::from_timestamp_millis(at_ms),
            AckActor::parse(&actor, "actor").ok(),
        );
        match parsed {
            (Some(condition_key), Some(acknowledged_at), Some(actor)) => acks.push(PendingAck {
                condition_key,
                up_to: Seq(up_to),
                acknowledged_at,
                actor,
            }),
            _ => tracing::error!(
                condition_key = %key, up_to_seq = up_to, acknowledged_at = at_ms,
                "a pending acknowledgement in the site buffer is invalid; it is never sent"
            ),
        }
    }
    Ok(PendingAcks::new(acks))
}

/// Deletes every pending acknowledgement (the node handed them over); returns their keys.
pub(super) fn drop_pending(conn: &Connection) -> Result<Vec<String>> {
    Ok(conn
        .prepare_cached("DELETE FROM pending_acks RETURNING condition_key")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?)
}

/// A standby takes the active's pending acknowledgements: they replace its own, and its head is
/// raised to their highest watermark. Returns the new head.
pub(super) fn replace_pending(conn: &Connection, acks: &[PendingAck]) -> Result<Seq> {
    conn.prepare_cached("DELETE FROM pending_acks")?
        .execute([])?;
    let mut insert = conn.prepare_cached(
        "INSERT INTO pending_acks (condition_key, up_to_seq, acknowledged_at, actor)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (condition_key) DO UPDATE SET
             up_to_seq = max(up_to_seq, excluded.up_to_seq),
             acknowledged_at = max(acknowledged_at, excluded.acknowledged_at)",
    )?;
    let mut highest = Seq::START;
    for ack in acks {
        insert.execute(params![
            ack.condition_key.as_str(),
            ack.up_to.0,
            ack.acknowledged_at.timestamp_millis(),
            ack.actor.as_str()
        ])?;
        highest = highest.max(ack.up_to);
    }
    rows::raise_head(conn, highest)?;
    Ok(rows::select_head(conn)?)
}

/// Records the acknowledgements a former active handed over, due at once (see the module
/// invariants), keeping this node's own of a key when it is at least as recent. Returns how many
/// were recorded.
pub(super) fn adopt_acks(conn: &Connection, acks: &[PendingAck]) -> Result<usize> {
    let mut record = conn.prepare_cached(
        "INSERT INTO pending_acks (condition_key, up_to_seq, acknowledged_at, actor)
         VALUES (?1, 0, ?2, ?3)
         ON CONFLICT (condition_key) DO UPDATE SET
             acknowledged_at = excluded.acknowledged_at,
             actor = excluded.actor
         WHERE excluded.acknowledged_at > acknowledged_at",
    )?;
    let mut recorded = 0;
    for ack in acks {
        recorded += record.execute(params![
            ack.condition_key.as_str(),
            ack.acknowledged_at.timestamp_millis(),
            ack.actor.as_str()
        ])?;
    }
    Ok(recorded)
}
