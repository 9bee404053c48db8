//! The operator side of the MS SQL backend: status and detail lookups, filtered keyset queries,
//! Retry/Discard by ids and by filter, KPIs and the retention purge.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{MsSqlStore, decode, result_set, sql};
use crate::domain::delivery::AttemptOutcome;
use crate::domain::history::{
    ACKNOWLEDGED_ENTRY, ActionRefusal, Actor, CLEARED_ENTRY, HistoryEntry, HistoryEvent,
    OperatorAction, SUPERSEDED_ENTRY,
};
use crate::domain::kpi::{KpiParams, KpiValues, Kpis, stuck_cutoff};
use crate::domain::query::{NotificationFilter, PageRequest};
use crate::records::{
    ActionResult, FilterActionReport, FilterCount, NotificationDetail, NotificationState, Page,
    PurgeReport,
};
use crate::store::{NotificationId, Result, StoreError};

/// Ids acted on per transaction: the request's 1000-id cap (grpc::admin::MAX_BULK) plus two
/// parameters stays inside SQL Server's 2100 parameters per request. Larger calls (which the API
/// never makes) run in several transactions.
const IDS_PER_STATEMENT: usize = 1000;

pub(super) async fn state(
    store: &MsSqlStore,
    id: NotificationId,
) -> Result<Option<NotificationState>> {
    let stmt = sql::select_state(id);
    let mut results = store.batch("state", &stmt.sql, &stmt.params).await?;
    result_set(&mut results, 0, "state")?
        .first()
        .map(decode::state)
        .transpose()
}

pub(super) async fn query(store: &MsSqlStore, page: &PageRequest) -> Result<Page> {
    // One row more than the page tells whether there is a next page.
    let limit = i64::try_from(page.size).unwrap_or(i64::MAX - 1) + 1;
    let stmt = sql::query(
        &page.filter,
        page.after.map(|c| (c.created_at, c.row_id)),
        limit,
    );
    let mut results = store.batch("query", &stmt.sql, &stmt.params).await?;
    let mut rows = result_set(&mut results, 0, "query")?
        .iter()
        .map(decode::state)
        .collect::<Result<Vec<_>>>()?;
    let next = if rows.len() > page.size {
        rows.truncate(page.size);
        rows.last().map(NotificationState::cursor)
    } else {
        None
    };
    Ok(Page { rows, next })
}

pub(super) async fn detail(
    store: &MsSqlStore,
    id: NotificationId,
) -> Result<Option<NotificationDetail>> {
    let stmt = sql::select_detail(id);
    let mut results = store.batch("detail", &stmt.sql, &stmt.params).await?;
    let rows = result_set(&mut results, 0, "detail")?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let attempts = result_set(&mut results, 1, "detail")?
        .iter()
        .map(history_entry)
        .collect::<Result<Vec<_>>>()?;
    let calls = result_set(&mut results, 2, "detail")?
        .iter()
        .map(super::status_callback::history_entry)
        .collect::<Result<Vec<_>>>()?;
    let history = crate::domain::history::with_calls(attempts, calls);
    Ok(Some(NotificationDetail {
        state: decode::state(row)?,
        body: decode::text(row, "Body")?,
        type_data: decode::text(row, "TypeData")?,
        source_instance_id: decode::text(row, "SourceInstanceId")?,
        source_script: decode::text(row, "SourceScript")?,
        origin_execution_id: decode::opt::<uuid::Uuid>(row, "OriginExecutionId")?
            .map(|u| u.to_string()),
        origin_parent_execution_id: decode::opt::<uuid::Uuid>(row, "OriginParentExecutionId")?
            .map(|u| u.to_string()),
        resolved_targets: decode::opt_text(row, "ResolvedTargets")?,
        history,
    }))
}

fn history_entry(row: &tiberius::Row) -> Result<HistoryEntry> {
    let outcome = decode::text(row, "Outcome")?;
    let event = if let Some(outcome) = AttemptOutcome::from_db(&outcome) {
        HistoryEvent::Attempt {
            outcome,
            duration: decode::opt::<i64>(row, "DurationMs")?
                .map(|d| Duration::from_millis(u64::try_from(d).unwrap_or(0))),
            lease_epoch: decode::opt::<i64>(row, "LeaseEpoch")?.unwrap_or(0),
            digest: decode::opt::<uuid::Uuid>(row, "DigestId")?.map(NotificationId::from_uuid),
            provider: decode::opt_text(row, "Provider")?,
        }
    } else if outcome == SUPERSEDED_ENTRY {
        // The replacing notification's id, in Actor.
        let by = decode::opt_text(row, "Actor")?.unwrap_or_default();
        HistoryEvent::Superseded {
            by: NotificationId::parse(&by, "Actor")
                .map_err(|_| StoreError::Corrupt(format!("superseded by {by:?}")))?,
        }
    } else if outcome == CLEARED_ENTRY {
        HistoryEvent::Cleared {
            actor: decode::opt_text(row, "Actor")?
                .unwrap_or_else(|| Actor::unknown().as_str().to_owned()),
        }
    } else if outcome == ACKNOWLEDGED_ENTRY {
        HistoryEvent::Acknowledged {
            actor: decode::opt_text(row, "Actor")?
                .unwrap_or_else(|| Actor::unknown().as_str().to_owned()),
        }
    } else {
        let action = [OperatorAction::Retry, OperatorAction::Discard]
            .into_iter()
            .find(|a| a.as_str() == outcome)
            .ok_or_else(|| StoreError::Corrupt(format!("history outcome {outcome:?}")))?;
        HistoryEvent::Operator {
            action,
            actor: decode::opt_text(row, "Actor")?
                .unwrap_or_else(|| Actor::unknown().as_str().to_owned()),
        }
    };
    Ok(HistoryEntry {
        sequence: decode::count(row, "AttemptNo")?,
        at: decode::time(row, "StartedAt")?,
        error: decode::opt_text(row, "Error")?,
        event,
    })
}

pub(super) async fn act_on_ids(
    store: &MsSqlStore,
    action: OperatorAction,
    ids: &[NotificationId],
    actor: &Actor,
) -> Result<Vec<ActionResult>> {
    // Each distinct id is acted on once; a repeat is answered as a second call would be: the
    // status the first occurrence left (or the same refusal).
    let mut distinct: Vec<NotificationId> = Vec::new();
    for id in ids {
        if !distinct.contains(id) {
            distinct.push(*id);
        }
    }
    let mut answers: HashMap<NotificationId, ActionResult> = HashMap::new();
    for chunk in distinct.chunks(IDS_PER_STATEMENT) {
        let stmt = sql::act_on_these(action, actor.as_str(), chunk);
        let mut results = store
            .batch("operator action", &stmt.sql, &stmt.params)
            .await?;
        let rows = result_set(&mut results, 0, "operator action")?;
        if rows.len() != chunk.len() {
            return Err(StoreError::Corrupt(format!(
                "operator action: {} answers for {} ids",
                rows.len(),
                chunk.len()
            )));
        }
        for (id, row) in chunk.iter().zip(&rows) {
            let answer = if decode::opt::<i64>(row, "Id")?.is_none() {
                Err(ActionRefusal::NotFound)
            } else {
                let state = decode::state(row)?;
                if decode::req::<i32>(row, "Changed")? == 1 {
                    Ok(state)
                } else {
                    Err(ActionRefusal::WrongStatus(state.status))
                }
            };
            answers.insert(*id, answer);
        }
    }
    let mut seen: Vec<NotificationId> = Vec::new();
    ids.iter()
        .map(|id| {
            let first = answers.get(id).cloned().ok_or_else(|| {
                StoreError::Corrupt(format!("operator action: no answer for {id}"))
            })?;
            if seen.contains(id) {
                return Ok(match first {
                    Ok(state) => Err(ActionRefusal::WrongStatus(state.status)),
                    refused => refused,
                });
            }
            seen.push(*id);
            Ok(first)
        })
        .collect()
}

pub(super) async fn act_on_filter(
    store: &MsSqlStore,
    action: OperatorAction,
    filter: &NotificationFilter,
    limit: usize,
    actor: &Actor,
) -> Result<FilterActionReport> {
    if limit == 0 {
        return Ok(FilterActionReport::default());
    }
    let filter = NotificationFilter {
        statuses: vec![OperatorAction::FROM],
        ..filter.clone()
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX - 1);
    let stmt = sql::act_on_filter(action, actor.as_str(), &filter, limit);
    let mut results = store
        .batch("operator action", &stmt.sql, &stmt.params)
        .await?;
    let changed = result_set(&mut results, 0, "operator action")?
        .iter()
        .map(|row| decode::guid(row, "NotificationId").map(NotificationId::from_uuid))
        .collect::<Result<Vec<_>>>()?;
    let matching = decode::req::<i64>(
        result_set(&mut results, 1, "operator action")?
            .first()
            .ok_or_else(|| StoreError::Corrupt("operator action: no match count".into()))?,
        "Matching",
    )?;
    Ok(FilterActionReport {
        changed,
        more_matching: matching > limit,
    })
}

/// How many rows [`act_on_filter`] would act on, changing and locking nothing.
pub(super) async fn count_on_filter(
    store: &MsSqlStore,
    filter: &NotificationFilter,
    limit: usize,
) -> Result<FilterCount> {
    let filter = NotificationFilter {
        statuses: vec![OperatorAction::FROM],
        ..filter.clone()
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX - 1);
    let stmt = sql::count_on_filter(&filter, limit);
    let mut results = store.batch("count", &stmt.sql, &stmt.params).await?;
    let found = decode::req::<i64>(
        result_set(&mut results, 0, "count")?
            .first()
            .ok_or_else(|| StoreError::Corrupt("count: no match count".into()))?,
        "Matching",
    )?;
    Ok(FilterCount {
        matching: usize::try_from(found.min(limit)).unwrap_or(usize::MAX),
        more_matching: found > limit,
    })
}

pub(super) async fn kpis(store: &MsSqlStore, p: &KpiParams) -> Result<Kpis> {
    let stmt = sql::kpis(
        p.now,
        stuck_cutoff(p.now, p.stuck_age_threshold),
        stuck_cutoff(p.now, p.delivered_window),
    );
    let mut results = store.batch("KPIs", &stmt.sql, &stmt.params).await?;
    let age = |created: Option<DateTime<Utc>>| {
        created.map(|c| (p.now - c).to_std().unwrap_or(Duration::ZERO))
    };
    let count = |row: &tiberius::Row, column: &str| -> Result<u64> {
        Ok(u64::try_from(decode::opt::<i64>(row, column)?.unwrap_or(0)).unwrap_or(0))
    };
    let mut kpis = Kpis::default();
    let (mut oldest_due, mut oldest_wait): (Option<DateTime<Utc>>, Option<DateTime<Utc>>) =
        (None, None);
    for row in result_set(&mut results, 0, "KPIs")? {
        let due = decode::opt_time(&row, "OldestDue")?;
        let wait = decode::opt_time(&row, "OldestWaiting")?;
        let values = KpiValues {
            queue_depth: count(&row, "QueueDepth")?,
            stuck_count: count(&row, "Stuck")?,
            parked_count: count(&row, "Parked")?,
            delivered_recently: count(&row, "DeliveredRecently")?,
            oldest_pending_age: age(due),
            oldest_retry_wait_age: age(wait),
        };
        let g = &mut kpis.global;
        g.queue_depth += values.queue_depth;
        g.stuck_count += values.stuck_count;
        g.parked_count += values.parked_count;
        g.delivered_recently += values.delivered_recently;
        oldest_due = earliest(oldest_due, due);
        oldest_wait = earliest(oldest_wait, wait);
        if !values.is_empty() {
            kpis.sites
                .push((decode::text(&row, "SourceSiteId")?, values));
        }
    }
    kpis.global.oldest_pending_age = age(oldest_due);
    kpis.global.oldest_retry_wait_age = age(oldest_wait);
    Ok(kpis)
}

fn earliest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

pub(super) async fn purge_terminal(
    store: &MsSqlStore,
    resolved_before: DateTime<Utc>,
    batch: u32,
) -> Result<PurgeReport> {
    let stmt = sql::purge_terminal(resolved_before, batch);
    let mut results = store.batch("purge", &stmt.sql, &stmt.params).await?;
    let rows = result_set(&mut results, 0, "purge")?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt("purge: no result row".into()))?;
    let count = |column: &str| -> Result<u64> {
        Ok(u64::try_from(decode::opt::<i64>(row, column)?.unwrap_or(0)).unwrap_or(0))
    };
    Ok(PurgeReport {
        notifications: count("Notifications")?,
        parked: count("Parked")?,
        history_entries: count("HistoryEntries")?,
        incidents: count("Incidents")?,
    })
}
