-- Escalation until someone answers (issue 35; rules in central's domain::escalation): a list's
-- policy, the incidents its alarms open, each page an incident fires, and every step of an
-- incident's life as a history row. Timers are rows (Incidents.NextDueAt), never memory, so a
-- leader change or a restart loses no page and fires none twice (IncidentPages' key).

-- The list's policy as JSON (store/stored_policy.rs); NULL: its alarms do not escalate.
ALTER TABLE NotificationLists ADD COLUMN Escalation TEXT;

CREATE TABLE Incidents (
    -- The incident's number, as operators see and type it.
    Id              INTEGER PRIMARY KEY,
    -- The list, site and condition of the alarm that opened it: a keyed alarm of the same
    -- three joins it while it is not final.
    ListName        TEXT    NOT NULL,
    SourceSiteId    TEXT    NOT NULL,
    ConditionKey    TEXT,
    Priority        INTEGER NOT NULL,
    -- The notification that opened it, and the latest of its condition (the state every later
    -- page quotes: a joined, newer notification replaces it).
    AlarmId         TEXT    NOT NULL,
    LatestId        TEXT    NOT NULL,
    Subject         TEXT    NOT NULL,
    -- The policy as it was when the incident opened (JSON, as NotificationLists.Escalation):
    -- an edit of the list's policy applies to incidents opened after it.
    Policy          TEXT    NOT NULL,
    EscalateOnPark  INTEGER NOT NULL,
    -- Open, Acknowledged, Exhausted, Cleared, Discarded (domain::escalation::IncidentStatus).
    Status          TEXT    NOT NULL,
    OpenedAt        INTEGER NOT NULL,
    -- The last page fired: its number (1 is the alarm), cycle (reminders so far), round, step.
    PageCount       INTEGER NOT NULL DEFAULT 1,
    Cycle           INTEGER NOT NULL DEFAULT 0,
    Round           INTEGER NOT NULL DEFAULT 0,
    Step            INTEGER NOT NULL DEFAULT 1,
    -- What is due next, and when: Open, the page (NextRound, NextStep) or, with both NULL,
    -- exhaustion; Acknowledged, the reminder. NULL otherwise.
    NextDueAt       INTEGER,
    NextRound       INTEGER,
    NextStep        INTEGER,
    -- Pages that fired LATE_AFTER or more after their due time (the console's "late").
    LatePages       INTEGER NOT NULL DEFAULT 0,
    AcknowledgedAt  INTEGER,
    AcknowledgedBy  TEXT,
    AcknowledgedVia TEXT,
    -- When it became Exhausted, Cleared or Discarded.
    EndedAt         INTEGER,
    -- Numbers IncidentHistory rows: 1, 2, 3, ...
    HistoryCount    INTEGER NOT NULL DEFAULT 0
);

-- The escalation clock: what is due next, over the incidents that wait for something.
CREATE INDEX IX_Incidents_Due ON Incidents (NextDueAt) WHERE NextDueAt IS NOT NULL;
-- At most one incident per condition is not final: the one a keyed alarm joins.
CREATE UNIQUE INDEX UX_Incidents_Condition ON Incidents (SourceSiteId, ConditionKey, ListName)
    WHERE ConditionKey IS NOT NULL AND Status IN ('Open', 'Acknowledged', 'Exhausted');
-- A site's acknowledgement or clear finds the incidents of its condition on every list.
CREATE INDEX IX_Incidents_Site_Condition ON Incidents (SourceSiteId, ConditionKey)
    WHERE ConditionKey IS NOT NULL AND Status IN ('Open', 'Acknowledged', 'Exhausted');
-- The incidents page, newest first.
CREATE INDEX IX_Incidents_Opened ON Incidents (OpenedAt DESC, Id DESC);

-- One row per page an incident fired. The key is the incident, cycle, round and step: the
-- same page can never be written twice, whichever node fires it.
CREATE TABLE IncidentPages (
    IncidentId INTEGER NOT NULL,
    Cycle      INTEGER NOT NULL,
    Round      INTEGER NOT NULL,
    Step       INTEGER NOT NULL,
    PageNo     INTEGER NOT NULL,
    DueAt      INTEGER NOT NULL,
    FiredAt    INTEGER NOT NULL,
    -- How late it fired, when LATE_AFTER or more; NULL on time.
    LateMs     INTEGER,
    -- The dispatcher lease epoch it fired under (0: the alarm, stored by ingest).
    LeaseEpoch INTEGER NOT NULL,
    PRIMARY KEY (IncidentId, Cycle, Round, Step)
) WITHOUT ROWID;
CREATE UNIQUE INDEX UX_IncidentPages_PageNo ON IncidentPages (IncidentId, PageNo);

CREATE TABLE IncidentHistory (
    IncidentId  INTEGER NOT NULL,
    Sequence    INTEGER NOT NULL,
    At          INTEGER NOT NULL,
    -- domain::escalation::IncidentEvent
    Kind        TEXT    NOT NULL,
    -- Who: an operator, a link's recipient, a site, or 'dispatcher'.
    Actor       TEXT    NOT NULL,
    -- How an acknowledgement came (link, console, api, site); NULL for the rest.
    Means       TEXT,
    -- The address an acknowledgement came from, where there is one.
    FromAddress TEXT,
    Detail      TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (IncidentId, Sequence)
) WITHOUT ROWID;

-- Each notification of an incident: the alarm (page 1), a joined notification of its condition
-- (IncidentPage NULL), or a page's message to one list (IncidentPage 2, 3, ...). An
-- acknowledgement ends the page messages not yet handed to the relay.
ALTER TABLE Notifications ADD COLUMN IncidentId INTEGER;
ALTER TABLE Notifications ADD COLUMN IncidentPage INTEGER;
CREATE INDEX IX_Notifications_Incident ON Notifications (IncidentId, IncidentPage)
    WHERE IncidentId IS NOT NULL;
