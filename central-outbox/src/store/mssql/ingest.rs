//! Idempotent ingest, and the condition keys' clear: a submit batch becomes one statement per
//! chunk of rows, which stores the ids not yet stored and reports each id's stored content hash,
//! so that every row's outcome (Accepted, Duplicate, Conflict) comes back in the same round trip.
//! A single row calls the procedure `dbo.SubmitNotification`; rows without a condition key go in
//! one INSERT of many rows; a chunk with keyed rows, or rows cleared at the site, stores them
//! one after another in batch order in one transaction (each such row through the procedure,
//! which lets it supersede the older waiting rows of its site, list and key), so that it ends
//! the same rows as the SQLite backend's row-by-row inserts (see `sql::insert_rows`). A stored
//! row is never changed by its resubmit. Each new row is stored with its priority and serve
//! turn, the turns given as if the rows were stored one by one in batch order.
//!
//! Escalation: only the procedure opens or joins an alarm's incident, so the rows of a list with
//! a policy go through it like those of a list that consolidates (the same hint and guard: "a
//! list that consolidates" below stands for both).
//!
//! Flood consolidation: the procedure counts each row it stores as an arrival of its list's window
//! and holds it when over the list's threshold (procedures/SubmitNotification.sql); the INSERT of
//! many rows does not, so the rows of a list that consolidates go through the procedure in batch
//! order, as keyed rows do. Which lists consolidate is a hint kept per replica
//! ([`ConsolidatingLists`]); the batch itself checks the lists of the rows it puts in an INSERT
//! and, when one consolidates after all, stores nothing and names it, and the chunk is sent again
//! with that list's rows through the procedure (`sql::insert_rows`). So a row is counted whatever
//! the hint says, and a batch of lists that do not consolidate costs what it did.
//!
//! When another replica inserts one of the same new ids at the same moment, the chunk fails
//! with a duplicate key (2627/2601) and is rolled back whole; its rows are then stored one by
//! one through the procedure, in batch order, a duplicate key there resolved by comparing the
//! stored ContentHash.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tiberius::Row;
use uuid::Uuid;

use super::error::{ErrorClass, classify, to_store_error};
use super::{MsSqlStore, decode, result_set, sql};
use crate::domain::history::Actor;
use crate::domain::{ConditionKey, NotificationId, SiteId};
use crate::records::{InsertOutcome, NewNotification};
use crate::store::{Result, StoreError};

/// Rows per statement: at most 18 parameters each (a keyed row's procedure call) and one per
/// distinct list (the consolidation guard's) stays inside SQL Server's 2100 parameters per
/// request, and the VALUES list inside its 1000-row limit.
const ROWS_PER_STATEMENT: usize = 100;
const _: () = assert!(ROWS_PER_STATEMENT * (sql::SUBMIT_PARAMS + 1) <= 2100);

/// How long a replica trusts what it learnt about which lists consolidate: a list that no longer
/// does has its rows sent through the procedure (correct, only slower) for at most this long,
/// and a list that does costs one refused batch per this long to learn again.
const CONSOLIDATING_HINT_TTL: Duration = Duration::from_secs(60);

/// The lists this replica has seen consolidate (a batch's guard named them), so that their rows
/// go through the procedure at once rather than after a refused batch. Only a hint: the batch
/// checks the lists it stores otherwise, so a missing list costs a round trip, and a list that
/// stopped consolidating costs only speed.
#[derive(Debug, Default)]
pub(super) struct ConsolidatingLists {
    lists: HashSet<String>,
    /// When the oldest entry was learnt; the whole set is dropped after
    /// [`CONSOLIDATING_HINT_TTL`].
    since: Option<Instant>,
}

impl ConsolidatingLists {
    fn current(&mut self) -> HashSet<String> {
        if self
            .since
            .is_some_and(|since| since.elapsed() >= CONSOLIDATING_HINT_TTL)
        {
            *self = Self::default();
        }
        self.lists.clone()
    }

    fn learn(&mut self, lists: &HashSet<String>) {
        self.since.get_or_insert_with(Instant::now);
        self.lists.extend(lists.iter().cloned());
    }
}

/// The hint, read under its lock (held only to copy it: a poisoned lock still holds a set).
fn consolidating(store: &MsSqlStore) -> HashSet<String> {
    store
        .consolidating
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .current()
}

fn learn_consolidating(store: &MsSqlStore, lists: &HashSet<String>) {
    store
        .consolidating
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .learn(lists);
}

/// The lists a batch's consolidation guard named (`sql::CONSOLIDATING_LIST`), if it refused to
/// store anything; `None` when it stored the rows.
fn refused(results: &[Vec<Row>]) -> Result<Option<HashSet<String>>> {
    let Some(first) = results.first() else {
        return Ok(None);
    };
    let names_lists = first.first().is_some_and(|row| {
        row.columns()
            .iter()
            .any(|c| c.name() == sql::CONSOLIDATING_LIST)
    });
    if !names_lists {
        return Ok(None);
    }
    first
        .iter()
        .map(|row| decode::text(row, sql::CONSOLIDATING_LIST))
        .collect::<Result<HashSet<String>>>()
        .map(Some)
}

/// Tells the hint of this replica whether `list`, just written or deleted here, consolidates.
pub(super) fn note_list(store: &MsSqlStore, list: &str, consolidates: bool) {
    let mut hint = store
        .consolidating
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if consolidates {
        hint.learn(&HashSet::from([list.to_owned()]));
    } else {
        hint.lists.remove(list);
    }
}

fn outcome(inserted: bool, stored: &[u8], submitted: &[u8; 32]) -> InsertOutcome {
    if inserted {
        InsertOutcome::Accepted
    } else if stored == submitted {
        InsertOutcome::Duplicate
    } else {
        InsertOutcome::Conflict
    }
}

pub(super) async fn submit(
    store: &MsSqlStore,
    batch: &[NewNotification],
) -> Result<Vec<InsertOutcome>> {
    // An id repeated within the batch is inserted once (its first occurrence); the repeats are
    // judged against what is stored, as if they had come in a later batch.
    let mut first: HashMap<Uuid, usize> = HashMap::new();
    let mut unique = Vec::new();
    for (i, new) in batch.iter().enumerate() {
        first
            .entry(*new.submission.id.as_uuid())
            .or_insert_with(|| {
                unique.push(i);
                i
            });
    }
    let mut outcomes: Vec<Option<InsertOutcome>> = vec![None; batch.len()];
    let mut stored_hash: HashMap<Uuid, Vec<u8>> = HashMap::new();
    let mut consolidating = consolidating(store);
    for chunk in unique.chunks(ROWS_PER_STATEMENT) {
        let rows: Vec<&NewNotification> = chunk.iter().map(|&i| &batch[i]).collect();
        // Each refusal names at least one list not in the set yet (the guard checks only the
        // lists of rows outside it), so this ends within one run per list of the chunk.
        let answer = loop {
            let stmt = sql::insert_rows(&rows, &consolidating);
            match store.batch_raw(&stmt.sql, &stmt.params).await {
                Ok(results) => match refused(&results)? {
                    Some(lists) => {
                        tracing::debug!(?lists, "lists consolidate; storing their rows in order");
                        learn_consolidating(store, &lists);
                        consolidating.extend(lists);
                    }
                    None => break Ok(results),
                },
                Err(e) => break Err(e),
            }
        };
        match answer {
            Ok(results) => {
                // One result for the INSERT's rows, and one per procedure call.
                let mut reported: HashMap<Uuid, bool> = HashMap::new();
                for row in results.iter().flatten() {
                    let id = decode::guid(row, "NotificationId")?;
                    let hash = decode::req::<&[u8]>(row, "ContentHash")?.to_vec();
                    reported.insert(id, decode::req::<i32>(row, "Inserted")? == 1);
                    stored_hash.insert(id, hash);
                }
                for &i in chunk {
                    let new = &batch[i];
                    let id = *new.submission.id.as_uuid();
                    let (Some(&inserted), Some(hash)) = (reported.get(&id), stored_hash.get(&id))
                    else {
                        return Err(StoreError::Corrupt(format!(
                            "submit: notification {id} is neither inserted nor stored"
                        )));
                    };
                    outcomes[i] = Some(outcome(inserted, hash, &new.hash.0));
                }
            }
            Err(e) if classify(&e) == ErrorClass::DuplicateKey => {
                tracing::debug!("concurrent insert of the same id; inserting row by row");
                for &i in chunk {
                    let (result, hash) = insert_one(store, &batch[i]).await?;
                    stored_hash.insert(*batch[i].submission.id.as_uuid(), hash);
                    outcomes[i] = Some(result);
                }
            }
            Err(e) => return Err(to_store_error("submit", &e)),
        }
    }
    batch
        .iter()
        .zip(outcomes)
        .map(|(new, outcome_of_first)| match outcome_of_first {
            Some(o) => Ok(o),
            None => {
                let id = new.submission.id.as_uuid();
                let hash = stored_hash.get(id).ok_or_else(|| {
                    StoreError::Corrupt(format!("submit: no stored hash for repeated id {id}"))
                })?;
                Ok(outcome(false, hash, &new.hash.0))
            }
        })
        .collect()
}

/// One row through the submit procedure; a duplicate key (another replica inserting the id
/// between the procedure's check and its INSERT) means the id is stored, and its hash decides.
async fn insert_one(store: &MsSqlStore, new: &NewNotification) -> Result<(InsertOutcome, Vec<u8>)> {
    let stmt = sql::submit_one(new);
    match store.batch_raw(&stmt.sql, &stmt.params).await {
        Ok(mut results) => procedure_answer(&mut results, new),
        Err(e) if classify(&e) == ErrorClass::DuplicateKey => {
            let stmt = sql::select_content_hash(new.submission.id);
            let mut results = store.batch("submit", &stmt.sql, &stmt.params).await?;
            let rows = result_set(&mut results, 0, "submit")?;
            let Some(row) = rows.first() else {
                // The key was not the id's: another replica opened the incident of this row's
                // condition at the same moment (UX_Incidents_Condition). Stored again now, the
                // row joins that incident.
                let stmt = sql::submit_one(new);
                let mut results = store.batch("submit", &stmt.sql, &stmt.params).await?;
                return procedure_answer(&mut results, new);
            };
            let hash = decode::req::<&[u8]>(row, "ContentHash")?.to_vec();
            Ok((outcome(false, &hash, &new.hash.0), hash))
        }
        Err(e) => Err(to_store_error("submit", &e)),
    }
}

/// The submit procedure's answer for `new`: the outcome and the stored hash.
fn procedure_answer(
    results: &mut [Vec<Row>],
    new: &NewNotification,
) -> Result<(InsertOutcome, Vec<u8>)> {
    let rows = result_set(results, 0, "submit")?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt("submit: the procedure gave no answer".into()))?;
    let hash = decode::req::<&[u8]>(row, "ContentHash")?.to_vec();
    let inserted = decode::req::<i32>(row, "Inserted")? == 1;
    Ok((outcome(inserted, &hash, &new.hash.0), hash))
}

/// Ends the waiting rows of `site` with condition key `key` as Cleared, recorded as done by
/// `actor`; returns their ids (`IngestStore::clear_condition`).
pub(super) async fn clear_condition(
    store: &MsSqlStore,
    site: &SiteId,
    key: &ConditionKey,
    actor: &Actor,
) -> Result<Vec<NotificationId>> {
    let stmt = sql::clear_condition(site, key, actor);
    let mut results = store
        .batch("clear condition", &stmt.sql, &stmt.params)
        .await?;
    result_set(&mut results, 0, "clear condition")?
        .iter()
        .map(|row| decode::guid(row, "NotificationId").map(NotificationId::from_uuid))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;
    use outbox_domain::ScriptOrigin;

    use super::*;
    use crate::domain::channel::{ListInput, NotificationList};
    use crate::domain::consolidation::Consolidation;
    use crate::domain::status::Status;
    use crate::domain::{NotificationContent, NotificationType, Priority, Submission};
    use crate::store::mssql::ScratchDatabase;
    use crate::store::{AdminStore, ChannelSettingsStore, IngestStore};

    fn row(list: &str, key: Option<&str>) -> NewNotification {
        let content = NotificationContent::parse(
            NotificationType::Email,
            list.into(),
            "Tank 4 high level".into(),
            "level 97%".into(),
            String::new(),
        )
        .unwrap();
        let origin = ScriptOrigin::parse("node-1".into(), "alarm.py".into(), None, None).unwrap();
        NewNotification::new(Submission {
            id: NotificationId::generate(),
            content,
            provenance: origin.at_site(SiteId::parse("north".into()).unwrap(), Utc::now()),
            priority: Priority::Normal,
            condition_key: key.map(|k| ConditionKey::parse(k.into(), "condition_key").unwrap()),
            cleared_at_site: None,
            deliver_after: None,
        })
    }

    async fn statuses(store: &MsSqlStore, rows: &[NewNotification]) -> Vec<Status> {
        let mut statuses = Vec::new();
        for row in rows {
            let state = store.state(row.submission.id).await.unwrap().unwrap();
            statuses.push(state.status);
        }
        statuses
    }

    /// A replica that has not seen a list consolidate (another one turned it on) puts the
    /// list's rows in an INSERT of many rows; the batch's guard refuses, and the rows go through
    /// the procedure: counted and held as if the replica had known. (The conformance suite's
    /// store learns of its own lists when it writes them, so it never takes this path.)
    #[tokio::test]
    #[ignore = "needs OUTBOX_TEST_MSSQL_URL (make test-mssql)"]
    async fn a_replica_unaware_that_a_list_consolidates_still_holds_its_flood() {
        let url = std::env::var("OUTBOX_TEST_MSSQL_URL").expect("OUTBOX_TEST_MSSQL_URL");
        let database = ScratchDatabase::create(&url).await.unwrap();
        let writer = MsSqlStore::open(database.options()).await.unwrap();
        let list = NotificationList::parse(ListInput {
            name: "flood".into(),
            recipients: vec!["ops@plant.test".into()],
            consolidation: Some(Consolidation::parse(2, Duration::from_secs(3600), 3).unwrap()),
            ..Default::default()
        })
        .unwrap();
        writer.upsert_list(list).await.unwrap();

        // A long run of the list's plain rows (an INSERT, were it not for the guard), a keyed
        // row of another list, and a long run of a third.
        let replica = MsSqlStore::open(database.options()).await.unwrap();
        let flood: Vec<NewNotification> = (0..MIN_RUN).map(|_| row("flood", None)).collect();
        let ops: Vec<NewNotification> = (0..MIN_RUN).map(|_| row("ops", None)).collect();
        let mut batch = flood.clone();
        batch.push(row("other", Some("pump7.trip")));
        batch.extend(ops.iter().cloned());
        let outcomes = replica.submit(batch.clone()).await.unwrap();
        assert!(outcomes.iter().all(|o| *o == InsertOutcome::Accepted));
        let mut expected = vec![Status::Pending; 2];
        expected.extend(vec![Status::Held; MIN_RUN - 2]);
        assert_eq!(statuses(&replica, &flood).await, expected);
        assert_eq!(
            statuses(&replica, &batch[MIN_RUN..]).await,
            vec![Status::Pending; MIN_RUN + 1]
        );
        assert!(consolidating(&replica).contains("flood"), "learnt");

        // All plain rows, the list's among them: the INSERT of every row is refused too.
        let third = MsSqlStore::open(database.options()).await.unwrap();
        let mixed = vec![row("ops", None), row("flood", None), row("flood", None)];
        third.submit(mixed.clone()).await.unwrap();
        // Over the threshold even if the hour turned between the two submits (then the first
        // of these starts the count).
        assert_eq!(statuses(&third, &mixed[..1]).await, [Status::Pending]);
        assert_eq!(statuses(&third, &mixed[2..]).await, [Status::Held]);
        // `database` goes last, when the stores' connections are gone (as in the conformance
        // suite's fixture).
    }

    /// A run of plain rows long enough for an INSERT of many rows (`sql::MIN_INSERT_RUN`).
    const MIN_RUN: usize = 20;

    #[test]
    fn outcomes_follow_the_stored_hash() {
        let mine = [7u8; 32];
        assert_eq!(outcome(true, &mine, &mine), InsertOutcome::Accepted);
        assert_eq!(outcome(false, &mine, &mine), InsertOutcome::Duplicate);
        assert_eq!(outcome(false, &[8u8; 32], &mine), InsertOutcome::Conflict);
    }
}
