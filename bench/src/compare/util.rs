//! Small pieces every workload uses: errors, progress lines, a seeded RNG,
//! timing loops and the figures they produce.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Any failure of the run; `main` prints it and exits non-zero after the
/// server guards have stopped their processes.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds what was being done to an error.
pub trait Context<T> {
    fn ctx(self, what: impl std::fmt::Display) -> Result<T>;
}

impl<T, E: std::fmt::Display> Context<T> for std::result::Result<T, E> {
    fn ctx(self, what: impl std::fmt::Display) -> Result<T> {
        self.map_err(|e| format!("{what}: {e}").into())
    }
}

/// Fails the run with a message.
pub fn fail<T>(msg: impl Into<String>) -> Result<T> {
    Err(msg.into().into())
}

/// A progress line on stderr, with the time since the run started.
pub fn progress(msg: impl std::fmt::Display) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed().as_secs_f64();
    eprintln!("[{t:7.1}s] {msg}");
}

/// SplitMix64: a small seeded generator, so every system gets the same data
/// in every run (no dependency on a library's generator staying the same).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        let span = (hi - lo + 1) as u64;
        lo + (self.next_u64() % span) as i64
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next_u64() % items.len() as u64) as usize]
    }
}

/// What one system achieved in one case.
#[derive(Clone, Debug, Default)]
pub struct Figure {
    /// Operations per second (throughput cases) or the median latency in
    /// milliseconds (latency cases, see [`Kind`]).
    pub value: f64,
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    /// Operations counted.
    pub ops: u64,
    /// Failed transactions (pgbench with retries), if counted.
    pub failures: Option<u64>,
    /// Retried transactions (pgbench with retries), if counted.
    pub retries: Option<u64>,
}

/// Whether a case is measured as throughput (higher is better) or as a
/// latency (lower is better).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Throughput,
    Latency,
}

impl Figure {
    pub fn from_hist(ops: u64, secs: f64, hist: &Histogram<u64>) -> Figure {
        Figure {
            value: ops as f64 / secs,
            p50_us: Some(hist.value_at_quantile(0.5)),
            p99_us: Some(hist.value_at_quantile(0.99)),
            ops,
            failures: None,
            retries: None,
        }
    }

    /// The median of `runs` latencies, in milliseconds.
    pub fn from_latencies(runs: &[Duration]) -> Figure {
        let mut us: Vec<u64> = runs.iter().map(|d| d.as_micros() as u64).collect();
        us.sort_unstable();
        let median = us.get(us.len() / 2).copied().unwrap_or(0);
        Figure {
            value: median as f64 / 1000.0,
            p50_us: Some(median),
            p99_us: us.last().copied(),
            ops: us.len() as u64,
            failures: None,
            retries: None,
        }
    }
}

pub fn histogram() -> Histogram<u64> {
    // 3 significant figures with an auto-resizing range cannot fail to build.
    Histogram::<u64>::new(3).unwrap_or_else(|_| unreachable!("valid histogram precision"))
}

/// Runs two systems' operations (`a(i)`, `b(i)`, each at least `min_ops`
/// times) in `rounds` alternating turns
/// (a, b, a, b, …; `seconds` in all for each, split evenly): a machine
/// that slows down during the run then slows both alike. Each figure
/// counts all its rounds' operations over their summed time; `i` runs on
/// across rounds (unique keys for inserts).
pub fn measure_alternating(
    rounds: usize,
    seconds: f64,
    min_ops: u64,
    mut a: impl FnMut(u64) -> Result<()>,
    mut b: impl FnMut(u64) -> Result<()>,
) -> Result<(Figure, Figure)> {
    let rounds = rounds.max(1);
    let turn = Duration::from_secs_f64(seconds / rounds as f64);
    let min_turn = min_ops.div_ceil(rounds as u64);
    let mut sides = [(histogram(), 0u64, 0f64), (histogram(), 0u64, 0f64)];
    for _ in 0..rounds {
        for (side, (hist, n, secs)) in sides.iter_mut().enumerate() {
            let start = Instant::now();
            let first = *n;
            while *n - first < min_turn || start.elapsed() < turn {
                let t = Instant::now();
                if side == 0 {
                    a(*n)?;
                } else {
                    b(*n)?;
                }
                hist.record(t.elapsed().as_micros() as u64)
                    .ctx("histogram")?;
                *n += 1;
            }
            *secs += start.elapsed().as_secs_f64();
        }
    }
    let [(ha, na, sa), (hb, nb, sb)] = sides;
    Ok((
        Figure::from_hist(na, sa, &ha),
        Figure::from_hist(nb, sb, &hb),
    ))
}

/// Runs `op(i)` for `seconds` (at least `min_ops` times, at most
/// `max_ops`) and times each call: the wire clients' timed loop.
pub async fn measure_async<F, Fut>(
    seconds: f64,
    min_ops: u64,
    max_ops: u64,
    mut op: F,
) -> Result<Figure>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut hist = histogram();
    let deadline = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut i = 0u64;
    while i < max_ops && (i < min_ops || start.elapsed() < deadline) {
        let t = Instant::now();
        op(i).await?;
        hist.record(t.elapsed().as_micros() as u64)
            .ctx("histogram")?;
        i += 1;
    }
    Ok(Figure::from_hist(i, start.elapsed().as_secs_f64(), &hist))
}

/// Days since 1970-01-01 as `YYYY-MM-DD` (proleptic Gregorian).
pub fn date_string(days: i64) -> String {
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}")
}

/// `YYYY-MM-DD` as days since 1970-01-01.
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        assert_eq!(date_string(0), "1970-01-01");
        assert_eq!(days_from_civil(1992, 1, 1), 8035);
        for d in [-1000, 0, 8035, 10_000, 11_000] {
            let s = date_string(d);
            let p: Vec<i64> = s.split('-').map(|x| x.parse().unwrap()).collect();
            assert_eq!(days_from_civil(p[0], p[1], p[2]), d);
        }
    }
}
