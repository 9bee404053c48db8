//! Intake: what the site's scripts write through `SiteNotify`, a `Send`, a `ClearCondition` and
//! an `Acknowledge`, each answered only after its commit.
//!
//! Invariants:
//! - [`Intake::enqueue`] returns only after the row is committed: an id handed to a script is
//!   never lost, whatever happens to the process afterwards.
//! - A Send is stored only while the buffer keeps room to drain (`super::room`): past
//!   `min_free_disk_bytes` or `max_buffer_bytes` it is refused with [`BufferError::NoRoom`],
//!   storing nothing. A clear is never refused for room: it is tiny, and the reserve is for it.
//! - A clear is one write job (`super::pending_clears` says what it commits); its pending clears
//!   are announced before its marks.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::error::{BufferError, Result};
use super::room;
use super::rows;
use super::store::Store;
use super::{pending_acks, pending_clears};
use crate::domain::{
    AckActor, BufferedNotification, ConditionKey, PendingAck, PendingAcks, PendingClear, Seq,
    SiteId,
};

/// Sends and clears from the site's scripts (`grpc::site_notify`).
#[derive(Clone, Debug)]
pub(crate) struct Intake {
    store: Store,
}

/// What [`Intake::clear_condition`] committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConditionCleared {
    /// Buffered rows this clear marked (rows marked by an earlier clear are not counted).
    pub marked: usize,
    /// The key's pending clear as it now stands.
    pub pending: PendingClear,
}

impl Intake {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// Stores a notification durably; returns once it is committed. Refused with
    /// [`BufferError::NoRoom`], storing nothing, when it would leave the buffer no room to drain.
    pub(crate) async fn enqueue(&self, notification: BufferedNotification) -> Result<Seq> {
        // Held until the commit is answered: until then the row counts as in flight.
        let _admitted = self.store.room.admit(stored_bytes(&notification))?;
        let row = Arc::new(notification);
        let announced = Arc::clone(&row);
        let announce = Arc::clone(&self.store.announce);
        let room = Arc::clone(&self.store.room);
        let (seq, _) = self
            .store
            .db
            .write_then(
                move |conn| {
                    let seq = rows::insert_buffered(conn, &row)?;
                    // Figures for the next admission; a failure to read them only leaves
                    // the previous ones, never fails the Send.
                    Ok::<_, BufferError>((seq, room::Pages::read(conn).ok()))
                },
                move |(seq, pages)| {
                    if let Some(pages) = pages {
                        room.pages(*pages);
                    }
                    announce.sent(*seq, announced);
                },
            )
            .await?;
        Ok(seq)
    }

    /// Ends this site's buffered notifications with `key` and records the key's pending clear,
    /// in one write job; returns once it is committed.
    pub(crate) async fn clear_condition(
        &self,
        site: &SiteId,
        key: ConditionKey,
        at: DateTime<Utc>,
    ) -> Result<ConditionCleared> {
        let site = site.as_str().to_owned();
        let at_ms = at.timestamp_millis();
        let announce = Arc::clone(&self.store.announce);
        let (marked, pending, _) = self
            .store
            .db
            .write_then(
                move |conn| pending_clears::record_clear(conn, &site, &key, at_ms),
                // The list first: see the module invariants.
                move |(marked, _, clears)| {
                    announce.pending_clears(clears.clone());
                    announce.marked(marked.clone());
                },
            )
            .await?;
        Ok(ConditionCleared {
            marked: marked.len(),
            pending,
        })
    }

    /// Records the key's pending acknowledgement (the central half of `SiteNotify.Acknowledge`)
    /// at the newest seq handed out, in one write job; returns it and every pending one once it
    /// is committed. Never refused for room, like a clear.
    pub(crate) async fn acknowledge(
        &self,
        key: ConditionKey,
        actor: AckActor,
        at: DateTime<Utc>,
    ) -> Result<(PendingAck, PendingAcks)> {
        let at_ms = at.timestamp_millis();
        let announce = Arc::clone(&self.store.announce);
        self.store
            .db
            .write_then(
                move |conn| pending_acks::record_ack(conn, &key, at_ms, &actor),
                move |(_, acks)| announce.pending_acks(acks.clone()),
            )
            .await
    }
}

/// What a row is counted as for `super::room`: its text fields plus a fixed overhead.
fn stored_bytes(n: &BufferedNotification) -> u64 {
    let p = &n.provenance;
    room::row_bytes(&[
        n.content.list_name.as_str(),
        n.content.subject.as_str(),
        n.content.body.as_str(),
        n.content.type_data.as_str(),
        p.source_site_id.as_str(),
        p.source_instance_id.as_str(),
        p.source_script.as_str(),
        n.condition_key.as_ref().map_or("", ConditionKey::as_str),
    ])
}
