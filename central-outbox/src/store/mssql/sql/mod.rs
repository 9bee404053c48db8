//! Every T-SQL statement the MS SQL backend sends, each in one place. A fixed statement is a
//! file in this module's folder (`claim_due.sql` ...), compiled in with `include_str!`:
//! the file is the statement, sent as it is. A statement whose shape varies with its input (a
//! filter, a number of rows, ids or targets) is built by a function from fixed fragments. Both
//! live in the module of their area: [`connection`] (pool check-out, the health probe,
//! migrations), [`ingest`] (submits and the condition keys' clear), [`dispatch`] (the lease,
//! claims, outcomes), [`admin`] (reads, operator actions, KPIs, purge), [`settings`] (lists and
//! channel settings), [`site_health`], [`site_status`] and [`status_callback`].
//!
//! The dispatcher's two busiest statements (claiming and recording outcomes), the lease, the
//! single-row submit (also each keyed row of a larger submit) and the digest claim call stored
//! procedures, each defined by its own file under migrations/mssql/procedures/ (which the
//! migrator creates again whenever the file changes, see `procedures`): a one-line call costs a
//! server far less to parse than the batch would.
//!
//! Rules they keep:
//! - One batch per unit of work, starting `SET XACT_ABORT ON` so any error rolls the whole
//!   transaction back; writes that touch several rows or tables run in one explicit transaction,
//!   which also makes a deadlock victim (1205) safe to run again.
//! - Values are always bound (`@P1`, `@P2`, ...), never spliced into the text. Each statement
//!   with parameters has a function right beside its `include_str!` that takes the values in
//!   domain terms and returns the [`Statement`] with every value under the placeholder it fills
//!   ([`Statement::set`]), so the text and what it is bound with are read together. The built
//!   statements number their placeholders with [`Statement::bind`].
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
//! The tests (`sql/tests.rs`) parse every statement file, every migration, every procedure file and
//! a rendering of each built statement as T-SQL, check that every file is included by exactly one
//! module and every placeholder bound once, and compare each built statement's rendering with its
//! committed snapshot under `sql/snapshots/` (`UPDATE_SNAPSHOTS=1` rewrites them: review the diff).

use std::borrow::Cow;

use chrono::{DateTime, Utc};

pub(super) use super::pool::Param;
use crate::domain::NotificationId;

/// A statement with its parameters, in placeholder order: a fixed text with the values its
/// function beside it binds, or one assembled from fixed fragments.
#[derive(Debug, Default)]
pub(super) struct Statement {
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
    pub(super) fn new(sql: &str) -> Self {
        Self {
            sql: Cow::Owned(sql.to_owned()),
            params: Vec::new(),
        }
    }

    /// Binds `value` to `placeholder`, which must be the next one (`@P1`, then `@P2`, ...): each
    /// fixed statement's function names every value by the placeholder it fills, beside the text
    /// that uses it. Out of order is a bug in the statement's module, caught by debug builds and by
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
    pub(super) fn bind(&mut self, value: Param) -> String {
        self.params.push(value);
        format!("@P{}", self.params.len())
    }

    pub(super) fn push(&mut self, fragment: &str) {
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

pub(super) fn int(value: u32) -> Param {
    Param::Int(Some(int_value(value)))
}

pub(super) fn int_value(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

pub(super) fn at(instant: DateTime<Utc>) -> Param {
    Param::Time(Some(instant))
}

/// [`BATCH_START`], as a literal for `concat!` in the built statements.
macro_rules! batch_start {
    () => {
        "SET XACT_ABORT ON;\nSET NOCOUNT ON;\n"
    };
}

/// The columns `decode::state` reads, from `dbo.Notifications AS n`, as the built queries select
/// them (select_state.sql and select_detail.sql spell them out; a test keeps them equal).
macro_rules! state_columns {
    () => {
        "n.Id, n.NotificationId, n.Status, n.Type, n.ListName, n.Subject, n.SourceSiteId, \
         n.RetryCount, n.LastError, n.SiteEnqueuedAt, n.CreatedAt, n.LastAttemptAt, \
         n.NextAttemptAt, n.DeliveredAt, n.ResolvedAt, n.Priority, n.ConditionKey, n.DeliverAfter"
    };
}

/// The database's clock, once per batch, rounded to the columns' millisecond precision (as the
/// statement files that need it declare it).
macro_rules! declare_now {
    () => {
        "DECLARE @now datetime2(3) = SYSUTCDATETIME();\n"
    };
}

/// How every batch starts (and so every statement file, but the few session-level ones): see
/// the rules above.
const BATCH_START: &str = batch_start!();

pub(super) mod admin;
pub(super) mod connection;
pub(super) mod dispatch;
pub(super) mod escalation;
pub(super) mod ingest;
pub(super) mod settings;
pub(super) mod site_health;
pub(super) mod site_status;
pub(super) mod status_callback;
#[cfg(test)]
mod tests;

pub(super) use self::admin::*;
pub(super) use self::connection::*;
pub(super) use self::dispatch::*;
pub(super) use self::ingest::*;
pub(super) use self::settings::*;
pub(super) use self::site_health::*;
pub(super) use self::site_status::*;
pub(super) use self::status_callback::*;
