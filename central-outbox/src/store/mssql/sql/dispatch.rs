//! The dispatcher's statements: the leader lease (take, renew, release), claiming due rows and
//! digests (stored procedures), parking a claimed row whose content no longer validates, and
//! recording outcomes, fenced by the claim's epoch and the lease, through one procedure for
//! every outcome (see [`record_outcomes`] for how its texts travel).

use std::borrow::Cow;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::super::{millis_i32, millis_i64};
use super::{Param, Statement, guid, text};
use crate::domain::serve_order::ClaimLanes;
use crate::domain::{NotificationId, NotificationType};
use crate::records::{AttemptRecord, LeaseEpoch};

/// Takes or renews lease @P1 for holder @P2 for @P3 milliseconds: renews (same epoch) if the
/// holder was the last to hold it, even if it lapsed (nobody held it in between, so its claims
/// are still its own); takes it with the next epoch if another holder's lease is free or has
/// lapsed; creates it at epoch 1 if it never existed. Result: the epoch held, or no row. The
/// stored procedure dbo.AcquireLease (migrations/mssql/procedures/AcquireLease.sql): a renewal
/// must stay cheap when the server is busy with bulk work, and a one-line call is.
pub(crate) fn acquire_lease(name: &str, holder: &str, ttl: Duration) -> Statement {
    Statement::fixed(include_str!("acquire_lease.sql"))
        .set("@P1", text(name))
        .set("@P2", text(holder))
        .set("@P3", Param::Int(Some(millis_i32(ttl))))
}

/// Expires lease @P1 now if holder @P2 still holds it at epoch @P3, and ends that tenure: the
/// epoch moves on, so nothing more is recorded under it and a re-take starts a new one.
/// Result: rows changed.
pub(crate) fn release_lease(name: &str, holder: &str, epoch: LeaseEpoch) -> Statement {
    Statement::fixed(include_str!("release_lease.sql"))
        .set("@P1", text(name))
        .set("@P2", text(holder))
        .set("@P3", Param::BigInt(Some(epoch.0)))
}

/// Lease @P1 as stored, with the database's clock: two results, the clock (`ReadAt`, with the
/// leases' millisecond precision) and the lease's row (none if it was never taken). A plain
/// read on the main pool: it is the self-alerts' check, which must not take the connection
/// the renewals have to themselves.
pub(crate) fn select_lease(name: &str) -> Statement {
    Statement::fixed(include_str!("select_lease.sql")).set("@P1", text(name))
}

/// Claims due rows of type @P5 for @P2 milliseconds under epoch @P1 of lease @P6, and writes
/// their InFlight attempt rows, in one transaction: up to @P3 rows due longest, then up to @P4
/// more by priority and serve turn (`domain::serve_order`). The stored procedure
/// dbo.ClaimDueNotifications (migrations/mssql/procedures/ClaimDueNotifications.sql), which says
/// how. Result: the claimed rows, the longest-waiting ones first (by due time), then the others
/// in turn.
pub(crate) fn claim_due(
    lease: &str,
    epoch: LeaseEpoch,
    kind: NotificationType,
    lanes: ClaimLanes,
    claim_timeout: Duration,
) -> Statement {
    let rows = |n: usize| Param::BigInt(Some(i64::try_from(n).unwrap_or(i64::MAX)));
    Statement::fixed(include_str!("claim_due.sql"))
        .set("@P1", Param::BigInt(Some(epoch.0)))
        .set("@P2", Param::Int(Some(millis_i32(claim_timeout))))
        .set("@P3", rows(lanes.longest_waiting))
        .set("@P4", rows(lanes.in_turn))
        .set("@P5", text(kind.as_str()))
        .set("@P6", text(lease))
}

/// The earliest due time ahead of the database's clock among the unclaimed Pending and Retrying
/// rows of type @P1 (`NextDue`, NULL if none; a scheduled row's time, a retry's), and that clock
/// (`Now`), read once (`DispatchStore::next_due_in`). One seek in IX_Notifications_Due (Type,
/// NextAttemptAt, Id), whose filter the statement states, as Babelfish's planner requires before
/// it considers a filtered index. A plain read: it changes nothing.
pub(crate) fn select_next_due(kind: NotificationType) -> Statement {
    Statement::fixed(include_str!("select_next_due.sql")).set("@P1", text(kind.as_str()))
}

/// Claims, as digest @P5, the due Held rows of one list of type @P3 for @P2 milliseconds under
/// epoch @P1 of lease @P4 (only while that epoch holds it), with an InFlight attempt row each
/// naming the digest, in one transaction (`DispatchStore::claim_digest`). The stored procedure
/// dbo.ClaimDigestNotifications (migrations/mssql/procedures/ClaimDigestNotifications.sql),
/// which says how. Result: the claimed rows, longest due first (none when no Held row is
/// due).
pub(crate) fn claim_digest(
    lease: &str,
    epoch: LeaseEpoch,
    kind: NotificationType,
    digest: NotificationId,
    claim_timeout: Duration,
) -> Statement {
    Statement::fixed(include_str!("claim_digest.sql"))
        .set("@P1", Param::BigInt(Some(epoch.0)))
        .set("@P2", Param::Int(Some(millis_i32(claim_timeout))))
        .set("@P3", text(kind.as_str()))
        .set("@P4", text(lease))
        .set("@P5", guid(digest))
}

/// Parks a claimed row whose stored content no longer passes validation (it can never be
/// delivered), and closes its InFlight attempt with the reason. @P1: row id, @P2: epoch,
/// @P3: reason, @P4: notification id, @P5: attempt number.
pub(crate) fn park_invalid(
    row_id: i64,
    epoch: LeaseEpoch,
    reason: &str,
    id: NotificationId,
    attempt_no: i32,
) -> Statement {
    Statement::fixed(include_str!("park_invalid.sql"))
        .set("@P1", Param::BigInt(Some(row_id)))
        .set("@P2", Param::BigInt(Some(epoch.0)))
        .set("@P3", text(reason))
        .set("@P4", guid(id))
        .set("@P5", Param::Int(Some(attempt_no)))
}

/// Applies each attempt's outcome under lease @P1, the outcomes as a JSON array in @P2, one
/// object per row, no row twice: a row's transition only if it is still claimed by that attempt
/// under its epoch and no other node has taken the lease since (it is still at that epoch,
/// lapsed or not: then nobody can have claimed the row again); the attempt row's outcome only
/// then, so an unapplied outcome leaves the attempt InFlight (a possible duplicate, made
/// visible). A Held row that would become Retrying (its digest failed for now) stays Held, due
/// at the retry time, for the next digest. One call for a group of outcomes instead of one
/// each, because a server spends far more on a call than on a row (on Babelfish, parsing the
/// batch is most of it). The stored procedure dbo.RecordAttemptOutcomes
/// (migrations/mssql/procedures/RecordAttemptOutcomes.sql). Result: the ids of the rows it
/// applied to.
///
/// Every outcome takes this one path, whatever its texts hold. Each text (LastError,
/// ResolvedTargets, Error, Provider) goes through [`escape_free`], so that no character of it is one JSON
/// escapes: Babelfish's OPENJSON would hand such a string back still escaped. The procedure
/// decodes them. Instants go as ISO 8601 with 100 ns digits, which the server reads as
/// datetime2(7).
pub(crate) fn record_outcomes(lease: &str, records: &[&AttemptRecord]) -> Statement {
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
                "LastError": t.last_error.as_deref().map(escape_free),
                "NextAttemptAt": t.next_attempt_at.map(json_instant),
                "DeliveredAt": t.delivered_at().map(json_instant),
                "ResolvedAt": t.resolved_at.map(json_instant),
                "ResolvedTargets": t.resolved_targets.as_deref().map(escape_free),
                "Outcome": record.outcome.as_str(),
                "DurationMs": millis_i64(record.duration),
                "Error": record.error.as_deref().map(escape_free),
                "Provider": record.provider.as_deref().map(escape_free),
            })
        })
        .collect();
    Statement::fixed(include_str!("record_outcomes.sql"))
        .set("@P1", text(lease))
        .set("@P2", text(&serde_json::Value::Array(outcomes).to_string()))
}

/// The character that starts a code in [`escape_free`]'s texts.
const CODE: char = '%';

/// `text` with every character JSON escapes (`"`, `\` and those below U+0020), and [`CODE`] itself,
/// written as `%` and two upper-case hex digits (`%22`, `%5C`, `%0A`, `%25`); every other
/// character, non-ASCII included, as it is. `dbo.DecodeOutcomeText`
/// (migrations/mssql/procedures/DecodeOutcomeText.sql) turns it back. Such a text crosses JSON
/// unescaped, so OPENJSON reads it the same on SQL Server and on Babelfish. Borrowed when there is
/// nothing to encode (most texts).
pub(crate) fn escape_free(text: &str) -> Cow<'_, str> {
    let encoded = |c: char| c == CODE || c == '"' || c == '\\' || c < ' ';
    if !text.chars().any(encoded) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if encoded(c) {
            // Every encoded character is below U+0080: two hex digits.
            let code = u32::from(c);
            out.push(CODE);
            out.extend(
                [code >> 4, code & 0xF].map(|digit| {
                    char::from_digit(digit, 16).map_or('0', |d| d.to_ascii_uppercase())
                }),
            );
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// An instant as OPENJSON reads it into datetime2(7): ISO 8601, UTC, 100 ns digits.
fn json_instant(instant: DateTime<Utc>) -> String {
    format!(
        "{}.{:07}",
        instant.format("%Y-%m-%dT%H:%M:%S"),
        instant.timestamp_subsec_nanos() % 1_000_000_000 / 100
    )
}
