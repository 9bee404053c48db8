//! The operator side of the SQLite backend: status and detail lookups, filtered keyset queries,
//! Retry/Discard, KPIs and the retention purge.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Row, params, params_from_iter};

use super::{at_ms, corrupt, ms};
use crate::domain::delivery::AttemptOutcome;
use crate::domain::history::{
    ACKNOWLEDGED_ENTRY, ActionRefusal, Actor, CLEARED_ENTRY, HistoryEntry, HistoryEvent,
    OperatorAction, SUPERSEDED_ENTRY,
};
use crate::domain::kpi::{KpiParams, KpiValues, Kpis, stuck_cutoff};
use crate::domain::query::{NotificationFilter, PageRequest};
use crate::domain::status::Status;
use crate::domain::{NotificationType, Priority};
use crate::records::{
    ActionResult, FilterActionReport, FilterCount, NotificationDetail, NotificationState, Page,
    PurgeReport,
};
use crate::store::{NotificationId, Result, StoreError};

/// A row of `select_state.sql` or `query_states.sql`, before its enums are decoded.
pub(super) struct StateRow {
    row_id: i64,
    id: String,
    status: String,
    kind: String,
    list_name: String,
    subject: String,
    source_site_id: String,
    retry_count: u32,
    last_error: Option<String>,
    site_enqueued_at: i64,
    created_at: i64,
    last_attempt_at: Option<i64>,
    next_attempt_at: Option<i64>,
    delivered_at: Option<i64>,
    resolved_at: Option<i64>,
    priority: i64,
    condition_key: Option<String>,
    deliver_after: Option<i64>,
}

pub(super) fn read_state(row: &Row<'_>) -> rusqlite::Result<StateRow> {
    Ok(StateRow {
        row_id: row.get(0)?,
        id: row.get(1)?,
        status: row.get(2)?,
        kind: row.get(3)?,
        list_name: row.get(4)?,
        subject: row.get(5)?,
        source_site_id: row.get(6)?,
        retry_count: row.get(7)?,
        last_error: row.get(8)?,
        site_enqueued_at: row.get(9)?,
        created_at: row.get(10)?,
        last_attempt_at: row.get(11)?,
        next_attempt_at: row.get(12)?,
        delivered_at: row.get(13)?,
        resolved_at: row.get(14)?,
        priority: row.get(15)?,
        condition_key: row.get(16)?,
        deliver_after: row.get(17)?,
    })
}

impl StateRow {
    pub(super) fn decode(self) -> Result<NotificationState> {
        Ok(NotificationState {
            row_id: self.row_id,
            id: NotificationId::parse(&self.id, "NotificationId").map_err(corrupt)?,
            status: Status::from_db(&self.status)
                .ok_or_else(|| corrupt(format!("status {:?}", self.status)))?,
            kind: NotificationType::from_db(&self.kind)
                .ok_or_else(|| corrupt(format!("type {:?}", self.kind)))?,
            list_name: self.list_name,
            subject: self.subject,
            source_site_id: self.source_site_id,
            priority: Priority::from_rank(self.priority)
                .ok_or_else(|| corrupt(format!("priority rank {}", self.priority)))?,
            condition_key: self.condition_key,
            retry_count: self.retry_count,
            last_error: self.last_error,
            site_enqueued_at: at_ms("SiteEnqueuedAt", self.site_enqueued_at)?,
            created_at: at_ms("CreatedAt", self.created_at)?,
            last_attempt_at: opt_at_ms("LastAttemptAt", self.last_attempt_at)?,
            next_attempt_at: opt_at_ms("NextAttemptAt", self.next_attempt_at)?,
            delivered_at: opt_at_ms("DeliveredAt", self.delivered_at)?,
            resolved_at: opt_at_ms("ResolvedAt", self.resolved_at)?,
            deliver_after: opt_at_ms("DeliverAfter", self.deliver_after)?,
        })
    }
}

fn opt_at_ms(column: &str, millis: Option<i64>) -> Result<Option<DateTime<Utc>>> {
    millis.map(|m| at_ms(column, m)).transpose()
}

pub(super) fn select_state(
    conn: &Connection,
    id: NotificationId,
) -> Result<Option<NotificationState>> {
    conn.prepare_cached(include_str!("sql/select_state.sql"))?
        .query_row([id.to_string()], read_state)
        .optional()?
        .map(StateRow::decode)
        .transpose()
}

/// Appends the filter's conditions (each starting with " AND ") and their parameters.
fn push_filter(filter: &NotificationFilter, sql: &mut String, args: &mut Vec<Value>) {
    let mut arg = |sql: &mut String, clause: &str, value: Value| {
        args.push(value);
        sql.push_str(&clause.replace('?', &format!("?{}", args.len())));
    };
    if !filter.statuses.is_empty() {
        sql.push_str(" AND Status IN (");
        for (i, status) in filter.statuses.iter().enumerate() {
            let sep = if i == 0 { "?" } else { ", ?" };
            arg(sql, sep, Value::Text(status.as_str().into()));
        }
        sql.push(')');
    }
    if let Some(kind) = filter.kind {
        arg(sql, " AND Type = ?", Value::Text(kind.as_str().into()));
    }
    if !filter.priorities.is_empty() {
        sql.push_str(" AND Priority IN (");
        for (i, priority) in filter.priorities.iter().enumerate() {
            let sep = if i == 0 { "?" } else { ", ?" };
            arg(sql, sep, Value::Integer(priority.rank().into()));
        }
        sql.push(')');
    }
    if let Some(key) = &filter.condition_key {
        arg(sql, " AND ConditionKey = ?", Value::Text(key.clone()));
    }
    if let Some(site) = &filter.source_site_id {
        arg(sql, " AND SourceSiteId = ?", Value::Text(site.clone()));
    }
    if let Some(list) = &filter.list_name {
        arg(sql, " AND ListName = ?", Value::Text(list.clone()));
    }
    if let Some(from) = filter.created_from {
        arg(sql, " AND CreatedAt >= ?", Value::Integer(ms_ceil(from)));
    }
    if let Some(to) = filter.created_to {
        arg(sql, " AND CreatedAt < ?", Value::Integer(ms_ceil(to)));
    }
    if let Some(cutoff) = filter.stuck_before {
        // Held rows by their due time (their window's end), the others by their age, a
        // scheduled one's from its time; see `sql/kpis.sql`.
        arg(
            sql,
            " AND ((Status IN ('Pending', 'Retrying') AND CreatedAt < ?",
            Value::Integer(ms_ceil(cutoff)),
        );
        arg(
            sql,
            " AND COALESCE(DeliverAfter, 0) < ?",
            Value::Integer(ms_ceil(cutoff)),
        );
        arg(
            sql,
            ") OR (Status = 'Held' AND COALESCE(NextAttemptAt, 0) < ?))",
            Value::Integer(ms_ceil(cutoff)),
        );
    }
    if let Some(now) = filter.scheduled_after {
        arg(
            sql,
            " AND Status = 'Pending' AND DeliverAfter > ?",
            Value::Integer(ms(now)),
        );
    }
    if let Some(before) = filter.resolved_before {
        arg(sql, " AND ResolvedAt < ?", Value::Integer(ms_ceil(before)));
    }
    if let Some(keyword) = &filter.subject_contains {
        // SQLite's LIKE folds ASCII case, as the contract says; the keyword's own wildcards are
        // escaped so they match literally.
        let escaped = keyword
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        arg(
            sql,
            " AND Subject LIKE ? ESCAPE '\\'",
            Value::Text(format!("%{escaped}%")),
        );
    }
}

/// Stored times are whole milliseconds; a bound with sub-millisecond digits is rounded up so that
/// `>=` and `<` keep their meaning against the stored values.
fn ms_ceil(at: DateTime<Utc>) -> i64 {
    let millis = ms(at);
    if at.timestamp_subsec_nanos().is_multiple_of(1_000_000) {
        millis
    } else {
        millis.saturating_add(1)
    }
}

pub(super) fn query(conn: &Connection, page: &PageRequest) -> Result<Page> {
    let mut sql = include_str!("sql/query_states.sql").trim_end().to_owned();
    let mut args = Vec::new();
    push_filter(&page.filter, &mut sql, &mut args);
    if let Some(after) = page.after {
        // Keyset: strictly after the previous page's last row in (CreatedAt DESC, Id DESC)
        // order. Spelled out rather than as a row value so every backend can use the same shape.
        args.push(Value::Integer(ms(after.created_at)));
        let c = args.len();
        args.push(Value::Integer(after.row_id));
        let i = args.len();
        sql.push_str(&format!(
            " AND (CreatedAt < ?{c} OR (CreatedAt = ?{c} AND Id < ?{i}))"
        ));
    }
    // One row more than the page tells whether there is a next page.
    args.push(Value::Integer(
        i64::try_from(page.size).unwrap_or(i64::MAX) + 1,
    ));
    sql.push_str(&format!(
        " ORDER BY CreatedAt DESC, Id DESC LIMIT ?{}",
        args.len()
    ));
    let mut rows = conn
        .prepare(&sql)?
        .query_map(params_from_iter(args), read_state)?
        .map(|row| row.map_err(StoreError::from).and_then(StateRow::decode))
        .collect::<Result<Vec<_>>>()?;
    let next = if rows.len() > page.size {
        rows.truncate(page.size);
        rows.last().map(NotificationState::cursor)
    } else {
        None
    };
    Ok(Page { rows, next })
}

pub(super) fn detail(conn: &Connection, id: NotificationId) -> Result<Option<NotificationDetail>> {
    let Some(state) = select_state(conn, id)? else {
        return Ok(None);
    };
    type Extra = (
        String,
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let extra: Extra = conn
        .prepare_cached(include_str!("sql/select_detail.sql"))?
        .query_row([state.row_id], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
                row.get(5)?,
                row.get(6)?,
            ))
        })?;
    let (body, type_data, instance, script, execution, parent_execution, targets) = extra;
    let history = crate::domain::history::with_calls(
        history(conn, id)?,
        super::status_callback::history(conn, id)?,
    );
    Ok(Some(NotificationDetail {
        state,
        body,
        type_data,
        source_instance_id: instance,
        source_script: script,
        origin_execution_id: execution,
        origin_parent_execution_id: parent_execution,
        resolved_targets: targets,
        history,
    }))
}

fn history(conn: &Connection, id: NotificationId) -> Result<Vec<HistoryEntry>> {
    let mut stmt = conn.prepare_cached(include_str!("sql/select_history.sql"))?;
    let rows = stmt.query_map([id.to_string()], |row| {
        Ok((
            row.get::<_, u32>(0)?,
            row.get::<_, i64>(1)?,
            row.get::<_, Option<i64>>(2)?,
            row.get::<_, String>(3)?,
            row.get::<_, Option<String>>(4)?,
            row.get::<_, Option<i64>>(5)?,
            row.get::<_, Option<String>>(6)?,
            row.get::<_, Option<String>>(7)?,
            row.get::<_, Option<String>>(8)?,
        ))
    })?;
    let mut entries = Vec::new();
    for row in rows {
        let (sequence, at, duration, outcome, error, epoch, actor, digest, provider) = row?;
        let event = if let Some(outcome) = AttemptOutcome::from_db(&outcome) {
            HistoryEvent::Attempt {
                outcome,
                duration: duration.map(|d| Duration::from_millis(u64::try_from(d).unwrap_or(0))),
                lease_epoch: epoch.unwrap_or(0),
                digest: digest
                    .map(|d| {
                        NotificationId::parse(&d, "DigestId")
                            .map_err(|_| corrupt(format!("digest id {d:?}")))
                    })
                    .transpose()?,
                provider,
            }
        } else if outcome == SUPERSEDED_ENTRY {
            let by = actor.unwrap_or_default();
            HistoryEvent::Superseded {
                by: NotificationId::parse(&by, "Actor")
                    .map_err(|_| corrupt(format!("superseded by {by:?}")))?,
            }
        } else if outcome == CLEARED_ENTRY {
            HistoryEvent::Cleared {
                actor: actor.unwrap_or_else(|| Actor::unknown().as_str().to_owned()),
            }
        } else if outcome == ACKNOWLEDGED_ENTRY {
            HistoryEvent::Acknowledged {
                actor: actor.unwrap_or_else(|| Actor::unknown().as_str().to_owned()),
            }
        } else {
            let action = [OperatorAction::Retry, OperatorAction::Discard]
                .into_iter()
                .find(|a| a.as_str() == outcome)
                .ok_or_else(|| corrupt(format!("history outcome {outcome:?}")))?;
            HistoryEvent::Operator {
                action,
                actor: actor.unwrap_or_else(|| Actor::unknown().as_str().to_owned()),
            }
        };
        entries.push(HistoryEntry {
            sequence,
            at: at_ms("StartedAt", at)?,
            error,
            event,
        });
    }
    Ok(entries)
}

/// Applies `action` to one Parked row and writes its history entry, or says why not.
fn act(
    conn: &Connection,
    action: OperatorAction,
    id: NotificationId,
    actor: &Actor,
    now: DateTime<Utc>,
) -> Result<ActionResult> {
    let now_ms = ms(now);
    let update = match action {
        OperatorAction::Retry => include_str!("sql/retry_parked.sql"),
        OperatorAction::Discard => include_str!("sql/discard_parked.sql"),
    };
    let key = id.to_string();
    let mut stmt = conn.prepare_cached(update)?;
    let sequence: Option<u32> = match action {
        OperatorAction::Retry | OperatorAction::Discard => {
            stmt.query_row(params![key, now_ms], |row| row.get(0))
        }
    }
    .optional()?;
    let Some(sequence) = sequence else {
        let status: Option<String> = conn
            .prepare_cached(include_str!("sql/select_status.sql"))?
            .query_row([&key], |row| row.get(0))
            .optional()?;
        return match status {
            None => Ok(Err(ActionRefusal::NotFound)),
            Some(status) => {
                let status = Status::from_db(&status)
                    .ok_or_else(|| corrupt(format!("status {status:?}")))?;
                Ok(Err(ActionRefusal::WrongStatus(status)))
            }
        };
    };
    conn.prepare_cached(include_str!("sql/insert_history_entry.sql"))?
        .execute(params![
            key,
            sequence,
            now_ms,
            action.as_str(),
            actor.as_str()
        ])?;
    if action == OperatorAction::Discard {
        // An incident's alarm discarded ends the incident: nobody is paged for it any more.
        super::escalation::end_for_discard(conn, id, actor, now)?;
    }
    let state = select_state(conn, id)?.ok_or_else(|| {
        corrupt(format!(
            "notification {id} vanished while being {}",
            action.verb()
        ))
    })?;
    Ok(Ok(state))
}

pub(super) fn act_on_ids(
    conn: &Connection,
    action: OperatorAction,
    ids: &[NotificationId],
    actor: &Actor,
    now: DateTime<Utc>,
) -> Result<Vec<ActionResult>> {
    ids.iter()
        .map(|&id| act(conn, action, id, actor, now))
        .collect()
}

pub(super) fn act_on_filter(
    conn: &Connection,
    action: OperatorAction,
    filter: &NotificationFilter,
    limit: usize,
    actor: &Actor,
    now: DateTime<Utc>,
) -> Result<FilterActionReport> {
    let filter = NotificationFilter {
        statuses: vec![OperatorAction::FROM],
        ..filter.clone()
    };
    let mut sql = "SELECT NotificationId FROM Notifications WHERE 1 = 1".to_owned();
    let mut args = Vec::new();
    push_filter(&filter, &mut sql, &mut args);
    args.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX) + 1));
    sql.push_str(&format!(" ORDER BY CreatedAt, Id LIMIT ?{}", args.len()));
    let mut ids = conn
        .prepare(&sql)?
        .query_map(params_from_iter(args), |row| row.get::<_, String>(0))?
        .map(|id| {
            let id = id?;
            NotificationId::parse(&id, "NotificationId").map_err(corrupt)
        })
        .collect::<Result<Vec<_>>>()?;
    let more_matching = ids.len() > limit;
    ids.truncate(limit);
    let mut changed = Vec::with_capacity(ids.len());
    for id in ids {
        // Same transaction as the select: every selected row is still Parked.
        if act(conn, action, id, actor, now)?.is_ok() {
            changed.push(id);
        }
    }
    Ok(FilterActionReport {
        changed,
        more_matching,
    })
}

/// How many rows [`act_on_filter`] would act on: the Parked matches, counted up to `limit + 1`
/// (so the count stops early on a huge table and still tells whether more match).
pub(super) fn count_on_filter(
    conn: &Connection,
    filter: &NotificationFilter,
    limit: usize,
) -> Result<FilterCount> {
    let filter = NotificationFilter {
        statuses: vec![OperatorAction::FROM],
        ..filter.clone()
    };
    let mut sql = "SELECT COUNT(*) FROM (SELECT 1 FROM Notifications WHERE 1 = 1".to_owned();
    let mut args = Vec::new();
    push_filter(&filter, &mut sql, &mut args);
    args.push(Value::Integer(
        i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1,
    ));
    sql.push_str(&format!(" LIMIT ?{})", args.len()));
    let found: i64 = conn
        .prepare(&sql)?
        .query_row(params_from_iter(args), |row| row.get(0))?;
    let found = usize::try_from(found).unwrap_or(usize::MAX);
    Ok(FilterCount {
        matching: found.min(limit),
        more_matching: found > limit,
    })
}

/// One pass over the live and parked rows, grouped by site, and each site's recent deliveries
/// counted from an index alone (with a year of history, reading those rows was most of the
/// cost); the global figures are the sums (and minimum creation times) of the sites'.
pub(super) fn kpis(conn: &Connection, p: &KpiParams) -> Result<Kpis> {
    let now = ms(p.now);
    let stuck_before = ms(stuck_cutoff(p.now, p.stuck_age_threshold));
    let delivered_since = ms(stuck_cutoff(p.now, p.delivered_window));
    let age = |created: Option<i64>| {
        created.map(|c| Duration::from_millis(u64::try_from(now - c).unwrap_or(0)))
    };
    // By site, in site order (a BTreeMap: the sites come out sorted as before).
    let mut sites: std::collections::BTreeMap<String, (KpiValues, Option<i64>, Option<i64>)> =
        std::collections::BTreeMap::new();
    let mut stmt = conn.prepare_cached(include_str!("sql/kpis.sql"))?;
    let rows = stmt.query_map(params![now, stuck_before], |row| {
        Ok((
            row.get::<_, String>(0)?,
            count(row.get::<_, i64>(1)?),
            count(row.get::<_, i64>(2)?),
            count(row.get::<_, i64>(3)?),
            row.get::<_, Option<i64>>(4)?,
            row.get::<_, Option<i64>>(5)?,
        ))
    })?;
    for row in rows {
        let (site, depth, stuck, parked, due, wait) = row?;
        let values = KpiValues {
            queue_depth: depth,
            stuck_count: stuck,
            parked_count: parked,
            oldest_pending_age: age(due),
            oldest_retry_wait_age: age(wait),
            ..KpiValues::default()
        };
        sites.insert(site, (values, due, wait));
    }
    let mut stmt = conn.prepare_cached(include_str!("sql/kpis_delivered.sql"))?;
    let rows = stmt.query_map(params![delivered_since], |row| {
        Ok((row.get::<_, String>(0)?, count(row.get::<_, i64>(1)?)))
    })?;
    for row in rows {
        let (site, delivered) = row?;
        sites.entry(site).or_default().0.delivered_recently = delivered;
    }
    let mut kpis = Kpis::default();
    let (mut oldest_due, mut oldest_wait): (Option<i64>, Option<i64>) = (None, None);
    for (site, (values, due, wait)) in sites {
        let g = &mut kpis.global;
        g.queue_depth += values.queue_depth;
        g.stuck_count += values.stuck_count;
        g.parked_count += values.parked_count;
        g.delivered_recently += values.delivered_recently;
        oldest_due = min_some(oldest_due, due);
        oldest_wait = min_some(oldest_wait, wait);
        if !values.is_empty() {
            kpis.sites.push((site, values));
        }
    }
    kpis.global.oldest_pending_age = age(oldest_due);
    kpis.global.oldest_retry_wait_age = age(oldest_wait);
    Ok(kpis)
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn min_some(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

pub(super) fn purge_terminal(
    conn: &Connection,
    resolved_before: DateTime<Utc>,
    batch: u32,
) -> Result<PurgeReport> {
    let rows = conn
        .prepare_cached(include_str!("sql/select_purgeable.sql"))?
        .query_map(params![ms(resolved_before), batch], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, bool>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut delete_history = conn.prepare_cached(include_str!("sql/delete_history.sql"))?;
    let mut delete_calls =
        conn.prepare_cached(include_str!("sql/delete_status_callback_calls.sql"))?;
    let mut delete_callbacks =
        conn.prepare_cached(include_str!("sql/delete_status_callbacks_of.sql"))?;
    let mut delete_row = conn.prepare_cached(include_str!("sql/delete_notification.sql"))?;
    let mut report = PurgeReport::default();
    for (row_id, id, parked) in rows {
        report.history_entries += delete_history.execute([&id])? as u64;
        report.history_entries += delete_calls.execute([&id])? as u64;
        // A change still waiting when its notification goes (a retention shorter than
        // `give_up_after`) goes with it: there is nothing left to tell.
        delete_callbacks.execute([&id])?;
        let deleted = delete_row.execute([row_id])? as u64;
        report.notifications += deleted;
        if parked {
            report.parked += deleted;
        }
    }
    // Incidents past the retention too, in the same batch size: the table of incidents is
    // bounded like the notifications'.
    let incidents = conn
        .prepare_cached(include_str!("sql/select_purgeable_incidents.sql"))?
        .query_map(params![ms(resolved_before), batch], |row| {
            row.get::<_, i64>(0)
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for incident in incidents {
        conn.prepare_cached(include_str!("sql/delete_incident_pages.sql"))?
            .execute([incident])?;
        conn.prepare_cached(include_str!("sql/delete_incident_history.sql"))?
            .execute([incident])?;
        report.incidents += conn
            .prepare_cached(include_str!("sql/delete_incident.sql"))?
            .execute([incident])? as u64;
    }
    Ok(report)
}
