//! Short range scans or point selects through the embedded API, timed
//! (cases the embedded workload of `compare` measures against SQLite, for
//! profiling them alone): a table of N rows (default 10 000), then for
//! SECONDS (default 3) either a prepared `SELECT id, v FROM kv WHERE id >=
//! $1 AND id < $2` over 10 consecutive keys (MODE `range`, the default) or
//! `compare`'s point select `SELECT v, s FROM kv WHERE id = $1` (MODE
//! `point`), the keys from a fixed pseudo-random sequence.
//!
//! ```text
//! cargo build --release -p spindle-bench --example range && target/release/examples/range [N] [SECONDS] [range|point]
//! ```

use std::error::Error;
use std::time::{Duration, Instant};

use spindle::{Database, Value};

const RANGE: i64 = 10;

fn main() -> Result<(), Box<dyn Error>> {
    let n: i64 = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 10_000,
    };
    let seconds: f64 = match std::env::args().nth(2) {
        Some(s) => s.parse()?,
        None => 3.0,
    };
    let point = match std::env::args().nth(3).as_deref() {
        None | Some("range") => false,
        Some("point") => true,
        Some(other) => return Err(format!("mode {other:?}: expected range or point").into()),
    };
    let dir = tempfile::tempdir()?;
    let db = Database::open(dir.path().join("spindle"))?;
    let mut se = db.session();
    se.execute(
        "CREATE TABLE kv (id bigint NOT NULL, v bigint NOT NULL, s varchar(100), PRIMARY KEY (id))",
        &[],
    )?;
    let insert = se.prepare("INSERT INTO kv (id, v, s) VALUES ($1, $2, $3)")?;
    se.execute("BEGIN", &[])?;
    for i in 0..n {
        se.execute_prepared(
            &insert,
            &[
                Value::Int64(i),
                Value::Int64(i * 7),
                Value::String(format!("row {i}")),
            ],
        )?;
    }
    se.execute("COMMIT", &[])?;
    let scan = if point {
        se.prepare("SELECT v, s FROM kv WHERE id = $1")?
    } else {
        se.prepare("SELECT id, v FROM kv WHERE id >= $1 AND id < $2")?
    };
    let (want, what) = if point {
        (1, "point selects")
    } else {
        (RANGE as usize, "range scans")
    };
    // A fixed xorshift sequence of start keys.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % (n - RANGE).max(1) as u64) as i64
    };
    let t = Instant::now();
    let mut ops = 0u64;
    while t.elapsed() < Duration::from_secs_f64(seconds) {
        let k = next();
        let rows = if point {
            se.query_prepared(&scan, &[Value::Int64(k)])?
        } else {
            se.query_prepared(&scan, &[Value::Int64(k), Value::Int64(k + RANGE)])?
        };
        if rows.num_rows() != want {
            return Err(format!("{what} at {k}: {} rows", rows.num_rows()).into());
        }
        ops += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{ops} {what} in {secs:.2} s: {:.0} ops/s, {:.2} µs each",
        ops as f64 / secs,
        secs * 1e6 / ops as f64
    );
    Ok(())
}
