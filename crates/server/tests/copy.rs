//! COPY over the wire with tokio-postgres (`copy_in` / `copy_out`, the
//! extended protocol): text and CSV formats and their options, every
//! value type, constraint errors that leave nothing behind, COPY inside a
//! transaction block, CopyFail, and a connection that stays usable.
//! (psql's `\copy`, the simple protocol, is in tests/psql.rs.)

use std::net::SocketAddr;

use bytes::Bytes;
use futures::{SinkExt, TryStreamExt};

use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

async fn start() -> SocketAddr {
    let engine = spindle_sql::Engine::open(None).unwrap();
    let server = spindle_server::Server::bind(
        engine,
        "127.0.0.1:0".parse().unwrap(),
        spindle_server::Config::default(),
    )
    .await
    .unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.serve(std::future::pending()));
    addr
}

async fn connect(addr: SocketAddr) -> Client {
    let (client, conn) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=tester dbname=spindle",
            addr.port()
        ),
        NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    client
}

fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.code()
        .map(|c| c.code().to_string())
        .unwrap_or_else(|| format!("no code: {e:?}"))
}

/// COPY … FROM STDIN with `data` sent in two chunks; the row count.
async fn copy_in(client: &Client, sql: &str, data: &str) -> Result<u64, tokio_postgres::Error> {
    let sink = client.copy_in(sql).await?;
    let mut sink = Box::pin(sink);
    let mid = data.len() / 2;
    let mid = (mid..=data.len())
        .find(|i| data.is_char_boundary(*i))
        .unwrap_or(data.len());
    sink.send(Bytes::copy_from_slice(&data.as_bytes()[..mid]))
        .await?;
    sink.send(Bytes::copy_from_slice(&data.as_bytes()[mid..]))
        .await?;
    sink.as_mut().finish().await
}

/// The error of a COPY that fails before any data is sent.
async fn copy_in_err(client: &Client, sql: &str) -> tokio_postgres::Error {
    match client.copy_in::<_, Bytes>(sql).await {
        Ok(_) => panic!("{sql} started"),
        Err(e) => e,
    }
}

async fn copy_out(client: &Client, sql: &str) -> String {
    let stream = client.copy_out(sql).await.unwrap();
    let chunks: Vec<Bytes> = Box::pin(stream).try_collect().await.unwrap();
    chunks
        .iter()
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect()
}

/// The rows of a simple query, as text (NULL as "NULL").
async fn rows(client: &Client, sql: &str) -> Vec<Vec<String>> {
    client
        .simple_query(sql)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("NULL").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

async fn count(client: &Client, table: &str) -> i64 {
    client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0)
}

async fn schema(client: &Client) {
    client
        .batch_execute(
            "CREATE TABLE singers (
                id INT64 NOT NULL, name STRING(100), score FLOAT64, active BOOL,
                born DATE, photo BYTES(MAX), info JSON, amount NUMERIC, seen TIMESTAMP
             ) PRIMARY KEY (id);
             CREATE TABLE albums (
                id INT64 NOT NULL, album_id INT64 NOT NULL, title STRING(MAX) NOT NULL
             ) PRIMARY KEY (id, album_id), INTERLEAVE IN PARENT singers ON DELETE CASCADE",
        )
        .await
        .unwrap();
}

const TEXT_ROWS: &str =
    "1\tMarc\t1.5\tt\t1970-01-02\t\\\\x0aff\t{\"a\": [1, 2]}\t12.5\t2024-05-01 10:00:00+00\n\
2\tTab\\there, new\\nline \\\\ back\t\\N\tf\t\\N\t\\N\t\\N\t\\N\t\\N\n\
3\tCatalina\t-2e+100\t\\N\t2024-02-29\t\\\\x\t\"s\"\t-0.000000001\t1999-12-31 23:59:59.5+00\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_in_and_out_in_text_format() {
    let addr = start().await;
    let client = connect(addr).await;
    schema(&client).await;

    assert_eq!(
        copy_in(&client, "COPY singers FROM STDIN", TEXT_ROWS)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        rows(
            &client,
            "SELECT id, name, score, active, born, photo, info, amount, seen FROM singers ORDER BY id"
        )
        .await,
        vec![
            vec![
                "1",
                "Marc",
                "1.5",
                "t",
                "1970-01-02",
                "\\x0aff",
                "{\"a\":[1,2]}",
                "12.5",
                "2024-05-01 10:00:00+00"
            ],
            vec![
                "2",
                "Tab\there, new\nline \\ back",
                "NULL",
                "f",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
                "NULL"
            ],
            vec![
                "3",
                "Catalina",
                "-2e+100",
                "NULL",
                "2024-02-29",
                "\\x",
                "\"s\"",
                "-0.000000001",
                "1999-12-31 23:59:59.5+00"
            ],
        ]
        .into_iter()
        .map(|r| r.into_iter().map(String::from).collect::<Vec<_>>())
        .collect::<Vec<_>>()
    );

    // COPY TO gives back what COPY FROM reads: a round trip into a copy.
    let out = copy_out(&client, "COPY singers TO STDOUT").await;
    assert!(
        out.starts_with(
            "1\tMarc\t1.5\tt\t1970-01-02\t\\\\x0aff\t{\"a\":[1,2]}\t12.5\t2024-05-01 10:00:00+00\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("2\tTab\\there, new\\nline \\\\ back\t\\N\tf\t\\N\t\\N\t\\N\t\\N\t\\N\n"),
        "{out}"
    );
    assert_eq!(out.lines().count(), 3);
    client
        .batch_execute(
            "CREATE TABLE singers2 (
                id INT64 NOT NULL, name STRING(100), score FLOAT64, active BOOL,
                born DATE, photo BYTES(MAX), info JSON, amount NUMERIC, seen TIMESTAMP
             ) PRIMARY KEY (id)",
        )
        .await
        .unwrap();
    assert_eq!(
        copy_in(&client, "COPY singers2 FROM STDIN", &out)
            .await
            .unwrap(),
        3
    );
    assert_eq!(copy_out(&client, "COPY singers2 TO STDOUT").await, out);

    // A column list, a query, options.
    assert_eq!(
        copy_out(
            &client,
            "COPY singers (name, id) TO STDOUT WITH (DELIMITER '|', NULL 'nil')"
        )
        .await
        .lines()
        .next(),
        Some("Marc|1")
    );
    assert_eq!(
        copy_out(
            &client,
            "COPY (SELECT id, score FROM singers WHERE id > 1 ORDER BY id) TO STDOUT (HEADER)"
        )
        .await,
        "id\tscore\n2\t\\N\n3\t-2e+100\n"
    );
    // Unlisted columns take their defaults (NULL here).
    assert_eq!(
        copy_in(
            &client,
            "COPY singers (id, name) FROM STDIN",
            "10\tTen\n11\t\\N\n\\.\n"
        )
        .await
        .unwrap(),
        2
    );
    assert_eq!(
        rows(
            &client,
            "SELECT id, name, score FROM singers WHERE id >= 10 ORDER BY id"
        )
        .await,
        vec![vec!["10", "Ten", "NULL"], vec!["11", "NULL", "NULL"]]
    );
    // An empty COPY.
    assert_eq!(
        copy_in(&client, "COPY singers FROM STDIN", "")
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        copy_out(&client, "COPY (SELECT 1 AS x WHERE false) TO STDOUT").await,
        ""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_in_and_out_in_csv_format() {
    let addr = start().await;
    let client = connect(addr).await;
    schema(&client).await;

    let csv = "id,name,score\n1,\"Smith, \"\"Jr\"\"\",2.5\n2,,\n3,\"\",\n4,\"two\nlines\",0\n";
    assert_eq!(
        copy_in(
            &client,
            "COPY singers (id, name, score) FROM STDIN WITH (FORMAT csv, HEADER)",
            csv
        )
        .await
        .unwrap(),
        4
    );
    assert_eq!(
        rows(&client, "SELECT id, name, score FROM singers ORDER BY id").await,
        vec![
            vec!["1", "Smith, \"Jr\"", "2.5"],
            vec!["2", "NULL", "NULL"],
            vec!["3", "", "NULL"],
            vec!["4", "two\nlines", "0"],
        ]
    );
    assert_eq!(
        copy_out(
            &client,
            "COPY singers (id, name, score) TO STDOUT (FORMAT csv, HEADER true)"
        )
        .await,
        "id,name,score\n1,\"Smith, \"\"Jr\"\"\",2.5\n2,,\n3,\"\",\n4,\"two\nlines\",0\n"
    );
    // The old spelling, another delimiter and NULL string.
    assert_eq!(
        copy_in(
            &client,
            "COPY albums FROM STDIN DELIMITER ';' NULL 'NA' CSV HEADER",
            "id;album_id;title\n1;1;Total Junk\n1;2;\"Go; Go; Go\"\n"
        )
        .await
        .unwrap(),
        2
    );
    assert_eq!(
        copy_out(&client, "COPY albums TO STDOUT WITH CSV").await,
        "1,1,Total Junk\n1,2,Go; Go; Go\n"
    );
    assert_eq!(
        copy_out(
            &client,
            "COPY (SELECT id, name FROM singers WHERE id = 2) TO STDOUT (FORMAT csv, NULL 'NA', FORCE_QUOTE (id))"
        )
        .await,
        "\"2\",NA\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_copy_writes_nothing() {
    let addr = start().await;
    let client = connect(addr).await;
    schema(&client).await;
    client
        .batch_execute("INSERT INTO singers (id, name) VALUES (1, 'Marc')")
        .await
        .unwrap();

    // Duplicate key, after good rows (and across INSERT batches).
    let mut data: String = (100..2600).map(|i| format!("{i}\tn{i}\n")).collect();
    data.push_str("1\tagain\n");
    let e = copy_in(&client, "COPY singers (id, name) FROM STDIN", &data)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "23505", "{e:?}");
    assert_eq!(count(&client, "singers").await, 1);

    // A child without its parent row.
    let e = copy_in(
        &client,
        "COPY albums FROM STDIN",
        "1\t1\tok\n9\t1\torphan\n",
    )
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&e), "23503", "{e:?}");
    assert_eq!(count(&client, "albums").await, 0);

    // A value of the wrong type, a NOT NULL column, a too long string.
    let e = copy_in(
        &client,
        "COPY singers (id, name) FROM STDIN",
        "5\tx\nfive\ty\n",
    )
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&e), "22P02", "{e:?}");
    let e = copy_in(&client, "COPY albums FROM STDIN", "1\t1\t\\N\n")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "23502", "{e:?}");
    let long = "x".repeat(101);
    let e = copy_in(
        &client,
        "COPY singers (id, name) FROM STDIN",
        &format!("7\t{long}\n"),
    )
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&e), "22001", "{e:?}");

    // Malformed data: too few or too many fields, an open quote.
    let e = copy_in(&client, "COPY singers (id, name) FROM STDIN", "5\tx\n6\n")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22P04", "{e:?}");
    assert!(
        e.as_db_error()
            .unwrap()
            .message()
            .contains("missing data for column \"name\""),
        "{e:?}"
    );
    let e = copy_in(&client, "COPY singers (id, name) FROM STDIN", "5\tx\ty\n")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22P04", "{e:?}");
    let e = copy_in(&client, "COPY singers (id, name) FROM STDIN CSV", "5,\"x\n")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22P04", "{e:?}");
    assert_eq!(count(&client, "singers").await, 1);

    // Errors before any data: unknown table or column, bad options, files.
    let e = copy_in_err(&client, "COPY nope FROM STDIN").await;
    assert_eq!(sqlstate(&e), "42P01", "{e:?}");
    let e = copy_in_err(&client, "COPY singers (nope) FROM STDIN").await;
    assert_eq!(sqlstate(&e), "42703", "{e:?}");
    let e = copy_in_err(&client, "COPY singers FROM STDIN (FORMAT binary)").await;
    assert_eq!(sqlstate(&e), "0A000", "{e:?}");
    let e = copy_in_err(&client, "COPY singers FROM '/etc/passwd'").await;
    assert_eq!(sqlstate(&e), "0A000", "{e:?}");
    let Err(e) = client.copy_out("COPY nope TO STDOUT").await else {
        panic!("COPY nope started")
    };
    assert_eq!(sqlstate(&e), "42P01", "{e:?}");

    // The client gives up (CopyFail): nothing written, 57014.
    {
        let sink = client
            .copy_in::<_, Bytes>("COPY singers (id, name) FROM STDIN")
            .await
            .unwrap();
        let mut sink = Box::pin(sink);
        sink.send(Bytes::from_static(b"50\tfifty\n")).await.unwrap();
        // Dropped without finish: tokio-postgres sends CopyFail.
    }
    assert_eq!(count(&client, "singers").await, 1);
    assert_eq!(
        rows(&client, "SELECT name FROM singers").await,
        vec![vec!["Marc"]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_joins_a_transaction_block() {
    let addr = start().await;
    let client = connect(addr).await;
    schema(&client).await;

    // Rolled back with the transaction.
    client.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        copy_in(&client, "COPY singers (id) FROM STDIN", "1\n2\n")
            .await
            .unwrap(),
        2
    );
    // The transaction sees its own COPY, also through COPY TO.
    assert_eq!(
        copy_out(&client, "COPY singers (id) TO STDOUT").await,
        "1\n2\n"
    );
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(count(&client, "singers").await, 0);

    // Committed with it, together with the statements around it.
    client
        .batch_execute("BEGIN; INSERT INTO singers (id) VALUES (1)")
        .await
        .unwrap();
    copy_in(&client, "COPY albums FROM STDIN", "1\t1\tfirst\n")
        .await
        .unwrap();
    client.batch_execute("COMMIT").await.unwrap();
    assert_eq!(count(&client, "albums").await, 1);

    // A failing COPY fails the transaction block: 25P02 until ROLLBACK.
    client
        .batch_execute("BEGIN; INSERT INTO singers (id) VALUES (2)")
        .await
        .unwrap();
    let e = copy_in(&client, "COPY singers (id) FROM STDIN", "3\n1\n")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "23505");
    let e = client.simple_query("SELECT 1").await.unwrap_err();
    assert_eq!(sqlstate(&e), "25P02");
    let e = copy_in_err(&client, "COPY singers (id) FROM STDIN").await;
    assert_eq!(sqlstate(&e), "25P02");
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        rows(&client, "SELECT id FROM singers").await,
        vec![vec!["1"]]
    );

    // Many rows in one COPY: one transaction, several INSERT batches.
    let data: String = (10..3010).map(|i| format!("{i}\tsinger {i}\n")).collect();
    assert_eq!(
        copy_in(&client, "COPY singers (id, name) FROM STDIN", &data)
            .await
            .unwrap(),
        3000
    );
    assert_eq!(count(&client, "singers").await, 3001);
}

/// COPY … FROM STDIN with `data` sent in pieces of `piece` bytes (cut
/// anywhere, also inside a UTF-8 character or a quoted CSV field).
async fn copy_in_pieces(
    client: &Client,
    sql: &str,
    data: &[u8],
    piece: usize,
) -> Result<u64, tokio_postgres::Error> {
    let sink = client.copy_in(sql).await?;
    let mut sink = Box::pin(sink);
    for chunk in data.chunks(piece) {
        sink.feed(Bytes::copy_from_slice(chunk)).await?;
    }
    sink.as_mut().finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_in_is_streamed_in_pieces() {
    let addr = start().await;
    let client = connect(addr).await;
    schema(&client).await;

    // Rows cut at every kind of place, several INSERT batches.
    let data: String = (1..=2500)
        .map(|i| format!("{i},\"singer \"\"{i}\"\",\nnaïve ✓\",{i}.5\n"))
        .collect();
    for piece in [7, 4096] {
        let n = copy_in_pieces(
            &client,
            "COPY singers (id, name, score) FROM STDIN (FORMAT csv)",
            data.as_bytes(),
            piece,
        )
        .await
        .unwrap();
        assert_eq!(n, 2500);
        assert_eq!(count(&client, "singers").await, 2500);
        assert_eq!(
            rows(&client, "SELECT name, score FROM singers WHERE id = 1234").await,
            vec![vec!["singer \"1234\",\nnaïve ✓", "1234.5"]]
        );
        client.batch_execute("DELETE FROM singers").await.unwrap();
    }

    // An error after the first batches went in: nothing is written, and
    // the first error is the one reported (the malformed rows after it
    // are not read).
    // (The duplicate is in the second batch, inserted once row 2000 is
    // read; the malformed row comes later.)
    let mut data: String = (1..=1499).map(|i| format!("{i}\tname {i}\n")).collect();
    data.push_str("5\tduplicate\n");
    data.extend((1501..=2500).map(|i| format!("{i}\tname {i}\n")));
    data.push_str("not\ta\tvalid\trow\n");
    data.extend((3000..3100).map(|i| format!("{i}\tname {i}\n")));
    let e = copy_in_pieces(
        &client,
        "COPY singers (id, name) FROM STDIN",
        data.as_bytes(),
        1000,
    )
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&e), "23505", "{e:?}");
    assert_eq!(count(&client, "singers").await, 0);

    // A malformed row far into the data names its line.
    let mut data: String = (1..=3000).map(|i| format!("{i}\tname {i}\n")).collect();
    data.push_str("3001\ttoo\tmany\n");
    let e = copy_in_pieces(
        &client,
        "COPY singers (id, name) FROM STDIN",
        data.as_bytes(),
        333,
    )
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&e), "22P04", "{e:?}");
    let msg = e.as_db_error().map(|d| d.message().to_string());
    assert!(
        msg.as_deref()
            .is_some_and(|m| m.contains("line 3001") && m.contains("extra data")),
        "{msg:?}"
    );
    assert_eq!(count(&client, "singers").await, 0);

    // The connection is usable, outside any transaction.
    assert_eq!(
        rows(&client, "SELECT 'still here'").await,
        vec![vec!["still here"]]
    );
    client.batch_execute("BEGIN; COMMIT").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_copy_is_retried_when_its_data_was_kept() {
    let addr = start().await;
    let client = connect(addr).await;
    let other = connect(addr).await;
    schema(&client).await;
    client
        .batch_execute("INSERT INTO singers (id, name) VALUES (1, 'Marc'), (2, 'Cat')")
        .await
        .unwrap();

    // The COPY's transaction reads the parent row (interleaving); another
    // connection updates that row and commits while the COPY is open, so
    // the COPY's commit conflicts (40001). Its data (small) was kept: it is
    // loaded again in a new transaction, which commits.
    let sink = client
        .copy_in::<_, Bytes>("COPY albums FROM STDIN")
        .await
        .unwrap();
    let mut sink = Box::pin(sink);
    let data: String = (1..=1500).map(|i| format!("1\t{i}\talbum {i}\n")).collect();
    sink.send(Bytes::from(data)).await.unwrap();
    other
        .batch_execute("UPDATE singers SET name = 'Marc B' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(sink.as_mut().finish().await.unwrap(), 1500);
    assert_eq!(count(&client, "albums").await, 1500);

    // The same with more than 8 MiB of data: not kept, so the conflict is
    // reported and nothing is written.
    let sink = client
        .copy_in::<_, Bytes>("COPY albums FROM STDIN")
        .await
        .unwrap();
    let mut sink = Box::pin(sink);
    let title = "x".repeat(8 << 10);
    for i in 1..=1100 {
        sink.feed(Bytes::from(format!("2\t{i}\t{title}\n")))
            .await
            .unwrap();
    }
    other
        .batch_execute("UPDATE singers SET name = 'Cat B' WHERE id = 2")
        .await
        .unwrap();
    let e = sink.as_mut().finish().await.unwrap_err();
    assert_eq!(sqlstate(&e), "40001", "{e:?}");
    assert_eq!(
        count(&client, "albums WHERE id = 2").await,
        0,
        "a failed COPY writes nothing"
    );
    assert_eq!(count(&client, "albums").await, 1500);
}

/// COPY into a schema-qualified, quoted table name, with a column list
/// whose missing columns take their defaults, and into a table without a
/// primary key (hidden keys), past one insert batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_into_qualified_names_defaults_and_keyless_tables() {
    let addr = start().await;
    let client = connect(addr).await;
    client
        .batch_execute(
            "CREATE TABLE \"Mixed\" (id bigint PRIMARY KEY, note varchar(20) DEFAULT 'dflt', n bigint);
             CREATE TABLE nokey (a bigint, b text)",
        )
        .await
        .unwrap();
    assert_eq!(
        copy_in(
            &client,
            "COPY public.\"Mixed\" (n, id) FROM STDIN",
            "10\t1\n\\N\t2\n"
        )
        .await
        .unwrap(),
        2
    );
    assert_eq!(
        rows(&client, "SELECT id, note, n FROM \"Mixed\" ORDER BY id").await,
        vec![vec!["1", "dflt", "10"], vec!["2", "dflt", "NULL"]]
    );
    // A value that is not its column's type: 22P02, nothing written.
    let e = copy_in(&client, "COPY \"Mixed\" (id) FROM STDIN", "3\nx\n")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22P02", "{e:?}");
    assert_eq!(count(&client, "\"Mixed\"").await, 2);

    let data: String = (1..=25_000).map(|i| format!("{i}\tr{i}\n")).collect();
    assert_eq!(
        copy_in(&client, "COPY nokey FROM STDIN", &data)
            .await
            .unwrap(),
        25_000
    );
    assert_eq!(
        rows(
            &client,
            "SELECT count(*), count(DISTINCT a), sum(a), min(b) FROM nokey"
        )
        .await,
        vec![vec!["25000", "25000", "312512500", "r1"]]
    );
}
