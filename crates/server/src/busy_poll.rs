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
//! The window state is one atomic word:
//!
//! ```text
//!   bits 63..32  window number (ms since the server's epoch, wrapping)
//!   bits 31..16  connections noted in that window (saturating)
//!   bits 15..0   connections noted in the window before it
//! ```

use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
/// the module docs allows (the runtime's `epoll_wait` then finds whatever
/// came).
pub(crate) fn spin(socket: &TcpStream, micros: u64) {
    let limit = limit();
    if active() > limit {
        return;
    }
    if SPINNERS.fetch_add(1, Ordering::AcqRel) < limit {
        watch(socket, Duration::from_micros(micros), || active() > limit);
    }
    SPINNERS.fetch_sub(1, Ordering::AcqRel);
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
