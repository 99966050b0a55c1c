//! Real PostgreSQL drivers against a server started by the test on a free
//! port: psycopg 3 (Python) and node-postgres (`pg`) run the scenarios in
//! `tests/clients/` — interleaved tables, parameterized inserts and
//! selects, a committed and a rolled-back transaction, and errors checked
//! by SQLSTATE (23505, …).
//!
//! pgbench runs a custom script (`-n -f`, a random key, a SELECT and an
//! UPDATE) with 4 clients in `-M simple` and `-M prepared`, and once more
//! inside BEGIN/END with `--max-tries` retrying serialization failures
//! (40001): 0 failed transactions, and no update lost.
//!
//! `.ci/run` installs the clients from their registries and sets
//! `SPINDLE_REQUIRE_CLIENTS=1`: then a missing client fails the test.
//! Without it a missing client is skipped with a notice.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one client script may run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

/// Starts a server on a new in-memory database after running `setup`.
fn start(setup: &'static str) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let engine = spindle_sql::Engine::open(None).unwrap();
            engine.session().execute(setup, &[]).await.unwrap();
            let server = spindle_server::Server::bind(
                engine,
                "127.0.0.1:0".parse().unwrap(),
                spindle_server::Config::default(),
            )
            .await
            .unwrap();
            tx.send(server.local_addr().unwrap()).unwrap();
            server.serve(std::future::pending()).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

fn clients_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// Whether `cmd` runs and exits 0 (quietly).
fn works(mut cmd: Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Reports a missing client: a failure when SPINDLE_REQUIRE_CLIENTS=1,
/// else a notice. Returns normally only when skipping.
fn missing(what: &str, install: &str) {
    if std::env::var("SPINDLE_REQUIRE_CLIENTS").is_ok_and(|v| v == "1") {
        panic!("{what} is not installed, and SPINDLE_REQUIRE_CLIENTS=1 requires it ({install})");
    }
    println!("NOTICE: {what} is not installed; skipping (install: {install})");
}

/// Runs `cmd` to completion (killed after [`SCRIPT_TIMEOUT`]); returns
/// whether it succeeded, its stdout and its stderr.
fn run(mut cmd: Command) -> (bool, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the client");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > SCRIPT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    match status {
        Some(s) => (s.success(), out, err),
        None => (
            false,
            out,
            format!("{err}\n(killed after {SCRIPT_TIMEOUT:?})"),
        ),
    }
}

#[test]
fn psycopg_scenario() {
    let mut probe = Command::new("python3");
    probe.args(["-c", "import psycopg"]);
    if !works(probe) {
        missing(
            "python3 with psycopg 3",
            "python3 -m pip install 'psycopg[binary]'",
        );
        return;
    }
    let addr = start("");
    let mut cmd = Command::new("python3");
    cmd.arg(clients_dir().join("psycopg_scenario.py"))
        .arg(addr.port().to_string());
    let (ok, out, err) = run(cmd);
    println!("{out}");
    assert!(ok, "the psycopg scenario failed:\n{out}\n{err}");
    assert!(out.contains("psycopg scenario: ok"), "{out}\n{err}");
}

#[test]
fn node_pg_scenario() {
    let mut probe = Command::new("node");
    probe
        .args(["-e", "require.resolve('pg')"])
        .current_dir(clients_dir());
    if !works(probe) {
        missing(
            "node with the pg package",
            "cd crates/server/tests/clients && npm install",
        );
        return;
    }
    let addr = start("");
    let mut cmd = Command::new("node");
    cmd.arg("node_pg_scenario.js")
        .arg(addr.port().to_string())
        .current_dir(clients_dir());
    let (ok, out, err) = run(cmd);
    println!("{out}");
    assert!(ok, "the node pg scenario failed:\n{out}\n{err}");
    assert!(out.contains("node pg scenario: ok"), "{out}\n{err}");
}

fn pgbench_binary() -> Option<String> {
    for p in ["/usr/lib/postgresql/15/bin/pgbench", "/usr/bin/pgbench"] {
        if std::path::Path::new(p).exists() {
            return Some(p.to_string());
        }
    }
    let mut probe = Command::new("pgbench");
    probe.arg("--version");
    works(probe).then(|| "pgbench".to_string())
}

/// A tokio-postgres client of the test server on `port`.
async fn connect(port: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=spindle dbname=spindle"),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    client
}

/// Rows in the pgbench table.
const ACCOUNTS: usize = 100;

#[test]
fn pgbench_custom_script() {
    let Some(bin) = pgbench_binary() else {
        missing("pgbench", "apt-get install postgresql-15 (Debian)");
        return;
    };
    let addr = start(
        "CREATE TABLE accounts (aid INT64 NOT NULL, abalance INT64 NOT NULL, filler STRING(100))
           PRIMARY KEY (aid);
         INSERT INTO accounts SELECT value, 0, 'x' FROM generate_series(1, 100)", // ACCOUNTS
    );
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("select_update.sql");
    std::fs::write(
        &script,
        format!(
            "\\set id random(1, {ACCOUNTS})\n\
             SELECT abalance FROM accounts WHERE aid = :id;\n\
             UPDATE accounts SET abalance = abalance + 1 WHERE aid = :id;\n"
        ),
    )
    .unwrap();
    let in_transaction = dir.path().join("transaction.sql");
    std::fs::write(
        &in_transaction,
        format!(
            "\\set id random(1, {ACCOUNTS})\n\
             BEGIN;\n\
             SELECT abalance FROM accounts WHERE aid = :id;\n\
             UPDATE accounts SET abalance = abalance + 1 WHERE aid = :id;\n\
             END;\n"
        ),
    )
    .unwrap();
    let port = addr.port().to_string();
    let runs: [(&std::path::Path, &str, &[&str]); 3] = [
        (&script, "simple", &[]),
        (&script, "prepared", &[]),
        (&in_transaction, "prepared", &["--max-tries=100"]),
    ];
    for (file, mode, extra) in runs {
        let mut cmd = Command::new(&bin);
        cmd.args(["-n", "-f"])
            .arg(file)
            .args(["-M", mode, "-c", "4", "-j", "2", "-t", "50"])
            .args(extra)
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "spindle", "spindle"])
            .env("PGSSLMODE", "disable")
            .env("PGCONNECT_TIMEOUT", "10");
        let (ok, out, err) = run(cmd);
        println!("pgbench -M {mode} {extra:?}:\n{out}");
        assert!(ok, "pgbench -M {mode} failed:\n{out}\n{err}");
        assert!(
            out.contains("number of transactions actually processed: 200/200"),
            "{out}\n{err}"
        );
        assert!(
            out.contains("number of failed transactions: 0 "),
            "{out}\n{err}"
        );
    }
    // Every one of the 600 increments is there: none was lost.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let total: i64 = rt.block_on(async {
        let client = connect(&port).await;
        client
            .query_one("SELECT sum(abalance) FROM accounts", &[])
            .await
            .unwrap()
            .get(0)
    });
    assert_eq!(total, 600);
}

/// `pgbench -i` as a user runs it — its own tables, created without
/// primary keys, loaded by COPY … WITH (freeze on) (or server-side by
/// INSERT … SELECT … FROM generate_series(…) AS bid), VACUUM ANALYZE, then
/// ALTER TABLE … ADD PRIMARY KEY — and then its built-in TPC-B-like
/// script, retrying serialization failures. Afterwards the balances agree
/// (TPC-B's consistency condition): every account, teller and branch
/// change and every history row came from the same committed transactions.
#[test]
fn pgbench_initializes_and_runs_its_builtin_script() {
    let Some(bin) = pgbench_binary() else {
        missing("pgbench", "apt-get install postgresql-15 (Debian)");
        return;
    };
    let addr = start("SELECT 1");
    let port = addr.port().to_string();
    let pgbench = |args: &[&str]| {
        let mut cmd = Command::new(&bin);
        cmd.args(args)
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "spindle", "spindle"])
            .env("PGSSLMODE", "disable")
            .env("PGCONNECT_TIMEOUT", "10");
        let (ok, out, err) = run(cmd);
        println!("pgbench {args:?}:\n{out}\n{err}");
        assert!(ok, "pgbench {args:?} failed:\n{out}\n{err}");
        out
    };
    // Server-side generation first; the client-side one (the default)
    // then drops and recreates everything.
    pgbench(&["-i", "-I", "dtGvp", "-s", "1"]);
    pgbench(&["-i", "-s", "1"]);
    let out = pgbench(&["-c", "2", "-j", "2", "-t", "50", "--max-tries=1000"]);
    assert!(
        out.contains("number of transactions actually processed: 100/100"),
        "{out}"
    );
    assert!(out.contains("number of failed transactions: 0 "), "{out}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sums: Vec<i64> = rt.block_on(async {
        let client = connect(&port).await;
        let mut sums = Vec::new();
        for q in [
            "SELECT count(*), sum(abalance) FROM pgbench_accounts",
            "SELECT count(*), sum(bbalance) FROM pgbench_branches",
            "SELECT count(*), sum(tbalance) FROM pgbench_tellers",
            "SELECT count(*), sum(delta) FROM pgbench_history",
        ] {
            let row = client.query_one(q, &[]).await.unwrap();
            let count: i64 = row.get(0);
            sums.push(count);
            sums.push(row.get::<_, Option<i64>>(1).unwrap_or(0));
        }
        // The keys pgbench added are primary keys: a duplicate is refused.
        let err = client
            .batch_execute("INSERT INTO pgbench_branches (bid, bbalance) VALUES (1, 0)")
            .await
            .unwrap_err();
        assert_eq!(err.code().map(|c| c.code()), Some("23505"), "{err}");
        sums
    });
    // Rows: 100 000 accounts, 1 branch, 10 tellers, one history row per
    // transaction; the balance sums agree with the history's deltas.
    assert_eq!(sums[0], 100_000);
    assert_eq!((sums[2], sums[4], sums[6]), (1, 10, 100));
    assert_eq!(sums[1], sums[7], "accounts vs history: {sums:?}");
    assert_eq!(sums[3], sums[7], "branches vs history: {sums:?}");
    assert_eq!(sums[5], sums[7], "tellers vs history: {sums:?}");
}
