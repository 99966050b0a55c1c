//! Two-phase commit across splits, and its recovery.
//!
//! A transaction whose writes fall in more than one split commits in four
//! steps, each an atomic `apply_batch`:
//!
//! ```text
//!  1. prepare   for each participant split p:  meta prep/<ts>/<p> = p's writes
//!               flush                          (every participant is prepared)
//!  2. decide    coordinator:                   meta decision/<ts> = [participants]
//!               flush                          (the commit point)
//!  3. apply     for each participant split p:  versions of p's writes at ts, delete prep/<ts>/<p>
//!  4. finish    delete decision/<ts>, last_commit_ts = max(stored, ts)
//! ```
//!
//! Once the decision is durable the outcome is certain — recovery applies
//! the remaining prepared records — so steps 3 and 4 need no flush of
//! their own. The two flushes are shared with concurrent commits (group
//! commit), and several two-phase commits may be in doubt at once: they
//! run outside the commit lock. Readers only see timestamps up to the
//! store's visible timestamp, which passes `ts` only after step 4 (see the
//! crate docs' commit pipeline), so no reader ever sees part of a
//! transaction; they never wait either.
//!
//! Recovery ([`recover`], run when the database opens) finishes whatever a
//! crash interrupted:
//!
//! | crash after          | on disk                          | recovery          |
//! |----------------------|----------------------------------|-------------------|
//! | nothing / some prepares | prep records, no decision     | delete them: abort |
//! | the decision         | decision + all prep records      | apply all: commit |
//! | some applies         | decision + remaining prep records| apply the rest    |
//! | all applies          | decision only                    | delete it         |

use spindle_storage::{Batch, Store, Timestamp, Write};

use crate::{Error, Result};

/// Where a test may stop a commit, as if the process died there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// Before anything is written.
    BeforePrepare,
    /// After the first `n` participants prepared.
    AfterPrepare(usize),
    /// After the decision record is durable.
    AfterDecision,
    /// After the first `n` participants applied.
    AfterApply(usize),
}

pub(crate) fn prep_name(ts: Timestamp, split: u64) -> String {
    format!("prep/{ts:020}/{split:020}")
}

pub(crate) fn decision_name(ts: Timestamp) -> String {
    format!("decision/{ts:020}")
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

/// Resolves every in-doubt transaction; returns the highest timestamp it
/// committed, if any.
pub(crate) fn recover(store: &Store) -> Result<Option<Timestamp>> {
    let mut committed = None;
    let mut last = store.visible_ts();
    for (name, _) in store.meta_scan("decision/")? {
        let ts = parse_ts(&name, "decision/")
            .ok_or_else(|| Error::Recovery(format!("bad record {name}")))?;
        let mut batch = Batch::default();
        for (prep, bytes) in store.meta_scan(&format!("prep/{ts:020}/"))? {
            let writes = decode_writes(&bytes)
                .ok_or_else(|| Error::Recovery(format!("bad record {prep}")))?;
            batch.versions(ts, &writes);
            batch.delete_meta(&prep);
        }
        batch.delete_meta(&name);
        last = last.max(ts);
        batch.set_last_commit_ts(last);
        store.apply(batch)?;
        tracing::info!(ts, "recovery: committed an in-doubt transaction");
        committed = Some(ts);
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
