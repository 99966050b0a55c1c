//! The installed psql binary (PostgreSQL 15 client) against a server
//! started by the test: DDL with interleaving, inserts, `\dt`, `\d table`
//! (columns, primary key, and the interleave parent), `\l`, a query.
//! Skipped, with a notice, when psql is not installed.

use std::net::SocketAddr;
use std::process::Command;

/// The installed psql; `None` (skip) when there is none, unless
/// SPINDLE_REQUIRE_CLIENTS=1 (set by .ci/run), which makes that a failure.
fn psql_binary() -> Option<String> {
    for p in ["/usr/bin/psql", "/usr/lib/postgresql/15/bin/psql"] {
        if std::path::Path::new(p).exists() {
            return Some(p.to_string());
        }
    }
    if std::env::var("SPINDLE_REQUIRE_CLIENTS").is_ok_and(|v| v == "1") {
        panic!("psql is not installed, and SPINDLE_REQUIRE_CLIENTS=1 requires it");
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

/// Runs psql with `args` (after the connection options); returns its exit
/// status, stdout and stderr.
fn run_psql(bin: &str, addr: SocketAddr, args: &[&str]) -> (bool, String, String) {
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
    .env("COLUMNS", "200")
    .args(args);
    let out = cmd.output().expect("run psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Runs psql with `-c` for each command; returns stdout, panicking with
/// stderr if psql fails.
fn psql(bin: &str, addr: SocketAddr, commands: &[&str]) -> String {
    let mut args = Vec::new();
    for c in commands {
        args.extend(["-c", c]);
    }
    let (ok, stdout, stderr) = run_psql(bin, addr, &args);
    assert!(
        ok && stderr.is_empty(),
        "psql {commands:?} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
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
fn psql_copy() {
    let Some(bin) = psql_binary() else {
        println!("NOTICE: psql is not installed; skipping the psql \\copy scenario");
        return;
    };
    let addr = start();
    psql(
        &bin,
        addr,
        &[
            "CREATE TABLE singers (singer_id INT64 NOT NULL, name STRING(100)) PRIMARY KEY (singer_id)",
            "CREATE TABLE albums (singer_id INT64 NOT NULL, album_id INT64 NOT NULL, title STRING(MAX)) \
             PRIMARY KEY (singer_id, album_id), INTERLEAVE IN PARENT singers ON DELETE CASCADE",
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();

    // \copy … from a CSV file with a header, and from a text-format file.
    std::fs::write(
        path("singers.csv"),
        "singer_id,name\n1,Marc\n2,\"Smith, Jr\"\n3,\n",
    )
    .unwrap();
    let out = psql(
        &bin,
        addr,
        &[&format!(
            "\\copy singers from '{}' with (format csv, header)",
            path("singers.csv")
        )],
    );
    assert_eq!(out.trim(), "COPY 3");
    std::fs::write(path("albums.txt"), "1\t1\tTotal Junk\n2\t1\tGreen\n").unwrap();
    let out = psql(
        &bin,
        addr,
        &[&format!("\\copy albums from '{}'", path("albums.txt"))],
    );
    assert_eq!(out.trim(), "COPY 2");

    // \copy … to a file and to stdout, CSV and text.
    let out = psql(
        &bin,
        addr,
        &[&format!(
            "\\copy singers to '{}' csv header",
            path("out.csv")
        )],
    );
    assert_eq!(out.trim(), "COPY 3");
    assert_eq!(
        std::fs::read_to_string(path("out.csv")).unwrap(),
        "singer_id,name\n1,Marc\n2,\"Smith, Jr\"\n3,\n"
    );
    let out = psql(
        &bin,
        addr,
        &["\\copy (SELECT a.title, s.name FROM albums a JOIN singers s ON s.singer_id = a.singer_id ORDER BY a.singer_id) to stdout"],
    );
    assert_eq!(out, "Total Junk\tMarc\nGreen\tSmith, Jr\n");

    // A failing \copy (a child row without its parent) writes nothing.
    std::fs::write(path("orphans.txt"), "3\t1\tok\n9\t1\torphan\n").unwrap();
    let (ok, _, stderr) = run_psql(
        &bin,
        addr,
        &[
            "-c",
            &format!("\\copy albums from '{}'", path("orphans.txt")),
        ],
    );
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("violates interleave"), "{stderr}");
    let out = psql(&bin, addr, &["SELECT count(*) FROM albums"]);
    assert!(out.contains("     2\n"), "{out}");

    // COPY FROM STDIN with its data inline in a script (as pg_dump
    // writes), then the script goes on.
    std::fs::write(
        path("script.sql"),
        "COPY singers (singer_id, name) FROM STDIN;\n10\tTen\n11\t\\N\n\\.\nSELECT count(*) AS n FROM singers WHERE name IS NULL;\n",
    )
    .unwrap();
    let (ok, stdout, stderr) = run_psql(&bin, addr, &["-f", &path("script.sql")]);
    assert!(ok && stderr.is_empty(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("COPY 2\n"), "{stdout}");
    assert!(stdout.contains("\n 2\n(1 row)"), "{stdout}");
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

#[test]
fn psql_expanded_display_and_timing() {
    let Some(bin) = psql_binary() else {
        println!("NOTICE: psql is not installed; skipping the psql \\x / \\timing scenario");
        return;
    };
    let addr = start();
    psql(
        &bin,
        addr,
        &[
            "CREATE TABLE singers (singer_id INT64 NOT NULL, name STRING(100)) PRIMARY KEY (singer_id)",
            "INSERT INTO singers VALUES (1, 'Marc'), (2, NULL)",
        ],
    );

    // \x: one "-[ RECORD n ]" block per row, a line per column.
    let x = psql(
        &bin,
        addr,
        &[
            "\\x on",
            "SELECT singer_id, name FROM singers ORDER BY singer_id",
        ],
    );
    println!("{x}");
    assert!(x.contains("Expanded display is on."), "{x}");
    assert!(
        x.contains("-[ RECORD 1 ]---\nsinger_id | 1\nname      | Marc\n"),
        "{x}"
    );
    assert!(
        x.contains("-[ RECORD 2 ]---\nsinger_id | 2\nname      | \n"),
        "{x}"
    );
    // \x auto picks the normal layout for a narrow result.
    let x = psql(&bin, addr, &["\\x auto", "SELECT 1 AS one"]);
    assert!(x.contains("Expanded display is used automatically."), "{x}");
    assert!(x.contains(" one \n-----\n   1\n(1 row)"), "{x}");

    // \timing: a "Time: … ms" line after every statement, errors included
    // in the session going on.
    let t = psql(
        &bin,
        addr,
        &[
            "\\timing on",
            "SELECT count(*) FROM singers",
            "UPDATE singers SET name = 'Cat' WHERE singer_id = 2",
        ],
    );
    println!("{t}");
    assert!(t.contains("Timing is on."), "{t}");
    let times: Vec<&str> = t.lines().filter(|l| l.starts_with("Time: ")).collect();
    assert_eq!(times.len(), 2, "{t}");
    for line in times {
        let ms = line
            .strip_prefix("Time: ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok());
        assert!(
            ms.is_some_and(|ms| ms >= 0.0) && line.contains(" ms"),
            "{line}"
        );
    }
    assert!(t.contains("UPDATE 1"), "{t}");
}
