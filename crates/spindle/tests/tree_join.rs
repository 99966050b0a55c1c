//! The fast path for joins whose tables are all read by fixed key prefixes
//! (crates/sql/src/tree_join.rs) must answer exactly what DataFusion
//! answers: each query runs as written (the fast path) and with `AND TRUE`
//! added to its WHERE (which it does not match), on random trees with
//! orphans (`INTERLEAVE IN`, no parent rule: a tree's G rows whose K row is
//! missing join nothing), sibling tables in the same row trees, descending
//! and string keys, a chain of tables that are not interleaved but keyed
//! the same way, and tables keyed by their own ids with secondary indexes
//! (plain, covering, NULL_FILTERED) on the columns joined. A row tree read
//! down a chain of interleaved tables gives the rows in the same order;
//! other shapes the same rows (SQL promises no order). Shapes it must not
//! take still answer (or fail) as the general path does.

use proptest::prelude::*;
use spindle::{Database, Session, Value};

const SCHEMA: &[&str] = &[
    "CREATE TABLE P (a INT64 NOT NULL, b STRING(MAX) NOT NULL, v INT64) PRIMARY KEY (a, b DESC)",
    // Co-located only: a K row may have no P row, a G row no K row (a
    // tree's G rows need not all join).
    "CREATE TABLE K (a INT64 NOT NULL, b STRING(MAX) NOT NULL, k INT64 NOT NULL, x INT64) \
     PRIMARY KEY (a, b DESC, k), INTERLEAVE IN P",
    // G's own key column may be NULL (no ON compares it).
    "CREATE TABLE G (a INT64 NOT NULL, b STRING(MAX) NOT NULL, k INT64 NOT NULL, g INT64, \
     y STRING(MAX)) PRIMARY KEY (a, b DESC, k, g), INTERLEAVE IN K",
    // A sibling of K in P's row trees.
    "CREATE TABLE Sib (a INT64 NOT NULL, b STRING(MAX) NOT NULL, s INT64 NOT NULL) \
     PRIMARY KEY (a, b DESC, s), INTERLEAVE IN PARENT P ON DELETE CASCADE",
    // Not interleaved, keyed as a chain.
    "CREATE TABLE Q (a INT64 NOT NULL, w STRING(MAX)) PRIMARY KEY (a)",
    "CREATE TABLE R (a INT64 NOT NULL, n INT64 NOT NULL, z INT64) PRIMARY KEY (a, n)",
    // Keyed by their own ids, joined through indexes.
    "CREATE TABLE NC (c INT64 NOT NULL, name STRING(MAX)) PRIMARY KEY (c)",
    "CREATE TABLE NO (o INT64 NOT NULL, c INT64, st STRING(MAX)) PRIMARY KEY (o)",
    "CREATE INDEX NO_c ON NO (c)",
    "CREATE TABLE NL (l INT64 NOT NULL, o INT64, c INT64, q INT64) PRIMARY KEY (l)",
    "CREATE INDEX NL_c ON NL (c) STORING (q)",
    "CREATE NULL_FILTERED INDEX NL_o ON NL (o)",
];

/// The queries the fast path takes; `$1` is P's / Q's `a`, `$2` P's `b`.
const QUERIES: &[&str] = &[
    "SELECT p.v, k.k, k.x, g.g, g.y FROM P p JOIN K k ON k.a = p.a AND k.b = p.b \
     JOIN G g ON g.a = k.a AND g.b = k.b AND g.k = k.k WHERE p.a = $1 AND p.b = $2",
    // Bare names one table has, an alias, the ON written the other way
    // round, INNER JOIN, an unaliased table.
    "SELECT v AS value, x, p.b FROM P p INNER JOIN K ON p.b = K.b AND K.a = p.a \
     WHERE p.b = $2 AND p.a = $1",
    // A child without its parent's rows in the output; the same column twice.
    "SELECT g.y, g.g AS first, g.g AS again FROM K k JOIN G g ON (g.k = k.k AND g.b = k.b) \
     AND g.a = k.a WHERE k.a = $1 AND k.b = $2 AND k.k = 1",
    "SELECT q.w, r.n, r.z FROM Q q JOIN R r ON r.a = q.a WHERE q.a = $1",
    // ORDER BY a unique key of the answer (NULLs in g sort last, or first),
    // with and without LIMIT; an output alias; a column not in the output.
    "SELECT k.k, g.g, g.y FROM P p JOIN K k ON k.a = p.a AND k.b = p.b \
     JOIN G g ON g.a = k.a AND g.b = k.b AND g.k = k.k WHERE p.a = $1 AND p.b = $2 \
     ORDER BY k.k DESC, g.g",
    "SELECT k.k AS kk, g.g FROM P p JOIN K k ON k.a = p.a AND k.b = p.b \
     JOIN G g ON g.a = k.a AND g.b = k.b AND g.k = k.k WHERE p.a = $1 AND p.b = $2 \
     ORDER BY g.g DESC NULLS LAST, kk LIMIT 3",
    "SELECT g.y FROM P p JOIN K k ON k.a = p.a AND k.b = p.b \
     JOIN G g ON g.a = k.a AND g.b = k.b AND g.k = k.k WHERE p.a = $1 AND p.b = $2 \
     ORDER BY g.g NULLS FIRST, k.k DESC LIMIT 2",
    "SELECT nl.l, no.o, nl.q FROM NC nc JOIN NO no ON no.c = nc.c \
     JOIN NL nl ON nl.c = no.c AND nl.o = no.o WHERE nc.c = $1 ORDER BY l DESC LIMIT 2",
    "SELECT nl.l, no.st FROM NL nl JOIN NO no ON no.o = nl.o WHERE nl.c = $1 ORDER BY nl.l",
];

/// Queries the fast path takes whose rows may come in another order than
/// the general path's: compared as sorted rows.
const UNORDERED: &[&str] = &[
    // Each table through an index on the customer's id.
    "SELECT nc.name, no.o, nl.l, nl.q FROM NC nc JOIN NO no ON no.c = nc.c \
     JOIN NL nl ON nl.c = no.c AND nl.o = no.o WHERE nc.c = $1",
    // An order by its key, its lines through the NULL_FILTERED index.
    "SELECT no.st, nl.l, nl.c FROM NO no JOIN NL nl ON nl.o = no.o WHERE no.o = $1",
    // A condition no read applies (st), an ON naming two earlier tables.
    "SELECT no.o, nl.l FROM NC nc JOIN NO no ON no.c = nc.c \
     JOIN NL nl ON nl.o = no.o AND nl.c = nc.c WHERE nc.c = $1 AND no.st = 'x'",
    // Many rows joining many: orders of the same customer, pairwise.
    "SELECT a.o AS left_o, b.o AS right_o FROM NO a JOIN NO b ON b.c = a.c WHERE a.c = $1",
    // Read from the index alone (it stores q).
    "SELECT nl.q FROM NC nc JOIN NL nl ON nl.c = nc.c WHERE nc.c = $1",
    // Keys that do not extend: R's rows of P's a, whatever P's b.
    "SELECT p.v, r.n FROM P p JOIN R r ON r.a = p.a WHERE p.a = $1 AND p.b = $2",
    // The ON misses a key column: each K row of a joins every P row of a.
    "SELECT p.b AS pb, k.b AS kb, k.k FROM P p JOIN K k ON k.a = p.a WHERE p.a = $1 AND p.b = $2",
    // The values on the child's key, the parent joined second.
    "SELECT p.v, k.x FROM K k JOIN P p ON p.a = k.a AND p.b = k.b WHERE k.a = $1 AND k.b = $2",
    // An order and its customer, read by the order's customer id (FROM
    // order first, then joined the other way round).
    "SELECT no.st, nc.name FROM NO no JOIN NC nc ON nc.c = no.c WHERE no.o = $1",
    "SELECT nc.name, no.st FROM NC nc JOIN NO no ON no.c = nc.c WHERE no.o = $1",
    // A customer's lines, each with its order (one read per distinct order).
    "SELECT nl.l, no.st FROM NL nl JOIN NO no ON no.o = nl.o WHERE nl.c = $1",
    // A line, its order, the order's customer.
    "SELECT nl.q, no.st, nc.name FROM NL nl JOIN NO no ON no.o = nl.o \
     JOIN NC nc ON nc.c = no.c WHERE nl.l = $1",
    // A prefix of the root's key only; the same value named twice.
    "SELECT p.b, k.k, g.g FROM P p JOIN K k ON k.a = p.a AND k.b = p.b \
     JOIN G g ON g.a = k.a AND g.b = k.b AND g.k = k.k WHERE p.a = $1 AND g.a = $1",
];

fn db() -> Database {
    let db = Database::open_in_memory().unwrap();
    for s in SCHEMA {
        db.execute(s, &[]).unwrap();
    }
    db
}

fn rows(
    s: &mut Session,
    sql: &str,
    params: &[Value],
) -> Result<(Vec<String>, Vec<Vec<Value>>), String> {
    match s.query(sql, params) {
        Ok(r) => {
            let names = r
                .schema
                .fields()
                .iter()
                .map(|f| format!("{} {} {}", f.name(), f.data_type(), f.is_nullable()))
                .collect();
            let rows = r
                .rows()
                .unwrap()
                .iter()
                .map(|r| r.values().to_vec())
                .collect();
            Ok((names, rows))
        }
        Err(e) => Err(e.sqlstate().to_string()),
    }
}

#[derive(Debug, Clone)]
enum Op {
    P(i64, &'static str, Option<i64>),
    K(i64, &'static str, i64, Option<i64>),
    G(i64, &'static str, i64, Option<i64>, Option<&'static str>),
    Sib(i64, &'static str, i64),
    DeleteP(i64, &'static str),
    DeleteK(i64, &'static str, i64),
    Q(i64, Option<&'static str>),
    R(i64, i64, Option<i64>),
    Nc(i64, Option<&'static str>),
    No(i64, Option<i64>, Option<&'static str>),
    Nl(i64, Option<i64>, Option<i64>, Option<i64>),
    DeleteNo(i64),
}

fn a() -> impl Strategy<Value = i64> {
    0i64..4
}

fn b() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "x", "y", "x\0z"])
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (a(), b(), prop::option::of(-5i64..5)).prop_map(|(a, b, v)| Op::P(a, b, v)),
        3 => (a(), b(), 0i64..3, prop::option::of(-5i64..5)).prop_map(|(a, b, k, x)| Op::K(a, b, k, x)),
        4 => (
            a(),
            b(),
            0i64..3,
            prop::option::of(0i64..3),
            prop::option::of(prop::sample::select(vec!["p", "q"]))
        )
            .prop_map(|(a, b, k, g, y)| Op::G(a, b, k, g, y)),
        1 => (a(), b(), 0i64..2).prop_map(|(a, b, s)| Op::Sib(a, b, s)),
        1 => (a(), b()).prop_map(|(a, b)| Op::DeleteP(a, b)),
        1 => (a(), b(), 0i64..3).prop_map(|(a, b, k)| Op::DeleteK(a, b, k)),
        1 => (a(), prop::option::of(prop::sample::select(vec!["w", "ww"])))
            .prop_map(|(a, w)| Op::Q(a, w)),
        1 => (a(), 0i64..3, prop::option::of(-5i64..5)).prop_map(|(a, n, z)| Op::R(a, n, z)),
        1 => (a(), prop::option::of(prop::sample::select(vec!["n", "m"])))
            .prop_map(|(c, n)| Op::Nc(c, n)),
        // Orders and lines often enough for their joins to find rows.
        2 => (
            0i64..4,
            prop::option::of(a()),
            prop::option::of(prop::sample::select(vec!["x", "y"]))
        )
            .prop_map(|(o, c, st)| Op::No(o, c, st)),
        3 => (
            0i64..10,
            prop::option::of(0i64..4),
            prop::option::of(a()),
            prop::option::of(-5i64..5)
        )
            .prop_map(|(l, o, c, q)| Op::Nl(l, o, c, q)),
        1 => (0i64..4).prop_map(Op::DeleteNo),
    ]
}

fn int(v: Option<i64>) -> Value {
    v.map_or(Value::Null, Value::Int64)
}

fn text(v: Option<&str>) -> Value {
    v.map_or(Value::Null, |s| Value::String(s.into()))
}

/// The write of `op` (an INSERT OR UPDATE or a DELETE), with its values.
fn write(op: &Op) -> (&'static str, Vec<Value>) {
    let s = |b: &str| Value::String(b.into());
    match op {
        Op::P(a, b, v) => (
            "INSERT OR UPDATE INTO P (a, b, v) VALUES ($1, $2, $3)",
            vec![Value::Int64(*a), s(b), int(*v)],
        ),
        Op::K(a, b, k, x) => (
            "INSERT OR UPDATE INTO K (a, b, k, x) VALUES ($1, $2, $3, $4)",
            vec![Value::Int64(*a), s(b), Value::Int64(*k), int(*x)],
        ),
        Op::G(a, b, k, g, y) => (
            "INSERT OR UPDATE INTO G (a, b, k, g, y) VALUES ($1, $2, $3, $4, $5)",
            vec![Value::Int64(*a), s(b), Value::Int64(*k), int(*g), text(*y)],
        ),
        Op::Sib(a, b, x) => (
            "INSERT OR UPDATE INTO Sib (a, b, s) VALUES ($1, $2, $3)",
            vec![Value::Int64(*a), s(b), Value::Int64(*x)],
        ),
        Op::DeleteP(a, b) => (
            "DELETE FROM P WHERE a = $1 AND b = $2",
            vec![Value::Int64(*a), s(b)],
        ),
        Op::DeleteK(a, b, k) => (
            "DELETE FROM K WHERE a = $1 AND b = $2 AND k = $3",
            vec![Value::Int64(*a), s(b), Value::Int64(*k)],
        ),
        Op::Q(a, w) => (
            "INSERT OR UPDATE INTO Q (a, w) VALUES ($1, $2)",
            vec![Value::Int64(*a), text(*w)],
        ),
        Op::R(a, n, z) => (
            "INSERT OR UPDATE INTO R (a, n, z) VALUES ($1, $2, $3)",
            vec![Value::Int64(*a), Value::Int64(*n), int(*z)],
        ),
        Op::Nc(c, n) => (
            "INSERT OR UPDATE INTO NC (c, name) VALUES ($1, $2)",
            vec![Value::Int64(*c), text(*n)],
        ),
        Op::No(o, c, st) => (
            "INSERT OR UPDATE INTO NO (o, c, st) VALUES ($1, $2, $3)",
            vec![Value::Int64(*o), int(*c), text(*st)],
        ),
        Op::Nl(l, o, c, q) => (
            "INSERT OR UPDATE INTO NL (l, o, c, q) VALUES ($1, $2, $3, $4)",
            vec![Value::Int64(*l), int(*o), int(*c), int(*q)],
        ),
        Op::DeleteNo(o) => ("DELETE FROM NO WHERE o = $1", vec![Value::Int64(*o)]),
    }
}

/// Every query at every key, fast and general, with the same answers and
/// the fast path taken for each.
fn compare_all(db: &Database, s: &mut Session) -> Result<(), TestCaseError> {
    let sorted = |r: Result<(Vec<String>, Vec<Vec<Value>>), String>| {
        r.map(|(names, mut rows)| {
            rows.sort();
            (names, rows)
        })
    };
    for (sql, ordered) in QUERIES
        .iter()
        .map(|q| (q, true))
        .chain(UNORDERED.iter().map(|q| (q, false)))
    {
        for a in 0..4 {
            for b in ["", "x", "y", "x\0z"] {
                let params = if sql.contains("$2") {
                    vec![Value::Int64(a), Value::String(b.into())]
                } else {
                    vec![Value::Int64(a)]
                };
                let before = db.engine().fast_path_count();
                let fast = rows(s, sql, &params);
                prop_assert_eq!(
                    db.engine().fast_path_count(),
                    before + 1,
                    "not fast: {}",
                    sql
                );
                // `AND TRUE` ends the WHERE, before any ORDER BY or LIMIT.
                let end = sql
                    .find(" ORDER BY")
                    .or_else(|| sql.find(" LIMIT"))
                    .unwrap_or(sql.len());
                let general = rows(
                    s,
                    &format!("{} AND TRUE{}", &sql[..end], &sql[end..]),
                    &params,
                );
                if ordered {
                    prop_assert_eq!(&fast, &general, "{} {:?}", sql, params);
                } else {
                    prop_assert_eq!(sorted(fast), sorted(general), "{} {:?}", sql, params);
                }
                if !sql.contains("$2") {
                    break;
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn tree_joins_equal_the_general_path(ops in prop::collection::vec(op(), 1..300)) {
        let db = db();
        let mut s = db.session();
        for op in &ops {
            let (sql, params) = write(op);
            // A Sib row without its P row is refused (INTERLEAVE IN PARENT).
            let _ = s.execute(sql, &params);
        }
        compare_all(&db, &mut s)?;
        // Inside a transaction, after writes of its own.
        s.run("BEGIN").unwrap();
        // (A refused write would end the transaction: no rows that need a
        // parent here.)
        for op in ops.iter().rev().filter(|o| !matches!(o, Op::Sib(..))).take(5) {
            let (sql, params) = write(op);
            s.execute(sql, &params).unwrap();
        }
        s.execute("DELETE FROM K WHERE a = 1 AND b = 'x' AND k = 0", &[]).unwrap();
        compare_all(&db, &mut s)?;
        s.run("COMMIT").unwrap();
    }
}

/// Statements the fast path must leave alone, each with the general
/// path's answer or error.
#[test]
fn other_shapes_take_the_general_path() {
    let db = db();
    let mut s = db.session();
    for sql in [
        "INSERT INTO P (a, b, v) VALUES (1, 'x', 10), (2, 'x', 20)",
        "INSERT INTO K (a, b, k, x) VALUES (1, 'x', 1, 100), (1, 'x', 2, NULL), (3, 'x', 1, 300)",
        "INSERT INTO G (a, b, k, g, y) VALUES (1, 'x', 1, 1, 'p'), (1, 'x', 1, 2, NULL)",
        "INSERT INTO Q (a, w) VALUES (1, 'w')",
        "INSERT INTO R (a, n, z) VALUES (1, 1, 5), (1, 2, 6)",
    ] {
        s.run(sql).unwrap();
    }
    let cases: &[(&str, Result<usize, ()>)] = &[
        // Outer join: P 2 has no K rows and still comes out.
        (
            "SELECT p.a, k.k FROM P p LEFT JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 2 AND p.b = 'x'",
            Ok(1),
        ),
        // An extra condition in the ON.
        (
            "SELECT k.k FROM P p JOIN K k ON k.a = p.a AND k.b = p.b AND k.x > 0 WHERE p.a = 1 AND p.b = 'x'",
            Ok(1),
        ),
        // Ambiguous bare names: the general path's error.
        ("SELECT k.k FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE a = 1 AND b = 'x'", Err(())),
        // K joined by a column no read can be narrowed by (a full scan).
        ("SELECT k.k FROM P p JOIN K k ON k.x = p.v WHERE p.a = 1 AND p.b = 'x'", Ok(0)),
        // One column equal to two values (through the ON).
        ("SELECT k.k FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 1 AND p.b = 'x' AND k.a = 2", Ok(0)),
        // Other conditions in the WHERE.
        ("SELECT k.k FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 1 AND p.b = 'x' AND k.k > 1", Ok(1)),
        ("SELECT k.k FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 1 AND (p.b = 'x' OR p.b = 'y')", Ok(2)),
        // An ON between two earlier tables.
        ("SELECT g.g FROM P p JOIN K k ON k.a = p.a AND k.b = p.b JOIN G g ON g.a = k.a AND k.b = p.b WHERE p.a = 1 AND p.b = 'x'", Ok(4)),
        // ORDER BY an expression, a position or a name both an alias and
        // another column; OFFSET.
        (
            "SELECT k.k FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 1 AND p.b = 'x' ORDER BY k.x + 1",
            Ok(2),
        ),
        (
            "SELECT k.k FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 1 AND p.b = 'x' ORDER BY 1",
            Ok(2),
        ),
        (
            "SELECT k.k AS v FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 1 AND p.b = 'x' ORDER BY v",
            Ok(2),
        ),
        (
            "SELECT k.k FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 1 AND p.b = 'x' LIMIT 1 OFFSET 1",
            Ok(1),
        ),
        // An expression in the output.
        (
            "SELECT k.x + 1 FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 1 AND p.b = 'x'",
            Ok(2),
        ),
        // Duplicate output names (the general path suffixes them).
        (
            "SELECT p.a, k.a FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 1 AND p.b = 'x'",
            Ok(2),
        ),
    ];
    for (sql, want) in cases {
        let before = db.engine().fast_path_count();
        let got = rows(&mut s, sql, &[]).map(|(_, r)| r.len());
        assert_eq!(
            db.engine().fast_path_count(),
            before,
            "fast path taken: {sql}"
        );
        match want {
            Ok(n) => assert_eq!(got, Ok(*n), "{sql}"),
            Err(_) => assert!(got.is_err(), "{sql}: {got:?}"),
        }
    }
    // A key of another type as a parameter: the general path's answer.
    let sql = "SELECT k.k FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = $1 AND p.b = $2";
    let before = db.engine().fast_path_count();
    let got = rows(
        &mut s,
        sql,
        &[Value::String("1".into()), Value::String("x".into())],
    );
    assert_eq!(
        db.engine().fast_path_count(),
        before,
        "fast path taken with a text key"
    );
    assert_eq!(got.map(|(_, r)| r.len()), Ok(2));
    // NULL key: nothing, on the fast path.
    let got = rows(&mut s, sql, &[Value::Null, Value::String("x".into())]);
    assert_eq!(got.map(|(_, r)| r.len()), Ok(0));
}

/// A join of row trees is answered from the kept fast plan: the second run
/// plans nothing; a schema change plans it again; over the wire form with
/// values inline it takes the fast path too.
#[test]
fn inline_values_and_schema_changes() {
    let db = db();
    let mut s = db.session();
    s.run("INSERT INTO P (a, b, v) VALUES (1, 'x', 10)")
        .unwrap();
    s.run("INSERT INTO K (a, b, k, x) VALUES (1, 'x', 1, 100), (1, 'x', 2, 200)")
        .unwrap();
    let sql =
        "SELECT p.v, k.x FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 1 AND p.b = 'x'";
    let want = vec![
        vec![Value::Int64(10), Value::Int64(100)],
        vec![Value::Int64(10), Value::Int64(200)],
    ];
    for _ in 0..2 {
        let before = db.engine().fast_path_count();
        assert_eq!(rows(&mut s, sql, &[]).unwrap().1, want);
        assert_eq!(db.engine().fast_path_count(), before + 1);
    }
    // Another literal: the same parameterized form.
    let other = sql.replace("p.a = 1", "p.a = 2");
    let before = db.engine().fast_path_count();
    assert!(rows(&mut s, &other, &[]).unwrap().1.is_empty());
    assert_eq!(db.engine().fast_path_count(), before + 1);
    // A column added to K: the plan is made again and sees it.
    s.run("ALTER TABLE K ADD COLUMN x2 INT64").unwrap();
    s.run("UPDATE K SET x2 = 7 WHERE a = 1 AND b = 'x' AND k = 2")
        .unwrap();
    let with =
        "SELECT k.x2 FROM P p JOIN K k ON k.a = p.a AND k.b = p.b WHERE p.a = 1 AND p.b = 'x'";
    assert_eq!(
        rows(&mut s, with, &[]).unwrap().1,
        vec![vec![Value::Null], vec![Value::Int64(7)]]
    );
    assert_eq!(rows(&mut s, sql, &[]).unwrap().1, want);
}

/// A table read once per distinct value of the rows before it takes the
/// fast path for up to 1 024 values (`tree_join::MAX_LOOKUPS`), the
/// general path past that, with the same answer.
#[test]
fn many_lookups_take_the_general_path() {
    let db = db();
    let mut s = db.session();
    let insert = |s: &mut Session, c: i64, lines: std::ops::Range<i64>| {
        s.run("BEGIN").unwrap();
        for l in lines {
            s.execute(
                "INSERT INTO NL (l, o, c, q) VALUES ($1, $1, $2, 1)",
                &[Value::Int64(l), Value::Int64(c)],
            )
            .unwrap();
            s.execute(
                "INSERT INTO NO (o, c, st) VALUES ($1, $2, 'x')",
                &[Value::Int64(l), Value::Int64(c)],
            )
            .unwrap();
        }
        s.run("COMMIT").unwrap();
    };
    insert(&mut s, 7, 0..1024);
    insert(&mut s, 8, 2000..3025);
    let sql = "SELECT nl.l, no.st FROM NL nl JOIN NO no ON no.o = nl.o WHERE nl.c = $1";
    for (c, n, fast) in [(7, 1024, true), (8, 1025, false)] {
        let before = db.engine().fast_path_count();
        let (_, got) = rows(&mut s, sql, &[Value::Int64(c)]).unwrap();
        assert_eq!(
            db.engine().fast_path_count(),
            before + u64::from(fast),
            "c = {c}"
        );
        assert_eq!(got.len(), n);
        let (_, general) = rows(&mut s, &format!("{sql} AND TRUE"), &[Value::Int64(c)]).unwrap();
        let sorted = |mut r: Vec<Vec<Value>>| {
            r.sort();
            r
        };
        assert_eq!(sorted(got), sorted(general));
    }
}
