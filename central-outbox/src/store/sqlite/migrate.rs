//! Versioned schema migrations for the SQLite backend, embedded from `migrations/sqlite/` at
//! build time. They run in one IMMEDIATE transaction, which takes SQLite's write lock first, so
//! two replicas opening the same file at once apply each migration exactly once.

use rusqlite::{Connection, TransactionBehavior};

struct Migration {
    version: i64,
    name: &'static str,
    sql: &'static str,
}

/// Every migration, in order. Append only: an applied migration is never edited.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        sql: include_str!("../../../../migrations/sqlite/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "admin",
        sql: include_str!("../../../../migrations/sqlite/0002_admin.sql"),
    },
    Migration {
        version: 3,
        name: "channels",
        sql: include_str!("../../../../migrations/sqlite/0003_channels.sql"),
    },
    Migration {
        version: 4,
        name: "serve_order",
        sql: include_str!("../../../../migrations/sqlite/0004_serve_order.sql"),
    },
    Migration {
        version: 5,
        name: "condition_keys",
        sql: include_str!("../../../../migrations/sqlite/0005_condition_keys.sql"),
    },
    Migration {
        version: 6,
        name: "consolidation",
        sql: include_str!("../../../../migrations/sqlite/0006_consolidation.sql"),
    },
    Migration {
        version: 7,
        name: "site_health",
        sql: include_str!("../../../../migrations/sqlite/0007_site_health.sql"),
    },
    Migration {
        version: 8,
        name: "webhook_channel",
        sql: include_str!("../../../../migrations/sqlite/0008_webhook_channel.sql"),
    },
    Migration {
        version: 9,
        name: "latest_condition_state",
        sql: include_str!("../../../../migrations/sqlite/0009_latest_condition_state.sql"),
    },
    Migration {
        version: 10,
        name: "fallback_relays",
        sql: include_str!("../../../../migrations/sqlite/0010_fallback_relays.sql"),
    },
    Migration {
        version: 11,
        name: "escalation",
        sql: include_str!("../../../../migrations/sqlite/0011_escalation.sql"),
    },
    Migration {
        version: 12,
        name: "webhook_fallbacks",
        sql: include_str!("../../../../migrations/sqlite/0012_webhook_fallbacks.sql"),
    },
    Migration {
        version: 13,
        name: "scheduled_delivery",
        sql: include_str!("../../../../migrations/sqlite/0013_scheduled_delivery.sql"),
    },
    Migration {
        version: 14,
        name: "site_status_feed",
        sql: include_str!("../../../../migrations/sqlite/0014_site_status_feed.sql"),
    },
    Migration {
        version: 15,
        name: "status_callbacks",
        sql: include_str!("../../../../migrations/sqlite/0015_status_callbacks.sql"),
    },
    Migration {
        version: 16,
        name: "kpi_delivered_index",
        sql: include_str!("../../../../migrations/sqlite/0016_kpi_delivered_index.sql"),
    },
];

/// Brings the schema up to date. Fails if the database was migrated by a newer binary.
pub(super) fn apply(conn: &mut Connection) -> Result<(), group_commit::Error> {
    let txn = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    txn.execute_batch(include_str!("sql/migration_table.sql"))?;
    let current: i64 = txn.query_row(include_str!("sql/migration_version.sql"), [], |row| {
        row.get(0)
    })?;
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    if current > known {
        return Err(group_commit::Error::TaskFailed(format!(
            "the database schema is at version {current}, newer than this binary knows ({known}); \
             upgrade central-outbox"
        )));
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "applying migration"
        );
        txn.execute_batch(migration.sql)?;
        txn.execute(
            include_str!("sql/migration_record.sql"),
            rusqlite::params![
                migration.version,
                migration.name,
                chrono::Utc::now().timestamp_millis()
            ],
        )?;
    }
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applying_twice_is_a_no_op() {
        let mut conn = Connection::open_in_memory().unwrap();
        apply(&mut conn).unwrap();
        apply(&mut conn).unwrap();
        let versions: i64 = conn
            .query_row("SELECT COUNT(*) FROM SchemaMigrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(versions, MIGRATIONS.len() as i64);
    }

    /// A database at version 3 with rows waiting: the upgrade numbers each site's waiting rows
    /// from 1 in due order (so the sites take turns at once), leaves resolved rows alone, and
    /// makes every existing row normal.
    #[test]
    fn upgrading_gives_waiting_rows_their_turns() {
        let mut conn = Connection::open_in_memory().unwrap();
        for m in MIGRATIONS.iter().filter(|m| m.version <= 3) {
            conn.execute_batch(m.sql).unwrap();
            conn.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS SchemaMigrations (
                     Version INTEGER PRIMARY KEY, Name TEXT NOT NULL, AppliedAt INTEGER NOT NULL);
                 INSERT INTO SchemaMigrations VALUES ({}, '{}', 0);",
                m.version, m.name
            ))
            .unwrap();
        }
        // (id, site, status, due): north's due order is 3, 1; south has one; 4 is delivered.
        for (id, site, status, due) in [
            (1, "north", "Retrying", 20),
            (2, "south", "Pending", 15),
            (3, "north", "Pending", 10),
            (4, "north", "Delivered", 5),
        ] {
            conn.execute(
                "INSERT INTO Notifications (Id, NotificationId, Type, ListName, Subject, Body,
                     ContentHash, Status, SourceSiteId, SiteEnqueuedAt, CreatedAt, NextAttemptAt)
                 VALUES (?1, ?1, 'Email', 'ops', 's', 'b', x'00', ?3, ?2, 0, 0, ?4)",
                rusqlite::params![id, site, status, due],
            )
            .unwrap();
        }
        apply(&mut conn).unwrap();
        let turns: Vec<(i64, i64, i64)> = conn
            .prepare("SELECT Id, ServeTurn, Priority FROM Notifications ORDER BY Id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(turns, [(1, 2, 2), (2, 1, 2), (3, 1, 2), (4, 0, 2)]);
    }

    /// A database at version 7 with email settings stored: migration 8 rebuilds ChannelConfig
    /// with the same row, lets a webhook row leave the relay columns empty, and still refuses
    /// an email row without its relay.
    #[test]
    fn the_webhook_channel_migration_keeps_the_email_row() {
        let mut conn = Connection::open_in_memory().unwrap();
        for m in MIGRATIONS.iter().filter(|m| m.version <= 7) {
            conn.execute_batch(m.sql).unwrap();
            conn.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS SchemaMigrations (
                     Version INTEGER PRIMARY KEY, Name TEXT NOT NULL, AppliedAt INTEGER NOT NULL);
                 INSERT INTO SchemaMigrations VALUES ({}, '{}', 0);",
                m.version, m.name
            ))
            .unwrap();
        }
        conn.execute_batch(
            "INSERT INTO ChannelConfig (Channel, Host, Port, TlsMode, FromAddress, MaxRetries,
                 RetryDelayMs, MaxConcurrentConnections, TimeoutMs, UpdatedAt, Backoff,
                 RateLimitPerSecond, RateLimitBurst)
             VALUES ('email', 'relay.test', 587, 'starttls', 'o@x.test', 7, 90000, 3, 20000, 5,
                 'fixed', 2.5, 5)",
        )
        .unwrap();
        apply(&mut conn).unwrap();
        let row: (String, i64, i64, f64, i64) = conn
            .query_row(
                "SELECT Host, Port, MaxRetries, RateLimitPerSecond, UpdatedAt FROM ChannelConfig
                 WHERE Channel = 'email'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .unwrap();
        assert_eq!(row, ("relay.test".into(), 587, 7, 2.5, 5));
        conn.execute_batch(
            "INSERT INTO ChannelConfig (Channel, MaxRetries, RetryDelayMs,
                 MaxConcurrentConnections, TimeoutMs, UpdatedAt)
             VALUES ('webhook', 3, 1000, 8, 10000, 6)",
        )
        .unwrap();
        conn.execute_batch("DELETE FROM ChannelConfig WHERE Channel = 'email'")
            .unwrap();
        let relayless = conn.execute_batch(
            "INSERT INTO ChannelConfig (Channel, MaxRetries, RetryDelayMs,
                 MaxConcurrentConnections, TimeoutMs, UpdatedAt)
             VALUES ('email', 3, 1000, 8, 10000, 6)",
        );
        assert!(relayless.is_err(), "an email row needs its relay");
    }

    #[test]
    fn refuses_a_newer_schema() {
        let mut conn = Connection::open_in_memory().unwrap();
        apply(&mut conn).unwrap();
        conn.execute("INSERT INTO SchemaMigrations VALUES (999, 'future', 0)", [])
            .unwrap();
        let err = apply(&mut conn).unwrap_err();
        assert!(err.to_string().contains("version 999"));
    }
}
