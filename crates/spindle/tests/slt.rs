//! sqllogictest runner for Spindle (`cargo test -p spindle --test slt`).
//!
//! One libtest-mimic trial per file:
//!
//! * `<backend>::sql-tests/<file>.slt` — our own suite (`sql-tests/**/*.slt`).
//!   Every record must pass; all failures of a file are listed. Files that
//!   contain the pseudo statement `RESTART DATABASE` run on a database in a
//!   temporary directory (`embedded-disk`), the others in memory
//!   (`embedded`). Records may use the labels `spindle` and the backend name
//!   in `skipif`/`onlyif`.
//!   Every own file also runs on the `wire` backend (`wire-disk` with
//!   `RESTART DATABASE`): a `spindle-server` started by the test, reached
//!   with tokio-postgres (`slt/wire.rs`).
//! * `<backend>::sqlite/select{1,2,3,4,5}.test` — SQLite's corpus
//!   (`../shared/sqllogictest/sqlite`, see its README): must pass completely
//!   (PostgreSQL 15 passes all five).
//! * `<backend>::sqlite-report/...` — the rest of the corpus (evidence/,
//!   index/): pass/fail counts are printed, the trial
//!   passes unless the engine panics or a statement does not return (the
//!   hard timeout below). Each file stops starting records after a time
//!   budget.
//!
//! Environment:
//! * `SPINDLE_SLT_FILTER=substr` — only trials whose name contains `substr`
//!   (the libtest filter `cargo test --test slt -- substr` works too).
//! * `SPINDLE_SLT_BUDGET_SECS` — time budget per report file (default 45).
//! * `SPINDLE_SLT_TIMEOUT_SECS` — give up on a file (a statement that does
//!   not return) after this long (default 300; report files: budget + 60).
//! * `SPINDLE_SLT_SQLITE=dir` — another corpus location; `SPINDLE_SLT_SQLITE=off`
//!   skips the corpus.
//! * `SPINDLE_SLT_DISK=1` — also run every own file on the on-disk backend.
//! * `SPINDLE_SLT_DIR=dir` — another directory of own `.slt` files.

#[path = "slt/backend.rs"]
mod backend;
#[path = "slt/format.rs"]
mod format;
#[path = "slt/run.rs"]
mod run;
#[path = "slt/wire.rs"]
mod wire;

use std::env;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Trial};

use backend::{Backend, Embedded};
use run::{FileSpec, Mode};

fn env_secs(name: &str, default: u64) -> Duration {
    Duration::from_secs(
        env::var(name)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default),
    )
}

/// Every file under `dir` whose name ends with `ext`, sorted.
fn files_with_ext(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn relative(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

fn uses_restart(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .map(|text| text.lines().any(run::is_restart))
        .unwrap_or(false)
}

fn main() {
    let args = Arguments::from_args();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let own_dir = env::var_os("SPINDLE_SLT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../sql-tests"));
    let filter = env::var("SPINDLE_SLT_FILTER")
        .ok()
        .filter(|f| !f.is_empty());
    let budget = env_secs("SPINDLE_SLT_BUDGET_SECS", 45);
    let timeout = env_secs("SPINDLE_SLT_TIMEOUT_SECS", 300);
    let report_timeout = budget + Duration::from_secs(60);
    let also_disk = env::var("SPINDLE_SLT_DISK").is_ok_and(|v| v == "1");

    let memory: Arc<dyn Backend> = Arc::new(Embedded { persistent: false });
    let disk: Arc<dyn Backend> = Arc::new(Embedded { persistent: true });
    // Every own file also runs over the PostgreSQL wire protocol.
    let wire: Arc<dyn Backend> = Arc::new(wire::Wire { persistent: false });
    let wire_disk: Arc<dyn Backend> = Arc::new(wire::Wire { persistent: true });

    let mut specs: Vec<FileSpec> = Vec::new();

    // SQLite corpus first: its files are the long ones.
    let corpus = match env::var("SPINDLE_SLT_SQLITE") {
        Ok(v) if v == "off" => None,
        Ok(v) => Some(PathBuf::from(v)),
        Err(_) => Some(manifest.join("../../../shared/sqllogictest/sqlite")),
    };
    if let Some(corpus) = corpus {
        if corpus.is_dir() {
            for path in files_with_ext(&corpus, "test") {
                let rel = relative(&path, &corpus);
                let strict = matches!(
                    rel.as_str(),
                    "select1.test"
                        | "select2.test"
                        | "select3.test"
                        | "select4.test"
                        | "select5.test"
                );
                let (display, mode, hard_timeout) = if strict {
                    (format!("sqlite/{rel}"), Mode::SqliteStrict, timeout)
                } else {
                    (
                        format!("sqlite-report/{rel}"),
                        Mode::SqliteReport { budget },
                        report_timeout,
                    )
                };
                specs.push(FileSpec {
                    path,
                    display,
                    mode,
                    backend: memory.clone(),
                    hard_timeout,
                });
            }
            // Longest first, so that two test threads finish together.
            specs.sort_by_key(|s| {
                std::cmp::Reverse(std::fs::metadata(&s.path).map(|m| m.len()).unwrap_or(0))
            });
        } else {
            println!(
                "note: SQLite sqllogictest corpus not found at {}; skipping it",
                corpus.display()
            );
        }
    }

    for path in files_with_ext(&own_dir, "slt") {
        let display = format!("sql-tests/{}", relative(&path, &own_dir));
        let mut backends = Vec::new();
        if uses_restart(&path) {
            assert!(disk.persistent());
            backends.push(disk.clone());
            backends.push(wire_disk.clone());
        } else {
            backends.push(wire.clone());
            backends.push(memory.clone());
            if also_disk {
                backends.push(disk.clone());
            }
        }
        for backend in backends {
            specs.push(FileSpec {
                path: path.clone(),
                display: display.clone(),
                mode: Mode::Own,
                backend,
                hard_timeout: timeout,
            });
        }
    }

    let mut trials = vec![Trial::test("harness::format", || {
        format::self_check();
        Ok(())
    })];
    for spec in specs {
        let name = format!("{}::{}", spec.backend.name(), spec.display);
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        trials.push(Trial::test(name, move || run::run_trial(spec)));
    }

    let conclusion = libtest_mimic::run(&args, trials);
    run::print_reports();
    conclusion.exit();
}
