//! The checks that keep the statements honest: every statement file under `sql/` is included by
//! exactly one `include_str!`, starts as a batch must and parses as T-SQL (sqlglot, with the
//! migrations, the procedure files and a rendering of every built statement); every placeholder is
//! bound once; the built statements' renderings match their committed snapshots under
//! `sql/snapshots/`; and the outcome texts' encoding is one the procedure decodes back.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::super::migrate::MIGRATIONS;
use super::super::procedures::PROCEDURES;
use super::ingest::{MIN_INSERT_RUN, SUBMIT_ONE, SUBMIT_ONE_KEYED, in_order_layout, submit_call};
use super::*;
use crate::domain::consolidation::Consolidation;
use crate::domain::history::{Actor, OperatorAction};
use crate::domain::query::NotificationFilter;
use crate::domain::serve_order::ClaimLanes;
use crate::domain::{ConditionKey, NotificationType};
use crate::records::{AttemptRecord, LeaseEpoch, NewNotification};

fn sql_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/mssql/sql")
}

fn snapshot_dir() -> PathBuf {
    sql_dir().join("snapshots")
}

fn migrations_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/mssql")
}

fn procedures_dir() -> PathBuf {
    migrations_dir().join("procedures")
}

/// Every `(name, text)` of the `.sql` files in `dir`, by name. Read at test time rather than
/// listed, so a file nothing includes is still checked (and reported).
fn sql_files(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            (name, text)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .sql files in {}", dir.display());
    files
}

/// The fixed statements: the files under `sql/`.
fn statement_files() -> Vec<(String, String)> {
    sql_files(&sql_dir())
}

/// Every built statement, rendered for representative inputs (every filter field set, a keyset
/// cursor, two rows, ids or targets), by snapshot name.
fn renderings() -> Vec<(&'static str, String)> {
    use crate::domain::status::Status;
    use crate::domain::{NotificationType, Priority};

    let instant = DateTime::from_timestamp_millis(1_700_000_000_000).unwrap_or_default();
    let full_filter = NotificationFilter {
        statuses: vec![Status::Parked, Status::Retrying],
        kind: Some(NotificationType::Email),
        priorities: vec![Priority::Critical, Priority::Low],
        condition_key: Some("tank4.level.high".into()),
        source_site_id: Some("north".into()),
        list_name: Some("ops".into()),
        created_from: Some(instant),
        created_to: Some(instant),
        stuck_before: Some(instant),
        scheduled_after: Some(instant),
        subject_contains: Some("tank".into()),
        resolved_before: Some(instant),
    };
    let parked_only = NotificationFilter {
        statuses: vec![Status::Parked],
        source_site_id: Some("north".into()),
        ..Default::default()
    };
    // A keyed row, a run of plain rows long enough for an INSERT, a keyed row, a plain row.
    let mut in_order_sample = vec![false];
    in_order_sample.extend([true; MIN_INSERT_RUN]);
    in_order_sample.extend([false, true]);
    // A plain row of a list that consolidates, then a run of other plain rows long enough for
    // an INSERT, then one more of the list that consolidates.
    let consolidating_sample = [true; MIN_INSERT_RUN + 2];
    let mut consolidating_insertable = consolidating_sample;
    consolidating_insertable[0] = false;
    consolidating_insertable[MIN_INSERT_RUN + 1] = false;
    vec![
        ("insert_batch_2", insert_batch(2, 1)),
        (
            "insert_in_order_23",
            insert_in_order(&in_order_sample, &in_order_sample, 1),
        ),
        (
            "insert_in_order_keyed_2",
            insert_in_order(&[false, false], &[false, false], 0),
        ),
        (
            "insert_in_order_consolidating_22",
            insert_in_order(&consolidating_sample, &consolidating_insertable, 1),
        ),
        (
            "query_first_page",
            query(&NotificationFilter::default(), None, 51)
                .sql
                .into_owned(),
        ),
        (
            "query_every_filter_after_cursor",
            query(&full_filter, Some((instant, 42)), 51)
                .sql
                .into_owned(),
        ),
        ("act_on_ids_retry_2", act_on_ids(OperatorAction::Retry, 2)),
        (
            "act_on_ids_discard_2",
            act_on_ids(OperatorAction::Discard, 2),
        ),
        (
            "act_on_filter_retry",
            act_on_filter(OperatorAction::Retry, "ann", &parked_only, 1000)
                .sql
                .into_owned(),
        ),
        (
            "act_on_filter_discard",
            act_on_filter(OperatorAction::Discard, "ann", &parked_only, 1000)
                .sql
                .into_owned(),
        ),
        (
            "count_on_filter",
            count_on_filter(&parked_only, 1000).sql.into_owned(),
        ),
        ("replace_list_2", replace_list(2)),
        ("seed_list_2", seed_list(2)),
        (
            "drop_procedure",
            drop_procedure(procedure("SubmitNotification")),
        ),
        (
            "drop_function",
            drop_procedure(procedure("DecodeOutcomeText")),
        ),
    ]
}

/// The living procedure file of `name`.
fn procedure(name: &str) -> &'static super::super::procedures::Procedure {
    PROCEDURES.iter().find(|p| p.name == name).unwrap()
}

/// Each built statement's rendering equals its committed snapshot, and every snapshot belongs
/// to a rendering. A changed builder fails here until its snapshot is rewritten (review the
/// diff): `UPDATE_SNAPSHOTS=1 cargo test -p central-outbox mssql`. The fixed statements have no
/// snapshot: their file is the statement.
#[test]
fn built_statements_match_their_snapshots() {
    let dir = snapshot_dir();
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some();
    let renderings = renderings();
    let mut problems = Vec::new();
    for (name, sql) in &renderings {
        let path = dir.join(format!("{name}.sql"));
        let text = format!("{sql}\n");
        if update {
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(snapshot) if snapshot == text => {}
            Ok(_) => problems.push(format!("{name}: differs from {}", path.display())),
            Err(e) => problems.push(format!("{name}: {}: {e}", path.display())),
        }
    }
    for (file, _) in sql_files(&dir) {
        if !renderings
            .iter()
            .any(|(name, _)| format!("{name}.sql") == file)
        {
            problems.push(format!("{file}: no built statement has this snapshot"));
        }
    }
    assert!(
        problems.is_empty(),
        "statement snapshots out of date (rerun with UPDATE_SNAPSHOTS=1 and review):\n{}",
        problems.join("\n")
    );
}

/// Every statement file is sent by the backend: exactly one `include_str!` names it (in this
/// module's sources, or the warm-up's), so none outlives its caller and none has two homes.
#[test]
fn every_statement_file_is_included_once() {
    let mut sources = Vec::new();
    for dir in [sql_dir(), sql_dir().join("..")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                sources.push(std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    // Without whitespace, so a call rustfmt wrapped over lines still matches.
    let source: String = sources.concat().split_whitespace().collect();
    let mut problems = Vec::new();
    for (name, _) in statement_files() {
        let includes = source.matches(&format!("include_str!(\"{name}\")")).count()
            + source
                .matches(&format!("include_str!(\"sql/{name}\")"))
                .count();
        if includes != 1 {
            problems.push(format!("{name}: included {includes} times"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn statements_are_batches_with_bound_parameters() {
    // Session-level statements: the pool's probe, the migration lock and its release, the end
    // of a migration's transaction (opened by migration_begin.sql, which sets XACT_ABORT for
    // the session), and the warm-up's transaction, which sets only XACT_ABORT.
    let one_shot = [
        "check_connection.sql",
        "migration_lock.sql",
        "migration_unlock.sql",
        "migration_record.sql",
        "procedure_record.sql",
        "warm_up_begin.sql",
        "warm_up_roll_back.sql",
    ];
    let renderings = renderings()
        .into_iter()
        .map(|(name, sql)| (format!("{name}.sql"), sql));
    for (name, sql) in statement_files().into_iter().chain(renderings) {
        if !one_shot.contains(&name.as_str()) {
            assert!(
                sql.starts_with(BATCH_START),
                "{name} must start with SET XACT_ABORT ON"
            );
        }
        assert_portable(&name, &sql);
    }
    for (name, sql) in sql_files(&migrations_dir())
        .into_iter()
        .chain(sql_files(&procedures_dir()))
    {
        assert_portable(&name, &sql);
    }
    // Built statements number their placeholders in step with their parameters.
    let stmt = query(
        &NotificationFilter {
            statuses: vec![crate::domain::status::Status::Parked],
            subject_contains: Some("x".into()),
            ..Default::default()
        },
        Some((Utc::now(), 7)),
        10,
    );
    assert_eq!(stmt.params.len(), 5);
    assert!(stmt.sql.contains("@P5") && !stmt.sql.contains("@P6"));
    let batch = insert_batch(3, 2);
    assert!(batch.contains(&format!("@P{}", 3 * SUBMIT_COLUMNS + 2)));
    assert!(!batch.contains(&format!("@P{}", 3 * SUBMIT_COLUMNS + 3)));
    let last = 2 * SUBMIT_COLUMNS + SUBMIT_PARAMS;
    let mixed = insert_in_order(&[true, false, true], &[true, false, true], 0);
    assert_eq!(mixed.matches("EXEC dbo.SubmitNotification").count(), 3);
    assert!(mixed.contains(&format!("@P{last}")));
    assert!(!mixed.contains(&format!("@P{}", last + 1)));
}

/// None of what Babelfish rejects or SQL Server would need stricter isolation for.
fn assert_portable(name: &str, sql: &str) {
    for forbidden in [
        "MERGE ",
        "CREATE OR ALTER",
        "WAITFOR",
        "rowversion",
        "SERIALIZABLE",
        "REPEATABLE READ",
        "HOLDLOCK",
    ] {
        assert!(!sql.contains(forbidden), "{name} uses {forbidden}");
    }
}

/// The fixed reads of a notification's state select the columns the built queries select
/// (`state_columns!`), which `decode::state` reads.
#[test]
fn fixed_reads_select_the_state_columns() {
    let columns = concat!("SELECT ", state_columns!(), "\nFROM dbo.Notifications AS n");
    assert!(
        select_state(NotificationId::generate())
            .sql
            .contains(columns)
    );
    let detail = select_detail(NotificationId::generate()).sql;
    assert!(detail.contains(concat!("SELECT ", state_columns!(), ", n.Body")));
}

/// Only long runs of plain rows go in an INSERT; the other rows call the procedure.
#[test]
fn long_runs_of_plain_rows_go_in_one_insert() {
    let n = MIN_INSERT_RUN;
    let mut plain = vec![true; 2 * n + 4];
    plain[3] = false;
    plain[n + 4] = false;
    let layout = in_order_layout(&plain);
    assert!(
        layout[..4].iter().all(|&i| !i),
        "a run of 3, then a keyed row"
    );
    assert!(
        layout[4..n + 4].iter().all(|&i| i),
        "a run of MIN_INSERT_RUN"
    );
    assert!(
        layout[n + 4..].iter().all(|&i| !i),
        "a keyed row, then a run one shorter"
    );
    assert_eq!(in_order_layout(&[false, false]), [false, false]);
}

/// A migration's batches are split at its GO lines; a batch of comments alone (what is left of a
/// migration emptied of its procedures) is not sent, a comment before a statement goes with it.
#[test]
fn migration_batches_split_at_go_and_skip_comments_alone() {
    let file = "-- why\nALTER TABLE a ADD b int;\nGO\n-- only a comment\n\nGO\nSELECT 1;\n";
    assert_eq!(
        migration_batches(file),
        ["-- why\nALTER TABLE a ADD b int;\n", "SELECT 1;\n"]
    );
    assert!(migration_batches("-- the procedure moved\n-- to procedures/\n").is_empty());
    for m in MIGRATIONS
        .iter()
        .filter(|m| m.version == 4 || m.version == 9)
    {
        assert!(migration_batches(m.sql).is_empty(), "{}", m.file);
    }
}

/// A row of a batch calls the procedure as a single row does, at the batch's time.
#[test]
fn a_batch_calls_the_procedure_as_a_single_row_does() {
    assert_eq!(
        SUBMIT_ONE.trim_end(),
        format!("{BATCH_START}{}", submit_call(1, false, false))
    );
    let keyed_only = insert_in_order(&[false, false], &[false, false], 0);
    assert_eq!(
        SUBMIT_ONE_KEYED.trim_end(),
        format!("{BATCH_START}{}", submit_call(1, true, false))
    );
    assert!(keyed_only.contains(&submit_call(1 + SUBMIT_PARAMS, true, true)));
    assert!(!keyed_only.contains("@inserted"));
    assert!(
        !keyed_only.contains(CONSOLIDATING_LIST),
        "no INSERT, nothing to guard"
    );
}

/// The rows of a list known to consolidate call the procedure, as plain rows (their
/// parameters are a plain row's); the batch first checks the lists of the rows it puts in an
/// INSERT, and only those.
#[test]
fn rows_of_a_consolidating_list_go_through_the_procedure() {
    let n = MIN_INSERT_RUN;
    let plain = vec![true; n + 1];
    let mut insertable = plain.clone();
    insertable[0] = false;
    let sql = insert_in_order(&plain, &insertable, 2);
    assert!(sql.contains(&submit_call(1, false, true)));
    assert_eq!(sql.matches("EXEC dbo.SubmitNotification").count(), 1);
    let first = (n + 1) * SUBMIT_COLUMNS + 1;
    assert!(
        sql.contains(&format!("l.Name IN (@P{first}, @P{});", first + 1)),
        "{sql}"
    );
    let all_plain = insert_batch(2, 1);
    assert!(all_plain.contains("l.Name IN (@P29);"));
    // A guard that answers returns before anything is stored.
    let guard = all_plain.find("RETURN;").unwrap();
    assert!(guard < all_plain.find("INSERT").unwrap());
}

/// What `dbo.DecodeOutcomeText` (migrations/mssql/procedures/DecodeOutcomeText.sql) does, step for
/// step: each `%XX` (two hex digits) becomes the character XX names, read left to right into a new
/// string; any other `%` stays.
fn decode_outcome_text(encoded: &str) -> String {
    let mut decoded = String::new();
    let mut rest = encoded;
    while let Some(at) = rest.find('%') {
        let code = rest
            .get(at + 1..at + 3)
            .filter(|hex| hex.chars().all(|c| c.is_ascii_hexdigit()))
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .and_then(char::from_u32);
        match code {
            Some(c) => {
                decoded.push_str(&rest[..at]);
                decoded.push(c);
                rest = &rest[at + 3..];
            }
            None => {
                decoded.push_str(&rest[..=at]);
                rest = &rest[at + 1..];
            }
        }
    }
    decoded.push_str(rest);
    decoded
}

/// An outcome text crosses JSON with nothing escaped, whatever it holds, and decodes back to
/// itself; a text with nothing to encode is sent as it is.
#[test]
fn outcome_texts_travel_unescaped_and_decode_back() {
    let mut every_low = String::new();
    every_low.extend((0..0x80u32).filter_map(char::from_u32));
    for text in [
        "421 \"busy\" at C:\\relay\n\ttry later: Zürich ✓ 😀 \u{1} \u{1b}[0m",
        "100% done, %22 is not a quote, nor %zz, nor a trailing %",
        "\"Ops Desk\" <ops@plant.test>, b@plant.test",
        "",
        every_low.as_str(),
    ] {
        let encoded = escape_free(text);
        let json = serde_json::to_string(&encoded).unwrap();
        assert_eq!(
            json,
            format!("\"{encoded}\""),
            "nothing escaped in {text:?}"
        );
        assert_eq!(decode_outcome_text(&encoded), text);
    }
    // A text sent unencoded (by the previous binary, during an upgrade) never fails the call;
    // only a `%XX` of its own would change.
    assert_eq!(decode_outcome_text("100% done, 50%!"), "100% done, 50%!");
    let plain = "550 5.1.1 <nobody@plant.test>: user unknown, é ✓";
    assert!(matches!(
        escape_free(plain),
        std::borrow::Cow::Borrowed(p) if p == plain
    ));
}

/// Every statement bound through its function, with sample values.
fn bound_statements() -> Vec<(&'static str, Statement)> {
    use crate::domain::delivery::{AttemptOutcome, Delivered, DeliveryError};
    use crate::domain::retry::Transition;
    use crate::domain::status::Status;
    use crate::domain::{NotificationContent, SiteId, Submission};
    use outbox_domain::ScriptOrigin;

    let now = Utc::now();
    let content = NotificationContent::parse(
        NotificationType::Email,
        "ops".into(),
        "Tank 4 high level".into(),
        "level 97%".into(),
        String::new(),
    )
    .unwrap();
    let origin = ScriptOrigin::parse("node-1".into(), "alarm.py".into(), None, None).unwrap();
    let new = NewNotification::new(Submission {
        id: NotificationId::generate(),
        content,
        provenance: origin.at_site(SiteId::parse("north".into()).unwrap(), now),
        priority: crate::domain::Priority::High,
        condition_key: None,
        cleared_at_site: None,
        deliver_after: None,
    });
    let key = ConditionKey::parse("tank4.level.high".into(), "condition_key").unwrap();
    let mut keyed = new.clone();
    keyed.submission.id = NotificationId::generate();
    keyed.submission.condition_key = Some(key.clone());
    let mut other_list = new.clone();
    other_list.submission.id = NotificationId::generate();
    other_list.submission.content.list_name =
        crate::domain::ListName::parse("other".into()).unwrap();
    let mut cleared = keyed.clone();
    cleared.submission.id = NotificationId::generate();
    cleared.submission.cleared_at_site = Some(now);
    let mut scheduled = new.clone();
    scheduled.submission.id = NotificationId::generate();
    scheduled.submission.deliver_after = Some(now + chrono::Duration::hours(1));
    let id = new.submission.id;
    let result: std::result::Result<Delivered, DeliveryError> =
        Err(DeliveryError::transient("relay busy"));
    let record = AttemptRecord {
        row_id: 7,
        id,
        attempt_no: 2,
        epoch: LeaseEpoch(3),
        outcome: AttemptOutcome::of(&result),
        error: Some("relay busy".into()),
        duration: Duration::from_millis(40),
        transition: Transition {
            status: Status::Retrying,
            retry_count: 1,
            next_attempt_at: Some(now),
            last_error: Some("relay busy".into()),
            resolved_at: None,
            resolved_targets: None,
        },
        provider: None,
    };
    let smtp = crate::config::Config {
        smtp: Some(crate::config::SmtpConfig::new(
            "relay.test",
            25,
            "outbox@plant.test",
        )),
        ..Default::default()
    }
    .validate()
    .unwrap()
    .smtp
    .unwrap();
    let webhook = crate::domain::channel::WebhookSettings::default();
    let policy = crate::domain::escalation::EscalationPolicy::parse(
        crate::domain::escalation::PolicyInput {
            acknowledge_within: Duration::from_secs(300),
            steps: vec![(vec!["managers".into()], Duration::from_secs(600))],
            repeat: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let filter = NotificationFilter {
        statuses: vec![Status::Parked],
        subject_contains: Some("tank".into()),
        ..Default::default()
    };
    let secret = || Some(("old".to_owned(), "new".to_owned()));
    vec![
        ("migration_lock", migration_lock(Duration::from_secs(5))),
        ("migration_record", migration_record(&MIGRATIONS[0])),
        (
            "procedure_record",
            procedure_record(procedure("AcquireLease"), 1),
        ),
        ("insert_rows", insert_rows(&[&new, &new], &HashSet::new())),
        ("insert_rows_one", insert_rows(&[&new], &HashSet::new())),
        (
            "insert_rows_in_order",
            insert_rows(
                &[&new, &keyed, &new, &new, &cleared, &keyed],
                &HashSet::new(),
            ),
        ),
        (
            "insert_rows_consolidating",
            insert_rows(&[&new, &new, &keyed], &HashSet::from(["ops".to_owned()])),
        ),
        (
            "insert_rows_two_lists",
            insert_rows(&[&new, &other_list, &new], &HashSet::new()),
        ),
        (
            "insert_rows_scheduled",
            insert_rows(&[&new, &scheduled, &new], &HashSet::new()),
        ),
        ("submit_one", submit_one(&new)),
        ("submit_one_keyed", submit_one(&cleared)),
        ("submit_one_scheduled", submit_one(&scheduled)),
        (
            "clear_condition",
            clear_condition(
                &SiteId::parse("north".into()).unwrap(),
                &key,
                &Actor::new("site north"),
            ),
        ),
        ("select_content_hash", select_content_hash(id)),
        (
            "acquire_lease",
            acquire_lease("dispatcher", "node", Duration::from_secs(15)),
        ),
        (
            "release_lease",
            release_lease("dispatcher", "node", LeaseEpoch(3)),
        ),
        (
            "claim_due",
            claim_due(
                "dispatcher",
                LeaseEpoch(3),
                NotificationType::Email,
                ClaimLanes {
                    in_turn: 9,
                    longest_waiting: 1,
                },
                Duration::from_secs(120),
            ),
        ),
        (
            "claim_digest",
            claim_digest(
                "dispatcher",
                LeaseEpoch(3),
                NotificationType::Email,
                id,
                Duration::from_secs(120),
            ),
        ),
        ("select_next_due", select_next_due(NotificationType::Email)),
        ("park_invalid", park_invalid(7, LeaseEpoch(3), "bad", id, 2)),
        (
            "record_outcomes",
            record_outcomes("dispatcher", &[&record, &record]),
        ),
        ("select_state", select_state(id)),
        ("select_detail", select_detail(id)),
        ("query", query(&filter, Some((now, 7)), 51)),
        (
            "act_on_these",
            act_on_these(OperatorAction::Retry, "ann", &[id, id]),
        ),
        (
            "act_on_filter",
            act_on_filter(OperatorAction::Discard, "ann", &filter, 10),
        ),
        ("kpis", kpis(now, now, now)),
        ("purge_terminal", purge_terminal(now, 100)),
        ("select_list", select_list("ops")),
        (
            "replace_list_with",
            replace_list_with(
                ListWrite::Replace,
                "ops",
                NotificationType::Email,
                None,
                None,
                Some(Consolidation::parse(10, Duration::from_secs(60), 100).unwrap()),
                None,
                vec!["a@plant.test".into(), "b@plant.test".into()],
                Some(&policy),
                Some("https://erp.test/status".into()),
            ),
        ),
        (
            "seed_list_with",
            replace_list_with(
                ListWrite::Seed,
                "ops",
                NotificationType::Webhook,
                Some("teams".into()),
                Some("sealed".into()),
                None,
                Some("https://b.test/a https://c.test/a".into()),
                vec!["https://h.test/a".into()],
                None,
                None,
            ),
        ),
        (
            "select_due_incidents",
            escalation::select_due("dispatcher", LeaseEpoch(3), 201),
        ),
        (
            "select_sources",
            escalation::select_sources(&[*id.as_uuid()], &["ops".into(), "managers".into()]),
        ),
        ("select_ack_state", escalation::select_ack_state(7)),
        ("select_reached", escalation::select_reached(7)),
        (
            "acknowledge_call",
            escalation::acknowledge_call(
                escalation::ReadState {
                    id: 7,
                    status: "Open",
                    page_count: 2,
                    due: Some(now),
                },
                "ann",
                "console",
                Some("10.0.0.1"),
                Some(3_600_000),
                " page notifications not yet sent were stopped",
            ),
        ),
        (
            "select_condition_incidents",
            escalation::select_condition_incidents("north", "pump7.trip"),
        ),
        ("select_incident", escalation::select_incident(7)),
        (
            "select_incidents",
            escalation::select_incidents(&crate::records::IncidentQuery {
                statuses: vec![
                    crate::domain::escalation::IncidentStatus::Open,
                    crate::domain::escalation::IncidentStatus::Exhausted,
                ],
                late_only: true,
                before: Some(crate::domain::escalation::IncidentId(40)),
                limit: 50,
            }),
        ),
        ("incident_fire", {
            let mut batch = escalation::IncidentBatch::new(
                escalation::ReadState {
                    id: 7,
                    status: "Open",
                    page_count: 1,
                    due: Some(now),
                },
                Some(("dispatcher", LeaseEpoch(3))),
            );
            let next = batch.bind(at(now));
            batch.update(&format!("i.PageCount = 2, i.NextDueAt = {next}"), 2);
            escalation::insert_page(&mut batch, 0, 0, 2, 2, now, None, LeaseEpoch(3));
            let incident = batch.incident().to_owned();
            escalation::insert_message(&mut batch, &new, Some((&incident, 2)));
            escalation::end_pages(&mut batch, "Acknowledged", "Acknowledged", "ann");
            let detail = batch.bind(text("a page"));
            batch.history("Skipped", "dispatcher", None, None, &detail);
            batch.history(
                "Paged",
                "dispatcher",
                Some("api"),
                Some("10.0.0.1"),
                &detail,
            );
            batch.finish()
        }),
        ("delete_list", delete_list("ops")),
        ("select_channel", select_channel("email")),
        (
            "replace_channel",
            replace_channel(ChannelWrite::Replace, "email", &smtp, None, None),
        ),
        (
            "seed_channel",
            replace_channel(ChannelWrite::Seed, "email", &smtp, None, None),
        ),
        (
            "replace_webhook_channel",
            replace_webhook_channel(ChannelWrite::Replace, "webhook", &webhook),
        ),
        (
            "seed_webhook_channel",
            replace_webhook_channel(ChannelWrite::Seed, "webhook", &webhook),
        ),
        ("delete_channel", delete_channel("email")),
        (
            "reseal_list_secret",
            reseal_list_secret("hooks", "old".into(), "new".into()),
        ),
        (
            "reseal_channel_secrets",
            reseal_channel_secrets("email", secret(), secret()),
        ),
        (
            "record_site_health",
            record_site_health(&crate::domain::site_health::SiteHealthReport {
                site: SiteId::parse("north".into()).unwrap(),
                node: SiteId::parse("north-a".into()).unwrap(),
                role: crate::domain::site_health::NodeRole::Active,
                buffer_depth: 12,
                oldest_buffered_age: Duration::from_secs(3),
                last_forward_at: Some(now),
                standby_lag_rows: 2,
                standby_lag: Duration::from_millis(40),
                version: "0.1.0".into(),
                central_reachable: true,
                rejected: 0,
                sends_refused: false,
            }),
        ),
        (
            "forget_silent_nodes",
            forget_silent_nodes(Duration::from_millis(30 * 24 * 3600 * 1000 + 500)),
        ),
    ]
}

/// Each statement's function binds exactly one value per placeholder its text uses: @P1 to
/// @Pn, each used, none missing, for n values. (A value bound to the wrong placeholder of
/// a fixed statement is caught by `Statement::set`, which names each one.)
#[test]
fn every_placeholder_is_bound_once() {
    for (name, stmt) in bound_statements() {
        let mut used = BTreeSet::new();
        for (i, _) in stmt.sql.match_indices("@P") {
            let digits: String = stmt.sql[i + 2..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            // A procedure's own parameter (`@Priority = @P14`) is not a placeholder.
            if !digits.is_empty() {
                used.insert(digits.parse::<usize>().unwrap());
            }
        }
        let bound: BTreeSet<usize> = (1..=stmt.params.len()).collect();
        assert_eq!(used, bound, "{name}: placeholders used vs values bound");
    }
}

/// Every statement file, every built statement's snapshot, every migration and every procedure
/// file parses as T-SQL
/// (sqlglot, tsql dialect), and none is only accepted as an opaque command. The parser is
/// installed by `make tools` (which `make test` runs); its absence fails the test, because a
/// silently skipped check is no check.
#[test]
fn every_statement_parses_as_tsql() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let python = std::env::var_os("OUTBOX_SQLGLOT_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target/tools/venv/bin/python"));
    assert!(
        python.exists(),
        "the T-SQL parser's Python is not installed at {}: run `make tools` \
         (`make test` does it first), or point OUTBOX_SQLGLOT_PYTHON at a python with sqlglot",
        python.display()
    );
    let dirs = [
        sql_dir(),
        snapshot_dir(),
        migrations_dir(),
        procedures_dir(),
    ];
    let output = Command::new(&python)
        .arg(sql_dir().join("check_tsql.py"))
        .args(&dirs)
        .output()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "T-SQL parse check failed:\n{report}"
    );
    // The script names every file it parsed; all of them must be there, and the migrations and
    // procedures the backend applies among them.
    let mut expected: Vec<String> = dirs
        .iter()
        .flat_map(|dir| sql_files(dir).into_iter().map(|(name, _)| name))
        .collect();
    assert!(expected.len() >= MIGRATIONS.len() + PROCEDURES.len() + renderings().len());
    expected.sort();
    for file in expected {
        assert!(
            report.contains(&format!("ok {file}\n")),
            "{file} was not parsed:\n{report}"
        );
    }
    let procedure_files = PROCEDURES.iter().map(|p| format!("{}.sql", p.name));
    for file in MIGRATIONS
        .iter()
        .map(|m| m.file.to_owned())
        .chain(procedure_files)
    {
        assert!(
            report.contains(&format!("ok {file}\n")),
            "{file} was not parsed"
        );
    }
}
