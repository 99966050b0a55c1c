//! Concurrent transactions through the embedded API: every anomaly
//! scenario must end serializably (one side aborts with 40001), and a
//! many-thread bank keeps its invariants.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use spindle::{Database, Value};

fn one_i64(s: &mut spindle::Session, sql: &str) -> i64 {
    s.query(sql, &[]).unwrap().rows().unwrap()[0]
        .get::<i64>(0)
        .unwrap()
}

/// `n` of row 1 of `counters`, read by a new session.
fn counter_1(db: &Database) -> i64 {
    one_i64(&mut db.session(), "SELECT n FROM counters WHERE id = 1")
}

fn commit_err(s: &mut spindle::Session) -> Option<String> {
    match s.run("COMMIT") {
        Ok(_) => None,
        Err(e) => Some(e.sqlstate().to_string()),
    }
}

#[test]
fn lost_update_is_prevented() {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE counters (id INT64 NOT NULL, n INT64) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    db.execute("INSERT INTO counters VALUES (1, 0)", &[])
        .unwrap();
    let (mut a, mut b) = (db.session(), db.session());
    a.run("BEGIN").unwrap();
    b.run("BEGIN").unwrap();
    let na = one_i64(&mut a, "SELECT n FROM counters WHERE id = 1");
    let nb = one_i64(&mut b, "SELECT n FROM counters WHERE id = 1");
    a.execute(
        "UPDATE counters SET n = $1 WHERE id = 1",
        &[Value::Int64(na + 1)],
    )
    .unwrap();
    // b's UPDATE waits for a's row lock; once a commits, b cannot move
    // past a (it read the row a changed): the statement fails with 40001.
    let b = std::thread::spawn(move || {
        let r = b.execute(
            "UPDATE counters SET n = $1 WHERE id = 1",
            &[Value::Int64(nb + 1)],
        );
        (b, r.err().map(|e| e.sqlstate().to_string()))
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(commit_err(&mut a), None);
    let (mut b, err) = b.join().unwrap();
    assert_eq!(err.as_deref(), Some("40001"));
    b.run("ROLLBACK").unwrap();
    assert_eq!(counter_1(&db), 1);
}

#[test]
fn write_skew_is_prevented() {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE doctors (id INT64 NOT NULL, on_call BOOL) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    db.execute("INSERT INTO doctors VALUES (1, true), (2, true)", &[])
        .unwrap();
    let (mut a, mut b) = (db.session(), db.session());
    a.run("BEGIN").unwrap();
    b.run("BEGIN").unwrap();
    // Each sees two doctors on call and takes itself off.
    assert_eq!(
        one_i64(&mut a, "SELECT count(*) FROM doctors WHERE on_call"),
        2
    );
    assert_eq!(
        one_i64(&mut b, "SELECT count(*) FROM doctors WHERE on_call"),
        2
    );
    a.execute("UPDATE doctors SET on_call = false WHERE id = 1", &[])
        .unwrap();
    b.execute("UPDATE doctors SET on_call = false WHERE id = 2", &[])
        .unwrap();
    assert_eq!(commit_err(&mut a), None);
    assert_eq!(commit_err(&mut b).as_deref(), Some("40001"));
    assert_eq!(
        one_i64(
            &mut db.session(),
            "SELECT count(*) FROM doctors WHERE on_call"
        ),
        1
    );
}

#[test]
fn phantoms_are_prevented() {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE orders (id INT64 NOT NULL, amount INT64) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    db.execute(
        "CREATE TABLE totals (k INT64 NOT NULL, total INT64) PRIMARY KEY (k)",
        &[],
    )
    .unwrap();
    db.execute("INSERT INTO orders VALUES (1, 10), (2, 20)", &[])
        .unwrap();
    let (mut a, mut b) = (db.session(), db.session());
    a.run("BEGIN").unwrap();
    let total = one_i64(
        &mut a,
        "SELECT sum(amount) FROM orders WHERE id BETWEEN 1 AND 100",
    );
    // A new row appears in the range a read.
    b.execute("INSERT INTO orders VALUES (50, 5)", &[]).unwrap();
    a.execute("INSERT INTO totals VALUES (1, $1)", &[Value::Int64(total)])
        .unwrap();
    assert_eq!(commit_err(&mut a).as_deref(), Some("40001"));
    // An insert outside the range read does not conflict.
    a.run("BEGIN").unwrap();
    let total = one_i64(
        &mut a,
        "SELECT sum(amount) FROM orders WHERE id BETWEEN 1 AND 100",
    );
    b.execute("INSERT INTO orders VALUES (500, 5)", &[])
        .unwrap();
    a.execute("INSERT INTO totals VALUES (1, $1)", &[Value::Int64(total)])
        .unwrap();
    assert_eq!(commit_err(&mut a), None);
    assert_eq!(
        one_i64(&mut db.session(), "SELECT total FROM totals WHERE k = 1"),
        35
    );
}

#[test]
fn read_only_snapshots_are_consistent_and_never_block_writers() {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE acct (id INT64 NOT NULL, bal INT64) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    db.execute("INSERT INTO acct VALUES (1, 50), (2, 50)", &[])
        .unwrap();
    let mut r = db.session();
    r.run("BEGIN READ ONLY").unwrap();
    let a = one_i64(&mut r, "SELECT bal FROM acct WHERE id = 1");
    // A transfer commits between the reader's two reads (read skew attempt).
    db.transaction(|tx| {
        tx.execute("UPDATE acct SET bal = bal - 30 WHERE id = 1", &[])?;
        tx.execute("UPDATE acct SET bal = bal + 30 WHERE id = 2", &[])?;
        Ok(())
    })
    .unwrap();
    let b = one_i64(&mut r, "SELECT bal FROM acct WHERE id = 2");
    assert_eq!(a + b, 100, "the reader saw one snapshot");
    let err = r.execute("UPDATE acct SET bal = 0", &[]).unwrap_err();
    assert_eq!(err.sqlstate(), "25006");
    r.run("ROLLBACK").unwrap();
    assert_eq!(one_i64(&mut db.session(), "SELECT sum(bal) FROM acct"), 100);
}

#[test]
fn disjoint_transactions_do_not_conflict() {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE kv (k INT64 NOT NULL, v INT64) PRIMARY KEY (k)",
        &[],
    )
    .unwrap();
    db.execute("INSERT INTO kv VALUES (1, 0), (2, 0)", &[])
        .unwrap();
    let (mut a, mut b) = (db.session(), db.session());
    a.run("BEGIN").unwrap();
    b.run("BEGIN").unwrap();
    a.execute("UPDATE kv SET v = v + 1 WHERE k = 1", &[])
        .unwrap();
    b.execute("UPDATE kv SET v = v + 1 WHERE k = 2", &[])
        .unwrap();
    assert_eq!(commit_err(&mut a), None);
    assert_eq!(commit_err(&mut b), None);
}

/// Eight threads move money between accounts and log each transfer in the
/// same transaction. Afterwards the total is unchanged and every balance
/// equals its opening balance plus the logged transfers.
#[test]
fn many_thread_bank_keeps_its_invariants() {
    const ACCOUNTS: i64 = 10;
    const THREADS: u64 = 8;
    const TRANSFERS: u64 = 25;
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE accounts (id INT64 NOT NULL, balance INT64 NOT NULL) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    db.execute(
        "CREATE TABLE transfers (id INT64 NOT NULL, src INT64, dst INT64, amount INT64) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    for i in 0..ACCOUNTS {
        db.execute("INSERT INTO accounts VALUES ($1, 1000)", &[Value::Int64(i)])
            .unwrap();
    }
    let committed = Arc::new(AtomicU64::new(0));
    let gave_up = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let db = db.clone();
            let committed = committed.clone();
            let gave_up = gave_up.clone();
            std::thread::spawn(move || {
                let mut x = t * 7919 + 17;
                for n in 0..TRANSFERS {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let src = ((x >> 33) % ACCOUNTS as u64) as i64;
                    let dst = (src + 1 + ((x >> 13) % (ACCOUNTS as u64 - 1)) as i64) % ACCOUNTS;
                    let amount = 1 + ((x >> 5) % 50) as i64;
                    let id = (t * 1_000_000 + n) as i64;
                    let r = db.transaction(|tx| {
                        let bal = tx
                            .query(
                                "SELECT balance FROM accounts WHERE id = $1",
                                &[Value::Int64(src)],
                            )?
                            .rows()?[0]
                            .get::<i64>(0)?;
                        if bal < amount {
                            return Ok(false);
                        }
                        tx.execute(
                            "UPDATE accounts SET balance = balance - $1 WHERE id = $2",
                            &[Value::Int64(amount), Value::Int64(src)],
                        )?;
                        tx.execute(
                            "UPDATE accounts SET balance = balance + $1 WHERE id = $2",
                            &[Value::Int64(amount), Value::Int64(dst)],
                        )?;
                        tx.execute(
                            "INSERT INTO transfers VALUES ($1, $2, $3, $4)",
                            &[
                                Value::Int64(id),
                                Value::Int64(src),
                                Value::Int64(dst),
                                Value::Int64(amount),
                            ],
                        )?;
                        Ok(true)
                    });
                    match r {
                        Ok(true) => {
                            committed.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(false) => {}
                        Err(e) if e.is_retryable() => {
                            gave_up.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("transfer failed: {e} ({})", e.sqlstate()),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut s = db.session();
    assert_eq!(
        one_i64(&mut s, "SELECT sum(balance) FROM accounts"),
        ACCOUNTS * 1000
    );
    assert_eq!(
        one_i64(&mut s, "SELECT count(*) FROM transfers") as u64,
        committed.load(Ordering::Relaxed)
    );
    assert!(committed.load(Ordering::Relaxed) > 0);
    let mismatched = one_i64(
        &mut s,
        "SELECT count(*) FROM accounts a WHERE a.balance <> 1000
           + COALESCE((SELECT sum(amount) FROM transfers t WHERE t.dst = a.id), 0)
           - COALESCE((SELECT sum(amount) FROM transfers t WHERE t.src = a.id), 0)",
    );
    assert_eq!(
        mismatched, 0,
        "every balance is explained by the transfer log"
    );
    assert_eq!(
        one_i64(&mut s, "SELECT count(*) FROM accounts WHERE balance < 0"),
        0
    );
    eprintln!(
        "bank: {} committed, {} gave up after retries",
        committed.load(Ordering::Relaxed),
        gave_up.load(Ordering::Relaxed)
    );
}

#[test]
fn stale_reads_read_an_older_snapshot() {
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE kv (k INT64 NOT NULL, v STRING(MAX)) PRIMARY KEY (k)",
        &[],
    )
    .unwrap();
    db.execute("INSERT INTO kv VALUES (1, 'old')", &[]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(600));
    db.execute("UPDATE kv SET v = 'new' WHERE k = 1", &[])
        .unwrap();
    let mut s = db.session();
    let read = |s: &mut spindle::Session| -> String {
        s.query("SELECT v FROM kv WHERE k = 1", &[])
            .unwrap()
            .rows()
            .unwrap()[0]
            .get::<String>(0)
            .unwrap()
    };
    assert_eq!(read(&mut s), "new");
    // 300 ms ago lies between the two commits.
    s.run("SET spanner.read_only_staleness = 'EXACT_STALENESS 300ms'")
        .unwrap();
    assert_eq!(read(&mut s), "old");
    s.run("BEGIN READ ONLY").unwrap();
    assert_eq!(read(&mut s), "old");
    assert_eq!(
        s.execute("DELETE FROM kv", &[]).unwrap_err().sqlstate(),
        "25006"
    );
    s.run("ROLLBACK").unwrap();
    // Writes are never stale.
    s.execute("UPDATE kv SET v = 'newer' WHERE k = 1", &[])
        .unwrap();
    s.run("SET spanner.read_only_staleness = 'MAX_STALENESS 10s'")
        .unwrap();
    assert_eq!(read(&mut s), "newer");
    s.run("SET spanner.read_only_staleness = 'READ_TIMESTAMP 2000-01-01T00:00:00Z'")
        .unwrap();
    assert_eq!(
        s.query("SELECT v FROM kv", &[]).unwrap_err().sqlstate(),
        "72000"
    );
    s.run("SET spanner.read_only_staleness = 'SOMETIMES'")
        .unwrap();
    assert_eq!(
        s.query("SELECT v FROM kv", &[]).unwrap_err().sqlstate(),
        "22023"
    );
    s.run("SET spanner.read_only_staleness = 'STRONG'").unwrap();
    assert_eq!(read(&mut s), "newer");
}

/// Autocommit increments of one row from many threads, by the cached fast
/// plan (a `$n` text and the same statement with its values inline): the
/// conflicts are retried, so no increment is lost or applied twice.
#[test]
fn concurrent_autocommit_increments_are_retried_not_lost() {
    const THREADS: i64 = 6;
    const EACH: i64 = 40;
    let db = Database::open_in_memory().unwrap();
    db.execute(
        "CREATE TABLE counters (id INT64 NOT NULL, n INT64) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    db.execute("INSERT INTO counters VALUES (1, 0)", &[])
        .unwrap();
    let before = db.engine().fast_path_count();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut s = db.session();
                for i in 0..EACH {
                    let n = if (t + i) % 2 == 0 {
                        s.execute(
                            "UPDATE counters SET n = n + $1 WHERE id = $2",
                            &[Value::Int64(1), Value::Int64(1)],
                        )
                    } else {
                        s.execute("UPDATE counters SET n = n + 1 WHERE id = 1", &[])
                    };
                    assert_eq!(n.unwrap(), 1);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(counter_1(&db), THREADS * EACH);
    // Every statement ran by its plan (a conflicted attempt counts too).
    assert!(db.engine().fast_path_count() - before >= (THREADS * EACH) as u64);
}

/// Runs `sql` on `s` in another thread: the session back, and the
/// statement's SQLSTATE if it failed.
fn spawn_run(
    mut s: spindle::Session,
    sql: &'static str,
) -> std::thread::JoinHandle<(spindle::Session, Option<String>)> {
    std::thread::spawn(move || {
        let r = s.run(sql);
        (s, r.err().map(|e| e.sqlstate().to_string()))
    })
}

fn counters(db: &Database, rows: i64) {
    db.execute(
        "CREATE TABLE counters (id INT64 NOT NULL, n INT64) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    for id in 1..=rows {
        db.execute("INSERT INTO counters VALUES ($1, 0)", &[Value::Int64(id)])
            .unwrap();
    }
}

/// Two rows of `counters` and two sessions in transaction blocks, the
/// first holding row 1's lock (it updated it).
fn counters_and_a_locked_row(db: &Database) -> (spindle::Session, spindle::Session) {
    counters(db, 2);
    let (mut a, mut b) = (db.session(), db.session());
    a.run("BEGIN").unwrap();
    b.run("BEGIN").unwrap();
    a.run("UPDATE counters SET n = n + 1 WHERE id = 1").unwrap();
    (a, b)
}

const WAIT: std::time::Duration = std::time::Duration::from_millis(100);

#[test]
fn a_second_update_of_a_row_waits_for_the_first_and_sees_its_value() {
    let db = Database::open_in_memory().unwrap();
    let (mut a, mut b) = counters_and_a_locked_row(&db);
    // b read another row first: its snapshot predates a's commit.
    assert_eq!(one_i64(&mut b, "SELECT n FROM counters WHERE id = 2"), 0);
    let waiting = spawn_run(b, "UPDATE counters SET n = n + 10 WHERE id = 1");
    std::thread::sleep(WAIT);
    assert!(!waiting.is_finished(), "b must wait for a's row lock");
    assert_eq!(commit_err(&mut a), None);
    let (mut b, err) = waiting.join().unwrap();
    assert_eq!(err, None, "b continues from a's value instead of aborting");
    assert_eq!(one_i64(&mut b, "SELECT n FROM counters WHERE id = 1"), 11);
    assert_eq!(commit_err(&mut b), None);
    assert_eq!(counter_1(&db), 11);
}

#[test]
fn crossed_updates_end_in_a_deadlock_error_for_one_side() {
    let db = Database::open_in_memory().unwrap();
    let (a, mut b) = counters_and_a_locked_row(&db);
    b.run("UPDATE counters SET n = n + 1 WHERE id = 2").unwrap();
    // Each side asks for the other's row; whichever closes the cycle gets
    // 40P01 (normally b, which asks second, but a slow start of a's thread
    // may swap them) and rolls back, and the other goes on.
    let run = |mut s: spindle::Session, sql: &'static str| {
        std::thread::spawn(move || {
            let err = s.run(sql).err();
            if err.is_some() {
                s.run("ROLLBACK").unwrap();
            }
            (s, err)
        })
    };
    let wa = run(a, "UPDATE counters SET n = n + 1 WHERE id = 2");
    std::thread::sleep(WAIT);
    let wb = run(b, "DELETE FROM counters WHERE id = 1");
    let (mut a, ea) = wa.join().unwrap();
    let (mut b, eb) = wb.join().unwrap();
    let a_won = eb.is_some();
    let err = match (ea, eb) {
        (Some(e), None) | (None, Some(e)) => e,
        other => panic!("exactly one side must fail: {other:?}"),
    };
    assert_eq!(err.sqlstate(), "40P01", "{err}");
    assert!(err.is_retryable());
    // The winner commits; the loser's COMMIT finds no transaction block.
    assert_eq!(commit_err(&mut a), None);
    assert_eq!(commit_err(&mut b), None);
    let mut s = db.session();
    let (sum, count) = if a_won { (2, 2) } else { (1, 1) };
    assert_eq!(one_i64(&mut s, "SELECT sum(n) FROM counters"), sum);
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM counters"), count);
}

#[test]
fn lock_timeout_bounds_the_wait_for_a_row_lock() {
    let db = Database::open_in_memory().unwrap();
    counters(&db, 1);
    let (mut a, mut b) = (db.session(), db.session());
    a.run("BEGIN").unwrap();
    a.run("UPDATE counters SET n = 5 WHERE id = 1").unwrap();
    b.run("SET lock_timeout = '50ms'").unwrap();
    for sql in [
        "UPDATE counters SET n = n + 1 WHERE id = 1",
        "DELETE FROM counters WHERE id = 1",
    ] {
        let started = std::time::Instant::now();
        let err = b.run(sql).unwrap_err();
        assert_eq!(err.sqlstate(), "55P03", "{sql}");
        assert!(started.elapsed() >= std::time::Duration::from_millis(50));
    }
    // Set inside a transaction block, it applies to its next statements.
    b.run("SET lock_timeout = 0").unwrap();
    b.run("BEGIN").unwrap();
    b.run("SET lock_timeout = '20ms'").unwrap();
    let err = b.run("UPDATE counters SET n = 7 WHERE id = 1").unwrap_err();
    assert_eq!(err.sqlstate(), "55P03");
    b.run("ROLLBACK").unwrap();
    assert_eq!(commit_err(&mut a), None);
    b.run("UPDATE counters SET n = n + 1 WHERE id = 1").unwrap();
    assert_eq!(one_i64(&mut b, "SELECT n FROM counters WHERE id = 1"), 6);
}

#[test]
fn a_hot_row_updated_by_many_transactions_never_aborts() {
    // TPC-B's shape: every transaction updates one shared row and inserts
    // a row of its own. Without row locks most of them failed with 40001;
    // with them each waits its turn and refreshes, so none may fail.
    const THREADS: i64 = 6;
    const EACH: i64 = 25;
    let db = Database::open_in_memory().unwrap();
    counters(&db, 1);
    db.execute(
        "CREATE TABLE history (id INT64 NOT NULL, delta INT64) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut s = db.session();
                for i in 0..EACH {
                    s.run("BEGIN").unwrap();
                    s.execute(
                        "UPDATE counters SET n = n + $1 WHERE id = 1",
                        &[Value::Int64(t + 1)],
                    )
                    .unwrap();
                    s.execute(
                        "INSERT INTO history VALUES ($1, $2)",
                        &[Value::Int64(t * 1000 + i), Value::Int64(t + 1)],
                    )
                    .unwrap();
                    assert_eq!(commit_err(&mut s), None);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut s = db.session();
    let total: i64 = (1..=THREADS).sum::<i64>() * EACH;
    assert_eq!(
        one_i64(&mut s, "SELECT n FROM counters WHERE id = 1"),
        total
    );
    assert_eq!(one_i64(&mut s, "SELECT sum(delta) FROM history"), total);
}

#[test]
fn an_autocommit_update_whose_refresh_fails_is_retried() {
    let db = Database::open_in_memory().unwrap();
    counters(&db, 1);
    let mut a = db.session();
    a.run("BEGIN").unwrap();
    a.run("UPDATE counters SET n = n + 1 WHERE id = 1").unwrap();
    // a also changes the schema: b, waiting on the row, cannot move its
    // snapshot past that commit (every transaction reads the catalog), so
    // its first attempt fails; autocommit runs it again.
    a.run("CREATE TABLE other (id INT64 NOT NULL) PRIMARY KEY (id)")
        .unwrap();
    let waiting = spawn_run(db.session(), "UPDATE counters SET n = n + 10 WHERE id = 1");
    std::thread::sleep(WAIT);
    assert!(!waiting.is_finished());
    assert_eq!(commit_err(&mut a), None);
    let (_, err) = waiting.join().unwrap();
    assert_eq!(err, None);
    assert_eq!(counter_1(&db), 11);
}

#[test]
fn select_for_update_by_key_waits_for_the_row_lock() {
    // Read-then-write with FOR UPDATE: the second reader waits for the
    // first writer's commit and reads its value, so neither aborts (without
    // the lock, b would compute from 0 and fail with 40001 at commit).
    let db = Database::open_in_memory().unwrap();
    counters(&db, 1);
    let (mut a, mut b) = (db.session(), db.session());
    a.run("BEGIN").unwrap();
    b.run("BEGIN").unwrap();
    let read = "SELECT n FROM counters WHERE id = $1 FOR UPDATE";
    let write = "UPDATE counters SET n = $1 WHERE id = 1";
    let na = a.query(read, &[Value::Int64(1)]).unwrap().rows().unwrap()[0]
        .get::<i64>(0)
        .unwrap();
    let waiting = std::thread::spawn(move || {
        let nb = b.query(read, &[Value::Int64(1)]).unwrap().rows().unwrap()[0]
            .get::<i64>(0)
            .unwrap();
        b.execute(write, &[Value::Int64(nb + 1)]).unwrap();
        (nb, commit_err(&mut b))
    });
    std::thread::sleep(WAIT);
    assert!(!waiting.is_finished(), "b's FOR UPDATE waits for a's lock");
    a.execute(write, &[Value::Int64(na + 1)]).unwrap();
    assert_eq!(commit_err(&mut a), None);
    assert_eq!(waiting.join().unwrap(), (1, None));
    assert_eq!(counter_1(&db), 2);

    // In a read-only transaction FOR UPDATE is a plain read: no wait.
    a.run("BEGIN").unwrap();
    a.run("UPDATE counters SET n = 9 WHERE id = 1").unwrap();
    let mut c = db.session();
    c.run("BEGIN READ ONLY").unwrap();
    assert_eq!(
        one_i64(&mut c, "SELECT n FROM counters WHERE id = 1 FOR UPDATE"),
        2
    );
    c.run("COMMIT").unwrap();
    // Over a key range FOR UPDATE takes no lock either (the general path).
    assert_eq!(
        one_i64(&mut c, "SELECT n FROM counters WHERE id >= 1 FOR UPDATE"),
        2
    );
    a.run("ROLLBACK").unwrap();
}
