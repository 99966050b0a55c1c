//! # Busy polling between statements while the server is lightly loaded
//!
//! A connection thread that has sent ReadyForQuery and has nothing to run
//! parks in `epoll_wait`; the client's next message then has to wake it
//! (the kernel's wake-up of a sleeping thread, on a virtual machine often
//! the wake-up of an idle vCPU). With one client issuing statements back
//! to back, that wake-up is most of each round trip. So, before parking, a
//! connection waiting for its client's next message watches the socket
//! for a short while (`peek`, non-blocking) and parks only when nothing
//! came; when something came, `epoll_wait` returns at once.
//!
//! Spinning burns a core, which only pays while cores are idle. The rule:
//!
//! ```text
//!   spin before parking  ⇔  the client owes the next message (Conn::idle)
//!                          ∧ active connections ≤ limit
//!                          ∧ spinners < limit
//!   limit = max(1, cores / 2)
//!   active = connections woken in this 1 ms window or the one before
//!   a spin ends when data arrives, after `micros`, or when active > limit
//!   ∧ spinning pays for this connection (Payoff: after 3 spins in a row
//!     that timed out, park without spinning for 1, 2, 4, … ≤ 64 waits
//!     between trial spins; one spin that sees the message resets it)
//! ```
//!
//! "Active" counts connections, not threads: a thread's every wake-up
//! notes its connection in the current window (one count per connection
//! per window), so an idle psql session does not count and a second busy
//! client stops the first one's spinning within a window. A connection
//! waiting for a query running on the shared runtime, or for COPY data, is
//! not `idle` and never spins.
//!
//! Measured with pgbench on the 2-core VM (2026-11-23, `--busy-poll-us 0`
//! against 50, runs alternated): prepared point selects at 1 client
//! 11.0–12.8 k → 26.5–26.9 k tps; TPC-B-like at 1 client 1.16–1.28 k →
//! 1.87–2.27 k; a row tree's 3 selects in a read-only transaction
//! 2.3–2.6 k → 3.6–4.4 k. At 4 clients nobody spins (strace: one `recvfrom`
//! per statement, as without it).
//!
//! The budget (`spindle serve --busy-poll-us`, default
//! [`crate::DEFAULT_BUSY_POLL_MICROS`] = 200 µs) must cover the client's
//! gap between our reply and its next message: its own wake-up plus its
//! handling of the reply. 50 µs covered pgbench (C, a tight loop) but not
//! a client on an async runtime, whose spins then mostly timed out. The
//! harness's row-tree read (tokio-postgres, 5 round trips; `compare
//! --only 4`, 2026-11-29, budgets alternated): against PostgreSQL 0.66 /
//! 0.87 / 0.99 / 1.08 at 50 µs, 1.39–1.69 at 100 and 150, 1.50–1.65 at
//! 200, 1.46–2.24 at 300, 1.58–1.62 at 500 (Spindle's p50 per row tree
//! 720–1 037 µs at 50, 443–587 from 100 on). A Python client (psycopg 3,
//! binary, prepared): 812 / 827 → 1 309 / 1 572 row trees per second at
//! 200 µs, the server's CPU per row tree 0.49–0.50 → 0.70–0.75 ms (the
//! spinning). A miss costs at most the budget and backs off ([`Payoff`]).
//!
//! The window state is one atomic word:
//!
//! ```text
//!   bits 63..32  window number (ms since the server's epoch, wrapping)
//!   bits 31..16  connections noted in that window (saturating)
//!   bits 15..0   connections noted in the window before it
//! ```

use std::net::TcpStream;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The packed window state (module docs).
static WINDOW: AtomicU64 = AtomicU64::new(0);
/// Connections spinning now.
static SPINNERS: AtomicUsize = AtomicUsize::new(0);

/// Window length.
const WINDOW_MICROS: u64 = 1_000;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The current window's number (wraps after ~50 days; only equality and
/// succession are compared).
fn window_now() -> u32 {
    (epoch().elapsed().as_micros() as u64 / WINDOW_MICROS) as u32
}

fn unpack(s: u64) -> (u32, u16, u16) {
    ((s >> 32) as u32, (s >> 16) as u16, s as u16)
}

fn pack(w: u32, cur: u16, prev: u16) -> u64 {
    (u64::from(w) << 32) | (u64::from(cur) << 16) | u64::from(prev)
}

/// How many connections may spin at once, and how many may be active
/// for any to spin.
pub(crate) fn limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| (n.get() / 2).max(1))
            .unwrap_or(1)
    })
}

/// One connection's view: the window it was last noted in.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    noted: AtomicU64,
}

impl Activity {
    /// Called on every wake-up of the connection's thread: counts the
    /// connection once in the current window.
    pub(crate) fn wake(&self) {
        let w = window_now();
        // `noted` holds window + 1 (0: never noted).
        let tag = u64::from(w) + 1;
        if self.noted.swap(tag, Ordering::Relaxed) == tag {
            return;
        }
        note(w);
    }
}

/// The window word after noting one more connection in window `w`.
fn noted(s: u64, w: u32) -> u64 {
    let (sw, cur, prev) = unpack(s);
    if sw == w {
        pack(w, cur.saturating_add(1), prev)
    } else if sw.wrapping_add(1) == w {
        pack(w, 1, cur)
    } else {
        pack(w, 1, 0)
    }
}

/// Connections noted in window `w` or the one before it, per word `s`.
fn count(s: u64, w: u32) -> usize {
    let (sw, cur, prev) = unpack(s);
    if sw == w {
        usize::from(cur.max(prev))
    } else if sw.wrapping_add(1) == w {
        usize::from(cur)
    } else {
        0
    }
}

fn note(w: u32) {
    let mut s = WINDOW.load(Ordering::Relaxed);
    while let Err(now) =
        WINDOW.compare_exchange_weak(s, noted(s, w), Ordering::AcqRel, Ordering::Relaxed)
    {
        s = now;
    }
}

/// Connections noted in the current window or the one before it.
fn active() -> usize {
    count(WINDOW.load(Ordering::Acquire), window_now())
}

/// Before parking: watches `socket` for up to `micros` while the rule in
/// the module docs allows and spinning has been paying off for this
/// connection (`payoff`); the runtime's `epoll_wait` then finds whatever
/// came.
pub(crate) fn spin(socket: &TcpStream, micros: u64, payoff: &Payoff) {
    let limit = limit();
    if active() > limit || !payoff.should_spin() {
        return;
    }
    if SPINNERS.fetch_add(1, Ordering::AcqRel) < limit {
        let came = watch(socket, Duration::from_micros(micros), || active() > limit);
        // A watch cut short by other connections says nothing about
        // this client's pace.
        if came || active() <= limit {
            payoff.record(came);
        }
    }
    SPINNERS.fetch_sub(1, Ordering::AcqRel);
}

/// Consecutive spins that timed out before a connection stops spinning
/// for a while.
const MISSES: u32 = 3;
/// Most parks skipped in a row before the next trial spin.
const MAX_SKIP: u32 = 64;

/// Whether spinning pays for one connection: spins whose budget ran out
/// with nothing from the client are wasted CPU, which on a busy host (a
/// shared VM whose vCPUs are taken away) the client and the other
/// connections need. After [`MISSES`] such spins in a row the connection
/// parks without spinning for 1, 2, 4, … up to [`MAX_SKIP`] waits between
/// trial spins; one spin that sees the client's message resets it.
///
/// ```text
///   spin: miss miss miss │ skip 1 │ miss │ skip 2 │ miss │ skip 4 … ≤ 64 │ hit → spin every time again
/// ```
///
/// Measured (2026-11-27, a slow stretch of the VM: a fixed CPU loop at
/// 254 ms against 150 on steady hours): a row-tree read at 1 client ran
/// 991 tps at 637 µs of server CPU per transaction with spinning, 1 238
/// at 422 without (6 alternated rounds, medians).
#[derive(Debug, Default)]
pub(crate) struct Payoff {
    misses: AtomicU32,
    skip: AtomicU32,
}

impl Payoff {
    /// Whether to spin at this park (a skipped park counts down).
    fn should_spin(&self) -> bool {
        let skip = self.skip.load(Ordering::Relaxed);
        if skip > 0 {
            self.skip.store(skip - 1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// A spin's outcome: whether the client's message came within it.
    fn record(&self, came: bool) {
        if came {
            self.misses.store(0, Ordering::Relaxed);
            return;
        }
        let misses = self.misses.load(Ordering::Relaxed).saturating_add(1);
        self.misses.store(misses, Ordering::Relaxed);
        if misses >= MISSES {
            let doublings = (misses - MISSES).min(MAX_SKIP.trailing_zeros());
            self.skip.store(1 << doublings, Ordering::Relaxed);
        }
    }
}

/// Peeks at `socket` until a byte (or end of stream, or an error) is
/// there, `budget` has passed or `stop` says so; whether something came.
fn watch(socket: &TcpStream, budget: Duration, stop: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    let mut byte = [0u8; 1];
    loop {
        match socket.peek(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Data, end of stream or an error: epoll_wait reports it now.
            _ => return true,
        }
        if start.elapsed() >= budget || stop() {
            return false;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_word_round_trips() {
        for (w, c, p) in [(0, 0, 0), (1, 2, 3), (u32::MAX, u16::MAX, 7)] {
            assert_eq!(unpack(pack(w, c, p)), (w, c, p));
        }
    }

    #[test]
    fn connections_are_counted_per_window_and_forgotten() {
        let mut s = 0;
        for _ in 0..3 {
            s = noted(s, 10);
        }
        assert_eq!(count(s, 10), 3);
        // The next window remembers the last one's count...
        assert_eq!(count(s, 11), 3);
        s = noted(s, 11);
        assert_eq!(count(s, 11), 3);
        assert_eq!(count(s, 12), 1);
        // ...but not two windows back.
        assert_eq!(count(s, 13), 0);
        assert_eq!(count(noted(s, 13), 13), 1);
        // Window numbers wrap.
        let s = noted(noted(0, u32::MAX), u32::MAX);
        assert_eq!(count(s, 0), 2);
        assert_eq!(count(noted(s, 0), 0), 2);
    }

    /// Spinning stops after `MISSES` timed-out spins, resumes for one
    /// trial spin after each doubling skip (capped), and a spin that sees
    /// the client's message makes every park spin again.
    #[test]
    fn spinning_backs_off_while_it_does_not_pay_and_resumes_when_it_does() {
        let p = Payoff::default();
        // Parks whose spins time out, until the run of skips.
        for _ in 0..MISSES {
            assert!(p.should_spin());
            p.record(false);
        }
        let mut pattern = Vec::new();
        for _ in 0..200 {
            let spun = p.should_spin();
            pattern.push(spun);
            if spun {
                p.record(false);
            }
        }
        let skips: Vec<usize> = pattern
            .split(|spun| *spun)
            .map(|run| run.len())
            .filter(|n| *n > 0)
            .collect();
        // (The last run may be cut short by the loop's end.)
        let whole = &skips[..skips.len() - 1];
        assert_eq!(&whole[..7], &[1, 2, 4, 8, 16, 32, 64]);
        assert!(
            whole[7..].iter().all(|n| *n == MAX_SKIP as usize),
            "{skips:?}"
        );
        // A hit: every park spins again.
        while !p.should_spin() {}
        p.record(true);
        for _ in 0..10 {
            assert!(p.should_spin());
            p.record(true);
        }
        // One miss after hits does not stop it.
        p.record(false);
        assert!(p.should_spin());
    }

    #[test]
    fn a_watch_sees_a_waiting_byte_and_gives_up_on_silence() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let t = Instant::now();
        assert!(!watch(&server, Duration::from_millis(2), || false));
        assert!(t.elapsed() >= Duration::from_millis(2));
        assert!(!watch(&server, Duration::from_secs(60), || true));
        client.write_all(b"Q").unwrap();
        assert!(watch(&server, Duration::from_secs(60), || false));
        // Peeked, not consumed.
        let mut b = [0u8; 1];
        assert_eq!(server.peek(&mut b).unwrap(), 1);
        assert_eq!(&b, b"Q");
        drop(client);
    }
}
