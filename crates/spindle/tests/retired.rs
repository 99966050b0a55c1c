//! DROP TABLE and DROP INDEX retire whole key spaces instead of deleting
//! row by row: readers at older timestamps (a live snapshot, a stale read)
//! still read the dropped rows, and the garbage collector removes them
//! once no reader can.

use std::time::Duration;

use spindle::{Database, Value};

fn count(s: &mut spindle::Session, sql: &str) -> i64 {
    s.query(sql, &[]).unwrap().rows().unwrap()[0]
        .get(0)
        .unwrap()
}

#[test]
fn dropped_key_spaces_stay_readable_until_no_reader_needs_them() {
    let db = Database::open_in_memory().unwrap();
    for sql in [
        "CREATE TABLE p (id INT64 NOT NULL, name STRING(MAX)) PRIMARY KEY (id)",
        "CREATE TABLE c (id INT64 NOT NULL, k INT64 NOT NULL, v INT64) PRIMARY KEY (id, k), \
         INTERLEAVE IN PARENT p ON DELETE CASCADE",
        "CREATE INDEX p_by_name ON p (name)",
        "CREATE INDEX c_by_v ON c (id, v), INTERLEAVE IN p",
        "CREATE TABLE other (id INT64 NOT NULL) PRIMARY KEY (id)",
        "INSERT INTO other SELECT value FROM generate_series(1, 7)",
        "INSERT INTO p SELECT value, 'n' || CAST(value AS STRING) FROM generate_series(1, 100)",
    ] {
        db.execute(sql, &[]).unwrap();
    }
    let mut s = db.session();
    s.execute(
        "INSERT INTO c SELECT p.value, k.value, 0 FROM generate_series(1, 100) p \
         CROSS JOIN generate_series(1, 3) k",
        &[],
    )
    .unwrap();
    let rows = s.query("SHOW spanner.commit_timestamp", &[]).unwrap();
    let before_drop: String = rows.rows().unwrap()[0].get(0).unwrap();

    // A snapshot taken before the drop.
    let mut reader = db.session();
    reader.execute("BEGIN READ ONLY", &[]).unwrap();
    assert_eq!(count(&mut reader, "SELECT count(*) FROM other"), 7);

    db.execute("DROP TABLE p, c", &[]).unwrap();
    let mgr = db.engine().manager().clone();
    mgr.set_retention(Duration::ZERO);
    std::thread::sleep(Duration::from_millis(5));
    // The live snapshot still sees the dropped tables: nothing of them goes.
    let removed = mgr.gc().unwrap();
    assert!(
        removed < 100,
        "removed {removed} entries under a live snapshot"
    );
    assert_eq!(
        count(&mut reader, "SELECT count(*) FROM p WHERE name = 'n42'"),
        1
    );
    assert_eq!(count(&mut reader, "SELECT count(*) FROM c"), 300);
    assert_eq!(
        count(&mut reader, "SELECT count(*) FROM c WHERE id = 5 AND v = 0"),
        3
    );
    reader.execute("COMMIT", &[]).unwrap();

    // Within the retention window a stale read sees them too.
    mgr.set_retention(Duration::from_secs(3600));
    let mut stale = db.session();
    stale
        .execute(
            &format!("SET spanner.read_only_staleness = 'READ_TIMESTAMP {before_drop}'"),
            &[],
        )
        .unwrap();
    assert_eq!(count(&mut stale, "SELECT count(*) FROM c"), 300);
    assert_eq!(count(&mut stale, "SELECT count(*) FROM p"), 100);
    let err = s.query("SELECT count(*) FROM p", &[]).unwrap_err();
    assert_eq!(err.sqlstate(), "42P01", "{err}");

    // Once no reader can see them: 100 rows of p, 300 of c, 100 entries
    // of p_by_name, 300 of c_by_v, 100 of p's row copy, all removed (with
    // the catalog's few old versions). Had the DROP deleted them row by
    // row, there would be a tombstone and an old version for each: twice
    // as many.
    mgr.set_retention(Duration::ZERO);
    std::thread::sleep(Duration::from_millis(5));
    let removed = mgr.gc().unwrap();
    assert!((900..=920).contains(&removed), "removed {removed}");
    assert_eq!(mgr.gc().unwrap(), 0);
    // The table that stayed is whole; new tables of the same names start
    // empty.
    assert_eq!(count(&mut s, "SELECT count(*) FROM other"), 7);
    db.execute(
        "CREATE TABLE p (id INT64 NOT NULL, name STRING(MAX)) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    assert_eq!(count(&mut s, "SELECT count(*) FROM p"), 0);
    let rows = db
        .query(
            "SELECT count(*) FROM other WHERE id = $1",
            &[Value::Int64(3)],
        )
        .unwrap();
    assert_eq!(rows.rows().unwrap()[0].get::<i64>(0).unwrap(), 1);
}

/// A child table dropped without its root still deletes its rows (they
/// share the root's key space), and a global index's entries are retired.
#[test]
fn a_child_dropped_alone_deletes_its_rows() {
    let db = Database::open_in_memory().unwrap();
    for sql in [
        "CREATE TABLE p (id INT64 NOT NULL) PRIMARY KEY (id)",
        "CREATE TABLE c (id INT64 NOT NULL, k INT64 NOT NULL, v INT64) PRIMARY KEY (id, k), \
         INTERLEAVE IN PARENT p",
        "CREATE INDEX c_by_v ON c (v)",
        "INSERT INTO p SELECT value FROM generate_series(1, 10)",
        "INSERT INTO c SELECT value, 1, value FROM generate_series(1, 10)",
        "DROP TABLE c",
        "CREATE TABLE c (id INT64 NOT NULL, k INT64 NOT NULL, v INT64) PRIMARY KEY (id, k), \
         INTERLEAVE IN PARENT p",
    ] {
        db.execute(sql, &[]).unwrap();
    }
    let mut s = db.session();
    assert_eq!(count(&mut s, "SELECT count(*) FROM c"), 0);
    assert_eq!(count(&mut s, "SELECT count(*) FROM p"), 10);
    // DELETE of a parent finds no children left behind.
    db.execute("DELETE FROM p WHERE id = 3", &[]).unwrap();
    assert_eq!(count(&mut s, "SELECT count(*) FROM p"), 9);
}

/// ALTER TABLE … ADD PRIMARY KEY writes the rows (and their index entries)
/// in new key spaces and retires the old ones: the table and its index
/// keep their oids, older snapshots read the rows as they were, and the
/// collector removes exactly the old rows and entries afterwards.
#[test]
fn add_primary_key_moves_rows_to_a_new_key_space() {
    let db = Database::open_in_memory().unwrap();
    for sql in [
        "CREATE TABLE t (a int, b text)",
        "CREATE INDEX t_b ON t (b)",
        "INSERT INTO t SELECT value, 'v' || CAST(value AS STRING) FROM generate_series(1, 200)",
    ] {
        db.execute(sql, &[]).unwrap();
    }
    let mut s = db.session();
    let oids = |s: &mut spindle::Session| -> Vec<i64> {
        s.query(
            "SELECT oid FROM pg_catalog.pg_class WHERE relname IN ('t', 't_b') ORDER BY relname",
            &[],
        )
        .unwrap()
        .rows()
        .unwrap()
        .iter()
        .map(|r| r.get(0).unwrap())
        .collect()
    };
    let before = oids(&mut s);
    assert_eq!(before.len(), 2);
    let mut reader = db.session();
    reader.execute("BEGIN READ ONLY", &[]).unwrap();
    assert_eq!(
        count(&mut reader, "SELECT count(*) FROM t WHERE b = 'v7'"),
        1
    );

    s.execute("ALTER TABLE t ADD PRIMARY KEY (a)", &[]).unwrap();
    assert_eq!(oids(&mut s), before);
    assert_eq!(
        count(&mut s, "SELECT count(*) FROM t WHERE b = 'v7' AND a = 7"),
        1
    );
    assert_eq!(count(&mut s, "SELECT count(*) FROM t"), 200);

    let mgr = db.engine().manager().clone();
    mgr.set_retention(Duration::ZERO);
    std::thread::sleep(Duration::from_millis(5));
    // The snapshot from before the ALTER reads the key-less table still.
    assert!(mgr.gc().unwrap() < 200);
    assert_eq!(count(&mut reader, "SELECT count(*) FROM t"), 200);
    assert_eq!(
        count(&mut reader, "SELECT count(*) FROM t WHERE b = 'v9'"),
        1
    );
    reader.execute("COMMIT", &[]).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    // 200 old rows and 200 old entries (and a few old catalog versions):
    // nothing was deleted row by row.
    let removed = mgr.gc().unwrap();
    assert!((400..=410).contains(&removed), "removed {removed}");
    assert_eq!(count(&mut s, "SELECT count(*) FROM t WHERE b = 'v9'"), 1);
    assert_eq!(count(&mut s, "SELECT sum(a) FROM t"), 20_100);
}
