//! Committed transactions are serializable: threads run random list-append transactions
//! (reads, and appends of unique elements) over a few hot keys, and the checker of
//! tests/elle builds the write-write, write-read and read-write dependency graph of every
//! committed transaction from the histories and the final lists, and finds no cycle, no read
//! of something never committed, and no lost or duplicated append. On one node and on a
//! 3-node cluster over `mem`. tests/serializable_unisolated.rs shows the same checker failing
//! with isolation switched off; `SHOAL_ELLE_TXNS` sets the transactions per thread (the
//! nightly script runs many more).

mod elle;

use elle::{finals, run_all, txns_per_thread, Committed, Op};
use shoal_btree::BTree;
use shoal_engine::{Cluster, Engine, EngineConfig};
use std::collections::HashMap;
use std::time::Duration;

#[test]
fn list_append_histories_are_serializable_on_one_node() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let w = e.worker();
    let tree = BTree::create(&w, "lists").unwrap();
    let t0 = std::time::Instant::now();
    let history = run_all(
        (0..4).map(|_| e.worker()).collect(),
        tree,
        txns_per_thread(),
    );
    eprintln!(
        "{:?} with the default durability; log: {:?}",
        t0.elapsed(),
        e.stats().log
    );
    let bad = elle::check(&history, &finals(&w, &tree));
    assert!(bad.is_empty(), "not serializable: {bad:#?}");
    drop(w);
    e.close().unwrap();
}

/// The same with every transaction pausing inside, so that the others commit in between (the
/// interleavings the unisolated run shows the checker catching, tests/serializable_unisolated.rs).
#[test]
fn list_append_histories_that_pause_inside_are_serializable() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let w = e.worker();
    let tree = BTree::create(&w, "lists").unwrap();
    let workers = (0..4).map(|_| e.worker()).collect();
    let pause = Some(std::time::Duration::from_micros(50));
    let history = elle::run_all_paused(workers, tree, txns_per_thread(), pause);
    let bad = elle::check(&history, &finals(&w, &tree));
    assert!(bad.is_empty(), "not serializable: {bad:#?}");
    drop(w);
    e.close().unwrap();
}

#[test]
fn list_append_histories_are_serializable_on_three_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let c = Cluster::mem(3, Duration::from_secs(20), move |i| {
        EngineConfig::for_cluster_node(path.join(format!("node{i}")), 16 << 20)
    })
    .unwrap();
    let w = c.node(0).worker();
    let tree = BTree::create(&w, "lists").unwrap();
    let workers = (0..4).map(|i| c.node(i % 3).worker()).collect();
    let history = run_all(workers, tree, txns_per_thread() / 2);
    let bad = elle::check(&history, &finals(&c.node(2).worker(), &tree));
    assert!(bad.is_empty(), "not serializable: {bad:#?}");
    drop(w);
    c.close().unwrap();
}

fn read(key: u64, saw: &[u32]) -> Op {
    Op::Read {
        key,
        saw: saw.to_vec(),
    }
}

fn append(key: u64, element: u32) -> Op {
    Op::Append { key, element }
}

#[test]
fn the_checker_finds_write_skew_lost_appends_and_reads_of_nothing_committed() {
    // write skew: each reads both keys empty and appends to one; no serial order explains it
    let skew = [
        Committed {
            ops: vec![read(1, &[]), read(2, &[]), append(1, 10)],
        },
        Committed {
            ops: vec![read(1, &[]), read(2, &[]), append(2, 20)],
        },
    ];
    let finals = HashMap::from([(1, vec![10]), (2, vec![20])]);
    let bad = elle::check(&skew, &finals);
    assert!(
        bad.iter().any(|b| b.contains("cycle") && b.contains("rw")),
        "{bad:?}"
    );

    // the serial version of the same: T0 then T1, T1 sees T0's append
    let serial = [
        Committed {
            ops: vec![read(1, &[]), read(2, &[]), append(1, 10)],
        },
        Committed {
            ops: vec![read(1, &[10]), read(2, &[]), append(2, 20)],
        },
    ];
    assert_eq!(elle::check(&serial, &finals), Vec::<String>::new());

    // a committed append missing from the final list, and a read of an element never committed
    let lost = [
        Committed {
            ops: vec![append(1, 10)],
        },
        Committed {
            ops: vec![read(1, &[99])],
        },
    ];
    let bad = elle::check(&lost, &HashMap::from([(1, vec![])]));
    assert!(bad.iter().any(|b| b.contains("is lost")), "{bad:?}");
    assert!(bad.iter().any(|b| b.contains("not a prefix")), "{bad:?}");
}
