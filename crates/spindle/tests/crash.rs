//! Crash test: a child process (this test binary, re-executed with
//! `SPINDLE_CRASH_CHILD` set) commits transactions in a loop and prints each
//! acknowledged commit; the parent kills it with SIGKILL at an arbitrary
//! moment, reopens the database and checks that every acknowledged commit is
//! there, whole, and nothing else is. A second child run leaves an explicit
//! transaction with inserts, an update and a cascading delete open when it is
//! killed: none of it may survive.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use spindle::{Database, Value};

const TEST_NAME: &str = "committed_transactions_survive_sigkill";
const ROLE_ENV: &str = "SPINDLE_CRASH_CHILD";
const DIR_ENV: &str = "SPINDLE_CRASH_DIR";
const START_ENV: &str = "SPINDLE_CRASH_START";
const PREFIX: &str = "CRASHTEST ";
/// Rows of the child table written with every parent row.
const ITEMS_PER_ACK: i64 = 3;
/// Commits the second child makes before it opens the transaction it never ends.
const SECOND_RUN_COMMITS: i64 = 20;
const LINE_TIMEOUT: Duration = Duration::from_secs(180);

#[test]
fn committed_transactions_survive_sigkill() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        let dir = std::env::var(DIR_ENV).expect("SPINDLE_CRASH_DIR");
        let start: i64 = std::env::var(START_ENV)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        match role.as_str() {
            "loop" => child_commit_loop(Path::new(&dir), start),
            "open" => child_leave_open(Path::new(&dir), start),
            other => panic!("unknown child role {other}"),
        }
    }
    parent();
}

fn payload(id: i64) -> String {
    format!("payload of commit {id} ").repeat(8)
}

fn item_payload(id: i64, seq: i64) -> String {
    format!("item {seq} of commit {id}")
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{PREFIX}{line}").unwrap();
    out.flush().unwrap();
}

// ---------------------------------------------------------------------------
// Child side

fn open_and_create(dir: &Path) -> Database {
    let db = Database::open(dir).expect("child: open");
    let mut s = db.session();
    s.run(
        "CREATE TABLE IF NOT EXISTS Acks (Id INT64 NOT NULL, Payload STRING(MAX)) PRIMARY KEY (Id)",
    )
    .expect("child: create Acks");
    s.run(
        "CREATE TABLE IF NOT EXISTS Items (Id INT64 NOT NULL, Seq INT64 NOT NULL, Payload STRING(MAX)) \
         PRIMARY KEY (Id, Seq), INTERLEAVE IN PARENT Acks ON DELETE CASCADE",
    )
    .expect("child: create Items");
    db
}

fn write_commit(s: &mut spindle::Session, id: i64) -> spindle::Result<()> {
    s.execute(
        "INSERT INTO Acks (Id, Payload) VALUES ($1, $2)",
        &[Value::Int64(id), Value::String(payload(id))],
    )?;
    for seq in 0..ITEMS_PER_ACK {
        s.execute(
            "INSERT INTO Items (Id, Seq, Payload) VALUES ($1, $2, $3)",
            &[
                Value::Int64(id),
                Value::Int64(seq),
                Value::String(item_payload(id, seq)),
            ],
        )?;
    }
    Ok(())
}

/// Commits forever, alternating the embedded transaction API and explicit
/// BEGIN/COMMIT, printing `ACK <id>` after each commit returned.
fn child_commit_loop(dir: &Path, start: i64) -> ! {
    let db = open_and_create(dir);
    let mut s = db.session();
    say("READY");
    let mut id = start;
    loop {
        if id % 2 == 0 {
            db.transaction(|tx| write_commit(tx, id))
                .expect("child: transaction");
        } else {
            s.run("BEGIN").expect("child: BEGIN");
            write_commit(&mut s, id).expect("child: writes");
            s.run("COMMIT").expect("child: COMMIT");
        }
        say(&format!("ACK {id}"));
        id += 1;
    }
}

/// Commits a few transactions, then leaves one open with an insert (with
/// children), an update and a cascading delete of acknowledged rows, prints
/// `OPEN` and waits to be killed.
fn child_leave_open(dir: &Path, start: i64) -> ! {
    let db = open_and_create(dir);
    let mut s = db.session();
    say("READY");
    for id in start..start + SECOND_RUN_COMMITS {
        s.run("BEGIN").expect("child: BEGIN");
        write_commit(&mut s, id).expect("child: writes");
        s.run("COMMIT").expect("child: COMMIT");
        say(&format!("ACK {id}"));
    }
    s.run("BEGIN").expect("child: BEGIN");
    write_commit(&mut s, -1).expect("child: uncommitted insert");
    s.execute(
        "UPDATE Acks SET Payload = 'uncommitted update' WHERE Id = $1",
        &[Value::Int64(start)],
    )
    .expect("child: uncommitted update");
    s.execute("DELETE FROM Acks WHERE Id = $1", &[Value::Int64(start + 1)])
        .expect("child: uncommitted delete");
    say("OPEN");
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

// ---------------------------------------------------------------------------
// Parent side

struct Run {
    acks: Vec<i64>,
    saw_open: bool,
}

fn spawn_child(dir: &Path, role: &str, start: i64) -> (Child, Receiver<String>) {
    let exe = std::env::current_exe().expect("current_exe");
    let test = crate::common::libtest_name(module_path!(), TEST_NAME);
    let mut child = Command::new(exe)
        .args([
            test.as_str(),
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ROLE_ENV, role)
        .env(DIR_ENV, dir)
        .env(START_ENV, start.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(msg) = line.strip_prefix(PREFIX) {
                if tx.send(msg.to_string()).is_err() {
                    break;
                }
            }
        }
    });
    (child, rx)
}

/// Reads the child's messages until `done` says so, then SIGKILLs it.
fn run_child(dir: &Path, role: &str, start: i64, done: impl Fn(&Run) -> bool) -> Run {
    let (mut child, rx) = spawn_child(dir, role, start);
    let mut run = Run {
        acks: Vec::new(),
        saw_open: false,
    };
    loop {
        match rx.recv_timeout(LINE_TIMEOUT) {
            Ok(msg) => {
                if let Some(id) = msg.strip_prefix("ACK ") {
                    run.acks.push(id.parse().expect("ack id"));
                } else if msg == "OPEN" {
                    run.saw_open = true;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "child ({role}) printed nothing for {LINE_TIMEOUT:?}; acks so far: {}",
                    run.acks.len()
                );
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = child.wait().expect("wait");
                panic!(
                    "child ({role}) exited on its own with {status} after {} acks (see its stderr above)",
                    run.acks.len()
                );
            }
        }
        if done(&run) {
            break;
        }
    }
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("wait for the child");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "child should die of SIGKILL, got {status}"
        );
    }
    let _ = status;
    // Acks the child printed before it died but this thread had not read
    // yet (on a loaded machine it may be several commits ahead): they were
    // acknowledged too. The reader thread ends at the pipe's EOF.
    while let Ok(msg) = rx.recv_timeout(LINE_TIMEOUT) {
        if let Some(id) = msg.strip_prefix("ACK ") {
            run.acks.push(id.parse().expect("ack id"));
        }
    }
    run
}

fn query_i64s(db: &Database, sql: &str) -> Vec<Vec<i64>> {
    let rows = db.query(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.rows()
        .unwrap_or_else(|e| panic!("{sql}: rows: {e}"))
        .iter()
        .map(|row| {
            (0..row.values().len())
                .map(|i| row.get::<i64>(i).expect("i64"))
                .collect()
        })
        .collect()
}

/// Checks the database holds exactly the commits `present` (plus possibly
/// `maybe`, a commit that may have finished without being acknowledged),
/// each one whole. Returns the ids found.
fn check(db: &Database, acked: &[i64], maybe: Option<i64>) -> Vec<i64> {
    let ids: Vec<i64> = query_i64s(db, "SELECT Id FROM Acks ORDER BY Id")
        .into_iter()
        .map(|r| r[0])
        .collect();
    for id in acked {
        assert!(
            ids.contains(id),
            "acknowledged commit {id} is missing after the crash; found {} rows",
            ids.len()
        );
    }
    for id in &ids {
        assert!(
            acked.contains(id) || Some(*id) == maybe,
            "row {id} was never acknowledged (acked up to {:?}, maybe {maybe:?})",
            acked.last()
        );
    }
    // Every commit is whole: its children and its payloads.
    let items = query_i64s(db, "SELECT Id, COUNT(*) FROM Items GROUP BY Id ORDER BY Id");
    let item_ids: Vec<i64> = items.iter().map(|r| r[0]).collect();
    assert_eq!(
        item_ids, ids,
        "Items rows belong to exactly the committed Acks rows"
    );
    for r in &items {
        assert_eq!(
            r[1], ITEMS_PER_ACK,
            "commit {} has {} of its {ITEMS_PER_ACK} items",
            r[0], r[1]
        );
    }
    let rows = db
        .query("SELECT Id, Payload FROM Acks ORDER BY Id", &[])
        .expect("payloads");
    for row in rows.rows().expect("rows") {
        let id: i64 = row.get(0).unwrap();
        let p: String = row.get(1).unwrap();
        assert_eq!(p, payload(id), "payload of commit {id}");
    }
    ids
}

fn pseudo_random(lo: usize, hi: usize) -> usize {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as usize;
    lo + nanos % (hi - lo + 1)
}

fn parent() {
    let tmp = tempfile::Builder::new()
        .prefix("spindle-crash-")
        .tempdir()
        .expect("temp dir");
    let dir = tmp.path().join("db");

    // Run 1: killed in the middle of its commit loop.
    let kill_after = pseudo_random(40, 160);
    let run1 = run_child(&dir, "loop", 0, |r| r.acks.len() >= kill_after);
    let last1 = *run1.acks.last().unwrap();
    assert_eq!(run1.acks, (0..=last1).collect::<Vec<_>>());
    let ids1 = {
        let db = Database::open(&dir).expect("reopen after the first crash");
        // The commit after the last acknowledged one may have finished.
        check(&db, &run1.acks, Some(last1 + 1))
    };
    let mut acked: Vec<i64> = ids1.clone();

    // Run 2: commits, then is killed with a transaction open.
    let start2 = ids1.last().copied().unwrap_or(-1) + 1;
    let run2 = run_child(&dir, "open", start2, |r| r.saw_open);
    assert_eq!(run2.acks.len() as i64, SECOND_RUN_COMMITS);
    acked.extend(&run2.acks);
    {
        let db = Database::open(&dir).expect("reopen after the second crash");
        // Nothing of the open transaction: no row -1, the updated row keeps its
        // payload (checked in `check`), the deleted row and its items are there.
        let ids = check(&db, &acked, None);
        assert!(!ids.contains(&-1), "uncommitted insert survived");
        assert!(
            ids.contains(&(start2 + 1)),
            "uncommitted delete was applied"
        );

        // The reopened database takes new writes.
        db.transaction(|tx| write_commit(tx, 1_000_000))
            .expect("write after recovery");
        acked.push(1_000_000);
        check(&db, &acked, None);
    }
    // Recovery is repeatable: a clean close and another open see the same.
    let db = Database::open(&dir).expect("third open");
    check(&db, &acked, None);
}
