//! The statements of a connection's life and of the schema: the pool's check-out probe, the
//! health probe, the migration runner's lock, ledger and transaction (`migrate`), and the
//! procedures' ledger and drop (`procedures`). The session-level ones (the check-out probe, the
//! lock, its release and the ledger rows that end a migration's or a procedure's transaction)
//! do not start with `SET XACT_ABORT ON`: the transaction was opened by [`MIGRATION_BEGIN`],
//! which sets it for the session.

use std::time::Duration;

use super::super::migrate::Migration;
use super::super::millis_i32;
use super::super::procedures::{Kind, Procedure};
use super::{BATCH_START, Param, Statement, text};

/// Pool check-out: a round trip, and no transaction left open by an earlier batch.
pub(crate) const CHECK_CONNECTION: &str = include_str!("check_connection.sql");

/// The health probe: a round trip on a pooled connection that opens and commits a transaction.
pub(crate) const PING: &str = include_str!("ping.sql");

/// The application lock that serialises migrations between replicas starting together, waiting
/// up to `wait` for it (@P1, in milliseconds). Owned by the session, so it is released when the
/// migrating connection closes, even on a crash. Named after the database: SQL Server scopes
/// application locks to the database anyway, but Babelfish takes them server-wide, where
/// centrals of unrelated databases would queue behind each other's migrations. Result:
/// sp_getapplock's return code (>= 0: granted).
pub(crate) fn migration_lock(wait: Duration) -> Statement {
    Statement::fixed(include_str!("migration_lock.sql"))
        .set("@P1", Param::Int(Some(millis_i32(wait))))
}

/// Releases [`migration_lock`]'s lock.
pub(crate) const MIGRATION_UNLOCK: &str = include_str!("migration_unlock.sql");

/// Creates the migrations ledger if needed and reads the schema version.
pub(crate) const MIGRATION_VERSION: &str = include_str!("migration_version.sql");

/// Opens a migration's transaction. The file's batches follow (see [`migration_batches`]), then
/// [`migration_record`]: the file's changes and its ledger row commit together, and an error
/// anywhere rolls all of it back (XACT_ABORT stays on for the session).
pub(crate) const MIGRATION_BEGIN: &str = include_str!("migration_begin.sql");

/// The batches of a migration file, in order: its text split at lines that hold only `GO`, as
/// SQL Server's own tools do (a column added by ALTER TABLE can only be named by a later batch).
/// A batch of comments alone is left out: a migration emptied of the procedures it used to create
/// keeps only the comment that says where they went.
pub(crate) fn migration_batches(file: &str) -> Vec<&str> {
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
    batches.retain(|batch| {
        batch.lines().any(|line| {
            let line = line.trim();
            !line.is_empty() && !line.starts_with("--")
        })
    });
    batches
}

/// Writes migration `m`'s ledger row (@P1: version, @P2: name) and commits it with the file's
/// changes.
pub(crate) fn migration_record(m: &Migration) -> Statement {
    Statement::fixed(include_str!("migration_record.sql"))
        .set("@P1", Param::Int(Some(m.version)))
        .set("@P2", text(m.name))
}

/// Each procedure's `dbo.SchemaProcedures` row (Name, Revision, Sha256) and whether its object
/// exists (Present: 1 or 0), so that one dropped by hand is created again.
pub(crate) const PROCEDURE_VERSIONS: &str = include_str!("procedure_versions.sql");

/// Drops procedure `p` if it exists, in a batch of its own before its file's CREATE (which must
/// be alone in its batch). Built from the name, which is one of `procedures::PROCEDURES` (a name
/// cannot be bound): the same guarded drop the migrations used to write before each CREATE.
pub(crate) fn drop_procedure(p: &Procedure) -> String {
    let (kind, type_code) = match p.kind {
        Kind::Procedure => ("PROCEDURE", "P"),
        Kind::Function => ("FUNCTION", "FN"),
        Kind::Trigger => ("TRIGGER", "TR"),
    };
    let name = p.name;
    format!(
        "{BATCH_START}IF OBJECT_ID(N'dbo.{name}', N'{type_code}') IS NOT NULL\n    \
         DROP {kind} dbo.{name};"
    )
}

/// Records procedure `p` at `revision` with its file's SHA-256 (@P1: name, @P2: revision, @P3:
/// hash) and commits it with the procedure's drop and create.
pub(crate) fn procedure_record(p: &Procedure, revision: i32) -> Statement {
    Statement::fixed(include_str!("procedure_record.sql"))
        .set("@P1", text(p.name))
        .set("@P2", Param::Int(Some(revision)))
        .set("@P3", Param::Binary(p.sha256().to_vec()))
}
