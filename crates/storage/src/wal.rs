//! # The write-ahead log: one device write and one `fdatasync` per flush
//!
//! A commit applies its writes to the data file ([`crate::kv`], redb) in a
//! write transaction that is not synced, and appends the same writes to
//! this log; a flush writes every record appended since the last one with
//! one `write` and one `fdatasync` (commits waiting meanwhile share it:
//! group commit). The data file is synced only at checkpoints. (Before,
//! with sled as the data file, sled made a batch durable with two
//! synchronous writes of its own plus an `fdatasync` of its file: three
//! device waits per commit; the log made it one.)
//!
//! ```text
//!   <dir>/wal: record* (then stale records or zeros, up to its allocated size)
//!   record:  len u32 LE │ crc32 u32 LE (of payload) │ payload (len bytes)
//!   payload: lsn u64 LE │ ops u32 LE │ op*
//!   op:      00 │ klen u32 LE │ key                      (remove)
//!            01 │ klen u32 LE │ key │ vlen u32 LE │ value (insert)
//!            02 │ klen u32 LE │ key │ ts u64 LE │ 00               (version: tombstone)
//!            02 │ klen u32 LE │ key │ ts u64 LE │ 01 │ vlen u32 LE │ value (version: row)
//! ```
//!
//! Removes and inserts are physical (metadata); a version is logical: it
//! is applied by the store's head logic (`Store::write_batch`: the key's
//! head moves to its timestamped slot, the version becomes the head),
//! which depends only on the data file's state. Replaying the records in
//! LSN order over the state the data file had after the record before
//! therefore writes exactly what the commit wrote. (Logging versions
//! rather than the physical writes they resolve to lets a record be
//! written before its batch has read the heads it replaces.)
//!
//! ## A commit: its record, its flush, its apply
//!
//! ```text
//!   committer: submit: LSN, record → pending, batch → queue ─ flush: wake applier ─ write ─ fdatasync ─ durable ─ applied? ─ done
//!   applier:                                                                 └─► redb write txn: heads, versions, meta/wal_lsn ─ commit ─ applied = LSN
//! ```
//!
//! [`Wal::submit`] only encodes the record, indexes the batch's versions
//! for point reads ([`Wal::newest_unapplied`]) and queues the batch; the
//! applier thread writes queued batches to the data file in LSN order (the
//! batches queued when it looks share one write transaction: a two-phase
//! commit's prepares and apply, or concurrent commits). A lone flush (no
//! flush has overlapped another for [`LONE_AFTER`]: one client
//! committing) wakes it at once while scans have had to wait for applies
//! lately ([`SCAN_WAITED_WITHIN`]: the client reads what it commits) or
//! when its batch is large ([`APPLY_AT_ONCE_VERSIONS`]); otherwise
//! batches gather — up to
//! [`APPLY_BATCHES`] of them, or for [`APPLY_DELAY`] (10 ms) — so that one
//! data-file transaction (its copy-on-write pages, checksums and commit)
//! serves many commits; anyone who waits for the apply (a scan, a flush
//! that needs the data file) ends the gathering. Meanwhile the committer writes and syncs
//! the log in [`Wal::flush`] (PostgreSQL's backend does the same I/O; its
//! data pages were changed before the commit). The flush returns once the
//! log is durable and the data file has every batch submitted before it
//! was called: the B-tree update (~70 µs for a TPC-B commit) runs during
//! the `fdatasync` (~200 µs here) instead of before it. A commit uses
//! [`Wal::flush_durable`], which does not wait for the apply: a bulk
//! load's B-tree update outlasts the log write, and the commit is
//! acknowledged once durable. Point reads do not wait for the apply: the
//! versions of every batch not yet applied are indexed by key
//! ([`Wal::newest_unapplied`], through `Store::get_at`); a scan waits for
//! the apply when an unapplied batch it must see writes inside its key
//! range, and only then ([`Wal::wait_applied_in`], through
//! `Store::scan_at`). A flush that finds
//! another committer's sync in progress waits for it (the waiters are
//! woken together when it ends), then, unless it covered them, one of
//! them syncs what is still pending (group commit: one sync covers every
//! record appended before it began).
//!
//! Invariants:
//! * Records get consecutive log sequence numbers (LSNs) in submission
//!   order; the pending buffer and the queue are filled in that order
//!   (under the submit lock), the buffer is emptied into the file under the
//!   output lock (the written buffer, emptied, is kept for a later write:
//!   up to 32 MiB, so a large commit's record goes to mapped memory), and
//!   the applier applies the queue in order. Each data-file
//!   transaction also writes its LSN to `meta/wal_lsn`, so the data file's
//!   state after any crash (its last durable commit, whole) holds exactly
//!   the records up to the LSN it stores.
//! * A commit becomes visible (its timestamp published) only once its
//!   record is durable. A snapshot's scan reads only once every published
//!   commit's batch is applied (`Store::scan_at`); its point read looks in
//!   the index of unapplied versions first, then in a data-file snapshot
//!   taken after the look: a batch's versions are indexed before it is
//!   queued and leave the index only after its group's redb commit, so
//!   each published version is in one or the other (or the read waits,
//!   for a key inside the key span of an unapplied batch too large to
//!   index, over [`INDEX_VERSIONS`] versions). Callers that apply without a flush and then read the
//!   data file use [`Wal::wait_applied`].
//! * A record may be durable before its batch is applied. If the apply
//!   then fails, the record would still be replayed after a restart, so the
//!   log stops ([`Error::LogStopped`]): every later submit and flush fails
//!   until the database is reopened, and recovery decides the failed
//!   commit (like a crash at that point).
//! * The file is allocated ahead, with zeros, and written in place from
//!   offset 0 again after each checkpoint: a flush then changes no file
//!   size, so its `fdatasync` writes the data alone, without a file-system
//!   journal commit (PostgreSQL zero-fills its WAL segments for the same
//!   reason). Records are written only below the allocated size
//!   (`Shared::allocated`: zeros up to it are durable). The grower thread
//!   keeps it ahead of the writes: once a flush leaves less than
//!   [`GROW_AHEAD`] of zeros after its record, the grower zero-fills and
//!   syncs the next [`ALLOCATE_BYTES`], in [`GROW_STEP`] pieces (an
//!   `fdatasync` of the log writes back every dirty page of the file, so
//!   a commit that syncs meanwhile writes one piece of zeros at most, not
//!   four megabytes). Growth holds `Shared::growing`; a flush whose record
//!   would pass the allocated size (it outran the grower, or one record is
//!   larger than the room left) takes it too, waits for the grower's
//!   piece and grows the file itself: no record is written where zeros
//!   are being written. (Before, the flush that reached the end grew the
//!   file by four megabytes and synced it in its commit: about 5 ms here,
//!   every 4 MiB of log of a new database, with every committer waiting
//!   for the output lock.)
//! * Recovery ([`Wal::recover`]) replays, in order, the records whose LSN
//!   is above the data file's, stopping at the first torn or corrupt record
//!   (one that was never acknowledged: a commit is acknowledged only after
//!   its record's `fdatasync`) or at the first record whose LSN does not
//!   follow its predecessor's (a stale record from before the last
//!   checkpoint: every newer record has a higher LSN). Then the data file
//!   is synced and the log emptied.
//! * A checkpoint restarts the log once it passes [`CHECKPOINT_BYTES`]. The
//!   applier thread runs it, after the group that was applied (readers
//!   waiting for that group are released first): with the output lock held
//!   (no record is being written, so the file holds exactly the records up
//!   to the durable LSN), it applies every batch up to that LSN, syncs the
//!   data file (a durable redb commit) and starts the log again at offset
//!   0; records appended meanwhile are still pending and go to the emptied
//!   file. No commit waits for a checkpoint's apply and sync (a million-row
//!   commit's record passes the size on its own: it used to wait for its
//!   whole apply, then the sync, in its flush); a flush that comes while
//!   one runs waits for the output lock.
//! * A batch applied to the data file whose record was not yet flushed
//!   may survive a crash anyway (a later checkpoint): it was never
//!   acknowledged, and it survives whole or not at all.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::kv::{self, Kv, WriteTable};
use crate::{Error, Result, Timestamp};

/// Log size after which a flush checkpoints (syncs the data file, empties
/// the log).
pub const CHECKPOINT_BYTES: u64 = 64 << 20;
/// The log file grows (zero-filled, then synced) by this much at a time.
pub const ALLOCATE_BYTES: u64 = 4 << 20;
/// A flush that leaves less than this much allocated after its record
/// wakes the grower thread (see the module docs).
pub const GROW_AHEAD: u64 = 2 << 20;
/// The grower zero-fills and syncs this much at a time.
pub const GROW_STEP: u64 = 256 << 10;
/// Most batches the applier writes in one data-file transaction.
const APPLY_GROUP: usize = 256;
/// While commits flush concurrently, the applier waits for this many
/// queued batches, or for [`APPLY_DELAY`], before it writes them: one
/// data-file transaction for many commits (see [`Shared::run_applier`]).
const APPLY_BATCHES: usize = 256;
/// How long queued batches wait for more before the applier writes them
/// (when nothing asked for them sooner). Each data-file transaction
/// copies every B-tree page it changes once, however often it changes it,
/// so the hot pages of concurrent commits (a few rows every transaction
/// updates, the path from the root, the end of an append-only table) are
/// copied, checksummed and freed once per group: TPC-B at 4 clients spent
/// 160 µs of applier CPU a commit in groups of ~7 (1 ms), 80 µs in groups
/// of ~100 (20 ms), 100 µs at 5 ms. A scan that needs the group waits for
/// its apply (it ends the gathering at once).
const APPLY_DELAY: std::time::Duration = std::time::Duration::from_millis(10);
/// A flush is *lone* when it runs alone and no flush has overlapped
/// another for this long: one client committing, whose next statement may
/// scan what it wrote. While scans have had to wait for the apply lately
/// ([`SCAN_WAITED_WITHIN`]), or for a large batch
/// ([`APPLY_AT_ONCE_VERSIONS`]), the applier writes a lone flush's batch
/// at once, during the sync, so that such a scan does not wait; any other
/// flush lets batches gather ([`APPLY_DELAY`]).
const LONE_AFTER: std::time::Duration = std::time::Duration::from_millis(50);
/// A lone flush has the applier write its batch at once only if a scan
/// waited for the apply ([`Wal::wait_applied_in`]) within this long (or
/// the batch is large: [`APPLY_AT_ONCE_VERSIONS`]). A
/// client whose scans read other rows than it commits (a row-tree delete
/// after a delete of another tree, TPC-B's point reads and writes) lets
/// its batches gather, one data-file transaction for many commits
/// instead of one each; the first scan that meets an unapplied batch
/// wakes the applier, waits for that group alone, and turns the at-once
/// writes back on for this long.
const SCAN_WAITED_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);
/// A lone flush has the applier write the queue at once, whatever the
/// scans, when the last batch submitted (its own) holds this many versions.
/// Gathering saves what a group
/// shares — its commit, the copies of the pages on the path to the root and
/// of hot rows' leaves — and for many versions spread over leaves of their
/// own the per-version cost dominates: a row-tree delete (26 versions) cost
/// the applier as much CPU in groups of ~8 as alone, and at one client ran
/// 8% slower for the bursts, where TPC-B's commits (4 versions) cost 22%
/// less CPU gathered (bench/README, session 37).
const APPLY_AT_ONCE_VERSIONS: usize = 16;
/// Most versions a batch may have to be indexed for point reads before it
/// is applied ([`Unapplied`]); a larger one (a bulk load) makes readers
/// wait for its apply instead.
pub(crate) const INDEX_VERSIONS: usize = 1024;

const OP_REMOVE: u8 = 0;
const OP_INSERT: u8 = 1;
const OP_VERSION: u8 = 2;

/// One physical operation on the data file: insert `key → value`, or remove `key`.
pub(crate) type Op = (Vec<u8>, Option<Vec<u8>>);

/// One logical version: key, commit timestamp, row (`None`: a tombstone).
pub(crate) type Version = (Vec<u8>, Timestamp, Option<Vec<u8>>);

/// Writes a record's batch inside a write transaction, noting in the
/// [`Replaced`] list each version that replaced a live row. The flag is
/// true on the applier thread, which yields its CPU now and then while it
/// writes (`Store::write_batch`), false in recovery.
pub(crate) type ApplyFn = fn(&mut WriteTable<'_>, &Record, &mut Replaced, bool) -> Result<()>;

/// Versions of a batch that replaced a live row: the version's index in
/// the batch and the replaced row's live bytes (key and value).
pub(crate) type Replaced = Vec<(usize, u64)>;

/// Told, after each group of batches is in the data file (and before a
/// wait for its apply returns), the logical key and replaced live bytes
/// of every version (a row or a tombstone) that replaced a live row (the
/// split statistics take them off: a commit counts every put as new
/// bytes, and a delete as nothing, because it does not know what it
/// replaces). It runs on the applier thread and must not
/// block.
pub type ReplacedObserver = Arc<dyn Fn(&mut dyn Iterator<Item = (&[u8], u64)>) + Send + Sync>;

/// Tells `observer` (if set) the keys and bytes of `replaced`, the
/// replaced rows of the batch whose versions are `versions`.
pub(crate) fn tell_replaced(
    observer: &std::sync::OnceLock<ReplacedObserver>,
    replaced: &Replaced,
    versions: &[Version],
) {
    if let (Some(observe), false) = (observer.get(), replaced.is_empty()) {
        observe(
            &mut replaced
                .iter()
                .filter_map(|&(i, bytes)| versions.get(i).map(|v| (v.0.as_slice(), bytes))),
        );
    }
}

/// A decoded record, or a submitted batch.
#[derive(Debug, PartialEq)]
pub(crate) struct Record {
    pub(crate) lsn: u64,
    pub(crate) ops: Vec<Op>,
    pub(crate) versions: Vec<Version>,
}

/// The versions of batches submitted but not yet in the data file, by
/// logical key, in key order, for point reads ([`Wal::newest_unapplied`]):
/// a snapshot may read a published commit's rows before the applier has
/// written them, instead of waiting for it; and for scans
/// ([`Wal::wait_applied_in`]): a scan waits for the apply only when an
/// unapplied batch it must see writes inside its range. A batch is indexed when it is
/// submitted (before it is queued, so before it can be applied) and its
/// entries leave once its group is committed to the data file (after the
/// data file's generation moved: a reader that looks here and then takes
/// a data-file snapshot finds every batch in one or the other).
#[derive(Default)]
struct Unapplied {
    /// Logical key → its unapplied versions, in LSN order.
    versions: std::collections::BTreeMap<Vec<u8>, Vec<UnappliedVersion>>,
    /// Each unapplied batch too large to index (more than
    /// [`INDEX_VERSIONS`] versions): its LSN and the smallest and largest
    /// logical key it writes. A point read of a key inside a span waits
    /// for the apply; any other key is answered from `versions` (a bulk
    /// load into one table does not hold up reads of another).
    spans: Vec<(u64, Vec<u8>, Vec<u8>)>,
}

/// One version in [`Unapplied`]: its batch's LSN, its commit timestamp,
/// and the row (`None`: a tombstone).
type UnappliedVersion = (u64, Timestamp, Option<Vec<u8>>);

/// Records appended but not yet written, and the LSN of the last one.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    last_lsn: u64,
    /// An emptied buffer of an earlier write, kept for the next one (up to
    /// [`SPARE_BUFFER_BYTES`]): a large commit's record then goes into
    /// memory already mapped, not into pages the kernel must fault in and
    /// zero first (page faults and zeroing of fresh memory, this buffer's
    /// among others, were a fifth to a third of the samples of a COMMIT
    /// of 100 000 to 1 000 000 rows in `perf`).
    spare: Vec<u8>,
}

/// The largest emptied record buffer kept for reuse.
const SPARE_BUFFER_BYTES: usize = 32 << 20;

/// Group commit's state ([`Shared::sync_group`]).
#[derive(Default)]
struct Lead {
    /// A flush leads: it writes and syncs (or waits for the output lock to).
    running: bool,
    /// Flushes waiting for it to end.
    waiting: usize,
}

/// The log file and where the next record goes.
struct Output {
    file: File,
    pos: u64,
}

/// Zero-fills `file` from `allocated` up to `target`, syncing (size
/// included) after every `sync_every` bytes and at the end, and storing
/// the allocated size after each sync. The grower syncs in [`GROW_STEP`]
/// pieces; a flush that grows the file itself syncs once, however large
/// its record (a million-row commit's record is tens of megabytes). The
/// caller holds `Shared::growing`.
fn grow(file: &File, allocated: &AtomicU64, target: u64, sync_every: u64) -> Result<()> {
    let mut at = allocated.load(Ordering::Acquire);
    let zeros = vec![0u8; GROW_STEP.min(target.saturating_sub(at)) as usize];
    let mut unsynced = 0;
    while at < target {
        let n = (target - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
        unsynced += n as u64;
        if unsynced >= sync_every || at >= target {
            file.sync_all()?;
            allocated.store(at, Ordering::Release);
            unsynced = 0;
        }
    }
    Ok(())
}

/// The first multiple of [`ALLOCATE_BYTES`] at or above `end`.
fn allocation_for(end: u64) -> u64 {
    end.div_ceil(ALLOCATE_BYTES) * ALLOCATE_BYTES
}

/// What the committers and the applier thread share.
struct Shared {
    pending: Mutex<Pending>,
    output: Mutex<Output>,
    /// Whether a group-commit flush is leading (writing and syncing, or
    /// waiting for `output` to do so), and how many flushes wait on
    /// `synced` for it to end rather than queue on `output`
    /// ([`Shared::sync_group`]).
    leading: Mutex<Lead>,
    /// Signalled (every waiter at once) when a leading flush ends.
    synced: Condvar,
    /// Batches submitted, not yet applied, in LSN order.
    queue: Mutex<VecDeque<Record>>,
    /// Their versions, by key, for point reads ([`Unapplied`]).
    unapplied: Mutex<Unapplied>,
    /// The LSN of the last batch submitted without being indexed (more
    /// than [`INDEX_VERSIONS`] versions; stored with `unapplied` locked):
    /// until it is applied, readers wait for the apply rather than look in
    /// the index, and flushes wake the applier at once.
    unindexed: AtomicU64,
    /// How many batches are queued (stored with `queue` locked).
    queued: AtomicUsize,
    /// How many versions the last batch submitted holds (a lone flush's
    /// own: [`APPLY_AT_ONCE_VERSIONS`]).
    last_batch_versions: AtomicUsize,
    /// Threads in [`Wal::flush_then`]: a lone flush ([`LONE_AFTER`])
    /// wakes the applier at once (it writes the batch during the sync);
    /// any other lets batches gather ([`APPLY_BATCHES`]).
    flushing: AtomicUsize,
    /// When a flush last began while another was running: microseconds
    /// since `started`, plus one (0: never).
    overlapped_at: AtomicU64,
    /// When a scan last had to wait for the apply ([`Wal::wait_applied_in`]):
    /// microseconds since `started`, plus one (0: never).
    scan_waited_at: AtomicU64,
    /// The clock of `overlapped_at` and `scan_waited_at`.
    started: std::time::Instant,
    /// Set when someone needs the queued batches applied now (a reader
    /// waiting for them, a lone flush, a full queue): the applier stops
    /// gathering.
    urgent: AtomicBool,
    /// Set by the applier, with `queue` locked, while it sleeps with
    /// nothing queued (as opposed to gathering: `applier_asleep` alone).
    applier_idle: AtomicBool,
    /// Writes a record's batch inside a write transaction (the store's
    /// head logic); recovery replays records with it too.
    apply: ApplyFn,
    /// Told what each applied group replaced ([`ReplacedObserver`]; set
    /// once, by the transaction layer).
    replaced: std::sync::OnceLock<ReplacedObserver>,
    /// Signalled by flushes and waits while batches are queued (the
    /// applier waits on `queue`).
    work: Condvar,
    /// Set by the applier, with `queue` locked, while it waits on `work`:
    /// a flush wakes it only then (a wake-up is a system call, and a busy
    /// applier looks at the queue again before it sleeps). A batch is
    /// queued under the same lock, so its submitter, whose flush or wait
    /// follows, sees the flag the applier set before it slept.
    applier_asleep: AtomicBool,
    /// Signalled (with `queue` locked) when `applied_lsn` moves while
    /// someone waits for it (`waiters`), or when the log stops.
    applied: Condvar,
    /// Threads in [`Shared::wait_applied`]'s wait (changed with `queue`
    /// locked).
    waiters: AtomicUsize,
    /// The LSN of the last record submitted.
    appended_lsn: AtomicU64,
    /// Every record up to this LSN is on the disk.
    durable_lsn: AtomicU64,
    /// Every batch up to this LSN is in the data file.
    applied_lsn: AtomicU64,
    /// A write to the log or the data file failed: the log stopped.
    failed: AtomicBool,
    /// Whether flushes share syncs (group commit).
    group: AtomicBool,
    stop: AtomicBool,
    /// `fdatasync`s of the log so far.
    syncs: AtomicU64,
    checkpoint_bytes: AtomicU64,
    /// Where the next record goes in the file (`Output::pos`, stored with
    /// the output lock held): the applier checkpoints once it passes
    /// `checkpoint_bytes`.
    log_bytes: AtomicU64,
    /// Checkpoints so far.
    checkpoints: AtomicU64,
    /// Held by the applier while it writes a group ([`Wal::pause_applier`]).
    pause: Mutex<()>,
    /// How much of the log file is zero-filled and durable: records are
    /// written below it only (see the module docs).
    allocated: AtomicU64,
    /// Held while the file grows past `allocated`.
    growing: Mutex<()>,
    /// The grower thread is asked to grow the file (set by a flush, with
    /// `grow_wake` locked when it was clear; cleared by the grower).
    grow_wanted: AtomicBool,
    grow_wake: Mutex<()>,
    grow_cv: Condvar,
    /// Growths by the grower thread, and by flushes that outran it.
    grown_ahead: AtomicU64,
    grown_inline: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| Error::Corrupt("write-ahead log lock poisoned".into()))
}

impl Shared {
    fn check(&self) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(Error::LogStopped);
        }
        Ok(())
    }

    /// Stops the log and wakes everyone waiting for the applier.
    fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        if let Ok(_q) = self.queue.lock() {
            self.applied.notify_all();
        }
    }

    /// Writes and syncs what is pending (with the output lock held); with
    /// `always`, syncs even if nothing is pending (one sync per flush: the
    /// baseline without group commit). Any failure stops the log.
    fn sync_locked(&self, out: &mut Output, always: bool) -> Result<()> {
        self.check()?;
        let r = (|| {
            let (mut buf, last) = {
                let mut p = lock(&self.pending)?;
                let spare = std::mem::take(&mut p.spare);
                (std::mem::replace(&mut p.buf, spare), p.last_lsn)
            };
            let wrote = !buf.is_empty();
            if wrote {
                let end = out.pos + buf.len() as u64;
                if end > self.allocated.load(Ordering::Acquire) {
                    // Outran the grower (or a record larger than the room
                    // left): wait for its piece, then grow here.
                    let _growing = lock(&self.growing)?;
                    if end > self.allocated.load(Ordering::Acquire) {
                        grow(&out.file, &self.allocated, allocation_for(end), u64::MAX)?;
                        self.grown_inline.fetch_add(1, Ordering::AcqRel);
                    }
                }
                out.file.write_all_at(&buf, out.pos)?;
                out.pos = end;
                self.log_bytes.store(end, Ordering::Release);
                if self.allocated.load(Ordering::Acquire).saturating_sub(end) < GROW_AHEAD {
                    self.want_growth();
                }
            }
            if wrote || always {
                out.file.sync_data()?;
                self.syncs.fetch_add(1, Ordering::AcqRel);
            }
            self.durable_lsn.fetch_max(last, Ordering::AcqRel);
            if buf.capacity() <= SPARE_BUFFER_BYTES {
                buf.clear();
                let mut p = lock(&self.pending)?;
                if p.spare.capacity() < buf.capacity() {
                    p.spare = buf;
                }
            }
            Ok(())
        })();
        if let Err(e) = &r {
            tracing::error!(error = %e, "writing the write-ahead log failed; the log stopped");
            self.fail();
        }
        r
    }

    /// Group commit: returns once every record up to `target` is durable.
    /// A flush that finds no other leading writes and syncs everything
    /// pending (its own record and every record appended meanwhile); the
    /// flushes that come while it leads wait until it ends — all woken at
    /// once — and return if it covered them, or one of them leads the
    /// next sync. (Before, they queued on the output lock, which an unlock
    /// hands to one waiter at a time: a flush covered by the sync it waited
    /// for still had to be woken, take the lock and release it in turn,
    /// one thread wake-up after another. PostgreSQL's `XLogFlush` waits
    /// the same way, `LWLockAcquireOrWait`.)
    fn sync_group(&self, target: u64) -> Result<()> {
        let mut lead = lock(&self.leading)?;
        loop {
            if self.durable_lsn.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            if !lead.running {
                break;
            }
            lead.waiting += 1;
            let woken = self.synced.wait(lead);
            lead = woken.map_err(|_| Error::Corrupt("write-ahead log lock poisoned".into()))?;
            lead.waiting -= 1;
        }
        lead.running = true;
        drop(lead);
        // Ends the lead however the sync ends, so that the next flush can
        // lead; wakes the waiters, if any (a lone committer makes no
        // wake-up call).
        struct Leading<'a>(&'a Shared);
        impl Drop for Leading<'_> {
            fn drop(&mut self) {
                let mut lead = self.0.leading.lock().unwrap_or_else(|e| e.into_inner());
                lead.running = false;
                if lead.waiting > 0 {
                    self.0.synced.notify_all();
                }
            }
        }
        let _leading = Leading(self);
        // Every record up to `target` is in the pending buffer or was
        // taken from it by a writer that holds the output lock until its
        // sync is done: once the lock is ours, this sync covers `target`.
        self.sync_locked(&mut *lock(&self.output)?, false)
    }

    /// Microseconds since the log was opened.
    fn micros(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Whether no flush has overlapped another for [`LONE_AFTER`].
    fn lone(&self) -> bool {
        match self.overlapped_at.load(Ordering::Relaxed) {
            0 => true,
            at => self.micros().saturating_sub(at - 1) >= LONE_AFTER.as_micros() as u64,
        }
    }

    /// Whether a scan waited for the apply within [`SCAN_WAITED_WITHIN`]
    /// before `now` (microseconds since `started`).
    fn scan_waited_before(&self, now: u64) -> bool {
        match self.scan_waited_at.load(Ordering::Relaxed) {
            0 => false,
            at => now.saturating_sub(at - 1) < SCAN_WAITED_WITHIN.as_micros() as u64,
        }
    }

    /// Notes that a scan is about to wait for the apply.
    fn note_scan_wait(&self) {
        self.scan_waited_at
            .store(self.micros() + 1, Ordering::Relaxed);
    }

    /// Whether `flush` should have the applier write the queued batches
    /// now rather than let them gather: it waits for them, it is lone
    /// while scans wait for applies ([`SCAN_WAITED_WITHIN`]) or with a
    /// large batch ([`APPLY_AT_ONCE_VERSIONS`]), the queue is
    /// full, or a batch too large to index is queued (readers wait for
    /// it).
    fn apply_now(&self, flush: &Flushing<'_>, wait_applied: bool) -> bool {
        wait_applied
            || flush.alone
                && self.lone()
                && (self.scan_waited_before(self.micros())
                    || self.last_batch_versions.load(Ordering::Acquire) >= APPLY_AT_ONCE_VERSIONS)
            || self.queued.load(Ordering::Acquire) >= APPLY_BATCHES
            || self.unindexed.load(Ordering::Acquire) > self.applied_lsn.load(Ordering::Acquire)
    }

    /// Wakes the applier if batches up to `lsn` are still queued.
    fn wake_applier(&self, lsn: u64) {
        if self.applied_lsn.load(Ordering::Acquire) < lsn {
            self.urgent.store(true, Ordering::SeqCst);
            if self.applier_asleep.load(Ordering::SeqCst) {
                self.work.notify_one();
            }
        }
    }

    /// Waits until every batch up to `lsn` is applied (the caller woke the
    /// applier).
    fn wait_applied(&self, lsn: u64) -> Result<()> {
        if self.applied_lsn.load(Ordering::Acquire) >= lsn {
            return self.check();
        }
        let mut q = lock(&self.queue)?;
        // Under the lock the flag is exact: a batch still queued while the
        // applier sleeps (its submitter's wake-up not yet sent) is started
        // here rather than waited for.
        if !q.is_empty() {
            self.urgent.store(true, Ordering::SeqCst);
            if self.applier_asleep.load(Ordering::SeqCst) {
                self.work.notify_one();
            }
        }
        // Counted before `applied_lsn` is read again: the applier stores
        // the LSN, then reads the count (both SeqCst), so either this
        // thread sees the new LSN or the applier sees the waiter and
        // notifies under the lock, which this thread holds until it waits.
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let r = loop {
            if let Err(e) = self.check() {
                break Err(e);
            }
            if self.applied_lsn.load(Ordering::SeqCst) >= lsn {
                break Ok(());
            }
            q = match self.applied.wait(q) {
                Ok(q) => q,
                Err(_) => break Err(Error::Corrupt("write-ahead log lock poisoned".into())),
            };
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// Whether the log has passed its checkpoint size (and has not
    /// stopped).
    /// Wakes the grower thread, unless it was asked already.
    fn want_growth(&self) {
        if !self.grow_wanted.swap(true, Ordering::AcqRel) {
            // Notified under its lock: the grower cannot miss this between
            // its look at the flag and its wait.
            if let Ok(_w) = self.grow_wake.lock() {
                self.grow_cv.notify_one();
            }
        }
    }

    /// The grower thread: when asked, grows the file by
    /// [`ALLOCATE_BYTES`] while less than [`GROW_AHEAD`] is left after the
    /// log's end. A failure is left for the flush that needs the room (it
    /// grows the file itself, and its failure stops the log).
    fn run_grower(&self, file: &File) {
        loop {
            {
                let Ok(mut w) = self.grow_wake.lock() else {
                    return;
                };
                while !self.grow_wanted.load(Ordering::Acquire) {
                    if self.stop.load(Ordering::Acquire) {
                        return;
                    }
                    w = match self.grow_cv.wait(w) {
                        Ok(w) => w,
                        Err(_) => return,
                    };
                }
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let r = (|| {
                let _growing = lock(&self.growing)?;
                let allocated = self.allocated.load(Ordering::Acquire);
                let end = self.log_bytes.load(Ordering::Acquire);
                if allocated.saturating_sub(end) < GROW_AHEAD {
                    grow(file, &self.allocated, allocated + ALLOCATE_BYTES, GROW_STEP)?;
                    self.grown_ahead.fetch_add(1, Ordering::AcqRel);
                }
                Ok::<(), Error>(())
            })();
            // Cleared after the growth: flushes meanwhile need not wake
            // the grower again; the next one past the mark does.
            self.grow_wanted.store(false, Ordering::Release);
            if let Err(e) = r {
                tracing::warn!(error = %e, "growing the write-ahead log ahead of its writes failed");
            }
        }
    }

    fn checkpoint_due(&self) -> bool {
        !self.failed.load(Ordering::Acquire)
            && self.log_bytes.load(Ordering::Acquire)
                >= self.checkpoint_bytes.load(Ordering::Relaxed)
    }

    /// The applier thread: applies queued batches in order — every batch
    /// queued when it looks (at most [`APPLY_GROUP`]) in one write
    /// transaction, which also records the last one's LSN (the data file
    /// holds whole records only, so "every record up to the stored LSN"
    /// still holds) — and checkpoints once the log has passed its size;
    /// drains the queue before it stops.
    fn run_applier(&self, kv: &Kv) {
        loop {
            let jobs: Vec<Record> = {
                let Ok(mut q) = lock(&self.queue) else {
                    return self.fail();
                };
                let mut gathered = false;
                loop {
                    if !q.is_empty() {
                        if gathered
                            || q.len() >= APPLY_BATCHES
                            || self.urgent.swap(false, Ordering::SeqCst)
                            || self.stop.load(Ordering::Acquire)
                        {
                            let group = take_group(self, &mut q);
                            break group;
                        }
                        // Gather: more commits are flushing (see
                        // `Wal::flush_then`). A wake-up ends it early.
                        self.applier_asleep.store(true, Ordering::SeqCst);
                        q = match self.work.wait_timeout(q, APPLY_DELAY) {
                            Ok((q, _)) => q,
                            Err(_) => return self.fail(),
                        };
                        self.applier_asleep.store(false, Ordering::SeqCst);
                        gathered = true;
                        continue;
                    }
                    if self.checkpoint_due() {
                        break Vec::new();
                    }
                    if self.stop.load(Ordering::Acquire) {
                        return;
                    }
                    self.applier_idle.store(true, Ordering::SeqCst);
                    self.applier_asleep.store(true, Ordering::SeqCst);
                    q = match self.work.wait(q) {
                        Ok(q) => q,
                        Err(_) => return self.fail(),
                    };
                    self.applier_asleep.store(false, Ordering::SeqCst);
                    self.applier_idle.store(false, Ordering::SeqCst);
                }
            };
            self.apply_jobs(kv, jobs);
            if self.checkpoint_due() {
                if let Err(e) = self.checkpoint(kv) {
                    tracing::error!(error = %e, "checkpointing the write-ahead log failed; the log stopped");
                    self.fail();
                }
            }
        }
    }

    /// Writes `jobs` (consecutive batches, in LSN order) to the data file in
    /// one write transaction and moves `applied_lsn` past them; a failure
    /// stops the log.
    fn apply_jobs(&self, kv: &Kv, jobs: Vec<Record>) {
        let Some(lsn) = jobs.last().map(|j| j.lsn) else {
            return;
        };
        if self.failed.load(Ordering::Acquire) {
            return; // dropped: the log stopped before them
        }
        // Where each indexed batch's versions lie in the merged group
        // (`merge_group` appends them in batch order): only those keys
        // are in the index, not a bulk batch's thousands.
        let mut indexed = Vec::new();
        let mut at = 0;
        for job in &jobs {
            let n = job.versions.len();
            if n <= INDEX_VERSIONS {
                indexed.push(at..at + n);
            }
            at += n;
        }
        let group = merge_group(jobs);
        let Ok(_running) = lock(&self.pause) else {
            return self.fail();
        };
        let mut replaced = Replaced::new();
        match kv.write(|t| {
            (self.apply)(t, &group, &mut replaced, true)?;
            write_lsn(t, lsn)
        }) {
            Ok(()) => {
                // The data file's snapshots hold the group now: its
                // versions leave the index (see `Unapplied`).
                if !group.versions.is_empty() {
                    let Ok(mut u) = lock(&self.unapplied) else {
                        return self.fail();
                    };
                    u.spans.retain(|(l, _, _)| *l > lsn);
                    let indexed_versions = indexed
                        .iter()
                        .filter_map(|r| group.versions.get(r.clone()))
                        .flatten();
                    for (key, _, _) in indexed_versions {
                        if let Some(list) = u.versions.get_mut(key) {
                            list.retain(|(l, _, _)| *l > lsn);
                            if list.is_empty() {
                                u.versions.remove(key);
                            }
                        }
                    }
                }
                // Before the LSN moves: whoever waits for the apply finds
                // the observer told (it never blocks: see its docs).
                tell_replaced(&self.replaced, &replaced, &group.versions);
                self.applied_lsn.store(lsn, Ordering::SeqCst);
                if self.waiters.load(Ordering::SeqCst) > 0 {
                    if let Ok(_q) = self.queue.lock() {
                        self.applied.notify_all();
                    }
                }
            }
            Err(e) => {
                // The records may be (or become) durable: see the module docs.
                tracing::error!(error = %e, lsn, "a logged batch failed in the data file; the log stopped");
                self.fail();
            }
        }
    }

    /// Restarts the log (on the applier thread): with the output lock
    /// held, the file holds exactly the records up to the durable LSN (no
    /// record is being written); once every one of them is applied and the
    /// data file synced (a durable redb commit), the log starts again at
    /// offset 0. Committers wait for the output lock meanwhile; none waits
    /// for the checkpoint itself.
    fn checkpoint(&self, kv: &Kv) -> Result<()> {
        let mut out = lock(&self.output)?;
        self.check()?;
        if out.pos < self.checkpoint_bytes.load(Ordering::Relaxed) {
            return Ok(());
        }
        let durable = self.durable_lsn.load(Ordering::Acquire);
        while self.applied_lsn.load(Ordering::Acquire) < durable {
            let jobs: Vec<Record> = {
                let mut q = lock(&self.queue)?;
                // A durable record's batch is queued by its submitter just
                // after the record is encoded (without waking anyone): it
                // is there, or about to be.
                while q.is_empty() {
                    self.check()?;
                    self.applier_asleep.store(true, Ordering::SeqCst);
                    q = self
                        .work
                        .wait_timeout(q, std::time::Duration::from_millis(1))
                        .map_err(|_| Error::Corrupt("write-ahead log lock poisoned".into()))?
                        .0;
                    self.applier_asleep.store(false, Ordering::SeqCst);
                }
                take_group(self, &mut q)
            };
            self.apply_jobs(kv, jobs);
            self.check()?;
        }
        kv.sync()?;
        out.pos = 0;
        self.log_bytes.store(0, Ordering::Release);
        self.checkpoints.fetch_add(1, Ordering::AcqRel);
        tracing::debug!(lsn = durable, "write-ahead log checkpointed");
        Ok(())
    }
}

/// A thread in [`Wal::flush_then`], counted in `Shared::flushing` while
/// it lives.
struct Flushing<'a> {
    shared: &'a Shared,
    /// No other flush was running when this one began.
    alone: bool,
}

impl<'a> Flushing<'a> {
    fn enter(shared: &'a Shared) -> Flushing<'a> {
        let alone = shared.flushing.fetch_add(1, Ordering::AcqRel) == 0;
        if !alone {
            shared
                .overlapped_at
                .store(shared.micros() + 1, Ordering::Relaxed);
        }
        Flushing { shared, alone }
    }
}

impl Drop for Flushing<'_> {
    fn drop(&mut self) {
        self.shared.flushing.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The next applier group: the oldest queued batches, at most
/// [`APPLY_GROUP`] (taken off the queue's counts; `queue` is locked).
fn take_group(s: &Shared, q: &mut VecDeque<Record>) -> Vec<Record> {
    let n = q.len().min(APPLY_GROUP);
    let group: Vec<Record> = q.drain(..n).collect();
    s.queued.store(q.len(), Ordering::Release);
    group
}

/// The batches of one applier group as one: the physical operations with
/// only the last one of each key kept (blind writes: the others are
/// overwritten in the same transaction — a two-phase commit's prepare
/// records, inserted and then removed by its apply batch, are not written
/// at all), in key order; the versions of every batch, in order. Applying
/// it leaves the table as applying the batches one by one: the store's
/// metadata keys (physical operations) and its version keys never overlap
/// (logical keys never start with `FF`), so moving operations ahead of
/// later batches' versions changes nothing.
fn merge_group(mut jobs: Vec<Record>) -> Record {
    if jobs.len() == 1 {
        if let Some(one) = jobs.pop() {
            return one;
        }
    }
    let lsn = jobs.last().map_or(0, |j| j.lsn);
    let mut ops: std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>> = Default::default();
    let mut versions = Vec::new();
    for job in jobs {
        ops.extend(job.ops);
        versions.extend(job.versions);
    }
    Record {
        lsn,
        ops: ops.into_iter().collect(),
        versions,
    }
}

pub(crate) struct Wal {
    /// The next LSN; held while a batch is submitted.
    submit: Mutex<u64>,
    shared: Arc<Shared>,
    applier: Option<JoinHandle<()>>,
    grower: Option<JoinHandle<()>>,
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Ok(_q) = self.shared.queue.lock() {
            self.shared.work.notify_all();
        }
        if let Ok(_w) = self.shared.grow_wake.lock() {
            self.shared.grow_cv.notify_all();
        }
        if let Some(h) = self.applier.take() {
            let _ = h.join();
        }
        if let Some(h) = self.grower.take() {
            let _ = h.join();
        }
    }
}

impl Wal {
    /// Opens `dir/wal`, replays into `kv` the records it does not have
    /// (see the module docs; `apply` writes one record's batch inside a
    /// write transaction, here and in the applier), syncs it, empties the
    /// log and starts the applier thread.
    pub(crate) fn recover(dir: &Path, kv: Arc<Kv>, apply: ApplyFn) -> Result<Wal> {
        let path = dir.join("wal");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let stored = stored_lsn(&kv)?;
        let mut last = stored;
        let mut replayed = 0usize;
        for record in records(&bytes) {
            if record.lsn <= stored {
                continue;
            }
            kv.write(|t| {
                // Split statistics are counted afresh after a restart.
                apply(t, &record, &mut Replaced::new(), false)?;
                write_lsn(t, record.lsn)
            })?;
            last = record.lsn;
            replayed += 1;
        }
        // The log is about to be overwritten: what was replayed must be on
        // the disk first.
        kv.sync()?;
        if replayed > 0 {
            tracing::info!(replayed, lsn = last, "write-ahead log recovered");
        }
        // Every record in the file is in the data file now (LSN ≤ `last`): the log
        // restarts at offset 0 over them.
        let allocated = AtomicU64::new(bytes.len() as u64);
        if bytes.len() < ALLOCATE_BYTES as usize {
            grow(&file, &allocated, ALLOCATE_BYTES, u64::MAX)?;
        }
        let grower_file = file.try_clone()?;
        let output = Output { file, pos: 0 };
        // Make the (possibly new) file's directory entry durable too.
        File::open(dir)?.sync_all()?;
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                last_lsn: last,
                ..Pending::default()
            }),
            output: Mutex::new(output),
            leading: Mutex::new(Lead::default()),
            synced: Condvar::new(),
            queue: Mutex::new(VecDeque::new()),
            unapplied: Mutex::new(Unapplied::default()),
            unindexed: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
            last_batch_versions: AtomicUsize::new(0),
            flushing: AtomicUsize::new(0),
            overlapped_at: AtomicU64::new(0),
            scan_waited_at: AtomicU64::new(0),
            started: std::time::Instant::now(),
            urgent: AtomicBool::new(false),
            applier_idle: AtomicBool::new(false),
            apply,
            replaced: std::sync::OnceLock::new(),
            work: Condvar::new(),
            applier_asleep: AtomicBool::new(false),
            applied: Condvar::new(),
            waiters: AtomicUsize::new(0),
            appended_lsn: AtomicU64::new(last),
            durable_lsn: AtomicU64::new(last),
            applied_lsn: AtomicU64::new(last),
            failed: AtomicBool::new(false),
            group: AtomicBool::new(true),
            stop: AtomicBool::new(false),
            syncs: AtomicU64::new(0),
            checkpoint_bytes: AtomicU64::new(CHECKPOINT_BYTES),
            log_bytes: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            pause: Mutex::new(()),
            allocated,
            growing: Mutex::new(()),
            grow_wanted: AtomicBool::new(false),
            grow_wake: Mutex::new(()),
            grow_cv: Condvar::new(),
            grown_ahead: AtomicU64::new(0),
            grown_inline: AtomicU64::new(0),
        });
        let (s, k) = (shared.clone(), kv.clone());
        let applier = std::thread::Builder::new()
            .name("spindle-apply".into())
            .spawn(move || s.run_applier(&k))?;
        let s = shared.clone();
        let mut wal = Wal {
            submit: Mutex::new(last + 1),
            shared,
            applier: Some(applier),
            grower: None,
        };
        // If this fails, `wal`'s drop stops the applier.
        wal.grower = Some(
            std::thread::Builder::new()
                .name("spindle-wal-grow".into())
                .spawn(move || s.run_grower(&grower_file))?,
        );
        Ok(wal)
    }

    /// Appends the record of `ops` and `versions` to the log (durable
    /// after [`Wal::flush`]) and queues them for the applier, which starts
    /// on them at the next [`Wal::flush`] or [`Wal::wait_applied`] (of any
    /// thread; a queued batch is applied before any later one). Returns
    /// the record's LSN.
    pub(crate) fn submit(&self, ops: Vec<Op>, versions: Vec<Version>) -> Result<u64> {
        let s = &self.shared;
        s.check()?;
        let mut next = lock(&self.submit)?;
        let lsn = *next;
        {
            let mut p = lock(&s.pending)?;
            encode_record(&mut p.buf, lsn, &ops, &versions);
            p.last_lsn = lsn;
        }
        s.appended_lsn.store(lsn, Ordering::Release);
        *next += 1;
        if !versions.is_empty() {
            let mut u = lock(&s.unapplied)?;
            if versions.len() <= INDEX_VERSIONS {
                for (key, ts, value) in &versions {
                    u.versions
                        .entry(key.clone())
                        .or_default()
                        .push((lsn, *ts, value.clone()));
                }
            } else {
                let keys = || versions.iter().map(|(k, _, _)| k);
                if let (Some(lo), Some(hi)) = (keys().min(), keys().max()) {
                    u.spans.push((lsn, lo.clone(), hi.clone()));
                }
                s.unindexed.store(lsn, Ordering::Release);
            }
        }
        // The applier is woken by the flush or wait that follows (one
        // wake-up per commit, not one per batch of a two-phase commit).
        {
            let mut q = lock(&s.queue)?;
            s.last_batch_versions
                .store(versions.len(), Ordering::Release);
            q.push_back(Record { lsn, ops, versions });
            s.queued.store(q.len(), Ordering::Release);
        }
        Ok(lsn)
    }

    /// Returns once every batch submitted before the call is durable and
    /// applied. With group commit, a sync that another committer started
    /// after the caller's record was appended covers it; otherwise the
    /// caller writes and syncs what is pending. Without group commit every
    /// call syncs once itself. Wakes the applier to checkpoint when the log
    /// has grown past its size.
    pub(crate) fn flush(&self) -> Result<()> {
        self.flush_then(true)
    }

    /// [`Wal::flush`] that returns once the records are durable, whether
    /// or not the applier has written their batches to the data file yet
    /// (a commit's acknowledgement; readers wait for the apply instead, in
    /// [`Wal::wait_applied_to`]).
    pub(crate) fn flush_durable(&self) -> Result<()> {
        self.flush_then(false)
    }

    fn flush_then(&self, wait_applied: bool) -> Result<()> {
        let s = &self.shared;
        s.check()?;
        let target = s.appended_lsn.load(Ordering::Acquire);
        let _flushing = Flushing::enter(s);
        // A flush that waits for the apply, or a lone one (one client
        // committing: `LONE_AFTER`) while scans wait for applies
        // (`SCAN_WAITED_WITHIN`), has the applier write the queued batches
        // while it syncs the log (a lone client's next scan finds them
        // applied); otherwise batches gather for one data-file
        // transaction — point reads do not wait for them (`Unapplied`),
        // nor do scans of other rows — and the applier is only started on
        // its wait ([`APPLY_DELAY`]).
        if s.apply_now(&_flushing, wait_applied) {
            s.wake_applier(target);
        } else if s.applier_idle.load(Ordering::SeqCst) {
            s.work.notify_one();
        }
        if s.group.load(Ordering::Relaxed) {
            s.sync_group(target)?;
        } else {
            s.sync_locked(&mut *lock(&s.output)?, true)?;
        }
        if s.checkpoint_due() {
            // The applier checkpoints (woken under the queue lock, so that
            // it cannot miss this between its look and its wait).
            let _q = lock(&s.queue)?;
            s.work.notify_one();
        }
        if wait_applied {
            s.wait_applied(target)?;
        }
        Ok(())
    }

    /// Waits until every batch submitted before the call is in the data
    /// file (not necessarily durable).
    pub(crate) fn wait_applied(&self) -> Result<()> {
        let s = &self.shared;
        let target = s.appended_lsn.load(Ordering::Acquire);
        s.wake_applier(target);
        s.wait_applied(target)
    }

    /// Every record up to this LSN is on the disk (so is every batch of a
    /// commit whose flush has returned).
    pub(crate) fn durable_lsn(&self) -> u64 {
        self.shared.durable_lsn.load(Ordering::Acquire)
    }

    /// The LSN of the last record submitted: every batch submitted so far
    /// is in the data file once [`Wal::wait_applied_to`] of it returns.
    #[cfg(test)]
    pub(crate) fn appended_lsn(&self) -> u64 {
        self.shared.appended_lsn.load(Ordering::Acquire)
    }

    /// Waits until every batch up to `lsn` is in the data file (at once
    /// when it is already).
    pub(crate) fn wait_applied_to(&self, lsn: u64) -> Result<()> {
        let s = &self.shared;
        // Applied: readable, even once the log has stopped (that fails
        // writes, and reads only of what never reached the data file).
        if s.applied_lsn.load(Ordering::Acquire) >= lsn {
            return Ok(());
        }
        s.wake_applier(lsn);
        s.wait_applied(lsn)
    }

    /// For a point read of logical `key` at `ts` by a snapshot that needs
    /// every batch up to `lsn`: the newest version at or below `ts` among
    /// the batches not yet in the data file (`None`: none of them has
    /// one). The caller then reads the data file — a snapshot taken after
    /// this call — and keeps the newer of the two: a batch that left the
    /// index before the look is in that snapshot. When the index cannot
    /// answer (the key falls in the key span of a batch too large to
    /// index, still unapplied) this waits for the apply, as
    /// [`Wal::wait_applied_to`], and returns `None`.
    pub(crate) fn newest_unapplied(
        &self,
        key: &[u8],
        ts: Timestamp,
        lsn: u64,
    ) -> Result<Option<(Timestamp, Option<Vec<u8>>)>> {
        let s = &self.shared;
        if s.applied_lsn.load(Ordering::Acquire) >= lsn {
            return Ok(None);
        }
        {
            let u = lock(&s.unapplied)?;
            let in_bulk = u
                .spans
                .iter()
                .any(|(l, lo, hi)| *l <= lsn && lo.as_slice() <= key && key <= hi.as_slice());
            if !in_bulk {
                // A stopped log applies nothing more: what it holds is
                // not readable (as for a wait).
                s.check()?;
                return Ok(u.versions.get(key).and_then(|list| {
                    list.iter()
                        .filter(|(_, t, _)| *t <= ts)
                        .max_by_key(|(_, t, _)| *t)
                        .map(|(_, t, v)| (*t, v.clone()))
                }));
            }
        }
        self.wait_applied_to(lsn)?;
        Ok(None)
    }

    /// For a scan of logical keys in `[start, end)` by a snapshot that
    /// needs every batch up to `lsn`: returns once the data file holds
    /// every such batch that writes inside the range — at once when none
    /// of the unapplied ones does (a snapshot taken after this call then
    /// has all the range's versions the scan may see: a batch leaves the
    /// index only once the data file holds it), else after
    /// [`Wal::wait_applied_to`]. A batch too large to index counts as
    /// writing its whole key span. So a statement that scans one row tree
    /// right after the commit of another (a cascading delete after a
    /// delete) does not wait for that commit's B-tree apply.
    pub(crate) fn wait_applied_in(&self, start: &[u8], end: &[u8], lsn: u64) -> Result<()> {
        if self.applied_in(start, end, lsn)? {
            return Ok(());
        }
        // Lone flushes have their batches written at once for a while
        // (`SCAN_WAITED_WITHIN`): this client reads what it commits.
        self.shared.note_scan_wait();
        self.wait_applied_to(lsn)
    }

    /// Whether [`Wal::wait_applied_in`] would return at once: no batch up
    /// to `lsn` that writes inside `[start, end)` is still on its way into
    /// the data file. Once true it stays true (batches up to `lsn` were
    /// all submitted before the snapshot that needs them), so a data-file
    /// snapshot taken after a `true` holds all the range's versions up to
    /// `lsn`.
    pub(crate) fn applied_in(&self, start: &[u8], end: &[u8], lsn: u64) -> Result<bool> {
        let s = &self.shared;
        if s.applied_lsn.load(Ordering::Acquire) >= lsn || start >= end {
            // Everything up to `lsn` is applied, or the range is empty.
            return Ok(true);
        }
        // The physical keys of logical key `k` (its versions) run from
        // `k 00 00…00` to `k 00 FF…FF` (see the crate docs); a range meets
        // them if it starts at or below the last and ends above the first.
        // (The scan's bounds are physical: a bound inside a key's version
        // suffix is not a logical key, but is handled all the same.)
        let reaches_start = |k: &[u8]| {
            k.iter()
                .chain(&[0u8])
                .chain(&[0xFFu8; 8])
                .cmp(start.iter())
                .is_ge()
        };
        let before_end = |k: &[u8]| k.iter().chain(&[0u8; 9]).cmp(end.iter()).is_lt();
        let clear = {
            let u = lock(&s.unapplied)?;
            let spans_clear = !u
                .spans
                .iter()
                .any(|(l, lo, hi)| *l <= lsn && reaches_start(hi) && before_end(lo));
            let meets = |k: &[u8], list: &[UnappliedVersion]| {
                reaches_start(k) && before_end(k) && list.iter().any(|(l, _, _)| *l <= lsn)
            };
            // A logical key `k` below the start meets the range only as a
            // prefix of it followed by `00` (a start inside `k`'s
            // versions): where they first differ, `k` is lower, and so
            // are all its versions. So the keys below the start are
            // looked up by themselves, one per `00` byte of the start,
            // and the rest walked from the start to the end. (The walk
            // used to begin nine bytes short of the start, at the table's
            // prefix for a one-column key: a cascading delete's scans
            // then walked every unapplied key of the table below theirs.)
            let meet_prefix = (0..start.len()).filter(|&i| start[i] == 0).any(|i| {
                u.versions
                    .get(&start[..i])
                    .is_some_and(|l| meets(&start[..i], l))
            });
            let meet_indexed = meet_prefix
                || u.versions
                    .range::<[u8], _>((
                        std::ops::Bound::Included(start),
                        std::ops::Bound::Unbounded,
                    ))
                    .take_while(|(k, _)| k.as_slice() < end)
                    .any(|(k, list)| meets(k, list));
            spans_clear && !meet_indexed
        };
        if clear {
            // A stopped log applies nothing more: what it holds is not
            // readable (as for a wait), wherever it writes.
            s.check()?;
        }
        Ok(clear)
    }

    /// Whether every batch up to `lsn` is in the data file.
    #[cfg(test)]
    pub(crate) fn is_applied(&self, lsn: u64) -> bool {
        self.shared.applied_lsn.load(Ordering::Acquire) >= lsn
    }

    /// Sets the observer of what applied groups replace (once; later
    /// calls are ignored).
    pub(crate) fn set_replaced_observer(&self, observe: ReplacedObserver) {
        let _ = self.shared.replaced.set(observe);
    }

    /// Stops the applier before its next group until the guard is dropped
    /// (tests hold a commit's batch out of the data file with it).
    pub(crate) fn pause_applier(&self) -> Result<MutexGuard<'_, ()>> {
        lock(&self.shared.pause)
    }

    /// Group commit on (the default: flushes share syncs) or off (every
    /// flush writes and syncs itself).
    pub(crate) fn set_group_commit(&self, on: bool) {
        self.shared.group.store(on, Ordering::Relaxed);
    }

    /// `fdatasync`s of the log so far.
    pub(crate) fn sync_count(&self) -> u64 {
        self.shared.syncs.load(Ordering::Acquire)
    }
}

/// The LSN the data file's state includes (0 before the first logged
/// commit).
fn stored_lsn(kv: &Kv) -> Result<u64> {
    match kv.get(crate::META_WAL_LSN)? {
        None => Ok(0),
        Some(v) => {
            let b: [u8; 8] = v
                .as_slice()
                .try_into()
                .map_err(|_| Error::Corrupt("bad meta/wal_lsn".into()))?;
            Ok(u64::from_be_bytes(b))
        }
    }
}

/// Records `lsn` as the data file's.
fn write_lsn(t: &mut WriteTable<'_>, lsn: u64) -> Result<()> {
    kv::write_ops(
        t,
        &[(
            crate::META_WAL_LSN.to_vec(),
            Some(lsn.to_be_bytes().to_vec()),
        )],
    )
}

fn encode_record(out: &mut Vec<u8>, lsn: u64, ops: &[Op], versions: &[Version]) {
    // Sized up front: a big transaction's record would otherwise grow
    // (and copy) the buffer many times over.
    let size = 20
        + ops
            .iter()
            .map(|(k, v)| 5 + k.len() + v.as_ref().map_or(0, |v| 4 + v.len()))
            .sum::<usize>()
        + versions
            .iter()
            .map(|(k, _, v)| 14 + k.len() + v.as_ref().map_or(0, |v| 4 + v.len()))
            .sum::<usize>();
    out.reserve(size);
    let start = out.len();
    out.extend_from_slice(&[0; 8]); // length and checksum, filled below
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(&((ops.len() + versions.len()) as u32).to_le_bytes());
    for (k, v) in ops {
        out.push(if v.is_some() { OP_INSERT } else { OP_REMOVE });
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
        if let Some(v) = v {
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
    for (k, ts, v) in versions {
        out.push(OP_VERSION);
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(&ts.to_le_bytes());
        match v {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
        }
    }
    debug_assert_eq!(out.len() - start, size, "a record's size as reserved");
    let payload = &out[start + 8..];
    let len = (payload.len() as u32).to_le_bytes();
    let crc = crc32fast::hash(payload).to_le_bytes();
    out[start..start + 4].copy_from_slice(&len);
    out[start + 4..start + 8].copy_from_slice(&crc);
}

/// The intact records of a log, in order; ends at the first torn or
/// corrupt one, or the first whose LSN does not follow the previous one.
struct Records<'a> {
    rest: &'a [u8],
    prev: Option<u64>,
}

fn records(bytes: &[u8]) -> Records<'_> {
    Records {
        rest: bytes,
        prev: None,
    }
}

impl Iterator for Records<'_> {
    type Item = Record;

    fn next(&mut self) -> Option<Self::Item> {
        let mut r = Reader(self.rest);
        self.rest = &[];
        let len = r.u32()? as usize;
        let crc = r.u32()?;
        let payload = r.take(len)?;
        if crc32fast::hash(payload) != crc {
            return None;
        }
        let record = decode_payload(payload)?;
        if self.prev.is_some_and(|p| record.lsn != p + 1) {
            return None;
        }
        self.prev = Some(record.lsn);
        self.rest = r.0;
        Some(record)
    }
}

fn decode_payload(payload: &[u8]) -> Option<Record> {
    let mut r = Reader(payload);
    let lsn = r.u64()?;
    let n = r.u32()? as usize;
    let mut ops = Vec::new();
    let mut versions = Vec::new();
    for _ in 0..n {
        let tag = r.take(1)?[0];
        let klen = r.u32()? as usize;
        let key = r.take(klen)?.to_vec();
        match tag {
            OP_INSERT => {
                let vlen = r.u32()? as usize;
                ops.push((key, Some(r.take(vlen)?.to_vec())));
            }
            OP_REMOVE => ops.push((key, None)),
            OP_VERSION => {
                let ts = r.u64()?;
                let value = match r.take(1)?[0] {
                    0 => None,
                    1 => {
                        let vlen = r.u32()? as usize;
                        Some(r.take(vlen)?.to_vec())
                    }
                    _ => return None,
                };
                versions.push((key, ts, value));
            }
            _ => return None,
        }
    }
    Some(Record { lsn, ops, versions })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(n: u8) -> Vec<Op> {
        vec![
            (vec![n, 1], Some(vec![n; 3])),
            (vec![n, 2], None),
            (vec![], Some(vec![])),
        ]
    }

    fn versions(n: u8) -> Vec<Version> {
        vec![
            (vec![n, 3], u64::from(n) << 40 | 7, Some(vec![n; 2])),
            (vec![n, 4], 9, None),
            (vec![], 0, Some(vec![])),
        ]
    }

    fn record(lsn: u64) -> Record {
        Record {
            lsn,
            ops: ops(lsn as u8),
            versions: versions(lsn as u8),
        }
    }

    fn encode(out: &mut Vec<u8>, r: &Record) {
        encode_record(out, r.lsn, &r.ops, &r.versions);
    }

    /// Replays the physical operations only (these tests log no versions).
    fn replay(t: &mut WriteTable<'_>, r: &Record, _: &mut Replaced, _: bool) -> Result<()> {
        assert!(r.versions.is_empty());
        kv::write_ops(t, &r.ops)
    }

    /// Submits `ops` as a commit does.
    fn apply(wal: &Wal, ops: Vec<Op>) {
        wal.submit(ops, vec![]).unwrap();
    }

    fn open(dir: &Path) -> Arc<Kv> {
        Arc::new(Kv::open(dir).unwrap())
    }

    #[test]
    fn records_round_trip_and_stop_at_a_torn_or_corrupt_one() {
        let mut log = Vec::new();
        for lsn in 1..=3u64 {
            encode(&mut log, &record(lsn));
        }
        let all: Vec<_> = records(&log).collect();
        assert_eq!(all, (1..=3u64).map(record).collect::<Vec<_>>());
        // A torn tail: every prefix yields the records that are whole.
        let one = {
            let mut b = Vec::new();
            encode(&mut b, &record(1));
            b.len()
        };
        for cut in 0..log.len() {
            let n = records(&log[..cut]).count();
            assert_eq!(n, cut / one, "cut at {cut}");
        }
        // A flipped byte in the second record ends the log there.
        let mut bad = log.clone();
        bad[one + 12] ^= 0x40;
        assert_eq!(records(&bad).map(|r| r.lsn).collect::<Vec<_>>(), vec![1]);
        // A log restarted at offset 0 over older records (LSNs 1..=3):
        // the new records (10, 11) end where the LSNs stop following on.
        let mut restarted = Vec::new();
        encode(&mut restarted, &record(10));
        encode(&mut restarted, &record(11));
        restarted.extend_from_slice(&log[2 * one..]);
        let lsns: Vec<u64> = records(&restarted).map(|r| r.lsn).collect();
        assert_eq!(lsns, vec![10, 11]);
        // Zeros (the allocated, never written part) end the log too.
        let mut zeros = log[..one].to_vec();
        zeros.extend_from_slice(&[0; 64]);
        assert_eq!(records(&zeros).count(), 1);
    }

    /// `ops` committed to `kv` with `lsn`, as a logged commit does.
    fn commit(kv: &Kv, ops: &[Op], lsn: u64) {
        kv.write(|t| {
            kv::write_ops(t, ops)?;
            write_lsn(t, lsn)
        })
        .unwrap();
    }

    /// The applier thread is told it is the applier (and may yield, see
    /// `Store::write_batch`); recovery, which replays on the opening
    /// thread, is not.
    #[test]
    fn only_the_applier_is_told_it_applies() {
        use std::sync::atomic::AtomicUsize;
        // Calls on the applier thread, in recovery, and told wrongly.
        static APPLIER: AtomicUsize = AtomicUsize::new(0);
        static RECOVERY: AtomicUsize = AtomicUsize::new(0);
        static WRONG: AtomicUsize = AtomicUsize::new(0);
        fn counting(
            t: &mut WriteTable<'_>,
            r: &Record,
            _: &mut Replaced,
            applier: bool,
        ) -> Result<()> {
            // Recovery runs on the test's own thread, the applier never.
            let test_thread = std::thread::current()
                .name()
                .is_some_and(|n| n.ends_with("only_the_applier_is_told_it_applies"));
            if test_thread == applier {
                WRONG.fetch_add(1, Ordering::Relaxed);
            }
            let count = if applier { &APPLIER } else { &RECOVERY };
            count.fetch_add(1, Ordering::Relaxed);
            kv::write_ops(t, &r.ops)
        }
        let dir = tempfile::tempdir().unwrap();
        let copy = tempfile::tempdir().unwrap();
        let put = |k: &str| (k.as_bytes().to_vec(), Some(b"v".to_vec()));
        {
            let kv = open(dir.path());
            let wal = Wal::recover(dir.path(), kv.clone(), counting).unwrap();
            // With the applier held, the three batches are only in the
            // log when the files are copied: recovery replays them.
            let held = wal.pause_applier().unwrap();
            for k in ["a", "b", "c"] {
                apply(&wal, vec![put(k)]);
            }
            wal.flush_durable().unwrap();
            for f in [kv::DATA_FILE, "wal"] {
                std::fs::copy(dir.path().join(f), copy.path().join(f)).unwrap();
            }
            drop(held);
            wal.wait_applied().unwrap();
        }
        assert_eq!(RECOVERY.load(Ordering::Relaxed), 0);
        let applied = APPLIER.load(Ordering::Relaxed);
        assert!(applied >= 1, "the applier wrote the batches");
        let kv = open(copy.path());
        let wal = Wal::recover(copy.path(), kv.clone(), counting).unwrap();
        assert_eq!(RECOVERY.load(Ordering::Relaxed), 3);
        assert_eq!(kv.get(b"c").unwrap(), Some(b"v".to_vec()));
        apply(&wal, vec![put("d")]);
        wal.flush().unwrap();
        wal.wait_applied().unwrap();
        assert_eq!(APPLIER.load(Ordering::Relaxed), applied + 1);
        assert_eq!(kv.get(b"d").unwrap(), Some(b"v".to_vec()));
        assert_eq!(WRONG.load(Ordering::Relaxed), 0);
    }

    /// Checkpoints restart the log in place: the file stops growing, and
    /// recovery over a restarted log (new records, then older ones) finds
    /// the newest state.
    #[test]
    fn checkpoints_restart_the_log_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let put = |k: &str, v: u32| (k.as_bytes().to_vec(), Some(v.to_be_bytes().to_vec()));
        {
            let kv = open(dir.path());
            let wal = Wal::recover(dir.path(), kv.clone(), replay).unwrap();
            wal.shared.checkpoint_bytes.store(10_000, Ordering::Relaxed);
            for i in 0..1000u32 {
                let ops = vec![put("k", i), put(&format!("k{}", i % 7), i)];
                apply(&wal, ops);
                wal.flush().unwrap();
            }
            // The applier checkpoints after the group it applied: the last
            // one may still be running.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let restarts = || wal.shared.checkpoints.load(Ordering::Acquire);
            while restarts() < 3 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(restarts() >= 3, "{} checkpoints", restarts());
            let len = std::fs::metadata(dir.path().join("wal")).unwrap().len();
            assert_eq!(len, ALLOCATE_BYTES);
        }
        let kv = open(dir.path());
        Wal::recover(dir.path(), kv.clone(), replay).unwrap();
        assert_eq!(kv.get(b"k").unwrap(), Some(999u32.to_be_bytes().to_vec()));
        assert_eq!(kv.get(b"k4").unwrap(), Some(998u32.to_be_bytes().to_vec()));
        assert_eq!(stored_lsn(&kv).unwrap(), 1000);
    }

    /// The grower keeps the file allocated ahead of the records: flushes
    /// that stay within the room it made never grow the file themselves;
    /// a record larger than the room left does, and every record survives
    /// a restart.
    #[test]
    fn the_grower_allocates_the_log_ahead_of_its_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let value = vec![7u8; 64 << 10];
        let put = |i: u32, v: &[u8]| (format!("k{i}").into_bytes(), Some(v.to_vec()));
        let wait_until = |what: &str, done: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while !done() {
                assert!(std::time::Instant::now() < deadline, "{what}");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        let mut i = 0u32;
        {
            let kv = open(dir.path());
            let wal = Wal::recover(dir.path(), kv.clone(), replay).unwrap();
            let s = &wal.shared;
            let allocated = || s.allocated.load(Ordering::Acquire);
            let written = || s.log_bytes.load(Ordering::Acquire);
            assert_eq!(allocated(), ALLOCATE_BYTES);
            // Up to the mark: nobody grows the file.
            while written() + (value.len() as u64) < ALLOCATE_BYTES - GROW_AHEAD {
                apply(&wal, vec![put(i, &value)]);
                wal.flush_durable().unwrap();
                i += 1;
            }
            assert_eq!(allocated(), ALLOCATE_BYTES);
            // Past it: the grower adds the next allocation, in the
            // background.
            apply(&wal, vec![put(i, &value)]);
            wal.flush_durable().unwrap();
            i += 1;
            wait_until("the grower did not grow the log", &|| {
                allocated() == 2 * ALLOCATE_BYTES
            });
            // Flushes across the old end write into the zeros it made.
            while written() < ALLOCATE_BYTES + (value.len() as u64) {
                apply(&wal, vec![put(i, &value)]);
                wal.flush_durable().unwrap();
                i += 1;
            }
            assert_eq!(s.grown_ahead.load(Ordering::Acquire), 1);
            assert_eq!(s.grown_inline.load(Ordering::Acquire), 0);
            let len = std::fs::metadata(dir.path().join("wal")).unwrap().len();
            assert_eq!(len, 2 * ALLOCATE_BYTES);
            // A record larger than the room left grows the file in its
            // flush (after any growth of the grower's).
            let big = vec![9u8; 2 * ALLOCATE_BYTES as usize];
            apply(&wal, vec![put(i, &big)]);
            wal.flush_durable().unwrap();
            i += 1;
            assert_eq!(s.grown_inline.load(Ordering::Acquire), 1);
            assert!(allocated() >= written());
            assert_eq!(allocated() % ALLOCATE_BYTES, 0);
            let len = std::fs::metadata(dir.path().join("wal")).unwrap().len();
            assert!(len >= written(), "{len} < {}", written());
        }
        let kv = open(dir.path());
        Wal::recover(dir.path(), kv.clone(), replay).unwrap();
        assert_eq!(stored_lsn(&kv).unwrap(), u64::from(i));
        assert_eq!(kv.get(b"k0").unwrap(), Some(value.clone()));
        assert_eq!(
            kv.get(format!("k{}", i - 2).as_bytes()).unwrap(),
            Some(value)
        );
        assert_eq!(
            kv.get(format!("k{}", i - 1).as_bytes())
                .unwrap()
                .map(|v| v.len()),
            Some(2 * ALLOCATE_BYTES as usize)
        );
    }

    /// A flush does not wait for a checkpoint: with the applier held, the
    /// log passes its checkpoint size and flushes still return once
    /// durable; released, the applier applies and checkpoints, and a
    /// recovery finds every commit.
    #[test]
    fn a_flush_does_not_wait_for_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let put = |k: &str, v: u32| (k.as_bytes().to_vec(), Some(v.to_be_bytes().to_vec()));
        {
            let kv = open(dir.path());
            let wal = Arc::new(Wal::recover(dir.path(), kv.clone(), replay).unwrap());
            wal.shared.checkpoint_bytes.store(1_000, Ordering::Relaxed);
            let held = wal.pause_applier().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let w = wal.clone();
            let committer = std::thread::spawn(move || {
                for i in 0..100u32 {
                    w.submit(vec![put(&format!("k{i}"), i)], Vec::new())
                        .unwrap();
                    w.flush_durable().unwrap();
                }
                tx.send(()).unwrap();
            });
            rx.recv_timeout(std::time::Duration::from_secs(20))
                .expect("the flushes waited for the held applier");
            committer.join().unwrap();
            assert!(wal.shared.log_bytes.load(Ordering::Acquire) >= 1_000);
            assert_eq!(wal.shared.checkpoints.load(Ordering::Acquire), 0);
            drop(held);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while wal.shared.checkpoints.load(Ordering::Acquire) == 0
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(wal.shared.checkpoints.load(Ordering::Acquire) >= 1);
            assert!(wal.shared.applied_lsn.load(Ordering::Acquire) >= 100);
            assert_eq!(kv.get(b"k99").unwrap(), Some(99u32.to_be_bytes().to_vec()));
        }
        let kv = open(dir.path());
        Wal::recover(dir.path(), kv.clone(), replay).unwrap();
        for i in [0u32, 50, 99] {
            assert_eq!(
                kv.get(format!("k{i}").as_bytes()).unwrap(),
                Some(i.to_be_bytes().to_vec())
            );
        }
        assert_eq!(stored_lsn(&kv).unwrap(), 100);
    }

    /// Recovery replays only the records above the data file's LSN:
    /// re-applying an older one over a newer state would tear the newer
    /// record.
    #[test]
    fn recovery_replays_the_records_the_data_file_lacks_then_empties_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let put = |k: &str, v: &str| (k.as_bytes().to_vec(), Some(v.as_bytes().to_vec()));
        // The data file holds records 1..=3; record 3 (never flushed to the
        // log) wrote k and j; the log has 1 and 2, and record 2 wrote k only.
        {
            let kv = open(dir.path());
            commit(&kv, &[put("k", "1")], 1);
            commit(&kv, &[put("k", "2")], 2);
            commit(&kv, &[put("k", "3"), put("j", "3")], 3);
            kv.sync().unwrap();
            let mut log = Vec::new();
            encode_record(&mut log, 1, &[put("k", "1")], &[]);
            encode_record(&mut log, 2, &[put("k", "2")], &[]);
            std::fs::write(dir.path().join("wal"), &log).unwrap();
        }
        {
            let kv = open(dir.path());
            let wal = Wal::recover(dir.path(), kv.clone(), replay).unwrap();
            assert_eq!(kv.get(b"k").unwrap().as_deref(), Some(&b"3"[..]));
            assert_eq!(kv.get(b"j").unwrap().as_deref(), Some(&b"3"[..]));
            // The log restarts at offset 0, over records the data file has.
            assert_eq!(wal.shared.output.lock().unwrap().pos, 0);
            assert_eq!(
                std::fs::metadata(dir.path().join("wal")).unwrap().len(),
                ALLOCATE_BYTES
            );
            // The next record continues after the data file's LSN.
            apply(&wal, vec![put("k", "4")]);
            wal.flush().unwrap();
            assert_eq!(stored_lsn(&kv).unwrap(), 4);
        }
        // The data file holds record 1 only; the log has 1, 2, 3 and a torn
        // 4: 2 and 3 are replayed, 4 is not.
        let dir = tempfile::tempdir().unwrap();
        {
            let kv = open(dir.path());
            commit(&kv, &[put("k", "1")], 1);
            kv.sync().unwrap();
            let mut log = Vec::new();
            encode_record(&mut log, 1, &[put("k", "1")], &[]);
            encode_record(&mut log, 2, &[put("k", "2"), put("j", "2")], &[]);
            encode_record(&mut log, 3, &[put("k", "3"), (b"j".to_vec(), None)], &[]);
            let whole = log.len();
            encode_record(&mut log, 4, &[put("k", "4")], &[]);
            log.truncate(whole + 10);
            std::fs::write(dir.path().join("wal"), &log).unwrap();
        }
        let kv = open(dir.path());
        Wal::recover(dir.path(), kv.clone(), replay).unwrap();
        assert_eq!(kv.get(b"k").unwrap().as_deref(), Some(&b"3"[..]));
        assert_eq!(kv.get(b"j").unwrap(), None);
        assert_eq!(stored_lsn(&kv).unwrap(), 3);
    }

    /// A merged group keeps each key's last operation and every version
    /// in order.
    #[test]
    fn a_merged_group_keeps_the_last_write_of_each_key() {
        let put = |k: &str, v: &str| (k.as_bytes().to_vec(), Some(v.as_bytes().to_vec()));
        let gone = |k: &str| (k.as_bytes().to_vec(), None);
        let version = |k: &str, ts: u64| (k.as_bytes().to_vec(), ts, Some(vec![ts as u8]));
        let jobs = vec![
            Record {
                lsn: 4,
                ops: vec![put("prep/1", "x"), put("m", "1")],
                versions: vec![version("a", 1)],
            },
            Record {
                lsn: 5,
                ops: vec![gone("prep/1"), put("z", "2")],
                versions: vec![version("a", 2), version("b", 2)],
            },
            Record {
                lsn: 6,
                ops: vec![put("m", "3")],
                versions: vec![],
            },
        ];
        let merged = merge_group(jobs);
        assert_eq!(merged.lsn, 6);
        assert_eq!(
            merged.ops,
            vec![put("m", "3"), gone("prep/1"), put("z", "2")]
        );
        assert_eq!(
            merged.versions,
            vec![version("a", 1), version("a", 2), version("b", 2)]
        );
    }

    /// Applies like `replay`, but fails a batch that writes key `b`.
    fn failing_at_b(t: &mut WriteTable<'_>, r: &Record, _: &mut Replaced, _: bool) -> Result<()> {
        kv::write_ops(t, &r.ops)?;
        if r.ops.iter().any(|(k, _)| k == b"b") {
            return Err(Error::Corrupt("injected".into()));
        }
        Ok(())
    }

    /// A batch whose data-file write fails after its record was appended
    /// stops the log: that flush and every later submit and flush fail
    /// until the store is reopened, and recovery then finds the failed
    /// batch whole or not at all.
    #[test]
    fn a_batch_that_fails_in_the_data_file_stops_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let put = |k: &str, v: &str| (k.as_bytes().to_vec(), Some(v.as_bytes().to_vec()));
        {
            let kv = open(dir.path());
            let wal = Wal::recover(dir.path(), kv.clone(), failing_at_b).unwrap();
            apply(&wal, vec![put("a", "1")]);
            wal.flush().unwrap();
            let applied = wal.appended_lsn();
            apply(&wal, vec![put("b", "2"), put("c", "2")]);
            assert!(matches!(wal.flush(), Err(Error::LogStopped)));
            // What was applied before stays readable; what failed is not.
            wal.wait_applied_to(applied).unwrap();
            assert!(matches!(
                wal.wait_applied_to(wal.appended_lsn()),
                Err(Error::LogStopped)
            ));
            // Not in the data file…
            assert_eq!(kv.get(b"b").unwrap(), None);
            // …and nothing else goes through.
            assert!(matches!(
                wal.submit(vec![put("d", "3")], vec![]),
                Err(Error::LogStopped)
            ));
            assert!(matches!(wal.flush(), Err(Error::LogStopped)));
            assert!(matches!(wal.wait_applied(), Err(Error::LogStopped)));
        }
        let kv = open(dir.path());
        Wal::recover(dir.path(), kv.clone(), replay).unwrap();
        assert_eq!(kv.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(kv.get(b"b").unwrap(), kv.get(b"c").unwrap());
        assert_eq!(kv.get(b"d").unwrap(), None);
    }

    /// Commits from several threads, each flushed (by its own sync or one
    /// that another thread started after it was appended), are all back
    /// after a crash.
    #[test]
    fn concurrent_flushed_commits_all_survive_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let copy = tempfile::tempdir().unwrap();
        {
            let kv = open(dir.path());
            let wal = Wal::recover(dir.path(), kv.clone(), replay).unwrap();
            std::thread::scope(|scope| {
                for thread in 0..4u32 {
                    let wal = &wal;
                    scope.spawn(move || {
                        for i in 0..50u32 {
                            let key = format!("t{thread}/{i}").into_bytes();
                            apply(wal, vec![(key, Some(i.to_be_bytes().to_vec()))]);
                            wal.flush().unwrap();
                        }
                    });
                }
            });
            assert!(wal.sync_count() >= 1);
            for f in [kv::DATA_FILE, "wal"] {
                std::fs::copy(dir.path().join(f), copy.path().join(f)).unwrap();
            }
            std::mem::forget((kv, wal));
        }
        let kv = open(copy.path());
        Wal::recover(copy.path(), kv.clone(), replay).unwrap();
        for thread in 0..4u32 {
            for i in 0..50u32 {
                let key = format!("t{thread}/{i}").into_bytes();
                assert_eq!(kv.get(&key).unwrap(), Some(i.to_be_bytes().to_vec()));
            }
        }
        assert_eq!(stored_lsn(&kv).unwrap(), 200);
    }

    /// Concurrent durable flushes (which let batches gather for the
    /// applier rather than wake it) are each covered by a sync, and every
    /// batch reaches the data file with nobody waiting for it: no batch is
    /// left in the queue once the flushes stop.
    #[test]
    fn gathered_batches_are_all_applied_without_a_reader() {
        let dir = tempfile::tempdir().unwrap();
        let kv = open(dir.path());
        let wal = Wal::recover(dir.path(), kv.clone(), replay).unwrap();
        std::thread::scope(|scope| {
            for thread in 0..6u32 {
                let wal = &wal;
                scope.spawn(move || {
                    for i in 0..40u32 {
                        let key = format!("t{thread}/{i}").into_bytes();
                        let lsn = wal.submit(vec![(key, Some(vec![1]))], Vec::new()).unwrap();
                        wal.flush_durable().unwrap();
                        assert!(wal.durable_lsn() >= lsn);
                    }
                });
            }
        });
        let applied = |appended: u64| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while wal.shared.applied_lsn.load(Ordering::Acquire) < appended {
                assert!(
                    std::time::Instant::now() < deadline,
                    "batches left unapplied: {} of {appended}",
                    wal.shared.applied_lsn.load(Ordering::Acquire)
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        assert_eq!(wal.appended_lsn(), 240);
        applied(240);
        // A flush while another is in progress (held here) does not wake
        // the idle applier to apply at once; its batch is applied after
        // the gathering delay all the same.
        {
            let _other = Flushing::enter(&wal.shared);
            wal.submit(vec![(b"late".to_vec(), Some(vec![2]))], Vec::new())
                .unwrap();
            wal.flush_durable().unwrap();
            applied(241);
        }
        assert_eq!(kv.get(b"late").unwrap(), Some(vec![2]));
        for thread in 0..6u32 {
            for i in 0..40u32 {
                let key = format!("t{thread}/{i}").into_bytes();
                assert_eq!(kv.get(&key).unwrap(), Some(vec![1]));
            }
        }
    }

    /// Batches are applied at once while one client commits (and its
    /// scans wait for applies), and gather once flushes overlap, until none has for `LONE_AFTER`; a flush that
    /// waits for the apply always starts it.
    #[test]
    fn batches_gather_only_while_flushes_overlap() {
        let dir = tempfile::tempdir().unwrap();
        let kv = open(dir.path());
        let wal = Wal::recover(dir.path(), kv, replay).unwrap();
        let s = &wal.shared;
        // (A scan waited for an apply a moment ago: a lone flush's batch
        // is written at once only then, see the test below.)
        s.note_scan_wait();
        {
            let first = Flushing::enter(s);
            assert!(
                first.alone && s.apply_now(&first, false),
                "a lone flush applies at once"
            );
        }
        let overlapped = std::time::Instant::now();
        {
            let first = Flushing::enter(s);
            let second = Flushing::enter(s);
            assert!(!second.alone && !s.apply_now(&second, false));
            assert!(
                s.apply_now(&second, true),
                "a flush that waits for the apply starts it"
            );
            drop(first);
        }
        let next = Flushing::enter(s);
        assert!(next.alone);
        let gathering = !s.apply_now(&next, false);
        // Unless this thread stood still for `LONE_AFTER` (a loaded
        // machine), the overlap a moment ago keeps batches gathering.
        if overlapped.elapsed() < LONE_AFTER {
            assert!(gathering, "an overlap a moment ago: still gathering");
        }
        drop(next);
        std::thread::sleep(LONE_AFTER + std::time::Duration::from_millis(10));
        s.note_scan_wait();
        let later = Flushing::enter(s);
        assert!(
            s.apply_now(&later, false),
            "lone again once no flush has overlapped for a while"
        );
    }

    /// Replays the physical operations; ignores versions (the index of
    /// unapplied versions is the log's own, whatever the apply writes).
    fn replay_ops(t: &mut WriteTable<'_>, r: &Record, _: &mut Replaced, _: bool) -> Result<()> {
        kv::write_ops(t, &r.ops)
    }

    #[test]
    fn lone_flushes_apply_at_once_only_while_scans_wait_for_applies() {
        let dir = tempfile::tempdir().unwrap();
        let kv = open(dir.path());
        let wal = Wal::recover(dir.path(), kv, replay_ops).unwrap();
        let s = &wal.shared;
        let lone_applies_now = || {
            let lone = Flushing::enter(s);
            assert!(lone.alone);
            s.apply_now(&lone, false)
        };
        assert!(
            !lone_applies_now(),
            "no scan waited: a lone flush lets batches gather"
        );
        let pause = wal.pause_applier().unwrap();
        let lsn = wal
            .submit(vec![], vec![(b"k".to_vec(), 5, Some(b"v".to_vec()))])
            .unwrap();
        assert_eq!(s.last_batch_versions.load(Ordering::SeqCst), 1);
        // A scan of other keys neither waits nor counts.
        wal.wait_applied_in(b"l", b"z", lsn).unwrap();
        wal.wait_applied_in(b"a", b"k", lsn).unwrap();
        assert!(!wal.is_applied(lsn));
        assert!(!lone_applies_now(), "a scan that did not wait counted");
        // One that meets the batch waits for it, and counts.
        std::thread::scope(|scope| {
            let scan = scope.spawn(|| wal.wait_applied_in(b"a", b"z", lsn));
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while s.scan_waited_at.load(Ordering::Relaxed) == 0
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(!scan.is_finished(), "the scan did not wait for the apply");
            drop(pause);
            scan.join().unwrap().unwrap();
        });
        assert!(wal.is_applied(lsn));
        assert!(
            lone_applies_now(),
            "a scan waited: a lone flush's batch is written at once"
        );
        let waited = s.scan_waited_at.load(Ordering::Relaxed) - 1;
        let window = SCAN_WAITED_WITHIN.as_micros() as u64;
        assert!(s.scan_waited_before(waited + window - 1));
        assert!(
            !s.scan_waited_before(waited + window),
            "no wait for a while: batches gather again"
        );
        // Without a scan's wait, a batch of many versions is written at
        // once all the same; small ones gather.
        s.scan_waited_at.store(0, Ordering::SeqCst);
        let batch = |n: usize| {
            let versions = (0..n)
                .map(|i| (vec![b'm', i as u8], 9, Some(vec![1])))
                .collect();
            wal.submit(vec![], versions).unwrap();
        };
        batch(APPLY_AT_ONCE_VERSIONS - 1);
        assert!(!lone_applies_now());
        batch(APPLY_AT_ONCE_VERSIONS);
        assert!(
            lone_applies_now(),
            "a batch of many versions: written at once"
        );
        batch(1);
        assert!(
            !lone_applies_now(),
            "a small batch after a large one gathers"
        );
        wal.wait_applied().unwrap();
    }

    /// Waits until `n` threads are inside a flush and one of them leads.
    fn until_flushing(s: &Shared, n: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while s.flushing.load(Ordering::SeqCst) < n
            || !s.leading.lock().unwrap().running
            || s.leading.lock().unwrap().waiting < n - 1
        {
            assert!(
                std::time::Instant::now() < deadline,
                "flushes did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Group commit: a flush leads while the log's file is busy (its
    /// output lock held here, as a checkpoint or a write would); records
    /// appended meanwhile are flushed by flushes that wait for the leader.
    /// Its one sync covers them all: one sync for three flushes, and every
    /// record durable when they return.
    #[test]
    fn flushes_that_wait_for_a_leader_share_its_sync() {
        let dir = tempfile::tempdir().unwrap();
        let kv = open(dir.path());
        let wal = Wal::recover(dir.path(), kv.clone(), replay).unwrap();
        let s = &wal.shared;
        let before = wal.sync_count();
        std::thread::scope(|scope| {
            let busy = s.output.lock().unwrap();
            apply(&wal, vec![(b"a".to_vec(), Some(b"1".to_vec()))]);
            let leader = scope.spawn(|| wal.flush_durable());
            until_flushing(s, 1);
            apply(&wal, vec![(b"b".to_vec(), Some(b"2".to_vec()))]);
            apply(&wal, vec![(b"c".to_vec(), Some(b"3".to_vec()))]);
            let followers = [
                scope.spawn(|| wal.flush_durable()),
                scope.spawn(|| wal.flush_durable()),
            ];
            until_flushing(s, 3);
            assert_eq!(
                wal.durable_lsn(),
                0,
                "nothing synced while the file is busy"
            );
            drop(busy);
            leader.join().unwrap().unwrap();
            for f in followers {
                f.join().unwrap().unwrap();
            }
        });
        assert_eq!(wal.durable_lsn(), 3);
        assert_eq!(
            wal.sync_count() - before,
            1,
            "one sync for the three flushes"
        );
        wal.wait_applied().unwrap();
        assert_eq!(kv.get(b"c").unwrap(), Some(b"3".to_vec()));
    }

    /// A leader whose sync fails (the log stopped) ends its lead: the
    /// flushes waiting for it fail too rather than wait forever.
    #[test]
    fn flushes_waiting_for_a_failed_leader_fail_too() {
        let dir = tempfile::tempdir().unwrap();
        let kv = open(dir.path());
        let wal = Wal::recover(dir.path(), kv.clone(), replay).unwrap();
        let s = &wal.shared;
        std::thread::scope(|scope| {
            let busy = s.output.lock().unwrap();
            apply(&wal, vec![(b"a".to_vec(), Some(b"1".to_vec()))]);
            let leader = scope.spawn(|| wal.flush_durable());
            until_flushing(s, 1);
            apply(&wal, vec![(b"b".to_vec(), Some(b"2".to_vec()))]);
            let follower = scope.spawn(|| wal.flush_durable());
            until_flushing(s, 2);
            s.fail();
            drop(busy);
            for f in [leader, follower] {
                assert!(matches!(f.join().unwrap(), Err(Error::LogStopped)));
            }
        });
        assert!(!s.leading.lock().unwrap().running);
    }

    /// Records written through the kept (emptied) buffer of an earlier
    /// write: a large record, then smaller and larger ones, land in the log
    /// exactly once each and in order — nothing of an earlier record is
    /// written again.
    #[test]
    fn a_reused_record_buffer_writes_each_record_once() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = [50_000usize, 10, 3_000, 20_000, 1, 60_000, 5];
        let value = |i: usize, n: usize| vec![b'a' + i as u8; n];
        {
            let kv = open(dir.path());
            let wal = Wal::recover(dir.path(), kv.clone(), replay).unwrap();
            for (i, n) in sizes.iter().enumerate() {
                apply(
                    &wal,
                    vec![(format!("k{i}").into_bytes(), Some(value(i, *n)))],
                );
                wal.flush_durable().unwrap();
                // The buffer just written is kept for the next record.
                assert!(lock(&wal.shared.pending).unwrap().spare.capacity() >= *n);
            }
            wal.wait_applied().unwrap();
        }
        let log = std::fs::read(dir.path().join("wal")).unwrap();
        let got: Vec<(u64, Vec<Op>)> = records(&log).map(|r| (r.lsn, r.ops)).collect();
        let want: Vec<(u64, Vec<Op>)> = sizes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let op = (format!("k{i}").into_bytes(), Some(value(i, *n)));
                (i as u64 + 1, vec![op])
            })
            .collect();
        assert_eq!(got, want);
    }

    /// Commits that were not synced are lost with the data file's unsynced
    /// state when the process dies without a checkpoint, and come back from
    /// the log: here the data file is reopened from its last durable
    /// commit (the handle is leaked, as a crash would leave it, then the
    /// file is copied).
    #[test]
    fn unsynced_commits_come_back_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let put = |k: &str, v: &str| (k.as_bytes().to_vec(), Some(v.as_bytes().to_vec()));
        let copy = tempfile::tempdir().unwrap();
        {
            let kv = open(dir.path());
            let wal = Wal::recover(dir.path(), kv.clone(), replay).unwrap();
            for i in 0..50 {
                let v = i.to_string();
                apply(&wal, vec![put("k", &v)]);
                wal.flush().unwrap();
            }
            for f in [kv::DATA_FILE, "wal"] {
                std::fs::copy(dir.path().join(f), copy.path().join(f)).unwrap();
            }
            std::mem::forget((kv, wal));
        }
        let kv = open(copy.path());
        Wal::recover(copy.path(), kv.clone(), replay).unwrap();
        assert_eq!(kv.get(b"k").unwrap().as_deref(), Some(&b"49"[..]));
        assert_eq!(stored_lsn(&kv).unwrap(), 50);
    }
}
