//! The dispatcher's side of the MS SQL backend: the leader lease, claiming due rows (one by one,
//! or the Held rows of a list as one digest), and fenced outcomes. Every condition that keeps two dispatchers apart (the lease's holder and expiry,
//! the claim's epoch, a row being due) is evaluated inside the statement that changes the row,
//! on the database's clock.

use std::collections::HashSet;
use std::time::Duration;

use tiberius::Row;

use super::error::{ErrorClass, classify, to_store_error};
use super::{MsSqlStore, decode, result_set, sql};
use crate::domain::escalation::{IncidentId, IncidentRef};
use crate::domain::serve_order::ClaimLanes;
use crate::domain::{NotificationId, NotificationType};
use crate::records::{AttemptRecord, ClaimedNotification, LeaseEpoch, LeaseReading, LeaseRecord};
use crate::store::claimed::{StoredClaim, invalid_row_error};
use crate::store::{Result, StoreError};

pub(super) async fn acquire_lease(
    store: &MsSqlStore,
    name: &str,
    holder: &str,
    ttl: Duration,
) -> Result<Option<LeaseEpoch>> {
    let stmt = sql::acquire_lease(name, holder, ttl);
    // Two nodes creating a never-held lease at once: one insert fails on the key and is rolled
    // back; run again, it finds the other's row and answers by the usual rule.
    let mut results = match store.lease_batch_raw(&stmt.sql, &stmt.params).await {
        Err(e) if classify(&e) == ErrorClass::DuplicateKey => store
            .lease_batch_raw(&stmt.sql, &stmt.params)
            .await
            .map_err(|e| to_store_error("acquire lease", &e))?,
        other => other.map_err(|e| to_store_error("acquire lease", &e))?,
    };
    let rows = result_set(&mut results, 0, "acquire lease")?;
    rows.first()
        .map(|row| decode::req::<i64>(row, "Epoch").map(LeaseEpoch))
        .transpose()
}

pub(super) async fn release_lease(
    store: &MsSqlStore,
    name: &str,
    holder: &str,
    epoch: LeaseEpoch,
) -> Result<bool> {
    let stmt = sql::release_lease(name, holder, epoch);
    let mut results = store
        .lease_batch_raw(&stmt.sql, &stmt.params)
        .await
        .map_err(|e| to_store_error("release lease", &e))?;
    Ok(single_count(&mut results, "Released", "release lease")? > 0)
}

pub(super) async fn read_lease(store: &MsSqlStore, name: &str) -> Result<LeaseReading> {
    const CONTEXT: &str = "read lease";
    let stmt = sql::select_lease(name);
    let mut results = store.batch(CONTEXT, &stmt.sql, &stmt.params).await?;
    let read_at = result_set(&mut results, 0, CONTEXT)?
        .first()
        .ok_or_else(|| StoreError::Corrupt(format!("{CONTEXT}: the clock was not read")))
        .and_then(|row| decode::time(row, "ReadAt"))?;
    let record = result_set(&mut results, 1, CONTEXT)?
        .first()
        .map(|row| -> Result<LeaseRecord> {
            Ok(LeaseRecord {
                holder: decode::text(row, "Holder")?,
                epoch: LeaseEpoch(decode::req::<i64>(row, "Epoch")?),
                expires_at: decode::time(row, "ExpiresAt")?,
            })
        })
        .transpose()?;
    Ok(LeaseReading { read_at, record })
}

/// The one integer of a batch's one-row result.
pub(super) fn single_count(results: &mut [Vec<Row>], column: &str, context: &str) -> Result<i64> {
    let rows = result_set(results, 0, context)?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt(format!("{context}: no result row")))?;
    match decode::opt::<i32>(row, column) {
        Ok(value) => Ok(i64::from(value.unwrap_or(0))),
        // COUNT_BIG and bigint variables come back as bigint.
        Err(_) => Ok(decode::opt::<i64>(row, column)?.unwrap_or(0)),
    }
}

pub(super) async fn claim_due(
    store: &MsSqlStore,
    lease: &str,
    epoch: LeaseEpoch,
    kind: NotificationType,
    lanes: ClaimLanes,
    claim_timeout: Duration,
) -> Result<Vec<ClaimedNotification>> {
    if lanes.total() == 0 {
        return Ok(Vec::new());
    }
    let stmt = sql::claim_due(lease, epoch, kind, lanes, claim_timeout);
    let mut results = store.batch("claim", &stmt.sql, &stmt.params).await?;
    let rows = result_set(&mut results, 0, "claim")?;
    validate_claims(store, epoch, &rows).await
}

/// How long until the earliest waiting row of `kind` not due yet comes due, by the database's
/// clock (`DispatchStore::next_due_in`).
pub(super) async fn next_due_in(
    store: &MsSqlStore,
    kind: NotificationType,
) -> Result<Option<Duration>> {
    const CONTEXT: &str = "next due";
    let stmt = sql::select_next_due(kind);
    let mut results = store.batch(CONTEXT, &stmt.sql, &stmt.params).await?;
    let rows = result_set(&mut results, 0, CONTEXT)?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt(format!("{CONTEXT}: no answer")))?;
    let clock = decode::time(row, "Now")?;
    Ok(decode::opt_time(row, "NextDue")?
        .map(|next| (next - clock).to_std().unwrap_or(Duration::ZERO)))
}

/// Claims the due Held rows of one list as digest `digest` (`DispatchStore::claim_digest`), in
/// the procedure's order, longest due first.
pub(super) async fn claim_digest(
    store: &MsSqlStore,
    lease: &str,
    epoch: LeaseEpoch,
    kind: NotificationType,
    digest: NotificationId,
    claim_timeout: Duration,
) -> Result<Vec<ClaimedNotification>> {
    let stmt = sql::claim_digest(lease, epoch, kind, digest, claim_timeout);
    let mut results = store.batch("claim digest", &stmt.sql, &stmt.params).await?;
    let rows = result_set(&mut results, 0, "claim digest")?;
    validate_claims(store, epoch, &rows).await
}

/// The claimed rows in their order, each re-validated: one whose stored content no longer
/// passes is parked with the reason rather than failing the whole claim.
async fn validate_claims(
    store: &MsSqlStore,
    epoch: LeaseEpoch,
    rows: &[Row],
) -> Result<Vec<ClaimedNotification>> {
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        match decode_claim(row, epoch)? {
            Ok(notification) => claimed.push(notification),
            Err(invalid) => park_invalid(store, epoch, invalid).await?,
        }
    }
    Ok(claimed)
}

/// A claimed row whose stored content fails validation.
struct InvalidRow {
    row_id: i64,
    id: uuid::Uuid,
    attempt_no: i32,
    problem: String,
}

/// Decodes a claimed row. The outer error is a database-level problem (a NULL or a type the
/// schema rules out); the inner one is content that no longer validates, which parks the row.
fn decode_claim(
    row: &Row,
    epoch: LeaseEpoch,
) -> Result<std::result::Result<ClaimedNotification, InvalidRow>> {
    let row_id = decode::req::<i64>(row, "Id")?;
    let id = decode::guid(row, "NotificationId")?;
    let attempt_no = decode::req::<i32>(row, "AttemptCount")?;
    let retry_count = decode::count(row, "RetryCount")?;
    let kind = decode::text(row, "Type")?;
    let list_name = decode::text(row, "ListName")?;
    let subject = decode::text(row, "Subject")?;
    let body = decode::text(row, "Body")?;
    let type_data = decode::text(row, "TypeData")?;
    let site = decode::text(row, "SourceSiteId")?;
    let instance = decode::text(row, "SourceInstanceId")?;
    let script = decode::text(row, "SourceScript")?;
    let execution = decode::opt::<uuid::Uuid>(row, "OriginExecutionId")?.map(|u| u.to_string());
    let parent = decode::opt::<uuid::Uuid>(row, "OriginParentExecutionId")?.map(|u| u.to_string());
    let enqueued = decode::time(row, "SiteEnqueuedAt")?;
    let priority = decode::req::<i32>(row, "Priority")?;
    let incident_page = decode::opt::<i32>(row, "IncidentPage")?
        .map(|p| {
            u32::try_from(p)
                .map_err(|_| StoreError::Corrupt(format!("IncidentPage {p} is negative")))
        })
        .transpose()?;
    let stored = StoredClaim {
        row_id,
        id: NotificationId::from_uuid(id),
        kind,
        list_name,
        subject,
        body,
        type_data,
        retry_count,
        attempt_no: u32::try_from(attempt_no)
            .map_err(|_| StoreError::Corrupt(format!("AttemptCount {attempt_no} is negative")))?,
        source_site_id: site,
        source_instance_id: instance,
        source_script: script,
        origin_execution_id: execution,
        origin_parent_execution_id: parent,
        site_enqueued_at: Some(enqueued),
        priority: i64::from(priority),
        incident: decode::opt::<i64>(row, "IncidentId")?.map(|id| IncidentRef {
            id: IncidentId(id),
            page_no: incident_page,
        }),
    };
    Ok(stored.validate(epoch).map_err(|problem| InvalidRow {
        row_id,
        id,
        attempt_no,
        problem,
    }))
}

async fn park_invalid(store: &MsSqlStore, epoch: LeaseEpoch, row: InvalidRow) -> Result<()> {
    tracing::error!(row_id = row.row_id, problem = %row.problem, "parking undeliverable stored row");
    let stmt = sql::park_invalid(
        row.row_id,
        epoch,
        &invalid_row_error(&row.problem),
        NotificationId::from_uuid(row.id),
        row.attempt_no,
    );
    store.batch("claim", &stmt.sql, &stmt.params).await?;
    Ok(())
}

/// Outcomes per [`sql::record_outcomes`] call at most: its JSON stays a few hundred KiB.
const OUTCOMES_PER_CALL: usize = 256;

/// Records each outcome, in as few calls as it can: groups of [`sql::record_outcomes`], every
/// outcome through it whatever its texts hold. A group never holds a row twice, and a row's
/// outcomes are written in the order given, so the answers are those of writing them one by
/// one.
pub(super) async fn record_outcomes(
    store: &MsSqlStore,
    lease: &str,
    records: &[AttemptRecord],
) -> Result<Vec<bool>> {
    let mut applied = vec![false; records.len()];
    let mut group: Vec<usize> = Vec::new();
    for (i, record) in records.iter().enumerate() {
        let repeats_a_row = group.iter().any(|&g| records[g].row_id == record.row_id);
        if repeats_a_row || group.len() == OUTCOMES_PER_CALL {
            record_group(store, lease, records, &mut group, &mut applied).await?;
        }
        group.push(i);
    }
    record_group(store, lease, records, &mut group, &mut applied).await?;
    Ok(applied)
}

/// Writes the outcomes `group` indexes with one [`sql::record_outcomes`] call, notes which were
/// applied, and empties the group.
async fn record_group(
    store: &MsSqlStore,
    lease: &str,
    records: &[AttemptRecord],
    group: &mut Vec<usize>,
    applied: &mut [bool],
) -> Result<()> {
    if group.is_empty() {
        return Ok(());
    }
    let members: Vec<&AttemptRecord> = group.iter().map(|&i| &records[i]).collect();
    let stmt = sql::record_outcomes(lease, &members);
    let mut results = store
        .batch("record outcomes", &stmt.sql, &stmt.params)
        .await?;
    let done = result_set(&mut results, 0, "record outcomes")?
        .iter()
        .map(|row| decode::req::<i64>(row, "Id"))
        .collect::<Result<HashSet<i64>>>()?;
    for i in group.drain(..) {
        applied[i] = done.contains(&records[i].row_id);
    }
    Ok(())
}
