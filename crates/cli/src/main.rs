//! The `spindle` command.
//!
//! * `spindle shell [--data-dir DIR | --in-memory] [-c SQL | -f FILE]`: a SQL
//!   shell on an embedded database (also what `spindle` alone runs).
//! * `spindle serve [--data-dir DIR | --in-memory] [--listen ADDR]`: the
//!   PostgreSQL wire-protocol server (`spindle-server`).
//!
//! Each subcommand lives in its own module with a `clap::Args` struct and a
//! `run` function returning the exit status.
//!
//! Diagnostics go to stderr through `tracing`, filtered by `RUST_LOG`
//! (default `warn`).

mod format;
mod repl;
mod serve;
mod shell;
mod split;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(
    name = "spindle",
    version,
    about = "Spindle: a Spanner-style relational database",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Open a SQL shell on an embedded database (the default command).
    ///
    /// Interactive when stdin is a terminal; otherwise runs the statements
    /// read from stdin, one after another.
    Shell(shell::ShellArgs),
    /// Serve the database over the PostgreSQL wire protocol (psql, drivers).
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    init_tracing();
    let cli = Cli::parse();
    match cli
        .command
        .unwrap_or_else(|| Command::Shell(shell::ShellArgs::default()))
    {
        Command::Shell(args) => shell::run(args),
        Command::Serve(args) => serve::run(args),
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default: warnings and errors).
fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_shell_arguments() {
        let cli =
            Cli::try_parse_from(["spindle", "shell", "--data-dir", "/tmp/x", "-c", "SELECT 1"])
                .unwrap();
        let Some(Command::Shell(args)) = cli.command else {
            panic!("expected the shell command");
        };
        assert_eq!(
            args.data_dir.as_deref(),
            Some(std::path::Path::new("/tmp/x"))
        );
        assert_eq!(args.commands, vec!["SELECT 1"]);
        assert!(
            Cli::try_parse_from(["spindle", "shell", "--data-dir", "x", "--in-memory"]).is_err()
        );
        assert!(Cli::try_parse_from(["spindle"]).unwrap().command.is_none());
    }
}
