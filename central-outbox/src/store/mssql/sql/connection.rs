//! The statements of a connection's life and of the schema: the pool's check-out probe, the
//! health probe, and the migration runner's lock, ledger and transaction (`migrate`). The
//! session-level ones (the check-out probe, the lock, its release and the ledger row that ends a
//! migration's transaction) do not start with `SET XACT_ABORT ON`: the migration's transaction
//! was opened by [`MIGRATION_BEGIN`], which sets it for the session.

use std::time::Duration;

use super::super::migrate::Migration;
use super::super::millis_i32;
use super::{Param, Statement, text};

/// Pool check-out: a round trip, and no transaction left open by an earlier batch.
pub const CHECK_CONNECTION: &str = include_str!("check_connection.sql");

/// The health probe: a round trip on a pooled connection that opens and commits a transaction.
pub const PING: &str = include_str!("ping.sql");

/// The application lock that serialises migrations between replicas starting together, waiting
/// up to `wait` for it (@P1, in milliseconds). Owned by the session, so it is released when the
/// migrating connection closes, even on a crash. Named after the database: SQL Server scopes
/// application locks to the database anyway, but Babelfish takes them server-wide, where
/// centrals of unrelated databases would queue behind each other's migrations. Result:
/// sp_getapplock's return code (>= 0: granted).
pub fn migration_lock(wait: Duration) -> Statement {
    Statement::fixed(include_str!("migration_lock.sql"))
        .set("@P1", Param::Int(Some(millis_i32(wait))))
}

/// Releases [`migration_lock`]'s lock.
pub const MIGRATION_UNLOCK: &str = include_str!("migration_unlock.sql");

/// Creates the migrations ledger if needed and reads the schema version.
pub const MIGRATION_VERSION: &str = include_str!("migration_version.sql");

/// Opens a migration's transaction. The file's batches follow (see [`migration_batches`]), then
/// [`migration_record`]: the file's changes and its ledger row commit together, and an error
/// anywhere rolls all of it back (XACT_ABORT stays on for the session).
pub const MIGRATION_BEGIN: &str = include_str!("migration_begin.sql");

/// The batches of a migration file, in order: its text split at lines that hold only `GO`, as
/// SQL Server's own tools do (a CREATE PROCEDURE must be alone in its batch).
pub fn migration_batches(file: &str) -> Vec<&str> {
    let mut batches = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in file.split_inclusive('\n') {
        if line.trim().eq_ignore_ascii_case("GO") {
            batches.push(&file[start..offset]);
            start = offset + line.len();
        }
        offset += line.len();
    }
    batches.push(&file[start..]);
    batches.retain(|batch| !batch.trim().is_empty());
    batches
}

/// Writes migration `m`'s ledger row (@P1: version, @P2: name) and commits it with the file's
/// changes.
pub fn migration_record(m: &Migration) -> Statement {
    Statement::fixed(include_str!("migration_record.sql"))
        .set("@P1", Param::Int(Some(m.version)))
        .set("@P2", text(m.name))
}
