//! Keeps `sql/` honest. Each fixed statement of this backend is one file there, compiled in with
//! `include_str!`, so a typo or a column a migration renamed would otherwise surface only when
//! the code path that runs it does. These tests prepare every file against the schema the
//! migrations build (failing with the file's name), check that every file is named by some
//! `include_str!` so none outlives its caller, and check that the files read by one row reader
//! return the columns it expects.

use std::fs;
use std::path::{Path, PathBuf};

use rusqlite::Connection;

use super::migrate;

fn sqlite_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/sqlite")
}

/// Every `(name, text)` under `sql/`, by name. Read at test time rather than listed, so a file
/// added without a caller is still checked.
fn statement_files() -> Vec<(String, String)> {
    let dir = sqlite_dir().join("sql");
    let mut files: Vec<(String, String)> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            (name, text)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no statement files in {}", dir.display());
    files
}

fn migrated() -> Connection {
    let mut conn = Connection::open_in_memory().unwrap();
    migrate::apply(&mut conn).unwrap();
    conn
}

/// `prepare` compiles against the live schema (tables, columns, functions) and refuses a text
/// holding more than one statement.
#[test]
fn every_file_is_one_statement_valid_for_the_schema() {
    let conn = migrated();
    let failures: Vec<String> = statement_files()
        .iter()
        .filter_map(|(name, text)| conn.prepare(text).err().map(|e| format!("{name}: {e}")))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_file_is_included_by_the_backend() {
    let mut source = String::new();
    for entry in fs::read_dir(sqlite_dir()).unwrap() {
        let path = entry.unwrap().path();
        // This file's own include_str!s would hide a statement the backend stopped using.
        let checker = path.file_name().is_some_and(|n| n == "statement_files.rs");
        if path.extension().is_some_and(|ext| ext == "rs") && !checker {
            source.push_str(&fs::read_to_string(&path).unwrap());
        }
    }
    // Without whitespace, so a call rustfmt wrapped over lines still matches.
    let source: String = source.split_whitespace().collect();
    let unused: Vec<String> = statement_files()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !source.contains(&format!("include_str!(\"sql/{name}\")")))
        .collect();
    assert!(
        unused.is_empty(),
        "statement files no include_str! names: {}",
        unused.join(", ")
    );
}

/// Pairs of files whose rows one function reads by position.
#[test]
fn files_read_by_one_reader_return_matching_columns() {
    let conn = migrated();
    let columns = |sql: &str| -> Vec<String> {
        conn.prepare(sql)
            .unwrap()
            .column_names()
            .map(str::to_owned)
            .collect()
    };
    // `admin::read_state`.
    assert_eq!(
        columns(include_str!("sql/select_state.sql")),
        columns(include_str!("sql/query_states.sql")),
    );
    // `site_status::changes`: `read_state`'s columns, then the change's seq and targets.
    let state = columns(include_str!("sql/select_state.sql"));
    assert_eq!(state.len(), super::site_status::STATE_COLUMNS);
    let changes = columns(include_str!("sql/select_site_status_changes.sql"));
    assert_eq!(changes.len(), state.len() + 2, "{changes:?}");
    assert_eq!(
        changes[state.len() - 1],
        "DeliverAfter",
        "the last state column, then the change's: {changes:?}"
    );
    // `ClaimedRow::read`: column 17 is the due time, spelled differently in each; the incident
    // columns follow it.
    const DUE: usize = 17;
    let claim = columns(include_str!("sql/claim_in_turn.sql"));
    for other in [
        include_str!("sql/claim_longest_waiting.sql"),
        include_str!("sql/claim_digest.sql"),
    ] {
        let other = columns(other);
        assert_eq!(claim.len(), other.len());
        assert_eq!(claim[..DUE], other[..DUE]);
        assert_eq!(claim[DUE + 1..], other[DUE + 1..]);
    }
}

/// The statements whose plans may read a table whole or sort their rows, and why that stays
/// cheap as the table grows. Every other statement must reach the tables that grow with the
/// history (or with a backlog) through a key or an index range.
const WHOLE_READS: &[(&str, &str)] = &[
    // The head of the console's list: the filters, keyset and LIMIT `admin::query` appends
    // turn it into an index range; alone it reads newest first in rowid order.
    ("query_states.sql", "completed by admin::query"),
    // The live rows' KPI pass: every waiting row, by design, once a second at most
    // (kpi_gauges::REUSE); the delivered rows are kpis_delivered.sql's range.
    ("kpis.sql", "reads the live rows only"),
    // The daily purge's batches: incidents and feed changes oldest first, stopping at the batch.
    (
        "select_purgeable_incidents.sql",
        "oldest first, stops at the batch",
    ),
    (
        "purge_site_status_changes.sql",
        "the feed holds only unconfirmed changes",
    ),
    // The admin's incident list, newest first by rowid, stopping at the page.
    ("select_incidents.sql", "newest first, stops at the page"),
    // One incident's pages or messages, a few rows sorted.
    ("select_incident_messages.sql", "one incident's rows"),
    ("select_reached_lists.sql", "one incident's rows"),
];

/// Tables small by construction (configuration, one row per node or lease, queues emptied as
/// they are served), which a plan may scan.
const SMALL_TABLES: &[&str] = &[
    "CONSTANT ROW",
    "json_each",
    "ChannelConfig",
    "Leases",
    "NotificationLists",
    "SiteHealth",
    "SiteStatusWatchers",
    "StatusCallbacks",
];

/// SQLite's planner has no statistics here (central never runs ANALYZE), so its plans do not
/// depend on the data and the empty schema shows the plans a year of rows gets. Twice it chose
/// one that reads every waiting row: the claim's check for rows with a pending ending went
/// through the full status index instead of its partial one (a quarter of central's CPU with
/// 100,000 rows waiting), and the purge sorted every purgeable row to take each batch.
#[test]
fn no_statement_reads_a_growing_table_whole() {
    let conn = migrated();
    let mut failures = Vec::new();
    for (name, text) in statement_files() {
        if WHOLE_READS.iter().any(|(file, _)| *file == name) {
            continue;
        }
        let plan = match query_plan(&conn, &text) {
            Ok(plan) => plan,
            // The migration bookkeeping statements name a table the schema's runner creates.
            Err(_) if name.starts_with("migration_") => continue,
            Err(e) => panic!("{name}: {e}"),
        };
        for step in plan {
            let scans_big = step
                .strip_prefix("SCAN ")
                .is_some_and(|table| !SMALL_TABLES.iter().any(|small| table.starts_with(small)));
            let sorts = step.contains("TEMP B-TREE FOR") && step.contains("ORDER BY");
            // A full index entered by its status alone visits every row of those statuses.
            let by_status_alone = step.ends_with("(Status=?)");
            if scans_big || sorts || by_status_alone {
                failures.push(format!("{name}: {step}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn query_plan(conn: &Connection, text: &str) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {text}"))?;
    let params = vec![rusqlite::types::Null; stmt.parameter_count()];
    let rows = stmt.query_map(rusqlite::params_from_iter(params), |row| {
        row.get::<_, String>(3)
    })?;
    rows.collect()
}
