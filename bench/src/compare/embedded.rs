//! Workload 3, in-process: Spindle's embedded API against SQLite (rusqlite,
//! WAL, `synchronous=FULL`), both on disk, both with prepared statements
//! (Spindle: one `Session` running `Session::prepare`'s handle of the
//! `$n`-parameter SQL), one thread.
//!
//! * point select by primary key;
//! * short range scan (10 consecutive keys);
//! * single-row insert, each its own durable transaction;
//! * bulk insert of N rows in one transaction (median of 5 runs, rows/s).
//!
//! The two systems take turns: each timed case runs in 3 alternating
//! rounds per system (`--seconds` in all for each), and the bulk runs
//! alternate one by one, so a machine that slows down during the run (a
//! shared VM) slows both sides of a ratio alike. (Before, all of
//! Spindle's cases ran first, then all of SQLite's, and a slow minute
//! could halve one side's figure.)

use std::path::Path;
use std::time::Instant;

use rusqlite::{params, Connection};
use spindle::{Database, Value};

use super::report::Record;
use super::util::{fail, measure_alternating, progress, Context, Figure, Kind, Result, Rng};

pub struct Sizes {
    pub rows: i64,
    pub bulk_rows: i64,
    pub seconds: f64,
}

/// Bulk-insert repetitions per system (alternating); the median is reported.
const BULK_RUNS: usize = 5;
/// Turns per system in the timed cases (see [`measure_alternating`]).
const ROUNDS: usize = 3;
/// Rows a range scan returns.
const RANGE: i64 = 10;

fn payload(i: i64) -> String {
    format!("{i:0>12}-{}", "p".repeat(36))
}

/// The keys point selects and range scans visit: the same sequence for
/// both systems.
fn key(rng: &mut Rng, rows: i64) -> i64 {
    rng.range(0, rows - RANGE)
}

struct Pair {
    point: Figure,
    range: Figure,
    insert: Figure,
    bulk: Figure,
}

/// Both systems' figures, each case measured in alternating turns
/// ([`measure_alternating`]; bulk runs alternate one by one), so a VM that
/// slows down mid-run slows both sides of a ratio alike.
fn run_both(dir: &Path, s: &Sizes) -> Result<(Pair, Pair)> {
    let db = Database::open(dir.join("spindle")).ctx("opening the Spindle database")?;
    let mut se = db.session();
    se.execute(
        "CREATE TABLE kv (id bigint NOT NULL, v bigint NOT NULL, s varchar(100), PRIMARY KEY (id))",
        &[],
    )
    .ctx("create kv")?;
    se.execute(
        "CREATE TABLE ins (id bigint NOT NULL, v bigint NOT NULL, s varchar(100), PRIMARY KEY (id))",
        &[],
    )
    .ctx("create ins")?;
    let mut start = 0;
    while start < s.rows {
        let end = (start + 1000).min(s.rows);
        let values: Vec<String> = (start..end)
            .map(|i| format!("({i}, {}, '{}')", i * 7, payload(i)))
            .collect();
        se.execute(&format!("INSERT INTO kv VALUES {}", values.join(", ")), &[])
            .ctx("load kv")?;
        start = end;
    }

    let c = Connection::open(dir.join("sqlite.db")).ctx("opening SQLite")?;
    let mode: String = c
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .ctx("WAL")?;
    if mode != "wal" {
        return fail(format!("SQLite journal_mode is {mode}, not wal"));
    }
    c.execute_batch(
        "PRAGMA synchronous=FULL;
         CREATE TABLE kv (id INTEGER NOT NULL PRIMARY KEY, v INTEGER NOT NULL, s TEXT);
         CREATE TABLE ins (id INTEGER NOT NULL PRIMARY KEY, v INTEGER NOT NULL, s TEXT);",
    )
    .ctx("SQLite schema")?;
    {
        c.execute_batch("BEGIN").ctx("begin")?;
        let mut st = c
            .prepare("INSERT INTO kv VALUES (?1, ?2, ?3)")
            .ctx("prepare")?;
        for i in 0..s.rows {
            st.execute(params![i, i * 7, payload(i)]).ctx("load")?;
        }
        c.execute_batch("COMMIT").ctx("commit")?;
    }

    progress("embedded: point selects (Spindle and SQLite in turns)");
    let (mut rng_a, mut rng_b) = (Rng::new(3), Rng::new(3));
    let get = se
        .prepare("SELECT v, s FROM kv WHERE id = $1")
        .ctx("prepare point select")?;
    let mut sq_get = c
        .prepare("SELECT v, s FROM kv WHERE id = ?1")
        .ctx("prepare")?;
    let (sp_point, sq_point) = measure_alternating(
        ROUNDS,
        s.seconds,
        10,
        |_| {
            let k = key(&mut rng_a, s.rows);
            let rows = se
                .query_prepared(&get, &[Value::Int64(k)])
                .ctx("point select")?;
            if rows.num_rows() != 1 {
                return fail(format!("point select {k}: {} rows", rows.num_rows()));
            }
            Ok(())
        },
        |_| {
            let k = key(&mut rng_b, s.rows);
            let mut rows = sq_get.query(params![k]).ctx("point select")?;
            let mut n = 0;
            while let Some(r) = rows.next().ctx("row")? {
                let _: i64 = r.get(0).ctx("v")?;
                let _: String = r.get(1).ctx("s")?;
                n += 1;
            }
            if n != 1 {
                return fail(format!("SQLite point select {k}: {n} rows"));
            }
            Ok(())
        },
    )?;

    progress("embedded: range scans (in turns)");
    let (mut rng_a, mut rng_b) = (Rng::new(4), Rng::new(4));
    let scan = se
        .prepare("SELECT id, v FROM kv WHERE id >= $1 AND id < $2")
        .ctx("prepare range scan")?;
    let mut sq_scan = c
        .prepare("SELECT id, v FROM kv WHERE id >= ?1 AND id < ?2")
        .ctx("prepare")?;
    let (sp_range, sq_range) = measure_alternating(
        ROUNDS,
        s.seconds,
        10,
        |_| {
            let k = key(&mut rng_a, s.rows);
            let rows = se
                .query_prepared(&scan, &[Value::Int64(k), Value::Int64(k + RANGE)])
                .ctx("range scan")?;
            if rows.num_rows() != RANGE as usize {
                return fail(format!("range scan {k}: {} rows", rows.num_rows()));
            }
            Ok(())
        },
        |_| {
            let k = key(&mut rng_b, s.rows);
            let mut rows = sq_scan.query(params![k, k + RANGE]).ctx("range")?;
            let mut n = 0;
            while let Some(r) = rows.next().ctx("row")? {
                let _: i64 = r.get(1).ctx("v")?;
                n += 1;
            }
            if n != RANGE {
                return fail(format!("SQLite range scan {k}: {n} rows"));
            }
            Ok(())
        },
    )?;

    progress("embedded: single-row inserts (in turns)");
    let put = se
        .prepare("INSERT INTO ins (id, v, s) VALUES ($1, $2, $3)")
        .ctx("prepare insert")?;
    let mut sq_put = c
        .prepare("INSERT INTO ins (id, v, s) VALUES (?1, ?2, ?3)")
        .ctx("prepare")?;
    let (sp_insert, sq_insert) = measure_alternating(
        ROUNDS,
        s.seconds,
        10,
        |i| {
            let i = i as i64;
            se.execute_prepared(
                &put,
                &[
                    Value::Int64(i),
                    Value::Int64(i * 7),
                    Value::String(payload(i)),
                ],
            )
            .ctx("insert")?;
            Ok(())
        },
        |i| {
            let i = i as i64;
            sq_put
                .execute(params![i, i * 7, payload(i)])
                .ctx("insert")?;
            Ok(())
        },
    )?;

    progress(format!(
        "embedded: bulk inserts of {} rows (in turns)",
        s.bulk_rows
    ));
    let (mut sp_times, mut sq_times) = (Vec::new(), Vec::new());
    for run in 0..BULK_RUNS {
        let table = format!("bulk{run}");
        se.execute(
            &format!("CREATE TABLE {table} (id bigint NOT NULL, v bigint NOT NULL, s varchar(100), PRIMARY KEY (id))"),
            &[],
        )
        .ctx("create bulk")?;
        let st = se
            .prepare(&format!(
                "INSERT INTO {table} (id, v, s) VALUES ($1, $2, $3)"
            ))
            .ctx("prepare bulk")?;
        let t = Instant::now();
        se.execute("BEGIN", &[]).ctx("begin")?;
        for i in 0..s.bulk_rows {
            se.execute_prepared(
                &st,
                &[
                    Value::Int64(i),
                    Value::Int64(i * 7),
                    Value::String(payload(i)),
                ],
            )
            .ctx("bulk insert")?;
        }
        se.execute("COMMIT", &[]).ctx("commit")?;
        sp_times.push(t.elapsed());

        c.execute_batch(&format!(
            "CREATE TABLE {table} (id INTEGER NOT NULL PRIMARY KEY, v INTEGER NOT NULL, s TEXT)"
        ))
        .ctx("create bulk")?;
        let mut st = c
            .prepare(&format!(
                "INSERT INTO {table} (id, v, s) VALUES (?1, ?2, ?3)"
            ))
            .ctx("prepare")?;
        let t = Instant::now();
        c.execute_batch("BEGIN").ctx("begin")?;
        for i in 0..s.bulk_rows {
            st.execute(params![i, i * 7, payload(i)]).ctx("bulk")?;
        }
        c.execute_batch("COMMIT").ctx("commit")?;
        sq_times.push(t.elapsed());
    }
    let n = se
        .query("SELECT count(*) FROM bulk0", &[])
        .ctx("count")?
        .rows()
        .ctx("rows")?
        .first()
        .map(|r| r.get::<i64>(0))
        .transpose()
        .ctx("count")?;
    if n != Some(s.bulk_rows) {
        return fail(format!("bulk insert: {n:?} rows, expected {}", s.bulk_rows));
    }
    let sq_n: i64 = c
        .query_row("SELECT count(*) FROM bulk0", [], |r| r.get(0))
        .ctx("SQLite count")?;
    if sq_n != s.bulk_rows {
        return fail(format!(
            "SQLite bulk insert: {sq_n} rows, expected {}",
            s.bulk_rows
        ));
    }
    Ok((
        Pair {
            point: sp_point,
            range: sp_range,
            insert: sp_insert,
            bulk: bulk_figure(&sp_times, s.bulk_rows),
        },
        Pair {
            point: sq_point,
            range: sq_range,
            insert: sq_insert,
            bulk: bulk_figure(&sq_times, s.bulk_rows),
        },
    ))
}

fn bulk_figure(times: &[std::time::Duration], rows: i64) -> Figure {
    let lat = Figure::from_latencies(times);
    Figure {
        value: rows as f64 / (lat.value / 1000.0),
        p50_us: None,
        p99_us: None,
        ops: rows as u64 * times.len() as u64,
        failures: None,
        retries: None,
    }
}

pub fn run(s: &Sizes, out: &mut Vec<Record>) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("compare-embedded")
        .tempdir()
        .ctx("temp dir")?;
    progress(format!("embedded: loading {} rows into each", s.rows));
    let (sp, sq) = run_both(dir.path(), s)?;
    let w = "3 embedded";
    let rec = |case: &str, unit, a: Figure, b: Figure, target, note: &str| Record {
        workload: w.into(),
        case: case.into(),
        kind: Kind::Throughput,
        unit,
        spindle_label: "Spindle embedded".into(),
        spindle: a,
        other_label: "SQLite".into(),
        other: b,
        target,
        note: note.into(),
    };
    let note = format!(
        "{} rows; one thread; prepared statements on both sides (Spindle \
         `Session::prepare` with `$n` parameters); SQLite WAL, synchronous=FULL (a disk flush \
         per commit); Spindle durable commits (acknowledged once the log is synced: \
         Store::flush_durable; a snapshot taken after waits until the B-tree apply is done, \
         which bench/examples/bulk.rs times as \"read after\")",
        s.rows
    );
    out.push(rec(
        "point select by PK",
        "ops/s",
        sp.point,
        sq.point,
        Some(0.5),
        &note,
    ));
    out.push(rec(
        "range scan, 10 rows",
        "ops/s",
        sp.range,
        sq.range,
        None,
        &note,
    ));
    out.push(rec(
        "single-row durable insert",
        "ops/s",
        sp.insert,
        sq.insert,
        None,
        &note,
    ));
    out.push(rec(
        &format!("bulk insert, {} rows in 1 txn", s.bulk_rows),
        "rows/s",
        sp.bulk,
        sq.bulk,
        Some(1.0),
        &note,
    ));
    Ok(())
}
