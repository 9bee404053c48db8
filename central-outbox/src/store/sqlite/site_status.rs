//! The site status feed on SQLite (migration 0014): the triggers on `Notifications` record
//! each final status of a watching site's notification in `SiteStatusFeed`; these functions
//! start watches, read a site's changes, forget the confirmed ones and purge the old. Times
//! are this process's clock, which is the database's (one process writes the file).

use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, params};

use super::admin::read_state;
use super::{corrupt, duration_ms, ms};
use crate::domain::SiteId;
use crate::records::{SiteStatusChange, SiteStatusPurge};
use crate::store::Result;

/// The columns `admin::read_state` reads, which the change's seq and targets follow.
pub(super) const STATE_COLUMNS: usize = 18;

/// Starts or renews `site`'s watch at `now`.
pub(super) fn watch(conn: &Connection, site: &SiteId, now: DateTime<Utc>) -> Result<()> {
    conn.prepare_cached(include_str!("sql/watch_site_status.sql"))?
        .execute(params![site.as_str(), ms(now)])?;
    Ok(())
}

/// The oldest `limit` unconfirmed changes of `site`.
pub(super) fn changes(
    conn: &Connection,
    site: &SiteId,
    limit: u32,
) -> Result<Vec<SiteStatusChange>> {
    let mut stmt = conn.prepare_cached(include_str!("sql/select_site_status_changes.sql"))?;
    let rows = stmt.query_map(params![site.as_str(), limit], |row| {
        Ok((
            read_state(row)?,
            row.get::<_, i64>(STATE_COLUMNS)?,
            row.get::<_, Option<String>>(STATE_COLUMNS + 1)?,
        ))
    })?;
    let mut changes = Vec::new();
    for row in rows {
        let (state, seq, delivered_to) = row?;
        changes.push(SiteStatusChange {
            seq,
            state: state.decode()?,
            delivered_to,
        });
    }
    Ok(changes)
}

/// Deletes the changes `seqs` of `site`. The watch is not renewed here: the stream renews it
/// on its own clock, and a write of the watch row per batch would cost the single writer (which
/// the dispatcher's claims and outcomes wait on) one more statement per confirmation.
pub(super) fn forget(conn: &Connection, site: &SiteId, seqs: &[i64]) -> Result<()> {
    let seqs = serde_json::Value::from(seqs.to_vec()).to_string();
    conn.prepare_cached(include_str!("sql/delete_site_status_change.sql"))?
        .execute(params![site.as_str(), seqs])?;
    Ok(())
}

/// The sites with changes after `after`, and the highest seq among them (`after` when none).
pub(super) fn heads(conn: &Connection, after: i64) -> Result<(Vec<SiteId>, i64)> {
    let mut stmt = conn.prepare_cached(include_str!("sql/select_site_status_heads.sql"))?;
    let rows = stmt.query_map([after], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
    })?;
    let (mut sites, mut head) = (Vec::new(), after);
    for row in rows {
        let (site, newest) = row?;
        sites.push(
            SiteId::parse(site)
                .map_err(|e| corrupt(format!("SiteStatusFeed.SiteId: {}", e.problem)))?,
        );
        head = head.max(newest);
    }
    Ok((sites, head))
}

/// Drops up to `batch` changes decided, and up to `batch` watches last renewed, before
/// `now - keep`.
pub(super) fn purge(
    conn: &Connection,
    keep: Duration,
    batch: u32,
    now: DateTime<Utc>,
) -> Result<SiteStatusPurge> {
    let cutoff = ms(now).saturating_sub(duration_ms(keep));
    let changes = conn
        .prepare_cached(include_str!("sql/purge_site_status_changes.sql"))?
        .execute(params![cutoff, batch])?;
    let watchers = conn
        .prepare_cached(include_str!("sql/purge_site_status_watchers.sql"))?
        .execute(params![cutoff, batch])?;
    Ok(SiteStatusPurge {
        changes: changes as u64,
        watchers: watchers as u64,
    })
}
