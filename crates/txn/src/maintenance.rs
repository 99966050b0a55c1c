//! # Split maintenance, off the commit path
//!
//! Every commit counts its writes against the splits it touched (bytes,
//! rows, deletes, write rate) and decides, from those counters alone,
//! whether a split is due for a recount: it grew past the size threshold,
//! it has carried sustained write load, or enough of it may have been
//! deleted. The recount itself — a scan of the whole split — and the cut or
//! merge it leads to run on the maintenance thread, never in a commit:
//!
//! ```text
//!   commit ─► visible ─► note: counters += deltas (split map lock, µs) ─► due? ─► queue[id] ─► return
//!   maintenance thread: take queue, per split:
//!        map lock: start, end, counters ─► ts = visible_ts, wait until the data file has ts
//!        ─► scan [start, end) at ts (no lock) ─► map lock:
//!                   unchanged? counters = scan (+ growth since) ─► cut at the middle row tree
//!                   or (small) scan the neighbour (no lock) ─► map lock: both unchanged? merge
//!                   ─► halves still too big: again
//!        map changed ─► persist it (metadata batch)
//! ```
//!
//! (A million-row load used to wait in its COMMIT for its whole batch to
//! reach the data file and then for the scan of its split, with the split
//! map locked: every other commit waited too.)
//!
//! Invariants:
//! * A cut falls only at a row-tree boundary strictly inside the split
//!   (`SplitMap::split_at` checks it against the catalog's boundaries), so
//!   a row tree never spans two splits.
//! * A scan's sizes apply only to the split it scanned: if the split's start
//!   or end moved meanwhile, the result is dropped (the next due commit
//!   queues it again). No scan runs with the map locked: a merge's scan of
//!   the neighbour neither (the neighbour may be large), and the merge is
//!   made only if neither split moved meanwhile.
//! * Counters are estimates between recounts: a recount sets them from the
//!   scan at `ts` plus what commits noted while it ran.
//! * [`Splits::wait_idle`] returns once nothing is queued or running:
//!   `TxnManager::split_stats` (SHOW SPLITS, `spindle_splits`) waits for it,
//!   so the layout it reports follows every commit before the call.
//! * A cut for load falls where the split's sampled commits divide, few
//!   of them crossing it (`LoadSample::cut_key`); with no such key the
//!   split stays whole and no recount is queued for load. The halves of a
//!   load cut are not merged back within the load window, nor while they
//!   write at half the load-split rate or more (`Splits::may_merge`).
//! * Maintenance only skips on failure: a split left uncut is cut at a
//!   later recount.
//! * Only the maintenance thread persists the split map, encoded under
//!   the map's lock and written after it is released.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

use spindle_catalog::Catalog;
use spindle_storage::splits::{Boundaries, SplitMap};
use spindle_storage::{Batch, Store, Timestamp};

use crate::{
    CatalogBoundaries, SplitDelta, LOAD_RECOUNT_INTERVAL, LOAD_SPLIT_WRITES_PER_MINUTE, SPLITS_META,
};

/// The split map, its thresholds and its maintenance queue, shared by the
/// transaction manager and the maintenance thread.
pub(crate) struct Splits {
    pub(crate) map: Mutex<SplitMap>,
    pub(crate) threshold: AtomicU64,
    /// `DEFAULT_LOAD_SPLIT_AFTER` in microseconds (tests shorten it).
    pub(crate) load_split_after_micros: AtomicU64,
    /// Bumped (with the map locked) by every cut and merge: a commit
    /// grouped its writes under one layout version, and if the layout
    /// changed before it is counted, its counts may belong to a split it
    /// did not name.
    layout: AtomicU64,
    store: Arc<Store>,
    /// The transaction manager's cached catalog (the newest one): its row
    /// trees are where cuts may fall.
    catalog: Arc<RwLock<(Timestamp, Arc<Catalog>)>>,
    queue: Mutex<Queue>,
    /// Signalled when work is queued, when a round ends and at shutdown.
    changed: Condvar,
    /// Scans of a split (or a merge's neighbour) so far.
    pub(crate) scans: AtomicU64,
    /// Replaced rows the applier could not count while the map was
    /// locked ([`Splits::note_replaced`]): counted by the next commit.
    replaced: Mutex<Vec<(Vec<u8>, u64)>>,
}

/// Most replaced rows kept for the next commit to count (beyond, the
/// next recount corrects the counts).
const REPLACED_PENDING_MAX: usize = 65_536;

#[derive(Default)]
struct Queue {
    /// Splits due for a recount, by id.
    due: BTreeMap<u64, Due>,
    /// A round is running.
    busy: bool,
    stop: bool,
}

/// Takes a replaced row (its key and live bytes) off its split's counts.
fn take_replaced(map: &mut SplitMap, key: &[u8], bytes: u64) {
    let idx = map.index_of(key);
    if let Some(s) = map.splits_mut().get_mut(idx) {
        s.bytes = s.bytes.saturating_sub(bytes);
        s.rows = s.rows.saturating_sub(1);
    }
}

/// Why a split is queued for a recount.
#[derive(Clone, Copy)]
struct Due {
    /// For sustained write load (cut even below the size threshold).
    load: bool,
    /// The recount of every split at open ([`Splits::recount_all`]). It
    /// merges nothing (the halves of a cut for load are small, and what
    /// kept them apart, their load and the time of the cut, is not known
    /// after a restart), and it does not count as a recent scan that
    /// holds back a recount for load (`LOAD_RECOUNT_INTERVAL`).
    at_open: bool,
}

/// A split due for a recount.
#[derive(Clone, Copy)]
struct Recount {
    id: u64,
    /// For sustained write load (cut even below the size threshold).
    load: bool,
    /// See [`Due::at_open`].
    at_open: bool,
    /// A recount after one whose scan missed concurrent writes: not
    /// repeated for that reason again.
    again: bool,
}

/// Live bytes and rows per row tree, in key order.
type Sizes = Vec<(Vec<u8>, u64, u64)>;

/// The `(bytes, rows)` counters of a cut split's two halves: the recount's
/// scan found `scanned` in all and `left` of it below the cut, and commits
/// noted `growth` against the split while the scan ran. The growth goes to
/// the left half, the split those commits named (where in the split they
/// wrote is not known; a grown cut is recounted once more, which settles
/// it): dropping it would leave the split map's totals short of the data
/// until the next recount, which a split that stops growing never gets.
fn cut_counters(
    scanned: (u64, u64),
    left: (u64, u64),
    growth: (u64, u64),
) -> ((u64, u64), (u64, u64)) {
    (
        (left.0 + growth.0, left.1 + growth.1),
        (
            scanned.0.saturating_sub(left.0),
            scanned.1.saturating_sub(left.1),
        ),
    )
}

impl Splits {
    pub(crate) fn new(
        map: SplitMap,
        threshold: u64,
        load_split_after_micros: u64,
        store: Arc<Store>,
        catalog: Arc<RwLock<(Timestamp, Arc<Catalog>)>>,
    ) -> Splits {
        Splits {
            map: Mutex::new(map),
            threshold: AtomicU64::new(threshold),
            load_split_after_micros: AtomicU64::new(load_split_after_micros),
            layout: AtomicU64::new(0),
            store,
            catalog,
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
            scans: AtomicU64::new(0),
            replaced: Mutex::new(Vec::new()),
        }
    }

    fn queue(&self) -> Option<MutexGuard<'_, Queue>> {
        self.queue.lock().ok()
    }

    /// The layout version; read with the map locked, it names the layout
    /// of that map.
    pub(crate) fn layout(&self) -> u64 {
        self.layout.load(Ordering::Acquire)
    }

    /// Counts a commit's writes against its splits and queues the splits
    /// due for a recount (under the split map's lock, which commits take to
    /// group their writes: counters only, no scan). `layout`: the layout
    /// version the commit grouped its writes under; if a cut or merge came
    /// since, every split now holding a key range the commit wrote (several
    /// cuts may have spread one old split over many), and the split each
    /// delta named, is recounted: the counts went to the named split, and
    /// the recounts put them where the rows are.
    pub(crate) fn note_commit(&self, deltas: &[SplitDelta], layout: u64) {
        let threshold = self.threshold.load(Ordering::Relaxed);
        let after = self.load_split_after_micros.load(Ordering::Relaxed);
        let mut due = Vec::new();
        {
            let Ok(mut map) = self.map.lock() else {
                return;
            };
            if self.layout() != layout {
                for d in deltas {
                    let (lo, hi) = (map.index_of(&d.first), map.index_of(&d.last));
                    due.extend(map.splits()[lo..=hi].iter().map(|s| (s.id, false)));
                    if let Some(s) = map.splits().iter().find(|s| s.id == d.id) {
                        due.push((s.id, false));
                    }
                }
            }
            if let Ok(mut pending) = self.replaced.lock() {
                for (key, bytes) in pending.drain(..) {
                    take_replaced(&mut map, &key, bytes);
                }
            }
            for d in deltas {
                let Some(idx) = map.splits().iter().position(|s| s.id == d.id) else {
                    continue;
                };
                let s = &mut map.splits_mut()[idx];
                s.writes.add(d.writes);
                s.bytes += d.bytes;
                s.rows += d.puts;
                s.dirty_deletes += d.deletes;
                let loaded = s.writes.per_minute() >= LOAD_SPLIT_WRITES_PER_MINUTE;
                s.loaded_since = match (loaded, s.loaded_since) {
                    (false, _) => None,
                    (true, None) => Some(std::time::Instant::now()),
                    (true, since) => since,
                };
                if loaded {
                    s.load_sample.add(&d.first, &d.last);
                } else if !s.load_sample.is_empty() {
                    s.load_sample.clear();
                }
                let sustained = s
                    .loaded_since
                    .is_some_and(|t| t.elapsed().as_micros() as u64 >= after);
                // A recount scans the whole split, so the triggers that can
                // repeat commit after commit are spaced out: sustained load
                // recounts at most every LOAD_RECOUNT_INTERVAL (and only with
                // a cut in its sample), size below.
                let since = s.recounted.map(|(at, _)| at.elapsed());
                let mut load = sustained
                    && since.is_none_or(|d| d >= LOAD_RECOUNT_INTERVAL)
                    && s.load_checked
                        .is_none_or(|t| t.elapsed() >= LOAD_RECOUNT_INTERVAL);
                if load {
                    // Recount for load only if the sample has a cut
                    // (weighed at most once per LOAD_RECOUNT_INTERVAL).
                    s.load_checked = Some(std::time::Instant::now());
                    load = self.load_cut(&map, idx).is_some();
                }
                let s = &mut map.splits_mut()[idx];
                // Past the threshold, and grown by a quarter since the last
                // recount: a split that is one uncuttable row tree would
                // otherwise be rescanned at every commit, and one whose
                // updates the applier has not reported yet (`note_replaced`)
                // every few megabytes of updates (a 60 MB split under
                // TPC-B was scanned every ~2 s).
                let big = s.bytes > threshold
                    && s.recounted.is_none_or(|(_, was)| s.bytes >= was + was / 4);
                // A deleted row comes off the counts once applied
                // (`note_replaced`), so deletes need no recount to keep the
                // sizes right; a recount is what merges a split, so one is
                // queued when deletes took the split below the merge size
                // (a quarter of the threshold) since its last recount, or
                // took away as many rows as it has left (the counts are
                // estimates). Before, an eighth of a large split's rows
                // deleted queued a scan of all of it: under the benchmark's
                // row-tree deletes, a third of the server's CPU went to the
                // maintenance thread's scans of its 1 M-row split.
                let (deletes, rows) = (s.dirty_deletes, s.rows);
                let small = threshold / 4;
                let shrunk = deletes > 0
                    && (deletes >= rows
                        || (s.bytes < small && s.recounted.is_none_or(|(_, was)| was >= small)));
                if big || load || shrunk {
                    due.push((s.id, load));
                }
            }
        }
        if due.is_empty() {
            return;
        }
        if let Some(mut q) = self.queue() {
            for (id, load) in due {
                let d = q.due.entry(id).or_insert(Due {
                    load,
                    at_open: false,
                });
                d.load |= load;
                d.at_open = false;
            }
            self.changed.notify_all();
        }
    }

    /// Queues every split for a recount (at open: the counters are kept in
    /// memory only, so a reopened database's splits start at zero, and a
    /// split's size would be known again only after enough new writes to
    /// pass the threshold). The maintenance thread scans them in the
    /// background; [`Splits::wait_idle`] (and so `split_stats`) waits for
    /// the scans. A split past the threshold is cut as after any recount;
    /// none is merged ([`Due::at_open`]).
    pub(crate) fn recount_all(&self) {
        let ids: Vec<u64> = match self.map.lock() {
            Ok(map) => map.splits().iter().map(|s| s.id).collect(),
            Err(_) => return,
        };
        if let Some(mut q) = self.queue() {
            for id in ids {
                q.due.entry(id).or_insert(Due {
                    load: false,
                    at_open: true,
                });
            }
            self.changed.notify_all();
        }
    }

    /// Takes rows that later versions replaced off their splits' counts
    /// (told by the store after they are applied, [`ReplacedObserver`]):
    /// `note_commit` counted every put as a new row of its size and every
    /// delete as nothing, so a split whose rows are updated, not grown,
    /// would otherwise look as if it grew by every update (a recount scan
    /// each time the counter passed the threshold by another quarter),
    /// and one whose rows are deleted as if it kept them. Runs on the log's
    /// applier thread, so it never waits for the map (a commit may hold
    /// it while it waits for that thread): a group it cannot count at
    /// once is kept for the next commit to count.
    ///
    /// [`ReplacedObserver`]: spindle_storage::ReplacedObserver
    pub(crate) fn note_replaced(&self, replaced: &mut dyn Iterator<Item = (&[u8], u64)>) {
        match self.map.try_lock() {
            Ok(mut map) => {
                for (key, bytes) in replaced {
                    take_replaced(&mut map, key, bytes);
                }
            }
            Err(_) => {
                if let Ok(mut pending) = self.replaced.lock() {
                    let room = REPLACED_PENDING_MAX.saturating_sub(pending.len());
                    pending.extend(replaced.take(room).map(|(k, b)| (k.to_vec(), b)));
                }
            }
        }
    }

    /// Waits until no recount is queued or running.
    pub(crate) fn wait_idle(&self) {
        let Some(mut q) = self.queue() else { return };
        while (q.busy || !q.due.is_empty()) && !q.stop {
            q = match self.changed.wait(q) {
                Ok(q) => q,
                Err(_) => return,
            };
        }
    }

    /// Stops the maintenance thread after its current round (queued
    /// recounts are dropped: maintenance is never required).
    pub(crate) fn stop(&self) {
        if let Some(mut q) = self.queue() {
            q.stop = true;
            self.changed.notify_all();
        }
    }

    /// The maintenance thread.
    pub(crate) fn run(&self) {
        loop {
            let due = {
                let Some(mut q) = self.queue() else { return };
                loop {
                    if q.stop {
                        return;
                    }
                    if !q.due.is_empty() {
                        q.busy = true;
                        break std::mem::take(&mut q.due);
                    }
                    q = match self.changed.wait(q) {
                        Ok(q) => q,
                        Err(_) => return,
                    };
                }
            };
            self.maintain(due);
            if let Some(mut q) = self.queue() {
                q.busy = false;
                self.changed.notify_all();
            }
        }
    }

    /// One round: recounts the due splits, cuts those past the threshold
    /// (or under sustained load) at a row-tree boundary near their middle
    /// — again while a half is still past it — and merges small
    /// neighbours; persists the map if it changed.
    fn maintain(&self, due: BTreeMap<u64, Due>) {
        let catalog = match self.catalog.read() {
            Ok(c) => c.1.clone(),
            Err(_) => return,
        };
        let b = CatalogBoundaries(&catalog);
        let mut work: Vec<Recount> = due
            .into_iter()
            .rev()
            .map(|(id, d)| Recount {
                id,
                load: d.load,
                at_open: d.at_open,
                again: false,
            })
            .collect();
        let mut changed = false;
        while let Some(r) = work.pop() {
            changed |= self.recount(r, &b, &mut work);
        }
        if changed {
            // Encoded under the lock, written without it (the write waits
            // for the log and the applier, and commits group their writes
            // under the lock). Only this thread writes the map, so the
            // persisted layouts follow one another in order.
            let encoded = match self.map.lock() {
                Ok(map) => map.encode(),
                Err(_) => return,
            };
            let mut batch = Batch::default();
            batch.put_meta(SPLITS_META, encoded);
            if let Err(e) = self.store.apply(batch) {
                tracing::warn!(error = %e, "could not persist the split map");
            }
        }
    }

    /// Recounts a split and cuts or merges it; queues in `work` the halves
    /// of a cut still past the threshold, or written while the scan ran
    /// (their counters would miss those writes: recounted once more).
    /// Whether the map changed.
    fn recount(&self, r: Recount, b: &CatalogBoundaries<'_>, work: &mut Vec<Recount>) -> bool {
        let Recount {
            id,
            load,
            at_open,
            again,
        } = r;
        let threshold = self.threshold.load(Ordering::Relaxed);
        let (start, end, before) = {
            let Ok(map) = self.map.lock() else {
                return false;
            };
            let Some(idx) = map.splits().iter().position(|s| s.id == id) else {
                return false;
            };
            let s = &map.splits()[idx];
            let end = map.end_of(idx).map(|e| e.to_vec());
            (s.start.clone(), end, (s.bytes, s.rows, s.dirty_deletes))
        };
        // A commit is counted once it is visible, so the snapshot taken
        // now holds every commit in `before`; every commit at or below `ts`
        // is in the data file once the wait returns (the visible LSN is
        // stored before the timestamp moves).
        let ts = self.store.visible_ts();
        if let Err(e) = self.store.wait_readable() {
            tracing::warn!(error = %e, "split maintenance skipped");
            return false;
        }
        let Some(sizes) = self.scan_sizes(&start, end.as_deref(), ts, b) else {
            return false;
        };
        let Ok(mut map) = self.map.lock() else {
            return false;
        };
        let Some(idx) = map.splits().iter().position(|s| s.id == id) else {
            return false;
        };
        if map.splits()[idx].start != start || map.end_of(idx) != end.as_deref() {
            return false; // moved meanwhile: this scan is not of it
        }
        let total: u64 = sizes.iter().map(|(_, n, _)| n).sum();
        let rows: u64 = sizes.iter().map(|(_, _, r)| r).sum();
        // A load recount queued before a cut of this split (by the commits
        // that came while the cut's scan ran) finds the load ended: the cut
        // ended it, and the half must carry load for the whole window again.
        let load = load && {
            let after = self.load_split_after_micros.load(Ordering::Relaxed);
            map.splits()[idx]
                .loaded_since
                .is_some_and(|t| t.elapsed().as_micros() as u64 >= after)
        };
        let grown = {
            let s = &map.splits()[idx];
            (s.bytes, s.rows, s.dirty_deletes) != before
        };
        {
            // What commits noted since `before` is added to the scan (some
            // of it may be in the scan too: an estimate errs high).
            let s = &mut map.splits_mut()[idx];
            s.bytes = total + s.bytes.saturating_sub(before.0);
            s.rows = rows + s.rows.saturating_sub(before.1);
            s.dirty_deletes = s.dirty_deletes.saturating_sub(before.2);
            s.oversized = false;
            let now = std::time::Instant::now();
            // At open, the size is known from now on, but no load recount
            // is held back by this scan: dated one interval ago (or, on a
            // clock too young for that, now).
            let at = if at_open {
                s.recounted.map_or_else(
                    || now.checked_sub(LOAD_RECOUNT_INTERVAL).unwrap_or(now),
                    |(at, _)| at,
                )
            } else {
                now
            };
            s.recounted = Some((at, total));
        }
        // Under load (and not too big), the cut falls where the sampled
        // commits divide; without such a key, no cut for load.
        let load_at = if load && total <= threshold {
            self.load_cut_with(&map, idx, b)
        } else {
            None
        };
        if total > threshold || load_at.is_some() {
            // For size: the row tree at which the running total passes
            // half (else the first one after the split's start).
            let inside = |r: &Vec<u8>| r.as_slice() > start.as_slice();
            let cut = load_at
                .clone()
                .or_else(|| {
                    let mut acc = 0;
                    sizes.iter().find_map(|(root, n, _)| {
                        let passed = acc >= total / 2;
                        acc += n;
                        (passed && inside(root)).then(|| root.clone())
                    })
                })
                .or_else(|| sizes.iter().map(|(r, _, _)| r).find(|r| inside(r)).cloned());
            let cut = cut.and_then(|at| map.split_at(idx, at.clone(), b).map(|id| (at, id)));
            match cut {
                Some((at, new_id)) => {
                    {
                        if load_at.is_some() {
                            let now = Some(std::time::Instant::now());
                            map.splits_mut()[idx].load_cut_at = now;
                            map.splits_mut()[idx + 1].load_cut_at = now;
                        }
                        let (left, left_rows) = sizes
                            .iter()
                            .take_while(|(r, _, _)| *r < at)
                            .fold((0, 0), |(n, r), (_, bn, br)| (n + bn, r + br));
                        let splits = map.splits_mut();
                        let growth = (
                            splits[idx].bytes.saturating_sub(total),
                            splits[idx].rows.saturating_sub(rows),
                        );
                        let ((lb, lr), (rb, rr)) =
                            cut_counters((total, rows), (left, left_rows), growth);
                        splits[idx].bytes = lb;
                        splits[idx].rows = lr;
                        splits[idx + 1].bytes = rb;
                        splits[idx + 1].rows = rr;
                        // Each half counts as recounted at its own size.
                        let now = std::time::Instant::now();
                        splits[idx].recounted = Some((now, left));
                        splits[idx + 1].recounted = Some((now, total - left));
                        self.layout.fetch_add(1, Ordering::AcqRel);
                        tracing::info!(split = id, at = ?at, "split");
                        // A load of many times the threshold is cut until
                        // every piece is below it.
                        let again = again || grown;
                        let recheck = grown && !r.again;
                        if total - left > threshold || recheck {
                            work.push(Recount {
                                id: new_id,
                                load: false,
                                at_open,
                                again,
                            });
                        }
                        if left > threshold || recheck {
                            work.push(Recount {
                                id,
                                load: false,
                                at_open,
                                again,
                            });
                        }
                    }
                    true
                }
                None => {
                    // One row tree larger than the threshold stays whole.
                    map.splits_mut()[idx].oversized = total > threshold;
                    false
                }
            }
        } else if !at_open
            && total < threshold / 4
            && idx + 1 < map.len()
            && self.may_merge(&mut map, idx)
        {
            // The neighbour is scanned without the map's lock (every commit
            // groups its writes under it, and the neighbour may be large);
            // the merge is made only if neither split moved meanwhile.
            let next = &map.splits()[idx + 1];
            let next_start = next.start.clone();
            let next_before = (next.bytes, next.rows);
            let next_end = map.end_of(idx + 1).map(|e| e.to_vec());
            drop(map);
            let Some(next) = self.scan_sizes(&next_start, next_end.as_deref(), ts, b) else {
                return false;
            };
            let next_total: u64 = next.iter().map(|(_, n, _)| n).sum();
            let next_rows: u64 = next.iter().map(|(_, _, r)| r).sum();
            if total + next_total >= threshold / 2 {
                return false;
            }
            let Ok(mut map) = self.map.lock() else {
                return false;
            };
            let Some(idx) = map.splits().iter().position(|s| s.id == id) else {
                return false;
            };
            let unmoved = idx + 1 < map.len()
                && map.splits()[idx].start == start
                && map.splits()[idx + 1].start == next_start
                && map.end_of(idx + 1) == next_end.as_deref();
            if !unmoved {
                return false;
            }
            // As for the split itself: what commits noted since the
            // neighbour's counters were read is added to its scan.
            let n = &mut map.splits_mut()[idx + 1];
            n.bytes = next_total + n.bytes.saturating_sub(next_before.0);
            n.rows = next_rows + n.rows.saturating_sub(next_before.1);
            map.merge_with_next(idx);
            self.layout.fetch_add(1, Ordering::AcqRel);
            tracing::info!(split = id, "merged with its right neighbour");
            true
        } else {
            false
        }
    }

    /// The cut for load that split `idx`'s sampled commits suggest
    /// ([`spindle_storage::splits::LoadSample::cut_key`]), with the newest
    /// catalog's row trees.
    fn load_cut(&self, map: &SplitMap, idx: usize) -> Option<Vec<u8>> {
        let catalog = self.catalog.read().ok()?.1.clone();
        self.load_cut_with(map, idx, &CatalogBoundaries(&catalog))
    }

    fn load_cut_with(
        &self,
        map: &SplitMap,
        idx: usize,
        b: &CatalogBoundaries<'_>,
    ) -> Option<Vec<u8>> {
        let s = map.get(idx)?;
        s.load_sample.cut_key(&s.start, map.end_of(idx), b)
    }

    /// Whether split `idx` may merge with the next one as far as load
    /// goes: not while their writes together reach half the load-split
    /// rate (the merged split would soon be cut for load again), nor within
    /// the sustained-load window after either was cut for load (the new
    /// half's rate counter starts from an estimate). Without this, a split
    /// cut for load was merged back by the recount that followed the cut,
    /// then cut again: under pgbench's TPC-B a scan of the whole split
    /// every few hundred milliseconds (bench/README.md, nineteenth session).
    fn may_merge(&self, map: &mut SplitMap, idx: usize) -> bool {
        let after =
            std::time::Duration::from_micros(self.load_split_after_micros.load(Ordering::Relaxed));
        let splits = &mut map.splits_mut()[idx..=idx + 1];
        let writes: u64 = splits.iter_mut().map(|s| s.writes.per_minute()).sum();
        writes < LOAD_SPLIT_WRITES_PER_MINUTE / 2
            && splits
                .iter()
                .all(|s| s.load_cut_at.is_none_or(|at| at.elapsed() >= after))
    }

    /// Live bytes and rows per row tree of `[start, end)` at `ts` (applied:
    /// see [`Splits::maintain`]), in key order.
    fn scan_sizes(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        ts: Timestamp,
        b: &dyn Boundaries,
    ) -> Option<Sizes> {
        self.scans.fetch_add(1, Ordering::Relaxed);
        let mut out: Sizes = Vec::new();
        for item in self.store.scan(start, end, ts) {
            let (k, v) = item.ok()?;
            let root = b.root_of(&k);
            let n = (k.len() + v.len()) as u64;
            match out.last_mut() {
                Some((r, bytes, rows)) if *r == root => {
                    *bytes += n;
                    *rows += 1;
                }
                _ => out.push((root, n, 1)),
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::cut_counters;

    #[test]
    fn a_cut_keeps_what_commits_noted_during_its_scan() {
        // 3 000 bytes / 40 rows scanned, 1 200 / 16 below the cut; commits
        // noted 500 bytes / 8 rows against the split while the scan ran.
        let (l, r) = cut_counters((3_000, 40), (1_200, 16), (500, 8));
        assert_eq!(l, (1_700, 24));
        assert_eq!(r, (1_800, 24));
        assert_eq!((l.0 + r.0, l.1 + r.1), (3_500, 48));
        // Without growth, the halves are the scan's.
        assert_eq!(
            cut_counters((3_000, 40), (1_200, 16), (0, 0)),
            ((1_200, 16), (1_800, 24))
        );
    }
}
