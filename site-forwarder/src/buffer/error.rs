//! Why a buffer operation failed. One error for every capability: they share one database, and
//! the gRPC edge maps it to a status in one place (`grpc::buffer_status`).

use super::room::NoRoom;

/// Why a buffer operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BufferError {
    #[error("site buffer: {0}")]
    Database(#[from] group_commit::Error),
    #[error("site buffer holds invalid data: {0}")]
    Corrupt(String),
    /// A Send refused to keep room for draining (see `super::room`); nothing was stored.
    #[error("the site buffer takes no Sends now: {0}")]
    NoRoom(#[from] NoRoom),
}

impl BufferError {
    /// Whether the disk was full: SQLite's SQLITE_FULL, from a statement or from the commit.
    pub fn is_disk_full(&self) -> bool {
        let Self::Database(group_commit::Error::Sqlite(e) | group_commit::Error::Commit(e)) = self
        else {
            return false;
        };
        matches!(
            e.as_ref(),
            rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull
        )
    }

    /// Whether the whole group commit failed (disk full, I/O error, the file locked by another
    /// process): not this job's fault, and worth trying again after a pause.
    pub(super) fn is_commit_failure(&self) -> bool {
        matches!(self, Self::Database(group_commit::Error::Commit(_))) || self.is_disk_full()
    }
}

impl From<rusqlite::Error> for BufferError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Database(e.into())
    }
}

pub(crate) type Result<T, E = BufferError> = std::result::Result<T, E>;
