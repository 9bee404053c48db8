//! Idempotent ingest: a submit batch becomes one INSERT per chunk of rows, which stores the ids
//! not yet stored and reports each id's stored content hash, so that every row's outcome
//! (Accepted, Duplicate, Conflict) comes back in the same round trip (a single row calls the
//! procedure `dbo.SubmitNotification` instead, which answers the same). A stored row is never
//! changed. Each new row is stored with its priority and serve turn, the turns given as if the
//! rows were stored one by one in batch order (see `sql::insert_batch`).
//!
//! When another replica inserts one of the same new ids at the same moment, the chunk fails
//! with a duplicate key (2627/2601) and is rolled back whole; its rows are then inserted one by
//! one with a plain INSERT, each duplicate key resolved by comparing the stored ContentHash.

use std::collections::HashMap;

use uuid::Uuid;

use super::error::{ErrorClass, classify, to_store_error};
use super::{MsSqlStore, decode, result_set, sql};
use crate::store::{InsertOutcome, NewNotification, Result, StoreError};

/// Rows per INSERT statement: 14 parameters each stays well inside SQL Server's 2100 parameters
/// per request, and the VALUES list inside its 1000-row limit.
const ROWS_PER_STATEMENT: usize = 100;
const _: () = assert!(ROWS_PER_STATEMENT * sql::SUBMIT_COLUMNS <= 2100);

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
            Ok(mut results) => {
                let mut reported: HashMap<Uuid, bool> = HashMap::new();
                for row in result_set(&mut results, 0, "submit")? {
                    let id = decode::guid(&row, "NotificationId")?;
                    let hash = decode::req::<&[u8]>(&row, "ContentHash")?.to_vec();
                    reported.insert(id, decode::req::<i32>(&row, "Inserted")? == 1);
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

/// One plain INSERT; a duplicate key means the id is stored, and its hash decides.
async fn insert_one(store: &MsSqlStore, new: &NewNotification) -> Result<(InsertOutcome, Vec<u8>)> {
    let stmt = sql::insert_one(new);
    match store.batch_raw(&stmt.sql, &stmt.params).await {
        Ok(_) => Ok((InsertOutcome::Accepted, new.hash.0.to_vec())),
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
