//! SIGKILL under a concurrent cross-split workload: a child process runs
//! four threads of bank transfers between accounts in different splits
//! (two-phase commits), printing each acknowledged transfer; the parent
//! kills it mid-flight, reopens the database and checks that the money is
//! all there, that every acknowledged transfer is present, and that every
//! balance is explained by the transfers that survived.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spindle::{Database, Value};

const ROLE_ENV: &str = "SPINDLE_CRASH_2PC_CHILD";
const ACCOUNTS: i64 = 32;
const OPENING: i64 = 1000;

fn open(dir: &Path) -> Database {
    let db = Database::open(dir).unwrap();
    db.engine().manager().set_split_threshold(1500);
    db
}

fn one_i64(db: &Database, sql: &str) -> i64 {
    db.query(sql, &[]).unwrap().rows().unwrap()[0]
        .get::<i64>(0)
        .unwrap()
}

fn child(dir: &Path, run: i64) -> ! {
    let db = open(dir);
    db.execute("CREATE TABLE IF NOT EXISTS accounts (id INT64 NOT NULL, balance INT64 NOT NULL, pad STRING(MAX)) PRIMARY KEY (id)", &[])
        .unwrap();
    db.execute(
        "CREATE TABLE IF NOT EXISTS transfers (id INT64 NOT NULL, src INT64, dst INT64, amount INT64) PRIMARY KEY (id)",
        &[],
    )
    .unwrap();
    if one_i64(&db, "SELECT count(*) FROM accounts") == 0 {
        for i in 0..ACCOUNTS {
            db.execute(
                "INSERT INTO accounts VALUES ($1, $2, $3)",
                &[
                    Value::Int64(i),
                    Value::Int64(OPENING),
                    Value::String("p".repeat(100)),
                ],
            )
            .unwrap();
        }
    }
    let splits = one_i64(&db, "SELECT count(*) FROM spindle_sys.splits");
    let stdout = std::sync::Arc::new(std::sync::Mutex::new(std::io::stdout()));
    {
        let mut out = stdout.lock().unwrap();
        writeln!(out, "SPLITS {splits}").unwrap();
        out.flush().unwrap();
    }
    let threads: Vec<_> = (0..4i64)
        .map(|t| {
            let db = db.clone();
            let stdout = stdout.clone();
            std::thread::spawn(move || {
                for n in 0.. {
                    let src = (t * 7 + n * 3) % ACCOUNTS;
                    let dst = (src + ACCOUNTS / 2) % ACCOUNTS; // far apart: another split
                    let id = run * 1_000_000_000 + t * 100_000_000 + n;
                    let r = db.transaction(|tx| {
                        tx.execute(
                            "UPDATE accounts SET balance = balance - 1 WHERE id = $1",
                            &[Value::Int64(src)],
                        )?;
                        tx.execute(
                            "UPDATE accounts SET balance = balance + 1 WHERE id = $1",
                            &[Value::Int64(dst)],
                        )?;
                        tx.execute(
                            "INSERT INTO transfers VALUES ($1, $2, $3, 1)",
                            &[Value::Int64(id), Value::Int64(src), Value::Int64(dst)],
                        )?;
                        Ok(())
                    });
                    if r.is_ok() {
                        let mut out = stdout.lock().unwrap();
                        writeln!(out, "ACK {id}").unwrap();
                        out.flush().unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    std::process::exit(0)
}

fn run_and_kill(dir: &Path, run: i64, acks_wanted: usize) -> Vec<i64> {
    let exe = std::env::current_exe().unwrap();
    let test = crate::common::libtest_name(module_path!(), "sigkill_during_cross_split_transfers");
    let mut child = Command::new(exe)
        .args(["--exact", test.as_str(), "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, format!("{}|{run}", dir.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let reader = BufReader::new(child.stdout.take().unwrap());
    let mut acks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut splits = 0;
    for line in reader.lines() {
        let line = line.unwrap();
        if let Some(id) = line.strip_prefix("ACK ") {
            acks.push(id.parse().unwrap());
        } else if let Some(i) = line.find("SPLITS ") {
            // libtest's "test name ... " may precede it on the same line.
            splits = line[i + 7..].trim().parse().unwrap();
        }
        if acks.len() >= acks_wanted || Instant::now() > deadline {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    eprintln!(
        "child {run}: {} acks, {splits} splits, {status}",
        acks.len()
    );
    assert!(splits >= 2, "the accounts span several splits ({splits})");
    assert!(
        acks.len() >= acks_wanted,
        "child acknowledged only {} transfers",
        acks.len()
    );
    acks
}

fn check(dir: &Path, acked: &[i64]) {
    let db = open(dir);
    assert_eq!(
        one_i64(&db, "SELECT sum(balance) FROM accounts"),
        ACCOUNTS * OPENING,
        "money was created or lost"
    );
    let present: std::collections::HashSet<i64> = db
        .query("SELECT id FROM transfers", &[])
        .unwrap()
        .rows()
        .unwrap()
        .iter()
        .map(|r| r.get::<i64>(0).unwrap())
        .collect();
    for id in acked {
        assert!(
            present.contains(id),
            "acknowledged transfer {id} is missing"
        );
    }
    let unexplained = one_i64(
        &db,
        "SELECT count(*) FROM accounts a WHERE a.balance <> 1000
           + COALESCE((SELECT sum(amount) FROM transfers t WHERE t.dst = a.id), 0)
           - COALESCE((SELECT sum(amount) FROM transfers t WHERE t.src = a.id), 0)",
    );
    assert_eq!(unexplained, 0, "a transfer was applied in part");
}

#[test]
fn sigkill_during_cross_split_transfers() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        let (dir, run) = role.split_once('|').unwrap();
        child(Path::new(dir), run.parse().unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let mut acked = run_and_kill(dir.path(), 1, 40);
    check(dir.path(), &acked);
    acked.extend(run_and_kill(dir.path(), 2, 40));
    check(dir.path(), &acked);
}
