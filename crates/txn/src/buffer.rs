//! # A transaction's write buffer
//!
//! The writes a transaction has buffered, by key (`Some(value)`, or `None`
//! for a delete), in key order: a `BTreeMap` plus a sorted *tail* of keys
//! appended in ascending order, which sits in a gap of the map.
//!
//! ```text
//!   map:  a ─ c ─ f ─────────────────────── x ─ z
//!   tail:          [m, n, p, q, …]   (pushed in order; fence = x)
//!         no map key between the tail's first key and the fence
//! ```
//!
//! A bulk load inserts its keys in ascending order; in a `BTreeMap` of
//! 100 000 entries each insert compares its key with ~35 others (a linear
//! search of each node on the way down), and those key comparisons were
//! the largest single cost of an embedded INSERT (`memcmp`, 10% of the
//! statements' samples in `perf`). A key after the tail's last and below
//! the *fence* — the smallest map key above the tail — is pushed onto the
//! tail instead: two comparisons.
//!
//! The tail starts above every buffered key, or — when a run of map
//! inserts ascends ([`RESTART_STREAK`] in a row) — where the run goes:
//! a load whose table sorts below rows already written in the same
//! transaction (pgbench's accounts, copied after its branches) gets the
//! tail too. The old tail, if any, moves into the map first.
//!
//! Invariants:
//! * The tail is strictly ascending; no map key lies between its first
//!   key and its last; `fence` is the smallest map key above its last (or
//!   `None`). Each key is in at most one of the two.
//! * A write below the tail's first key or at or above the fence goes to
//!   the map. A write of a new key inside the tail's range, or a remove
//!   from inside it, first moves the tail into the map (`flush_tail`):
//!   each entry moves at most once per tail it joined, and a tail is only
//!   replaced after a run of ascending map inserts, so the cost stays
//!   about that of inserting it into the map in the first place.
//! * Iteration (`keys`, `range`, `into_iter`) yields the map's entries
//!   below the tail, the tail's, then the map's from the fence: key order.

use std::collections::btree_map;
use std::collections::BTreeMap;
use std::ops::Bound;

type Value = Option<Vec<u8>>;

/// Ascending map inserts in a row after which the tail restarts there.
const RESTART_STREAK: usize = 8;

#[derive(Default, Debug)]
pub struct WriteBuffer {
    map: BTreeMap<Vec<u8>, Value>,
    tail: Vec<(Vec<u8>, Value)>,
    /// The smallest map key above the tail (see the module docs).
    fence: Option<Vec<u8>>,
    /// The key of the last insert that went to the map, and how many
    /// such inserts in a row ascended.
    last_map_key: Vec<u8>,
    streak: usize,
}

/// A key's place in a [`WriteBuffer`], as `BTreeMap::entry` gives it.
pub enum Entry<'a> {
    Occupied(Occupied<'a>),
    Vacant(Vacant<'a>),
}

pub enum Occupied<'a> {
    Map(btree_map::OccupiedEntry<'a, Vec<u8>, Value>),
    Tail(&'a mut (Vec<u8>, Value)),
}

pub enum Vacant<'a> {
    Map(btree_map::VacantEntry<'a, Vec<u8>, Value>),
    /// Above every buffered key: pushed onto the tail.
    Append(&'a mut Vec<(Vec<u8>, Value)>, Vec<u8>),
}

impl Occupied<'_> {
    pub fn key(&self) -> &Vec<u8> {
        match self {
            Occupied::Map(e) => e.key(),
            Occupied::Tail(kv) => &kv.0,
        }
    }

    pub fn get(&self) -> &Value {
        match self {
            Occupied::Map(e) => e.get(),
            Occupied::Tail(kv) => &kv.1,
        }
    }

    pub fn insert(&mut self, value: Value) {
        match self {
            Occupied::Map(e) => {
                e.insert(value);
            }
            Occupied::Tail(kv) => kv.1 = value,
        }
    }
}

impl Vacant<'_> {
    pub fn key(&self) -> &Vec<u8> {
        match self {
            Vacant::Map(e) => e.key(),
            Vacant::Append(_, k) => k,
        }
    }

    pub fn into_key(self) -> Vec<u8> {
        match self {
            Vacant::Map(e) => e.into_key(),
            Vacant::Append(_, k) => k,
        }
    }

    pub fn insert(self, value: Value) {
        match self {
            Vacant::Map(e) => {
                e.insert(value);
            }
            Vacant::Append(tail, k) => tail.push((k, value)),
        }
    }
}

impl WriteBuffer {
    pub fn len(&self) -> usize {
        self.map.len() + self.tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty() && self.tail.is_empty()
    }

    /// Where `key` is in the tail: `Some(Ok(i))` at `i`, `Some(Err(()))`
    /// inside the tail's range but absent, `None` below or above the tail
    /// (or no tail).
    fn in_tail(&self, key: &[u8]) -> Option<Result<usize, ()>> {
        let (first, last) = (self.tail.first()?, self.tail.last()?);
        if key < first.0.as_slice() || key > last.0.as_slice() {
            return None;
        }
        Some(
            self.tail
                .binary_search_by(|(k, _)| k.as_slice().cmp(key))
                .map_err(|_| ()),
        )
    }

    /// Whether `key` may be pushed onto the tail: after its last key and
    /// below the fence (with no tail: above every map key).
    fn is_appendable(&self, key: &[u8]) -> bool {
        match self.tail.last() {
            Some((last, _)) => {
                key > last.as_slice() && self.fence.as_deref().is_none_or(|f| key < f)
            }
            None => self
                .map
                .last_key_value()
                .is_none_or(|(last, _)| key > last.as_slice()),
        }
    }

    /// Moves the tail into the map (see the module docs).
    fn flush_tail(&mut self) {
        let tail = std::mem::take(&mut self.tail);
        self.fence = None;
        if tail.len() >= self.map.len() / 8 {
            // Large next to the map: one merge of the two sorted trees.
            let mut other: BTreeMap<Vec<u8>, Value> = tail.into_iter().collect();
            self.map.append(&mut other);
        } else {
            self.map.extend(tail);
        }
    }

    /// Notes an insert of `key` into the map; returns whether the map
    /// inserts ascend in a run long enough to restart the tail there.
    fn note_map_insert(&mut self, key: &[u8]) -> bool {
        if !self.last_map_key.is_empty() && key > self.last_map_key.as_slice() {
            self.streak += 1;
        } else {
            self.streak = 0;
        }
        self.last_map_key.clear();
        self.last_map_key.extend_from_slice(key);
        self.streak >= RESTART_STREAK
    }

    pub fn entry(&mut self, key: Vec<u8>) -> Entry<'_> {
        if self.is_appendable(&key) {
            return Entry::Vacant(Vacant::Append(&mut self.tail, key));
        }
        match self.in_tail(&key) {
            Some(Ok(i)) => return Entry::Occupied(Occupied::Tail(&mut self.tail[i])),
            Some(Err(())) => self.flush_tail(),
            None => {}
        }
        if self.note_map_insert(&key) && !self.map.contains_key(&key) {
            // The tail restarts at `key`: everything buffered stays below
            // it or at or above the new fence.
            self.flush_tail();
            self.streak = 0;
            self.fence = self
                .map
                .range::<[u8], _>((Bound::Excluded(key.as_slice()), Bound::Unbounded))
                .next()
                .map(|(k, _)| k.clone());
            return Entry::Vacant(Vacant::Append(&mut self.tail, key));
        }
        match self.map.entry(key) {
            btree_map::Entry::Occupied(e) => Entry::Occupied(Occupied::Map(e)),
            btree_map::Entry::Vacant(e) => Entry::Vacant(Vacant::Map(e)),
        }
    }

    pub fn insert(&mut self, key: Vec<u8>, value: Value) {
        match self.entry(key) {
            Entry::Occupied(mut e) => e.insert(value),
            Entry::Vacant(e) => e.insert(value),
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<&Value> {
        // Between the tail's first key and the fence only the tail can
        // hold it; after the tail's last key (a load checking the key it
        // is about to append) it is absent without a search.
        if let (Some((first, _)), Some((last, _))) = (self.tail.first(), self.tail.last()) {
            if key >= first.as_slice() && self.fence.as_deref().is_none_or(|f| key < f) {
                if key > last.as_slice() {
                    return None;
                }
                return self
                    .tail
                    .binary_search_by(|(k, _)| k.as_slice().cmp(key))
                    .ok()
                    .map(|i| &self.tail[i].1);
            }
        }
        self.map.get(key)
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<Value> {
        match self.in_tail(key) {
            Some(Ok(i)) if i + 1 == self.tail.len() => {
                let v = self.tail.pop().map(|(_, v)| v);
                if self.tail.is_empty() {
                    self.fence = None;
                }
                v
            }
            Some(Ok(_)) => {
                self.flush_tail();
                self.map.remove(key)
            }
            Some(Err(())) => None,
            None => {
                let v = self.map.remove(key);
                if v.is_some() && self.fence.as_deref() == Some(key) {
                    let next = self.map_above_tail().next().map(|(k, _)| k.clone());
                    self.fence = next;
                }
                v
            }
        }
    }

    /// The map's entries below the tail (all of them when there is none).
    fn map_below_tail(&self) -> btree_map::Range<'_, Vec<u8>, Value> {
        match self.tail.first() {
            Some((first, _)) => self
                .map
                .range::<[u8], _>((Bound::Unbounded, Bound::Excluded(first.as_slice()))),
            None => self.map.range::<[u8], _>(..),
        }
    }

    /// The map's entries above the tail (none when there is no tail).
    fn map_above_tail(&self) -> impl Iterator<Item = (&Vec<u8>, &Value)> {
        self.tail
            .last()
            .map(|(last, _)| {
                self.map
                    .range::<[u8], _>((Bound::Excluded(last.as_slice()), Bound::Unbounded))
            })
            .into_iter()
            .flatten()
    }

    pub fn keys(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.map_below_tail()
            .map(|(k, _)| k)
            .chain(self.tail.iter().map(|(k, _)| k))
            .chain(self.map_above_tail().map(|(k, _)| k))
    }

    /// The entries in `range`, in key order (a range `BTreeMap::range`
    /// would refuse — start above end — panics here too).
    pub fn range(
        &self,
        range: (Bound<Vec<u8>>, Bound<Vec<u8>>),
    ) -> impl Iterator<Item = (&Vec<u8>, &Value)> {
        let from = match &range.0 {
            Bound::Included(s) => self.tail.partition_point(|(k, _)| k < s),
            Bound::Excluded(s) => self.tail.partition_point(|(k, _)| k <= s),
            Bound::Unbounded => 0,
        };
        let to = match &range.1 {
            Bound::Included(e) => self.tail.partition_point(|(k, _)| k <= e),
            Bound::Excluded(e) => self.tail.partition_point(|(k, _)| k < e),
            Bound::Unbounded => self.tail.len(),
        };
        let tail = self.tail.get(from..to.max(from)).unwrap_or_default();
        // The map's part of the range below the tail, then above it (from
        // whichever starts later: the range or the tail's end), each read
        // once.
        let below = self.map.range(range.clone()).take_while(|(k, _)| {
            self.tail
                .first()
                .is_none_or(|(first, _)| k.as_slice() < first.as_slice())
        });
        let above = self.tail.last().and_then(|(last, _)| {
            let lower = match range.0 {
                Bound::Included(s) if s > *last => Bound::Included(s),
                Bound::Excluded(s) if s >= *last => Bound::Excluded(s),
                _ => Bound::Excluded(last.clone()),
            };
            let nonempty = match (&lower, &range.1) {
                (_, Bound::Unbounded) | (Bound::Unbounded, _) => true,
                (Bound::Included(l), Bound::Included(u)) => l <= u,
                (Bound::Included(l) | Bound::Excluded(l), Bound::Excluded(u))
                | (Bound::Excluded(l), Bound::Included(u)) => l < u,
            };
            nonempty.then(|| self.map.range((lower, range.1)))
        });
        below
            .chain(tail.iter().map(|(k, v)| (k, v)))
            .chain(above.into_iter().flatten())
    }
}

impl WriteBuffer {
    /// Every write in key order, as one vector: a bulk load's writes are
    /// all in the tail, which is returned as it is (a commit of a million
    /// rows would otherwise copy them into a new 48 MB vector, whose fresh
    /// pages the kernel must fault in first).
    pub fn into_vec(self) -> Vec<(Vec<u8>, Value)> {
        if self.map.is_empty() {
            return self.tail;
        }
        let (mut map, tail) = (self.map, self.tail);
        let above = match tail.first() {
            Some((first, _)) => map.split_off(first),
            None => BTreeMap::new(),
        };
        let mut all = Vec::with_capacity(map.len() + tail.len() + above.len());
        all.extend(map);
        all.extend(tail);
        all.extend(above);
        all
    }
}

impl IntoIterator for WriteBuffer {
    type Item = (Vec<u8>, Value);
    type IntoIter = std::vec::IntoIter<(Vec<u8>, Value)>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// Insert through `entry` (the INSERT path): only if absent.
        InsertAbsent(u16),
        Insert(u16, Option<u8>),
        Remove(u16),
        /// An ascending run from the key.
        Run(u16, u8),
    }

    fn key(k: u16) -> Vec<u8> {
        format!("k{k:05}").into_bytes()
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u16..600).prop_map(Op::InsertAbsent),
            (0u16..600, proptest::option::of(any::<u8>())).prop_map(|(k, v)| Op::Insert(k, v)),
            (0u16..600).prop_map(Op::Remove),
            (0u16..600, 1u8..40).prop_map(|(k, n)| Op::Run(k, n)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Every operation, point read and range agrees with a `BTreeMap`.
        #[test]
        fn matches_a_btree_map(ops in proptest::collection::vec(op(), 1..200), lo in 0u16..650, hi in 0u16..650) {
            let mut buf = WriteBuffer::default();
            let mut model: BTreeMap<Vec<u8>, Value> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::InsertAbsent(k) => {
                        let absent = !model.contains_key(&key(k));
                        match buf.entry(key(k)) {
                            Entry::Occupied(e) => {
                                prop_assert!(!absent);
                                prop_assert_eq!(e.key(), &key(k));
                                prop_assert_eq!(e.get(), &model[&key(k)]);
                            }
                            Entry::Vacant(e) => {
                                prop_assert!(absent);
                                prop_assert_eq!(e.key(), &key(k));
                                e.insert(Some(vec![1]));
                                model.insert(key(k), Some(vec![1]));
                            }
                        }
                    }
                    Op::Insert(k, v) => {
                        buf.insert(key(k), v.map(|b| vec![b]));
                        model.insert(key(k), v.map(|b| vec![b]));
                    }
                    Op::Remove(k) => {
                        prop_assert_eq!(buf.remove(&key(k)), model.remove(&key(k)));
                    }
                    Op::Run(k, n) => {
                        for i in 0..u16::from(n) {
                            buf.insert(key(k + i), Some(vec![2]));
                            model.insert(key(k + i), Some(vec![2]));
                        }
                    }
                }
                prop_assert_eq!(buf.len(), model.len());
            }
            for k in 0..650 {
                prop_assert_eq!(buf.get(&key(k)), model.get(&key(k)));
            }
            let keys: Vec<&Vec<u8>> = buf.keys().collect();
            let want: Vec<&Vec<u8>> = model.keys().collect();
            prop_assert_eq!(keys, want);
            let (lo, hi) = (lo.min(hi), lo.max(hi));
            for range in [
                (Bound::Included(key(lo)), Bound::Excluded(key(hi))),
                (Bound::Included(key(lo)), Bound::Unbounded),
                (Bound::Excluded(key(lo)), Bound::Included(key(hi))),
                (Bound::Unbounded, Bound::Excluded(key(hi))),
            ] {
                if matches!(range, (Bound::Excluded(_), Bound::Included(_))) && lo == hi {
                    continue; // BTreeMap::range panics on it
                }
                let got: Vec<_> = buf.range(range.clone()).collect();
                let want: Vec<_> = model.range(range).collect();
                prop_assert_eq!(got, want);
            }
            let all = buf.into_vec();
            prop_assert_eq!(all, model.into_iter().collect::<Vec<_>>());
        }
    }

    /// Keys pushed in ascending order stay in the tail (one comparison
    /// each), and a write inside the tail's range moves it into the map.
    #[test]
    fn ascending_keys_go_to_the_tail() {
        let mut buf = WriteBuffer::default();
        for k in 10..1000 {
            buf.insert(key(k), Some(vec![]));
        }
        assert_eq!((buf.map.len(), buf.tail.len()), (0, 990));
        buf.insert(key(7), None); // below the tail: the map
        assert_eq!((buf.map.len(), buf.tail.len()), (1, 990));
        buf.insert(key(500), None); // present in the tail: replaced there
        assert_eq!(buf.tail[490], (key(500), None));
        assert_eq!(buf.remove(&key(999)), Some(Some(vec![]))); // the tail's last: popped
        assert_eq!((buf.map.len(), buf.tail.len()), (1, 989));
        buf.insert(key(6), Some(vec![])); // below the tail
        assert_eq!(buf.remove(&key(300)), Some(Some(vec![]))); // inside: the map takes the tail
        assert_eq!((buf.map.len(), buf.tail.len()), (990, 0));
        assert_eq!(buf.len(), 990);
    }

    /// pgbench's load: a few rows of a table that sorts high, then a long
    /// ascending run below them. After a short streak of map inserts the
    /// run gets the tail, fenced by the rows above it.
    #[test]
    fn a_run_below_the_tail_gets_a_tail_of_its_own() {
        let mut buf = WriteBuffer::default();
        for k in 900..910 {
            buf.insert(key(k), Some(vec![]));
        }
        for k in 100..400 {
            buf.insert(key(k), Some(vec![1]));
        }
        // The first map insert starts the streak; the ninth restarts the tail.
        let streak = RESTART_STREAK;
        assert_eq!(buf.tail.len(), 300 - streak);
        assert_eq!(buf.map.len(), 10 + streak);
        assert_eq!(buf.fence, Some(key(900)));
        // Above the fence: the map; the run's keys read back from the tail.
        buf.insert(key(950), None);
        assert_eq!(buf.tail.len(), 300 - streak);
        assert_eq!(buf.get(&key(250)), Some(&Some(vec![1])));
        assert_eq!(buf.get(&key(905)), Some(&Some(vec![])));
        let keys: Vec<Vec<u8>> = buf.keys().cloned().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        assert_eq!(keys.len(), 311);
        // Removing the fence moves it to the next map key above the tail.
        assert_eq!(buf.remove(&key(900)), Some(Some(vec![])));
        assert_eq!(buf.fence, Some(key(901)));
        let all = buf.into_vec();
        assert_eq!(all.len(), 310);
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
