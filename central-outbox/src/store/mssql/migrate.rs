//! Versioned schema migrations for the MS SQL backend, embedded from `migrations/mssql/` at build
//! time and applied at start-up, then the stored procedures brought up to date from their files
//! (`procedures`).
//!
//! Replicas starting together serialise on an exclusive, session-owned application lock
//! (`sp_getapplock`) taken on a connection of its own: the first applies what is missing, the
//! others wait, then find nothing to do. Each migration commits together with its
//! `SchemaMigrations` row (a file's `GO`-separated batches run in one transaction), so a crash
//! mid-way leaves the previous version intact; each procedure likewise with its
//! `SchemaProcedures` row. The lock belongs to the session, so closing the connection releases it
//! whatever happened.
//!
//! The numbered migrations hold schema only (tables, columns, indexes, constraints); an applied
//! one is never run again, and nothing checks its text, so one that used to create procedures
//! was emptied of them when they moved to their own files.

use std::time::Duration;

use super::error::to_store_error;
use super::pool::Manager;
use super::{decode, procedures, result_set, sql};
use crate::store::{Result, StoreError};

pub(super) struct Migration {
    pub version: i32,
    pub name: &'static str,
    /// The file's name under migrations/mssql (the parse check names it so).
    #[cfg_attr(not(test), allow(dead_code))]
    pub file: &'static str,
    pub sql: &'static str,
}

/// Every migration, in order. Append only: an applied migration is never run again (the ones
/// that created procedures were emptied of them; a procedure changes in its own file).
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        file: "0001_initial.sql",
        sql: include_str!("../../../../migrations/mssql/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "dispatch_procedures",
        file: "0002_dispatch_procedures.sql",
        sql: include_str!("../../../../migrations/mssql/0002_dispatch_procedures.sql"),
    },
    Migration {
        version: 3,
        name: "list_recipients_without_fk_on_babelfish",
        file: "0003_list_recipients_without_fk_on_babelfish.sql",
        sql: include_str!(
            "../../../../migrations/mssql/0003_list_recipients_without_fk_on_babelfish.sql"
        ),
    },
    Migration {
        version: 4,
        name: "submit_procedure",
        file: "0004_submit_procedure.sql",
        sql: include_str!("../../../../migrations/mssql/0004_submit_procedure.sql"),
    },
    Migration {
        version: 5,
        name: "serve_order",
        file: "0005_serve_order.sql",
        sql: include_str!("../../../../migrations/mssql/0005_serve_order.sql"),
    },
    Migration {
        version: 6,
        name: "condition_keys",
        file: "0006_condition_keys.sql",
        sql: include_str!("../../../../migrations/mssql/0006_condition_keys.sql"),
    },
    Migration {
        version: 7,
        name: "consolidation",
        file: "0007_consolidation.sql",
        sql: include_str!("../../../../migrations/mssql/0007_consolidation.sql"),
    },
    Migration {
        version: 8,
        name: "site_health",
        file: "0008_site_health.sql",
        sql: include_str!("../../../../migrations/mssql/0008_site_health.sql"),
    },
    Migration {
        version: 9,
        name: "outcome_texts",
        file: "0009_outcome_texts.sql",
        sql: include_str!("../../../../migrations/mssql/0009_outcome_texts.sql"),
    },
    Migration {
        version: 10,
        name: "webhook_channel",
        file: "0010_webhook_channel.sql",
        sql: include_str!("../../../../migrations/mssql/0010_webhook_channel.sql"),
    },
    Migration {
        version: 11,
        name: "schema_procedures",
        file: "0011_schema_procedures.sql",
        sql: include_str!("../../../../migrations/mssql/0011_schema_procedures.sql"),
    },
    Migration {
        version: 12,
        name: "latest_condition_state",
        file: "0012_latest_condition_state.sql",
        sql: include_str!("../../../../migrations/mssql/0012_latest_condition_state.sql"),
    },
    Migration {
        version: 13,
        name: "fallback_relays",
        file: "0013_fallback_relays.sql",
        sql: include_str!("../../../../migrations/mssql/0013_fallback_relays.sql"),
    },
    Migration {
        version: 14,
        name: "escalation",
        file: "0014_escalation.sql",
        sql: include_str!("../../../../migrations/mssql/0014_escalation.sql"),
    },
    Migration {
        version: 15,
        name: "webhook_fallbacks",
        file: "0015_webhook_fallbacks.sql",
        sql: include_str!("../../../../migrations/mssql/0015_webhook_fallbacks.sql"),
    },
    Migration {
        version: 16,
        name: "scheduled_delivery",
        file: "0016_scheduled_delivery.sql",
        sql: include_str!("../../../../migrations/mssql/0016_scheduled_delivery.sql"),
    },
    Migration {
        version: 17,
        name: "site_status_feed",
        file: "0017_site_status_feed.sql",
        sql: include_str!("../../../../migrations/mssql/0017_site_status_feed.sql"),
    },
    Migration {
        version: 18,
        name: "status_callbacks",
        file: "0018_status_callbacks.sql",
        sql: include_str!("../../../../migrations/mssql/0018_status_callbacks.sql"),
    },
];

/// Brings the schema, then the procedures, up to date. Fails if the database was migrated by a
/// newer binary (its schema version, or a procedure's revision, is newer than this one knows),
/// or the lock is not granted in time (another replica is migrating).
pub(super) async fn apply(pool: &bb8::Pool<Manager>, lock_timeout: Duration) -> Result<()> {
    // A connection of its own, closed at the end, so the session's lock goes with it.
    let mut conn = pool
        .dedicated_connection()
        .await
        .map_err(|e| to_store_error("migrations: connect", &e))?;
    // The lock wait is one server response, so it must end before the driver's per-response
    // timeout (`lock_timeout`) gives up on the connection. A replica that waits longer than that
    // fails start-up, and its supervisor starts it again.
    let lock = sql::migration_lock(lock_timeout.mul_f64(0.8));
    let bound = lock_timeout * 4;
    let run = async {
        let mut results = conn
            .batch(&lock.sql, &lock.params)
            .await
            .map_err(|e| to_store_error("migrations: lock", &e))?;
        let granted = match result_set(&mut results, 0, "migrations: lock")?.first() {
            Some(row) => decode::req::<i32>(row, "Result")? >= 0,
            None => false,
        };
        if !granted {
            return Err(StoreError::Unavailable(
                "migrations: another replica held the schema lock too long; try again".into(),
            ));
        }
        let mut results = conn
            .batch(sql::MIGRATION_VERSION, &[])
            .await
            .map_err(|e| to_store_error("migrations: read version", &e))?;
        let current = match result_set(&mut results, 0, "migrations: read version")?.first() {
            Some(row) => decode::req::<i32>(row, "Version")?,
            None => {
                return Err(StoreError::Corrupt(
                    "migrations: no schema version was returned".into(),
                ));
            }
        };
        let known = MIGRATIONS.last().map_or(0, |m| m.version);
        if current > known {
            return Err(StoreError::Unavailable(format!(
                "the database schema is at version {current}, newer than this binary knows \
                 ({known}); upgrade central-outbox"
            )));
        }
        for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
            tracing::info!(
                version = migration.version,
                name = migration.name,
                "applying MS SQL migration"
            );
            conn.batch(sql::MIGRATION_BEGIN, &[])
                .await
                .map_err(|e| to_store_error("migrations: begin", &e))?;
            for batch in sql::migration_batches(migration.sql) {
                conn.batch(batch, &[])
                    .await
                    .map_err(|e| to_store_error("migrations: apply", &e))?;
            }
            let record = sql::migration_record(migration);
            conn.batch(&record.sql, &record.params)
                .await
                .map_err(|e| to_store_error("migrations: record", &e))?;
        }
        // After the schema they use, under the same lock.
        procedures::apply(&mut conn).await?;
        conn.batch(sql::MIGRATION_UNLOCK, &[])
            .await
            .map_err(|e| to_store_error("migrations: unlock", &e))?;
        Ok(())
    };
    tokio::time::timeout(bound, run).await.unwrap_or_else(|_| {
        Err(StoreError::Unavailable(format!(
            "migrations did not finish within {bound:?}"
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_increase_and_files_guard_every_create() {
        let mut previous = 0;
        for m in MIGRATIONS {
            assert!(m.version > previous, "{}", m.name);
            previous = m.version;
            // Plain CREATE guarded by an existence check, so a re-run (or a DBA's manual run)
            // is harmless and Babelfish accepts it: a table or index is created only if it is
            // missing (`IF ... BEGIN CREATE`), a column added only if missing.
            assert!(!m.sql.contains("CREATE OR ALTER"));
            let lines: Vec<&str> = m.sql.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let guarded = |at: usize| lines[..at].last().is_some_and(|l| l.starts_with("IF "));
                if line.starts_with("CREATE ") {
                    let at = if i > 0 && lines[i - 1] == "BEGIN" {
                        i - 1
                    } else {
                        i
                    };
                    assert!(guarded(at), "{}: unguarded {line}", m.name);
                } else if line.trim_start().starts_with("ALTER TABLE") {
                    assert!(guarded(i), "{}: unguarded {line}", m.name);
                }
            }
        }
    }

    /// Schema only: a procedure or function lives in its file under procedures/, so what runs
    /// is that file, never the last migration that happened to create it.
    #[test]
    fn migrations_create_no_procedure() {
        for m in MIGRATIONS {
            for kind in ["PROCEDURE", "FUNCTION"] {
                assert!(
                    !m.sql.to_uppercase().contains(&format!("CREATE {kind}")),
                    "{} creates a {kind}: put it in migrations/mssql/procedures/",
                    m.file
                );
            }
        }
    }
}
