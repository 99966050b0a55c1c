//! The Postgres wire backend: each test file gets a `spindle-server` on a
//! fresh database (in memory, or in a temporary directory for files that
//! restart the database), started by the test on a free loopback port, and
//! every sqllogictest connection is a tokio-postgres client.
//!
//! A record runs over the extended protocol (Parse/Describe, then
//! Bind/Execute with binary results), so every value crosses the wire in
//! binary and is decoded by its described type OID back into a
//! [`spindle::Value`] — the same values, printed the same way, as the
//! embedded backend. A text holding several statements (which the extended
//! protocol refuses) runs as one simple Query instead; its rows are text.
//! `RESTART DATABASE` stops the server, closes the database, and starts a
//! new server on the same files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use spindle::Value;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

use crate::backend::{Backend, Connection, Instance, Outcome, SqlError};

pub struct Wire {
    pub persistent: bool,
}

impl Backend for Wire {
    fn name(&self) -> &'static str {
        if self.persistent {
            "wire-disk"
        } else {
            "wire"
        }
    }

    fn persistent(&self) -> bool {
        self.persistent
    }

    fn fresh(&self) -> Result<Arc<dyn Instance>, SqlError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| SqlError::harness(format!("runtime: {e}")))?;
        let (dir, path) = if self.persistent {
            let dir = tempfile::Builder::new()
                .prefix("spindle-slt-wire-")
                .tempdir()
                .map_err(|e| SqlError::harness(format!("temp dir: {e}")))?;
            let path = dir.path().join("db");
            (Some(dir), Some(path))
        } else {
            (None, None)
        };
        let instance = WireInstance(Arc::new(Inner {
            runtime: Arc::new(runtime),
            path,
            server: Mutex::new(None),
            _dir: dir,
        }));
        instance.0.start(0)?;
        Ok(Arc::new(instance))
    }
}

struct Running {
    addr: SocketAddr,
    /// Bumped by every restart: connections of an older server reconnect.
    generation: u64,
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<std::io::Result<()>>,
}

struct WireInstance(Arc<Inner>);

struct Inner {
    runtime: Arc<tokio::runtime::Runtime>,
    path: Option<PathBuf>,
    server: Mutex<Option<Running>>,
    _dir: Option<tempfile::TempDir>,
}

impl Inner {
    fn start(&self, generation: u64) -> Result<(), SqlError> {
        let engine = match &self.path {
            Some(p) => {
                std::fs::create_dir_all(p).map_err(|e| SqlError::harness(e.to_string()))?;
                // After a restart the old database closes when its last
                // reference goes: tasks DataFusion spawned for the last
                // query, or a garbage-collection pass, may still hold one
                // for a moment (the store's file lock says so).
                let mut attempt = 0;
                loop {
                    match spindle_sql::Engine::open(Some(p)) {
                        Err(e) if attempt < 100 && e.to_string().contains("acquire lock") => {
                            attempt += 1;
                            std::thread::sleep(std::time::Duration::from_millis(50));
                        }
                        r => break r,
                    }
                }
            }
            None => spindle_sql::Engine::open(None),
        }
        .map_err(|e| SqlError::harness(format!("open: {e}")))?;
        let running = self.runtime.block_on(async {
            let server = spindle_server::Server::bind(
                engine,
                "127.0.0.1:0".parse().unwrap(),
                // `spindle serve`'s default busy polling.
                spindle_server::Config {
                    busy_poll_micros: spindle_server::DEFAULT_BUSY_POLL_MICROS,
                    ..Default::default()
                },
            )
            .await
            .map_err(std::io::Error::other)?;
            let addr = server.local_addr()?;
            let (stop, rx) = tokio::sync::oneshot::channel::<()>();
            let done = tokio::spawn(server.serve(async move {
                let _ = rx.await;
            }));
            Ok::<_, std::io::Error>(Running {
                addr,
                generation,
                stop,
                done,
            })
        });
        let running = running.map_err(|e| SqlError::harness(format!("server: {e}")))?;
        *self.server.lock().unwrap() = Some(running);
        Ok(())
    }
}

impl Inner {
    /// A client of the running server, and the server's generation.
    fn client(&self) -> Result<(u64, Client), SqlError> {
        let (addr, generation) = self
            .server
            .lock()
            .unwrap()
            .as_ref()
            .map(|r| (r.addr, r.generation))
            .ok_or_else(|| SqlError::harness("server is not running"))?;
        let client = self.runtime.block_on(async move {
            let (client, conn) = tokio_postgres::connect(
                &format!(
                    "host=127.0.0.1 port={} user=slt dbname=spindle",
                    addr.port()
                ),
                NoTls,
            )
            .await?;
            tokio::spawn(conn);
            Ok::<_, tokio_postgres::Error>(client)
        });
        Ok((generation, client.map_err(error)?))
    }
}

impl Instance for WireInstance {
    fn connect(&self) -> Result<Box<dyn Connection>, SqlError> {
        let (generation, client) = self.0.client()?;
        Ok(Box::new(WireConnection {
            inner: self.0.clone(),
            runtime: self.0.runtime.clone(),
            generation,
            client,
        }))
    }

    fn restart(&self) -> Result<(), SqlError> {
        let this = &self.0;
        if this.path.is_none() {
            return Err(SqlError::harness(
                "RESTART DATABASE needs a persistent backend",
            ));
        }
        let mut generation = 0;
        if let Some(r) = this.server.lock().unwrap().take() {
            generation = r.generation + 1;
            let _ = r.stop.send(());
            let _ = this.runtime.block_on(r.done);
        }
        this.start(generation)
    }
}

struct WireConnection {
    inner: Arc<Inner>,
    runtime: Arc<tokio::runtime::Runtime>,
    generation: u64,
    client: Client,
}

fn error(e: tokio_postgres::Error) -> SqlError {
    match e.as_db_error() {
        Some(db) => SqlError {
            message: db.message().to_string(),
            sqlstate: Some(db.code().code().to_string()),
        },
        None => SqlError::harness(format!("wire: {e}")),
    }
}

/// Any value, as the bytes of its binary format.
struct Raw(Vec<u8>);

impl<'a> FromSql<'a> for Raw {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(raw.to_vec()))
    }
    fn accepts(_: &Type) -> bool {
        true
    }
}

impl Connection for WireConnection {
    fn run(&mut self, sql: &str) -> Result<Outcome, SqlError> {
        let current = self
            .inner
            .server
            .lock()
            .unwrap()
            .as_ref()
            .map(|r| r.generation);
        if current != Some(self.generation) {
            // The database restarted: like the embedded backend's sessions,
            // this connection starts over on the new server.
            let (generation, client) = self.inner.client()?;
            self.generation = generation;
            self.client = client;
        }
        let client = &self.client;
        self.runtime.block_on(async move {
            let stmt = match client.prepare(sql).await {
                Ok(s) => s,
                Err(e)
                    if e.as_db_error()
                        .is_some_and(|d| d.message().contains("multiple commands")) =>
                {
                    return simple(client, sql).await;
                }
                Err(e) => return Err(error(e)),
            };
            if stmt.columns().is_empty() {
                let n = client.execute(&stmt, &[]).await.map_err(error)?;
                return Ok(Outcome::Count(n));
            }
            let rows = client.query(&stmt, &[]).await.map_err(error)?;
            let columns = stmt.columns().len();
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let mut values = Vec::with_capacity(columns);
                for (i, col) in stmt.columns().iter().enumerate() {
                    let v = match row.try_get::<_, Option<Raw>>(i).map_err(error)? {
                        None => Value::Null,
                        Some(Raw(bytes)) => {
                            spindle_server::types::value_from_binary(col.type_().oid(), &bytes)
                                .map_err(|e| SqlError::harness(e.message))?
                        }
                    };
                    values.push(v);
                }
                out.push(values);
            }
            Ok(Outcome::Rows { columns, rows: out })
        })
    }
}

/// Several statements in one text: a simple Query; the last statement's
/// result counts.
async fn simple(client: &Client, sql: &str) -> Result<Outcome, SqlError> {
    let msgs = client.simple_query(sql).await.map_err(error)?;
    let mut outcome = Outcome::Count(0);
    let mut rows: Vec<Vec<Value>> = Vec::new();
    let mut columns = 0;
    for m in msgs {
        match m {
            SimpleQueryMessage::RowDescription(cols) => {
                columns = cols.len();
                rows.clear();
            }
            SimpleQueryMessage::Row(r) => rows.push(
                (0..r.len())
                    .map(|i| match r.get(i) {
                        None => Value::Null,
                        Some(s) => Value::String(s.to_string()),
                    })
                    .collect(),
            ),
            SimpleQueryMessage::CommandComplete(n) => {
                outcome = if columns > 0 {
                    Outcome::Rows {
                        columns,
                        rows: std::mem::take(&mut rows),
                    }
                } else {
                    Outcome::Count(n)
                };
                columns = 0;
            }
            _ => {}
        }
    }
    Ok(outcome)
}
