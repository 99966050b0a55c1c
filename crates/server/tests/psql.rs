//! The installed psql binary (PostgreSQL 15 client) against a server
//! started by the test: DDL with interleaving, inserts, `\dt`, `\d table`
//! (columns, primary key, and the interleave parent), `\l`, a query.
//! Skipped, with a notice, when psql is not installed.

use std::net::SocketAddr;
use std::process::Command;

fn psql_binary() -> Option<String> {
    for p in ["/usr/bin/psql", "/usr/lib/postgresql/15/bin/psql"] {
        if std::path::Path::new(p).exists() {
            return Some(p.to_string());
        }
    }
    None
}

fn start() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let engine = spindle_sql::Engine::open(None).unwrap();
            let server = spindle_server::Server::bind(
                engine,
                "127.0.0.1:0".parse().unwrap(),
                spindle_server::Config { password: None },
            )
            .await
            .unwrap();
            tx.send(server.local_addr().unwrap()).unwrap();
            server.serve(std::future::pending()).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

/// Runs psql with `-c` for each command; returns stdout, panicking with
/// stderr if psql fails.
fn psql(bin: &str, addr: SocketAddr, commands: &[&str]) -> String {
    let mut cmd = Command::new(bin);
    cmd.args([
        "-X",
        "-v",
        "ON_ERROR_STOP=1",
        "-h",
        "127.0.0.1",
        "-p",
        &addr.port().to_string(),
        "-U",
        "spindle",
        "-d",
        "spindle",
    ])
    .env("PGCONNECT_TIMEOUT", "10")
    .env("PAGER", "")
    .env("PSQL_PAGER", "")
    .env("PGSSLMODE", "disable")
    .env("COLUMNS", "200");
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd.output().expect("run psql");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success() && stderr.is_empty(),
        "psql {commands:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

#[test]
fn psql_scenario() {
    let Some(bin) = psql_binary() else {
        println!("NOTICE: psql is not installed; skipping the psql scenario");
        return;
    };
    let addr = start();
    let out = psql(
        &bin,
        addr,
        &[
            "CREATE TABLE singers (singer_id INT64 NOT NULL, name STRING(100)) PRIMARY KEY (singer_id)",
            "CREATE TABLE albums (singer_id INT64 NOT NULL, album_id INT64 NOT NULL, title STRING(MAX)) \
             PRIMARY KEY (singer_id, album_id), INTERLEAVE IN PARENT singers ON DELETE CASCADE",
            "INSERT INTO singers VALUES (1, 'Marc'), (2, 'Catalina')",
            "INSERT INTO albums VALUES (1, 1, 'Total Junk'), (1, 2, 'Go, Go, Go'), (2, 1, 'Green')",
        ],
    );
    assert!(out.contains("INSERT 0 3"), "{out}");

    let dt = psql(&bin, addr, &["\\dt"]);
    println!("{dt}");
    assert!(dt.contains("List of relations"), "{dt}");
    for line in [
        " public | albums  | table | spindle",
        " public | singers | table | spindle",
    ] {
        assert!(dt.contains(line), "missing {line:?} in:\n{dt}");
    }
    assert!(dt.contains("(2 rows)"), "{dt}");

    let d = psql(&bin, addr, &["\\d albums"]);
    println!("{d}");
    assert!(d.contains("Table \"public.albums\""), "{d}");
    assert!(
        d.contains(" singer_id | bigint            |           | not null |"),
        "{d}"
    );
    assert!(d.contains(" title     | character varying |"), "{d}");
    assert!(
        d.contains("\"albums_pkey\" PRIMARY KEY, btree (singer_id, album_id)"),
        "{d}"
    );
    assert!(
        d.contains("\"albums_interleave\" INTERLEAVE IN PARENT singers ON DELETE CASCADE"),
        "{d}"
    );

    let d = psql(&bin, addr, &["\\d singers"]);
    println!("{d}");
    assert!(d.contains(" name      | character varying(100) |"), "{d}");
    assert!(d.contains("Referenced by:"), "{d}");

    let d = psql(&bin, addr, &["\\d"]);
    assert!(d.contains(" public | albums  | table | spindle"), "{d}");

    let dplus = psql(&bin, addr, &["\\dt+"]);
    assert!(
        dplus.contains("INTERLEAVE IN PARENT singers ON DELETE CASCADE"),
        "{dplus}"
    );

    let dplus = psql(&bin, addr, &["\\d+ albums"]);
    assert!(
        dplus.contains("\"albums_interleave\" INTERLEAVE IN PARENT singers ON DELETE CASCADE"),
        "{dplus}"
    );

    let di = psql(&bin, addr, &["\\di"]);
    assert!(
        di.contains(" public | albums_pkey  | index | spindle | albums"),
        "{di}"
    );

    let l = psql(&bin, addr, &["\\l"]);
    println!("{l}");
    assert!(l.contains("List of databases"), "{l}");
    assert!(l.contains(" spindle "), "{l}");

    let q = psql(
        &bin,
        addr,
        &["SELECT s.name, count(*) AS albums FROM singers s JOIN albums a ON a.singer_id = s.singer_id GROUP BY s.name ORDER BY s.name"],
    );
    println!("{q}");
    assert!(q.contains(" Catalina |      1"), "{q}");
    assert!(q.contains(" Marc     |      2"), "{q}");
}

#[test]
fn psql_lists_secondary_indexes() {
    let Some(bin) = psql_binary() else {
        println!("note: psql not installed; skipping");
        return;
    };
    let addr = start();
    psql(
        &bin,
        addr,
        &[
            "CREATE TABLE singers (id bigint PRIMARY KEY, name varchar, rank bigint)",
            "CREATE TABLE albums (id bigint, aid bigint, title varchar, PRIMARY KEY (id, aid)) INTERLEAVE IN PARENT singers ON DELETE CASCADE",
            "CREATE UNIQUE INDEX singers_name ON singers (name) INCLUDE (rank)",
            "CREATE INDEX singers_rank ON singers (rank DESC) WHERE rank IS NOT NULL",
            "CREATE INDEX albums_title ON albums (id, title) INTERLEAVE IN singers",
        ],
    );
    let di = psql(&bin, addr, &["\\di"]);
    for (name, table) in [
        ("singers_name", "singers"),
        ("singers_rank", "singers"),
        ("albums_title", "albums"),
    ] {
        assert!(
            di.lines()
                .any(|l| l.contains(name) && l.contains("index") && l.contains(table)),
            "{di}"
        );
    }
    let d = psql(&bin, addr, &["\\d singers"]);
    assert!(
        d.contains("\"singers_name\" UNIQUE, btree (name) INCLUDE (rank)"),
        "{d}"
    );
    assert!(
        d.contains("\"singers_rank\" btree (rank DESC) WHERE rank IS NOT NULL"),
        "{d}"
    );
    let d = psql(&bin, addr, &["\\d albums"]);
    assert!(
        d.contains("\"albums_title\" btree (id, title) INTERLEAVE IN singers"),
        "{d}"
    );
}
