//! Commit timestamps through the embedded API: the value
//! `PENDING_COMMIT_TIMESTAMP()` writes is exactly the transaction's commit
//! timestamp (in rows, keys, index entries and across a two-phase commit),
//! concurrent writers each get their own, and the errors carry their
//! SQLSTATEs.

use std::sync::Arc;

use spindle::{Database, Value};

fn timestamps(db: &Database, sql: &str) -> Vec<i64> {
    db.query(sql, &[])
        .unwrap()
        .rows()
        .unwrap()
        .iter()
        .map(|r| match &r.values()[0] {
            Value::Timestamp(t) => *t,
            other => panic!("{sql}: not a timestamp: {other:?}"),
        })
        .collect()
}

fn setup(db: &Database) {
    for sql in [
        "CREATE TABLE Singers (SingerId INT64 NOT NULL, LastUpdated TIMESTAMP OPTIONS (allow_commit_timestamp = true), Name STRING(MAX)) PRIMARY KEY (SingerId)",
        "CREATE INDEX SingersByUpdate ON Singers (LastUpdated) STORING (Name)",
        "CREATE TABLE Log (At TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true), Writer INT64 NOT NULL, Seq INT64 NOT NULL) PRIMARY KEY (At, Writer, Seq)",
    ] {
        db.execute(sql, &[]).unwrap();
    }
}

#[test]
fn pending_commit_timestamp_is_the_commit_timestamp() {
    let db = Database::open_in_memory().unwrap();
    setup(&db);
    let mut s = db.session();
    assert_eq!(s.last_commit_timestamp(), None);
    s.execute("BEGIN", &[]).unwrap();
    s.execute(
        "INSERT INTO Singers VALUES (1, PENDING_COMMIT_TIMESTAMP(), 'a'), (2, PENDING_COMMIT_TIMESTAMP(), 'b')",
        &[],
    )
    .unwrap();
    s.execute(
        "INSERT INTO Log VALUES (PENDING_COMMIT_TIMESTAMP(), 0, 1)",
        &[],
    )
    .unwrap();
    s.execute("COMMIT", &[]).unwrap();
    let ts = s.last_commit_timestamp().expect("a commit timestamp");
    // Row values, key values and index entries all hold it.
    assert_eq!(
        timestamps(&db, "SELECT LastUpdated FROM Singers ORDER BY SingerId"),
        vec![ts, ts]
    );
    assert_eq!(timestamps(&db, "SELECT At FROM Log"), vec![ts]);
    assert_eq!(
        timestamps(
            &db,
            "SELECT LastUpdated FROM Singers@{FORCE_INDEX=SingersByUpdate} WHERE LastUpdated = (SELECT max(At) FROM Log)"
        ),
        vec![ts, ts]
    );
    // SHOW spanner.commit_timestamp prints the same instant.
    let shown = s.query("SHOW spanner.commit_timestamp", &[]).unwrap();
    let shown: String = shown.rows().unwrap()[0].get(0).unwrap();
    let as_ts = timestamps(&db, &format!("SELECT CAST('{shown}' AS TIMESTAMP)"));
    assert_eq!(as_ts, vec![ts]);

    // An autocommit statement's timestamp is later, and only the rows it
    // wrote change.
    s.execute(
        "UPDATE Singers SET LastUpdated = PENDING_COMMIT_TIMESTAMP() WHERE SingerId = 2",
        &[],
    )
    .unwrap();
    let ts2 = s.last_commit_timestamp().unwrap();
    assert!(ts2 > ts);
    assert_eq!(
        timestamps(&db, "SELECT LastUpdated FROM Singers ORDER BY SingerId"),
        vec![ts, ts2]
    );
    // The old index entry is gone, the new one is there.
    let by_index = timestamps(
        &db,
        "SELECT LastUpdated FROM Singers@{FORCE_INDEX=SingersByUpdate} ORDER BY LastUpdated",
    );
    assert_eq!(by_index, vec![ts, ts2]);
}

#[test]
fn errors_carry_sqlstates() {
    let db = Database::open_in_memory().unwrap();
    setup(&db);
    let err = db
        .execute(
            "INSERT INTO Singers VALUES (1, TIMESTAMP '2200-01-01 00:00:00+00', 'x')",
            &[],
        )
        .unwrap_err();
    assert_eq!(err.sqlstate(), "22008", "{err}");
    db.execute(
        "CREATE TABLE Plain (Id INT64 NOT NULL, T TIMESTAMP) PRIMARY KEY (Id)",
        &[],
    )
    .unwrap();
    let err = db
        .execute(
            "INSERT INTO Plain VALUES (1, PENDING_COMMIT_TIMESTAMP())",
            &[],
        )
        .unwrap_err();
    assert_eq!(err.sqlstate(), "22008", "{err}");
    let mut s = db.session();
    s.execute("BEGIN", &[]).unwrap();
    s.execute(
        "INSERT INTO Singers VALUES (1, PENDING_COMMIT_TIMESTAMP(), 'x')",
        &[],
    )
    .unwrap();
    let err = s
        .query("SELECT Name FROM Singers WHERE SingerId = 1", &[])
        .unwrap_err();
    assert_eq!(err.sqlstate(), "55000", "{err}");
    s.execute("ROLLBACK", &[]).unwrap();
    let err = s
        .execute("SET spanner.commit_timestamp = '2020-01-01'", &[])
        .unwrap_err();
    assert_eq!(err.sqlstate(), "55P02", "{err}");
    // Nothing was written by any failed statement.
    assert_eq!(
        db.query("SELECT count(*) FROM Singers", &[])
            .unwrap()
            .rows()
            .unwrap()[0]
            .get::<i64>(0)
            .unwrap(),
        0
    );
}

/// Many writers append to a log keyed by commit timestamp: every commit
/// succeeds (no key collides), each transaction's rows carry the timestamp
/// its session reports, and the log's key order is commit order.
#[test]
fn concurrent_writers_each_get_their_commit_timestamp() {
    let db = Arc::new(Database::open_in_memory().unwrap());
    setup(&db);
    let threads: Vec<_> = (0..4)
        .map(|w| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut s = db.session();
                let mut mine = Vec::new();
                for i in 0..25 {
                    s.execute(
                        &format!(
                            "INSERT INTO Log VALUES (PENDING_COMMIT_TIMESTAMP(), {w}, {i}), (PENDING_COMMIT_TIMESTAMP(), {w}, {})",
                            i + 1000
                        ),
                        &[],
                    )
                    .unwrap();
                    mine.push((s.last_commit_timestamp().unwrap(), w, i));
                }
                mine
            })
        })
        .collect();
    let mut expected = Vec::new();
    for t in threads {
        expected.extend(t.join().unwrap());
    }
    expected.sort();
    let rows = db
        .query("SELECT At, Writer, Seq FROM Log WHERE Seq < 1000", &[])
        .unwrap()
        .rows()
        .unwrap();
    let got: Vec<(i64, i64, i64)> = rows
        .iter()
        .map(|r| match r.values() {
            [Value::Timestamp(t), Value::Int64(w), Value::Int64(s)] => (*t, *w, *s),
            other => panic!("{other:?}"),
        })
        .collect();
    let want: Vec<(i64, i64, i64)> = expected.iter().map(|(t, w, i)| (*t, *w, *i)).collect();
    // Primary-key order (At first) is commit order.
    assert_eq!(got, want);
    let distinct: std::collections::BTreeSet<i64> = want.iter().map(|r| r.0).collect();
    assert_eq!(
        distinct.len(),
        want.len(),
        "one commit timestamp per transaction"
    );
    let pairs = db
        .query(
            "SELECT count(*) FROM Log a JOIN Log b ON a.At = b.At AND a.Writer = b.Writer AND b.Seq = a.Seq + 1000",
            &[],
        )
        .unwrap()
        .rows()
        .unwrap()[0]
        .get::<i64>(0)
        .unwrap();
    assert_eq!(
        pairs, 100,
        "both rows of each transaction share its timestamp"
    );
}

/// A commit that spans splits (the global index entry lands in another
/// split than the row) resolves the timestamp on both sides, and it
/// survives a restart.
#[test]
fn two_phase_commit_and_restart_keep_the_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let ts = {
        let db = Database::open(dir.path()).unwrap();
        db.engine().manager().set_split_threshold(2_000);
        setup(&db);
        for i in 0..80 {
            db.execute(
                "INSERT INTO Singers VALUES ($1, $2, $3)",
                &[
                    Value::Int64(i),
                    Value::Timestamp(1_600_000_000_000_000 + i * 1_000_000),
                    Value::String("x".repeat(60)),
                ],
            )
            .unwrap();
        }
        let sql = "INSERT INTO Singers VALUES (500, PENDING_COMMIT_TIMESTAMP(), 'e')";
        let explain: Vec<String> = db
            .query(&format!("EXPLAIN {sql}"), &[])
            .unwrap()
            .rows()
            .unwrap()
            .iter()
            .map(|r| r.get::<String>(0).unwrap())
            .collect();
        let explain = explain.join("\n");
        assert!(
            explain.contains("two-phase commit across 2 splits"),
            "{explain}"
        );
        let mut s = db.session();
        s.execute(sql, &[]).unwrap();
        s.last_commit_timestamp().unwrap()
    };
    let db = Database::open(dir.path()).unwrap();
    assert_eq!(
        timestamps(&db, "SELECT LastUpdated FROM Singers WHERE SingerId = 500"),
        vec![ts]
    );
    assert_eq!(
        timestamps(
            &db,
            "SELECT LastUpdated FROM Singers@{FORCE_INDEX=SingersByUpdate} WHERE Name = 'e'"
        ),
        vec![ts]
    );
    assert_eq!(
        timestamps(
            &db,
            "SELECT max(LastUpdated) FROM Singers@{FORCE_INDEX=SingersByUpdate}"
        ),
        vec![ts]
    );
}
