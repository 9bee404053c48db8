//! Which database central runs on: SQLite by default, or MS SQL Server with `--database URL`.
//!
//! - SQLite: each central process gets a copy of the empty template in its run directory, as
//!   the figures always did.
//! - MS SQL: each central process gets a new empty database of its own on the server the URL
//!   names (`ScratchDatabase`: `outbox_test_*`), migrated before the process starts and dropped
//!   after it stops, so no run sees another's rows there either.
//!
//! What a figure writes before central starts (the dispatcher lease held by another replica,
//! Pending rows) is written on MS SQL through central's own store, `MsSqlStore` (its
//! migrations, its lease statement, the idempotent insert ingest uses), not with SQL of the
//! bench's own: the rows are then exactly what the service would have written, whatever the
//! schema becomes.
//!
//! Invariant: the password in the URL is never printed nor written to the results; only
//! [`Backend::describe`] and [`Backend::to_json`] (server, port, login) are. It is in each
//! run's central config file, as it would be in an operator's, and that file goes with the run
//! directory unless `--keep`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use central_outbox::DISPATCHER_LEASE;
use central_outbox::domain::kpi::KpiParams;
use central_outbox::records::{InsertOutcome, NewNotification};
use central_outbox::store::mssql::{MsSqlOptions, MsSqlStore, ScratchDatabase};
use central_outbox::store::{AdminStore, DispatchStore, IngestStore, SiteStatusStore};
use serde_json::{Value, json};

use crate::fixtures::{self, CentralRows};
use crate::proc_stats;

/// The replica written into `Leases` as the dispatcher, so central under test never dispatches.
pub(crate) const OTHER_REPLICA: &str = "bench-other-replica";
/// How long that replica holds the lease: longer than any figure runs.
const OTHER_REPLICA_HOLDS: Duration = Duration::from_secs(24 * 3600);
/// Notifications per store call when writing Pending rows on MS SQL. The store splits a call
/// into statements of 100 rows; a few of those per call keeps the calls few without making
/// any one of them long.
const ROWS_PER_SUBMIT: u64 = 500;

/// The database server central runs on, for the whole invocation.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Sqlite,
    MsSql {
        /// As given: `ScratchDatabase` derives each database's connection string from it.
        server_url: String,
        /// Parsed, for descriptions without the password.
        server: Box<MsSqlOptions>,
    },
}

impl Backend {
    /// SQLite without `--database`; MS SQL with it. The URL is checked here, before anything
    /// starts, and never repeated in an error (it holds a password).
    pub(crate) fn from_arg(database: Option<&str>) -> Result<Self> {
        let Some(url) = database else {
            return Ok(Self::Sqlite);
        };
        if !MsSqlOptions::recognises(url) {
            bail!(
                "--database: not an MS SQL connection string; give mssql://USER:PASSWORD@HOST:PORT/\
                 master or server=tcp:HOST,PORT;user id=USER;password=PASSWORD;database=master \
                 (without --database, central runs on SQLite)"
            );
        }
        let server = MsSqlOptions::parse(url).map_err(|e| anyhow!("--database: {e}"))?;
        Ok(Self::MsSql {
            server_url: url.to_string(),
            server: Box::new(server),
        })
    }

    pub(crate) fn is_mssql(&self) -> bool {
        matches!(self, Self::MsSql { .. })
    }

    /// The server's TCP port, for finding its processes when it runs on this machine
    /// ([`crate::proc_stats::CpuWindow::with_server`]); `None` on SQLite.
    pub(crate) fn server_port(&self) -> Option<u16> {
        match self {
            Self::Sqlite => None,
            Self::MsSql { server, .. } => Some(server.port),
        }
    }

    /// The server processes (sessions) serving `client` now, when the server runs on this
    /// machine; to be handed to [`CentralDb::finish`] once `client` has stopped.
    pub(crate) fn sessions_of(&self, client: u32) -> Vec<u32> {
        self.server_port()
            .map(|port| proc_stats::server_processes(client, port))
            .unwrap_or_default()
    }

    /// One line for people.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Sqlite => "SQLite (a copy of an empty database file per central process; WAL, \
                             synchronous=FULL)"
                .to_string(),
            Self::MsSql { server, .. } => format!(
                "MS SQL at {}:{} as {} (a new database per central process)",
                server.host, server.port, server.user
            ),
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        match self {
            Self::Sqlite => json!({
                "kind": "sqlite",
                "per_process": "a copy of an empty database file in the run directory",
            }),
            Self::MsSql { server, .. } => json!({
                "kind": "mssql",
                "host": server.host,
                "port": server.port,
                "login": server.user,
                "pool_max_size": server.pool_max_size,
                "per_process": "a new database (outbox_test_*) created, migrated, and dropped \
                                after the process stops",
            }),
        }
    }

    /// Why figure group `group` cannot be measured on this backend, if it cannot.
    pub(crate) fn unsupported(&self, group: &str) -> Option<&'static str> {
        match (self, group) {
            (Self::MsSql { .. }, "memory") => Some(
                "central's 1,000,000-row fixture is a bulk-written SQLite file, and the figure is \
                 about SQLite's page cache inside central (on MS SQL the rows live in the \
                 server); its site figures do not involve central. Run it without --database",
            ),
            (Self::MsSql { .. }, "console") => Some(
                "the list pages are timed on the memory figure's 1,000,000-row SQLite fixture; \
                 run it without --database",
            ),
            _ => None,
        }
    }
}

/// Central's database for one process.
#[derive(Debug)]
pub(crate) enum CentralDb {
    Sqlite(PathBuf),
    MsSql(Box<ScratchDatabase>),
}

impl CentralDb {
    /// An empty database with the current schema: on SQLite a copy of `template` in `dir`; on
    /// MS SQL a new database on the server.
    pub(crate) async fn fresh(backend: &Backend, template: &Path, dir: &Path) -> Result<Self> {
        match backend {
            Backend::Sqlite => {
                let path = dir.join("central.db");
                fixtures::copy_db(template, &path)?;
                Ok(Self::Sqlite(path))
            }
            Backend::MsSql { server_url, .. } => {
                let scratch = ScratchDatabase::create(server_url)
                    .await
                    .context("creating a database for central on the MS SQL server")?;
                // Migrated now, as the SQLite template was, so central's start-up is the same
                // work on both backends and the schema's creation is never inside a figure.
                close_store(open_store(&scratch).await?, &scratch).await;
                Ok(Self::MsSql(Box::new(scratch)))
            }
        }
    }

    /// A database holding a year of delivered rows: on SQLite a copy of `history` (the file
    /// `rig` built) in `dir`; on MS SQL a new database into which the server writes `rows` of
    /// them (`mssql_history`), as there is no file to copy.
    pub(crate) async fn with_history(
        backend: &Backend,
        history: &Path,
        rows: u64,
        dir: &Path,
    ) -> Result<Self> {
        match backend {
            Backend::Sqlite => {
                let path = dir.join("central.db");
                fixtures::copy_db(history, &path)?;
                Ok(Self::Sqlite(path))
            }
            Backend::MsSql { .. } => {
                let db = Self::fresh(backend, history, dir).await?;
                let Self::MsSql(scratch) = &db else {
                    bail!("a fresh MS SQL database is not an MS SQL database");
                };
                let started = Instant::now();
                crate::mssql_history::write(scratch, rows).await?;
                eprintln!(
                    "bench: wrote {rows} history rows on the MS SQL server in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
                Ok(db)
            }
        }
    }

    /// Writes the database file back and drops it from the kernel's page cache
    /// (`posix_fadvise(DONTNEED)`), so that central starts on it as after the machine restarted:
    /// every page it reads comes from the disk. SQLite only (an MS SQL server keeps its own
    /// buffer pool).
    pub(crate) fn evict_from_kernel_cache(&self) -> Result<()> {
        match self {
            Self::Sqlite(path) => {
                for file in [path.clone(), fixtures::with_suffix(path, "-wal")] {
                    if !file.exists() {
                        continue;
                    }
                    let open = std::fs::File::open(&file)
                        .with_context(|| format!("opening {}", file.display()))?;
                    open.sync_all()?;
                    rustix::fs::fadvise(&open, 0, None, rustix::fs::Advice::DontNeed)
                        .with_context(|| {
                            format!("dropping {} from the page cache", file.display())
                        })?;
                }
                Ok(())
            }
            Self::MsSql(_) => bail!("a cold page cache is a SQLite figure"),
        }
    }

    /// What central's `database` key is set to.
    pub(crate) fn url(&self) -> String {
        match self {
            Self::Sqlite(path) => format!("sqlite://{}", path.display()),
            Self::MsSql(scratch) => scratch.connection_string(),
        }
    }

    /// Makes another central replica hold the dispatcher lease for a day, so central under test
    /// serves ingest but never dispatches (see [`fixtures::hold_dispatcher_lease`]).
    pub(crate) async fn hold_dispatcher_lease(&self) -> Result<()> {
        match self {
            Self::Sqlite(path) => fixtures::hold_dispatcher_lease(path),
            Self::MsSql(scratch) => {
                let store = open_store(scratch).await?;
                let epoch = store
                    .acquire_lease(DISPATCHER_LEASE, OTHER_REPLICA, OTHER_REPLICA_HOLDS)
                    .await
                    .context("taking the dispatcher lease for another replica")?;
                close_store(store, scratch).await;
                if epoch.is_none() {
                    bail!("the dispatcher lease of a new database is already held");
                }
                Ok(())
            }
        }
    }

    /// The terminal rows resolved longer than `retention` ago: what central's purge deletes
    /// with that retention (SQLite only, as the history it is asked about).
    pub(crate) fn terminal_rows_before(&self, retention: Duration) -> Result<u64> {
        let retention = chrono::Duration::from_std(retention)?;
        let cutoff = (chrono::Utc::now() - retention).timestamp_millis();
        match self {
            Self::Sqlite(path) => fixtures::terminal_rows_before(path, cutoff),
            Self::MsSql(_) => bail!("the purge figure runs on SQLite only so far"),
        }
    }

    /// Adds `n` Pending notifications, due now, with the content the load generators send.
    pub(crate) async fn add_pending_rows(&self, n: u64) -> Result<()> {
        match self {
            Self::Sqlite(path) => fixtures::add_central_rows(path, n, CentralRows::Pending),
            Self::MsSql(scratch) => {
                let store = open_store(scratch).await?;
                let mut written = 0;
                while written < n {
                    let count = ROWS_PER_SUBMIT.min(n - written);
                    let batch = (0..count)
                        .map(|_| {
                            outbox_proto::submission::parse(crate::central_figures::submit())
                                .map(NewNotification::new)
                                .map_err(|e| anyhow!("a generated notification is invalid: {e}"))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let outcomes = store.submit(batch).await.context("writing Pending rows")?;
                    if let Some(other) = outcomes.iter().find(|o| **o != InsertOutcome::Accepted) {
                        bail!("writing Pending rows: a fresh id was {other:?}");
                    }
                    written += count;
                }
                close_store(store, scratch).await;
                Ok(())
            }
        }
    }

    /// Starts `site`'s watch of its final statuses (as its first WatchSiteStatus would), so
    /// every status decided from now on is fed for it.
    pub(crate) async fn watch_site_status(&self, site: &str) -> Result<()> {
        match self {
            Self::Sqlite(path) => fixtures::watch_site_status(path, site),
            Self::MsSql(scratch) => {
                let site = central_outbox::domain::SiteId::parse(site.to_owned())
                    .map_err(|e| anyhow!("site id {site:?}: {}", e.problem))?;
                let store = open_store(scratch).await?;
                store
                    .watch_site_status(&site)
                    .await
                    .context("starting the site's watch")?;
                close_store(store, scratch).await;
                Ok(())
            }
        }
    }

    /// Notifications stored, read after central has stopped; only for a database whose
    /// dispatcher lease another replica holds ([`Self::hold_dispatcher_lease`]). SQLite counts
    /// the rows. The MS SQL store has no count of its own, so there its KPIs are read: with
    /// nothing dispatched every row is Pending, so the queue depth is the row count, and rows
    /// anywhere else (parked, delivered) mean the workload was not what the figure claims.
    pub(crate) async fn stored_notifications(&self) -> Result<u64> {
        match self {
            Self::Sqlite(path) => {
                crate::site_figures::count_rows(path, "SELECT COUNT(*) FROM Notifications")
            }
            Self::MsSql(scratch) => {
                let store = open_store(scratch).await?;
                let kpis = store
                    .kpis(KpiParams {
                        now: chrono::Utc::now(),
                        stuck_age_threshold: Duration::from_secs(3600),
                        delivered_window: Duration::from_secs(24 * 3600),
                    })
                    .await
                    .context("reading central's KPIs")?;
                close_store(store, scratch).await;
                let global = kpis.global;
                if global.parked_count > 0 || global.delivered_recently > 0 {
                    bail!(
                        "central dispatched while another replica held the lease: {} parked, \
                         {} delivered",
                        global.parked_count,
                        global.delivered_recently
                    );
                }
                Ok(global.queue_depth)
            }
        }
    }

    /// Drops the MS SQL database; on SQLite the file goes with the run directory.
    ///
    /// `sessions` are the server processes that served central ([`Backend::sessions_of`], taken
    /// before it stopped). A statement central gave up on (its command timeout) or left running
    /// when it stopped keeps running on the server until it ends, holding the database and
    /// burning CPU into the next figure; so this first waits, up to [`SESSIONS_GRACE`], for
    /// those processes to exit. A database that still cannot be dropped does not fail the
    /// figure, which was measured by then: it is reported here and listed at the end
    /// ([`left_behind`]).
    pub(crate) async fn finish(self, sessions: &[u32]) {
        match self {
            Self::Sqlite(_) => {}
            Self::MsSql(scratch) => {
                let name = scratch.name().to_string();
                let waited = wait_for_exit(sessions, SESSIONS_GRACE).await;
                if waited > Duration::from_secs(1) {
                    eprintln!(
                        "bench: waited {:.1} s for the server to finish central's last \
                         statements on {name}",
                        waited.as_secs_f64()
                    );
                }
                if let Err(e) = scratch.drop_now().await {
                    eprintln!("bench: WARNING: could not drop central's database {name}: {e}");
                    LEFT_BEHIND
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(name);
                }
            }
        }
    }
}

/// Longest [`CentralDb::finish`] waits for the server to finish what central left running.
const SESSIONS_GRACE: Duration = Duration::from_secs(120);

/// Waits until none of `pids` is alive, or `limit` has passed; returns how long it waited.
async fn wait_for_exit(pids: &[u32], limit: Duration) -> Duration {
    let started = Instant::now();
    while started.elapsed() < limit
        && pids
            .iter()
            .any(|pid| Path::new(&format!("/proc/{pid}")).exists())
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

/// Databases [`CentralDb::finish`] could not drop, in the order it tried.
static LEFT_BEHIND: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The MS SQL databases left on the server, for the report and the JSON.
pub(crate) fn left_behind() -> Vec<String> {
    LEFT_BEHIND
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// Central's store on `scratch`, opened as central opens it (which applies any migration not
/// yet applied). The caller closes it ([`close_store`]) before central starts, so the bench
/// holds no sessions on the server while a figure is measured.
async fn open_store(scratch: &ScratchDatabase) -> Result<MsSqlStore> {
    MsSqlStore::open(scratch.options())
        .await
        .with_context(|| format!("opening {} as central's store", scratch.name()))
}

/// Closes a store [`open_store`] opened, and waits (briefly) until the server has ended its
/// sessions, so they neither count in the next figure's `database` CPU nor keep the database
/// from being dropped.
async fn close_store(store: MsSqlStore, scratch: &ScratchDatabase) {
    let sessions = proc_stats::server_processes(proc_stats::own_pid(), scratch.options().port);
    drop(store);
    wait_for_exit(&sessions, Duration::from_secs(10)).await;
}
