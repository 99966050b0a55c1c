use crate::tree_store::btree_cursor::{Cursor, Position};
use crate::tree_store::btree_iters::{EntryGuard, bounds_are_empty, encode_bounds};
use crate::tree_store::page_store::PageHint;
use crate::tree_store::{PageNumber, PageResolver};
use crate::types::{Key, Value};
use crate::{Result, StorageError};
use Bound::{Excluded, Included, Unbounded};
use alloc::vec::Vec;
use core::borrow::Borrow;
use core::cmp::Ordering;
use core::ops::Bound;
use core::ops::RangeBounds;

#[derive(Clone)]
enum Slot<C> {
    Uninitialized,
    Active(C),
    Exhausted,
}

impl<C> Slot<C> {
    fn active(&self) -> Option<&C> {
        match self {
            Slot::Active(cursor) => Some(cursor),
            Slot::Uninitialized | Slot::Exhausted => None,
        }
    }

    fn active_mut(&mut self) -> Option<&mut C> {
        match self {
            Slot::Active(cursor) => Some(cursor),
            Slot::Uninitialized | Slot::Exhausted => None,
        }
    }

    fn is_uninitialized(&self) -> bool {
        matches!(self, Slot::Uninitialized)
    }
}

// Whether the front's entry `key`, on leaf `page` whose last key
// `last_key` returns, is within the range's upper bound (a patch of
// Spindle's vendored copy). Keys ascend within a leaf: once a leaf's last
// key is found within the bound, the leaf is remembered in
// `front_leaf_within` and no key on it is tested again.
fn front_within<'m, K: Key>(
    upper: Bound<&[u8]>,
    front_leaf_within: &mut Option<PageNumber>,
    key: &'m [u8],
    page: PageNumber,
    last_key: &dyn Fn() -> Option<&'m [u8]>,
) -> bool {
    let below_upper = |key: &[u8]| match upper {
        Included(bound) => K::compare(key, bound).is_le(),
        Excluded(bound) => K::compare(key, bound).is_lt(),
        Unbounded => true,
    };
    if *front_leaf_within == Some(page) {
        return true;
    }
    if !below_upper(key) {
        return false;
    }
    if last_key().is_some_and(below_upper) {
        *front_leaf_within = Some(page);
    }
    true
}

#[derive(Copy, Clone)]
enum Side {
    Front,
    Back,
}

#[derive(Clone)]
pub(crate) struct BtreeCursorRange<K: Key + 'static, V: Value + 'static> {
    root: Option<PageNumber>,
    lower_bound: Bound<Vec<u8>>,
    upper_bound: Bound<Vec<u8>>,
    manager: PageResolver,
    hint: PageHint,
    front: Slot<Cursor<K, V>>,
    back: Slot<Cursor<K, V>>,
    // A leaf whose last key is within the upper bound (a patch of Spindle's
    // vendored copy): every entry the front steps to on it is, too, so
    // `next_front_with` tests no key there. Pages do not change while a
    // range lives (it borrows its table or a read snapshot), and the upper
    // bound never changes (`seek_front` moves the lower one only).
    front_leaf_within: Option<PageNumber>,
    // The ends run on independent cursors and share the termination logic, so the first error
    // latches the whole range. See Cursor::errored.
    errored: bool,
}

impl<K: Key + 'static, V: Value + 'static> BtreeCursorRange<K, V> {
    pub(crate) fn new<'a, T: RangeBounds<KR>, KR: Borrow<K::SelfType<'a>>>(
        query_range: &'_ T,
        table_root: Option<PageNumber>,
        manager: PageResolver,
        hint: PageHint,
    ) -> Result<Self> {
        let (lower_bound, upper_bound) = encode_bounds::<K, KR, T>(query_range);
        Self::from_bounds(lower_bound, upper_bound, table_root, manager, hint)
    }

    pub(crate) fn from_bounds(
        lower_bound: Bound<Vec<u8>>,
        upper_bound: Bound<Vec<u8>>,
        table_root: Option<PageNumber>,
        manager: PageResolver,
        hint: PageHint,
    ) -> Result<Self> {
        if table_root.is_none() || bounds_are_empty::<K>(&lower_bound, &upper_bound) {
            return Ok(Self::empty(manager, hint));
        }

        Ok(Self {
            root: table_root,
            lower_bound,
            upper_bound,
            manager,
            hint,
            front: Slot::Uninitialized,
            back: Slot::Uninitialized,
            front_leaf_within: None,
            errored: false,
        })
    }

    fn empty(manager: PageResolver, hint: PageHint) -> Self {
        Self {
            root: None,
            lower_bound: Unbounded,
            upper_bound: Unbounded,
            manager,
            hint,
            front: Slot::Exhausted,
            back: Slot::Exhausted,
            front_leaf_within: None,
            errored: false,
        }
    }

    fn close(&mut self) {
        self.root = None;
        self.front = Slot::Exhausted;
        self.back = Slot::Exhausted;
    }

    fn initialize_side(&mut self, side: Side) -> Result {
        assert!(matches!(self.slot(side), Slot::Uninitialized));
        let root = self.root.expect("range cursor must have a root");
        let mut cursor = Cursor::new(root, self.manager.clone(), self.hint);
        match side {
            Side::Front => match self.lower_bound.as_ref().map(Vec::as_slice) {
                Included(key) => cursor.seek_to(Position::Before(key))?,
                Excluded(key) => cursor.seek_to(Position::After(key))?,
                Unbounded => cursor.seek_to(Position::Start)?,
            },
            Side::Back => match self.upper_bound.as_ref().map(Vec::as_slice) {
                Included(key) => cursor.seek_to(Position::After(key))?,
                Excluded(key) => cursor.seek_to(Position::Before(key))?,
                Unbounded => cursor.seek_to(Position::End)?,
            },
        }
        *self.slot_mut(side) = Slot::Active(cursor);
        Ok(())
    }

    fn prepare(&mut self, side: Side) -> Result<bool> {
        if matches!(self.slot(side), Slot::Uninitialized) {
            self.initialize_side(side)?;
        }
        Ok(self.slot(side).active().is_some())
    }

    fn slot(&self, side: Side) -> &Slot<Cursor<K, V>> {
        match side {
            Side::Front => &self.front,
            Side::Back => &self.back,
        }
    }

    fn slot_mut(&mut self, side: Side) -> &mut Slot<Cursor<K, V>> {
        match side {
            Side::Front => &mut self.front,
            Side::Back => &mut self.back,
        }
    }

    fn opposite_slot(&self, side: Side) -> &Slot<Cursor<K, V>> {
        match side {
            Side::Front => &self.back,
            Side::Back => &self.front,
        }
    }

    fn active_cursor_mut(&mut self, side: Side) -> &mut Cursor<K, V> {
        self.slot_mut(side)
            .active_mut()
            .expect("cursor must be active")
    }

    fn cursors_have_remaining(&mut self) -> Result<bool> {
        // The gap after one leaf is the same logical position as the gap before
        // the next leaf. Keep the front cursor canonical so path comparison can
        // detect when alternating iteration has consumed the whole range.
        if let (Slot::Active(front), Slot::Active(_)) = (&mut self.front, &self.back) {
            front.normalize_forward_gap()?;
        }

        match (&self.front, &self.back) {
            (Slot::Active(front), Slot::Active(back)) => {
                Ok(front.compare_position(back) == Ordering::Less)
            }
            (Slot::Exhausted, _) | (_, Slot::Exhausted) => Ok(false),
            (Slot::Uninitialized, _) | (_, Slot::Uninitialized) => Ok(true),
        }
    }

    fn advance_cursor(&mut self, side: Side) -> Result<Option<EntryGuard<K, V>>> {
        match side {
            Side::Front => self.active_cursor_mut(side).next(),
            Side::Back => self.active_cursor_mut(side).prev(),
        }
    }

    fn entry_within_open_bound(&self, entry: &EntryGuard<K, V>, side: Side) -> bool {
        let key = entry.key_bytes();
        match side {
            Side::Front => match self.upper_bound.as_ref().map(Vec::as_slice) {
                Included(bound) => K::compare(key, bound).is_le(),
                Excluded(bound) => K::compare(key, bound).is_lt(),
                Unbounded => true,
            },
            Side::Back => match self.lower_bound.as_ref().map(Vec::as_slice) {
                Included(bound) => K::compare(key, bound).is_ge(),
                Excluded(bound) => K::compare(key, bound).is_gt(),
                Unbounded => true,
            },
        }
    }

    // Skips the front of the range forward to the first key >= `key` (a patch
    // of Spindle's vendored copy). `key` must not be before an entry the front
    // already returned. The back side, if started, keeps its position.
    pub(crate) fn seek_front(&mut self, key: &[u8]) -> Result {
        if self.errored {
            return Err(StorageError::PreviousIo);
        }
        let raise = match &self.lower_bound {
            Included(bound) | Excluded(bound) => K::compare(key, bound).is_gt(),
            Unbounded => true,
        };
        if !raise {
            return Ok(());
        }
        match &mut self.lower_bound {
            Included(bound) => {
                bound.clear();
                bound.extend_from_slice(key);
            }
            other => *other = Included(key.to_vec()),
        }
        if bounds_are_empty::<K>(&self.lower_bound, &self.upper_bound) {
            self.close();
            return Ok(());
        }
        let result = match &mut self.front {
            Slot::Active(cursor) => cursor.seek_before_from_here(key),
            Slot::Uninitialized | Slot::Exhausted => Ok(()),
        };
        if result.is_err() {
            self.errored = true;
        }
        result
    }

    // The next entry from the front, handed to `f` as key and value bytes
    // borrowed from the leaf page (a patch of Spindle's vendored copy; the
    // same steps and bound checks as `next`, without a page reference per
    // entry).
    pub(crate) fn next_front_with<R>(
        &mut self,
        f: impl FnOnce(&[u8], &[u8]) -> R,
    ) -> Option<Result<R>> {
        if self.errored {
            return Some(Err(StorageError::PreviousIo));
        }
        let result = self.next_front_with_inner(f);
        if matches!(result, Some(Err(_))) {
            self.errored = true;
        }
        result
    }

    fn next_front_with_inner<R>(
        &mut self,
        f: impl FnOnce(&[u8], &[u8]) -> R,
    ) -> Option<Result<R>> {
        match self.prepare(Side::Front) {
            Ok(true) => {}
            Ok(false) => return None,
            Err(err) => return Some(Err(err)),
        }
        match self.cursors_have_remaining() {
            Ok(true) => {}
            Ok(false) => {
                self.close();
                return None;
            }
            Err(err) => return Some(Err(err)),
        }
        // With both ends started, `cursors_have_remaining` stops the range;
        // with the front alone, the upper bound does.
        let check_bound = self.back.is_uninitialized();
        let Self {
            front,
            upper_bound,
            front_leaf_within,
            ..
        } = self;
        let Some(cursor) = front.active_mut() else {
            // `prepare` returned true: the front is active.
            return None;
        };
        let upper = upper_bound.as_ref().map(Vec::as_slice);
        let stepped = cursor.next_with(|key, value, page, last_key| {
            let within = !check_bound
                || front_within::<K>(upper, front_leaf_within, key, page, last_key);
            within.then(|| f(key, value))
        });
        match stepped {
            Ok(Some(Some(r))) => Some(Ok(r)),
            Ok(Some(None) | None) => {
                self.close();
                None
            }
            Err(err) => Some(Err(err)),
        }
    }

    // Like `next_front_with`, for a run of entries (a patch of Spindle's
    // vendored copy): hands `f` the front's entries in order, at most to the
    // end of the current leaf, until `f` returns false. `Ok(true)`: more
    // may follow (call again); `Ok(false)`: the range is done. With the back
    // end started, the ends' positions must be compared at every entry, so
    // a run is one entry.
    pub(crate) fn run_front_with(
        &mut self,
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<bool> {
        if self.errored {
            return Err(StorageError::PreviousIo);
        }
        let result = self.run_front_with_inner(&mut f);
        if result.is_err() {
            self.errored = true;
        }
        result
    }

    fn run_front_with_inner(&mut self, f: &mut impl FnMut(&[u8], &[u8]) -> bool) -> Result<bool> {
        if !self.back.is_uninitialized() {
            return match self.next_front_with_inner(|key, value| {
                f(key, value);
            }) {
                Some(Ok(())) => Ok(true),
                Some(Err(err)) => Err(err),
                None => Ok(false),
            };
        }
        if !self.prepare(Side::Front)? {
            return Ok(false);
        }
        // The back is not started: only the front's own exhaustion and the
        // upper bound end the range.
        if !self.cursors_have_remaining()? {
            self.close();
            return Ok(false);
        }
        let Self {
            front,
            upper_bound,
            front_leaf_within,
            ..
        } = self;
        let Some(cursor) = front.active_mut() else {
            // `prepare` returned true: the front is active.
            return Ok(false);
        };
        let upper = upper_bound.as_ref().map(Vec::as_slice);
        let mut past_bound = false;
        let stepped = cursor.run_with(|key, value, page, last_key| {
            if !front_within::<K>(upper, front_leaf_within, key, page, last_key) {
                past_bound = true;
                return false;
            }
            f(key, value)
        })?;
        if !stepped || past_bound {
            self.close();
            return Ok(false);
        }
        Ok(true)
    }

    fn next_from(&mut self, side: Side) -> Option<Result<EntryGuard<K, V>>> {
        if self.errored {
            return Some(Err(StorageError::PreviousIo));
        }
        let result = self.next_from_inner(side);
        if matches!(result, Some(Err(_))) {
            self.errored = true;
        }
        result
    }

    fn next_from_inner(&mut self, side: Side) -> Option<Result<EntryGuard<K, V>>> {
        match self.prepare(side) {
            Ok(true) => {}
            Ok(false) => return None,
            Err(err) => return Some(Err(err)),
        }
        match self.cursors_have_remaining() {
            Ok(true) => {}
            Ok(false) => {
                self.close();
                return None;
            }
            Err(err) => return Some(Err(err)),
        }

        let entry = match self.advance_cursor(side) {
            Ok(Some(entry)) => entry,
            Ok(None) => {
                self.close();
                return None;
            }
            Err(err) => return Some(Err(err)),
        };
        if self.opposite_slot(side).is_uninitialized()
            && !self.entry_within_open_bound(&entry, side)
        {
            self.close();
            return None;
        }
        Some(Ok(entry))
    }
}

impl<K: Key + 'static, V: Value + 'static> Iterator for BtreeCursorRange<K, V> {
    type Item = Result<EntryGuard<K, V>>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_from(Side::Front)
    }
}

impl<K: Key + 'static, V: Value + 'static> DoubleEndedIterator for BtreeCursorRange<K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.next_from(Side::Back)
    }
}
