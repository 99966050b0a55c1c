//! # spindle-txn: transactions over the multi-version store
//!
//! A [`Transaction`] reads one snapshot (the store's visible timestamp when
//! it began) and buffers its writes in memory. Reads see the snapshot with
//! the transaction's own writes laid over it. Nothing reaches the store
//! until [`Transaction::commit`], which writes the whole buffer — rows and,
//! if DDL ran, the catalog — as one atomic, flushed batch at a new commit
//! timestamp.
//!
//! ```text
//!   begin ──► read_ts = store.visible_ts()
//!   reads ──► write buffer ∪ store@read_ts
//!   writes ─► write buffer (BTreeMap key → Some(value) | None)
//!   commit ─► lock ─► conflict check ─► ts = next_ts() ─► store.commit(ts, buffer) ─► unlock
//! ```
//!
//! ## Isolation (this version)
//!
//! Commits are serialized by one lock, and a read-write transaction may
//! commit only if no other transaction committed after its snapshot
//! (`last_commit_ts <= read_ts`); otherwise it aborts with
//! [`Error::Conflict`] (SQLSTATE 40001, retry). That makes every committed
//! transaction equivalent to running alone at its commit point:
//! serializable, never blocking, never deadlocking, at the price of
//! aborting on any concurrent commit. Read-only transactions always commit.
//! Per-key conflict detection, splits and two-phase commit replace this in
//! the transaction issue.
//!
//! ## Timestamps
//!
//! `next_ts = max(last_commit_ts + 1, wall clock in µs)`: unique, strictly
//! increasing across restarts (the last one is persisted by each commit).
//!
//! ## The catalog
//!
//! The catalog is stored under the logical key [`CATALOG_KEY`] like any row,
//! so it is versioned and committed atomically with data. A transaction
//! reads it at its snapshot; DDL replaces the transaction's copy.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, RwLock};

use spindle_catalog::Catalog;
use spindle_storage::{Store, Timestamp};
use tracing::{debug, info_span};

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
}

impl Error {
    /// Whether retrying the transaction may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Conflict)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Shared state of one database: the store, the commit lock and the cached
/// catalog.
pub struct TxnManager {
    store: Store,
    /// Serializes commits; holds the last commit timestamp.
    commit_lock: Mutex<Timestamp>,
    /// The catalog as of the commit timestamp stored with it.
    catalog: RwLock<(Timestamp, Arc<Catalog>)>,
}

impl TxnManager {
    pub fn new(store: Store) -> Result<Arc<TxnManager>> {
        let ts = store.visible_ts();
        let catalog = match store.get(CATALOG_KEY, ts)? {
            Some(bytes) => {
                Catalog::from_bytes(&bytes).map_err(|e| Error::CorruptCatalog(e.to_string()))?
            }
            None => Catalog::new(),
        };
        Ok(Arc::new(TxnManager {
            store,
            commit_lock: Mutex::new(ts),
            catalog: RwLock::new((ts, Arc::new(catalog))),
        }))
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Starts a transaction on the newest snapshot.
    pub fn begin(self: &Arc<Self>) -> Result<Transaction> {
        let read_ts = self.store.visible_ts();
        let catalog = self.catalog_at(read_ts)?;
        debug!(read_ts, "begin");
        Ok(Transaction {
            mgr: self.clone(),
            read_ts,
            writes: BTreeMap::new(),
            catalog,
            catalog_changed: false,
        })
    }

    fn catalog_at(&self, ts: Timestamp) -> Result<Arc<Catalog>> {
        {
            let cached = self.catalog.read().map_err(|_| Error::Poisoned)?;
            // The cache holds the newest catalog; it is valid for any
            // snapshot at or after the commit that wrote it.
            if cached.0 <= ts {
                return Ok(cached.1.clone());
            }
        }
        match self.store.get(CATALOG_KEY, ts)? {
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
    read_ts: Timestamp,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    catalog: Arc<Catalog>,
    catalog_changed: bool,
}

impl Transaction {
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

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(w) = self.writes.get(key) {
            return Ok(w.clone());
        }
        Ok(self.mgr.store.get(key, self.read_ts)?)
    }

    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.writes.insert(key, Some(value));
    }

    pub fn delete(&mut self, key: Vec<u8>) {
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
            self.writes.insert(k, None);
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
        let upper = match end {
            Some(e) => Bound::Excluded(e.to_vec()),
            None => Bound::Unbounded,
        };
        let overlay: Vec<(Vec<u8>, Option<Vec<u8>>)> = self
            .writes
            .range((Bound::Included(start.to_vec()), upper))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Snapshot {
            start: start.to_vec(),
            end: end.map(|e| e.to_vec()),
            read_ts: self.read_ts,
            overlay,
        }
    }

    pub fn manager(&self) -> &Arc<TxnManager> {
        &self.mgr
    }

    /// Commits atomically and durably, or fails with [`Error::Conflict`].
    /// The buffered writes are consumed: after a commit (successful or
    /// not) the transaction holds nothing and must not be used again.
    pub fn commit(&mut self) -> Result<Option<Timestamp>> {
        let span = info_span!("commit", read_ts = self.read_ts, writes = self.writes.len());
        let _g = span.enter();
        if !self.has_writes() {
            return Ok(None);
        }
        let catalog_changed = std::mem::take(&mut self.catalog_changed);
        let buffered = std::mem::take(&mut self.writes);
        let mut last = self.mgr.commit_lock.lock().map_err(|_| Error::Poisoned)?;
        if *last > self.read_ts {
            debug!(last = *last, "conflict");
            return Err(Error::Conflict);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let ts = (*last + 1).max(now);
        let mut writes: Vec<(Vec<u8>, Option<Vec<u8>>)> = buffered.into_iter().collect();
        if catalog_changed {
            writes.push((CATALOG_KEY.to_vec(), Some(self.catalog.to_bytes())));
        }
        // Publish the new catalog before the commit becomes visible, so no
        // snapshot at `ts` can pick up the previous one from the cache.
        let previous = if catalog_changed {
            let mut cached = self.mgr.catalog.write().map_err(|_| Error::Poisoned)?;
            Some(std::mem::replace(&mut *cached, (ts, self.catalog.clone())))
        } else {
            None
        };
        if let Err(e) = self.mgr.store.commit(ts, &writes) {
            if let Some(prev) = previous {
                if let Ok(mut cached) = self.mgr.catalog.write() {
                    *cached = prev;
                }
            }
            return Err(e.into());
        }
        *last = ts;
        Ok(Some(ts))
    }
}

/// See [`Transaction::snapshot`].
#[derive(Clone)]
pub struct Snapshot {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
    read_ts: Timestamp,
    overlay: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl Snapshot {
    pub fn into_iter(self, mgr: &Arc<TxnManager>) -> TxnScan {
        let store = mgr
            .store
            .scan(&self.start, self.end.as_deref(), self.read_ts);
        TxnScan {
            store: store.peekable(),
            overlay: self.overlay.into_iter().peekable(),
        }
    }
}

/// A buffered write: `None` deletes the key.
type BufferedWrite = (Vec<u8>, Option<Vec<u8>>);

/// Merges the store's snapshot with the transaction's buffered writes.
pub struct TxnScan {
    store: std::iter::Peekable<spindle_storage::ScanIter>,
    overlay: std::iter::Peekable<std::vec::IntoIter<BufferedWrite>>,
}

impl Iterator for TxnScan {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let store_key = match self.store.peek() {
                Some(Ok((k, _))) => Some(k.clone()),
                Some(Err(_)) => return self.store.next().map(|r| r.map_err(Error::from)),
                None => None,
            };
            let take_overlay = match (&store_key, self.overlay.peek()) {
                (None, None) => return None,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some(sk), Some((ok, _))) => {
                    if ok <= sk {
                        if ok == sk {
                            self.store.next();
                        }
                        true
                    } else {
                        false
                    }
                }
            };
            if take_overlay {
                if let Some((k, v)) = self.overlay.next() {
                    match v {
                        Some(v) => return Some(Ok((k, v))),
                        None => continue,
                    }
                }
            } else {
                return self.store.next().map(|r| r.map_err(Error::from));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mgr() -> Arc<TxnManager> {
        TxnManager::new(Store::open_temporary().unwrap()).unwrap()
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

    #[test]
    fn concurrent_writer_conflicts() {
        let m = mgr();
        let mut a = m.begin().unwrap();
        let mut b = m.begin().unwrap();
        a.put(b"\x20x".to_vec(), b"a".to_vec());
        b.put(b"\x20x".to_vec(), b"b".to_vec());
        a.commit().unwrap();
        assert!(matches!(b.commit(), Err(Error::Conflict)));
        // Read-only transactions always commit.
        let mut r = m.begin().unwrap();
        let mut w = m.begin().unwrap();
        w.put(b"\x20y".to_vec(), b"1".to_vec());
        w.commit().unwrap();
        assert!(r.commit().unwrap().is_none());
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
