//! End-to-end tests of `spindle serve`'s TLS flags with the built binary:
//! bad certificate or key files and incomplete flags stop it at startup
//! with a clear message and a non-zero exit status; with a certificate it
//! answers an SSLRequest with 'S', without one with 'N'.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

fn serve_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    cmd.args(["serve", "--in-memory", "--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `spindle serve` expecting it to stop at startup.
fn serve_fails(args: &[&str]) -> Output {
    let out = serve_cmd(args).output().expect("run spindle serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "spindle serve {args:?} started");
    assert!(!stderr.contains("panicked"), "{stderr}");
    out
}

/// A running `spindle serve`, killed when dropped.
struct Running {
    child: Child,
    port: u16,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(args: &[&str]) -> Running {
    let mut child = serve_cmd(args).spawn().expect("spawn spindle serve");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let mut running = Running { child, port: 0 };
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    running.port = addr.rsplit(':').next().unwrap().parse().unwrap();
    running
}

/// Sends an SSLRequest; returns the server's one-byte answer.
fn ssl_request(port: u16) -> u8 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).unwrap();
    let mut answer = [0u8; 1];
    s.read_exact(&mut answer).unwrap();
    answer[0]
}

fn write_cert(dir: &Path) -> (String, String) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = dir.join("server.crt");
    let key = dir.join("server.key");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    (
        cert.to_string_lossy().into_owned(),
        key.to_string_lossy().into_owned(),
    )
}

#[test]
fn bad_tls_files_and_flags_stop_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key) = write_cert(tmp.path());
    let missing = tmp.path().join("missing.crt");
    let missing = missing.to_string_lossy();

    let out = serve_fails(&["--tls-cert", &missing, "--tls-key", &key]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spindle serve: TLS: reading") && err.contains("missing.crt"),
        "{err}"
    );

    let out = serve_fails(&["--tls-cert", &key, "--tls-key", &key]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no certificate found"), "{err}");

    let out = serve_fails(&["--tls-cert", &cert, "--tls-key", &cert]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no PEM private key"), "{err}");

    // Both or neither; --require-tls needs them.
    for args in [
        &["--tls-cert", cert.as_str()][..],
        &["--tls-key", key.as_str()][..],
        &["--require-tls"][..],
    ] {
        let out = serve_fails(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--tls-"), "{err}");
    }
}

#[test]
fn ssl_request_is_accepted_only_with_a_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key) = write_cert(tmp.path());
    let tls = serve(&["--tls-cert", &cert, "--tls-key", &key, "--require-tls"]);
    assert_eq!(ssl_request(tls.port), b'S');
    let plain = serve(&[]);
    assert_eq!(ssl_request(plain.port), b'N');
}
