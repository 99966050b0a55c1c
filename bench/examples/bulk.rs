//! Bulk insert timed in two parts: the statements and the COMMIT (the
//! figures bench/README.md's bulk-insert section quotes). One `Session`
//! runs a prepared `INSERT … VALUES ($1, $2, $3)` N times (default 100 000) inside
//! `BEGIN … COMMIT`, RUNS times (default 3), into new tables of a temporary database
//! (with `index` as the second argument, each table has a secondary index on `v`),
//! then times a point read right after each COMMIT ("read after": the
//! commit is acknowledged once its log record is durable, and the read's
//! snapshot waits until the data file has it):
//!
//! ```text
//! cargo build --release -p spindle-bench --example bulk && target/release/examples/bulk 100000 [index|-] [RUNS]
//! ```

use std::error::Error;
use std::time::Instant;

use spindle::{Database, Value};

fn main() -> Result<(), Box<dyn Error>> {
    let n: i64 = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 100_000,
    };
    let index = std::env::args().nth(2).as_deref() == Some("index");
    let runs: usize = match std::env::args().nth(3) {
        Some(s) => s.parse()?,
        None => 3,
    };
    let dir = tempfile::tempdir()?;
    let db = Database::open(dir.path().join("spindle"))?;
    let mut se = db.session();
    for run in 0..runs {
        se.execute(
            &format!("CREATE TABLE b{run} (id bigint NOT NULL, v bigint NOT NULL, s varchar(100), PRIMARY KEY (id))"),
            &[],
        )?;
        if index {
            se.execute(&format!("CREATE INDEX b{run}_v ON b{run} (v)"), &[])?;
        }
        let insert = se.prepare(&format!(
            "INSERT INTO b{run} (id, v, s) VALUES ($1, $2, $3)"
        ))?;
        let cpu0 = thread_cpu_ns();
        let t = Instant::now();
        se.execute("BEGIN", &[])?;
        for i in 0..n {
            let payload = format!("{i:0>12}-{}", "p".repeat(36));
            se.execute_prepared(
                &insert,
                &[Value::Int64(i), Value::Int64(i * 7), Value::String(payload)],
            )?;
        }
        let statements = t.elapsed();
        let statements_cpu = thread_cpu_ns().zip(cpu0).map(|(b, a)| b.saturating_sub(a));
        se.execute("COMMIT", &[])?;
        let total = t.elapsed();
        // A read right after: its snapshot waits until the data file has
        // the commit (the COMMIT returned once the log was durable).
        se.query(&format!("SELECT v FROM b{run} WHERE id = 0"), &[])?;
        let readable = t.elapsed();
        println!(
            "run {run}: statements {statements:?} ({:.0} ns/row, on CPU {}), commit {:?}, {:.0} rows/s, read after {:?}",
            statements.as_nanos() as f64 / n as f64,
            statements_cpu.map_or("?".to_string(), |c| format!("{:.0} ns/row", c as f64 / n as f64)),
            total - statements,
            n as f64 / total.as_secs_f64(),
            readable - total
        );
    }
    Ok(())
}

/// This thread's time on a CPU so far, in nanoseconds (Linux's
/// `/proc/thread-self/schedstat`, first field); `None` elsewhere.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
