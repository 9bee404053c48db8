//! Which database central runs on in this run of the suite, and read/write SQL on it as an
//! auditor would look at the table.
//!
//! The suite is written once. Each test names its central database by the SQLite file it would
//! use on the embedded default (`<tempdir>/central.db`); with `OUTBOX_E2E_CENTRAL=mssql` (set by
//! `make test-mssql`) that name stands for a fresh scratch database on the MS SQL server
//! `OUTBOX_TEST_MSSQL_URL` names, created by [`CentralDatabase::create`]. It lives as long as
//! the directory that names it (a test restarting central finds its rows again): databases
//! whose directory is gone are dropped whenever another is created, and the last few of a run
//! are left on the test server. [`Db`] answers the same queries on either: the tests' SQL stays
//! within what both dialects read alike (`?1` parameters are rewritten to `@P1`), and values
//! come back in one form (times as Unix milliseconds, ids as lowercase text).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Duration;

use central_outbox::store::mssql::{MsSqlOptions, ScratchDatabase};
use tokio_util::compat::TokioAsyncWriteCompatExt;

/// Chooses the backend: `sqlite` (the default) or `mssql`.
const BACKEND_VAR: &str = "OUTBOX_E2E_CENTRAL";
/// The MS SQL server (a login that may create databases), as for the conformance suite.
const MSSQL_URL_VAR: &str = "OUTBOX_TEST_MSSQL_URL";

/// The MS SQL server's connection string when this run puts central on MS SQL.
fn mssql_server() -> Option<&'static str> {
    static SERVER: OnceLock<Option<String>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let wanted = std::env::var(BACKEND_VAR).unwrap_or_default();
            if !wanted.eq_ignore_ascii_case("mssql") {
                return None;
            }
            let url = std::env::var(MSSQL_URL_VAR).unwrap_or_else(|_| {
                panic!(
                    "{BACKEND_VAR}=mssql needs {MSSQL_URL_VAR} (a server that may CREATE DATABASE)"
                )
            });
            Some(url)
        })
        .as_deref()
}

/// Whether this run puts central on MS SQL (a test about SQLite's own file says it is skipped).
pub(crate) fn on_mssql() -> bool {
    mssql_server().is_some()
}

/// Scratch databases by the SQLite path that names them.
fn registry() -> &'static Mutex<HashMap<PathBuf, Arc<ScratchDatabase>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<PathBuf, Arc<ScratchDatabase>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

fn scratch_for(path: &Path) -> Option<Arc<ScratchDatabase>> {
    registry().lock().unwrap().get(path).cloned()
}

/// Takes out the databases whose naming directory no longer exists (their test has ended), to
/// be dropped by the caller outside the lock.
fn ended_tests() -> Vec<Arc<ScratchDatabase>> {
    let mut registry = registry().lock().unwrap();
    let ended: Vec<PathBuf> = registry
        .keys()
        .filter(|path| path.parent().is_some_and(|dir| !dir.exists()))
        .cloned()
        .collect();
    ended
        .iter()
        .filter_map(|path| registry.remove(path))
        .collect()
}

/// A test's central database; keep it for as long as central (or anything reading its table)
/// runs.
#[derive(Debug, Clone)]
pub(crate) struct CentralDatabase {
    path: PathBuf,
    _scratch: Option<Arc<ScratchDatabase>>,
}

impl CentralDatabase {
    /// The database named by `path`: the SQLite file itself, or (on MS SQL) a new scratch
    /// database, or the one already created for that name.
    pub(crate) async fn create(path: &Path) -> Self {
        let scratch = match mssql_server() {
            None => None,
            Some(server) => {
                // Dropping a ScratchDatabase drops its database (on a thread of its own).
                drop(ended_tests());
                Some(match scratch_for(path) {
                    Some(existing) => existing,
                    None => {
                        let created = Arc::new(
                            ScratchDatabase::create(server)
                                .await
                                .expect("create a scratch database for central"),
                        );
                        registry()
                            .lock()
                            .unwrap()
                            .insert(path.to_owned(), Arc::clone(&created));
                        created
                    }
                })
            }
        };
        Self {
            path: path.to_owned(),
            _scratch: scratch,
        }
    }

    /// The `database` setting that points central at it.
    pub(crate) fn url(&self) -> String {
        database_url(&self.path)
    }
}

/// The `database` setting for the database named by `path` (see [`CentralDatabase`]).
pub(crate) fn database_url(path: &Path) -> String {
    match scratch_for(path) {
        Some(scratch) => scratch.connection_string(),
        None => format!("sqlite://{}", path.display()),
    }
}

/// One value as the tests read it, whichever the backend.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Int(i64),
    Text(String),
}

/// One result row.
#[derive(Debug, Clone)]
pub(crate) struct SqlRow(Vec<Value>);

/// Turns a [`Value`] into what a test asks for.
pub(crate) trait FromValue: Sized {
    fn from_value(value: &Value) -> Result<Self, String>;
}

impl FromValue for i64 {
    fn from_value(value: &Value) -> Result<Self, String> {
        match value {
            Value::Int(v) => Ok(*v),
            other => Err(format!("expected an integer, got {other:?}")),
        }
    }
}

impl FromValue for String {
    fn from_value(value: &Value) -> Result<Self, String> {
        match value {
            Value::Text(v) => Ok(v.clone()),
            Value::Int(v) => Ok(v.to_string()),
            Value::Null => Err("expected text, got NULL".into()),
        }
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(value: &Value) -> Result<Self, String> {
        match value {
            Value::Null => Ok(None),
            other => T::from_value(other).map(Some),
        }
    }
}

impl SqlRow {
    pub(crate) fn get<T: FromValue>(&self, index: usize) -> Result<T, String> {
        let value = self
            .0
            .get(index)
            .ok_or_else(|| format!("no column {index}"))?;
        T::from_value(value)
    }
}

/// SQL against central's database, as an auditor would run it.
pub(crate) enum Db {
    Sqlite(rusqlite::Connection),
    MsSql(MsSqlSession),
}

impl Db {
    /// Opens the database named by `path` (see [`CentralDatabase`]).
    pub(crate) fn open(path: &Path) -> Self {
        match scratch_for(path) {
            Some(scratch) => Self::MsSql(MsSqlSession::open(scratch.options())),
            None => {
                // Read-write for `expire_lease`; never creates a file, so a wrong name fails.
                let conn = rusqlite::Connection::open_with_flags(
                    path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE,
                )
                .unwrap();
                conn.busy_timeout(Duration::from_secs(5)).unwrap();
                Self::Sqlite(conn)
            }
        }
    }

    /// Every row `sql` returns; `params` bind `?1`, `?2`, ... as text.
    pub(crate) fn query(&self, sql: &str, params: &[&str]) -> Vec<SqlRow> {
        match self {
            Self::Sqlite(conn) => {
                let mut stmt = conn.prepare(sql).unwrap();
                let columns = stmt.column_count();
                stmt.query_map(rusqlite::params_from_iter(params.iter()), |row| {
                    (0..columns)
                        .map(|i| {
                            Ok(match row.get_ref(i)? {
                                rusqlite::types::ValueRef::Null => Value::Null,
                                rusqlite::types::ValueRef::Integer(v) => Value::Int(v),
                                rusqlite::types::ValueRef::Real(v) => Value::Int(v as i64),
                                rusqlite::types::ValueRef::Text(t) => {
                                    Value::Text(String::from_utf8_lossy(t).into_owned())
                                }
                                rusqlite::types::ValueRef::Blob(b) => Value::Text(hex(b)),
                            })
                        })
                        .collect::<rusqlite::Result<Vec<_>>>()
                        .map(SqlRow)
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
            }
            Self::MsSql(session) => session.query(&tsql(sql), params),
        }
    }

    /// Runs a statement that changes rows; returns how many.
    pub(crate) fn execute(&self, sql: &str, params: &[&str]) -> u64 {
        match self {
            Self::Sqlite(conn) => conn
                .execute(sql, rusqlite::params_from_iter(params.iter()))
                .unwrap() as u64,
            Self::MsSql(session) => {
                let rows = session.query(&format!("{}; SELECT @@ROWCOUNT;", tsql(sql)), params);
                rows[0].get::<i64>(0).unwrap() as u64
            }
        }
    }

    pub(crate) fn count(&self, sql: &str) -> i64 {
        self.query(sql, &[])[0].get(0).unwrap()
    }

    /// Every row `sql` returns, each read by `read`.
    pub(crate) fn rows<T>(
        &self,
        sql: &str,
        read: impl FnMut(&SqlRow) -> Result<T, String>,
    ) -> Vec<T> {
        self.query(sql, &[])
            .iter()
            .map(read)
            .collect::<Result<_, _>>()
            .unwrap()
    }

    pub(crate) fn strings(&self, sql: &str) -> Vec<String> {
        self.rows(sql, |r| r.get(0))
    }

    /// (Status, RetryCount, LastError) of one notification.
    pub(crate) fn row(&self, id: &str) -> Option<(String, i64, Option<String>)> {
        self.query(
            "SELECT Status, RetryCount, LastError FROM Notifications WHERE NotificationId = ?1",
            &[id],
        )
        .first()
        .map(|r| (r.get(0).unwrap(), r.get(1).unwrap(), r.get(2).unwrap()))
    }

    /// (AttemptNo, Outcome, Error) of every attempt of one notification, oldest first.
    pub(crate) fn attempts(&self, id: &str) -> Vec<(i64, String, Option<String>)> {
        self.query(
            "SELECT AttemptNo, Outcome, Error FROM NotificationAttempts
             WHERE NotificationId = ?1 ORDER BY AttemptNo",
            &[id],
        )
        .iter()
        .map(|r| (r.get(0).unwrap(), r.get(1).unwrap(), r.get(2).unwrap()))
        .collect()
    }

    /// Ends the dispatcher lease now by the database's clock, behind its holder's back.
    pub(crate) fn expire_lease(&self) {
        let changed = match self {
            Self::Sqlite(_) => {
                let now = chrono::Utc::now().timestamp_millis().to_string();
                self.execute(
                    "UPDATE Leases SET ExpiresAt = ?1 WHERE Name = 'dispatcher'",
                    &[&now],
                )
            }
            Self::MsSql(_) => self.execute(
                "UPDATE dbo.Leases SET ExpiresAt = SYSUTCDATETIME() WHERE Name = N'dispatcher'",
                &[],
            ),
        };
        assert_eq!(changed, 1);
    }
}

/// `?N` placeholders as T-SQL's `@PN`.
fn tsql(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push_str("@P");
        } else {
            out.push(c);
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

type Request = (String, Vec<String>, mpsc::Sender<Vec<SqlRow>>);

/// A connection to an MS SQL database on a thread of its own, so [`Db`] keeps the synchronous
/// interface the tests use from async code: a query blocks the caller only for its round trip,
/// and never waits on the caller's runtime.
pub(crate) struct MsSqlSession {
    requests: mpsc::Sender<Request>,
}

impl MsSqlSession {
    fn open(options: MsSqlOptions) -> Self {
        let (requests, inbox) = mpsc::channel::<Request>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let tcp = tokio::net::TcpStream::connect((options.host.as_str(), options.port))
                    .await
                    .unwrap();
                tcp.set_nodelay(true).unwrap();
                let mut client =
                    tiberius::Client::connect(options.tiberius_config(), tcp.compat_write())
                        .await
                        .unwrap();
                while let Ok((sql, params, reply)) = inbox.recv() {
                    let refs: Vec<&dyn tiberius::ToSql> =
                        params.iter().map(|p| p as &dyn tiberius::ToSql).collect();
                    let rows = client
                        .query(sql.as_str(), &refs)
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {e}"))
                        .into_first_result()
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {e}"));
                    let rows = rows
                        .into_iter()
                        .map(|row| SqlRow(row.into_iter().map(value).collect()))
                        .collect();
                    if reply.send(rows).is_err() {
                        break;
                    }
                }
            });
        });
        Self { requests }
    }

    fn query(&self, sql: &str, params: &[&str]) -> Vec<SqlRow> {
        let (reply, answer) = mpsc::channel();
        self.requests
            .send((
                sql.to_owned(),
                params.iter().map(|p| (*p).to_owned()).collect(),
                reply,
            ))
            .expect("the MS SQL session thread is running");
        answer
            .recv_timeout(Duration::from_secs(60))
            .expect("the MS SQL session answered (see its panic above)")
    }
}

/// One column's value in the tests' form: times as Unix milliseconds, ids as lowercase text.
fn value(data: tiberius::ColumnData<'static>) -> Value {
    use tiberius::ColumnData as C;
    use tiberius::FromSql;
    match data {
        C::U8(Some(v)) => Value::Int(i64::from(v)),
        C::I16(Some(v)) => Value::Int(i64::from(v)),
        C::I32(Some(v)) => Value::Int(i64::from(v)),
        C::I64(Some(v)) => Value::Int(v),
        C::Bit(Some(v)) => Value::Int(i64::from(v)),
        C::F32(Some(v)) => Value::Int(v as i64),
        C::F64(Some(v)) => Value::Int(v as i64),
        C::String(Some(s)) => Value::Text(s.into_owned()),
        C::Guid(Some(g)) => Value::Text(g.to_string()),
        C::Binary(Some(b)) => Value::Text(hex(&b)),
        ref time @ (C::DateTime2(Some(_)) | C::DateTime(Some(_)) | C::SmallDateTime(Some(_))) => {
            let at = chrono::NaiveDateTime::from_sql(time)
                .unwrap()
                .expect("a non-NULL time");
            Value::Int(at.and_utc().timestamp_millis())
        }
        C::U8(None)
        | C::I16(None)
        | C::I32(None)
        | C::I64(None)
        | C::Bit(None)
        | C::F32(None)
        | C::F64(None)
        | C::String(None)
        | C::Guid(None)
        | C::Binary(None)
        | C::DateTime2(None)
        | C::DateTime(None)
        | C::SmallDateTime(None) => Value::Null,
        other => panic!("a column type the tests do not read: {other:?}"),
    }
}
