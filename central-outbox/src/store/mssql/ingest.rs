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
//! When another replica inserts one of the same new ids at the same moment, the chunk fails
//! with a duplicate key (2627/2601) and is rolled back whole; its rows are then stored one by
//! one through the procedure, in batch order, a duplicate key there resolved by comparing the
//! stored ContentHash.

use std::collections::HashMap;

use uuid::Uuid;

use super::error::{ErrorClass, classify, to_store_error};
use super::{MsSqlStore, decode, result_set, sql};
use crate::domain::history::Actor;
use crate::domain::{ConditionKey, NotificationId, SiteId};
use crate::store::{InsertOutcome, NewNotification, Result, StoreError};

/// Rows per statement: at most 17 parameters each (a keyed row's procedure call) stays inside
/// SQL Server's 2100 parameters per request, and the VALUES list inside its 1000-row limit.
const ROWS_PER_STATEMENT: usize = 100;
const _: () = assert!(ROWS_PER_STATEMENT * sql::SUBMIT_PARAMS <= 2100);

fn outcome(inserted: bool, stored: &[u8], submitted: &[u8; 32]) -> InsertOutcome {
    if inserted {
        InsertOutcome::Accepted
    } else if stored == submitted {
        InsertOutcome::Duplicate
    } else {
        InsertOutcome::Conflict
    }
}

pub async fn submit(store: &MsSqlStore, batch: &[NewNotification]) -> Result<Vec<InsertOutcome>> {
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
    for chunk in unique.chunks(ROWS_PER_STATEMENT) {
        let rows: Vec<&NewNotification> = chunk.iter().map(|&i| &batch[i]).collect();
        let stmt = sql::insert_rows(&rows);
        match store.batch_raw(&stmt.sql, &stmt.params).await {
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
        Ok(mut results) => {
            let rows = result_set(&mut results, 0, "submit")?;
            let row = rows.first().ok_or_else(|| {
                StoreError::Corrupt("submit: the procedure gave no answer".into())
            })?;
            let hash = decode::req::<&[u8]>(row, "ContentHash")?.to_vec();
            let inserted = decode::req::<i32>(row, "Inserted")? == 1;
            Ok((outcome(inserted, &hash, &new.hash.0), hash))
        }
        Err(e) if classify(&e) == ErrorClass::DuplicateKey => {
            let stmt = sql::select_content_hash(new.submission.id);
            let mut results = store.batch("submit", &stmt.sql, &stmt.params).await?;
            let rows = result_set(&mut results, 0, "submit")?;
            let row = rows.first().ok_or_else(|| {
                StoreError::Unavailable("submit: duplicate key, but the row is gone".into())
            })?;
            let hash = decode::req::<&[u8]>(row, "ContentHash")?.to_vec();
            Ok((outcome(false, &hash, &new.hash.0), hash))
        }
        Err(e) => Err(to_store_error("submit", &e)),
    }
}

/// Ends the waiting rows of `site` with condition key `key` as Cleared, recorded as done by
/// `actor`; returns their ids (`OutboxStore::clear_condition`).
pub async fn clear_condition(
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
    use super::*;

    #[test]
    fn outcomes_follow_the_stored_hash() {
        let mine = [7u8; 32];
        assert_eq!(outcome(true, &mine, &mine), InsertOutcome::Accepted);
        assert_eq!(outcome(false, &mine, &mine), InsertOutcome::Duplicate);
        assert_eq!(outcome(false, &[8u8; 32], &mine), InsertOutcome::Conflict);
    }
}
