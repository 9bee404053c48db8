//! The buffer file's schema: every version's tables, in the order they were added, and the
//! migration that brings a file written by any earlier binary up to date.
//!
//! Invariants:
//! - `PRAGMA user_version` holds the version a file was brought to; each step runs in its own
//!   transaction with the version it reaches, so a crash mid-migration resumes at that step.
//! - A file newer than this binary is refused, never written.
//! - Columns added later have defaults that read old rows as what they were sent as.

use rusqlite::Connection;

/// Schema version this binary writes, kept in `PRAGMA user_version`.
pub(super) const SCHEMA_VERSION: i64 = 8;

/// Version 1: the waiting rows and the rows central rejected. Columns mirror `NotificationSubmit`
/// so a row can be resubmitted byte for byte; times are Unix milliseconds (UTC).
pub(super) const SCHEMA_V1: &str = "
CREATE TABLE buffered (
    seq                        INTEGER PRIMARY KEY AUTOINCREMENT,
    notification_id            TEXT NOT NULL UNIQUE,
    type                       TEXT NOT NULL,
    list_name                  TEXT NOT NULL,
    subject                    TEXT NOT NULL,
    body                       TEXT NOT NULL,
    type_data                  TEXT NOT NULL,
    source_site_id             TEXT NOT NULL,
    source_instance_id         TEXT NOT NULL,
    source_script              TEXT NOT NULL,
    origin_execution_id        TEXT,
    origin_parent_execution_id TEXT,
    enqueued_at                INTEGER NOT NULL
);
CREATE TABLE rejected (
    seq                        INTEGER PRIMARY KEY,
    notification_id            TEXT NOT NULL UNIQUE,
    type                       TEXT NOT NULL,
    list_name                  TEXT NOT NULL,
    subject                    TEXT NOT NULL,
    body                       TEXT NOT NULL,
    type_data                  TEXT NOT NULL,
    source_site_id             TEXT NOT NULL,
    source_instance_id         TEXT NOT NULL,
    source_script              TEXT NOT NULL,
    origin_execution_id        TEXT,
    origin_parent_execution_id TEXT,
    enqueued_at                INTEGER NOT NULL,
    reason                     TEXT NOT NULL,
    rejected_at                INTEGER NOT NULL
);
";

/// Version 2: the node's place in its pair.
pub(super) const SCHEMA_V2: &str = "
CREATE TABLE pair_state (
    id                 INTEGER PRIMARY KEY CHECK (id = 1),
    role               TEXT NOT NULL,
    term               INTEGER NOT NULL,
    holds_own_rows     INTEGER NOT NULL,
    replicated_through INTEGER NOT NULL
);
";

/// Version 3: the notification's priority, as its `Priority::rank` (0 critical .. 3 low). Rows
/// written before it read back as normal (rank 2), what they were sent as: a buffer written by
/// the previous binary opens and forwards unchanged.
pub(super) const SCHEMA_V3: &str = "
ALTER TABLE buffered ADD COLUMN priority INTEGER NOT NULL DEFAULT 2;
ALTER TABLE rejected ADD COLUMN priority INTEGER NOT NULL DEFAULT 2;
";

/// Version 4: each row's condition key and, once a clear ended it, when (Unix ms, NULL = not
/// cleared); the pending clears. Rows written before it have no key, as they were sent.
pub(super) const SCHEMA_V4: &str = "
ALTER TABLE buffered ADD COLUMN condition_key TEXT;
ALTER TABLE buffered ADD COLUMN cleared_at INTEGER;
ALTER TABLE rejected ADD COLUMN condition_key TEXT;
ALTER TABLE rejected ADD COLUMN cleared_at INTEGER;
CREATE INDEX buffered_by_condition_key ON buffered (condition_key)
    WHERE condition_key IS NOT NULL;
CREATE INDEX buffered_cleared ON buffered (seq) WHERE cleared_at IS NOT NULL;
CREATE TABLE pending_clears (
    condition_key TEXT PRIMARY KEY,
    up_to_seq     INTEGER NOT NULL,
    cleared_at    INTEGER NOT NULL
);
";

/// Version 5: per key, the `cleared_at` (Unix ms) of the latest clear central applied for this
/// node while it was active, so that one handed over again by a former active is not applied
/// twice. Emptied when the node hands its buffer over; the [`APPLIED_CLEARS_KEPT`](super::pending_clears::APPLIED_CLEARS_KEPT) most recent
/// keys are kept (more only where their times tie).
pub(super) const SCHEMA_V5: &str = "
CREATE TABLE applied_clears (
    condition_key TEXT PRIMARY KEY,
    cleared_at    INTEGER NOT NULL
);
CREATE INDEX applied_clears_by_time ON applied_clears (cleared_at);
";

/// Version 6: the pending acknowledgements (`super::pending_acks`): per key, the watermark,
/// when (Unix ms) and by whom.
pub(super) const SCHEMA_V6: &str = "
CREATE TABLE pending_acks (
    condition_key   TEXT PRIMARY KEY,
    up_to_seq       INTEGER NOT NULL,
    acknowledged_at INTEGER NOT NULL,
    actor           TEXT NOT NULL
);
";

/// Version 7: when a scheduled notification is to be delivered (Unix ms, `deliver_after` of
/// its submit; NULL = at once). Rows written before it were sent unscheduled.
pub(super) const SCHEMA_V7: &str = "
ALTER TABLE buffered ADD COLUMN deliver_after INTEGER;
ALTER TABLE rejected ADD COLUMN deliver_after INTEGER;
";

/// Version 8: the final statuses central sent back (`super::central_statuses`): one row per
/// notification, its latest by central's order; `seq` is this node's order of storing them
/// (the same on both nodes of a pair), `view` central's `NotificationStatusView` as encoded.
/// `pair_state.statuses_through` is the highest `seq` a standby copied from its active.
pub(super) const SCHEMA_V8: &str = "
CREATE TABLE central_statuses (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    notification_id TEXT NOT NULL UNIQUE,
    central_seq     INTEGER NOT NULL,
    condition_key   TEXT,
    decided_at      INTEGER NOT NULL,
    stored_at       INTEGER NOT NULL,
    view            BLOB NOT NULL
);
CREATE INDEX central_statuses_by_condition_key ON central_statuses (condition_key)
    WHERE condition_key IS NOT NULL;
CREATE INDEX central_statuses_by_age ON central_statuses (stored_at);
ALTER TABLE pair_state ADD COLUMN statuses_through INTEGER NOT NULL DEFAULT 0;
";

/// Runs on the write connection before the writer starts: creates or upgrades the schema.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), group_commit::Error> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(group_commit::Error::TaskFailed(format!(
            "the buffer's schema version {version} is newer than this binary supports \
             ({SCHEMA_VERSION}); run a newer site-forwarder"
        )));
    }
    if version < 1 {
        let txn = conn.transaction()?;
        txn.execute_batch(SCHEMA_V1)?;
        txn.pragma_update(None, "user_version", 1)?;
        txn.commit()?;
    }
    if version < 2 {
        let txn = conn.transaction()?;
        txn.execute_batch(SCHEMA_V2)?;
        txn.pragma_update(None, "user_version", 2)?;
        txn.commit()?;
    }
    if version < 3 {
        let txn = conn.transaction()?;
        txn.execute_batch(SCHEMA_V3)?;
        txn.pragma_update(None, "user_version", 3)?;
        txn.commit()?;
    }
    if version < 4 {
        let txn = conn.transaction()?;
        txn.execute_batch(SCHEMA_V4)?;
        txn.pragma_update(None, "user_version", 4)?;
        txn.commit()?;
    }
    if version < 5 {
        let txn = conn.transaction()?;
        txn.execute_batch(SCHEMA_V5)?;
        txn.pragma_update(None, "user_version", 5)?;
        txn.commit()?;
    }
    if version < 6 {
        let txn = conn.transaction()?;
        txn.execute_batch(SCHEMA_V6)?;
        txn.pragma_update(None, "user_version", 6)?;
        txn.commit()?;
    }
    if version < 7 {
        let txn = conn.transaction()?;
        txn.execute_batch(SCHEMA_V7)?;
        txn.pragma_update(None, "user_version", 7)?;
        txn.commit()?;
    }
    if version < 8 {
        let txn = conn.transaction()?;
        txn.execute_batch(SCHEMA_V8)?;
        txn.pragma_update(None, "user_version", 8)?;
        txn.commit()?;
    }
    Ok(())
}

/// Keeps the writer's statement journals in memory. Every write job runs in its own savepoint
/// (see `group_commit`), and SQLite copies each page a savepoint or a statement changes into a
/// sub-journal so that alone can be rolled back; past 64 KiB that journal spills to a temporary
/// file. A standby's batch (hundreds of rows in one job) went past it every time: writing,
/// truncating and finally deleting that file was 45% of the standby's CPU in a profile. The
/// journal only serves a rollback inside the running transaction and is never read after a
/// crash (the WAL is), so keeping it in memory changes no durability; it holds at most the
/// pages one job changes (a standby's batch: a few MiB). Set after the migrations, which keep
/// their temporary files on disk.
pub(super) fn keep_job_journals_in_memory(conn: &Connection) -> Result<(), group_commit::Error> {
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Priority;

    /// The default the v3 migration gives rows written before it must be normal's rank.
    #[test]
    fn the_schema_default_is_normals_rank() {
        let default = format!("DEFAULT {}", Priority::Normal.rank());
        assert_eq!(
            SCHEMA_V3.matches(default.as_str()).count(),
            2,
            "{SCHEMA_V3}"
        );
    }
}
