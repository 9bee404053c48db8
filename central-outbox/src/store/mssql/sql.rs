//! Every T-SQL statement the MS SQL backend sends, in one place. The dispatcher's two busiest
//! (claiming and recording outcomes) and the single-row submit (also each keyed row of a larger
//! submit) call stored procedures, whose bodies are in the migrations that create them
//! (migrations/mssql/0002_dispatch_procedures.sql, recreated by 0004 to 0007), and so does the
//! digest claim (0007): a one-line call costs a server far less to parse than the batch would.
//!
//! Rules they keep:
//! - One batch per unit of work, starting `SET XACT_ABORT ON` so any error rolls the whole
//!   transaction back; writes that touch several rows or tables run in one explicit transaction,
//!   which also makes a deadlock victim (1205) safe to run again.
//! - Values are always bound (`@P1`, `@P2`, ...), never spliced into the text. Each statement
//!   with parameters has a function right after its text that takes the values in domain terms
//!   and returns the [`Statement`] with every value under the placeholder it fills, so the text
//!   and what it is bound with are read together. The statements whose shape varies (filters,
//!   row counts) are built from the fixed fragments below, with placeholders numbered by
//!   [`Statement::bind`].
//! - Columns are qualified wherever an OUTPUT clause is present; OUTPUT goes INTO a table
//!   variable whose columns match it in order.
//! - Portable to Babelfish for PostgreSQL: no MERGE, no CREATE OR ALTER, no update through a
//!   CTE, no WAITFOR, no rowversion, no SERIALIZABLE or REPEATABLE READ. Table hints are a speed-up
//!   on SQL Server (which Babelfish ignores): every claim and action re-checks its condition in
//!   the UPDATE itself, so correctness never depends on READPAST skipping a locked row.
//! - Times come from the database's clock (`SYSUTCDATETIME()`) wherever replicas must agree
//!   (claims, leases, CreatedAt); instants computed by the dispatcher (next attempt, resolution)
//!   and query bounds are bound as datetime2(7) and compared at full precision.
//!
//! Each statement has a committed snapshot under `sql/` beside this file, which the tests compare
//! and parse as T-SQL (see `tests` below); set `UPDATE_SNAPSHOTS=1` to rewrite them.

use std::borrow::Cow;
use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::migrate::Migration;
use super::pool::Param;
use super::{millis_i32, millis_i64};
use crate::domain::channel::{SmtpAuth, SmtpSettings};
use crate::domain::consolidation::Consolidation;
use crate::domain::history::{Actor, OperatorAction, site_actor};
use crate::domain::query::NotificationFilter;
use crate::domain::retry::Backoff;
use crate::domain::serve_order::ClaimLanes;
use crate::domain::site_health::SiteHealthReport;
use crate::domain::{ConditionKey, NotificationId, NotificationType, SiteId};
use crate::records::{AttemptRecord, LeaseEpoch, NewNotification};

/// A statement with its parameters, in placeholder order: a fixed text with the values its
/// function beside it binds, or one assembled from fixed fragments.
#[derive(Debug, Default)]
pub struct Statement {
    pub sql: Cow<'static, str>,
    pub params: Vec<Param>,
}

impl Statement {
    /// A fixed statement, whose values are then bound with [`Self::set`].
    fn fixed(sql: &'static str) -> Self {
        Self {
            sql: Cow::Borrowed(sql),
            params: Vec::new(),
        }
    }

    /// A statement to assemble, starting with `sql`.
    pub fn new(sql: &str) -> Self {
        Self {
            sql: Cow::Owned(sql.to_owned()),
            params: Vec::new(),
        }
    }

    /// Binds `value` to `placeholder`, which must be the next one (`@P1`, then `@P2`, ...):
    /// each fixed statement's function names every value by the placeholder it fills, beside
    /// the text that uses it. Out of order is a bug in this file, caught by debug builds and by
    /// the tests (`every_placeholder_is_bound_once`).
    fn set(mut self, placeholder: &str, value: Param) -> Self {
        self.params.push(value);
        debug_assert_eq!(
            placeholder,
            format!("@P{}", self.params.len()),
            "parameters bound out of order"
        );
        self
    }

    /// Binds a value and returns its placeholder.
    pub fn bind(&mut self, value: Param) -> String {
        self.params.push(value);
        format!("@P{}", self.params.len())
    }

    pub fn push(&mut self, fragment: &str) {
        self.sql.to_mut().push_str(fragment);
    }

    /// Appends `before`, a fresh placeholder for `value`, then `after`.
    fn push_bound(&mut self, before: &str, value: Param, after: &str) {
        let placeholder = self.bind(value);
        self.push(before);
        self.push(&placeholder);
        self.push(after);
    }
}

fn text(value: &str) -> Param {
    Param::Text(Some(value.to_owned()))
}

fn guid(id: NotificationId) -> Param {
    Param::Guid(Some(*id.as_uuid()))
}

fn int(value: u32) -> Param {
    Param::Int(Some(int_value(value)))
}

fn int_value(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// Prepends the settings every batch starts with.
macro_rules! batch {
    ($($body:expr),+ $(,)?) => {
        concat!("SET XACT_ABORT ON;\nSET NOCOUNT ON;\n", $($body),+)
    };
}

/// The columns `decode::state` reads, from `dbo.Notifications AS n`.
macro_rules! state_columns {
    () => {
        "n.Id, n.NotificationId, n.Status, n.Type, n.ListName, n.Subject, n.SourceSiteId, \
         n.RetryCount, n.LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, \
         n.NextAttemptAt, n.DeliveredAt, n.ResolvedAt, n.Priority, n.ConditionKey"
    };
}

/// The database's clock, once per batch, rounded to the columns' millisecond precision.
macro_rules! declare_now {
    () => {
        "DECLARE @now datetime2(3) = SYSUTCDATETIME();\n"
    };
}

// ---------------------------------------------------------------------------------------------
// Connections and migrations

/// Pool check-out: a round trip, and no transaction left open by an earlier batch.
pub const CHECK_CONNECTION: &str = "SELECT @@TRANCOUNT AS OpenTransactions;";

/// The health probe: a round trip on a pooled connection that opens and commits a transaction.
pub const PING: &str = batch!(
    "BEGIN TRANSACTION;
COMMIT TRANSACTION;
SELECT 1 AS Ok;"
);

/// The application lock that serialises migrations between replicas starting together. Owned
/// by the session, so it is released when the migrating connection closes, even on a crash.
/// Named after the database: SQL Server scopes application locks to the database anyway, but
/// Babelfish takes them server-wide, where centrals of unrelated databases would queue behind
/// each other's migrations. @P1: lock timeout in milliseconds. Result: sp_getapplock's return
/// code (>= 0: granted).
pub const MIGRATION_LOCK: &str = "\
DECLARE @result int;
DECLARE @resource nvarchar(255) = N'central-outbox/schema-migrations/' + DB_NAME();
EXEC @result = sp_getapplock @Resource = @resource, @LockMode = N'Exclusive', @LockOwner = N'Session', @LockTimeout = @P1;
SELECT @result AS Result;";

/// [`MIGRATION_LOCK`], waiting up to `wait` for the lock.
pub fn migration_lock(wait: Duration) -> Statement {
    Statement::fixed(MIGRATION_LOCK).set("@P1", Param::Int(Some(millis_i32(wait))))
}

pub const MIGRATION_UNLOCK: &str = "\
DECLARE @resource nvarchar(255) = N'central-outbox/schema-migrations/' + DB_NAME();
EXEC sp_releaseapplock @Resource = @resource, @LockOwner = N'Session';";

/// Creates the migrations ledger if needed and reads the schema version.
pub const MIGRATION_VERSION: &str = batch!(
    "IF OBJECT_ID(N'dbo.SchemaMigrations', N'U') IS NULL
BEGIN
CREATE TABLE dbo.SchemaMigrations (
    Version   int NOT NULL,
    Name      nvarchar(128) NOT NULL,
    AppliedAt datetime2(3) NOT NULL,
    CONSTRAINT PK_SchemaMigrations PRIMARY KEY CLUSTERED (Version)
);
END;
SELECT COALESCE(MAX(m.Version), 0) AS Version FROM dbo.SchemaMigrations AS m;"
);

/// Opens a migration's transaction. The file's batches follow (see [`migration_batches`]), then
/// [`MIGRATION_RECORD`]: the file's changes and its ledger row commit together, and an error
/// anywhere rolls all of it back (XACT_ABORT stays on for the session).
pub const MIGRATION_BEGIN: &str = batch!("BEGIN TRANSACTION;");

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

/// Writes a migration's ledger row and commits it with the file's changes. @P1: version,
/// @P2: name.
pub const MIGRATION_RECORD: &str = "\
INSERT INTO dbo.SchemaMigrations (Version, Name, AppliedAt) VALUES (@P1, @P2, SYSUTCDATETIME());
COMMIT TRANSACTION;";

/// [`MIGRATION_RECORD`] of migration `m`.
pub fn migration_record(m: &Migration) -> Statement {
    Statement::fixed(MIGRATION_RECORD)
        .set("@P1", Param::Int(Some(m.version)))
        .set("@P2", text(m.name))
}

// ---------------------------------------------------------------------------------------------
// Ingest

/// The columns of one row of [`insert_batch`] (a plain row: no condition key, not cleared at the
/// site), in the order it binds them.
pub const SUBMIT_COLUMNS: usize = 14;

/// The parameters of a row with a condition key or cleared at the site, as the submit procedure
/// takes them ([`SUBMIT_ONE_KEYED`], and such a row of [`insert_in_order`]): a plain row's
/// [`SUBMIT_COLUMNS`], then its condition key, when the site cleared it and who did. A plain
/// row's call leaves those three out (they default to NULL): on Babelfish, three more
/// parameters cost a single-row submit ~3%.
pub const SUBMIT_PARAMS: usize = 17;

/// Whether `new` goes in the INSERT of many rows ([`insert_batch`]): it has no condition key
/// (it supersedes nothing) and was not cleared at the site (it is stored Pending, with no
/// history entry).
fn is_plain(new: &NewNotification) -> bool {
    new.submission.condition_key.is_none() && new.submission.cleared_at_site.is_none()
}

/// One submitted row's values, in the order of the VALUES columns of [`insert_batch`]
/// (NotificationId ... SiteEnqueuedAt, Priority).
fn submitted_row(new: &NewNotification) -> [Param; SUBMIT_COLUMNS] {
    let s = &new.submission;
    let p = &s.provenance;
    [
        guid(s.id),
        text(s.content.kind.as_str()),
        text(s.content.list_name.as_str()),
        text(s.content.subject.as_str()),
        text(s.content.body.as_str()),
        text(s.content.type_data.as_str()),
        Param::Binary(new.hash.0.to_vec()),
        text(p.source_site_id.as_str()),
        text(&p.source_instance_id),
        text(&p.source_script),
        Param::Guid(p.origin_execution_id),
        Param::Guid(p.origin_parent_execution_id),
        at(p.site_enqueued_at),
        Param::Int(Some(i32::from(s.priority.rank()))),
    ]
}

/// One submitted row's values as the submit procedure takes them: [`submitted_row`], then the
/// condition key, when the site cleared the row and the history's actor for that (the site, as
/// `domain::history::site_actor` names it), each NULL when not set.
fn submit_params(new: &NewNotification) -> impl Iterator<Item = Param> {
    let s = &new.submission;
    let cleared_by = s.cleared_at_site.map(|_| {
        site_actor(s.provenance.source_site_id.as_str())
            .as_str()
            .to_owned()
    });
    submitted_row(new).into_iter().chain([
        Param::Text(s.condition_key.as_ref().map(|k| k.as_str().to_owned())),
        Param::Time(s.cleared_at_site),
        Param::Text(cleared_by),
    ])
}

/// A row's values as every ingest statement binds them: a plain row's [`SUBMIT_COLUMNS`], a
/// keyed or cleared one's [`SUBMIT_PARAMS`].
fn row_params(new: &NewNotification) -> Vec<Param> {
    if is_plain(new) {
        submitted_row(new).into()
    } else {
        submit_params(new).collect()
    }
}

/// The statement that stores `rows` (distinct ids, each with its [`row_params`]): a single row
/// through [`SUBMIT_ONE`] or [`SUBMIT_ONE_KEYED`], plain rows ([`is_plain`]) of lists not in
/// `consolidating` through [`insert_batch`], and rows among which one has a condition key, was
/// cleared at the site or is for a list in `consolidating` through [`insert_in_order`]. Each
/// answers every row's stored content hash and whether it inserted it, unless a list of a row
/// it would store in an INSERT of many rows consolidates after all: then it stores nothing and
/// answers only those lists (see [`consolidation_guard`]).
///
/// The procedure counts a row as an arrival of its list's window and holds it if it is over the
/// threshold (migration 0007); the INSERT of many rows does not, so a row of a list that
/// consolidates goes through the procedure, in batch order, as a keyed row does.
pub fn insert_rows(rows: &[&NewNotification], consolidating: &HashSet<String>) -> Statement {
    if let [one] = rows {
        return submit_one(one);
    }
    let plain: Vec<bool> = rows.iter().map(|new| is_plain(new)).collect();
    let insertable: Vec<bool> = rows
        .iter()
        .zip(&plain)
        .map(|(new, &plain)| {
            plain && !consolidating.contains(new.submission.content.list_name.as_str())
        })
        .collect();
    let all_in_one = insertable.iter().all(|&i| i);
    let in_insert = if all_in_one {
        insertable.clone()
    } else {
        in_order_layout(&insertable)
    };
    // The lists of the rows an INSERT stores, each once, for the guard.
    let mut lists: Vec<&str> = Vec::new();
    for (new, _) in rows.iter().zip(&in_insert).filter(|(_, i)| **i) {
        let list = new.submission.content.list_name.as_str();
        if !lists.contains(&list) {
            lists.push(list);
        }
    }
    let sql = if all_in_one {
        insert_batch(rows.len(), lists.len())
    } else {
        insert_in_order(&plain, &insertable, lists.len())
    };
    let mut params: Vec<Param> = rows.iter().flat_map(|new| row_params(new)).collect();
    params.extend(lists.into_iter().map(text));
    Statement {
        sql: Cow::Owned(sql),
        params,
    }
}

/// Plain rows in a row from which [`insert_in_order`] stores them with one [`insert_plain`]
/// rather than one procedure call each. On Babelfish, which parses every statement of a batch
/// on every call, the INSERT's long text costs about as much as twenty calls: 100 rows with a
/// keyed one in every ten took 103 ms with their runs of nine in INSERTs and 76 ms all as
/// calls; with a keyed one in every 25, 68 - 75 ms against 75 - 77 ms (measured while a plain
/// row's call still passed all [`SUBMIT_PARAMS`]; 100 plain rows in one INSERT: 55 ms).
const MIN_INSERT_RUN: usize = 20;

/// How [`insert_in_order`] stores each of a batch's rows, given which may go in an INSERT of
/// many rows (plain, [`is_plain`], and of a list not known to consolidate): `true` in the
/// INSERT of its run of such rows (one of at least [`MIN_INSERT_RUN`]), `false` through the
/// submit procedure.
fn in_order_layout(insertable: &[bool]) -> Vec<bool> {
    let mut in_insert = vec![false; insertable.len()];
    let mut start = 0;
    while start < insertable.len() {
        let run = insertable[start..].iter().take_while(|&&p| p).count();
        if run >= MIN_INSERT_RUN {
            in_insert[start..start + run].fill(true);
        }
        start += run.max(1);
    }
    in_insert
}

/// The two reads of a new row's serve turn (`domain::serve_order::serve_turn`) for type `$type`,
/// priority `$priority` and site `$site` (column references or placeholders), as the columns
/// `Head` (the smallest turn waiting at that type and priority, in flight or not: the first
/// entry of IX_Notifications_Serve there, whose filter `Priority >= 0` the read states to use
/// it) and `SiteLast` (the newest turn the site has waiting there: the last entry of
/// IX_Notifications_Site_Turn, which leaves turn 0 out, changing no turn), each NULL when
/// nothing waits. Each is one seek (migrations/mssql/0005_serve_order.sql). No hint or stricter
/// isolation serialises two submits at once: both may read the same turns and store the same
/// turn, a tie the claim gives to the older row (Id), as the rule does for rows stored
/// together.
macro_rules! serve_turn_reads {
    ($type:literal, $priority:literal, $site:literal) => {
        concat!(
            "(SELECT MIN(s.ServeTurn)
        FROM dbo.Notifications AS s
        WHERE s.Type = ",
            $type,
            " AND s.Priority = ",
            $priority,
            "
          AND s.Status IN (N'Pending', N'Retrying') AND s.Priority >= 0) AS Head,
        (SELECT MAX(l.ServeTurn)
        FROM dbo.Notifications AS l
        WHERE l.Type = ",
            $type,
            " AND l.Priority = ",
            $priority,
            " AND l.SourceSiteId = ",
            $site,
            "
          AND l.Status IN (N'Pending', N'Retrying') AND l.ServeTurn > 0) AS SiteLast"
        )
    };
}

/// The column of [`consolidation_guard`]'s answer.
pub const CONSOLIDATING_LIST: &str = "ConsolidatingList";

/// The start of a batch that stores rows in an INSERT of many rows ([`insert_plain`]), which
/// neither counts nor holds a row of a list that consolidates; their lists, each once, are
/// bound after every row's values, from placeholder `@P{first}` on (`lists` of them). If one of
/// those lists consolidates (the caller did not know, or it does since), the batch stores
/// nothing and answers those lists (column [`CONSOLIDATING_LIST`]), and the caller sends the
/// rows again with those lists' rows through the procedure. Otherwise its answer is empty, and
/// the batch goes on. One seek per list in the same round trip, rather than a round trip to read
/// the lists' settings first: a batch of lists that do not consolidate costs about what it did
/// (100 plain rows of one list on Babelfish: 47.6 ms against 47.1 ms without the guard, median
/// of 55; naming each row's list placeholder instead, 100 of them, cost 9 ms of parsing).
fn consolidation_guard(first: usize, lists: usize) -> String {
    let lists: Vec<String> = (first..first + lists).map(|p| format!("@P{p}")).collect();
    format!(
        "SELECT l.Name AS {CONSOLIDATING_LIST}
FROM dbo.NotificationLists AS l
WHERE l.ConsolidateThreshold IS NOT NULL AND l.Name IN ({});
IF @@ROWCOUNT > 0 RETURN;
",
        lists.join(", ")
    )
}

/// The ids the INSERTs of plain rows ([`insert_plain`]) stored, for the answer.
const INSERTED_TABLE: &str =
    "DECLARE @inserted TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY);\n";

/// Inserts every row whose id is not stored yet, then reports for each id in the batch its
/// stored content hash and whether this batch inserted it. Not an upsert: a row that exists is
/// left as it is. Two batches inserting the same new id at once make one of them fail with
/// 2627/2601; the caller then stores its rows one by one with [`SUBMIT_ONE`]. Plain rows only
/// ([`is_plain`]), of lists that do not consolidate ([`consolidation_guard`] first); see
/// [`insert_plain`] for how each row gets its serve turn. The rows' `lists` distinct lists
/// follow their values.
pub fn insert_batch(rows: usize, lists: usize) -> String {
    let firsts: Vec<usize> = (0..rows).map(|row| row * SUBMIT_COLUMNS + 1).collect();
    format!(
        "{}{}{}{INSERTED_TABLE}{}{}",
        batch!(""),
        consolidation_guard(rows * SUBMIT_COLUMNS + 1, lists),
        declare_now!(),
        insert_plain(&firsts),
        plain_answers(&firsts)
    )
}

/// The INSERT of the plain rows whose values start at the placeholders `firsts` (each row's
/// [`SUBMIT_COLUMNS`] in a row), in that order, recording the ids it stored in `@inserted`; it
/// needs `@now` and `@inserted` declared before it.
///
/// Each new row gets its serve turn as if the rows were stored one after another in batch order
/// (as the SQLite backend stores them): a site's rows at one type and priority take consecutive
/// turns (ROW_NUMBER in batch order, `Ord`) from one past the later of the head turn and the
/// site's newest waiting turn ([`serve_turn_reads`], read once before the INSERT). When nothing
/// waited at that type and priority, the batch's first row there starts the turns at 1, and
/// the head it leaves is then 1 for every other site of the batch, which starts at 2. Only the
/// rows inserted count (the window functions run after NOT EXISTS). Sites are told apart by the
/// column's binary collation, not the default one: "North" and "north" are two sites. Plain rows
/// supersede nothing, so the turns read once are those each row would read in its turn.
///
/// The rows reach the INSERT in batch order, so that their Ids (which break ties between equal
/// turns and equal due times) follow it as they do on SQLite: the window functions leave them
/// sorted by group, and the TOP of all of them ORDER BY Ord sorts them back (checked on
/// Babelfish; SQL Server numbers the rows as the sorted TOP hands them over, though it documents
/// that order only for an ORDER BY on the INSERT's own SELECT). That ORDER BY is not used:
/// Babelfish 4.4 rejects it next to OUTPUT ("syntax error at or near ORDER").
fn insert_plain(firsts: &[usize]) -> String {
    let values: Vec<String> = firsts
        .iter()
        .enumerate()
        .map(|(ord, &first)| {
            let placeholders: Vec<String> = (first..first + SUBMIT_COLUMNS)
                .map(|i| format!("@P{i}"))
                .collect();
            format!("({}, {})", ord + 1, placeholders.join(", "))
        })
        .collect();
    format!(
        "INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, Priority, ServeTurn)
OUTPUT inserted.NotificationId INTO @inserted
SELECT w.NotificationId, w.Type, w.ListName, w.Subject, w.Body, w.TypeData, w.ContentHash, N'Pending', w.SourceSiteId, w.SourceInstanceId, w.SourceScript, w.OriginExecutionId, w.OriginParentExecutionId, w.SiteEnqueuedAt, @now, @now, w.Priority, w.ServeTurn
FROM (
    SELECT TOP ({}) g.Ord, g.NotificationId, g.Type, g.ListName, g.Subject, g.Body, g.TypeData, g.ContentHash, g.SourceSiteId, g.SourceInstanceId, g.SourceScript, g.OriginExecutionId, g.OriginParentExecutionId, g.SiteEnqueuedAt, g.Priority,
        CASE WHEN g.Head IS NULL AND g.SiteLast IS NULL THEN CASE WHEN g.SiteFirst = g.GroupFirst THEN 0 ELSE 1 END
            WHEN COALESCE(g.SiteLast, 0) > COALESCE(g.Head, 0) THEN g.SiteLast
            ELSE COALESCE(g.Head, 0) END
        + ROW_NUMBER() OVER (PARTITION BY g.Type, g.Priority, g.SourceSiteId COLLATE Latin1_General_BIN2 ORDER BY g.Ord) AS ServeTurn
    FROM (
        SELECT v.Ord, v.NotificationId, v.Type, v.ListName, v.Subject, v.Body, v.TypeData, v.ContentHash, v.SourceSiteId, v.SourceInstanceId, v.SourceScript, v.OriginExecutionId, v.OriginParentExecutionId, v.SiteEnqueuedAt, v.Priority,
            {},
            MIN(v.Ord) OVER (PARTITION BY v.Type, v.Priority) AS GroupFirst,
            MIN(v.Ord) OVER (PARTITION BY v.Type, v.Priority, v.SourceSiteId COLLATE Latin1_General_BIN2) AS SiteFirst
        FROM (VALUES
            {}
        ) AS v (Ord, NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, Priority)
        WHERE NOT EXISTS (SELECT 1 FROM dbo.Notifications AS e WHERE e.NotificationId = v.NotificationId)
    ) AS g
    ORDER BY g.Ord
) AS w;
",
        firsts.len(),
        serve_turn_reads!("v.Type", "v.Priority", "v.SourceSiteId"),
        values.join(",\n            "),
    )
}

/// The answer for the plain rows whose ids are at the placeholders `firsts`: each id's stored
/// content hash, and whether `@inserted` holds it.
fn plain_answers(firsts: &[usize]) -> String {
    let ids: Vec<String> = firsts.iter().map(|first| format!("@P{first}")).collect();
    format!(
        "SELECT n.NotificationId, n.ContentHash, CASE WHEN i.NotificationId IS NULL THEN 0 ELSE 1 END AS Inserted
FROM dbo.Notifications AS n
LEFT JOIN @inserted AS i ON i.NotificationId = n.NotificationId
WHERE n.NotificationId IN ({});",
        ids.join(", ")
    )
}

/// Stores rows among which at least one has a condition key or was cleared at the site, one
/// after another in batch order as the SQLite backend stores them, in one transaction: each
/// keyed or cleared row through the submit procedure (which stores the key, stores a cleared
/// row Cleared with its history entry and lets a keyed row supersede the older waiting ones of
/// its site, list and key, migrations/mssql/0006_condition_keys.sql), a long run of plain rows
/// between them through one [`insert_plain`] (see [`in_order_layout`]), a short one through the
/// procedure too, every row at the batch's `@now`. Every statement sees what the ones before it stored and ended, so a later row
/// of a site, list and key supersedes an earlier one of the same batch, and every serve turn is
/// the one the row reads in its turn (a run of plain rows supersedes nothing, so the turns read
/// once at its start are those). One INSERT of all the rows, then their supersedes, would not
/// do: a supersede can end the head turn, or a site's newest one, that a later row reads (and
/// on Babelfish that statement cost more than the calls, measured). `plain[i]` tells whether
/// row i is plain; its values start at the next placeholder ([`SUBMIT_COLUMNS`] for a plain
/// row, [`SUBMIT_PARAMS`] for the others). `insertable[i]` tells whether row i may go in an
/// INSERT: plain, and of a list not known to consolidate (a row of a list that does goes
/// through the procedure, which counts and holds it; the INSERTs' lists are checked first by
/// [`consolidation_guard`], whose `lists` distinct lists of the rows in INSERTs follow every
/// row's values). Answers as [`insert_batch`]: one result per call, then one for the rows of the
/// INSERTs; the caller matches them by id.
pub fn insert_in_order(plain: &[bool], insertable: &[bool], lists: usize) -> String {
    let in_insert = in_order_layout(insertable);
    let any_insert = in_insert.iter().any(|&i| i);
    let mut sql = String::from(batch!(""));
    if any_insert {
        let values: usize = plain
            .iter()
            .map(|&p| if p { SUBMIT_COLUMNS } else { SUBMIT_PARAMS })
            .sum();
        sql.push_str(&consolidation_guard(values + 1, lists));
    }
    sql.push_str(declare_now!());
    if any_insert {
        sql.push_str(INSERTED_TABLE);
    }
    sql.push_str("BEGIN TRANSACTION;\n");
    let (mut next, mut run, mut inserted) = (1, Vec::new(), Vec::new());
    for (&plain, in_insert) in plain.iter().zip(in_insert) {
        if in_insert {
            run.push(next);
            inserted.push(next);
        } else {
            if !run.is_empty() {
                sql.push_str(&insert_plain(&run));
                run.clear();
            }
            sql.push_str(&submit_call(next, !plain, true));
            sql.push('\n');
        }
        next += if plain { SUBMIT_COLUMNS } else { SUBMIT_PARAMS };
    }
    if !run.is_empty() {
        sql.push_str(&insert_plain(&run));
    }
    sql.push_str("COMMIT TRANSACTION;");
    if any_insert {
        sql.push('\n');
        sql.push_str(&plain_answers(&inserted));
    }
    sql
}

/// The submit procedure's parameters, in the order [`submit_params`] binds them.
const SUBMIT_ARGS: [&str; SUBMIT_PARAMS] = [
    "NotificationId",
    "Type",
    "ListName",
    "Subject",
    "Body",
    "TypeData",
    "ContentHash",
    "SourceSiteId",
    "SourceInstanceId",
    "SourceScript",
    "OriginExecutionId",
    "OriginParentExecutionId",
    "SiteEnqueuedAt",
    "Priority",
    "ConditionKey",
    "ClearedAtSite",
    "ClearedBy",
];

/// A call of the submit procedure with its values from placeholder `@P{first}` on: all
/// [`SUBMIT_PARAMS`] for a `keyed` row (a key, or cleared at the site), a plain row's
/// [`SUBMIT_COLUMNS`] otherwise; `at_now`: the row is stored at the batch's `@now` (one time for
/// every row of a submit, as on SQLite), otherwise at the time of the call.
fn submit_call(first: usize, keyed: bool, at_now: bool) -> String {
    let count = if keyed { SUBMIT_PARAMS } else { SUBMIT_COLUMNS };
    let mut args: Vec<String> = SUBMIT_ARGS[..count]
        .iter()
        .enumerate()
        .map(|(i, name)| format!("@{name} = @P{}", first + i))
        .collect();
    if at_now {
        args.push("@SubmittedAt = @now".into());
    }
    format!("EXEC dbo.SubmitNotification {};", args.join(", "))
}

/// A single plain row ([`is_plain`]), through the stored procedure of migration 0006
/// (migrations/mssql/0006_condition_keys.sql, first created by 0004: on Babelfish ~0.9 ms against
/// ~3 ms for the batch of one row), which gives the row its serve turn with the reads of
/// [`serve_turn_reads`]. Result as [`insert_batch`]'s. Also the fallback, row by row, after a
/// duplicate key.
pub const SUBMIT_ONE: &str = batch!(
    "EXEC dbo.SubmitNotification @NotificationId = @P1, @Type = @P2, @ListName = @P3, @Subject = @P4, @Body = @P5, @TypeData = @P6, @ContentHash = @P7, @SourceSiteId = @P8, @SourceInstanceId = @P9, @SourceScript = @P10, @OriginExecutionId = @P11, @OriginParentExecutionId = @P12, @SiteEnqueuedAt = @P13, @Priority = @P14;"
);

/// [`SUBMIT_ONE`] of a row with a condition key or cleared at the site: the procedure also
/// stores its key, stores a row cleared at the site Cleared with its history entry, and lets a
/// keyed row supersede the older waiting ones of its site, list and key.
pub const SUBMIT_ONE_KEYED: &str = batch!(
    "EXEC dbo.SubmitNotification @NotificationId = @P1, @Type = @P2, @ListName = @P3, @Subject = @P4, @Body = @P5, @TypeData = @P6, @ContentHash = @P7, @SourceSiteId = @P8, @SourceInstanceId = @P9, @SourceScript = @P10, @OriginExecutionId = @P11, @OriginParentExecutionId = @P12, @SiteEnqueuedAt = @P13, @Priority = @P14, @ConditionKey = @P15, @ClearedAtSite = @P16, @ClearedBy = @P17;"
);

/// [`SUBMIT_ONE`] or [`SUBMIT_ONE_KEYED`] of `new`.
pub fn submit_one(new: &NewNotification) -> Statement {
    let sql = if is_plain(new) {
        SUBMIT_ONE
    } else {
        SUBMIT_ONE_KEYED
    };
    Statement {
        sql: Cow::Borrowed(sql),
        params: row_params(new),
    }
}

/// The stored content hash of an id (after a duplicate-key error).
pub const SELECT_CONTENT_HASH: &str =
    batch!("SELECT n.ContentHash FROM dbo.Notifications AS n WHERE n.NotificationId = @P1;");

pub fn select_content_hash(id: NotificationId) -> Statement {
    Statement::fixed(SELECT_CONTENT_HASH).set("@P1", guid(id))
}

/// Ends, as Cleared, the waiting rows (Pending, Retrying or Held, not claimed, or whose claim ran
/// out) of site @P1 with condition key @P2, each with a history entry by @P3 numbered as its
/// history count goes up by one, in one transaction (`IngestStore::clear_condition`). The rows
/// are found through IX_Notifications_Condition (migration 0006, with Held since 0007). Without OUTPUT or a table
/// variable, as the submit procedure does it: the UPDATE stamps the rows it ends with a token of
/// this call, and the history INSERT and the answer find exactly those (Cleared, resolved at
/// @now, that token) through IX_Notifications_Status_Resolved. Result: their ids.
pub const CLEAR_CONDITION: &str = batch!(
    declare_now!(),
    "DECLARE @token uniqueidentifier = NEWID();
BEGIN TRANSACTION;
UPDATE n
SET n.Status = N'Cleared', n.ResolvedAt = @now, n.NextAttemptAt = NULL, n.ClaimedUntil = NULL, n.ClaimEpoch = NULL, n.ClaimToken = @token, n.AttemptCount = n.AttemptCount + 1
FROM dbo.Notifications AS n
WHERE n.Status IN (N'Pending', N'Retrying', N'Held') AND n.ConditionKey IS NOT NULL
  AND n.SourceSiteId = @P1 AND n.ConditionKey = @P2
  AND (n.ClaimedUntil IS NULL OR n.ClaimedUntil <= @now);
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT n.NotificationId, n.AttemptCount, @now, N'Cleared', @P3
FROM dbo.Notifications AS n
WHERE n.Status = N'Cleared' AND n.ResolvedAt = @now AND n.ClaimToken = @token;
SELECT n.NotificationId
FROM dbo.Notifications AS n
WHERE n.Status = N'Cleared' AND n.ResolvedAt = @now AND n.ClaimToken = @token;
COMMIT TRANSACTION;"
);

/// [`CLEAR_CONDITION`] of `site`'s key `key`, recorded as done by `actor`.
pub fn clear_condition(site: &SiteId, key: &ConditionKey, actor: &Actor) -> Statement {
    Statement::fixed(CLEAR_CONDITION)
        .set("@P1", text(site.as_str()))
        .set("@P2", text(key.as_str()))
        .set("@P3", text(actor.as_str()))
}

// ---------------------------------------------------------------------------------------------
// Leases, claims and outcomes

/// Takes or renews lease @P1 for holder @P2 for @P3 milliseconds: renews (same epoch) if the
/// holder was the last to hold it, even if it lapsed (nobody held it in between, so its claims
/// are still its own); takes it with the next epoch if another holder's lease is free or has
/// lapsed; creates it at epoch 1 if it never existed. Result: the epoch held, or no row. The
/// stored procedure of migration 0002: a renewal must stay cheap when the server is busy with
/// bulk work, and a one-line call is (see that migration).
pub const ACQUIRE_LEASE: &str =
    batch!("EXEC dbo.AcquireLease @Name = @P1, @Holder = @P2, @TtlMs = @P3;");

pub fn acquire_lease(name: &str, holder: &str, ttl: Duration) -> Statement {
    Statement::fixed(ACQUIRE_LEASE)
        .set("@P1", text(name))
        .set("@P2", text(holder))
        .set("@P3", Param::Int(Some(millis_i32(ttl))))
}

/// Expires lease @P1 now if holder @P2 still holds it at epoch @P3, and ends that tenure: the
/// epoch moves on, so nothing more is recorded under it and a re-take starts a new one.
/// Result: rows changed.
pub const RELEASE_LEASE: &str = batch!(
    declare_now!(),
    "UPDATE l
SET l.ExpiresAt = @now, l.Epoch = l.Epoch + 1
FROM dbo.Leases AS l
WHERE l.Name = @P1 AND l.Holder = @P2 AND l.Epoch = @P3 AND l.ExpiresAt > @now;
SELECT @@ROWCOUNT AS Released;"
);

pub fn release_lease(name: &str, holder: &str, epoch: LeaseEpoch) -> Statement {
    Statement::fixed(RELEASE_LEASE)
        .set("@P1", text(name))
        .set("@P2", text(holder))
        .set("@P3", Param::BigInt(Some(epoch.0)))
}

/// Claims due rows of type @P5 for @P2 milliseconds under epoch @P1 of lease @P6, and writes
/// their InFlight attempt rows, in one transaction: up to @P3 rows due longest, then up to @P4
/// more by priority and serve turn (`domain::serve_order`). The stored procedure of migration
/// 0005 (migrations/mssql/0005_serve_order.sql), which says how. Result: the claimed rows, the
/// longest-waiting ones first (by due time), then the others in turn.
pub const CLAIM_DUE: &str = batch!(
    "EXEC dbo.ClaimDueNotifications @Epoch = @P1, @ClaimMs = @P2, @LongestWaiting = @P3, @InTurn = @P4, @Type = @P5, @Lease = @P6;"
);

pub fn claim_due(
    lease: &str,
    epoch: LeaseEpoch,
    kind: NotificationType,
    lanes: ClaimLanes,
    claim_timeout: Duration,
) -> Statement {
    let rows = |n: usize| Param::BigInt(Some(i64::try_from(n).unwrap_or(i64::MAX)));
    Statement::fixed(CLAIM_DUE)
        .set("@P1", Param::BigInt(Some(epoch.0)))
        .set("@P2", Param::Int(Some(millis_i32(claim_timeout))))
        .set("@P3", rows(lanes.longest_waiting))
        .set("@P4", rows(lanes.in_turn))
        .set("@P5", text(kind.as_str()))
        .set("@P6", text(lease))
}

/// Claims, as digest @P5, the due Held rows of one list of type @P3 for @P2 milliseconds under
/// epoch @P1 of lease @P4 (only while that epoch holds it), with an InFlight attempt row each
/// naming the digest, in one transaction (`DispatchStore::claim_digest`). The stored procedure of
/// migration 0007 (migrations/mssql/0007_consolidation.sql), which says how. Result: the
/// claimed rows, longest due first (none when no Held row is due).
pub const CLAIM_DIGEST: &str = batch!(
    "EXEC dbo.ClaimDigestNotifications @Epoch = @P1, @ClaimMs = @P2, @Type = @P3, @Lease = @P4, @DigestId = @P5;"
);

pub fn claim_digest(
    lease: &str,
    epoch: LeaseEpoch,
    kind: NotificationType,
    digest: NotificationId,
    claim_timeout: Duration,
) -> Statement {
    Statement::fixed(CLAIM_DIGEST)
        .set("@P1", Param::BigInt(Some(epoch.0)))
        .set("@P2", Param::Int(Some(millis_i32(claim_timeout))))
        .set("@P3", text(kind.as_str()))
        .set("@P4", text(lease))
        .set("@P5", guid(digest))
}

/// Parks a claimed row whose stored content no longer passes validation (it can never be
/// delivered), and closes its InFlight attempt with the reason. @P1: row id, @P2: epoch,
/// @P3: reason, @P4: notification id, @P5: attempt number.
pub const PARK_INVALID: &str = batch!(
    declare_now!(),
    "BEGIN TRANSACTION;
UPDATE n
SET n.Status = N'Parked', n.LastError = @P3, n.ResolvedAt = @now, n.ClaimedUntil = NULL, n.ClaimEpoch = NULL
FROM dbo.Notifications AS n
WHERE n.Id = @P1 AND n.ClaimEpoch = @P2;
UPDATE a
SET a.Outcome = N'PermanentFailure', a.DurationMs = 0, a.Error = @P3
FROM dbo.NotificationAttempts AS a
WHERE a.NotificationId = @P4 AND a.AttemptNo = @P5;
COMMIT TRANSACTION;"
);

pub fn park_invalid(
    row_id: i64,
    epoch: LeaseEpoch,
    reason: &str,
    id: NotificationId,
    attempt_no: i32,
) -> Statement {
    Statement::fixed(PARK_INVALID)
        .set("@P1", Param::BigInt(Some(row_id)))
        .set("@P2", Param::BigInt(Some(epoch.0)))
        .set("@P3", text(reason))
        .set("@P4", guid(id))
        .set("@P5", Param::Int(Some(attempt_no)))
}

/// Applies an attempt's transition to row @P8 only if it is still claimed by attempt @P12 under
/// epoch @P9 and no other node has taken lease @P10 since (it is still at epoch @P9, lapsed or
/// not: then nobody can have claimed the row again); completes attempt (@P11, @P12) only then,
/// so an unapplied outcome leaves the attempt InFlight (a possible duplicate, made visible). A
/// Held row that would become Retrying (its digest failed for now) stays Held, due at the retry
/// time, for the next digest (as `dbo.RecordAttemptOutcomes` of migration 0007). Result: 1 if
/// applied, else 0.
pub const RECORD_OUTCOME: &str = batch!(
    "DECLARE @applied int;
BEGIN TRANSACTION;
UPDATE n
SET n.Status = CASE WHEN n.Status = N'Held' AND @P1 = N'Retrying' THEN N'Held' ELSE @P1 END,
    n.RetryCount = @P2,
    n.LastError = COALESCE(@P3, n.LastError),
    n.NextAttemptAt = @P4,
    n.DeliveredAt = COALESCE(@P5, n.DeliveredAt),
    n.ResolvedAt = @P6,
    n.ResolvedTargets = COALESCE(@P7, n.ResolvedTargets),
    n.ClaimedUntil = NULL,
    n.ClaimEpoch = NULL
FROM dbo.Notifications AS n
WHERE n.Id = @P8 AND n.ClaimEpoch = @P9 AND n.AttemptCount = @P12
  AND EXISTS (SELECT 1 FROM dbo.Leases AS l WHERE l.Name = @P10 AND l.Epoch = @P9);
SET @applied = @@ROWCOUNT;
UPDATE a
SET a.Outcome = @P13, a.DurationMs = @P14, a.Error = @P15
FROM dbo.NotificationAttempts AS a
WHERE @applied = 1 AND a.NotificationId = @P11 AND a.AttemptNo = @P12;
COMMIT TRANSACTION;
SELECT @applied AS Applied;"
);

/// [`RECORD_OUTCOME`] of `record` under lease `lease`: the row's new state (@P1-@P7), the claim
/// it must still be under (@P8-@P10, @P12), and the attempt row's outcome (@P11-@P15).
pub fn record_outcome(lease: &str, record: &AttemptRecord) -> Statement {
    let t = &record.transition;
    Statement::fixed(RECORD_OUTCOME)
        .set("@P1", text(t.status.as_str()))
        .set("@P2", int(t.retry_count))
        .set("@P3", Param::Text(t.last_error.clone()))
        .set("@P4", Param::Time(t.next_attempt_at))
        .set("@P5", Param::Time(t.delivered_at()))
        .set("@P6", Param::Time(t.resolved_at))
        .set("@P7", Param::Text(t.resolved_targets.clone()))
        .set("@P8", Param::BigInt(Some(record.row_id)))
        .set("@P9", Param::BigInt(Some(record.epoch.0)))
        .set("@P10", text(lease))
        .set("@P11", guid(record.id))
        .set("@P12", int(record.attempt_no))
        .set("@P13", text(record.outcome.as_str()))
        .set("@P14", Param::BigInt(Some(millis_i64(record.duration))))
        .set("@P15", Param::Text(record.error.clone()))
}

/// [`RECORD_OUTCOME`] for many attempts at once: lease @P1, and the outcomes as a JSON array in
/// @P2 (see [`record_outcomes`]), one object per row; no row twice. One call for a group of
/// outcomes instead of one each, because a server spends far more on a call than on a row (on
/// Babelfish, parsing the batch is most of it). The stored procedure of migration 0002
/// (migrations/mssql/0002_dispatch_procedures.sql). Result: the ids of the rows it applied to.
pub const RECORD_OUTCOMES: &str =
    batch!("EXEC dbo.RecordAttemptOutcomes @Lease = @P1, @Outcomes = @P2;");

/// [`RECORD_OUTCOMES`] of `records` under lease `lease`. Each record's texts must pass
/// [`travels_in_json`]; its instants go as ISO 8601 with 100 ns digits, which the server reads
/// as the datetime2(7) that [`RECORD_OUTCOME`] binds.
pub fn record_outcomes(lease: &str, records: &[&AttemptRecord]) -> Statement {
    let outcomes: Vec<serde_json::Value> = records
        .iter()
        .map(|record| {
            let t = &record.transition;
            serde_json::json!({
                "Id": record.row_id,
                "Epoch": record.epoch.0,
                "AttemptNo": record.attempt_no,
                "NotificationId": record.id.as_uuid().to_string(),
                "Status": t.status.as_str(),
                "RetryCount": t.retry_count,
                "LastError": t.last_error,
                "NextAttemptAt": t.next_attempt_at.map(json_instant),
                "DeliveredAt": t.delivered_at().map(json_instant),
                "ResolvedAt": t.resolved_at.map(json_instant),
                "ResolvedTargets": t.resolved_targets,
                "Outcome": record.outcome.as_str(),
                "DurationMs": millis_i64(record.duration),
                "Error": record.error,
            })
        })
        .collect();
    Statement::fixed(RECORD_OUTCOMES)
        .set("@P1", text(lease))
        .set("@P2", text(&serde_json::Value::Array(outcomes).to_string()))
}

/// Whether every text of `record` reaches the server unchanged through [`RECORD_OUTCOMES`]: one
/// that JSON must escape (a quote, a backslash, a control character such as a line break) does
/// not on Babelfish, whose OPENJSON hands such a string back still escaped. Those few outcomes
/// go through [`RECORD_OUTCOME`], whose values are bound one by one.
pub fn travels_in_json(record: &AttemptRecord) -> bool {
    let t = &record.transition;
    [&t.last_error, &t.resolved_targets, &record.error]
        .into_iter()
        .flatten()
        .all(|text| !text.chars().any(|c| c == '"' || c == '\\' || c < ' '))
}

/// An instant as OPENJSON reads it into datetime2(7): ISO 8601, UTC, 100 ns digits.
fn json_instant(instant: DateTime<Utc>) -> String {
    format!(
        "{}.{:07}",
        instant.format("%Y-%m-%dT%H:%M:%S"),
        instant.timestamp_subsec_nanos() % 1_000_000_000 / 100
    )
}

// ---------------------------------------------------------------------------------------------
// Operator side

/// One notification's state by id (@P1).
pub const SELECT_STATE: &str = batch!(
    "SELECT ",
    state_columns!(),
    "
FROM dbo.Notifications AS n
WHERE n.NotificationId = @P1;"
);

pub fn select_state(id: NotificationId) -> Statement {
    Statement::fixed(SELECT_STATE).set("@P1", guid(id))
}

/// One notification's state and content (first result) and its history oldest first (second).
pub const SELECT_DETAIL: &str = batch!(
    "SELECT ",
    state_columns!(),
    ", n.Body, n.TypeData, n.SourceInstanceId, n.SourceScript, n.OriginExecutionId, n.OriginParentExecutionId, n.ResolvedTargets
FROM dbo.Notifications AS n
WHERE n.NotificationId = @P1;
SELECT a.AttemptNo, a.StartedAt, a.DurationMs, a.Outcome, a.Error, a.LeaseEpoch, a.Actor, a.DigestId
FROM dbo.NotificationAttempts AS a
WHERE a.NotificationId = @P1
ORDER BY a.AttemptNo;"
);

pub fn select_detail(id: NotificationId) -> Statement {
    Statement::fixed(SELECT_DETAIL).set("@P1", guid(id))
}

fn at(instant: DateTime<Utc>) -> Param {
    Param::Time(Some(instant))
}

/// Appends the filter's conditions on `dbo.Notifications AS n`, each starting with " AND ".
pub fn push_filter(filter: &NotificationFilter, stmt: &mut Statement) {
    if !filter.statuses.is_empty() {
        stmt.push("\n  AND n.Status IN (");
        for (i, status) in filter.statuses.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            stmt.push_bound(sep, Param::Text(Some(status.as_str().into())), "");
        }
        stmt.push(")");
    }
    if let Some(kind) = filter.kind {
        stmt.push_bound(
            "\n  AND n.Type = ",
            Param::Text(Some(kind.as_str().into())),
            "",
        );
    }
    if !filter.priorities.is_empty() {
        stmt.push("\n  AND n.Priority IN (");
        for (i, priority) in filter.priorities.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            stmt.push_bound(sep, Param::Int(Some(i32::from(priority.rank()))), "");
        }
        stmt.push(")");
    }
    if let Some(key) = &filter.condition_key {
        stmt.push_bound(
            "\n  AND n.ConditionKey = ",
            Param::Text(Some(key.clone())),
            "",
        );
    }
    if let Some(site) = &filter.source_site_id {
        stmt.push_bound(
            "\n  AND n.SourceSiteId = ",
            Param::Text(Some(site.clone())),
            "",
        );
    }
    if let Some(list) = &filter.list_name {
        stmt.push_bound("\n  AND n.ListName = ", Param::Text(Some(list.clone())), "");
    }
    if let Some(from) = filter.created_from {
        stmt.push_bound("\n  AND n.CreatedAt >= ", at(from), "");
    }
    if let Some(to) = filter.created_to {
        stmt.push_bound("\n  AND n.CreatedAt < ", at(to), "");
    }
    if let Some(cutoff) = filter.stuck_before {
        stmt.push_bound(
            "\n  AND n.Status IN (N'Pending', N'Retrying') AND n.CreatedAt < ",
            at(cutoff),
            "",
        );
    }
    if let Some(before) = filter.resolved_before {
        stmt.push_bound("\n  AND n.ResolvedAt < ", at(before), "");
    }
    // A substring test, not LIKE: the keyword's %, _ and [ need no escaping, and lower-casing
    // both sides makes it case-insensitive whatever the column's collation. An empty keyword
    // matches everything, as LIKE '%%' would.
    if let Some(keyword) = filter.subject_contains.as_ref().filter(|k| !k.is_empty()) {
        stmt.push_bound(
            "\n  AND CHARINDEX(LOWER(",
            Param::Text(Some(keyword.clone())),
            "), LOWER(n.Subject)) > 0",
        );
    }
}

/// A page of the filtered table, newest first: the rows strictly after `after` in
/// (CreatedAt DESC, Id DESC) order, at most `limit` of them.
pub fn query(
    filter: &NotificationFilter,
    after: Option<(DateTime<Utc>, i64)>,
    limit: i64,
) -> Statement {
    let mut stmt = Statement::new(batch!(""));
    let top = stmt.bind(Param::BigInt(Some(limit)));
    stmt.push(&format!(
        "SELECT TOP ({top}) {}\nFROM dbo.Notifications AS n\nWHERE 1 = 1",
        state_columns!()
    ));
    push_filter(filter, &mut stmt);
    if let Some((created_at, row_id)) = after {
        // Spelled out rather than as a row value, which T-SQL lacks.
        let c = stmt.bind(at(created_at));
        let i = stmt.bind(Param::BigInt(Some(row_id)));
        stmt.push(&format!(
            "\n  AND (n.CreatedAt < {c} OR (n.CreatedAt = {c} AND n.Id < {i}))"
        ));
    }
    stmt.push("\nORDER BY n.CreatedAt DESC, n.Id DESC;");
    stmt
}

/// The UPDATE of an operator action on the Parked rows in `@targets` (limited to those with
/// `Ord <= @limit` when `limit` is given), recording each changed row's next history number in
/// `@changed`. Retry resets the delivery facts; Discard resolves the row and keeps them.
fn action_update(retry: bool, limit: Option<&str>) -> String {
    let set = if retry {
        "SET n.Status = N'Pending', n.RetryCount = 0, n.NextAttemptAt = SYSUTCDATETIME(), \
         n.LastError = NULL, \
         n.ResolvedAt = NULL, n.ClaimedUntil = NULL, n.ClaimEpoch = NULL, \
         n.AttemptCount = n.AttemptCount + 1"
    } else {
        "SET n.Status = N'Discarded', n.ResolvedAt = @now, n.ClaimedUntil = NULL, \
         n.ClaimEpoch = NULL, n.AttemptCount = n.AttemptCount + 1"
    };
    let limit = limit
        .map(|l| format!(" AND t.Ord <= {l}"))
        .unwrap_or_default();
    format!(
        "UPDATE n
{set}
OUTPUT inserted.NotificationId, inserted.AttemptCount INTO @changed
FROM dbo.Notifications AS n
JOIN @targets AS t ON t.NotificationId = n.NotificationId
WHERE n.Status = N'Parked'{limit};
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT c.NotificationId, c.AttemptCount, @now, @P1, @P2
FROM @changed AS c;
"
    )
}

const ACTION_TABLES: &str = "\
DECLARE @targets TABLE (Ord bigint NOT NULL PRIMARY KEY, NotificationId uniqueidentifier NOT NULL);
DECLARE @changed TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY, AttemptCount int NOT NULL);
";

/// Applies an operator action (@P1: history outcome, @P2: actor) to `ids` distinct ids (@P3...)
/// in one transaction, then returns one row per id in order: whether it changed, and its state
/// now (all NULL if there is no such notification).
pub fn act_on_ids(action: OperatorAction, ids: usize) -> String {
    let retry = action == OperatorAction::Retry;
    let values: Vec<String> = (0..ids)
        .map(|i| format!("({}, @P{})", i + 1, i + 3))
        .collect();
    format!(
        "{}{}{ACTION_TABLES}INSERT INTO @targets (Ord, NotificationId) VALUES {};
BEGIN TRANSACTION;
{}COMMIT TRANSACTION;
SELECT t.Ord, CASE WHEN c.NotificationId IS NULL THEN 0 ELSE 1 END AS Changed, {}
FROM @targets AS t
LEFT JOIN @changed AS c ON c.NotificationId = t.NotificationId
LEFT JOIN dbo.Notifications AS n ON n.NotificationId = t.NotificationId
ORDER BY t.Ord;",
        batch!(""),
        declare_now!(),
        values.join(", "),
        action_update(retry, None),
        state_columns!()
    )
}

/// [`act_on_ids`] for these distinct `ids`, recorded as done by `actor`.
pub fn act_on_these(action: OperatorAction, actor: &str, ids: &[NotificationId]) -> Statement {
    let mut stmt = Statement {
        sql: Cow::Owned(act_on_ids(action, ids.len())),
        params: Vec::new(),
    }
    .set("@P1", text(action.as_str()))
    .set("@P2", text(actor));
    stmt.params.extend(ids.iter().copied().map(guid));
    stmt
}

/// Applies an operator action (recorded as done by `actor`) to the oldest `limit` Parked rows
/// matching `filter`, in one transaction. The oldest `limit + 1` matches are locked first
/// (UPDLOCK: an operator acting on the same rows waits), so the second result (how many
/// matched, at most `limit + 1`) tells whether more remain; the first lists the changed ids,
/// oldest first.
pub fn act_on_filter(
    action: OperatorAction,
    actor: &str,
    filter: &NotificationFilter,
    limit: i64,
) -> Statement {
    let retry = action == OperatorAction::Retry;
    let mut stmt = Statement::new(concat!(batch!(""), declare_now!()));
    stmt.bind(Param::Text(Some(action.as_str().into())));
    stmt.bind(Param::Text(Some(actor.into())));
    let probe = stmt.bind(Param::BigInt(Some(limit.saturating_add(1))));
    let limit = stmt.bind(Param::BigInt(Some(limit)));
    stmt.push(ACTION_TABLES);
    stmt.push(&format!(
        "BEGIN TRANSACTION;
INSERT INTO @targets (Ord, NotificationId)
SELECT TOP ({probe}) ROW_NUMBER() OVER (ORDER BY n.CreatedAt, n.Id) AS Ord, n.NotificationId
FROM dbo.Notifications AS n WITH (UPDLOCK, ROWLOCK)
WHERE 1 = 1"
    ));
    push_filter(filter, &mut stmt);
    stmt.push("\nORDER BY n.CreatedAt, n.Id;\n");
    stmt.push(&action_update(retry, Some(&limit)));
    stmt.push(
        "COMMIT TRANSACTION;
SELECT c.NotificationId
FROM @changed AS c
JOIN @targets AS t ON t.NotificationId = c.NotificationId
ORDER BY t.Ord;
SELECT COUNT_BIG(*) AS Matching FROM @targets;",
    );
    stmt
}

/// How many rows matching `filter` there are, counted up to `limit + 1` (so the count stops
/// early on a huge table and still tells whether more than `limit` match). A plain read: a dry
/// run locks nothing, so the later action may find a few rows more or fewer.
pub fn count_on_filter(filter: &NotificationFilter, limit: i64) -> Statement {
    let mut stmt = Statement::new(batch!(""));
    let probe = stmt.bind(Param::BigInt(Some(limit.saturating_add(1))));
    stmt.push(&format!(
        "SELECT COUNT_BIG(*) AS Matching FROM (\nSELECT TOP ({probe}) n.Id\nFROM dbo.Notifications AS n\nWHERE 1 = 1"
    ));
    push_filter(filter, &mut stmt);
    stmt.push("\n) AS m;");
    stmt
}

/// One pass over the live, parked and recently delivered rows, per site. @P1: now,
/// @P2: created before this is stuck, @P3: delivered since. Held rows are in the queue depth and
/// wait (for their window's end, or their retry time) like retries; they are never stuck: they
/// wait by design, not for their turn.
pub const KPIS: &str = batch!(
    "SELECT n.SourceSiteId,
    CAST(SUM(CASE WHEN n.Status IN (N'Pending', N'Retrying', N'Held') THEN 1 ELSE 0 END) AS bigint) AS QueueDepth,
    CAST(SUM(CASE WHEN n.Status IN (N'Pending', N'Retrying') AND n.CreatedAt < @P2 THEN 1 ELSE 0 END) AS bigint) AS Stuck,
    CAST(SUM(CASE WHEN n.Status = N'Parked' THEN 1 ELSE 0 END) AS bigint) AS Parked,
    CAST(SUM(CASE WHEN n.Status = N'Delivered' AND n.ResolvedAt >= @P3 THEN 1 ELSE 0 END) AS bigint) AS DeliveredRecently,
    MIN(CASE WHEN n.Status = N'Pending' OR (n.Status = N'Retrying' AND (n.NextAttemptAt IS NULL OR n.NextAttemptAt <= @P1)) THEN n.CreatedAt END) AS OldestDue,
    MIN(CASE WHEN (n.Status = N'Retrying' AND n.NextAttemptAt > @P1) OR n.Status = N'Held' THEN n.CreatedAt END) AS OldestWaiting
FROM dbo.Notifications AS n
WHERE n.Status IN (N'Pending', N'Retrying', N'Held', N'Parked')
   OR (n.Status = N'Delivered' AND n.ResolvedAt >= @P3)
GROUP BY n.SourceSiteId
ORDER BY n.SourceSiteId;"
);

pub fn kpis(
    now: DateTime<Utc>,
    stuck_before: DateTime<Utc>,
    delivered_since: DateTime<Utc>,
) -> Statement {
    Statement::fixed(KPIS)
        .set("@P1", at(now))
        .set("@P2", at(stuck_before))
        .set("@P3", at(delivered_since))
}

/// Deletes up to @P2 terminal rows (Delivered, Parked, Discarded, Superseded, Cleared) resolved
/// before @P1, oldest first, and their history, in one transaction. The DELETE re-checks the condition (an operator may have retried a row since
/// it was picked). Result: rows and history entries deleted.
pub const PURGE_TERMINAL: &str = batch!(
    "DECLARE @doomed TABLE (Id bigint NOT NULL PRIMARY KEY);
DECLARE @gone TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY, Status nvarchar(16) NOT NULL);
DECLARE @history bigint;
BEGIN TRANSACTION;
INSERT INTO @doomed (Id)
SELECT TOP (@P2) n.Id
FROM dbo.Notifications AS n WITH (UPDLOCK, ROWLOCK)
WHERE n.Status IN (N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared') AND n.ResolvedAt < @P1
ORDER BY n.ResolvedAt;
DELETE n
OUTPUT deleted.NotificationId, deleted.Status INTO @gone
FROM dbo.Notifications AS n
JOIN @doomed AS d ON d.Id = n.Id
WHERE n.Status IN (N'Delivered', N'Parked', N'Discarded', N'Superseded', N'Cleared') AND n.ResolvedAt < @P1;
DELETE a
FROM dbo.NotificationAttempts AS a
JOIN @gone AS g ON g.NotificationId = a.NotificationId;
SET @history = @@ROWCOUNT;
COMMIT TRANSACTION;
SELECT COUNT_BIG(*) AS Notifications, COUNT_BIG(CASE WHEN g.Status = N'Parked' THEN 1 END) AS Parked, @history AS HistoryEntries FROM @gone AS g;"
);

pub fn purge_terminal(resolved_before: DateTime<Utc>, batch: u32) -> Statement {
    Statement::fixed(PURGE_TERMINAL)
        .set("@P1", at(resolved_before))
        .set("@P2", Param::BigInt(Some(i64::from(batch))))
}

// ---------------------------------------------------------------------------------------------
// Lists and channel settings

/// The columns `channel::read_list` reads, from `dbo.NotificationLists AS l`.
macro_rules! list_columns {
    () => {
        "l.Name, l.Type, l.WebhookFormat, l.WebhookSecret, l.UpdatedAt, l.ConsolidateThreshold, \
         l.ConsolidateWindowSeconds, l.ConsolidateMaxPerDigest"
    };
}

/// List @P1 (first result) and its targets (second).
pub const SELECT_LIST: &str = batch!(
    "SELECT ",
    list_columns!(),
    "
FROM dbo.NotificationLists AS l
WHERE l.Name = @P1;
SELECT r.ListName, r.Address
FROM dbo.NotificationListRecipients AS r
WHERE r.ListName = @P1;"
);

pub fn select_list(name: &str) -> Statement {
    Statement::fixed(SELECT_LIST).set("@P1", text(name))
}

/// Every list by name (first result) and every target (second).
pub const SELECT_LISTS: &str = batch!(
    "SELECT ",
    list_columns!(),
    "
FROM dbo.NotificationLists AS l
ORDER BY l.Name;
SELECT r.ListName, r.Address
FROM dbo.NotificationListRecipients AS r;"
);

/// Creates or replaces list @P1 (type @P2, webhook format @P3, secret @P4, consolidation
/// threshold @P5, window in seconds @P6 and rows per digest @P7, all three NULL for none) and
/// its `targets` targets (@P8...), as a whole, in one transaction. A list that consolidates
/// gets its row of ConsolidationWindows if it has none yet, at a window long past (the same as
/// no row: its first arrival starts a count), so that a submit only ever updates that row
/// (migration 0007).
pub fn replace_list(targets: usize) -> String {
    let values: Vec<String> = (0..targets)
        .map(|i| format!("(@P1, @P{})", i + 8))
        .collect();
    let insert = if values.is_empty() {
        String::new()
    } else {
        format!(
            "INSERT INTO dbo.NotificationListRecipients (ListName, Address) VALUES {};\n",
            values.join(", ")
        )
    };
    format!(
        "{}{}BEGIN TRANSACTION;
UPDATE l
SET l.Type = @P2, l.WebhookFormat = @P3, l.WebhookSecret = @P4, l.UpdatedAt = @now,
    l.ConsolidateThreshold = @P5, l.ConsolidateWindowSeconds = @P6, l.ConsolidateMaxPerDigest = @P7
FROM dbo.NotificationLists AS l
WHERE l.Name = @P1;
INSERT INTO dbo.NotificationLists (Name, Type, WebhookFormat, WebhookSecret, UpdatedAt, ConsolidateThreshold, ConsolidateWindowSeconds, ConsolidateMaxPerDigest)
SELECT @P1, @P2, @P3, @P4, @now, @P5, @P6, @P7
WHERE NOT EXISTS (SELECT 1 FROM dbo.NotificationLists AS x WHERE x.Name = @P1);
INSERT INTO dbo.ConsolidationWindows (ListName, WindowStart, Arrived)
SELECT @P1, CAST('19700101' AS datetime2(3)), 0
WHERE @P5 IS NOT NULL AND NOT EXISTS (SELECT 1 FROM dbo.ConsolidationWindows AS w WHERE w.ListName = @P1);
DELETE r
FROM dbo.NotificationListRecipients AS r
WHERE r.ListName = @P1;
{insert}COMMIT TRANSACTION;",
        batch!(""),
        declare_now!()
    )
}

/// [`replace_list`] of list `name` with its `targets` (each once); `format` and `secret` (sealed)
/// only for a webhook list; `consolidation` when the list consolidates floods.
pub fn replace_list_with(
    name: &str,
    kind: NotificationType,
    format: Option<String>,
    secret: Option<String>,
    consolidation: Option<Consolidation>,
    targets: Vec<String>,
) -> Statement {
    let threshold = consolidation.map(|c| int_value(c.threshold()));
    let window = consolidation.map(|c| i32::try_from(c.window().as_secs()).unwrap_or(i32::MAX));
    let max_per_digest = consolidation.map(|c| int_value(c.max_per_digest()));
    let mut stmt = Statement {
        sql: Cow::Owned(replace_list(targets.len())),
        params: Vec::new(),
    }
    .set("@P1", text(name))
    .set("@P2", text(kind.as_str()))
    .set("@P3", Param::Text(format))
    .set("@P4", Param::Text(secret))
    .set("@P5", Param::Int(threshold))
    .set("@P6", Param::Int(window))
    .set("@P7", Param::Int(max_per_digest));
    stmt.params
        .extend(targets.into_iter().map(|t| Param::Text(Some(t))));
    stmt
}

/// Deletes list @P1 and its targets. Result: lists deleted (0 or 1). The list's row goes first:
/// it is the lock every writer of the list takes, so a replace running at the same time either
/// finishes before (and its targets are deleted here) or starts after (and writes the list
/// anew); no target is left without its list, with or without the foreign key (migration 0003).
pub const DELETE_LIST: &str = batch!(
    "DECLARE @deleted int;
BEGIN TRANSACTION;
DELETE l
FROM dbo.NotificationLists AS l
WHERE l.Name = @P1;
SET @deleted = @@ROWCOUNT;
DELETE r
FROM dbo.NotificationListRecipients AS r
WHERE r.ListName = @P1;
COMMIT TRANSACTION;
SELECT @deleted AS Deleted;"
);

pub fn delete_list(name: &str) -> Statement {
    Statement::fixed(DELETE_LIST).set("@P1", text(name))
}

/// The settings of channel @P1.
pub const SELECT_CHANNEL: &str = batch!(
    "SELECT c.Host, c.Port, c.TlsMode, c.AuthMechanism, c.Username, c.Password, c.FromAddress, c.MaxRetries, c.RetryDelayMs, c.Backoff, c.MaxRetryDelayMs, c.MaxConcurrentConnections, c.RateLimitPerSecond, c.RateLimitBurst, c.TimeoutMs, c.OverallTimeoutMs, c.OAuthTokenUrl, c.OAuthClientId, c.OAuthClientSecret, c.OAuthScope, c.UpdatedAt
FROM dbo.ChannelConfig AS c
WHERE c.Channel = @P1;"
);

pub fn select_channel(channel: &str) -> Statement {
    Statement::fixed(SELECT_CHANNEL).set("@P1", text(channel))
}

/// Creates or replaces channel @P1's settings (@P2..@P21 in SELECT_CHANNEL's column order,
/// without UpdatedAt), in one transaction.
pub const REPLACE_CHANNEL: &str = batch!(
    declare_now!(),
    "BEGIN TRANSACTION;
UPDATE c
SET c.Host = @P2, c.Port = @P3, c.TlsMode = @P4, c.AuthMechanism = @P5, c.Username = @P6,
    c.Password = @P7, c.FromAddress = @P8, c.MaxRetries = @P9, c.RetryDelayMs = @P10,
    c.Backoff = @P11, c.MaxRetryDelayMs = @P12, c.MaxConcurrentConnections = @P13,
    c.RateLimitPerSecond = @P14, c.RateLimitBurst = @P15, c.TimeoutMs = @P16,
    c.OverallTimeoutMs = @P17, c.OAuthTokenUrl = @P18, c.OAuthClientId = @P19,
    c.OAuthClientSecret = @P20, c.OAuthScope = @P21, c.UpdatedAt = @now
FROM dbo.ChannelConfig AS c
WHERE c.Channel = @P1;
INSERT INTO dbo.ChannelConfig (Channel, Host, Port, TlsMode, AuthMechanism, Username, Password, FromAddress, MaxRetries, RetryDelayMs, Backoff, MaxRetryDelayMs, MaxConcurrentConnections, RateLimitPerSecond, RateLimitBurst, TimeoutMs, OverallTimeoutMs, OAuthTokenUrl, OAuthClientId, OAuthClientSecret, OAuthScope, UpdatedAt)
SELECT @P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @P10, @P11, @P12, @P13, @P14, @P15, @P16, @P17, @P18, @P19, @P20, @P21, @now
WHERE NOT EXISTS (SELECT 1 FROM dbo.ChannelConfig AS x WHERE x.Channel = @P1);
COMMIT TRANSACTION;"
);

/// [`REPLACE_CHANNEL`] of email channel `channel` with settings `s`, whose password and OAuth
/// client secret are given sealed (`None` when its authentication has none).
pub fn replace_channel(
    channel: &str,
    s: &SmtpSettings,
    password: Option<String>,
    client_secret: Option<String>,
) -> Statement {
    let (username, oauth) = match &s.auth {
        SmtpAuth::None => (None, None),
        SmtpAuth::Password { username, .. } => (Some(username.clone()), None),
        SmtpAuth::XOAuth2 { username, oauth } => (Some(username.clone()), Some(oauth)),
    };
    let p = &s.policy;
    let max_retry_delay = match p.backoff {
        Backoff::Fixed => None,
        Backoff::Exponential { cap } => Some(millis_i64(cap)),
    };
    Statement::fixed(REPLACE_CHANNEL)
        .set("@P1", text(channel))
        .set("@P2", text(&s.host))
        .set("@P3", Param::Int(Some(i32::from(s.port))))
        .set("@P4", text(s.tls.as_str()))
        .set("@P5", text(s.auth.mechanism()))
        .set("@P6", Param::Text(username))
        .set("@P7", Param::Text(password))
        .set("@P8", text(s.from_address.as_str()))
        .set("@P9", Param::BigInt(Some(p.max_retries)))
        .set("@P10", Param::BigInt(Some(millis_i64(p.retry_delay))))
        .set("@P11", text(p.backoff.as_str()))
        .set("@P12", Param::BigInt(max_retry_delay))
        .set("@P13", int(p.max_concurrent_connections))
        .set("@P14", Param::Float(p.rate_limit.map(|r| r.per_second)))
        .set(
            "@P15",
            Param::BigInt(p.rate_limit.map(|r| i64::from(r.burst))),
        )
        .set("@P16", Param::BigInt(Some(millis_i64(s.timeout))))
        .set("@P17", Param::BigInt(Some(millis_i64(s.overall_timeout))))
        .set("@P18", Param::Text(oauth.map(|o| o.token_url.clone())))
        .set("@P19", Param::Text(oauth.map(|o| o.client_id.clone())))
        .set("@P20", Param::Text(client_secret))
        .set("@P21", Param::Text(oauth.map(|o| o.scope.clone())))
}

/// Deletes channel @P1's settings. Result: rows deleted.
pub const DELETE_CHANNEL: &str = batch!(
    "DELETE c
FROM dbo.ChannelConfig AS c
WHERE c.Channel = @P1;
SELECT @@ROWCOUNT AS Deleted;"
);

pub fn delete_channel(channel: &str) -> Statement {
    Statement::fixed(DELETE_CHANNEL).set("@P1", text(channel))
}

/// Every stored secret, for the start-up re-seal: lists' webhook secrets (first result), the
/// channels' password and OAuth client secret (second).
pub const SELECT_SECRETS: &str = batch!(
    "SELECT l.Name, l.WebhookSecret
FROM dbo.NotificationLists AS l
WHERE l.WebhookSecret IS NOT NULL;
SELECT c.Channel, c.Password, c.OAuthClientSecret
FROM dbo.ChannelConfig AS c
WHERE c.Password IS NOT NULL OR c.OAuthClientSecret IS NOT NULL;"
);

/// Replaces list @P1's webhook secret @P2 with @P3, only while it is still @P2: a replica that
/// stored a new secret meanwhile keeps it.
pub const RESEAL_LIST_SECRET: &str = batch!(
    "UPDATE l
SET l.WebhookSecret = @P3
FROM dbo.NotificationLists AS l
WHERE l.Name = @P1 AND l.WebhookSecret = @P2;"
);

pub fn reseal_list_secret(name: &str, old: String, new: String) -> Statement {
    Statement::fixed(RESEAL_LIST_SECRET)
        .set("@P1", text(name))
        .set("@P2", Param::Text(Some(old)))
        .set("@P3", Param::Text(Some(new)))
}

/// Replaces channel @P1's password @P2 with @P3 and its OAuth client secret @P4 with @P5, each
/// only while it is still the old value (a NULL old value leaves that column alone: NULL equals
/// nothing).
pub const RESEAL_CHANNEL_SECRETS: &str = batch!(
    "UPDATE c
SET c.Password = CASE WHEN c.Password = @P2 THEN @P3 ELSE c.Password END,
    c.OAuthClientSecret = CASE WHEN c.OAuthClientSecret = @P4 THEN @P5 ELSE c.OAuthClientSecret END
FROM dbo.ChannelConfig AS c
WHERE c.Channel = @P1;"
);

/// [`RESEAL_CHANNEL_SECRETS`] of `channel`: each secret as (old, new), or `None` to leave it.
pub fn reseal_channel_secrets(
    channel: &str,
    password: Option<(String, String)>,
    client_secret: Option<(String, String)>,
) -> Statement {
    let (old_password, new_password) = password.unzip();
    let (old_client_secret, new_client_secret) = client_secret.unzip();
    Statement::fixed(RESEAL_CHANNEL_SECRETS)
        .set("@P1", text(channel))
        .set("@P2", Param::Text(old_password))
        .set("@P3", Param::Text(new_password))
        .set("@P4", Param::Text(old_client_secret))
        .set("@P5", Param::Text(new_client_secret))
}

// ---------------------------------------------------------------------------------------------
// Site health

/// Replaces the health report of site @P1's node @P2 (@P3..@P12 in SELECT_SITE_HEALTH's column
/// order, without ReceivedAt), received now by the database's clock, in one transaction. Two
/// first reports of one node racing to insert (a node reporting to two replicas at once) end
/// one of them with a duplicate key; run again, it updates.
pub const RECORD_SITE_HEALTH: &str = batch!(
    declare_now!(),
    "BEGIN TRANSACTION;
UPDATE h
SET h.Role = @P3, h.BufferDepth = @P4, h.OldestBufferedAgeMs = @P5, h.LastForwardAt = @P6,
    h.StandbyLagRows = @P7, h.StandbyLagMs = @P8, h.Version = @P9, h.CentralReachable = @P10,
    h.Rejected = @P11, h.SendsRefused = @P12, h.ReceivedAt = @now
FROM dbo.SiteHealth AS h
WHERE h.SiteId = @P1 AND h.NodeName = @P2;
INSERT INTO dbo.SiteHealth (SiteId, NodeName, Role, BufferDepth, OldestBufferedAgeMs, LastForwardAt, StandbyLagRows, StandbyLagMs, Version, CentralReachable, Rejected, SendsRefused, ReceivedAt)
SELECT @P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @P10, @P11, @P12, @now
WHERE NOT EXISTS (SELECT 1 FROM dbo.SiteHealth AS x WHERE x.SiteId = @P1 AND x.NodeName = @P2);
COMMIT TRANSACTION;"
);

pub fn record_site_health(report: &SiteHealthReport) -> Statement {
    let flag = |set: bool| Param::Int(Some(i32::from(set)));
    let count = |n: u64| Param::BigInt(Some(i64::try_from(n).unwrap_or(i64::MAX)));
    Statement::fixed(RECORD_SITE_HEALTH)
        .set("@P1", text(report.site.as_str()))
        .set("@P2", text(report.node.as_str()))
        .set("@P3", text(report.role.as_str()))
        .set("@P4", count(report.buffer_depth))
        .set(
            "@P5",
            Param::BigInt(Some(millis_i64(report.oldest_buffered_age))),
        )
        .set("@P6", Param::Time(report.last_forward_at))
        .set("@P7", count(report.standby_lag_rows))
        .set("@P8", Param::BigInt(Some(millis_i64(report.standby_lag))))
        .set("@P9", text(&report.version))
        .set("@P10", flag(report.central_reachable))
        .set("@P11", count(report.rejected))
        .set("@P12", flag(report.sends_refused))
}

/// The database's clock (first result) and every node's latest report, by site then node
/// (second): the clock the offline rule is applied with is the one that stamped the reports.
pub const SELECT_SITE_HEALTH: &str = batch!(
    declare_now!(),
    "SELECT @now AS ReadAt;
SELECT h.SiteId, h.NodeName, h.Role, h.BufferDepth, h.OldestBufferedAgeMs, h.LastForwardAt,
    h.StandbyLagRows, h.StandbyLagMs, h.Version, h.CentralReachable, h.Rejected, h.SendsRefused,
    h.ReceivedAt
FROM dbo.SiteHealth AS h
ORDER BY h.SiteId, h.NodeName;"
);

/// Every statement, rendered, by snapshot name: the fixed ones as they are, the built ones for
/// representative inputs (every filter field set, a keyset cursor, two rows or ids).
#[cfg(test)]
pub fn catalog() -> Vec<(&'static str, String)> {
    use crate::domain::status::Status;
    use crate::domain::{NotificationType, Priority};

    let instant = DateTime::from_timestamp_millis(1_700_000_000_000).unwrap_or_default();
    let full_filter = NotificationFilter {
        statuses: vec![Status::Parked, Status::Retrying],
        kind: Some(NotificationType::Email),
        priorities: vec![Priority::Critical, Priority::Low],
        condition_key: Some("tank4.level.high".into()),
        source_site_id: Some("north".into()),
        list_name: Some("ops".into()),
        created_from: Some(instant),
        created_to: Some(instant),
        stuck_before: Some(instant),
        subject_contains: Some("tank".into()),
        resolved_before: Some(instant),
    };
    let parked_only = NotificationFilter {
        statuses: vec![Status::Parked],
        source_site_id: Some("north".into()),
        ..Default::default()
    };
    // A keyed row, a run of plain rows long enough for an INSERT, a keyed row, a plain row.
    let mut in_order_sample = vec![false];
    in_order_sample.extend([true; MIN_INSERT_RUN]);
    in_order_sample.extend([false, true]);
    // A plain row of a list that consolidates, then a run of other plain rows long enough for
    // an INSERT, then one more of the list that consolidates.
    let consolidating_sample = [true; MIN_INSERT_RUN + 2];
    let mut consolidating_insertable = consolidating_sample;
    consolidating_insertable[0] = false;
    consolidating_insertable[MIN_INSERT_RUN + 1] = false;
    let mut statements = vec![
        ("check_connection", CHECK_CONNECTION.to_owned()),
        ("ping", PING.to_owned()),
        ("migration_lock", MIGRATION_LOCK.to_owned()),
        ("migration_unlock", MIGRATION_UNLOCK.to_owned()),
        ("migration_version", MIGRATION_VERSION.to_owned()),
        ("migration_begin", MIGRATION_BEGIN.to_owned()),
        ("migration_record", MIGRATION_RECORD.to_owned()),
        ("insert_batch_2", insert_batch(2, 1)),
        (
            "insert_in_order_23",
            insert_in_order(&in_order_sample, &in_order_sample, 1),
        ),
        (
            "insert_in_order_keyed_2",
            insert_in_order(&[false, false], &[false, false], 0),
        ),
        (
            "insert_in_order_consolidating_22",
            insert_in_order(&consolidating_sample, &consolidating_insertable, 1),
        ),
        ("select_content_hash", SELECT_CONTENT_HASH.to_owned()),
        ("acquire_lease", ACQUIRE_LEASE.to_owned()),
        ("release_lease", RELEASE_LEASE.to_owned()),
        ("submit_one", SUBMIT_ONE.to_owned()),
        ("submit_one_keyed", SUBMIT_ONE_KEYED.to_owned()),
        ("clear_condition", CLEAR_CONDITION.to_owned()),
        ("claim_due", CLAIM_DUE.to_owned()),
        ("claim_digest", CLAIM_DIGEST.to_owned()),
        ("park_invalid", PARK_INVALID.to_owned()),
        ("record_outcome", RECORD_OUTCOME.to_owned()),
        ("record_outcomes", RECORD_OUTCOMES.to_owned()),
        ("select_state", SELECT_STATE.to_owned()),
        ("select_detail", SELECT_DETAIL.to_owned()),
        (
            "query_first_page",
            query(&NotificationFilter::default(), None, 51)
                .sql
                .into_owned(),
        ),
        (
            "query_every_filter_after_cursor",
            query(&full_filter, Some((instant, 42)), 51)
                .sql
                .into_owned(),
        ),
        ("act_on_ids_retry_2", act_on_ids(OperatorAction::Retry, 2)),
        (
            "act_on_ids_discard_2",
            act_on_ids(OperatorAction::Discard, 2),
        ),
        (
            "act_on_filter_retry",
            act_on_filter(OperatorAction::Retry, "ann", &parked_only, 1000)
                .sql
                .into_owned(),
        ),
        (
            "act_on_filter_discard",
            act_on_filter(OperatorAction::Discard, "ann", &parked_only, 1000)
                .sql
                .into_owned(),
        ),
        (
            "count_on_filter",
            count_on_filter(&parked_only, 1000).sql.into_owned(),
        ),
        ("kpis", KPIS.to_owned()),
        ("purge_terminal", PURGE_TERMINAL.to_owned()),
        ("select_list", SELECT_LIST.to_owned()),
        ("select_lists", SELECT_LISTS.to_owned()),
        ("replace_list_2", replace_list(2)),
        ("delete_list", DELETE_LIST.to_owned()),
        ("select_channel", SELECT_CHANNEL.to_owned()),
        ("replace_channel", REPLACE_CHANNEL.to_owned()),
        ("delete_channel", DELETE_CHANNEL.to_owned()),
        ("select_secrets", SELECT_SECRETS.to_owned()),
        ("reseal_list_secret", RESEAL_LIST_SECRET.to_owned()),
        ("reseal_channel_secrets", RESEAL_CHANNEL_SECRETS.to_owned()),
        ("record_site_health", RECORD_SITE_HEALTH.to_owned()),
        ("select_site_health", SELECT_SITE_HEALTH.to_owned()),
    ];
    for m in super::migrate::MIGRATIONS {
        statements.push((m.snapshot, m.sql.to_owned()));
    }
    statements
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::*;

    fn snapshot_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/mssql/sql")
    }

    /// Each statement's text equals its committed snapshot, and every snapshot belongs to a
    /// statement. A changed statement fails here until its snapshot is rewritten (review the
    /// diff): `UPDATE_SNAPSHOTS=1 cargo test -p central-outbox mssql`. Migrations have no
    /// snapshot: their file under migrations/mssql is the committed text (the parse check reads
    /// it there).
    #[test]
    fn statements_match_their_snapshots() {
        let dir = snapshot_dir();
        let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some();
        let migrations: Vec<&str> = super::super::migrate::MIGRATIONS
            .iter()
            .map(|m| m.snapshot)
            .collect();
        let catalog: Vec<(&str, String)> = catalog()
            .into_iter()
            .filter(|(name, _)| !migrations.contains(name))
            .collect();
        let mut problems = Vec::new();
        for (name, sql) in &catalog {
            let path = dir.join(format!("{name}.sql"));
            let text = format!("{sql}\n");
            if update {
                std::fs::write(&path, &text).unwrap();
                continue;
            }
            match std::fs::read_to_string(&path) {
                Ok(snapshot) if snapshot == text => {}
                Ok(_) => problems.push(format!("{name}: differs from {}", path.display())),
                Err(e) => problems.push(format!("{name}: {}: {e}", path.display())),
            }
        }
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "sql") {
                let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
                if !catalog.iter().any(|(name, _)| *name == stem) {
                    problems.push(format!(
                        "{}: no statement has this snapshot",
                        path.display()
                    ));
                }
            }
        }
        assert!(
            problems.is_empty(),
            "statement snapshots out of date (rerun with UPDATE_SNAPSHOTS=1 and review):\n{}",
            problems.join("\n")
        );
    }

    /// Every `pub const` statement in this file appears in the catalog, so none escapes the
    /// snapshot and parse tests.
    #[test]
    fn the_catalog_lists_every_statement_constant() {
        let source = include_str!("sql.rs");
        let rendered: Vec<String> = catalog().into_iter().map(|(_, sql)| sql).collect();
        let constants = [
            CHECK_CONNECTION,
            PING,
            MIGRATION_LOCK,
            MIGRATION_UNLOCK,
            MIGRATION_VERSION,
            MIGRATION_BEGIN,
            MIGRATION_RECORD,
            SELECT_CONTENT_HASH,
            CLEAR_CONDITION,
            ACQUIRE_LEASE,
            RELEASE_LEASE,
            CLAIM_DUE,
            CLAIM_DIGEST,
            PARK_INVALID,
            RECORD_OUTCOME,
            RECORD_OUTCOMES,
            SELECT_STATE,
            SELECT_DETAIL,
            KPIS,
            PURGE_TERMINAL,
            SELECT_LIST,
            SELECT_LISTS,
            DELETE_LIST,
            SELECT_CHANNEL,
            REPLACE_CHANNEL,
            DELETE_CHANNEL,
            SELECT_SECRETS,
            RESEAL_LIST_SECRET,
            RESEAL_CHANNEL_SECRETS,
            SUBMIT_ONE,
            SUBMIT_ONE_KEYED,
            RECORD_SITE_HEALTH,
            SELECT_SITE_HEALTH,
        ];
        let declared = source.matches("\npub const ").count();
        // SUBMIT_COLUMNS and SUBMIT_PARAMS are numbers, CONSOLIDATING_LIST a column's name,
        // not statements.
        assert_eq!(declared, constants.len() + 3, "a new constant: add it here");
        for sql in constants {
            assert!(
                rendered.iter().any(|r| r == sql),
                "not in the catalog:\n{sql}"
            );
        }
    }

    #[test]
    fn statements_are_batches_with_bound_parameters() {
        for (name, sql) in catalog() {
            // Session-level statements, and the end of a migration's transaction (opened by
            // MIGRATION_BEGIN, which sets XACT_ABORT for the session).
            let one_shot = [
                "check_connection",
                "migration_lock",
                "migration_unlock",
                "migration_record",
            ];
            let migration_file = super::super::migrate::MIGRATIONS
                .iter()
                .any(|m| m.snapshot == name);
            if !one_shot.contains(&name) && !migration_file {
                assert!(
                    sql.starts_with("SET XACT_ABORT ON;\nSET NOCOUNT ON;\n"),
                    "{name} must start with SET XACT_ABORT ON"
                );
            }
            for forbidden in [
                "MERGE ",
                "CREATE OR ALTER",
                "WAITFOR",
                "rowversion",
                "SERIALIZABLE",
                "REPEATABLE READ",
                "HOLDLOCK",
            ] {
                assert!(!sql.contains(forbidden), "{name} uses {forbidden}");
            }
        }
        // Built statements number their placeholders in step with their parameters.
        let stmt = query(
            &NotificationFilter {
                statuses: vec![crate::domain::status::Status::Parked],
                subject_contains: Some("x".into()),
                ..Default::default()
            },
            Some((Utc::now(), 7)),
            10,
        );
        assert_eq!(stmt.params.len(), 5);
        assert!(stmt.sql.contains("@P5") && !stmt.sql.contains("@P6"));
        let batch = insert_batch(3, 2);
        assert!(batch.contains(&format!("@P{}", 3 * SUBMIT_COLUMNS + 2)));
        assert!(!batch.contains(&format!("@P{}", 3 * SUBMIT_COLUMNS + 3)));
        let last = 2 * SUBMIT_COLUMNS + SUBMIT_PARAMS;
        let mixed = insert_in_order(&[true, false, true], &[true, false, true], 0);
        assert_eq!(mixed.matches("EXEC dbo.SubmitNotification").count(), 3);
        assert!(mixed.contains(&format!("@P{last}")));
        assert!(!mixed.contains(&format!("@P{}", last + 1)));
    }

    /// Only long runs of plain rows go in an INSERT; the other rows call the procedure.
    #[test]
    fn long_runs_of_plain_rows_go_in_one_insert() {
        let n = MIN_INSERT_RUN;
        let mut plain = vec![true; 2 * n + 4];
        plain[3] = false;
        plain[n + 4] = false;
        let layout = in_order_layout(&plain);
        assert!(
            layout[..4].iter().all(|&i| !i),
            "a run of 3, then a keyed row"
        );
        assert!(
            layout[4..n + 4].iter().all(|&i| i),
            "a run of MIN_INSERT_RUN"
        );
        assert!(
            layout[n + 4..].iter().all(|&i| !i),
            "a keyed row, then a run one shorter"
        );
        assert_eq!(in_order_layout(&[false, false]), [false, false]);
    }

    /// A row of a batch calls the procedure as a single row does, at the batch's time.
    #[test]
    fn a_batch_calls_the_procedure_as_a_single_row_does() {
        assert_eq!(
            SUBMIT_ONE,
            format!("{}{}", batch!(""), submit_call(1, false, false))
        );
        let keyed_only = insert_in_order(&[false, false], &[false, false], 0);
        assert_eq!(
            SUBMIT_ONE_KEYED,
            format!("{}{}", batch!(""), submit_call(1, true, false))
        );
        assert!(keyed_only.contains(&submit_call(1 + SUBMIT_PARAMS, true, true)));
        assert!(!keyed_only.contains("@inserted"));
        assert!(
            !keyed_only.contains(CONSOLIDATING_LIST),
            "no INSERT, nothing to guard"
        );
    }

    /// The rows of a list known to consolidate call the procedure, as plain rows (their
    /// parameters are a plain row's); the batch first checks the lists of the rows it puts in an
    /// INSERT, and only those.
    #[test]
    fn rows_of_a_consolidating_list_go_through_the_procedure() {
        let n = MIN_INSERT_RUN;
        let plain = vec![true; n + 1];
        let mut insertable = plain.clone();
        insertable[0] = false;
        let sql = insert_in_order(&plain, &insertable, 2);
        assert!(sql.contains(&submit_call(1, false, true)));
        assert_eq!(sql.matches("EXEC dbo.SubmitNotification").count(), 1);
        let first = (n + 1) * SUBMIT_COLUMNS + 1;
        assert!(
            sql.contains(&format!("l.Name IN (@P{first}, @P{});", first + 1)),
            "{sql}"
        );
        let all_plain = insert_batch(2, 1);
        assert!(all_plain.contains("l.Name IN (@P29);"));
        // A guard that answers returns before anything is stored.
        let guard = all_plain.find("RETURN;").unwrap();
        assert!(guard < all_plain.find("INSERT").unwrap());
    }

    /// Every statement bound through its function, with sample values.
    fn bound_statements() -> Vec<(&'static str, Statement)> {
        use crate::domain::delivery::{AttemptOutcome, Delivered, DeliveryError};
        use crate::domain::retry::Transition;
        use crate::domain::status::Status;
        use crate::domain::{NotificationContent, SiteId, Submission};
        use outbox_domain::ScriptOrigin;

        let now = Utc::now();
        let content = NotificationContent::parse(
            NotificationType::Email,
            "ops".into(),
            "Tank 4 high level".into(),
            "level 97%".into(),
            String::new(),
        )
        .unwrap();
        let origin = ScriptOrigin::parse("node-1".into(), "alarm.py".into(), None, None).unwrap();
        let new = NewNotification::new(Submission {
            id: NotificationId::generate(),
            content,
            provenance: origin.at_site(SiteId::parse("north".into()).unwrap(), now),
            priority: crate::domain::Priority::High,
            condition_key: None,
            cleared_at_site: None,
        });
        let key = ConditionKey::parse("tank4.level.high".into(), "condition_key").unwrap();
        let mut keyed = new.clone();
        keyed.submission.id = NotificationId::generate();
        keyed.submission.condition_key = Some(key.clone());
        let mut other_list = new.clone();
        other_list.submission.id = NotificationId::generate();
        other_list.submission.content.list_name =
            crate::domain::ListName::parse("other".into()).unwrap();
        let mut cleared = keyed.clone();
        cleared.submission.id = NotificationId::generate();
        cleared.submission.cleared_at_site = Some(now);
        let id = new.submission.id;
        let result: std::result::Result<Delivered, DeliveryError> =
            Err(DeliveryError::transient("relay busy"));
        let record = AttemptRecord {
            row_id: 7,
            id,
            attempt_no: 2,
            epoch: LeaseEpoch(3),
            outcome: AttemptOutcome::of(&result),
            error: Some("relay busy".into()),
            duration: Duration::from_millis(40),
            transition: Transition {
                status: Status::Retrying,
                retry_count: 1,
                next_attempt_at: Some(now),
                last_error: Some("relay busy".into()),
                resolved_at: None,
                resolved_targets: None,
            },
        };
        let smtp = crate::config::Config {
            smtp: Some(crate::config::SmtpConfig::new(
                "relay.test",
                25,
                "outbox@plant.test",
            )),
            ..Default::default()
        }
        .validate()
        .unwrap()
        .smtp
        .unwrap();
        let filter = NotificationFilter {
            statuses: vec![Status::Parked],
            subject_contains: Some("tank".into()),
            ..Default::default()
        };
        let secret = || Some(("old".to_owned(), "new".to_owned()));
        vec![
            ("migration_lock", migration_lock(Duration::from_secs(5))),
            (
                "migration_record",
                migration_record(&super::super::migrate::MIGRATIONS[0]),
            ),
            ("insert_rows", insert_rows(&[&new, &new], &HashSet::new())),
            ("insert_rows_one", insert_rows(&[&new], &HashSet::new())),
            (
                "insert_rows_in_order",
                insert_rows(
                    &[&new, &keyed, &new, &new, &cleared, &keyed],
                    &HashSet::new(),
                ),
            ),
            (
                "insert_rows_consolidating",
                insert_rows(&[&new, &new, &keyed], &HashSet::from(["ops".to_owned()])),
            ),
            (
                "insert_rows_two_lists",
                insert_rows(&[&new, &other_list, &new], &HashSet::new()),
            ),
            ("submit_one", submit_one(&new)),
            ("submit_one_keyed", submit_one(&cleared)),
            (
                "clear_condition",
                clear_condition(
                    &SiteId::parse("north".into()).unwrap(),
                    &key,
                    &Actor::new("site north"),
                ),
            ),
            ("select_content_hash", select_content_hash(id)),
            (
                "acquire_lease",
                acquire_lease("dispatcher", "node", Duration::from_secs(15)),
            ),
            (
                "release_lease",
                release_lease("dispatcher", "node", LeaseEpoch(3)),
            ),
            (
                "claim_due",
                claim_due(
                    "dispatcher",
                    LeaseEpoch(3),
                    NotificationType::Email,
                    ClaimLanes {
                        in_turn: 9,
                        longest_waiting: 1,
                    },
                    Duration::from_secs(120),
                ),
            ),
            (
                "claim_digest",
                claim_digest(
                    "dispatcher",
                    LeaseEpoch(3),
                    NotificationType::Email,
                    id,
                    Duration::from_secs(120),
                ),
            ),
            ("park_invalid", park_invalid(7, LeaseEpoch(3), "bad", id, 2)),
            ("record_outcome", record_outcome("dispatcher", &record)),
            (
                "record_outcomes",
                record_outcomes("dispatcher", &[&record, &record]),
            ),
            ("select_state", select_state(id)),
            ("select_detail", select_detail(id)),
            ("query", query(&filter, Some((now, 7)), 51)),
            (
                "act_on_these",
                act_on_these(OperatorAction::Retry, "ann", &[id, id]),
            ),
            (
                "act_on_filter",
                act_on_filter(OperatorAction::Discard, "ann", &filter, 10),
            ),
            ("kpis", kpis(now, now, now)),
            ("purge_terminal", purge_terminal(now, 100)),
            ("select_list", select_list("ops")),
            (
                "replace_list_with",
                replace_list_with(
                    "ops",
                    NotificationType::Email,
                    None,
                    None,
                    Some(Consolidation::parse(10, Duration::from_secs(60), 100).unwrap()),
                    vec!["a@plant.test".into(), "b@plant.test".into()],
                ),
            ),
            ("delete_list", delete_list("ops")),
            ("select_channel", select_channel("email")),
            (
                "replace_channel",
                replace_channel("email", &smtp, None, None),
            ),
            ("delete_channel", delete_channel("email")),
            (
                "reseal_list_secret",
                reseal_list_secret("hooks", "old".into(), "new".into()),
            ),
            (
                "reseal_channel_secrets",
                reseal_channel_secrets("email", secret(), secret()),
            ),
            (
                "record_site_health",
                record_site_health(&crate::domain::site_health::SiteHealthReport {
                    site: SiteId::parse("north".into()).unwrap(),
                    node: SiteId::parse("north-a".into()).unwrap(),
                    role: crate::domain::site_health::NodeRole::Active,
                    buffer_depth: 12,
                    oldest_buffered_age: Duration::from_secs(3),
                    last_forward_at: Some(now),
                    standby_lag_rows: 2,
                    standby_lag: Duration::from_millis(40),
                    version: "0.1.0".into(),
                    central_reachable: true,
                    rejected: 0,
                    sends_refused: false,
                }),
            ),
        ]
    }

    /// Each statement's function binds exactly one value per placeholder its text uses: @P1 to
    /// @Pn, each used, none missing, for n values. (A value bound to the wrong placeholder of
    /// a fixed statement is caught by `Statement::set`, which names each one.)
    #[test]
    fn every_placeholder_is_bound_once() {
        for (name, stmt) in bound_statements() {
            let mut used = std::collections::BTreeSet::new();
            for (i, _) in stmt.sql.match_indices("@P") {
                let digits: String = stmt.sql[i + 2..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                // A procedure's own parameter (`@Priority = @P14`) is not a placeholder.
                if !digits.is_empty() {
                    used.insert(digits.parse::<usize>().unwrap());
                }
            }
            let bound: std::collections::BTreeSet<usize> = (1..=stmt.params.len()).collect();
            assert_eq!(used, bound, "{name}: placeholders used vs values bound");
        }
    }

    /// Every statement parses as T-SQL (sqlglot, tsql dialect), and none is only accepted as an
    /// opaque command. The parser is installed by `make tools` (which `make test` runs); its
    /// absence fails the test, because a silently skipped check is no check.
    #[test]
    fn every_statement_parses_as_tsql() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let python = std::env::var_os("OUTBOX_SQLGLOT_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target/tools/venv/bin/python"));
        assert!(
            python.exists(),
            "the T-SQL parser's Python is not installed at {}: run `make tools` \
             (`make test` does it first), or point OUTBOX_SQLGLOT_PYTHON at a python with sqlglot",
            python.display()
        );
        let output = Command::new(&python)
            .arg(snapshot_dir().join("check_tsql.py"))
            .arg(snapshot_dir())
            .arg(workspace.join("migrations/mssql"))
            .output()
            .unwrap();
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success(),
            "T-SQL parse check failed:\n{report}"
        );
        // The script names every file it parsed; all of them must be there. A migration is
        // parsed from its own file (`migration_0001_initial` is migrations/mssql/0001_initial.sql).
        let migrations = super::super::migrate::MIGRATIONS;
        for (name, _) in catalog() {
            let file = match migrations.iter().find(|m| m.snapshot == name) {
                Some(_) => name.trim_start_matches("migration_"),
                None => name,
            };
            assert!(
                report.contains(&format!("ok {file}.sql")),
                "{name} was not parsed:\n{report}"
            );
        }
    }
}
