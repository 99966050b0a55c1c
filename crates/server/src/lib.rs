//! # spindle-server: the PostgreSQL wire protocol
//!
//! `spindle serve` listens here; psql, drivers and pgbench talk to Spindle
//! as they talk to PostgreSQL (protocol 3.0, built on `pgwire`).
//!
//! ```text
//! Server::serve ── accept ──► one thread per connection (span "connection"),
//!   │                         a single-threaded tokio runtime on each
//!   pgwire message loop (startup, Query, Parse/Bind/Describe/Execute/Sync, …)
//!     └─ handler::Handler ── one spindle_sql::Session per connection
//!          ├─ simple Query: parse, then Session::execute_statement per
//!          │    statement; RowDescription + DataRows (text) + CommandComplete
//!          ├─ Parse: Session::describe → parameter types, result columns;
//!          │    the text's parsed statements kept with the statement
//!          ├─ Bind: counts checked, parameters decoded (types.rs)
//!          └─ Execute: Session::execute_parsed(parsed, params), or
//!               Session::execute(sql, []) without parameters (it tries the
//!               text's inline values as parameters) → DataRows in the
//!               formats the client asked for
//! ```
//!
//! * **Threads**: the accepting runtime (multi-threaded) hands each socket
//!   to a thread of its own that runs the connection's protocol loop and
//!   its statements' fast paths and commits; DataFusion plans run back on
//!   the accepting runtime (`Engine::set_executor`), so a query still uses
//!   every core, except kept plans whose last run read little, which run
//!   on the connection's thread (`Engine::inline_plan_count`). A statement that blocks (a commit's flush, a lock wait)
//!   blocks only its own connection. Between statements, while few
//!   connections are active, a connection thread watches its socket for a
//!   moment before it sleeps (`busy_poll`, [`Config::busy_poll_micros`]).
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
//!   commits) to finish, then closes the connections (and waits for their
//!   threads). Statements still running after the grace period are
//!   dropped at their next await; a lock wait is interrupted (57014).

mod busy_poll;
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
use tracing::{debug, info, info_span, warn};

use handler::{Conn, Handlers, Shared};
pub use tls::Tls;

/// The stack of a connection's thread, which plans and runs its
/// statements: 8 MiB, Linux's default for a main thread (a spawned
/// thread gets 2 MiB). A statement's future nests the futures of the
/// statements it runs (EXPLAIN of an UPDATE runs the UPDATE), and
/// DataFusion plans recursively over a query's expressions; in a debug
/// build `sql-tests/explain.slt` over the wire overflowed 2 MiB. Only the
/// pages a thread touches take memory.
const CONNECTION_STACK: usize = 8 << 20;

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
    /// Microseconds a connection thread may spin for its client's next
    /// message before it parks, while the server is lightly loaded (see
    /// `busy_poll`); 0 never spins. `spindle serve` uses
    /// [`DEFAULT_BUSY_POLL_MICROS`].
    pub busy_poll_micros: u64,
}

/// `spindle serve`'s busy-polling budget: long enough for a client's next
/// statement to arrive from an async driver on a virtual machine (the
/// client's own wake-up and its handling of the reply), see `busy_poll`.
pub const DEFAULT_BUSY_POLL_MICROS: u64 = 200;

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
                busy_poll_micros: config.busy_poll_micros,
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
        self.shared
            .engine
            .set_executor(tokio::runtime::Handle::current());
        let (closing, _) = tokio::sync::watch::channel(false);
        let (running_tx, mut running_rx) = tokio::sync::mpsc::channel::<()>(1);
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
                    let connection = ConnectionThread {
                        socket,
                        acceptor,
                        conn,
                        closing: closing.subscribe(),
                        _running: running_tx.clone(),
                    };
                    if let Err(e) = std::thread::Builder::new()
                        .name(format!("spindle-conn-{id}"))
                        .stack_size(CONNECTION_STACK)
                        .spawn(move || connection.run(span))
                    {
                        warn!(error = %e, "cannot start a connection thread; connection dropped");
                    }
                }
            }
        }
        drop(self.listener);
        drop(running_tx);
        info!(
            connections = closing.receiver_count(),
            "shutting down: waiting for running statements"
        );
        let statements = tokio::time::timeout(SHUTDOWN_GRACE, self.shared.in_flight.write()).await;
        if statements.is_err() {
            warn!("statements still running after the grace period; closing anyway");
            self.shared.interrupt_all();
        }
        // Every connection's future is dropped at its next await (a
        // statement that finished meanwhile stays finished); the channel
        // closes once every connection thread has returned.
        closing.send_replace(true);
        while running_rx.recv().await.is_some() {}
        info!("shut down");
        Ok(())
    }
}

/// One connection, served on its own thread by a single-threaded runtime
/// (`new_current_thread`): the socket, the protocol and the fast path run
/// where the kernel wakes the thread, with no hand-off between threads per
/// statement. Pgbench's prepared point selects at 4 clients ran 44–46 k/s
/// with a task per connection on the shared multi-threaded runtime and
/// 57–71 k/s this way (bench/README.md). DataFusion plans still run on the
/// shared runtime ([`Engine::set_executor`]).
struct ConnectionThread {
    socket: tokio::net::TcpStream,
    acceptor: Option<pgwire::tokio::TlsAcceptor>,
    conn: Arc<Conn>,
    /// Becomes `true` when the server shuts down.
    closing: tokio::sync::watch::Receiver<bool>,
    /// Dropped when the thread returns ([`Server::serve`] waits for all).
    _running: tokio::sync::mpsc::Sender<()>,
}

impl ConnectionThread {
    fn run(mut self, span: tracing::Span) {
        let _entered = span.enter();
        // The socket moves from the accepting runtime's reactor to this
        // thread's (`into_std` leaves it non-blocking, as `from_std` needs).
        let socket = match self.socket.into_std() {
            Ok(s) => s,
            Err(e) => return warn!(error = %e, "connection dropped"),
        };
        let mut builder = tokio::runtime::Builder::new_current_thread();
        builder.enable_all();
        let micros = self.conn.shared.busy_poll_micros;
        if micros > 0 {
            // A second handle on the socket (the same open file, so
            // non-blocking too) to peek at while the runtime is idle.
            match socket.try_clone() {
                Ok(peek) => {
                    let conn = self.conn.clone();
                    let woken = self.conn.clone();
                    let payoff = busy_poll::Payoff::default();
                    builder
                        .on_thread_park(move || {
                            if conn.idle.load(Ordering::Relaxed) {
                                busy_poll::spin(&peek, micros, &payoff);
                            }
                        })
                        .on_thread_unpark(move || woken.activity.wake());
                }
                Err(e) => debug!(error = %e, "no socket handle to poll; the connection parks"),
            }
        }
        let runtime = match builder.build() {
            Ok(rt) => rt,
            Err(e) => {
                return warn!(error = %e, "cannot start a connection runtime; connection dropped")
            }
        };
        runtime.block_on(async move {
            let socket = match tokio::net::TcpStream::from_std(socket) {
                Ok(s) => s,
                Err(e) => return warn!(error = %e, "connection dropped"),
            };
            info!("connection opened");
            let serve = pgwire::tokio::process_socket(socket, self.acceptor, Handlers::new(self.conn));
            tokio::select! {
                r = serve => match r {
                    Ok(()) => info!("connection closed"),
                    Err(e) => info!(error = %e, "connection closed"),
                },
                _ = self.closing.wait_for(|closing| *closing) => info!("connection closed by shutdown"),
            }
        });
    }
}
