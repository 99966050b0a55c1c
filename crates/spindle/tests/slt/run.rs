//! Running one test file: the sqllogictest `DB` adapter, the record loop
//! with its tally, time limits, and the SQLite corpus quirks.

use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use sqllogictest::{
    ColumnType, DBOutput, DefaultColumnType, QueryExpect, Record, RecordOutput, Runner, DB,
};

use crate::backend::{Backend, Connection, Instance, Outcome, SqlError};
use crate::format::{format_value, Style};

/// The pseudo statement that restarts the database (files containing it run
/// on a persistent backend only): every session and its open transaction is
/// dropped, the database is closed and opened again from its files.
pub const RESTART: &str = "RESTART DATABASE";

pub fn is_restart(sql: &str) -> bool {
    sql.trim()
        .trim_end_matches(';')
        .trim()
        .eq_ignore_ascii_case(RESTART)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Our own `.slt` files: every record must pass.
    Own,
    /// SQLite corpus files that must pass completely.
    SqliteStrict,
    /// SQLite corpus files that only report pass/fail counts, and stop
    /// starting new records after `budget`.
    SqliteReport { budget: Duration },
}

impl Mode {
    fn is_sqlite(self) -> bool {
        !matches!(self, Mode::Own)
    }
}

pub struct FileSpec {
    pub path: PathBuf,
    /// Name shown in trial names and reports.
    pub display: String,
    pub mode: Mode,
    pub backend: Arc<dyn Backend>,
    /// Give up waiting for a file after this long (a statement that never
    /// returns). The worker thread is then abandoned.
    pub hard_timeout: Duration,
}

/// Outcome counts of one file.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub statements_passed: u64,
    pub statements_failed: u64,
    pub queries_passed: u64,
    pub queries_failed: u64,
    /// Records skipped by `skipif`/`onlyif`.
    pub skipped: u64,
    /// Statement/query records not run because of the time budget.
    pub not_run: u64,
    /// Other records (control, hash-threshold, ...) that failed.
    pub other_failed: u64,
    /// The first failures, rendered.
    pub failures: Vec<String>,
    /// Failures counted by the first line of their message.
    pub kinds: std::collections::BTreeMap<String, u64>,
    /// Why the file stopped before its end, if it did.
    pub stopped: Option<String>,
    pub elapsed: Duration,
}

const MAX_RENDERED_FAILURES: usize = 25;

impl Tally {
    pub fn failed(&self) -> u64 {
        self.statements_failed + self.queries_failed + self.other_failed
    }
    pub fn passed(&self) -> u64 {
        self.statements_passed + self.queries_passed
    }
    fn record_failure(&mut self, rendered: String) {
        let mut kind: String = rendered
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(140)
            .collect();
        if let Some(i) = kind.find(" (SQLSTATE") {
            kind.truncate(i);
        }
        *self.kinds.entry(kind).or_default() += 1;
        if self.failures.len() < MAX_RENDERED_FAILURES {
            self.failures.push(rendered);
        }
    }
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} passed, {} failed (queries {}/{}, statements {}/{} passed)",
            self.passed(),
            self.failed(),
            self.queries_passed,
            self.queries_passed + self.queries_failed,
            self.statements_passed,
            self.statements_passed + self.statements_failed,
        );
        if self.skipped > 0 {
            s.push_str(&format!(", {} skipped by skipif/onlyif", self.skipped));
        }
        if self.not_run > 0 {
            s.push_str(&format!(", {} not run", self.not_run));
        }
        if let Some(why) = &self.stopped {
            s.push_str(&format!(" [stopped: {why}]"));
        }
        s.push_str(&format!(" in {:.1}s", self.elapsed.as_secs_f64()));
        s
    }
    /// The most frequent kinds of failure, one per line.
    pub fn top_kinds(&self, n: usize) -> String {
        let mut kinds: Vec<(&String, &u64)> = self.kinds.iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        kinds
            .iter()
            .take(n)
            .map(|(k, c)| format!("    {c:>5} x {k}\n"))
            .collect()
    }
}

/// Report lines printed again after all trials.
pub static REPORTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

pub fn print_reports() {
    let reports = REPORTS.lock().unwrap();
    if reports.is_empty() {
        return;
    }
    println!("SQLite corpus report:");
    for line in reports.iter() {
        println!("  {line}");
    }
}

// ---------------------------------------------------------------------------
// The sqllogictest adapter.

struct SltDb {
    conn: Box<dyn Connection>,
    instance: Arc<dyn Instance>,
    /// Type letters of the `query` record being run (the original runner
    /// formats values by them).
    hints: Arc<Mutex<Option<Vec<char>>>>,
    style: Style,
}

fn column_type(rows: &[Vec<spindle::Value>], col: usize) -> DefaultColumnType {
    use spindle::Value;
    for row in rows {
        match row.get(col) {
            Some(Value::Null) | None => continue,
            Some(Value::Int64(_)) => return DefaultColumnType::Integer,
            Some(Value::Float64(_) | Value::Numeric(_)) => return DefaultColumnType::FloatingPoint,
            Some(_) => return DefaultColumnType::Text,
        }
    }
    DefaultColumnType::Any
}

impl DB for SltDb {
    type Error = SqlError;
    type ColumnType = DefaultColumnType;

    fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SqlError> {
        if is_restart(sql) {
            self.instance.restart()?;
            return Ok(DBOutput::StatementComplete(0));
        }
        match self.conn.run(sql)? {
            Outcome::Count(n) => Ok(DBOutput::StatementComplete(n)),
            Outcome::Rows { columns, rows } => {
                let hints = self.hints.lock().unwrap().clone();
                let types = (0..columns).map(|c| column_type(&rows, c)).collect();
                let rows = rows
                    .iter()
                    .map(|row| {
                        row.iter()
                            .enumerate()
                            .map(|(i, v)| {
                                let hint = hints.as_ref().and_then(|h| h.get(i).copied());
                                format_value(v, hint, self.style)
                            })
                            .collect()
                    })
                    .collect();
                Ok(DBOutput::Rows { types, rows })
            }
        }
    }

    fn engine_name(&self) -> &str {
        ""
    }

    fn error_sql_state(err: &SqlError) -> Option<String> {
        err.sqlstate.clone()
    }
}

// ---------------------------------------------------------------------------
// SQLite corpus quirks.

/// The corpus' engine label for PostgreSQL; Spindle runs its records.
pub const SQLITE_ENGINE_LABEL: &str = "postgresql";

/// Rewrites a corpus file for the `sqllogictest` crate:
/// * `skipif mysql # comment` loses its comment;
/// * `onlyif X` / `skipif X` lines followed by `halt` become a `halt` only
///   when they select our engine, and disappear otherwise;
/// * value-wise result mode and hash threshold 8 are set at the top.
pub fn preprocess_sqlite(text: &str, engine: &str) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    out.push_str("control resultmode valuewise\nhash-threshold 8\n\n");
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        // A run of condition lines.
        let mut conds: Vec<(bool, String)> = Vec::new(); // (onlyif?, label)
        let mut j = i;
        while j < lines.len() {
            let line = lines[j].split('#').next().unwrap_or("").trim();
            let mut words = line.split_whitespace();
            match (words.next(), words.next()) {
                (Some("onlyif"), Some(label)) => conds.push((true, label.to_string())),
                (Some("skipif"), Some(label)) => conds.push((false, label.to_string())),
                _ => break,
            }
            j += 1;
        }
        if conds.is_empty() {
            out.push_str(lines[i].trim_end_matches('\r'));
            out.push('\n');
            i += 1;
            continue;
        }
        if j < lines.len() && lines[j].trim() == "halt" {
            let selected = conds.iter().all(|(only, label)| (label == engine) == *only);
            if selected {
                out.push_str("halt\n");
            }
            i = j + 1;
            continue;
        }
        for (only, label) in &conds {
            out.push_str(if *only { "onlyif " } else { "skipif " });
            out.push_str(label);
            out.push('\n');
        }
        i = j;
    }
    out
}

// ---------------------------------------------------------------------------
// Running a file.

fn run_file(spec: &FileSpec, tally: &Mutex<Tally>) -> Result<(), String> {
    let start = Instant::now();
    let text = std::fs::read_to_string(&spec.path)
        .map_err(|e| format!("cannot read {}: {e}", spec.path.display()))?;
    let style = Style {
        sqlite: spec.mode.is_sqlite(),
    };
    let text = if style.sqlite {
        preprocess_sqlite(&text, SQLITE_ENGINE_LABEL)
    } else {
        text
    };
    let records = sqllogictest::parse_with_name::<DefaultColumnType>(&text, spec.display.as_str())
        .map_err(|e| format!("parse error: {e}"))?;

    let instance = spec
        .backend
        .fresh()
        .map_err(|e| format!("cannot open a database: {e}"))?;
    let hints: Arc<Mutex<Option<Vec<char>>>> = Arc::new(Mutex::new(None));
    let make_conn = {
        let instance = instance.clone();
        let hints = hints.clone();
        move || {
            let db = instance.connect().map(|conn| SltDb {
                conn,
                instance: instance.clone(),
                hints: hints.clone(),
                style,
            });
            std::future::ready(db)
        }
    };
    let mut runner = Runner::new(make_conn);
    if style.sqlite {
        runner.add_label(SQLITE_ENGINE_LABEL);
    } else {
        runner.add_label("spindle");
        runner.add_label(spec.backend.name());
    }

    let deadline = match spec.mode {
        Mode::SqliteReport { budget } => Some(start + budget),
        _ => None,
    };
    let mut records = records.into_iter();
    while let Some(record) = records.next() {
        let counted = matches!(record, Record::Statement { .. } | Record::Query { .. });
        if let Some(deadline) = deadline {
            if counted && Instant::now() >= deadline {
                let rest = 1 + records
                    .by_ref()
                    .filter(|r| matches!(r, Record::Statement { .. } | Record::Query { .. }))
                    .count() as u64;
                let mut t = tally.lock().unwrap();
                t.not_run = rest;
                t.stopped = Some(format!("time budget of {}s", spec_budget_secs(spec)));
                break;
            }
        }
        let is_query = matches!(record, Record::Query { .. });
        match &record {
            Record::Halt { loc } => {
                tally.lock().unwrap().stopped = Some(format!("halt at {loc}"));
                break;
            }
            Record::Query {
                expected: QueryExpect::Results { types, .. },
                ..
            } => {
                *hints.lock().unwrap() = Some(types.iter().map(|t| t.to_char()).collect());
            }
            Record::Query { .. } => *hints.lock().unwrap() = None,
            _ => {}
        }
        let result = runner.run(record);
        let mut t = tally.lock().unwrap();
        match result {
            Ok(RecordOutput::Nothing) if counted => t.skipped += 1,
            Ok(_) if counted => {
                if is_query {
                    t.queries_passed += 1
                } else {
                    t.statements_passed += 1
                }
            }
            Ok(_) => {}
            Err(e) => {
                if !counted {
                    t.other_failed += 1;
                } else if is_query {
                    t.queries_failed += 1;
                } else {
                    t.statements_failed += 1;
                }
                t.record_failure(e.display(false).to_string());
            }
        }
    }
    runner.shutdown();
    drop(runner);
    tally.lock().unwrap().elapsed = start.elapsed();
    Ok(())
}

fn spec_budget_secs(spec: &FileSpec) -> u64 {
    match spec.mode {
        Mode::SqliteReport { budget } => budget.as_secs(),
        _ => 0,
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

/// Runs one file as one trial.
pub fn run_trial(spec: FileSpec) -> Result<(), Failed> {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let (tx, rx) = mpsc::channel();
    let display = spec.display.clone();
    let mode = spec.mode;
    let hard_timeout = spec.hard_timeout;
    let start = Instant::now();
    let worker = {
        let tally = tally.clone();
        thread::Builder::new()
            .name(format!("slt {display}"))
            .stack_size(64 << 20)
            .spawn(move || {
                let result = run_file(&spec, &tally);
                let _ = tx.send(result);
            })
            .map_err(|e| Failed::from(format!("cannot spawn the worker thread: {e}")))?
    };

    let mut abandoned = None;
    match rx.recv_timeout(hard_timeout) {
        Ok(Ok(())) => {
            let _ = worker.join();
        }
        Ok(Err(setup)) => return Err(setup.into()),
        Err(RecvTimeoutError::Disconnected) => {
            let msg = match worker.join() {
                Err(payload) => panic_message(payload),
                Ok(()) => "worker ended without a result".to_string(),
            };
            let t = tally.lock().unwrap().clone();
            return Err(format!(
                "PANIC while running {display}: {msg}\n(after {} records passed, {} failed)",
                t.passed(),
                t.failed()
            )
            .into());
        }
        Err(RecvTimeoutError::Timeout) => {
            // The worker is stuck in a statement; leave it behind (it dies
            // with the process).
            abandoned = Some(format!(
                "gave up after {}s: a statement did not return",
                hard_timeout.as_secs()
            ));
        }
    }

    let mut t = tally.lock().unwrap().clone();
    let hung = abandoned.is_some();
    if let Some(why) = abandoned {
        t.stopped = Some(why);
        t.elapsed = start.elapsed();
    }
    match mode {
        Mode::SqliteReport { .. } => {
            let line = format!("{display}: {}", t.summary());
            println!("report {line}\n{}", t.top_kinds(5));
            REPORTS.lock().unwrap().push(line.clone());
            // Failed records are only counted here, but a statement that
            // never returns is a hang, as much a bug as a panic.
            if hung {
                return Err(format!("HANG while running {line}").into());
            }
            Ok(())
        }
        Mode::SqliteStrict | Mode::Own => {
            if mode == Mode::SqliteStrict {
                REPORTS
                    .lock()
                    .unwrap()
                    .push(format!("{display}: {}", t.summary()));
            }
            if t.failed() == 0 && t.stopped.as_deref().is_none_or(|s| s.starts_with("halt")) {
                return Ok(());
            }
            let mut msg = format!("{display}: {}\n{}", t.summary(), t.top_kinds(10));
            for (i, f) in t.failures.iter().enumerate() {
                msg.push_str(&format!("\n--- failure {} ---\n{}\n", i + 1, f.trim_end()));
            }
            if t.failed() as usize > t.failures.len() {
                msg.push_str(&format!(
                    "\n... and {} more failures\n",
                    t.failed() as usize - t.failures.len()
                ));
            }
            Err(msg.into())
        }
    }
}
