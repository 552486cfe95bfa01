//! A transaction still open at kill -9 leaves nothing behind, and costs no other transaction
//! its committed change (issue 43; large values in overflow pages, issue 28). The child
//! commits two large values, then opens a transaction that replaces the first, removes the
//! second and inserts a third, and does not commit it; meanwhile another worker commits a new
//! value of the first key. Everything is made durable in the log (`Engine::flush`) and the
//! child waits to be killed. After recovery the other worker's value is there, the second
//! value too, the third is absent, and no page is left over.
//!
//! Before issue 43 a transaction changed pages in place and logged undo records, and recovery
//! rolled back the cut-off one: it put back the value it had overwritten, over the other
//! worker's committed change (the same scenario with `Worker::begin_transaction` on a6932b4:
//! the first key came back with its old value, the acknowledged one lost).

mod common;

use shoal_btree::{transact, BTree, Transaction};
use shoal_engine::{Durability, Engine, EngineConfig};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const DIR: &str = "SHOAL_CRASH_OVERFLOW_DIR";

fn config(dir: &Path) -> EngineConfig {
    let mut c = EngineConfig::new(dir, 8 << 20);
    c.durability = Durability::Commit;
    c.wal_bytes = 64 << 20;
    c
}

fn value(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect()
}

#[test]
fn child_with_a_transaction_open() {
    let Ok(dir) = std::env::var(DIR) else {
        return; // only as a child
    };
    let e = Engine::open(config(Path::new(&dir))).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    t.upsert(&w, b"kept", value(3, 300_000)).unwrap();
    t.upsert(&w, b"removed", value(5, 50_000)).unwrap();
    w.commit().unwrap();
    // a transaction that never commits
    let mut open = Transaction::begin(&w);
    open.upsert(&t, b"kept", value(7, 200_000)).unwrap();
    assert!(open.remove(&t, b"removed").unwrap());
    open.upsert(&t, b"new", value(9, 100_000)).unwrap();
    // another worker's committed change of the same key (acknowledged: durable)
    let other = e.worker();
    transact(&other, |tx| tx.upsert(&t, b"kept", value(11, 250_000))).unwrap();
    e.flush().unwrap(); // everything so far is in the log
    println!("ready");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(600));
    drop(open);
}

#[test]
fn a_transaction_open_at_a_crash_leaves_nothing_and_costs_no_other_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = common::respawn(
        "child_with_a_transaction_open",
        &[(DIR, dir.path().display().to_string())],
    );
    // wait for "ready", then SIGKILL
    let out = child.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(out));
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.ends_with("ready"))),
        "the child never got ready"
    );
    child.kill().unwrap();
    let _ = child.wait();
    let e = Engine::open(config(dir.path())).unwrap();
    let w = e.worker();
    let t = BTree::open(&w, "t").unwrap();
    assert_eq!(
        t.get(&w, b"kept").unwrap().unwrap(),
        value(11, 250_000),
        "the other worker's committed value"
    );
    assert_eq!(t.get(&w, b"removed").unwrap().unwrap(), value(5, 50_000));
    assert_eq!(t.get(&w, b"new").unwrap(), None);
    let report = t.verify(&w).unwrap();
    assert_eq!(report.overflow_values, 2);
    assert_eq!(
        e.store().slots_in_use(),
        1 + report.pages.len() as u64,
        "the open transaction wrote no page; the replaced chain was freed"
    );
    drop(w);
    e.close().unwrap();
}
