//! The buffer's side of ClearCondition, as SQL over `pending_clears` and `applied_clears`:
//! marking a key's buffered rows cleared, the durable pending clears (the central half of each
//! clear; `crate::clears` sends them), what a standby takes of them and what a hand-over gives.
//! The capabilities run these inside their write jobs (`super::intake`, `super::clears`,
//! `super::replica`, `super::handover`).
//!
//! Invariants:
//! - A clear is one write job: the key's rows still buffered are marked (`cleared_at`; a row
//!   marked before keeps its time) and the key's pending clear is recorded with `up_to_seq` =
//!   the newest seq handed out so far, read inside the job. A Send committed earlier in the same
//!   transaction is therefore below it and marked, one committed later above it and unmarked.
//! - `pending_clears` holds at most one row per key; a later clear of the key moves its
//!   `up_to_seq` forward (why that is enough: `PendingClears` in the domain). A row is deleted
//!   only once central applied that very watermark, so a clear recorded while central was
//!   applying an earlier one stays pending.
//! - Every change to `pending_clears` is published after its commit
//!   (`super::announce`), before the marking it commits with is announced as
//!   `RowChange::Marked`: a replication stream that copies the marks again has seen
//!   the new list by then, and sends it with them or before.
//! - A standby's pending clears are the active's, replaced as a whole by each list the active
//!   sends ([`replace_pending`]), at the active's seqs like its rows; its head is raised to
//!   their watermarks, so a Send it takes once promoted is above every one of them.
//! - A clear handed over by a former active ([`adopt_clears`]) is recorded at seq 0: due at
//!   once, and holding every unmarked row of the key here until central applied it. The former
//!   active's rows the clear came before are all marked (the clear marked them, and marked the
//!   copies held here during the hand-over), so none of them needs to go first; its rows after
//!   the clear, and this node's own rows of the key (sent while it was active, after the clear
//!   or during a partition), wait for it. A pending clear of the key this node already has is
//!   kept with its watermark (which orders this node's own rows), and a clear as recent as one
//!   this node already had central apply (`applied_clears`) is not recorded again: applying it
//!   again would end this node's rows of the key sent since.

use chrono::DateTime;
use rusqlite::{Connection, OptionalExtension, params};

use super::error::{BufferError, Result};
use super::rows;
use crate::domain::{ConditionKey, PendingClear, PendingClears, Seq};

/// Keys `applied_clears` remembers, the most recently cleared kept. A former active hands over
/// clears it made before it stopped being active; forgetting one means only that, should the
/// former active still hold it when it returns, central is asked to clear the key once more.
/// The bound keeps a site whose keys are ever new (an id in the key) from growing the table
/// for good.
pub(super) const APPLIED_CLEARS_KEPT: i64 = 10_000;

/// What an adoption (`super::handover::Adoption::adopt`) did with the clears handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct AdoptedClears {
    /// Recorded, or merged into this node's pending clear of the key.
    pub recorded: usize,
    /// Not recorded: this node had central apply a clear of the key at least as recent.
    pub already_applied: usize,
}

/// The SQL of a clear (see the module invariants): marks this site's unmarked rows of `key`
/// (returning their seqs), records the key's pending clear at the newest seq handed out, and
/// returns that clear and every pending clear as the job leaves them.
pub(super) fn record_clear(
    conn: &Connection,
    site: &str,
    key: &ConditionKey,
    at_ms: i64,
) -> Result<(Vec<Seq>, PendingClear, PendingClears)> {
    let marked: Vec<Seq> = conn
        .prepare_cached(
            "UPDATE buffered SET cleared_at = ?3
             WHERE condition_key = ?1 AND source_site_id = ?2
               AND cleared_at IS NULL
             RETURNING seq",
        )?
        .query_map(params![key.as_str(), site, at_ms], |r| r.get(0).map(Seq))?
        .collect::<rusqlite::Result<_>>()?;
    let up_to = rows::select_head(conn)?;
    conn.prepare_cached(
        "INSERT INTO pending_clears (condition_key, up_to_seq, cleared_at)
         VALUES (?1, ?2, ?3)
         ON CONFLICT (condition_key) DO UPDATE SET
             up_to_seq = max(up_to_seq, excluded.up_to_seq),
             cleared_at = excluded.cleared_at",
    )?
    .execute(params![key.as_str(), up_to.0, at_ms])?;
    let clears = select_pending(conn, Invalid::Report)?;
    let pending = clears
        .iter()
        .find(|c| &c.condition_key == key)
        .cloned()
        .ok_or_else(|| {
            BufferError::Corrupt(format!(
                "the pending clear of {key} was written but does not read back"
            ))
        })?;
    Ok((marked, pending, clears))
}

/// Deletes `clear` once central applied it, unless a later clear of the key moved it meanwhile,
/// or a clear handed over made it more recent, and remembers it as applied. Returns whether it
/// was deleted.
pub(super) fn delete_applied(conn: &Connection, clear: &PendingClear) -> Result<bool> {
    let key = clear.condition_key.as_str();
    let at_ms = clear.cleared_at.timestamp_millis();
    let deleted = conn
        .prepare_cached(
            "DELETE FROM pending_clears
             WHERE condition_key = ?1 AND up_to_seq = ?2 AND cleared_at = ?3",
        )?
        .execute(params![key, clear.up_to.0, at_ms])?;
    if deleted > 0 {
        remember_applied(conn, key, at_ms)?;
    }
    Ok(deleted > 0)
}

/// What [`select_pending`] does with a row that no longer passes the rules (edited by hand):
/// it could never be sent, so it is left out rather than stopping the buffer, and logged where
/// that is not once per forwarded page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Invalid {
    Report,
    Skip,
}

/// Every pending clear, oldest watermark first.
pub(super) fn select_pending(
    conn: &Connection,
    invalid: Invalid,
) -> Result<PendingClears, group_commit::Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT condition_key, up_to_seq, cleared_at FROM pending_clears ORDER BY up_to_seq",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut clears = Vec::new();
    for row in rows {
        let (key, up_to, at_ms) = row?;
        let parsed = ConditionKey::parse(key.clone(), "condition_key");
        match (parsed, DateTime::from_timestamp_millis(at_ms)) {
            (Ok(condition_key), Some(cleared_at)) => clears.push(PendingClear {
                condition_key,
                up_to: Seq(up_to),
                cleared_at,
            }),
            _ if invalid == Invalid::Skip => {}
            _ => tracing::error!(
                condition_key = %key, up_to_seq = up_to, cleared_at = at_ms,
                "a pending clear in the site buffer is invalid; it is never sent to central"
            ),
        }
    }
    Ok(PendingClears::new(clears))
}

/// Deletes every pending clear and forgets the applied ones (the node has handed them over and
/// its buffer is about to become a copy of another's); returns the pending clears' keys.
pub(super) fn drop_pending(conn: &Connection) -> Result<Vec<String>> {
    let keys = conn
        .prepare_cached("DELETE FROM pending_clears RETURNING condition_key")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    conn.prepare_cached("DELETE FROM applied_clears")?
        .execute([])?;
    Ok(keys)
}

/// Records that central applied a clear of `key` committed at `at_ms`, keeping the most
/// recent [`APPLIED_CLEARS_KEPT`] keys.
pub(super) fn remember_applied(conn: &Connection, key: &str, at_ms: i64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO applied_clears (condition_key, cleared_at) VALUES (?1, ?2)
         ON CONFLICT (condition_key) DO UPDATE SET
             cleared_at = max(cleared_at, excluded.cleared_at)",
    )?
    .execute(params![key, at_ms])?;
    // NULL (nothing deleted) while fewer are kept.
    conn.prepare_cached(
        "DELETE FROM applied_clears WHERE cleared_at < (
             SELECT cleared_at FROM applied_clears ORDER BY cleared_at DESC LIMIT 1 OFFSET ?1)",
    )?
    .execute([APPLIED_CLEARS_KEPT - 1])?;
    Ok(())
}

/// A standby takes the active's pending clears: they replace its own (an empty list deletes
/// them all), and its head is raised to their highest watermark, so the first seq it hands out
/// once promoted is above every one of them even when the active's rows up to there have not
/// reached it yet. Returns the new head.
pub(super) fn replace_pending(conn: &Connection, clears: &[PendingClear]) -> Result<Seq> {
    conn.prepare_cached("DELETE FROM pending_clears")?
        .execute([])?;
    let mut insert = conn.prepare_cached(
        "INSERT INTO pending_clears (condition_key, up_to_seq, cleared_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (condition_key) DO UPDATE SET
             up_to_seq = max(up_to_seq, excluded.up_to_seq),
             cleared_at = max(cleared_at, excluded.cleared_at)",
    )?;
    let mut highest = Seq::START;
    for clear in clears {
        insert.execute(params![
            clear.condition_key.as_str(),
            clear.up_to.0,
            clear.cleared_at.timestamp_millis()
        ])?;
        highest = highest.max(clear.up_to);
    }
    rows::raise_head(conn, highest)?;
    Ok(rows::select_head(conn)?)
}

/// Records the clears a former active handed over (see the module invariants); their
/// `up_to` is the former active's seq and is not used.
pub(super) fn adopt_clears(conn: &Connection, clears: &[PendingClear]) -> Result<AdoptedClears> {
    let mut adopted = AdoptedClears::default();
    let mut applied =
        conn.prepare_cached("SELECT cleared_at FROM applied_clears WHERE condition_key = ?1")?;
    let mut record = conn.prepare_cached(
        "INSERT INTO pending_clears (condition_key, up_to_seq, cleared_at) VALUES (?1, 0, ?2)
         ON CONFLICT (condition_key) DO UPDATE SET
             cleared_at = max(cleared_at, excluded.cleared_at)",
    )?;
    for clear in clears {
        let key = clear.condition_key.as_str();
        let at_ms = clear.cleared_at.timestamp_millis();
        let applied_at: Option<i64> = applied.query_row([key], |r| r.get(0)).optional()?;
        if applied_at.is_some_and(|applied_at| applied_at >= at_ms) {
            adopted.already_applied += 1;
            continue;
        }
        record.execute(params![key, at_ms])?;
        adopted.recorded += 1;
    }
    Ok(adopted)
}
