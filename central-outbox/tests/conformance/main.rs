//! The store conformance suite: one list of behaviours every `OutboxStore` backend must show,
//! run against each backend through the same code. SQLite (the embedded default) always runs;
//! further backends join the `backends!` list below.
//!
//! Each behaviour seeds its own store through the trait, so it knows independently what the
//! store should answer, and compares.

// Helpers are not #[test] fns, so clippy's allow-unwrap-in-tests does not reach them; a failed
// set-up step must fail the test loudly anyway.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod seed;

mod admin;
mod purge;

use std::future::Future;

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
