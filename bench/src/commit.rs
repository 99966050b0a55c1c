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

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use spindle_catalog::{Catalog, ColumnDef, KeyColumn, TableDef};
use spindle_keys::{DataType, Direction, Value};
use spindle_storage::Store;
use spindle_txn::TxnManager;

#[derive(Parser)]
struct Args {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Directory for the database (default: a temporary directory).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

const ACCOUNTS: i64 = 4096;

struct Setup {
    mgr: Arc<TxnManager>,
    catalog: Catalog,
    /// Account ids at the start of each split, to pick same- or cross-split pairs.
    split_first: Vec<i64>,
}

fn key(c: &Catalog, id: i64) -> Vec<u8> {
    // The schema below has one INT64 key column, so encoding cannot fail.
    c.encode_key("accounts", &[Value::Int64(id)])
        .unwrap_or_default()
}

fn setup(dir: &std::path::Path) -> Setup {
    let mgr = TxnManager::new(Store::open(dir).expect("open store")).expect("open database");
    mgr.set_split_threshold(32 * 1024);
    let mut c = Catalog::new();
    c.create_table(TableDef {
        name: "accounts".into(),
        columns: vec![ColumnDef {
            name: "id".into(),
            data_type: DataType::Int64,
            nullable: false,
            default: None,
            allow_commit_timestamp: false,
        }],
        primary_key: vec![KeyColumn {
            name: "id".into(),
            direction: Direction::Asc,
        }],
        interleave: None,
    })
    .expect("schema");
    let mut t = mgr.begin().expect("begin");
    t.set_catalog(c.clone());
    t.commit().expect("commit schema");
    for chunk in (0..ACCOUNTS).collect::<Vec<_>>().chunks(256) {
        let mut t = mgr.begin().expect("begin");
        for id in chunk {
            t.put(key(&c, *id), vec![b'x'; 64]);
        }
        t.commit().expect("load");
    }
    let stats = mgr.split_stats().expect("splits");
    let mut split_first = Vec::new();
    for id in 0..ACCOUNTS {
        let k = key(&c, id);
        let idx = stats.partition_point(|s| s.start.as_slice() <= k.as_slice()) - 1;
        if split_first.len() <= idx {
            split_first.resize(idx + 1, -1);
        }
        if split_first[idx] < 0 {
            split_first[idx] = id;
        }
    }
    split_first.retain(|id| *id >= 0);
    Setup {
        mgr,
        catalog: c,
        split_first,
    }
}

struct Result {
    commits: u64,
    seconds: f64,
    hist: Histogram<u64>,
}

/// Runs `clients` threads committing for `secs`; `pair(client, n)` gives the
/// two accounts each transaction writes.
fn run(
    s: &Setup,
    clients: usize,
    secs: f64,
    pair: impl Fn(usize, u64) -> (i64, i64) + Sync,
) -> Result {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let hists: Vec<Histogram<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|client| {
                let pair = &pair;
                scope.spawn(move || {
                    let mut h = Histogram::<u64>::new(3).expect("histogram");
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let (a, b) = pair(client, n);
                        let t0 = Instant::now();
                        let mut t = s.mgr.begin().expect("begin");
                        t.put(key(&s.catalog, a), n.to_be_bytes().to_vec());
                        t.put(key(&s.catalog, b), n.to_be_bytes().to_vec());
                        t.commit().expect("disjoint commits never conflict");
                        h.record(t0.elapsed().as_micros() as u64).ok();
                        n += 1;
                    }
                    h
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    for h in &hists {
        hist.add(h).ok();
    }
    Result {
        commits: hist.len(),
        seconds: start.elapsed().as_secs_f64(),
        hist,
    }
}

fn report(name: &str, r: &Result) -> f64 {
    let tps = r.commits as f64 / r.seconds;
    println!(
        "| {name:<34} | {tps:>10.0} | {:>9} | {:>9} |",
        r.hist.value_at_quantile(0.5),
        r.hist.value_at_quantile(0.99)
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
    println!("| workload                           | commits/s  | p50 (µs)  | p99 (µs)  |");
    println!("|------------------------------------|------------|-----------|-----------|");
    // Client c owns split c (for 8 clients, splits 0..8) and, for
    // cross-split pairs, split c + 8.
    let same = |c: usize, _n: u64| (s.split_first[c], s.split_first[c] + 1);
    let cross = |c: usize, _n: u64| (s.split_first[c], s.split_first[c + 8]);
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
    s.mgr.set_group_commit(true);
    let group = rows.iter().find(|r| r.0 == 8).map(|r| r.1).unwrap_or(0.0);
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
}
