//! Group commit for SQLite: one writer thread owns the only write connection and runs every write
//! job that is queued when it wakes inside one transaction, so a burst of N concurrent writes
//! costs one fsync instead of N. A job's caller is answered only after the transaction holding
//! its writes has committed, so "answered Ok" always means "durable".
//!
//! Invariants:
//! - Each job runs inside its own savepoint: a job that fails rolls back only its own writes and
//!   gets its own error; the other jobs of the batch still commit.
//! - If the commit itself fails (disk full, I/O error), every job of the batch gets the error and
//!   none of their writes are visible.
//! - No waiting to fill a batch: the writer takes what is queued and commits at once, so an idle
//!   system pays one fsync of latency and a busy one batches naturally while the previous fsync runs.
//!
//! - Priority jobs ([`Database::write_first`]) go into the next transaction the writer begins,
//!   ahead of every queued ordinary job: the dispatcher's lease renewal must never wait behind a
//!   burst of ingest or a purge. The wait is bounded by the one transaction already running.
//!
//! - [`Database::write_then`] runs a job's follow-up on the writer thread right after the
//!   transaction holding the job committed, before any caller of that transaction is answered,
//!   in the order the jobs ran: so follow-ups see commits in commit order (a store announcing new
//!   rows in seq order relies on that), and never see a job that failed or was not committed.
//!
//! Reads go through a small pool of separate read-only connections; in WAL mode they see the last
//! committed state and never block the writer.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};
use tokio::sync::{Semaphore, mpsc, oneshot};

/// Why a write or read did not complete.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("sqlite: {0}")]
    Sqlite(Arc<rusqlite::Error>),
    #[error("commit failed, nothing of this batch was written: {0}")]
    Commit(Arc<rusqlite::Error>),
    #[error("the database writer has stopped")]
    WriterStopped,
    #[error("a database task failed: {0}")]
    TaskFailed(String),
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sqlite(Arc::new(e))
    }
}

/// How durable a commit is. `Full` fsyncs the WAL on every commit; `Normal` may lose the last
/// transactions on power loss (never on a process crash) and exists for benchmarks that compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    Full,
    Normal,
}

/// Settings for [`Database::open`].
#[derive(Debug, Clone)]
pub struct Options {
    pub path: PathBuf,
    pub durability: Durability,
    /// Most jobs committed in one transaction. Bounds the latency one commit adds to the first
    /// caller of a batch; 1024 keeps a batch of small inserts well under a few milliseconds.
    pub max_batch_jobs: usize,
    /// Write jobs that may wait for the writer before `write` applies back-pressure.
    pub queue_capacity: usize,
    /// Read connections (readers run on tokio's blocking pool).
    pub readers: usize,
    /// The most memory SQLite's page cache may take on the write connection, and on each read
    /// connection (`PRAGMA cache_size`); `None`: SQLite's default (2 MiB). The pages the writer
    /// touches on every commit (the B-trees' upper levels and their newest leaves) stay in its
    /// cache across transactions; a reader's cache is dropped whenever another connection has
    /// committed, so it only needs to hold what one query reads.
    pub writer_cache_bytes: Option<u64>,
    pub reader_cache_bytes: Option<u64>,
}

impl Options {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            durability: Durability::Full,
            max_batch_jobs: 1024,
            queue_capacity: 8192,
            readers: 4,
            writer_cache_bytes: None,
            reader_cache_bytes: None,
        }
    }

    /// The most memory the page caches of all connections take together.
    pub fn page_cache_bound(&self) -> u64 {
        const DEFAULT: u64 = 2 * 1024 * 1024;
        self.writer_cache_bytes.unwrap_or(DEFAULT)
            + self.readers.max(1) as u64 * self.reader_cache_bytes.unwrap_or(DEFAULT)
    }
}

type Reply = Box<dyn FnOnce(Result<(), Error>) + Send>;
/// A queued write: given the open transaction (or the reason none could be begun), it runs and
/// returns the reply to send once the commit outcome is known.
type Job = Box<dyn FnOnce(Result<&mut Transaction<'_>, Error>) -> Reply + Send>;

/// A SQLite database with one group-committing writer and a pool of readers. Cheap to clone.
#[derive(Clone)]
pub struct Database {
    jobs: mpsc::Sender<Job>,
    /// Jumps the queue (see the module documentation). Unbounded: its callers are a handful of
    /// periodic tasks, each with one job outstanding at a time.
    priority: mpsc::UnboundedSender<Job>,
    readers: Arc<ReadPool>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("path", &self.readers.path)
            .finish_non_exhaustive()
    }
}

impl Database {
    /// Opens (creating if needed) the database, runs `prepare` on the write connection before
    /// anything else (schema migrations belong there), and starts the writer thread.
    pub fn open(
        options: &Options,
        prepare: impl FnOnce(&mut Connection) -> Result<(), Error>,
    ) -> Result<Self, Error> {
        if let Some(dir) = options.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::TaskFailed(format!("cannot create directory {}: {e}", dir.display()))
            })?;
        }
        let mut conn = Connection::open(&options.path)?;
        configure_writer(&conn, options.durability)?;
        set_cache(&conn, options.writer_cache_bytes)?;
        prepare(&mut conn)?;
        keep_statement_journals_in_memory(&conn)?;

        let (jobs, queue) = mpsc::channel(options.queue_capacity.max(1));
        let (priority, priority_queue) = mpsc::unbounded_channel();
        let queues = Queues {
            priority: priority_queue,
            ordinary: queue,
        };
        let max_batch = options.max_batch_jobs.max(1);
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || run_writer(conn, queues, max_batch))
            .map_err(|e| Error::TaskFailed(format!("cannot start the writer thread: {e}")))?;

        let readers = Arc::new(ReadPool::open(
            &options.path,
            options.readers.max(1),
            options.reader_cache_bytes,
        )?);
        Ok(Self {
            jobs,
            priority,
            readers,
        })
    }

    /// Runs `job` on the writer inside the next group-commit transaction and returns its result
    /// once that transaction has committed. An `Err` from the job rolls back only the job.
    pub async fn write<T, E>(
        &self,
        job: impl FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        self.write_then(job, |_: &T| {}).await
    }

    /// [`Self::write`], and `committed` runs with the job's result on the writer thread once the
    /// transaction holding the job has committed, before the caller is answered. Follow-ups run
    /// in the order their jobs ran, which is commit order; none runs for a job that failed or
    /// whose transaction did not commit. They hold up the writer, so they must be short (take a
    /// lock, send on a channel) and must not block or panic.
    pub async fn write_then<T, E>(
        &self,
        job: impl FnOnce(&Connection) -> Result<T, E> + Send + 'static,
        committed: impl FnOnce(&T) + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        let (job, answered) = make_job(job, committed);
        self.jobs
            .send(job)
            .await
            .map_err(|_| E::from(Error::WriterStopped))?;
        answered.await.map_err(|_| E::from(Error::WriterStopped))?
    }

    /// [`Self::write`] ahead of every queued ordinary job: `job` runs in the next transaction
    /// the writer begins. For small, urgent writes (a lease renewal); bulk work through this
    /// would only delay the other urgent jobs.
    pub async fn write_first<T, E>(
        &self,
        job: impl FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        let (job, answered) = make_job(job, |_: &T| {});
        self.priority
            .send(job)
            .map_err(|_| E::from(Error::WriterStopped))?;
        answered.await.map_err(|_| E::from(Error::WriterStopped))?
    }

    /// Runs `query` on a read connection on tokio's blocking pool.
    pub async fn read<T, E>(
        &self,
        query: impl FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        self.readers.read(query).await
    }
}

/// Wraps `job` for the writer: run in its own savepoint, followed up by `committed` and answered
/// once the commit is known.
fn make_job<T, E>(
    job: impl FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    committed: impl FnOnce(&T) + Send + 'static,
) -> (Job, oneshot::Receiver<Result<T, E>>)
where
    T: Send + 'static,
    E: From<Error> + Send + 'static,
{
    let (answer, answered) = oneshot::channel::<Result<T, E>>();
    let job: Job = Box::new(move |txn| {
        let outcome = match txn {
            Ok(txn) => run_in_savepoint(txn, job),
            Err(e) => Err(E::from(e)),
        };
        Box::new(move |commit: Result<(), Error>| {
            let result = match commit {
                Ok(()) => {
                    if let Ok(value) = &outcome {
                        committed(value);
                    }
                    outcome
                }
                // A failed job has no writes to lose: report its own error, not the commit's.
                Err(e) => outcome.and(Err(E::from(e))),
            };
            // The caller may have gone away (cancelled request): nothing to tell.
            let _ = answer.send(result);
        })
    });
    (job, answered)
}

fn run_in_savepoint<T, E: From<Error>>(
    txn: &mut Transaction<'_>,
    job: impl FnOnce(&Connection) -> Result<T, E>,
) -> Result<T, E> {
    // Cached statements rather than rusqlite's `Savepoint`, which parses its SQL afresh for
    // every job: at thousands of jobs a second that parsing showed in profiles.
    let conn: &Connection = txn;
    let run = |sql: &str| -> Result<(), Error> {
        conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    };
    run("SAVEPOINT job").map_err(E::from)?;
    let outcome = job(conn);
    let closed = match outcome {
        Ok(_) => run("RELEASE job"),
        Err(_) => run("ROLLBACK TO job").and_then(|()| run("RELEASE job")),
    };
    match (outcome, closed) {
        (Ok(value), Ok(())) => Ok(value),
        // The job's own error says more than a failure to roll it back.
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(E::from(e)),
    }
}

/// Each job runs in a savepoint, so SQLite journals every page a job changes (the statement
/// journal), by default in memory up to 64 KiB and in a temporary file beyond. A dispatcher
/// outcome job touches a dozen index pages, so nearly every job spilled: pwrite calls into that
/// file were a quarter of central's CPU while dispatching (perf, `make bench` dispatch). In
/// memory, a job's journal holds the pages that job changed, and every job is bounded (claims,
/// outcomes and purge batches by their batch sizes, admin operations by one notification or
/// list). Set after `prepare`, so that a migration rewriting a large table still journals to a
/// file. The pragma also keeps the writer's temporary sorts in memory; central's plan guard
/// (`store::sqlite::statement_files`) keeps its statements from sorting a growing table.
fn keep_statement_journals_in_memory(conn: &Connection) -> Result<(), Error> {
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(())
}

fn configure_writer(conn: &Connection, durability: Durability) -> Result<(), Error> {
    // Another process (a second replica, the sqlite3 CLI) may hold the write lock briefly.
    conn.busy_timeout(LOCK_WAIT)?;
    enter_wal(conn)?;
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Prepared statements are reused across batches; the default cache of 16 is too small for
    // the statements of a whole store.
    conn.set_prepared_statement_cache_capacity(64);
    keep_plans(conn)
}

/// Bounds the connection's page cache to `bytes` (a negative `cache_size` is in KiB).
fn set_cache(conn: &Connection, bytes: Option<u64>) -> Result<(), Error> {
    if let Some(bytes) = bytes {
        let kib = i64::try_from(bytes / 1024).unwrap_or(i64::MAX).max(1);
        conn.pragma_update(None, "cache_size", -kib)?;
    }
    Ok(())
}

/// How long a connection waits for another process's lock before giving up.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Puts the file in WAL mode. Switching a new file takes an exclusive lock, and SQLite answers
/// "database is locked" at once, without its busy wait, when another process (a replica
/// starting at the same moment) holds any lock; so that answer is retried here for up to
/// [`LOCK_WAIT`]. Once the file is in WAL mode the pragma needs no lock.
fn enter_wal(conn: &Connection) -> Result<(), Error> {
    let started = std::time::Instant::now();
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && started.elapsed() < LOCK_WAIT =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return Ok(other?),
        }
    }
}

/// Turns on SQLite's query planner stability guarantee. Without it a cached statement whose
/// plan SQLite judged to depend on a bound value (a partial index, a LIKE pattern) is parsed and
/// planned again every time that value changes, which made the dispatcher's claim cost ~14% of
/// central's CPU in a profile. Plans here never depend on bound values: every query states the
/// constants its indexes need.
fn keep_plans(conn: &Connection) -> Result<(), Error> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// The writer's two inboxes.
struct Queues {
    priority: mpsc::UnboundedReceiver<Job>,
    ordinary: mpsc::Receiver<Job>,
}

impl Queues {
    /// Blocks until a job arrives on either queue, priority first; `None` once both are closed
    /// and empty (every `Database` handle is gone).
    fn wait(&mut self, idle: &tokio::runtime::Runtime) -> Option<Job> {
        idle.block_on(async {
            tokio::select! {
                biased;
                Some(job) = self.priority.recv() => Some(job),
                Some(job) = self.ordinary.recv() => Some(job),
                else => None,
            }
        })
    }

    /// The next batch after `first`: every queued priority job, then ordinary jobs up to
    /// `max_batch` in all. Priority jobs run first in the transaction.
    fn fill(&mut self, first: Job, batch: &mut Vec<Job>, max_batch: usize) {
        while let Ok(job) = self.priority.try_recv() {
            batch.push(job);
        }
        batch.push(first);
        while batch.len() < max_batch {
            match self.ordinary.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
    }
}

fn run_writer(mut conn: Connection, mut queues: Queues, max_batch: usize) {
    // Only for waiting on the two queues: the writer's work itself is blocking SQLite calls.
    let idle = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            // Every write then fails with WriterStopped, which callers already handle.
            tracing::error!(error = %e, "cannot start the SQLite writer");
            return;
        }
    };
    let mut batch: Vec<Job> = Vec::with_capacity(max_batch);
    let mut replies: Vec<Reply> = Vec::with_capacity(max_batch);
    while let Some(first) = queues.wait(&idle) {
        queues.fill(first, &mut batch, max_batch);
        // IMMEDIATE takes the write lock up front, so a busy database fails here (before any
        // job ran) rather than at commit.
        let mut txn = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(txn) => txn,
            Err(e) => {
                tracing::error!(error = %e, "cannot begin a write transaction");
                let error = Error::Commit(Arc::new(e));
                for job in batch.drain(..) {
                    job(Err(error.clone()))(Err(error.clone()));
                }
                continue;
            }
        };
        for job in batch.drain(..) {
            replies.push(job(Ok(&mut txn)));
        }
        let committed = txn.commit().map_err(|e| {
            tracing::error!(error = %e, jobs = replies.len(), "group commit failed");
            Error::Commit(Arc::new(e))
        });
        for reply in replies.drain(..) {
            reply(committed.clone());
        }
    }
}

/// Read-only connections handed out one per query. A connection lost to a panicking query is
/// replaced by a new one on next use.
struct ReadPool {
    path: PathBuf,
    cache_bytes: Option<u64>,
    idle: Mutex<Vec<Connection>>,
    permits: Semaphore,
}

impl ReadPool {
    fn open(path: &Path, size: usize, cache_bytes: Option<u64>) -> Result<Self, Error> {
        let idle = (0..size)
            .map(|_| open_reader(path, cache_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            path: path.to_owned(),
            cache_bytes,
            idle: Mutex::new(idle),
            permits: Semaphore::new(size),
        })
    }

    async fn read<T, E>(
        self: &Arc<Self>,
        query: impl FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| E::from(Error::WriterStopped))?;
        let pool = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let conn = match pool.take() {
                Ok(conn) => conn,
                Err(e) => return Err(E::from(e)),
            };
            let result = query(&conn);
            pool.give_back(conn);
            result
        })
        .await
        .map_err(|e| E::from(Error::TaskFailed(e.to_string())))?
    }

    fn take(&self) -> Result<Connection, Error> {
        let pooled = self.idle.lock().map(|mut idle| idle.pop()).ok().flatten();
        match pooled {
            Some(conn) => Ok(conn),
            None => open_reader(&self.path, self.cache_bytes),
        }
    }

    fn give_back(&self, conn: Connection) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
    }
}

fn open_reader(path: &Path, cache_bytes: Option<u64>) -> Result<Connection, Error> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(LOCK_WAIT)?;
    conn.set_prepared_statement_cache_capacity(32);
    set_cache(&conn, cache_bytes)?;
    keep_plans(&conn)?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    fn open(dir: &tempfile::TempDir) -> Database {
        Database::open(&Options::new(dir.path().join("t.db")), |conn| {
            conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")?;
            Ok(())
        })
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_all_commit_and_are_readable() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir);
        let mut tasks = tokio::task::JoinSet::new();
        for k in 0..500_i64 {
            let db = db.clone();
            tasks.spawn(async move {
                db.write(move |c| {
                    c.execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [k])
                        .map_err(Error::from)
                })
                .await
            });
        }
        while let Some(done) = tasks.join_next().await {
            assert_eq!(done.unwrap().unwrap(), 1);
        }
        let count: i64 = db
            .read(|c| {
                c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
                    .map_err(Error::from)
            })
            .await
            .unwrap();
        assert_eq!(count, 500);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_connection_keeps_the_page_cache_it_was_given() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = Options::new(dir.path().join("t.db"));
        options.writer_cache_bytes = Some(8 * 1024 * 1024);
        options.reader_cache_bytes = Some(1024 * 1024);
        options.readers = 3;
        assert_eq!(options.page_cache_bound(), 11 * 1024 * 1024);
        let db = Database::open(&options, |_| Ok(())).unwrap();
        let cache_size = |c: &Connection| {
            c.query_row("PRAGMA cache_size", [], |r| r.get::<_, i64>(0))
                .map_err(Error::from)
        };
        assert_eq!(db.write(cache_size).await.unwrap(), -8192);
        assert_eq!(db.read(cache_size).await.unwrap(), -1024);
        // Unset: SQLite's default.
        let plain = Database::open(&Options::new(dir.path().join("u.db")), |_| Ok(())).unwrap();
        assert_eq!(plain.read(cache_size).await.unwrap(), -2000);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_journals_its_jobs_in_memory_after_prepare() {
        let dir = tempfile::tempdir().unwrap();
        let temp_store = |c: &Connection| {
            c.query_row("PRAGMA temp_store", [], |r| r.get::<_, i64>(0))
                .map_err(Error::from)
        };
        let mut during_prepare = None;
        let db = Database::open(&Options::new(dir.path().join("t.db")), |c| {
            during_prepare = Some(temp_store(c)?);
            Ok(())
        })
        .unwrap();
        // 0: SQLite's default (a file beyond 64 KiB); 2: memory.
        assert_eq!(during_prepare, Some(0));
        assert_eq!(db.write(temp_store).await.unwrap(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_job_rolls_back_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir);
        db.write(|c| {
            c.execute("INSERT INTO t (k, v) VALUES (1, 'a')", [])
                .map_err(Error::from)
        })
        .await
        .unwrap();
        // One job writes a row and then fails on a duplicate key; another succeeds.
        let failing = db.write(|c| {
            c.execute("INSERT INTO t (k, v) VALUES (2, 'b')", [])?;
            c.execute("INSERT INTO t (k, v) VALUES (1, 'dup')", [])
                .map_err(Error::from)
        });
        let passing = db.write(|c| {
            c.execute("INSERT INTO t (k, v) VALUES (3, 'c')", [])
                .map_err(Error::from)
        });
        let (failing, passing) = tokio::join!(failing, passing);
        assert!(failing.is_err());
        assert_eq!(passing.unwrap(), 1);
        let keys: Vec<i64> = db
            .read(|c| {
                let mut stmt = c.prepare("SELECT k FROM t ORDER BY k")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                rows.collect::<Result<Vec<i64>, _>>().map_err(Error::from)
            })
            .await
            .unwrap();
        assert_eq!(
            keys,
            vec![1, 3],
            "the failed job's first insert was rolled back"
        );
    }

    /// Follow-ups see every committed job once, in commit order (here: rowid order), and never a
    /// job that failed; each has run by the time its caller is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn follow_ups_run_in_commit_order_and_only_for_committed_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir);
        let seen = Arc::new(Mutex::new(Vec::<i64>::new()));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..300_i64 {
            let db = db.clone();
            let seen = Arc::clone(&seen);
            tasks.spawn(async move {
                let record = Arc::clone(&seen);
                let rowid = db
                    .write_then(
                        move |c| {
                            if i % 50 == 7 {
                                // Fails after writing: rolled back, so no follow-up.
                                c.execute("INSERT INTO t (v) VALUES ('doomed')", [])?;
                                return Err(Error::TaskFailed("refused".into()));
                            }
                            c.execute("INSERT INTO t (v) VALUES ('x')", [])?;
                            Ok::<_, Error>(c.last_insert_rowid())
                        },
                        move |rowid| record.lock().unwrap().push(*rowid),
                    )
                    .await;
                if let Ok(rowid) = rowid {
                    assert!(
                        seen.lock().unwrap().contains(&rowid),
                        "answered before its follow-up ran"
                    );
                }
                rowid.ok()
            });
        }
        let mut committed = Vec::new();
        while let Some(done) = tasks.join_next().await {
            committed.extend(done.unwrap());
        }
        committed.sort_unstable();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(committed.len(), 294);
        assert_eq!(seen, committed, "each committed job once, in commit order");
    }

    /// A priority job queued behind a long transaction and a backlog of ordinary jobs runs in
    /// the very next transaction, before any of the backlog.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_priority_job_runs_before_the_queued_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = Options::new(dir.path().join("t.db"));
        options.max_batch_jobs = 10;
        let db = Database::open(&options, |conn| {
            conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")?;
            Ok(())
        })
        .unwrap();

        // Hold the writer inside a job until the backlog is queued.
        let (running_tx, running_rx) = std::sync::mpsc::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let held = tokio::spawn({
            let db = db.clone();
            async move {
                db.write(move |c| {
                    running_tx.send(()).ok();
                    release_rx.recv().ok();
                    c.execute("INSERT INTO t (v) VALUES ('long')", [])
                        .map_err(Error::from)
                })
                .await
            }
        });
        tokio::task::spawn_blocking(move || running_rx.recv().unwrap())
            .await
            .unwrap();
        const BACKLOG: usize = 100;
        let mut backlog = tokio::task::JoinSet::new();
        for _ in 0..BACKLOG {
            let db = db.clone();
            backlog.spawn(async move {
                db.write(|c| {
                    c.execute("INSERT INTO t (v) VALUES ('bulk')", [])
                        .map_err(Error::from)
                })
                .await
            });
        }
        while db.jobs.max_capacity() - db.jobs.capacity() < BACKLOG {
            tokio::task::yield_now().await;
        }

        let mut urgent = Box::pin(db.write_first(|c| {
            c.query_row("SELECT COUNT(*) FROM t WHERE v = 'bulk'", [], |r| {
                r.get::<_, i64>(0)
            })
            .map_err(Error::from)
        }));
        // Poll it once: that queues the job (the answer cannot have come yet).
        std::future::poll_fn(|cx| {
            assert!(urgent.as_mut().poll(cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
        release_tx.send(()).unwrap();
        held.await.unwrap().unwrap();
        let bulk_before_urgent = urgent.await.unwrap();
        assert_eq!(
            bulk_before_urgent, 0,
            "the priority job ran after queued ordinary jobs"
        );
        while let Some(done) = backlog.join_next().await {
            done.unwrap().unwrap();
        }
    }
}
