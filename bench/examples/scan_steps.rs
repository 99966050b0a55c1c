//! A storage scan read entry by entry (`ScanIter::next_with`, one redb
//! step per entry) against the same scan read in runs (`ScanIter::run_with`,
//! up to a B-tree leaf's entries per call), in one process over one store:
//! the storage layer's share of what reading in runs saves, without the
//! noise of two servers or two data directories. N rows (default 100 000)
//! of a key shaped like a table row's (table marker, 8-byte id) and a
//! 70-byte value are committed at one timestamp; then ROUNDS (default 21)
//! rounds each time one full scan both ways, the order alternating, and
//! the medians are printed in ns per entry with their ratio.
//!
//! ```text
//! cargo build --release -p spindle-cli -p spindle-bench --bins --example bulk --example range --example scan_steps
//! $CARGO_TARGET_DIR/release/examples/scan_steps [N] [ROUNDS]
//! ```

use std::error::Error;
use std::hint::black_box;
use std::time::Instant;

use spindle_storage::Store;

fn main() -> Result<(), Box<dyn Error>> {
    let n: u64 = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 100_000,
    };
    let rounds: usize = match std::env::args().nth(2) {
        Some(s) => s.parse()?,
        None => 21,
    };
    let store = Store::open_temporary()?;
    let key = |i: u64| {
        let mut k = vec![0x20, 0x01, 0x10];
        k.extend_from_slice(&i.to_be_bytes());
        k
    };
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        let writes: Vec<_> = chunk
            .iter()
            .map(|&i| (key(i), Some(vec![b'v'; 70])))
            .collect();
        store.commit(1, &writes)?;
    }
    let start = [0x20u8];
    let by_steps = || -> Result<(u64, u64), Box<dyn Error>> {
        let mut it = store.scan(&start, None, 1);
        let (mut entries, mut bytes) = (0u64, 0u64);
        while let Some(r) = it.next_with(|k, v| (k.len() + v.len()) as u64) {
            entries += 1;
            bytes += r?;
        }
        Ok((entries, bytes))
    };
    let by_runs = || -> Result<(u64, u64), Box<dyn Error>> {
        let mut it = store.scan(&start, None, 1);
        let (mut entries, mut bytes) = (0u64, 0u64);
        while it.run_with(|k, v| {
            entries += 1;
            bytes += (k.len() + v.len()) as u64;
            true
        })? {}
        Ok((entries, bytes))
    };
    // Warm the cache, and check both read the same entries.
    let (a, b) = (by_steps()?, by_runs()?);
    if a != b || a.0 != n {
        return Err(format!("steps read {a:?}, runs {b:?}, {n} written").into());
    }
    let (mut steps, mut runs) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for which in [round % 2, 1 - round % 2] {
            let t = Instant::now();
            black_box(if which == 0 { by_steps()? } else { by_runs()? });
            let ns = t.elapsed().as_nanos() as f64 / n as f64;
            if which == 0 {
                steps.push(ns)
            } else {
                runs.push(ns)
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (s, r) = (median(&mut steps), median(&mut runs));
    println!(
        "{n} entries, {rounds} rounds: entry by entry {s:.1} ns/entry, in runs {r:.1} ns/entry, ratio {:.2}",
        s / r
    );
    Ok(())
}
