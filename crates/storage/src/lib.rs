//! # spindle-storage: multi-version keys on redb
//!
//! The store keeps every committed version of every logical key, tagged with
//! its commit timestamp, in one ordered table ([`kv`]: a redb B-tree file).
//! Readers pick a timestamp and see exactly the versions committed at or
//! before it; a commit appends its versions to the write-ahead log
//! ([`wal`]), whose applier thread writes them in one redb write
//! transaction (not synced) while the committer flushes the log (one
//! `write`, one `fdatasync`; the commit is acknowledged then), so a crash
//! leaves either all of a commit or none of it, and an acknowledged commit
//! is replayed if the data file had not yet made it durable. A snapshot
//! reads a published commit before the applier is done: a point read
//! ([`Store::get_at`]) takes the newer of the data file's version and the
//! log's index of unapplied versions; a scan ([`Store::scan_at`]) waits
//! for the apply of the unapplied batches that write inside its range.
//!
//! ## Physical layout
//!
//! ```text
//!   logical key              version suffix
//!   ┌───────────────────────┬────┬──────────────────────────┐
//!   │ 20 [table] [key] ...  │ 00 │ 00 00 00 00 00 00 00 00  │ → 02 [ts u64 BE] [row bytes] | 03 [ts u64 BE]
//!   ├───────────────────────┼────┼──────────────────────────┤   (the head: the newest version)
//!   │ 20 [table] [key] ...  │ 00 │ !commit_ts (u64, BE)     │ → 01 [row bytes] | 00 (tombstone)
//!   └───────────────────────┴────┴──────────────────────────┘   (older versions, newest first)
//!   FF "meta/…"                                              → unversioned metadata
//! ```
//!
//! The newest version of every key lives in its **head**, at the key's
//! fixed slot (suffix `00` + eight zero bytes), with its commit timestamp
//! in the value; older versions live under their inverted timestamp, so
//! the newer sort first. A read of the newest version — almost every read
//! — is one exact-key lookup; a read at an older snapshot finds the head
//! too new and continues into the older versions. A commit moves the
//! previous head to its timestamped slot and writes the new head, in the
//! same atomic batch.
//!
//! The separator `00` is lower than the table marker `20`, so the
//! versions of a row sort before the row's interleaved children: a logical
//! range scan stays a physical range scan. Example, keys × time:
//!
//! ```text
//!              ts=5        ts=7        ts=9
//!   Singers/1  "Marc"                  "Marc R."     read@6 → "Marc", read@9 → "Marc R."
//!   Albums/1/1             "Total"                    read@6 → (none)
//!   Singers/2  "Cat"       (deleted)                  read@6 → "Cat", read@7 → (none)
//!
//!   Singers/1 00 head      → 02 ts=9 "Marc R."
//!   Singers/1 00 !5        → 01 "Marc"
//! ```
//!
//! Invariants:
//! * Every logical key that has a version has a head, and the head is its
//!   newest version. Applying a version older than the head (never done by
//!   the transaction layer) stores it in its timestamped slot instead;
//!   applying the head's own version again rewrites the head.
//! * Commits that write the same key apply one at a time, in timestamp
//!   order (the transaction layer's validation aborts concurrent writers of
//!   a key), so reading the head and replacing it in one batch is safe.
//!   [`Store::gc`] removes a head only if it is unchanged (compare and
//!   swap), and never a version as new as the one it keeps.
//! * Logical keys never start with `FF` (reserved for metadata), and a
//!   logical key is never followed by `00` inside another logical key (row
//!   keys continue only with a table marker). Versions no snapshot can
//!   read any more are removed by [`Store::gc`].
//! * `meta/layout` records the layout with heads; a store is created with
//!   it and refuses to open without it.

mod kv;
pub mod splits;
mod wal;

pub use wal::ReplacedObserver;

use std::sync::atomic::{AtomicU64, Ordering};

use spindle_keys::key::prefix_end;
use tracing::debug;

const META_PREFIX: &[u8] = b"\xFFmeta/";
const META_LAST_TS: &[u8] = b"\xFFmeta/last_commit_ts";
/// The last write-ahead log record the data file's state includes ([`wal`]).
const META_WAL_LSN: &[u8] = b"\xFFmeta/wal_lsn";
/// How long [`Store::open`] waits for a lock the previous handle of the
/// same directory (in this process) is still releasing.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
const META_LAYOUT: &[u8] = b"\xFFmeta/layout";
/// The layout with heads (see the module docs).
const LAYOUT_HEADS: u8 = 2;
const VERSION_SEP: u8 = 0x00;
const SUFFIX_LEN: usize = 9;
/// The timestamp whose inverted form (all zero bytes) is the head's slot.
const HEAD_TS: Timestamp = u64::MAX;
/// First byte of a stored value.
const TAG_TOMBSTONE: u8 = 0;
const TAG_LIVE: u8 = 1;
const TAG_HEAD_LIVE: u8 = 2;
const TAG_HEAD_TOMBSTONE: u8 = 3;

/// Storage errors. Every one is internal (XX000) to the layers above: the
/// disk failed or stored bytes are not what this layer wrote.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("storage I/O error: {0}")]
    Kv(#[source] Box<redb::Error>),
    #[error("corrupt storage: {0}")]
    Corrupt(String),
    #[error(
        "{0} holds a store written by an earlier Spindle (sled files `conf` and `db`); \
         this version keeps its data in `data.redb`: open a new directory"
    )]
    OldFormat(std::path::PathBuf),
    #[error("storage I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A write failed after its log record was appended (see [`wal`]): no
    /// commit can proceed until the database is reopened and recovered.
    #[error("the write-ahead log stopped after a failed write; restart the database to recover")]
    LogStopped,
}

pub type Result<T> = std::result::Result<T, Error>;

/// A commit timestamp: microseconds since the Unix epoch, made unique and
/// monotonic by the transaction layer.
pub type Timestamp = u64;

/// One write of a commit: `Some(value)` stores a version, `None` a tombstone.
pub type Write = (Vec<u8>, Option<Vec<u8>>);

/// The multi-version store.
pub struct Store {
    kv: std::sync::Arc<kv::Kv>,
    /// Highest published timestamp: every commit at or below it is
    /// durable and finished; snapshots read at it once
    /// [`Store::wait_readable`] returns.
    visible_ts: AtomicU64,
    /// Every batch of a commit at or below `visible_ts` has a log record
    /// at or below this LSN (the durable LSN when the commits were
    /// published, stored before `visible_ts` moves).
    visible_lsn: AtomicU64,
    temporary: bool,
    /// The write-ahead log that makes commits durable ([`wal`]); `None`
    /// for temporary stores.
    durable: Option<wal::Wal>,
    /// A temporary store's [`ReplacedObserver`] (a durable store's is
    /// the log's: its applier applies).
    replaced: std::sync::OnceLock<ReplacedObserver>,
}

impl Store {
    /// Opens (or creates) a store in the directory `path`
    /// (`path/data.redb` and `path/wal`, see [`kv`] and [`wal`]).
    ///
    /// A directory written by an earlier Spindle, whose store was sled
    /// (files `conf` and `db`, no `data.redb`), is refused with
    /// [`Error::OldFormat`] rather than opened empty beside the old data.
    pub fn open(path: &std::path::Path) -> Result<Store> {
        if !path.join(kv::DATA_FILE).exists()
            && path.join("conf").exists()
            && path.join("db").exists()
        {
            return Err(Error::OldFormat(path.to_path_buf()));
        }
        std::fs::create_dir_all(path)?;
        let kv = std::sync::Arc::new(kv::Kv::open(path)?);
        // Replayed before anything is read: the last commit timestamp may
        // be in the log.
        let wal = wal::Wal::recover(path, kv.clone(), |t, r, replaced, applier| {
            write_batch(t, &r.ops, &r.versions, replaced, applier)
        })?;
        let mut store = Self::from_kv(kv, false)?;
        store.durable = Some(wal);
        Ok(store)
    }

    /// A store that lives in memory and is gone when dropped.
    pub fn open_temporary() -> Result<Store> {
        Self::from_kv(std::sync::Arc::new(kv::Kv::temporary()?), true)
    }

    fn from_kv(kv: std::sync::Arc<kv::Kv>, temporary: bool) -> Result<Store> {
        let last = match kv.get(META_LAST_TS)? {
            Some(v) => u64::from_be_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| Error::Corrupt("last commit timestamp".into()))?,
            ),
            None => 0,
        };
        debug!(last_commit_ts = last, "store opened");
        match kv.get(META_LAYOUT)?.as_deref() {
            Some([LAYOUT_HEADS]) => {}
            None if last == 0 => {
                kv.write(|t| {
                    kv::write_ops(t, &[(META_LAYOUT.to_vec(), Some(vec![LAYOUT_HEADS]))])
                })?;
                kv.sync()?;
            }
            other => return Err(Error::Corrupt(format!("unknown store layout {other:?}"))),
        }
        Ok(Store {
            kv,
            visible_ts: AtomicU64::new(last),
            visible_lsn: AtomicU64::new(0),
            temporary,
            durable: None,
            replaced: std::sync::OnceLock::new(),
        })
    }

    pub fn is_temporary(&self) -> bool {
        self.temporary
    }

    /// The newest fully committed timestamp: a snapshot at it sees every
    /// acknowledged commit once [`Store::wait_readable`] returns.
    pub fn visible_ts(&self) -> Timestamp {
        self.visible_ts.load(Ordering::Acquire)
    }

    /// The log position a snapshot at [`Store::visible_ts`] (read before
    /// this call) needs applied: every batch of every commit it may see is
    /// at or below it. Snapshots read with it ([`Store::get_at`],
    /// [`Store::scan_at`]) rather than wait for the applier when taken.
    pub fn readable_lsn(&self) -> u64 {
        self.visible_lsn.load(Ordering::Acquire)
    }

    /// Whether a [`Store::scan_at`] of `[start, end)` (`end = None`: to
    /// the end of the logical key space) by a snapshot at log position
    /// `lsn` would read at once: no batch up to `lsn` that writes inside
    /// the range is still on its way into the data file. Batches writing
    /// elsewhere (a bulk load's previous commit, into keys below `start`)
    /// do not count, as they do not for the scan.
    pub fn is_applied_in(&self, start: &[u8], end: Option<&[u8]>, lsn: u64) -> Result<bool> {
        match &self.durable {
            Some(wal) => wal.applied_in(start, end.unwrap_or(META_PREFIX), lsn),
            None => Ok(true),
        }
    }

    /// Waits until the data file holds every commit published so far (at
    /// or below any [`Store::visible_ts`] read before the call): a commit
    /// is acknowledged once its log record is durable
    /// ([`Store::flush_durable`]), and its batch may still be on its way
    /// into the data file then (for up to 10 ms while batches gather).
    /// Returns at once when it is there already.
    pub fn wait_readable(&self) -> Result<()> {
        match &self.durable {
            Some(wal) => wal.wait_applied_to(self.visible_lsn.load(Ordering::Acquire)),
            None => Ok(()),
        }
    }

    /// Applies all `writes` at `ts` atomically and durably, and makes `ts`
    /// visible: the single-split commit. The caller (the transaction
    /// layer) guarantees that commits are serialized and that `ts` is
    /// greater than every earlier commit's.
    pub fn commit(&self, ts: Timestamp, writes: &[Write]) -> Result<()> {
        let mut batch = Batch::default();
        batch.versions(ts, writes);
        batch.set_last_commit_ts(ts);
        self.apply(batch)?;
        self.publish(ts);
        debug!(ts, writes = writes.len(), "committed");
        Ok(())
    }

    /// Applies one batch atomically, then flushes it to disk.
    pub fn apply(&self, batch: Batch) -> Result<()> {
        self.apply_unsynced(batch)?;
        self.flush()
    }

    /// Applies one batch atomically without waiting for the disk; a later
    /// [`Store::flush`] makes it durable (group commit). On disk the batch
    /// is logged and queued ([`wal`]): it is in the data file, whole,
    /// once [`Store::flush`] or [`Store::wait_applied`] returns, and is
    /// applied only after one of them is called. Returns the batch's log
    /// position: it is durable once [`Store::durable_lsn`] reaches it (0
    /// for a temporary store, which has no log and applies it at once).
    pub fn apply_unsynced(&self, batch: Batch) -> Result<u64> {
        match &self.durable {
            Some(wal) => wal.submit(batch.inner, batch.versions),
            None => {
                let mut replaced = wal::Replaced::new();
                self.kv.write(|t| {
                    write_batch(t, &batch.inner, &batch.versions, &mut replaced, false)
                })?;
                wal::tell_replaced(&self.replaced, &replaced, &batch.versions);
                Ok(0)
            }
        }
    }

    /// Every batch up to this log position ([`Store::apply_unsynced`]'s
    /// answer) is on the disk (0 for a temporary store).
    pub fn durable_lsn(&self) -> u64 {
        self.durable.as_ref().map_or(0, wal::Wal::durable_lsn)
    }

    /// Sets the observer told, after each batch (on disk: each group of
    /// batches) is in the data file, which versions replaced a live row
    /// and its live bytes ([`ReplacedObserver`]). Set once; later calls
    /// are ignored.
    pub fn set_replaced_observer(&self, observe: ReplacedObserver) {
        match &self.durable {
            Some(wal) => wal.set_replaced_observer(observe),
            None => {
                let _ = self.replaced.set(observe);
            }
        }
    }

    /// Waits until every batch applied before the call is readable (in
    /// the data file, not necessarily durable).
    pub fn wait_applied(&self) -> Result<()> {
        match &self.durable {
            Some(wal) => wal.wait_applied(),
            None => Ok(()),
        }
    }

    /// Makes everything applied so far durable: returns once the
    /// write-ahead log is synced past the last batch applied before the
    /// call (with group commit that sync is usually under way already: see
    /// [`wal`]; the data file itself is flushed only at checkpoints). A
    /// no-op for temporary stores.
    pub fn flush(&self) -> Result<()> {
        match &self.durable {
            Some(wal) => wal.flush(),
            None => Ok(()),
        }
    }

    /// Holds the log's applier before its next batch until the guard is
    /// dropped (`None` for a temporary store, which has none): tests use
    /// it to keep an acknowledged commit out of the data file for a while.
    #[doc(hidden)]
    pub fn pause_applier(&self) -> Result<Option<std::sync::MutexGuard<'_, ()>>> {
        self.durable
            .as_ref()
            .map(wal::Wal::pause_applier)
            .transpose()
    }

    /// [`Store::flush`] that returns once the log is durable, without
    /// waiting for the batches to reach the data file: a commit that
    /// publishes its timestamp after it relies on readers calling
    /// [`Store::wait_readable`] (the transaction layer does, for every
    /// snapshot it takes).
    pub fn flush_durable(&self) -> Result<()> {
        match &self.durable {
            Some(wal) => wal.flush_durable(),
            None => Ok(()),
        }
    }

    /// Group commit on (the default: a background thread syncs the log as
    /// soon as a commit appends to it, and one sync serves every commit
    /// waiting for it) or off (each [`Store::flush`] syncs the log itself:
    /// the baseline the commit benchmark compares against).
    pub fn set_group_commit(&self, on: bool) {
        if let Some(wal) = &self.durable {
            wal.set_group_commit(on);
        }
    }

    /// How many times the log has been synced (0 for temporary stores):
    /// benchmarks report commits per sync.
    pub fn sync_count(&self) -> u64 {
        self.durable.as_ref().map_or(0, wal::Wal::sync_count)
    }

    /// Makes commits up to `ts` visible to new snapshots. Their batches
    /// were all submitted before the call, so the log's last LSN now bounds
    /// them; it is stored first, so a reader that sees `ts` waits for it.
    pub fn publish(&self, ts: Timestamp) {
        if let Some(wal) = &self.durable {
            self.visible_lsn
                .fetch_max(wal.durable_lsn(), Ordering::AcqRel);
        }
        self.visible_ts.fetch_max(ts, Ordering::AcqRel);
    }

    /// All metadata entries whose name starts with `prefix`.
    pub fn meta_scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut key = META_PREFIX.to_vec();
        key.extend_from_slice(prefix.as_bytes());
        // `key` starts with META_PREFIX, whose bytes are not all FF.
        let end = prefix_end(&key).unwrap_or_default();
        let mut out = Vec::new();
        for item in self.kv.snapshot()?.range(&key, &end, false)? {
            let (k, v) = item.map_err(redb::Error::from)?;
            // Every key in the range starts with `key`, so with META_PREFIX.
            let name = k.value().get(META_PREFIX.len()..).unwrap_or_default();
            out.push((
                String::from_utf8_lossy(name).into_owned(),
                v.value().to_vec(),
            ));
        }
        Ok(out)
    }

    /// The value of `key` as of `ts` in the data file (what is applied:
    /// a snapshot reads through [`Store::get_at`]).
    pub fn get(&self, key: &[u8], ts: Timestamp) -> Result<Option<Vec<u8>>> {
        Ok(self.stored_version(key, ts)?.and_then(|(_, v)| v))
    }

    /// The value of `key` as of `ts` for a snapshot that needs every batch
    /// up to log position `lsn` (its [`Store::readable_lsn`]): read from
    /// the data file and from the log's batches not yet applied, the newer
    /// version winning, so a point read never waits for the applier
    /// (unless a batch too large to index is on its way: see `wal`).
    pub fn get_at(&self, key: &[u8], ts: Timestamp, lsn: u64) -> Result<Option<Vec<u8>>> {
        let Some(wal) = &self.durable else {
            return self.get(key, ts);
        };
        // Looked at before the data file's snapshot is taken (see
        // `wal::Unapplied`).
        let unapplied = wal.newest_unapplied(key, ts, lsn)?;
        let stored = self.stored_version(key, ts)?;
        Ok(match (unapplied, stored) {
            (Some((u, uv)), Some((s, sv))) => {
                if u >= s {
                    uv
                } else {
                    sv
                }
            }
            (Some((_, v)), None) | (None, Some((_, v))) => v,
            (None, None) => None,
        })
    }

    /// The version of `key` visible at `ts` in the data file: its commit
    /// timestamp and its row (`None`: a tombstone); `None` if no version
    /// is at or below `ts`.
    fn stored_version(
        &self,
        key: &[u8],
        ts: Timestamp,
    ) -> Result<Option<(Timestamp, Option<Vec<u8>>)>> {
        // The head: one exact lookup, and the answer unless it is too new.
        let snapshot = self.kv.snapshot()?;
        let Some(head) = snapshot.get(&head_key(key))? else {
            return Ok(None);
        };
        let (head_ts, payload) = decode_head(&head)?;
        if head_ts <= ts {
            return Ok(Some((head_ts, payload.map(<[u8]>::to_vec))));
        }
        let start = physical_key(key, ts);
        let end = physical_key(key, 0);
        // The first older version at or below `ts` is the visible one.
        match snapshot.range(&start, &end, true)?.next() {
            Some(item) => {
                let (k, v) = item.map_err(redb::Error::from)?;
                let (_, version_ts) = split_physical(k.value())?;
                Ok(Some((
                    version_ts,
                    decode_version(v.value())?.map(<[u8]>::to_vec),
                )))
            }
            None => Ok(None),
        }
    }

    /// [`Store::scan`] for a snapshot that needs every batch up to log
    /// position `lsn` (its [`Store::readable_lsn`]): a scan reads the data
    /// file only, so it first waits until the data file holds every one of
    /// them that writes inside `[start, end)` (none is the usual case: a
    /// scan of other rows than the last commits wrote does not wait).
    pub fn scan_at(&self, start: &[u8], end: Option<&[u8]>, ts: Timestamp, lsn: u64) -> ScanIter {
        if let Some(wal) = &self.durable {
            // Before the scan's snapshot is taken; only for unapplied
            // batches that write inside the range.
            let until = end.unwrap_or(META_PREFIX);
            if let Err(e) = wal.wait_applied_in(start, until, lsn) {
                return ScanIter {
                    snapshot: None,
                    end: Vec::new(),
                    inner: None,
                    ts,
                    decided: false,
                    error: Some(e),
                };
            }
        }
        self.scan(start, end, ts)
    }

    /// Iterates the live keys in `[start, end)` as of `ts`, in key order.
    /// `end = None` means to the end of the logical key space. Reads the
    /// data file as it is (what is applied): a snapshot scans through
    /// [`Store::scan_at`].
    pub fn scan(&self, start: &[u8], end: Option<&[u8]>, ts: Timestamp) -> ScanIter {
        let end = end
            .map(|e| e.to_vec())
            .unwrap_or_else(|| META_PREFIX.to_vec());
        let mut scan = ScanIter {
            snapshot: None,
            end,
            inner: None,
            ts,
            decided: false,
            error: None,
        };
        match self.kv.snapshot() {
            Ok(snapshot) => {
                scan.snapshot = Some(snapshot);
                scan.seek(start);
            }
            Err(e) => scan.error = Some(e),
        }
        scan
    }

    /// Removes versions no snapshot at or after `horizon` can read: for each
    /// key, every version older than the newest one at or below `horizon`,
    /// and that one too if it is a tombstone. Returns how many versions it
    /// removed. Readers at `horizon` or later see exactly what they saw
    /// before.
    pub fn gc(&self, horizon: Timestamp) -> Result<u64> {
        self.gc_range(horizon, &[], None)
    }

    /// [`Store::gc`] of the logical keys in `[start, end)` only (`None`:
    /// to the end of the data): what VACUUM of some tables walks, instead
    /// of the whole store.
    pub fn gc_range(&self, horizon: Timestamp, start: &[u8], end: Option<&[u8]>) -> Result<u64> {
        let end = match end {
            Some(e) if e < META_PREFIX => e,
            _ => META_PREFIX,
        };
        if start >= end {
            return Ok(0);
        }
        let mut removed = 0u64;
        // Garbage found in the snapshot, removed 4 096 at a time; a head is
        // kept with the value it had, to be removed only if unchanged.
        let mut garbage: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        // The logical key being walked, and the timestamp of its
        // visible-at-horizon version once passed (everything older is
        // garbage).
        // (One buffer for the key, reused: most keys have one version, and
        // an allocation per key was most of a collection's time.)
        let mut current: Vec<u8> = Vec::new();
        let mut walking = false;
        let mut kept: Option<Timestamp> = None;
        let snapshot = self.kv.snapshot()?;
        let mut range = snapshot.range(start, end, false)?;
        loop {
            // Each entry is read in place on its page (`Range::next_with`).
            let step = range.next_with(|pk, v| -> Result<()> {
                let e = decode_entry(pk, v)?;
                if !walking || current != e.key {
                    current.clear();
                    current.extend_from_slice(e.key);
                    walking = true;
                    kept = None;
                }
                if e.ts > horizon {
                    return Ok(());
                }
                let is_garbage = match kept {
                    // Strictly older: a commit may have moved the kept head
                    // to its timestamped slot since the snapshot was taken.
                    Some(k) => e.ts < k,
                    None => {
                        kept = Some(e.ts);
                        // The newest version at or below the horizon: a
                        // tombstone there hides nothing anyone can still
                        // read.
                        e.payload.is_none()
                    }
                };
                if is_garbage {
                    garbage.push((pk.to_vec(), e.head.then(|| v.to_vec())));
                }
                Ok(())
            });
            match step {
                None => break,
                Some(r) => r.map_err(redb::Error::from)??,
            }
            if garbage.len() >= 4096 {
                removed += self.remove_garbage(std::mem::take(&mut garbage))?;
            }
        }
        if !garbage.is_empty() {
            removed += self.remove_garbage(garbage)?;
        }
        debug!(horizon, removed, "garbage collected");
        Ok(removed)
    }

    /// Removes every entry, all versions, of the logical keys in
    /// `[start, end)` — a retired key space (a dropped table's or index's,
    /// which no snapshot can read any more: the caller checks) — in
    /// batches of 4 096 removals per write, so that commits applying
    /// meanwhile wait for one batch at most. Not logged, like
    /// [`Store::gc`]: after a crash the rest is removed by the next call.
    /// Returns how many entries it removed.
    pub fn purge_range(&self, start: &[u8], end: &[u8]) -> Result<u64> {
        let end = end.min(META_PREFIX);
        if start >= end {
            return Ok(0);
        }
        let mut removed = 0u64;
        loop {
            let batch: Vec<Vec<u8>> = {
                let snapshot = self.kv.snapshot()?;
                let mut keys = Vec::new();
                for item in snapshot.range(start, end, false)? {
                    let (pk, _) = item.map_err(redb::Error::from)?;
                    keys.push(pk.value().to_vec());
                    if keys.len() >= 4096 {
                        break;
                    }
                }
                keys
            };
            if batch.is_empty() {
                return Ok(removed);
            }
            let ops: Vec<(Vec<u8>, Option<Vec<u8>>)> =
                batch.into_iter().map(|k| (k, None)).collect();
            removed += ops.len() as u64;
            self.kv.write(|t| kv::write_ops(t, &ops))?;
        }
    }

    /// Removes older versions, and heads still equal to the value given
    /// (a commit may have replaced one since [`Store::gc`] read it). Not
    /// logged: garbage that comes back after a crash is collected again.
    fn remove_garbage(&self, garbage: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<u64> {
        self.kv.write(|t| {
            let mut removed = 0;
            for (pk, head) in &garbage {
                if let Some(expected) = head {
                    if kv::write_get(t, pk)?.as_ref() != Some(expected) {
                        continue;
                    }
                }
                kv::write_ops(t, &[(pk.clone(), None)])?;
                removed += 1;
            }
            Ok(removed)
        })
    }

    /// Reads an unversioned metadata value.
    pub fn meta(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let mut key = META_PREFIX.to_vec();
        key.extend_from_slice(name.as_bytes());
        self.kv.get(&key)
    }

    /// Size of the data file in bytes (0 for a temporary store).
    pub fn size_on_disk(&self) -> Result<u64> {
        self.kv.size_on_disk()
    }
}

/// Versions [`write_batch`] writes between two yields of its thread. The
/// log's applier writes a group of commits (up to 10 ms of them) in one
/// go, ~2 ms of CPU under pgbench's TPC-B; without yielding it held its
/// vCPU for all of it, and the connection threads whose wake-ups (a
/// client's message, an `fdatasync`'s end) landed there waited: gaps
/// with no transaction finishing recurred with every group, and p99 was
/// 2–2.5× PostgreSQL's. Yielding every 32 versions (a `sched_yield`, a
/// no-op when nothing else is runnable): p99 at 4 clients 2.4 ms against
/// 3.9, at 8 clients 3.9–4.0 against 5.1–5.5, throughput the same at 4
/// clients and 5% higher at 8 (bench/README.md, session 33). Only the
/// applier yields: a temporary store writes on the committing thread,
/// under the commit lock, and recovery runs before anyone else.
const YIELD_EVERY: usize = 32;

/// Writes a batch inside a write transaction: metadata operations as
/// they are, and each version as its key's new head, the head it replaces
/// moving to its timestamped slot (one B-tree insert returns the old
/// head). Versions of one key apply in the order given. Depends only on the
/// table's state: recovery replays logged batches with it ([`wal`]).
fn write_batch(
    table: &mut kv::WriteTable<'_>,
    ops: &[wal::Op],
    versions: &[wal::Version],
    replaced: &mut wal::Replaced,
    applier: bool,
) -> Result<()> {
    kv::write_ops(table, ops)?;
    for (i, (key, ts, value)) in versions.iter().enumerate() {
        if applier && i % YIELD_EVERY == YIELD_EVERY - 1 {
            std::thread::yield_now();
        }
        let (ts, value) = (*ts, value.as_deref());
        let hk = head_key(key);
        let Some(old) = kv::insert_returning(table, &hk, &head_value(ts, value))? else {
            continue;
        };
        let (old_ts, old_payload) = decode_head(&old)?;
        if let (Some(old_row), true) = (old_payload, old_ts < ts) {
            replaced.push((i, (key.len() + old_row.len()) as u64));
        }
        if old_ts < ts {
            kv::insert(
                table,
                &physical_key(key, old_ts),
                &version_value(old_payload),
            )?;
        } else if old_ts > ts {
            // An older version than the head (never written by the
            // transaction layer): the head stays, the version takes its slot.
            kv::insert(table, &hk, &old)?;
            kv::insert(table, &physical_key(key, ts), &version_value(value))?;
        }
    }
    Ok(())
}

/// One atomic group of changes: versions of logical keys and metadata.
#[derive(Default)]
pub struct Batch {
    /// Metadata writes.
    inner: Vec<wal::Op>,
    /// Versions, turned into head writes when applied (`write_batch`).
    versions: Vec<wal::Version>,
    len: usize,
}

impl Batch {
    /// Adds versions at `ts` (a `None` value is a tombstone).
    pub fn versions(&mut self, ts: Timestamp, writes: &[Write]) {
        self.versions.reserve(writes.len());
        for (key, value) in writes {
            self.versions.push((key.clone(), ts, value.clone()));
            self.len += 1;
        }
    }

    /// [`Batch::versions`] for writes the caller gives up: moved, not copied.
    pub fn versions_owned(&mut self, ts: Timestamp, writes: Vec<Write>) {
        self.versions.reserve(writes.len());
        self.len += writes.len();
        self.versions
            .extend(writes.into_iter().map(|(key, value)| (key, ts, value)));
    }

    /// Sets metadata `name` (unversioned).
    pub fn put_meta(&mut self, name: &str, value: Vec<u8>) {
        let mut key = META_PREFIX.to_vec();
        key.extend_from_slice(name.as_bytes());
        self.inner.push((key, Some(value)));
        self.len += 1;
    }

    fn put_meta_raw(&mut self, key: &[u8], value: Vec<u8>) {
        self.inner.push((key.to_vec(), Some(value)));
        self.len += 1;
    }

    /// Records `ts` as the last commit timestamp.
    pub fn set_last_commit_ts(&mut self, ts: Timestamp) {
        self.put_meta_raw(META_LAST_TS, ts.to_be_bytes().to_vec());
    }

    pub fn delete_meta(&mut self, name: &str) {
        let mut key = META_PREFIX.to_vec();
        key.extend_from_slice(name.as_bytes());
        self.inner.push((key, None));
        self.len += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

fn physical_key(key: &[u8], ts: Timestamp) -> Vec<u8> {
    let mut pk = Vec::with_capacity(key.len() + SUFFIX_LEN);
    pk.extend_from_slice(key);
    pk.push(VERSION_SEP);
    pk.extend_from_slice(&(!ts).to_be_bytes());
    pk
}

fn split_physical(pk: &[u8]) -> Result<(&[u8], Timestamp)> {
    if pk.len() < SUFFIX_LEN || pk[pk.len() - SUFFIX_LEN] != VERSION_SEP {
        return Err(Error::Corrupt("version suffix missing".into()));
    }
    let (key, suffix) = pk.split_at(pk.len() - SUFFIX_LEN);
    let mut ts = [0u8; 8];
    ts.copy_from_slice(&suffix[1..]);
    Ok((key, !u64::from_be_bytes(ts)))
}

/// A byte string `m` with `a < m <= b` near the middle of the keys
/// between `a` and `b`: the common prefix, then the midpoint of the next
/// eight bytes of each (zero-padded) read as big-endian numbers. `None`
/// if `a >= b` or the two are too close for that midpoint to be above `a`
/// (their eight bytes after the common prefix differ by one).
fn midpoint(a: &[u8], b: &[u8]) -> Option<Vec<u8>> {
    if a >= b {
        return None;
    }
    let p = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let word = |k: &[u8]| {
        let mut w = [0u8; 8];
        for (slot, x) in w.iter_mut().zip(k.iter().skip(p)) {
            *slot = *x;
        }
        u64::from_be_bytes(w)
    };
    let (x, y) = (word(a), word(b));
    let m = x + (y.saturating_sub(x)) / 2;
    let mut out = b[..p].to_vec();
    out.extend_from_slice(&m.to_be_bytes());
    (out.as_slice() > a && out.as_slice() <= b).then_some(out)
}

fn head_key(key: &[u8]) -> Vec<u8> {
    physical_key(key, HEAD_TS)
}

/// A head's value: its commit timestamp and the row, or a tombstone.
fn head_value(ts: Timestamp, payload: Option<&[u8]>) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + payload.map_or(0, <[u8]>::len));
    v.push(if payload.is_some() {
        TAG_HEAD_LIVE
    } else {
        TAG_HEAD_TOMBSTONE
    });
    v.extend_from_slice(&ts.to_be_bytes());
    if let Some(p) = payload {
        v.extend_from_slice(p);
    }
    v
}

/// An older version's value (its timestamp is in its key).
fn version_value(payload: Option<&[u8]>) -> Vec<u8> {
    match payload {
        Some(p) => {
            let mut v = Vec::with_capacity(p.len() + 1);
            v.push(TAG_LIVE);
            v.extend_from_slice(p);
            v
        }
        None => vec![TAG_TOMBSTONE],
    }
}

fn decode_head(v: &[u8]) -> Result<(Timestamp, Option<&[u8]>)> {
    let (tag, rest) = v
        .split_first()
        .ok_or_else(|| Error::Corrupt("empty head".into()))?;
    let ts = rest
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| Error::Corrupt("head without timestamp".into()))?;
    match *tag {
        TAG_HEAD_LIVE => Ok((ts, Some(&rest[8..]))),
        TAG_HEAD_TOMBSTONE => Ok((ts, None)),
        _ => Err(Error::Corrupt("bad head value".into())),
    }
}

fn decode_version(v: &[u8]) -> Result<Option<&[u8]>> {
    match v.first() {
        Some(&TAG_LIVE) => Ok(Some(&v[1..])),
        Some(&TAG_TOMBSTONE) => Ok(None),
        _ => Err(Error::Corrupt("bad version value".into())),
    }
}

/// One stored version, head or older.
struct Entry<'a> {
    key: &'a [u8],
    ts: Timestamp,
    payload: Option<&'a [u8]>,
    head: bool,
}

fn decode_entry<'a>(pk: &'a [u8], v: &'a [u8]) -> Result<Entry<'a>> {
    let (key, slot) = split_physical(pk)?;
    if slot == HEAD_TS {
        let (ts, payload) = decode_head(v)?;
        Ok(Entry {
            key,
            ts,
            payload,
            head: true,
        })
    } else {
        Ok(Entry {
            key,
            ts: slot,
            payload: decode_version(v)?,
            head: false,
        })
    }
}

/// Iterator of a snapshot scan: `(logical key, value)` of live keys.
pub struct ScanIter {
    /// The store as of the scan's start (`None` if it could not be taken:
    /// then `error` holds why).
    snapshot: Option<std::sync::Arc<kv::Snapshot>>,
    end: Vec<u8>,
    inner: Option<kv::KvRange>,
    ts: Timestamp,
    /// Whether the visible version of the logical key of the last head
    /// read was already found (returned, or a tombstone): its older
    /// versions, which follow it, are then skipped. A key's versions sort
    /// right after its head and before anything else (layout above), and
    /// every scan and seek starts at a logical key, so at its head: an
    /// older version always belongs to the last head read, and no key
    /// comparison is needed.
    decided: bool,
    /// An error to return from the next call of `next`.
    error: Option<Error>,
}

impl ScanIter {
    /// Continues the scan at the first live key `>= key` (which must not be
    /// before the keys already returned): a jump over a key range the
    /// caller does not need, such as the children of a parent row, without
    /// reading it. It reads the same snapshot as the rest of the scan.
    ///
    /// The jump moves the open B-tree range forward (`redb::Range::seek`,
    /// patched into the vendored redb): a target in the same leaf or under
    /// a nearby branch costs a local search, not a descent from the root.
    pub fn seek(&mut self, key: &[u8]) {
        self.decided = false;
        if key >= self.end.as_slice() {
            self.inner = None;
            return;
        }
        if let Some(inner) = self.inner.as_mut() {
            if let Err(e) = inner.seek(key) {
                self.inner = None;
                self.error = Some(redb::Error::from(e).into());
            }
            return;
        }
        if let Some(snapshot) = &self.snapshot {
            match snapshot.range(key, &self.end, false) {
                Ok(r) => self.inner = Some(r),
                Err(e) => self.error = Some(e),
            }
        }
    }
}

impl ScanIter {
    /// Hands the far half of what is left of this scan to a new iterator
    /// over the same store snapshot, so that two threads can read one
    /// range. `after` must be the last key this iterator returned: it then
    /// continues after it (past its older versions, not its children) up
    /// to a *cut*, and the new iterator reads from the cut to the end.
    ///
    /// ```text
    ///   [start ........ after | ........ cut | ................ end)
    ///    already returned       this one       the returned one
    /// ```
    ///
    /// The cut is the first stored logical key at or after the byte-wise
    /// midpoint of `after` and the range's last key: a whole logical key,
    /// so no key's versions straddle it. `None` (and this iterator
    /// unchanged) when what is left cannot be cut.
    pub fn split_off(&mut self, after: &[u8]) -> Option<ScanIter> {
        if self.error.is_some() || self.inner.is_none() {
            return None;
        }
        let snapshot = self.snapshot.clone()?;
        let logical = |r: Option<std::result::Result<_, redb::StorageError>>| -> Option<Vec<u8>> {
            let (pk, _): (redb::AccessGuard<'_, &[u8]>, redb::AccessGuard<'_, &[u8]>) = r?.ok()?;
            split_physical(pk.value()).ok().map(|(k, _)| k.to_vec())
        };
        let last = logical(snapshot.range(after, &self.end, false).ok()?.next_back())?;
        let mid = midpoint(after, &last)?;
        let cut = logical(snapshot.range(&mid, &self.end, false).ok()?.next())?;
        if cut.as_slice() <= after {
            return None;
        }
        let mut rest = ScanIter {
            snapshot: Some(snapshot),
            end: std::mem::replace(&mut self.end, cut.clone()),
            inner: None,
            ts: self.ts,
            decided: false,
            error: None,
        };
        rest.seek(&cut);
        let mut resume = after.to_vec();
        resume.push(VERSION_SEP + 1);
        // The open range still ends at the old end: start a new one that
        // ends at the cut.
        self.inner = None;
        self.seek(&resume);
        Some(rest)
    }

    /// The next live `(logical key, value)`, handed to `f` as slices of
    /// the store's pages (no copy); `None` at the end of the scan. The
    /// iterator's `next` is this with the two slices copied.
    pub fn next_with<R>(&mut self, f: impl FnOnce(&[u8], &[u8]) -> R) -> Option<Result<R>> {
        // A run that stops at its first live entry; a run can end at its
        // leaf's end having met only older versions and tombstones.
        let mut f = Some(f);
        loop {
            let mut out = None;
            let more = self.run_with(|k, v| {
                out = f.take().map(|f| f(k, v));
                false
            });
            match (more, out) {
                (Err(e), _) => return Some(Err(e)),
                (Ok(_), Some(r)) => return Some(Ok(r)),
                (Ok(true), None) => continue,
                (Ok(false), None) => return None,
            }
        }
    }

    /// The next live entries handed to `f` in order, as `next_with` hands
    /// one, until `f` returns false or the B-tree leaf being read is done
    /// (`redb::Range::run_with`, patched into the vendored redb): a scan
    /// that reads many entries in a row pays the step's preparation once
    /// per leaf, not once per entry. `Ok(true)`: more may follow (call
    /// again); `Ok(false)`: the scan is done. The entry `f` returned false
    /// for is consumed, as `next_with`'s is. On an error, the entries
    /// handed to `f` before it stay consumed.
    pub fn run_with(&mut self, mut f: impl FnMut(&[u8], &[u8]) -> bool) -> Result<bool> {
        if let Some(e) = self.error.take() {
            self.inner = None;
            return Err(e);
        }
        let Some(inner) = self.inner.as_mut() else {
            return Ok(false);
        };
        let (ts, decided) = (self.ts, &mut self.decided);
        let mut failed = None;
        let more = inner.run_with(|pk, v| {
            let e = match decode_entry(pk, v) {
                Ok(e) => e,
                Err(err) => {
                    failed = Some(err);
                    return false;
                }
            };
            if e.head {
                *decided = false; // a new logical key
            }
            if *decided || e.ts > ts {
                return true; // an older version, or one newer than the scan
            }
            *decided = true;
            match e.payload {
                Some(value) => f(e.key, value),
                None => true, // a tombstone
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        more.map_err(|e| redb::Error::from(e).into())
    }
}

impl Iterator for ScanIter {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_with(|k, v| (k.to_vec(), v.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Vec<u8> {
        let mut v = vec![0x20];
        v.extend_from_slice(s.as_bytes());
        v
    }

    fn scan(s: &Store, ts: Timestamp) -> Vec<(String, String)> {
        s.scan(&[0x20], None, ts)
            .map(|r| {
                let (k, v) = r.unwrap();
                (
                    String::from_utf8(k[1..].to_vec()).unwrap(),
                    String::from_utf8(v).unwrap(),
                )
            })
            .collect()
    }

    /// Up to `n` entries of `it` read with `run_with`, its runs stopped
    /// after every third entry and at the `n`th.
    fn take_by_runs(it: &mut ScanIter, n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut got = Vec::new();
        while got.len() < n {
            let more = it
                .run_with(|k, v| {
                    got.push((k.to_vec(), v.to_vec()));
                    got.len() < n && got.len() % 3 != 0
                })
                .unwrap();
            if !more {
                break;
            }
        }
        got
    }

    /// A scan read in runs returns what one read entry by entry does.
    fn scan_by_runs(s: &Store, ts: Timestamp) -> Vec<(String, String)> {
        take_by_runs(&mut s.scan(&[0x20], None, ts), usize::MAX)
            .into_iter()
            .map(|(k, v)| {
                (
                    String::from_utf8(k[1..].to_vec()).unwrap(),
                    String::from_utf8(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn snapshots_see_exactly_their_versions() {
        let s = Store::open_temporary().unwrap();
        s.commit(
            5,
            &[
                (k("a"), Some(b"a5".to_vec())),
                (k("c"), Some(b"c5".to_vec())),
            ],
        )
        .unwrap();
        s.commit(7, &[(k("b"), Some(b"b7".to_vec())), (k("c"), None)])
            .unwrap();
        s.commit(9, &[(k("a"), Some(b"a9".to_vec()))]).unwrap();
        assert_eq!(scan(&s, 4), vec![]);
        assert_eq!(
            scan(&s, 5),
            vec![("a".into(), "a5".into()), ("c".into(), "c5".into())]
        );
        assert_eq!(
            scan(&s, 8),
            vec![("a".into(), "a5".into()), ("b".into(), "b7".into())]
        );
        assert_eq!(
            scan(&s, 9),
            vec![("a".into(), "a9".into()), ("b".into(), "b7".into())]
        );
        assert_eq!(s.get(&k("a"), 6).unwrap(), Some(b"a5".to_vec()));
        assert_eq!(s.get(&k("c"), 7).unwrap(), None);
        assert_eq!(s.visible_ts(), 9);
    }

    #[test]
    fn midpoints_fall_between_their_keys() {
        assert_eq!(
            midpoint(&[1, 0], &[1, 10]),
            Some(vec![1, 5, 0, 0, 0, 0, 0, 0, 0])
        );
        let m = midpoint(&[0x20, 5], &[0x20, 9, 3]).unwrap();
        assert!(m.as_slice() > [0x20, 5].as_slice() && m.as_slice() <= [0x20, 9, 3].as_slice());
        // A prefix of the other key.
        let m = midpoint(&[7], &[7, 0x20, 1]).unwrap();
        assert!(m.as_slice() > [7].as_slice() && m.as_slice() <= [7, 0x20, 1].as_slice());
        // A prefix that the other extends by zeros only past eight bytes.
        let b = [[7u8].as_slice(), &[0; 9], &[1]].concat();
        let m = midpoint(&[7], &b).unwrap();
        assert!(m.as_slice() > [7].as_slice() && m.as_slice() <= b.as_slice());
        // Equal or reversed: no midpoint.
        assert_eq!(midpoint(&[3], &[3]), None);
        assert_eq!(midpoint(&[4], &[3]), None);
    }

    /// A scan split at any of its keys returns, across its two halves and
    /// in order, exactly what the whole scan returns: no key twice (older
    /// versions, children of the last key), none lost.
    #[test]
    fn a_split_scan_returns_what_the_whole_scan_returns() {
        let s = Store::open_temporary().unwrap();
        let key = |i: u32| {
            let mut v = vec![0x20];
            v.extend_from_slice(&(i * 7919 % 100_003).to_be_bytes());
            v
        };
        // Rows, some with a child key, some with several versions, some
        // deleted later.
        for ts in 1..=3u64 {
            let mut writes = Vec::new();
            for i in 0..300u32 {
                if ts == 1 || i % (ts as u32 + 1) == 0 {
                    writes.push((key(i), Some(format!("{i}@{ts}").into_bytes())));
                }
                if ts == 1 && i % 5 == 0 {
                    let mut child = key(i);
                    child.extend_from_slice(&[0x20, 1]);
                    writes.push((child, Some(b"child".to_vec())));
                }
                if ts == 3 && i % 11 == 0 {
                    writes.push((key(i), None));
                }
            }
            writes.sort();
            writes.dedup_by(|a, b| a.0 == b.0);
            s.commit(ts, &writes).unwrap();
        }
        for read_ts in [1, 2, 3] {
            let whole: Vec<(Vec<u8>, Vec<u8>)> =
                s.scan(&[0x20], None, read_ts).map(|r| r.unwrap()).collect();
            for after in [0, 1, 57, whole.len() / 2, whole.len() - 2] {
                let mut first = s.scan(&[0x20], None, read_ts);
                let mut got: Vec<(Vec<u8>, Vec<u8>)> =
                    (&mut first).take(after + 1).map(|r| r.unwrap()).collect();
                let last = got.last().unwrap().0.clone();
                let second = first.split_off(&last).expect("a cut");
                got.extend(first.map(|r| r.unwrap()));
                let tail: Vec<_> = second.map(|r| r.unwrap()).collect();
                assert!(!tail.is_empty(), "the far half is not empty");
                got.extend(tail);
                assert_eq!(got, whole, "read_ts {read_ts}, split after row {after}");
            }
            // Nothing left to cut after the last key.
            let mut it = s.scan(&[0x20], None, read_ts);
            let all: Vec<_> = (&mut it).map(|r| r.unwrap()).collect();
            assert!(it.split_off(&all.last().unwrap().0).is_none());
        }
    }

    /// `ScanIter::seek` moves the open B-tree range forward (the vendored
    /// redb's `Range::seek`, which searches again from the current leaf or
    /// a branch on the path): wherever it jumps to, it must land where a
    /// new scan from the target starts. Row trees of 0–40 children with
    /// 100-byte values give a tree of several levels, so jumps stay in a
    /// leaf, cross to a sibling leaf, or climb one or more branches; some
    /// rows have older versions and some are deleted.
    #[test]
    fn seek_lands_where_a_new_scan_starts() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};

        let s = Store::open_temporary().unwrap();
        let row = |i: u32, child: Option<u32>| {
            let mut k = vec![0x20, 1, 0x10];
            k.extend_from_slice(&i.to_be_bytes());
            if let Some(c) = child {
                k.extend_from_slice(&[0x20, 2, 0x10]);
                k.extend_from_slice(&c.to_be_bytes());
            }
            k
        };
        for ts in 1..=3u64 {
            let mut writes = Vec::new();
            for i in 0..1500u32 {
                let value = Some(vec![b'a' + (i % 26) as u8; 100]);
                if ts == 1 {
                    writes.push((row(i, None), value.clone()));
                    for c in 0..(i * 7) % 41 {
                        writes.push((row(i, Some(c)), value.clone()));
                    }
                } else if i % (ts as u32 + 2) == 0 {
                    writes.push((row(i, None), if ts == 3 { None } else { value }));
                }
            }
            s.commit(ts, &writes).unwrap();
        }
        let keys: Vec<Vec<u8>> = s.scan(&[0x20], None, 1).map(|r| r.unwrap().0).collect();
        assert!(keys.len() > 20_000, "{} keys", keys.len());

        let mut runner = TestRunner::new(Config {
            cases: 48,
            ..Config::default()
        });
        let jumps = proptest::collection::vec((0usize..400, 0u8..3, 1u64..=120), 1..60);
        runner
            .run(&jumps, |jumps| {
                for read_ts in [1, 2, 3] {
                    let mut it = s.scan(&[0x20], None, read_ts);
                    let mut at = 0;
                    for &(jump, how, steps) in &jumps {
                        let Some(base) = keys.get(at + jump) else {
                            break;
                        };
                        let target = match how {
                            0 => base.clone(),
                            1 => {
                                spindle_keys::key::prefix_end(base).unwrap_or_else(|| base.clone())
                            }
                            _ => [base.as_slice(), &[0x00]].concat(),
                        };
                        it.seek(&target);
                        let want: Vec<_> = s
                            .scan(&target, None, read_ts)
                            .take(steps as usize)
                            .map(|r| r.unwrap())
                            .collect();
                        // Read on one entry at a time or in runs, alike.
                        let got: Vec<_> = if jump % 2 == 0 {
                            (&mut it).take(steps as usize).map(|r| r.unwrap()).collect()
                        } else {
                            take_by_runs(&mut it, steps as usize)
                        };
                        prop_assert_eq!(&got, &want, "seek to {:?} at ts {}", target, read_ts);
                        match got.last() {
                            Some((k, _)) => at = keys.partition_point(|x| x <= k),
                            None => break,
                        }
                    }
                }
                Ok(())
            })
            .unwrap();
    }

    /// A bounded scan stops exactly at its end wherever the end falls: on a
    /// key, between two keys, at or after a leaf's last key, past the last
    /// key; also after a seek. (Vendored redb tests the end once per leaf
    /// whose last key is before it: vendor/redb/SPINDLE-PATCH.md, change 3.)
    #[test]
    fn a_bounded_scan_ends_at_its_end() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};

        let s = Store::open_temporary().unwrap();
        // Even numbers are keys, odd ones fall between two keys.
        let key = |n: u32| {
            let mut k = vec![0x20, 1, 0x10];
            k.extend_from_slice(&n.to_be_bytes());
            k
        };
        let writes: Vec<_> = (0..20_000u32)
            .map(|i| (key(i * 2), Some(vec![b'a' + (i % 26) as u8; 100])))
            .collect();
        s.commit(1, &writes).unwrap();
        let keys: Vec<Vec<u8>> = writes.iter().map(|(k, _)| k.clone()).collect();

        let mut runner = TestRunner::new(Config {
            cases: 64,
            ..Config::default()
        });
        let cases = (
            0u32..40_010,
            0u32..40_010,
            proptest::option::of(0u32..40_010),
        );
        runner
            .run(&cases, |(a, b, seek)| {
                let (start, end) = (key(a), key(b));
                let mut it = s.scan(&start, Some(&end), 1);
                let mut from = start.clone();
                // A seek target is never before the scan's start (`seek`'s
                // contract).
                if let Some(c) = seek {
                    from = key(a.max(c));
                    it.seek(&from);
                }
                // Read entry by entry, or in runs (which test the end in
                // their own loop).
                let got: Vec<Vec<u8>> = if a % 2 == 0 {
                    it.map(|r| r.unwrap().0).collect()
                } else {
                    take_by_runs(&mut it, usize::MAX)
                        .into_iter()
                        .map(|(k, _)| k)
                        .collect()
                };
                let want: Vec<Vec<u8>> = keys
                    .iter()
                    .filter(|k| **k >= from && **k < end)
                    .cloned()
                    .collect();
                prop_assert_eq!(got, want, "[{}, {}) after a seek to {:?}", a, b, seek);
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn versions_of_a_parent_sort_before_its_children() {
        let s = Store::open_temporary().unwrap();
        let parent = k("p");
        let mut child = parent.clone();
        child.extend_from_slice(&[0x20, b'c']);
        s.commit(1, &[(child.clone(), Some(b"child".to_vec()))])
            .unwrap();
        s.commit(2, &[(parent.clone(), Some(b"parent".to_vec()))])
            .unwrap();
        let keys: Vec<Vec<u8>> = s.scan(&parent, None, 2).map(|r| r.unwrap().0).collect();
        assert_eq!(keys, vec![parent, child]);
    }

    #[test]
    fn gc_keeps_what_snapshots_at_the_horizon_can_read() {
        let s = Store::open_temporary().unwrap();
        s.commit(
            1,
            &[
                (k("a"), Some(b"a1".to_vec())),
                (k("b"), Some(b"b1".to_vec())),
            ],
        )
        .unwrap();
        s.commit(2, &[(k("a"), Some(b"a2".to_vec())), (k("b"), None)])
            .unwrap();
        s.commit(3, &[(k("a"), Some(b"a3".to_vec()))]).unwrap();
        let before: Vec<_> = (2..=3).map(|ts| scan(&s, ts)).collect();
        // Horizon 2: a1 and b1 are unreadable; b's tombstone at 2 goes too.
        assert_eq!(s.gc(2).unwrap(), 3);
        let after: Vec<_> = (2..=3).map(|ts| scan(&s, ts)).collect();
        assert_eq!(before, after);
        assert_eq!(s.get(&k("a"), 2).unwrap(), Some(b"a2".to_vec()));
        assert_eq!(s.gc(2).unwrap(), 0);
        assert_eq!(s.gc(3).unwrap(), 1);
        assert_eq!(scan(&s, 3), vec![("a".into(), "a3".into())]);
    }

    #[test]
    fn purge_removes_every_version_of_a_range_and_nothing_else() {
        let s = Store::open_temporary().unwrap();
        for ts in 1..=3 {
            let v = format!("{ts}").into_bytes();
            let mut writes = vec![(k("a"), Some(v.clone())), (k("c"), Some(v.clone()))];
            // Enough keys for several batches of removals.
            for i in 0..5000u32 {
                writes.push((k(&format!("b{i:05}")), Some(v.clone())));
            }
            s.commit(ts, &writes).unwrap();
        }
        // Three versions of each b-key: its head and two older ones.
        assert_eq!(s.purge_range(&k("b"), &k("c")).unwrap(), 15_000);
        assert_eq!(s.purge_range(&k("b"), &k("c")).unwrap(), 0);
        assert_eq!(
            scan(&s, 3),
            vec![("a".into(), "3".into()), ("c".into(), "3".into())]
        );
        assert_eq!(physical(&s, &k("a")).len(), 3);
        assert_eq!(physical(&s, &k("c")).len(), 3);
        // Never into the metadata.
        assert_eq!(s.purge_range(&k("d"), &[0xFF; 8]).unwrap(), 0);
        assert_eq!(s.visible_ts(), 3);
    }

    #[test]
    fn gc_of_a_range_leaves_the_rest() {
        let s = Store::open_temporary().unwrap();
        for ts in 1..=3 {
            let v = format!("{ts}").into_bytes();
            s.commit(
                ts,
                &[
                    (k("a"), Some(v.clone())),
                    (k("b"), Some(v.clone())),
                    (k("c"), Some(v)),
                ],
            )
            .unwrap();
        }
        // Only b's two old versions: a's and c's stay.
        assert_eq!(s.gc_range(3, &k("b"), Some(&k("c"))).unwrap(), 2);
        assert_eq!(physical(&s, &k("a")).len(), 3);
        assert_eq!(physical(&s, &k("b")).len(), 1);
        assert_eq!(physical(&s, &k("c")).len(), 3);
        assert_eq!(s.gc_range(3, &k("c"), Some(&k("b"))).unwrap(), 0);
        // To the end of the data (not into the metadata).
        assert_eq!(s.gc_range(3, &k("b"), None).unwrap(), 2);
        assert_eq!(s.gc(3).unwrap(), 2);
        assert_eq!(s.get(&k("a"), 3).unwrap(), Some(b"3".to_vec()));
        assert_eq!(s.visible_ts(), 3);
    }

    #[test]
    fn commits_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            s.commit(3, &[(k("x"), Some(b"1".to_vec()))]).unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.visible_ts(), 3);
        assert_eq!(s.get(&k("x"), 3).unwrap(), Some(b"1".to_vec()));
    }

    /// The physical entries of logical key `key`: (slot timestamp, value).
    fn physical(s: &Store, key: &[u8]) -> Vec<(Timestamp, Vec<u8>)> {
        let mut start = key.to_vec();
        start.push(VERSION_SEP);
        let end = prefix_end(&start).unwrap();
        s.kv.snapshot()
            .unwrap()
            .range(&start, &end, false)
            .unwrap()
            .map(|r| {
                let (pk, v) = r.unwrap();
                (split_physical(pk.value()).unwrap().1, v.value().to_vec())
            })
            .collect()
    }

    #[test]
    fn the_head_is_the_newest_version_and_older_snapshots_read_past_it() {
        let s = Store::open_temporary().unwrap();
        s.commit(1, &[(k("a"), Some(b"1".to_vec()))]).unwrap();
        s.commit(3, &[(k("a"), Some(b"3".to_vec()))]).unwrap();
        s.commit(5, &[(k("a"), None)]).unwrap();
        s.commit(7, &[(k("a"), Some(b"7".to_vec()))]).unwrap();
        let expect = |ts| match ts {
            0 => None,
            1 | 2 => Some(b"1".to_vec()),
            3 | 4 => Some(b"3".to_vec()),
            5 | 6 => None,
            _ => Some(b"7".to_vec()),
        };
        for ts in 0..9 {
            assert_eq!(s.get(&k("a"), ts).unwrap(), expect(ts), "at {ts}");
            let scanned = scan(&s, ts).into_iter().map(|(_, v)| v.into_bytes()).next();
            assert_eq!(scanned, expect(ts), "scan at {ts}");
        }
        // One entry per version: the head (ts 7) first, then 5, 3, 1.
        let slots: Vec<Timestamp> = physical(&s, &k("a")).iter().map(|e| e.0).collect();
        assert_eq!(slots, vec![HEAD_TS, 5, 3, 1]);
        assert_eq!(physical(&s, &k("a"))[0].1, head_value(7, Some(b"7")));
    }

    #[test]
    fn applying_a_version_again_or_an_older_one_keeps_the_newest_in_the_head() {
        let s = Store::open_temporary().unwrap();
        s.commit(5, &[(k("a"), Some(b"5".to_vec()))]).unwrap();
        // Recovery may apply a decided commit again.
        s.commit(5, &[(k("a"), Some(b"5".to_vec()))]).unwrap();
        assert_eq!(physical(&s, &k("a")).len(), 1);
        s.commit(3, &[(k("a"), Some(b"3".to_vec()))]).unwrap();
        assert_eq!(s.get(&k("a"), 4).unwrap(), Some(b"3".to_vec()));
        assert_eq!(s.get(&k("a"), 9).unwrap(), Some(b"5".to_vec()));
        // One key written twice in one batch: the later timestamp wins.
        let mut b = Batch::default();
        b.versions(8, &[(k("b"), Some(b"8".to_vec()))]);
        b.versions(9, &[(k("b"), None)]);
        s.apply(b).unwrap();
        assert_eq!(s.get(&k("b"), 8).unwrap(), Some(b"8".to_vec()));
        assert_eq!(s.get(&k("b"), 9).unwrap(), None);
    }

    /// Every physical entry of the store.
    fn entries(s: &Store) -> Vec<(Vec<u8>, Vec<u8>)> {
        s.kv.entries()
    }

    /// The log holds versions, not the physical writes they resolved to:
    /// a store recovered from its log (its data file copied as a crash
    /// leaves it, at its last durable commit) holds exactly the entries of
    /// the store that applied them — heads moved to their slots,
    /// tombstones, a version applied twice, one older than its head, one
    /// key written twice in a batch, metadata.
    #[test]
    fn a_store_recovered_from_its_log_holds_the_same_entries() {
        let dir = tempfile::tempdir().unwrap();
        let copy = tempfile::tempdir().unwrap();
        let expect = {
            let s = Store::open(dir.path()).unwrap();
            for i in 1..=40u64 {
                let value = (i % 7 != 0).then(|| i.to_string().into_bytes());
                s.commit(i * 2, &[(k(&(i % 5).to_string()), value)])
                    .unwrap();
            }
            s.commit(80, &[(k("4"), Some(b"again".to_vec()))]).unwrap();
            s.commit(3, &[(k("1"), Some(b"older".to_vec()))]).unwrap();
            let mut b = Batch::default();
            b.versions(90, &[(k("x"), Some(b"90".to_vec()))]);
            b.versions(91, &[(k("x"), None)]);
            b.put_meta("m", b"meta".to_vec());
            b.set_last_commit_ts(91);
            s.apply(b).unwrap();
            let expect = entries(&s);
            for f in [kv::DATA_FILE, "wal"] {
                std::fs::copy(dir.path().join(f), copy.path().join(f)).unwrap();
            }
            std::mem::forget(s);
            expect
        };
        {
            // The copied data file lacks the commits: recovery has work.
            let kv = kv::Kv::open(copy.path()).unwrap();
            assert_eq!(kv.get(META_WAL_LSN).unwrap(), None);
        }
        let s = Store::open(copy.path()).unwrap();
        assert_eq!(entries(&s), expect);
        assert_eq!(s.visible_ts(), 91);
        assert_eq!(s.get(&k("1"), 4).unwrap(), Some(b"older".to_vec()));
    }

    #[test]
    fn a_durable_commit_is_readable_once_applied() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let pause = s.pause_applier().unwrap().unwrap();
        let mut b = Batch::default();
        b.versions(5, &[(k("a"), Some(b"a5".to_vec()))]);
        b.set_last_commit_ts(5);
        s.apply_unsynced(b).unwrap();
        // Durable (and published) with the applier held: the batch is not
        // in the data file yet, and a reader waits for it.
        s.flush_durable().unwrap();
        s.publish(5);
        assert_eq!(s.get(&k("a"), 5).unwrap(), None);
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                s.wait_readable().unwrap();
                s.get(&k("a"), s.visible_ts()).unwrap()
            });
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(!reader.is_finished(), "read before the apply");
            drop(pause);
            assert_eq!(reader.join().unwrap(), Some(b"a5".to_vec()));
        });
        // Reopened: the record was durable.
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.get(&k("a"), 5).unwrap(), Some(b"a5".to_vec()));
    }

    /// A point read of a snapshot (`get_at`) reads a published commit's
    /// versions while its batch is still out of the data file (the applier
    /// held) — rows, tombstones, and older versions by timestamp — and a
    /// scan (`scan_at`) waits for the apply if the batch writes inside its
    /// range, and only then. A batch too large to index makes point reads
    /// of keys in its span wait too, and scans of ranges that meet it.
    #[test]
    fn point_reads_see_unapplied_batches_and_scans_wait_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let put = |key: &str, v: &str| (k(key), Some(v.as_bytes().to_vec()));
        s.commit(5, &[put("a", "a5"), put("b", "b5")]).unwrap();
        let pause = s.pause_applier().unwrap().unwrap();
        let mut b = Batch::default();
        b.versions(7, &[put("a", "a7"), (k("b"), None), put("c", "c7")]);
        b.set_last_commit_ts(7);
        s.apply_unsynced(b).unwrap();
        s.flush_durable().unwrap();
        s.publish(7);
        let lsn = s.readable_lsn();
        // The data file does not have it yet.
        assert_eq!(s.get(&k("a"), 7).unwrap(), Some(b"a5".to_vec()));
        let at = |key: &str, ts| s.get_at(&k(key), ts, lsn).unwrap();
        assert_eq!(at("a", 7), Some(b"a7".to_vec()));
        assert_eq!(at("a", 6), Some(b"a5".to_vec()));
        assert_eq!(at("b", 7), None);
        assert_eq!(at("b", 5), Some(b"b5".to_vec()));
        assert_eq!(at("c", 7), Some(b"c7".to_vec()));
        assert_eq!(at("c", 6), None);
        assert_eq!(at("d", 7), None);
        // A scan of a range the unapplied batch writes nothing in (its
        // keys are a, b and c) reads the data file at once.
        let scan = |start: &str, end: Option<&str>, ts| {
            let end = end.map(k);
            s.scan_at(&k(start), end.as_deref(), ts, lsn)
                .map(|r| r.unwrap().0)
                .collect::<Vec<_>>()
        };
        // (On threads: a scan that waits with the applier held would
        // never return.)
        std::thread::scope(|scope| {
            let quick = scope.spawn(|| {
                [
                    scan("a0", Some("b"), 7),
                    scan("c0", None, 7),
                    scan("b", Some("b"), 7),
                ]
            });
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !quick.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let quick_blocked = !quick.is_finished();
            // A range holding one of its keys waits for the apply.
            let scanner = scope.spawn(|| scan("b", Some("b0"), 7));
            std::thread::sleep(std::time::Duration::from_millis(100));
            let blocked = !scanner.is_finished();
            drop(pause);
            assert!(!quick_blocked, "scans of other ranges waited for the apply");
            assert_eq!(
                quick.join().unwrap(),
                [(); 3].map(|_| Vec::<Vec<u8>>::new())
            );
            assert!(blocked, "a scan read before the apply");
            assert_eq!(scanner.join().unwrap(), Vec::<Vec<u8>>::new());
        });
        assert_eq!(scan("0", None, 7), vec![k("a"), k("c")]);
        // Applied: the index is empty, the data file answers.
        assert_eq!(s.get_at(&k("a"), 7, lsn).unwrap(), Some(b"a7".to_vec()));

        // The range's ends: its start is in it, its end is not. Each case
        // an unapplied commit of key "e" at a new timestamp.
        // (Bounds inside a version suffix, `e 00`, are not logical keys;
        // the scan's bounds are physical, and so is the wait's test.)
        for (ts, start, end, waits, rows) in [
            (11, "e", Some("e0"), true, 1),
            (12, "d", Some("e"), false, 0),
            (13, "d", Some("e\0"), false, 0),
            (14, "e\0", None, true, 1),
            (15, "d", None, true, 1),
            (16, "e0", None, false, 0),
            (17, "e0", Some("d"), false, 0),
            // Deeper inside e's versions than a version key: e's versions
            // from `e 00 00…` up are still at or above this start.
            (18, "e\0\0\0\0\0\0\0\0\0\0\0", None, true, 1),
            (19, "e\0\x01", None, true, 1),
            (20, "e\x01\0\0\0\0\0\0\0\0\0\0", None, false, 0),
        ] {
            let pause = s.pause_applier().unwrap().unwrap();
            let mut b = Batch::default();
            b.versions(ts, &[put("e", "e")]);
            b.set_last_commit_ts(ts);
            s.apply_unsynced(b).unwrap();
            s.flush_durable().unwrap();
            s.publish(ts);
            let lsn = s.readable_lsn();
            std::thread::scope(|scope| {
                let scanner = scope.spawn(|| {
                    let end = end.map(k);
                    s.scan_at(&k(start), end.as_deref(), ts, lsn).count()
                });
                // A scan that waits is given 100 ms to show it; one that
                // does not, up to 5 s to finish.
                let limit = std::time::Duration::from_millis(if waits { 100 } else { 5000 });
                let deadline = std::time::Instant::now() + limit;
                while !scanner.is_finished() && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                let blocked = !scanner.is_finished();
                drop(pause);
                assert_eq!(
                    blocked, waits,
                    "scan of [{start}, {end:?}) after a commit of e"
                );
                assert_eq!(scanner.join().unwrap(), rows, "[{start}, {end:?}) at {ts}");
            });
        }

        // A batch of more versions than are indexed: point reads of keys
        // in its key span wait, and scans of ranges that meet the span;
        // others do not. (The last commit of "e" may still be unapplied:
        // applied first, or the scan of [a, m) below would wait for it.)
        s.wait_applied().unwrap();
        let pause = s.pause_applier().unwrap().unwrap();
        let many: Vec<Write> = (0..=wal::INDEX_VERSIONS)
            .map(|i| put(&format!("m{i:05}"), "m"))
            .collect();
        let mut b = Batch::default();
        b.versions(39, &many);
        s.apply_unsynced(b).unwrap();
        s.flush_durable().unwrap();
        s.publish(39);
        let lsn = s.readable_lsn();
        assert_eq!(s.get_at(&k("a"), 39, lsn).unwrap(), Some(b"a7".to_vec()));
        assert_eq!(s.get_at(&k("z"), 39, lsn).unwrap(), None);
        let scan = |start: &str, end: &str| {
            s.scan_at(&k(start), Some(&k(end)), 39, lsn)
                .map(|r| r.unwrap().0)
                .collect::<Vec<_>>()
        };
        assert_eq!(scan("a", "m"), vec![k("a"), k("c"), k("e")]);
        assert_eq!(scan("m99", "z"), Vec::<Vec<u8>>::new());
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| s.get_at(&k("m00007x"), 39, lsn).unwrap());
            // Inside the span, though the batch has no key in the range.
            let scanner = scope.spawn(|| scan("m00007x", "m00008"));
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(!reader.is_finished(), "read past an unindexed batch");
            assert!(!scanner.is_finished(), "scan past an unindexed batch");
            drop(pause);
            assert_eq!(reader.join().unwrap(), None);
            assert_eq!(scanner.join().unwrap(), Vec::<Vec<u8>>::new());
        });
        assert_eq!(
            s.get_at(&k("m00007"), 39, lsn).unwrap(),
            Some(b"m".to_vec())
        );
    }

    /// A snapshot waits only for the batches of published commits: a
    /// commit whose record is appended but not yet durable (its committer
    /// still flushing, its batch not applied) is not published, and a
    /// reader of what is published does not wait for its apply. (Readers
    /// used to wait for every record appended before the publication.)
    #[test]
    fn a_snapshot_does_not_wait_for_a_commit_still_flushing() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let mut a = Batch::default();
        a.versions(5, &[(k("a"), Some(b"a5".to_vec()))]);
        s.apply_unsynced(a).unwrap();
        s.flush_durable().unwrap();
        s.wait_applied().unwrap();
        let pause = s.pause_applier().unwrap().unwrap();
        // Commit 7 is appended, neither durable nor applied (the applier
        // is held); commit 5 is published.
        let mut b = Batch::default();
        b.versions(7, &[(k("b"), Some(b"b7".to_vec()))]);
        s.apply_unsynced(b).unwrap();
        s.publish(5);
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                s.wait_readable().unwrap();
                (s.get(&k("a"), 5).unwrap(), s.get(&k("b"), 5).unwrap())
            });
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !reader.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let finished = reader.is_finished();
            drop(pause);
            assert!(finished, "the snapshot waited for an unpublished commit");
            assert_eq!(reader.join().unwrap(), (Some(b"a5".to_vec()), None));
        });
        // Once durable and published, commit 7 is waited for and read.
        s.flush_durable().unwrap();
        s.publish(7);
        s.wait_readable().unwrap();
        assert_eq!(s.get(&k("b"), 7).unwrap(), Some(b"b7".to_vec()));
    }

    /// The observer of replaced rows hears, once each batch is applied,
    /// of every version that replaced a live row — a newer row or a
    /// tombstone: its key and the replaced row's live bytes — and of
    /// nothing else (a new key, a put over a tombstone, a tombstone over a
    /// tombstone), on disk (the log's applier) and in memory alike.
    #[test]
    fn the_replaced_observer_hears_of_each_replaced_live_row() {
        type Heard = std::sync::Arc<std::sync::Mutex<Vec<(Vec<u8>, u64)>>>;
        let check = |s: &Store| {
            let heard: Heard = Default::default();
            let h = heard.clone();
            s.set_replaced_observer(std::sync::Arc::new(move |it| {
                h.lock().unwrap().extend(it.map(|(k, b)| (k.to_vec(), b)));
            }));
            let put = |key: &str, v: &str| (k(key), Some(v.as_bytes().to_vec()));
            s.commit(1, &[put("a", "1234"), put("b", "12")]).unwrap();
            s.commit(2, &[put("a", "12345678"), (k("b"), None)])
                .unwrap();
            s.commit(3, &[put("b", "123"), put("a", "1")]).unwrap();
            s.commit(4, &[(k("c"), None)]).unwrap();
            s.commit(5, &[(k("b"), None)]).unwrap();
            s.commit(6, &[(k("b"), None)]).unwrap();
            s.wait_applied().unwrap();
            let want = vec![
                (k("a"), (k("a").len() + 4) as u64),
                (k("b"), (k("b").len() + 2) as u64),
                (k("a"), (k("a").len() + 8) as u64),
                (k("b"), (k("b").len() + 3) as u64),
            ];
            assert_eq!(*heard.lock().unwrap(), want);
        };
        check(&Store::open_temporary().unwrap());
        let dir = tempfile::tempdir().unwrap();
        check(&Store::open(dir.path()).unwrap());
    }

    #[test]
    fn a_directory_of_the_sled_era_is_refused_not_opened_empty() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("conf"), b"segment_size: 524288").unwrap();
        std::fs::write(dir.path().join("db"), b"old").unwrap();
        match Store::open(dir.path()) {
            Err(e @ Error::OldFormat(_)) => assert!(e.to_string().contains("data.redb"), "{e}"),
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("an old directory was opened"),
        }
        assert!(!dir.path().join(kv::DATA_FILE).exists());
    }

    mod model {
        use super::*;
        use proptest::prelude::*;
        use std::collections::BTreeMap;

        #[derive(Debug, Clone)]
        enum Op {
            /// Commit writes to keys (index, value or tombstone).
            Commit(Vec<(u8, Option<u8>)>),
            Gc,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => prop::collection::vec((0u8..5, prop::option::of(0u8..4)), 1..4).prop_map(Op::Commit),
                1 => Just(Op::Gc),
            ]
        }

        /// What a snapshot at `ts` reads, from the history of commits.
        fn model_read(
            history: &BTreeMap<(u8, Timestamp), Option<u8>>,
            key: u8,
            ts: Timestamp,
        ) -> Option<u8> {
            history
                .range((key, 0)..=(key, ts))
                .next_back()
                .and_then(|(_, v)| *v)
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

            /// Point reads of snapshots (`get_at`) on a durable store equal
            /// the model at every timestamp, whatever part of the commits
            /// the applier has written: it is held (`hold`) and let go at
            /// random between commits, so reads meet versions in the log's
            /// index, in the data file, and split between the two.
            #[test]
            fn point_reads_match_the_model_wherever_the_applier_is(
                steps in prop::collection::vec(
                    (prop::collection::vec((0u8..5, prop::option::of(0u8..4)), 1..4), any::<bool>()),
                    1..25,
                )
            ) {
                let dir = tempfile::tempdir().unwrap();
                let s = Store::open(dir.path()).unwrap();
                let mut history: BTreeMap<(u8, Timestamp), Option<u8>> = BTreeMap::new();
                let mut held = None;
                for (ts, (writes, hold)) in (1..).zip(&steps) {
                    if *hold && held.is_none() {
                        held = s.pause_applier().unwrap();
                    } else if !*hold {
                        held = None;
                    }
                    let mut w: BTreeMap<u8, Option<u8>> = BTreeMap::new();
                    for (key, v) in writes {
                        w.insert(*key, *v);
                    }
                    let writes: Vec<Write> = w
                        .iter()
                        .map(|(key, v)| (k(&key.to_string()), v.map(|v| vec![v])))
                        .collect();
                    let mut b = Batch::default();
                    b.versions(ts, &writes);
                    b.set_last_commit_ts(ts);
                    s.apply_unsynced(b).unwrap();
                    s.flush_durable().unwrap();
                    s.publish(ts);
                    for (key, v) in w {
                        history.insert((key, ts), v);
                    }
                    let lsn = s.readable_lsn();
                    for read_ts in 0..=ts {
                        for key in 0u8..5 {
                            let got = s.get_at(&k(&key.to_string()), read_ts, lsn).unwrap();
                            prop_assert_eq!(
                                got,
                                model_read(&history, key, read_ts).map(|v| vec![v]),
                                "key {} at {}", key, read_ts
                            );
                        }
                    }
                }
                drop(held);
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

            /// Reads and scans at every timestamp at or after the GC horizon
            /// equal a model that keeps every version.
            #[test]
            fn store_matches_a_model_of_versions(ops in prop::collection::vec(op(), 1..30)) {
                let s = Store::open_temporary().unwrap();
                let mut history: BTreeMap<(u8, Timestamp), Option<u8>> = BTreeMap::new();
                let mut ts = 0;
                let mut horizon = 0;
                for op in &ops {
                    match op {
                        Op::Commit(writes) => {
                            ts += 1;
                            let mut w: BTreeMap<u8, Option<u8>> = BTreeMap::new();
                            for (key, v) in writes {
                                w.insert(*key, *v);
                            }
                            let writes: Vec<Write> = w
                                .iter()
                                .map(|(key, v)| (k(&key.to_string()), v.map(|v| vec![v])))
                                .collect();
                            s.commit(ts, &writes).unwrap();
                            for (key, v) in w {
                                history.insert((key, ts), v);
                            }
                        }
                        Op::Gc => {
                            horizon = ts.saturating_sub(2);
                            s.gc(horizon).unwrap();
                        }
                    }
                    for at in horizon..=ts + 1 {
                        let mut expect = Vec::new();
                        for key in 0u8..5 {
                            let m = model_read(&history, key, at);
                            prop_assert_eq!(s.get(&k(&key.to_string()), at).unwrap(), m.map(|v| vec![v]));
                            if let Some(v) = m {
                                expect.push((key.to_string(), String::from_utf8(vec![v]).unwrap()));
                            }
                        }
                        prop_assert_eq!(scan_by_runs(&s, at), expect.clone());
                        prop_assert_eq!(scan(&s, at), expect);
                    }
                }
            }
        }
    }
}
