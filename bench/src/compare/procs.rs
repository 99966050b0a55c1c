//! The servers the run starts and always stops: PostgreSQL 15 in a
//! temporary cluster and `spindle serve` on a temporary data directory.
//! Each is a guard whose `Drop` stops the process (on success, on error and
//! on a panic, which unwinds). Ctrl-C, SIGTERM or SIGHUP stop them too
//! ([`install_signal_handler`]: drops do not run when a signal ends the
//! process). Only a `kill -9` of the harness leaves them running; their
//! directories are under the system temp dir.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::util::{fail, progress, Context, Result};

/// How to stop a running server and remove its directory if a signal ends
/// the harness; registered while the server runs.
type EmergencyStop = Box<dyn FnOnce() + Send>;

static LIVE: Mutex<Vec<(u64, EmergencyStop)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn register(stop: EmergencyStop) -> u64 {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((id, stop));
    id
}

fn deregister(id: u64) {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(i, _)| *i != id);
}

/// On SIGINT, SIGTERM or SIGHUP: stop every server the harness started,
/// remove their directories and exit with 130.
pub fn install_signal_handler() -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).ctx("signal handler")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                eprintln!("compare: interrupted by signal {sig}; stopping the servers");
                let live = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
                for (_, stop) in live {
                    stop();
                }
                std::process::exit(130);
            }
        })
        .ctx("signal thread")?;
    Ok(())
}

/// A free loopback port (bound, read, released: another process could take
/// it in between, which then fails the server's start loudly).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").ctx("binding a probe port")?;
    Ok(l.local_addr().ctx("probe port")?.port())
}

/// Waits until `addr` accepts TCP connections.
fn wait_for_port(addr: SocketAddr, timeout: Duration, child: &mut Child) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait().ctx("waiting for the server")? {
            return fail(format!("the server exited while starting: {status}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    fail(format!("nothing listens on {addr} after {timeout:?}"))
}

fn run_checked(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().ctx(format!("running {what}"))?;
    if !out.status.success() {
        return fail(format!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn tail(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A PostgreSQL cluster in a temporary directory, stopped on drop.
pub struct Postgres {
    bin: PathBuf,
    /// `Some(user)` when the harness runs as root: PostgreSQL refuses to
    /// run as root, so its programs run as this OS user (`runuser`).
    os_user: Option<String>,
    pub port: u16,
    pub version: String,
    dir: tempfile::TempDir,
    started: bool,
    emergency: Option<u64>,
}

impl Postgres {
    fn command(&self, program: &str) -> Command {
        let exe = self.bin.join(program);
        match &self.os_user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(exe);
                c
            }
            None => Command::new(exe),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// initdb (trust authentication, superuser `postgres`) and start on a
    /// free loopback port with fsync on and the default settings otherwise.
    pub fn start(bin: &Path, os_user_if_root: &str) -> Result<Postgres> {
        let is_root = run_checked(Command::new("id").arg("-u"), "id -u")?.trim() == "0";
        let dir = tempfile::Builder::new()
            .prefix("compare-pg")
            .tempdir()
            .ctx("temp dir")?;
        let os_user = if is_root {
            let uid: u32 = run_checked(Command::new("id").args(["-u", os_user_if_root]), "id")?
                .trim()
                .parse()
                .ctx("uid")?;
            let gid: u32 = run_checked(Command::new("id").args(["-g", os_user_if_root]), "id")?
                .trim()
                .parse()
                .ctx("gid")?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .ctx("chown of the PostgreSQL temp dir")?;
            Some(os_user_if_root.to_string())
        } else {
            None
        };
        let mut pg = Postgres {
            bin: bin.to_path_buf(),
            os_user,
            port: free_port()?,
            version: String::new(),
            dir,
            started: false,
            emergency: None,
        };
        pg.version = run_checked(
            pg.command("postgres").arg("--version"),
            "postgres --version",
        )?
        .trim()
        .to_string();
        progress(format!("initdb ({})", pg.version));
        run_checked(
            pg.command("initdb").arg("-D").arg(pg.data()).args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
            ]),
            "initdb",
        )?;
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on -c max_connections=50",
            pg.port,
            pg.dir.path().display()
        );
        pg.started = true; // from here on, Drop tries to stop it
        let mut stop = pg.command("pg_ctl");
        stop.arg("-D")
            .arg(pg.data())
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .stdout(Stdio::null());
        let dir = pg.dir.path().to_path_buf();
        pg.emergency = Some(register(Box::new(move || {
            let _ = stop.status();
            let _ = std::fs::remove_dir_all(dir);
        })));
        run_checked(
            pg.command("pg_ctl")
                .arg("-D")
                .arg(pg.data())
                .arg("-l")
                .arg(pg.dir.path().join("log"))
                .args(["-w", "-t", "120", "-o", &opts, "start"])
                .stdout(Stdio::null()),
            "pg_ctl start",
        )
        .map_err(|e| format!("{e}\nserver log:\n{}", tail(&pg.dir.path().join("log"))))?;
        progress(format!("PostgreSQL listening on 127.0.0.1:{}", pg.port));
        Ok(pg)
    }

    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if !self.started {
            return;
        }
        if let Some(id) = self.emergency {
            deregister(id);
        }
        let r = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "fast", "-w", "-t", "60", "stop"])
            .stdout(Stdio::null())
            .status();
        match r {
            Ok(s) if s.success() => progress("PostgreSQL stopped"),
            other => eprintln!("stopping PostgreSQL failed: {other:?}"),
        }
    }
}

/// `spindle serve` on a temporary data directory, stopped on drop.
pub struct Spindle {
    child: Child,
    pub port: u16,
    /// Whether it runs in a session of its own (started through `setsid`).
    pub own_session: bool,
    log: PathBuf,
    emergency: u64,
    _dir: tempfile::TempDir,
}

impl Spindle {
    pub fn start(bin: &Path) -> Result<Spindle> {
        let dir = tempfile::Builder::new()
            .prefix("compare-spindle")
            .tempdir()
            .ctx("temp dir")?;
        let port = free_port()?;
        let log = dir.path().join("server.log");
        let logfile = std::fs::File::create(&log).ctx("server log")?;
        let serve = |program: &Path, prefix: &[&Path]| -> std::io::Result<Child> {
            Command::new(program)
                .args(prefix)
                .arg("serve")
                .arg("--data-dir")
                .arg(dir.path().join("data"))
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(logfile.try_clone()?)
                .spawn()
        };
        // In a session of its own, as pg_ctl starts PostgreSQL (it calls
        // setsid): with the kernel's autogroup scheduling, a server in the
        // harness's session would share a scheduling group with pgbench's
        // threads, and be scheduled differently from PostgreSQL (see
        // bench/README.md, "Both servers are daemons"). `setsid` execs the
        // server in place (the child is not a process group leader), so the
        // child's pid is the server's.
        let (child, own_session) = match serve(Path::new("setsid"), &[bin]) {
            Ok(child) => Ok((child, true)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                progress(
                    "setsid not found: Spindle runs in the harness's session (PostgreSQL in its own)",
                );
                serve(bin, &[]).map(|child| (child, false))
            }
            Err(e) => Err(e),
        }
        .ctx(format!("starting {}", bin.display()))?;
        let pid = child.id().to_string();
        let path = dir.path().to_path_buf();
        let emergency = register(Box::new(move || {
            // The server stops gracefully on SIGTERM within a few seconds.
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let _ = Command::new("sh")
                .args([
                    "-c",
                    &format!("for i in $(seq 100); do kill -0 {pid} 2>/dev/null || exit 0; sleep 0.1; done; kill -9 {pid}"),
                ])
                .status();
            let _ = std::fs::remove_dir_all(path);
        }));
        let mut s = Spindle {
            child,
            port,
            own_session,
            log,
            emergency,
            _dir: dir,
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        if let Err(e) = wait_for_port(addr, Duration::from_secs(120), &mut s.child) {
            return fail(format!("spindle serve: {e}\nlog:\n{}", tail(&s.log)));
        }
        progress(format!("spindle serve listening on {addr}"));
        Ok(s)
    }

    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=spindle dbname=spindle",
            self.port
        )
    }

    /// The server's log so far (the end of it), for error messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }
}

impl Drop for Spindle {
    fn drop(&mut self) {
        deregister(self.emergency);
        // SIGTERM is a graceful stop; kill it if it has not exited in 30 s.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                progress("spindle serve stopped");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        eprintln!("spindle serve did not stop on SIGTERM within 30 s: killed");
    }
}

/// The `spindle` binary: `--spindle-bin`, else a sibling of this executable
/// (same target directory and profile).
pub fn find_spindle(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe().ctx("current executable")?;
    let sibling = exe.with_file_name("spindle");
    if sibling.exists() {
        return Ok(sibling);
    }
    fail(format!(
        "no spindle binary next to {} — build it with the same profile \
         (`cargo build --release -p spindle-cli -p spindle-bench`) or pass --spindle-bin PATH",
        exe.display()
    ))
}
