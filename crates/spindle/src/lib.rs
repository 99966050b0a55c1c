//! # Spindle: a Spanner-style relational database, embedded
//!
//! Interleaved tables (a child row is stored under its parent row, so a
//! root row and its descendants — a *row tree* — are contiguous), SQL in
//! GoogleSQL's or PostgreSQL's DDL spelling, serializable transactions and
//! durable commits, in your process.
//!
//! ```
//! use spindle::{Database, Value};
//!
//! # fn main() -> spindle::Result<()> {
//! let db = Database::open_in_memory()?;
//! db.execute("CREATE TABLE Singers (SingerId INT64 NOT NULL, Name STRING(MAX)) PRIMARY KEY (SingerId)", &[])?;
//! db.execute(
//!     "CREATE TABLE Albums (SingerId INT64 NOT NULL, AlbumId INT64 NOT NULL, Title STRING(MAX))
//!      PRIMARY KEY (SingerId, AlbumId), INTERLEAVE IN PARENT Singers ON DELETE CASCADE",
//!     &[],
//! )?;
//! db.execute("INSERT INTO Singers (SingerId, Name) VALUES ($1, $2)", &[Value::Int64(1), Value::String("Marc".into())])?;
//! db.transaction(|tx| {
//!     tx.execute("INSERT INTO Albums VALUES (1, 1, 'Total Junk')", &[])?;
//!     tx.execute("INSERT INTO Albums VALUES (1, 2, 'Go, Go, Go')", &[])?;
//!     Ok(())
//! })?;
//! let rows = db.query("SELECT a.Title FROM Singers s JOIN Albums a ON s.SingerId = a.SingerId ORDER BY a.AlbumId", &[])?;
//! let titles: Vec<String> = rows.rows()?.iter().map(|r| r.get::<String>(0)).collect::<Result<_, _>>()?;
//! assert_eq!(titles, ["Total Junk", "Go, Go, Go"]);
//! // Deleting a singer deletes its row tree.
//! assert_eq!(db.execute("DELETE FROM Singers WHERE SingerId = 1", &[])?, 1);
//! assert_eq!(db.query("SELECT count(*) FROM Albums", &[])?.rows()?[0].get::<i64>(0)?, 0);
//! # Ok(())
//! # }
//! ```
//!
//! A statement run many times is parsed once with [`Session::prepare`]:
//!
//! ```
//! # use spindle::{Database, Value};
//! # fn main() -> spindle::Result<()> {
//! let db = Database::open_in_memory()?;
//! let mut s = db.session();
//! s.execute("CREATE TABLE t (id bigint NOT NULL, v text, PRIMARY KEY (id))", &[])?;
//! let insert = s.prepare("INSERT INTO t (id, v) VALUES ($1, $2)")?;
//! s.execute("BEGIN", &[])?;
//! for i in 0..100 {
//!     s.execute_prepared(&insert, &[Value::Int64(i), Value::String(format!("row {i}"))])?;
//! }
//! s.execute("COMMIT", &[])?;
//! let get = s.prepare("SELECT v FROM t WHERE id = $1")?;
//! let rows = s.query_prepared(&get, &[Value::Int64(42)])?;
//! assert_eq!(rows.rows()?[0].get::<String>(0)?, "row 42");
//! # Ok(())
//! # }
//! ```
//!
//! The API is synchronous; it drives the async engine on a runtime the
//! [`Database`] owns. Async callers (the wire server) use
//! [`Session::execute_async`].

use std::path::Path;
use std::sync::Arc;

pub use datafusion::arrow;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
pub use spindle_keys::{DataType, Value};
use spindle_sql::{Engine, Output as SqlOutput};

/// An error with its PostgreSQL SQLSTATE.
#[derive(Debug)]
pub struct Error {
    inner: ErrorKind,
}

#[derive(Debug)]
enum ErrorKind {
    Sql(spindle_sql::Error),
    Io(std::io::Error),
    Type(String),
}

impl Error {
    /// The PostgreSQL SQLSTATE code (e.g. `23505`).
    pub fn sqlstate(&self) -> &'static str {
        match &self.inner {
            ErrorKind::Sql(e) => e.sqlstate(),
            ErrorKind::Io(_) => "58030",
            ErrorKind::Type(_) => "42804",
        }
    }

    /// Whether retrying the transaction may succeed (SQLSTATE 40001, a
    /// serialization failure, or 40P01, a deadlock).
    pub fn is_retryable(&self) -> bool {
        match &self.inner {
            ErrorKind::Sql(e) => e.is_retryable(),
            _ => false,
        }
    }

    /// The SQL layer's error, for callers that need the detail.
    pub fn sql_error(&self) -> Option<&spindle_sql::Error> {
        match &self.inner {
            ErrorKind::Sql(e) => Some(e),
            _ => None,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            ErrorKind::Sql(e) => write!(f, "{e}"),
            ErrorKind::Io(e) => write!(f, "I/O error: {e}"),
            ErrorKind::Type(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.inner {
            ErrorKind::Sql(e) => Some(e),
            ErrorKind::Io(e) => Some(e),
            ErrorKind::Type(_) => None,
        }
    }
}

impl From<spindle_sql::Error> for Error {
    fn from(e: spindle_sql::Error) -> Self {
        Error {
            inner: ErrorKind::Sql(e),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error {
            inner: ErrorKind::Io(e),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attempts of [`Database::transaction`] before a conflict is returned.
const TRANSACTION_ATTEMPTS: usize = 10;

/// An open database. Cheap to clone; all clones share one engine.
#[derive(Clone)]
pub struct Database {
    engine: Arc<Engine>,
    runtime: Arc<tokio::runtime::Runtime>,
}

impl Database {
    /// Opens (creating if needed) the database in directory `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Database> {
        std::fs::create_dir_all(path.as_ref())?;
        Self::with_engine(Engine::open(Some(path.as_ref()))?)
    }

    /// A database that lives in a temporary directory, removed on drop.
    pub fn open_in_memory() -> Result<Database> {
        Self::with_engine(Engine::open(None)?)
    }

    fn with_engine(engine: Arc<Engine>) -> Result<Database> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("spindle")
            .enable_all()
            .build()?;
        Ok(Database {
            engine,
            runtime: Arc::new(runtime),
        })
    }

    /// The engine, for async embedders and the wire server.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// A new session (connection) with its own transaction state.
    pub fn session(&self) -> Session {
        Session {
            inner: self.engine.session(),
            runtime: self.runtime.clone(),
        }
    }

    /// Runs one statement in its own transaction; returns rows affected.
    pub fn execute(&self, sql: &str, params: &[Value]) -> Result<u64> {
        self.session().execute(sql, params)
    }

    /// Runs one query in its own transaction.
    pub fn query(&self, sql: &str, params: &[Value]) -> Result<Rows> {
        self.session().query(sql, params)
    }

    /// Runs `f` in a transaction and commits it. When the transaction
    /// aborts with a serialization conflict (40001), it is retried with
    /// backoff: `f` must be safe to run again.
    pub fn transaction<T>(&self, mut f: impl FnMut(&mut Session) -> Result<T>) -> Result<T> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut s = self.session();
            s.run("BEGIN")?;
            let r = f(&mut s).and_then(|v| {
                if s.inner.transaction_failed() {
                    return Err(spindle_sql::Error::InFailedTransaction.into());
                }
                s.run("COMMIT").map(|_| v)
            });
            match r {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retryable() && attempt < TRANSACTION_ATTEMPTS => {
                    let _ = s.run("ROLLBACK");
                    std::thread::sleep(std::time::Duration::from_millis(1 << attempt.min(8)));
                }
                Err(e) => {
                    let _ = s.run("ROLLBACK");
                    return Err(e);
                }
            }
        }
    }
}

/// A connection: runs statements, holds an open transaction between
/// `BEGIN` and `COMMIT`/`ROLLBACK`.
pub struct Session {
    inner: spindle_sql::Session,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// SQL parsed once by [`Session::prepare`] and run many times with
/// parameters ([`Session::execute_prepared`], [`Session::query_prepared`]):
/// each run skips finding the text's parse. It follows schema changes (a
/// statement's cached plan is remade when the catalog it was made against
/// changed), and any session of the same database may run it.
#[derive(Clone, Debug)]
pub struct Statement {
    parsed: Arc<spindle_sql::plan_cache::Parsed>,
}

/// The result of one statement.
#[derive(Debug, Clone)]
pub enum Output {
    Rows(Rows),
    /// PostgreSQL command tag (`INSERT 0 3`, `CREATE TABLE`, …) and rows affected.
    Command {
        tag: String,
        rows: u64,
    },
}

impl From<SqlOutput> for Output {
    fn from(o: SqlOutput) -> Self {
        match o {
            SqlOutput::Rows { schema, batches } => Output::Rows(Rows { schema, batches }),
            SqlOutput::Command { tag, rows } => Output::Command {
                tag: tag.to_string(),
                rows,
            },
        }
    }
}

impl Session {
    /// Runs every statement in `sql`, stopping at the first error.
    pub fn run(&mut self, sql: &str) -> Result<Vec<Output>> {
        self.run_with(sql, &[])
    }

    fn run_with(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Output>> {
        // A statement a cached plan runs needs no runtime.
        if let Some(out) = self.inner.execute_now(sql, params)? {
            return Ok(vec![Output::from(out)]);
        }
        let rt = self.runtime.clone();
        let out = rt.block_on(self.inner.execute(sql, params))?;
        Ok(out.into_iter().map(Output::from).collect())
    }

    /// Parses `sql` (one or more statements with `$1`, `$2`, … parameters)
    /// for running many times. A syntax error is returned here (and fails
    /// an open transaction block, as running the text would).
    pub fn prepare(&mut self, sql: &str) -> Result<Statement> {
        Ok(Statement {
            parsed: self.inner.prepare(sql)?,
        })
    }

    fn run_prepared(&mut self, stmt: &Statement, params: &[Value]) -> Result<Vec<Output>> {
        if let Some(out) = self.inner.execute_parsed_now(&stmt.parsed, params)? {
            return Ok(vec![Output::from(out)]);
        }
        self.run_prepared_general(stmt, params)
    }

    /// `stmt` on the runtime, once the fast path declined it.
    fn run_prepared_general(&mut self, stmt: &Statement, params: &[Value]) -> Result<Vec<Output>> {
        let rt = self.runtime.clone();
        let out = rt.block_on(self.inner.execute_parsed(&stmt.parsed, params))?;
        Ok(out.into_iter().map(Output::from).collect())
    }

    /// [`Session::execute`] of a prepared statement.
    pub fn execute_prepared(&mut self, stmt: &Statement, params: &[Value]) -> Result<u64> {
        // The fast path's one output, read without the `Vec` and the
        // conversion `run_prepared` makes (this runs once per row of a
        // bulk load).
        match self.inner.execute_parsed_now(&stmt.parsed, params)? {
            Some(SqlOutput::Command { rows, .. }) => Ok(rows),
            Some(SqlOutput::Rows { batches, .. }) => {
                Ok(batches.iter().map(|b| b.num_rows() as u64).sum())
            }
            None => affected(self.run_prepared_general(stmt, params)?),
        }
    }

    /// [`Session::query`] of a prepared statement.
    pub fn query_prepared(&mut self, stmt: &Statement, params: &[Value]) -> Result<Rows> {
        returned(self.run_prepared(stmt, params)?)
    }

    /// Async form of [`Session::run`] with parameters, for async callers.
    pub async fn execute_async(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Output>> {
        let out = self.inner.execute(sql, params).await?;
        Ok(out.into_iter().map(Output::from).collect())
    }

    /// Runs one statement with positional parameters (`$1`, `$2`, …);
    /// returns the rows it affected (or returned).
    pub fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        affected(self.run_with(sql, params)?)
    }

    /// Runs one query with positional parameters.
    pub fn query(&mut self, sql: &str, params: &[Value]) -> Result<Rows> {
        returned(self.run_with(sql, params)?)
    }

    pub fn in_transaction(&self) -> bool {
        self.inner.in_transaction()
    }

    /// Commit timestamp (µs since the Unix epoch) of the last read-write
    /// transaction this session committed — the value its
    /// `PENDING_COMMIT_TIMESTAMP()` writes received.
    pub fn last_commit_timestamp(&self) -> Option<i64> {
        self.inner.last_commit_timestamp()
    }
}

/// The rows the last statement affected (or returned).
fn affected(mut out: Vec<Output>) -> Result<u64> {
    match out.pop() {
        Some(Output::Command { rows, .. }) => Ok(rows),
        Some(Output::Rows(r)) => Ok(r.num_rows() as u64),
        None => Ok(0),
    }
}

/// The rows the last statement returned; an error if it returns none.
fn returned(mut out: Vec<Output>) -> Result<Rows> {
    match out.pop() {
        Some(Output::Rows(r)) => Ok(r),
        Some(Output::Command { tag, .. }) => Err(Error {
            inner: ErrorKind::Type(format!("statement returned no rows ({tag})")),
        }),
        None => Err(Error {
            inner: ErrorKind::Type("empty query".into()),
        }),
    }
}

/// Query results as Arrow record batches.
#[derive(Debug, Clone)]
pub struct Rows {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

impl Rows {
    pub fn column_names(&self) -> Vec<String> {
        self.schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }

    /// The rows as typed values.
    pub fn rows(&self) -> Result<Vec<Row>> {
        let rows = spindle_sql::dml::batch_rows(&self.batches)?;
        Ok(rows.into_iter().map(|values| Row { values }).collect())
    }
}

/// One result row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    values: Vec<Value>,
}

impl Row {
    pub fn values(&self) -> &[Value] {
        &self.values
    }

    /// The value of column `idx` converted to `T`.
    pub fn get<T: FromValue>(&self, idx: usize) -> Result<T> {
        let v = self.values.get(idx).ok_or_else(|| Error {
            inner: ErrorKind::Type(format!(
                "column index {idx} out of range ({} columns)",
                self.values.len()
            )),
        })?;
        T::from_value(v).ok_or_else(|| Error {
            inner: ErrorKind::Type(format!(
                "cannot convert {} value to {}",
                v.type_name(),
                std::any::type_name::<T>()
            )),
        })
    }
}

/// Conversion from a [`Value`] for [`Row::get`].
pub trait FromValue: Sized {
    fn from_value(v: &Value) -> Option<Self>;
}

impl FromValue for i64 {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Int64(i) => Some(*i),
            _ => None,
        }
    }
}
impl FromValue for f64 {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Float64(f) => Some(*f),
            Value::Int64(i) => Some(*i as f64),
            _ => None,
        }
    }
}
impl FromValue for bool {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
}
impl FromValue for String {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::String(s) | Value::Json(s) => Some(s.clone()),
            _ => None,
        }
    }
}
impl FromValue for Vec<u8> {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Bytes(b) => Some(b.clone()),
            _ => None,
        }
    }
}
impl FromValue for Value {
    fn from_value(v: &Value) -> Option<Self> {
        Some(v.clone())
    }
}
impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Null => Some(None),
            v => T::from_value(v).map(Some),
        }
    }
}
