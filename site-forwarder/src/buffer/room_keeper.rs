//! Keeping the buffer's room current with no Send asking: a check every
//! [`ROOM_CHECK_INTERVAL`], so a refusal lifts (and health follows) when space frees by
//! itself, and the changes of whether Sends are taken, for health (`lib.rs`'s room task). The
//! rule itself: `super::room`.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::error::BufferError;
use super::room::{self, ROOM_CHECK_INTERVAL, RoomStatus};
use super::store::Store;

/// The room task's hold on the buffer.
#[derive(Clone, Debug)]
pub(crate) struct RoomKeeper {
    store: Store,
}

impl RoomKeeper {
    pub(super) fn new(store: Store) -> Self {
        Self { store }
    }

    /// Changes of whether the buffer takes Sends.
    pub(crate) fn watch(&self) -> watch::Receiver<RoomStatus> {
        self.store.room.watch()
    }

    /// Checks the room every [`ROOM_CHECK_INTERVAL`] until `stop`, so a refusal lifts (and
    /// health follows) when space frees with no Send to notice it.
    pub(crate) async fn keep_current(&self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(ROOM_CHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let pages = self
                .store
                .db
                .read(|conn| room::Pages::read(conn).map_err(BufferError::from))
                .await;
            match pages {
                Ok(pages) => self.store.room.pages(pages),
                Err(error) => {
                    tracing::debug!(%error, "cannot read the buffer's page counts; using the last")
                }
            }
            if self.store.room.refusing() {
                self.store.make_room().await;
            } else {
                self.store.room.reassess();
            }
        }
    }
}
