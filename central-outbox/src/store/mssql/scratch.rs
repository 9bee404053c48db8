//! Throw-away databases on an MS SQL server, for the test suites and `make bench`: each run gets
//! an empty database of its own (`outbox_test_*`), so runs never see each other's rows and
//! every one starts from the migrations, as a new installation would.
//!
//! Creating databases concurrently is fine on SQL Server but not on Babelfish for PostgreSQL,
//! which fails some of them with "tuple concurrently updated": creation is serialised within
//! the process, and a failed attempt is tried again a few times.

use std::time::Duration;

use tokio_util::compat::TokioAsyncWriteCompatExt;

use super::options::MsSqlOptions;
use crate::store::{Result, StoreError};

/// Attempts at creating a database before giving up.
const CREATE_ATTEMPTS: u32 = 4;
/// Plain drops tried, [`PLAIN_DROP_PAUSE`] apart: longer than a connection's warm-up on
/// Babelfish (about 5 s on a busy machine, and more than 10 s with builds beside it), which a
/// pool dropped meanwhile waits for. Babelfish has no other way to drop a database still in use.
const PLAIN_DROP_ATTEMPTS: u32 = 60;
const PLAIN_DROP_PAUSE: Duration = Duration::from_secs(1);

/// Held while a database is created or dropped: catalog changes one at a time.
static CATALOG_CHANGE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An empty database created for one test or benchmark run; dropped by [`Self::drop_now`] or,
/// failing that, when this value is dropped (best effort: a leftover is named `outbox_test_*`).
#[derive(Debug)]
pub struct ScratchDatabase {
    server: MsSqlOptions,
    server_url: String,
    name: String,
    dropped: bool,
}

impl ScratchDatabase {
    /// Creates `outbox_test_<random>` on the server `server_url` names (its database, e.g.
    /// `master`, must let the login `CREATE DATABASE`).
    pub async fn create(server_url: &str) -> Result<Self> {
        let server = MsSqlOptions::parse(server_url)
            .map_err(|e| StoreError::Unavailable(format!("scratch database server: {e}")))?;
        // 64 random bits are plenty for one server's test databases. Kept short because
        // Babelfish maps a database to the PostgreSQL schema `<name>_dbo` and, with a 32-hex
        // name, resolved foreign-key checks against a truncated form of it ("relation
        // outbox_test_<...>.notificationlists does not exist" on inserting list targets).
        let name = format!("outbox_test_{:016x}", fastrand::u64(..));
        let _turn = CATALOG_CHANGE.lock().await;
        let mut attempt = 1;
        loop {
            // The name is bound and quoted by the server, never spliced into the text.
            match on_server(
                &server,
                "DECLARE @sql nvarchar(max) = N'CREATE DATABASE ' + QUOTENAME(@P1); EXEC (@sql);",
                &name,
            )
            .await
            {
                Ok(()) => break,
                Err(e) if attempt < CREATE_ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "creating a scratch database failed; again");
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(e) => {
                    return Err(StoreError::Unavailable(format!(
                        "cannot create scratch database {name}: {e}"
                    )));
                }
            }
        }
        Ok(Self {
            server,
            server_url: server_url.to_owned(),
            name,
            dropped: false,
        })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Options that connect to this database.
    pub fn options(&self) -> MsSqlOptions {
        MsSqlOptions {
            database: self.name.clone(),
            ..self.server.clone()
        }
    }

    /// A connection string for this database, in the form the server's was given in, for a
    /// central process's `--database`.
    pub fn connection_string(&self) -> String {
        with_database(&self.server_url, &self.name)
    }

    /// Drops the database now (closing any session still using it).
    pub async fn drop_now(mut self) -> Result<()> {
        self.dropped = true;
        drop_database(&self.server, &self.name).await
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let server = self.server.clone();
        let name = self.name.clone();
        // Drop may run inside a runtime, which cannot be blocked on; a thread with a runtime of
        // its own does the work, and is waited for.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            runtime.block_on(drop_database(&server, &name))
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            tracing::warn!(database = %self.name, "could not drop a scratch database: {dropped:?}");
        }
    }
}

/// Drops the database: plainly first (Babelfish has no `ALTER DATABASE`, and by now the test's
/// connections are normally closed), then, on SQL Server, after closing any session still in it.
async fn drop_database(server: &MsSqlOptions, name: &str) -> Result<()> {
    let _turn = CATALOG_CHANGE.lock().await;
    // A store's pool may still be opening and warming a spare connection when the store is
    // dropped (bb8's task holds the pool until it is done, a few seconds on Babelfish), so a
    // plain drop is tried again for a while before the sessions are closed by force.
    for attempt in 1..=PLAIN_DROP_ATTEMPTS {
        let plain = on_server(
            server,
            "DECLARE @sql nvarchar(max) = N'DROP DATABASE ' + QUOTENAME(@P1); EXEC (@sql);",
            name,
        )
        .await;
        if plain.is_ok() {
            return Ok(());
        }
        if attempt < PLAIN_DROP_ATTEMPTS {
            tokio::time::sleep(PLAIN_DROP_PAUSE).await;
        }
    }
    on_server(
        server,
        "DECLARE @sql nvarchar(max) = N'ALTER DATABASE ' + QUOTENAME(@P1) \
         + N' SET SINGLE_USER WITH ROLLBACK IMMEDIATE; DROP DATABASE ' \
         + QUOTENAME(@P1); EXEC (@sql);",
        name,
    )
    .await
    .map_err(|e| StoreError::Unavailable(format!("cannot drop scratch database {name}: {e}")))
}

/// `server_url` with its database replaced by `database`: the URL's path, or an ADO.NET
/// string's `Database` key (a later key wins there).
pub(super) fn with_database(server_url: &str, database: &str) -> String {
    match url::Url::parse(server_url.trim()) {
        Ok(mut url) if url.scheme().eq_ignore_ascii_case("mssql") => {
            url.set_path(database);
            url.to_string()
        }
        _ => format!("{};Database={database}", server_url.trim_end_matches(';')),
    }
}

/// Runs one statement with one string parameter on the server's own database.
async fn on_server(
    server: &MsSqlOptions,
    sql: &str,
    arg: &str,
) -> std::result::Result<(), tiberius::error::Error> {
    let config = server.tiberius_config();
    let tcp = tokio::net::TcpStream::connect((server.host.as_str(), server.port)).await?;
    tcp.set_nodelay(true)?;
    let mut client = tiberius::Client::connect(config, tcp.compat_write()).await?;
    client.execute(sql, &[&arg]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_is_replaced_in_either_form() {
        let url = with_database(
            "mssql://sa:p%21@db:1433/master?encrypt=false",
            "outbox_test_1",
        );
        let parsed = MsSqlOptions::parse(&url).unwrap();
        assert_eq!(parsed.database, "outbox_test_1");
        assert_eq!(parsed.password.expose(), "p!");
        let ado = with_database(
            "server=tcp:127.0.0.1,1433;user id=u;password=x;database=master;",
            "outbox_test_2",
        );
        assert_eq!(MsSqlOptions::parse(&ado).unwrap().database, "outbox_test_2");
    }
}
