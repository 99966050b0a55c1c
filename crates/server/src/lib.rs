//! # spindle-server: the PostgreSQL wire protocol
//!
//! `spindle serve` listens here; psql, drivers and pgbench talk to Spindle
//! as they talk to PostgreSQL (protocol 3.0, built on `pgwire`).
//!
//! ```text
//! Server::serve ── accept ──► one task per connection (span "connection")
//!   pgwire message loop (startup, Query, Parse/Bind/Describe/Execute/Sync, …)
//!     └─ handler::Handler ── one spindle_sql::Session per connection
//!          ├─ simple Query: parse, then Session::execute_statement per
//!          │    statement; RowDescription + DataRows (text) + CommandComplete
//!          ├─ Parse: Session::describe → parameter types, result columns
//!          ├─ Bind: counts checked, parameters decoded (types.rs)
//!          └─ Execute: Session::execute(sql, params) → DataRows in the
//!               formats the client asked for
//! ```
//!
//! Modules: [`handler`] (protocol ↔ session), [`types`] (OIDs, text and
//! binary values), `copy` (`COPY … FROM STDIN` / `TO STDOUT`, text and CSV).
//!
//! * **Errors**: every statement error becomes an ErrorResponse with
//!   `spindle_sql::Error::sqlstate`; after an error in the extended
//!   protocol, messages are skipped until Sync (pgwire). The connection
//!   always stays usable.
//! * **Authentication**: without a password, trust (meant for loopback);
//!   with [`Config::password`], SCRAM-SHA-256 for every user (28P01 on a
//!   wrong password).
//! * **TLS** ([`tls`]): with [`Config::tls`], an SSLRequest is answered
//!   `S` and the connection continues over TLS (pgwire and rustls);
//!   without it, `N`. [`Config::require_tls`] refuses plaintext startups
//!   (28000).
//! * **Cancel**: a CancelRequest with the connection's key drops the running
//!   statement's future (SQLSTATE 57014).
//! * **Shutdown**: [`Server::serve`] stops accepting when its shutdown
//!   future completes, waits for running statements (and so for their
//!   commits) to finish, then closes the connections.

mod copy;
pub mod handler;
pub mod tls;
pub mod types;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pgwire::api::{ConnectionManager, RandomPidSecretKeyGenerator};
use spindle_sql::Engine;
use tokio::net::TcpListener;
use tokio::sync::RwLock;
use tokio::task::JoinSet;
use tracing::{info, info_span, warn, Instrument};

use handler::{Conn, Handlers, Shared};
pub use tls::Tls;

/// Errors of setting up a server (serving reports I/O errors as they are).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    TlsFile {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    TlsInvalid { path: String, message: String },
    #[error("TLS certificate and key rejected: {0}")]
    TlsRejected(String),
    #[error("require_tls needs a TLS certificate and key")]
    TlsRequiredWithoutCertificate,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// How long shutdown waits for running statements.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Server options.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// When set, every client must authenticate with SCRAM-SHA-256 using
    /// this password (any user name). Otherwise connections are trusted.
    pub password: Option<String>,
    /// When set, SSLRequests are accepted and connections may use TLS.
    pub tls: Option<Tls>,
    /// Refuse startups that did not negotiate TLS (SQLSTATE 28000).
    /// Needs [`Config::tls`].
    pub require_tls: bool,
}

/// A server over one database.
pub struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
}

impl Server {
    /// Binds `addr` (port 0 picks a free port; see [`Server::local_addr`]).
    pub async fn bind(
        engine: Arc<Engine>,
        addr: SocketAddr,
        config: Config,
    ) -> Result<Server, Error> {
        if config.require_tls && config.tls.is_none() {
            return Err(Error::TlsRequiredWithoutCertificate);
        }
        let listener = TcpListener::bind(addr).await?;
        Ok(Server {
            shared: Arc::new(Shared {
                engine,
                password: config.password,
                tls: config.tls,
                require_tls: config.require_tls,
                connections: Arc::new(ConnectionManager::new()),
                in_flight: RwLock::new(()),
                pids: RandomPidSecretKeyGenerator::default(),
                interrupts: Default::default(),
            }),
            listener,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves connections until `shutdown` completes, then shuts down
    /// gracefully (see the module documentation).
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        let ids = AtomicU64::new(1);
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        info!(addr = %self.listener.local_addr()?, "listening");
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = self.listener.accept() => {
                    let (socket, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let id = ids.fetch_add(1, Ordering::Relaxed);
                    let conn = Arc::new(Conn::new(self.shared.clone()));
                    let span = info_span!("connection", id, %peer);
                    let acceptor = self.shared.tls.as_ref().map(|t| t.acceptor.clone());
                    tasks.spawn(
                        async move {
                            info!("connection opened");
                            let r = pgwire::tokio::process_socket(socket, acceptor, Handlers::new(conn)).await;
                            match r {
                                Ok(()) => info!("connection closed"),
                                Err(e) => info!(error = %e, "connection closed"),
                            }
                        }
                        .instrument(span),
                    );
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        drop(self.listener);
        info!(
            connections = tasks.len(),
            "shutting down: waiting for running statements"
        );
        match tokio::time::timeout(SHUTDOWN_GRACE, self.shared.in_flight.write()).await {
            Ok(_guard) => {
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
            }
            Err(_) => {
                warn!("statements still running after the grace period; closing anyway");
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
            }
        }
        info!("shut down");
        Ok(())
    }
}
