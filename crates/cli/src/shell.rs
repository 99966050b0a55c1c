//! `spindle shell`: a SQL shell on an embedded database.
//!
//! Input — typed at the prompt, piped into stdin, read from `-f FILE` or
//! given with `-c SQL` — goes line by line through one [`Shell`], which
//! splits it into statements with the `;`-aware [`Splitter`] and runs each
//! statement on its own through one [`spindle::Session`] (so `BEGIN` …
//! `COMMIT` spans statements). A line starting with `\` where a statement
//! would start is a shell command (`\q`, `\dt`, `\d`, `\timing`, `\?`).
//!
//! Errors are printed as `ERROR:  <message> (SQLSTATE xxxxx)` on stderr and
//! the shell goes on; in non-interactive mode the exit status is 1 when any
//! statement failed, and 2 when the shell could not run at all (the database
//! or an input could not be opened).

use std::ffi::OsString;
use std::io::{self, BufRead, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use spindle::{Database, Output, Session, Value};

use crate::format;
use crate::repl;
use crate::split::Splitter;

/// Arguments of `spindle shell`.
#[derive(clap::Args, Debug, Default)]
pub struct ShellArgs {
    /// Directory of the database, created if missing [default:
    /// $SPINDLE_DATA_DIR, else the platform's local data directory +
    /// `/spindle`, else ./spindle-data]
    #[arg(long, short = 'd', value_name = "DIR", conflicts_with = "in_memory")]
    pub data_dir: Option<PathBuf>,

    /// Use a temporary in-memory database instead of a data directory.
    #[arg(long)]
    pub in_memory: bool,

    /// Run this SQL (statements separated by `;`, or a `\` command) and
    /// exit; may be given several times.
    #[arg(short = 'c', long = "command", value_name = "SQL")]
    pub commands: Vec<String>,

    /// Split the key space once a split holds more than BYTES of keys and
    /// values (default 64 MiB); small values make splits visible in
    /// spindle_sys.splits on small data.
    #[arg(long, value_name = "BYTES")]
    pub split_size: Option<u64>,

    /// Run the statements in FILE and exit (`-` reads stdin).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "commands"
    )]
    pub file: Option<PathBuf>,
}

/// Exit status when a statement failed in non-interactive mode.
const EXIT_STATEMENT_FAILED: u8 = 1;
/// Exit status when the shell could not run (database or input unusable).
const EXIT_FATAL: u8 = 2;

/// Runs `spindle shell`.
pub fn run(args: ShellArgs) -> ExitCode {
    let (db, location) = if args.in_memory {
        (Database::open_in_memory(), "in-memory database".to_string())
    } else {
        let dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
        tracing::debug!(dir = %dir.display(), "opening database");
        (Database::open(&dir), dir.display().to_string())
    };
    let db = match db {
        Ok(db) => db,
        Err(e) => {
            eprintln_safe(&format!(
                "spindle: cannot open {location}: {e} (SQLSTATE {})",
                e.sqlstate()
            ));
            return ExitCode::from(EXIT_FATAL);
        }
    };
    if let Some(bytes) = args.split_size {
        db.engine().manager().set_split_threshold(bytes);
    }
    let mut shell = Shell::new(db);

    if !args.commands.is_empty() {
        for command in &args.commands {
            if shell.run_text(command) == Flow::Quit {
                break;
            }
        }
        return shell.exit_code();
    }
    if let Some(file) = &args.file {
        if file.as_os_str() != "-" {
            return match std::fs::File::open(file) {
                Ok(f) => shell.run_reader(io::BufReader::new(f)),
                Err(e) => {
                    eprintln_safe(&format!("spindle: {}: {e}", file.display()));
                    ExitCode::from(EXIT_FATAL)
                }
            };
        }
        return shell.run_reader(io::stdin().lock());
    }
    if io::stdin().is_terminal() {
        repl::run(&mut shell, &location);
        return ExitCode::SUCCESS;
    }
    shell.run_reader(io::stdin().lock())
}

/// The data directory used when none is given: `$SPINDLE_DATA_DIR` if set,
/// else `<local data dir>/spindle`, else `./spindle-data`.
pub fn default_data_dir() -> PathBuf {
    resolve_data_dir(std::env::var_os("SPINDLE_DATA_DIR"), dirs::data_local_dir())
}

fn resolve_data_dir(env: Option<OsString>, local_data: Option<PathBuf>) -> PathBuf {
    match env {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => match local_data {
            Some(base) => base.join("spindle"),
            None => PathBuf::from("spindle-data"),
        },
    }
}

/// Whether to keep reading input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Quit,
}

/// Whether `line` (trimmed) is handled by the shell rather than the
/// database when it comes where a statement would start.
pub fn is_shell_command(line: &str) -> bool {
    line.starts_with('\\') || is_quit_word(line)
}

fn is_quit_word(line: &str) -> bool {
    let word = line.trim_end_matches(';').trim_end();
    word.eq_ignore_ascii_case("quit") || word.eq_ignore_ascii_case("exit")
}

const HELP: &str = "\
Type SQL statements ending with `;`. A statement may span several lines.

Shell commands:
  \\q, quit, exit   leave the shell (also Ctrl-D)
  \\dt              list tables
  \\d NAME          describe table NAME (\\d alone lists tables)
  \\timing [on|off] show how long each statement takes
  \\?               this help

Ctrl-C clears the statement being typed.
";

/// One shell: a session on the database plus the pending input.
pub struct Shell {
    session: Session,
    splitter: Splitter,
    out: BufWriter<io::Stdout>,
    /// A statement or shell command failed.
    failed: bool,
    timing: bool,
}

impl Shell {
    pub fn new(db: Database) -> Shell {
        Shell {
            session: db.session(),
            splitter: Splitter::new(),
            out: BufWriter::new(io::stdout()),
            failed: false,
            timing: false,
        }
    }

    /// The exit status of a non-interactive run.
    pub fn exit_code(&self) -> ExitCode {
        if self.failed {
            ExitCode::from(EXIT_STATEMENT_FAILED)
        } else {
            ExitCode::SUCCESS
        }
    }

    /// True when no statement text is pending (the next line starts a
    /// statement).
    pub fn at_statement_start(&self) -> bool {
        self.splitter.is_blank()
    }

    /// Runs a complete text: every line, then a last statement even
    /// without `;`.
    pub fn run_text(&mut self, text: &str) -> Flow {
        for line in text.split_inclusive('\n') {
            if self.feed_line(line) == Flow::Quit {
                return Flow::Quit;
            }
        }
        if !text.ends_with('\n') && self.feed_line("\n") == Flow::Quit {
            return Flow::Quit;
        }
        self.finish()
    }

    /// Runs everything `reader` yields, line by line, as it is read.
    pub fn run_reader(&mut self, mut reader: impl BufRead) -> ExitCode {
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    if self.feed_line(&line) == Flow::Quit {
                        return self.exit_code();
                    }
                }
                Err(e) => {
                    self.flush();
                    eprintln_safe(&format!("spindle: cannot read input: {e}"));
                    return ExitCode::from(EXIT_FATAL);
                }
            }
        }
        self.finish();
        self.exit_code()
    }

    /// Takes one line of input (with its `\n`, if any): runs a shell
    /// command, or the statements the line completes.
    pub fn feed_line(&mut self, line: &str) -> Flow {
        if self.splitter.is_blank() {
            let trimmed = line.trim();
            if is_shell_command(trimmed) {
                self.splitter.clear();
                return self.shell_command(trimmed);
            }
        }
        for statement in self.splitter.push(line) {
            if self.execute(&statement) == Flow::Quit {
                return Flow::Quit;
            }
        }
        Flow::Continue
    }

    /// End of input: runs the last statement if it lacks its `;`.
    pub fn finish(&mut self) -> Flow {
        let mut flow = Flow::Continue;
        for statement in self.splitter.finish() {
            flow = self.execute(&statement);
            if flow == Flow::Quit {
                break;
            }
        }
        self.flush_flow(flow)
    }

    /// Drops any partially typed statement.
    pub fn discard_pending(&mut self) {
        self.splitter.clear();
    }

    /// Runs one statement and prints its result or error.
    fn execute(&mut self, sql: &str) -> Flow {
        tracing::debug!(sql, "executing");
        let started = Instant::now();
        let result = self.session.run(sql);
        let elapsed = started.elapsed();
        let flow = match result {
            Ok(outputs) => {
                let mut flow = Flow::Continue;
                for output in outputs {
                    flow = self.print_output(output);
                    if flow == Flow::Quit {
                        break;
                    }
                }
                flow
            }
            Err(e) => {
                self.report_error(&e);
                Flow::Continue
            }
        };
        let flow = if self.timing && flow == Flow::Continue {
            let ms = elapsed.as_secs_f64() * 1000.0;
            self.write(&format!("Time: {ms:.3} ms\n"))
        } else {
            flow
        };
        self.flush_flow(flow)
    }

    fn print_output(&mut self, output: Output) -> Flow {
        match output {
            Output::Rows(rows) => match format::render_rows(&rows) {
                Ok(text) => self.write(&format!("{text}\n")),
                Err(e) => {
                    self.report_error(&e);
                    Flow::Continue
                }
            },
            Output::Command { tag, .. } => self.write(&format!("{tag}\n")),
        }
    }

    fn report_error(&mut self, e: &spindle::Error) {
        self.failed = true;
        // Whatever the statement printed before goes out first.
        self.flush();
        eprintln_safe(&format!("ERROR:  {e} (SQLSTATE {})", e.sqlstate()));
    }

    fn report_shell_error(&mut self, message: &str) {
        self.failed = true;
        self.flush();
        eprintln_safe(message);
    }

    /// Writes to stdout; a write error (e.g. a closed pipe) ends the shell.
    fn write(&mut self, text: &str) -> Flow {
        match self.out.write_all(text.as_bytes()) {
            Ok(()) => Flow::Continue,
            Err(e) => {
                tracing::debug!(error = %e, "stdout closed");
                Flow::Quit
            }
        }
    }

    fn flush(&mut self) -> Flow {
        match self.out.flush() {
            Ok(()) => Flow::Continue,
            Err(e) => {
                tracing::debug!(error = %e, "stdout closed");
                Flow::Quit
            }
        }
    }

    fn flush_flow(&mut self, flow: Flow) -> Flow {
        if self.flush() == Flow::Quit {
            Flow::Quit
        } else {
            flow
        }
    }

    /// Runs a `\` command or `quit`/`exit`.
    fn shell_command(&mut self, line: &str) -> Flow {
        if is_quit_word(line) {
            return Flow::Quit;
        }
        let mut words = line.split_whitespace().map(|w| w.trim_end_matches(';'));
        let name = words.next().unwrap_or("");
        let arg = words.next().filter(|w| !w.is_empty());
        let flow = match name {
            "\\q" | "\\quit" => return Flow::Quit,
            "\\?" | "\\h" | "\\help" => self.write(HELP),
            "\\dt" => self.list_tables(),
            "\\d" => match arg {
                Some(table) => self.describe_table(table),
                None => self.list_tables(),
            },
            "\\timing" => {
                self.timing = match arg {
                    Some(a) if a.eq_ignore_ascii_case("on") => true,
                    Some(a) if a.eq_ignore_ascii_case("off") => false,
                    _ => !self.timing,
                };
                let state = if self.timing { "on" } else { "off" };
                self.write(&format!("Timing is {state}.\n"))
            }
            _ => {
                self.report_shell_error(&format!("invalid command {name}\nTry \\? for help."));
                Flow::Continue
            }
        };
        self.flush_flow(flow)
    }

    /// `\dt`: the user's tables, with their interleaving parents.
    fn list_tables(&mut self) -> Flow {
        const QUERIES: &[&str] = &[
            "SELECT table_name, parent_table_name, on_delete_action, interleave_type \
             FROM information_schema.tables WHERE table_type = 'BASE TABLE' ORDER BY table_name",
            // Without Spanner's interleaving columns.
            "SELECT table_name FROM information_schema.tables \
             WHERE table_schema NOT IN ('information_schema', 'pg_catalog') ORDER BY table_name",
        ];
        self.catalog_query(QUERIES, &[], None)
    }

    /// `\d NAME`: the columns of one table. Table names are matched without
    /// regard to case (as Spanner resolves them) unless written in quotes.
    fn describe_table(&mut self, table: &str) -> Flow {
        const QUERIES: &[&str] = &[
            "SELECT column_name, spanner_type, is_nullable, is_primary_key, column_default \
             FROM information_schema.columns WHERE table_schema <> 'information_schema' \
             AND lower(table_name) = lower($1) ORDER BY ordinal_position",
            "SELECT column_name, spanner_type, is_nullable, is_primary_key, column_default \
             FROM information_schema.columns WHERE table_schema <> 'information_schema' \
             AND table_name = $1 ORDER BY ordinal_position",
            // Without Spanner's columns.
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns \
             WHERE table_name = $1 ORDER BY ordinal_position",
        ];
        let quoted = table.starts_with('"');
        let table = unquote_identifier(table);
        let missing = format!("Did not find any relation named \"{table}\".");
        let queries = if quoted { &QUERIES[1..] } else { QUERIES };
        self.catalog_query(queries, &[Value::String(table)], Some(&missing))
    }

    /// Runs the first of `queries` that the database accepts and prints its
    /// rows; `if_empty` is reported as an error when it returns no rows.
    fn catalog_query(
        &mut self,
        queries: &[&str],
        params: &[Value],
        if_empty: Option<&str>,
    ) -> Flow {
        let mut first_error = None;
        for sql in queries {
            match self.session.query(sql, params) {
                Ok(rows) => {
                    if rows.num_rows() == 0 {
                        if let Some(message) = if_empty {
                            self.report_shell_error(message);
                            return Flow::Continue;
                        }
                    }
                    return self.print_output(Output::Rows(rows));
                }
                Err(e) => {
                    tracing::debug!(sql, error = %e, "catalog query failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            self.report_error(&e);
        }
        Flow::Continue
    }
}

/// `"Name"` → `Name`; other names are used as typed.
fn unquote_identifier(name: &str) -> String {
    match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
        Some(inner) => inner.replace("\"\"", "\""),
        None => name.to_string(),
    }
}

/// Prints a line on stderr, ignoring a closed stderr (nothing else can be
/// done about it, and `eprintln!` would panic).
pub fn eprintln_safe(message: &str) {
    let mut err = io::stderr().lock();
    let _ = writeln!(err, "{message}");
    let _ = err.flush();
}

/// The shell history file: `$SPINDLE_HISTORY`, else `spindle_history` in
/// the platform's local data directory, else `~/.spindle_history`.
pub fn history_file() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SPINDLE_HISTORY").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    dirs::data_local_dir()
        .map(|d| d.join("spindle_history"))
        .or_else(|| dirs::home_dir().map(|h| h.join(".spindle_history")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_dir_resolution() {
        assert_eq!(
            resolve_data_dir(Some("/x/y".into()), Some("/home/u/.local/share".into())),
            PathBuf::from("/x/y")
        );
        assert_eq!(
            resolve_data_dir(Some("".into()), Some("/home/u/.local/share".into())),
            PathBuf::from("/home/u/.local/share/spindle")
        );
        assert_eq!(
            resolve_data_dir(None, Some("/d".into())),
            PathBuf::from("/d/spindle")
        );
        assert_eq!(resolve_data_dir(None, None), PathBuf::from("spindle-data"));
    }

    #[test]
    fn shell_command_words() {
        assert!(is_shell_command("\\dt"));
        assert!(is_shell_command("quit"));
        assert!(is_shell_command("EXIT;"));
        assert!(!is_shell_command("exit_code"));
        assert!(!is_shell_command("SELECT 1;"));
        assert_eq!(unquote_identifier("\"My\"\"T\""), "My\"T");
        assert_eq!(unquote_identifier("Singers"), "Singers");
    }
}
