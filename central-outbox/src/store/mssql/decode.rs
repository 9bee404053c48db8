//! Reading columns of MS SQL rows into domain values. A NULL where the schema forbids one, a
//! value of the wrong type, or an unknown enum name is reported as corrupt data, never a panic.

use chrono::{DateTime, Utc};
use tiberius::{FromSql, Row};
use uuid::Uuid;

use crate::domain::status::Status;
use crate::domain::{NotificationId, NotificationType, Priority};
use crate::records::NotificationState;
use crate::store::{Result, StoreError};

fn corrupt(column: &str, problem: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("column {column}: {problem}"))
}

/// A nullable column.
pub(super) fn opt<'a, T: FromSql<'a>>(row: &'a Row, column: &str) -> Result<Option<T>> {
    row.try_get::<T, _>(column).map_err(|e| corrupt(column, e))
}

/// A NOT NULL column.
pub(super) fn req<'a, T: FromSql<'a>>(row: &'a Row, column: &str) -> Result<T> {
    opt(row, column)?.ok_or_else(|| corrupt(column, "is NULL"))
}

pub(super) fn text(row: &Row, column: &str) -> Result<String> {
    req::<&str>(row, column).map(str::to_owned)
}

pub(super) fn opt_text(row: &Row, column: &str) -> Result<Option<String>> {
    Ok(opt::<&str>(row, column)?.map(str::to_owned))
}

pub(super) fn time(row: &Row, column: &str) -> Result<DateTime<Utc>> {
    req::<DateTime<Utc>>(row, column)
}

pub(super) fn opt_time(row: &Row, column: &str) -> Result<Option<DateTime<Utc>>> {
    opt::<DateTime<Utc>>(row, column)
}

pub(super) fn guid(row: &Row, column: &str) -> Result<Uuid> {
    req::<Uuid>(row, column)
}

/// An `int` column that holds a count (never negative by construction).
pub(super) fn count(row: &Row, column: &str) -> Result<u32> {
    let value = req::<i32>(row, column)?;
    u32::try_from(value).map_err(|_| corrupt(column, format!("negative: {value}")))
}

/// A priority rank column (`Priority::rank`).
pub(super) fn priority(row: &Row, column: &str) -> Result<Priority> {
    let rank = req::<i32>(row, column)?;
    Priority::from_rank(i64::from(rank))
        .ok_or_else(|| corrupt(column, format!("unknown rank {rank}")))
}

/// The state columns (`sql::state_columns!`) of a row.
pub(super) fn state(row: &Row) -> Result<NotificationState> {
    let status = text(row, "Status")?;
    let kind = text(row, "Type")?;
    Ok(NotificationState {
        row_id: req::<i64>(row, "Id")?,
        id: NotificationId::from_uuid(guid(row, "NotificationId")?),
        status: Status::from_db(&status).ok_or_else(|| corrupt("Status", &status))?,
        kind: NotificationType::from_db(&kind).ok_or_else(|| corrupt("Type", &kind))?,
        list_name: text(row, "ListName")?,
        subject: text(row, "Subject")?,
        source_site_id: text(row, "SourceSiteId")?,
        priority: priority(row, "Priority")?,
        condition_key: opt_text(row, "ConditionKey")?,
        retry_count: count(row, "RetryCount")?,
        last_error: opt_text(row, "LastError")?,
        site_enqueued_at: time(row, "SiteEnqueuedAt")?,
        created_at: time(row, "CreatedAt")?,
        last_attempt_at: opt_time(row, "LastAttemptAt")?,
        next_attempt_at: opt_time(row, "NextAttemptAt")?,
        delivered_at: opt_time(row, "DeliveredAt")?,
        resolved_at: opt_time(row, "ResolvedAt")?,
        deliver_after: opt_time(row, "DeliverAfter")?,
    })
}
