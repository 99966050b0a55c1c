//! Two-phase commit across splits, and its recovery.
//!
//! A transaction whose writes fall in more than one split commits in two
//! steps of atomic `apply_batch`es:
//!
//! ```text
//!  1. prepare   for each participant split p:  meta prepared/<ts>/<p> = [participants] + p's writes
//!  2. apply     one batch: versions of every participant's writes at ts,
//!               delete every prepared/<ts>/*, last_commit_ts = max(stored, ts)
//!               flush          ← the commit point: every participant is prepared
//! ```
//!
//! Step 2 is queued right behind the prepares, before the flush: the store
//! has one write-ahead log and applies its batches in log order, and after
//! a crash both the log (replay stops at the first torn record) and the data
//! file (applied in order, synced at checkpoints) hold a prefix of the
//! batches. So step 2 is never found without every prepare before it, and
//! its apply overlaps the flush's disk wait instead of following it. The
//! commit returns once the flush is done and step 2 is applied.
//!
//! The decision is implicit (as in CockroachDB's parallel commits): a
//! transaction is committed exactly when every participant named in its
//! prepare records has its prepare record durable. So the coordinator
//! writes no decision record and the commit costs one flush, not two.
//! Step 2 needs no flush of its own: once the prepares are durable, recovery
//! finishes the commit. Step 2 applies every version and removes all of the
//! transaction's prepare records in one batch (one write transaction and one
//! log record, rather than one per participant), so a set of
//! records found after a crash is either complete (committed, step 2 lost
//! or applied whole) or was never complete (nothing applied: step 2 comes
//! after every prepare in the log). The flush is shared with concurrent commits (group
//! commit), and several two-phase commits may be in doubt at once: they
//! run outside the commit lock. Readers only see timestamps up to the
//! store's visible timestamp, which passes `ts` only after step 2 (see the
//! crate docs' commit pipeline), so no reader ever sees part of a
//! transaction; they never wait either.
//!
//! Recovery ([`recover`], run when the database opens) finishes whatever a
//! crash interrupted:
//!
//! | crash after             | on disk                               | recovery           |
//! |-------------------------|---------------------------------------|--------------------|
//! | nothing / some prepares | prepare records of some participants  | delete them: abort |
//! | all prepares            | every participant's prepare record    | apply all: commit  |
//! | the apply               | nothing                               | nothing            |
//!
//! Stores written by the earlier protocol (`prep/<ts>/<p>` records without
//! the participant list, and a `decision/<ts>` record written and flushed
//! after them) are recovered by its rule: committed if the decision is
//! there, aborted otherwise.

use spindle_storage::{Batch, Store, Timestamp, Write};

use crate::{Error, Result};

/// Where a test may stop a commit, as if the process died there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// Before anything is written.
    BeforePrepare,
    /// After the first `n` participants prepared.
    AfterPrepare(usize),
    /// After every prepare record is durable: the commit point.
    Committed,
}

pub(crate) fn prepared_name(ts: Timestamp, split: u64) -> String {
    format!("prepared/{ts:020}/{split:020}")
}

/// A prepare record: `[n u32][participant split id u64] × n` then the
/// split's writes ([`encode_writes`]).
pub(crate) fn encode_prepared(participants: &[u64], writes: &[Write]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 8 * participants.len());
    out.extend_from_slice(&(participants.len() as u32).to_be_bytes());
    for p in participants {
        out.extend_from_slice(&p.to_be_bytes());
    }
    out.extend_from_slice(&encode_writes(writes));
    out
}

fn decode_prepared(bytes: &[u8]) -> Option<(Vec<u64>, Vec<Write>)> {
    let n = u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let ids = bytes.get(4..4 + 8usize.checked_mul(n)?)?;
    let participants = ids
        .chunks_exact(8)
        .map(|c| c.try_into().map(u64::from_be_bytes))
        .collect::<std::result::Result<Vec<u64>, _>>()
        .ok()?;
    let writes = decode_writes(&bytes[4 + 8 * n..])?;
    Some((participants, writes))
}

/// `[count u32]` then per write `[klen u32][key][tag u8: 0 delete, 1 put][vlen u32][value]`.
pub(crate) fn encode_writes(writes: &[Write]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(writes.len() as u32).to_be_bytes());
    for (k, v) in writes {
        out.extend_from_slice(&(k.len() as u32).to_be_bytes());
        out.extend_from_slice(k);
        match v {
            Some(v) => {
                out.push(1);
                out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                out.extend_from_slice(v);
            }
            None => out.push(0),
        }
    }
    out
}

pub(crate) fn decode_writes(bytes: &[u8]) -> Option<Vec<Write>> {
    let mut pos = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = bytes.get(pos..pos.checked_add(n)?)?;
        pos += n;
        Some(s)
    };
    let count = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
    let mut out = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let klen = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
        let key = take(klen)?.to_vec();
        let v = match take(1)?[0] {
            1 => {
                let vlen = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
                Some(take(vlen)?.to_vec())
            }
            _ => None,
        };
        out.push((key, v));
    }
    Some(out)
}

fn parse_ts(name: &str, prefix: &str) -> Option<Timestamp> {
    name.strip_prefix(prefix)?.split('/').next()?.parse().ok()
}

/// A prepare record read back: its name, participants and writes.
type PrepareRecord = (String, Vec<u64>, Vec<Write>);

/// Resolves every in-doubt transaction; returns the highest timestamp it
/// committed, if any.
pub(crate) fn recover(store: &Store) -> Result<Option<Timestamp>> {
    let bad = |name: &str| Error::Recovery(format!("bad record {name}"));
    let mut committed = None;
    let mut last = store.visible_ts();
    // Prepare records by transaction: (name, participants, writes).
    let mut txns: std::collections::BTreeMap<Timestamp, Vec<PrepareRecord>> = Default::default();
    for (name, bytes) in store.meta_scan("prepared/")? {
        let ts = parse_ts(&name, "prepared/").ok_or_else(|| bad(&name))?;
        let (participants, writes) = decode_prepared(&bytes).ok_or_else(|| bad(&name))?;
        txns.entry(ts)
            .or_default()
            .push((name, participants, writes));
    }
    for (ts, records) in txns {
        let mut batch = Batch::default();
        let mut present: Vec<u64> = Vec::new();
        for (name, _, _) in &records {
            let split = name.rsplit('/').next().and_then(|s| s.parse().ok());
            present.push(split.ok_or_else(|| bad(name))?);
            batch.delete_meta(name);
        }
        present.sort_unstable();
        let Some((_, first, _)) = records.first() else {
            continue;
        };
        let mut named = first.clone();
        named.sort_unstable();
        let complete = present == named
            && records.iter().all(|(_, p, _)| {
                let mut p = p.clone();
                p.sort_unstable();
                p == named
            });
        if complete {
            for (_, _, writes) in &records {
                batch.versions(ts, writes);
            }
            last = last.max(ts);
            batch.set_last_commit_ts(last);
            store.apply(batch)?;
            tracing::info!(ts, "recovery: committed a fully prepared transaction");
            committed = Some(committed.map_or(ts, |c: Timestamp| c.max(ts)));
        } else {
            store.apply(batch)?;
            tracing::info!(ts, "recovery: aborted a partly prepared transaction");
        }
    }
    // The earlier protocol's records.
    for (name, _) in store.meta_scan("decision/")? {
        let ts = parse_ts(&name, "decision/").ok_or_else(|| bad(&name))?;
        let mut batch = Batch::default();
        for (prep, bytes) in store.meta_scan(&format!("prep/{ts:020}/"))? {
            let writes = decode_writes(&bytes).ok_or_else(|| bad(&prep))?;
            batch.versions(ts, &writes);
            batch.delete_meta(&prep);
        }
        batch.delete_meta(&name);
        last = last.max(ts);
        batch.set_last_commit_ts(last);
        store.apply(batch)?;
        tracing::info!(ts, "recovery: committed an in-doubt transaction");
        committed = Some(committed.map_or(ts, |c: Timestamp| c.max(ts)));
    }
    let orphans = store.meta_scan("prep/")?;
    if !orphans.is_empty() {
        let mut batch = Batch::default();
        for (name, _) in &orphans {
            batch.delete_meta(name);
        }
        store.apply(batch)?;
        tracing::info!(
            records = orphans.len(),
            "recovery: aborted prepared writes without a decision"
        );
    }
    if let Some(ts) = committed {
        store.publish(ts);
    }
    Ok(committed)
}
