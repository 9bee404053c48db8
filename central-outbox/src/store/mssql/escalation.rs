//! Escalation in the MS SQL backend (rules in `domain::escalation`, the contract in
//! `store::EscalationStore`, the SQLite backend's twin in `store/sqlite/escalation.rs`).
//!
//! Where each part runs:
//! - An alarm opens or joins its incident in dbo.SubmitNotification, in the submit's own
//!   transaction, from columns of the list derived from its policy when it is written
//!   ([`OpeningRule`]): an alarm is never stored without its incident.
//! - A parked page escalates at once in dbo.RecordAttemptOutcomes, and a clear or a discard
//!   ends its incidents in the clear's and the discard's batches (`sql::escalation::end_incidents`).
//! - The clock's turn and the acknowledgements are decided here, in Rust, from a read of the
//!   incident, and applied by one batch per incident whose UPDATE re-checks the state read (and,
//!   for the clock, the lease at its epoch): a batch that finds the incident moved on (an
//!   acknowledgement committed meanwhile, another node's fire) changes nothing, and the caller
//!   reads again. So an acknowledgement and a page of the same incident are never both applied
//!   from the same state, and a page notification ended by an acknowledgement can no longer
//!   be claimed: the same guarantees as SQLite's single writer, by another means.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tiberius::Row;
use uuid::Uuid;

use super::error::{ErrorClass, classify, to_store_error};
use super::pool::Param;
use super::{MsSqlStore, decode, result_set, sql};
use crate::domain::escalation::{
    AckMeans, AckResult, Acknowledgement, EscalationPolicy, IncidentEvent, IncidentId,
    IncidentStatus, Next, PagePlace, Scheduled, StepTargets, schedule_time,
};
use crate::domain::history::ACKNOWLEDGED_ENTRY;
use crate::domain::status::Status;
use crate::domain::{ContentHash, NotificationId, NotificationType, Priority};
use crate::records::{
    EscalationTurn, IncidentAck, IncidentDetail, IncidentHistoryEntry, IncidentList,
    IncidentMessage, IncidentPageRecord, IncidentQuery, IncidentView, LeaseEpoch, NewNotification,
};
use crate::store::page_source::PageSource;
use crate::store::stored_policy;
use crate::store::{Result, StoreError};
use sql::escalation::{IncidentBatch, ReadState};

/// Who the history names for what the escalation clock does itself.
const CLOCK: &str = "dispatcher";

/// What an acknowledgement's history row says after the count of page messages it stopped.
const STOPPED_REST: &str = " page notifications not yet sent were stopped";

/// Reads of an incident an acknowledgement makes before it finds the state it read still
/// there: each miss means another writer changed the incident in between, which cannot go on
/// for long (an incident changes a handful of times in its life).
const ACK_READS: usize = 8;

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

/// What dbo.SubmitNotification needs of a list's policy to open an incident, written beside
/// the policy's JSON (migration 0014) so the procedure reads no JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpeningRule {
    /// Bit `rank` set for each priority the policy applies to.
    pub(crate) priorities: i32,
    /// How long step 1 waits, and what follows it (`None`: exhaustion).
    pub(crate) first_wait_ms: i64,
    pub(crate) first_next: Option<PagePlace>,
    pub(crate) escalate_on_park: bool,
    /// The opening history row after "notification <id> to list <list> (<priority>) ", with
    /// `{due}` for the time step 1's wait ends (as the SQLite backend words it).
    pub(crate) opened_note: String,
}

impl OpeningRule {
    pub(crate) fn of(policy: &EscalationPolicy) -> Self {
        let priorities = policy
            .priorities()
            .iter()
            .fold(0, |mask, p| mask | (1 << p.rank()));
        let wait = policy.wait_after(1);
        let first_next = policy.following(PagePlace::FIRST);
        let next = match first_next {
            Some(page) => format!("next: {page} at {{due}}"),
            None => "exhausted at {due} unless acknowledged".to_owned(),
        };
        Self {
            priorities,
            first_wait_ms: i64::try_from(wait.as_millis()).unwrap_or(i64::MAX),
            first_next,
            escalate_on_park: policy.escalate_on_park(),
            opened_note: format!("is step 1 of {}; {next}", policy.step_count()),
        }
    }
}

/// An incident as the clock reads it when something of it is due.
struct DueIncident {
    id: i64,
    status: String,
    policy: String,
    list: String,
    latest_id: Uuid,
    priority: i32,
    cycle: u32,
    page_count: u32,
    due: DateTime<Utc>,
    next_round: Option<u32>,
    next_step: Option<u32>,
    acknowledged_by: Option<String>,
    acknowledged_at: Option<DateTime<Utc>>,
}

fn opt_count(row: &Row, column: &str) -> Result<Option<u32>> {
    decode::opt::<i32>(row, column)?
        .map(|v| u32::try_from(v).map_err(|_| corrupt(format!("{column} = {v}"))))
        .transpose()
}

impl DueIncident {
    fn read(row: &Row) -> Result<Self> {
        Ok(Self {
            id: decode::req::<i64>(row, "Id")?,
            status: decode::text(row, "Status")?,
            policy: decode::text(row, "Policy")?,
            list: decode::text(row, "ListName")?,
            latest_id: decode::guid(row, "LatestId")?,
            priority: decode::req::<i32>(row, "Priority")?,
            cycle: decode::count(row, "Cycle")?,
            page_count: decode::count(row, "PageCount")?,
            due: decode::time(row, "NextDueAt")?,
            next_round: opt_count(row, "NextRound")?,
            next_step: opt_count(row, "NextStep")?,
            acknowledged_by: decode::opt_text(row, "AcknowledgedBy")?,
            acknowledged_at: decode::opt_time(row, "AcknowledgedAt")?,
        })
    }

    fn state(&self) -> ReadState<'_> {
        ReadState {
            id: self.id,
            status: &self.status,
            page_count: self.page_count,
            due: Some(self.due),
        }
    }
}

/// The notifications pages quote and the channel types of the lists they go to, read before
/// the fires that use them.
#[derive(Default)]
struct Sources {
    quoted: HashMap<Uuid, PageSource>,
    list_types: HashMap<String, String>,
}

impl Sources {
    async fn read(store: &MsSqlStore, ids: &[Uuid], lists: &[String]) -> Result<Self> {
        let stmt = sql::escalation::select_sources(ids, lists);
        let mut results = store
            .batch("escalation sources", &stmt.sql, &stmt.params)
            .await?;
        let mut sources = Self::default();
        for row in &result_set(&mut results, 0, "escalation sources")? {
            sources
                .quoted
                .insert(decode::guid(row, "NotificationId")?, page_source(row)?);
        }
        sources.learn_types(&result_set(&mut results, 1, "escalation sources")?)?;
        Ok(sources)
    }

    fn learn_types(&mut self, rows: &[Row]) -> Result<()> {
        for row in rows {
            self.list_types
                .insert(decode::text(row, "Name")?, decode::text(row, "Type")?);
        }
        Ok(())
    }

    /// The copy of `quoted` to `list` at `priority` after `edit`, or why there can be none
    /// (the list is gone, or the quoted notification, or its copy breaks a content rule).
    fn copy(
        &self,
        quoted: Uuid,
        list: &str,
        priority: Priority,
        edit: impl FnOnce(&mut PageSource),
    ) -> std::result::Result<NewNotification, String> {
        let kind = self.list_types.get(list).ok_or("no such list")?;
        let kind = NotificationType::from_db(kind)
            .ok_or_else(|| format!("its type {kind:?} has no channel"))?;
        let mut source =
            self.quoted.get(&quoted).cloned().ok_or_else(|| {
                format!("the notification it quotes ({quoted}) is no longer stored")
            })?;
        edit(&mut source);
        let submission = source.submission(kind, list, priority)?;
        Ok(NewNotification {
            hash: ContentHash::of(&submission.content),
            submission,
        })
    }
}

fn page_source(row: &Row) -> Result<PageSource> {
    Ok(PageSource {
        kind: decode::text(row, "Type")?,
        subject: decode::text(row, "Subject")?,
        body: decode::text(row, "Body")?,
        type_data: decode::text(row, "TypeData")?,
        site: decode::text(row, "SourceSiteId")?,
        instance: decode::text(row, "SourceInstanceId")?,
        script: decode::text(row, "SourceScript")?,
        origin: decode::opt::<Uuid>(row, "OriginExecutionId")?.map(|u| u.to_string()),
        origin_parent: decode::opt::<Uuid>(row, "OriginParentExecutionId")?.map(|u| u.to_string()),
        enqueued_at: decode::opt_time(row, "SiteEnqueuedAt")?,
    })
}

/// The lists `step` of `policy` pages for an incident of `list`.
fn step_lists(policy: &EscalationPolicy, step: u32, list: &str) -> Vec<String> {
    match policy.targets(step) {
        StepTargets::AlarmList => vec![list.to_owned()],
        StepTargets::Lists(lists) => lists.iter().map(|l| l.as_str().to_owned()).collect(),
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

/// What one incident's batch did.
enum Fired {
    /// Applied, with what it adds to the turn.
    Applied(EscalationTurn),
    /// The incident had moved on from the state read: nothing changed.
    Stale,
}

/// One turn of the escalation clock (`EscalationStore::escalate_due`).
pub(super) async fn escalate_due(
    store: &MsSqlStore,
    lease: &str,
    epoch: LeaseEpoch,
    limit: u32,
) -> Result<EscalationTurn> {
    let stmt = sql::escalation::select_due(lease, epoch, limit.saturating_add(1));
    let mut results = store
        .batch("escalation turn", &stmt.sql, &stmt.params)
        .await?;
    let head = result_set(&mut results, 0, "escalation turn")?;
    let head = head
        .first()
        .ok_or_else(|| corrupt("escalation turn: no lease answer"))?;
    let held = decode::req::<i32>(head, "Held")? == 1;
    let now = decode::time(head, "Now")?;
    let mut turn = EscalationTurn {
        held,
        ..EscalationTurn::default()
    };
    if !held {
        return Ok(turn);
    }
    let mut due = result_set(&mut results, 1, "escalation turn")?
        .iter()
        .map(DueIncident::read)
        .collect::<Result<Vec<_>>>()?;
    turn.more_due = due.len() > limit as usize;
    due.truncate(limit as usize);
    if !due.is_empty() {
        let sources = read_turn_sources(store, &due).await?;
        for incident in &due {
            match fire_alone(store, incident, &sources, lease, epoch, now).await? {
                Fired::Applied(done) => {
                    turn.pages += done.pages;
                    turn.messages += done.messages;
                    turn.skipped += done.skipped;
                    turn.late += done.late;
                    turn.exhausted += done.exhausted;
                }
                Fired::Stale => {}
            }
        }
    }
    let mut results = store
        .batch("escalation turn", sql::escalation::SELECT_NEXT_DUE, &[])
        .await?;
    let row = result_set(&mut results, 0, "escalation turn")?;
    let row = row
        .first()
        .ok_or_else(|| corrupt("escalation turn: no next due answer"))?;
    let clock = decode::time(row, "Now")?;
    turn.next_due_in = decode::opt_time(row, "NextDue")?
        .map(|next| (next - clock).to_std().unwrap_or(Duration::ZERO));
    Ok(turn)
}

/// The sources every due incident's page may quote, and the types of every list they may page.
async fn read_turn_sources(store: &MsSqlStore, due: &[DueIncident]) -> Result<Sources> {
    let mut ids = Vec::new();
    let mut lists = Vec::new();
    for incident in due {
        let Ok(policy) = stored_policy::decode(&incident.policy) else {
            continue; // Exhausted by its fire, which names the reason; it pages nobody.
        };
        let step = match (incident.status.as_str(), incident.next_step) {
            ("Acknowledged", _) => 1,
            (_, Some(step)) => step,
            _ => continue, // Exhaustion or settling: nothing to quote.
        };
        if !ids.contains(&incident.latest_id) {
            ids.push(incident.latest_id);
        }
        for list in step_lists(&policy, step, &incident.list) {
            if !lists.contains(&list) {
                lists.push(list);
            }
        }
    }
    if ids.is_empty() {
        return Ok(Sources::default());
    }
    Sources::read(store, &ids, &lists).await
}

/// Fires `incident` in a batch of its own. A batch the server refuses for the incident's own
/// data (a value no column takes, a rule a hand edit broke) exhausts the incident with the
/// reason in its history, so the clock goes on for every other incident instead of failing
/// each turn on it; the connection or the server being unavailable fails the turn, to be tried
/// again.
async fn fire_alone(
    store: &MsSqlStore,
    incident: &DueIncident,
    sources: &Sources,
    lease: &str,
    epoch: LeaseEpoch,
    now: DateTime<Utc>,
) -> Result<Fired> {
    let planned = plan_fire(incident, sources, lease, epoch, now);
    let (stmt, done) = match planned {
        Ok(planned) => planned,
        Err(problem) => {
            tracing::error!(incident = incident.id, %problem, "an incident's stored data cannot be fired; exhausting it");
            let detail =
                format!("its stored data cannot be fired ({problem}): nobody more can be paged");
            return exhaust(store, incident, lease, epoch, &detail).await;
        }
    };
    match store.batch_raw(&stmt.sql, &stmt.params).await {
        Ok(mut results) => {
            if applied(&mut results, "escalation fire")?.0 {
                Ok(Fired::Applied(done))
            } else {
                Ok(Fired::Stale)
            }
        }
        // The page row's key: another fire of this page committed first.
        Err(e) if classify(&e) == ErrorClass::DuplicateKey => Ok(Fired::Stale),
        Err(e) if matches!(classify(&e), ErrorClass::Server | ErrorClass::Conversion) => {
            tracing::error!(incident = incident.id, error = %e, "the server refused an incident's page; exhausting it");
            let detail = format!("its page could not be stored ({e}): nobody more can be paged");
            exhaust(store, incident, lease, epoch, &detail).await
        }
        Err(e) => Err(to_store_error("escalation fire", &e)),
    }
}

/// Whether a batch's guarded UPDATE applied, and how many page messages it stopped.
fn applied(results: &mut [Vec<Row>], context: &str) -> Result<(bool, u32)> {
    let last = results
        .len()
        .checked_sub(1)
        .ok_or_else(|| corrupt(format!("{context}: the batch returned no result")))?;
    let rows = result_set(results, last, context)?;
    let row = rows
        .first()
        .ok_or_else(|| corrupt(format!("{context}: no answer row")))?;
    Ok((
        decode::req::<i32>(row, "Applied")? == 1,
        decode::count(row, "Stopped")?,
    ))
}

/// The batch that fires what is due of `incident`, and what it adds to the turn if it applies.
/// `Err` names what in the incident's stored data makes it impossible.
fn plan_fire(
    incident: &DueIncident,
    sources: &Sources,
    lease: &str,
    epoch: LeaseEpoch,
    now: DateTime<Utc>,
) -> std::result::Result<(sql::Statement, EscalationTurn), String> {
    let policy = stored_policy::decode(&incident.policy)
        .map_err(|e| format!("its policy snapshot is unreadable: {e}"))?;
    let mut batch = IncidentBatch::new(incident.state(), Some((lease, epoch)));
    match IncidentStatus::from_db(&incident.status) {
        Some(IncidentStatus::Open) => match (incident.next_round, incident.next_step) {
            (Some(round), Some(step)) => {
                let page = PagePlace { round, step };
                let done = plan_page(
                    &mut batch,
                    incident,
                    &policy,
                    sources,
                    page,
                    incident.cycle,
                    None,
                    epoch,
                    now,
                )?;
                Ok((batch.finish(), done))
            }
            _ => {
                let detail = format!("no acknowledgement after {} pages", incident.page_count);
                plan_exhaust(&mut batch, &detail);
                let done = EscalationTurn {
                    exhausted: 1,
                    ..EscalationTurn::default()
                };
                Ok((batch.finish(), done))
            }
        },
        Some(IncidentStatus::Acknowledged) => {
            let by = incident.acknowledged_by.as_deref().unwrap_or("somebody");
            let at = incident
                .acknowledged_at
                .map_or_else(String::new, |at| format!(" at {}", at.to_rfc3339()));
            let reminded =
                format!("acknowledged by {by}{at} and not cleared: paging again from step 1");
            let done = plan_page(
                &mut batch,
                incident,
                &policy,
                sources,
                PagePlace::FIRST,
                incident.cycle + 1,
                Some(&reminded),
                epoch,
                now,
            )?;
            Ok((batch.finish(), done))
        }
        other => {
            // Nothing is due in this status (a hand edit): settle it so the clock moves on.
            tracing::error!(
                incident = incident.id,
                status = other.map_or(incident.status.clone(), |s| s.as_str().to_owned()),
                "an incident was due in a status with nothing to fire; settled"
            );
            batch.update(
                "i.NextDueAt = NULL, i.NextRound = NULL, i.NextStep = NULL",
                0,
            );
            Ok((batch.finish(), EscalationTurn::default()))
        }
    }
}

fn plan_exhaust(batch: &mut IncidentBatch, detail: &str) {
    batch.update(
        "i.Status = N'Exhausted', i.EndedAt = @now, i.NextDueAt = NULL, i.NextRound = NULL, i.NextStep = NULL",
        1,
    );
    let detail = batch.bind(Param::Text(Some(detail.to_owned())));
    batch.history(
        IncidentEvent::Exhausted.as_str(),
        CLOCK,
        None,
        None,
        &detail,
    );
}

/// Exhausts `incident` (still in the state read) in a batch of its own, with `detail`.
async fn exhaust(
    store: &MsSqlStore,
    incident: &DueIncident,
    lease: &str,
    epoch: LeaseEpoch,
    detail: &str,
) -> Result<Fired> {
    let mut batch = IncidentBatch::new(incident.state(), Some((lease, epoch)));
    plan_exhaust(&mut batch, detail);
    let stmt = batch.finish();
    let mut results = store
        .batch("escalation exhaust", &stmt.sql, &stmt.params)
        .await?;
    if applied(&mut results, "escalation exhaust")?.0 {
        Ok(Fired::Applied(EscalationTurn {
            exhausted: 1,
            ..EscalationTurn::default()
        }))
    } else {
        Ok(Fired::Stale)
    }
}

/// Plans `page` of `incident` (of cycle `cycle`) into `batch`: its page row, one message per
/// list it reaches, its history (after `reminded`, the reminder's row, when it is one), and the
/// incident's next due time.
#[allow(clippy::too_many_arguments)]
fn plan_page(
    batch: &mut IncidentBatch,
    incident: &DueIncident,
    policy: &EscalationPolicy,
    sources: &Sources,
    page: PagePlace,
    cycle: u32,
    reminded: Option<&str>,
    epoch: LeaseEpoch,
    now: DateTime<Utc>,
) -> std::result::Result<EscalationTurn, String> {
    let priority = Priority::from_rank(i64::from(incident.priority))
        .ok_or_else(|| format!("Incidents.Priority = {}", incident.priority))?;
    let (from, late) = schedule_time(incident.due, now);
    let page_no = incident.page_count + 1;
    let scheduled = policy.after(page, from);
    let mut done = EscalationTurn {
        pages: 1,
        late: u32::from(late.is_some()),
        ..EscalationTurn::default()
    };
    let mut messages = Vec::new();
    let mut skipped = Vec::new();
    let mut paged = Vec::new();
    for list in step_lists(policy, page.step, &incident.list) {
        match sources.copy(incident.latest_id, &list, priority, |_| {}) {
            Ok(message) => {
                paged.push(format!("{list} ({})", message.submission.id));
                messages.push(message);
            }
            Err(why) => skipped.push(format!("{page}: list {list} not paged: {why}")),
        }
    }
    done.messages = messages.len() as u32;
    done.skipped = skipped.len() as u32;
    let history_rows = usize::from(reminded.is_some()) + skipped.len() + 1;
    let (next_round, next_step) = match scheduled.next {
        Next::Page(next) => (Some(next.round), Some(next.step)),
        Next::Exhaust => (None, None),
    };
    let set = format!(
        "i.Status = N'Open', i.PageCount = {}, i.Cycle = {}, i.Round = {}, i.Step = {}, \
         i.NextDueAt = {}, i.NextRound = {}, i.NextStep = {}, i.LatePages = i.LatePages + {}",
        batch.bind(sql::int(page_no)),
        batch.bind(sql::int(cycle)),
        batch.bind(sql::int(page.round)),
        batch.bind(sql::int(page.step)),
        batch.bind(sql::at(scheduled.due_at)),
        batch.bind(Param::Int(next_round.map(sql::int_value))),
        batch.bind(Param::Int(next_step.map(sql::int_value))),
        batch.bind(sql::int(u32::from(late.is_some()))),
    );
    batch.update(&set, history_rows);
    let late_ms = late.map(|l| i64::try_from(l.as_millis()).unwrap_or(i64::MAX));
    sql::escalation::insert_page(
        batch,
        cycle,
        page.round,
        page.step,
        page_no,
        incident.due,
        late_ms,
        epoch,
    );
    let incident_id = batch.incident().to_owned();
    for message in &messages {
        sql::escalation::insert_message(batch, message, Some((&incident_id, page_no)));
    }
    let detail_of = |batch: &mut IncidentBatch, text: String| batch.bind(Param::Text(Some(text)));
    if let Some(reminded) = reminded {
        let detail = detail_of(batch, reminded.to_owned());
        batch.history(IncidentEvent::Reminded.as_str(), CLOCK, None, None, &detail);
    }
    for why in skipped {
        let detail = detail_of(batch, why);
        batch.history(IncidentEvent::Skipped.as_str(), CLOCK, None, None, &detail);
    }
    let late_text = match late {
        Some(late) => format!(
            " LATE by {}s (due {})",
            late.as_secs(),
            incident.due.to_rfc3339()
        ),
        None => String::new(),
    };
    let whom = if paged.is_empty() {
        "nobody".to_owned()
    } else {
        paged.join(", ")
    };
    let detail = detail_of(
        batch,
        format!(
            "{page} of {} (page {page_no}): paged {whom}{late_text}; {}",
            policy.step_count(),
            describe(scheduled)
        ),
    );
    batch.history(IncidentEvent::Paged.as_str(), CLOCK, None, None, &detail);
    Ok(done)
}

/// An incident as an acknowledgement reads it.
struct AckState {
    status: IncidentStatus,
    status_text: String,
    page_count: u32,
    next_due: Option<DateTime<Utc>>,
    by: Option<String>,
    via: Option<String>,
    at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
    policy: String,
    key: Option<String>,
    latest_id: Uuid,
    priority: i32,
    now: DateTime<Utc>,
}

/// `EscalationStore::acknowledge_incident`.
pub(super) async fn acknowledge(
    store: &MsSqlStore,
    id: IncidentId,
    ack: &Acknowledgement,
) -> Result<AckResult> {
    for _ in 0..ACK_READS {
        let stmt = sql::escalation::select_ack_state(id.0);
        let mut results = store.batch("acknowledge", &stmt.sql, &stmt.params).await?;
        let rows = result_set(&mut results, 0, "acknowledge")?;
        let Some(row) = rows.first() else {
            return Ok(AckResult::NotFound);
        };
        let status_text = decode::text(row, "Status")?;
        let state = AckState {
            status: IncidentStatus::from_db(&status_text)
                .ok_or_else(|| corrupt(format!("Incidents.Status = {status_text:?}")))?,
            status_text,
            page_count: decode::count(row, "PageCount")?,
            next_due: decode::opt_time(row, "NextDueAt")?,
            by: decode::opt_text(row, "AcknowledgedBy")?,
            via: decode::opt_text(row, "AcknowledgedVia")?,
            at: decode::opt_time(row, "AcknowledgedAt")?,
            ended_at: decode::opt_time(row, "EndedAt")?,
            policy: decode::text(row, "Policy")?,
            key: decode::opt_text(row, "ConditionKey")?,
            latest_id: decode::guid(row, "LatestId")?,
            priority: decode::req::<i32>(row, "Priority")?,
            now: decode::time(row, "Now")?,
        };
        // Only a first acknowledgement under a policy that announces it reads what the notice
        // quotes; every other answer needs the incident's row alone.
        let announces = state.status.takes_acknowledgement()
            && stored_policy::decode(&state.policy)
                .is_ok_and(|policy| policy.notify_acknowledgement());
        let (reached, sources) = if announces {
            read_reached(store, id).await?
        } else {
            (Vec::new(), Sources::default())
        };
        let read = ReadState {
            id: id.0,
            status: &state.status_text,
            page_count: state.page_count,
            due: state.next_due,
        };
        let (stmt, answer) = plan_acknowledgement(id, &state, read, &reached, &sources, ack)?;
        let mut results = store.batch("acknowledge", &stmt.sql, &stmt.params).await?;
        let (applied, stopped) = applied(&mut results, "acknowledge")?;
        if applied {
            return Ok(match answer {
                AckResult::Acknowledged { .. } => AckResult::Acknowledged { stopped },
                other => other,
            });
        }
    }
    Err(StoreError::Unavailable(format!(
        "acknowledge: incident {} changed under every one of {ACK_READS} reads; try again",
        id.0
    )))
}

/// The lists incident `id` reached, and the notification its notice quotes with their types.
async fn read_reached(store: &MsSqlStore, id: IncidentId) -> Result<(Vec<String>, Sources)> {
    let stmt = sql::escalation::select_reached(id.0);
    let mut results = store.batch("acknowledge", &stmt.sql, &stmt.params).await?;
    let reached = result_set(&mut results, 0, "acknowledge")?
        .iter()
        .map(|row| decode::text(row, "ListName"))
        .collect::<Result<Vec<_>>>()?;
    let mut sources = Sources::default();
    for row in &result_set(&mut results, 1, "acknowledge")? {
        sources
            .quoted
            .insert(decode::guid(row, "NotificationId")?, page_source(row)?);
    }
    sources.learn_types(&result_set(&mut results, 2, "acknowledge")?)?;
    Ok((reached, sources))
}

/// The batch that records `ack` on the incident in `state`, and what it answers if it applies
/// (an `Acknowledged`'s count comes from the batch).
fn plan_acknowledgement(
    id: IncidentId,
    state: &AckState,
    read: ReadState<'_>,
    reached: &[String],
    sources: &Sources,
    ack: &Acknowledgement,
) -> Result<(sql::Statement, AckResult)> {
    let actor = ack.actor.as_str();
    let mut batch = IncidentBatch::new(read, None);
    if state.status.takes_acknowledgement() {
        let policy = stored_policy::decode(&state.policy).ok();
        // Only a condition can be cleared, so only a keyed incident is reminded.
        let reminder = state
            .key
            .as_ref()
            .and(policy.as_ref())
            .and_then(EscalationPolicy::acknowledgement_reminder)
            .map(|r| i64::try_from(r.as_millis()).unwrap_or(i64::MAX));
        let notify = policy
            .as_ref()
            .is_some_and(EscalationPolicy::notify_acknowledgement);
        if !notify {
            // The common case, and the one an operator waits on: one procedure call.
            let stmt = sql::escalation::acknowledge_call(
                read,
                actor,
                ack.means.as_str(),
                ack.from(),
                reminder,
                STOPPED_REST,
            );
            return Ok((stmt, AckResult::Acknowledged { stopped: 0 }));
        }
        let reminder_at = match reminder {
            Some(ms) => {
                let seconds = batch.bind(Param::BigInt(Some(ms / 1000)));
                let millis = batch.bind(Param::BigInt(Some(ms % 1000)));
                format!(
                    "DATEADD(millisecond, CAST({millis} AS int), DATEADD(second, CAST({seconds} AS int), @now))"
                )
            }
            None => "NULL".to_owned(),
        };
        let set = format!(
            "i.Status = N'Acknowledged', i.AcknowledgedAt = @now, i.AcknowledgedBy = {}, \
             i.AcknowledgedVia = {}, i.NextDueAt = {reminder_at}, i.NextRound = NULL, \
             i.NextStep = NULL, i.EndedAt = NULL",
            batch.bind(Param::Text(Some(actor.to_owned()))),
            batch.bind(Param::Text(Some(ack.means.as_str().to_owned()))),
        );
        batch.update(&set, 1);
        sql::escalation::end_pages(
            &mut batch,
            Status::Acknowledged.as_str(),
            ACKNOWLEDGED_ENTRY,
            actor,
        );
        let mut rest = STOPPED_REST.to_owned();
        {
            let priority = Priority::from_rank(i64::from(state.priority))
                .ok_or_else(|| corrupt(format!("Incidents.Priority = {}", state.priority)))?;
            let mut told = Vec::with_capacity(reached.len());
            for list in reached {
                let notice = sources.copy(state.latest_id, list, priority, |source| {
                    source.announce_acknowledgement(id.0, ack, state.now);
                });
                match notice {
                    Ok(message) => {
                        told.push(format!("{list} ({})", message.submission.id));
                        sql::escalation::insert_message(&mut batch, &message, None);
                    }
                    Err(why) => told.push(format!("{list} (not told: {why})")),
                }
            }
            if !told.is_empty() {
                rest.push_str(&format!("; told who acknowledged it: {}", told.join(", ")));
            }
        }
        let rest = batch.bind(Param::Text(Some(rest)));
        let detail = if reminder.is_some() {
            format!(
                "CONVERT(nvarchar(12), @stopped) + {rest} + N'; reminder at ' + CONVERT(nvarchar(23), {reminder_at}, 126) + N'+00:00 unless cleared'"
            )
        } else {
            format!("CONVERT(nvarchar(12), @stopped) + {rest}")
        };
        batch.history(
            IncidentEvent::Acknowledged.as_str(),
            actor,
            Some(ack.means.as_str()),
            ack.from(),
            &detail,
        );
        return Ok((batch.finish(), AckResult::Acknowledged { stopped: 0 }));
    }
    batch.update("i.Status = i.Status", 1);
    let (event, detail, answer) = if state.status == IncidentStatus::Acknowledged {
        let by = state.by.clone().unwrap_or_default();
        let means = state
            .via
            .as_deref()
            .and_then(AckMeans::from_db)
            .ok_or_else(|| corrupt(format!("Incidents.AcknowledgedVia = {:?}", state.via)))?;
        let at = state
            .at
            .ok_or_else(|| corrupt("Incidents.AcknowledgedAt is NULL"))?;
        let detail = format!(
            "already acknowledged by {by} ({}) at {}",
            means.as_str(),
            at.to_rfc3339()
        );
        (
            IncidentEvent::AcknowledgedAgain,
            detail,
            AckResult::AlreadyAcknowledged { by, means, at },
        )
    } else {
        let at = state
            .ended_at
            .ok_or_else(|| corrupt("Incidents.EndedAt is NULL"))?;
        let detail = format!(
            "the incident had ended: {} at {}; nothing reopened",
            state.status,
            at.to_rfc3339()
        );
        (
            IncidentEvent::AcknowledgedLate,
            detail,
            AckResult::AlreadyEnded {
                status: state.status,
                at,
            },
        )
    };
    let detail = batch.bind(Param::Text(Some(detail)));
    batch.history(
        event.as_str(),
        actor,
        Some(ack.means.as_str()),
        ack.from(),
        &detail,
    );
    Ok((batch.finish(), answer))
}

/// `EscalationStore::acknowledge_condition`.
pub(super) async fn acknowledge_condition(
    store: &MsSqlStore,
    site: &str,
    key: &str,
    ack: &Acknowledgement,
) -> Result<Vec<(IncidentId, AckResult)>> {
    let stmt = sql::escalation::select_condition_incidents(site, key);
    let mut results = store
        .batch("acknowledge condition", &stmt.sql, &stmt.params)
        .await?;
    let ids = result_set(&mut results, 0, "acknowledge condition")?
        .iter()
        .map(|row| decode::req::<i64>(row, "Id"))
        .collect::<Result<Vec<_>>>()?;
    let mut answers = Vec::with_capacity(ids.len());
    for id in ids {
        let id = IncidentId(id);
        answers.push((id, acknowledge(store, id, ack).await?));
    }
    Ok(answers)
}

/// `EscalationStore::incidents`.
pub(super) async fn incidents(store: &MsSqlStore, query: &IncidentQuery) -> Result<IncidentList> {
    let stmt = sql::escalation::select_incidents(query);
    let mut results = store.batch("incidents", &stmt.sql, &stmt.params).await?;
    let limit = query.limit.max(1) as usize;
    let mut incidents = result_set(&mut results, 0, "incidents")?
        .iter()
        .map(read_incident)
        .collect::<Result<Vec<_>>>()?;
    let more = incidents.len() > limit;
    incidents.truncate(limit);
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
pub(super) async fn incident(store: &MsSqlStore, id: IncidentId) -> Result<Option<IncidentDetail>> {
    let stmt = sql::escalation::select_incident(id.0);
    let mut results = store.batch("incident", &stmt.sql, &stmt.params).await?;
    let rows = result_set(&mut results, 0, "incident")?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let incident = read_incident(row)?;
    let pages = result_set(&mut results, 1, "incident")?
        .iter()
        .map(|row| {
            Ok(IncidentPageRecord {
                page_no: decode::count(row, "PageNo")?,
                cycle: decode::count(row, "Cycle")?,
                page: PagePlace {
                    round: decode::count(row, "Round")?,
                    step: decode::count(row, "Step")?,
                },
                due_at: decode::time(row, "DueAt")?,
                fired_at: decode::time(row, "FiredAt")?,
                late_by: decode::opt::<i64>(row, "LateMs")?
                    .map(|l| Duration::from_millis(u64::try_from(l).unwrap_or(0))),
                lease_epoch: decode::req::<i64>(row, "LeaseEpoch")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let history = result_set(&mut results, 2, "incident")?
        .iter()
        .map(|row| {
            let kind = decode::text(row, "Kind")?;
            Ok(IncidentHistoryEntry {
                sequence: decode::count(row, "Sequence")?,
                at: decode::time(row, "At")?,
                event: IncidentEvent::from_db(&kind)
                    .ok_or_else(|| corrupt(format!("IncidentHistory.Kind = {kind:?}")))?,
                actor: decode::text(row, "Actor")?,
                means: decode::opt_text(row, "Means")?
                    .as_deref()
                    .and_then(AckMeans::from_db),
                from: decode::opt_text(row, "FromAddress")?,
                detail: decode::text(row, "Detail")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let messages = result_set(&mut results, 3, "incident")?
        .iter()
        .map(|row| {
            let status = decode::text(row, "Status")?;
            Ok(IncidentMessage {
                id: NotificationId::from_uuid(decode::guid(row, "NotificationId")?),
                list: decode::text(row, "ListName")?,
                page_no: opt_count(row, "IncidentPage")?,
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

/// An incident row (`sql::escalation::INCIDENT_COLUMNS`) as the admin API shows it.
fn read_incident(row: &Row) -> Result<IncidentView> {
    let next = match decode::opt_time(row, "NextDueAt")? {
        None => None,
        Some(due) => {
            let page = match (opt_count(row, "NextRound")?, opt_count(row, "NextStep")?) {
                (Some(round), Some(step)) => Some(PagePlace { round, step }),
                _ => None,
            };
            Some((page, due))
        }
    };
    let acknowledged = match (
        decode::opt_text(row, "AcknowledgedBy")?,
        decode::opt_text(row, "AcknowledgedVia")?,
        decode::opt_time(row, "AcknowledgedAt")?,
    ) {
        (Some(by), Some(via), Some(at)) => Some(IncidentAck {
            by,
            means: AckMeans::from_db(&via)
                .ok_or_else(|| corrupt(format!("Incidents.AcknowledgedVia = {via:?}")))?,
            at,
        }),
        _ => None,
    };
    let status = decode::text(row, "Status")?;
    let priority = decode::req::<i32>(row, "Priority")?;
    Ok(IncidentView {
        id: IncidentId(decode::req::<i64>(row, "Id")?),
        alarm_id: NotificationId::from_uuid(decode::guid(row, "AlarmId")?),
        latest_id: NotificationId::from_uuid(decode::guid(row, "LatestId")?),
        list: decode::text(row, "ListName")?,
        site: decode::text(row, "SourceSiteId")?,
        condition_key: decode::opt_text(row, "ConditionKey")?,
        priority: Priority::from_rank(i64::from(priority))
            .ok_or_else(|| corrupt(format!("Incidents.Priority = {priority}")))?,
        subject: decode::text(row, "Subject")?,
        status: IncidentStatus::from_db(&status)
            .ok_or_else(|| corrupt(format!("Incidents.Status = {status:?}")))?,
        opened_at: decode::time(row, "OpenedAt")?,
        page_count: decode::count(row, "PageCount")?,
        last_page: PagePlace {
            round: decode::count(row, "Round")?,
            step: decode::count(row, "Step")?,
        },
        next,
        late_pages: decode::count(row, "LatePages")?,
        acknowledged,
        ended_at: decode::opt_time(row, "EndedAt")?,
        policy: stored_policy::decode(&decode::text(row, "Policy")?)
            .map_err(StoreError::Corrupt)?,
    })
}
