//! Replication, the standby's side: applying the active's batches (`crate::pair::replica`).
//!
//! Invariants:
//! - A standby stores the active's rows at the active's seqs; AUTOINCREMENT then starts any
//!   seq it hands out once promoted above all of them. A row the active marked cleared comes
//!   again at the same seq and replaces the copy.
//! - Batches that arrived together are applied in one transaction with how far the copy
//!   reaches (`pair_state.replicated_through`, see `super::roles`).
//! - A standby's pending clears are the active's, as the active last listed them, at the
//!   active's seqs like its rows (how: `super::pending_clears`); so are its pending
//!   acknowledgements (`super::pending_acks`).
//! - The final statuses central sent the active are stored at the active's status seqs, in the
//!   batch's transaction with how far that copy reaches (`pair_state.statuses_through`).

use std::sync::Arc;

use chrono::Utc;

use super::central_statuses;
use super::error::{BufferError, Result};
use super::pending_acks;
use super::pending_clears::{self, Invalid};
use super::replication::RetainedSpan;
use super::rows::{self, Insert};
use super::store::Store;
use crate::domain::{
    BufferedNotification, CentralStatus, PendingAck, PendingClear, Seq, StatusSeq,
};

/// One or more replication batches as a standby applies them, in one transaction: the spans,
/// then the adds, then the removes, then the pending clears and acknowledgements.
#[derive(Debug, Default)]
pub(crate) struct ReplicaChanges {
    /// Spans in which the standby keeps only the listed seqs.
    pub retained: Vec<RetainedSpan>,
    /// Rows to copy at the active's seqs, in seq order.
    pub adds: Vec<(Seq, BufferedNotification)>,
    /// Seqs the active no longer holds.
    pub removes: Vec<Seq>,
    /// The active's pending clears, all of them (the latest list of the batches), when a batch
    /// carried them: they replace the standby's.
    pub pending_clears: Option<Vec<PendingClear>>,
    /// The active's pending acknowledgements likewise.
    pub pending_acks: Option<Vec<PendingAck>>,
    /// Final statuses central sent the active, at the active's status seqs, in order.
    pub statuses: Vec<(StatusSeq, CentralStatus)>,
}

/// The standby's copy of the active.
#[derive(Clone, Debug)]
pub(crate) struct Replica {
    store: Store,
}

impl Replica {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// Applies replication batches in one transaction and records how far the copy reaches.
    pub(crate) async fn apply_replica(&self, changes: ReplicaChanges) -> Result<()> {
        let through = changes.adds.iter().map(|(seq, _)| *seq).max();
        let announce = Arc::clone(&self.store.announce);
        self.store
            .db
            .write_then(
                move |conn| {
                    // Spans first: they describe the active before any of these adds were read,
                    // and a row added now may fall in one of their gaps.
                    let mut delete_span =
                        conn.prepare_cached("DELETE FROM buffered WHERE seq BETWEEN ?1 AND ?2")?;
                    for span in &changes.retained {
                        for (first, last) in span.gaps() {
                            delete_span.execute([first.0, last.0])?;
                        }
                    }
                    for (seq, row) in &changes.adds {
                        // Nearly always a seq and a notification this node does not hold yet: the
                        // plain insert, which (unlike a REPLACE) needs no statement journal. A
                        // full copy over an older one replaces what it finds.
                        if rows::insert_row(conn, Insert::ReplicaUnlessHeld(*seq), row)? == 0 {
                            rows::insert_row(conn, Insert::Replica(*seq), row)?;
                        }
                    }
                    let mut delete = conn.prepare_cached("DELETE FROM buffered WHERE seq = ?1")?;
                    for seq in &changes.removes {
                        delete.execute([seq.0])?;
                    }
                    if let Some(through) = through {
                        conn.prepare_cached(
                        "UPDATE pair_state SET replicated_through = max(replicated_through, ?1)",
                    )?
                    .execute([through.0])?;
                    }
                    let clears = match &changes.pending_clears {
                        Some(list) => {
                            let head = pending_clears::replace_pending(conn, list)?;
                            let stored = pending_clears::select_pending(conn, Invalid::Report)?;
                            Some((head, stored))
                        }
                        None => None,
                    };
                    let acks = match &changes.pending_acks {
                        Some(list) => {
                            let head = pending_acks::replace_pending(conn, list)?;
                            Some((head, pending_acks::select_pending(conn)?))
                        }
                        None => None,
                    };
                    let statuses: Vec<_> = changes
                        .statuses
                        .iter()
                        .map(|(seq, status)| (Some(*seq), status.clone()))
                        .collect();
                    let status_head =
                        central_statuses::store(conn, &statuses, Utc::now().timestamp_millis())?;
                    if let Some((last, _)) = changes.statuses.last() {
                        central_statuses::save_through(conn, *last)?;
                    }
                    Ok::<_, BufferError>((clears, acks, status_head))
                },
                // The head only moves forward: what a promotion starts the replication stream from.
                move |(clears, acks, status_head)| {
                    if let Some(stored) = *status_head {
                        announce.status_head.send_if_modified(|h| {
                            let newer = stored > *h;
                            *h = (*h).max(stored);
                            newer
                        });
                    }
                    let head = clears.as_ref().map(|(head, _)| *head);
                    let ack_head = acks.as_ref().map(|(head, _)| *head);
                    announce.other_change(through.max(head).max(ack_head));
                    if let Some((_, stored)) = clears {
                        announce.pending_clears(stored.clone());
                    }
                    if let Some((_, stored)) = acks {
                        announce.pending_acks(stored.clone());
                    }
                },
            )
            .await?;
        Ok(())
    }
}
