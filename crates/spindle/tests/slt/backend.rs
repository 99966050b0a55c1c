//! Backends the `.slt` files run against.
//!
//! A [`Backend`] makes a fresh, empty database per test file (an
//! [`Instance`]); an instance hands out [`Connection`]s (one per
//! sqllogictest `connection` name). Results come back as
//! [`spindle::Value`]s so that every backend is printed the same way (see
//! `format.rs`). The Postgres wire backend of a later issue implements the
//! same three traits and runs the same files.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use spindle::{Database, Output, Session, Value};

/// An error of a statement, or of the harness talking to the backend.
#[derive(Debug, Clone)]
pub struct SqlError {
    pub message: String,
    /// PostgreSQL SQLSTATE, when the backend reports one.
    pub sqlstate: Option<String>,
}

impl SqlError {
    pub fn harness(message: impl Into<String>) -> Self {
        SqlError {
            message: message.into(),
            sqlstate: None,
        }
    }
}

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.sqlstate {
            Some(state) => write!(f, "{} (SQLSTATE {state})", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

impl std::error::Error for SqlError {}

impl From<spindle::Error> for SqlError {
    fn from(e: spindle::Error) -> Self {
        SqlError {
            message: e.to_string(),
            sqlstate: Some(e.sqlstate().to_string()),
        }
    }
}

/// What one SQL text produced (the last statement's output when the text
/// holds several).
pub enum Outcome {
    Rows {
        columns: usize,
        rows: Vec<Vec<Value>>,
    },
    Count(u64),
}

/// One session on a database.
pub trait Connection: Send {
    fn run(&mut self, sql: &str) -> Result<Outcome, SqlError>;
}

/// One database, fresh and empty when made, used by one test file.
pub trait Instance: Send + Sync {
    fn connect(&self) -> Result<Box<dyn Connection>, SqlError>;
    /// Closes the database (dropping every session and its open
    /// transaction) and opens it again from its files.
    fn restart(&self) -> Result<(), SqlError>;
}

pub trait Backend: Send + Sync {
    /// Name used in trial names and as an extra `skipif`/`onlyif` label.
    fn name(&self) -> &'static str;
    /// Whether [`Instance::restart`] works (the data outlives the process).
    fn persistent(&self) -> bool;
    fn fresh(&self) -> Result<Arc<dyn Instance>, SqlError>;
}

// ---------------------------------------------------------------------------
// The embedded backend: `spindle::Database` in this process.

/// `Database::open_in_memory()` (`persistent = false`) or
/// `Database::open(<temp dir>)` (`persistent = true`).
pub struct Embedded {
    pub persistent: bool,
}

impl Backend for Embedded {
    fn name(&self) -> &'static str {
        if self.persistent {
            "embedded-disk"
        } else {
            "embedded"
        }
    }

    fn persistent(&self) -> bool {
        self.persistent
    }

    fn fresh(&self) -> Result<Arc<dyn Instance>, SqlError> {
        let (dir, path, db) = if self.persistent {
            let dir = tempfile::Builder::new()
                .prefix("spindle-slt-")
                .tempdir()
                .map_err(|e| SqlError::harness(format!("temp dir: {e}")))?;
            let path = dir.path().join("db");
            let db = Database::open(&path)?;
            (Some(dir), Some(path), db)
        } else {
            (None, None, Database::open_in_memory()?)
        };
        Ok(Arc::new(EmbeddedInstance(Arc::new(Shared {
            state: Mutex::new(EmbeddedState {
                db: Some(db),
                generation: 0,
                next_id: 0,
                idle: HashMap::new(),
            }),
            path,
            _dir: dir,
        }))))
    }
}

struct EmbeddedInstance(Arc<Shared>);

struct Shared {
    /// Sessions live here, not in the connections, so that a restart can
    /// drop all of them before the database is reopened. A connection takes
    /// its session out while a statement runs (so a statement that blocks
    /// on another session's lock does not block the whole instance).
    state: Mutex<EmbeddedState>,
    path: Option<PathBuf>,
    /// Removed (with the database files) when the instance is dropped.
    _dir: Option<tempfile::TempDir>,
}

struct EmbeddedState {
    db: Option<Database>,
    generation: u64,
    next_id: u64,
    /// connection id -> (generation of the database it belongs to, session)
    idle: HashMap<u64, (u64, Session)>,
}

impl Instance for EmbeddedInstance {
    fn connect(&self) -> Result<Box<dyn Connection>, SqlError> {
        let mut st = self.0.state.lock().unwrap();
        let id = st.next_id;
        st.next_id += 1;
        Ok(Box::new(EmbeddedConnection {
            shared: self.0.clone(),
            id,
        }))
    }

    fn restart(&self) -> Result<(), SqlError> {
        let Some(path) = &self.0.path else {
            return Err(SqlError::harness(
                "RESTART DATABASE needs a persistent backend",
            ));
        };
        let mut st = self.0.state.lock().unwrap();
        st.idle.clear();
        st.db = None; // closes the database
        st.generation += 1;
        st.db = Some(Database::open(path)?);
        Ok(())
    }
}

struct EmbeddedConnection {
    shared: Arc<Shared>,
    id: u64,
}

impl EmbeddedConnection {
    fn take_session(&self) -> Result<(u64, Session), SqlError> {
        let mut st = self.shared.state.lock().unwrap();
        let generation = st.generation;
        match st.idle.remove(&self.id) {
            Some((g, s)) if g == generation => Ok((g, s)),
            _ => {
                let db = st
                    .db
                    .as_ref()
                    .ok_or_else(|| SqlError::harness("database is closed"))?;
                Ok((generation, db.session()))
            }
        }
    }

    fn put_session(&self, generation: u64, session: Session) {
        let mut st = self.shared.state.lock().unwrap();
        if st.generation == generation {
            st.idle.insert(self.id, (generation, session));
        }
    }
}

impl Connection for EmbeddedConnection {
    fn run(&mut self, sql: &str) -> Result<Outcome, SqlError> {
        let (generation, mut session) = self.take_session()?;
        let result = session.run(sql);
        self.put_session(generation, session);
        let outputs = result?;
        match outputs.into_iter().last() {
            None => Ok(Outcome::Count(0)),
            Some(Output::Command { rows, .. }) => Ok(Outcome::Count(rows)),
            Some(Output::Rows(rows)) => {
                let columns = rows.column_names().len();
                let rows = rows
                    .rows()?
                    .iter()
                    .map(|row| row.values().to_vec())
                    .collect();
                Ok(Outcome::Rows { columns, rows })
            }
        }
    }
}
