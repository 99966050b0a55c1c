//! The machine's condition at the start and the end of a run, so a run on
//! a slow or busy hour of a shared VM can be told from a change in the
//! code. Ratios compare systems measured in the same run, but a workload
//! bound by the disk and one bound by the CPU are not slowed alike when
//! the host is busy, so the figures of two runs are only comparable when
//! their probes roughly agree.
//!
//! Three figures, each cheap (well under a second):
//! * a fixed CPU-bound loop (xorshift, `black_box`ed), in milliseconds;
//! * 4 KiB written in place and `fdatasync`ed 200 times in the temporary
//!   directory the servers' data directories go to: p50 / p99 in µs;
//! * Linux's CPU pressure (`/proc/pressure/cpu`, "some", 60 s average):
//!   the share of time something runnable waited for a CPU.

use std::fs::OpenOptions;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use crate::util::{Context, Result};

/// Iterations of the CPU loop (about 50 ms on this machine's good days).
const CPU_ITERATIONS: u64 = 50_000_000;
/// Synced writes timed for the disk figure.
const SYNCS: usize = 200;

/// One look at the machine.
pub struct Probe {
    pub cpu_ms: f64,
    pub sync_p50_us: f64,
    pub sync_p99_us: f64,
    /// `None` where the kernel has no pressure stall information.
    pub cpu_pressure: Option<f64>,
}

impl Probe {
    pub fn take() -> Result<Probe> {
        let t = Instant::now();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..CPU_ITERATIONS {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x = black_box(x);
        }
        black_box(x);
        let cpu_ms = t.elapsed().as_secs_f64() * 1000.0;

        let dir = tempfile::Builder::new()
            .prefix("compare-probe")
            .tempdir()
            .ctx("probe temp dir")?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.path().join("sync"))
            .ctx("probe file")?;
        let page = vec![0x5au8; 4096];
        // Allocated and synced first: the timed writes change no file size.
        file.write_all_at(&page, 0).ctx("probe write")?;
        file.sync_all().ctx("probe sync")?;
        let mut times: Vec<Duration> = Vec::with_capacity(SYNCS);
        for _ in 0..SYNCS {
            let t = Instant::now();
            file.write_all_at(&page, 0).ctx("probe write")?;
            file.sync_data().ctx("probe sync")?;
            times.push(t.elapsed());
        }
        times.sort();
        let at = |q: f64| {
            let i = ((times.len() as f64 - 1.0) * q).round() as usize;
            times[i.min(times.len() - 1)].as_secs_f64() * 1e6
        };
        Ok(Probe {
            cpu_ms,
            sync_p50_us: at(0.5),
            sync_p99_us: at(0.99),
            cpu_pressure: cpu_pressure(),
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "CPU loop {:.0} ms, 4 KiB write + fdatasync p50 / p99 {:.0} / {:.0} µs, CPU pressure {}",
            self.cpu_ms,
            self.sync_p50_us,
            self.sync_p99_us,
            self.cpu_pressure
                .map_or("n/a".to_string(), |p| format!("{p:.1}%"))
        )
    }
}

/// `/proc/pressure/cpu`'s "some avg60", in percent.
fn cpu_pressure() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    let line = text.lines().find(|l| l.starts_with("some"))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("avg60="))?
        .parse()
        .ok()
}
