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
