//! Transactions are isolated: threads moving money between accounts neither make nor lose any,
//! and read-only transactions summing every account see the exact total every time; on one
//! node and on a 3-node cluster (in one process, over `mem`), and with accounts over many
//! leaves on 2 nodes (commits that latch leaves the other node keeps taking must still get
//! through). tests/transactions_unisolated.rs
//! shows the same checker failing with isolation switched off.

mod bank;

use bank::Load;

use shoal_btree::BTree;
use shoal_engine::{Cluster, EngineConfig};
use std::time::Duration;

fn secs() -> f64 {
    std::env::var("SHOAL_BANK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0)
}

/// A mem cluster of `n` nodes with small caches, its data under `dir`.
fn cluster(n: usize, dir: &std::path::Path) -> Cluster {
    let path = dir.to_path_buf();
    Cluster::mem(n, Duration::from_secs(20), move |i| {
        EngineConfig::for_cluster_node(path.join(format!("node{i}")), 16 << 20)
    })
    .unwrap()
}

/// What isolation promises of a bank run: transfers and audits ran, no audit saw a wrong
/// total, and the total after it is exact.
fn isolated(seen: &bank::Seen, total: i64) {
    assert!(seen.transfers > 100, "{seen:?}");
    assert!(seen.audits > 10, "{seen:?}");
    assert_eq!(seen.wrong_audits, 0, "audits saw a wrong total: {seen:?}");
    assert_eq!(total, bank::TOTAL, "money was made or lost");
}

/// A bank run on one node (4 movers, 1 auditor) under `load`, checked for isolation.
fn isolated_on_one_node(load: Load, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (e, tree, w) = bank::one_node(dir.path());
    let movers = (0..4).map(|_| e.worker()).collect();
    let seen = bank::run(movers, vec![e.worker()], tree, load);
    let total = bank::total_now(&w, &tree);
    eprintln!("{what}: {seen:?}, total after {total}");
    isolated(&seen, total);
    drop(w);
    e.close().unwrap();
}

#[test]
fn transfers_keep_the_total_and_audits_see_it_on_one_node() {
    isolated_on_one_node(Load::for_secs(secs()), "one node");
}

#[test]
fn transfers_that_pause_inside_keep_the_total_and_audits_see_it() {
    let load = Load {
        pause_inside: Some(Duration::from_micros(50)),
        ..Load::for_secs(secs())
    };
    isolated_on_one_node(load, "one node, pausing inside transfers");
}

#[test]
fn a_transfer_that_another_commits_inside_of_runs_again_and_keeps_the_total() {
    let dir = tempfile::tempdir().unwrap();
    let (e, tree, w) = bank::one_node(dir.path());
    let runs = bank::transfer_around_another(&w, &e.worker(), &tree);
    assert_eq!(runs, 2, "the outer transfer conflicted once and ran again");
    assert_eq!(
        bank::total_now(&w, &tree),
        bank::TOTAL,
        "money was made or lost"
    );
    let balance = |a| {
        let mut v = Vec::new();
        assert!(tree.lookup(&w, shoal_btree::u64_key(a), &mut v).unwrap());
        i64::from_le_bytes(v[..8].try_into().unwrap())
    };
    let start = bank::START;
    assert_eq!(
        (balance(0), balance(1), balance(2)),
        (start - 110, start + 100, start + 10)
    );
    drop(w);
    e.close().unwrap();
}

#[test]
fn transfers_keep_the_total_and_audits_see_it_on_three_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(3, dir.path());
    let w = c.node(0).worker();
    let tree = BTree::create(&w, "bank").unwrap();
    bank::open_accounts(&w, &tree);
    // movers on every node; the auditor on the node that does not home the accounts
    let movers = (0..4).map(|i| c.node(i % 3).worker()).collect();
    let seen = bank::run(
        movers,
        vec![c.node(2).worker()],
        tree,
        Load::for_secs(secs()),
    );
    let total = bank::total_now(&c.node(1).worker(), &tree);
    eprintln!("three nodes: {seen:?}, total after {total}");
    isolated(&seen, total);
    drop(w);
    c.close().unwrap();
}

#[test]
fn transfers_between_leaves_that_both_nodes_write_still_commit() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(2, dir.path());
    let w = c.node(0).worker();
    let tree = BTree::create(&w, "bank").unwrap();
    bank::open_wide_accounts(&w, &tree);
    let leaves = tree.verify(&w).unwrap().leaves;
    assert!(leaves >= 8, "the accounts fill {leaves} leaves");
    // two movers on each node, each transfer four moves that write the same few leaves every
    // time, which the other node keeps taking
    let movers = (0..4).map(|i| c.node(i % 2).worker()).collect();
    let load = Load {
        legs: 4,
        ..Load::for_secs(secs())
    };
    let seen = bank::run(movers, vec![c.node(1).worker()], tree, load);
    let total = bank::total_now(&c.node(1).worker(), &tree);
    eprintln!("two nodes, {leaves} leaves: {seen:?}, total after {total}");
    isolated(&seen, total);
    drop(w);
    c.close().unwrap();
}

/// What isolation promises of a flip-flop run: moves and audits ran, no committed audit saw
/// a sum that never existed, and none wrote one.
fn no_audit_saw_a_state_that_never_existed(
    w: &shoal_engine::Worker,
    sums: &BTree,
    seen: &bank::FlipFlops,
    auditors: u64,
) {
    assert!(seen.moves > 100, "{seen:?}");
    assert!(seen.audits > 100 && seen.writing_audits > 10, "{seen:?}");
    assert_eq!(
        seen.wrong_audits, 0,
        "audits committed a state that never existed: {seen:?}"
    );
    for a in 0..auditors {
        let mut v = Vec::new();
        if sums.lookup(w, shoal_btree::u64_key(a), &mut v).unwrap() {
            let s = i64::from_le_bytes(v[..8].try_into().unwrap());
            assert_eq!(
                s,
                2 * bank::START,
                "auditor {a} wrote a sum that never existed"
            );
        }
    }
}

#[test]
fn audits_of_values_that_move_and_move_back_see_only_states_that_existed_on_one_node() {
    let dir = tempfile::tempdir().unwrap();
    // (durability none: moves as fast as the machine allows, for more interleavings)
    let mut cfg = EngineConfig::new(dir.path(), 64 << 20);
    cfg.durability = shoal_engine::Durability::None;
    let e = shoal_engine::Engine::open(cfg).unwrap();
    let w = e.worker();
    let tree = BTree::create(&w, "flip").unwrap();
    let sums = BTree::create(&w, "sums").unwrap();
    bank::open_flip_flop(&w, &tree);
    let seen = bank::flip_flop(e.worker(), vec![e.worker()], tree, sums, secs());
    eprintln!("one node: {seen:?}");
    no_audit_saw_a_state_that_never_existed(&w, &sums, &seen, 1);
    drop(w);
    e.close().unwrap();
}

#[test]
fn audits_of_values_that_move_and_move_back_see_only_states_that_existed_on_three_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(3, dir.path());
    let w = c.node(0).worker();
    let tree = BTree::create(&w, "flip").unwrap();
    let sums = BTree::create(&w, "sums").unwrap();
    bank::open_flip_flop(&w, &tree);
    // the mover and an auditor on node 1 (the pages' home is node 0), an auditor on node 2
    let auditors = vec![c.node(1).worker(), c.node(2).worker()];
    let seen = bank::flip_flop(c.node(1).worker(), auditors, tree, sums, secs());
    eprintln!("three nodes: {seen:?}");
    no_audit_saw_a_state_that_never_existed(&c.node(1).worker(), &sums, &seen, 2);
    drop(w);
    c.close().unwrap();
}

#[test]
fn audits_of_registers_whose_values_are_swapped_see_a_permutation_on_one_and_three_nodes() {
    assert!(bank::a_permutation(
        &(0..bank::REGISTERS).rev().collect::<Vec<_>>()
    ));
    assert!(!bank::a_permutation(&vec![0; bank::REGISTERS as usize]));
    let check = |seen: &bank::Swaps, what: &str| {
        eprintln!("{what}: {seen:?}");
        assert!(seen.swaps > 100 && seen.audits > 10, "{what}: {seen:?}");
        assert_eq!(
            seen.wrong_audits, 0,
            "{what}: an audit saw a state that never existed"
        );
    };
    // one node
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EngineConfig::new(dir.path(), 64 << 20);
    cfg.durability = shoal_engine::Durability::None;
    let e = shoal_engine::Engine::open(cfg).unwrap();
    let w = e.worker();
    let tree = BTree::create(&w, "registers").unwrap();
    bank::open_registers(&w, &tree);
    assert!(tree.verify(&w).unwrap().leaves >= 16);
    let pause = Duration::from_micros(20);
    let seen = bank::swaps(
        vec![e.worker(), e.worker()],
        vec![e.worker()],
        tree,
        pause,
        secs() / 2.0,
    );
    check(&seen, "one node");
    drop(w);
    e.close().unwrap();
    // three nodes
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(3, dir.path());
    let w = c.node(0).worker();
    let tree = BTree::create(&w, "registers").unwrap();
    bank::open_registers(&w, &tree);
    let swappers = vec![c.node(1).worker(), c.node(0).worker()];
    let seen = bank::swaps(
        swappers,
        vec![c.node(1).worker(), c.node(2).worker()],
        tree,
        pause,
        secs() / 2.0,
    );
    check(&seen, "three nodes");
    drop(w);
    c.close().unwrap();
}

#[test]
fn transfers_over_many_leaves_keep_the_total_and_audits_by_point_reads_see_it_on_one_and_three_nodes(
) {
    // movers pause inside their transfers, so that audits reading every leaf get through
    let load = Load {
        audit_by_points: true,
        pause_inside: Some(Duration::from_micros(50)),
        ..Load::for_secs(secs() / 2.0)
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EngineConfig::new(dir.path(), 64 << 20);
    cfg.durability = shoal_engine::Durability::None;
    let e = shoal_engine::Engine::open(cfg).unwrap();
    let w = e.worker();
    let tree = BTree::create(&w, "bank").unwrap();
    bank::open_wide_accounts(&w, &tree);
    assert!(tree.verify(&w).unwrap().leaves >= 8);
    let movers = (0..4).map(|_| e.worker()).collect();
    let seen = bank::run(movers, vec![e.worker()], tree, load);
    let total = bank::total_now(&w, &tree);
    eprintln!("one node, point audits: {seen:?}, total after {total}");
    isolated(&seen, total);
    drop(w);
    e.close().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(3, dir.path());
    let w = c.node(0).worker();
    let tree = BTree::create(&w, "bank").unwrap();
    bank::open_wide_accounts(&w, &tree);
    let movers = (0..4).map(|i| c.node(i % 3).worker()).collect();
    let seen = bank::run(movers, vec![c.node(2).worker()], tree, load);
    let total = bank::total_now(&c.node(1).worker(), &tree);
    eprintln!("three nodes, point audits: {seen:?}, total after {total}");
    isolated(&seen, total);
    drop(w);
    c.close().unwrap();
}
