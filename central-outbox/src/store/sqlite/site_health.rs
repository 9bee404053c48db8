//! Site health on SQLite: the `SiteHealth` table (migration 0007), one row per (site, node)
//! holding its latest report, at most `MAX_NODES_PER_SITE` per site. The database's clock is
//! this process's clock, so `received_at`, the read's `now` and the purge's cutoff are all taken
//! here.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, Row, params};

use super::{at_ms, corrupt, duration_ms, ms};
use crate::domain::SiteId;
use crate::domain::site_health::{
    MAX_NODES_PER_SITE, NodeRole, SiteHealthReport, SiteHealthSnapshot, SiteHealthWrite,
    StoredSiteHealth,
};
use crate::store::Result;

/// Replaces the (site, node)'s row with `report`, received at `now`; a new node only while its
/// site has fewer than [`MAX_NODES_PER_SITE`].
pub(super) fn record(
    conn: &Connection,
    report: &SiteHealthReport,
    now: DateTime<Utc>,
) -> Result<SiteHealthWrite> {
    let mut stmt = conn.prepare_cached(include_str!("sql/record_site_health.sql"))?;
    let changed = stmt.execute(params![
        report.site.as_str(),
        report.node.as_str(),
        report.role.as_str(),
        count(report.buffer_depth),
        duration_ms(report.oldest_buffered_age),
        report.last_forward_at.map(ms),
        count(report.standby_lag_rows),
        duration_ms(report.standby_lag),
        report.version,
        report.central_reachable,
        count(report.rejected),
        report.sends_refused,
        ms(now),
        count(MAX_NODES_PER_SITE as u64),
    ])?;
    Ok(if changed == 0 {
        SiteHealthWrite::SiteFull
    } else {
        SiteHealthWrite::Stored
    })
}

/// Deletes the nodes last heard from at or before `now - silent_for`; returns them.
pub(super) fn forget_silent(
    conn: &Connection,
    silent_for: Duration,
    now: DateTime<Utc>,
) -> Result<Vec<(SiteId, SiteId)>> {
    let cutoff = ms(now).saturating_sub(duration_ms(silent_for));
    let mut stmt = conn.prepare_cached(include_str!("sql/forget_silent_nodes.sql"))?;
    let rows = stmt.query_map([cutoff], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
    })?;
    let mut forgotten = Vec::new();
    for row in rows {
        let (site, node) = row?;
        let site = SiteId::parse(site)
            .map_err(|e| corrupt(format!("SiteHealth.SiteId: {}", e.problem)))?;
        let node = SiteId::parse(node)
            .map_err(|e| corrupt(format!("SiteHealth.NodeName: {}", e.problem)))?;
        forgotten.push((site, node));
    }
    Ok(forgotten)
}

/// Every row, by site then node, read at `now`.
pub(super) fn select(conn: &Connection, now: DateTime<Utc>) -> Result<SiteHealthSnapshot> {
    let mut stmt = conn.prepare_cached(include_str!("sql/select_site_health.sql"))?;
    let rows = stmt.query_map([], StoredRow::read)?;
    let mut nodes = Vec::new();
    for row in rows {
        nodes.push(row?.decode()?);
    }
    Ok(SiteHealthSnapshot {
        read_at: now,
        nodes,
    })
}

/// A row as stored, before its values are checked.
struct StoredRow {
    site: String,
    node: String,
    role: String,
    buffer_depth: i64,
    oldest_age_ms: i64,
    last_forward_at: Option<i64>,
    lag_rows: i64,
    lag_ms: i64,
    version: String,
    central_reachable: bool,
    rejected: i64,
    sends_refused: bool,
    received_at: i64,
}

impl StoredRow {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            site: row.get(0)?,
            node: row.get(1)?,
            role: row.get(2)?,
            buffer_depth: row.get(3)?,
            oldest_age_ms: row.get(4)?,
            last_forward_at: row.get(5)?,
            lag_rows: row.get(6)?,
            lag_ms: row.get(7)?,
            version: row.get(8)?,
            central_reachable: row.get(9)?,
            rejected: row.get(10)?,
            sends_refused: row.get(11)?,
            received_at: row.get(12)?,
        })
    }

    fn decode(self) -> Result<StoredSiteHealth> {
        let site = SiteId::parse(self.site)
            .map_err(|e| corrupt(format!("SiteHealth.SiteId: {}", e.problem)))?;
        let node = SiteId::parse(self.node)
            .map_err(|e| corrupt(format!("SiteHealth.NodeName: {}", e.problem)))?;
        let role = NodeRole::parse(&self.role)
            .ok_or_else(|| corrupt(format!("SiteHealth.Role = {:?}", self.role)))?;
        Ok(StoredSiteHealth {
            report: SiteHealthReport {
                site,
                node,
                role,
                buffer_depth: unsigned(self.buffer_depth),
                oldest_buffered_age: millis(self.oldest_age_ms),
                last_forward_at: self
                    .last_forward_at
                    .map(|at| at_ms("SiteHealth.LastForwardAt", at))
                    .transpose()?,
                standby_lag_rows: unsigned(self.lag_rows),
                standby_lag: millis(self.lag_ms),
                version: self.version,
                central_reachable: self.central_reachable,
                rejected: unsigned(self.rejected),
                sends_refused: self.sends_refused,
            },
            received_at: at_ms("SiteHealth.ReceivedAt", self.received_at)?,
        })
    }
}

/// A count as SQLite's signed integer (no buffer holds 2^63 rows).
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}
