//! Escalation in the SQLite backend (rules in `domain::escalation`, the contract in
//! `store::EscalationStore`): the incident a submit opens or joins, the clock's turn that fires
//! due pages, acknowledgements, and the endings a clear, a discard or a parked page bring.
//!
//! Everything here runs on the writer inside the caller's transaction, so an incident and the
//! notifications it stores or ends change together. SQLite has one writer: a page and an
//! acknowledgement of the same incident are never interleaved, and a page notification ended by
//! an acknowledgement can no longer be claimed.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{at_ms, corrupt, insert_row, ms, record_endings};
use crate::domain::escalation::{
    AckMeans, AckResult, Acknowledgement, EscalationPolicy, IncidentEvent, IncidentId,
    IncidentStatus, Next, PagePlace, Scheduled, StepTargets, schedule_time,
};
use crate::domain::history::{Actor, ending_entry};
use crate::domain::status::Status;
use crate::domain::{ContentHash, NotificationId, NotificationType, Priority, SiteId, Submission};
use crate::records::{
    EscalationTurn, IncidentAck, IncidentDetail, IncidentHistoryEntry, IncidentList,
    IncidentMessage, IncidentPageRecord, IncidentQuery, IncidentView, LeaseEpoch, NewNotification,
};
use crate::store::page_source::PageSource;
use crate::store::stored_policy;
use crate::store::{Result, StoreError};

/// Who the history names for what the escalation clock does itself.
const CLOCK: &str = "dispatcher";

/// Each list's policy, read once per submit batch.
#[derive(Default)]
pub(super) struct Policies(HashMap<String, Option<EscalationPolicy>>);

impl Policies {
    /// `list`'s policy; `None` when it has none (or does not exist). A stored policy that no
    /// longer passes the domain's checks (a hand edit) escalates nothing rather than failing
    /// the submits of that list, which would keep its alarms from being delivered at all: it
    /// is logged at ERROR, once per batch.
    pub(super) fn of(
        &mut self,
        conn: &Connection,
        list: &str,
    ) -> Result<Option<&EscalationPolicy>> {
        if !self.0.contains_key(list) {
            let text: Option<Option<String>> = conn
                .prepare_cached(include_str!("sql/select_list_escalation.sql"))?
                .query_row([list], |row| row.get(0))
                .optional()?;
            let policy = match text.flatten() {
                None => None,
                Some(text) => stored_policy::decode(&text)
                    .inspect_err(|e| {
                        tracing::error!(list, error = %e, "a stored escalation policy is invalid; its alarms open no incident (store the list again)");
                    })
                    .ok(),
            };
            self.0.insert(list.to_owned(), policy);
        }
        Ok(self.0.get(list).and_then(Option::as_ref))
    }
}

/// Writes history row `event` of `incident`.
#[allow(clippy::too_many_arguments)]
fn history(
    conn: &Connection,
    incident: i64,
    at_ms: i64,
    event: IncidentEvent,
    actor: &str,
    means: Option<AckMeans>,
    from: Option<&str>,
    detail: &str,
) -> Result<()> {
    let sequence: i64 = conn
        .prepare_cached(include_str!("sql/next_incident_history.sql"))?
        .query_row([incident], |row| row.get(0))?;
    conn.prepare_cached(include_str!("sql/insert_incident_history.sql"))?
        .execute(params![
            incident,
            sequence,
            at_ms,
            event.as_str(),
            actor,
            means.map(AckMeans::as_str),
            from,
            detail
        ])?;
    Ok(())
}

/// The `(NextRound, NextStep)` columns of what is due next: both NULL for exhaustion.
fn next_columns(next: Next) -> (Option<u32>, Option<u32>) {
    match next {
        Next::Page(page) => (Some(page.round), Some(page.step)),
        Next::Exhaust => (None, None),
    }
}

fn describe(scheduled: Scheduled) -> String {
    match scheduled.next {
        Next::Page(page) => format!("next: {page} at {}", scheduled.due_at.to_rfc3339()),
        Next::Exhaust => format!(
            "exhausted at {} unless acknowledged",
            scheduled.due_at.to_rfc3339()
        ),
    }
}

/// The just-stored notification `s` of a list with `policy`: if the policy applies to its
/// priority, a keyed one joins the open incident of its condition, and any other opens an
/// incident, of which it is page 1.
pub(super) fn open_or_join(
    conn: &Connection,
    s: &Submission,
    policy: &EscalationPolicy,
    now: DateTime<Utc>,
) -> Result<()> {
    if !policy.applies_to(s.priority) {
        return Ok(());
    }
    let now_ms = ms(now);
    let id = s.id.to_string();
    let site = s.provenance.source_site_id.as_str();
    let list = s.content.list_name.as_str();
    let subject = s.content.subject.as_str();
    let key = s.condition_key.as_ref().map(|k| k.as_str());
    if let Some(key) = key {
        let open: Option<i64> = conn
            .prepare_cached(include_str!("sql/select_condition_incident.sql"))?
            .query_row(params![site, key, list], |row| row.get(0))
            .optional()?;
        if let Some(incident) = open {
            conn.prepare_cached(include_str!("sql/join_incident.sql"))?
                .execute(params![incident, id, subject])?;
            link(conn, &id, incident, None)?;
            let detail = format!("notification {id}, a newer state of its condition, joined it");
            return history(
                conn,
                incident,
                now_ms,
                IncidentEvent::Joined,
                &site_actor(site),
                None,
                None,
                &detail,
            );
        }
    }
    let scheduled = policy.after(PagePlace::FIRST, now);
    let (next_round, next_step) = next_columns(scheduled.next);
    let incident: i64 = conn
        .prepare_cached(include_str!("sql/insert_incident.sql"))?
        .query_row(
            params![
                list,
                site,
                key,
                s.priority.rank(),
                id,
                id,
                subject,
                stored_policy::encode(policy),
                policy.escalate_on_park(),
                IncidentStatus::Open.as_str(),
                now_ms,
                ms(scheduled.due_at),
                next_round,
                next_step,
            ],
            |row| row.get(0),
        )?;
    conn.prepare_cached(include_str!("sql/insert_incident_page.sql"))?
        .execute(params![
            incident,
            0,
            0,
            1,
            1,
            now_ms,
            now_ms,
            None::<i64>,
            0
        ])?;
    link(conn, &id, incident, Some(1))?;
    let detail = format!(
        "notification {id} to list {list} ({}) is step 1 of {}; {}",
        s.priority.as_str(),
        policy.step_count(),
        describe(scheduled)
    );
    history(
        conn,
        incident,
        now_ms,
        IncidentEvent::Opened,
        &site_actor(site),
        None,
        None,
        &detail,
    )
}

fn site_actor(site: &str) -> String {
    crate::domain::history::site_actor(site).as_str().to_owned()
}

fn link(conn: &Connection, id: &str, incident: i64, page_no: Option<u32>) -> Result<()> {
    conn.prepare_cached(include_str!("sql/link_notification.sql"))?
        .execute(params![id, incident, page_no])?;
    Ok(())
}

/// An incident as the clock reads it when something of it is due.
struct DueIncident {
    id: i64,
    status: String,
    policy: String,
    list: String,
    latest_id: String,
    priority: i64,
    cycle: u32,
    page_count: u32,
    due_ms: i64,
    next_round: Option<u32>,
    next_step: Option<u32>,
    acknowledged_by: Option<String>,
    acknowledged_at: Option<i64>,
}

impl DueIncident {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            status: row.get(1)?,
            policy: row.get(2)?,
            list: row.get(3)?,
            latest_id: row.get(4)?,
            priority: row.get(5)?,
            cycle: row.get(6)?,
            page_count: row.get(7)?,
            due_ms: row.get(8)?,
            next_round: row.get(9)?,
            next_step: row.get(10)?,
            acknowledged_by: row.get(11)?,
            acknowledged_at: row.get(12)?,
        })
    }
}

/// One turn of the escalation clock (`EscalationStore::escalate_due`).
pub(super) fn escalate_due(
    conn: &Connection,
    lease: &str,
    epoch: LeaseEpoch,
    limit: u32,
    now: DateTime<Utc>,
) -> Result<EscalationTurn> {
    let now_ms = ms(now);
    let held = conn
        .prepare_cached(include_str!("sql/check_lease.sql"))?
        .query_row(params![lease, epoch.0, now_ms], |_| Ok(()))
        .optional()?
        .is_some();
    let mut turn = EscalationTurn {
        held,
        ..EscalationTurn::default()
    };
    if !held {
        return Ok(turn);
    }
    let mut due = conn
        .prepare_cached(include_str!("sql/select_due_incidents.sql"))?
        .query_map(params![now_ms, i64::from(limit) + 1], DueIncident::read)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    turn.more_due = due.len() > limit as usize;
    due.truncate(limit as usize);
    for incident in due {
        fire_alone(conn, &incident, epoch, now, &mut turn)?;
    }
    let next: Option<i64> = conn
        .prepare_cached(include_str!("sql/select_next_incident_due.sql"))?
        .query_row([], |row| row.get(0))?;
    turn.next_due_in =
        next.map(|due| Duration::from_millis(u64::try_from(due - now_ms).unwrap_or(0)));
    Ok(turn)
}

/// Fires `incident` in a savepoint of its own. An incident whose stored data breaks a rule
/// (`StoreError::Corrupt`: a timestamp or priority no release writes) is rolled back and
/// exhausted with the reason in its history, so the clock goes on for every other incident
/// instead of failing each turn on it; any other failure (the disk, the database) fails the
/// turn, to be tried again.
fn fire_alone(
    conn: &Connection,
    incident: &DueIncident,
    epoch: LeaseEpoch,
    now: DateTime<Utc>,
    turn: &mut EscalationTurn,
) -> Result<()> {
    conn.prepare_cached(include_str!("sql/savepoint_incident.sql"))?
        .execute([])?;
    let before = turn.clone();
    match fire(conn, incident, epoch, now, turn) {
        Ok(()) => {}
        Err(StoreError::Corrupt(problem)) => {
            conn.prepare_cached(include_str!("sql/rollback_incident.sql"))?
                .execute([])?;
            *turn = before;
            tracing::error!(incident = incident.id, %problem, "an incident's stored data cannot be fired; exhausting it");
            let detail =
                format!("its stored data cannot be fired ({problem}): nobody more can be paged");
            exhaust(conn, incident.id, ms(now), &detail, turn)?;
        }
        Err(other) => return Err(other),
    }
    conn.prepare_cached(include_str!("sql/release_incident.sql"))?
        .execute([])?;
    Ok(())
}

/// Fires what is due of one incident. Whatever is wrong with the incident itself (a damaged
/// policy snapshot, a status with nothing to fire) ends or settles it with a history row rather
/// than failing the turn: a row that fails every turn would stop the clock for every incident.
fn fire(
    conn: &Connection,
    incident: &DueIncident,
    epoch: LeaseEpoch,
    now: DateTime<Utc>,
    turn: &mut EscalationTurn,
) -> Result<()> {
    let now_ms = ms(now);
    let policy = match stored_policy::decode(&incident.policy) {
        Ok(policy) => policy,
        Err(e) => {
            tracing::error!(incident = incident.id, error = %e, "an incident's policy snapshot is unreadable; exhausting it");
            return exhaust(
                conn,
                incident.id,
                now_ms,
                &format!("its policy snapshot is unreadable ({e}): nobody more can be paged"),
                turn,
            );
        }
    };
    let due_at = at_ms("Incidents.NextDueAt", incident.due_ms)?;
    match IncidentStatus::from_db(&incident.status) {
        Some(IncidentStatus::Open) => match (incident.next_round, incident.next_step) {
            (Some(round), Some(step)) => {
                let page = PagePlace { round, step };
                fire_page(
                    conn,
                    incident,
                    &policy,
                    page,
                    incident.cycle,
                    due_at,
                    epoch,
                    now,
                    turn,
                )
            }
            _ => exhaust(
                conn,
                incident.id,
                now_ms,
                &format!("no acknowledgement after {} pages", incident.page_count),
                turn,
            ),
        },
        Some(IncidentStatus::Acknowledged) => {
            let by = incident.acknowledged_by.as_deref().unwrap_or("somebody");
            let at = incident
                .acknowledged_at
                .and_then(DateTime::from_timestamp_millis)
                .map_or_else(String::new, |at| format!(" at {}", at.to_rfc3339()));
            let detail =
                format!("acknowledged by {by}{at} and not cleared: paging again from step 1");
            history(
                conn,
                incident.id,
                now_ms,
                IncidentEvent::Reminded,
                CLOCK,
                None,
                None,
                &detail,
            )?;
            fire_page(
                conn,
                incident,
                &policy,
                PagePlace::FIRST,
                incident.cycle + 1,
                due_at,
                epoch,
                now,
                turn,
            )
        }
        other => {
            // Nothing is due in this status (a hand edit): settle it so the clock moves on.
            let status: &str = match other {
                Some(status) => status.as_str(),
                None => &incident.status,
            };
            tracing::error!(
                incident = incident.id,
                status,
                "an incident was due in a status with nothing to fire; settled"
            );
            conn.prepare_cached(include_str!("sql/settle_incident_due.sql"))?
                .execute([incident.id])?;
            Ok(())
        }
    }
}

fn exhaust(
    conn: &Connection,
    incident: i64,
    now_ms: i64,
    detail: &str,
    turn: &mut EscalationTurn,
) -> Result<()> {
    conn.prepare_cached(include_str!("sql/end_incident.sql"))?
        .query_row(
            params![incident, IncidentStatus::Exhausted.as_str(), now_ms],
            |_| Ok(()),
        )
        .optional()?;
    turn.exhausted += 1;
    history(
        conn,
        incident,
        now_ms,
        IncidentEvent::Exhausted,
        CLOCK,
        None,
        None,
        detail,
    )
}

/// Fires `page` of `incident` (of cycle `cycle`), due at `due_at`: its page row, one message
/// per list it reaches, a history row, and the incident's next due time.
#[allow(clippy::too_many_arguments)]
fn fire_page(
    conn: &Connection,
    incident: &DueIncident,
    policy: &EscalationPolicy,
    page: PagePlace,
    cycle: u32,
    due_at: DateTime<Utc>,
    epoch: LeaseEpoch,
    now: DateTime<Utc>,
    turn: &mut EscalationTurn,
) -> Result<()> {
    let now_ms = ms(now);
    let (from, late) = schedule_time(due_at, now);
    let page_no = incident.page_count + 1;
    let late_ms = late.map(|l| i64::try_from(l.as_millis()).unwrap_or(i64::MAX));
    conn.prepare_cached(include_str!("sql/insert_incident_page.sql"))?
        .execute(params![
            incident.id,
            cycle,
            page.round,
            page.step,
            page_no,
            ms(due_at),
            now_ms,
            late_ms,
            epoch.0
        ])?;
    let lists: Vec<String> = match policy.targets(page.step) {
        StepTargets::AlarmList => vec![incident.list.clone()],
        StepTargets::Lists(lists) => lists.iter().map(|l| l.as_str().to_owned()).collect(),
    };
    let priority = Priority::from_rank(incident.priority)
        .ok_or_else(|| corrupt(format!("Incidents.Priority = {}", incident.priority)))?;
    let mut paged = Vec::with_capacity(lists.len());
    for list in &lists {
        match store_message(conn, incident, list, page_no, priority, now)? {
            Ok(id) => paged.push(format!("{list} ({id})")),
            Err(why) => {
                turn.skipped += 1;
                let detail = format!("{page}: list {list} not paged: {why}");
                history(
                    conn,
                    incident.id,
                    now_ms,
                    IncidentEvent::Skipped,
                    CLOCK,
                    None,
                    None,
                    &detail,
                )?;
            }
        }
    }
    turn.messages += paged.len() as u32;
    turn.pages += 1;
    let scheduled = policy.after(page, from);
    let (next_round, next_step) = next_columns(scheduled.next);
    conn.prepare_cached(include_str!("sql/advance_incident.sql"))?
        .execute(params![
            incident.id,
            page_no,
            cycle,
            page.round,
            page.step,
            ms(scheduled.due_at),
            next_round,
            next_step,
            u32::from(late.is_some())
        ])?;
    let late_text = match late {
        Some(late) => {
            turn.late += 1;
            format!(" LATE by {}s (due {})", late.as_secs(), due_at.to_rfc3339())
        }
        None => String::new(),
    };
    let whom = if paged.is_empty() {
        "nobody".to_owned()
    } else {
        paged.join(", ")
    };
    let detail = format!(
        "{page} of {} (page {page_no}): paged {whom}{late_text}; {}",
        policy.step_count(),
        describe(scheduled)
    );
    history(
        conn,
        incident.id,
        now_ms,
        IncidentEvent::Paged,
        CLOCK,
        None,
        None,
        &detail,
    )
}

/// Stores the page's message to `list`: a copy of the incident's latest notification, Pending,
/// at the incident's priority, linked as page `page_no`. `Ok(Err(why))` when the list cannot be
/// paged (it no longer exists, or the quoted notification is gone or no longer valid).
fn store_message(
    conn: &Connection,
    incident: &DueIncident,
    list: &str,
    page_no: u32,
    priority: Priority,
    now: DateTime<Utc>,
) -> Result<std::result::Result<NotificationId, String>> {
    let stored = store_copy(conn, &incident.latest_id, list, priority, now, |_| Ok(()))?;
    if let Ok(id) = &stored {
        link(conn, &id.to_string(), incident.id, Some(page_no))?;
    }
    Ok(stored)
}

/// Stores a Pending copy of notification `quoted` to `list` at `priority`, under a fresh id,
/// after `edit` had its say on the copy's text. `Ok(Err(why))` when it cannot be: the list no
/// longer exists, or the quoted notification is gone or its copy breaks a content rule.
fn store_copy(
    conn: &Connection,
    quoted: &str,
    list: &str,
    priority: Priority,
    now: DateTime<Utc>,
    edit: impl FnOnce(&mut PageSource) -> std::result::Result<(), String>,
) -> Result<std::result::Result<NotificationId, String>> {
    let kind: Option<String> = conn
        .prepare_cached(include_str!("sql/select_list_type.sql"))?
        .query_row([list], |row| row.get(0))
        .optional()?;
    let Some(kind) = kind else {
        return Ok(Err("no such list".into()));
    };
    let Some(kind) = NotificationType::from_db(&kind) else {
        return Ok(Err(format!("its type {kind:?} has no channel")));
    };
    let source = conn
        .prepare_cached(include_str!("sql/select_page_source.sql"))?
        .query_row([quoted], |row| {
            Ok(PageSource {
                kind: row.get(0)?,
                subject: row.get(1)?,
                body: row.get(2)?,
                type_data: row.get(3)?,
                site: row.get(4)?,
                instance: row.get(5)?,
                script: row.get(6)?,
                origin: row.get(7)?,
                origin_parent: row.get(8)?,
                enqueued_at: DateTime::from_timestamp_millis(row.get(9)?),
            })
        })
        .optional()?;
    let Some(mut source) = source else {
        return Ok(Err(format!(
            "the notification it quotes ({quoted}) is no longer stored"
        )));
    };
    if let Err(why) = edit(&mut source) {
        return Ok(Err(why));
    }
    let submission = match source.submission(kind, list, priority) {
        Ok(submission) => submission,
        Err(why) => return Ok(Err(why)),
    };
    let new = NewNotification {
        hash: ContentHash::of(&submission.content),
        submission,
    };
    insert_row(conn, &new, now)?;
    Ok(Ok(new.submission.id))
}

/// Tells every list incident `incident` reached (a message of it delivered, or being delivered)
/// who acknowledged it: one Pending notification per list, a copy of the incident's latest
/// with "Acknowledged by X: " before its subject and the acknowledgement first in its body, not
/// linked to the incident (it pages nobody and carries no link). Returns, per list, the message
/// stored or why none could be, for the acknowledgement's history row.
fn notify_acknowledged(
    conn: &Connection,
    incident: i64,
    ack: &Acknowledgement,
    now: DateTime<Utc>,
) -> Result<Vec<String>> {
    let (latest, priority): (String, i64) = conn
        .prepare_cached(include_str!("sql/select_incident_quote.sql"))?
        .query_row([incident], |row| Ok((row.get(0)?, row.get(1)?)))?;
    let priority = Priority::from_rank(priority)
        .ok_or_else(|| corrupt(format!("Incidents.Priority = {priority}")))?;
    let lists: Vec<String> = conn
        .prepare_cached(include_str!("sql/select_reached_lists.sql"))?
        .query_map(params![incident, ms(now)], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut told = Vec::with_capacity(lists.len());
    for list in lists {
        let stored = store_copy(conn, &latest, &list, priority, now, |source| {
            source.announce_acknowledgement(incident, ack, now);
            Ok(())
        })?;
        told.push(match stored {
            Ok(id) => format!("{list} ({id})"),
            Err(why) => format!("{list} (not told: {why})"),
        });
    }
    Ok(told)
}

/// Ends incident `incident`'s page messages not yet handed to the relay as `ending` (by `by`),
/// each with its history entry, and marks those being delivered to end so unless their attempt
/// delivers them. Returns how many ended now.
fn end_pages(
    conn: &Connection,
    incident: i64,
    ending: Status,
    by: &str,
    now_ms: i64,
) -> Result<u32> {
    let ended = conn
        .prepare_cached(include_str!("sql/end_incident_pages.sql"))?
        .query_map(params![incident, now_ms, ending.as_str()], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, u32>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let entry = ending_entry(ending.as_str())
        .ok_or_else(|| corrupt(format!("{ending} does not end a page")))?;
    record_endings(conn, &ended, now_ms, entry, by)?;
    conn.prepare_cached(include_str!("sql/mark_incident_pages.sql"))?
        .execute(params![incident, now_ms, ending.as_str(), by])?;
    Ok(ended.len() as u32)
}

/// `EscalationStore::acknowledge_incident`.
pub(super) fn acknowledge(
    conn: &Connection,
    id: IncidentId,
    ack: &Acknowledgement,
    now: DateTime<Utc>,
) -> Result<AckResult> {
    let now_ms = ms(now);
    let state = conn
        .prepare_cached(include_str!("sql/select_incident_state.sql"))?
        .query_row([id.0], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, Option<String>>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, Option<i64>>(3)?,
                row.get::<_, Option<i64>>(4)?,
                row.get::<_, String>(5)?,
                row.get::<_, Option<String>>(6)?,
            ))
        })
        .optional()?;
    let Some((status, by, via, at, ended_at, policy, key)) = state else {
        return Ok(AckResult::NotFound);
    };
    let status = IncidentStatus::from_db(&status)
        .ok_or_else(|| corrupt(format!("Incidents.Status = {status:?}")))?;
    let actor = ack.actor.as_str();
    let record = |event: IncidentEvent, detail: &str| {
        history(
            conn,
            id.0,
            now_ms,
            event,
            actor,
            Some(ack.means),
            ack.from(),
            detail,
        )
    };
    if status.takes_acknowledgement() {
        let policy = stored_policy::decode(&policy).ok();
        // Only a condition can be cleared, so only a keyed incident is reminded.
        let reminder = key
            .and(policy.as_ref())
            .and_then(EscalationPolicy::acknowledgement_reminder)
            .map(|r| ms(now + r));
        conn.prepare_cached(include_str!("sql/acknowledge_incident.sql"))?
            .execute(params![id.0, now_ms, actor, ack.means.as_str(), reminder])?;
        let stopped = end_pages(conn, id.0, Status::Acknowledged, actor, now_ms)?;
        let mut detail = format!("{stopped} page notifications not yet sent were stopped");
        if policy
            .as_ref()
            .is_some_and(EscalationPolicy::notify_acknowledgement)
        {
            let told = notify_acknowledged(conn, id.0, ack, now)?;
            if !told.is_empty() {
                detail.push_str(&format!("; told who acknowledged it: {}", told.join(", ")));
            }
        }
        if let Some(reminder) = reminder.and_then(DateTime::from_timestamp_millis) {
            detail.push_str(&format!(
                "; reminder at {} unless cleared",
                reminder.to_rfc3339()
            ));
        }
        record(IncidentEvent::Acknowledged, &detail)?;
        return Ok(AckResult::Acknowledged { stopped });
    }
    if status == IncidentStatus::Acknowledged {
        let by = by.unwrap_or_default();
        let means = via
            .as_deref()
            .and_then(AckMeans::from_db)
            .ok_or_else(|| corrupt(format!("Incidents.AcknowledgedVia = {via:?}")))?;
        let at = at_ms("Incidents.AcknowledgedAt", at.unwrap_or_default())?;
        let detail = format!(
            "already acknowledged by {by} ({}) at {}",
            means.as_str(),
            at.to_rfc3339()
        );
        record(IncidentEvent::AcknowledgedAgain, &detail)?;
        return Ok(AckResult::AlreadyAcknowledged { by, means, at });
    }
    let at = at_ms("Incidents.EndedAt", ended_at.unwrap_or_default())?;
    let detail = format!(
        "the incident had ended: {status} at {}; nothing reopened",
        at.to_rfc3339()
    );
    record(IncidentEvent::AcknowledgedLate, &detail)?;
    Ok(AckResult::AlreadyEnded { status, at })
}

fn condition_incidents(conn: &Connection, site: &SiteId, key: &str) -> Result<Vec<i64>> {
    Ok(conn
        .prepare_cached(include_str!("sql/select_condition_incidents.sql"))?
        .query_map(params![site.as_str(), key], |row| row.get(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?)
}

/// `EscalationStore::acknowledge_condition`.
pub(super) fn acknowledge_condition(
    conn: &Connection,
    site: &SiteId,
    key: &str,
    ack: &Acknowledgement,
    now: DateTime<Utc>,
) -> Result<Vec<(IncidentId, AckResult)>> {
    condition_incidents(conn, site, key)?
        .into_iter()
        .map(|id| Ok((IncidentId(id), acknowledge(conn, IncidentId(id), ack, now)?)))
        .collect()
}

/// Ends `incident` as `ending` (Cleared or Discarded) by `actor`, with its page messages not
/// yet sent; nothing if it had ended already.
fn end(
    conn: &Connection,
    incident: i64,
    ending: IncidentStatus,
    actor: &Actor,
    now_ms: i64,
) -> Result<()> {
    let changed = conn
        .prepare_cached(include_str!("sql/end_incident.sql"))?
        .query_row(params![incident, ending.as_str(), now_ms], |_| Ok(()))
        .optional()?;
    if changed.is_none() {
        return Ok(());
    }
    let (status, event, verb) = match ending {
        IncidentStatus::Discarded => (
            Status::Discarded,
            IncidentEvent::Discarded,
            "its alarm was discarded",
        ),
        _ => (
            Status::Cleared,
            IncidentEvent::Cleared,
            "its condition was cleared",
        ),
    };
    let stopped = end_pages(conn, incident, status, actor.as_str(), now_ms)?;
    let detail = format!("{verb}; {stopped} page notifications not yet sent were stopped");
    history(
        conn,
        incident,
        now_ms,
        event,
        actor.as_str(),
        None,
        None,
        &detail,
    )
}

/// A clear of `site`'s condition `key` ends its incidents on every list.
pub(super) fn end_for_clear(
    conn: &Connection,
    site: &SiteId,
    key: &str,
    actor: &Actor,
    now: DateTime<Utc>,
) -> Result<()> {
    for incident in condition_incidents(conn, site, key)? {
        end(conn, incident, IncidentStatus::Cleared, actor, ms(now))?;
    }
    Ok(())
}

/// An operator discarded notification `id`: if it is an incident's alarm or a joined
/// notification of its condition, the incident ends.
pub(super) fn end_for_discard(
    conn: &Connection,
    id: NotificationId,
    actor: &Actor,
    now: DateTime<Utc>,
) -> Result<()> {
    let incident: Option<i64> = conn
        .prepare_cached(include_str!("sql/select_incident_of_row.sql"))?
        .query_row([id.to_string()], |row| row.get(0))
        .optional()?;
    match incident {
        Some(incident) => end(conn, incident, IncidentStatus::Discarded, actor, ms(now)),
        None => Ok(()),
    }
}

/// Notification row `row_id` just parked: its incident escalates at once if the policy says so
/// and it was the latest page's.
pub(super) fn parked(
    conn: &Connection,
    row_id: i64,
    id: NotificationId,
    now_ms: i64,
) -> Result<()> {
    let incident: Option<i64> = conn
        .prepare_cached(include_str!("sql/escalate_parked_page.sql"))?
        .query_row(params![row_id, now_ms], |row| row.get(0))
        .optional()?;
    if let Some(incident) = incident {
        let detail =
            format!("notification {id} of its latest page parked: the next page is due now");
        history(
            conn,
            incident,
            now_ms,
            IncidentEvent::Escalated,
            CLOCK,
            None,
            None,
            &detail,
        )?;
    }
    Ok(())
}

/// `EscalationStore::incidents`.
pub(super) fn incidents(conn: &Connection, query: &IncidentQuery) -> Result<IncidentList> {
    let statuses = if query.statuses.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = query.statuses.iter().map(|s| s.as_str()).collect();
        format!(",{},", names.join(","))
    };
    let limit = query.limit.max(1);
    let mut incidents = conn
        .prepare_cached(include_str!("sql/select_incidents.sql"))?
        .query_map(
            params![
                statuses,
                query.late_only,
                query.before.map(|b| b.0),
                i64::from(limit) + 1
            ],
            StoredIncident::read,
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?
        .into_iter()
        .map(StoredIncident::decode)
        .collect::<Result<Vec<_>>>()?;
    let more = incidents.len() > limit as usize;
    incidents.truncate(limit as usize);
    let next_before = if more {
        incidents.last().map(|i| i.id)
    } else {
        None
    };
    Ok(IncidentList {
        incidents,
        next_before,
    })
}

/// `EscalationStore::incident`.
pub(super) fn incident(conn: &Connection, id: IncidentId) -> Result<Option<IncidentDetail>> {
    let stored = conn
        .prepare_cached(include_str!("sql/select_incident.sql"))?
        .query_row([id.0], StoredIncident::read)
        .optional()?;
    let Some(stored) = stored else {
        return Ok(None);
    };
    let incident = stored.decode()?;
    let pages = conn
        .prepare_cached(include_str!("sql/select_incident_pages.sql"))?
        .query_map([id.0], |row| {
            Ok((
                row.get::<_, u32>(0)?,
                row.get::<_, u32>(1)?,
                row.get::<_, u32>(2)?,
                row.get::<_, u32>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, i64>(5)?,
                row.get::<_, Option<i64>>(6)?,
                row.get::<_, i64>(7)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?
        .into_iter()
        .map(|(page_no, cycle, round, step, due, fired, late, epoch)| {
            Ok(IncidentPageRecord {
                page_no,
                cycle,
                page: PagePlace { round, step },
                due_at: at_ms("IncidentPages.DueAt", due)?,
                fired_at: at_ms("IncidentPages.FiredAt", fired)?,
                late_by: late.map(|l| Duration::from_millis(u64::try_from(l).unwrap_or(0))),
                lease_epoch: epoch,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let history = conn
        .prepare_cached(include_str!("sql/select_incident_history.sql"))?
        .query_map([id.0], |row| {
            Ok((
                row.get::<_, u32>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, Option<String>>(4)?,
                row.get::<_, Option<String>>(5)?,
                row.get::<_, String>(6)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?
        .into_iter()
        .map(|(sequence, at, kind, actor, means, from, detail)| {
            Ok(IncidentHistoryEntry {
                sequence,
                at: at_ms("IncidentHistory.At", at)?,
                event: IncidentEvent::from_db(&kind)
                    .ok_or_else(|| corrupt(format!("IncidentHistory.Kind = {kind:?}")))?,
                actor,
                means: means.as_deref().and_then(AckMeans::from_db),
                from,
                detail,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let messages = conn
        .prepare_cached(include_str!("sql/select_incident_messages.sql"))?
        .query_map([id.0], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<u32>>(2)?,
                row.get::<_, String>(3)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?
        .into_iter()
        .map(|(nid, list, page_no, status)| {
            Ok(IncidentMessage {
                id: NotificationId::parse(&nid, "NotificationId").map_err(corrupt)?,
                list,
                page_no,
                status: Status::from_db(&status)
                    .ok_or_else(|| corrupt(format!("status {status:?}")))?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(IncidentDetail {
        incident,
        pages,
        history,
        messages,
    }))
}

/// The columns of select_incidents.sql, as read.
struct StoredIncident {
    id: i64,
    list: String,
    site: String,
    key: Option<String>,
    priority: i64,
    alarm_id: String,
    latest_id: String,
    subject: String,
    status: String,
    opened_at: i64,
    page_count: u32,
    round: u32,
    step: u32,
    next_due: Option<i64>,
    next_round: Option<u32>,
    next_step: Option<u32>,
    late_pages: u32,
    ack_by: Option<String>,
    ack_via: Option<String>,
    ack_at: Option<i64>,
    ended_at: Option<i64>,
    policy: String,
}

impl StoredIncident {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            list: row.get(1)?,
            site: row.get(2)?,
            key: row.get(3)?,
            priority: row.get(4)?,
            alarm_id: row.get(5)?,
            latest_id: row.get(6)?,
            subject: row.get(7)?,
            status: row.get(8)?,
            opened_at: row.get(9)?,
            page_count: row.get(10)?,
            round: row.get(11)?,
            step: row.get(12)?,
            next_due: row.get(13)?,
            next_round: row.get(14)?,
            next_step: row.get(15)?,
            late_pages: row.get(16)?,
            ack_by: row.get(17)?,
            ack_via: row.get(18)?,
            ack_at: row.get(19)?,
            ended_at: row.get(20)?,
            policy: row.get(21)?,
        })
    }

    fn decode(self) -> Result<IncidentView> {
        let id = |text: &str| NotificationId::parse(text, "NotificationId").map_err(corrupt);
        let next = match self.next_due {
            None => None,
            Some(due) => {
                let page = match (self.next_round, self.next_step) {
                    (Some(round), Some(step)) => Some(PagePlace { round, step }),
                    _ => None,
                };
                Some((page, at_ms("Incidents.NextDueAt", due)?))
            }
        };
        let acknowledged = match (self.ack_by, self.ack_via, self.ack_at) {
            (Some(by), Some(via), Some(at)) => Some(IncidentAck {
                by,
                means: AckMeans::from_db(&via)
                    .ok_or_else(|| corrupt(format!("Incidents.AcknowledgedVia = {via:?}")))?,
                at: at_ms("Incidents.AcknowledgedAt", at)?,
            }),
            _ => None,
        };
        Ok(IncidentView {
            id: IncidentId(self.id),
            alarm_id: id(&self.alarm_id)?,
            latest_id: id(&self.latest_id)?,
            list: self.list,
            site: self.site,
            condition_key: self.key,
            priority: Priority::from_rank(self.priority)
                .ok_or_else(|| corrupt(format!("Incidents.Priority = {}", self.priority)))?,
            subject: self.subject,
            status: IncidentStatus::from_db(&self.status)
                .ok_or_else(|| corrupt(format!("Incidents.Status = {:?}", self.status)))?,
            opened_at: at_ms("Incidents.OpenedAt", self.opened_at)?,
            page_count: self.page_count,
            last_page: PagePlace {
                round: self.round,
                step: self.step,
            },
            next,
            late_pages: self.late_pages,
            acknowledged,
            ended_at: self
                .ended_at
                .map(|e| at_ms("Incidents.EndedAt", e))
                .transpose()?,
            policy: stored_policy::decode(&self.policy).map_err(StoreError::Corrupt)?,
        })
    }
}
