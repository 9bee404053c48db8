//! MS SQL only: the stored procedures come from their living files under
//! `migrations/mssql/procedures/`, recorded in `dbo.SchemaProcedures` (revision and SHA-256 of
//! the file). At each start the migrator creates again a procedure whose recorded file is not
//! the one built in, leaves the others alone, brings a database from before the ledger up to
//! date with its rows intact, and stops, changing nothing, when a newer binary created one.

use std::collections::BTreeMap;
use std::time::Duration;

use central_outbox::store::mssql::{MsSqlOptions, MsSqlStore, ScratchDatabase};
use central_outbox::store::{AdminStore, DispatchStore};
use sha2::{Digest, Sha256};

use super::{mssql_server, seed, session_of_its_own};

/// Every procedure file, by the name of the procedure it creates.
const PROCEDURES: [&str; 7] = [
    "AcknowledgeIncident",
    "AcquireLease",
    "ClaimDigestNotifications",
    "ClaimDueNotifications",
    "DecodeOutcomeText",
    "RecordAttemptOutcomes",
    "SubmitNotification",
];

/// A procedure's `dbo.SchemaProcedures` row.
#[derive(Debug, Clone, PartialEq)]
struct Recorded {
    revision: i32,
    sha256: Vec<u8>,
    applied_at: chrono::NaiveDateTime,
}

/// The SHA-256 of a procedure's file, as the migrator records it.
fn file_sha256(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations/mssql/procedures")
        .join(format!("{name}.sql"));
    Sha256::digest(std::fs::read(&path).unwrap()).to_vec()
}

/// The store's options with a pool of one connection: these tests open a store again and
/// again, and warming a connection costs Babelfish seconds (nor is a spare then still being
/// opened in the background when the test drops the database).
fn small(database: &ScratchDatabase) -> MsSqlOptions {
    let mut options = database.options();
    options.pool_max_size = 1;
    options.pool_min_idle = Some(1);
    options
}

/// Runs each statement on a session of its own, outside any store (as a DBA, or another
/// binary, would).
async fn run(options: &MsSqlOptions, statements: &[&str]) {
    let mut client = session_of_its_own(options).await;
    for sql in statements {
        client
            .simple_query(*sql)
            .await
            .unwrap()
            .into_results()
            .await
            .unwrap();
    }
}

/// `dbo.SchemaProcedures`, by procedure name.
async fn recorded(options: &MsSqlOptions) -> BTreeMap<String, Recorded> {
    let mut client = session_of_its_own(options).await;
    let rows = client
        .simple_query("SELECT Name, Revision, Sha256, AppliedAt FROM dbo.SchemaProcedures")
        .await
        .unwrap()
        .into_first_result()
        .await
        .unwrap();
    rows.iter()
        .map(|row| {
            (
                row.get::<&str, _>("Name").unwrap().to_owned(),
                Recorded {
                    revision: row.get::<i32, _>("Revision").unwrap(),
                    sha256: row.get::<&[u8], _>("Sha256").unwrap().to_vec(),
                    applied_at: row.get::<chrono::NaiveDateTime, _>("AppliedAt").unwrap(),
                },
            )
        })
        .collect()
}

/// Every procedure is recorded with its file's hash.
fn assert_every_file_recorded(recorded: &BTreeMap<String, Recorded>) {
    let names: Vec<&str> = recorded.keys().map(String::as_str).collect();
    assert_eq!(names, PROCEDURES);
    for (name, row) in recorded {
        assert_eq!(row.sha256, file_sha256(name), "{name}'s recorded hash");
        assert!(row.revision >= 1, "{name}'s revision");
    }
}

/// A procedure whose recorded file differs from the one built in (here: dbo.AcquireLease,
/// replaced by one that never grants the lease, with another hash recorded) is created again
/// from its file at the next start, and only that one; a database from before the ledger (no
/// dbo.SchemaProcedures, schema version 10) gets every procedure created again from its file,
/// its rows intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs OUTBOX_TEST_MSSQL_URL (make test-mssql)"]
async fn mssql_a_changed_procedure_file_is_created_again_at_the_next_start() {
    let database = ScratchDatabase::create(&mssql_server()).await.unwrap();
    let options = small(&database);
    let store = MsSqlStore::open(options.clone()).await.unwrap();
    let before = recorded(&options).await;
    assert_every_file_recorded(&before);
    let kept = seed::submission(&seed::Spec::new("north", "ops", "kept", seed::End::Pending));
    let id = kept.submission.id;
    seed::Rows::put(&store, vec![kept]).await;

    run(
        &options,
        &[
            "DROP PROCEDURE dbo.AcquireLease",
            "CREATE PROCEDURE dbo.AcquireLease @Name nvarchar(64), @Holder nvarchar(1024), \
             @TtlMs int AS BEGIN SELECT l.Epoch FROM dbo.Leases AS l WHERE 1 = 0; END;",
            "UPDATE dbo.SchemaProcedures SET Sha256 = 0x00 WHERE Name = N'AcquireLease'",
        ],
    )
    .await;
    let ttl = Duration::from_secs(60);
    assert_eq!(
        store.acquire_lease(seed::LEASE, "a", ttl).await.unwrap(),
        None,
        "the replaced procedure grants nothing"
    );
    drop(store);

    let store = MsSqlStore::open(options.clone()).await.unwrap();
    assert!(
        store
            .acquire_lease(seed::LEASE, "a", ttl)
            .await
            .unwrap()
            .is_some(),
        "dbo.AcquireLease is the file's again"
    );
    let after = recorded(&options).await;
    assert_every_file_recorded(&after);
    for name in PROCEDURES {
        if name == "AcquireLease" {
            assert!(after[name].applied_at >= before[name].applied_at);
        } else {
            assert_eq!(after[name], before[name], "{name} was left alone");
        }
    }
    drop(store);

    // As a database migrated by the release before the procedure files.
    run(
        &options,
        &[
            "DROP TABLE dbo.SchemaProcedures",
            "DELETE FROM dbo.SchemaMigrations WHERE Version >= 11",
        ],
    )
    .await;
    let store = MsSqlStore::open(options.clone()).await.unwrap();
    assert_every_file_recorded(&recorded(&options).await);
    let state = store
        .state(id)
        .await
        .unwrap()
        .expect("the row is still there");
    assert_eq!(state.subject, "kept");
    assert!(
        store
            .acquire_lease(seed::LEASE, "a", ttl)
            .await
            .unwrap()
            .is_some()
    );
    drop(store);
    database.drop_now().await.unwrap();
}

/// A procedure recorded at a newer revision than its file was created by a newer binary: this
/// one refuses to start, naming it, and changes nothing (it does not put its older procedure
/// back under the newer replicas). Deleting the row is the way back on purpose: the next start
/// creates the procedure from this binary's file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs OUTBOX_TEST_MSSQL_URL (make test-mssql)"]
async fn mssql_a_procedure_from_a_newer_binary_stops_an_older_one() {
    let database = ScratchDatabase::create(&mssql_server()).await.unwrap();
    let options = small(&database);
    drop(MsSqlStore::open(options.clone()).await.unwrap());
    run(
        &options,
        &[
            "UPDATE dbo.SchemaProcedures SET Revision = 99, Sha256 = 0x00 \
             WHERE Name = N'SubmitNotification'",
            // Changed too, so that a start that went on would create it again.
            "UPDATE dbo.SchemaProcedures SET Sha256 = 0x00 WHERE Name = N'AcquireLease'",
        ],
    )
    .await;
    let before = recorded(&options).await;

    let error = MsSqlStore::open(options.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("dbo.SubmitNotification in the database is at revision 99"),
        "{error}"
    );
    assert!(error.contains("dbo.SchemaProcedures"), "{error}");
    assert_eq!(recorded(&options).await, before, "nothing changed");

    run(
        &options,
        &["DELETE FROM dbo.SchemaProcedures WHERE Name = N'SubmitNotification'"],
    )
    .await;
    let store = MsSqlStore::open(options.clone()).await.unwrap();
    assert_every_file_recorded(&recorded(&options).await);
    let row = seed::submission(&seed::Spec::new(
        "north",
        "ops",
        "after",
        seed::End::Pending,
    ));
    seed::Rows::put(&store, vec![row]).await;
    drop(store);
    database.drop_now().await.unwrap();
}
