//! `spindle serve`: the PostgreSQL wire-protocol server on a data directory.
//!
//! ```text
//! spindle serve [--data-dir DIR | --in-memory] [--listen 127.0.0.1:5433] [--password-env VAR]
//! ```
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
        let server =
            spindle_server::Server::bind(engine, args.listen, spindle_server::Config { password })
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
