//! Kept threads for split scans' far halves ([`crate::split_scan`]), and
//! for freeing a join's plan after its query (`session::DropLater`).
//!
//! A split scan hands the far half of its range to a helper thread. A new
//! OS thread for each split costs about 50 µs here (spawn and join,
//! measured on an idle machine), a tenth of a 2 500-row scan's whole CPU.
//! So a helper that finishes waits for the next job for a while
//! ([`KEEP_IDLE`]) before it exits.
//!
//! ```text
//!   run(job):  an idle helper?  ── yes ─▶ pop it, send it the job
//!                               └─ no ──▶ start a new thread with the job
//!   helper:    job ─▶ push self on `idle` ─▶ wait ≤ KEEP_IDLE ─▶ job ─▶ …
//!                                              └─ timed out: off `idle`, exit
//! ```
//!
//! Invariants:
//! * A job never waits for a free helper: it goes to one that is idle or
//!   to a new thread. (Unlike a bounded pool, where a scan thread waiting
//!   for its helper's batches could wait for a helper that never starts.)
//! * A helper on the `idle` list is waiting on its channel. It leaves the
//!   list only by being popped by [`run`] (which then sends it a job, so
//!   it waits until the job arrives) or by removing itself under the
//!   lock when its wait times out (then no one holds its sender).
//!   Hence a job sent to a popped helper always runs.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// How long a helper waits for another job before its thread exits.
pub(crate) const KEEP_IDLE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The helpers waiting for a job: each one's id and channel.
struct Idle {
    next_id: u64,
    waiting: Vec<(u64, Sender<Job>)>,
}

fn idle() -> &'static Mutex<Idle> {
    static IDLE: OnceLock<Mutex<Idle>> = OnceLock::new();
    IDLE.get_or_init(|| {
        Mutex::new(Idle {
            next_id: 0,
            waiting: Vec::new(),
        })
    })
}

/// Runs `job` on a helper thread: an idle one, or a new one named
/// `name`. An error only when no thread could be started (the job is
/// then dropped unrun; the caller does the work itself).
pub(crate) fn run(name: &str, job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let mut job: Job = Box::new(job);
    loop {
        let popped = idle()
            .lock()
            .map_err(|_| std::io::Error::other("helper thread list poisoned"))?
            .waiting
            .pop();
        let Some((_, tx)) = popped else { break };
        match tx.send(job) {
            Ok(()) => return Ok(()),
            // Cannot happen (see the invariants); try another helper.
            Err(e) => job = e.0,
        }
    }
    let id = {
        let mut idle = idle()
            .lock()
            .map_err(|_| std::io::Error::other("helper thread list poisoned"))?;
        idle.next_id += 1;
        idle.next_id
    };
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || helper(id, job))
        .map(|_| ())
}

/// A helper thread's life: run the job, then wait on the idle list for
/// the next one.
fn helper(id: u64, first: Job) {
    let (tx, rx): (Sender<Job>, Receiver<Job>) = channel();
    let mut job = first;
    loop {
        job();
        match idle().lock() {
            Ok(mut idle) => idle.waiting.push((id, tx.clone())),
            Err(_) => return,
        }
        job = match rx.recv_timeout(KEEP_IDLE) {
            Ok(next) => next,
            Err(RecvTimeoutError::Timeout) => {
                let Ok(mut idle) = idle().lock() else { return };
                if let Some(at) = idle.waiting.iter().position(|(i, _)| *i == id) {
                    idle.waiting.swap_remove(at);
                    return;
                }
                drop(idle);
                // Popped just now: its job is on the way.
                match rx.recv() {
                    Ok(next) => next,
                    Err(_) => return,
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
    }
}

/// Helpers idle right now (tests).
#[cfg(test)]
fn idle_count() -> usize {
    idle().lock().map(|i| i.waiting.len()).unwrap_or(0)
}

/// Helper threads started so far (tests).
#[cfg(test)]
fn started_count() -> u64 {
    idle().lock().map(|i| i.next_id).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    /// The pool is the process's: these tests take turns, so that one's
    /// helpers do not stand in for the other's.
    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static TURN: Mutex<()> = Mutex::new(());
        TURN.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn jobs_run_once_each_and_threads_are_reused() {
        let _turn = one_at_a_time();
        let (done_tx, done_rx) = sync_channel::<u64>(64);
        // One at a time: each job finds an idle helper (the previous job's,
        // or one another test left idle) and starts no thread. Counting
        // threads started, not distinct threads seen: a reused helper of
        // another test is a different thread but no new one.
        let started = started_count();
        for i in 0..20u64 {
            let done = done_tx.clone();
            run("test-helper", move || {
                done.send(i).unwrap();
            })
            .unwrap();
            let got = done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(got, i);
            // Wait until the helper is back on the idle list.
            let t = std::time::Instant::now();
            while idle_count() == 0 && t.elapsed() < Duration::from_secs(10) {
                std::thread::yield_now();
            }
        }
        // The first job may start one; a split scan of another test in
        // this binary taking the idle helper at the wrong moment, one more.
        let new = started_count() - started;
        assert!(new <= 2, "{new} threads started for 20 sequential jobs");
    }

    #[test]
    fn concurrent_jobs_each_get_a_thread() {
        let _turn = one_at_a_time();
        // Eight jobs that all wait for each other: they can only finish if
        // every one runs at once (no job waits for a free helper).
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let (done_tx, done_rx) = sync_channel::<()>(8);
        for _ in 0..8 {
            let (b, done) = (barrier.clone(), done_tx.clone());
            run("test-helper", move || {
                b.wait();
                done.send(()).unwrap();
            })
            .unwrap();
        }
        for _ in 0..8 {
            done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
    }
}
