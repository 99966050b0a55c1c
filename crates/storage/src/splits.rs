//! Splits: the key space cut into contiguous ranges at row-tree boundaries.
//!
//! ```text
//!   split 1            split 2                    split 3
//!   [ "" ──────────────[ 20 T1 [k=40] ───────────[ 20 T2 ────────────── ∞ )
//!     catalog, T1 rows    T1 rows k ≥ 40 with        rows of table T2
//!     k < 40, their       their interleaved
//!     children            children
//! ```
//!
//! A split is the unit of load accounting and of commit: a transaction
//! whose writes fall in one split commits with one atomic batch; one that
//! touches several commits with two-phase commit (`spindle-txn`).
//!
//! ## Invariant
//!
//! Every split boundary is a *row-tree boundary*: the start of a root
//! table's key range or the exact key of a root row. Since a root row's
//! descendants all have its key as a prefix (`spindle_keys::key`), no row
//! tree ever spans two splits. The map does not know the schema; the
//! caller supplies [`Boundaries`], which maps any key to the key of the
//! row tree containing it, and every cut goes through it.
//!
//! Split starts are persisted under one metadata key, so the layout
//! survives restart; statistics are kept in memory, and the transaction
//! layer recounts every split in the background when a database opens.

use std::time::{Duration, Instant};

/// Maps a key to the row-tree boundary at or before it: the key of its
/// root row, or the key itself when it is not inside any row tree.
pub trait Boundaries {
    /// The root-row key of the row tree containing `key`.
    fn root_of(&self, key: &[u8]) -> Vec<u8>;
}

/// Load counters over a sliding minute (two 30-second buckets).
#[derive(Clone, Debug)]
pub struct Rate {
    bucket_start: Instant,
    current: u64,
    previous: u64,
}

impl Default for Rate {
    fn default() -> Self {
        Rate {
            bucket_start: Instant::now(),
            current: 0,
            previous: 0,
        }
    }
}

const BUCKET: Duration = Duration::from_secs(30);

impl Rate {
    fn roll(&mut self) {
        let elapsed = self.bucket_start.elapsed();
        if elapsed >= BUCKET * 2 {
            self.previous = 0;
            self.current = 0;
            self.bucket_start = Instant::now();
        } else if elapsed >= BUCKET {
            self.previous = self.current;
            self.current = 0;
            self.bucket_start += BUCKET;
        }
    }

    pub fn add(&mut self, n: u64) {
        self.roll();
        self.current += n;
    }

    /// Events over roughly the last minute.
    pub fn per_minute(&mut self) -> u64 {
        self.roll();
        self.current + self.previous
    }

    /// Keeps half of the counts and returns the other half (a cut split's
    /// events are shared out between its halves; where in the split they
    /// fell is not known).
    fn halve(&mut self) -> Rate {
        self.roll();
        let other = Rate {
            bucket_start: self.bucket_start,
            current: self.current / 2,
            previous: self.previous / 2,
        };
        self.current -= other.current;
        self.previous -= other.previous;
        other
    }
}

/// The key ranges written by a sample of a loaded split's commits (a
/// reservoir of [`LOAD_SAMPLE`] commits: each commit seen so far had the
/// same chance to be kept), from which a cut for load is chosen: where
/// the sampled commits fall about evenly on both sides and few cross it.
/// A commit that wrote on both sides of a cut would pay two-phase commit
/// for it; when most of them would (pgbench's TPC-B writes a branch, a
/// teller, an account and the history's tail in every transaction),
/// there is no cut for load at all (CockroachDB's load-based splitter
/// weighs the same two things).
#[derive(Clone, Debug, Default)]
pub struct LoadSample {
    seen: u64,
    ranges: Vec<(Vec<u8>, Vec<u8>)>,
    /// xorshift state for the reservoir's choices (seeded on first use).
    random: u64,
}

/// Commits a [`LoadSample`] keeps.
pub const LOAD_SAMPLE: usize = 64;
/// Sampled commits needed before a cut for load is chosen.
pub const LOAD_SAMPLE_MIN: usize = 16;

impl LoadSample {
    /// Notes a commit that wrote keys `first..=last` in the split.
    pub fn add(&mut self, first: &[u8], last: &[u8]) {
        self.seen += 1;
        if self.ranges.len() < LOAD_SAMPLE {
            self.ranges.push((first.to_vec(), last.to_vec()));
            return;
        }
        let slot = self.next_random() % self.seen;
        if let Some(r) = self.ranges.get_mut(slot as usize) {
            r.0.clear();
            r.0.extend_from_slice(first);
            r.1.clear();
            r.1.extend_from_slice(last);
        }
    }

    pub fn clear(&mut self) {
        self.seen = 0;
        self.ranges.clear();
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    fn next_random(&mut self) -> u64 {
        if self.random == 0 {
            self.random = 0x9E37_79B9_7F4A_7C15;
        }
        let mut x = self.random;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random = x;
        x
    }

    /// The row-tree boundary strictly inside `[start, end)` to cut at for
    /// load: among the sampled commits' first keys (as row-tree roots),
    /// the one that leaves the two sides' commit counts closest, each side
    /// with at least a quarter of the sampled commits and at most a fifth
    /// of them crossing it. `None` when no key qualifies or too few
    /// commits were sampled.
    pub fn cut_key(&self, start: &[u8], end: Option<&[u8]>, b: &dyn Boundaries) -> Option<Vec<u8>> {
        let n = self.ranges.len();
        if n < LOAD_SAMPLE_MIN {
            return None;
        }
        let mut candidates: Vec<Vec<u8>> = self
            .ranges
            .iter()
            .map(|(first, _)| b.root_of(first))
            .filter(|c| c.as_slice() > start && end.is_none_or(|e| c.as_slice() < e))
            .collect();
        candidates.sort();
        candidates.dedup();
        let mut best: Option<(usize, Vec<u8>)> = None;
        for c in candidates {
            let (mut left, mut right, mut crossing) = (0, 0, 0);
            for (first, last) in &self.ranges {
                if last.as_slice() < c.as_slice() {
                    left += 1;
                } else if first.as_slice() >= c.as_slice() {
                    right += 1;
                } else {
                    crossing += 1;
                }
            }
            if crossing * 5 > n || left * 4 < n || right * 4 < n {
                continue;
            }
            let imbalance = left.abs_diff(right);
            if best.as_ref().is_none_or(|(i, _)| imbalance < *i) {
                best = Some((imbalance, c));
            }
        }
        best.map(|(_, c)| c)
    }
}

/// One split and its statistics.
#[derive(Clone, Debug)]
pub struct Split {
    pub id: u64,
    /// Inclusive start key; the split ends where the next one starts.
    pub start: Vec<u8>,
    /// Approximate live bytes (keys + values) and rows.
    pub bytes: u64,
    pub rows: u64,
    pub reads: Rate,
    pub writes: Rate,
    /// A single row tree larger than the split threshold (cannot be cut).
    pub oversized: bool,
    /// Deletes since `bytes` was last recounted (deletes do not know the
    /// size they freed).
    pub dirty_deletes: u64,
    /// When `bytes` was last recounted by a scan, and what it was then:
    /// recounts for load, and of an oversized split, are spaced out by
    /// these (a recount scans the whole split).
    pub recounted: Option<(Instant, u64)>,
    /// Since when the write rate has been at or above the load-split rate
    /// at every check (`None`: it is below): load is *sustained* once this
    /// is old enough, so a bulk load's burst does not cut a split.
    pub loaded_since: Option<Instant>,
    /// When this split was last cut for load (either half of the cut):
    /// such halves are not merged back while the load may still be there
    /// (`spindle-txn`'s maintenance; a merge followed by another load cut
    /// would rescan the split again and again).
    pub load_cut_at: Option<Instant>,
    /// Commits sampled while the split carries load (see [`LoadSample`]);
    /// emptied when the load ends and at a cut.
    pub load_sample: LoadSample,
    /// When a cut for load was last looked for (a look weighs the whole
    /// sample: spaced out like load recounts).
    pub load_checked: Option<Instant>,
}

impl Split {
    fn new(id: u64, start: Vec<u8>) -> Split {
        Split {
            id,
            start,
            bytes: 0,
            rows: 0,
            reads: Rate::default(),
            writes: Rate::default(),
            oversized: false,
            dirty_deletes: 0,
            recounted: None,
            loaded_since: None,
            load_cut_at: None,
            load_sample: LoadSample::default(),
            load_checked: None,
        }
    }
}

/// The ordered list of splits covering the whole key space.
#[derive(Clone, Debug)]
pub struct SplitMap {
    splits: Vec<Split>,
    next_id: u64,
}

impl Default for SplitMap {
    fn default() -> Self {
        SplitMap {
            splits: vec![Split::new(1, Vec::new())],
            next_id: 2,
        }
    }
}

impl SplitMap {
    pub fn splits(&self) -> &[Split] {
        &self.splits
    }

    pub fn splits_mut(&mut self) -> &mut [Split] {
        &mut self.splits
    }

    pub fn len(&self) -> usize {
        self.splits.len()
    }

    pub fn is_empty(&self) -> bool {
        self.splits.is_empty()
    }

    /// Index of the split containing `key`.
    pub fn index_of(&self, key: &[u8]) -> usize {
        // The first split starts at the empty key, so the result is >= 1.
        self.splits
            .partition_point(|s| s.start.as_slice() <= key)
            .saturating_sub(1)
    }

    pub fn get(&self, idx: usize) -> Option<&Split> {
        self.splits.get(idx)
    }

    /// Whether split `idx` holds `key` (what `index_of(key) == idx` says,
    /// without the search: a run of keys in order stays in one split while
    /// this holds).
    pub fn contains(&self, idx: usize, key: &[u8]) -> bool {
        self.splits
            .get(idx)
            .is_some_and(|s| s.start.as_slice() <= key)
            && self.end_of(idx).is_none_or(|e| key < e)
    }

    /// End key (exclusive) of split `idx`; `None` for the last.
    pub fn end_of(&self, idx: usize) -> Option<&[u8]> {
        self.splits.get(idx + 1).map(|s| s.start.as_slice())
    }

    /// Cuts split `idx` at `at`, which the [`Boundaries`] must confirm is a
    /// row-tree boundary strictly inside the split. Returns the new split's
    /// id, or `None` if `at` is not a valid cut. The halves share the
    /// split's read and write rates, and neither counts as loaded until
    /// its own rate says so again at a commit: a load cut needs load
    /// sustained on the half itself before the half is cut again.
    pub fn split_at(&mut self, idx: usize, at: Vec<u8>, b: &dyn Boundaries) -> Option<u64> {
        let s = self.splits.get(idx)?;
        if b.root_of(&at) != at || at <= s.start {
            return None;
        }
        if self
            .splits
            .get(idx + 1)
            .is_some_and(|next| at.as_slice() >= next.start.as_slice())
        {
            return None;
        }
        let s = &mut self.splits[idx];
        let mut new = Split::new(self.next_id, at);
        new.reads = s.reads.halve();
        new.writes = s.writes.halve();
        s.loaded_since = None;
        s.load_sample.clear();
        let id = new.id;
        self.next_id += 1;
        self.splits.insert(idx + 1, new);
        Some(id)
    }

    /// Merges split `idx + 1` into split `idx`.
    pub fn merge_with_next(&mut self, idx: usize) -> bool {
        if idx + 1 >= self.splits.len() {
            return false;
        }
        let next = self.splits.remove(idx + 1);
        let s = &mut self.splits[idx];
        s.bytes += next.bytes;
        s.rows += next.rows;
        s.oversized = false;
        true
    }

    /// Persisted form: `[next_id u64][count u32]` then per split
    /// `[id u64][len u32][start bytes]`, all big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.next_id.to_be_bytes());
        out.extend_from_slice(&(self.splits.len() as u32).to_be_bytes());
        for s in &self.splits {
            out.extend_from_slice(&s.id.to_be_bytes());
            out.extend_from_slice(&(s.start.len() as u32).to_be_bytes());
            out.extend_from_slice(&s.start);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<SplitMap> {
        let mut pos = 0;
        let mut take = |n: usize| -> Option<&[u8]> {
            let s = bytes.get(pos..pos + n)?;
            pos += n;
            Some(s)
        };
        let next_id = u64::from_be_bytes(take(8)?.try_into().ok()?);
        let count = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
        let mut splits = Vec::with_capacity(count.min(1 << 16));
        for _ in 0..count {
            let id = u64::from_be_bytes(take(8)?.try_into().ok()?);
            let len = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
            splits.push(Split::new(id, take(len)?.to_vec()));
        }
        if splits.first().map(|s| s.start.is_empty()) != Some(true) {
            return None;
        }
        Some(SplitMap { splits, next_id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// Test keys: a root row is `[r]`, its descendants `[r, c, ...]`.
    struct OneByteRoots;
    impl Boundaries for OneByteRoots {
        fn root_of(&self, key: &[u8]) -> Vec<u8> {
            key.iter().take(1).copied().collect()
        }
    }

    #[test]
    fn a_cut_shares_the_rates_and_ends_the_load() {
        let mut map = SplitMap::default();
        let s = &mut map.splits_mut()[0];
        s.writes.add(1001);
        s.reads.add(10);
        s.loaded_since = Some(Instant::now());
        map.split_at(0, vec![7], &OneByteRoots).unwrap();
        let [left, right] = map.splits_mut() else {
            panic!("two splits")
        };
        assert_eq!(
            (left.writes.per_minute(), right.writes.per_minute()),
            (501, 500)
        );
        assert_eq!((left.reads.per_minute(), right.reads.per_minute()), (5, 5));
        assert!(left.loaded_since.is_none() && right.loaded_since.is_none());
    }

    #[test]
    fn a_load_cut_falls_where_the_commits_divide_and_few_cross() {
        let mut sample = LoadSample::default();
        // Commits of one row each, spread over root rows 10..=49.
        for r in 10..50u8 {
            sample.add(&[r, 1], &[r, 2]);
        }
        let at = sample.cut_key(&[], None, &OneByteRoots).unwrap();
        assert!((28..=32).contains(&at[0]), "{at:?}");
        // Within bounds only.
        assert!(sample.cut_key(&[40], None, &OneByteRoots).is_none());
        // Too few commits sampled.
        let mut few = LoadSample::default();
        for r in 10..20u8 {
            few.add(&[r], &[r]);
        }
        assert!(few.cut_key(&[], None, &OneByteRoots).is_none());
    }

    #[test]
    fn no_load_cut_when_most_commits_would_cross_it() {
        let mut sample = LoadSample::default();
        // Every commit writes a row near the start and one at the end
        // (TPC-B: branch, teller, account, history's tail).
        for i in 0..200u8 {
            sample.add(&[1 + i % 50], &[200, i]);
        }
        assert_eq!(sample.len(), LOAD_SAMPLE);
        assert!(sample.cut_key(&[], None, &OneByteRoots).is_none());
        // A few such commits among many local ones do not stop a cut.
        let mut mixed = LoadSample::default();
        for i in 0..60u8 {
            if i % 10 == 0 {
                mixed.add(&[1], &[200]);
            } else {
                mixed.add(&[10 + i], &[10 + i]);
            }
        }
        assert!(mixed.cut_key(&[], None, &OneByteRoots).is_some());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(Vec<u8>),
        Delete(usize),
        Split(usize, usize),
        Merge(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => proptest::collection::vec(any::<u8>(), 1..4).prop_map(Op::Insert),
            1 => any::<usize>().prop_map(Op::Delete),
            2 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Op::Split(a, b)),
            1 => any::<usize>().prop_map(Op::Merge),
        ]
    }

    proptest! {
        /// Under random inserts, deletes, splits (at any proposed key,
        /// snapped to its row tree) and merges, no row tree spans two splits.
        #[test]
        fn no_row_tree_spans_two_splits(ops in proptest::collection::vec(op(), 1..80)) {
            let b = OneByteRoots;
            let mut map = SplitMap::default();
            let mut keys: BTreeSet<Vec<u8>> = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Insert(k) => { keys.insert(k); }
                    Op::Delete(i) => {
                        if let Some(k) = keys.iter().nth(i % keys.len().max(1)).cloned() { keys.remove(&k); }
                    }
                    Op::Split(i, j) => {
                        let idx = i % map.len();
                        // Propose a cut at some live key; snap it to its tree.
                        if let Some(k) = keys.iter().nth(j % keys.len().max(1)) {
                            let at = b.root_of(k);
                            map.split_at(idx, at, &b);
                        }
                        // A cut inside a row tree is always refused.
                        if let Some(k) = keys.iter().find(|k| k.len() > 1) {
                            let idx = map.index_of(k);
                            prop_assert!(map.split_at(idx, k.clone(), &b).is_none());
                        }
                    }
                    Op::Merge(i) => { map.merge_with_next(i % map.len()); }
                }
                for k in &keys {
                    prop_assert_eq!(map.index_of(k), map.index_of(&b.root_of(k)));
                    for i in 0..map.len() + 1 {
                        prop_assert_eq!(map.contains(i, k), map.index_of(k) == i);
                    }
                }
                for w in map.splits().windows(2) {
                    prop_assert!(w[0].start < w[1].start);
                    prop_assert_eq!(b.root_of(&w[1].start), w[1].start.clone());
                }
            }
            let back = SplitMap::decode(&map.encode()).unwrap();
            prop_assert_eq!(back.splits().iter().map(|s| (s.id, s.start.clone())).collect::<Vec<_>>(),
                            map.splits().iter().map(|s| (s.id, s.start.clone())).collect::<Vec<_>>());
        }
    }
}
