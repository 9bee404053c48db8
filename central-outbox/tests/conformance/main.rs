//! The store conformance suite: one list of behaviours every `OutboxStore` backend must show,
//! run against each backend through the same code. SQLite (the embedded default) always runs;
//! MS SQL runs when `OUTBOX_TEST_MSSQL_URL` names a server (`make test-mssql` starts one in
//! Docker), and otherwise each of its tests prints that it was skipped. Further backends join
//! the `backend!` list at the end.
//!
//! Each behaviour seeds its own store through the trait, so it knows independently what the
//! store should answer, and compares.

// Helpers are not #[test] fns, so clippy's allow-unwrap-in-tests does not reach them; a failed
// set-up step must fail the test loudly anyway.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod seed;

mod admin;
mod engine;
mod purge;

use std::future::Future;
use std::io::Write;

use central_outbox::store::mssql::{MsSqlStore, ScratchDatabase};
use central_outbox::store::sqlite::SqliteStore;

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

/// The variable naming the SQL Server the MS SQL tests run against, as a connection string
/// whose database (e.g. `master`) may create databases: each test gets a new one.
const MSSQL_URL_VAR: &str = "OUTBOX_TEST_MSSQL_URL";

/// MS SQL in a fresh database of its own on the server `OUTBOX_TEST_MSSQL_URL` names, dropped
/// when the test ends. `None` (and a line saying the test was skipped) when the variable is
/// unset.
pub async fn mssql() -> Option<Fixture<MsSqlStore>> {
    let Ok(url) = std::env::var(MSSQL_URL_VAR) else {
        // Written to the process's stderr directly rather than with eprintln!, which the test
        // harness captures and shows only for failures: a skip must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {MSSQL_URL_VAR} not set; an MS SQL conformance test did not run \
             (`make test-mssql` runs them against Babelfish or SQL Server)"
        );
        return None;
    };
    let database = ScratchDatabase::create(&url)
        .await
        .expect("create the test database");
    let store = MsSqlStore::open(database.options())
        .await
        .expect("open MS SQL store");
    Some(Fixture {
        store,
        _keep: Box::new(database),
    })
}

/// Runs one behaviour against a fresh store of a backend; does nothing for a backend whose
/// fixture is absent (it has said why).
pub async fn check<S, F, Fut>(fixture: impl Into<Option<Fixture<S>>>, behaviour: F)
where
    F: FnOnce(S) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(Fixture { store, _keep }) = fixture.into() else {
        return;
    };
    behaviour(store).await;
    drop(_keep);
}

/// Instantiates every behaviour for one backend as `#[tokio::test]`s in a module of its name.
macro_rules! backend {
    ($name:ident, $fixture:expr) => {
        mod $name {
            use super::*;

            macro_rules! behaviour {
                ($test:ident, $path:path) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $test() {
                        check($fixture, |store| async move { $path(&store).await }).await;
                    }
                };
            }

            behaviour!(
                submit_is_idempotent_and_refuses_other_content_under_an_id,
                engine::submit_is_idempotent_and_refuses_other_content_under_an_id
            );
            behaviour!(
                leases_are_exclusive_and_epochs_only_grow,
                engine::leases_are_exclusive_and_epochs_only_grow
            );
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
                concurrent_claims_never_hand_out_a_row_twice,
                engine::concurrent_claims_never_hand_out_a_row_twice
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
                kpis_match_an_independent_count,
                admin::kpis_match_an_independent_count
            );
            behaviour!(
                lists_and_smtp_settings_round_trip,
                admin::lists_and_smtp_settings_round_trip
            );
            behaviour!(
                purge_removes_only_terminal_rows_past_retention,
                purge::purge_removes_only_terminal_rows_past_retention
            );
        }
    };
}

backend!(sqlite_backend, sqlite());
backend!(mssql_backend, mssql().await);
