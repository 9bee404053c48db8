//! Warming a new pooled connection before the pool hands it out: the statements the hot paths
//! send (a submit through the procedure and an INSERT of many rows, the lease, both claims and
//! the next due time, the outcomes, the state select, a delivery's reads of its list and channel) run once each, so
//! that a stream, a dispatcher or a new leader never pays for a cold connection while someone
//! waits for it.
//!
//! Why: on Babelfish for PostgreSQL a TDS connection is a PostgreSQL backend of its own, and
//! each backend keeps its own catalog caches, compiled procedure bodies and statement plans.
//! Measured on a fresh connection (`first_use_of_each_statement`, below, on Babelfish 4.4): the
//! first INSERT of many rows took seconds and the first call of each procedure hundreds of
//! milliseconds to seconds, where a warm connection runs the same statement in a few
//! milliseconds. A stream that opened after a link reset got such a connection and acked its
//! first batch 6-15 s late. SQL Server shares its plan cache between sessions, so there the
//! warm-up costs a handful of round trips and, at most, a few plan compilations per replica.
//!
//! Invariants: the warm-up changes nothing. Every write runs inside a transaction that is rolled
//! back (the rows have fresh random ids, and the lease a name of this connection's own), and the
//! claims and outcomes are under epoch -1, which no lease ever holds (epochs start at 1), so
//! they claim and record nothing. A warm-up that fails leaves no transaction open (its batches
//! set XACT_ABORT, and a last batch rolls back whatever is left).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::Utc;
use outbox_domain::ScriptOrigin;
use tiberius::error::Error;

use super::pool::{Connection, Param};
use super::sql::{self, Statement};
use crate::domain::delivery::AttemptOutcome;
use crate::domain::retry::Transition;
use crate::domain::serve_order::ClaimLanes;
use crate::domain::status::Status;
use crate::domain::{
    NotificationContent, NotificationId, NotificationType, Priority, SiteId, Submission,
};
use crate::records::{AttemptRecord, LeaseEpoch, NewNotification};

/// The names under which the warm-up's rows and lease would be stored, were they not rolled
/// back: nothing real is called this (a list, site or lease of that name changes nothing, and
/// the rows never become visible).
const WARM_UP: &str = "central-outbox-warm-up";

/// An epoch no lease holds: epochs start at 1 and only go up.
const NO_EPOCH: LeaseEpoch = LeaseEpoch(-1);

/// Opens the transaction the warm-up's writes are rolled back in.
pub(super) const BEGIN: &str = include_str!("sql/warm_up_begin.sql");

/// Rolls back the warm-up's writes (and whatever a failed step left open).
pub(super) const ROLL_BACK: &str = include_str!("sql/warm_up_roll_back.sql");

/// Decodes an outcome text as `dbo.RecordAttemptOutcomes` does for one that holds a code.
const DECODE_OUTCOME_TEXT: &str = include_str!("sql/warm_up_decode_outcome_text.sql");

/// One statement of the warm-up, named for logs and measurements.
#[derive(Debug)]
pub(super) struct Step {
    pub name: &'static str,
    pub statement: Statement,
}

impl Step {
    fn fixed(name: &'static str, sql: &'static str) -> Self {
        Self {
            name,
            statement: Statement {
                sql: sql.into(),
                params: Vec::new(),
            },
        }
    }
}

/// A row as a site would submit it, with a fresh id.
fn row() -> Option<NewNotification> {
    let content = NotificationContent::parse(
        NotificationType::Email,
        WARM_UP.into(),
        "warm-up".into(),
        "warm-up".into(),
        String::new(),
    )
    .ok()?;
    let origin = ScriptOrigin::parse(WARM_UP.into(), WARM_UP.into(), None, None).ok()?;
    let site = SiteId::parse(WARM_UP.into()).ok()?;
    Some(NewNotification::new(Submission {
        id: NotificationId::generate(),
        content,
        provenance: origin.at_site(site, Utc::now()),
        priority: Priority::Normal,
        condition_key: None,
        cleared_at_site: None,
        deliver_after: None,
    }))
}

/// An outcome for a row that does not exist (row id -1), under [`NO_EPOCH`].
fn no_record() -> AttemptRecord {
    AttemptRecord {
        row_id: -1,
        id: NotificationId::generate(),
        attempt_no: 1,
        epoch: NO_EPOCH,
        outcome: AttemptOutcome::Delivered,
        error: None,
        duration: Duration::ZERO,
        transition: Transition {
            status: Status::Delivered,
            retry_count: 0,
            next_attempt_at: None,
            last_error: None,
            resolved_at: Some(Utc::now()),
            resolved_targets: None,
        },
        provider: None,
    }
}

/// Which statements a connection is warmed with: those of the pool it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// The main pool: every hot path ([`steps`]).
    Everything,
    /// The lease's own connection: it only takes, renews and releases the lease
    /// ([`lease_steps`]), so it is not made to pay for the rest (on Babelfish ~0.6 s instead of
    /// ~4.5 s of a server core).
    Lease,
}

impl Kind {
    /// The steps of this kind of warm-up.
    pub(super) fn steps(self) -> Vec<Step> {
        match self {
            Self::Everything => steps(),
            Self::Lease => lease_steps(),
        }
    }
}

/// A lease name of this warm-up's own, never a real one.
fn warm_up_lease() -> String {
    format!("{WARM_UP}-{:08x}", fastrand::u32(..))
}

/// The lease's statements: a take (rolled back) and a release that matches nothing.
pub(super) fn lease_steps() -> Vec<Step> {
    let lease = warm_up_lease();
    vec![
        Step::fixed("begin", BEGIN),
        Step {
            name: "acquire lease",
            statement: sql::acquire_lease(&lease, WARM_UP, Duration::from_secs(1)),
        },
        Step::fixed("roll back", ROLL_BACK),
        Step {
            name: "release lease",
            statement: sql::release_lease(&lease, WARM_UP, NO_EPOCH),
        },
    ]
}

/// The warm-up, in order: the writes between [`BEGIN`] and [`ROLL_BACK`], then the statements
/// that change nothing by their arguments. Each is the text the hot path sends (the INSERT of
/// many rows in its two-row form: on Babelfish the first INSERT of any shape pays for the
/// backend's caches, a later one of another row count only for its own parse).
pub(super) fn steps() -> Vec<Step> {
    let mut steps = vec![Step::fixed("begin", BEGIN)];
    if let (Some(one), Some(a), Some(b)) = (row(), row(), row()) {
        steps.push(Step {
            name: "submit one",
            statement: sql::submit_one(&one),
        });
        steps.push(Step {
            name: "submit many",
            statement: sql::insert_rows(&[&a, &b], &HashSet::new()),
        });
    }
    let lease = warm_up_lease();
    steps.push(Step {
        name: "acquire lease",
        statement: sql::acquire_lease(&lease, WARM_UP, Duration::from_secs(1)),
    });
    steps.push(Step::fixed("roll back", ROLL_BACK));
    let lanes = ClaimLanes {
        in_turn: 1,
        longest_waiting: 1,
    };
    let claim = Duration::from_secs(1);
    steps.push(Step {
        name: "claim due",
        statement: sql::claim_due(&lease, NO_EPOCH, NotificationType::Email, lanes, claim),
    });
    steps.push(Step {
        name: "claim digest",
        statement: sql::claim_digest(
            &lease,
            NO_EPOCH,
            NotificationType::Email,
            NotificationId::generate(),
            claim,
        ),
    });
    // Read after every claim that took all due rows: when the channel wakes next.
    steps.push(Step {
        name: "next due",
        statement: sql::select_next_due(NotificationType::Email),
    });
    let record = no_record();
    steps.push(Step {
        name: "record outcomes",
        statement: sql::record_outcomes(&lease, &[&record]),
    });
    // The decoding of outcome texts that hold a code (dbo.DecodeOutcomeText), which the outcome
    // above (for no row) never reaches.
    steps.push(Step::fixed("decode outcome text", DECODE_OUTCOME_TEXT));
    steps.push(Step {
        name: "state",
        statement: sql::select_state(NotificationId::generate()),
    });
    // A delivery's first reads of its list and of the SMTP settings (cached after that).
    steps.push(Step {
        name: "list",
        statement: sql::select_list(WARM_UP),
    });
    steps.push(Step {
        name: "channel",
        statement: sql::select_channel(WARM_UP),
    });
    steps.push(Step::fixed("ping", sql::PING));
    steps
}

/// Runs the warm-up on `conn` and returns how long it took. On an error the connection is left
/// with no transaction open if it is still usable (the pool discards it otherwise).
pub(super) async fn warm(conn: &mut Connection, kind: Kind) -> Result<Duration, Error> {
    let started = Instant::now();
    for step in kind.steps() {
        if let Err(e) = run(conn, &step).await {
            tracing::debug!(step = step.name, error = %e, "a warm-up step failed");
            if !conn.is_broken() {
                // Best effort: XACT_ABORT has normally rolled back already.
                let _ = conn.batch(ROLL_BACK, &[]).await;
            }
            return Err(e);
        }
    }
    Ok(started.elapsed())
}

async fn run(conn: &mut Connection, step: &Step) -> Result<(), Error> {
    let params: &[Param] = &step.statement.params;
    conn.batch(&step.statement.sql, params).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mssql::pool::Manager;
    use crate::store::mssql::{MsSqlStore, ScratchDatabase};

    #[test]
    fn every_step_is_built_and_the_writes_are_rolled_back() {
        let steps = steps();
        let names: Vec<&str> = steps.iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "begin",
                "submit one",
                "submit many",
                "acquire lease",
                "roll back",
                "claim due",
                "claim digest",
                "next due",
                "record outcomes",
                "decode outcome text",
                "state",
                "list",
                "channel",
                "ping"
            ]
        );
        let lease: Vec<&str> = lease_steps().iter().map(|s| s.name).collect();
        assert_eq!(
            lease,
            ["begin", "acquire lease", "roll back", "release lease"]
        );
        // Every write sits between the transaction's start and its rollback.
        let begin = names.iter().position(|n| *n == "begin");
        let roll_back = names.iter().position(|n| *n == "roll back");
        for write in ["submit one", "submit many", "acquire lease"] {
            let at = names.iter().position(|n| *n == write);
            assert!(begin < at && at < roll_back, "{write}");
        }
    }

    /// Time of each step on `conn`, in order.
    async fn timed(conn: &mut Connection, steps: &[Step]) -> Vec<(&'static str, Duration)> {
        let mut times = Vec::new();
        for step in steps {
            let started = Instant::now();
            run(conn, step).await.unwrap();
            times.push((step.name, started.elapsed()));
        }
        times
    }

    fn print(label: &str, times: &[(&'static str, Duration)]) {
        let cells: Vec<String> = times
            .iter()
            .map(|(name, t)| format!("{name} {:.0} ms", t.as_secs_f64() * 1e3))
            .collect();
        let total: Duration = times.iter().map(|(_, t)| *t).sum();
        println!(
            "{label}: total {:.0} ms; {}",
            total.as_secs_f64() * 1e3,
            cells.join(", ")
        );
    }

    /// What warms a Babelfish backend: each step's first run on a fresh connection, its second
    /// run, and a fresh connection's steps after the warm-up of another connection (the
    /// server's shared state) and after its own. Prints; asserts only that the warm-up leaves
    /// nothing behind.
    #[tokio::test]
    #[ignore = "needs OUTBOX_TEST_MSSQL_URL; a measurement (make test-mssql runs it)"]
    async fn first_use_of_each_statement() {
        let url = std::env::var("OUTBOX_TEST_MSSQL_URL").expect("OUTBOX_TEST_MSSQL_URL");
        let database = ScratchDatabase::create(&url).await.unwrap();
        let started = Instant::now();
        let first = MsSqlStore::open(database.options()).await.unwrap();
        println!("open with the migrations: {:?}", started.elapsed());
        drop(first);
        // A replica starting on a migrated database: its start-up cost of the warm-up.
        let started = Instant::now();
        let store = MsSqlStore::open(database.options()).await.unwrap();
        println!("open of a migrated database: {:?}", started.elapsed());
        let cold = Manager::cold(database.options());
        for round in 1..=3 {
            let mut conn = cold.connect_once().await.unwrap();
            print(
                &format!("round {round}, cold, first"),
                &timed(&mut conn, &steps()).await,
            );
            print(
                &format!("round {round}, cold, again"),
                &timed(&mut conn, &steps()).await,
            );
            let mut conn = cold.connect_once().await.unwrap();
            let warm_up = warm(&mut conn, Kind::Everything).await.unwrap();
            println!("round {round}: warm-up took {warm_up:?}");
            print(
                &format!("round {round}, warmed"),
                &timed(&mut conn, &steps()).await,
            );
        }
        // Each statement alone on a fresh connection: its cost in isolation.
        for step in steps() {
            if matches!(step.name, "begin" | "roll back") {
                continue;
            }
            let mut conn = cold.connect_once().await.unwrap();
            let wrapped = [
                Step::fixed("begin", BEGIN),
                step,
                Step::fixed("roll back", ROLL_BACK),
            ];
            print("alone", &timed(&mut conn, &wrapped).await);
        }
        // Nothing was stored by any of it.
        let mut conn = cold.connect_once().await.unwrap();
        let counts = conn
            .batch(
                "SELECT (SELECT COUNT(*) FROM dbo.Notifications) AS Rows, \
                 (SELECT COUNT(*) FROM dbo.Leases) AS Leases;",
                &[],
            )
            .await
            .unwrap();
        let row = &counts[0][0];
        assert_eq!(row.get::<i32, _>("Rows"), Some(0));
        assert_eq!(row.get::<i32, _>("Leases"), Some(0));
        // The pools close their connections in the background; the database is dropped when
        // `database` goes (best effort: a leftover is named outbox_test_*).
        drop((conn, store));
    }
}
