//! Output column names follow PostgreSQL: a column keeps its name, a
//! function call takes the function's name, anything else is `?column?`,
//! and names may repeat (`SELECT v, v`), which DataFusion alone refuses.

use spindle::{Database, Value};

fn names(db: &Database, sql: &str) -> Vec<String> {
    db.query(sql, &[])
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .column_names()
}

#[test]
fn names_repeat_as_in_postgres() {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE t (id INT64 NOT NULL, v INT64, info JSON) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    db.execute(
        "INSERT INTO t (id, v, info) VALUES (1, 10, '{\"a\": 1}'), (2, 20, NULL)",
        &[],
    )
    .unwrap();
    let cases: &[(&str, &[&str])] = &[
        // General path (a scan).
        ("SELECT v, v FROM t", &["v", "v"]),
        ("SELECT t.v, v, V FROM t", &["v", "v", "v"]),
        ("SELECT info::text, info FROM t", &["info", "info"]),
        (
            "SELECT v + 1, v + 1, 2 FROM t",
            &["?column?", "?column?", "?column?"],
        ),
        ("SELECT count(*), count(v) FROM t", &["count", "count"]),
        ("SELECT 1 AS a, 2 AS a", &["a", "a"]),
        ("SELECT v AS x, id AS x FROM t ORDER BY v", &["x", "x"]),
        (
            "SELECT v, v FROM t UNION ALL SELECT id, id FROM t",
            &["v", "v"],
        ),
        // Fast path (the full primary key).
        ("SELECT v, v FROM t WHERE id = 1", &["v", "v"]),
        ("SELECT id, v, id FROM t WHERE id = 1", &["id", "v", "id"]),
    ];
    for (sql, want) in cases {
        assert_eq!(names(&db, sql), *want, "{sql}");
    }
    // The values are right too, not only the names.
    let rows = db
        .query("SELECT v, v + 1, v FROM t ORDER BY id", &[])
        .unwrap()
        .rows()
        .unwrap();
    let got: Vec<Vec<Value>> = rows.iter().map(|r| r.values().to_vec()).collect();
    assert_eq!(
        got,
        vec![
            vec![Value::Int64(10), Value::Int64(11), Value::Int64(10)],
            vec![Value::Int64(20), Value::Int64(21), Value::Int64(20)],
        ]
    );
    // A derived table's repeated name is still ambiguous when referenced,
    // as in PostgreSQL.
    let err = db
        .query("SELECT v FROM (SELECT v, v FROM t) AS s", &[])
        .unwrap_err();
    assert_eq!(err.sqlstate(), "42702", "{err}");
}
