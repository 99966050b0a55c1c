//! Row filters (crates/sql/src/row_filter.rs): a scan tests its simple
//! predicates on each stored row's bytes and decodes only the rows that
//! pass, until the filter proves not to pay. EXPLAIN names the tests; the
//! scan's output rows in EXPLAIN ANALYZE show which rows were decoded.
//! (The answers themselves are checked in sql-tests/row_filter.slt.)

use crate::common::{output_rows, rows};
use spindle::{Database, Session, Value};

fn db() -> Database {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE rf (k bigint NOT NULL, s varchar(20), n bigint, PRIMARY KEY (k))",
        &[],
    )
    .unwrap();
    db.execute(
        "INSERT INTO rf SELECT k, CASE WHEN k % 5 = 0 THEN 'BUILDING' ELSE 'AUTO' END, \
         CASE WHEN k % 7 = 0 THEN NULL ELSE k % 100 END FROM generate_series(1, 5000) AS t(k)",
        &[],
    )
    .unwrap();
    db
}

/// The `SpindleScan` line of EXPLAIN [ANALYZE] `sql`.
fn scan_line(s: &mut Session, sql: &str) -> String {
    let plan: Vec<String> = rows(s, sql)
        .into_iter()
        .flatten()
        .filter_map(|v| match v {
            Value::String(t) => Some(t),
            _ => None,
        })
        .collect();
    plan.iter()
        .flat_map(|p| p.lines())
        .find(|l| l.contains("SpindleScan: "))
        .unwrap_or_else(|| panic!("no scan in {plan:?}"))
        .to_string()
}

#[test]
fn explain_names_the_tests_and_only_passing_rows_are_decoded() {
    let db = db();
    let mut s = db.session();
    let q = "SELECT count(*), sum(k) FROM rf WHERE s = 'BUILDING' AND n < 50";
    let line = scan_line(&mut s, &format!("EXPLAIN {q}"));
    assert!(
        line.contains("row filter: s = 'BUILDING' AND n < 50"),
        "{line}"
    );
    // A key range is not tested again; a float comparison is not tested.
    let line = scan_line(
        &mut s,
        "EXPLAIN SELECT k FROM rf WHERE k > 10 AND CAST(n AS double precision) < 2.5",
    );
    assert!(!line.contains("row filter"), "{line}");
    // 5 000 rows, 1 000 BUILDING, of which n < 50 (not NULL): the scan
    // decodes just those (its first 1 024 rows keep 20%: it stays on).
    let want = (1..=5000)
        .filter(|k| k % 5 == 0 && k % 7 != 0 && k % 100 < 50)
        .count() as f64;
    let line = scan_line(&mut s, &format!("EXPLAIN ANALYZE {q}"));
    assert_eq!(output_rows(&line), want, "{line}");
    let sum: i64 = (1..=5000i64)
        .filter(|k| k % 5 == 0 && k % 7 != 0 && k % 100 < 50)
        .sum();
    assert_eq!(
        rows(&mut s, q),
        vec![vec![Value::Int64(want as i64), Value::Int64(sum)]]
    );
}

#[test]
fn a_filter_that_keeps_most_rows_stops_testing() {
    let db = db();
    let mut s = db.session();
    // n IS NOT NULL keeps 6 of 7 rows: after its first 1 024 rows (one per
    // thread of the split scan) the filter is off and the rest are all
    // decoded, so the scan outputs more rows than pass but not all.
    let pass = (1..=5000).filter(|k| k % 7 != 0).count() as f64;
    let line = scan_line(
        &mut s,
        "EXPLAIN ANALYZE SELECT count(*) FROM rf WHERE n IS NOT NULL",
    );
    let out = output_rows(&line);
    assert!(out > pass && out < 5000.0, "{out} rows of {pass}: {line}");
}
