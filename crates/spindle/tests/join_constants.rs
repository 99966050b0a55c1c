//! Constants through inner joins (crates/sql/src/join_constants.rs): a row
//! tree read with one statement joining its three tables, the root's key
//! fixed in the WHERE, reads only that tree's rows from every table — in
//! the interleaved layout and in the non-interleaved one (through its
//! indexes) — and answers what the generator put there, with literals and
//! with parameters, and where the rule must not apply (outer joins, other
//! types) the answers stay right.

use crate::common::{metric, rows};
use spindle::{Database, Session, Value};

const CUSTOMERS: i64 = 200;
const ORDERS: i64 = 4;
const LINES: i64 = 3;

fn db() -> Database {
    let db = Database::open_in_memory().unwrap();
    for ddl in [
        "CREATE TABLE il_c (c_id INT64 NOT NULL, name STRING(MAX)) PRIMARY KEY (c_id)",
        "CREATE TABLE il_o (c_id INT64 NOT NULL, o_id INT64 NOT NULL, amount INT64) \
         PRIMARY KEY (c_id, o_id), INTERLEAVE IN PARENT il_c ON DELETE CASCADE",
        "CREATE TABLE il_l (c_id INT64 NOT NULL, o_id INT64 NOT NULL, l_id INT64 NOT NULL, \
         qty INT64) PRIMARY KEY (c_id, o_id, l_id), INTERLEAVE IN PARENT il_o ON DELETE CASCADE",
        "CREATE TABLE ni_c (c_id INT64 NOT NULL, name STRING(MAX)) PRIMARY KEY (c_id)",
        "CREATE TABLE ni_o (c_id INT64 NOT NULL, o_id INT64 NOT NULL, amount INT64) PRIMARY KEY (o_id)",
        "CREATE INDEX ni_o_c ON ni_o (c_id)",
        "CREATE TABLE ni_l (c_id INT64 NOT NULL, o_id INT64 NOT NULL, l_id INT64 NOT NULL, \
         qty INT64) PRIMARY KEY (l_id)",
        "CREATE INDEX ni_l_c ON ni_l (c_id)",
    ] {
        db.execute(ddl, &[]).unwrap();
    }
    let mut s = db.session();
    s.run("BEGIN").unwrap();
    for c in 1..=CUSTOMERS {
        for p in ["il", "ni"] {
            s.execute(
                &format!("INSERT INTO {p}_c (c_id, name) VALUES ($1, $2)"),
                &[Value::Int64(c), Value::String(format!("C{c}"))],
            )
            .unwrap();
        }
        for j in 0..ORDERS {
            let o = c * ORDERS + j;
            for p in ["il", "ni"] {
                s.execute(
                    &format!("INSERT INTO {p}_o (c_id, o_id, amount) VALUES ($1, $2, $3)"),
                    &[Value::Int64(c), Value::Int64(o), Value::Int64(o * 7 % 100)],
                )
                .unwrap();
            }
            for k in 0..LINES {
                for p in ["il", "ni"] {
                    s.execute(
                        &format!(
                            "INSERT INTO {p}_l (c_id, o_id, l_id, qty) VALUES ($1, $2, $3, $4)"
                        ),
                        &[
                            Value::Int64(c),
                            Value::Int64(o),
                            Value::Int64(o * LINES + k),
                            Value::Int64(k + 1),
                        ],
                    )
                    .unwrap();
                }
            }
        }
    }
    s.run("COMMIT").unwrap();
    db
}

/// The row tree of customer `c` as the join below answers it, in key order.
fn tree(c: i64) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    for j in 0..ORDERS {
        let o = c * ORDERS + j;
        for k in 0..LINES {
            out.push(vec![
                Value::String(format!("C{c}")),
                Value::Int64(o),
                Value::Int64(o * 7 % 100),
                Value::Int64(o * LINES + k),
                Value::Int64(k + 1),
            ]);
        }
    }
    out
}

fn join(p: &str, root: &str) -> String {
    format!(
        "SELECT c.name, o.o_id, o.amount, l.l_id, l.qty FROM {p}_c c \
         JOIN {p}_o o ON o.c_id = c.c_id \
         JOIN {p}_l l ON l.c_id = o.c_id AND l.o_id = o.o_id \
         WHERE c.c_id = {root} ORDER BY l.l_id"
    )
}

/// `entries_read` of the scan of `table` in `EXPLAIN ANALYZE` of `sql`.
fn read_of(s: &mut Session, sql: &str, table: &str) -> f64 {
    let plan = rows(s, &format!("EXPLAIN ANALYZE {sql}"))
        .into_iter()
        .flatten()
        .map(|v| match v {
            Value::String(t) => t,
            other => format!("{other:?}"),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let line = plan
        .lines()
        .find(|l| l.contains(&format!("SpindleScan: table={table} ")))
        .unwrap_or_else(|| panic!("no scan of {table} in\n{plan}"));
    metric(line, "entries_read")
}

#[test]
fn a_row_tree_join_reads_only_its_tree() {
    let db = db();
    let mut s = db.session();
    for p in ["il", "ni"] {
        for c in [1, 77, CUSTOMERS] {
            let sql = join(p, &c.to_string());
            assert_eq!(rows(&mut s, &sql), tree(c), "{p} {c}");
            // The lines table is read for this customer only (before the
            // rule: every line of every customer). Interleaved: the tree's
            // range, its own rows and the version entries of its parents'
            // rows met on the way (a few more than its lines); not
            // interleaved: the index's entries.
            let read = read_of(&mut s, &sql, &format!("{p}_l"));
            let lines = (ORDERS * LINES) as f64;
            assert!(read >= lines && read <= 2.0 * lines, "{p} {c}: {read}");
        }
        // No such customer: nothing.
        assert!(rows(&mut s, &join(p, "0")).is_empty());
    }
}

#[test]
fn parameters_run_each_value() {
    let db = db();
    let mut s = db.session();
    for p in ["il", "ni"] {
        let sql = join(p, "$1");
        for c in [3, 150, 3, 0, 42] {
            let got: Vec<Vec<Value>> = s
                .query(&sql, &[Value::Int64(c)])
                .unwrap()
                .rows()
                .unwrap()
                .iter()
                .map(|r| r.values().to_vec())
                .collect();
            let want = if c == 0 { Vec::new() } else { tree(c) };
            assert_eq!(got, want, "{p} {c}");
        }
        let got = s.query(&sql, &[Value::Null]).unwrap().rows().unwrap().len();
        assert_eq!(got, 0, "{p}: a NULL key joins nothing");
    }
}

#[test]
fn the_constant_reaches_through_aliases_and_subqueries() {
    let db = db();
    let mut s = db.session();
    for p in ["il", "ni"] {
        // The constant comes from a subquery's projection under another name.
        let sql = format!(
            "SELECT t.n, count(*), sum(l.qty) FROM \
             (SELECT c_id AS id, name AS n FROM {p}_c WHERE c_id = 9) t \
             JOIN {p}_l l ON l.c_id = t.id GROUP BY t.n"
        );
        assert_eq!(
            rows(&mut s, &sql),
            vec![vec![
                Value::String("C9".into()),
                Value::Int64(ORDERS * LINES),
                Value::Int64(ORDERS * (1..=LINES).sum::<i64>()),
            ]],
            "{p}"
        );
        assert!(read_of(&mut s, &sql, &format!("{p}_l")) <= 2.0 * (ORDERS * LINES) as f64);
        // The constant on the inner side of a LEFT JOIN is not the outer
        // side's: all customers stay, only customer 9 has lines.
        let sql = format!(
            "SELECT count(*), count(l.l_id) FROM {p}_c c LEFT JOIN \
             (SELECT * FROM {p}_l WHERE c_id = 9) l ON l.c_id = c.c_id"
        );
        assert_eq!(
            rows(&mut s, &sql),
            vec![vec![
                Value::Int64(CUSTOMERS - 1 + ORDERS * LINES),
                Value::Int64(ORDERS * LINES),
            ]],
            "{p}"
        );
    }
}

#[test]
fn other_types_and_conditions_keep_their_answers() {
    let db = db();
    let mut s = db.session();
    // Floating-point join keys: -0 = 0 holds in the join and in a filter;
    // the rule leaves them alone, and the answer counts both zeros.
    s.run("CREATE TABLE fa (k FLOAT64 NOT NULL, v INT64) PRIMARY KEY (k)")
        .unwrap();
    s.run("CREATE TABLE fb (k FLOAT64 NOT NULL, w INT64) PRIMARY KEY (k)")
        .unwrap();
    s.run("INSERT INTO fa (k, v) VALUES (0.0, 1), (1.0, 2)")
        .unwrap();
    s.run("INSERT INTO fb (k, w) VALUES (-0.0, 10), (1.0, 20)")
        .unwrap();
    assert_eq!(
        rows(
            &mut s,
            "SELECT a.v, b.w FROM fa a JOIN fb b ON b.k = a.k WHERE a.k = 0.0"
        ),
        vec![vec![Value::Int64(1), Value::Int64(10)]]
    );
    // A join of a key to a non-key column of another type: no inference,
    // the same answer.
    assert_eq!(
        rows(
            &mut s,
            "SELECT count(*) FROM il_c c JOIN il_o o ON o.amount = c.c_id WHERE c.c_id = 14"
        ),
        rows(&mut s, "SELECT count(*) FROM il_o WHERE amount = 14")
    );
    // A non-constant condition on the root does not spread.
    let sql = "SELECT count(*) FROM il_c c JOIN il_l l ON l.c_id = c.c_id WHERE c.c_id < 3";
    assert_eq!(
        rows(&mut s, sql),
        vec![vec![Value::Int64(2 * ORDERS * LINES)]]
    );
}
