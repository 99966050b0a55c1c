//! Splits and two-phase commit at the transaction layer: automatic splits
//! at row-tree boundaries, one-phase vs two-phase commits, and recovery
//! after a crash at every step of two-phase commit.

use std::sync::Arc;

use spindle_catalog::{
    Catalog, ColumnDef, Interleave, InterleaveKind, KeyColumn, OnDelete, TableDef,
};
use spindle_keys::{DataType, Direction, Value};
use spindle_storage::Store;
use spindle_txn::{CrashPoint, Error, TxnManager};

const ACCOUNTS: i64 = 40;

fn schema() -> Catalog {
    let mut c = Catalog::new();
    let col = |n: &str| ColumnDef {
        name: n.into(),
        data_type: DataType::Int64,
        nullable: false,
        default: None,
        allow_commit_timestamp: false,
    };
    let key = |names: &[&str]| -> Vec<KeyColumn> {
        names
            .iter()
            .map(|n| KeyColumn {
                name: n.to_string(),
                direction: Direction::Asc,
            })
            .collect()
    };
    c.create_table(TableDef {
        name: "accounts".into(),
        columns: vec![col("id")],
        primary_key: key(&["id"]),
        interleave: None,
    })
    .unwrap();
    c.create_table(TableDef {
        name: "entries".into(),
        columns: vec![col("id"), col("seq")],
        primary_key: key(&["id", "seq"]),
        interleave: Some(Interleave {
            parent: "accounts".into(),
            kind: InterleaveKind::InParent,
            on_delete: OnDelete::Cascade,
        }),
    })
    .unwrap();
    c
}

fn account_key(c: &Catalog, id: i64) -> Vec<u8> {
    c.encode_key("accounts", &[Value::Int64(id)]).unwrap()
}

fn entry_key(c: &Catalog, id: i64, seq: i64) -> Vec<u8> {
    c.encode_key("entries", &[Value::Int64(id), Value::Int64(seq)])
        .unwrap()
}

fn balance(m: &Arc<TxnManager>, c: &Catalog, id: i64) -> i64 {
    let t = m.begin().unwrap();
    let v = t.get(&account_key(c, id)).unwrap().unwrap();
    String::from_utf8(v).unwrap().parse().unwrap()
}

/// Opens a database with accounts of 100 each, each with a few interleaved
/// entries, spread over several splits by a small split threshold.
fn setup(dir: &std::path::Path) -> (Arc<TxnManager>, Catalog) {
    let m = TxnManager::new(Store::open(dir).unwrap()).unwrap();
    m.set_split_threshold(2_000);
    let c = schema();
    let mut t = m.begin().unwrap();
    t.set_catalog(c.clone());
    t.commit().unwrap();
    for chunk in (0..ACCOUNTS).collect::<Vec<_>>().chunks(4) {
        let mut t = m.begin().unwrap();
        for id in chunk {
            t.put(account_key(&c, *id), b"100".to_vec());
            for seq in 0..3 {
                t.put(entry_key(&c, *id, seq), vec![b'e'; 40]);
            }
        }
        t.commit().unwrap();
    }
    // Splits are cut in the background: the tests' layout is the one
    // after every commit above.
    m.wait_split_maintenance();
    (m, c)
}

fn split_index(starts: &[Vec<u8>], key: &[u8]) -> usize {
    starts.partition_point(|s| s.as_slice() <= key) - 1
}

#[test]
fn splits_cut_only_between_row_trees() {
    let dir = tempfile::tempdir().unwrap();
    let (m, c) = setup(dir.path());
    let stats = m.split_stats().unwrap();
    assert!(
        stats.len() >= 4,
        "a small threshold splits the table: {} splits",
        stats.len()
    );
    let starts: Vec<Vec<u8>> = stats.iter().map(|s| s.start.clone()).collect();
    for id in 0..ACCOUNTS {
        let root = split_index(&starts, &account_key(&c, id));
        for seq in 0..3 {
            assert_eq!(
                split_index(&starts, &entry_key(&c, id, seq)),
                root,
                "row tree {id} spans splits"
            );
        }
    }
    assert!(stats.iter().all(|s| s.bytes <= 4_000 || s.oversized));
    assert!(
        stats.iter().map(|s| s.rows).sum::<u64>() >= (ACCOUNTS * 4) as u64 - 4,
        "{:?}",
        stats.iter().map(|s| (s.rows, s.bytes)).collect::<Vec<_>>()
    );
    // The layout survives a restart, and the sizes are counted again (in
    // the background, at open): a reopened database's splits do not
    // report zero.
    let total = |stats: &[spindle_txn::SplitInfo]| {
        (
            stats.iter().map(|s| s.rows).sum::<u64>(),
            stats.iter().map(|s| s.bytes).sum::<u64>(),
        )
    };
    let m = {
        // Recounted now, as the reopened database will be.
        drop(m);
        let m = TxnManager::new(Store::open(dir.path()).unwrap()).unwrap();
        m.split_stats().unwrap();
        m
    };
    let before = m.split_stats().unwrap();
    drop(m);
    let m = TxnManager::new(Store::open(dir.path()).unwrap()).unwrap();
    let stats = m.split_stats().unwrap();
    let again: Vec<Vec<u8>> = stats.iter().map(|s| s.start.clone()).collect();
    assert_eq!(again, starts);
    let (rows, bytes) = total(&stats);
    assert!(rows >= (ACCOUNTS * 4) as u64, "{rows} rows after a restart");
    assert!(bytes > rows * 40, "{bytes} bytes after a restart");
    assert_eq!(
        stats.iter().map(|s| (s.rows, s.bytes)).collect::<Vec<_>>(),
        before.iter().map(|s| (s.rows, s.bytes)).collect::<Vec<_>>()
    );
}

#[test]
fn one_split_commits_in_one_phase_and_several_in_two() {
    let dir = tempfile::tempdir().unwrap();
    let (m, c) = setup(dir.path());
    let mut t = m.begin().unwrap();
    t.put(account_key(&c, 0), b"99".to_vec());
    t.put(entry_key(&c, 0, 9), b"x".to_vec());
    let info = t.commit().unwrap().unwrap();
    assert!(!info.two_phase);
    assert_eq!(info.splits.len(), 1);
    let mut t = m.begin().unwrap();
    t.put(account_key(&c, 0), b"98".to_vec());
    t.put(account_key(&c, ACCOUNTS - 1), b"102".to_vec());
    let info = t.commit().unwrap().unwrap();
    assert!(info.two_phase);
    assert_eq!(info.splits.len(), 2);
    assert_eq!(balance(&m, &c, 0), 98);
    assert_eq!(balance(&m, &c, ACCOUNTS - 1), 102);
}

/// A commit's writes go to the splits that hold them — each split's run
/// of keys found by bisection, the catalog key (written last) to its own
/// split — and a commit over every split lands whole.
#[test]
fn a_commit_over_every_split_groups_its_writes_by_split() {
    let dir = tempfile::tempdir().unwrap();
    let (m, c) = setup(dir.path());
    let starts: Vec<Vec<u8>> = m
        .split_stats()
        .unwrap()
        .iter()
        .map(|s| s.start.clone())
        .collect();
    assert!(starts.len() >= 4, "{} splits", starts.len());
    let mut want: std::collections::BTreeSet<usize> = (0..ACCOUNTS)
        .map(|id| split_index(&starts, &account_key(&c, id)))
        .collect();
    want.insert(split_index(&starts, spindle_txn::CATALOG_KEY));
    let mut t = m.begin().unwrap();
    for id in 0..ACCOUNTS {
        t.put(account_key(&c, id), (200 + id).to_string().into_bytes());
    }
    t.set_catalog(c.clone());
    let info = t.commit().unwrap().unwrap();
    assert!(info.two_phase);
    assert_eq!(info.splits.len(), want.len(), "{:?}", info.splits);
    let ids: std::collections::BTreeSet<u64> = info.splits.iter().copied().collect();
    assert_eq!(ids.len(), info.splits.len(), "a split listed twice");
    drop(t);
    drop(m);
    let m = TxnManager::new(Store::open(dir.path()).unwrap()).unwrap();
    for id in 0..ACCOUNTS {
        assert_eq!(balance(&m, &c, id), 200 + id);
    }
}

/// A transfer between accounts in different splits, stopped at each step of
/// two-phase commit; after reopening, it is either entirely there or not at
/// all, and no prepared or decision record is left.
#[test]
fn crash_at_every_step_of_two_phase_commit_is_all_or_nothing() {
    let points = [
        (CrashPoint::BeforePrepare, false),
        (CrashPoint::AfterPrepare(1), false),
        // All prepare records are written: the "crash" here loses nothing
        // written, so they are durable, and that is the commit point.
        (CrashPoint::AfterPrepare(2), true),
        (CrashPoint::Committed, true),
    ];
    for (point, committed) in points {
        let dir = tempfile::tempdir().unwrap();
        let (m, c) = setup(dir.path());
        let (a, b) = (1, ACCOUNTS - 2);
        let mut t = m.begin().unwrap();
        t.put(account_key(&c, a), b"70".to_vec());
        t.put(account_key(&c, b), b"130".to_vec());
        t.put(entry_key(&c, a, 100), b"transfer out".to_vec());
        t.put(entry_key(&c, b, 100), b"transfer in".to_vec());
        m.inject_crash(Some(point));
        match t.commit() {
            Err(Error::Crashed(p)) => assert_eq!(p, point),
            other => panic!("expected a crash at {point:?}, got {other:?}"),
        }
        // The "dead" process refuses further commits.
        let mut t2 = m.begin().unwrap();
        t2.put(account_key(&c, 5), b"0".to_vec());
        assert!(t2.commit().is_err());
        drop(t2);
        drop(t);
        drop(m);

        let m = TxnManager::new(Store::open(dir.path()).unwrap()).unwrap();
        let (ba, bb) = (balance(&m, &c, a), balance(&m, &c, b));
        if committed {
            assert_eq!(
                (ba, bb),
                (70, 130),
                "{point:?}: the decided transaction must be complete"
            );
        } else {
            assert_eq!(
                (ba, bb),
                (100, 100),
                "{point:?}: the undecided transaction must be gone"
            );
        }
        let t = m.begin().unwrap();
        assert_eq!(
            t.get(&entry_key(&c, a, 100)).unwrap().is_some(),
            committed,
            "{point:?}"
        );
        assert_eq!(
            t.get(&entry_key(&c, b, 100)).unwrap().is_some(),
            committed,
            "{point:?}"
        );
        let total: i64 = (0..ACCOUNTS).map(|id| balance(&m, &c, id)).sum();
        assert_eq!(total, ACCOUNTS * 100, "{point:?}");
        assert!(
            m.store().meta_scan("prep/").unwrap().is_empty(),
            "{point:?}"
        );
        assert!(
            m.store().meta_scan("prepared/").unwrap().is_empty(),
            "{point:?}"
        );
        assert!(
            m.store().meta_scan("decision/").unwrap().is_empty(),
            "{point:?}"
        );
        // And the database keeps working.
        let mut t = m.begin().unwrap();
        t.put(account_key(&c, a), b"100".to_vec());
        t.commit().unwrap();
    }
}

/// Commits do not wait for each other to apply: while a two-phase commit
/// is held after its decision, a one-split commit on another thread
/// validates, applies and flushes (its version is in the store), but is not
/// visible — nor acknowledged — until the earlier commit finishes, and no
/// snapshot sees half of either.
#[test]
fn commits_apply_while_an_earlier_two_phase_commit_is_held() {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let (m, c) = setup(dir.path());
    let (a, b) = (1, ACCOUNTS - 2);
    let single = 20;
    let stats = m.split_stats().unwrap();
    let starts: Vec<Vec<u8>> = stats.iter().map(|s| s.start.clone()).collect();
    assert_ne!(
        split_index(&starts, &account_key(&c, a)),
        split_index(&starts, &account_key(&c, b))
    );

    let (reached_tx, reached_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let reached_tx = std::sync::Mutex::new(reached_tx);
    let release_rx = std::sync::Mutex::new(release_rx);
    m.set_step_hook(Some(Arc::new(move |point| {
        if point == CrashPoint::Committed && std::thread::current().name() == Some("held-2pc") {
            reached_tx.lock().unwrap().send(()).unwrap();
            release_rx.lock().unwrap().recv().unwrap();
        }
    })));

    let held = {
        let (m, c) = (m.clone(), c.clone());
        std::thread::Builder::new()
            .name("held-2pc".into())
            .spawn(move || {
                let mut t = m.begin().unwrap();
                t.put(account_key(&c, a), b"70".to_vec());
                t.put(account_key(&c, b), b"130".to_vec());
                t.commit().unwrap().unwrap()
            })
            .unwrap()
    };
    reached_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let visible_while_held = m.store().visible_ts();

    let (done_tx, done_rx) = mpsc::channel();
    let other = {
        let (m, c) = (m.clone(), c.clone());
        std::thread::spawn(move || {
            let mut t = m.begin().unwrap();
            t.put(account_key(&c, single), b"55".to_vec());
            let info = t.commit().unwrap().unwrap();
            done_tx.send(info.clone()).unwrap();
            info
        })
    };
    // The later commit's version reaches the store while the earlier
    // commit is still held.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let newest = m
            .store()
            .get(&account_key(&c, single), u64::MAX)
            .unwrap()
            .unwrap();
        if newest == b"55" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the one-split commit did not apply while a two-phase commit was held"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // ... but neither is visible nor acknowledged.
    let visible_during = m.store().visible_ts();
    assert!(visible_during >= visible_while_held);
    assert_eq!(balance(&m, &c, single), 100);
    assert_eq!((balance(&m, &c, a), balance(&m, &c, b)), (100, 100));
    std::thread::sleep(Duration::from_millis(50));
    assert!(done_rx.try_recv().is_err(), "acknowledged before visible");

    release_tx.send(()).unwrap();
    let first = held.join().unwrap();
    let second = other.join().unwrap();
    assert!(first.two_phase && !second.two_phase);
    assert!(first.ts < second.ts);
    assert!(
        visible_during < first.ts,
        "visible past a commit still in flight"
    );
    assert!(m.store().visible_ts() >= second.ts);
    assert_eq!((balance(&m, &c, a), balance(&m, &c, b)), (70, 130));
    assert_eq!(balance(&m, &c, single), 55);
    m.set_step_hook(None);

    // Both survive a restart.
    drop(m);
    let m = TxnManager::new(Store::open(dir.path()).unwrap()).unwrap();
    assert_eq!((balance(&m, &c, a), balance(&m, &c, b)), (70, 130));
    assert_eq!(balance(&m, &c, single), 55);
}

/// Many threads mixing one-split and two-phase transfers while readers
/// check that every snapshot sums to the same total.
#[test]
fn concurrent_one_and_two_phase_transfers_keep_the_total() {
    let dir = tempfile::tempdir().unwrap();
    let (m, c) = setup(dir.path());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let total = |m: &Arc<TxnManager>| -> i64 {
        let t = m.begin().unwrap();
        (0..ACCOUNTS)
            .map(|id| {
                let v = t.get(&account_key(&c, id)).unwrap().unwrap();
                String::from_utf8(v).unwrap().parse::<i64>().unwrap()
            })
            .sum()
    };
    let (two_phase, snapshots) = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (m, stop) = (m.clone(), stop.clone());
                let total = &total;
                scope.spawn(move || {
                    let mut snapshots = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        assert_eq!(total(&m), ACCOUNTS * 100, "a snapshot saw half a transfer");
                        snapshots += 1;
                    }
                    snapshots
                })
            })
            .collect();
        let writers: Vec<_> = (0..6u64)
            .map(|w| {
                let (m, c) = (m.clone(), c.clone());
                scope.spawn(move || {
                    let mut seed = w * 7919 + 1;
                    let mut committed = 0;
                    let mut two_phase = 0;
                    while committed < 40 {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let from = (seed >> 33) as i64 % ACCOUNTS;
                        let to = (seed >> 17) as i64 % ACCOUNTS;
                        if from == to {
                            continue;
                        }
                        let mut t = m.begin().unwrap();
                        let get = |t: &spindle_txn::Transaction, id| -> i64 {
                            let v = t.get(&account_key(&c, id)).unwrap().unwrap();
                            String::from_utf8(v).unwrap().parse().unwrap()
                        };
                        let (f, to_balance) = (get(&t, from), get(&t, to));
                        t.put(account_key(&c, from), (f - 1).to_string().into_bytes());
                        t.put(
                            account_key(&c, to),
                            (to_balance + 1).to_string().into_bytes(),
                        );
                        match t.commit() {
                            Ok(Some(info)) => {
                                committed += 1;
                                two_phase += info.two_phase as usize;
                            }
                            Err(Error::Conflict) => {}
                            other => panic!("unexpected commit result {other:?}"),
                        }
                    }
                    two_phase
                })
            })
            .collect();
        let two_phase: usize = writers.into_iter().map(|w| w.join().unwrap()).sum();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let snapshots: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
        (two_phase, snapshots)
    });
    assert!(two_phase > 0, "no transfer crossed splits");
    assert!(snapshots > 0);
    assert_eq!(total(&m), ACCOUNTS * 100);
    drop(m);
    let m = TxnManager::new(Store::open(dir.path()).unwrap()).unwrap();
    assert_eq!(total(&m), ACCOUNTS * 100);
}

/// `[count u32]` then per put `[klen u32][key][1][vlen u32][value]`: the
/// writes of a prepare record, byte by byte as `twopc` encodes them.
fn encode_puts(puts: &[(Vec<u8>, &[u8])]) -> Vec<u8> {
    let mut out = (puts.len() as u32).to_be_bytes().to_vec();
    for (k, v) in puts {
        out.extend((k.len() as u32).to_be_bytes());
        out.extend(k);
        out.push(1);
        out.extend((v.len() as u32).to_be_bytes());
        out.extend(*v);
    }
    out
}

/// Recovery's rule on records written by hand: a transaction whose prepare
/// records name a participant without one is aborted, one with all of them
/// is committed; the earlier protocol's records (`prep/` without the
/// participant list, then `decision/`) commit only with their decision.
#[test]
fn recovery_commits_exactly_the_fully_prepared_transactions() {
    use spindle_storage::Batch;
    let dir = tempfile::tempdir().unwrap();
    let (m, c) = setup(dir.path());
    let base = m.store().visible_ts();
    let prepared = |participants: &[u64], puts: &[(Vec<u8>, &[u8])]| {
        let mut v = (participants.len() as u32).to_be_bytes().to_vec();
        for p in participants {
            v.extend(p.to_be_bytes());
        }
        v.extend(encode_puts(puts));
        v
    };
    let name = |kind: &str, ts: u64, split: u64| format!("{kind}/{ts:020}/{split:020}");
    let mut b = Batch::default();
    // ts+1: participants 7 and 9, both prepared → committed.
    b.put_meta(
        &name("prepared", base + 1, 7),
        prepared(&[7, 9], &[(account_key(&c, 1), b"61")]),
    );
    b.put_meta(
        &name("prepared", base + 1, 9),
        prepared(&[7, 9], &[(account_key(&c, 2), b"62")]),
    );
    // ts+2: participants 7, 8 and 9, 8 missing → aborted.
    b.put_meta(
        &name("prepared", base + 2, 7),
        prepared(&[7, 8, 9], &[(account_key(&c, 3), b"63")]),
    );
    b.put_meta(
        &name("prepared", base + 2, 9),
        prepared(&[7, 8, 9], &[(account_key(&c, 4), b"64")]),
    );
    // ts+3: the earlier protocol with its decision → committed.
    b.put_meta(
        &name("prep", base + 3, 7),
        encode_puts(&[(account_key(&c, 5), b"65")]),
    );
    b.put_meta(&format!("decision/{:020}", base + 3), vec![]);
    // ts+4: the earlier protocol without a decision → aborted.
    b.put_meta(
        &name("prep", base + 4, 7),
        encode_puts(&[(account_key(&c, 6), b"66")]),
    );
    m.store().apply(b).unwrap();
    drop(m);

    let m = TxnManager::new(Store::open(dir.path()).unwrap()).unwrap();
    let got: Vec<i64> = (1..=6).map(|id| balance(&m, &c, id)).collect();
    assert_eq!(got, vec![61, 62, 100, 100, 65, 100]);
    assert!(m.store().visible_ts() >= base + 3);
    for kind in ["prepared/", "prep/", "decision/"] {
        assert!(m.store().meta_scan(kind).unwrap().is_empty(), "{kind}");
    }
}

/// Accounts `ids` with three entries each, in one transaction.
fn load_accounts(m: &Arc<TxnManager>, c: &Catalog, ids: std::ops::Range<i64>) {
    let mut t = m.begin().unwrap();
    for id in ids {
        t.put(account_key(c, id), b"100".to_vec());
        for seq in 0..3 {
            t.put(entry_key(c, id, seq), vec![b'e'; 40]);
        }
    }
    t.commit().unwrap();
}

/// A commit that pushes its split past the threshold returns without
/// waiting for the recount (which waits for the data file: here the
/// applier is held, so a commit that waited would never return); the
/// split is cut in the background once the applier moves again.
#[test]
fn a_commit_does_not_wait_for_its_split_to_be_recounted() {
    let dir = tempfile::tempdir().unwrap();
    let m = TxnManager::new(Store::open(dir.path()).unwrap()).unwrap();
    let c = schema();
    let mut t = m.begin().unwrap();
    t.set_catalog(c.clone());
    t.commit().unwrap();
    drop(t);
    m.set_split_threshold(2_000);
    let t = m.begin().unwrap();
    drop(t); // the snapshot waited for the catalog's apply
    let held = m.store().pause_applier().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (m2, c2) = (m.clone(), c.clone());
    let committer = std::thread::spawn(move || {
        load_accounts(&m2, &c2, 0..ACCOUNTS);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("the commit waited for its split's recount");
    committer.join().unwrap();
    drop(held);
    let stats = m.split_stats().unwrap();
    assert!(stats.len() >= 4, "{} splits", stats.len());
    assert_eq!(
        stats.iter().map(|s| s.rows).sum::<u64>(),
        (ACCOUNTS * 4) as u64 + 1
    );
}

/// One commit of many times the threshold is cut until every piece is
/// below it (each cut at a row-tree boundary), not in two.
#[test]
fn a_load_of_many_thresholds_is_cut_below_the_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let m = TxnManager::new(Store::open(dir.path()).unwrap()).unwrap();
    m.set_split_threshold(1_000);
    let c = schema();
    let mut t = m.begin().unwrap();
    t.set_catalog(c.clone());
    t.commit().unwrap();
    drop(t);
    // 40 row trees of ~220 bytes: ~9 thresholds, in one commit.
    load_accounts(&m, &c, 0..ACCOUNTS);
    let stats = m.split_stats().unwrap();
    assert!(stats.len() >= 9, "{} splits", stats.len());
    assert!(
        stats.iter().all(|s| s.bytes <= 1_000),
        "{:?}",
        stats.iter().map(|s| s.bytes).collect::<Vec<_>>()
    );
    let starts: Vec<Vec<u8>> = stats.iter().map(|s| s.start.clone()).collect();
    for id in 0..ACCOUNTS {
        let root = split_index(&starts, &account_key(&c, id));
        for seq in 0..3 {
            assert_eq!(split_index(&starts, &entry_key(&c, id, seq)), root);
        }
    }
}
