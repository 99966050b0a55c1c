//! Secondary index benchmark, through the embedded SQL API on an on-disk
//! database:
//!
//! 1. point lookup by an indexed non-key column vs the same lookup as a
//!    full scan (`FORCE_INDEX=_BASE_TABLE`);
//! 2. covering lookup (the index STORES the column read) vs non-covering
//!    (each entry's base row fetched by key);
//! 3. durable single-row inserts into a table with 0, 1 and 3 indexes.
//!
//! Every figure is a ratio against a baseline measured in the same run.
//! A benchmark harness, not part of the database: any failure aborts the
//! run with a message (`expect`), which is what a measurement wants.
//!
//! ```text
//! cargo run --release -p spindle-bench --bin index-bench -- [--rows 20000] [--seconds 3] [--dir DIR]
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use spindle::{Database, Value};

#[derive(Parser)]
struct Args {
    /// Rows in the lookup table.
    #[arg(long, default_value_t = 20_000)]
    rows: i64,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Directory for the database (default: a temporary directory).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

struct Measured {
    name: String,
    ops: u64,
    secs: f64,
    hist: Histogram<u64>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }
}

/// Runs `op` repeatedly for `seconds` (at least 3 times).
fn measure(name: &str, seconds: f64, mut op: impl FnMut(u64)) -> Measured {
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let start = Instant::now();
    let mut i = 0u64;
    while i < 3 || start.elapsed() < Duration::from_secs_f64(seconds) {
        let t = Instant::now();
        op(i);
        hist.record(t.elapsed().as_micros() as u64).expect("record");
        i += 1;
    }
    Measured {
        name: name.to_string(),
        ops: i,
        secs: start.elapsed().as_secs_f64(),
        hist,
    }
}

/// A scrambled, collision-free non-key value for row `i`.
fn k_of(i: i64, rows: i64) -> i64 {
    (i * 7919) % rows
}

fn main() {
    let args = Args::parse();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().join("db"));
    let db = Database::open(&dir).expect("open database");
    let n = args.rows;
    for sql in [
        "CREATE TABLE items (id INT64 NOT NULL, k INT64, w INT64, v STRING(MAX)) PRIMARY KEY (id)",
        "CREATE INDEX items_by_k ON items (k) STORING (w)",
    ] {
        db.execute(sql, &[]).expect("schema");
    }
    let load = Instant::now();
    let mut start = 0;
    while start < n {
        let end = (start + 500).min(n);
        let values: Vec<String> = (start..end)
            .map(|i| format!("({i}, {}, {}, '{}')", k_of(i, n), i * 3, "v".repeat(80)))
            .collect();
        db.execute(
            &format!("INSERT INTO items VALUES {}", values.join(", ")),
            &[],
        )
        .expect("load");
        start = end;
    }
    println!("loaded {n} rows in {:.1} s", load.elapsed().as_secs_f64());

    let lookup = |sql: &str| {
        let sql = sql.to_string();
        let db = &db;
        move |i: u64| {
            let k = k_of((i as i64 * 104_729) % n, n);
            let rows = db.query(&sql, &[Value::Int64(k)]).expect("query");
            assert_eq!(rows.num_rows(), 1, "{sql} k={k}");
        }
    };
    let results = [
        measure(
            "lookup by k, index (non-covering)",
            args.seconds,
            lookup("SELECT v FROM items WHERE k = $1"),
        ),
        measure(
            "lookup by k, full scan",
            args.seconds,
            lookup("SELECT v FROM items@{FORCE_INDEX=_BASE_TABLE} WHERE k = $1"),
        ),
        measure(
            "lookup by k, index (covering)",
            args.seconds,
            lookup("SELECT w FROM items WHERE k = $1"),
        ),
    ];

    // Write cost: durable single-row inserts with 0, 1 and 3 indexes.
    let mut writes = Vec::new();
    for (t, indexes) in [("w0", 0), ("w1", 1), ("w3", 3)] {
        db.execute(
            &format!("CREATE TABLE {t} (id INT64 NOT NULL, a INT64, b INT64, c STRING(MAX)) PRIMARY KEY (id)"),
            &[],
        )
        .expect("schema");
        let defs = [
            format!("CREATE INDEX {t}_a ON {t} (a)"),
            format!("CREATE INDEX {t}_b ON {t} (b) STORING (a)"),
            format!("CREATE INDEX {t}_c ON {t} (c)"),
        ];
        for d in defs.iter().take(indexes) {
            db.execute(d, &[]).expect("index");
        }
        let sql = format!("INSERT INTO {t} VALUES ($1, $2, $3, $4)");
        writes.push(measure(
            &format!("insert, {indexes} index(es)"),
            args.seconds,
            |i| {
                let id = (i as i64).wrapping_mul(2_654_435_761) % 1_000_000_007;
                db.execute(
                    &sql,
                    &[
                        Value::Int64(id),
                        Value::Int64(id % 1000),
                        Value::Int64(id / 7),
                        Value::String(format!("c{id}")),
                    ],
                )
                .expect("insert");
            },
        ));
    }

    println!();
    println!("| workload                              | ops/s    | p50 (µs) | p99 (µs) |");
    println!("|---------------------------------------|----------|----------|----------|");
    for m in results.iter().chain(&writes) {
        println!(
            "| {:<37} | {:>8.0} | {:>8} | {:>8} |",
            m.name,
            m.rate(),
            m.hist.value_at_quantile(0.5),
            m.hist.value_at_quantile(0.99)
        );
    }
    println!();
    println!(
        "index lookup / full scan ({n} rows): {:.1}x",
        results[0].rate() / results[1].rate()
    );
    println!(
        "covering / non-covering index lookup: {:.2}x",
        results[2].rate() / results[0].rate()
    );
    println!(
        "insert throughput with 1 index / none: {:.2}; with 3 indexes / none: {:.2}",
        writes[1].rate() / writes[0].rate(),
        writes[2].rate() / writes[0].rate()
    );
}
