//! The commit benchmark's workload (used by `commit-bench` and `compare`):
//! an on-disk store of 4096 accounts over at least 16 splits, and clients
//! that each commit transactions writing two of their own accounts, in one
//! split or across two (two-phase commit). No transaction conflicts with
//! another, so every commit must succeed.
//!
//! A benchmark harness, not part of the database: any failure (opening the
//! store, a commit) aborts the run with a message (`expect`), since a
//! measurement after a failure would be meaningless.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use spindle_catalog::{Catalog, ColumnDef, KeyColumn, TableDef};
use spindle_keys::{DataType, Direction, Value};
use spindle_storage::Store;
use spindle_txn::TxnManager;

pub const ACCOUNTS: i64 = 4096;

pub struct Setup {
    pub mgr: Arc<TxnManager>,
    pub catalog: Catalog,
    /// Account ids at the start of each split, to pick same- or cross-split pairs.
    pub split_first: Vec<i64>,
}

pub fn key(c: &Catalog, id: i64) -> Vec<u8> {
    // The schema below has one INT64 key column, so encoding cannot fail.
    c.encode_key("accounts", &[Value::Int64(id)])
        .unwrap_or_default()
}

pub fn setup(dir: &std::path::Path) -> Setup {
    let mgr = TxnManager::new(Store::open(dir).expect("open store")).expect("open database");
    // The accounts take about 320 KiB of keys and values. Split
    // maintenance runs in the background, so a split may take several
    // loads before it is cut, and a cut leaves pieces anywhere from half
    // the threshold to just below it: at 16 KiB that is at least 20
    // splits however the cuts fall (at 32 KiB it could be as few as 10).
    mgr.set_split_threshold(16 * 1024);
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

pub struct Result {
    pub commits: u64,
    pub seconds: f64,
    /// Durable flushes the transaction layer made during the run.
    pub flushes: u64,
    pub hist: Histogram<u64>,
}

/// Runs `clients` threads committing for `secs`; `pair(client, n)` gives the
/// two accounts each transaction writes.
pub fn run(
    s: &Setup,
    clients: usize,
    secs: f64,
    pair: impl Fn(usize, u64) -> (i64, i64) + Sync,
) -> Result {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let flushes_before = s.mgr.flush_count();
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
        flushes: s.mgr.flush_count() - flushes_before,
        hist,
    }
}

impl Result {
    /// Commits per second.
    pub fn rate(&self) -> f64 {
        self.commits as f64 / self.seconds
    }
}

impl Setup {
    /// Transactions writing two accounts of split `c` (one atomic batch).
    pub fn same_split(&self, c: usize) -> (i64, i64) {
        (self.split_first[c], self.split_first[c] + 1)
    }

    /// Transactions writing accounts of splits `c` and `c + 8` (two-phase commit).
    pub fn cross_split(&self, c: usize) -> (i64, i64) {
        (self.split_first[c], self.split_first[c + 8])
    }
}
