//! The operator side's statements: a notification's state and detail, pages of the filtered
//! table, operator actions (retry, discard) on chosen ids or on a filter, their dry-run count,
//! the KPIs and the purge of old terminal rows. The filter's conditions ([`push_filter`]) are
//! the one fragment every filtered statement shares; every value in them is bound.

use std::borrow::Cow;

use chrono::{DateTime, Utc};

use super::{BATCH_START, Param, Statement, at, guid, text};
use crate::domain::NotificationId;
use crate::domain::history::OperatorAction;
use crate::domain::query::NotificationFilter;

/// One notification's state by id (@P1).
pub(crate) fn select_state(id: NotificationId) -> Statement {
    Statement::fixed(include_str!("select_state.sql")).set("@P1", guid(id))
}

/// One notification's state and content (first result) and its history oldest first (second).
pub(crate) fn select_detail(id: NotificationId) -> Statement {
    Statement::fixed(include_str!("select_detail.sql")).set("@P1", guid(id))
}

/// Appends the filter's conditions on `dbo.Notifications AS n`, each starting with " AND ".
pub(crate) fn push_filter(filter: &NotificationFilter, stmt: &mut Statement) {
    if !filter.statuses.is_empty() {
        stmt.push("\n  AND n.Status IN (");
        for (i, status) in filter.statuses.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            stmt.push_bound(sep, Param::Text(Some(status.as_str().into())), "");
        }
        stmt.push(")");
    }
    if let Some(kind) = filter.kind {
        stmt.push_bound(
            "\n  AND n.Type = ",
            Param::Text(Some(kind.as_str().into())),
            "",
        );
    }
    if !filter.priorities.is_empty() {
        stmt.push("\n  AND n.Priority IN (");
        for (i, priority) in filter.priorities.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            stmt.push_bound(sep, Param::Int(Some(i32::from(priority.rank()))), "");
        }
        stmt.push(")");
    }
    if let Some(key) = &filter.condition_key {
        stmt.push_bound(
            "\n  AND n.ConditionKey = ",
            Param::Text(Some(key.clone())),
            "",
        );
    }
    if let Some(site) = &filter.source_site_id {
        stmt.push_bound(
            "\n  AND n.SourceSiteId = ",
            Param::Text(Some(site.clone())),
            "",
        );
    }
    if let Some(list) = &filter.list_name {
        stmt.push_bound("\n  AND n.ListName = ", Param::Text(Some(list.clone())), "");
    }
    if let Some(from) = filter.created_from {
        stmt.push_bound("\n  AND n.CreatedAt >= ", at(from), "");
    }
    if let Some(to) = filter.created_to {
        stmt.push_bound("\n  AND n.CreatedAt < ", at(to), "");
    }
    if let Some(cutoff) = filter.stuck_before {
        // Held rows by their due time (their window's end), the others by their age, a
        // scheduled one's from its time; see `kpis`.
        stmt.push_bound(
            "\n  AND ((n.Status IN (N'Pending', N'Retrying') AND n.CreatedAt < ",
            at(cutoff),
            "",
        );
        stmt.push_bound(
            " AND (n.DeliverAfter IS NULL OR n.DeliverAfter < ",
            at(cutoff),
            "))",
        );
        stmt.push_bound(
            " OR (n.Status = N'Held' AND (n.NextAttemptAt IS NULL OR n.NextAttemptAt < ",
            at(cutoff),
            ")))",
        );
    }
    if let Some(now) = filter.scheduled_after {
        stmt.push_bound(
            "\n  AND n.Status = N'Pending' AND n.DeliverAfter > ",
            at(now),
            "",
        );
    }
    if let Some(before) = filter.resolved_before {
        stmt.push_bound("\n  AND n.ResolvedAt < ", at(before), "");
    }
    // A substring test, not LIKE: the keyword's %, _ and [ need no escaping, and lower-casing
    // both sides makes it case-insensitive whatever the column's collation. An empty keyword
    // matches everything, as LIKE '%%' would.
    if let Some(keyword) = filter.subject_contains.as_ref().filter(|k| !k.is_empty()) {
        stmt.push_bound(
            "\n  AND CHARINDEX(LOWER(",
            Param::Text(Some(keyword.clone())),
            "), LOWER(n.Subject)) > 0",
        );
    }
}

/// A page of the filtered table, newest first: the rows strictly after `after` in
/// (CreatedAt DESC, Id DESC) order, at most `limit` of them.
pub(crate) fn query(
    filter: &NotificationFilter,
    after: Option<(DateTime<Utc>, i64)>,
    limit: i64,
) -> Statement {
    let mut stmt = Statement::new(BATCH_START);
    let top = stmt.bind(Param::BigInt(Some(limit)));
    stmt.push(&format!(
        "SELECT TOP ({top}) {}\nFROM dbo.Notifications AS n\nWHERE 1 = 1",
        state_columns!()
    ));
    push_filter(filter, &mut stmt);
    if let Some((created_at, row_id)) = after {
        // Spelled out rather than as a row value, which T-SQL lacks.
        let c = stmt.bind(at(created_at));
        let i = stmt.bind(Param::BigInt(Some(row_id)));
        stmt.push(&format!(
            "\n  AND (n.CreatedAt < {c} OR (n.CreatedAt = {c} AND n.Id < {i}))"
        ));
    }
    stmt.push("\nORDER BY n.CreatedAt DESC, n.Id DESC;");
    stmt
}

/// The UPDATE of an operator action on the Parked rows in `@targets` (limited to those with
/// `Ord <= @limit` when `limit` is given), recording each changed row's next history number in
/// `@changed`. Retry resets the delivery facts; Discard resolves the row and keeps them, and
/// ends the incident of a discarded alarm.
fn action_update(retry: bool, limit: Option<&str>) -> String {
    let set = if retry {
        "SET n.Status = N'Pending', n.RetryCount = 0, n.NextAttemptAt = SYSUTCDATETIME(), \
         n.LastError = NULL, \
         n.ResolvedAt = NULL, n.ClaimedUntil = NULL, n.ClaimEpoch = NULL, \
         n.AttemptCount = n.AttemptCount + 1"
    } else {
        "SET n.Status = N'Discarded', n.ResolvedAt = @now, n.ClaimedUntil = NULL, \
         n.ClaimEpoch = NULL, n.AttemptCount = n.AttemptCount + 1"
    };
    let limit = limit
        .map(|l| format!(" AND t.Ord <= {l}"))
        .unwrap_or_default();
    // A discarded alarm (or joined notification) ends its incident.
    let ends = if retry {
        String::new()
    } else {
        super::escalation::end_incidents(
            "i.Id IN (SELECT n.IncidentId FROM dbo.Notifications AS n \
             JOIN @changed AS c ON c.NotificationId = n.NotificationId \
             WHERE n.IncidentId IS NOT NULL AND (n.IncidentPage IS NULL OR n.IncidentPage = 1))",
            "Discarded",
            "@P2",
        )
    };
    format!(
        "UPDATE n
{set}
OUTPUT inserted.NotificationId, inserted.AttemptCount INTO @changed
FROM dbo.Notifications AS n
JOIN @targets AS t ON t.NotificationId = n.NotificationId
WHERE n.Status = N'Parked'{limit};
INSERT INTO dbo.NotificationAttempts (NotificationId, AttemptNo, StartedAt, Outcome, Actor)
SELECT c.NotificationId, c.AttemptCount, @now, @P1, @P2
FROM @changed AS c;
{ends}"
    )
}

const ACTION_TABLES: &str = "\
DECLARE @targets TABLE (Ord bigint NOT NULL PRIMARY KEY, NotificationId uniqueidentifier NOT NULL);
DECLARE @changed TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY, AttemptCount int NOT NULL);
";

/// Applies an operator action (@P1: history outcome, @P2: actor) to `ids` distinct ids (@P3...)
/// in one transaction, then returns one row per id in order: whether it changed, and its state
/// now (all NULL if there is no such notification).
pub(crate) fn act_on_ids(action: OperatorAction, ids: usize) -> String {
    let retry = action == OperatorAction::Retry;
    let values: Vec<String> = (0..ids)
        .map(|i| format!("({}, @P{})", i + 1, i + 3))
        .collect();
    format!(
        "{}{}{ACTION_TABLES}INSERT INTO @targets (Ord, NotificationId) VALUES {};
BEGIN TRANSACTION;
{}COMMIT TRANSACTION;
SELECT t.Ord, CASE WHEN c.NotificationId IS NULL THEN 0 ELSE 1 END AS Changed, {}
FROM @targets AS t
LEFT JOIN @changed AS c ON c.NotificationId = t.NotificationId
LEFT JOIN dbo.Notifications AS n ON n.NotificationId = t.NotificationId
ORDER BY t.Ord;",
        BATCH_START,
        declare_now!(),
        values.join(", "),
        action_update(retry, None),
        state_columns!()
    )
}

/// [`act_on_ids`] for these distinct `ids`, recorded as done by `actor`.
pub(crate) fn act_on_these(
    action: OperatorAction,
    actor: &str,
    ids: &[NotificationId],
) -> Statement {
    let mut stmt = Statement {
        sql: Cow::Owned(act_on_ids(action, ids.len())),
        params: Vec::new(),
    }
    .set("@P1", text(action.as_str()))
    .set("@P2", text(actor));
    stmt.params.extend(ids.iter().copied().map(guid));
    stmt
}

/// Applies an operator action (recorded as done by `actor`) to the oldest `limit` Parked rows
/// matching `filter`, in one transaction. The oldest `limit + 1` matches are locked first
/// (UPDLOCK: an operator acting on the same rows waits), so the second result (how many
/// matched, at most `limit + 1`) tells whether more remain; the first lists the changed ids,
/// oldest first.
pub(crate) fn act_on_filter(
    action: OperatorAction,
    actor: &str,
    filter: &NotificationFilter,
    limit: i64,
) -> Statement {
    let retry = action == OperatorAction::Retry;
    let mut stmt = Statement::new(concat!(batch_start!(), declare_now!()));
    stmt.bind(Param::Text(Some(action.as_str().into())));
    stmt.bind(Param::Text(Some(actor.into())));
    let probe = stmt.bind(Param::BigInt(Some(limit.saturating_add(1))));
    let limit = stmt.bind(Param::BigInt(Some(limit)));
    stmt.push(ACTION_TABLES);
    stmt.push(&format!(
        "BEGIN TRANSACTION;
INSERT INTO @targets (Ord, NotificationId)
SELECT TOP ({probe}) ROW_NUMBER() OVER (ORDER BY n.CreatedAt, n.Id) AS Ord, n.NotificationId
FROM dbo.Notifications AS n WITH (UPDLOCK, ROWLOCK)
WHERE 1 = 1"
    ));
    push_filter(filter, &mut stmt);
    stmt.push("\nORDER BY n.CreatedAt, n.Id;\n");
    stmt.push(&action_update(retry, Some(&limit)));
    stmt.push(
        "COMMIT TRANSACTION;
SELECT c.NotificationId
FROM @changed AS c
JOIN @targets AS t ON t.NotificationId = c.NotificationId
ORDER BY t.Ord;
SELECT COUNT_BIG(*) AS Matching FROM @targets;",
    );
    stmt
}

/// How many rows matching `filter` there are, counted up to `limit + 1` (so the count stops
/// early on a huge table and still tells whether more than `limit` match). A plain read: a dry
/// run locks nothing, so the later action may find a few rows more or fewer.
pub(crate) fn count_on_filter(filter: &NotificationFilter, limit: i64) -> Statement {
    let mut stmt = Statement::new(BATCH_START);
    let probe = stmt.bind(Param::BigInt(Some(limit.saturating_add(1))));
    stmt.push(&format!(
        "SELECT COUNT_BIG(*) AS Matching FROM (\nSELECT TOP ({probe}) n.Id\nFROM dbo.Notifications AS n\nWHERE 1 = 1"
    ));
    push_filter(filter, &mut stmt);
    stmt.push("\n) AS m;");
    stmt
}

/// One pass over the live, parked and recently delivered rows, per site. @P1: now,
/// @P2: created before this is stuck, @P3: delivered since. Held rows are in the queue depth and
/// wait (for their window's end, or their retry time) like retries; one still Held a stuck
/// threshold after that due time (@P2 compared with NextAttemptAt) is stuck, and from its due
/// time on it counts as due: a digest that cannot go out is seen. A scheduled row (DeliverAfter)
/// waiting for its time is in the queue depth only; from its time on its ages count from then,
/// not from its arrival (`domain::schedule`, rule 5).
pub(crate) fn kpis(
    now: DateTime<Utc>,
    stuck_before: DateTime<Utc>,
    delivered_since: DateTime<Utc>,
) -> Statement {
    Statement::fixed(include_str!("kpis.sql"))
        .set("@P1", at(now))
        .set("@P2", at(stuck_before))
        .set("@P3", at(delivered_since))
}

/// Deletes up to @P2 terminal rows (Delivered, Parked, Discarded, Superseded, Cleared,
/// Acknowledged) resolved before @P1, oldest first, and their history, and up to @P2 incidents
/// that ended (or were acknowledged, with no reminder due) before @P1 with their pages and
/// history, in one transaction. The DELETE re-checks the condition (an operator may have
/// retried a row since it was picked). Result: rows, history entries and incidents deleted.
pub(crate) fn purge_terminal(resolved_before: DateTime<Utc>, batch: u32) -> Statement {
    Statement::fixed(include_str!("purge_terminal.sql"))
        .set("@P1", at(resolved_before))
        .set("@P2", Param::BigInt(Some(i64::from(batch))))
}
