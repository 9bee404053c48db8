//! The store conformance suite: one list of behaviours every `OutboxStore` backend must show,
//! run against each backend through the same code. SQLite (the embedded default) always runs.
//! The MS SQL tests need a server, so they are `#[ignore]`d, and a run without one reports them
//! as ignored rather than passed; `make test-mssql` runs them (`--include-ignored`) against the
//! server `OUTBOX_TEST_MSSQL_URL` names (Babelfish, or SQL Server in Docker), and asked for
//! without that variable they fail saying so. Further backends join the `backend!` list at the
//! end.
//!
//! The behaviours come in two lists. `dispatch_behaviours!` checks the dispatch capability
//! (`DispatchStore`: leases, claims in serve order, fenced outcomes, the purge) and needs of the
//! rest of a store only a way to put rows in and look at them (`seed::Rows`); it also runs
//! against the dispatcher's in-memory test store (`central_outbox::testing::MemoryStore`), so
//! the store the dispatcher's paused-clock tests run on cannot drift from the real ones.
//! `whole_store_behaviours!` checks ingest, operator actions, channel settings, condition
//! keys, flood consolidation, scheduled delivery, site health, the site status feed, the status
//! callbacks' queue, and the channel settings with
//! their start-up seeds, which only the SQL backends keep.
//!
//! Each behaviour seeds its own store through the store's capabilities, so it knows
//! independently what the store should answer, and compares.

// Helpers are not #[test] fns, so clippy's allow-unwrap-in-tests does not reach them; a failed
// set-up step must fail the test loudly anyway.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod poll;
mod seed;

mod admin;
mod channels;
mod conditions;
mod consolidation;
mod engine;
mod escalation;
mod escalation_model;
mod lifecycle_model;
mod procedures;
mod purge;
mod scheduled;
mod serve_order;
mod site_health;
mod site_status;
mod status_callbacks;

use std::future::Future;
use std::io::Write;

use central_outbox::store::mssql::{MsSqlStore, ScratchDatabase};
use central_outbox::store::sqlite::SqliteStore;
use central_outbox::testing::MemoryStore;

/// A fresh, empty store of one backend, and whatever keeps it alive.
pub struct Fixture<S> {
    pub store: S,
    _keep: Box<dyn Send>,
}

/// SQLite on a real file in a fresh temporary directory, with durable commits as in production.
pub fn sqlite() -> Fixture<SqliteStore> {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(
        &dir.path().join("central.db"),
        group_commit::Durability::Full,
    )
    .expect("open SQLite store");
    Fixture {
        store,
        _keep: Box::new(dir),
    }
}

/// The dispatcher's in-memory test store, empty.
pub fn memory() -> Fixture<MemoryStore> {
    Fixture {
        store: MemoryStore::default(),
        _keep: Box::new(()),
    }
}

/// The variable naming the SQL Server the MS SQL tests run against, as a connection string
/// whose database (e.g. `master`) may create databases: each test gets a new one.
const MSSQL_URL_VAR: &str = "OUTBOX_TEST_MSSQL_URL";

/// MS SQL in a fresh database of its own on the server `OUTBOX_TEST_MSSQL_URL` names, dropped
/// when the test ends.
pub async fn mssql() -> Fixture<MsSqlStore> {
    let url = mssql_server();
    let database = ScratchDatabase::create(&url)
        .await
        .expect("create the test database");
    let store = MsSqlStore::open(database.options())
        .await
        .expect("open MS SQL store");
    Fixture {
        store,
        _keep: Box::new(database),
    }
}

/// The server `OUTBOX_TEST_MSSQL_URL` names. An MS SQL test runs only when asked for (it is
/// ignored otherwise), so without a server it fails rather than pass having checked nothing.
fn mssql_server() -> String {
    std::env::var(MSSQL_URL_VAR).unwrap_or_else(|_| {
        panic!(
            "{MSSQL_URL_VAR} is not set: the MS SQL tests need a server (a login that may \
             CREATE DATABASE); `make test-mssql` starts Babelfish or takes that variable"
        )
    })
}

/// Runs one behaviour against a fresh store of a backend.
pub async fn check<S, F, Fut>(fixture: Fixture<S>, behaviour: F)
where
    F: FnOnce(S) -> Fut,
    Fut: Future<Output = ()>,
{
    let Fixture { store, _keep } = fixture;
    behaviour(store).await;
    drop(_keep);
}

/// Instantiates the named lists of behaviours for one backend as `#[tokio::test]`s in a module
/// of its name, each carrying the attributes given before the name (an `#[ignore]` for a backend
/// that needs a server).
macro_rules! backend {
    ($(#[$attr:meta])* $name:ident, $fixture:expr, $($behaviours:ident)&+) => {
        mod $name {
            use super::*;

            macro_rules! behaviour {
                ($test:ident, $path:path) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    $(#[$attr])*
                    async fn $test() {
                        check($fixture, |store| async move { $path(&store).await }).await;
                    }
                };
            }

            $($behaviours!();)+
        }
    };
}

/// The dispatch capability: what the dispatcher relies on (module docs).
macro_rules! dispatch_behaviours {
    () => {
        behaviour!(
            leases_are_exclusive_and_epochs_only_grow,
            engine::leases_are_exclusive_and_epochs_only_grow
        );
        behaviour!(a_lease_is_read_as_stored, engine::a_lease_is_read_as_stored);
        behaviour!(
            claims_are_exclusive_per_channel_and_outcomes_are_fenced,
            engine::claims_are_exclusive_per_channel_and_outcomes_are_fenced
        );
        behaviour!(
            an_expired_claim_is_due_again,
            engine::an_expired_claim_is_due_again
        );
        behaviour!(
            a_lapsed_lease_stays_its_holders_until_another_takes_it,
            engine::a_lapsed_lease_stays_its_holders_until_another_takes_it
        );
        behaviour!(
            an_outcome_applies_only_to_its_own_attempt,
            engine::an_outcome_applies_only_to_its_own_attempt
        );
        behaviour!(
            outcomes_recorded_together_apply_each_on_its_own,
            engine::outcomes_recorded_together_apply_each_on_its_own
        );
        behaviour!(
            a_due_retry_is_claimed_before_newer_rows,
            engine::a_due_retry_is_claimed_before_newer_rows
        );
        behaviour!(
            concurrent_claims_never_hand_out_a_row_twice,
            engine::concurrent_claims_never_hand_out_a_row_twice
        );
        behaviour!(
            purge_removes_only_terminal_rows_past_retention,
            purge::purge_removes_only_terminal_rows_past_retention
        );
        behaviour!(
            claims_take_the_most_urgent_first,
            serve_order::claims_take_the_most_urgent_first
        );
        behaviour!(
            sites_take_turns_within_a_priority,
            serve_order::sites_take_turns_within_a_priority
        );
        behaviour!(
            the_longest_waiting_share_takes_the_oldest_due_row,
            serve_order::the_longest_waiting_share_takes_the_oldest_due_row
        );
        behaviour!(
            a_scheduled_row_is_not_claimed_before_its_time,
            scheduled::a_scheduled_row_is_not_claimed_before_its_time
        );
    };
}

/// Everything else a whole store keeps.
macro_rules! whole_store_behaviours {
    () => {
        behaviour!(
            a_watching_site_gets_each_final_status_once_in_order,
            site_status::a_watching_site_gets_each_final_status_once_in_order
        );
        behaviour!(
            the_purge_drops_old_changes_and_watches,
            site_status::the_purge_drops_old_changes_and_watches
        );
        behaviour!(
            each_final_status_is_queued_called_in_order_and_audited,
            status_callbacks::each_final_status_is_queued_called_in_order_and_audited
        );
        behaviour!(
            submit_is_idempotent_and_refuses_other_content_under_an_id,
            engine::submit_is_idempotent_and_refuses_other_content_under_an_id
        );
        behaviour!(
            query_filters_match_exactly,
            admin::query_filters_match_exactly
        );
        behaviour!(
            pagination_neither_skips_nor_repeats_under_inserts,
            admin::pagination_neither_skips_nor_repeats_under_inserts
        );
        behaviour!(
            retry_and_discard_apply_only_to_parked,
            admin::retry_and_discard_apply_only_to_parked
        );
        behaviour!(
            bulk_by_filter_changes_exactly_the_matching_parked_rows,
            admin::bulk_by_filter_changes_exactly_the_matching_parked_rows
        );
        behaviour!(
            a_dry_run_counts_what_a_bulk_action_would_change,
            admin::a_dry_run_counts_what_a_bulk_action_would_change
        );
        behaviour!(
            kpis_match_an_independent_count,
            admin::kpis_match_an_independent_count
        );
        behaviour!(
            lists_and_smtp_settings_round_trip,
            admin::lists_and_smtp_settings_round_trip
        );
        behaviour!(
            webhook_settings_round_trip_beside_the_email_row,
            channels::webhook_settings_round_trip_beside_the_email_row
        );
        behaviour!(
            seeds_store_only_what_is_missing,
            channels::seeds_store_only_what_is_missing
        );
        behaviour!(
            fallback_relays_round_trip_in_their_order,
            channels::fallback_relays_round_trip_in_their_order
        );
        behaviour!(
            webhook_fallbacks_round_trip_in_their_order,
            channels::webhook_fallbacks_round_trip_in_their_order
        );
        behaviour!(
            priority_is_stored_shown_and_filtered,
            serve_order::priority_is_stored_shown_and_filtered
        );
        behaviour!(
            a_newer_keyed_notification_supersedes_the_older_waiting_ones,
            conditions::a_newer_keyed_notification_supersedes_the_older_waiting_ones
        );
        behaviour!(
            clearing_a_condition_ends_only_that_sites_waiting_rows,
            conditions::clearing_a_condition_ends_only_that_sites_waiting_rows
        );
        behaviour!(
            a_row_cleared_at_the_site_is_stored_cleared_and_never_delivered,
            conditions::a_row_cleared_at_the_site_is_stored_cleared_and_never_delivered
        );
        behaviour!(
            a_late_older_keyed_notification_is_stored_superseded,
            conditions::a_late_older_keyed_notification_is_stored_superseded
        );
        behaviour!(
            a_row_ended_while_being_delivered_ends_so_unless_its_attempt_delivers_it,
            conditions::a_row_ended_while_being_delivered_ends_so_unless_its_attempt_delivers_it
        );
        behaviour!(
            a_row_ended_while_claimed_ends_when_its_claim_expires,
            conditions::a_row_ended_while_claimed_ends_when_its_claim_expires
        );
        behaviour!(
            a_flood_is_held_and_claimed_as_digests_when_its_window_ends,
            consolidation::a_flood_is_held_and_claimed_as_digests_when_its_window_ends
        );
        behaviour!(
            held_rows_are_superseded_and_cleared_like_waiting_ones,
            consolidation::held_rows_are_superseded_and_cleared_like_waiting_ones
        );
        behaviour!(
            consolidation_settings_round_trip,
            consolidation::consolidation_settings_round_trip
        );
        behaviour!(
            a_scheduled_time_is_kept_and_one_passed_on_arrival_is_due_at_once,
            scheduled::a_scheduled_time_is_kept_and_one_passed_on_arrival_is_due_at_once
        );
        behaviour!(
            a_scheduled_row_waiting_for_its_time_is_neither_stuck_nor_late,
            scheduled::a_scheduled_row_waiting_for_its_time_is_neither_stuck_nor_late
        );
        behaviour!(
            a_scheduled_row_is_superseded_and_cleared_like_a_waiting_one,
            scheduled::a_scheduled_row_is_superseded_and_cleared_like_a_waiting_one
        );
        behaviour!(
            a_scheduled_row_is_neither_held_nor_escalated,
            scheduled::a_scheduled_row_is_neither_held_nor_escalated
        );
        behaviour!(
            the_lifecycle_matches_its_model,
            lifecycle_model::the_lifecycle_matches_its_model
        );
        behaviour!(
            site_health_keeps_the_latest_report_per_node,
            site_health::site_health_keeps_the_latest_report_per_node
        );
        behaviour!(
            a_silent_node_goes_offline_and_a_report_brings_it_back,
            site_health::a_silent_node_goes_offline_and_a_report_brings_it_back
        );
        behaviour!(
            a_site_keeps_at_most_its_bound_of_nodes_and_silent_ones_are_forgotten,
            site_health::a_site_keeps_at_most_its_bound_of_nodes_and_silent_ones_are_forgotten
        );
    };
}

/// Escalation (`EscalationStore`): both SQL backends.
macro_rules! escalation_behaviours {
    () => {
        behaviour!(
            policies_round_trip_on_their_lists,
            escalation::policies_round_trip_on_their_lists
        );
        behaviour!(
            unanswered_pages_fire_in_order_on_time_then_the_incident_is_exhausted,
            escalation::unanswered_pages_fire_in_order_on_time_then_the_incident_is_exhausted
        );
        behaviour!(
            an_acknowledgement_stops_the_escalation_and_its_unsent_pages,
            escalation::an_acknowledgement_stops_the_escalation_and_its_unsent_pages
        );
        behaviour!(
            a_keyed_alarm_joins_its_conditions_incident_and_a_clear_ends_it,
            escalation::a_keyed_alarm_joins_its_conditions_incident_and_a_clear_ends_it
        );
        behaviour!(
            a_discarded_alarm_ends_its_incident,
            escalation::a_discarded_alarm_ends_its_incident
        );
        behaviour!(
            a_parked_page_escalates_at_once,
            escalation::a_parked_page_escalates_at_once
        );
        behaviour!(
            an_acknowledgement_is_announced_to_the_lists_it_reached,
            escalation::an_acknowledgement_is_announced_to_the_lists_it_reached
        );
        behaviour!(
            an_edit_of_the_policy_leaves_open_incidents_alone,
            escalation::an_edit_of_the_policy_leaves_open_incidents_alone
        );
        behaviour!(
            only_the_leases_epoch_fires_and_each_page_fires_once,
            escalation::only_the_leases_epoch_fires_and_each_page_fires_once
        );
        behaviour!(
            no_page_is_claimed_after_its_incident_was_acknowledged,
            escalation::no_page_is_claimed_after_its_incident_was_acknowledged
        );
        behaviour!(
            escalation_matches_its_model,
            escalation_model::escalation_matches_its_model
        );
    };
}

backend!(
    sqlite_backend,
    sqlite(),
    dispatch_behaviours & whole_store_behaviours & escalation_behaviours
);
backend!(
    #[ignore = "needs OUTBOX_TEST_MSSQL_URL (make test-mssql)"]
    mssql_backend,
    mssql().await,
    dispatch_behaviours & whole_store_behaviours & escalation_behaviours
);
// Only ingest makes rows Held (flood consolidation) or supersedes and clears them (condition
// keys), so the memory store, which has no ingest, runs the dispatch behaviours alone.
backend!(memory_backend, memory(), dispatch_behaviours);

/// Log lines at WARN and above, captured from everything running on the test's thread.
#[derive(Clone, Default)]
struct CapturedLog(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A resubmitted id is an expected answer (DUPLICATE), not an error, even when it races with
/// another replica inserting the same new ids and the server answers with a duplicate key
/// (2627), as after every site reconnect: nothing may be logged at ERROR (the MS SQL driver used
/// to log every such reply at ERROR). The race is made certain: another session inserts the
/// ids in a transaction it holds open until this submit is waiting on their keys. Runs on one
/// thread so the capture sees the driver's events.
#[tokio::test(flavor = "current_thread")]
#[ignore = "needs OUTBOX_TEST_MSSQL_URL (make test-mssql)"]
async fn mssql_duplicate_resubmits_log_no_error() {
    use central_outbox::records::InsertOutcome;
    use central_outbox::store::IngestStore;
    let log = CapturedLog::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _capture = tracing::subscriber::set_default(subscriber);
    let url = mssql_server();
    let database = ScratchDatabase::create(&url).await.unwrap();
    let store = MsSqlStore::open(database.options()).await.unwrap();
    // Warm: a connection open and the insert statement compiled (the first run of a statement
    // on a Babelfish connection takes seconds), so the racing submit reaches the server at once.
    let warm = seed::submission(&seed::Spec::new("north", "ops", "warm", seed::End::Pending));
    store.submit(vec![warm]).await.unwrap();
    let rows: Vec<_> = (0..20)
        .map(|i| {
            seed::submission(&seed::Spec::new(
                "north",
                "ops",
                &format!("race {i}"),
                seed::End::Pending,
            ))
        })
        .collect();

    // The other replica: the same ids and content, inserted and not yet committed.
    let mut other = session_of_its_own(&database.options()).await;
    other
        .simple_query("BEGIN TRANSACTION")
        .await
        .unwrap()
        .into_results()
        .await
        .unwrap();
    for row in &rows {
        let id = *row.submission.id.as_uuid();
        let hash: &[u8] = &row.hash.0;
        other
            .execute(
                "INSERT INTO dbo.Notifications (NotificationId, Type, ListName, Subject, Body, \
                 ContentHash, Status, SourceSiteId, SiteEnqueuedAt, CreatedAt) \
                 VALUES (@P1, N'Email', N'ops', N'x', N'x', @P2, N'Pending', N'north', \
                 SYSUTCDATETIME(), SYSUTCDATETIME())",
                &[&id, &hash],
            )
            .await
            .unwrap();
    }
    // Shared by the poll below (an `FnMut` asking again and again) and the commit after it.
    let other = tokio::sync::Mutex::new(other);
    let submit = store.submit(rows.clone());
    let commit = async {
        // Commit once the submit waits on the uncommitted keys: a session blocked by this one
        // (`sys.sysprocesses.blocked`, which SQL Server and Babelfish both keep).
        poll::until(
            "the submit waits on the other replica's uncommitted rows",
            std::time::Duration::from_secs(20),
            || async {
                let blocked = other
                    .lock()
                    .await
                    .simple_query(
                        "SELECT COUNT(*) FROM sys.sysprocesses \
                         WHERE blocked = @@SPID AND spid <> @@SPID",
                    )
                    .await
                    .unwrap()
                    .into_row()
                    .await
                    .unwrap()
                    .and_then(|row| row.get::<i32, _>(0))
                    .unwrap_or(0);
                (blocked > 0).then_some(())
            },
        )
        .await;
        other
            .lock()
            .await
            .simple_query("COMMIT")
            .await
            .unwrap()
            .into_results()
            .await
            .unwrap();
    };
    let (outcomes, ()) = tokio::join!(submit, commit);
    assert!(
        outcomes
            .unwrap()
            .iter()
            .all(|o| *o == InsertOutcome::Duplicate),
        "the other replica's rows are duplicates of these"
    );
    let again = store.submit(rows).await.unwrap();
    assert!(again.iter().all(|o| *o == InsertOutcome::Duplicate));
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(
        !text.contains("ERROR"),
        "a duplicate submit was logged at ERROR:\n{text}"
    );
    drop((store, other));
    database.drop_now().await.unwrap();
}

/// A plain driver session of its own on the database `options` names, outside any store: the
/// other replica or the onlooker of a test.
async fn session_of_its_own(
    options: &central_outbox::store::mssql::MsSqlOptions,
) -> tiberius::Client<tokio_util::compat::Compat<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect((options.host.as_str(), options.port))
        .await
        .unwrap();
    tiberius::Client::connect(
        options.tiberius_config(),
        tokio_util::compat::TokioAsyncWriteCompatExt::compat_write(tcp),
    )
    .await
    .unwrap()
}

/// The sessions a store holds on the server once it is open: its whole pool and the lease's
/// own connection, opened (and warmed) before `open` returns, so that no burst of dispatch or
/// ingest waits for a connection to be opened; with a smaller `Min Pool Size` only that many
/// and the lease's. Counted from another session, by the program name the store logs in with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs OUTBOX_TEST_MSSQL_URL (make test-mssql)"]
async fn mssql_store_opens_its_whole_pool_before_it_serves() {
    let url = mssql_server();
    let database = ScratchDatabase::create(&url).await.unwrap();
    for (min_idle, expected) in [(None, 3 + 1), (Some(1), 1 + 1)] {
        let mut options = database.options();
        options.pool_max_size = 3;
        options.pool_min_idle = min_idle;
        options.application_name = format!("pool-test-{}", uuid::Uuid::new_v4().simple());
        let store = MsSqlStore::open(options.clone()).await.unwrap();
        let mut counter = options.clone();
        counter.application_name = "pool-test-counter".into();
        let mut other = session_of_its_own(&counter).await;
        let sessions = other
            .query(
                "SELECT COUNT(DISTINCT spid) FROM sys.sysprocesses WHERE program_name = @P1",
                &[&options.application_name.as_str()],
            )
            .await
            .unwrap()
            .into_row()
            .await
            .unwrap()
            .and_then(|row| row.get::<i32, _>(0))
            .unwrap_or(0);
        assert_eq!(
            sessions, expected,
            "sessions open with Min Pool Size {min_idle:?} of a pool of 3 (and the lease's)"
        );
        drop((store, other));
    }
    database.drop_now().await.unwrap();
}

/// Migration 0010 builds dbo.ChannelConfig again (Babelfish cannot make a column nullable in
/// place): a database migrated to 0009 with email settings stored keeps them, row for row, and
/// the webhook channel's row can then be stored beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs OUTBOX_TEST_MSSQL_URL (make test-mssql)"]
async fn mssql_webhook_channel_migration_keeps_the_email_row() {
    use central_outbox::domain::channel::WebhookSettings;
    use central_outbox::store::{ChannelSettingsStore, ReadChannelSettings};
    let url = mssql_server();
    let database = ScratchDatabase::create(&url).await.unwrap();
    let store = MsSqlStore::open(database.options()).await.unwrap();
    drop(store);
    // Back to the table 0001 created, with an email row in it, and 0010 (and the later ones,
    // whose guards find their work done) not applied.
    let options = database.options();
    let tcp = tokio::net::TcpStream::connect((options.host.as_str(), options.port))
        .await
        .unwrap();
    let mut client = tiberius::Client::connect(
        options.tiberius_config(),
        tokio_util::compat::TokioAsyncWriteCompatExt::compat_write(tcp),
    )
    .await
    .unwrap();
    for sql in [
        "DROP TABLE dbo.ChannelConfig",
        "CREATE TABLE dbo.ChannelConfig (Channel nvarchar(32) COLLATE Latin1_General_BIN2 NOT NULL, \
         Host nvarchar(512) NOT NULL, Port int NOT NULL, TlsMode nvarchar(16) NOT NULL, \
         AuthMechanism nvarchar(16) NOT NULL CONSTRAINT DF_ChannelConfig_AuthMechanism DEFAULT (N'none'), \
         Username nvarchar(512) NULL, Password nvarchar(max) NULL, FromAddress nvarchar(1024) NOT NULL, \
         MaxRetries bigint NOT NULL, RetryDelayMs bigint NOT NULL, \
         Backoff nvarchar(16) NOT NULL CONSTRAINT DF_ChannelConfig_Backoff DEFAULT (N'fixed'), \
         MaxRetryDelayMs bigint NULL, MaxConcurrentConnections int NOT NULL, RateLimitPerSecond float NULL, \
         RateLimitBurst bigint NULL, TimeoutMs bigint NOT NULL, OverallTimeoutMs bigint NULL, \
         OAuthTokenUrl nvarchar(max) NULL, OAuthClientId nvarchar(max) NULL, \
         OAuthClientSecret nvarchar(max) NULL, OAuthScope nvarchar(max) NULL, UpdatedAt datetime2(3) NOT NULL, \
         CONSTRAINT PK_ChannelConfig PRIMARY KEY CLUSTERED (Channel))",
        "INSERT INTO dbo.ChannelConfig (Channel, Host, Port, TlsMode, FromAddress, MaxRetries, \
         RetryDelayMs, Backoff, MaxRetryDelayMs, MaxConcurrentConnections, RateLimitPerSecond, \
         RateLimitBurst, TimeoutMs, OverallTimeoutMs, UpdatedAt) VALUES (N'email', N'relay.test', 587, \
         N'starttls', N'o@x.test', 7, 90000, N'exponential', 600000, 3, 2.5, 5, 20000, 80000, SYSUTCDATETIME())",
        "DELETE FROM dbo.SchemaMigrations WHERE Version >= 10",
    ] {
        client
            .simple_query(sql)
            .await
            .unwrap()
            .into_results()
            .await
            .unwrap();
    }
    drop(client);
    let store = MsSqlStore::open(database.options()).await.unwrap();
    let smtp = store.smtp_settings().await.unwrap().unwrap().value;
    assert_eq!((smtp.host.as_str(), smtp.port), ("relay.test", 587));
    assert_eq!(smtp.policy.max_retries, 7);
    assert_eq!(smtp.overall_timeout, std::time::Duration::from_secs(80));
    store
        .put_webhook_settings(WebhookSettings::default())
        .await
        .unwrap();
    assert_eq!(
        store.webhook_settings().await.unwrap().unwrap().value,
        WebhookSettings::default()
    );
    assert_eq!(store.smtp_settings().await.unwrap().unwrap().value, smtp);
    drop(store);
    database.drop_now().await.unwrap();
}
