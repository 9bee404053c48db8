//! Both ends of a hand-over. A node that stops being active while it holds rows of its own
//! ([`Handover`], `crate::pair::handover`) reads them out with its pending clears, hands them to
//! the active and then deletes them and becomes an empty standby; the active ([`Adoption`],
//! `grpc::site_pair`) stores them under its own seqs.
//!
//! Invariants:
//! - The end of a hand-over deletes the rows and the pending clears handed over and ends
//!   `holds_own_rows` in one transaction (`super::roles`): a node that crashes before it still
//!   holds its rows and hands them over again; one that crashes after it is an empty standby.
//! - An adopted row is stored once: a notification already buffered is skipped, and the held
//!   copy of a row the former active marked cleared is marked here too.
//! - The pending clears handed over are recorded after the rows (how: `super::pending_clears`),
//!   and so are the pending acknowledgements (`super::pending_acks`).

use std::sync::Arc;

use rusqlite::params;

use super::error::{BufferError, Result};
use super::pending_acks;
use super::pending_clears::{self, AdoptedClears, Invalid};
use super::rows::{self, Insert, Page};
use super::store::Store;
use crate::domain::{
    BufferedNotification, PendingAck, PendingAcks, PendingClear, PendingClears, Role, Seq,
};

/// What [`Handover::finish_handover`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct HandoverFinished {
    /// Rows deleted (the active holds them now).
    pub deleted: usize,
    /// Keys of the pending clears deleted (handed over before, unless the hand-over says
    /// otherwise).
    pub deleted_clears: Vec<String>,
    /// Keys of the pending acknowledgements deleted (handed over before).
    pub deleted_acks: Vec<String>,
}

/// What [`Adoption::adopt`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Adopted {
    pub adopted: usize,
    pub already_held: usize,
    pub clears: AdoptedClears,
    /// Pending acknowledgements recorded (or made more recent).
    pub acks: usize,
}

/// The handing node's hold on its buffer.
#[derive(Clone, Debug)]
pub(crate) struct Handover {
    store: Store,
}

impl Handover {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// Up to `limit` rows with a seq greater than `after`, oldest first.
    pub(crate) async fn next_after(&self, after: Seq, limit: usize) -> Result<Page> {
        self.store.rows_after(after, limit).await
    }

    /// Moves rows that can never be handed over (they break the content rules) to `rejected`
    /// with the reason, as the forwarder does; retried until it commits (see `super::store`).
    pub(crate) async fn set_aside(&self, rejected: Vec<(Seq, String)>) -> Result<usize> {
        self.store.settle(Vec::new(), rejected).await
    }

    /// The pending clears as the table holds them now (read after the rows).
    pub(crate) async fn read_pending_clears(&self) -> Result<PendingClears> {
        self.store.read_pending_clears().await
    }

    /// The pending acknowledgements as the table holds them now.
    pub(crate) async fn read_pending_acks(&self) -> Result<PendingAcks> {
        self.store.read_pending_acks().await
    }

    /// Ends a hand-over: every row up to `through` is now held by the active, so they are
    /// deleted here, and the node becomes an empty standby that copies the active from scratch.
    /// Its pending clears go too (handed over before; see the module invariants).
    pub(crate) async fn finish_handover(
        &self,
        through: Seq,
        term: u64,
    ) -> Result<HandoverFinished> {
        let announce = Arc::clone(&self.store.announce);
        let finished = self
            .store
            .db
            .write_then(
                move |conn| {
                    let deleted = conn
                        .prepare_cached("DELETE FROM buffered WHERE seq <= ?1")?
                        .execute([through.0])?;
                    let deleted_clears = pending_clears::drop_pending(conn)?;
                    let deleted_acks = pending_acks::drop_pending(conn)?;
                    conn.prepare_cached(
                        "UPDATE pair_state SET role = ?1, term = ?2, holds_own_rows = 0,
                         replicated_through = 0",
                    )?
                    .execute(params![
                        Role::Standby.as_str(),
                        i64::try_from(term).unwrap_or(i64::MAX)
                    ])?;
                    Ok::<_, BufferError>(HandoverFinished {
                        deleted,
                        deleted_clears,
                        deleted_acks,
                    })
                },
                move |finished| {
                    announce.other_change(None);
                    if !finished.deleted_clears.is_empty() {
                        announce.pending_clears(PendingClears::default());
                    }
                    if !finished.deleted_acks.is_empty() {
                        announce.pending_acks(PendingAcks::default());
                    }
                },
            )
            .await?;
        Ok(finished)
    }
}

/// The active's side of a hand-over.
#[derive(Clone, Debug)]
pub(crate) struct Adoption {
    store: Store,
}

impl Adoption {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// Stores rows handed over by a node that stopped being active, each under a new seq here,
    /// skipping notifications already buffered; a held copy of a row the node marked cleared is
    /// marked here too. Then records the node's pending clears (after the rows: see
    /// `super::pending_clears` for how). Answered once they are committed.
    pub(crate) async fn adopt(
        &self,
        rows: Vec<BufferedNotification>,
        pending_clears: Vec<PendingClear>,
        pending_acks: Vec<PendingAck>,
    ) -> Result<Adopted> {
        let announce = Arc::clone(&self.store.announce);
        let (adopted, _, _, _, _) = self
            .store
            .db
            .write_then(
                move |conn| {
                    let mut adopted = Adopted::default();
                    let mut marked = Vec::new();
                    for row in &rows {
                        match rows::insert_row(conn, Insert::NewUnlessHeld, row)? {
                            0 => {
                                adopted.already_held += 1;
                                marked.extend(rows::mark_held_copy(conn, row)?);
                            }
                            _ => adopted.adopted += 1,
                        }
                    }
                    let head = Seq(conn.last_insert_rowid());
                    adopted.clears = pending_clears::adopt_clears(conn, &pending_clears)?;
                    let stored = if adopted.clears.recorded > 0 {
                        Some(pending_clears::select_pending(conn, Invalid::Report)?)
                    } else {
                        None
                    };
                    adopted.acks = pending_acks::adopt_acks(conn, &pending_acks)?;
                    let acks = if adopted.acks > 0 {
                        Some(pending_acks::select_pending(conn)?)
                    } else {
                        None
                    };
                    Ok::<_, BufferError>((adopted, head, marked, stored, acks))
                },
                move |(adopted, head, marked, stored, acks)| {
                    if adopted.adopted > 0 {
                        announce.other_change(Some(*head));
                    }
                    if let Some(stored) = stored {
                        announce.pending_clears(stored.clone());
                    }
                    if let Some(acks) = acks {
                        announce.pending_acks(acks.clone());
                    }
                    announce.marked(marked.clone());
                },
            )
            .await?;
        Ok(adopted)
    }
}
