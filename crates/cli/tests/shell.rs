//! End-to-end tests of `spindle shell`: they run the built binary on a
//! temporary data directory, feeding SQL through stdin or `-c`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs `spindle <args>` with `stdin` piped in.
fn spindle(args: &[&str], stdin: &str) -> Output {
    spindle_env(args, stdin, &[])
}

fn spindle_env(args: &[&str], stdin: &str, env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("SPINDLE_DATA_DIR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn spindle");
    {
        let mut input = child.stdin.take().expect("stdin is piped");
        input.write_all(stdin.as_bytes()).expect("write stdin");
        // Dropping `input` closes stdin: end of the script.
    }
    child.wait_with_output().expect("wait for spindle")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn data_dir_arg(dir: &Path) -> String {
    dir.join("db").to_string_lossy().into_owned()
}

const CREATE_SINGERS: &str = "CREATE TABLE singers (singer_id bigint NOT NULL, name varchar, \
                              PRIMARY KEY (singer_id));";

#[test]
fn piped_script_runs_every_statement_and_reports_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = data_dir_arg(tmp.path());
    let script = format!(
        "{CREATE_SINGERS}\n\
         -- a comment; with a semicolon\n\
         INSERT INTO singers (singer_id, name)\n\
         VALUES (1, 'Marc'), (2, 'Catalina; the second'), (10, NULL);\n\
         SELECT * FROM no_such_table;\n\
         SELECT singer_id, name FROM singers ORDER BY singer_id;\n\
         SELECT name FROM singers WHERE singer_id = 1\n"
    );
    let out = spindle(&["shell", "--data-dir", &dir], &script);
    let (so, se) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "stdout:\n{so}\nstderr:\n{se}");

    // The failing statement is reported on stderr with its SQLSTATE…
    assert_eq!(se.matches("ERROR:  ").count(), 1, "stderr:\n{se}");
    assert!(se.contains("(SQLSTATE 42P01)"), "stderr:\n{se}");
    assert!(se.to_lowercase().contains("no_such_table"), "stderr:\n{se}");

    // …and everything before and after it ran.
    let expected = [
        "CREATE TABLE",
        "INSERT 0 3",
        " singer_id |         name",
        "-----------+----------------------",
        "         1 | Marc",
        "         2 | Catalina; the second",
        "        10 |",
        "(3 rows)",
        "",
        " name",
        "------",
        " Marc",
        "(1 row)",
        "",
        "",
    ]
    .join("\n");
    assert_eq!(so, expected, "stderr:\n{se}");
}

#[test]
fn command_flag_runs_sql_and_sets_exit_status() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = data_dir_arg(tmp.path());

    let ok = spindle(
        &[
            "shell",
            "--data-dir",
            &dir,
            "-c",
            &format!("{CREATE_SINGERS} INSERT INTO singers VALUES (7, 'x'); SELECT count(*) AS n FROM singers"),
        ],
        "SELECT 'stdin is ignored with -c';",
    );
    assert_eq!(ok.status.code(), Some(0), "stderr:\n{}", stderr(&ok));
    assert_eq!(
        stdout(&ok),
        "CREATE TABLE\nINSERT 0 1\n n\n---\n 1\n(1 row)\n\n"
    );
    assert_eq!(stderr(&ok), "");

    let failed = spindle(
        &[
            "shell",
            "--data-dir",
            &dir,
            "-c",
            "SELECT nope FROM singers; SELECT 2 AS two",
        ],
        "",
    );
    assert_eq!(failed.status.code(), Some(1));
    assert!(
        stderr(&failed).starts_with("ERROR:  "),
        "{}",
        stderr(&failed)
    );
    assert!(
        stderr(&failed).contains("(SQLSTATE 42703)"),
        "{}",
        stderr(&failed)
    );
    assert_eq!(stdout(&failed), " two\n-----\n   2\n(1 row)\n\n");
}

#[test]
fn data_persists_across_invocations() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = data_dir_arg(tmp.path());

    let first = spindle(
        &["shell", "--data-dir", &dir],
        &format!("{CREATE_SINGERS}\nINSERT INTO singers VALUES (1, 'Marc'), (2, 'Catalina');\n"),
    );
    assert_eq!(first.status.code(), Some(0), "stderr:\n{}", stderr(&first));

    let second = spindle(
        &[
            "shell",
            "--data-dir",
            &dir,
            "-c",
            "SELECT singer_id, name FROM singers ORDER BY singer_id",
        ],
        "",
    );
    assert_eq!(
        second.status.code(),
        Some(0),
        "stderr:\n{}",
        stderr(&second)
    );
    assert_eq!(
        stdout(&second),
        " singer_id |   name\n-----------+----------\n         1 | Marc\n         2 | Catalina\n(2 rows)\n\n"
    );
}

#[test]
fn default_data_dir_comes_from_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("from-env");
    let env = [("SPINDLE_DATA_DIR", dir.as_path())];

    let create = spindle_env(&["shell", "-c", CREATE_SINGERS], "", &env);
    assert_eq!(
        create.status.code(),
        Some(0),
        "stderr:\n{}",
        stderr(&create)
    );
    assert!(
        dir.exists(),
        "the database was not created in $SPINDLE_DATA_DIR"
    );

    let dir_arg = dir.to_string_lossy().into_owned();
    let count = spindle(
        &[
            "shell",
            "--data-dir",
            &dir_arg,
            "-c",
            "SELECT count(*) AS n FROM singers",
        ],
        "",
    );
    assert_eq!(count.status.code(), Some(0), "stderr:\n{}", stderr(&count));
    assert!(stdout(&count).contains("(1 row)"));
}

#[test]
fn in_memory_database_and_shell_commands() {
    let out = spindle(
        &["shell", "--in-memory"],
        "\\?\nSELECT 'a;b' AS s,\n  -- comment ; here\n  3 AS n /* ; */;\n\\bogus\nquit\nSELECT 'not run';\n",
    );
    let (so, se) = (stdout(&out), stderr(&out));
    // The unknown backslash command counts as a failure.
    assert_eq!(out.status.code(), Some(1), "stdout:\n{so}\nstderr:\n{se}");
    assert!(so.contains("Shell commands:"), "{so}");
    assert!(
        so.contains("  s  | n\n-----+---\n a;b | 3\n(1 row)\n"),
        "{so}"
    );
    assert!(se.contains("invalid command \\bogus"), "{se}");
    assert!(!so.contains("not run"), "`quit` must stop the script: {so}");
}

#[test]
fn cannot_open_database_is_fatal() {
    let tmp = tempfile::tempdir().unwrap();
    // A regular file where the data directory should be.
    let file = tmp.path().join("file");
    std::fs::write(&file, "not a directory").unwrap();
    let out = spindle(
        &[
            "shell",
            "--data-dir",
            &file.to_string_lossy(),
            "-c",
            "SELECT 1",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2), "stderr:\n{}", stderr(&out));
    assert!(stderr(&out).contains("cannot open"), "{}", stderr(&out));
}

#[test]
fn backslash_commands_list_and_describe_tables() {
    let script = "\
CREATE TABLE Singers (SingerId INT64 NOT NULL, Name STRING(MAX)) PRIMARY KEY (SingerId);
CREATE TABLE Albums (SingerId INT64 NOT NULL, AlbumId INT64 NOT NULL, Title STRING(100))
  PRIMARY KEY (SingerId, AlbumId), INTERLEAVE IN PARENT Singers ON DELETE CASCADE;
\\dt
\\d Albums
\\d nosuch
";
    let out = spindle(&["shell", "--in-memory"], script);
    let (so, se) = (stdout(&out), stderr(&out));
    // The unknown table in `\d` is the one failure.
    assert_eq!(out.status.code(), Some(1), "stdout:\n{so}\nstderr:\n{se}");
    assert!(
        se.contains("Did not find any relation named \"nosuch\""),
        "{se}"
    );

    let lines: Vec<&str> = so.lines().collect();
    let dt = lines
        .iter()
        .position(|l| l.trim_start().starts_with("table_name"))
        .unwrap_or_else(|| panic!("no \\dt output:\n{so}"));
    assert!(lines[dt].contains("parent_table_name"), "{so}");
    let albums = lines[dt + 2].to_lowercase();
    assert!(
        albums.starts_with(" albums ")
            && albums.contains("| singers ")
            && albums.contains("cascade"),
        "{so}"
    );
    assert!(
        lines[dt + 3].to_lowercase().starts_with(" singers "),
        "{so}"
    );
    assert_eq!(lines[dt + 4], "(2 rows)", "{so}");

    let d = lines
        .iter()
        .position(|l| l.trim_start().starts_with("column_name"))
        .unwrap_or_else(|| panic!("no \\d output:\n{so}"));
    assert!(
        lines[d + 2].to_lowercase().starts_with(" singerid "),
        "{so}"
    );
    assert!(lines[d + 4].contains("STRING(100)"), "{so}");
    assert_eq!(lines[d + 5], "(3 rows)", "{so}");
}

#[test]
fn values_print_like_postgres() {
    let out = spindle(
        &[
            "shell",
            "--in-memory",
            "-c",
            "SELECT 1.5::double precision AS f, 1e100 AS big, true AS b, NULL AS n, \
             DATE '2024-01-02' AS d, TIMESTAMP '2024-01-02 03:04:05.25' AS ts, \
             x'00ff' AS by, 'x\ny' AS s",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", stderr(&out));
    let expected = [
        "  f  |  big   | b | n |     d      |            ts             |   by   | s",
        "-----+--------+---+---+------------+---------------------------+--------+---",
        " 1.5 | 1e+100 | t |   | 2024-01-02 | 2024-01-02 03:04:05.25+00 | \\x00ff | x+",
        "     |        |   |   |            |                           |        | y",
        "(1 row)",
        "",
        "",
    ]
    .join("\n");
    assert_eq!(stdout(&out), expected);
}
