//! The submit side's statements: storing a batch of submitted rows (one INSERT of many plain
//! rows, calls of the submit procedure in batch order, or a mix of both, each built for its row
//! count), the single-row submit, the content hash read after a duplicate key, and the
//! condition keys' clear. Every submit answers each row's stored content hash and whether it
//! was inserted; none is an upsert.

use std::borrow::Cow;
use std::collections::HashSet;

use super::{BATCH_START, Param, Statement, at, guid, text};
use crate::domain::history::{Actor, site_actor};
use crate::domain::{ConditionKey, NotificationId, SiteId};
use crate::records::NewNotification;

/// The columns of one row of [`insert_batch`] (a plain row: no condition key, not cleared at the
/// site), in the order it binds them.
pub(crate) const SUBMIT_COLUMNS: usize = 14;

/// The parameters of a row with a condition key, cleared at the site or scheduled, as the submit
/// procedure takes them ([`SUBMIT_ONE_KEYED`], and such a row of [`insert_in_order`]): a plain
/// row's [`SUBMIT_COLUMNS`], then its condition key, when the site cleared it and who did, and
/// when it is to be delivered. A plain row's call leaves those four out (they default to NULL):
/// on Babelfish, three more parameters cost a single-row submit ~3%.
pub(crate) const SUBMIT_PARAMS: usize = 18;

/// Whether `new` goes in the INSERT of many rows ([`insert_batch`]): it has no condition key
/// (it supersedes nothing), was not cleared at the site (it is stored Pending, with no
/// history entry) and is not scheduled (it is due now: only the procedure stores a
/// `deliver_after`, and decides on the database's clock whether it is still ahead).
fn is_plain(new: &NewNotification) -> bool {
    let s = &new.submission;
    s.condition_key.is_none() && s.cleared_at_site.is_none() && s.deliver_after.is_none()
}

/// One submitted row's values, in the order of the VALUES columns of [`insert_batch`]
/// (NotificationId ... SiteEnqueuedAt, Priority).
fn submitted_row(new: &NewNotification) -> [Param; SUBMIT_COLUMNS] {
    let s = &new.submission;
    let p = &s.provenance;
    [
        guid(s.id),
        text(s.content.kind.as_str()),
        text(s.content.list_name.as_str()),
        text(s.content.subject.as_str()),
        text(s.content.body.as_str()),
        text(s.content.type_data.as_str()),
        Param::Binary(new.hash.0.to_vec()),
        text(p.source_site_id.as_str()),
        text(&p.source_instance_id),
        text(&p.source_script),
        Param::Guid(p.origin_execution_id),
        Param::Guid(p.origin_parent_execution_id),
        at(p.site_enqueued_at),
        Param::Int(Some(i32::from(s.priority.rank()))),
    ]
}

/// One submitted row's values as the submit procedure takes them: [`submitted_row`], then the
/// condition key, when the site cleared the row and the history's actor for that (the site, as
/// `domain::history::site_actor` names it), and its `deliver_after`, each NULL when not set.
fn submit_params(new: &NewNotification) -> impl Iterator<Item = Param> {
    let s = &new.submission;
    let cleared_by = s.cleared_at_site.map(|_| {
        site_actor(s.provenance.source_site_id.as_str())
            .as_str()
            .to_owned()
    });
    submitted_row(new).into_iter().chain([
        Param::Text(s.condition_key.as_ref().map(|k| k.as_str().to_owned())),
        Param::Time(s.cleared_at_site),
        Param::Text(cleared_by),
        Param::Time(s.deliver_after),
    ])
}

/// A row's values as every ingest statement binds them: a plain row's [`SUBMIT_COLUMNS`], a
/// keyed or cleared one's [`SUBMIT_PARAMS`].
fn row_params(new: &NewNotification) -> Vec<Param> {
    if is_plain(new) {
        submitted_row(new).into()
    } else {
        submit_params(new).collect()
    }
}

/// The statement that stores `rows` (distinct ids, each with its [`row_params`]): a single row
/// through [`SUBMIT_ONE`] or [`SUBMIT_ONE_KEYED`], plain rows ([`is_plain`]) of lists not in
/// `consolidating` through [`insert_batch`], and rows among which one has a condition key, was
/// cleared at the site or is for a list in `consolidating` through [`insert_in_order`]. Each
/// answers every row's stored content hash and whether it inserted it, unless a list of a row
/// it would store in an INSERT of many rows consolidates after all: then it stores nothing and
/// answers only those lists (see [`consolidation_guard`]).
///
/// The procedure counts a row as an arrival of its list's window and holds it if it is over the
/// threshold (migrations/mssql/procedures/SubmitNotification.sql); the INSERT of many rows does
/// not, so a row of a list that consolidates goes through the procedure, in batch order, as a keyed
/// row does.
pub(crate) fn insert_rows(rows: &[&NewNotification], consolidating: &HashSet<String>) -> Statement {
    if let [one] = rows {
        return submit_one(one);
    }
    let plain: Vec<bool> = rows.iter().map(|new| is_plain(new)).collect();
    let insertable: Vec<bool> = rows
        .iter()
        .zip(&plain)
        .map(|(new, &plain)| {
            plain && !consolidating.contains(new.submission.content.list_name.as_str())
        })
        .collect();
    let all_in_one = insertable.iter().all(|&i| i);
    let in_insert = if all_in_one {
        insertable.clone()
    } else {
        in_order_layout(&insertable)
    };
    // The lists of the rows an INSERT stores, each once, for the guard.
    let mut lists: Vec<&str> = Vec::new();
    for (new, _) in rows.iter().zip(&in_insert).filter(|(_, i)| **i) {
        let list = new.submission.content.list_name.as_str();
        if !lists.contains(&list) {
            lists.push(list);
        }
    }
    let sql = if all_in_one {
        insert_batch(rows.len(), lists.len())
    } else {
        insert_in_order(&plain, &insertable, lists.len())
    };
    let mut params: Vec<Param> = rows.iter().flat_map(|new| row_params(new)).collect();
    params.extend(lists.into_iter().map(text));
    Statement {
        sql: Cow::Owned(sql),
        params,
    }
}

/// Plain rows in a row from which [`insert_in_order`] stores them with one [`insert_plain`]
/// rather than one procedure call each. On Babelfish, which parses every statement of a batch
/// on every call, the INSERT's long text costs about as much as twenty calls: 100 rows with a
/// keyed one in every ten took 103 ms with their runs of nine in INSERTs and 76 ms all as
/// calls; with a keyed one in every 25, 68 - 75 ms against 75 - 77 ms (measured while a plain
/// row's call still passed all [`SUBMIT_PARAMS`]; 100 plain rows in one INSERT: 55 ms).
pub(super) const MIN_INSERT_RUN: usize = 20;

/// How [`insert_in_order`] stores each of a batch's rows, given which may go in an INSERT of
/// many rows (plain, [`is_plain`], and of a list not known to consolidate): `true` in the
/// INSERT of its run of such rows (one of at least [`MIN_INSERT_RUN`]), `false` through the
/// submit procedure.
pub(super) fn in_order_layout(insertable: &[bool]) -> Vec<bool> {
    let mut in_insert = vec![false; insertable.len()];
    let mut start = 0;
    while start < insertable.len() {
        let run = insertable[start..].iter().take_while(|&&p| p).count();
        if run >= MIN_INSERT_RUN {
            in_insert[start..start + run].fill(true);
        }
        start += run.max(1);
    }
    in_insert
}

/// The two reads of a new row's serve turn (`domain::serve_order::serve_turn`) for type `$type`,
/// priority `$priority` and site `$site` (column references or placeholders), as the columns `Head`
/// (the smallest turn waiting at that type and priority, in flight or not: the first entry of
/// IX_Notifications_Serve there, whose filter `Priority >= 0` the read states to use it) and
/// `SiteLast` (the newest turn the site has waiting there: the last entry of
/// IX_Notifications_Site_Turn, which leaves turn 0 out, changing no turn), each NULL when nothing
/// waits. Each is one seek (the indexes of migrations/mssql/0005_serve_order.sql). No hint or
/// stricter isolation serialises two submits at once: both may read the same turns and store the
/// same turn, a tie the claim gives to the older row (Id), as the rule does for rows stored
/// together.
macro_rules! serve_turn_reads {
    ($type:literal, $priority:literal, $site:literal) => {
        concat!(
            "(SELECT MIN(s.ServeTurn)
        FROM dbo.Notifications AS s
        WHERE s.Type = ",
            $type,
            " AND s.Priority = ",
            $priority,
            "
          AND s.Status IN (N'Pending', N'Retrying') AND s.Priority >= 0) AS Head,
        (SELECT MAX(l.ServeTurn)
        FROM dbo.Notifications AS l
        WHERE l.Type = ",
            $type,
            " AND l.Priority = ",
            $priority,
            " AND l.SourceSiteId = ",
            $site,
            "
          AND l.Status IN (N'Pending', N'Retrying') AND l.ServeTurn > 0) AS SiteLast"
        )
    };
}

/// The column of [`consolidation_guard`]'s answer.
pub(crate) const CONSOLIDATING_LIST: &str = "ConsolidatingList";

/// The start of a batch that stores rows in an INSERT of many rows ([`insert_plain`]), which
/// neither counts nor holds a row of a list that consolidates; their lists, each once, are
/// bound after every row's values, from placeholder `@P{first}` on (`lists` of them). If one of
/// those lists consolidates (the caller did not know, or it does since), the batch stores
/// nothing and answers those lists (column [`CONSOLIDATING_LIST`]), and the caller sends the
/// rows again with those lists' rows through the procedure. A list with an escalation policy
/// is answered too: only the procedure opens and joins incidents. Otherwise its answer is empty, and
/// the batch goes on. One seek per list in the same round trip, rather than a round trip to read
/// the lists' settings first: a batch of lists that do not consolidate costs about what it did
/// (100 plain rows of one list on Babelfish: 47.6 ms against 47.1 ms without the guard, median
/// of 55; naming each row's list placeholder instead, 100 of them, cost 9 ms of parsing).
fn consolidation_guard(first: usize, lists: usize) -> String {
    let lists: Vec<String> = (first..first + lists).map(|p| format!("@P{p}")).collect();
    format!(
        "SELECT l.Name AS {CONSOLIDATING_LIST}
FROM dbo.NotificationLists AS l
WHERE (l.ConsolidateThreshold IS NOT NULL OR l.Escalation IS NOT NULL) AND l.Name IN ({});
IF @@ROWCOUNT > 0 RETURN;
",
        lists.join(", ")
    )
}

/// The ids the INSERTs of plain rows ([`insert_plain`]) stored, for the answer.
const INSERTED_TABLE: &str =
    "DECLARE @inserted TABLE (NotificationId uniqueidentifier NOT NULL PRIMARY KEY);\n";

/// Inserts every row whose id is not stored yet, then reports for each id in the batch its
/// stored content hash and whether this batch inserted it. Not an upsert: a row that exists is
/// left as it is. Two batches inserting the same new id at once make one of them fail with
/// 2627/2601; the caller then stores its rows one by one with [`SUBMIT_ONE`]. Plain rows only
/// ([`is_plain`]), of lists that do not consolidate ([`consolidation_guard`] first); see
/// [`insert_plain`] for how each row gets its serve turn. The rows' `lists` distinct lists
/// follow their values.
pub(crate) fn insert_batch(rows: usize, lists: usize) -> String {
    let firsts: Vec<usize> = (0..rows).map(|row| row * SUBMIT_COLUMNS + 1).collect();
    format!(
        "{}{}{}{INSERTED_TABLE}{}{}",
        BATCH_START,
        consolidation_guard(rows * SUBMIT_COLUMNS + 1, lists),
        declare_now!(),
        insert_plain(&firsts),
        plain_answers(&firsts)
    )
}

/// The INSERT of the plain rows whose values start at the placeholders `firsts` (each row's
/// [`SUBMIT_COLUMNS`] in a row), in that order, recording the ids it stored in `@inserted`; it
/// needs `@now` and `@inserted` declared before it.
///
/// Each new row gets its serve turn as if the rows were stored one after another in batch order
/// (as the SQLite backend stores them): a site's rows at one type and priority take consecutive
/// turns (ROW_NUMBER in batch order, `Ord`) from one past the later of the head turn and the
/// site's newest waiting turn ([`serve_turn_reads`], read once before the INSERT). When nothing
/// waited at that type and priority, the batch's first row there starts the turns at 1, and
/// the head it leaves is then 1 for every other site of the batch, which starts at 2. Only the
/// rows inserted count (the window functions run after NOT EXISTS). Sites are told apart by the
/// column's binary collation, not the default one: "North" and "north" are two sites. Plain rows
/// supersede nothing, so the turns read once are those each row would read in its turn.
///
/// The rows reach the INSERT in batch order, so that their Ids (which break ties between equal
/// turns and equal due times) follow it as they do on SQLite: the window functions leave them
/// sorted by group, and the TOP of all of them ORDER BY Ord sorts them back (checked on
/// Babelfish; SQL Server numbers the rows as the sorted TOP hands them over, though it documents
/// that order only for an ORDER BY on the INSERT's own SELECT). That ORDER BY is not used:
/// Babelfish 4.4 rejects it next to OUTPUT ("syntax error at or near ORDER").
fn insert_plain(firsts: &[usize]) -> String {
    let values: Vec<String> = firsts
        .iter()
        .enumerate()
        .map(|(ord, &first)| {
            let placeholders: Vec<String> = (first..first + SUBMIT_COLUMNS)
                .map(|i| format!("@P{i}"))
                .collect();
            format!("({}, {})", ord + 1, placeholders.join(", "))
        })
        .collect();
    format!(
        "INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, Status, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, CreatedAt, NextAttemptAt, Priority, ServeTurn)
OUTPUT inserted.NotificationId INTO @inserted
SELECT w.NotificationId, w.Type, w.ListName, w.Subject, w.Body, w.TypeData, w.ContentHash, N'Pending', w.SourceSiteId, w.SourceInstanceId, w.SourceScript, w.OriginExecutionId, w.OriginParentExecutionId, w.SiteEnqueuedAt, @now, @now, w.Priority, w.ServeTurn
FROM (
    SELECT TOP ({}) g.Ord, g.NotificationId, g.Type, g.ListName, g.Subject, g.Body, g.TypeData, g.ContentHash, g.SourceSiteId, g.SourceInstanceId, g.SourceScript, g.OriginExecutionId, g.OriginParentExecutionId, g.SiteEnqueuedAt, g.Priority,
        CASE WHEN g.Head IS NULL AND g.SiteLast IS NULL THEN CASE WHEN g.SiteFirst = g.GroupFirst THEN 0 ELSE 1 END
            WHEN COALESCE(g.SiteLast, 0) > COALESCE(g.Head, 0) THEN g.SiteLast
            ELSE COALESCE(g.Head, 0) END
        + ROW_NUMBER() OVER (PARTITION BY g.Type, g.Priority, g.SourceSiteId COLLATE Latin1_General_BIN2 ORDER BY g.Ord) AS ServeTurn
    FROM (
        SELECT v.Ord, v.NotificationId, v.Type, v.ListName, v.Subject, v.Body, v.TypeData, v.ContentHash, v.SourceSiteId, v.SourceInstanceId, v.SourceScript, v.OriginExecutionId, v.OriginParentExecutionId, v.SiteEnqueuedAt, v.Priority,
            {},
            MIN(v.Ord) OVER (PARTITION BY v.Type, v.Priority) AS GroupFirst,
            MIN(v.Ord) OVER (PARTITION BY v.Type, v.Priority, v.SourceSiteId COLLATE Latin1_General_BIN2) AS SiteFirst
        FROM (VALUES
            {}
        ) AS v (Ord, NotificationId, Type, ListName, Subject, Body, TypeData, ContentHash, SourceSiteId, SourceInstanceId, SourceScript, OriginExecutionId, OriginParentExecutionId, SiteEnqueuedAt, Priority)
        WHERE NOT EXISTS (SELECT 1 FROM dbo.Notifications AS e WHERE e.NotificationId = v.NotificationId)
    ) AS g
    ORDER BY g.Ord
) AS w;
",
        firsts.len(),
        serve_turn_reads!("v.Type", "v.Priority", "v.SourceSiteId"),
        values.join(",\n            "),
    )
}

/// The answer for the plain rows whose ids are at the placeholders `firsts`: each id's stored
/// content hash, and whether `@inserted` holds it.
fn plain_answers(firsts: &[usize]) -> String {
    let ids: Vec<String> = firsts.iter().map(|first| format!("@P{first}")).collect();
    format!(
        "SELECT n.NotificationId, n.ContentHash, CASE WHEN i.NotificationId IS NULL THEN 0 ELSE 1 END AS Inserted
FROM dbo.Notifications AS n
LEFT JOIN @inserted AS i ON i.NotificationId = n.NotificationId
WHERE n.NotificationId IN ({});",
        ids.join(", ")
    )
}

/// Stores rows among which at least one has a condition key or was cleared at the site, one after
/// another in batch order as the SQLite backend stores them, in one transaction: each keyed or
/// cleared row through the submit procedure (which stores the key, stores a cleared row Cleared
/// with its history entry and lets a keyed row supersede the older waiting ones of its site, list
/// and key, migrations/mssql/procedures/SubmitNotification.sql), a long run of plain rows between
/// them through one [`insert_plain`] (see [`in_order_layout`]), a short one through the procedure
/// too, every row at the batch's `@now`. Every statement sees what the ones before it stored and
/// ended, so a later row of a site, list and key supersedes an earlier one of the same batch, and
/// every serve turn is the one the row reads in its turn (a run of plain rows supersedes nothing,
/// so the turns read once at its start are those). One INSERT of all the rows, then their
/// supersedes, would not do: a supersede can end the head turn, or a site's newest one, that a
/// later row reads (and on Babelfish that statement cost more than the calls, measured). `plain[i]`
/// tells whether row i is plain; its values start at the next placeholder ([`SUBMIT_COLUMNS`] for a
/// plain row, [`SUBMIT_PARAMS`] for the others). `insertable[i]` tells whether row i may go in an
/// INSERT: plain, and of a list not known to consolidate (a row of a list that does goes through
/// the procedure, which counts and holds it; the INSERTs' lists are checked first by
/// [`consolidation_guard`], whose `lists` distinct lists of the rows in INSERTs follow every row's
/// values). Answers as [`insert_batch`]: one result per call, then one for the rows of the INSERTs;
/// the caller matches them by id.
pub(crate) fn insert_in_order(plain: &[bool], insertable: &[bool], lists: usize) -> String {
    let in_insert = in_order_layout(insertable);
    let any_insert = in_insert.iter().any(|&i| i);
    let mut sql = String::from(BATCH_START);
    if any_insert {
        let values: usize = plain
            .iter()
            .map(|&p| if p { SUBMIT_COLUMNS } else { SUBMIT_PARAMS })
            .sum();
        sql.push_str(&consolidation_guard(values + 1, lists));
    }
    sql.push_str(declare_now!());
    if any_insert {
        sql.push_str(INSERTED_TABLE);
    }
    sql.push_str("BEGIN TRANSACTION;\n");
    let (mut next, mut run, mut inserted) = (1, Vec::new(), Vec::new());
    for (&plain, in_insert) in plain.iter().zip(in_insert) {
        if in_insert {
            run.push(next);
            inserted.push(next);
        } else {
            if !run.is_empty() {
                sql.push_str(&insert_plain(&run));
                run.clear();
            }
            sql.push_str(&submit_call(next, !plain, true));
            sql.push('\n');
        }
        next += if plain { SUBMIT_COLUMNS } else { SUBMIT_PARAMS };
    }
    if !run.is_empty() {
        sql.push_str(&insert_plain(&run));
    }
    sql.push_str("COMMIT TRANSACTION;");
    if any_insert {
        sql.push('\n');
        sql.push_str(&plain_answers(&inserted));
    }
    sql
}

/// The submit procedure's parameters, in the order [`submit_params`] binds them.
const SUBMIT_ARGS: [&str; SUBMIT_PARAMS] = [
    "NotificationId",
    "Type",
    "ListName",
    "Subject",
    "Body",
    "TypeData",
    "ContentHash",
    "SourceSiteId",
    "SourceInstanceId",
    "SourceScript",
    "OriginExecutionId",
    "OriginParentExecutionId",
    "SiteEnqueuedAt",
    "Priority",
    "ConditionKey",
    "ClearedAtSite",
    "ClearedBy",
    "DeliverAfter",
];

/// A call of the submit procedure with its values from placeholder `@P{first}` on: all
/// [`SUBMIT_PARAMS`] for a `keyed` row (a key, cleared at the site, or scheduled), a plain row's
/// [`SUBMIT_COLUMNS`] otherwise; `at_now`: the row is stored at the batch's `@now` (one time for
/// every row of a submit, as on SQLite), otherwise at the time of the call.
pub(super) fn submit_call(first: usize, keyed: bool, at_now: bool) -> String {
    let count = if keyed { SUBMIT_PARAMS } else { SUBMIT_COLUMNS };
    let mut args: Vec<String> = SUBMIT_ARGS[..count]
        .iter()
        .enumerate()
        .map(|(i, name)| format!("@{name} = @P{}", first + i))
        .collect();
    if at_now {
        args.push("@SubmittedAt = @now".into());
    }
    format!("EXEC dbo.SubmitNotification {};", args.join(", "))
}

/// A single plain row ([`is_plain`]), through the stored procedure dbo.SubmitNotification
/// (migrations/mssql/procedures/SubmitNotification.sql: on Babelfish ~0.9 ms against ~3 ms for
/// the batch of one row), which gives the row its serve turn with the reads of
/// [`serve_turn_reads`]. Result as [`insert_batch`]'s. Also the fallback, row by row, after a
/// duplicate key.
pub(super) const SUBMIT_ONE: &str = include_str!("submit_one.sql");

/// [`SUBMIT_ONE`] of a row with a condition key, cleared at the site or scheduled: the procedure
/// also stores its key, stores a row cleared at the site Cleared with its history entry, lets a
/// keyed row supersede the older waiting ones of its site, list and key, and stores a scheduled
/// row due at its time.
pub(super) const SUBMIT_ONE_KEYED: &str = include_str!("submit_one_keyed.sql");

/// [`SUBMIT_ONE`] or [`SUBMIT_ONE_KEYED`] of `new`.
pub(crate) fn submit_one(new: &NewNotification) -> Statement {
    let sql = if is_plain(new) {
        SUBMIT_ONE
    } else {
        SUBMIT_ONE_KEYED
    };
    Statement {
        sql: Cow::Borrowed(sql),
        params: row_params(new),
    }
}

/// The stored content hash of an id (after a duplicate-key error).
pub(crate) fn select_content_hash(id: NotificationId) -> Statement {
    Statement::fixed(include_str!("select_content_hash.sql")).set("@P1", guid(id))
}

/// Ends, as Cleared, the waiting rows (Pending, Retrying or Held, not claimed, or whose claim ran
/// out) and the Parked rows of site @P1 with condition key @P2, each with a history entry by @P3
/// numbered as its history count goes up by one, and marks those being delivered (PendingEnd,
/// applied when their attempt does not deliver them), in one transaction
/// (`IngestStore::clear_condition`). The rows are found through IX_Notifications_Condition
/// (migration 0006, with Held since 0007 and Parked since 0012). Without OUTPUT
/// or a table variable, as the submit procedure does it: the UPDATE stamps the rows it ends with a
/// token of this call, and the history INSERT and the answer find exactly those (Cleared, resolved
/// at @now, that token) through IX_Notifications_Status_Resolved. Result: their ids. In the same
/// transaction the condition's incidents on every list end Cleared, with their page messages
/// not yet sent ([`super::escalation::end_incidents`]).
pub(crate) fn clear_condition(site: &SiteId, key: &ConditionKey, actor: &Actor) -> Statement {
    let sql = format!(
        "{}{}COMMIT TRANSACTION;",
        include_str!("clear_condition.sql"),
        super::escalation::end_incidents(
            "i.ConditionKey IS NOT NULL AND i.SourceSiteId = @P1 AND i.ConditionKey = @P2",
            "Cleared",
            "@P3"
        )
    );
    Statement {
        sql: Cow::Owned(sql),
        params: Vec::new(),
    }
    .set("@P1", text(site.as_str()))
    .set("@P2", text(key.as_str()))
    .set("@P3", text(actor.as_str()))
}
