//! The wire server with real clients: tokio-postgres (simple and extended
//! protocol, binary parameters and results of every type, transactions,
//! errors) and hand-written protocol messages (bad input).

use std::error::Error as _;
use std::net::SocketAddr;

use bytes::{Buf, BufMut, BytesMut};
use chrono::{DateTime, NaiveDate, Utc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

/// Starts a server on an in-memory database; it lives until the test's
/// runtime ends.
async fn start(password: Option<&str>) -> SocketAddr {
    start_with(spindle_server::Config {
        password: password.map(str::to_string),
        ..Default::default()
    })
    .await
}

async fn start_with(config: spindle_server::Config) -> SocketAddr {
    let engine = spindle_sql::Engine::open(None).unwrap();
    let server = spindle_server::Server::bind(engine, "127.0.0.1:0".parse().unwrap(), config)
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

/// NUMERIC as its decimal text, in PostgreSQL's binary format.
#[derive(Debug, PartialEq)]
struct Numeric(String);

impl ToSql for Numeric {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let (neg, s) = match self.0.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, self.0.as_str()),
        };
        let (int, frac) = s.split_once('.').unwrap_or((s, ""));
        // Pad both sides to whole base-10000 groups.
        let int = format!("{}{int}", "0".repeat((4 - int.len() % 4) % 4));
        let frac_p = format!("{frac}{}", "0".repeat((4 - frac.len() % 4) % 4));
        let mut digits: Vec<i16> = int
            .as_bytes()
            .chunks(4)
            .chain(frac_p.as_bytes().chunks(4))
            .map(|c| std::str::from_utf8(c).unwrap().parse().unwrap())
            .collect();
        let mut weight = (int.len() / 4) as i16 - 1;
        while digits.first() == Some(&0) {
            digits.remove(0);
            weight -= 1;
        }
        while digits.last() == Some(&0) {
            digits.pop();
        }
        out.put_i16(digits.len() as i16);
        out.put_i16(if digits.is_empty() { 0 } else { weight });
        out.put_u16(if neg { 0x4000 } else { 0 });
        out.put_u16(frac.len() as u16);
        for d in digits {
            out.put_i16(d);
        }
        Ok(IsNull::No)
    }
    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }
    tokio_postgres::types::to_sql_checked!();
}

impl<'a> FromSql<'a> for Numeric {
    fn from_sql(
        _: &Type,
        mut raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let n = raw.get_i16();
        let weight = raw.get_i16() as i32;
        let sign = raw.get_u16();
        let dscale = raw.get_u16() as usize;
        let digits: Vec<i16> = (0..n).map(|_| raw.get_i16()).collect();
        let mut int = String::new();
        let mut frac = String::new();
        for p in (0..=weight.max(0)).rev() {
            let i = weight - p;
            let d = if i >= 0 {
                digits.get(i as usize).copied().unwrap_or(0)
            } else {
                0
            };
            int.push_str(&format!("{d:04}"));
        }
        for k in 1..=dscale.div_ceil(4) as i32 {
            let i = weight + k;
            let d = if i >= 0 {
                digits.get(i as usize).copied().unwrap_or(0)
            } else {
                0
            };
            frac.push_str(&format!("{d:04}"));
        }
        let int = int.trim_start_matches('0');
        let mut s = format!(
            "{}{}",
            if sign == 0x4000 { "-" } else { "" },
            if int.is_empty() { "0" } else { int }
        );
        if dscale > 0 {
            s.push('.');
            s.push_str(&frac[..dscale]);
        }
        Ok(Numeric(s))
    }
    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_protocol_tags_and_values() {
    let addr = start(None).await;
    let c = connect(addr).await;
    c.batch_execute(
        "CREATE TABLE t (id INT64 NOT NULL, name STRING(MAX), f FLOAT64, b BOOL, d DATE, ts TIMESTAMP, n NUMERIC, by BYTES(MAX)) PRIMARY KEY (id)",
    )
    .await
    .unwrap();
    let msgs = c
        .simple_query(
            "INSERT INTO t VALUES (1, 'a', 1.5, true, DATE '2024-02-29', TIMESTAMP '2024-01-02 03:04:05.5+00', 12.50, X'0aff'), (2, NULL, 1e100, false, NULL, NULL, NULL, NULL); \
             UPDATE t SET name = 'b' WHERE id = 2; SELECT * FROM t ORDER BY id; DELETE FROM t WHERE id = 2",
        )
        .await
        .unwrap();
    let mut tags = Vec::new();
    let mut rows = Vec::new();
    for m in &msgs {
        match m {
            SimpleQueryMessage::CommandComplete(n) => tags.push(*n),
            SimpleQueryMessage::Row(r) => rows.push(
                (0..r.len())
                    .map(|i| r.get(i).map(str::to_string))
                    .collect::<Vec<_>>(),
            ),
            _ => {}
        }
    }
    assert_eq!(tags, vec![2, 1, 2, 1]);
    let s = |x: &str| Some(x.to_string());
    assert_eq!(
        rows[0],
        vec![
            s("1"),
            s("a"),
            s("1.5"),
            s("t"),
            s("2024-02-29"),
            s("2024-01-02 03:04:05.5+00"),
            s("12.5"),
            s("\\x0aff")
        ]
    );
    assert_eq!(rows[1][2], s("1e+100"));
    assert_eq!(rows[1][4], None);

    // version(), current_database(), SET/SHOW
    let row = c
        .query_one(
            "SELECT version(), current_database(), current_schema()",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, String>(0).starts_with("PostgreSQL 15"));
    assert_eq!(row.get::<_, String>(1), "spindle");
    assert_eq!(row.get::<_, String>(2), "public");
    c.batch_execute("SET application_name = 'wire test'")
        .await
        .unwrap();
    let row = c.query_one("SHOW application_name", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "wire test");
    let e = c
        .batch_execute("SET no_such_parameter = 1")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "42704");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_with_binary_values_of_every_type() {
    let addr = start(None).await;
    let mut c = connect(addr).await;
    c.batch_execute(
        "CREATE TABLE everything (
            id bigint NOT NULL, f double precision, b boolean, s varchar, by bytea,
            d date, ts timestamptz, n numeric, j jsonb, PRIMARY KEY (id))",
    )
    .await
    .unwrap();
    let insert = c
        .prepare("INSERT INTO everything VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)")
        .await
        .unwrap();
    assert_eq!(
        insert.params(),
        &[
            Type::INT8,
            Type::FLOAT8,
            Type::BOOL,
            Type::TEXT,
            Type::BYTEA,
            Type::DATE,
            Type::TIMESTAMPTZ,
            Type::NUMERIC,
            Type::TEXT, // a JSON parameter is text (results are jsonb)
        ]
    );
    let date = NaiveDate::from_ymd_opt(2024, 2, 29).unwrap();
    let ts: DateTime<Utc> = "2024-01-02T03:04:05.123456Z".parse().unwrap();
    let n = c
        .execute(
            &insert,
            &[
                &7i64,
                &-2.5f64,
                &true,
                &"héllo",
                &vec![0u8, 1, 255],
                &date,
                &ts,
                &Numeric("-12345678901234567890.123456789".into()),
                &r#"{"a":[1,2]}"#,
            ],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    // NULLs in every column
    c.execute(
        &insert,
        &[
            &8i64,
            &None::<f64>,
            &None::<bool>,
            &None::<&str>,
            &None::<Vec<u8>>,
            &None::<NaiveDate>,
            &None::<DateTime<Utc>>,
            &None::<Numeric>,
            &None::<&str>,
        ],
    )
    .await
    .unwrap();

    let select = c
        .prepare("SELECT id, f, b, s, by, d, ts, n, j FROM everything WHERE id = $1")
        .await
        .unwrap();
    assert_eq!(select.params(), &[Type::INT8]);
    let types: Vec<Type> = select.columns().iter().map(|c| c.type_().clone()).collect();
    assert_eq!(
        types,
        vec![
            Type::INT8,
            Type::FLOAT8,
            Type::BOOL,
            Type::TEXT,
            Type::BYTEA,
            Type::DATE,
            Type::TIMESTAMPTZ,
            Type::NUMERIC,
            Type::JSONB
        ]
    );
    let row = c.query_one(&select, &[&7i64]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 7);
    assert_eq!(row.get::<_, f64>(1), -2.5);
    assert!(row.get::<_, bool>(2));
    assert_eq!(row.get::<_, String>(3), "héllo");
    assert_eq!(row.get::<_, Vec<u8>>(4), vec![0u8, 1, 255]);
    assert_eq!(row.get::<_, NaiveDate>(5), date);
    assert_eq!(row.get::<_, DateTime<Utc>>(6), ts);
    assert_eq!(
        row.get::<_, Numeric>(7),
        Numeric("-12345678901234567890.123456789".into())
    );
    assert_eq!(
        row.get::<_, serde_json::Value>(8),
        serde_json::json!({"a": [1, 2]})
    );
    let row = c.query_one(&select, &[&8i64]).await.unwrap();
    for i in 1..9 {
        assert!(
            row.try_get::<_, Option<String>>(i)
                .map(|v| v.is_none())
                .unwrap_or(true),
            "column {i} should be NULL"
        );
    }
    assert_eq!(row.get::<_, Option<f64>>(1), None);

    // Parameters in WHERE, UPDATE SET and expressions; statement reuse.
    let update = c
        .prepare("UPDATE everything SET f = $1, s = s || $2 WHERE id = $3")
        .await
        .unwrap();
    assert_eq!(update.params()[0], Type::FLOAT8);
    assert_eq!(update.params()[2], Type::INT8);
    assert_eq!(
        c.execute(&update, &[&1.25f64, &"!", &7i64]).await.unwrap(),
        1
    );
    assert_eq!(
        c.execute(&update, &[&1.25f64, &"!", &99i64]).await.unwrap(),
        0
    );
    let row = c
        .query_one("SELECT s, f FROM everything WHERE id = $1", &[&7i64])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "héllo!");
    assert_eq!(row.get::<_, f64>(1), 1.25);
    let del = c
        .prepare("DELETE FROM everything WHERE id = $1")
        .await
        .unwrap();
    assert_eq!(del.params(), &[Type::INT8]);
    assert_eq!(c.execute(&del, &[&8i64]).await.unwrap(), 1);

    // Declared types win over inference; text parameters of unknown type.
    let typed = c
        .prepare_typed("SELECT $1::BIGINT + 1", &[Type::INT4])
        .await
        .unwrap();
    assert_eq!(typed.params(), &[Type::INT4]);
    let row = c.query_one(&typed, &[&41i32]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 42);
    let row = c
        .query_one("SELECT $1 AS greeting", &[&"hi"])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "hi");

    // A portal read in chunks (max_rows) inside a transaction.
    let tx = c.transaction().await.unwrap();
    for i in 100..110i64 {
        tx.execute("INSERT INTO everything (id) VALUES ($1)", &[&i])
            .await
            .unwrap();
    }
    let portal = tx
        .bind(
            "SELECT id FROM everything WHERE id >= $1 ORDER BY id",
            &[&100i64],
        )
        .await
        .unwrap();
    let first = tx.query_portal(&portal, 4).await.unwrap();
    let rest = tx.query_portal(&portal, 0).await.unwrap();
    assert_eq!(first.len(), 4);
    assert_eq!(rest.len(), 6);
    assert_eq!(rest[0].get::<_, i64>(0), 104);
    // A limit met exactly suspends the portal (as in PostgreSQL, which
    // cannot know that no row follows); the next fetch finds none.
    let query = "SELECT id FROM everything WHERE id >= $1 ORDER BY id";
    let portal = tx.bind(query, &[&100i64]).await.unwrap();
    assert_eq!(tx.query_portal(&portal, 10).await.unwrap().len(), 10);
    assert!(tx.query_portal(&portal, 10).await.unwrap().is_empty());
    // A limit above the row count: every row, and the portal is done.
    let portal = tx.bind(query, &[&105i64]).await.unwrap();
    let all = tx.query_portal(&portal, 50).await.unwrap();
    assert_eq!(
        all.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(),
        (105..110).collect::<Vec<_>>()
    );
    assert!(tx.query_portal(&portal, 50).await.unwrap().is_empty());
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_sqlstate_and_the_connection_survives() {
    let addr = start(None).await;
    let c = connect(addr).await;
    c.batch_execute(
        "CREATE TABLE p (id INT64 NOT NULL) PRIMARY KEY (id);
         CREATE TABLE ch (id INT64 NOT NULL, k INT64 NOT NULL) PRIMARY KEY (id, k), INTERLEAVE IN PARENT p;
         INSERT INTO p VALUES (1)",
    )
    .await
    .unwrap();
    let cases = [
        ("INSERT INTO p VALUES (1)", "23505"),
        ("INSERT INTO ch VALUES (2, 1)", "23503"),
        ("SELECT * FROM nope", "42P01"),
        ("SELECT nope FROM p", "42703"),
        ("SELEC 1", "42601"),
        ("SELECT 1 / 0", "22012"),
        ("SELECT $1", "42P02"),
    ];
    for (sql, code) in cases {
        let e = c.simple_query(sql).await.unwrap_err();
        assert_eq!(sqlstate(&e), code, "{sql}: {e}");
        // extended protocol too (SELECT $1 is fine there)
        if !sql.contains('$') {
            let e = c.query(sql, &[]).await.unwrap_err();
            assert_eq!(sqlstate(&e), code, "{sql} (extended): {e}");
        }
    }
    c.execute("INSERT INTO ch VALUES (1, 1)", &[])
        .await
        .unwrap();
    let e = c
        .execute("DELETE FROM p WHERE id = 1", &[])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "23503");

    // Failed transaction: 25P02 until ROLLBACK.
    c.batch_execute("BEGIN").await.unwrap();
    assert!(c.batch_execute("INSERT INTO p VALUES (1)").await.is_err());
    let e = c.query("SELECT 1", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&e), "25P02");
    let e = c.simple_query("SELECT 1").await.unwrap_err();
    assert_eq!(sqlstate(&e), "25P02");
    c.batch_execute("ROLLBACK").await.unwrap();
    let row = c.query_one("SELECT count(*) FROM p", &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);

    // Bad parameter values.
    let e = c
        .query("SELECT * FROM p WHERE id = $1", &[&"x"])
        .await
        .unwrap_err();
    assert!(e.source().is_some() || e.code().is_some(), "{e:?}");
    let row = c.query_one("SELECT 1::BIGINT", &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_requires_scram() {
    let addr = start(Some("s3cret")).await;
    let ok = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=u password=s3cret dbname=spindle",
            addr.port()
        ),
        NoTls,
    )
    .await;
    let (client, conn) = ok.unwrap();
    tokio::spawn(conn);
    client.simple_query("SELECT 1").await.unwrap();
    let bad = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=u password=wrong dbname=spindle",
            addr.port()
        ),
        NoTls,
    )
    .await;
    let e = bad.err().expect("wrong password must be refused");
    assert_eq!(sqlstate(&e), "28P01");
}

// ---------------------------------------------------------------------------
// Hand-written protocol messages

struct Raw {
    s: TcpStream,
    buf: BytesMut,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Raw {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut body = BytesMut::new();
        body.put_i32(196608);
        for (k, v) in [("user", "raw"), ("database", "spindle")] {
            body.put_slice(k.as_bytes());
            body.put_u8(0);
            body.put_slice(v.as_bytes());
            body.put_u8(0);
        }
        body.put_u8(0);
        let mut msg = BytesMut::new();
        msg.put_i32(body.len() as i32 + 4);
        msg.put_slice(&body);
        s.write_all(&msg).await.unwrap();
        let mut raw = Raw {
            s,
            buf: BytesMut::new(),
        };
        raw.until_ready().await;
        raw
    }

    async fn send(&mut self, tag: u8, body: &[u8]) {
        let mut msg = BytesMut::new();
        msg.put_u8(tag);
        msg.put_i32(body.len() as i32 + 4);
        msg.put_slice(body);
        self.s.write_all(&msg).await.unwrap();
    }

    /// The next message: (tag, body); None when the server closed.
    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if self.buf.len() >= 5 {
                let len = i32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() > len {
                    let tag = self.buf[0];
                    let body = self.buf[5..1 + len].to_vec();
                    self.buf.advance(1 + len);
                    return Some((tag, body));
                }
            }
            let mut chunk = [0u8; 4096];
            let n =
                tokio::time::timeout(std::time::Duration::from_secs(10), self.s.read(&mut chunk))
                    .await
                    .expect("server did not answer")
                    .ok()?;
            if n == 0 {
                return None;
            }
            self.buf.put_slice(&chunk[..n]);
        }
    }

    /// Nothing arrives for 300 ms (replies held until Flush or Sync).
    async fn assert_silent(&mut self, what: &str) {
        let mut chunk = [0u8; 64];
        let early = tokio::time::timeout(
            std::time::Duration::from_millis(300),
            self.s.read(&mut chunk),
        )
        .await;
        assert!(early.is_err(), "{what}");
    }

    /// The tags of the messages up to and including ReadyForQuery.
    async fn tags_until_ready(&mut self) -> Vec<u8> {
        let mut tags = Vec::new();
        while let Some((tag, _)) = self.next().await {
            tags.push(tag);
            if tag == b'Z' {
                break;
            }
        }
        tags
    }

    /// Messages up to ReadyForQuery; returns the SQLSTATEs of errors seen.
    async fn until_ready(&mut self) -> Vec<String> {
        let mut codes = Vec::new();
        while let Some((tag, body)) = self.next().await {
            if tag == b'E' {
                let mut fields = body.split(|b| *b == 0);
                codes.extend(fields.by_ref().find_map(|f| {
                    f.strip_prefix(b"C")
                        .map(|c| String::from_utf8_lossy(c).to_string())
                }));
            }
            if tag == b'Z' {
                return codes;
            }
        }
        codes.push("closed".into());
        codes
    }
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_protocol_input_gets_clear_errors() {
    let addr = start(None).await;
    let mut raw = Raw::connect(addr).await;

    // Bind to a statement that does not exist.
    let mut bind = cstr("");
    bind.extend(cstr("nope"));
    bind.extend([0, 0, 0, 0, 0, 0]);
    raw.send(b'B', &bind).await;
    raw.send(b'E', &[0, 0, 0, 0, 0]).await; // skipped until Sync
    raw.send(b'S', &[]).await;
    assert_eq!(raw.until_ready().await, vec!["26000"]);

    // Describe / Execute of unknown names.
    let mut d = vec![b'S'];
    d.extend(cstr("missing"));
    raw.send(b'D', &d).await;
    raw.send(b'S', &[]).await;
    assert_eq!(raw.until_ready().await, vec!["26000"]);
    let mut ex = cstr("missing_portal");
    ex.extend([0, 0, 0, 0]);
    raw.send(b'E', &ex).await;
    raw.send(b'S', &[]).await;
    assert_eq!(raw.until_ready().await, vec!["34000"]);

    // Wrong parameter count.
    let mut parse = cstr("two");
    parse.extend(cstr("SELECT $1::BIGINT + $2::BIGINT"));
    parse.extend([0, 0]);
    raw.send(b'P', &parse).await;
    let mut bind = cstr("");
    bind.extend(cstr("two"));
    bind.extend([0, 0]); // no format codes
    bind.extend([0, 1, 0, 0, 0, 1, b'5']); // one parameter: '5'
    bind.extend([0, 0]);
    raw.send(b'B', &bind).await;
    raw.send(b'S', &[]).await;
    assert_eq!(raw.until_ready().await, vec!["08P01"]);

    // Too many format codes for the parameters.
    let mut bind = cstr("");
    bind.extend(cstr("two"));
    bind.extend([0, 3, 0, 0, 0, 0, 0, 0]);
    bind.extend([0, 2, 0, 0, 0, 1, b'5', 0, 0, 0, 1, b'6']);
    bind.extend([0, 0]);
    raw.send(b'B', &bind).await;
    raw.send(b'S', &[]).await;
    assert_eq!(raw.until_ready().await, vec!["08P01"]);

    // Binary parameter of the wrong width.
    let mut bind = cstr("");
    bind.extend(cstr("two"));
    bind.extend([0, 1, 0, 1]);
    bind.extend([0, 2, 0, 0, 0, 2, 0, 5, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 6]);
    bind.extend([0, 0]);
    raw.send(b'B', &bind).await;
    raw.send(b'E', &[0, 0, 0, 0, 0]).await;
    raw.send(b'S', &[]).await;
    assert_eq!(raw.until_ready().await, vec!["22P03"]);

    // The connection still works.
    raw.send(b'Q', &cstr("SELECT 1")).await;
    assert_eq!(raw.until_ready().await, Vec::<String>::new());

    // A malformed message (a length far beyond any limit) ends this
    // connection, not the server.
    raw.s
        .write_all(&[b'Q', 0x7f, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    // The server answers with an error or just closes; either way the
    // stream ends.
    while raw.next().await.is_some() {}
    let c = connect(addr).await;
    let row = c.query_one("SELECT 2::BIGINT", &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_keeps_acknowledged_commits() {
    let dir = tempfile::tempdir().unwrap();
    let engine = spindle_sql::Engine::open(Some(dir.path())).unwrap();
    let server = spindle_server::Server::bind(
        engine,
        "127.0.0.1:0".parse().unwrap(),
        spindle_server::Config::default(),
    )
    .await
    .unwrap();
    let addr = server.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(server.serve(async move {
        let _ = stop_rx.await;
    }));
    let c = connect(addr).await;
    c.batch_execute("CREATE TABLE k (id INT64 NOT NULL) PRIMARY KEY (id)")
        .await
        .unwrap();
    for i in 0..20i64 {
        c.execute("INSERT INTO k VALUES ($1)", &[&i]).await.unwrap();
    }
    stop_tx.send(()).unwrap();
    handle.await.unwrap().unwrap();
    drop(c);
    // Reopen the files: every acknowledged insert is there.
    let engine = spindle_sql::Engine::open(Some(dir.path())).unwrap();
    let mut s = engine.session();
    let out = s.execute("SELECT count(*) FROM k", &[]).await.unwrap();
    match &out[0] {
        spindle_sql::Output::Rows { batches, .. } => {
            let v = spindle_sql::types::array_value(batches[0].column(0).as_ref(), 0).unwrap();
            assert_eq!(v, spindle_keys::Value::Int64(20));
        }
        other => panic!("{other:?}"),
    }
}

/// A cross join of 10^10 rows: minutes of work unless it is canceled.
const LONG_QUERY: &str = "SELECT sum(a.value * b.value) FROM generate_series(1, 100000) a, \
                          generate_series(1, 100000) b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_request_stops_a_running_query() {
    use std::time::Duration;
    let addr = start(None).await;
    let client = connect(addr).await;
    let other = connect(addr).await;
    let token = client.cancel_token();

    // Simple protocol, outside a transaction block.
    let running = tokio::spawn(async move {
        let r = client.simple_query(LONG_QUERY).await;
        (client, r)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!running.is_finished(), "the query ended before the cancel");
    // Another connection is not held up meanwhile.
    other.simple_query("SELECT 1").await.unwrap();
    token.cancel_query(NoTls).await.unwrap();
    let (client, r) = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the canceled query stopped")
        .unwrap();
    let e = r.expect_err("canceled");
    assert_eq!(sqlstate(&e), "57014", "{e:?}");
    assert_eq!(
        e.as_db_error().unwrap().message(),
        "canceling statement due to user request"
    );
    // The connection stays usable.
    let row = client.query_one("SELECT 1 + 1", &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 2);

    // Extended protocol, inside a transaction block: the block fails
    // (25P02) until ROLLBACK, as in PostgreSQL.
    client.batch_execute("BEGIN").await.unwrap();
    let token = client.cancel_token();
    let running = tokio::spawn(async move {
        let r = client.query(LONG_QUERY, &[]).await.map(|_| ());
        (client, r)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    token.cancel_query(NoTls).await.unwrap();
    let (client, r) = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the canceled query stopped")
        .unwrap();
    assert_eq!(sqlstate(&r.expect_err("canceled")), "57014");
    let e = client.query("SELECT 1", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&e), "25P02");
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        client
            .query_one("SELECT 2", &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        2
    );

    // A cancel with no query running does nothing.
    client.cancel_token().cancel_query(NoTls).await.unwrap();
    assert_eq!(
        client
            .query_one("SELECT 3", &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_statement_query_is_one_implicit_transaction() {
    let addr = start(None).await;
    let client = connect(addr).await;
    client
        .batch_execute("CREATE TABLE t (id INT64 NOT NULL, v STRING(MAX)) PRIMARY KEY (id)")
        .await
        .unwrap();
    async fn ids(client: &Client) -> Vec<i64> {
        client
            .query("SELECT id FROM t ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    // All or nothing: the duplicate key undoes the two inserts before it.
    let e = client
        .simple_query(
            "INSERT INTO t VALUES (1, 'a'); INSERT INTO t VALUES (2, 'b'); \
             INSERT INTO t VALUES (1, 'dup'); INSERT INTO t VALUES (3, 'c')",
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "23505");
    assert_eq!(ids(&client).await, Vec::<i64>::new());

    // Success: every statement's result, and later statements see the
    // earlier ones' writes.
    let msgs = client
        .simple_query(
            "INSERT INTO t VALUES (1, 'a'); INSERT INTO t VALUES (2, 'b'); SELECT count(*) FROM t",
        )
        .await
        .unwrap();
    let tags: Vec<u64> = msgs
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::CommandComplete(n) => Some(*n),
            _ => None,
        })
        .collect();
    assert_eq!(tags, vec![1, 1, 1]);
    let counted: Vec<&str> = msgs
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0),
            _ => None,
        })
        .collect();
    assert_eq!(counted, vec!["2"]);

    // An error in a query after a write also rolls the write back.
    let e = client
        .simple_query("UPDATE t SET v = 'changed'; SELECT 1 / 0")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22012");
    let v: Vec<String> = client
        .query("SELECT v FROM t ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(v, vec!["a", "b"]);

    // DDL and DML together: a failure leaves no table behind.
    let e = client
        .simple_query(
            "CREATE TABLE u (id INT64 NOT NULL) PRIMARY KEY (id); \
             INSERT INTO u VALUES (1); INSERT INTO u VALUES (1)",
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "23505");
    let e = client.simple_query("SELECT * FROM u").await.unwrap_err();
    assert_eq!(sqlstate(&e), "42P01");

    // A string with its own BEGIN/COMMIT runs statement by statement: the
    // committed block stays when a later statement fails.
    let e = client
        .simple_query(
            "BEGIN; INSERT INTO t VALUES (5, 'e'); COMMIT; INSERT INTO t VALUES (1, 'dup')",
        )
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "23505");
    assert_eq!(ids(&client).await, vec![1, 2, 5]);

    // Inside an explicit transaction block the statements join it, and an
    // error fails the block until ROLLBACK.
    client.batch_execute("BEGIN").await.unwrap();
    let e = client
        .simple_query("INSERT INTO t VALUES (6, 'f'); INSERT INTO t VALUES (1, 'dup')")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "23505");
    let e = client.simple_query("SELECT 1").await.unwrap_err();
    assert_eq!(sqlstate(&e), "25P02");
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(ids(&client).await, vec![1, 2, 5]);

    // Reads only: no transaction needed, each query runs as before.
    let msgs = client
        .simple_query("SELECT 1; SELECT count(*) FROM t")
        .await
        .unwrap();
    assert_eq!(
        msgs.iter()
            .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
            .count(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_columns_are_described_as_jsonb() {
    let addr = start(None).await;
    let client = connect(addr).await;
    client
        .batch_execute(
            "CREATE TABLE docs (id INT64 NOT NULL, info JSON, note STRING(MAX)) PRIMARY KEY (id);
             CREATE TABLE parts (id INT64 NOT NULL, part INT64 NOT NULL, spec JSON)
               PRIMARY KEY (id, part), INTERLEAVE IN PARENT docs;
             INSERT INTO docs VALUES (1, '{\"a\": [1, 2]}', 'x'), (2, NULL, 'y');
             INSERT INTO parts VALUES (1, 1, '\"s\"')",
        )
        .await
        .unwrap();
    let types = |sql: &'static str| {
        let client = &client;
        async move {
            client
                .prepare(sql)
                .await
                .unwrap()
                .columns()
                .iter()
                .map(|c| c.type_().clone())
                .collect::<Vec<_>>()
        }
    };
    // A JSON column stays jsonb (OID 3802) through projections, filters,
    // ordering, joins and aliases; STRING stays text.
    assert_eq!(
        types("SELECT id, info, note FROM docs").await,
        vec![Type::INT8, Type::JSONB, Type::TEXT]
    );
    assert_eq!(types("SELECT * FROM docs").await[1], Type::JSONB);
    assert_eq!(
        types("SELECT info AS i FROM docs WHERE id = $1 ORDER BY id").await,
        vec![Type::JSONB]
    );
    assert_eq!(
        types("SELECT d.info, p.spec FROM docs d JOIN parts p ON p.id = d.id").await,
        vec![Type::JSONB, Type::JSONB]
    );
    assert_eq!(
        types("SELECT id, spec FROM parts").await,
        vec![Type::INT8, Type::JSONB]
    );
    assert_eq!(
        types("SELECT j FROM (SELECT info AS j FROM docs) AS sub").await,
        vec![Type::JSONB]
    );
    assert_eq!(Type::JSONB.oid(), 3802);
    // Only the column itself is jsonb: a cast to text, or any other
    // expression over it, is text (and a cast inside a subquery stays so).
    for sql in [
        "SELECT CAST(info AS text) FROM docs",
        "SELECT info::text FROM docs",
        "SELECT info::varchar AS v FROM docs",
        "SELECT TRY_CAST(info AS text) FROM docs",
        "SELECT t FROM (SELECT info::text AS t FROM docs) AS sub",
        "SELECT coalesce(info::text, 'none') FROM docs",
        "SELECT CASE WHEN id = 1 THEN info END FROM docs",
    ] {
        assert_eq!(types(sql).await, vec![Type::TEXT], "{sql}");
    }
    let row = client
        .query_one("SELECT info::text AS t, info FROM docs WHERE id = 1", &[])
        .await
        .unwrap();
    assert_eq!(row.columns()[0].type_().oid(), Type::TEXT.oid());
    assert_eq!(row.columns()[1].type_().oid(), 3802);
    assert_eq!(row.get::<_, String>(0), "{\"a\":[1,2]}");
    // Repeated output names are allowed, as in PostgreSQL, and each column
    // keeps its own type.
    for sql in [
        "SELECT info::text, info FROM docs ORDER BY id",
        "SELECT info::text, info FROM docs WHERE id = 1",
    ] {
        assert_eq!(types(sql).await, vec![Type::TEXT, Type::JSONB], "{sql}");
        let stmt = client.prepare(sql).await.unwrap();
        let names: Vec<&str> = stmt.columns().iter().map(|c| c.name()).collect();
        assert_eq!(names, ["info", "info"], "{sql}");
        let rows = client.query(&stmt, &[]).await.unwrap();
        assert_eq!(rows[0].get::<_, String>(0), "{\"a\":[1,2]}", "{sql}");
    }

    // Values in binary (jsonb's version byte + text) and text format.
    let rows = client
        .query("SELECT id, info FROM docs ORDER BY id", &[])
        .await
        .unwrap();
    let info: Option<serde_json::Value> = rows[0].get(1);
    assert_eq!(info, Some(serde_json::json!({"a": [1, 2]})));
    let info: Option<serde_json::Value> = rows[1].get(1);
    assert_eq!(info, None);
    let msgs = client
        .simple_query("SELECT info FROM docs WHERE id = 1")
        .await
        .unwrap();
    let text = msgs.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    });
    assert_eq!(text.as_deref(), Some("{\"a\":[1,2]}"));
    // A jsonb parameter (declared by the client).
    let insert = client
        .prepare_typed(
            "INSERT INTO docs (id, info) VALUES ($1, $2)",
            &[Type::INT8, Type::JSONB],
        )
        .await
        .unwrap();
    let n = client
        .execute(&insert, &[&3i64, &serde_json::json!({"b": true})])
        .await
        .unwrap();
    assert_eq!(n, 1);
    let row = client
        .query_one("SELECT upper(note), info FROM docs WHERE id = 3", &[])
        .await
        .unwrap();
    assert_eq!(row.columns()[0].type_(), &Type::TEXT);
    assert_eq!(
        row.get::<_, serde_json::Value>(1),
        serde_json::json!({"b": true})
    );
}

/// Extended-protocol replies are queued until Sync or Flush (one write per
/// round trip), and a Flush delivers everything queued without a Sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_wait_for_sync_or_flush() {
    let addr = start(None).await;
    let mut raw = Raw::connect(addr).await;
    raw.send(
        b'Q',
        &cstr("CREATE TABLE f (k BIGINT PRIMARY KEY, v BIGINT)"),
    )
    .await;
    assert_eq!(raw.until_ready().await, Vec::<String>::new());

    let mut parse = cstr("sel");
    parse.extend(cstr("SELECT v FROM f WHERE k = $1"));
    parse.extend([0, 1, 0, 0, 0, 20]); // $1 is int8
    raw.send(b'P', &parse).await;
    let mut d = vec![b'S'];
    d.extend(cstr("sel"));
    raw.send(b'D', &d).await;
    // Nothing is sent before a Flush or Sync.
    raw.assert_silent("the server replied before Flush").await;
    raw.send(b'H', &[]).await;
    let tags: Vec<u8> = [
        raw.next().await.unwrap().0,
        raw.next().await.unwrap().0,
        raw.next().await.unwrap().0,
    ]
    .to_vec();
    // ParseComplete, ParameterDescription, RowDescription.
    assert_eq!(tags, vec![b'1', b't', b'T']);

    // Bind, Describe portal, Execute, Sync: every reply, then ReadyForQuery.
    let mut bind = cstr("");
    bind.extend(cstr("sel"));
    bind.extend([0, 0]);
    bind.extend([0, 1, 0, 0, 0, 1, b'7']);
    bind.extend([0, 0]);
    raw.send(b'B', &bind).await;
    let mut d = vec![b'P'];
    d.extend(cstr(""));
    raw.send(b'D', &d).await;
    raw.send(b'E', &[0, 0, 0, 0, 0]).await;
    raw.send(b'S', &[]).await;
    let tags = raw.tags_until_ready().await;
    // BindComplete, RowDescription, CommandComplete (no rows), ReadyForQuery.
    assert_eq!(tags, vec![b'2', b'T', b'C', b'Z']);

    // Execute's rows and CommandComplete (or PortalSuspended) wait too.
    raw.send(b'Q', &cstr("INSERT INTO f VALUES (7, 70), (8, 80)"))
        .await;
    assert_eq!(raw.until_ready().await, Vec::<String>::new());
    raw.send(b'B', &bind).await;
    raw.send(b'E', &[0, 0, 0, 0, 0]).await;
    let mut range = cstr("all");
    range.extend(cstr("SELECT v FROM f ORDER BY k"));
    range.extend([0, 0]);
    raw.send(b'P', &range).await;
    let mut bind_all = cstr("p");
    bind_all.extend(cstr("all"));
    bind_all.extend([0, 0, 0, 0, 0, 0]);
    raw.send(b'B', &bind_all).await;
    let mut ex = cstr("p");
    ex.extend([0, 0, 0, 1]); // one row at a time
    raw.send(b'E', &ex).await;
    raw.assert_silent("the server replied to Execute before Flush")
        .await;
    raw.send(b'H', &[]).await;
    let mut got = Vec::new();
    for _ in 0..7 {
        got.push(raw.next().await.unwrap().0);
    }
    // BindComplete, DataRow, CommandComplete; ParseComplete, BindComplete,
    // DataRow, PortalSuspended.
    assert_eq!(got, vec![b'2', b'D', b'C', b'1', b'2', b'D', b's']);
    raw.send(b'E', &ex).await;
    raw.send(b'E', &ex).await;
    raw.send(b'S', &[]).await;
    let tags = raw.tags_until_ready().await;
    // The second row and the end of the portal (no rows, then
    // CommandComplete), then ReadyForQuery.
    assert_eq!(tags, vec![b'D', b's', b'C', b'Z']);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_lock_waits_deadlocks_and_timeouts_over_the_wire() {
    use std::time::Duration;
    let addr = start(None).await;
    let (a, b) = (connect(addr).await, connect(addr).await);
    a.batch_execute(
        "CREATE TABLE acc (id INT64 NOT NULL, n INT64) PRIMARY KEY (id);
         INSERT INTO acc VALUES (1, 0), (2, 0)",
    )
    .await
    .unwrap();
    let wait = Duration::from_millis(100);

    // A second update of a row waits for the first and continues from it.
    a.batch_execute("BEGIN; UPDATE acc SET n = n + 1 WHERE id = 1")
        .await
        .unwrap();
    b.batch_execute("BEGIN").await.unwrap();
    let update = "UPDATE acc SET n = n + $1 WHERE id = $2";
    let waiting = b.execute(update, &[&10i64, &1i64]);
    tokio::pin!(waiting);
    assert!(tokio::time::timeout(wait, &mut waiting).await.is_err());
    a.batch_execute("COMMIT").await.unwrap();
    assert_eq!(waiting.await.unwrap(), 1);
    b.batch_execute("COMMIT").await.unwrap();
    let n: i64 = a
        .query_one("SELECT n FROM acc WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 11);

    // Crossed updates: whichever side closes the cycle gets 40P01 at once
    // (normally b, which asks second) and rolls back; the other goes on.
    a.batch_execute("BEGIN; UPDATE acc SET n = n + 1 WHERE id = 1")
        .await
        .unwrap();
    b.batch_execute("BEGIN; UPDATE acc SET n = n + 1 WHERE id = 2")
        .await
        .unwrap();
    async fn ask(
        c: &Client,
        sql: &str,
        id: i64,
        delay: Duration,
    ) -> Result<u64, tokio_postgres::Error> {
        tokio::time::sleep(delay).await;
        let r = c.execute(sql, &[&1i64, &id]).await;
        if r.is_err() {
            c.batch_execute("ROLLBACK").await.unwrap();
        }
        r
    }
    let (ra, rb) = tokio::join!(ask(&a, update, 2, Duration::ZERO), ask(&b, update, 1, wait));
    let e = match (ra, rb) {
        (Ok(1), Err(e)) | (Err(e), Ok(1)) => e,
        other => panic!("exactly one side must fail: {other:?}"),
    };
    assert_eq!(sqlstate(&e), "40P01", "{e}");
    a.batch_execute("COMMIT").await.unwrap();
    b.batch_execute("COMMIT").await.unwrap();

    // lock_timeout: 55P03 once the wait passes it.
    a.batch_execute("BEGIN; UPDATE acc SET n = n + 1 WHERE id = 2")
        .await
        .unwrap();
    b.batch_execute("SET lock_timeout = '50ms'").await.unwrap();
    let e = b
        .simple_query("UPDATE acc SET n = 0 WHERE id = 2")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "55P03", "{e}");
    a.batch_execute("COMMIT").await.unwrap();
    async fn n_of_2(c: &Client) -> i64 {
        let row = c.query_one("SELECT n FROM acc WHERE id = 2", &[]).await;
        row.unwrap().get::<_, i64>(0)
    }
    let before = n_of_2(&b).await;
    b.batch_execute("UPDATE acc SET n = n * 2 WHERE id = 2")
        .await
        .unwrap();
    assert_eq!(n_of_2(&b).await, before * 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_request_stops_a_wait_for_a_row_lock() {
    use std::time::Duration;
    let addr = start(None).await;
    let holder = connect(addr).await;
    let waiter = connect(addr).await;
    holder
        .batch_execute(
            "CREATE TABLE acc (id INT64 NOT NULL, n INT64) PRIMARY KEY (id);
             INSERT INTO acc VALUES (1, 0);
             BEGIN; UPDATE acc SET n = 1 WHERE id = 1",
        )
        .await
        .unwrap();
    // Simple and extended protocol: each waits for the holder's lock until
    // canceled, then fails with 57014 and the connection stays usable.
    for extended in [false, true] {
        let token = waiter.cancel_token();
        let started = std::time::Instant::now();
        let running = async {
            if extended {
                waiter
                    .execute("UPDATE acc SET n = n + 1 WHERE id = $1", &[&1i64])
                    .await
                    .map(|_| ())
            } else {
                waiter
                    .simple_query("UPDATE acc SET n = n + 1 WHERE id = 1")
                    .await
                    .map(|_| ())
            }
        };
        let cancel = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            token.cancel_query(NoTls).await.unwrap();
        };
        let (r, ()) = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::join!(running, cancel)
        })
        .await
        .expect("the canceled wait stopped");
        let e = r.expect_err("canceled");
        assert_eq!(sqlstate(&e), "57014", "{e:?}");
        assert!(started.elapsed() >= Duration::from_millis(300));
        let row = waiter
            .query_one("SELECT n FROM acc WHERE id = 1", &[])
            .await;
        assert_eq!(row.unwrap().get::<_, i64>(0), 0);
    }
    holder.batch_execute("COMMIT").await.unwrap();
    waiter
        .batch_execute("UPDATE acc SET n = n + 1 WHERE id = 1")
        .await
        .unwrap();
    let row = waiter
        .query_one("SELECT n FROM acc WHERE id = 1", &[])
        .await;
    assert_eq!(row.unwrap().get::<_, i64>(0), 2);
}

/// Each connection runs on a thread of its own with a single-threaded
/// runtime; DataFusion plans run on the server's multi-threaded runtime,
/// where a correlated subquery (evaluated per outer row by blocking on a
/// nested plan) can run. Without that hand-off it fails with "correlated
/// subqueries need a multi-threaded runtime".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn general_plans_run_on_the_shared_runtime() {
    let addr = start(None).await;
    let c = connect(addr).await;
    c.batch_execute(
        "CREATE TABLE t1 (a INT64 NOT NULL, c INT64) PRIMARY KEY (a);
         INSERT INTO t1 VALUES (1, 10), (2, 30), (3, 20), (4, NULL)",
    )
    .await
    .unwrap();
    let sql = "SELECT a, (SELECT count(*) FROM t1 AS x WHERE x.c > t1.c) FROM t1 ORDER BY a";
    let expected = vec![(1, 2), (2, 0), (3, 1), (4, 0)];
    for rows in [
        c.query(sql, &[]).await.unwrap(),
        c.query(&c.prepare(sql).await.unwrap(), &[]).await.unwrap(),
    ] {
        let got: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(got, expected);
    }
    let simple = c.simple_query(sql).await.unwrap();
    let n = simple
        .iter()
        .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
        .count();
    assert_eq!(n, 4);
    // A statement error from the executor reaches the client as usual.
    let e = c
        .query("SELECT a / (c - c) FROM t1 WHERE a = 1 OR c > 0", &[])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22012", "{e:?}");
}

/// A simple query that changes a reported parameter is followed by its
/// ParameterStatus (before ReadyForQuery); one that changes nothing sends
/// none, and setting a parameter to the value the client already has sends
/// none either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_parameters_are_reported_once() {
    let addr = start(None).await;
    let mut raw = Raw::connect(addr).await;
    async fn statuses(raw: &mut Raw, sql: &str) -> Vec<String> {
        raw.send(b'Q', &cstr(sql)).await;
        let mut out = Vec::new();
        while let Some((tag, body)) = raw.next().await {
            if tag == b'S' {
                // name \0 value \0
                let parts: Vec<String> = body
                    .split(|b| *b == 0)
                    .take(2)
                    .map(|p| String::from_utf8_lossy(p).to_string())
                    .collect();
                out.push(parts.join("="));
            }
            if tag == b'Z' {
                break;
            }
        }
        out
    }
    assert_eq!(
        statuses(&mut raw, "SET application_name = 'reporter'").await,
        vec!["application_name=reporter"]
    );
    assert_eq!(statuses(&mut raw, "SELECT 1").await, Vec::<String>::new());
    assert_eq!(
        statuses(&mut raw, "SET application_name = 'reporter'").await,
        Vec::<String>::new()
    );
    assert_eq!(
        statuses(&mut raw, "SET DateStyle = 'ISO, DMY'; SELECT 1").await,
        vec!["DateStyle=ISO, DMY"]
    );
    let reset = statuses(&mut raw, "RESET ALL").await;
    for p in ["application_name=", "DateStyle=ISO, MDY"] {
        assert!(reset.iter().any(|r| r == p), "{p} in {reset:?}");
    }
    assert!(
        !reset.iter().any(|r| r.starts_with("TimeZone")),
        "{reset:?}"
    );
}

/// RowDescription reports each column's `pg_type.typlen` (drivers such as
/// JDBC read it): the fixed width of fixed-width types, -1 for the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_description_carries_each_type_size() {
    let addr = start(None).await;
    let mut raw = Raw::connect(addr).await;
    raw.send(
        b'Q',
        &cstr(
            "SELECT true AS b, 1::smallint AS s, 2::int AS i, 3::bigint AS l, \
             1.5::real AS f, 2.5::double precision AS d, DATE '2026-01-02' AS day, \
             TIMESTAMP '2026-01-02 03:04:05' AS ts, 'x' AS t, 1.25::numeric AS n",
        ),
    )
    .await;
    let (tag, body) = raw.next().await.unwrap();
    assert_eq!(tag, b'T');
    let count = i16::from_be_bytes([body[0], body[1]]) as usize;
    let mut at = 2;
    let mut sizes = Vec::new();
    for _ in 0..count {
        let name_end = at + body[at..].iter().position(|b| *b == 0).unwrap();
        let name = String::from_utf8(body[at..name_end].to_vec()).unwrap();
        // table oid (4), attnum (2), type oid (4), typlen (2), typmod (4), format (2)
        let f = name_end + 1;
        let oid = u32::from_be_bytes(body[f + 6..f + 10].try_into().unwrap());
        let size = i16::from_be_bytes(body[f + 10..f + 12].try_into().unwrap());
        sizes.push((name, oid, size));
        at = f + 18;
    }
    let expect = [
        ("b", 16, 1),
        ("s", 21, 2),
        ("i", 23, 4),
        ("l", 20, 8),
        ("f", 700, 4),
        ("d", 701, 8),
        ("day", 1082, 4),
        ("ts", 1114, 8),
        ("t", 25, -1),
        ("n", 1700, -1),
    ];
    let expect: Vec<(String, u32, i16)> = expect
        .iter()
        .map(|(n, o, s)| (n.to_string(), *o, *s))
        .collect();
    assert_eq!(sizes, expect);
    assert_eq!(raw.until_ready().await, Vec::<String>::new());
}

/// With busy polling on, a lone client's statements (simple and extended)
/// are answered whether its next message comes while the connection is
/// still watching the socket or after it gave up and parked; and with two
/// clients at once (more than one active connection: no spinning), each
/// still sees its own results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_polling_connections_answer_every_message() {
    let addr = start_with(spindle_server::Config {
        busy_poll_micros: 2_000,
        ..Default::default()
    })
    .await;
    let a = connect(addr).await;
    a.batch_execute("CREATE TABLE t (k bigint PRIMARY KEY, v bigint)")
        .await
        .unwrap();
    let insert = a.prepare("INSERT INTO t VALUES ($1, $2)").await.unwrap();
    let select = a.prepare("SELECT v FROM t WHERE k = $1").await.unwrap();
    for k in 0..200i64 {
        a.execute(&insert, &[&k, &(k * 10)]).await.unwrap();
        let v: i64 = a.query_one(&select, &[&k]).await.unwrap().get(0);
        assert_eq!(v, k * 10);
        if k % 50 == 0 {
            // Longer than the spin: the connection parks, then wakes.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    let b = connect(addr).await;
    let (ra, rb) = tokio::join!(
        async {
            let mut sum = 0i64;
            for k in 0..100i64 {
                sum += a.query_one(&select, &[&k]).await.unwrap().get::<_, i64>(0);
            }
            sum
        },
        async {
            let mut n = 0;
            for _ in 0..100 {
                let rows = b.simple_query("SELECT count(*) FROM t").await.unwrap();
                for m in &rows {
                    if let SimpleQueryMessage::Row(r) = m {
                        assert_eq!(r.get(0), Some("200"));
                        n += 1;
                    }
                }
            }
            n
        }
    );
    assert_eq!(ra, (0..100i64).map(|k| k * 10).sum::<i64>());
    assert_eq!(rb, 100);
}

/// A statement prepared with parameters is parsed once, at Parse, and its
/// Executes run those statements (not the text looked up again): they
/// must still see every schema change made since, from any connection —
/// an index, a new column, the table dropped (an error with its
/// SQLSTATE, not a stale answer) and made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_follow_schema_changes() {
    let addr = start(None).await;
    let a = connect(addr).await;
    let b = connect(addr).await;
    a.batch_execute(
        "CREATE TABLE t (k bigint PRIMARY KEY, v bigint NOT NULL);
         INSERT INTO t VALUES (1, 10), (2, 20), (3, 30)",
    )
    .await
    .unwrap();
    let select = a.prepare("SELECT v FROM t WHERE k = $1").await.unwrap();
    let bump = a
        .prepare("UPDATE t SET v = v + $1 WHERE k = $2")
        .await
        .unwrap();
    let by_v = a.prepare("SELECT k FROM t WHERE v = $1").await.unwrap();
    let v = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get(0)).collect::<Vec<i64>>();

    assert_eq!(a.execute(&bump, &[&5i64, &2i64]).await.unwrap(), 1);
    assert_eq!(v(a.query(&select, &[&2i64]).await.unwrap()), vec![25]);

    b.batch_execute("CREATE UNIQUE INDEX t_v ON t (v)")
        .await
        .unwrap();
    assert_eq!(v(a.query(&by_v, &[&25i64]).await.unwrap()), vec![2]);
    // The index is maintained by the prepared UPDATE, and enforced.
    assert_eq!(a.execute(&bump, &[&1i64, &2i64]).await.unwrap(), 1);
    assert_eq!(v(a.query(&by_v, &[&26i64]).await.unwrap()), vec![2]);
    let e = a.execute(&bump, &[&4i64, &2i64]).await.unwrap_err();
    assert_eq!(sqlstate(&e), "23505", "{e:?}");

    b.batch_execute("ALTER TABLE t ADD COLUMN w bigint")
        .await
        .unwrap();
    assert_eq!(a.execute(&bump, &[&100i64, &3i64]).await.unwrap(), 1);
    assert_eq!(v(a.query(&select, &[&3i64]).await.unwrap()), vec![130]);

    b.batch_execute("DROP TABLE t").await.unwrap();
    let e = a.query(&select, &[&3i64]).await.unwrap_err();
    assert_eq!(sqlstate(&e), "42P01", "{e:?}");
    let e = a.execute(&bump, &[&1i64, &3i64]).await.unwrap_err();
    assert_eq!(sqlstate(&e), "42P01", "{e:?}");

    b.batch_execute(
        "CREATE TABLE t (k bigint PRIMARY KEY, v bigint NOT NULL);
         INSERT INTO t VALUES (3, 7)",
    )
    .await
    .unwrap();
    assert_eq!(a.execute(&bump, &[&1i64, &3i64]).await.unwrap(), 1);
    assert_eq!(v(a.query(&select, &[&3i64]).await.unwrap()), vec![8]);
    assert_eq!(
        v(a.query(&select, &[&2i64]).await.unwrap()),
        Vec::<i64>::new()
    );
}

/// A text sent again as an unnamed statement (tokio-postgres' `query` with
/// a `&str`: Parse, Describe, then Bind/Execute) is described from what the
/// engine kept, and still follows every schema change: the columns a new
/// column adds, a key's new type after the table is made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unnamed_statements_follow_schema_changes() {
    let addr = start(None).await;
    let a = connect(addr).await;
    let b = connect(addr).await;
    a.batch_execute(
        "CREATE TABLE u (k bigint PRIMARY KEY, v text);
         INSERT INTO u VALUES (1, 'one'), (2, 'two')",
    )
    .await
    .unwrap();
    let sql = "SELECT * FROM u WHERE k = $1";
    for k in [1i64, 2, 1] {
        let rows = a.query(sql, &[&k]).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].len(), 2);
        assert_eq!(rows[0].get::<_, i64>(0), k);
    }

    b.batch_execute("ALTER TABLE u ADD COLUMN w double precision")
        .await
        .unwrap();
    b.batch_execute("UPDATE u SET w = 2.5 WHERE k = 2")
        .await
        .unwrap();
    let rows = a.query(sql, &[&2i64]).await.unwrap();
    assert_eq!(rows[0].len(), 3);
    assert_eq!(rows[0].columns()[2].type_(), &Type::FLOAT8);
    assert_eq!(rows[0].get::<_, Option<f64>>(2), Some(2.5));

    b.batch_execute(
        "DROP TABLE u;
         CREATE TABLE u (k text PRIMARY KEY, n bigint);
         INSERT INTO u VALUES ('x', 9)",
    )
    .await
    .unwrap();
    // $1 is now text: the client learns so from the new description.
    let stmt = a.prepare(sql).await.unwrap();
    assert_eq!(stmt.params(), &[Type::TEXT]);
    let rows = a.query(sql, &[&"x"]).await.unwrap();
    assert_eq!(rows[0].get::<_, &str>(0), "x");
    assert_eq!(rows[0].get::<_, i64>(1), 9);
    let e = a.query(sql, &[&1i64]).await.unwrap_err();
    assert!(e.to_string().contains("error serializing"), "{e:?}");
}

/// A LIMIT or OFFSET parameter is described as a bigint, as PostgreSQL
/// does, so that a client sends it as a number (ORMs prepare a find as
/// `… WHERE id = $1 LIMIT $2`); each row count runs (a template per count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_row_counts_are_bigints() {
    let addr = start(None).await;
    let c = connect(addr).await;
    c.batch_execute(
        "CREATE TABLE rc (k bigint PRIMARY KEY, v text NOT NULL);
         INSERT INTO rc VALUES (1, 'a'), (2, 'b'), (3, 'b'), (4, 'b'), (5, 'c')",
    )
    .await
    .unwrap();
    let find = c
        .prepare("SELECT k FROM rc WHERE v = $1 ORDER BY k LIMIT $2 OFFSET $3")
        .await
        .unwrap();
    assert_eq!(
        find.params(),
        &[
            tokio_postgres::types::Type::TEXT,
            tokio_postgres::types::Type::INT8,
            tokio_postgres::types::Type::INT8
        ]
    );
    let ks = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get(0)).collect::<Vec<i64>>();
    for (v, limit, offset, want) in [
        ("b", 2i64, 0i64, vec![2i64, 3]),
        ("b", 2, 1, vec![3, 4]),
        ("b", 1, 0, vec![2]),
        ("a", 5, 0, vec![1]),
        ("b", 0, 0, vec![]),
        ("b", 2, 0, vec![2, 3]),
    ] {
        let rows = c.query(&find, &[&v, &limit, &offset]).await.unwrap();
        assert_eq!(ks(rows), want, "{v} {limit} {offset}");
    }
    let e = c.query(&find, &[&"b", &-1i64, &0i64]).await.unwrap_err();
    assert_eq!(sqlstate(&e).len(), 5, "{e:?}");
}

/// Every connection's socket has TCP_NODELAY, as PostgreSQL's do (pgwire
/// sets it when it takes the socket): with Nagle's algorithm, a reply
/// written while the previous one is unacknowledged would wait for the
/// pipelining client's delayed ACK. This guards the option should the
/// server take its sockets another way. The test finds the server's end
/// of its connections among this process's sockets (the server runs in
/// the test's process) and reads the option on each; the pipelined
/// queries must all answer, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_have_no_nagle_delay() {
    use std::mem::ManuallyDrop;
    use std::os::fd::FromRawFd;

    let addr = start(None).await;
    let a = connect(addr).await;
    let b = connect(addr).await;
    a.batch_execute("SELECT 1").await.unwrap();
    let select = b.prepare("SELECT $1::bigint + 1").await.unwrap();
    // Pipelined: all sent before the first reply is read.
    let replies = futures::future::join_all((0..20i64).map(|i| {
        let (b, select) = (&b, &select);
        async move { b.query_one(select, &[&i]).await.unwrap().get::<_, i64>(0) }
    }))
    .await;
    assert_eq!(replies, (1..=20).collect::<Vec<i64>>());

    // The server's ends of this server's connections: TCP sockets of this
    // process whose local address is the server's and that have a peer
    // (the listener has none).
    let mut accepted = 0;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let entry = entry.unwrap();
        let is_socket = std::fs::read_link(entry.path())
            .map(|l| l.to_string_lossy().starts_with("socket:"))
            .unwrap_or(false);
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if !is_socket {
            continue;
        }
        // Borrowed, never closed (ManuallyDrop): the descriptor belongs
        // to the server or the client.
        let socket = ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
        if socket.local_addr().ok() != Some(addr) || socket.peer_addr().is_err() {
            continue;
        }
        accepted += 1;
        assert!(
            socket.nodelay().unwrap(),
            "a connection to the server without TCP_NODELAY"
        );
    }
    assert!(
        accepted >= 2,
        "found {accepted} of the server's connections"
    );
}
