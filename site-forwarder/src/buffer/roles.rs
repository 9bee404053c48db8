//! The node's persisted place in its pair (`pair_state`): its role, its term, whether it holds
//! rows of its own and how far its copy of the active reaches. Read at start-up and by a
//! standby, written at each role change (`crate::pair::node`).
//!
//! Invariants:
//! - `pair_state` has at most one row. It is written in the same transaction as the buffer
//!   change it describes (a batch and its `replicated_through`: `super::replica`; a hand-over
//!   and the end of `holds_own_rows`: `super::handover`), so a crash never leaves the two
//!   disagreeing.
//! - `holds_own_rows` is set whenever the node may hold rows its peer lacks: from the moment it
//!   is active (it accepts Sends) until it has handed every row to the active. While it is set,
//!   the node's rows are never deleted by replication.

use rusqlite::{Connection, OptionalExtension, params};

use super::error::{BufferError, Result};
use super::store::Store;
use crate::domain::{Role, Seq, StatusSeq};

/// The node's persisted place in its pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PairRecord {
    pub role: Role,
    /// The highest term this node has been active in or followed an active in.
    pub term: u64,
    /// The buffer may hold rows the peer lacks (see the module invariants).
    pub holds_own_rows: bool,
    /// The highest seq copied from the active being followed; 0 = nothing copied yet.
    pub replicated_through: Seq,
    /// The highest status seq copied from that active; 0 = none yet (reset with the copy).
    pub statuses_through: StatusSeq,
}

/// The role record, for the node's role changes and the standby's follow.
#[derive(Clone, Debug)]
pub(crate) struct Roles {
    store: Store,
}

impl Roles {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// The node's persisted place in its pair; `None` before it was ever part of one.
    pub(crate) async fn pair_record(&self) -> Result<Option<PairRecord>> {
        self.store.db.read(select_pair_record).await
    }

    /// Persists a role change; `replicated_through` is kept as stored unless `reset_copy`.
    pub(crate) async fn save_role(
        &self,
        role: Role,
        term: u64,
        holds_own_rows: bool,
        reset_copy: bool,
    ) -> Result<()> {
        self.store
            .db
            .write(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "INSERT INTO pair_state (id, role, term, holds_own_rows, replicated_through)
                     VALUES (1, ?1, ?2, ?3, 0)
                     ON CONFLICT (id) DO UPDATE SET role = ?1, term = ?2, holds_own_rows = ?3,
                         replicated_through = CASE WHEN ?4 THEN 0 ELSE replicated_through END,
                         statuses_through = CASE WHEN ?4 THEN 0 ELSE statuses_through END",
                )?;
                stmt.execute(params![
                    role.as_str(),
                    i64::try_from(term).unwrap_or(i64::MAX),
                    holds_own_rows,
                    reset_copy
                ])?;
                Ok(())
            })
            .await
    }
}

fn select_pair_record(conn: &Connection) -> Result<Option<PairRecord>> {
    let row = conn
        .prepare_cached(
            "SELECT role, term, holds_own_rows, replicated_through, statuses_through
             FROM pair_state WHERE id = 1",
        )?
        .query_row([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, bool>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })
        .optional()?;
    let Some((role, term, holds_own_rows, through, statuses_through)) = row else {
        return Ok(None);
    };
    let role = Role::from_db(&role)
        .ok_or_else(|| BufferError::Corrupt(format!("pair_state.role {role:?} is not a role")))?;
    Ok(Some(PairRecord {
        role,
        term: u64::try_from(term).unwrap_or(0),
        holds_own_rows,
        replicated_through: Seq(through),
        statuses_through: StatusSeq(statuses_through),
    }))
}
