//! Join keys as scan ranges (crates/sql/src/join_keys.rs): when a hash
//! join's probe side is a scan whose leading key column is the join key,
//! the scan reads only the build side's keys, seeking between them. The
//! answers must be those of a full scan — for separate, interleaved and
//! descending keys, string keys, the transaction's own writes, and a kept
//! plan run again after its build side changed — and the scan must read
//! only the matching rows.

use crate::common::{output_rows, rows};
use spindle::{Database, Session, Value};

const ORDERS: i64 = 1000;
const LINES: i64 = 3;

fn db() -> Database {
    let db = Database::open_in_memory().unwrap();
    for ddl in [
        "CREATE TABLE ord (oid INT64 NOT NULL, seg STRING(MAX)) PRIMARY KEY (oid)",
        "CREATE TABLE line (oid INT64 NOT NULL, n INT64 NOT NULL, v INT64) PRIMARY KEY (oid, n)",
        "CREATE TABLE cline (oid INT64 NOT NULL, n INT64 NOT NULL, v INT64) PRIMARY KEY (oid, n), \
         INTERLEAVE IN PARENT ord ON DELETE CASCADE",
        "CREATE TABLE dline (oid INT64 NOT NULL, n INT64 NOT NULL, v INT64) PRIMARY KEY (oid DESC, n)",
        "CREATE TABLE segs (name STRING(MAX) NOT NULL, weight INT64) PRIMARY KEY (name)",
    ] {
        db.execute(ddl, &[]).unwrap();
    }
    let mut s = db.session();
    s.run("BEGIN").unwrap();
    for o in 0..ORDERS {
        s.execute(
            "INSERT INTO ord (oid, seg) VALUES ($1, $2)",
            &[Value::Int64(o), Value::String(seg_of(o).into())],
        )
        .unwrap();
        for n in 0..LINES {
            for t in ["line", "cline", "dline"] {
                s.execute(
                    &format!("INSERT INTO {t} (oid, n, v) VALUES ($1, $2, $3)"),
                    &[Value::Int64(o), Value::Int64(n), Value::Int64(o * 10 + n)],
                )
                .unwrap();
            }
        }
    }
    for (i, name) in ["a", "b", "c", "d", "e", "f"].iter().enumerate() {
        s.execute(
            "INSERT INTO segs (name, weight) VALUES ($1, $2)",
            &[Value::String((*name).into()), Value::Int64(i as i64 + 1)],
        )
        .unwrap();
    }
    s.run("COMMIT").unwrap();
    db
}

fn seg_of(o: i64) -> &'static str {
    // Segment b is every 7th order: its keys are spread over the table.
    if o % 7 == 3 {
        "b"
    } else {
        ["a", "c", "d"][(o % 3) as usize]
    }
}

fn text(s: &mut Session, sql: &str) -> String {
    rows(s, sql)
        .into_iter()
        .flatten()
        .map(|v| match v {
            Value::String(t) => t,
            other => format!("{other:?}"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The probe query on `table`: count and sum of the lines of segment `seg`'s orders.
fn probe(table: &str, seg: &str) -> String {
    format!(
        "SELECT count(*), sum(l.v) FROM ord o JOIN {table} l ON l.oid = o.oid WHERE o.seg = '{seg}'"
    )
}

/// What `probe` must answer, from the generator (`extra`: lines added to
/// the orders of the segment beyond the generated ones: (count, sum)).
fn expected(seg: &str, extra: (i64, i64)) -> Vec<Vec<Value>> {
    let orders: Vec<i64> = (0..ORDERS).filter(|o| seg_of(*o) == seg).collect();
    let count = orders.len() as i64 * LINES + extra.0;
    let sum: i64 = orders
        .iter()
        .map(|o| (0..LINES).map(|n| o * 10 + n).sum::<i64>())
        .sum::<i64>()
        + extra.1;
    vec![vec![Value::Int64(count), Value::Int64(sum)]]
}

/// The rows the scan of `table` produced in `EXPLAIN ANALYZE` of `sql`
/// (DataFusion shows counts of thousands as `2.57 K`: three digits).
fn scan_rows(s: &mut Session, sql: &str, table: &str) -> f64 {
    let plan = text(s, &format!("EXPLAIN ANALYZE {sql}"));
    let line = plan
        .lines()
        .find(|l| l.contains(&format!("SpindleScan: table={table} ")))
        .unwrap_or_else(|| panic!("no scan of {table} in\n{plan}"));
    assert!(
        line.contains("join keys=oid") || line.contains("join keys=name"),
        "the scan of {table} does not take the join's keys:\n{plan}"
    );
    output_rows(line)
}

/// `got` is `want` to DataFusion's three digits.
fn about(got: f64, want: u64) -> bool {
    (got - want as f64).abs() <= want as f64 * 0.005
}

#[test]
fn a_probe_scan_reads_only_the_build_sides_keys() {
    let db = db();
    let mut s = db.session();
    let b_orders = (0..ORDERS).filter(|o| seg_of(*o) == "b").count() as u64;
    for table in ["line", "cline", "dline"] {
        let sql = probe(table, "b");
        assert_eq!(rows(&mut s, &sql), expected("b", (0, 0)), "{table}");
        // Only segment b's lines come out of the scan (a full scan: 3 000).
        let read = scan_rows(&mut s, &sql, table);
        assert!(about(read, b_orders * LINES as u64), "{table}: {read}");
        // Most orders: more rows than the scan's first batch, so a helper
        // thread reads the far half of the keys.
        let most = sql.replace("o.seg = 'b'", "o.seg <> 'b'");
        let all = expected("a", (0, 0))[0]
            .iter()
            .zip(&expected("c", (0, 0))[0])
            .zip(&expected("d", (0, 0))[0])
            .map(|((a, c), d)| match (a, c, d) {
                (Value::Int64(a), Value::Int64(c), Value::Int64(d)) => Value::Int64(a + c + d),
                other => panic!("{other:?}"),
            })
            .collect::<Vec<_>>();
        assert_eq!(rows(&mut s, &most), vec![all], "{table}");
        let read = scan_rows(&mut s, &most, table);
        assert!(
            about(read, (ORDERS as u64 - b_orders) * LINES as u64),
            "{table}: {read}"
        );
        // A segment with no orders: nothing is read, nothing is found.
        let none = probe(table, "zzz");
        assert_eq!(
            rows(&mut s, &none),
            vec![vec![Value::Int64(0), Value::Null]],
            "{table}"
        );
    }
}

/// A join on two keys publishes `struct(oid, n) IN (…)`: the scan reads
/// the build side's `oid` values (before: the whole table).
#[test]
fn a_join_on_two_keys_reads_its_leading_keys_values() {
    let db = db();
    let mut s = db.session();
    let b_orders = (0..ORDERS).filter(|o| seg_of(*o) == "b").count() as u64;
    for table in ["line", "cline", "dline"] {
        let sql = format!(
            "SELECT count(*), sum(l.v) FROM (SELECT oid, 1 AS n FROM ord WHERE seg = 'b') o \
             JOIN {table} l ON l.oid = o.oid AND l.n = o.n"
        );
        let sum: i64 = (0..ORDERS)
            .filter(|o| seg_of(*o) == "b")
            .map(|o| o * 10 + 1)
            .sum();
        assert_eq!(
            rows(&mut s, &sql),
            vec![vec![Value::Int64(b_orders as i64), Value::Int64(sum)]],
            "{table}"
        );
        let read = scan_rows(&mut s, &sql, table);
        assert!(about(read, b_orders * LINES as u64), "{table}: {read}");
    }
}

#[test]
fn string_keys_and_duplicate_build_keys() {
    let db = db();
    let mut s = db.session();
    // Build side: orders (many per segment name); probe: segs by its key.
    let sql = "SELECT g.name, count(*), sum(g.weight) FROM ord o JOIN segs g ON g.name = o.seg \
               WHERE o.oid < 10 GROUP BY g.name ORDER BY g.name";
    let mut want: Vec<(String, i64, i64)> = Vec::new();
    for o in 0..10 {
        let name = seg_of(o);
        let weight = "abcdef".find(name).unwrap() as i64 + 1;
        match want.iter_mut().find(|w| w.0 == name) {
            Some(w) => {
                w.1 += 1;
                w.2 += weight;
            }
            None => want.push((name.to_string(), 1, weight)),
        }
    }
    want.sort();
    let want: Vec<Vec<Value>> = want
        .into_iter()
        .map(|(n, c, w)| vec![Value::String(n), Value::Int64(c), Value::Int64(w)])
        .collect();
    assert_eq!(rows(&mut s, sql), want);
    assert!(about(scan_rows(&mut s, sql, "segs"), want.len() as u64));
}

#[test]
fn own_writes_and_kept_plans_see_this_runs_keys() {
    let db = db();
    let mut s = db.session();
    let sql = probe("line", "b");
    // A kept plan, by its text or as its normalized form's template
    // (`o.seg = 'b'` is a filter with a parameter in a slot).
    let kept = || db.engine().cached_plan_count() + db.engine().template_plan_count();
    let by_keys = || db.engine().join_key_scan_count();
    assert_eq!(rows(&mut s, &sql), expected("b", (0, 0)));
    let (before, scans) = (kept(), by_keys());
    assert_eq!(rows(&mut s, &sql), expected("b", (0, 0)));
    assert_eq!(kept(), before + 1, "the second run uses the kept plan");
    assert_eq!(
        by_keys(),
        scans + 1,
        "the kept plan's scan reads by the join's keys"
    );
    // More keys (857) than DataFusion's default IN-list cap (150): a plan
    // whose scan takes a join's keys keeps the engine's cap, in its first
    // run and as a kept plan (`session::lowers_inlist_cap`); with the
    // default cap the join would hand over its hash table, naming no keys.
    let most = sql.replace("o.seg = 'b'", "o.seg <> 'b'");
    for run in ["first", "kept"] {
        let scans = by_keys();
        assert_eq!(rows(&mut s, &most).len(), 1);
        assert_eq!(by_keys(), scans + 1, "{run} run of the 857-key join");
    }
    // The build side changes: the kept plan's next run must read the new
    // keys, not the ones its filter held last time.
    db.execute("UPDATE ord SET seg = 'b' WHERE oid = 0", &[])
        .unwrap();
    let o0 = (LINES, (0..LINES).sum::<i64>());
    assert_eq!(rows(&mut s, &sql), expected("b", o0));
    // Uncommitted lines of the transaction, on a key of the build side and
    // on one outside it.
    s.run("BEGIN").unwrap();
    s.execute(
        "INSERT INTO line (oid, n, v) VALUES (3, 99, 1000), (4, 99, 5000)",
        &[],
    )
    .unwrap();
    assert_eq!(rows(&mut s, &sql), expected("b", (o0.0 + 1, o0.1 + 1000)));
    s.run("ROLLBACK").unwrap();
    assert_eq!(rows(&mut s, &sql), expected("b", o0));
}
