//! The durable store-and-forward buffer: one SQLite file (WAL, `synchronous=FULL`) written
//! through `group_commit`, so concurrent `Send`s share one transaction and one fsync.
//!
//! Its users never hold the whole buffer. [`Buffer::open_with`] opens the file once (in `run`),
//! and each task is handed the capabilities it uses, each a cheap handle over the same database
//! (`store`), the way central's store is split into one trait per capability:
//!
//! | capability | what it may do | who holds it |
//! |---|---|---|
//! | [`Intake`] | store a Send (refused without room), record a ClearCondition or an Acknowledge | `grpc::site_notify` |
//! | [`StatusReader`] | a notification's local status, the buffer's figures, its room | `grpc::site_notify`, `health_report`, `metrics`, `pair::node` (first start) |
//! | [`Statuses`] | store the final statuses central sends back, follow and read them, prune them | `statuses` (the follower), `grpc::site_notify` (`WatchStatus`) |
//! | [`RoomKeeper`] | check the room every second, follow whether Sends are taken | `lib.rs`'s room task |
//! | [`Forwarding`] | wake on Sends, read rows with their pending clears, settle acks | `forwarder` |
//! | [`Clears`] | follow pending clears and leaving rows, forget an applied clear | `clears` |
//! | [`Acks`] | follow pending acknowledgements and leaving rows, forget an applied one | `acks` |
//! | [`Replication`] | the active's feed: head, rows, marks, removals, spans, pending clears | `pair::source` (via `grpc::site_pair`) |
//! | [`Commits`] | follow the newest committed seq | `pair::node` (dates commits for the standby lag) |
//! | [`Replica`] | apply the active's batches | `pair::replica` |
//! | [`Roles`] | read and save the node's role record | `pair::node`, `pair::replica` |
//! | [`Handover`] | read out own rows and clears, end the hand-over | `pair::handover` |
//! | [`Adoption`] | store the rows and clears a former active hands over | `grpc::site_pair` |
//!
//! Below the handles, by table: `rows` (`buffered`, `rejected`), `pending_clears`
//! (`pending_clears`, `applied_clears`), `pending_acks` (`pending_acks`), `central_statuses` (`central_statuses`), `roles` (`pair_state`), `schema` (every table and the
//! migration); `announce` (what each commit tells the node), [`recent`] (rows kept in memory
//! for replication), [`room`] (the room kept to drain). Each module states its invariants.

mod acks;
mod announce;
mod central_statuses;
mod clears;
mod error;
mod forwarding;
mod handover;
mod intake;
mod pending_acks;
mod pending_clears;
pub(crate) mod recent;
mod replica;
mod replication;
mod roles;
pub(crate) mod room;
mod room_keeper;
mod rows;
mod schema;
mod status;
mod statuses;
mod store;

#[cfg(test)]
pub(crate) mod tests;

pub(crate) use acks::Acks;
pub(crate) use announce::{RecentReader, RowChange};
pub(crate) use clears::Clears;
pub(crate) use error::{BufferError, Result};
pub(crate) use forwarding::Forwarding;
pub(crate) use handover::{Adoption, Handover};
pub(crate) use intake::Intake;
pub(crate) use replica::{Replica, ReplicaChanges};
pub(crate) use replication::{Commits, Replication, RetainedSpan};
pub(crate) use roles::{PairRecord, Roles};
pub(crate) use room::{RoomStatus, SpaceLimits};
pub(crate) use room_keeper::RoomKeeper;
pub(crate) use rows::Page;
pub(crate) use status::StatusReader;
pub(crate) use statuses::Statuses;

use std::path::Path;

use tokio_util::sync::CancellationToken;

use store::Store;

/// The opened buffer: the one place every capability is handed out from. Only `run` holds it.
#[derive(Clone, Debug)]
pub(crate) struct Buffer {
    store: Store,
}

impl Buffer {
    /// Opens (creating if needed) the buffer file and brings its schema up to date, refusing
    /// Sends past `limits`; `stop` ends a settle's retries. Blocking: call it from a blocking
    /// context or at start-up.
    pub(crate) fn open_with(
        path: &Path,
        limits: SpaceLimits,
        stop: CancellationToken,
    ) -> Result<Self> {
        Ok(Self {
            store: Store::open(path, limits, stop)?,
        })
    }

    /// Opens the buffer with no space limits of its own.
    // Test-only shorthand: the service opens with limits (`open_with`).
    #[cfg(test)]
    pub(crate) fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, SpaceLimits::NONE, CancellationToken::new())
    }

    pub(crate) fn intake(&self) -> Intake {
        Intake::new(self.store.clone())
    }

    pub(crate) fn status(&self) -> StatusReader {
        StatusReader::new(self.store.clone())
    }

    pub(crate) fn statuses(&self) -> Statuses {
        Statuses::new(self.store.clone())
    }

    pub(crate) fn room_keeper(&self) -> RoomKeeper {
        RoomKeeper::new(self.store.clone())
    }

    pub(crate) fn forwarding(&self) -> Forwarding {
        Forwarding::new(self.store.clone())
    }

    pub(crate) fn clears(&self) -> Clears {
        Clears::new(self.store.clone())
    }

    pub(crate) fn acks(&self) -> Acks {
        Acks::new(self.store.clone())
    }

    pub(crate) fn replication(&self) -> Replication {
        Replication::new(self.store.clone())
    }

    pub(crate) fn commits(&self) -> Commits {
        Commits::new(self.store.clone())
    }

    pub(crate) fn replica(&self) -> Replica {
        Replica::new(self.store.clone())
    }

    pub(crate) fn roles(&self) -> Roles {
        Roles::new(self.store.clone())
    }

    pub(crate) fn handover(&self) -> Handover {
        Handover::new(self.store.clone())
    }

    pub(crate) fn adoption(&self) -> Adoption {
        Adoption::new(self.store.clone())
    }

    /// The database itself, for tests that write what no capability may (a row broken by
    /// hand, an old schema's column).
    #[cfg(test)]
    pub(crate) fn db(&self) -> &group_commit::Database {
        &self.store.db
    }
}
