//! The statements of the site status feed (migration 0017, trigger
//! `RecordSiteStatusChanges`): starting or renewing a site's watch, reading a site's
//! unconfirmed changes with their notifications, forgetting the confirmed ones, the heads
//! that wake the streams, and the purge, all by the database's clock.

use std::time::Duration;

use super::{Param, Statement, text};
use crate::domain::SiteId;

/// Starts or renews site @P1's watch. Two first watches of one site racing to insert end one
/// with a duplicate key; run again, it updates.
pub(crate) fn watch_site_status(site: &SiteId) -> Statement {
    Statement::fixed(include_str!("watch_site_status.sql")).set("@P1", text(site.as_str()))
}

/// The oldest @P2 unconfirmed changes of site @P1, in `decode::state`'s columns (status, reason
/// and time as the change recorded them) with `Seq` and `ResolvedTargets`.
pub(crate) fn select_site_status_changes(site: &SiteId, limit: u32) -> Statement {
    Statement::fixed(include_str!("select_site_status_changes.sql"))
        .set("@P1", text(site.as_str()))
        .set(
            "@P2",
            Param::Int(Some(i32::try_from(limit).unwrap_or(i32::MAX))),
        )
}

/// Deletes site @P1's changes whose seqs the JSON array @P2 holds (`[{"Seq": n}, ...]`) and
/// renews its watch, in one transaction.
pub(crate) fn forget_site_status_changes(site: &SiteId, seqs: &[i64]) -> Statement {
    let seqs: Vec<serde_json::Value> = seqs
        .iter()
        .map(|seq| serde_json::json!({ "Seq": seq }))
        .collect();
    Statement::fixed(include_str!("forget_site_status_changes.sql"))
        .set("@P1", text(site.as_str()))
        .set("@P2", text(&serde_json::Value::Array(seqs).to_string()))
}

/// The sites with changes after seq @P1, each with its newest (`SiteId`, `Head`).
pub(crate) fn select_site_status_heads(after: i64) -> Statement {
    Statement::fixed(include_str!("select_site_status_heads.sql"))
        .set("@P1", Param::BigInt(Some(after)))
}

/// Deletes up to @P3 changes decided, and up to @P3 watches renewed, before `keep` ago (@P1
/// whole seconds and @P2 milliseconds, as `forget_silent_nodes` binds an age); answers how many
/// of each (`Changes`, `Watchers`).
pub(crate) fn purge_site_status(keep: Duration, batch: u32) -> Statement {
    let seconds = i32::try_from(keep.as_secs()).unwrap_or(i32::MAX);
    let millis = i32::try_from(keep.subsec_millis()).unwrap_or(0);
    Statement::fixed(include_str!("purge_site_status.sql"))
        .set("@P1", Param::Int(Some(seconds)))
        .set("@P2", Param::Int(Some(millis)))
        .set(
            "@P3",
            Param::Int(Some(i32::try_from(batch).unwrap_or(i32::MAX))),
        )
}
