//! The statements of the status callbacks (migration 0018, queued by the trigger
//! `RecordSiteStatusChanges`): the due changes with their notifications and their list's
//! endpoint, the record of one call (its history entry, and its change forgotten or made due
//! again, in one transaction), and the backlog.

use super::{Param, Statement, at, guid};
use crate::records::StatusCallbackCall;

/// The @P1 oldest due changes (by the database's clock) that have no earlier change of their
/// notification waiting, in `decode::state`'s columns with `Seq`, `ResolvedTargets`,
/// `StatusCallbackUrl`, `QueuedAt` and `Calls` (first result); the earliest `NextDue` of any
/// change and the clock `Now` (second).
pub(crate) fn select_due_status_callbacks(limit: u32) -> Statement {
    Statement::fixed(include_str!("select_due_status_callbacks.sql")).set(
        "@P1",
        Param::Int(Some(i32::try_from(limit).unwrap_or(i32::MAX))),
    )
}

/// Records `call` as the next entry of its notification's calls, and deletes its change
/// (@P9 NULL: answered or given up) or makes it due at @P9, in one transaction.
pub(crate) fn record_status_callback(call: &StatusCallbackCall) -> Statement {
    Statement::fixed(include_str!("record_status_callback.sql"))
        .set("@P1", guid(call.id))
        .set("@P2", at(call.called_at))
        .set(
            "@P3",
            Param::BigInt(
                call.duration
                    .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            ),
        )
        .set("@P4", Param::Text(Some(call.status.as_str().to_owned())))
        .set("@P5", Param::Text(Some(call.outcome.as_str().to_owned())))
        .set("@P6", Param::Text(call.error.clone()))
        .set("@P7", Param::Text(call.endpoint.clone()))
        .set("@P8", Param::BigInt(Some(call.seq)))
        .set("@P9", Param::Time(call.retry_at))
}

/// How many changes wait (`Waiting`) and the oldest one's queueing time (`OldestQueuedAt`).
pub(crate) const SELECT_STATUS_CALLBACK_BACKLOG: &str =
    include_str!("select_status_callback_backlog.sql");
