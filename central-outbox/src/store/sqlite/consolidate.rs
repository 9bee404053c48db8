//! Flood consolidation in the SQLite backend (rules in `domain::consolidation`): the count of a
//! list's arrivals in its current window, the hold of the rows over its threshold, and the claim
//! of one list's due held rows as one digest.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::{ClaimedRow, ms, stamp_claims};
use crate::domain::consolidation::{Consolidation, limits};
use crate::domain::{NotificationId, NotificationType, Submission};
use crate::records::{ClaimedNotification, LeaseEpoch};
use crate::store::Result;
use crate::store::stored_list::consolidation_settings;

/// A list's consolidation settings as stored; `None` when the list does not consolidate (or
/// does not exist). A stored setting out of its limits (a hand edit) consolidates nothing
/// rather than failing the submits of that list: it is logged.
pub(super) fn settings(conn: &Connection, list: &str) -> Result<Option<Consolidation>> {
    let stored = conn
        .prepare_cached(include_str!("sql/select_consolidation.sql"))?
        .query_row([list], |row| {
            Ok((
                row.get::<_, Option<i64>>(0)?,
                row.get::<_, Option<i64>>(1)?,
                row.get::<_, Option<i64>>(2)?,
            ))
        })
        .optional()?;
    let Some((Some(threshold), Some(window), Some(max))) = stored else {
        return Ok(None);
    };
    Ok(consolidation_settings(threshold, window, max)
        .inspect_err(|e| tracing::error!(list, error = %e, "stored consolidation settings are invalid; not consolidating"))
        .ok())
}

/// Counts the just-stored row `s` as an arrival of its list's current window and holds it
/// (Held, due at the window's end) if it is over the threshold and may be held. Returns whether
/// it was held.
pub(super) fn count_and_hold(
    conn: &Connection,
    s: &Submission,
    rules: Consolidation,
    now: DateTime<Utc>,
) -> Result<bool> {
    let (start, _) = rules.window_of(now);
    let arrived: i64 = conn
        .prepare_cached(include_str!("sql/count_arrival.sql"))?
        .query_row(params![s.content.list_name.as_str(), ms(start)], |row| {
            row.get(0)
        })?;
    if !rules.holds(s.priority, u64::try_from(arrived).unwrap_or(0)) {
        return Ok(false);
    }
    conn.prepare_cached(include_str!("sql/hold_notification.sql"))?
        .execute(params![s.id.to_string(), ms(rules.held_until(now))])?;
    Ok(true)
}

/// Claims, under `epoch` (only while it holds the lease), the due held rows of one list of
/// channel `kind` as digest `digest`: the list of the longest-due held row, up to its
/// `max_per_digest` rows (all of them at the limit's maximum if the list no longer
/// consolidates), longest due first. Their InFlight attempt rows name the digest.
pub(super) fn claim_digest(
    conn: &Connection,
    lease: &str,
    epoch: LeaseEpoch,
    kind: NotificationType,
    digest: NotificationId,
    claim_timeout: Duration,
    now: DateTime<Utc>,
) -> Result<Vec<ClaimedNotification>> {
    let now_ms = ms(now);
    let holds_lease = conn
        .prepare_cached(include_str!("sql/check_lease.sql"))?
        .query_row(params![lease, epoch.0, now_ms], |_| Ok(()))
        .optional()?
        .is_some();
    if !holds_lease {
        return Ok(Vec::new());
    }
    super::settle_pending_ends(conn, now_ms)?;
    let list: Option<String> = conn
        .prepare_cached(include_str!("sql/select_digest_list.sql"))?
        .query_row(params![kind.as_str(), now_ms], |row| row.get(0))
        .optional()?;
    let Some(list) = list else {
        return Ok(Vec::new());
    };
    let max = settings(conn, &list)?.map_or(limits::MAX_PER_DIGEST, |rules| rules.max_per_digest());
    let until = now_ms.saturating_add(super::duration_ms(claim_timeout));
    let mut rows = conn
        .prepare_cached(include_str!("sql/claim_digest.sql"))?
        .query_map(
            params![until, epoch.0, now_ms, max, kind.as_str(), list],
            ClaimedRow::read,
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    // RETURNING gives rows in no particular order: put them back in the claim's.
    rows.sort_by_key(|r| (r.due_ms, r.row_id));
    stamp_claims(conn, rows, epoch, now_ms, Some(digest))
}
