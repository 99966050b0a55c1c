//! TLS on the wire server, with a self-signed certificate made by the test
//! (rcgen): tokio-postgres over rustls verifying that certificate, the
//! installed psql with `sslmode=require` and `sslmode=verify-full`,
//! `require_tls` refusing plaintext (28000), SCRAM over TLS, and bad
//! certificate or key files refused at startup.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use pgwire::tokio::tokio_rustls::rustls;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use tokio_postgres_rustls::MakeRustlsConnect;

/// A self-signed certificate for `localhost` and `127.0.0.1`, in PEM,
/// also written to files in a temporary directory.
struct Cert {
    cert_pem: String,
    key_pem: String,
    der: Vec<u8>,
    dir: tempfile::TempDir,
}

impl Cert {
    fn new() -> Cert {
        let made = rcgen::generate_simple_self_signed(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ])
        .unwrap();
        let cert = Cert {
            cert_pem: made.cert.pem(),
            key_pem: made.signing_key.serialize_pem(),
            der: made.cert.der().to_vec(),
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::write(cert.cert_path(), &cert.cert_pem).unwrap();
        std::fs::write(cert.key_path(), &cert.key_pem).unwrap();
        cert
    }

    fn cert_path(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    fn key_path(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    fn tls(&self) -> spindle_server::Tls {
        spindle_server::Tls::from_pem_files(&self.cert_path(), &self.key_path()).unwrap()
    }

    /// A rustls client that trusts only this certificate (and verifies it).
    fn connector(&self) -> MakeRustlsConnect {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.der.clone().into()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        MakeRustlsConnect::new(config)
    }
}

async fn start(config: spindle_server::Config) -> SocketAddr {
    let engine = spindle_sql::Engine::open(None).unwrap();
    let server = spindle_server::Server::bind(engine, "127.0.0.1:0".parse().unwrap(), config)
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.serve(std::future::pending()));
    addr
}

fn conn_str(addr: SocketAddr, extra: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user=tester dbname=spindle {extra}",
        addr.port()
    )
}

async fn connect_tls(addr: SocketAddr, cert: &Cert, extra: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(
        &conn_str(addr, &format!("sslmode=require {extra}")),
        cert.connector(),
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

async fn one_value(client: &Client, sql: &str) -> String {
    let msgs = client.simple_query(sql).await.unwrap();
    msgs.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no row from {sql}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_over_verified_tls() {
    let cert = Cert::new();
    let addr = start(spindle_server::Config {
        tls: Some(cert.tls()),
        ..Default::default()
    })
    .await;
    let client = connect_tls(addr, &cert, "").await;
    client
        .batch_execute(
            "CREATE TABLE t (id INT64 NOT NULL, v STRING(MAX)) PRIMARY KEY (id);
             INSERT INTO t VALUES (1, 'over tls')",
        )
        .await
        .unwrap();
    let row = client
        .query_one("SELECT v FROM t WHERE id = $1", &[&1i64])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "over tls");

    // A client that does not trust the certificate fails the handshake.
    let other = Cert::new();
    let e = tokio_postgres::connect(&conn_str(addr, "sslmode=require"), other.connector())
        .await
        .err()
        .expect("a certificate the client does not trust is refused");
    assert!(
        format!("{e:?}").to_lowercase().contains("certificate"),
        "{e:?}"
    );

    // TLS is optional: plaintext still works.
    let (plain, conn) = tokio_postgres::connect(&conn_str(addr, ""), NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    assert_eq!(one_value(&plain, "SELECT v FROM t").await, "over tls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_tls_refuses_plaintext_with_28000() {
    let cert = Cert::new();
    let addr = start(spindle_server::Config {
        tls: Some(cert.tls()),
        require_tls: true,
        ..Default::default()
    })
    .await;
    let e = tokio_postgres::connect(&conn_str(addr, "sslmode=disable"), NoTls)
        .await
        .err()
        .expect("plaintext is refused");
    assert_eq!(sqlstate(&e), "28000");
    let msg = e.as_db_error().map(|d| d.message().to_string());
    assert!(
        msg.as_deref().is_some_and(|m| m.contains("requires TLS")),
        "{msg:?}"
    );
    // sslmode=prefer falls back to plaintext only if TLS is refused; here
    // it is accepted, as is require.
    for mode in ["prefer", "require"] {
        let client = connect_tls(addr, &cert, &format!("sslmode={mode}")).await;
        assert_eq!(one_value(&client, "SELECT 1 + 1").await, "2");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_over_tls() {
    let cert = Cert::new();
    let addr = start(spindle_server::Config {
        password: Some("s3cret".into()),
        tls: Some(cert.tls()),
        require_tls: false,
        ..Default::default()
    })
    .await;
    // channel_binding=require: SCRAM-SHA-256-PLUS, bound to the
    // certificate of this TLS connection.
    for binding in ["prefer", "require", "disable"] {
        let client = connect_tls(
            addr,
            &cert,
            &format!("password=s3cret channel_binding={binding}"),
        )
        .await;
        assert_eq!(one_value(&client, "SELECT 'in'").await, "in");
    }
    let e = tokio_postgres::connect(
        &conn_str(addr, "sslmode=require password=wrong"),
        cert.connector(),
    )
    .await
    .err()
    .expect("a wrong password is refused");
    assert_eq!(sqlstate(&e), "28P01");
    // Plaintext SCRAM still works (TLS is optional here).
    let (plain, conn) = tokio_postgres::connect(&conn_str(addr, "password=s3cret"), NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    assert_eq!(one_value(&plain, "SELECT 'plain'").await, "plain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_certificate_files_are_refused() {
    let cert = Cert::new();
    let dir = cert.dir.path();
    let err = |c: &Path, k: &Path| {
        spindle_server::Tls::from_pem_files(c, k)
            .expect_err("refused")
            .to_string()
    };
    let missing = dir.join("missing.pem");
    let e = err(&missing, &cert.key_path());
    assert!(
        e.contains("missing.pem") && e.contains("No such file"),
        "{e}"
    );
    let e = err(&cert.cert_path(), &missing);
    assert!(e.contains("missing.pem"), "{e}");

    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let e = err(&garbage, &cert.key_path());
    assert!(
        e.contains("garbage.pem") && e.contains("no certificate"),
        "{e}"
    );
    let e = err(&cert.cert_path(), &garbage);
    assert!(
        e.contains("garbage.pem") && e.contains("no PEM private key"),
        "{e}"
    );
    // The certificate where the key should be, and the other way round.
    let e = err(&cert.key_path(), &cert.cert_path());
    assert!(e.contains("no certificate"), "{e}");
    // A key that does not belong to the certificate.
    let other = Cert::new();
    let e = err(&cert.cert_path(), &other.key_path());
    assert!(e.contains("rejected"), "{e}");
    // A truncated certificate.
    let cut = dir.join("cut.pem");
    std::fs::write(&cut, &cert.cert_pem[..cert.cert_pem.len() / 2]).unwrap();
    let e = err(&cut, &cert.key_path());
    assert!(e.contains("cut.pem"), "{e}");

    // require_tls without a certificate is a configuration error.
    let engine = spindle_sql::Engine::open(None).unwrap();
    let r = spindle_server::Server::bind(
        engine,
        "127.0.0.1:0".parse().unwrap(),
        spindle_server::Config {
            require_tls: true,
            ..Default::default()
        },
    )
    .await;
    assert!(matches!(
        r,
        Err(spindle_server::Error::TlsRequiredWithoutCertificate)
    ));
}

// ---------------------------------------------------------------------------
// psql

/// The installed psql; `None` (skip) when there is none, unless
/// SPINDLE_REQUIRE_CLIENTS=1 (set by .ci/run), which makes that a failure.
fn psql_binary() -> Option<String> {
    for p in ["/usr/bin/psql", "/usr/lib/postgresql/15/bin/psql"] {
        if Path::new(p).exists() {
            return Some(p.to_string());
        }
    }
    if std::env::var("SPINDLE_REQUIRE_CLIENTS").is_ok_and(|v| v == "1") {
        panic!("psql is not installed, and SPINDLE_REQUIRE_CLIENTS=1 requires it");
    }
    None
}

/// Runs psql with a connection string and `-c` commands; returns whether
/// it succeeded, stdout and stderr.
fn psql(bin: &str, conninfo: &str, commands: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(bin);
    cmd.args(["-X", "-v", "ON_ERROR_STOP=1", "-d", conninfo])
        .env("PGCONNECT_TIMEOUT", "10")
        .env("PAGER", "")
        .env("PSQL_PAGER", "")
        .env_remove("PGSSLMODE")
        // No client certificate or CA from the user's ~/.postgresql.
        .env("PGSSLCERT", "/nonexistent")
        .env("PGSSLKEY", "/nonexistent")
        .env("PGSSLROOTCERT", "/nonexistent");
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd.output().expect("run psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn psql_over_tls() {
    let Some(bin) = psql_binary() else {
        println!("NOTICE: psql is not installed; skipping the psql TLS test");
        return;
    };
    let cert = Cert::new();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr = rt.block_on(start(spindle_server::Config {
        tls: Some(cert.tls()),
        require_tls: true,
        ..Default::default()
    }));
    let base = format!(
        "host=127.0.0.1 port={} user=spindle dbname=spindle",
        addr.port()
    );

    let (ok, out, err) = psql(
        &bin,
        &format!("{base} sslmode=require"),
        &["\\conninfo", "SELECT 40 + 2 AS answer"],
    );
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("SSL connection (protocol: TLSv1.3"), "{out}");
    assert!(out.contains("42"), "{out}");

    // verify-full: psql checks the certificate against the test's CA file
    // and the host name against its subject alternative names.
    let root = cert.cert_path();
    let (ok, out, err) = psql(
        &bin,
        &format!("{base} sslmode=verify-full sslrootcert={}", root.display()),
        &["\\conninfo"],
    );
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("SSL connection"), "{out}");
    // ... and refuses a certificate it does not trust.
    let other = Cert::new();
    let (ok, _, err) = psql(
        &bin,
        &format!(
            "{base} sslmode=verify-full sslrootcert={}",
            other.cert_path().display()
        ),
        &["SELECT 1"],
    );
    assert!(!ok && err.contains("certificate verify failed"), "{err}");

    // require_tls: sslmode=disable is refused with the server's message.
    let (ok, out, err) = psql(&bin, &format!("{base} sslmode=disable"), &["SELECT 1"]);
    assert!(!ok, "stdout:\n{out}");
    assert!(err.contains("requires TLS"), "{err}");

    // Without a certificate the server answers the SSLRequest with 'N':
    // sslmode=require fails, prefer falls back to plaintext.
    let plain = rt.block_on(start(spindle_server::Config::default()));
    let base = format!(
        "host=127.0.0.1 port={} user=spindle dbname=spindle",
        plain.port()
    );
    let (ok, _, err) = psql(&bin, &format!("{base} sslmode=require"), &["SELECT 1"]);
    assert!(!ok && err.contains("does not support SSL"), "{err}");
    let (ok, out, err) = psql(&bin, &format!("{base} sslmode=prefer"), &["\\conninfo"]);
    assert!(ok, "{err}");
    assert!(!out.contains("SSL connection"), "{out}");
}
