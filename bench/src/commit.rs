//! Commit benchmark: single-split vs cross-split (two-phase) commits at 1
//! and 8 clients, and group commit vs one flush per commit.
//!
//! Runs on the transaction layer over an on-disk store (every commit is
//! durable), so it measures the commit path itself, not SQL planning. Each
//! client writes its own accounts, so no transaction conflicts with another.
//!
//! A benchmark harness, not part of the database: any failure aborts the
//! run with a message (`expect`), which is what a measurement wants.
//!
//! ```text
//! cargo run --release -p spindle-bench --bin commit-bench -- [--seconds 3] [--dir /path/on/disk]
//! ```

use clap::Parser;
use spindle_bench::commits::{run, setup, Result, ACCOUNTS};

#[derive(Parser)]
struct Args {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Directory for the database (default: a temporary directory).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

fn report(name: &str, r: &Result) -> f64 {
    let tps = r.commits as f64 / r.seconds;
    println!(
        "| {name:<38} | {tps:>10.0} | {:>9} | {:>9} | {:>17.2} |",
        r.hist.value_at_quantile(0.5),
        r.hist.value_at_quantile(0.99),
        r.commits as f64 / r.flushes.max(1) as f64
    );
    tps
}

fn main() {
    let args = Args::parse();
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let s = setup(&dir);
    let splits = s.split_first.len();
    assert!(splits >= 16, "need at least 16 splits, got {splits}");
    println!(
        "{splits} splits over {ACCOUNTS} accounts, {:.1}s per run, durable commits\n",
        args.seconds
    );
    println!(
        "| workload                               | commits/s  | p50 (µs)  | p99 (µs)  | commits per flush |"
    );
    println!(
        "|----------------------------------------|------------|-----------|-----------|-------------------|"
    );
    // Client c owns split c (for 8 clients, splits 0..8) and, for
    // cross-split pairs, split c + 8.
    let same = |c: usize, _n: u64| s.same_split(c);
    let cross = |c: usize, _n: u64| s.cross_split(c);
    let mut rows = Vec::new();
    for clients in [1, 8] {
        let one = report(
            &format!("single-split, {clients} client(s)"),
            &run(&s, clients, args.seconds, same),
        );
        let two = report(
            &format!("cross-split (2PC), {clients} client(s)"),
            &run(&s, clients, args.seconds, cross),
        );
        rows.push((clients, one, two));
    }
    s.mgr.set_group_commit(false);
    let no_group = report(
        "single-split, 8 clients, no group",
        &run(&s, 8, args.seconds, same),
    );
    let no_group_cross = report(
        "cross-split (2PC), 8 clients, no group",
        &run(&s, 8, args.seconds, cross),
    );
    s.mgr.set_group_commit(true);
    let group = rows.iter().find(|r| r.0 == 8).map(|r| r.1).unwrap_or(0.0);
    let group_cross = rows.iter().find(|r| r.0 == 8).map(|r| r.2).unwrap_or(0.0);
    println!();
    for (clients, one, two) in &rows {
        println!(
            "cross-split / single-split throughput at {clients} client(s): {:.2}",
            two / one
        );
    }
    println!(
        "group commit / one flush per commit at 8 clients: {:.2}",
        group / no_group
    );
    println!(
        "group commit / one flush per step, cross-split at 8 clients: {:.2}",
        group_cross / no_group_cross
    );
}
