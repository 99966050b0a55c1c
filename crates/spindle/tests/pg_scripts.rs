//! Statements PostgreSQL scripts send around a load (`pgbench -i` and
//! dumps): ALTER TABLE … ADD PRIMARY KEY on a table created without one,
//! VACUUM and ANALYZE, storage parameters — their SQLSTATEs, that a failed
//! re-key writes nothing, and that a concurrent write and a re-key do not
//! both commit.

use spindle::{Database, Value};

fn count(db: &Database, sql: &str) -> i64 {
    db.query(sql, &[]).unwrap().rows().unwrap()[0]
        .get(0)
        .unwrap()
}

fn state(db: &Database, sql: &str) -> String {
    db.execute(sql, &[])
        .map(|_| panic!("{sql} succeeded"))
        .unwrap_err()
        .sqlstate()
        .to_string()
}

#[test]
fn errors_carry_their_sqlstates() {
    let db = Database::open_in_memory().unwrap();
    db.execute("CREATE TABLE t (a int, b int, c jsonb)", &[])
        .unwrap();
    db.execute("INSERT INTO t VALUES (1, 1, NULL), (1, 2, NULL)", &[])
        .unwrap();
    assert_eq!(state(&db, "ALTER TABLE t ADD PRIMARY KEY (a)"), "23505");
    db.execute("DELETE FROM t WHERE b = 2", &[]).unwrap();
    db.execute("INSERT INTO t VALUES (NULL, 3, NULL)", &[])
        .unwrap();
    assert_eq!(state(&db, "ALTER TABLE t ADD PRIMARY KEY (a)"), "23502");
    assert_eq!(state(&db, "ALTER TABLE t ADD PRIMARY KEY (x)"), "42703");
    assert_eq!(state(&db, "ALTER TABLE t ADD PRIMARY KEY (c)"), "42P16");
    assert_eq!(state(&db, "ALTER TABLE t ADD PRIMARY KEY (b, b)"), "42P16");
    assert_eq!(state(&db, "ALTER TABLE nope ADD PRIMARY KEY (a)"), "42P01");
    // Nothing was written by the failures: still key-less, two rows.
    assert_eq!(count(&db, "SELECT count(*) FROM t"), 2);
    db.execute("ALTER TABLE t ADD PRIMARY KEY (b)", &[])
        .unwrap();
    assert_eq!(state(&db, "ALTER TABLE t ADD PRIMARY KEY (a)"), "42P16");
    assert_eq!(state(&db, "INSERT INTO t (a, b) VALUES (5, 3)"), "23505");
    assert_eq!(
        state(&db, "CREATE TABLE u (a int) WITH (fillfactor = 101)"),
        "22023"
    );
    assert_eq!(
        state(&db, "CREATE TABLE u (a int) WITH (nope = 1)"),
        "22023"
    );
    assert_eq!(
        state(&db, "CREATE TABLE u (a int) WITH (oids = true)"),
        "0A000"
    );
    assert_eq!(state(&db, "VACUUM nope"), "42P01");
    assert_eq!(state(&db, "ANALYZE t (nope)"), "42703");
    assert_eq!(state(&db, "VACUUM t (a)"), "0A000");
    assert_eq!(state(&db, "VACUUM (nope) t"), "42601");
    let mut s = db.session();
    s.execute("BEGIN", &[]).unwrap();
    s.execute("ANALYZE t", &[]).unwrap();
    let err = s.execute("VACUUM", &[]).unwrap_err();
    assert_eq!(err.sqlstate(), "25001", "{err}");
    // As in PostgreSQL, the error ends the block's useful life.
    assert_eq!(s.execute("SELECT 1", &[]).unwrap_err().sqlstate(), "25P02");
    s.execute("ROLLBACK", &[]).unwrap();
    // A read-only session may VACUUM and ANALYZE (no data changes).
    s.execute("SET default_transaction_read_only = on", &[])
        .unwrap();
    s.execute("VACUUM t", &[]).unwrap();
    s.execute("ANALYZE", &[]).unwrap();
}

/// The re-key reads the whole table at its snapshot: a row committed
/// meanwhile by another transaction makes the ALTER's commit fail (and an
/// autocommit one retries and takes the row with it).
#[test]
fn a_concurrent_write_and_the_rekey_do_not_both_commit() {
    let db = Database::open_in_memory().unwrap();
    db.execute("CREATE TABLE t (a int, b text)", &[]).unwrap();
    db.execute(
        "INSERT INTO t SELECT n, 'x' FROM generate_series(1, 500) AS n",
        &[],
    )
    .unwrap();
    let mut alter = db.session();
    alter.execute("BEGIN", &[]).unwrap();
    alter
        .execute("ALTER TABLE t ADD PRIMARY KEY (a)", &[])
        .unwrap();
    db.execute("INSERT INTO t VALUES (1, 'dup')", &[]).unwrap();
    let err = alter.execute("COMMIT", &[]).unwrap_err();
    assert!(err.is_retryable(), "{err}");
    // Still key-less, with the duplicate: an autocommit ALTER now fails on it.
    assert_eq!(count(&db, "SELECT count(*) FROM t"), 501);
    assert_eq!(state(&db, "ALTER TABLE t ADD PRIMARY KEY (a)"), "23505");
    db.execute("DELETE FROM t WHERE b = 'dup'", &[]).unwrap();
    db.execute("ALTER TABLE t ADD PRIMARY KEY (a)", &[])
        .unwrap();
    let rows = db
        .query("SELECT b FROM t WHERE a = $1", &[Value::Int64(250)])
        .unwrap();
    assert_eq!(rows.rows().unwrap()[0].get::<String>(0).unwrap(), "x");
    assert_eq!(count(&db, "SELECT count(*) FROM t"), 500);
}
