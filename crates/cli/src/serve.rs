//! `spindle serve`: the PostgreSQL wire-protocol server on a data directory.
//!
//! ```text
//! spindle serve [--data-dir DIR | --in-memory] [--listen 127.0.0.1:5433] [--password-env VAR]
//!               [--tls-cert FILE --tls-key FILE [--require-tls]] [--busy-poll-us N]
//! ```
//!
//! With `--tls-cert` and `--tls-key` (PEM) clients may connect over TLS
//! (`sslmode=require`); `--require-tls` refuses those that do not. The
//! files are read before the database is opened: a missing or invalid one
//! is an error and exit status 1.
//!
//! Prints `listening on ADDR` on stdout once it accepts connections.
//! SIGINT and SIGTERM stop it gracefully: no new connections, running
//! statements (and their commits) finish, then the process exits 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Data directory (default: $SPINDLE_DATA_DIR, else the platform's data
    /// directory plus /spindle)
    #[arg(long, value_name = "DIR", conflicts_with = "in_memory")]
    pub data_dir: Option<PathBuf>,

    /// Serve a temporary database that disappears when the server stops
    #[arg(long)]
    pub in_memory: bool,

    /// Address to listen on
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:5433")]
    pub listen: SocketAddr,

    /// Split the key space once a split holds more than BYTES of keys and
    /// values (default 64 MiB)
    #[arg(long, value_name = "BYTES")]
    pub split_size: Option<u64>,

    /// Require SCRAM-SHA-256 authentication with the password in this
    /// environment variable (without it, connections are trusted)
    #[arg(long, value_name = "VAR")]
    pub password_env: Option<String>,

    /// Accept TLS connections with this PEM certificate chain (the server's
    /// certificate first); needs --tls-key
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1)
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Refuse connections that do not use TLS (SQLSTATE 28000); needs
    /// --tls-cert and --tls-key
    #[arg(long, requires = "tls_cert")]
    pub require_tls: bool,

    /// Between statements, a connection may watch its socket for the
    /// client's next message this many microseconds before sleeping, while
    /// no more connections are active than half the cores (saves the
    /// wake-up per round trip; 0 turns it off)
    #[arg(long, value_name = "MICROS", default_value_t = spindle_server::DEFAULT_BUSY_POLL_MICROS)]
    pub busy_poll_us: u64,
}

pub fn run(args: ServeArgs) -> ExitCode {
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spindle serve: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let password = match &args.password_env {
        Some(var) => Some(std::env::var(var).map_err(|_| format!("${var} is not set"))?),
        None => None,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(spindle_server::Tls::from_pem_files(cert, key).map_err(|e| format!("TLS: {e}"))?)
        }
        // clap enforces both or neither.
        _ => None,
    };
    if password.is_none() && !args.listen.ip().is_loopback() {
        tracing::warn!(
            "listening on {} without a password: every client is trusted",
            args.listen
        );
    }
    let engine = if args.in_memory {
        spindle_sql::Engine::open(None)
    } else {
        let dir = args.data_dir.unwrap_or_else(crate::shell::default_data_dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        spindle_sql::Engine::open(Some(&dir))
    }
    .map_err(|e| format!("opening the database: {e}"))?;
    if let Some(bytes) = args.split_size {
        engine.manager().set_split_threshold(bytes);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("spindle-server")
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let config = spindle_server::Config {
            password,
            tls,
            require_tls: args.require_tls,
            busy_poll_micros: args.busy_poll_us,
        };
        let server = spindle_server::Server::bind(engine, args.listen, config)
            .await
            .map_err(|e| format!("listening on {}: {e}", args.listen))?;
        let addr = server.local_addr().map_err(|e| e.to_string())?;
        println!("listening on {addr}");
        server
            .serve(shutdown_signal())
            .await
            .map_err(|e| e.to_string())
    })
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutdown signal received");
}
