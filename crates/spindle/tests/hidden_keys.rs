//! Tables without a primary key: each row gets a hidden key (`_rowid`).
//! One transaction's rows get consecutive keys from a random start, so a
//! plain scan (key order) reads them back in the order they were
//! inserted, one run per transaction; transactions start apart.

use spindle::Database;

/// `(s, g)` of every row of `k`, in key order (a plain scan).
fn rows_in_key_order(db: &Database) -> Vec<(i64, i64)> {
    let mut s = db.session();
    s.query("SELECT s, g FROM k", &[])
        .unwrap()
        .rows()
        .unwrap()
        .iter()
        .map(|r| (r.get(0).unwrap(), r.get(1).unwrap()))
        .collect()
}

/// The runs of equal `s` in `rows`, each checked to ascend in `g` from 1.
fn runs(rows: &[(i64, i64)]) -> Vec<(i64, usize)> {
    let mut out: Vec<(i64, usize)> = Vec::new();
    for (s, g) in rows {
        match out.last_mut() {
            Some((last, n)) if last == s => {
                *n += 1;
                assert_eq!(*g, *n as i64, "statement {s}: rows out of order");
            }
            _ => {
                assert_eq!(*g, 1, "statement {s}: a run starts at row {g}");
                out.push((*s, 1));
            }
        }
    }
    out
}

#[test]
fn one_transactions_rows_get_consecutive_hidden_keys() {
    let db = Database::open_in_memory().unwrap();
    db.execute("CREATE TABLE k (s INT64, g INT64)", &[])
        .unwrap();
    // The general INSERT path (a query as the source) …
    db.execute(
        "INSERT INTO k SELECT 1, value FROM generate_series(1, 300)",
        &[],
    )
    .unwrap();
    // … the VALUES path, and a transaction with two statements.
    let values: Vec<String> = (1..=40).map(|g| format!("(2, {g})")).collect();
    db.execute(&format!("INSERT INTO k VALUES {}", values.join(", ")), &[])
        .unwrap();
    let mut s = db.session();
    s.execute("BEGIN", &[]).unwrap();
    s.execute(
        "INSERT INTO k SELECT 3, value FROM generate_series(1, 200)",
        &[],
    )
    .unwrap();
    s.execute(
        "INSERT INTO k SELECT 4, value FROM generate_series(1, 200)",
        &[],
    )
    .unwrap();
    s.execute("COMMIT", &[]).unwrap();

    let rows = rows_in_key_order(&db);
    assert_eq!(rows.len(), 740);
    let mut found = runs(&rows);
    // The transaction's second statement went on where its first ended.
    let third = found.iter().position(|r| r.0 == 3).unwrap();
    assert_eq!(found.get(third + 1), Some(&(4, 200)), "{found:?}");
    found.sort();
    // With keys drawn at random per row, 300 rows would read back in the
    // order inserted once in 300! tries.
    assert_eq!(found, vec![(1, 300), (2, 40), (3, 200), (4, 200)]);
}

#[test]
fn single_row_statements_start_apart() {
    let db = Database::open_in_memory().unwrap();
    db.execute("CREATE TABLE k (s INT64, g INT64)", &[])
        .unwrap();
    for s in 1..=64 {
        db.execute(&format!("INSERT INTO k VALUES ({s}, 1)"), &[])
            .unwrap();
    }
    let rows = rows_in_key_order(&db);
    assert_eq!(rows.len(), 64);
    // Every statement drew its own random start: in key order they are
    // not the order they ran in (ascending once in 64! orders).
    let order: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let sorted: Vec<i64> = (1..=64).collect();
    assert_ne!(order, sorted, "hidden keys follow the insert order");
    assert_eq!(runs(&rows).len(), 64);
}
