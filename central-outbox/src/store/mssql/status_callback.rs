//! The status callbacks on MS SQL (migration 0018): the trigger `RecordSiteStatusChanges`
//! queues each final status of a notification whose list has an endpoint in
//! `dbo.StatusCallbacks`; these calls hand out the due changes by the database's clock, record
//! each call in `dbo.StatusCallbackCalls` with what becomes of its change
//! (`sql::status_callback`), and turn the calls into history entries for the detail.

use std::time::Duration;

use tiberius::Row;

use super::{MsSqlStore, decode, result_set, sql};
use crate::domain::history::{HistoryEntry, HistoryEvent};
use crate::domain::status::Status;
use crate::domain::status_callback::CallOutcome;
use crate::domain::webhook::WebhookUrl;
use crate::records::{
    DueStatusCallback, SiteStatusChange, StatusCallbackBacklog, StatusCallbackCall,
    StatusCallbackTurn,
};
use crate::store::{Result, StoreError};

const CONTEXT: &str = "status callbacks";

pub(super) async fn due(store: &MsSqlStore, limit: u32) -> Result<StatusCallbackTurn> {
    let stmt = sql::select_due_status_callbacks(limit);
    let mut results = store.batch(CONTEXT, &stmt.sql, &stmt.params).await?;
    let due = result_set(&mut results, 0, CONTEXT)?
        .iter()
        .map(due_change)
        .collect::<Result<Vec<_>>>()?;
    let clock = result_set(&mut results, 1, CONTEXT)?;
    let row = clock
        .first()
        .ok_or_else(|| StoreError::Corrupt(format!("{CONTEXT}: no clock row")))?;
    let now = decode::time(row, "Now")?;
    // By the database's clock, like the NextCallAt it is compared with.
    let next_due_in =
        decode::opt_time(row, "NextDue")?.map(|at| (at - now).to_std().unwrap_or(Duration::ZERO));
    Ok(StatusCallbackTurn { due, next_due_in })
}

fn due_change(row: &Row) -> Result<DueStatusCallback> {
    Ok(DueStatusCallback {
        change: SiteStatusChange {
            seq: decode::req::<i64>(row, "Seq")?,
            state: decode::state(row)?,
            delivered_to: decode::opt_text(row, "ResolvedTargets")?,
        },
        endpoint: decode::opt_text(row, "StatusCallbackUrl")?
            .map(|u| {
                WebhookUrl::parse(&u).map_err(|e| {
                    StoreError::Corrupt(format!(
                        "column NotificationLists.StatusCallbackUrl: {}",
                        e.problem
                    ))
                })
            })
            .transpose()?,
        queued_at: decode::time(row, "QueuedAt")?,
        calls: decode::count(row, "Calls")?,
    })
}

pub(super) async fn record(store: &MsSqlStore, call: &StatusCallbackCall) -> Result<()> {
    let stmt = sql::record_status_callback(call);
    store.batch(CONTEXT, &stmt.sql, &stmt.params).await?;
    Ok(())
}

pub(super) async fn backlog(store: &MsSqlStore) -> Result<StatusCallbackBacklog> {
    let mut results = store
        .batch(CONTEXT, sql::SELECT_STATUS_CALLBACK_BACKLOG, &[])
        .await?;
    let rows = result_set(&mut results, 0, CONTEXT)?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt(format!("{CONTEXT}: no backlog row")))?;
    Ok(StatusCallbackBacklog {
        waiting: u64::try_from(decode::req::<i64>(row, "Waiting")?).unwrap_or(0),
        oldest_queued_at: decode::opt_time(row, "OldestQueuedAt")?,
    })
}

/// One row of the detail's third result (`StatusCallbackCalls`) as a history entry, numbered
/// by its `CallNo` until `with_calls` merges it with the attempts.
pub(super) fn history_entry(row: &Row) -> Result<HistoryEntry> {
    let outcome = decode::text(row, "Outcome")?;
    let status = decode::text(row, "Status")?;
    Ok(HistoryEntry {
        sequence: decode::count(row, "CallNo")?,
        at: decode::time(row, "CalledAt")?,
        error: decode::opt_text(row, "Error")?,
        event: HistoryEvent::StatusCallback {
            outcome: CallOutcome::from_db(&outcome).ok_or_else(|| {
                StoreError::Corrupt(format!("status callback outcome {outcome:?}"))
            })?,
            status: Status::from_db(&status)
                .ok_or_else(|| StoreError::Corrupt(format!("status callback status {status:?}")))?,
            endpoint: decode::opt_text(row, "Endpoint")?,
            duration: decode::opt::<i64>(row, "DurationMs")?
                .map(|d| Duration::from_millis(u64::try_from(d).unwrap_or(0))),
        },
    })
}
