//! Kept DataFusion plans (crates/sql/src/query_cache.rs): a query sent
//! again runs the plan made the first time, re-bound to its own
//! transaction. Each run must read that transaction's data (committed
//! rows, its own writes, its snapshot), a schema change must re-plan, a
//! plan that depends on more than its text and catalog must not be kept,
//! and reads through a kept plan must count for serializability.

use crate::common::rows;
use spindle::{Database, Value};

fn db() -> Database {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE c (id INT64 NOT NULL, seg STRING(MAX)) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    db.execute(
        "CREATE TABLE o (oid INT64 NOT NULL, cid INT64, amount INT64) PRIMARY KEY (oid)",
        &[],
    )
    .unwrap();
    db.execute("INSERT INTO c VALUES (1, 'a'), (2, 'b'), (3, 'a')", &[])
        .unwrap();
    db.execute(
        "INSERT INTO o VALUES (10, 1, 5), (11, 1, 7), (12, 2, 100), (13, 3, 1)",
        &[],
    )
    .unwrap();
    db
}

/// A hash join, an aggregate and a sort: every stateful operator a kept
/// plan must reset.
const JOIN: &str = "SELECT c.seg, sum(o.amount) AS total, count(*) AS n \
    FROM c JOIN o ON c.id = o.cid GROUP BY c.seg ORDER BY c.seg";

fn seg(name: &str, total: i64, n: i64) -> Vec<Value> {
    vec![
        Value::String(name.into()),
        Value::Int64(total),
        Value::Int64(n),
    ]
}

#[test]
fn a_kept_plan_reads_each_runs_data() {
    let db = db();
    let kept = || db.engine().cached_plan_count();
    let mut s = db.session();
    let before = kept();
    assert_eq!(rows(&mut s, JOIN), vec![seg("a", 13, 3), seg("b", 100, 1)]);
    assert_eq!(kept(), before, "the first run plans");
    assert_eq!(rows(&mut s, JOIN), vec![seg("a", 13, 3), seg("b", 100, 1)]);
    assert_eq!(kept(), before + 1, "the second run uses the kept plan");
    // Committed changes between runs (a new build-side row, a new probe row).
    db.execute("INSERT INTO c VALUES (4, 'b')", &[]).unwrap();
    db.execute("INSERT INTO o VALUES (14, 4, 1000), (15, 3, 2)", &[])
        .unwrap();
    assert_eq!(rows(&mut s, JOIN), vec![seg("a", 15, 4), seg("b", 1100, 2)]);
    // The transaction's own uncommitted writes, and its snapshot.
    s.run("BEGIN").unwrap();
    s.execute("DELETE FROM o WHERE oid = 12", &[]).unwrap();
    assert_eq!(rows(&mut s, JOIN), vec![seg("a", 15, 4), seg("b", 1000, 1)]);
    db.execute("INSERT INTO o VALUES (16, 1, 50)", &[]).unwrap();
    assert_eq!(rows(&mut s, JOIN), vec![seg("a", 15, 4), seg("b", 1000, 1)]);
    s.run("ROLLBACK").unwrap();
    assert_eq!(rows(&mut s, JOIN), vec![seg("a", 65, 5), seg("b", 1100, 2)]);
    // Another session runs the same kept plan with its own view.
    let mut t = db.session();
    assert_eq!(rows(&mut t, JOIN), vec![seg("a", 65, 5), seg("b", 1100, 2)]);
    assert!(kept() >= before + 5);
}

#[test]
fn a_schema_change_plans_again() {
    let db = db();
    let mut s = db.session();
    let q = "SELECT * FROM c ORDER BY id";
    assert_eq!(rows(&mut s, q)[0].len(), 2);
    assert_eq!(rows(&mut s, q)[0].len(), 2);
    db.execute("ALTER TABLE c ADD COLUMN extra INT64", &[])
        .unwrap();
    let before = db.engine().cached_plan_count();
    let r = rows(&mut s, q);
    assert_eq!(db.engine().cached_plan_count(), before, "planned again");
    assert_eq!(
        r[0],
        vec![Value::Int64(1), Value::String("a".into()), Value::Null]
    );
    // Dropped and created again with other columns and rows.
    db.execute("DROP TABLE o", &[]).unwrap();
    db.execute(
        "CREATE TABLE o (oid INT64 NOT NULL, cid INT64, amount INT64) PRIMARY KEY (oid)",
        &[],
    )
    .unwrap();
    db.execute("INSERT INTO o VALUES (1, 2, 3)", &[]).unwrap();
    assert_eq!(rows(&mut s, JOIN), vec![seg("b", 3, 1)]);
    assert_eq!(rows(&mut s, JOIN), vec![seg("b", 3, 1)]);
}

#[test]
fn plans_that_depend_on_more_than_the_text_are_not_kept() {
    let db = db();
    let mut s = db.session();
    for q in [
        // Folded to the planning instant.
        "SELECT count(*) FROM c WHERE now() > TIMESTAMP '2000-01-01T00:00:00Z'",
        // Volatile.
        "SELECT count(*) FROM c WHERE random() < 2.0",
        // Materialized when planned.
        "SELECT count(*) FROM information_schema.tables",
        // A correlated subquery DataFusion cannot decorrelate (a volatile
        // UDF that runs it per row, in the transaction it was planned in).
        "SELECT id, (SELECT count(*) FROM o AS x WHERE x.amount > c.id) FROM c ORDER BY id",
    ] {
        let before = db.engine().cached_plan_count();
        let first = rows(&mut s, q);
        let second = rows(&mut s, q);
        assert_eq!(first, second, "{q}");
        assert_eq!(db.engine().cached_plan_count(), before, "kept: {q}");
    }
    // A view of the catalog sees a table created between two runs.
    let q = "SELECT count(*) FROM information_schema.tables WHERE table_name = 'fresh'";
    assert_eq!(rows(&mut s, q), vec![vec![Value::Int64(0)]]);
    db.execute("CREATE TABLE fresh (k INT64 NOT NULL) PRIMARY KEY (k)", &[])
        .unwrap();
    assert_eq!(rows(&mut s, q), vec![vec![Value::Int64(1)]]);
}

#[test]
fn reads_through_a_kept_plan_are_checked_at_commit() {
    let db = db();
    let q = "SELECT sum(amount) FROM o WHERE oid BETWEEN 10 AND 100";
    // Planned and kept by another session first.
    assert_eq!(rows(&mut db.session(), q), vec![vec![Value::Int64(113)]]);
    // Kept by its text or, its values being inline, as the template of
    // its parameterized form (crates/sql/src/params.rs).
    let kept = || db.engine().cached_plan_count() + db.engine().template_plan_count();
    let before = kept();
    let mut a = db.session();
    a.run("BEGIN").unwrap();
    assert_eq!(rows(&mut a, q), vec![vec![Value::Int64(113)]]);
    assert_eq!(kept(), before + 1);
    // A row appears in the range a read; a then writes what it computed.
    db.execute("INSERT INTO o VALUES (50, 2, 5)", &[]).unwrap();
    a.execute("INSERT INTO c VALUES (9, 'total')", &[]).unwrap();
    let err = a.run("COMMIT").err().map(|e| e.sqlstate().to_string());
    assert_eq!(err.as_deref(), Some("40001"));
}

#[test]
fn a_kept_index_scan_fetches_rows_of_each_run() {
    let db = db();
    db.execute("CREATE INDEX o_by_cid ON o (cid)", &[]).unwrap();
    let q = "SELECT oid, amount FROM o WHERE cid = 1 ORDER BY oid";
    let mut s = db.session();
    let plan = rows(&mut s, &format!("EXPLAIN {q}"));
    assert!(
        format!("{plan:?}").contains("then base rows by key"),
        "{plan:?}"
    );
    let pair = |a: i64, b: i64| vec![Value::Int64(a), Value::Int64(b)];
    assert_eq!(rows(&mut s, q), vec![pair(10, 5), pair(11, 7)]);
    // Kept by its text or as its parameterized form's template.
    let kept = || db.engine().cached_plan_count() + db.engine().template_plan_count();
    let before = kept();
    db.execute("UPDATE o SET amount = 70 WHERE oid = 11", &[])
        .unwrap();
    db.execute("INSERT INTO o VALUES (17, 1, 9)", &[]).unwrap();
    assert_eq!(
        rows(&mut s, q),
        vec![pair(10, 5), pair(11, 70), pair(17, 9)]
    );
    s.run("BEGIN").unwrap();
    s.execute("UPDATE o SET amount = 1 WHERE oid = 10", &[])
        .unwrap();
    assert_eq!(
        rows(&mut s, q),
        vec![pair(10, 1), pair(11, 70), pair(17, 9)]
    );
    s.run("ROLLBACK").unwrap();
    assert_eq!(
        rows(&mut s, q),
        vec![pair(10, 5), pair(11, 70), pair(17, 9)]
    );
    assert_eq!(kept(), before + 3);
}

/// The count and sum of `big` as one session driven from a single-threaded
/// runtime (a server connection's thread) sees them.
fn count_sum(rt: &tokio::runtime::Runtime, s: &mut spindle::Session) -> (i64, i64) {
    let out = rt
        .block_on(s.execute_async("SELECT count(*), sum(x) FROM big", &[]))
        .unwrap();
    let [spindle::Output::Rows(rows)] = out.as_slice() else {
        panic!("not one result: {out:?}");
    };
    let rows = rows.rows().unwrap();
    let v = rows[0].values();
    match (&v[0], &v[1]) {
        (Value::Int64(n), Value::Int64(sum)) => (*n, *sum),
        other => panic!("unexpected {other:?}"),
    }
}

/// A session on a single-threaded runtime hands DataFusion plans to the
/// engine's executor (as the server's connections do), except a kept plan
/// whose last run read little, which runs on the session's thread. The
/// choice follows the data: a table that grows past the budget sends its
/// plan back to the executor after one run (that run, in place, reads a
/// scan split in two halves on the one thread).
#[test]
fn a_kept_plan_that_read_little_runs_on_the_sessions_thread() {
    let db = db_with_big("SELECT n, n % 7 FROM generate_series(1, 100) AS n");
    let executor = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    db.engine().set_executor(executor.handle().clone());
    let conn = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let inline = || db.engine().inline_plan_count();
    let mut s = db.session();
    let small: i64 = (1..=100).map(|n| n % 7).sum();
    assert_eq!(count_sum(&conn, &mut s), (100, small));
    assert_eq!(inline(), 0, "the planning run goes to the executor");
    assert_eq!(count_sum(&conn, &mut s), (100, small));
    assert_eq!(inline(), 1, "100 rows read last time: in place");
    // 20 000 rows: the next run still runs in place (its last run read
    // 100), reading a scan split in two (after 1 024 rows) on one thread.
    db.execute(
        "INSERT INTO big SELECT n, n % 7 FROM generate_series(101, 20000) AS n",
        &[],
    )
    .unwrap();
    let large: i64 = (1..=20_000).map(|n| n % 7).sum();
    assert_eq!(count_sum(&conn, &mut s), (20_000, large));
    assert_eq!(inline(), 2);
    for _ in 0..2 {
        assert_eq!(count_sum(&conn, &mut s), (20_000, large));
        assert_eq!(inline(), 2, "20 000 rows read: back to the executor");
    }
    // Another session's run of the same plan sees the same record.
    let mut t = db.session();
    assert_eq!(count_sum(&conn, &mut t), (20_000, large));
    assert_eq!(inline(), 2);
    // Without an executor nothing is handed anywhere, and nothing counted.
    let plain = db_with_big("VALUES (1, 5)");
    let mut p = plain.session();
    assert_eq!(count_sum(&conn, &mut p), (1, 5));
    assert_eq!(count_sum(&conn, &mut p), (1, 5));
    assert_eq!(plain.engine().inline_plan_count(), 0);
}

/// A database with table `big (id, x)` holding `rows` (a query or VALUES).
fn db_with_big(rows: &str) -> Database {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE big (id INT64 NOT NULL, x INT64) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    db.execute(&format!("INSERT INTO big {rows}"), &[]).unwrap();
    db
}
