//! The statements of escalation (migration 0014; the logic in `store/mssql/escalation.rs`): the
//! clock's reads and each incident's fire, acknowledgements, the incidents page, and the
//! endings a clear or a discard bring (fragments the clear's and the discard's batches append).
//!
//! Every write re-checks, in the statement that changes the incident, the state its caller read
//! (status, page count, due time) and, for the clock, that the lease is still held at its
//! epoch: a fire or an acknowledgement computed from a state another node has moved on from
//! changes nothing and says so (`Applied` 0), and the caller reads again. The page row's key
//! (incident, cycle, round, step) makes a second fire of the same page fail whatever happens.

use chrono::{DateTime, Utc};

use super::{BATCH_START, Param, Statement, at, guid, int, text};
use crate::records::{IncidentQuery, LeaseEpoch, NewNotification};

/// The clock's first read (`@P1` the lease, `@P2` its epoch, `@P3` at most this many): whether
/// the lease is held at the epoch by the database's clock (first result: `Held`, `Now`), then
/// the incidents due now, longest due first (IX_Incidents_Due), with what firing them needs.
pub(crate) fn select_due(lease: &str, epoch: LeaseEpoch, limit: u32) -> Statement {
    Statement::fixed(include_str!("select_due_incidents.sql"))
        .set("@P1", text(lease))
        .set("@P2", Param::BigInt(Some(epoch.0)))
        .set("@P3", int(limit))
}

/// When the next incident is due (`NextDue`, NULL if none), and the database's clock (`Now`).
pub(crate) const SELECT_NEXT_DUE: &str = include_str!("select_next_incident_due.sql");

/// The notifications `ids` (`@P1...`) as a page quotes them, and the channel type of the lists
/// `lists` (after them): what the caller needs to build each page message before the fire.
pub(crate) fn select_sources(ids: &[uuid::Uuid], lists: &[String]) -> Statement {
    let mut stmt = Statement::new(BATCH_START);
    let ids: Vec<String> = ids
        .iter()
        .map(|id| stmt.bind(Param::Guid(Some(*id))))
        .collect();
    let lists: Vec<String> = lists.iter().map(|l| stmt.bind(text(l))).collect();
    let none = "NULL".to_owned();
    stmt.push(&format!(
        "SELECT n.NotificationId, n.Type, n.Subject, n.Body, n.TypeData, n.SourceSiteId, \
         n.SourceInstanceId, n.SourceScript, n.OriginExecutionId, n.OriginParentExecutionId, \
         n.SiteEnqueuedAt
FROM dbo.Notifications AS n
WHERE n.NotificationId IN ({});
SELECT l.Name, l.Type FROM dbo.NotificationLists AS l WHERE l.Name IN ({});",
        if ids.is_empty() {
            none.clone()
        } else {
            ids.join(", ")
        },
        if lists.is_empty() {
            none
        } else {
            lists.join(", ")
        },
    ));
    stmt
}

/// The incident as its caller read it: the fire or acknowledgement applies only while it
/// still is so.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadState<'a> {
    pub id: i64,
    pub status: &'a str,
    pub page_count: u32,
    pub due: Option<DateTime<Utc>>,
}

/// A batch that changes one incident: `@applied` says whether its guarded UPDATE matched;
/// everything after [`IncidentBatch::then`] runs only if it did.
pub(crate) struct IncidentBatch {
    stmt: Statement,
    /// History rows to write in the guarded part, in order (`Kind`, actor, means, from, detail
    /// as placeholders, or a detail expression).
    history: Vec<String>,
    /// The guarded part.
    body: String,
    incident: String,
}

impl IncidentBatch {
    /// Starts the batch with the UPDATE of `state`'s incident (`set`: its SET list, with
    /// placeholders bound by `bind` beforehand), guarded by the state read and, when `lease`
    /// is given, by the lease still held at its epoch. `history` rows follow it.
    pub(crate) fn new(state: ReadState<'_>, lease: Option<(&str, LeaseEpoch)>) -> Self {
        let mut stmt = Statement::new(concat!(
            batch_start!(),
            declare_now!(),
            "DECLARE @applied int = 0;\nDECLARE @mark uniqueidentifier = NEWID();\nDECLARE @stopped int = 0;\n"
        ));
        let incident = stmt.bind(Param::BigInt(Some(state.id)));
        let mut guard = format!("i.Id = {incident}");
        let status = stmt.bind(text(state.status));
        guard.push_str(&format!(" AND i.Status = {status}"));
        let pages = stmt.bind(int(state.page_count));
        guard.push_str(&format!(" AND i.PageCount = {pages}"));
        match state.due {
            Some(due) => {
                let due = stmt.bind(at(due));
                guard.push_str(&format!(" AND i.NextDueAt = {due}"));
            }
            None => guard.push_str(" AND i.NextDueAt IS NULL"),
        }
        if let Some((lease, epoch)) = lease {
            let lease = stmt.bind(text(lease));
            let epoch = stmt.bind(Param::BigInt(Some(epoch.0)));
            guard.push_str(&format!(
                "\n  AND EXISTS (SELECT 1 FROM dbo.Leases AS l WHERE l.Name = {lease} AND l.Epoch = {epoch} AND l.ExpiresAt > @now)"
            ));
        }
        stmt.push("BEGIN TRANSACTION;\n");
        // The SET list comes in `update`; the guard is kept for it.
        Self {
            stmt,
            history: Vec::new(),
            body: guard,
            incident,
        }
    }

    /// Binds a value for the statements of this batch.
    pub(crate) fn bind(&mut self, value: Param) -> String {
        self.stmt.bind(value)
    }

    /// The incident's id placeholder.
    pub(crate) fn incident(&self) -> &str {
        &self.incident
    }

    /// The guarded UPDATE's SET list (without the history count, which this adds); call once,
    /// before [`Self::then`].
    pub(crate) fn update(&mut self, set: &str, history_rows: usize) {
        let guard = std::mem::take(&mut self.body);
        self.stmt.push(&format!(
            "UPDATE i\nSET {set}, i.HistoryCount = i.HistoryCount + {history_rows}\nFROM dbo.Incidents AS i\nWHERE {guard};\nSET @applied = @@ROWCOUNT;\nIF @applied = 1\nBEGIN\n"
        ));
    }

    /// A statement of the guarded part.
    pub(crate) fn then(&mut self, statement: &str) {
        self.stmt.push(statement);
    }

    /// A history row of the guarded part (numbered in the order added, after the count the
    /// incident had): `detail` is a T-SQL expression (a placeholder, or one built around
    /// `@stopped`).
    pub(crate) fn history(
        &mut self,
        kind: &str,
        actor: &str,
        means: Option<&str>,
        from: Option<&str>,
        detail: &str,
    ) {
        let kind = self.bind(text(kind));
        let actor = self.bind(text(actor));
        let means = self.bind(Param::Text(means.map(str::to_owned)));
        let from = self.bind(Param::Text(from.map(str::to_owned)));
        self.history
            .push(format!("{kind}, {actor}, {means}, {from}, {detail}"));
    }

    /// The batch: the guarded part's history rows, the commit, and the answer (`Applied`,
    /// `Stopped`).
    pub(crate) fn finish(mut self) -> Statement {
        let count = self.history.len();
        for (i, row) in self.history.iter().enumerate() {
            self.stmt.push(&format!(
                "INSERT INTO dbo.IncidentHistory (IncidentId, Sequence, At, Kind, Actor, Means, FromAddress, Detail)\nSELECT i.Id, i.HistoryCount - {}, @now, {row}\nFROM dbo.Incidents AS i WHERE i.Id = {};\n",
                count - 1 - i,
                self.incident
            ));
        }
        self.stmt.push(
            "END;\nCOMMIT TRANSACTION;\nSELECT @applied AS Applied, @stopped AS Stopped, @now AS Now;",
        );
        self.stmt
    }
}

/// Appends to `batch`'s guarded part the insert of `message`, Pending at the database's `@now`
/// with its serve turn (`domain::serve_order::serve_turn`, as dbo.SubmitNotification gives
/// it), linked to `incident` as page `page_no` when given.
pub(crate) fn insert_message(
    batch: &mut IncidentBatch,
    message: &NewNotification,
    link: Option<(&str, u32)>,
) {
    let s = &message.submission;
    let p = &s.provenance;
    let id = batch.bind(guid(s.id));
    let kind = batch.bind(text(s.content.kind.as_str()));
    let list = batch.bind(text(s.content.list_name.as_str()));
    let subject = batch.bind(text(s.content.subject.as_str()));
    let body = batch.bind(text(s.content.body.as_str()));
    let type_data = batch.bind(text(s.content.type_data.as_str()));
    let hash = batch.bind(Param::Binary(message.hash.0.to_vec()));
    let site = batch.bind(text(p.source_site_id.as_str()));
    let instance = batch.bind(text(&p.source_instance_id));
    let script = batch.bind(text(&p.source_script));
    let origin = batch.bind(Param::Guid(p.origin_execution_id));
    let parent = batch.bind(Param::Guid(p.origin_parent_execution_id));
    let enqueued = batch.bind(at(p.site_enqueued_at));
    let priority = batch.bind(Param::Int(Some(i32::from(s.priority.rank()))));
    let (incident, page) = match link {
        Some((incident, page_no)) => (incident.to_owned(), batch.bind(int(page_no))),
        None => ("NULL".to_owned(), "NULL".to_owned()),
    };
    batch.then(&format!(
        "INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, AttemptCount, Priority, ServeTurn, IncidentId, IncidentPage)
SELECT {id}, {kind}, {list}, {subject}, {body}, {type_data}, {hash}, N'Pending', {site}, {instance}, {script}, {origin}, {parent}, {enqueued}, @now, @now, 0, {priority},
    1 + CASE WHEN t.SiteLast > t.Head THEN t.SiteLast ELSE t.Head END, {incident}, {page}
FROM (
    SELECT COALESCE((
            SELECT MIN(s.ServeTurn) FROM dbo.Notifications AS s
            WHERE s.Type = {kind} AND s.Priority = {priority}
              AND s.Status IN (N'Pending', N'Retrying') AND s.Priority >= 0), 0) AS Head,
        COALESCE((
            SELECT MAX(l.ServeTurn) FROM dbo.Notifications AS l
            WHERE l.Type = {kind} AND l.Priority = {priority} AND l.SourceSiteId = {site}
              AND l.Status IN (N'Pending', N'Retrying') AND l.ServeTurn > 0), 0) AS SiteLast
) AS t;
"
    ));
}

/// Appends to `batch`'s guarded part the page row of a fire.
#[allow(clippy::too_many_arguments)]
pub(crate) fn insert_page(
    batch: &mut IncidentBatch,
    cycle: u32,
    round: u32,
    step: u32,
    page_no: u32,
    due: DateTime<Utc>,
    late_ms: Option<i64>,
    epoch: LeaseEpoch,
) {
    let incident = batch.incident().to_owned();
    let values = [
        batch.bind(int(cycle)),
        batch.bind(int(round)),
        batch.bind(int(step)),
        batch.bind(int(page_no)),
        batch.bind(at(due)),
        batch.bind(Param::BigInt(late_ms)),
        batch.bind(Param::BigInt(Some(epoch.0))),
    ];
    batch.then(&format!(
        "INSERT INTO dbo.IncidentPages (IncidentId, Cycle, Round, Step, PageNo, DueAt, FiredAt, LateMs, LeaseEpoch)\nVALUES ({incident}, {}, {}, {}, {}, {}, @now, {}, {});\n",
        values[0], values[1], values[2], values[3], values[4], values[5], values[6]
    ));
}

/// Appends to `batch`'s guarded part the end of the incident's page messages: those not handed
/// to the relay end now as `ending` (Acknowledged, Cleared, Discarded; their count in
/// `@stopped`), each with its history entry `entry` by `actor`; those being delivered are
/// marked to end so unless their attempt delivers them. The actor is cut to the 256 units of
/// the history's Actor and PendingEndBy columns (a site's acknowledgement names the site and
/// its operator, which fits unless the names are mostly outside the Basic Multilingual Plane);
/// the incident's own history keeps it whole.
pub(crate) fn end_pages(batch: &mut IncidentBatch, ending: &str, entry: &str, actor: &str) {
    let incident = batch.incident().to_owned();
    let ending = batch.bind(text(ending));
    let entry = batch.bind(text(entry));
    let actor = batch.bind(text(actor));
    batch.then(&format!(
        "UPDATE n
SET n.Status = {ending}, n.ResolvedAt = @now, n.NextAttemptAt = NULL, n.ClaimedUntil = NULL,
    n.ClaimEpoch = NULL, n.ClaimToken = @mark, n.AttemptCount = n.AttemptCount + 1
FROM dbo.Notifications AS n
WHERE n.IncidentId = {incident} AND n.IncidentPage > 1
  AND n.Status IN (N'Pending', N'Retrying', N'Held')
  AND (n.ClaimedUntil IS NULL OR n.ClaimedUntil <= @now);
SET @stopped = @@ROWCOUNT;
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT n.NotificationId, n.AttemptCount, @now, {entry}, LEFT({actor}, 256)
FROM dbo.Notifications AS n
WHERE n.IncidentId = {incident} AND n.ClaimToken = @mark AND n.Status = {ending};
UPDATE n
SET n.PendingEnd = {ending}, n.PendingEndBy = LEFT({actor}, 256)
FROM dbo.Notifications AS n
WHERE n.IncidentId = {incident} AND n.IncidentPage > 1
  AND n.Status IN (N'Pending', N'Retrying', N'Held')
  AND n.ClaimedUntil > @now;
"
    ));
}

/// The first acknowledgement of incident `state` by `actor` (`means`, from `from`), through
/// dbo.AcknowledgeIncident (migrations/mssql/procedures/AcknowledgeIncident.sql): the reminder
/// `reminder_ms` after now if given, `rest` after the stopped count in its history row. Answers
/// as [`IncidentBatch::finish`] does.
#[allow(clippy::too_many_arguments)] // The procedure's parameters, each bound by name.
pub(crate) fn acknowledge_call(
    state: ReadState<'_>,
    actor: &str,
    means: &str,
    from: Option<&str>,
    reminder_ms: Option<i64>,
    rest: &str,
) -> Statement {
    Statement::fixed(include_str!("acknowledge_incident.sql"))
        .set("@P1", Param::BigInt(Some(state.id)))
        .set("@P2", text(state.status))
        .set("@P3", int(state.page_count))
        .set("@P4", Param::Time(state.due))
        .set("@P5", text(actor))
        .set("@P6", text(means))
        .set("@P7", Param::Text(from.map(str::to_owned)))
        .set("@P8", Param::BigInt(reminder_ms))
        .set("@P9", text(rest))
}

/// The state an acknowledgement reads, with the database's clock.
pub(crate) fn select_ack_state(incident: i64) -> Statement {
    Statement::fixed(include_str!("select_incident_ack_state.sql"))
        .set("@P1", Param::BigInt(Some(incident)))
}

/// What the "acknowledged by" notice needs, read only for a policy that sends it: the lists the
/// incident reached (first result: a message of it delivered, or being delivered now), and the
/// notification it quotes with those lists' channel types (second and third).
pub(crate) fn select_reached(incident: i64) -> Statement {
    Statement::fixed(include_str!("select_incident_reached.sql"))
        .set("@P1", Param::BigInt(Some(incident)))
}

/// The incidents of site @P1's condition @P2 that are not final, on every list.
pub(crate) fn select_condition_incidents(site: &str, key: &str) -> Statement {
    Statement::fixed(include_str!("select_condition_incidents.sql"))
        .set("@P1", text(site))
        .set("@P2", text(key))
}

/// Incident @P1 (first result), its pages (second), history (third) and notifications
/// (fourth).
pub(crate) fn select_incident(incident: i64) -> Statement {
    Statement::fixed(include_str!("select_incident.sql")).set("@P1", Param::BigInt(Some(incident)))
}

/// The incidents page: newest first, in `query`'s statuses, only those with a late page if
/// asked, older than its cursor, one more than its limit (to tell whether more follow).
pub(crate) fn select_incidents(query: &IncidentQuery) -> Statement {
    let mut stmt = Statement::new(BATCH_START);
    let limit = stmt.bind(Param::BigInt(Some(i64::from(query.limit.max(1)) + 1)));
    let mut filter = String::from("WHERE 1 = 1");
    if !query.statuses.is_empty() {
        let statuses: Vec<String> = query
            .statuses
            .iter()
            .map(|s| stmt.bind(text(s.as_str())))
            .collect();
        filter.push_str(&format!(" AND i.Status IN ({})", statuses.join(", ")));
    }
    if query.late_only {
        filter.push_str(" AND i.LatePages > 0");
    }
    if let Some(before) = query.before {
        let before = stmt.bind(Param::BigInt(Some(before.0)));
        filter.push_str(&format!(" AND i.Id < {before}"));
    }
    stmt.push(&format!(
        "SELECT TOP ({limit}) {INCIDENT_COLUMNS}\nFROM dbo.Incidents AS i\n{filter}\nORDER BY i.Id DESC;"
    ));
    stmt
}

/// The columns of an incident as `escalation::StoredIncident` reads them (select_incident.sql
/// spells them out too).
const INCIDENT_COLUMNS: &str = "i.Id, i.ListName, i.SourceSiteId, i.ConditionKey, i.Priority, \
     i.AlarmId, i.LatestId, i.Subject, i.Status, i.OpenedAt, i.PageCount, i.Round, i.Step, \
     i.NextDueAt, i.NextRound, i.NextStep, i.LatePages, i.AcknowledgedBy, i.AcknowledgedVia, \
     i.AcknowledgedAt, i.EndedAt, i.Policy";

/// T-SQL that ends, as `ending` (Cleared or Discarded, by the actor in `actor`, a placeholder),
/// the incidents `selector` picks (a condition on `dbo.Incidents AS i`) that are not final,
/// with their page messages not yet sent, and writes each one's history row: appended by the
/// clear's and the discard's batches inside their transaction, after `@now` is declared.
pub(crate) fn end_incidents(selector: &str, ending: &str, actor: &str) -> String {
    let (page_entry, event, verb) = match ending {
        "Discarded" => ("OperatorDiscard", "Discarded", "its alarm was discarded"),
        _ => ("Cleared", "Cleared", "its condition was cleared"),
    };
    format!(
        "DECLARE @endMark uniqueidentifier = NEWID();
UPDATE i
SET i.Status = N'{ending}', i.EndedAt = @now, i.NextDueAt = NULL, i.NextRound = NULL,
    i.NextStep = NULL, i.HistoryCount = i.HistoryCount + 1, i.MarkToken = @endMark
FROM dbo.Incidents AS i
WHERE ({selector}) AND i.Status IN (N'Open', N'Acknowledged', N'Exhausted');
IF @@ROWCOUNT > 0
BEGIN
UPDATE n
SET n.Status = N'{ending}', n.ResolvedAt = @now, n.NextAttemptAt = NULL, n.ClaimedUntil = NULL,
    n.ClaimEpoch = NULL, n.ClaimToken = @endMark, n.AttemptCount = n.AttemptCount + 1
FROM dbo.Notifications AS n
JOIN dbo.Incidents AS i ON i.Id = n.IncidentId
WHERE i.MarkToken = @endMark AND n.IncidentPage > 1
  AND n.Status IN (N'Pending', N'Retrying', N'Held')
  AND (n.ClaimedUntil IS NULL OR n.ClaimedUntil <= @now);
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT n.NotificationId, n.AttemptCount, @now, N'{page_entry}', {actor}
FROM dbo.Notifications AS n
JOIN dbo.Incidents AS i ON i.Id = n.IncidentId
WHERE i.MarkToken = @endMark AND n.ClaimToken = @endMark AND n.Status = N'{ending}';
UPDATE n
SET n.PendingEnd = N'{ending}', n.PendingEndBy = {actor}
FROM dbo.Notifications AS n
JOIN dbo.Incidents AS i ON i.Id = n.IncidentId
WHERE i.MarkToken = @endMark AND n.IncidentPage > 1
  AND n.Status IN (N'Pending', N'Retrying', N'Held')
  AND n.ClaimedUntil > @now;
INSERT INTO dbo.IncidentHistory (IncidentId, Sequence, At, Kind, Actor, Detail)
SELECT i.Id, i.HistoryCount, @now, N'{event}', {actor},
    N'{verb}; ' + CONVERT(nvarchar(12), (
        SELECT COUNT(*) FROM dbo.Notifications AS s
        WHERE s.IncidentId = i.Id AND s.ClaimToken = @endMark AND s.Status = N'{ending}'))
    + N' page notifications not yet sent were stopped'
FROM dbo.Incidents AS i
WHERE i.MarkToken = @endMark;
UPDATE dbo.Incidents SET MarkToken = NULL WHERE MarkToken = @endMark;
END;
"
    )
}
