//! The site status feed on MS SQL (migration 0017): the trigger `RecordSiteStatusChanges`
//! records each final status of a watching site's notification in `dbo.SiteStatusFeed`; these
//! calls start watches, read a site's changes, forget the confirmed ones and purge the old
//! (`sql::site_status`), by the database's clock.

use std::time::Duration;

use super::error::{ErrorClass, classify, to_store_error};
use super::{MsSqlStore, decode, result_set, sql};
use crate::domain::SiteId;
use crate::records::{SiteStatusChange, SiteStatusPurge};
use crate::store::{Result, StoreError};

const CONTEXT: &str = "site status";

pub(super) async fn watch(store: &MsSqlStore, site: &SiteId) -> Result<()> {
    let stmt = sql::watch_site_status(site);
    match store.batch_raw(&stmt.sql, &stmt.params).await {
        // A concurrent first watch of the same site inserted the row; run again, it updates.
        Err(e) if classify(&e) == ErrorClass::DuplicateKey => {
            store.batch(CONTEXT, &stmt.sql, &stmt.params).await?;
        }
        other => {
            other.map_err(|e| to_store_error(CONTEXT, &e))?;
        }
    }
    Ok(())
}

pub(super) async fn changes(
    store: &MsSqlStore,
    site: &SiteId,
    limit: u32,
) -> Result<Vec<SiteStatusChange>> {
    let stmt = sql::select_site_status_changes(site, limit);
    let mut results = store.batch(CONTEXT, &stmt.sql, &stmt.params).await?;
    result_set(&mut results, 0, CONTEXT)?
        .iter()
        .map(|row| {
            Ok(SiteStatusChange {
                seq: decode::req::<i64>(row, "Seq")?,
                state: decode::state(row)?,
                delivered_to: decode::opt_text(row, "ResolvedTargets")?,
            })
        })
        .collect()
}

pub(super) async fn forget(store: &MsSqlStore, site: &SiteId, seqs: &[i64]) -> Result<()> {
    let stmt = sql::forget_site_status_changes(site, seqs);
    store.batch(CONTEXT, &stmt.sql, &stmt.params).await?;
    Ok(())
}

pub(super) async fn heads(store: &MsSqlStore, after: i64) -> Result<(Vec<SiteId>, i64)> {
    let stmt = sql::select_site_status_heads(after);
    let mut results = store.batch(CONTEXT, &stmt.sql, &stmt.params).await?;
    let (mut sites, mut head) = (Vec::new(), after);
    for row in result_set(&mut results, 0, CONTEXT)? {
        let site = SiteId::parse(decode::text(&row, "SiteId")?).map_err(|e| {
            StoreError::Corrupt(format!("column SiteStatusFeed.SiteId: {}", e.problem))
        })?;
        sites.push(site);
        head = head.max(decode::req::<i64>(&row, "Head")?);
    }
    Ok((sites, head))
}

pub(super) async fn purge(
    store: &MsSqlStore,
    keep: Duration,
    batch: u32,
) -> Result<SiteStatusPurge> {
    let stmt = sql::purge_site_status(keep, batch);
    let mut results = store.batch(CONTEXT, &stmt.sql, &stmt.params).await?;
    let rows = result_set(&mut results, 0, CONTEXT)?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt(format!("{CONTEXT}: no purge counts")))?;
    let count = |column: &str| -> Result<u64> {
        Ok(u64::try_from(decode::req::<i32>(row, column)?).unwrap_or(0))
    };
    Ok(SiteStatusPurge {
        changes: count("Changes")?,
        watchers: count("Watchers")?,
    })
}
