//! Site health on MS SQL: the `dbo.SiteHealth` table (migration 0008), one row per (site, node)
//! holding its latest report, at most `MAX_NODES_PER_SITE` per site, stamped, read and purged
//! with the database's clock (`sql::record_site_health`, `sql::SELECT_SITE_HEALTH`,
//! `sql::forget_silent_nodes`), so every replica applies the offline rule and the retention to
//! the same clock.

use std::time::Duration;

use tiberius::Row;

use super::error::{ErrorClass, classify};
use super::{MsSqlStore, decode, result_set, sql};
use crate::domain::SiteId;
use crate::domain::site_health::{
    NodeRole, SiteHealthReport, SiteHealthSnapshot, SiteHealthWrite, StoredSiteHealth,
};
use crate::store::{Result, StoreError};

const CONTEXT: &str = "site health";

pub(super) async fn record(
    store: &MsSqlStore,
    report: &SiteHealthReport,
) -> Result<SiteHealthWrite> {
    let stmt = sql::record_site_health(report);
    let mut results = match store.batch_raw(&stmt.sql, &stmt.params).await {
        // A concurrent first report of the same node inserted the row; run again, it updates.
        Err(e) if classify(&e) == ErrorClass::DuplicateKey => {
            store.batch(CONTEXT, &stmt.sql, &stmt.params).await?
        }
        other => other.map_err(|e| super::error::to_store_error(CONTEXT, &e))?,
    };
    let rows = result_set(&mut results, 0, CONTEXT)?;
    let stored = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt(format!("{CONTEXT}: no result row")))
        .and_then(|row| decode::req::<i32>(row, "Stored"))?;
    Ok(if stored == 0 {
        SiteHealthWrite::SiteFull
    } else {
        SiteHealthWrite::Stored
    })
}

pub(super) async fn forget_silent(
    store: &MsSqlStore,
    silent_for: Duration,
) -> Result<Vec<(SiteId, SiteId)>> {
    let stmt = sql::forget_silent_nodes(silent_for);
    let mut results = store.batch(CONTEXT, &stmt.sql, &stmt.params).await?;
    result_set(&mut results, 0, CONTEXT)?
        .iter()
        .map(|row| {
            let id = |column: &str| -> Result<SiteId> {
                SiteId::parse(decode::text(row, column)?).map_err(|e| corrupt(column, e.problem))
            };
            Ok((id("SiteId")?, id("NodeName")?))
        })
        .collect()
}

pub(super) async fn select(store: &MsSqlStore) -> Result<SiteHealthSnapshot> {
    let mut results = store.batch(CONTEXT, sql::SELECT_SITE_HEALTH, &[]).await?;
    let clock = result_set(&mut results, 0, CONTEXT)?;
    let read_at = clock
        .first()
        .ok_or_else(|| StoreError::Corrupt(format!("{CONTEXT}: the clock was not read")))
        .and_then(|row| decode::time(row, "ReadAt"))?;
    let nodes = result_set(&mut results, 1, CONTEXT)?
        .iter()
        .map(stored)
        .collect::<Result<Vec<_>>>()?;
    Ok(SiteHealthSnapshot { read_at, nodes })
}

fn corrupt(column: &str, problem: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("column SiteHealth.{column}: {problem}"))
}

fn stored(row: &Row) -> Result<StoredSiteHealth> {
    let id = |column: &str| -> Result<SiteId> {
        SiteId::parse(decode::text(row, column)?).map_err(|e| corrupt(column, e.problem))
    };
    let unsigned = |column: &str| -> Result<u64> {
        let value = decode::req::<i64>(row, column)?;
        u64::try_from(value).map_err(|_| corrupt(column, format!("negative: {value}")))
    };
    let millis = |column: &str| -> Result<Duration> { unsigned(column).map(Duration::from_millis) };
    let flag = |column: &str| -> Result<bool> { Ok(decode::req::<i32>(row, column)? != 0) };
    let role = decode::text(row, "Role")?;
    Ok(StoredSiteHealth {
        report: SiteHealthReport {
            site: id("SiteId")?,
            node: id("NodeName")?,
            role: NodeRole::parse(&role).ok_or_else(|| corrupt("Role", format!("{role:?}")))?,
            buffer_depth: unsigned("BufferDepth")?,
            oldest_buffered_age: millis("OldestBufferedAgeMs")?,
            last_forward_at: decode::opt_time(row, "LastForwardAt")?,
            standby_lag_rows: unsigned("StandbyLagRows")?,
            standby_lag: millis("StandbyLagMs")?,
            version: decode::text(row, "Version")?,
            central_reachable: flag("CentralReachable")?,
            rejected: unsigned("Rejected")?,
            sends_refused: flag("SendsRefused")?,
        },
        received_at: decode::time(row, "ReceivedAt")?,
    })
}
