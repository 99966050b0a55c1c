//! `compare`: Spindle against PostgreSQL 15 and SQLite in one run (issue 6).
//!
//! Starts PostgreSQL (initdb into a temporary directory, trust
//! authentication, a free loopback port, fsync on) and `spindle serve` (the
//! `spindle` binary next to this one, or `--spindle-bin`) on a temporary
//! data directory, runs the workloads below against the same schema and
//! data in every system, stops both servers (also on error), and writes
//! `compare.md`, `compare.json` and `compare.svg` to `--out`
//! (`bench/results` by default).
//!
//! 1. point reads by primary key over the wire (pgbench, `-M simple` and
//!    `-M prepared`, 1/4/8 clients), Spindle vs PostgreSQL;
//! 2. TPC-B-like durable write transactions (pgbench, `--max-tries`);
//! 3. embedded: Spindle's API vs SQLite in-process;
//! 4. locality: interleaved vs non-interleaved vs PostgreSQL;
//! 5. analytics: TPC-H Q1/Q3-style, Spindle vs PostgreSQL vs SQLite;
//! 6. commits: single-split vs cross-split, within Spindle.
//!
//! ```text
//! cargo build --release -p spindle-cli -p spindle-bench && target/release/compare [--seconds 3] [--scale 0.1] …
//! ```
//!
//! Before the workloads and after them it probes the machine (a fixed CPU
//! loop, synced 4 KiB writes, CPU pressure: [`probe`]) and writes both
//! looks into the results' settings: ratios are only compared across runs
//! whose probes roughly agree.
//!
//! A benchmark harness: a failed step or a disagreement between systems
//! ends the run with an error (exit code 1) and no results are written.
//! Progress goes to stderr.

mod analytics;
mod embedded;
mod locality;
mod pgbench;
mod probe;
mod procs;
mod report;
mod util;
mod wire;

use std::path::PathBuf;

use clap::Parser;

use report::{Meta, Record};
use util::{fail, progress, Context, Figure, Kind, Result};

#[derive(Parser, Debug)]
#[command(about = "Spindle vs PostgreSQL 15 vs SQLite, side by side in one run")]
struct Args {
    /// Seconds per timed measurement (pgbench -T, embedded and wire loops).
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Client counts for the pgbench workloads.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 4, 8])]
    clients: Vec<u32>,
    /// pgbench runs per system and case (workloads 1 and 2), each
    /// `--seconds` long, the systems alternating; the figure is the mean of
    /// the rounds' tps.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Rows in pgbench_accounts.
    #[arg(long, default_value_t = 100_000)]
    accounts: i64,
    /// Branches for TPC-B (10 tellers each).
    #[arg(long, default_value_t = 8)]
    branches: i64,
    /// pgbench --max-tries for TPC-B (retries of serialization failures).
    #[arg(long, default_value_t = 100)]
    max_tries: u32,
    /// Rows in the embedded workload's table.
    #[arg(long, default_value_t = 10_000)]
    embedded_rows: i64,
    /// Rows per bulk-insert transaction (embedded).
    #[arg(long, default_value_t = 10_000)]
    bulk_rows: i64,
    /// Customers in the locality workload.
    #[arg(long, default_value_t = 2_000)]
    customers: i64,
    /// Orders per customer (locality).
    #[arg(long, default_value_t = 5)]
    orders_per_customer: i64,
    /// Lines per order (locality).
    #[arg(long, default_value_t = 4)]
    lines_per_order: i64,
    /// Analytics size: lineitem rows = scale × 1 000 000 (orders a quarter
    /// of that, customers a tenth of the orders).
    #[arg(long, default_value_t = 0.1)]
    scale: f64,
    /// Timed runs per latency case (median reported; the systems' runs
    /// alternate).
    #[arg(long, default_value_t = 11)]
    runs: usize,
    /// Run only these workloads (1-6).
    #[arg(long, value_delimiter = ',')]
    only: Vec<u32>,
    /// PostgreSQL's bin directory (initdb, pg_ctl, postgres, pgbench).
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pg_bin: PathBuf,
    /// OS user that runs PostgreSQL when this harness runs as root.
    #[arg(long, default_value = "postgres")]
    pg_os_user: String,
    /// The spindle binary (default: next to this executable).
    #[arg(long)]
    spindle_bin: Option<PathBuf>,
    /// Where the results go.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results"))]
    out: PathBuf,
}

impl Args {
    fn wants(&self, w: u32) -> bool {
        self.only.is_empty() || self.only.contains(&w)
    }
}

fn main() {
    let args = Args::parse();
    if let Err(e) = procs::install_signal_handler().and_then(|_| run(&args)) {
        eprintln!("compare: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<()> {
    progress(format!(
        "compare ({} build)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    ));
    progress("probing the machine (CPU loop, synced 4 KiB writes)");
    let probe_start = probe::Probe::take()?;
    let mut records: Vec<Record> = Vec::new();
    let mut postgres_version = "not run".to_string();
    let mut server_bin = "not run".to_string();
    if [1, 2, 4, 5].iter().any(|w| args.wants(*w)) {
        let spindle_bin = procs::find_spindle(args.spindle_bin.as_deref())?;
        server_bin = spindle_bin.display().to_string();
        // Both guards stop their server when this block ends, on success or error.
        let pg = procs::Postgres::start(&args.pg_bin, &args.pg_os_user)?;
        postgres_version = pg.version.clone();
        let sp = procs::Spindle::start(&spindle_bin)?;
        server_bin = format!(
            "{server_bin} ({}; PostgreSQL in its own, from pg_ctl)",
            if sp.own_session {
                "in a session of its own, through setsid"
            } else {
                "in the harness's session: no setsid"
            }
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ctx("tokio runtime")?;
        let r = rt.block_on(wire_workloads(args, &pg, &sp, &mut records));
        if let Err(e) = r {
            return fail(format!("{e}\nspindle serve log (end):\n{}", sp.log_tail()));
        }
    }
    if args.wants(3) {
        embedded::run(
            &embedded::Sizes {
                rows: args.embedded_rows,
                bulk_rows: args.bulk_rows,
                seconds: args.seconds as f64,
            },
            &mut records,
        )?;
    }
    if args.wants(6) {
        commits(args.seconds as f64, &mut records)?;
    }
    records.sort_by(|a, b| a.workload.cmp(&b.workload));

    progress("probing the machine again");
    let probe_end = probe::Probe::take()?;
    let mut meta = meta(args, postgres_version, server_bin);
    meta.settings
        .push(("machine probe at the start".into(), probe_start.describe()));
    meta.settings
        .push(("machine probe at the end".into(), probe_end.describe()));
    report::write_all(&args.out, &meta, &records)?;
    println!("{}", report::markdown(&meta, &records));
    progress(format!(
        "wrote compare.md, compare.json, compare.svg to {}",
        args.out.display()
    ));
    Ok(())
}

async fn wire_workloads(
    args: &Args,
    pg: &procs::Postgres,
    sp: &procs::Spindle,
    records: &mut Vec<Record>,
) -> Result<()> {
    let pgc = wire::connect(&pg.conninfo()).await?;
    let spc = wire::connect(&sp.conninfo()).await?;
    if args.wants(1) || args.wants(2) {
        pgbench_workloads(args, pg, sp, &pgc, &spc, records).await?;
    }
    if args.wants(4) {
        locality::run(
            &pgc,
            &spc,
            &locality::Sizes {
                customers: args.customers,
                orders_per: args.orders_per_customer,
                lines_per: args.lines_per_order,
                seconds: args.seconds as f64,
                runs: args.runs,
            },
            records,
        )
        .await?;
    }
    if args.wants(5) {
        analytics::run(
            &pgc,
            &spc,
            &analytics::Sizes {
                lineitems: (args.scale * 1_000_000.0).round().max(100.0) as i64,
                runs: args.runs,
            },
            records,
        )
        .await?;
    }
    Ok(())
}

async fn pgbench_workloads(
    args: &Args,
    pg: &procs::Postgres,
    sp: &procs::Spindle,
    pgc: &tokio_postgres::Client,
    spc: &tokio_postgres::Client,
    records: &mut Vec<Record>,
) -> Result<()> {
    let sizes = pgbench::Sizes {
        accounts: args.accounts,
        branches: args.branches,
    };
    pgbench::load_both(pgc, spc, &sizes).await?;
    let scripts = tempfile::Builder::new()
        .prefix("compare-scripts")
        .tempdir()
        .ctx("temp dir")?;
    let select = scripts.path().join("select.sql");
    let tpcb = scripts.path().join("tpcb.sql");
    std::fs::write(&select, pgbench::select_script(&sizes)).ctx("script")?;
    std::fs::write(&tpcb, pgbench::tpcb_script(&sizes)).ctx("script")?;
    let bin = args.pg_bin.join("pgbench");
    let pg_t = pgbench::Target {
        port: pg.port,
        user: "postgres",
        db: "postgres",
    };
    let sp_t = pgbench::Target {
        port: sp.port,
        user: "spindle",
        db: "spindle",
    };
    let both = |script: &std::path::Path, mode: &str, clients: u32, tries: Option<u32>| {
        let r = pgbench::Run {
            pgbench: &bin,
            script,
            mode,
            clients,
            seconds: args.seconds,
            max_tries: tries,
        };
        // Rounds alternate which system goes first (S P, P S, S P, …), so
        // that a slow stretch of the machine falls on both.
        let (mut s, mut p) = (Vec::new(), Vec::new());
        for round in 0..args.rounds.max(1) {
            if round % 2 == 0 {
                s.push(pgbench::run(&sp_t, &r)?);
                p.push(pgbench::run(&pg_t, &r)?);
            } else {
                p.push(pgbench::run(&pg_t, &r)?);
                s.push(pgbench::run(&sp_t, &r)?);
            }
        }
        Ok::<_, util::Error>((pgbench::combine(&s)?, pgbench::combine(&p)?))
    };
    if args.wants(1) {
        for mode in ["simple", "prepared"] {
            for &clients in &args.clients {
                progress(format!("point reads: pgbench -M {mode} -c {clients}"));
                let (s, p) = both(&select, mode, clients, None)?;
                records.push(Record {
                    workload: "1 point reads".into(),
                    case: format!("-M {mode}, {clients} client(s)"),
                    kind: Kind::Throughput,
                    unit: "tps",
                    spindle_label: "Spindle".into(),
                    spindle: s,
                    other_label: "PostgreSQL".into(),
                    other: p,
                    target: Some(1.0),
                    note: format!(
                        "pgbench -n -f select.sql -T {} in {} rounds per system, the systems alternating (mean tps); `SELECT abalance FROM pgbench_accounts WHERE aid = :aid` over {} accounts; pgbench, the server and the other idle server share the machine",
                        args.seconds, args.rounds, args.accounts
                    ),
                });
            }
        }
    }
    if args.wants(2) {
        for &clients in &args.clients {
            progress(format!("TPC-B-like: pgbench -M prepared -c {clients}"));
            let (s, p) = both(&tpcb, "prepared", clients, Some(args.max_tries))?;
            records.push(Record {
                workload: "2 TPC-B-like".into(),
                case: format!("-M prepared, {clients} client(s)"),
                kind: Kind::Throughput,
                unit: "tps",
                spindle_label: "Spindle".into(),
                spindle: s,
                other_label: "PostgreSQL".into(),
                other: p,
                target: Some(1.0),
                note: format!(
                    "pgbench's tpcb-like script (BEGIN; 3 UPDATEs, SELECT, INSERT; END) with --max-tries={}, -T {} in {} rounds per system, the systems alternating (mean tps); {} accounts, {} branches, {} tellers; PostgreSQL at its default READ COMMITTED, Spindle serializable; durable commits in both (PostgreSQL: fsync=on, synchronous_commit=on; Spindle: its Store::flush); failed = gave up after the retries",
                    args.max_tries,
                    args.seconds,
                    args.rounds,
                    args.accounts,
                    args.branches,
                    args.branches * 10
                ),
            });
        }
        pgbench::check_tpcb(spc, "Spindle").await?;
        pgbench::check_tpcb(pgc, "PostgreSQL").await?;
    }
    Ok(())
}

/// Workload 6: the commit benchmark's single-split vs cross-split commits.
fn commits(seconds: f64, records: &mut Vec<Record>) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("compare-commits")
        .tempdir()
        .ctx("temp dir")?;
    progress("commits: loading accounts over 16+ splits");
    let s = spindle_bench::commits::setup(dir.path());
    if s.split_first.len() < 16 {
        return fail(format!(
            "commits: need at least 16 splits, got {}",
            s.split_first.len()
        ));
    }
    progress(format!("commits: {} splits", s.split_first.len()));
    let fig = |r: &spindle_bench::commits::Result| Figure::from_hist(r.commits, r.seconds, &r.hist);
    for clients in [1usize, 8] {
        progress(format!("commits: {clients} client(s)"));
        let one = spindle_bench::commits::run(&s, clients, seconds, |c, _| s.same_split(c));
        let two = spindle_bench::commits::run(&s, clients, seconds, |c, _| s.cross_split(c));
        records.push(Record {
            workload: "6 commits".into(),
            case: format!("{clients} client(s)"),
            kind: Kind::Throughput,
            unit: "commits/s",
            spindle_label: "Spindle cross-split (2PC)".into(),
            spindle: fig(&two),
            other_label: "Spindle single-split".into(),
            other: fig(&one),
            target: None,
            note: "transaction layer over an on-disk store (commit-bench's workload): each transaction writes two of its client's accounts, in one split or in two; ratio = cross-split / single-split".into(),
        });
    }
    Ok(())
}

fn meta(args: &Args, postgres: String, server_bin: String) -> Meta {
    let sh = |cmd: &str, a: &[&str]| -> Option<String> {
        std::process::Command::new(cmd)
            .args(a)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let mut commit =
        sh("git", &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    if sh("git", &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty())
    {
        commit.push_str(" + uncommitted changes");
    }
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let command = std::env::args()
        .map(|a| if a.contains(' ') { format!("'{a}'") } else { a })
        .collect::<Vec<_>>()
        .join(" ");
    let settings = vec![
        ("spindle serve binary".into(), server_bin),
        ("seconds per measurement".into(), args.seconds.to_string()),
        ("pgbench clients".into(), format!("{:?}", args.clients)),
        (
            "sizes".into(),
            format!(
                "{} accounts, {} branches; embedded {} rows, bulk {} rows; locality {} customers × {} orders × {} lines; analytics scale {} ({} lineitems); {} runs per latency case",
                args.accounts,
                args.branches,
                args.embedded_rows,
                args.bulk_rows,
                args.customers,
                args.orders_per_customer,
                args.lines_per_order,
                args.scale,
                (args.scale * 1_000_000.0).round(),
                args.runs
            ),
        ),
    ];
    Meta {
        date: sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "unknown".into()),
        commit,
        profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        command,
        machine: format!("{cores} cores, {cpu}"),
        postgres,
        sqlite: format!("{} (rusqlite, bundled)", rusqlite::version()),
        settings,
    }
}
