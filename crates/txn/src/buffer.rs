//! # A transaction's write buffer
//!
//! The writes a transaction has buffered, by key (`Some(value)`, or `None`
//! for a delete), in key order: a `BTreeMap` plus a sorted *tail* of keys
//! appended in ascending order.
//!
//! ```text
//!   map:  a ─ c ─ f ─ k            tail: [m, n, p, q, …]   (pushed in order)
//!         every key of the map  <  every key of the tail
//! ```
//!
//! A bulk load inserts its keys in ascending order; in a `BTreeMap` of
//! 100 000 entries each insert compares its key with ~35 others (a linear
//! search of each node on the way down), and those key comparisons were
//! the largest single cost of an embedded INSERT (`memcmp`, 10% of the
//! statements' samples in `perf`). A key above every buffered key is
//! pushed onto the tail instead: one comparison.
//!
//! Invariants:
//! * The tail is strictly ascending and every tail key is greater than
//!   every map key; each key is in at most one of the two.
//! * A write below the tail's first key goes to the map. A write of a new
//!   key inside the tail's range, or a remove from inside it, first moves
//!   the tail into the map (`flush_tail`): each entry moves at most once,
//!   so the cost stays that of inserting it into the map in the first
//!   place.
//! * Iteration (`keys`, `range`, `into_iter`) yields the map's entries,
//!   then the tail's: key order.

use std::collections::btree_map;
use std::collections::BTreeMap;
use std::ops::Bound;

type Value = Option<Vec<u8>>;

#[derive(Default, Debug)]
pub struct WriteBuffer {
    map: BTreeMap<Vec<u8>, Value>,
    tail: Vec<(Vec<u8>, Value)>,
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
    /// inside the tail's range but absent, `None` below the tail (or no
    /// tail).
    fn in_tail(&self, key: &[u8]) -> Option<Result<usize, ()>> {
        let first = self.tail.first()?;
        if key < first.0.as_slice() {
            return None;
        }
        Some(
            self.tail
                .binary_search_by(|(k, _)| k.as_slice().cmp(key))
                .map_err(|_| ()),
        )
    }

    /// Whether `key` is above every buffered key.
    fn is_above_all(&self, key: &[u8]) -> bool {
        match self.tail.last() {
            Some((last, _)) => key > last.as_slice(),
            None => self
                .map
                .last_key_value()
                .is_none_or(|(last, _)| key > last.as_slice()),
        }
    }

    /// Moves the tail into the map (see the module docs).
    fn flush_tail(&mut self) {
        let tail = std::mem::take(&mut self.tail);
        if tail.len() >= self.map.len() / 8 {
            // Large next to the map: one merge of the two sorted trees.
            let mut other: BTreeMap<Vec<u8>, Value> = tail.into_iter().collect();
            self.map.append(&mut other);
        } else {
            self.map.extend(tail);
        }
    }

    pub fn entry(&mut self, key: Vec<u8>) -> Entry<'_> {
        if self.is_above_all(&key) {
            return Entry::Vacant(Vacant::Append(&mut self.tail, key));
        }
        match self.in_tail(&key) {
            Some(Ok(i)) => return Entry::Occupied(Occupied::Tail(&mut self.tail[i])),
            Some(Err(())) => self.flush_tail(),
            None => {}
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
        match self.in_tail(key) {
            Some(Ok(i)) => Some(&self.tail[i].1),
            Some(Err(())) => None,
            None => self.map.get(key),
        }
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<Value> {
        match self.in_tail(key) {
            Some(Ok(i)) if i + 1 == self.tail.len() => self.tail.pop().map(|(_, v)| v),
            Some(Ok(_)) => {
                self.flush_tail();
                self.map.remove(key)
            }
            Some(Err(())) => None,
            None => self.map.remove(key),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.map.keys().chain(self.tail.iter().map(|(k, _)| k))
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
        self.map
            .range(range)
            .chain(tail.iter().map(|(k, v)| (k, v)))
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
        let mut all = Vec::with_capacity(self.map.len() + self.tail.len());
        all.extend(self.map);
        all.extend(self.tail);
        all
    }
}

impl IntoIterator for WriteBuffer {
    type Item = (Vec<u8>, Value);
    type IntoIter =
        std::iter::Chain<btree_map::IntoIter<Vec<u8>, Value>, std::vec::IntoIter<(Vec<u8>, Value)>>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.into_iter().chain(self.tail)
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
}
