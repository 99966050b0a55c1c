//! # The write-ahead log: one device write and one `fdatasync` per flush
//!
//! A commit applies its writes to the data file ([`crate::kv`], redb) in a
//! write transaction that is not synced, and appends the same physical
//! operations to this log; [`Wal::flush`] writes every record appended
//! since the last flush with one `write` and one `fdatasync` (commits
//! waiting meanwhile share it: group commit). The data file is synced only
//! at checkpoints. (Before, with sled as the data file, sled made a batch
//! durable with two synchronous writes of its own plus an `fdatasync` of
//! its file: three device waits per commit; the log made it one.)
//!
//! ```text
//!   <dir>/wal: record* (then stale records or zeros, up to its allocated size)
//!   record:  len u32 LE │ crc32 u32 LE (of payload) │ payload (len bytes)
//!   payload: lsn u64 LE │ ops u32 LE │ op*
//!   op:      00 │ klen u32 LE │ key                      (remove)
//!            01 │ klen u32 LE │ key │ vlen u32 LE │ value (insert)
//! ```
//!
//! Invariants:
//! * Records get consecutive log sequence numbers (LSNs) in the order
//!   their write transactions commit (both under the appender's lock), and
//!   each transaction also writes its LSN to `meta/wal_lsn`, so the data
//!   file's state after any crash (its last durable commit, whole) holds
//!   exactly the records up to the LSN it stores.
//! * The file is allocated ahead, with zeros, in [`ALLOCATE_BYTES`]
//!   steps, and written in place from offset 0 again after each
//!   checkpoint: a flush then changes no file size, so its `fdatasync`
//!   writes the data alone, without a file-system journal commit
//!   (PostgreSQL zero-fills its WAL segments for the same reason).
//! * Recovery ([`Wal::recover`]) replays, in order, the records whose LSN
//!   is above the data file's, stopping at the first torn or corrupt record
//!   (one that was never acknowledged: a commit is acknowledged only after
//!   its record's `fdatasync`) or at the first record whose LSN does not
//!   follow its predecessor's (a stale record from before the last
//!   checkpoint: every newer record has a higher LSN). A record's
//!   operations are blind writes of absolute values, so the replayed state
//!   is the state after the last durable record. Then the data file is
//!   synced and the log emptied.
//! * A checkpoint restarts the log once it passes [`CHECKPOINT_BYTES`]:
//!   with the flush lock held (no record is being written), every record
//!   in the file was committed to the data file before it was appended,
//!   so syncing the data file makes the log unnecessary.
//! * A commit applied to the data file whose record was not yet flushed
//!   may survive a crash anyway (a later checkpoint): it was never
//!   acknowledged, and it survives whole or not at all.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

use crate::kv::{self, Kv, WriteTable};
use crate::{Error, Result};

/// Log size after which a flush checkpoints (syncs the data file, empties
/// the log).
pub const CHECKPOINT_BYTES: u64 = 64 << 20;
/// The log file grows (zero-filled, then synced) by this much at a time.
pub const ALLOCATE_BYTES: u64 = 4 << 20;

const OP_REMOVE: u8 = 0;
const OP_INSERT: u8 = 1;

/// One physical operation on the data file: insert `key → value`, or remove `key`.
pub(crate) type Op = (Vec<u8>, Option<Vec<u8>>);

/// Records appended but not yet written, and the next LSN.
struct Appender {
    buf: Vec<u8>,
    next_lsn: u64,
}

/// The log file, where the next record goes, and its allocated size.
struct Output {
    file: File,
    pos: u64,
    allocated: u64,
}

impl Output {
    /// Zero-fills the file up to at least `end` (in [`ALLOCATE_BYTES`]
    /// steps) and makes the new size durable.
    fn allocate(&mut self, end: u64) -> Result<()> {
        if end <= self.allocated {
            return Ok(());
        }
        let target = end.div_ceil(ALLOCATE_BYTES) * ALLOCATE_BYTES;
        let zeros = vec![0u8; 1 << 20];
        let mut at = self.allocated;
        while at < target {
            let n = (target - at).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        self.file.sync_all()?;
        self.allocated = target;
        Ok(())
    }
}

pub(crate) struct Wal {
    appender: Mutex<Appender>,
    output: Mutex<Output>,
    /// [`CHECKPOINT_BYTES`] (smaller in tests).
    checkpoint_bytes: u64,
}

impl Wal {
    /// Opens `dir/wal`, replays into `kv` the records it does not have
    /// (see the module docs), syncs it and empties the log.
    pub(crate) fn recover(dir: &Path, kv: &Kv) -> Result<Wal> {
        let path = dir.join("wal");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let stored = stored_lsn(kv)?;
        let mut last = stored;
        let mut replayed = 0usize;
        for (lsn, ops) in records(&bytes) {
            if lsn <= stored {
                continue;
            }
            kv.write(|t| write_logged(t, &ops, lsn))?;
            last = lsn;
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
        let mut output = Output {
            allocated: bytes.len() as u64,
            file,
            pos: 0,
        };
        output.allocate(ALLOCATE_BYTES)?;
        // Make the (possibly new) file's directory entry durable too.
        File::open(dir)?.sync_all()?;
        Ok(Wal {
            appender: Mutex::new(Appender {
                buf: Vec::new(),
                next_lsn: last + 1,
            }),
            output: Mutex::new(output),
            checkpoint_bytes: CHECKPOINT_BYTES,
        })
    }

    /// Commits the operations `resolve` returns (it runs inside the write
    /// transaction, so it may read what it is about to replace) to `kv`,
    /// and appends them to the log (not yet written: see [`Wal::flush`]).
    pub(crate) fn apply(
        &self,
        kv: &Kv,
        resolve: impl FnOnce(&WriteTable<'_>) -> Result<Vec<Op>>,
    ) -> Result<()> {
        let mut app = self
            .appender
            .lock()
            .map_err(|_| Error::Corrupt("write-ahead log lock poisoned".into()))?;
        let lsn = app.next_lsn;
        let ops = kv.write(|t| {
            let ops = resolve(t)?;
            write_logged(t, &ops, lsn)?;
            Ok(ops)
        })?;
        app.next_lsn += 1;
        encode_record(&mut app.buf, lsn, &ops);
        Ok(())
    }

    /// Writes every record appended so far and waits for the disk
    /// (`fdatasync`); checkpoints when the log has grown past
    /// [`CHECKPOINT_BYTES`].
    pub(crate) fn flush(&self, kv: &Kv) -> Result<()> {
        let mut out = self
            .output
            .lock()
            .map_err(|_| Error::Corrupt("write-ahead log lock poisoned".into()))?;
        let pending = {
            let mut app = self
                .appender
                .lock()
                .map_err(|_| Error::Corrupt("write-ahead log lock poisoned".into()))?;
            std::mem::take(&mut app.buf)
        };
        if !pending.is_empty() {
            let end = out.pos + pending.len() as u64;
            out.allocate(end)?;
            out.file.write_all_at(&pending, out.pos)?;
            out.file.sync_data()?;
            out.pos = end;
        }
        if out.pos >= self.checkpoint_bytes {
            // Every record in the file was committed to the data file
            // before it was appended; records appended since `pending` was
            // taken are still in the buffer and go to the emptied file
            // next time.
            kv.sync()?;
            out.pos = 0;
            tracing::debug!("write-ahead log checkpointed");
        }
        Ok(())
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

/// Writes `ops` and records `lsn` as the data file's, in one transaction.
fn write_logged(t: &mut WriteTable<'_>, ops: &[Op], lsn: u64) -> Result<()> {
    kv::write_ops(t, ops)?;
    kv::write_ops(
        t,
        &[(
            crate::META_WAL_LSN.to_vec(),
            Some(lsn.to_be_bytes().to_vec()),
        )],
    )
}

fn encode_record(out: &mut Vec<u8>, lsn: u64, ops: &[Op]) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]); // length and checksum, filled below
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for (k, v) in ops {
        out.push(if v.is_some() { OP_INSERT } else { OP_REMOVE });
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
        if let Some(v) = v {
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
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
    type Item = (u64, Vec<Op>);

    fn next(&mut self) -> Option<Self::Item> {
        let mut r = Reader(self.rest);
        self.rest = &[];
        let len = r.u32()? as usize;
        let crc = r.u32()?;
        let payload = r.take(len)?;
        if crc32fast::hash(payload) != crc {
            return None;
        }
        let (lsn, ops) = decode_payload(payload)?;
        if self.prev.is_some_and(|p| lsn != p + 1) {
            return None;
        }
        self.prev = Some(lsn);
        self.rest = r.0;
        Some((lsn, ops))
    }
}

fn decode_payload(payload: &[u8]) -> Option<(u64, Vec<Op>)> {
    let mut r = Reader(payload);
    let lsn = r.u64()?;
    let n = r.u32()? as usize;
    let mut ops = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let tag = r.take(1)?[0];
        let klen = r.u32()? as usize;
        let key = r.take(klen)?.to_vec();
        let value = match tag {
            OP_INSERT => {
                let vlen = r.u32()? as usize;
                Some(r.take(vlen)?.to_vec())
            }
            OP_REMOVE => None,
            _ => return None,
        };
        ops.push((key, value));
    }
    Some((lsn, ops))
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

    #[test]
    fn records_round_trip_and_stop_at_a_torn_or_corrupt_one() {
        let mut log = Vec::new();
        for lsn in 1..=3u64 {
            encode_record(&mut log, lsn, &ops(lsn as u8));
        }
        let all: Vec<_> = records(&log).collect();
        assert_eq!(
            all,
            (1..=3u64).map(|l| (l, ops(l as u8))).collect::<Vec<_>>()
        );
        // A torn tail: every prefix yields the records that are whole.
        let one = {
            let mut b = Vec::new();
            encode_record(&mut b, 1, &ops(1));
            b.len()
        };
        for cut in 0..log.len() {
            let n = records(&log[..cut]).count();
            assert_eq!(n, cut / one, "cut at {cut}");
        }
        // A flipped byte in the second record ends the log there.
        let mut bad = log.clone();
        bad[one + 12] ^= 0x40;
        assert_eq!(records(&bad).map(|(l, _)| l).collect::<Vec<_>>(), vec![1]);
        // A log restarted at offset 0 over older records (LSNs 1..=3):
        // the new records (10, 11) end where the LSNs stop following on.
        let mut restarted = Vec::new();
        encode_record(&mut restarted, 10, &ops(1));
        encode_record(&mut restarted, 11, &ops(2));
        restarted.extend_from_slice(&log[2 * one..]);
        let lsns: Vec<u64> = records(&restarted).map(|(l, _)| l).collect();
        assert_eq!(lsns, vec![10, 11]);
        // Zeros (the allocated, never written part) end the log too.
        let mut zeros = log[..one].to_vec();
        zeros.extend_from_slice(&[0; 64]);
        assert_eq!(records(&zeros).count(), 1);
    }

    /// `ops` committed to `kv` with `lsn`, as a logged commit does.
    fn commit(kv: &Kv, ops: &[Op], lsn: u64) {
        kv.write(|t| write_logged(t, ops, lsn)).unwrap();
    }

    /// Checkpoints restart the log in place: the file stops growing, and
    /// recovery over a restarted log (new records, then older ones) finds
    /// the newest state.
    #[test]
    fn checkpoints_restart_the_log_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let put = |k: &str, v: u32| (k.as_bytes().to_vec(), Some(v.to_be_bytes().to_vec()));
        {
            let kv = Kv::open(dir.path()).unwrap();
            let mut wal = Wal::recover(dir.path(), &kv).unwrap();
            wal.checkpoint_bytes = 10_000;
            let mut restarts = 0;
            for i in 0..1000u32 {
                let ops = vec![put("k", i), put(&format!("k{}", i % 7), i)];
                wal.apply(&kv, |_| Ok(ops)).unwrap();
                let before = wal.output.lock().unwrap().pos;
                wal.flush(&kv).unwrap();
                if wal.output.lock().unwrap().pos < before {
                    restarts += 1;
                }
            }
            assert!(restarts >= 3, "{restarts} checkpoints");
            let len = std::fs::metadata(dir.path().join("wal")).unwrap().len();
            assert_eq!(len, ALLOCATE_BYTES);
        }
        let kv = Kv::open(dir.path()).unwrap();
        Wal::recover(dir.path(), &kv).unwrap();
        assert_eq!(kv.get(b"k").unwrap(), Some(999u32.to_be_bytes().to_vec()));
        assert_eq!(kv.get(b"k4").unwrap(), Some(998u32.to_be_bytes().to_vec()));
        assert_eq!(stored_lsn(&kv).unwrap(), 1000);
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
            let kv = Kv::open(dir.path()).unwrap();
            commit(&kv, &[put("k", "1")], 1);
            commit(&kv, &[put("k", "2")], 2);
            commit(&kv, &[put("k", "3"), put("j", "3")], 3);
            kv.sync().unwrap();
            let mut log = Vec::new();
            encode_record(&mut log, 1, &[put("k", "1")]);
            encode_record(&mut log, 2, &[put("k", "2")]);
            std::fs::write(dir.path().join("wal"), &log).unwrap();
        }
        {
            let kv = Kv::open(dir.path()).unwrap();
            let wal = Wal::recover(dir.path(), &kv).unwrap();
            assert_eq!(kv.get(b"k").unwrap().as_deref(), Some(&b"3"[..]));
            assert_eq!(kv.get(b"j").unwrap().as_deref(), Some(&b"3"[..]));
            // The log restarts at offset 0, over records the data file has.
            assert_eq!(wal.output.lock().unwrap().pos, 0);
            assert_eq!(
                std::fs::metadata(dir.path().join("wal")).unwrap().len(),
                ALLOCATE_BYTES
            );
            // The next record continues after the data file's LSN.
            wal.apply(&kv, |_| Ok(vec![put("k", "4")])).unwrap();
            wal.flush(&kv).unwrap();
            assert_eq!(stored_lsn(&kv).unwrap(), 4);
        }
        // The data file holds record 1 only; the log has 1, 2, 3 and a torn
        // 4: 2 and 3 are replayed, 4 is not.
        let dir = tempfile::tempdir().unwrap();
        {
            let kv = Kv::open(dir.path()).unwrap();
            commit(&kv, &[put("k", "1")], 1);
            kv.sync().unwrap();
            let mut log = Vec::new();
            encode_record(&mut log, 1, &[put("k", "1")]);
            encode_record(&mut log, 2, &[put("k", "2"), put("j", "2")]);
            encode_record(&mut log, 3, &[put("k", "3"), (b"j".to_vec(), None)]);
            let whole = log.len();
            encode_record(&mut log, 4, &[put("k", "4")]);
            log.truncate(whole + 10);
            std::fs::write(dir.path().join("wal"), &log).unwrap();
        }
        let kv = Kv::open(dir.path()).unwrap();
        Wal::recover(dir.path(), &kv).unwrap();
        assert_eq!(kv.get(b"k").unwrap().as_deref(), Some(&b"3"[..]));
        assert_eq!(kv.get(b"j").unwrap(), None);
        assert_eq!(stored_lsn(&kv).unwrap(), 3);
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
            let kv = Kv::open(dir.path()).unwrap();
            let wal = Wal::recover(dir.path(), &kv).unwrap();
            for i in 0..50 {
                let v = i.to_string();
                wal.apply(&kv, |_| Ok(vec![put("k", &v)])).unwrap();
                wal.flush(&kv).unwrap();
            }
            for f in [kv::DATA_FILE, "wal"] {
                std::fs::copy(dir.path().join(f), copy.path().join(f)).unwrap();
            }
            std::mem::forget((kv, wal));
        }
        let kv = Kv::open(copy.path()).unwrap();
        Wal::recover(copy.path(), &kv).unwrap();
        assert_eq!(kv.get(b"k").unwrap().as_deref(), Some(&b"49"[..]));
        assert_eq!(stored_lsn(&kv).unwrap(), 50);
    }
}
