//! # spindle-storage: multi-version keys on sled
//!
//! The store keeps every committed version of every logical key, tagged with
//! its commit timestamp, in one sled tree. Readers pick a timestamp and see
//! exactly the versions committed at or before it; a commit writes all its
//! versions with one atomic `apply_batch` and then flushes, so a crash
//! leaves either all of a commit or none of it.
//!
//! ## Physical layout
//!
//! ```text
//!   logical key              version suffix
//!   ┌───────────────────────┬────┬──────────────────────────┐
//!   │ 20 [table] [key] ...  │ 00 │ !commit_ts (u64, BE)     │ → 01 [row bytes] | 00 (tombstone)
//!   └───────────────────────┴────┴──────────────────────────┘
//!   FF "meta/…"                                              → unversioned metadata
//! ```
//!
//! The timestamp is stored inverted, so the newest version of a key comes
//! first. The separator `00` is lower than the table marker `20`, so the
//! versions of a row sort before the row's interleaved children: a logical
//! range scan stays a physical range scan. Example, keys × time:
//!
//! ```text
//!              ts=5        ts=7        ts=9
//!   Singers/1  "Marc"                  "Marc R."     read@6 → "Marc", read@9 → "Marc R."
//!   Albums/1/1             "Total"                    read@6 → (none)
//!   Singers/2  "Cat"       (deleted)                  read@6 → "Cat", read@7 → (none)
//! ```
//!
//! Logical keys must never start with `FF` (reserved for metadata) and a
//! logical key is never followed by `00` inside another logical key (row
//! keys continue only with a table marker). Versions no snapshot can read
//! any more are removed by [`Store::gc`].

pub mod splits;

use std::sync::atomic::{AtomicU64, Ordering};

use tracing::debug;

const META_PREFIX: &[u8] = b"\xFFmeta/";
const META_LAST_TS: &[u8] = b"\xFFmeta/last_commit_ts";
/// How long [`Store::open`] waits for a lock the previous handle of the
/// same directory (in this process) is still releasing.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
const VERSION_SEP: u8 = 0x00;
const SUFFIX_LEN: usize = 9;

/// Storage errors. Every one is internal (XX000) to the layers above: the
/// disk failed or stored bytes are not what this layer wrote.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("storage I/O error: {0}")]
    Sled(#[from] sled::Error),
    #[error("corrupt storage: {0}")]
    Corrupt(String),
    #[error("storage I/O error: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A commit timestamp: microseconds since the Unix epoch, made unique and
/// monotonic by the transaction layer.
pub type Timestamp = u64;

/// One write of a commit: `Some(value)` stores a version, `None` a tombstone.
pub type Write = (Vec<u8>, Option<Vec<u8>>);

/// The multi-version store.
pub struct Store {
    db: sled::Db,
    /// Highest timestamp whose commit is fully applied; readers use it.
    visible_ts: AtomicU64,
    temporary: bool,
    /// sled's log file, for `fdatasync` after each flush: sled makes its
    /// writes with `sync_file_range`, which neither flushes the disk's
    /// write cache nor the file's metadata, so a power failure could lose
    /// an acknowledged commit. `None` for temporary stores.
    log_file: Option<std::fs::File>,
}

impl Store {
    /// Opens (or creates) a store in `path`.
    ///
    /// sled releases its file lock only when its background I/O for the
    /// previous handle has finished, a moment after that handle is dropped;
    /// so a directory that is still locked is retried for up to
    /// [`LOCK_WAIT`] before the lock error is returned (another process
    /// holding it still gets the error, just not at once).
    pub fn open(path: &std::path::Path) -> Result<Store> {
        let config = sled::Config::new()
            .path(path)
            .mode(sled::Mode::HighThroughput);
        let started = std::time::Instant::now();
        let db = loop {
            match config.open() {
                Err(sled::Error::Io(e))
                    if e.to_string().contains("could not acquire lock")
                        && started.elapsed() < LOCK_WAIT =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => break r?,
            }
        };
        let mut store = Self::from_db(db, false)?;
        store.log_file = Some(std::fs::File::open(path.join("db"))?);
        Ok(store)
    }

    /// A store that lives in a temporary directory removed on drop.
    pub fn open_temporary() -> Result<Store> {
        let db = sled::Config::new().temporary(true).open()?;
        Self::from_db(db, true)
    }

    fn from_db(db: sled::Db, temporary: bool) -> Result<Store> {
        let last = match db.get(META_LAST_TS)? {
            Some(v) => u64::from_be_bytes(
                v.as_ref()
                    .try_into()
                    .map_err(|_| Error::Corrupt("last commit timestamp".into()))?,
            ),
            None => 0,
        };
        debug!(last_commit_ts = last, "store opened");
        Ok(Store {
            db,
            visible_ts: AtomicU64::new(last),
            temporary,
            log_file: None,
        })
    }

    pub fn is_temporary(&self) -> bool {
        self.temporary
    }

    /// The newest fully committed timestamp: a snapshot at it sees every
    /// acknowledged commit.
    pub fn visible_ts(&self) -> Timestamp {
        self.visible_ts.load(Ordering::Acquire)
    }

    /// Applies all `writes` at `ts` atomically and durably, and makes `ts`
    /// visible: the single-split commit. The caller (the transaction
    /// layer) guarantees that commits are serialized and that `ts` is
    /// greater than every earlier commit's.
    pub fn commit(&self, ts: Timestamp, writes: &[Write]) -> Result<()> {
        let mut batch = Batch::default();
        batch.versions(ts, writes);
        batch.put_meta_raw(META_LAST_TS, ts.to_be_bytes().to_vec());
        self.apply(batch)?;
        self.publish(ts);
        debug!(ts, writes = writes.len(), "committed");
        Ok(())
    }

    /// Applies one batch atomically, then flushes it to disk.
    pub fn apply(&self, batch: Batch) -> Result<()> {
        self.db.apply_batch(batch.inner)?;
        self.flush()
    }

    /// Applies one batch atomically without waiting for the disk; a later
    /// [`Store::flush`] makes it durable (group commit).
    pub fn apply_unsynced(&self, batch: Batch) -> Result<()> {
        self.db.apply_batch(batch.inner)?;
        Ok(())
    }

    /// Makes everything applied so far durable: sled writes its log, then
    /// `fdatasync` flushes it through the disk's cache.
    pub fn flush(&self) -> Result<()> {
        if !self.temporary {
            self.db.flush()?;
            if let Some(f) = &self.log_file {
                f.sync_data()?;
            }
        }
        Ok(())
    }

    /// Makes commits up to `ts` visible to new snapshots.
    pub fn publish(&self, ts: Timestamp) {
        self.visible_ts.fetch_max(ts, Ordering::AcqRel);
    }

    /// All metadata entries whose name starts with `prefix`.
    pub fn meta_scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut key = META_PREFIX.to_vec();
        key.extend_from_slice(prefix.as_bytes());
        let mut out = Vec::new();
        for item in self.db.scan_prefix(&key) {
            let (k, v) = item?;
            let name = String::from_utf8_lossy(&k[META_PREFIX.len()..]).into_owned();
            out.push((name, v.to_vec()));
        }
        Ok(out)
    }

    /// The value of `key` as of `ts`.
    pub fn get(&self, key: &[u8], ts: Timestamp) -> Result<Option<Vec<u8>>> {
        let start = physical_key(key, ts);
        let end = physical_key(key, 0);
        // The first version at or below `ts` is the visible one.
        match self.db.range(start..=end).next() {
            Some(item) => decode_version(&item?.1),
            None => Ok(None),
        }
    }

    /// Iterates the live keys in `[start, end)` as of `ts`, in key order.
    /// `end = None` means to the end of the logical key space.
    pub fn scan(&self, start: &[u8], end: Option<&[u8]>, ts: Timestamp) -> ScanIter {
        let end = end
            .map(|e| e.to_vec())
            .unwrap_or_else(|| META_PREFIX.to_vec());
        let inner = if start < end.as_slice() {
            Some(self.db.range(start.to_vec()..end.clone()))
        } else {
            None
        };
        ScanIter {
            db: self.db.clone(),
            end,
            inner,
            ts,
            last: None,
        }
    }

    /// Removes versions no snapshot at or after `horizon` can read: for each
    /// key, every version older than the newest one at or below `horizon`,
    /// and that one too if it is a tombstone. Returns how many versions it
    /// removed. Readers at `horizon` or later see exactly what they saw
    /// before.
    pub fn gc(&self, horizon: Timestamp) -> Result<u64> {
        let mut removed = 0u64;
        let mut batch = sled::Batch::default();
        let mut pending = 0;
        // The logical key being walked, and whether its visible-at-horizon
        // version has been passed (everything after it is garbage).
        let mut current: Option<Vec<u8>> = None;
        let mut past_horizon_version = false;
        for item in self.db.range(..META_PREFIX.to_vec()) {
            let (pk, v) = item?;
            let (key, ts) = split_physical(&pk)?;
            if current.as_deref() != Some(key) {
                current = Some(key.to_vec());
                past_horizon_version = false;
            }
            if ts > horizon {
                continue;
            }
            let garbage = if past_horizon_version {
                true
            } else {
                past_horizon_version = true;
                // The newest version at or below the horizon: a tombstone
                // there hides nothing anyone can still read.
                v.first() == Some(&0)
            };
            if garbage {
                batch.remove(pk);
                removed += 1;
                pending += 1;
                if pending >= 4096 {
                    self.db.apply_batch(std::mem::take(&mut batch))?;
                    pending = 0;
                }
            }
        }
        if pending > 0 {
            self.db.apply_batch(batch)?;
        }
        debug!(horizon, removed, "garbage collected");
        Ok(removed)
    }

    /// Reads an unversioned metadata value.
    pub fn meta(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let mut key = META_PREFIX.to_vec();
        key.extend_from_slice(name.as_bytes());
        Ok(self.db.get(key)?.map(|v| v.to_vec()))
    }

    /// Approximate on-disk size in bytes.
    pub fn size_on_disk(&self) -> Result<u64> {
        Ok(self.db.size_on_disk()?)
    }
}

/// One atomic group of changes: versions of logical keys and metadata.
#[derive(Default)]
pub struct Batch {
    inner: sled::Batch,
    len: usize,
}

impl Batch {
    /// Adds versions at `ts` (a `None` value is a tombstone).
    pub fn versions(&mut self, ts: Timestamp, writes: &[Write]) {
        for (key, value) in writes {
            let pk = physical_key(key, ts);
            match value {
                Some(v) => {
                    let mut bytes = Vec::with_capacity(v.len() + 1);
                    bytes.push(1);
                    bytes.extend_from_slice(v);
                    self.inner.insert(pk, bytes);
                }
                None => self.inner.insert(pk, vec![0u8]),
            }
            self.len += 1;
        }
    }

    /// Sets metadata `name` (unversioned).
    pub fn put_meta(&mut self, name: &str, value: Vec<u8>) {
        let mut key = META_PREFIX.to_vec();
        key.extend_from_slice(name.as_bytes());
        self.inner.insert(key, value);
        self.len += 1;
    }

    fn put_meta_raw(&mut self, key: &[u8], value: Vec<u8>) {
        self.inner.insert(key, value);
        self.len += 1;
    }

    /// Records `ts` as the last commit timestamp.
    pub fn set_last_commit_ts(&mut self, ts: Timestamp) {
        self.put_meta_raw(META_LAST_TS, ts.to_be_bytes().to_vec());
    }

    pub fn delete_meta(&mut self, name: &str) {
        let mut key = META_PREFIX.to_vec();
        key.extend_from_slice(name.as_bytes());
        self.inner.remove(key);
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

fn decode_version(v: &[u8]) -> Result<Option<Vec<u8>>> {
    match v.first() {
        Some(1) => Ok(Some(v[1..].to_vec())),
        Some(0) => Ok(None),
        _ => Err(Error::Corrupt("bad version value".into())),
    }
}

/// Iterator of a snapshot scan: `(logical key, value)` of live keys.
pub struct ScanIter {
    /// For [`ScanIter::seek`] (a handle: cloning a `sled::Db` is cheap).
    db: sled::Db,
    end: Vec<u8>,
    inner: Option<sled::Iter>,
    ts: Timestamp,
    /// The logical key whose visible version was already decided.
    last: Option<Vec<u8>>,
}

impl ScanIter {
    /// Continues the scan at the first live key `>= key` (which must not be
    /// before the keys already returned): a jump over a key range the
    /// caller does not need, such as the children of a parent row, without
    /// reading it.
    pub fn seek(&mut self, key: &[u8]) {
        self.last = None;
        self.inner = if key < self.end.as_slice() {
            Some(self.db.range(key.to_vec()..self.end.clone()))
        } else {
            None
        };
    }
}

impl Iterator for ScanIter {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        let inner = self.inner.as_mut()?;
        loop {
            let (pk, v) = match inner.next()? {
                Ok(kv) => kv,
                Err(e) => return Some(Err(e.into())),
            };
            let (key, ts) = match split_physical(&pk) {
                Ok(x) => x,
                Err(e) => return Some(Err(e)),
            };
            if ts > self.ts || self.last.as_deref() == Some(key) {
                continue;
            }
            self.last = Some(key.to_vec());
            match decode_version(&v) {
                Ok(Some(value)) => return Some(Ok((key.to_vec(), value))),
                Ok(None) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
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
}
