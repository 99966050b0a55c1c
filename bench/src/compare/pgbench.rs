//! Workloads 1 and 2 with pgbench against both servers: point reads by
//! primary key (`-M simple` and `-M prepared`) and TPC-B-like durable write
//! transactions (with `--max-tries`, so serialization failures retry).
//!
//! The tables are pgbench's, loaded by the harness with plain CREATE TABLE
//! and COPY (the same statements for both servers) instead of `pgbench -i`,
//! whose DDL is PostgreSQL's own. Differences from `pgbench -i`: the number
//! of accounts is `--accounts` (not 100 000 × scale) and there are
//! `--branches` branches with 10 tellers each, so that clients do not all
//! contend for one branch row.

use std::path::Path;
use std::process::Command;

use hdrhistogram::Histogram;
use tokio_postgres::Client;

use super::util::{fail, histogram, progress, Context, Figure, Result};
use super::wire::{batch, copy_rows, scalar_i64, Cell};

pub struct Sizes {
    pub accounts: i64,
    pub branches: i64,
}

impl Sizes {
    fn tellers(&self) -> i64 {
        self.branches * 10
    }
}

const DDL: &str = "
CREATE TABLE pgbench_branches (bid bigint NOT NULL, bbalance bigint NOT NULL, filler varchar(88), PRIMARY KEY (bid));
CREATE TABLE pgbench_tellers (tid bigint NOT NULL, bid bigint NOT NULL, tbalance bigint NOT NULL, filler varchar(84), PRIMARY KEY (tid));
CREATE TABLE pgbench_accounts (aid bigint NOT NULL, bid bigint NOT NULL, abalance bigint NOT NULL, filler varchar(84), PRIMARY KEY (aid));
CREATE TABLE pgbench_history (tid bigint, bid bigint, aid bigint, delta bigint, mtime timestamp, filler varchar(22));
";

/// Creates and fills pgbench's tables.
pub async fn load(c: &Client, s: &Sizes) -> Result<()> {
    batch(c, DDL).await?;
    let filler = |n: usize| Cell::Text("x".repeat(n));
    let branches: Vec<Vec<Cell>> = (1..=s.branches)
        .map(|b| vec![Cell::Int(b), Cell::Int(0), filler(88)])
        .collect();
    copy_rows(c, "pgbench_branches", &branches, 10_000).await?;
    let tellers: Vec<Vec<Cell>> = (1..=s.tellers())
        .map(|t| {
            vec![
                Cell::Int(t),
                Cell::Int((t - 1) / 10 + 1),
                Cell::Int(0),
                filler(84),
            ]
        })
        .collect();
    copy_rows(c, "pgbench_tellers", &tellers, 10_000).await?;
    let per_branch = (s.accounts / s.branches).max(1);
    let accounts: Vec<Vec<Cell>> = (1..=s.accounts)
        .map(|a| {
            vec![
                Cell::Int(a),
                Cell::Int(((a - 1) / per_branch).min(s.branches - 1) + 1),
                Cell::Int(0),
                filler(84),
            ]
        })
        .collect();
    copy_rows(c, "pgbench_accounts", &accounts, 10_000).await?;
    Ok(())
}

pub fn select_script(s: &Sizes) -> String {
    format!(
        "\\set aid random(1, {})\nSELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n",
        s.accounts
    )
}

/// pgbench's built-in `tpcb-like` script, with the sizes above.
pub fn tpcb_script(s: &Sizes) -> String {
    format!(
        "\\set aid random(1, {})\n\
         \\set bid random(1, {})\n\
         \\set tid random(1, {})\n\
         \\set delta random(-5000, 5000)\n\
         BEGIN;\n\
         UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;\n\
         SELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n\
         UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;\n\
         UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;\n\
         INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);\n\
         END;\n",
        s.accounts,
        s.branches,
        s.tellers()
    )
}

/// Every committed TPC-B transaction added the same delta to one account,
/// one teller, one branch and the history: the four sums must agree.
pub async fn check_tpcb(c: &Client, system: &str) -> Result<()> {
    let a = scalar_i64(c, "SELECT coalesce(sum(abalance), 0) FROM pgbench_accounts").await?;
    let t = scalar_i64(c, "SELECT coalesce(sum(tbalance), 0) FROM pgbench_tellers").await?;
    let b = scalar_i64(c, "SELECT coalesce(sum(bbalance), 0) FROM pgbench_branches").await?;
    let h = scalar_i64(c, "SELECT coalesce(sum(delta), 0) FROM pgbench_history").await?;
    if !(a == t && t == b && b == h) {
        return fail(format!(
            "{system}: TPC-B balances disagree after the run: accounts {a}, tellers {t}, \
             branches {b}, history {h}"
        ));
    }
    Ok(())
}

pub struct Target<'a> {
    pub port: u16,
    pub user: &'a str,
    pub db: &'a str,
}

pub struct Run<'a> {
    pub pgbench: &'a Path,
    pub script: &'a Path,
    pub mode: &'a str,
    pub clients: u32,
    pub seconds: u64,
    pub max_tries: Option<u32>,
}

/// One pgbench run: its summary's figures and the latencies of its
/// per-transaction log.
pub struct Round {
    tps: f64,
    processed: u64,
    failures: Option<u64>,
    retries: Option<u64>,
    latencies: Histogram<u64>,
}

/// The rounds of one system in one case as one figure: the mean of the
/// rounds' tps (rounds of equal length), transactions, failures and
/// retries summed, p50/p99 over every round's transactions.
pub fn combine(rounds: &[Round]) -> Result<Figure> {
    let mut hist = histogram();
    for r in rounds {
        hist.add(&r.latencies).ctx("histogram")?;
    }
    if rounds.is_empty() || hist.is_empty() {
        return fail("no pgbench rounds to combine");
    }
    let sum = |f: fn(&Round) -> Option<u64>| rounds.iter().map(f).sum::<Option<u64>>();
    Ok(Figure {
        value: rounds.iter().map(|r| r.tps).sum::<f64>() / rounds.len() as f64,
        p50_us: Some(hist.value_at_quantile(0.5)),
        p99_us: Some(hist.value_at_quantile(0.99)),
        ops: rounds.iter().map(|r| r.processed).sum(),
        failures: sum(|r| r.failures),
        retries: sum(|r| r.retries),
    })
}

/// Runs pgbench once; tps from its summary, latencies from its
/// per-transaction log (`-l`).
pub fn run(t: &Target, r: &Run) -> Result<Round> {
    let logs = tempfile::Builder::new()
        .prefix("compare-pgbench")
        .tempdir()
        .ctx("temp dir")?;
    let mut cmd = Command::new(r.pgbench);
    cmd.args(["-n", "-h", "127.0.0.1"])
        .args(["-p", &t.port.to_string(), "-U", t.user])
        .args(["-M", r.mode])
        .args(["-c", &r.clients.to_string()])
        .args(["-j", &r.clients.min(2).to_string()])
        .args(["-T", &r.seconds.to_string()])
        .arg("-f")
        .arg(r.script)
        .arg("-l")
        .arg(format!(
            "--log-prefix={}",
            logs.path().join("log").display()
        ));
    if let Some(n) = r.max_tries {
        cmd.arg(format!("--max-tries={n}"));
    }
    cmd.arg(t.db);
    let out = cmd.output().ctx("running pgbench")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return fail(format!(
            "pgbench failed ({}):\n{stdout}\n{stderr}",
            out.status
        ));
    }
    let field = |prefix: &str| -> Option<f64> {
        stdout.lines().find_map(|l| {
            l.trim()
                .strip_prefix(prefix)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
    };
    let Some(tps) = field("tps = ") else {
        return fail(format!("no tps in pgbench output:\n{stdout}\n{stderr}"));
    };
    let processed = field("number of transactions actually processed:").unwrap_or(0.0);
    let failures = field("number of failed transactions:");
    let retries = field("number of transactions retried:");
    // Per-transaction log lines: client, transaction no, latency (µs), …
    // (the latency is "failed" or "skipped" for those).
    let mut hist = histogram();
    for entry in std::fs::read_dir(logs.path()).ctx("pgbench logs")? {
        let text = std::fs::read_to_string(entry.ctx("log entry")?.path()).ctx("pgbench log")?;
        for line in text.lines() {
            if let Some(us) = line
                .split_whitespace()
                .nth(2)
                .and_then(|v| v.parse::<u64>().ok())
            {
                hist.record(us).ctx("histogram")?;
            }
        }
    }
    if hist.is_empty() {
        return fail(format!("pgbench wrote no transaction log:\n{stdout}"));
    }
    Ok(Round {
        tps,
        processed: processed as u64,
        failures: failures.map(|f| f as u64),
        retries: retries.map(|f| f as u64),
        latencies: hist,
    })
}

/// Loads both servers (the same rows) and logs what it did.
pub async fn load_both(pg: &Client, sp: &Client, s: &Sizes) -> Result<()> {
    progress(format!(
        "pgbench tables: {} accounts, {} branches, {} tellers",
        s.accounts,
        s.branches,
        s.tellers()
    ));
    load(pg, s).await?;
    batch(pg, "VACUUM ANALYZE").await?;
    load(sp, s).await?;
    Ok(())
}
