//! The stored procedures (with the one function they call and the one trigger), each defined by one living file under
//! `migrations/mssql/procedures/`, embedded at build time and created by the migrator whenever
//! its file changes; the numbered migrations hold only schema.
//!
//! Each file holds the procedure's `CREATE` statement, with its description before it, and
//! declares its revision on its first line (`-- dbo.SubmitNotification, revision 4`).
//! `dbo.SchemaProcedures` (migration 0011) records, per procedure, the revision and the SHA-256
//! of the file it was created from. After the numbered migrations, under the same application
//! lock (`migrate`), the migrator compares and drops and creates again (Babelfish rejects
//! `CREATE OR ALTER`) each procedure [`plan`] names, each in a transaction of its own with its
//! row, so a crash leaves either the old procedure and row or the new ones.
//!
//! Invariants: a procedure whose stored revision is higher than its file's was created by a newer
//! binary, so this one refuses to start (as the schema version check refuses a newer schema)
//! instead of putting its older procedure back under the newer replicas mid-rollout. A row this
//! binary has no file for (a procedure a newer binary added) is left alone: nothing here calls
//! it. A procedure is removed by a numbered migration that drops it and deletes its row.

use sha2::{Digest, Sha256};

use super::error::to_store_error;
use super::pool::Connection;
use super::{decode, result_set, sql};
use crate::store::{Result, StoreError};

/// What a file creates, and so how it is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Procedure,
    Function,
    /// A DML trigger on a table the numbered migrations create (created after them).
    Trigger,
}

/// One living file: `migrations/mssql/procedures/<name>.sql`, which creates `dbo.<name>`.
#[derive(Debug)]
pub(super) struct Procedure {
    pub name: &'static str,
    pub kind: Kind,
    pub sql: &'static str,
}

/// Every procedure, in the order they are created: a function before the procedures that call
/// it. A new file joins this list (a test checks that every file is here).
pub(super) const PROCEDURES: &[Procedure] = &[
    Procedure {
        name: "DecodeOutcomeText",
        kind: Kind::Function,
        sql: include_str!("../../../../migrations/mssql/procedures/DecodeOutcomeText.sql"),
    },
    Procedure {
        name: "AcquireLease",
        kind: Kind::Procedure,
        sql: include_str!("../../../../migrations/mssql/procedures/AcquireLease.sql"),
    },
    Procedure {
        name: "ClaimDueNotifications",
        kind: Kind::Procedure,
        sql: include_str!("../../../../migrations/mssql/procedures/ClaimDueNotifications.sql"),
    },
    Procedure {
        name: "ClaimDigestNotifications",
        kind: Kind::Procedure,
        sql: include_str!("../../../../migrations/mssql/procedures/ClaimDigestNotifications.sql"),
    },
    Procedure {
        name: "RecordAttemptOutcomes",
        kind: Kind::Procedure,
        sql: include_str!("../../../../migrations/mssql/procedures/RecordAttemptOutcomes.sql"),
    },
    Procedure {
        name: "SubmitNotification",
        kind: Kind::Procedure,
        sql: include_str!("../../../../migrations/mssql/procedures/SubmitNotification.sql"),
    },
    Procedure {
        name: "AcknowledgeIncident",
        kind: Kind::Procedure,
        sql: include_str!("../../../../migrations/mssql/procedures/AcknowledgeIncident.sql"),
    },
    Procedure {
        name: "RecordSiteStatusChanges",
        kind: Kind::Trigger,
        sql: include_str!("../../../../migrations/mssql/procedures/RecordSiteStatusChanges.sql"),
    },
];

impl Procedure {
    /// The revision the file declares on its first line, `-- dbo.<name>, revision <n>` (n >= 1).
    pub(super) fn revision(&self) -> Result<i32> {
        self.sql
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("-- dbo."))
            .and_then(|line| line.strip_prefix(self.name))
            .and_then(|line| line.strip_prefix(", revision "))
            .and_then(|n| n.parse::<i32>().ok())
            .filter(|&n| n >= 1)
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "procedures/{}.sql does not start with `-- dbo.{}, revision <n>`",
                    self.name, self.name
                ))
            })
    }

    /// The SHA-256 of the file as built in, which `dbo.SchemaProcedures` records.
    pub(super) fn sha256(&self) -> [u8; 32] {
        Sha256::digest(self.sql.as_bytes()).into()
    }
}

/// What the database holds of one procedure: its `dbo.SchemaProcedures` row, and whether the
/// object itself exists.
#[derive(Debug, Clone)]
pub(super) struct Installed {
    pub name: String,
    pub revision: i32,
    pub sha256: Vec<u8>,
    pub present: bool,
}

/// The procedures to create again, in [`PROCEDURES`] order: those without a row, or whose row
/// records an older revision or another file at the same revision (an edit that kept its
/// revision: the file is what this binary runs), and those whose object is missing (dropped by
/// hand). Fails, changing nothing, if any row records a newer revision than its file.
pub(super) fn plan(installed: &[Installed]) -> Result<Vec<&'static Procedure>> {
    let mut stale = Vec::new();
    for procedure in PROCEDURES {
        let revision = procedure.revision()?;
        let Some(row) = installed.iter().find(|row| row.name == procedure.name) else {
            stale.push(procedure);
            continue;
        };
        if row.revision > revision {
            return Err(StoreError::Unavailable(format!(
                "dbo.{} in the database is at revision {}, newer than this binary's {revision} \
                 (a newer central-outbox created it); upgrade central-outbox, or, to go back to \
                 this revision on purpose, delete its row from dbo.SchemaProcedures",
                procedure.name, row.revision
            )));
        }
        if row.revision < revision || row.sha256 != procedure.sha256() || !row.present {
            stale.push(procedure);
        }
    }
    Ok(stale)
}

/// Brings the procedures up to date on `conn`, which holds the migration lock (`migrate`).
pub(super) async fn apply(conn: &mut Connection) -> Result<()> {
    let mut results = conn
        .batch(sql::PROCEDURE_VERSIONS, &[])
        .await
        .map_err(|e| to_store_error("procedures: read versions", &e))?;
    let installed = result_set(&mut results, 0, "procedures: read versions")?
        .iter()
        .map(|row| {
            Ok(Installed {
                name: decode::text(row, "Name")?,
                revision: decode::req::<i32>(row, "Revision")?,
                sha256: decode::req::<&[u8]>(row, "Sha256")?.to_vec(),
                present: decode::req::<i32>(row, "Present")? == 1,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    for procedure in plan(&installed)? {
        let revision = procedure.revision()?;
        tracing::info!(
            procedure = procedure.name,
            revision,
            "creating MS SQL procedure from its file"
        );
        conn.batch(sql::MIGRATION_BEGIN, &[])
            .await
            .map_err(|e| to_store_error("procedures: begin", &e))?;
        conn.batch(&sql::drop_procedure(procedure), &[])
            .await
            .map_err(|e| to_store_error("procedures: drop", &e))?;
        conn.batch(procedure.sql, &[])
            .await
            .map_err(|e| to_store_error("procedures: create", &e))?;
        let record = sql::procedure_record(procedure, revision);
        conn.batch(&record.sql, &record.params)
            .await
            .map_err(|e| to_store_error("procedures: record", &e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn procedures_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/mssql/procedures")
    }

    fn row(name: &str, revision: i32, sha256: Vec<u8>) -> Installed {
        Installed {
            name: name.into(),
            revision,
            sha256,
            present: true,
        }
    }

    /// Every procedure as this binary would record it.
    fn up_to_date() -> Vec<Installed> {
        PROCEDURES
            .iter()
            .map(|p| row(p.name, p.revision().unwrap(), p.sha256().to_vec()))
            .collect()
    }

    fn names(stale: &[&Procedure]) -> Vec<&'static str> {
        stale.iter().map(|p| p.name).collect()
    }

    /// The files under migrations/mssql/procedures are the procedures the migrator knows, each
    /// built in from its own file: none forgotten, none without a file.
    #[test]
    fn every_procedure_file_is_known_to_the_migrator() {
        let mut files: Vec<String> = std::fs::read_dir(procedures_dir())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".sql"))
            .collect();
        files.sort();
        let mut known: Vec<String> = PROCEDURES
            .iter()
            .map(|p| format!("{}.sql", p.name))
            .collect();
        known.sort();
        assert_eq!(files, known, "procedure files vs migrate's PROCEDURES");
        for p in PROCEDURES {
            let file =
                std::fs::read_to_string(procedures_dir().join(format!("{}.sql", p.name))).unwrap();
            assert_eq!(file, p.sql, "{} is built in from another file", p.name);
        }
    }

    /// Each file declares its revision first, then creates exactly its own object in one batch
    /// (no GO, no DROP: the migrator drops it first), with a plain CREATE (Babelfish rejects
    /// CREATE OR ALTER); a function is created before the procedures that call it.
    #[test]
    fn each_file_creates_its_procedure_and_nothing_else() {
        for (i, p) in PROCEDURES.iter().enumerate() {
            // The drop is built from the name (a name cannot be bound): letters and digits only.
            assert!(
                p.name.chars().all(|c| c.is_ascii_alphanumeric()),
                "{}",
                p.name
            );
            assert!(p.revision().is_ok(), "{}: {:?}", p.name, p.revision());
            let keyword = match p.kind {
                Kind::Procedure => "PROCEDURE",
                Kind::Function => "FUNCTION",
                Kind::Trigger => "TRIGGER",
            };
            let creates: Vec<&str> = p
                .sql
                .lines()
                .filter(|line| line.starts_with("CREATE "))
                .collect();
            assert_eq!(
                creates.len(),
                1,
                "{}: one CREATE, found {creates:?}",
                p.name
            );
            let create = format!("CREATE {keyword} dbo.{}", p.name);
            assert!(
                creates[0] == create || creates[0].starts_with(&format!("{create} ")),
                "{}: creates {:?}",
                p.name,
                creates[0]
            );
            assert!(
                !p.sql
                    .lines()
                    .any(|line| line.trim().eq_ignore_ascii_case("GO")),
                "{}: a GO line",
                p.name
            );
            assert!(!p.sql.contains("CREATE OR ALTER") && !p.sql.contains("\nDROP "));
            for later in &PROCEDURES[i + 1..] {
                assert!(
                    !p.sql.contains(&format!("dbo.{}(", later.name)),
                    "{} calls {}, which is created after it",
                    p.name,
                    later.name
                );
            }
        }
    }

    #[test]
    fn a_new_database_gets_every_procedure() {
        assert_eq!(
            names(&plan(&[]).unwrap()),
            names(&PROCEDURES.iter().collect::<Vec<_>>())
        );
    }

    #[test]
    fn procedures_as_recorded_are_left_alone() {
        assert!(plan(&up_to_date()).unwrap().is_empty());
        // A row of a procedure this binary does not know (a newer binary added it).
        let mut installed = up_to_date();
        installed.push(row("SomethingNewer", 3, vec![0; 32]));
        assert!(plan(&installed).unwrap().is_empty());
    }

    #[test]
    fn a_changed_older_or_missing_procedure_is_created_again() {
        let mut installed = up_to_date();
        installed[1].sha256 = vec![0; 32];
        installed[2].revision -= 1;
        installed[3].present = false;
        installed.remove(4);
        assert_eq!(
            names(&plan(&installed).unwrap()),
            [
                PROCEDURES[1].name,
                PROCEDURES[2].name,
                PROCEDURES[3].name,
                PROCEDURES[4].name
            ]
        );
    }

    /// An older binary meeting a procedure a newer one created refuses, naming it and the way
    /// back, and plans nothing (even for the procedures before it).
    #[test]
    fn a_newer_revision_stops_an_older_binary() {
        let mut installed = up_to_date();
        installed[0].sha256 = vec![0; 32];
        let last = installed.len() - 1;
        installed[last].revision += 1;
        let error = plan(&installed).unwrap_err().to_string();
        let name = PROCEDURES[last].name;
        assert!(
            error.contains(&format!("dbo.{name} in the database is at revision")),
            "{error}"
        );
        assert!(error.contains("dbo.SchemaProcedures"), "{error}");
    }

    #[test]
    fn a_revision_line_names_its_procedure() {
        let p = Procedure {
            name: "AcquireLease",
            kind: Kind::Procedure,
            sql: "-- dbo.AcquireLease, revision 12\nCREATE PROCEDURE dbo.AcquireLease",
        };
        assert_eq!(p.revision().unwrap(), 12);
        for sql in [
            "-- dbo.ClaimDueNotifications, revision 2\n",
            "-- dbo.AcquireLease, revision 0\n",
            "-- dbo.AcquireLease revision 1\n",
            "CREATE PROCEDURE dbo.AcquireLease\n",
        ] {
            let p = Procedure { sql, ..p };
            assert!(p.revision().is_err(), "{sql:?}");
        }
    }
}
