//! The embedded API's prepared statements: run many times, across
//! transactions and sessions, following schema changes, with the same
//! errors (and SQLSTATEs) as the statement's text.

use spindle::{Database, Value};

fn db() -> Database {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE t (id bigint NOT NULL, v text, PRIMARY KEY (id))",
        &[],
    )
    .unwrap();
    db
}

#[test]
fn a_prepared_statement_runs_many_times_in_any_session() {
    let db = db();
    let mut s = db.session();
    let insert = s.prepare("INSERT INTO t (id, v) VALUES ($1, $2)").unwrap();
    s.execute("BEGIN", &[]).unwrap();
    for i in 0..50 {
        let n = s
            .execute_prepared(&insert, &[Value::Int64(i), Value::String(format!("v{i}"))])
            .unwrap();
        assert_eq!(n, 1);
    }
    s.execute("COMMIT", &[]).unwrap();
    // Another session runs the same handle, in autocommit.
    let mut other = db.session();
    other
        .execute_prepared(&insert, &[Value::Int64(50), Value::Null])
        .unwrap();
    let get = other.prepare("SELECT v FROM t WHERE id = $1").unwrap();
    let rows = s.query_prepared(&get, &[Value::Int64(7)]).unwrap();
    assert_eq!(rows.rows().unwrap()[0].get::<String>(0).unwrap(), "v7");
    let count = s.prepare("SELECT count(*) FROM t").unwrap();
    let rows = s.query_prepared(&count, &[]).unwrap();
    assert_eq!(rows.rows().unwrap()[0].get::<i64>(0).unwrap(), 51);
    // A statement that returns no rows is not a query.
    assert!(s
        .query_prepared(&insert, &[Value::Int64(99), Value::Null])
        .is_err());
}

#[test]
fn a_prepared_statement_follows_schema_changes() {
    let db = db();
    let mut s = db.session();
    let insert = s.prepare("INSERT INTO t (id, v) VALUES ($1, $2)").unwrap();
    let all = s.prepare("SELECT * FROM t WHERE id = $1").unwrap();
    s.execute_prepared(&insert, &[Value::Int64(1), Value::String("a".into())])
        .unwrap();
    assert_eq!(
        s.query_prepared(&all, &[Value::Int64(1)])
            .unwrap()
            .column_names(),
        ["id", "v"]
    );
    s.execute("ALTER TABLE t ADD COLUMN w bigint", &[]).unwrap();
    s.execute_prepared(&insert, &[Value::Int64(2), Value::String("b".into())])
        .unwrap();
    let rows = s.query_prepared(&all, &[Value::Int64(2)]).unwrap();
    assert_eq!(rows.column_names(), ["id", "v", "w"]);
    assert_eq!(rows.rows().unwrap()[0].values()[2], Value::Null);
    // Gone: the same error as the text's.
    s.execute("DROP TABLE t", &[]).unwrap();
    let e = s
        .execute_prepared(&insert, &[Value::Int64(3), Value::Null])
        .unwrap_err();
    let text = s
        .execute(
            "INSERT INTO t (id, v) VALUES ($1, $2)",
            &[Value::Int64(3), Value::Null],
        )
        .unwrap_err();
    assert_eq!(e.sqlstate(), "42P01", "{e}");
    assert_eq!(e.sqlstate(), text.sqlstate());
}

#[test]
fn a_prepared_statement_reports_what_its_text_would() {
    let db = db();
    let mut s = db.session();
    let e = s.prepare("INSERT INTO t VALUES (").unwrap_err();
    assert_eq!(e.sqlstate(), "42601", "{e}");
    // Inside a transaction block the syntax error fails the block.
    s.execute("BEGIN", &[]).unwrap();
    assert!(s.prepare("SELEC 1").is_err());
    let e = s.execute("SELECT 1", &[]).unwrap_err();
    assert_eq!(e.sqlstate(), "25P02", "{e}");
    s.execute("ROLLBACK", &[]).unwrap();

    let insert = s.prepare("INSERT INTO t (id, v) VALUES ($1, $2)").unwrap();
    s.execute_prepared(&insert, &[Value::Int64(1), Value::Null])
        .unwrap();
    let dup = s
        .execute_prepared(&insert, &[Value::Int64(1), Value::Null])
        .unwrap_err();
    assert_eq!(dup.sqlstate(), "23505", "{dup}");
    // A missing parameter: nothing written, the text's error.
    let missing = s.execute_prepared(&insert, &[Value::Int64(2)]).unwrap_err();
    let text = s
        .execute("INSERT INTO t (id, v) VALUES ($1, $2)", &[Value::Int64(2)])
        .unwrap_err();
    assert_eq!(missing.sqlstate(), text.sqlstate(), "{missing} / {text}");
    let rows = s.query("SELECT count(*) FROM t", &[]).unwrap();
    assert_eq!(rows.rows().unwrap()[0].get::<i64>(0).unwrap(), 1);
}

/// `execute_prepared` returns the rows a statement affected (or returned)
/// whichever way it ran: the fast path (a write or read by primary key)
/// and the general one (a predicate on a non-key column, a full scan),
/// in autocommit and in a transaction block.
#[test]
fn execute_prepared_counts_rows_on_every_path() {
    let db = db();
    let mut s = db.session();
    let insert = s.prepare("INSERT INTO t (id, v) VALUES ($1, $2)").unwrap();
    for i in 0..6 {
        let v = if i % 2 == 0 {
            Value::Null
        } else {
            Value::String(format!("v{i}"))
        };
        assert_eq!(
            s.execute_prepared(&insert, &[Value::Int64(i), v]).unwrap(),
            1
        );
    }
    let by_key = s.prepare("UPDATE t SET v = $2 WHERE id = $1").unwrap();
    let by_value = s.prepare("UPDATE t SET v = 'x' WHERE v IS NULL").unwrap();
    let point = s.prepare("SELECT v FROM t WHERE id = $1").unwrap();
    let all = s.prepare("SELECT id FROM t WHERE id >= $1").unwrap();
    let delete = s.prepare("DELETE FROM t WHERE v = 'x'").unwrap();
    s.execute("BEGIN", &[]).unwrap();
    assert_eq!(
        s.execute_prepared(&by_key, &[Value::Int64(1), Value::Null])
            .unwrap(),
        1
    );
    assert_eq!(
        s.execute_prepared(&by_key, &[Value::Int64(99), Value::Null])
            .unwrap(),
        0
    );
    assert_eq!(s.execute_prepared(&by_value, &[]).unwrap(), 4);
    s.execute("COMMIT", &[]).unwrap();
    assert_eq!(s.execute_prepared(&point, &[Value::Int64(3)]).unwrap(), 1);
    assert_eq!(s.execute_prepared(&point, &[Value::Int64(99)]).unwrap(), 0);
    assert_eq!(s.execute_prepared(&all, &[Value::Int64(2)]).unwrap(), 4);
    assert_eq!(s.execute_prepared(&delete, &[]).unwrap(), 4);
    assert_eq!(s.execute_prepared(&all, &[Value::Int64(0)]).unwrap(), 2);
}

/// The tag of a statement that `execute_now` ran, or `None` when it left
/// the statement to the general path.
fn run_now(s: &mut spindle_sql::Session, sql: &str) -> Result<Option<String>, String> {
    match s.execute_now(sql, &[]) {
        Ok(Some(spindle_sql::Output::Command { tag, .. })) => Ok(Some(tag.to_string())),
        Ok(Some(spindle_sql::Output::Rows { .. })) => Ok(Some("rows".into())),
        Ok(None) => Ok(None),
        Err(e) => Err(e.sqlstate().to_string()),
    }
}

/// BEGIN, COMMIT and ROLLBACK have nothing to plan: the fast path runs
/// them (`execute_now` returns their output; the general path's future
/// is never built), with the general path's outcomes — a failed block's
/// COMMIT rolls back, BEGIN in a failed block is refused, a conflicting
/// COMMIT fails with 40001 and leaves no block open.
#[test]
fn transaction_control_runs_on_the_fast_path_with_the_general_paths_outcomes() {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE t (id bigint NOT NULL, v bigint, PRIMARY KEY (id))",
        &[],
    )
    .unwrap();
    let mut s = db.engine().session();
    let count = || {
        let rows = db.query("SELECT count(*) FROM t", &[]).unwrap();
        rows.rows().unwrap()[0].get::<i64>(0).unwrap()
    };

    assert_eq!(run_now(&mut s, "BEGIN").unwrap().as_deref(), Some("BEGIN"));
    assert_eq!(
        run_now(&mut s, "INSERT INTO t VALUES (1, 1)")
            .unwrap()
            .as_deref(),
        Some("INSERT 0 1")
    );
    assert_eq!(run_now(&mut s, "END").unwrap().as_deref(), Some("COMMIT"));
    assert_eq!(count(), 1);

    // A failed block: BEGIN refused (25P02), COMMIT rolls back.
    assert_eq!(run_now(&mut s, "BEGIN").unwrap().as_deref(), Some("BEGIN"));
    run_now(&mut s, "INSERT INTO t VALUES (2, 2)").unwrap();
    assert_eq!(
        run_now(&mut s, "INSERT INTO t VALUES (1, 1)").unwrap_err(),
        "23505"
    );
    assert_eq!(run_now(&mut s, "BEGIN").unwrap_err(), "25P02");
    assert_eq!(
        run_now(&mut s, "COMMIT").unwrap().as_deref(),
        Some("ROLLBACK")
    );
    assert_eq!(count(), 1);

    // ROLLBACK drops the block's writes.
    run_now(&mut s, "BEGIN").unwrap();
    run_now(&mut s, "INSERT INTO t VALUES (3, 3)").unwrap();
    assert_eq!(
        run_now(&mut s, "ROLLBACK").unwrap().as_deref(),
        Some("ROLLBACK")
    );
    assert_eq!(count(), 1);

    // A conflicting COMMIT: 40001, and the block is gone.
    let mut other = db.engine().session();
    run_now(&mut s, "BEGIN").unwrap();
    assert_eq!(
        run_now(&mut s, "SELECT v FROM t WHERE id = 1")
            .unwrap()
            .as_deref(),
        Some("rows")
    );
    run_now(&mut s, "INSERT INTO t VALUES (4, 4)").unwrap();
    assert_eq!(
        run_now(&mut other, "UPDATE t SET v = 10 WHERE id = 1")
            .unwrap()
            .as_deref(),
        Some("UPDATE 1")
    );
    assert_eq!(run_now(&mut s, "COMMIT").unwrap_err(), "40001");
    assert_eq!(
        run_now(&mut s, "COMMIT").unwrap().as_deref(),
        Some("COMMIT")
    );
    assert_eq!(count(), 1);
}
