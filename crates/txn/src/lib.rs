//! # spindle-txn: transactions over the multi-version store
//!
//! A [`Transaction`] reads one snapshot (the store's visible timestamp when
//! it began) and buffers its writes in memory. Reads see the snapshot with
//! the transaction's own writes laid over it. Nothing reaches the store
//! until [`Transaction::commit`], which writes the whole buffer — rows and,
//! if DDL ran, the catalog — atomically and durably at a new commit
//! timestamp.
//!
//! ```text
//!   begin ──► read_ts = store.visible_ts(), read_lsn = store.readable_lsn()
//!   reads ──► write buffer ∪ store@read_ts (point: data file ∪ unapplied log batches;
//!             scan: waits until the data file holds read_lsn)
//!   writes ─► write buffer (key → Some(value) | None, in key order: buffer.rs)
//!   commit ─► commit lock: validate ─► ts = next_ts() ─► log write set, ts in flight ─► unlock
//!          ─► apply: one split: one batch            ┐ concurrently with other
//!                    several: two-phase commit        ┘ commits; flushes shared
//!          ─► finish: ts leaves the in-flight set; visible_ts = just below the
//!                     oldest commit still in flight ─► wait until ts is visible
//!          ─► count the writes against their splits; queue a split due for a
//!             recount, cut or merge for the maintenance thread (`maintenance.rs`)
//! ```
//!
//! ## The commit pipeline
//!
//! Only validation and timestamp assignment are serialized (the commit
//! lock, held for microseconds). Applying — one atomic batch for a
//! one-split commit, the steps of two-phase commit otherwise — happens
//! outside it, so commits of different splits apply at the same time and a
//! slow two-phase commit does not stop others. Durability is group commit,
//! in the store: a commit's log record is synced while the store's applier
//! thread writes its batch into the data file, and one sync covers every
//! commit appended before it began (`TxnManager::make_durable`,
//! `spindle_storage::Store::flush_durable`). The commit is acknowledged
//! once the log is durable, whether or not the apply has finished (a bulk
//! load's B-tree update takes longer than the log write). A snapshot
//! notes the log position its commits reach (`read_lsn`); a point read
//! then reads the data file and the log's unapplied batches
//! (`Store::get_at`: no wait, unless the key is in the key span of a
//! bulk batch too large to index, on its way), and a scan waits until
//! the data file holds those that write inside its key range
//! (`Store::scan_at`: an atomic load when the apply is done, a look at
//! the log's ordered index of unapplied versions when not; a scan of
//! other rows than the unapplied batches write does not wait). This is Spanner's safe time: a read at a timestamp waits until
//! the replica has applied everything up to it. (Snapshots used to wait
//! when taken: in TPC-B at 8 clients that wait was a third of the
//! server's `futex` calls.)
//!
//! Commits finish in any order, but become visible in timestamp order: the
//! store's visible timestamp never passes the oldest commit still in flight
//! (`Pipeline`), and a commit is acknowledged only once it is visible, so
//! a client that committed always reads its own writes, and no snapshot
//! sees a later commit without every earlier one.
//!
//! ```text
//!   ts:        100 (2PC, in flight)   101 (done)   102 (done)
//!   visible:   99 ────────────────────────────────► 102 when 100 finishes
//! ```
//!
//! The persisted "last commit timestamp" (the visible timestamp after a
//! restart) is written with each commit's final batch as the maximum so
//! far, so it never goes back when commits apply out of order. After a
//! crash, a commit below it that never applied is simply absent — it was
//! never acknowledged, and every later commit validated against its writes,
//! so none depends on it — and a two-phase commit whose participants all
//! prepared durably is finished by recovery before the database opens.
//!
//! ## Isolation: serializable by optimistic validation
//!
//! A transaction records what it read — the keys of point reads and the key
//! ranges of scans — and buffers what it writes. Under the commit lock, a
//! read-write transaction is validated against every transaction that got
//! a commit timestamp after its snapshot (finished or still in flight):
//!
//! ```text
//!   T.read_ts            T.commit
//!      │   C1 commits (ts1)  │      T may commit only if, for every Ci with
//!      │   C2 commits (ts2)  │      read_ts < tsi: Ci's writes ∩ (T's reads ∪ T's writes) = ∅
//!   ───┴──────────┴─────┴────┴──►
//! ```
//!
//! An INSERT's check that its key is absent
//! ([`Transaction::get_for_insert`]) is not recorded as a read: the insert
//! writes the key (or its statement, and so the transaction, fails), and
//! the key's write is validated the same way; only a key found present
//! joins the read set.
//!
//! If it passes, nothing T read changed between its snapshot and its
//! commit point, so T is equivalent to running alone at its commit
//! timestamp: serializable (no lost update, write skew, phantom — scans
//! record whole ranges — or read skew). Otherwise T aborts with
//! [`Error::Conflict`] (SQLSTATE 40001) and is retried by its caller.
//! Read-only transactions skip validation and always commit.
//!
//! Updates, deletes and `SELECT … FOR UPDATE` by primary key first take
//! the row's write lock ([`locks`]): a second writer of a hot row waits for
//! the first to commit and then moves its snapshot forward (a *refresh*,
//! valid only if nothing it read changed meanwhile) instead of aborting.
//! Locks only order writers; validation above still decides every commit.
//! A wait that would close a cycle fails with [`Error::Deadlock`] (40P01).
//!
//! The write sets of recent commits are kept in memory ([`CommitLog`]) until
//! no active transaction's snapshot is older than them. Every transaction
//! implicitly reads the catalog, so a committed schema change aborts every
//! concurrent read-write transaction.
//!
//! ## Timestamps
//!
//! `next_ts = max(last_commit_ts + 1, wall clock in µs)`: unique, strictly
//! increasing across restarts (the last one is persisted by each commit).
//!
//! Writes made with [`Transaction::put_pending`] hold a placeholder for the
//! commit timestamp (`PENDING_COMMIT_TIMESTAMP()`); the commit replaces it,
//! in keys and values, once `ts` is chosen under the commit lock, via
//! [`Catalog::resolve_pending_commit_timestamp`]. Validation ran against
//! the placeholder keys, which is sound because the final keys are new:
//! commit-timestamp columns refuse future timestamps, and `ts` exceeds
//! every earlier commit's. A pending write cannot be read back by its own
//! transaction ([`Error::PendingCommitTimestamp`]).
//!
//! ## The catalog
//!
//! The catalog is stored under the logical key [`CATALOG_KEY`] like any row,
//! so it is versioned and committed atomically with data. A transaction
//! reads it at its snapshot; DDL replaces the transaction's copy.
//!
//! ## Retired key spaces
//!
//! Table and index ids are handed out in commit order and never reused.
//! DROP TABLE of a root table (with its row trees) and DROP INDEX of a
//! global index change only the catalog: the dropped key space stays as it
//! was, readable by snapshots older than the drop through the catalog of
//! their time, and [`TxnManager::gc`] removes it physically once the
//! catalog at the collection horizon no longer names the id:
//!
//! ```text
//!   ts:      10 CREATE t (id 7)   20 INSERT rows   30 DROP TABLE t   ...   horizon ≥ 30
//!   20 00000007 …  rows          readable @ 20..29 (catalog@ts names 7)    purged
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Condvar, Mutex, RwLock};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use spindle_catalog::Catalog;
use spindle_storage::splits::{Boundaries, SplitMap};
use spindle_storage::{Batch, Store, Timestamp, Write};

mod buffer;
mod locks;
mod maintenance;
mod twopc;
use tracing::{debug, info_span};
pub use twopc::CrashPoint;

/// Logical key of the catalog (sorts before every table key, `20 …`).
pub const CATALOG_KEY: &[u8] = b"\x02catalog";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another transaction committed first: the caller should retry the
    /// whole transaction.
    #[error("could not serialize access due to a concurrent transaction; retry the transaction")]
    Conflict,
    #[error(transparent)]
    Storage(#[from] spindle_storage::Error),
    #[error("corrupt catalog: {0}")]
    CorruptCatalog(String),
    #[error("a lock was poisoned by a panic in another thread")]
    Poisoned,
    #[error("recovery failed: {0}")]
    Recovery(String),
    /// A background thread (split maintenance) could not be started.
    #[error("could not start a background thread")]
    Thread(#[source] std::io::Error),
    /// A stale read asked for a snapshot that cannot be read.
    #[error("{0}")]
    StaleRead(String),
    /// A test stopped the commit at a crash point; the database must be
    /// reopened, as after a real crash.
    #[error("commit stopped at injected crash point {0:?}")]
    Crashed(CrashPoint),
    /// The transaction read a row it wrote with `PENDING_COMMIT_TIMESTAMP()`:
    /// its value is not known until commit.
    #[error("cannot read a row written with PENDING_COMMIT_TIMESTAMP() in the same transaction: its commit timestamp is not known until commit")]
    PendingCommitTimestamp,
    /// Waiting for a write lock would close a cycle of waiting
    /// transactions: this one gives up and should be retried.
    #[error("deadlock detected: the transaction waited for a row lock held by a transaction that waits for it; retry the transaction")]
    Deadlock,
    /// A write lock was not granted within the session's `lock_timeout`.
    #[error("canceling statement due to lock timeout")]
    LockTimeout,
    /// A wait for a write lock was interrupted (the client canceled the
    /// statement).
    #[error("canceling statement due to user request")]
    Interrupted,
    /// Resolving a pending commit timestamp failed (a write the SQL layer
    /// marked did not decode against the catalog).
    #[error("cannot resolve the commit timestamp of a write: {0}")]
    ResolveCommitTimestamp(#[source] spindle_catalog::KeyError),
    /// A transaction declared to write nothing
    /// ([`Transaction::untracked_reads`]) tried to commit writes: its
    /// reads were not kept, so they could not be validated.
    #[error("a transaction that does not track its reads cannot commit writes")]
    UntrackedReads,
}

impl Error {
    /// Whether retrying the transaction may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Conflict | Error::Deadlock)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Shared state of one database: the store, the commit lock with the log
/// of recent commits, the snapshots in use, the split map and the cached
/// catalog.
pub struct TxnManager {
    store: Arc<Store>,
    /// Serializes validation and commit-timestamp assignment.
    commits: Mutex<CommitLog>,
    /// Read timestamps of live transactions (with counts).
    active: Mutex<BTreeMap<Timestamp, usize>>,
    /// Write locks of UPDATE/DELETE by key ([`locks`]).
    locks: locks::LockTable,
    /// Ids of transactions (lock owners).
    next_txn_id: AtomicU64,
    /// The catalog as of the commit timestamp stored with it.
    catalog: Arc<RwLock<(Timestamp, Arc<Catalog>)>>,
    /// The split map (grouping and maintenance take its lock) and its
    /// maintenance ([`maintenance`]).
    splits: Arc<maintenance::Splits>,
    /// The maintenance thread, joined on drop.
    maintainer: Mutex<Option<std::thread::JoinHandle<()>>>,
    crash_at: Mutex<Option<CrashPoint>>,
    crashed: AtomicBool,
    /// Test hook called at each step of a commit (see [`TxnManager::set_step_hook`]).
    step_hook: RwLock<Option<StepHook>>,
    /// The highest commit timestamp written to the store's metadata (the
    /// lock orders those writes so the stored value never goes back).
    persisted_last_ts: Mutex<Timestamp>,
    /// Commits between timestamp assignment and completion; visibility.
    pipeline: Mutex<Pipeline>,
    pipeline_changed: Condvar,
    /// Versions older than this many microseconds (and not needed by a
    /// live snapshot) are garbage-collected.
    retention_micros: AtomicU64,
}

/// Default version retention: one hour.
pub const DEFAULT_RETENTION: std::time::Duration = std::time::Duration::from_secs(3600);
/// How often the background collector runs.
const GC_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Default split size threshold (bytes of keys and values).
pub const DEFAULT_SPLIT_THRESHOLD: u64 = 64 * 1024 * 1024;
/// A split whose writes per minute exceed this is split for load.
pub const LOAD_SPLIT_WRITES_PER_MINUTE: u64 = 60_000;
/// How long a split's write rate must stay at or above
/// [`LOAD_SPLIT_WRITES_PER_MINUTE`] before it is cut for load: a burst (a
/// bulk load, a COPY) is not sustained load, and cutting for it only makes
/// later transactions that span the halves pay two-phase commit.
pub const DEFAULT_LOAD_SPLIT_AFTER: std::time::Duration = std::time::Duration::from_secs(120);
/// Least time between two recounts of a split for its write load.
const LOAD_RECOUNT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// A split with at least this many reads and writes per minute is hot.
pub const HOT_OPS_PER_MINUTE: u64 = 6_000;

const SPLITS_META: &str = "splits";

/// The last commit timestamp and the write sets of commits that some live
/// transaction may still have to be validated against.
pub struct CommitLog {
    last_ts: Timestamp,
    recent: VecDeque<(Timestamp, Arc<WriteSet>)>,
}

/// Commits that have a timestamp but have not finished applying. Commits
/// apply concurrently and finish in any order; the store's visible
/// timestamp only moves up to just below the oldest one still in flight,
/// so a snapshot never sees a commit before every earlier one is complete.
///
/// A one-split commit is complete once its batch is durable: each is
/// mapped to its batch's log position, and any commit that finishes also
/// finishes the oldest ones whose batches the store reports durable
/// ([`TxnManager::finish_commit`]). Their batches are logged under the
/// commit lock, in timestamp order, so the sync that makes a commit
/// durable makes every earlier one-split commit durable too, and no commit
/// waits for an earlier one's thread to be scheduled again to become
/// visible. (Before, a commit that logged its batch just after a sync
/// began, or whose thread had not yet run again after its sync, held up
/// the visibility of every later commit — and so their row locks: under
/// pgbench's TPC-B at 8 clients 15% of commits waited, ~190 µs on
/// average.) A two-phase commit (position 0) is finished only by its own
/// thread, after its last step. A one-split commit made visible this way
/// whose own flush then fails (the log stopped for another reason) stays
/// visible: its record is durable and recovery replays it; its client
/// gets the error, as after a crash at that point.
struct Pipeline {
    /// Timestamp → the log position that completes the commit once
    /// durable (0: none; its thread finishes it).
    in_flight: BTreeMap<Timestamp, u64>,
    /// The highest timestamp of a finished commit.
    max_finished: Timestamp,
    /// Commits waiting in `finish_commit` for their timestamp to become
    /// visible: a commit that finishes wakes them only when there are any
    /// (most finish in timestamp order and wait for no one).
    waiting: usize,
}

/// See [`TxnManager::set_step_hook`].
pub type StepHook = Arc<dyn Fn(CrashPoint) + Send + Sync>;

/// How a transaction committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitInfo {
    pub ts: Timestamp,
    /// Ids of the splits its writes touched.
    pub splits: Vec<u64>,
    /// Whether it needed two-phase commit (more than one split).
    pub two_phase: bool,
}

/// A split as `spindle_sys.splits` shows it.
#[derive(Clone, Debug)]
pub struct SplitInfo {
    pub id: u64,
    pub start: Vec<u8>,
    pub end: Option<Vec<u8>>,
    pub bytes: u64,
    pub rows: u64,
    pub reads_per_minute: u64,
    pub writes_per_minute: u64,
    pub hot: bool,
    pub oversized: bool,
}

/// Row-tree boundaries from the catalog: a key inside a root table's range
/// belongs to the row tree of the root row whose key prefixes it.
struct CatalogBoundaries<'a>(&'a Catalog);

impl Boundaries for CatalogBoundaries<'_> {
    fn root_of(&self, key: &[u8]) -> Vec<u8> {
        let Ok(id) = spindle_keys::key::root_table_id(key) else {
            return key.to_vec();
        };
        // A root table's row, or an entry of a global index (a root-level
        // key space whose "row tree" is the entry itself).
        let Some(width) = self.0.key_width(id) else {
            return key.to_vec();
        };
        match spindle_keys::key::root_key_len(key, width) {
            Ok(n) => key[..n].to_vec(),
            Err(_) => key.to_vec(),
        }
    }
}

impl Drop for TxnManager {
    fn drop(&mut self) {
        // The thread holds the store too: joined first, so that the data
        // file is closed once the manager is gone.
        self.splits.stop();
        if let Some(h) = self.maintainer.lock().ok().and_then(|mut h| h.take()) {
            let _ = h.join();
        }
    }
}

impl TxnManager {
    pub fn new(store: Store) -> Result<Arc<TxnManager>> {
        twopc::recover(&store)?;
        let ts = store.visible_ts();
        let catalog = match store.get(CATALOG_KEY, ts)? {
            Some(bytes) => {
                Catalog::from_bytes(&bytes).map_err(|e| Error::CorruptCatalog(e.to_string()))?
            }
            None => Catalog::new(),
        };
        let splits = match store.meta(SPLITS_META)? {
            Some(bytes) => SplitMap::decode(&bytes)
                .ok_or_else(|| Error::Recovery("corrupt split map".into()))?,
            None => SplitMap::default(),
        };
        let store = Arc::new(store);
        let catalog = Arc::new(RwLock::new((ts, Arc::new(catalog))));
        let splits = Arc::new(maintenance::Splits::new(
            splits,
            DEFAULT_SPLIT_THRESHOLD,
            DEFAULT_LOAD_SPLIT_AFTER.as_micros() as u64,
            store.clone(),
            catalog.clone(),
        ));
        // Weak: the splits hold the store, which holds the observer.
        let weak = Arc::downgrade(&splits);
        store.set_replaced_observer(Arc::new(move |replaced| {
            if let Some(splits) = weak.upgrade() {
                splits.note_replaced(replaced);
            }
        }));
        // The counters start at zero after a restart: recount what is
        // there, in the background.
        splits.recount_all();
        let s = splits.clone();
        let maintainer = std::thread::Builder::new()
            .name("spindle-splits".into())
            .spawn(move || s.run())
            .map_err(Error::Thread)?;
        let mgr = Arc::new(TxnManager {
            store,
            commits: Mutex::new(CommitLog {
                last_ts: ts,
                recent: VecDeque::new(),
            }),
            active: Mutex::new(BTreeMap::new()),
            locks: locks::LockTable::default(),
            next_txn_id: AtomicU64::new(1),
            catalog,
            splits,
            maintainer: Mutex::new(Some(maintainer)),
            crash_at: Mutex::new(None),
            crashed: AtomicBool::new(false),
            step_hook: RwLock::new(None),
            persisted_last_ts: Mutex::new(ts),
            pipeline: Mutex::new(Pipeline {
                in_flight: BTreeMap::new(),
                max_finished: ts,
                waiting: 0,
            }),
            pipeline_changed: Condvar::new(),
            retention_micros: AtomicU64::new(DEFAULT_RETENTION.as_micros() as u64),
        });
        Self::start_gc_thread(&mgr);
        Ok(mgr)
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Scans the split maintenance has made so far (each reads a whole
    /// split: for diagnostics and tests).
    pub fn split_scans(&self) -> u64 {
        self.splits.scans.load(Ordering::Relaxed)
    }

    /// Sets the size above which a split is cut in two.
    pub fn set_split_threshold(&self, bytes: u64) {
        self.splits.threshold.store(bytes.max(1), Ordering::Relaxed);
    }

    /// Wakes every transaction waiting for a write lock to look at its
    /// interrupt flag ([`Transaction::set_interrupt`]).
    pub fn wake_lock_waiters(&self) {
        self.locks.wake_all();
    }

    /// Sets how long a split's write load must be sustained before the
    /// split is cut for it ([`DEFAULT_LOAD_SPLIT_AFTER`]).
    pub fn set_load_split_after(&self, after: std::time::Duration) {
        self.splits
            .load_split_after_micros
            .store(after.as_micros() as u64, Ordering::Relaxed);
    }

    /// Sets how long old versions are kept for snapshot and stale reads.
    pub fn set_retention(&self, retention: std::time::Duration) {
        self.retention_micros
            .store(retention.as_micros() as u64, Ordering::Relaxed);
    }

    /// The oldest timestamp a read may use: versions older than the
    /// retention window may be gone.
    pub fn min_read_ts(&self) -> Timestamp {
        now_micros().saturating_sub(self.retention_micros.load(Ordering::Relaxed))
    }

    /// Removes versions that neither the retention window nor a live
    /// snapshot needs, and the key spaces of tables and indexes dropped
    /// before that point ([`TxnManager::purge_retired`]); returns how many
    /// entries went.
    pub fn gc(&self) -> Result<u64> {
        let horizon = self.gc_horizon()?;
        let removed = self.store.gc(horizon)?;
        Ok(removed + self.purge_retired(horizon)?)
    }

    /// [`TxnManager::gc`]'s version collection of the keys in the given
    /// `[start, end)` ranges only (`None`: to the end): VACUUM of some
    /// tables.
    pub fn gc_ranges(&self, ranges: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<u64> {
        let horizon = self.gc_horizon()?;
        let mut removed = 0;
        for (start, end) in ranges {
            removed += self.store.gc_range(horizon, start, end.as_deref())?;
        }
        Ok(removed)
    }

    /// The oldest timestamp any reader may still use: the retention
    /// window's start, or the oldest live snapshot if older. Every commit
    /// at or below it is in the data file when this returns.
    fn gc_horizon(&self) -> Result<Timestamp> {
        let oldest_snapshot = self
            .active
            .lock()
            .map_err(|_| Error::Poisoned)?
            .keys()
            .next()
            .copied();
        let horizon = self
            .min_read_ts()
            .min(self.store.visible_ts())
            .min(oldest_snapshot.unwrap_or(Timestamp::MAX));
        self.store.wait_readable()?;
        Ok(horizon)
    }

    /// Removes the key spaces retired by DROP TABLE and DROP INDEX. A
    /// dropped root table's row trees (its interleaved tables and indexes
    /// with it) and a dropped global index's entries stay in the store
    /// untouched by the DROP — one catalog change, however many rows —
    /// and are removed here once no reader can see them: the catalog as of
    /// `horizon` (every reader's snapshot is at or after it) no longer
    /// names the id, and the id was handed out before `horizon` (ids are
    /// never reused, so nothing will write there again). Readers at older
    /// timestamps read the rows as they were, through the catalog of
    /// their time.
    fn purge_retired(&self, horizon: Timestamp) -> Result<u64> {
        // The horizon's commits are in the data file (`gc_horizon` waited
        // for them): no log position to wait for.
        let catalog = self.catalog_at(horizon, 0)?;
        let mut removed = 0;
        for id in 1..catalog.next_id() {
            if catalog.names_id(id) {
                continue;
            }
            let mut start = Vec::new();
            spindle_keys::key::encode_table_prefix(&mut start, id);
            let mut end = Vec::new();
            spindle_keys::key::encode_table_prefix(&mut end, id + 1);
            removed += self.store.purge_range(&start, &end)?;
        }
        Ok(removed)
    }

    fn start_gc_thread(mgr: &Arc<TxnManager>) {
        let weak = Arc::downgrade(mgr);
        let spawned = std::thread::Builder::new()
            .name("spindle-gc".into())
            .spawn(move || loop {
                std::thread::sleep(GC_INTERVAL);
                let Some(mgr) = weak.upgrade() else { return };
                match mgr.gc() {
                    Ok(n) if n > 0 => tracing::info!(removed = n, "garbage-collected old versions"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "garbage collection failed"),
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the garbage collector");
        }
    }

    /// Turns group commit on (the default) or off (one log sync per
    /// commit, the baseline the commit benchmark compares against): see
    /// [`spindle_storage::Store::set_group_commit`].
    pub fn set_group_commit(&self, on: bool) {
        self.store.set_group_commit(on);
    }

    /// Waits until every batch this thread applied before the call is on
    /// disk (in the log: the store's applier may still be writing it to
    /// the data file, and snapshots wait for that in
    /// [`Store::wait_readable`]). The store does group commit: one sync
    /// covers every batch appended before it began.
    fn make_durable(&self) -> Result<()> {
        Ok(self.store.flush_durable()?)
    }

    /// How many times the store's log has been synced (benchmarks report
    /// commits per sync).
    pub fn flush_count(&self) -> u64 {
        self.store.sync_count()
    }

    /// Applies the batch that makes commit `ts` final (a one-phase commit,
    /// or the last step of a two-phase one), recording the highest commit
    /// timestamp with it: commits apply out of timestamp order, and the
    /// stored value — the visible timestamp after a restart — must never
    /// go back.
    /// Returns the batch's log position ([`Store::apply_unsynced`]).
    fn apply_final(&self, mut batch: Batch, ts: Timestamp) -> Result<u64> {
        let mut last = self.persisted_last_ts.lock().map_err(|_| Error::Poisoned)?;
        let new_last = (*last).max(ts);
        batch.set_last_commit_ts(new_last);
        let lsn = self.store.apply_unsynced(batch)?;
        *last = new_last;
        Ok(lsn)
    }

    /// Ends commit `ts` (applied and durable if `ok`, nothing applied if
    /// not), publishes every timestamp below the oldest commit still in
    /// flight, and, if `ok`, waits until `ts` is visible: a commit is
    /// acknowledged only once a snapshot taken after it sees it.
    /// Also finishes the oldest one-split commits whose batches are
    /// durable (see [`Pipeline`]): their own threads, when they come,
    /// find them finished.
    fn finish_commit(&self, ts: Timestamp, ok: bool) -> Result<()> {
        let mut p = self.pipeline.lock().map_err(|_| Error::Poisoned)?;
        p.in_flight.remove(&ts);
        p.max_finished = p.max_finished.max(ts);
        let durable = self.store.durable_lsn();
        while let Some((&oldest, &lsn)) = p.in_flight.first_key_value() {
            if lsn == 0 || lsn > durable {
                break;
            }
            p.in_flight.pop_first();
            p.max_finished = p.max_finished.max(oldest);
        }
        let visible = match p.in_flight.first_key_value() {
            Some((oldest, _)) => (oldest - 1).min(p.max_finished),
            None => p.max_finished,
        };
        self.store.publish(visible);
        if p.waiting > 0 {
            self.pipeline_changed.notify_all();
        }
        if !ok || self.store.visible_ts() >= ts {
            return Ok(());
        }
        p.waiting += 1;
        let r = loop {
            if self.crashed.load(Ordering::SeqCst) {
                break Err(Error::Recovery(
                    "the database stopped at a crash point before an earlier commit finished; \
                     reopen it"
                        .into(),
                ));
            }
            p = match self.pipeline_changed.wait(p) {
                Ok(p) => p,
                // Poisoned: nothing left to count for.
                Err(_) => return Err(Error::Poisoned),
            };
            if self.store.visible_ts() >= ts {
                break Ok(());
            }
        };
        p.waiting -= 1;
        r
    }

    /// A commit stopped at a crash point: its timestamp stays in flight, so
    /// nothing at or after it becomes visible in this process; commits
    /// waiting behind it give up.
    fn abandon_commit(&self) {
        self.crashed.store(true, Ordering::SeqCst);
        if let Ok(_p) = self.pipeline.lock() {
            self.pipeline_changed.notify_all();
        }
    }

    /// Installs a function called at each step of every commit (tests use
    /// it to hold a commit between steps while others run). A one-split
    /// commit calls it at [`CrashPoint::BeforePrepare`] with the commit
    /// lock held: a hook that blocks there stops every other commit.
    pub fn set_step_hook(&self, hook: Option<StepHook>) {
        if let Ok(mut h) = self.step_hook.write() {
            *h = hook;
        }
    }

    /// Stops the next commit that reaches `point`, as a crash would (tests).
    pub fn inject_crash(&self, point: Option<CrashPoint>) {
        if let Ok(mut c) = self.crash_at.lock() {
            *c = point;
        }
    }

    fn check_crash(&self, point: CrashPoint) -> Result<()> {
        let hook = self.step_hook.read().map_err(|_| Error::Poisoned)?.clone();
        if let Some(hook) = hook {
            hook(point);
        }
        let armed = *self.crash_at.lock().map_err(|_| Error::Poisoned)?;
        if armed == Some(point) {
            self.abandon_commit();
            return Err(Error::Crashed(point));
        }
        Ok(())
    }

    /// The splits with their statistics, in key order.
    /// Waits until split maintenance has caught up with every commit so far
    /// (see `maintenance.rs`).
    pub fn wait_split_maintenance(&self) {
        self.splits.wait_idle();
    }

    /// The splits and their statistics, once maintenance has caught up with
    /// every commit so far.
    pub fn split_stats(&self) -> Result<Vec<SplitInfo>> {
        self.splits.wait_idle();
        let mut map = self.splits.map.lock().map_err(|_| Error::Poisoned)?;
        let n = map.len();
        let ends: Vec<Option<Vec<u8>>> =
            (0..n).map(|i| map.end_of(i).map(|e| e.to_vec())).collect();
        Ok(map
            .splits_mut()
            .iter_mut()
            .zip(ends)
            .map(|(s, end)| {
                let reads_per_minute = s.reads.per_minute();
                let writes_per_minute = s.writes.per_minute();
                SplitInfo {
                    id: s.id,
                    start: s.start.clone(),
                    end,
                    bytes: s.bytes,
                    rows: s.rows,
                    reads_per_minute,
                    writes_per_minute,
                    hot: reads_per_minute + writes_per_minute >= HOT_OPS_PER_MINUTE,
                    oversized: s.oversized,
                }
            })
            .collect())
    }

    /// Counts a read of `[start, end)` against the splits it overlaps.
    fn note_read(&self, start: &[u8], end: Option<&[u8]>) {
        if let Ok(mut map) = self.splits.map.lock() {
            let first = map.index_of(start);
            let last = match end {
                Some(e) => map.index_of(e),
                None => map.len() - 1,
            };
            for s in &mut map.splits_mut()[first..=last] {
                s.reads.add(1);
            }
        }
    }

    /// Commits `groups` (writes per split id) with two-phase commit; see
    /// [`twopc`]. One flush, after every participant prepared and step 2
    /// was queued behind them: that is the commit point (recovery finishes
    /// the commit from the prepare records if step 2 did not survive). With
    /// group commit the flush is shared with other commits.
    fn two_phase_commit(&self, ts: Timestamp, groups: &[(u64, Vec<Write>)]) -> Result<()> {
        let participants: Vec<u64> = groups.iter().map(|(id, _)| *id).collect();
        let prepared = (|| {
            self.check_crash(CrashPoint::BeforePrepare)?;
            for (n, (id, ws)) in groups.iter().enumerate() {
                let mut b = Batch::default();
                b.put_meta(
                    &twopc::prepared_name(ts, *id),
                    twopc::encode_prepared(&participants, ws),
                );
                self.store.apply_unsynced(b)?;
                self.check_crash(CrashPoint::AfterPrepare(n + 1))?;
            }
            Ok(())
        })();
        if let Err(e) = prepared {
            // A participant's record is missing: recovery would abort too.
            if !matches!(e, Error::Crashed(_)) {
                self.abort_prepared(ts, groups);
            }
            return Err(e);
        }
        // Step 2 is queued now, behind the prepares in the store's one log,
        // so the store applies it while the flush waits for the disk: the
        // log and the data file each keep a prefix of the batches after a
        // crash, so step 2 survives only with every prepare (see `twopc`).
        let mut b = Batch::default();
        for (id, ws) in groups {
            b.versions(ts, ws);
            b.delete_meta(&twopc::prepared_name(ts, *id));
        }
        if let Err(e) = self.apply_final(b, ts).and_then(|_| self.make_durable()) {
            // Every prepare record was written but queuing step 2 or the
            // flush failed: they may be durable, so the outcome is in doubt
            // until recovery decides it. Stop like a crash rather than
            // abort what may be committed.
            self.abandon_commit();
            return Err(e);
        }
        // Durable, not yet published (snapshots taken after the
        // publication wait until step 2 is in the data file).
        let finished = self.check_crash(CrashPoint::Committed);
        if finished.is_err() {
            // Committed; only the publication is left, and recovery makes
            // it visible.
            self.abandon_commit();
        }
        finished
    }

    /// Removes the prepare records of a two-phase commit that failed
    /// before they were all durable (recovery would remove them at the next
    /// open).
    fn abort_prepared(&self, ts: Timestamp, groups: &[(u64, Vec<Write>)]) {
        let mut b = Batch::default();
        for (id, _) in groups {
            b.delete_meta(&twopc::prepared_name(ts, *id));
        }
        if let Err(e) = self
            .store
            .apply_unsynced(b)
            .and_then(|_| self.store.wait_applied())
        {
            tracing::warn!(error = %e, ts, "could not remove prepared records");
        }
    }

    /// Starts a transaction on the newest snapshot.
    pub fn begin(self: &Arc<Self>) -> Result<Transaction> {
        // Registering under the `active` lock keeps the commit log from
        // dropping entries this snapshot must be validated against.
        let read_ts = {
            let mut active = self.active.lock().map_err(|_| Error::Poisoned)?;
            let ts = self.store.visible_ts();
            *active.entry(ts).or_insert(0) += 1;
            ts
        };
        // Read after the timestamp: it covers every commit at or below it.
        let read_lsn = self.store.readable_lsn();
        let catalog = self.snapshot_catalog(read_ts, read_lsn)?;
        debug!(read_ts, "begin");
        Ok(self.transaction(read_ts, read_lsn, catalog, true))
    }

    /// For a snapshot at `read_ts` just registered in `active`: the
    /// catalog as of it; on failure the registration is undone. (The
    /// snapshot does not wait for the applier here: its reads do, a point
    /// read only if the log cannot answer it: `Store::get_at`.)
    fn snapshot_catalog(&self, read_ts: Timestamp, read_lsn: u64) -> Result<Arc<Catalog>> {
        let catalog = self.catalog_at(read_ts, read_lsn);
        if catalog.is_err() {
            self.end(read_ts);
        }
        catalog
    }

    /// Starts a read-only transaction on the snapshot at `read_ts` (a stale
    /// read). The timestamp must be inside the retention window and not in
    /// the future.
    pub fn begin_at(self: &Arc<Self>, read_ts: Timestamp) -> Result<Transaction> {
        let read_ts = {
            let mut active = self.active.lock().map_err(|_| Error::Poisoned)?;
            if read_ts < self.min_read_ts() {
                return Err(Error::StaleRead(format!(
                    "read timestamp {read_ts} is older than the version retention window"
                )));
            }
            if read_ts > self.store.visible_ts().max(now_micros()) {
                return Err(Error::StaleRead(format!(
                    "read timestamp {read_ts} is in the future"
                )));
            }
            // A timestamp between the newest commit and now reads the newest.
            let read_ts = read_ts.min(self.store.visible_ts());
            *active.entry(read_ts).or_insert(0) += 1;
            read_ts
        };
        let read_lsn = self.store.readable_lsn();
        let catalog = self.snapshot_catalog(read_ts, read_lsn)?;
        Ok(self.transaction(read_ts, read_lsn, catalog, false))
    }

    fn transaction(
        self: &Arc<Self>,
        read_ts: Timestamp,
        read_lsn: u64,
        catalog: Arc<Catalog>,
        refreshable: bool,
    ) -> Transaction {
        Transaction {
            mgr: self.clone(),
            id: self.next_txn_id.fetch_add(1, Ordering::Relaxed),
            read_ts,
            read_lsn,
            refreshable,
            writes: buffer::WriteBuffer::default(),
            absent: AbsentKeys::default(),
            key_runs: Vec::new(),
            pending: BTreeSet::new(),
            reads: Arc::new(Mutex::new(ReadSet::default())),
            track_reads: true,
            catalog,
            catalog_changed: false,
            locked: Vec::new(),
            lock_timeout: None,
            interrupt: None,
        }
    }

    fn end(&self, read_ts: Timestamp) {
        if let Ok(mut active) = self.active.lock() {
            if let Some(n) = active.get_mut(&read_ts) {
                *n -= 1;
                if *n == 0 {
                    active.remove(&read_ts);
                }
            }
        }
    }

    /// Number of commits kept for validation (for tests and metrics).
    pub fn commit_log_len(&self) -> usize {
        self.commits.lock().map(|c| c.recent.len()).unwrap_or(0)
    }

    fn catalog_at(&self, ts: Timestamp, lsn: u64) -> Result<Arc<Catalog>> {
        {
            let cached = self.catalog.read().map_err(|_| Error::Poisoned)?;
            // The cache holds the newest catalog; it is valid for any
            // snapshot at or after the commit that wrote it.
            if cached.0 <= ts {
                return Ok(cached.1.clone());
            }
        }
        match self.store.get_at(CATALOG_KEY, ts, lsn)? {
            Some(bytes) => Ok(Arc::new(
                Catalog::from_bytes(&bytes).map_err(|e| Error::CorruptCatalog(e.to_string()))?,
            )),
            None => Ok(Arc::new(Catalog::new())),
        }
    }
}

/// A read-write transaction (see the module docs).
pub struct Transaction {
    mgr: Arc<TxnManager>,
    /// Owner id in the lock table.
    id: u64,
    read_ts: Timestamp,
    /// The log position the snapshot needs applied
    /// (`Store::readable_lsn`), for its reads (`Store::get_at`,
    /// `Store::scan_at`).
    read_lsn: u64,
    /// Whether the snapshot may move forward after a lock wait (not for a
    /// stale read, whose timestamp the caller chose).
    refreshable: bool,
    /// Keys whose write lock this transaction holds ([`locks`]).
    locked: Vec<Vec<u8>>,
    /// Longest wait for a write lock (`None`: no limit).
    lock_timeout: Option<std::time::Duration>,
    /// Raised to stop a wait for a write lock (a cancel request).
    interrupt: Option<Arc<AtomicBool>>,
    writes: buffer::WriteBuffer,
    /// Keys INSERTs found absent, as one stretch of the snapshot.
    absent: AbsentKeys,
    /// The next key the SQL layer draws in a key space, per key space
    /// (a key-less table's hidden keys run on across the transaction's
    /// statements): [`Transaction::key_run`]. Scratch state, not a write.
    key_runs: Vec<(u32, i64)>,
    /// Keys of `writes` holding the commit-timestamp placeholder (see
    /// [`Transaction::put_pending`]).
    pending: BTreeSet<Vec<u8>>,
    /// What this transaction read, for commit-time validation.
    reads: Arc<Mutex<ReadSet>>,
    /// Whether point reads go into `reads` ([`Transaction::untracked_reads`]:
    /// not for a transaction that writes nothing).
    track_reads: bool,
    catalog: Arc<Catalog>,
    catalog_changed: bool,
}

/// Keys and key ranges a transaction read.
#[derive(Default, Debug)]
struct ReadSet {
    points: BTreeSet<Vec<u8>>,
    ranges: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl ReadSet {
    /// Whether any of `written` falls in what was read.
    fn overlaps(&self, written: &WriteSet) -> bool {
        if self.points.iter().any(|k| written.contains(k)) {
            return true;
        }
        self.ranges
            .iter()
            .any(|(start, end)| written.any_in(start, end.as_deref()))
    }
}

/// The keys a commit wrote, kept in [`CommitLog`] for validation: sorted
/// and without duplicates, searched by bisection. The keys lie back to
/// back in one buffer (key `i` is `bytes[ends[i - 1]..ends[i]]`): two
/// allocations per commit instead of one per key, to make and to free — a
/// bulk load's commit of 10 000 rows made and later freed 10 000.
///
/// ```text
///   keys:  "ab"  "abc"  "b"
///   bytes: a b a b c b
///   ends:  2 5 6
/// ```
struct WriteSet {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl WriteSet {
    fn new<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> WriteSet {
        let mut keys: Vec<&[u8]> = keys.into_iter().collect();
        // The buffer is in key order; only the catalog key is appended
        // (a DDL commit): it is moved into place rather than the whole
        // list sorted again (a million-row ADD PRIMARY KEY spent 10% of
        // its time in that sort).
        let ascending = |keys: &[&[u8]]| keys.is_sorted_by(|a, b| a < b);
        if !ascending(&keys) {
            let n = keys.len();
            if ascending(&keys[..n - 1]) {
                let last = keys[n - 1];
                let at = keys[..n - 1].partition_point(|k| *k < last);
                keys[at..].rotate_right(1);
            } else {
                keys.sort_unstable();
            }
            keys.dedup();
        }
        let mut set = WriteSet {
            bytes: Vec::with_capacity(keys.iter().map(|k| k.len()).sum()),
            ends: Vec::with_capacity(keys.len()),
        };
        for k in keys {
            set.bytes.extend_from_slice(k);
            set.ends.push(set.bytes.len());
        }
        set
    }

    /// Key `i` (`i < self.ends.len()`).
    fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    /// The number of keys below `key` (`below`) or at most `key`.
    fn partition(&self, mut below: impl FnMut(&[u8]) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.ends.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if below(self.key(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn contains(&self, key: &[u8]) -> bool {
        let i = self.partition(|k| k < key);
        i < self.ends.len() && self.key(i) == key
    }

    /// Whether a key in `[start, end)` was written.
    fn any_in(&self, start: &[u8], end: Option<&[u8]>) -> bool {
        let i = self.partition(|k| k < start);
        i < self.ends.len() && end.is_none_or(|e| self.key(i) < e)
    }
}

/// Fails if a transaction's buffered write of `key` holds the
/// commit-timestamp placeholder (`pending`: the keys whose writes do), which
/// cannot be read back.
fn readable(pending: &BTreeSet<Vec<u8>>, key: &[u8]) -> Result<()> {
    if !pending.is_empty() && pending.contains(key) {
        return Err(Error::PendingCommitTimestamp);
    }
    Ok(())
}

/// What one commit adds to a split's statistics (`maintenance::Splits::note_commit`),
/// counted before its writes move into the store's batch.
struct SplitDelta {
    id: u64,
    writes: u64,
    bytes: u64,
    puts: u64,
    deletes: u64,
    /// The smallest and the largest key written: if the layout changed
    /// since the writes were grouped, every split now between them is
    /// recounted (several cuts may have spread the old split's range).
    first: Vec<u8>,
    last: Vec<u8>,
}

impl SplitDelta {
    fn of(id: u64, ws: &[Write]) -> SplitDelta {
        // A group's writes are in key order but for at most one trailing
        // key that sorts before them (the catalog key, pushed last; see
        // `commit`): its bounds are at its ends, not found by a pass over
        // every key (a bulk load's commit holds a million).
        debug_assert!(
            ws.len() < 2 || ws[..ws.len() - 1].windows(2).all(|w| w[0].0 < w[1].0),
            "a split's writes out of key order"
        );
        let (first, last) = match ws {
            [] => (Vec::new(), Vec::new()),
            [.., prev, tail] if tail.0 < prev.0 => {
                (std::cmp::min(&ws[0].0, &tail.0).clone(), prev.0.clone())
            }
            [head, ..] => (head.0.clone(), ws[ws.len() - 1].0.clone()),
        };
        let mut d = SplitDelta {
            id,
            writes: ws.len() as u64,
            bytes: 0,
            puts: 0,
            deletes: 0,
            first,
            last,
        };
        for (k, v) in ws {
            match v {
                Some(v) => {
                    d.bytes += (k.len() + v.len()) as u64;
                    d.puts += 1;
                }
                None => d.deletes += 1,
            }
        }
        d
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        self.release_locks();
        self.mgr.end(self.read_ts);
    }
}

/// Locks a read set. A poisoned lock is recovered: the read set is plain
/// data that a panicking reader cannot leave half-updated in a way that
/// matters (at worst a key is missing, and the reader's statement failed).
fn lock_reads(reads: &Mutex<ReadSet>) -> std::sync::MutexGuard<'_, ReadSet> {
    reads.lock().unwrap_or_else(|e| e.into_inner())
}

impl Transaction {
    fn reads(&self) -> std::sync::MutexGuard<'_, ReadSet> {
        lock_reads(&self.reads)
    }

    /// Point reads of keys in `[start, end)` off this thread (e.g. the base
    /// rows an index scan fetches): the snapshot timestamp and a copy of
    /// the buffered writes in the range; each key read is added to this
    /// transaction's read set for commit-time validation.
    pub fn point_reader(&self, start: &[u8], end: Option<&[u8]>) -> PointReader {
        let upper = match end {
            Some(e) => Bound::Excluded(e.to_vec()),
            None => Bound::Unbounded,
        };
        let range = (Bound::Included(start.to_vec()), upper);
        PointReader {
            read_ts: self.read_ts,
            read_lsn: self.read_lsn,
            overlay: self
                .writes
                .range(range.clone())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            pending: self.pending.range(range).cloned().collect(),
            reads: self.reads.clone(),
        }
    }

    pub fn read_ts(&self) -> Timestamp {
        self.read_ts
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Replaces the transaction's catalog (DDL); written at commit.
    pub fn set_catalog(&mut self, catalog: Catalog) {
        self.catalog = Arc::new(catalog);
        self.catalog_changed = true;
    }

    pub fn has_writes(&self) -> bool {
        !self.writes.is_empty() || self.catalog_changed
    }

    /// This transaction's buffered write of `key`, if any (`Some(None)`: a
    /// tombstone). A write holding the commit-timestamp placeholder cannot
    /// be read back.
    fn own_write(&self, key: &[u8]) -> Result<Option<&Option<Vec<u8>>>> {
        let w = self.writes.get(key);
        if w.is_some() {
            readable(&self.pending, key)?;
        }
        Ok(w)
    }

    /// Records a point read of `key` from the store: validated at commit,
    /// counted on its split's read load.
    fn note_point_read(&self, key: &[u8]) {
        if self.track_reads {
            self.reads().points.insert(key.to_vec());
        }
        self.mgr.note_read(key, Some(key));
    }

    /// Declares that this transaction will write nothing (an autocommit
    /// query), so its point reads need not be kept for validation: a
    /// commit without writes validates nothing. (They still count on
    /// their splits' read load.) A point read of a server's pgbench
    /// select otherwise copied its key into the read set and freed it
    /// again. Should the transaction write after all, its commit fails
    /// with [`Error::UntrackedReads`] rather than go unvalidated.
    pub fn untracked_reads(&mut self) {
        self.track_reads = false;
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(w) = self.own_write(key)? {
            return Ok(w.clone());
        }
        self.note_point_read(key);
        Ok(self.mgr.store.get_at(key, self.read_ts, self.read_lsn)?)
    }

    /// Where the SQL layer's keys generated in key space `space` go on
    /// in this transaction (`None`: none drawn yet, or the run ended).
    /// Nothing here is checked: the keys are still inserted as any other.
    pub fn key_run(&self, space: u32) -> Option<i64> {
        self.key_runs
            .iter()
            .find(|(s, _)| *s == space)
            .map(|(_, next)| *next)
    }

    /// Sets (`None`: forgets) where keys generated in `space` go on.
    pub fn set_key_run(&mut self, space: u32, next: Option<i64>) {
        self.key_runs.retain(|(s, _)| *s != space);
        if let Some(next) = next {
            self.key_runs.push((space, next));
        }
    }

    /// [`Transaction::get`] for an insert, which writes `key` when it is
    /// absent: the caller must then write `key` in this transaction (or
    /// fail it). The absence is recorded only through that write —
    /// validation checks every written key against later commits' writes
    /// as it checks reads — so an absent key adds nothing to the read set
    /// and no read to the split's load. A present key is a read like any
    /// other (the caller may decide on it without writing: a duplicate-key
    /// error, `ON CONFLICT DO NOTHING`).
    pub fn get_for_insert(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(w) = self.own_write(key)? {
            return Ok(w.clone());
        }
        if self.absent.covers(key) {
            return Ok(None);
        }
        let found = self.mgr.store.get_at(key, self.read_ts, self.read_lsn)?;
        match &found {
            Some(_) => self.note_point_read(key),
            None => self
                .absent
                .missed(&self.mgr.store, key, self.read_ts, self.read_lsn)?,
        }
        Ok(found)
    }

    /// [`Transaction::get_for_insert`] and [`Transaction::put`] in one
    /// search of the write buffer: writes `value` at `key` and returns
    /// `None` when the key is absent (the write validates the absence);
    /// otherwise writes nothing and returns the key and its present value
    /// (recorded as a read when it came from the store).
    pub fn insert_absent(
        &mut self,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        use buffer::Entry;
        match self.writes.entry(key) {
            Entry::Occupied(mut e) => {
                readable(&self.pending, e.key())?;
                match e.get() {
                    Some(present) => Ok(Some((e.key().clone(), present.clone()))),
                    None => {
                        // Deleted by this transaction: a tombstone is never
                        // pending (`delete` drops a pending write instead).
                        e.insert(Some(value));
                        Ok(None)
                    }
                }
            }
            Entry::Vacant(e) => {
                if !self.absent.covers(e.key()) {
                    if let Some(present) =
                        self.mgr
                            .store
                            .get_at(e.key(), self.read_ts, self.read_lsn)?
                    {
                        let key = e.into_key();
                        self.note_point_read(&key);
                        return Ok(Some((key, present)));
                    }
                    self.absent
                        .missed(&self.mgr.store, e.key(), self.read_ts, self.read_lsn)?;
                }
                e.insert(Some(value));
                Ok(None)
            }
        }
    }

    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        if !self.pending.is_empty() {
            self.pending.remove(&key);
        }
        self.writes.insert(key, Some(value));
    }

    /// Writes a key and value that hold the commit-timestamp placeholder
    /// (`spindle_keys::value::PENDING_COMMIT_TIMESTAMP`) in commit-timestamp
    /// columns. At commit, once the timestamp is chosen (under the commit
    /// lock), [`Catalog::resolve_pending_commit_timestamp`] replaces the
    /// placeholder, in the key too, so the key written may differ from
    /// `key`. Until then the write cannot be read back: reading it fails
    /// with [`Error::PendingCommitTimestamp`].
    pub fn put_pending(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.pending.insert(key.clone());
        self.writes.insert(key, Some(value));
    }

    pub fn delete(&mut self, key: Vec<u8>) {
        // A pending key has never been stored (the placeholder never is),
        // so deleting it only drops the buffered write.
        if !self.pending.is_empty() && self.pending.remove(&key) {
            self.writes.remove(&key);
            return;
        }
        self.writes.insert(key, None);
    }

    /// Deletes every live key in `[start, end)`: a whole row tree when the
    /// range is a root row's prefix range. Returns how many keys it deleted.
    pub fn delete_range(&mut self, start: &[u8], end: Option<&[u8]>) -> Result<usize> {
        let keys: Vec<Vec<u8>> = self
            .scan(start, end)
            .map(|r| r.map(|(k, _)| k))
            .collect::<Result<_>>()?;
        let n = keys.len();
        for k in keys {
            self.delete(k);
        }
        Ok(n)
    }

    /// Live keys in `[start, end)` as the transaction sees them, in order.
    pub fn scan(&self, start: &[u8], end: Option<&[u8]>) -> TxnScan {
        let snapshot = self.snapshot(start, end);
        snapshot.into_iter(&self.mgr)
    }

    /// A self-contained view of `[start, end)` for reading off this thread
    /// (e.g. in a blocking task): the snapshot timestamp plus a copy of the
    /// buffered writes in the range.
    pub fn snapshot(&self, start: &[u8], end: Option<&[u8]>) -> Snapshot {
        self.reads()
            .ranges
            .push((start.to_vec(), end.map(|e| e.to_vec())));
        self.mgr.note_read(start, end);
        let upper = match end {
            Some(e) => Bound::Excluded(e.to_vec()),
            None => Bound::Unbounded,
        };
        let range = (Bound::Included(start.to_vec()), upper);
        let overlay: Vec<(Vec<u8>, Option<Vec<u8>>)> = self
            .writes
            .range(range.clone())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Snapshot {
            start: start.to_vec(),
            end: end.map(|e| e.to_vec()),
            read_ts: self.read_ts,
            read_lsn: self.read_lsn,
            overlay,
            pending: self.pending.range(range).cloned().collect(),
        }
    }

    pub fn manager(&self) -> &Arc<TxnManager> {
        &self.mgr
    }

    /// Bounds how long [`Transaction::lock_key`] waits (`None`: no limit).
    pub fn set_lock_timeout(&mut self, timeout: Option<std::time::Duration>) {
        self.lock_timeout = timeout;
    }

    /// A flag that, once raised (and [`TxnManager::wake_lock_waiters`]
    /// called), stops a wait of [`Transaction::lock_key`] with
    /// [`Error::Interrupted`]; the session lowers it before each statement.
    pub fn set_interrupt(&mut self, flag: Option<Arc<AtomicBool>>) {
        self.interrupt = flag;
    }

    /// Takes the write lock on `key` until this transaction ends ([`locks`]),
    /// before a statement reads the row to update or delete it. With
    /// `wait` false, returns `Ok(false)` instead of waiting when another
    /// transaction holds it (callers on an async runtime try that first
    /// and wait off the runtime). Once the lock is held, if a commit after
    /// this transaction's snapshot wrote `key`, the snapshot is refreshed
    /// (moved to the newest visible commit) so the row is read as that
    /// writer left it — or the transaction fails with [`Error::Conflict`]
    /// if something it already read or wrote changed in between.
    pub fn lock_key(&mut self, key: &[u8], wait: bool) -> Result<bool> {
        use locks::Acquired;
        match self.mgr.locks.acquire(
            self.id,
            key,
            wait,
            self.lock_timeout,
            self.interrupt.as_deref(),
        )? {
            Acquired::Busy => return Ok(false),
            Acquired::Held => return Ok(true),
            Acquired::Free | Acquired::AfterWait => self.locked.push(key.to_vec()),
        }
        self.refresh_for(key)?;
        Ok(true)
    }

    /// See [`Transaction::lock_key`]: moves the snapshot forward if `key`
    /// changed after it.
    fn refresh_for(&mut self, key: &[u8]) -> Result<()> {
        let log = self.mgr.commits.lock().map_err(|_| Error::Poisoned)?;
        let newer = |ts: &Timestamp| *ts > self.read_ts;
        let changed = log
            .recent
            .iter()
            .rev()
            .take_while(|(ts, _)| newer(ts))
            .any(|(_, written)| written.contains(key));
        if !changed {
            return Ok(());
        }
        if !self.refreshable {
            return Err(Error::Conflict);
        }
        // Every commit at or below the visible timestamp has finished, and
        // all after our snapshot are still in the log (our snapshot keeps
        // them there).
        let new_ts = self.mgr.store.visible_ts();
        let new_lsn = self.mgr.store.readable_lsn();
        {
            let reads = self.reads();
            for (ts, written) in log.recent.iter().rev().take_while(|(ts, _)| newer(ts)) {
                if *ts > new_ts {
                    continue;
                }
                let ww = self.writes.keys().any(|k| written.contains(k));
                if ww || written.contains(CATALOG_KEY) || reads.overlaps(written) {
                    debug!(conflicting_ts = *ts, "refresh failed");
                    return Err(Error::Conflict);
                }
            }
        }
        if new_ts > self.read_ts {
            let mut active = self.mgr.active.lock().map_err(|_| Error::Poisoned)?;
            if let Some(n) = active.get_mut(&self.read_ts) {
                *n -= 1;
                if *n == 0 {
                    active.remove(&self.read_ts);
                }
            }
            *active.entry(new_ts).or_insert(0) += 1;
            debug!(from = self.read_ts, to = new_ts, "snapshot refreshed");
            self.read_ts = new_ts;
            self.read_lsn = new_lsn;
            // Keys committed since may fall in the stretch known absent.
            self.absent.clear();
        }
        Ok(())
    }

    /// Releases every write lock this transaction holds.
    fn release_locks(&mut self) {
        if !self.locked.is_empty() {
            let keys = std::mem::take(&mut self.locked);
            self.mgr.locks.release(self.id, &keys);
        }
    }

    /// Ids of the splits the buffered writes fall in, in key order: one
    /// means the commit would take one phase, more means two-phase commit.
    pub fn write_splits(&self) -> Result<Vec<u64>> {
        let map = self.mgr.splits.map.lock().map_err(|_| Error::Poisoned)?;
        let mut ids: Vec<u64> = Vec::new();
        let keys = self.writes.keys().map(|k| k.as_slice());
        let catalog = self.catalog_changed.then_some(CATALOG_KEY);
        for k in catalog.into_iter().chain(keys) {
            let id = map.splits()[map.index_of(k)].id;
            if ids.last() != Some(&id) {
                ids.push(id);
            }
        }
        ids.dedup();
        Ok(ids)
    }

    /// Commits atomically and durably, or fails with [`Error::Conflict`].
    /// The buffered writes are consumed: after a commit (successful or
    /// not) the transaction holds nothing and must not be used again. Its
    /// write locks are released once the commit is visible (or failed).
    pub fn commit(&mut self) -> Result<Option<CommitInfo>> {
        let result = self.commit_writes();
        self.release_locks();
        result
    }

    fn commit_writes(&mut self) -> Result<Option<CommitInfo>> {
        let span = info_span!(
            "commit",
            read_ts = self.read_ts,
            writes = self.writes.len(),
            ts = tracing::field::Empty,
            splits = tracing::field::Empty,
            two_phase = tracing::field::Empty
        );
        let _g = span.enter();
        if !self.has_writes() {
            return Ok(None);
        }
        if !self.track_reads {
            return Err(Error::UntrackedReads);
        }
        if self.mgr.crashed.load(Ordering::SeqCst) {
            return Err(Error::Recovery(
                "the database stopped at a crash point; reopen it".into(),
            ));
        }
        let catalog_changed = std::mem::take(&mut self.catalog_changed);
        let mut buffered = std::mem::take(&mut self.writes);
        let pending = std::mem::take(&mut self.pending);
        let mut log = self.mgr.commits.lock().map_err(|_| Error::Poisoned)?;
        // Validate against every commit after our snapshot. The catalog is
        // an implicit read of every transaction.
        let mut reads = std::mem::take(&mut *self.reads());
        reads.points.insert(CATALOG_KEY.to_vec());
        for (ts, written) in log.recent.iter().rev() {
            if *ts <= self.read_ts {
                break;
            }
            let ww = buffered.keys().any(|k| written.contains(k));
            if ww || reads.overlaps(written) {
                debug!(conflicting_ts = *ts, write_write = ww, "conflict");
                return Err(Error::Conflict);
            }
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let ts = (log.last_ts + 1).max(now);
        // Put the commit timestamp into writes that wait for it. Their
        // final keys are new (commit-timestamp columns refuse the future,
        // and `ts` is later than every earlier commit), so validation
        // against the placeholder keys above missed no conflict.
        for key in pending {
            let Some(value) = buffered.remove(&key) else {
                continue;
            };
            let (k, v) = self
                .catalog
                .resolve_pending_commit_timestamp(&key, value.as_deref(), ts as i64)
                .map_err(Error::ResolveCommitTimestamp)?;
            buffered.insert(k, v);
        }
        let mut writes: Vec<Write> = buffered.into_vec();
        if catalog_changed {
            writes.push((CATALOG_KEY.to_vec(), Some(self.catalog.to_bytes())));
        }
        let write_set = WriteSet::new(writes.iter().map(|(k, _)| k.as_slice()));
        // Publish the new catalog before the commit becomes visible, so no
        // snapshot at `ts` can pick up the previous one from the cache.
        let previous = if catalog_changed {
            let mut cached = self.mgr.catalog.write().map_err(|_| Error::Poisoned)?;
            Some(std::mem::replace(&mut *cached, (ts, self.catalog.clone())))
        } else {
            None
        };
        let splits = self.mgr.splits.map.lock().map_err(|_| Error::Poisoned)?;
        let layout = self.mgr.splits.layout();
        // Group the writes by split. They are in key order (but for the
        // catalog key, pushed last), so each split's run of them ends where
        // a bisection for the split's end says: one search of the map and
        // one bisection per split touched, not a comparison per key.
        let sorted = writes.len() - usize::from(catalog_changed);
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut at = 0;
        while at < sorted {
            let idx = splits.index_of(&writes[at].0);
            // `writes[at]` is in split `idx`, so the run is never empty.
            let end = match splits.end_of(idx) {
                Some(e) => at + writes[at..sorted].partition_point(|w| w.0.as_slice() < e),
                None => sorted,
            };
            runs.push((idx, end - at));
            at = end;
        }
        if catalog_changed {
            runs.push((splits.index_of(CATALOG_KEY), 1));
        }
        let mut groups: Vec<(usize, Vec<Write>)> = if let [(idx, _)] = runs.as_slice() {
            vec![(*idx, writes)]
        } else {
            let mut it = writes.into_iter();
            runs.iter()
                .map(|(idx, n)| (*idx, it.by_ref().take(*n).collect()))
                .collect()
        };
        // The catalog key sorts first, so groups may repeat a split only if
        // the catalog shares split 0 with later keys: merge such groups.
        groups.sort_by_key(|(i, _)| *i);
        groups.dedup_by(|b, a| {
            if a.0 == b.0 {
                a.1.append(&mut b.1);
                true
            } else {
                false
            }
        });
        // By id: the map may change (split maintenance) once it is unlocked.
        let mut groups: Vec<(u64, Vec<Write>)> = groups
            .into_iter()
            .map(|(i, ws)| (splits.splits()[i].id, ws))
            .collect();
        drop(splits);
        let info = CommitInfo {
            ts,
            splits: groups.iter().map(|(id, _)| *id).collect(),
            two_phase: groups.len() > 1,
        };
        // Register the commit: later transactions validate against its
        // writes from now on, and nothing at or after `ts` becomes visible
        // until it finishes.
        log.last_ts = ts;
        log.recent.push_back((ts, Arc::new(write_set)));
        // Forget commits no live snapshot predates.
        let oldest = self
            .mgr
            .active
            .lock()
            .map_err(|_| Error::Poisoned)?
            .keys()
            .next()
            .copied();
        while let Some((front_ts, _)) = log.recent.front() {
            if oldest.is_none_or(|o| *front_ts <= o) {
                log.recent.pop_front();
            } else {
                break;
            }
        }
        let deltas: Vec<SplitDelta> = groups
            .iter()
            .map(|(id, ws)| SplitDelta::of(*id, ws))
            .collect();
        // One split: the batch is logged now, under the commit lock, so
        // one-split commits are logged in timestamp order (see `Pipeline`);
        // its writes move into it, uncopied.
        let one_split = groups.len() == 1;
        let logged = match groups.as_mut_slice() {
            [(_, ws)] => {
                let ws = std::mem::take(ws);
                self.mgr
                    .check_crash(CrashPoint::BeforePrepare)
                    .and_then(|_| {
                        let mut b = Batch::default();
                        b.versions_owned(ts, ws);
                        self.mgr.apply_final(b, ts)
                    })
            }
            _ => Ok(0),
        };
        self.mgr
            .pipeline
            .lock()
            .map_err(|_| Error::Poisoned)?
            .in_flight
            .insert(ts, *logged.as_ref().unwrap_or(&0));
        drop(log);

        // Outside the commit lock: other commits validate, apply and flush
        // meanwhile, and share this one's flushes.
        let result = match logged {
            Err(e) => Err(e),
            Ok(_) if one_split => self.mgr.make_durable(),
            Ok(_) => self.mgr.two_phase_commit(ts, &groups),
        };
        if let Err(e) = result {
            if let Some(prev) = previous {
                if let Ok(mut cached) = self.mgr.catalog.write() {
                    if cached.0 == ts {
                        *cached = prev;
                    }
                }
            }
            if !self.mgr.crashed.load(Ordering::SeqCst) {
                self.mgr.finish_commit(ts, false)?;
            }
            return Err(e);
        }
        span.record("ts", ts);
        span.record("splits", tracing::field::debug(&info.splits));
        span.record("two_phase", info.two_phase);
        self.mgr.finish_commit(ts, true)?;
        // Counted once visible: see `maintenance`.
        self.mgr.splits.note_commit(&deltas, layout);
        Ok(Some(info))
    }
}

/// See [`Transaction::point_reader`].
#[derive(Clone)]
pub struct PointReader {
    read_ts: Timestamp,
    read_lsn: u64,
    overlay: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    pending: BTreeSet<Vec<u8>>,
    reads: Arc<Mutex<ReadSet>>,
}

impl PointReader {
    pub fn get(&self, mgr: &Arc<TxnManager>, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(w) = self.overlay.get(key) {
            if self.pending.contains(key) {
                return Err(Error::PendingCommitTimestamp);
            }
            return Ok(w.clone());
        }
        lock_reads(&self.reads).points.insert(key.to_vec());
        mgr.note_read(key, Some(key));
        Ok(mgr.store.get_at(key, self.read_ts, self.read_lsn)?)
    }
}

/// See [`Transaction::snapshot`].
#[derive(Clone)]
pub struct Snapshot {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
    read_ts: Timestamp,
    read_lsn: u64,
    overlay: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Keys of `overlay` holding the commit-timestamp placeholder.
    pending: BTreeSet<Vec<u8>>,
}

impl Snapshot {
    pub fn into_iter(self, mgr: &Arc<TxnManager>) -> TxnScan {
        let store = mgr.store.scan_at(
            &self.start,
            self.end.as_deref(),
            self.read_ts,
            self.read_lsn,
        );
        TxnScan {
            store,
            peeked: None,
            overlay: self.overlay.into_iter().peekable(),
            pending: self.pending,
        }
    }
}

/// A buffered write: `None` deletes the key.
type BufferedWrite = (Vec<u8>, Option<Vec<u8>>);

/// Merges the store's snapshot with the transaction's buffered writes.
pub struct TxnScan {
    store: spindle_storage::ScanIter,
    /// The store's next item, once looked at (`Some(None)`: the store is
    /// exhausted).
    peeked: Option<Option<StoreItem>>,
    overlay: std::iter::Peekable<std::vec::IntoIter<BufferedWrite>>,
    pending: BTreeSet<Vec<u8>>,
}

type StoreItem = std::result::Result<(Vec<u8>, Vec<u8>), spindle_storage::Error>;

impl TxnScan {
    /// Continues at the first key `>= key`, skipping what lies between
    /// without reading it from the store (see `ScanIter::seek`). `key` must
    /// not be before a key already returned. The skipped range stays in
    /// the transaction's read set (the whole scanned range was recorded).
    pub fn seek(&mut self, key: &[u8]) {
        let ahead = matches!(&self.peeked, Some(Some(Ok((k, _)))) if k.as_slice() >= key);
        if !ahead {
            self.peeked = None;
            self.store.seek(key);
        }
        while self.overlay.peek().is_some_and(|(k, _)| k.as_slice() < key) {
            self.overlay.next();
        }
    }

    /// The next `(key, value)` handed to `f` as borrowed slices: straight
    /// from the store's pages (no copy) while no buffered write or peeked
    /// entry is in the way, which is every row of a read-only scan.
    pub fn next_with<R>(&mut self, f: impl FnOnce(&[u8], &[u8]) -> R) -> Option<Result<R>> {
        if self.peeked.is_none() && self.overlay.peek().is_none() {
            return self.store.next_with(f).map(|r| r.map_err(Error::from));
        }
        self.next().map(|r| r.map(|(k, v)| f(&k, &v)))
    }

    /// The next entries handed to `f` in order, as `next_with` hands one,
    /// until `f` returns false: several per call (up to a B-tree leaf's,
    /// `spindle_storage::ScanIter::run_with`) while no buffered write or
    /// peeked entry is in the way, else one. `Ok(true)`: more may follow;
    /// `Ok(false)`: the scan is done.
    pub fn run_with(&mut self, mut f: impl FnMut(&[u8], &[u8]) -> bool) -> Result<bool> {
        if self.peeked.is_none() && self.overlay.peek().is_none() {
            return self.store.run_with(f).map_err(Error::from);
        }
        match self.next() {
            None => Ok(false),
            Some(item) => {
                let (k, v) = item?;
                f(&k, &v);
                Ok(true)
            }
        }
    }

    /// Hands the far half of what is left to a new scan, so that two
    /// threads can read one range; see `spindle_storage::ScanIter::
    /// split_off` (`after` is the last key this scan returned). Only a scan
    /// with no buffered write ahead of it and nothing peeked is split
    /// (else `None`): its rows are then exactly the store's.
    pub fn split_off(&mut self, after: &[u8]) -> Option<TxnScan> {
        if self.peeked.is_some() || self.overlay.peek().is_some() || !self.pending.is_empty() {
            return None;
        }
        let store = self.store.split_off(after)?;
        Some(TxnScan {
            store,
            peeked: None,
            overlay: Vec::new().into_iter().peekable(),
            pending: BTreeSet::new(),
        })
    }

    fn peek_store(&mut self) -> Option<&StoreItem> {
        if self.peeked.is_none() {
            self.peeked = Some(self.store.next());
        }
        self.peeked.as_ref().and_then(|p| p.as_ref())
    }

    fn next_store(&mut self) -> Option<StoreItem> {
        match self.peeked.take() {
            Some(item) => item,
            None => self.store.next(),
        }
    }
}

impl Iterator for TxnScan {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            // Which side comes first: the store's next key or the overlay's
            // (the overlay wins ties: it is this transaction's own write).
            let order = {
                let overlay_key = self.overlay.peek().map(|(k, _)| k.as_slice());
                let overlay_key = overlay_key.map(|k| k.to_vec());
                match (self.peek_store(), overlay_key) {
                    (Some(Err(_)), _) => None,
                    (None, None) => return None,
                    (Some(Ok(_)), None) => Some(std::cmp::Ordering::Greater),
                    (None, Some(_)) => Some(std::cmp::Ordering::Less),
                    (Some(Ok((sk, _))), Some(ok)) => Some(ok.as_slice().cmp(sk.as_slice())),
                }
            };
            let take_overlay = match order {
                None => return self.next_store().map(|r| r.map_err(Error::from)),
                Some(std::cmp::Ordering::Greater) => false,
                Some(std::cmp::Ordering::Equal) => {
                    self.next_store();
                    true
                }
                Some(std::cmp::Ordering::Less) => true,
            };
            if take_overlay {
                if let Some((k, v)) = self.overlay.next() {
                    if !self.pending.is_empty() && self.pending.contains(&k) {
                        return Some(Err(Error::PendingCommitTimestamp));
                    }
                    match v {
                        Some(v) => return Some(Ok((k, v))),
                        None => continue,
                    }
                }
            } else {
                return self.next_store().map(|r| r.map_err(Error::from));
            }
        }
    }
}

/// Keys that INSERTs found absent from the store, kept as one stretch of
/// the transaction's snapshot ([`Transaction::insert_absent`]).
///
/// A bulk load probes ascending keys the store does not hold, each a
/// B-tree lookup (17% of an embedded INSERT's time in `perf`). One scan to
/// the next live key at the snapshot answers them all:
///
/// ```text
///   store@read_ts:  … 20 07 0c │ no live key here  │ 20 07 0f …
///                              lo ──────────────── hi (exclusive; none: to the end)
/// ```
///
/// After [`ASCENDING_MISSES`] lookups in a row found ascending keys
/// absent, the next miss scans for the next live key after it and keeps
/// `[lo, hi)`; a key inside is absent without a lookup. Random keys rarely
/// make such a run, so they keep their one lookup each. The snapshot does
/// not change, so the stretch stays true until `read_ts` moves
/// (`refresh_for` clears it). An absence is not recorded as a read, with
/// or without the stretch: the key's write is validated at commit.
#[derive(Default)]
struct AbsentKeys {
    lo: Vec<u8>,
    hi: Option<Vec<u8>>,
    known: bool,
    last_miss: Vec<u8>,
    run: u32,
}

/// Ascending misses before [`AbsentKeys`] scans for the next live key.
const ASCENDING_MISSES: u32 = 8;

impl AbsentKeys {
    fn covers(&self, key: &[u8]) -> bool {
        self.known && key >= self.lo.as_slice() && self.hi.as_deref().is_none_or(|h| key < h)
    }

    fn clear(&mut self) {
        self.known = false;
        self.run = 0;
    }

    /// `key` was looked up in the store at `ts` and is absent.
    fn missed(&mut self, store: &Store, key: &[u8], ts: Timestamp, lsn: u64) -> Result<()> {
        // The same key again (an INSERT that probes, then writes): the
        // run neither grows nor ends.
        if key == self.last_miss.as_slice() {
            return Ok(());
        }
        self.run = if key > self.last_miss.as_slice() {
            self.run + 1
        } else {
            0
        };
        self.last_miss.clear();
        self.last_miss.extend_from_slice(key);
        if self.run >= ASCENDING_MISSES {
            // The stretch is learnt by a scan, which waits for the applier
            // to reach the snapshot where the data file is behind in the
            // scanned keys; a point read does not wait. While an unapplied
            // batch writes at or after `key`, go on with point reads and
            // try again at the next miss. (A batch below it, such as the
            // previous commit of a load in ascending key order, does not
            // hold the stretch back: that commit is applied in the
            // background for up to 10 ms, the length of a whole
            // 10 000-row load.)
            if !store.is_applied_in(key, None, lsn)? {
                return Ok(());
            }
            self.run = 0;
            let next = store
                .scan_at(key, None, ts, lsn)
                .next_with(|k, _| k.to_vec())
                .transpose()?;
            self.lo.clear();
            self.lo.extend_from_slice(key);
            self.hi = next;
            self.known = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mgr() -> Arc<TxnManager> {
        TxnManager::new(Store::open_temporary().unwrap()).unwrap()
    }

    /// A split's delta carries its writes' smallest and largest key, also
    /// when the catalog key (which sorts first) was pushed after the rest.
    #[test]
    fn a_split_delta_is_bounded_by_its_smallest_and_largest_key() {
        let w = |k: &[u8]| (k.to_vec(), Some(b"v".to_vec()));
        let bounds = |ws: &[Write]| {
            let d = SplitDelta::of(1, ws);
            (d.first, d.last)
        };
        assert_eq!(bounds(&[]), (vec![], vec![]));
        assert_eq!(bounds(&[w(b"k")]), (b"k".to_vec(), b"k".to_vec()));
        assert_eq!(
            bounds(&[w(b"b"), w(b"c"), w(b"d")]),
            (b"b".to_vec(), b"d".to_vec())
        );
        assert_eq!(
            bounds(&[w(b"b"), w(b"c"), w(CATALOG_KEY)]),
            (CATALOG_KEY.to_vec(), b"c".to_vec())
        );
        assert_eq!(
            bounds(&[w(b"c"), w(CATALOG_KEY)]),
            (CATALOG_KEY.to_vec(), b"c".to_vec())
        );
    }

    #[test]
    fn a_locked_update_waits_and_reads_the_committed_value() {
        let m = mgr();
        let (k, other) = (b"\x20k".to_vec(), b"\x20o".to_vec());
        let mut setup = m.begin().unwrap();
        setup.put(k.clone(), b"1".to_vec());
        setup.put(other.clone(), b"x".to_vec());
        setup.commit().unwrap();

        let mut t1 = m.begin().unwrap();
        let mut t2 = m.begin().unwrap();
        assert!(t1.lock_key(&k, true).unwrap());
        assert_eq!(t1.get(&k).unwrap(), Some(b"1".to_vec()));
        t1.put(k.clone(), b"2".to_vec());
        // t2 read something t1 does not write before it updates k.
        assert_eq!(t2.get(&other).unwrap(), Some(b"x".to_vec()));
        assert!(!t2.lock_key(&k, false).unwrap(), "t1 holds the lock");
        let before = t2.read_ts();
        let waiter = std::thread::spawn(move || {
            assert!(t2.lock_key(&k, true).unwrap());
            let seen = t2.get(&k).unwrap();
            t2.put(k.clone(), b"3".to_vec());
            let read_ts = t2.read_ts();
            t2.commit().map(|_| (seen, read_ts))
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "t2 waits for t1's lock");
        let committed = t1.commit().unwrap().unwrap().ts;
        let (seen, read_ts) = waiter.join().unwrap().unwrap();
        // Without the refresh t2 would read 1 and fail at commit.
        assert_eq!(seen, Some(b"2".to_vec()));
        assert!(read_ts >= committed && read_ts > before);
        let t = m.begin().unwrap();
        assert_eq!(t.get(b"\x20k").unwrap(), Some(b"3".to_vec()));
        assert_eq!(m.locks.len(), 0);
    }

    /// A commit is acknowledged once its log record is durable, even with
    /// the store's applier held. A snapshot taken after it, or moved past
    /// it by a lock, reads its row by key at once (from the log's
    /// unapplied batches); a scan waits until the data file has it, then
    /// sees it.
    #[test]
    fn snapshots_after_a_commit_read_it_before_it_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let m = TxnManager::new(Store::open(dir.path()).unwrap()).unwrap();
        let (k, other) = (b"\x20k".to_vec(), b"\x20o".to_vec());
        let mut setup = m.begin().unwrap();
        setup.put(other.clone(), b"x".to_vec());
        setup.put(k.clone(), b"0".to_vec());
        setup.commit().unwrap();
        // (A lone commit's small batch may gather: the data file is to
        // have the setup before the applier is held.)
        m.store().wait_applied().unwrap();
        let mut stale = m.begin().unwrap();
        assert_eq!(stale.get(&other).unwrap(), Some(b"x".to_vec()));
        let older = m.begin().unwrap();

        std::thread::scope(|scope| {
            // Inside the scope: a failed assertion drops it before the
            // scope waits for the threads.
            let pause = m.store().pause_applier().unwrap().unwrap();
            let (done, acked) = std::sync::mpsc::channel();
            let (m1, k1) = (&m, k.clone());
            scope.spawn(move || {
                let mut t = m1.begin().unwrap();
                t.put(k1, b"1".to_vec());
                done.send(t.commit().map(|_| ())).unwrap();
            });
            let acked = acked.recv_timeout(std::time::Duration::from_secs(10));
            assert!(
                matches!(acked, Ok(Ok(()))),
                "the commit waited for the applier: {acked:?}"
            );
            // Not applied: the data file still has the old row.
            assert_eq!(m.store().get(&k, u64::MAX).unwrap(), Some(b"0".to_vec()));
            let fresh = m.begin().unwrap();
            assert_eq!(fresh.get(&k).unwrap(), Some(b"1".to_vec()));
            assert_eq!(fresh.get(&other).unwrap(), Some(b"x".to_vec()));
            // An older snapshot still reads the old row by key.
            assert_eq!(older.get(&k).unwrap(), Some(b"0".to_vec()));
            // A lock moves the stale one past the commit.
            assert!(stale.lock_key(&k, true).unwrap());
            assert_eq!(stale.get(&k).unwrap(), Some(b"1".to_vec()));
            let scan = scope.spawn(|| {
                m.begin()
                    .unwrap()
                    .scan(b"\x20", None)
                    .map(|r| r.unwrap())
                    .collect::<Vec<_>>()
            });
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(!scan.is_finished(), "a scan read before the apply");
            drop(pause);
            assert_eq!(
                scan.join().unwrap(),
                vec![(k.clone(), b"1".to_vec()), (other.clone(), b"x".to_vec())]
            );
        });
    }

    /// Ascending INSERTs make [`AbsentKeys`] skip the store's lookup for
    /// a stretch with no live key; stored keys at and after its end, and
    /// keys committed after the snapshot moved, are still found.
    #[test]
    fn inserts_over_a_stretch_known_absent_still_find_stored_keys() {
        let m = mgr();
        let key = |i: u32| format!("\x20t{i:05}").into_bytes();
        let mut setup = m.begin().unwrap();
        for i in (0..10).chain([100, 101]) {
            setup.put(key(i), b"old".to_vec());
        }
        setup.commit().unwrap();

        let mut t = m.begin().unwrap();
        for i in 10..60 {
            assert_eq!(
                t.insert_absent(key(i), b"new".to_vec()).unwrap(),
                None,
                "{i}"
            );
        }
        assert!(t.absent.known, "the ascending misses made a stretch");
        assert_eq!(t.absent.hi.as_deref(), Some(key(100).as_slice()));
        // The stretch's end and a key before it are stored.
        let present = t.insert_absent(key(100), b"new".to_vec()).unwrap();
        assert_eq!(present, Some((key(100), b"old".to_vec())));
        let present = t.insert_absent(key(5), b"new".to_vec()).unwrap();
        assert_eq!(present, Some((key(5), b"old".to_vec())));
        // The probe of an INSERT into a table with indexes uses it too.
        assert_eq!(t.get_for_insert(&key(80)).unwrap(), None);
        assert_eq!(t.get_for_insert(&key(100)).unwrap(), Some(b"old".to_vec()));

        // Another transaction commits keys inside the stretch; once t's
        // snapshot moves past them (a refresh for a locked key), t sees them.
        let mut u = m.begin().unwrap();
        u.put(key(70), b"u".to_vec());
        u.put(key(101), b"u".to_vec());
        u.commit().unwrap();
        assert_eq!(t.insert_absent(key(69), b"new".to_vec()).unwrap(), None);
        assert!(t.lock_key(&key(101), true).unwrap());
        assert!(!t.absent.known, "the refresh forgot the stretch");
        let present = t.insert_absent(key(70), b"new".to_vec()).unwrap();
        assert_eq!(present, Some((key(70), b"u".to_vec())));
        t.commit().unwrap();
        let r = m.begin().unwrap();
        assert_eq!(r.get(&key(70)).unwrap(), Some(b"u".to_vec()));
        assert_eq!(r.get(&key(59)).unwrap(), Some(b"new".to_vec()));
    }

    /// A load in ascending key order learns its stretch while an earlier
    /// commit below its keys is still on its way into the data file (the
    /// previous transaction of a load, applied in the background); a
    /// commit not yet applied at or after its keys holds the stretch back,
    /// and the key it wrote is found all the same.
    #[test]
    fn the_stretch_is_learnt_while_only_keys_below_it_are_unapplied() {
        let dir = tempfile::tempdir().unwrap();
        let m = TxnManager::new(Store::open(dir.path()).unwrap()).unwrap();
        let key = |i: u32| format!("\x20t{i:05}").into_bytes();
        let mut setup = m.begin().unwrap();
        setup.put(key(500), b"old".to_vec());
        setup.commit().unwrap();
        m.store().wait_applied().unwrap();
        let pause = m.store().pause_applier().unwrap().unwrap();
        // Unapplied below the load's keys.
        let mut below = m.begin().unwrap();
        for i in 0..10 {
            below.put(key(i), b"below".to_vec());
        }
        below.commit().unwrap();
        let mut t = m.begin().unwrap();
        for i in 10..30 {
            assert_eq!(t.insert_absent(key(i), b"t".to_vec()).unwrap(), None);
        }
        assert!(t.absent.known, "only keys below the load are unapplied");
        assert_eq!(t.absent.hi.as_deref(), Some(key(500).as_slice()));
        assert_eq!(
            t.insert_absent(key(500), b"t".to_vec()).unwrap(),
            Some((key(500), b"old".to_vec()))
        );
        assert_eq!(
            t.insert_absent(key(5), b"t".to_vec()).unwrap(),
            Some((key(5), b"below".to_vec()))
        );
        drop(t);

        // Unapplied above the load's start: no stretch, point reads.
        let mut above = m.begin().unwrap();
        above.put(key(300), b"above".to_vec());
        above.commit().unwrap();
        let mut t = m.begin().unwrap();
        for i in 100..130 {
            assert_eq!(t.insert_absent(key(i), b"t".to_vec()).unwrap(), None);
        }
        assert!(!t.absent.known, "a batch at key 300 is not applied");
        assert_eq!(
            t.insert_absent(key(300), b"t".to_vec()).unwrap(),
            Some((key(300), b"above".to_vec()))
        );
        // Once it is applied, the next misses learn the stretch up to it.
        drop(pause);
        m.store().wait_applied().unwrap();
        for i in 130..150 {
            assert_eq!(t.insert_absent(key(i), b"t".to_vec()).unwrap(), None);
        }
        assert!(t.absent.known);
        assert_eq!(t.absent.hi.as_deref(), Some(key(300).as_slice()));
        t.commit().unwrap();
        let r = m.begin().unwrap();
        assert_eq!(r.get(&key(149)).unwrap(), Some(b"t".to_vec()));
        assert_eq!(r.get(&key(300)).unwrap(), Some(b"above".to_vec()));
    }

    /// A key committed after the snapshot inside the stretch is absent to
    /// the transaction, and its INSERT then conflicts at commit.
    #[test]
    fn an_insert_in_the_stretch_of_a_key_committed_meanwhile_conflicts() {
        let m = mgr();
        let key = |i: u32| format!("\x20t{i:05}").into_bytes();
        let mut t = m.begin().unwrap();
        for i in 0..20 {
            assert_eq!(t.insert_absent(key(i), b"t".to_vec()).unwrap(), None);
        }
        assert!(t.absent.known);
        let mut u = m.begin().unwrap();
        u.put(key(30), b"u".to_vec());
        u.commit().unwrap();
        assert_eq!(t.insert_absent(key(30), b"t".to_vec()).unwrap(), None);
        assert!(matches!(t.commit(), Err(Error::Conflict)));
        let r = m.begin().unwrap();
        assert_eq!(r.get(&key(30)).unwrap(), Some(b"u".to_vec()));
        assert_eq!(r.get(&key(0)).unwrap(), None);
    }

    #[test]
    fn a_refresh_over_a_changed_read_is_a_conflict() {
        let m = mgr();
        let (k, r) = (b"\x20k".to_vec(), b"\x20r".to_vec());
        let mut setup = m.begin().unwrap();
        setup.put(b"\x20s".to_vec(), b"0".to_vec());
        setup.commit().unwrap();
        let mut t1 = m.begin().unwrap();
        let mut t2 = m.begin().unwrap();
        let mut stale = m.begin_at(m.store().visible_ts()).unwrap();
        t1.lock_key(&k, true).unwrap();
        t1.put(k.clone(), b"1".to_vec());
        t1.put(r.clone(), b"1".to_vec());
        // t2 read r, which t1 then changes: running t2 after t1 would
        // have read another value, so it cannot move past t1.
        assert_eq!(t2.get(&r).unwrap(), None);
        t1.commit().unwrap();
        assert!(matches!(t2.lock_key(&k, true), Err(Error::Conflict)));
        // t2 keeps the lock until it ends, as after any failed statement.
        assert!(!stale.lock_key(&k, false).unwrap());
        drop(t2);
        // A stale read's snapshot is the caller's choice: never moved.
        assert!(matches!(stale.lock_key(&k, true), Err(Error::Conflict)));
        drop(stale);
        // Nothing changed after t3's snapshot: no refresh, no conflict.
        let mut t3 = m.begin().unwrap();
        let ts = t3.read_ts();
        assert!(t3.lock_key(&k, true).unwrap());
        assert_eq!(t3.read_ts(), ts);
        drop(t3);
        assert_eq!(
            m.locks.len(),
            0,
            "dropping a transaction releases its locks"
        );
    }

    #[test]
    fn crossed_lock_waits_end_in_a_deadlock_error() {
        let m = mgr();
        let (a, b) = (b"\x20a".to_vec(), b"\x20b".to_vec());
        let mut t1 = m.begin().unwrap();
        let mut t2 = m.begin().unwrap();
        t1.lock_key(&a, true).unwrap();
        t2.lock_key(&b, true).unwrap();
        let b2 = b.clone();
        let waiter = std::thread::spawn(move || {
            let got = t1.lock_key(&b2, true);
            (t1, got)
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        let err = t2.lock_key(&a, true).unwrap_err();
        assert!(matches!(err, Error::Deadlock) && err.is_retryable());
        drop(t2);
        let (mut t1, got) = waiter.join().unwrap();
        assert!(got.unwrap());
        t1.put(b, b"1".to_vec());
        t1.commit().unwrap();
    }

    #[test]
    fn a_lock_wait_honours_the_timeout() {
        let m = mgr();
        let k = b"\x20k".to_vec();
        let mut t1 = m.begin().unwrap();
        let mut t2 = m.begin().unwrap();
        t1.lock_key(&k, true).unwrap();
        t2.set_lock_timeout(Some(std::time::Duration::from_millis(30)));
        assert!(matches!(t2.lock_key(&k, true), Err(Error::LockTimeout)));
    }

    fn keys(t: &Transaction) -> Vec<(Vec<u8>, Vec<u8>)> {
        t.scan(b"\x20", None).map(|r| r.unwrap()).collect()
    }

    #[test]
    fn reads_see_own_writes_over_snapshot() {
        let m = mgr();
        let mut t = m.begin().unwrap();
        t.put(b"\x20a".to_vec(), b"1".to_vec());
        t.put(b"\x20c".to_vec(), b"3".to_vec());
        t.commit().unwrap();
        let mut t = m.begin().unwrap();
        t.put(b"\x20b".to_vec(), b"2".to_vec());
        t.delete(b"\x20c".to_vec());
        t.put(b"\x20a".to_vec(), b"1'".to_vec());
        assert_eq!(
            keys(&t),
            vec![
                (b"\x20a".to_vec(), b"1'".to_vec()),
                (b"\x20b".to_vec(), b"2".to_vec())
            ]
        );
        // Another transaction does not see uncommitted writes.
        let other = m.begin().unwrap();
        assert_eq!(keys(&other).len(), 2);
        t.commit().unwrap();
        assert_eq!(keys(&other).len(), 2, "snapshot is stable");
        assert_eq!(keys(&m.begin().unwrap()).len(), 2);
    }

    /// A scan read in runs (`TxnScan::run_with`) returns what one read
    /// entry by entry does: the store's entries in runs, merged with the
    /// transaction's own writes one at a time where they lie ahead.
    #[test]
    fn runs_read_what_single_steps_read_over_own_writes() {
        let m = mgr();
        let key = |i: u32| format!("\x20k{i:05}").into_bytes();
        let mut t = m.begin().unwrap();
        for i in (0..3000).step_by(2) {
            t.put(key(i), vec![b's'; 40]);
        }
        t.commit().unwrap();
        let mut t = m.begin().unwrap();
        for i in (1..200).step_by(10) {
            t.put(key(i), b"new".to_vec());
        }
        for i in (100..300).step_by(4) {
            t.delete(key(i));
        }
        t.put(key(40), b"changed".to_vec());
        let want = keys(&t);
        for stop_every in [1, 7, usize::MAX] {
            let mut it = t.scan(b"\x20", None);
            let mut got = Vec::new();
            while it
                .run_with(|k, v| {
                    got.push((k.to_vec(), v.to_vec()));
                    got.len() % stop_every != 0
                })
                .unwrap()
            {}
            assert_eq!(got, want, "runs stopped every {stop_every} entries");
        }
        assert_eq!(want.len(), 1500 + 20 - 50);
    }

    #[test]
    fn scan_seek_skips_store_and_buffered_keys() {
        let m = mgr();
        let mut t = m.begin().unwrap();
        for k in ["\x20a", "\x20b1", "\x20b2", "\x20c", "\x20e"] {
            t.put(k.as_bytes().to_vec(), b"s".to_vec());
        }
        t.commit().unwrap();
        let mut t = m.begin().unwrap();
        t.put(b"\x20b3".to_vec(), b"o".to_vec());
        t.put(b"\x20d".to_vec(), b"o".to_vec());
        t.delete(b"\x20e".to_vec());
        let mut it = t.scan(b"\x20", None);
        assert_eq!(it.next().unwrap().unwrap().0, b"\x20a");
        assert_eq!(it.next().unwrap().unwrap().0, b"\x20b1");
        // Skip the rest of "b…" in the store and in the buffer.
        it.seek(b"\x20c");
        let rest: Vec<Vec<u8>> = it.map(|r| r.unwrap().0).collect();
        assert_eq!(rest, vec![b"\x20c".to_vec(), b"\x20d".to_vec()]);
        // Seeking to where the scan already is changes nothing; past the
        // end ends it.
        let mut it = t.scan(b"\x20", None);
        it.seek(b"\x20a");
        assert_eq!(it.next().unwrap().unwrap().0, b"\x20a");
        it.seek(b"\xff");
        assert!(it.next().is_none());
    }

    proptest::proptest! {
        /// The commit log's write set answers as a `BTreeSet` of the same
        /// keys would, for points and ranges, whatever order the keys came in.
        #[test]
        fn a_write_set_answers_as_a_tree_set(
            keys in proptest::collection::vec(proptest::collection::vec(0u8..4, 0..4), 0..40),
            probes in proptest::collection::vec(
                (proptest::collection::vec(0u8..4, 0..4), proptest::option::of(proptest::collection::vec(0u8..4, 0..4))),
                1..20,
            ),
        ) {
            let tree: BTreeSet<Vec<u8>> = keys.iter().cloned().collect();
            let set = WriteSet::new(keys.iter().map(|k| k.as_slice()));
            for (start, end) in probes {
                proptest::prop_assert_eq!(set.contains(&start), tree.contains(&start));
                if end.as_ref().is_some_and(|e| *e < start) {
                    continue;
                }
                let upper = match &end {
                    Some(e) => Bound::Excluded(e.clone()),
                    None => Bound::Unbounded,
                };
                let want = tree.range((Bound::Included(start.clone()), upper)).next().is_some();
                proptest::prop_assert_eq!(set.any_in(&start, end.as_deref()), want);
            }
        }
    }

    proptest::proptest! {
        /// A write set of keys in order plus one more at the end (a DDL
        /// commit's catalog key) holds the keys sorted, each once.
        #[test]
        fn a_write_set_puts_a_last_key_in_its_place(
            keys in proptest::collection::btree_set(proptest::collection::vec(0u8..4, 0..4), 0..40),
            last in proptest::collection::vec(0u8..4, 0..4),
        ) {
            let mut all: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
            all.push(&last);
            let set = WriteSet::new(all);
            let mut tree = keys.clone();
            tree.insert(last.clone());
            let got: Vec<&[u8]> = (0..set.ends.len()).map(|i| set.key(i)).collect();
            let want: Vec<&[u8]> = tree.iter().map(|k| k.as_slice()).collect();
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn ascending_absent_keys_are_looked_up_in_the_store_only_at_first() {
        let m = mgr();
        let mut seed = m.begin().unwrap();
        seed.put(b"\x20a".to_vec(), b"v".to_vec());
        seed.put(b"\x30z".to_vec(), b"v".to_vec());
        seed.commit().unwrap();
        let mut t = m.begin().unwrap();
        for i in 0u32..1_000 {
            let mut k = b"\x20m".to_vec();
            k.extend_from_slice(&i.to_be_bytes());
            assert_eq!(t.get_for_insert(&k).unwrap(), None);
            assert_eq!(t.insert_absent(k, b"v".to_vec()).unwrap(), None);
        }
        let mut k = b"\x20m".to_vec();
        k.extend_from_slice(&999u32.to_be_bytes());
        // Each key is probed, then written (a key-less table's hidden
        // key: `get_for_insert`, then `insert_absent`): the run of misses
        // still grows, and the stretch up to the next live key is known.
        assert!(t.absent.covers(&k));
        assert_eq!(t.absent.hi.as_deref(), Some(&b"\x30z"[..]));
    }

    /// Reads counted on the splits' load, over all splits.
    fn split_reads(m: &Arc<TxnManager>) -> u64 {
        m.split_stats()
            .unwrap()
            .iter()
            .map(|s| s.reads_per_minute)
            .sum()
    }

    #[test]
    fn untracked_reads_count_on_the_split_but_cannot_commit_writes() {
        let m = mgr();
        let k = b"\x20k".to_vec();
        let mut setup = m.begin().unwrap();
        setup.put(k.clone(), b"v".to_vec());
        setup.commit().unwrap();

        // A query's transaction: the read is answered and counted on its
        // split, not kept; its commit (nothing written) succeeds.
        let mut q = m.begin().unwrap();
        q.untracked_reads();
        assert_eq!(q.get(&k).unwrap(), Some(b"v".to_vec()));
        assert!(q.reads().points.is_empty());
        assert_eq!(split_reads(&m), 1);
        // A commit of `k` after the read does not fail it: no writes, so
        // nothing to validate (as for a tracked read-only transaction).
        let mut w = m.begin().unwrap();
        w.put(k.clone(), b"w".to_vec());
        w.commit().unwrap();
        assert!(q.commit().is_ok());

        // One that writes after all is refused at commit, and nothing of
        // it is written.
        let mut bad = m.begin().unwrap();
        bad.untracked_reads();
        assert_eq!(bad.get(&k).unwrap(), Some(b"w".to_vec()));
        bad.put(k.clone(), b"lost update".to_vec());
        assert!(matches!(bad.commit(), Err(Error::UntrackedReads)));
        let r = m.begin().unwrap();
        assert_eq!(r.get(&k).unwrap(), Some(b"w".to_vec()));

        // A tracked transaction keeps the read.
        let t = m.begin().unwrap();
        t.get(&k).unwrap();
        assert_eq!(t.reads().points.len(), 1);
    }

    #[test]
    fn an_insert_of_an_absent_key_is_validated_by_its_write() {
        let m = mgr();
        // Two inserts of one absent key: the second to commit aborts,
        // though neither recorded a read (nor counted one on its split).
        let (k, other) = (b"\x20k".to_vec(), b"\x20o".to_vec());
        let mut a = m.begin().unwrap();
        let mut b = m.begin().unwrap();
        assert_eq!(a.get_for_insert(&k).unwrap(), None);
        assert_eq!(b.get_for_insert(&k).unwrap(), None);
        assert_eq!(split_reads(&m), 0);
        assert!(a.reads().points.is_empty());
        a.put(k.clone(), b"a".to_vec());
        b.put(k.clone(), b"b".to_vec());
        a.commit().unwrap();
        assert!(matches!(b.commit(), Err(Error::Conflict)));

        // A present key is a read: an insert that found it and wrote
        // nothing there (ON CONFLICT DO NOTHING) conflicts with a
        // concurrent delete of it.
        let mut a = m.begin().unwrap();
        let mut d = m.begin().unwrap();
        assert_eq!(a.get_for_insert(&k).unwrap(), Some(b"a".to_vec()));
        assert_eq!(split_reads(&m), 1);
        a.put(other.clone(), b"x".to_vec());
        d.delete(k.clone());
        d.commit().unwrap();
        assert!(matches!(a.commit(), Err(Error::Conflict)));

        // The transaction's own writes answer first, tombstones included.
        let mut t = m.begin().unwrap();
        t.put(other.clone(), b"y".to_vec());
        assert_eq!(t.get_for_insert(&other).unwrap(), Some(b"y".to_vec()));
        t.delete(other.clone());
        assert_eq!(t.get_for_insert(&other).unwrap(), None);

        // insert_absent: the same answers, and the write when absent.
        let present = |k: &[u8], v: &[u8]| Some((k.to_vec(), v.to_vec()));
        let (fresh, stored) = (b"\x20n".to_vec(), b"\x20s".to_vec());
        let mut setup = m.begin().unwrap();
        setup.put(stored.clone(), b"s".to_vec());
        setup.commit().unwrap();
        let mut t = m.begin().unwrap();
        assert_eq!(t.insert_absent(fresh.clone(), b"1".to_vec()).unwrap(), None);
        assert_eq!(
            t.insert_absent(fresh.clone(), b"2".to_vec()).unwrap(),
            present(&fresh, b"1"),
            "a second insert finds the first and writes nothing"
        );
        assert_eq!(t.insert_absent(other.clone(), b"z".to_vec()).unwrap(), None);
        assert!(t.reads().points.is_empty());
        assert_eq!(
            t.insert_absent(stored.clone(), b"t".to_vec()).unwrap(),
            present(&stored, b"s"),
            "a stored key is returned, not overwritten"
        );
        assert_eq!(t.reads().points.len(), 1);
        t.commit().unwrap();
        let r = m.begin().unwrap();
        assert_eq!(r.get(&fresh).unwrap(), Some(b"1".to_vec()));
        assert_eq!(r.get(&other).unwrap(), Some(b"z".to_vec()));
        assert_eq!(r.get(&stored).unwrap(), Some(b"s".to_vec()));
        // Two insert_absent of one absent key in concurrent transactions.
        let key2 = b"\x20q".to_vec();
        let mut a = m.begin().unwrap();
        let mut b = m.begin().unwrap();
        assert_eq!(a.insert_absent(key2.clone(), b"a".to_vec()).unwrap(), None);
        assert_eq!(b.insert_absent(key2.clone(), b"b".to_vec()).unwrap(), None);
        a.commit().unwrap();
        assert!(matches!(b.commit(), Err(Error::Conflict)));
    }

    #[test]
    fn disjoint_writers_both_commit_but_read_write_overlap_conflicts() {
        let m = mgr();
        let mut a = m.begin().unwrap();
        let mut b = m.begin().unwrap();
        a.put(b"\x20x".to_vec(), b"a".to_vec());
        b.put(b"\x20y".to_vec(), b"b".to_vec());
        a.commit().unwrap();
        b.commit().unwrap(); // disjoint blind writes: no conflict

        // Lost update: both read x, both write it; the second must abort.
        let mut a = m.begin().unwrap();
        let mut b = m.begin().unwrap();
        a.get(b"\x20x").unwrap();
        b.get(b"\x20x").unwrap();
        a.put(b"\x20x".to_vec(), b"a2".to_vec());
        b.put(b"\x20x".to_vec(), b"b2".to_vec());
        a.commit().unwrap();
        assert!(matches!(b.commit(), Err(Error::Conflict)));

        // Write skew: each reads the other's key and writes its own.
        let mut a = m.begin().unwrap();
        let mut b = m.begin().unwrap();
        a.get(b"\x20y").unwrap();
        b.get(b"\x20x").unwrap();
        a.put(b"\x20x".to_vec(), b"a3".to_vec());
        b.put(b"\x20y".to_vec(), b"b3".to_vec());
        a.commit().unwrap();
        assert!(matches!(b.commit(), Err(Error::Conflict)));

        // Phantom: a scan of a range conflicts with an insert into it.
        let mut a = m.begin().unwrap();
        let mut b = m.begin().unwrap();
        assert_eq!(a.scan(b"\x20p", Some(b"\x20q")).count(), 0);
        a.put(b"\x20z".to_vec(), b"count=0".to_vec());
        b.put(b"\x20p1".to_vec(), b"new".to_vec());
        b.commit().unwrap();
        assert!(matches!(a.commit(), Err(Error::Conflict)));

        // Read-only transactions always commit.
        let mut r = m.begin().unwrap();
        r.get(b"\x20x").unwrap();
        let mut w = m.begin().unwrap();
        w.put(b"\x20x".to_vec(), b"1".to_vec());
        w.commit().unwrap();
        assert!(r.commit().unwrap().is_none());
    }

    /// Reserves a commit timestamp as a commit does and puts it in flight
    /// with log position `lsn`: a commit whose thread has not come back
    /// (0: a two-phase commit before its last step).
    fn hold_in_flight(m: &TxnManager, lsn: u64) -> Timestamp {
        let mut log = m.commits.lock().unwrap();
        log.last_ts += 1;
        let ts = log.last_ts;
        m.pipeline.lock().unwrap().in_flight.insert(ts, lsn);
        ts
    }

    fn durable_mgr(dir: &std::path::Path) -> Arc<TxnManager> {
        TxnManager::new(Store::open(dir).unwrap()).unwrap()
    }

    /// A one-split commit whose batch is durable is finished by the next
    /// commit that finishes, without its own thread: the later commit
    /// does not wait for it, and both become visible.
    #[test]
    fn a_durable_commit_is_finished_by_a_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let m = durable_mgr(dir.path());
        let mut t = m.begin().unwrap();
        t.put(b"\x20a".to_vec(), b"1".to_vec());
        t.commit().unwrap();
        let held = hold_in_flight(&m, m.store.durable_lsn());
        let mut t = m.begin().unwrap();
        t.put(b"\x20b".to_vec(), b"2".to_vec());
        let info = t.commit().unwrap().unwrap();
        assert!(info.ts > held);
        assert!(m.store.visible_ts() >= info.ts);
        assert!(m.pipeline.lock().unwrap().in_flight.is_empty());
        // The held commit's thread comes back later: nothing left to do.
        m.finish_commit(held, true).unwrap();
        assert!(m.store.visible_ts() >= info.ts);
    }

    /// A commit in flight whose batch is not durable, or that is finished
    /// only by its own thread (a two-phase commit), still holds back every
    /// later commit until it finishes.
    #[test]
    fn a_commit_not_known_durable_holds_back_later_ones() {
        let dir = tempfile::tempdir().unwrap();
        let m = durable_mgr(dir.path());
        let mut t = m.begin().unwrap();
        t.put(b"\x20a".to_vec(), b"1".to_vec());
        t.commit().unwrap();
        for lsn in [0, m.store.durable_lsn() + 1_000] {
            let held = hold_in_flight(&m, lsn);
            let m2 = m.clone();
            let later = std::thread::spawn(move || {
                let mut t = m2.begin().unwrap();
                t.put(b"\x20b".to_vec(), lsn.to_string().into_bytes());
                t.commit().unwrap().unwrap().ts
            });
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(!later.is_finished(), "lsn {lsn}: the later commit waits");
            assert!(m.store.visible_ts() < held);
            m.finish_commit(held, true).unwrap();
            let ts = later.join().unwrap();
            assert!(ts > held && m.store.visible_ts() >= ts);
        }
    }

    #[test]
    fn commit_log_is_trimmed_when_no_snapshot_needs_it() {
        let m = mgr();
        let old = m.begin().unwrap();
        for i in 0..5u8 {
            let mut t = m.begin().unwrap();
            t.put(vec![0x20, i], vec![i]);
            t.commit().unwrap();
        }
        assert_eq!(m.commit_log_len(), 5);
        drop(old);
        let mut t = m.begin().unwrap();
        t.put(b"\x20k".to_vec(), b"v".to_vec());
        t.commit().unwrap();
        // Only the newest commit is left (`t` was still live when it trimmed).
        assert_eq!(m.commit_log_len(), 1);
    }

    #[test]
    fn gc_respects_retention_and_live_snapshots() {
        let m = mgr();
        for v in [b"1", b"2", b"3"] {
            let mut t = m.begin().unwrap();
            t.put(b"\x20k".to_vec(), v.to_vec());
            t.commit().unwrap();
        }
        // Within the retention window nothing goes.
        assert_eq!(m.gc().unwrap(), 0);
        m.set_retention(std::time::Duration::ZERO);
        let reader = m.begin().unwrap();
        let mut t = m.begin().unwrap();
        t.put(b"\x20k".to_vec(), b"4".to_vec());
        t.commit().unwrap();
        // The live reader still needs version 3; versions 1 and 2 go.
        assert_eq!(m.gc().unwrap(), 2);
        assert_eq!(reader.get(b"\x20k").unwrap(), Some(b"3".to_vec()));
        drop(reader);
        drop(t);
        // Commit timestamps can run a little ahead of the wall clock.
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(m.gc().unwrap(), 1);
        assert_eq!(
            m.begin().unwrap().get(b"\x20k").unwrap(),
            Some(b"4".to_vec())
        );
    }

    #[test]
    fn delete_range_removes_a_row_tree() {
        let m = mgr();
        let mut t = m.begin().unwrap();
        for k in [&b"\x20p"[..], b"\x20p\x20c1", b"\x20p\x20c2", b"\x20q"] {
            t.put(k.to_vec(), b"v".to_vec());
        }
        t.commit().unwrap();
        let mut t = m.begin().unwrap();
        assert_eq!(t.delete_range(b"\x20p", Some(b"\x20q")).unwrap(), 3);
        assert_eq!(keys(&t), vec![(b"\x20q".to_vec(), b"v".to_vec())]);
    }

    #[test]
    fn catalog_changes_commit_with_data() {
        let m = mgr();
        let mut t = m.begin().unwrap();
        let mut c = (**t.catalog()).clone();
        c.create_table(spindle_catalog::TableDef {
            name: "t".into(),
            columns: vec![spindle_catalog::ColumnDef {
                name: "a".into(),
                data_type: spindle_keys::DataType::Int64,
                nullable: true,
                default: None,
                allow_commit_timestamp: false,
            }],
            primary_key: vec![],
            interleave: None,
        })
        .unwrap();
        t.set_catalog(c);
        let before = m.begin().unwrap();
        t.commit().unwrap();
        assert!(before.catalog().table("t").is_none());
        assert!(m.begin().unwrap().catalog().table("t").is_some());
    }
}
