//! Large values (overflow pages) in a transaction cut off by kill -9 (issue 28): the child
//! commits a value of 300 KB, then, in a transaction it never commits, replaces it with
//! another, removes a second one and inserts a third, makes all of that durable in the log
//! (`Engine::flush`) and waits to be killed. Recovery rolls the transaction back: the first
//! two values are back as committed (their old chains were kept until a commit that never
//! came), the third is gone, and no page is left over.

mod common;

use shoal_btree::BTree;
use shoal_engine::{Durability, Engine, EngineConfig};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const DIR: &str = "SHOAL_CRASH_OVERFLOW_DIR";

fn config(dir: &Path) -> EngineConfig {
    let mut c = EngineConfig::new(dir, 8 << 20);
    c.durability = Durability::Commit;
    c.wal_bytes = 64 << 20;
    c.roll_back = Some(shoal_btree::roll_back());
    c
}

fn value(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect()
}

#[test]
fn child_cut_off_in_a_transaction() {
    let Ok(dir) = std::env::var(DIR) else {
        return; // only as a child
    };
    let e = Engine::open(config(Path::new(&dir))).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    t.upsert(&w, b"kept", value(3, 300_000)).unwrap();
    t.upsert(&w, b"removed", value(5, 50_000)).unwrap();
    w.commit().unwrap();
    w.begin_transaction().unwrap();
    t.upsert(&w, b"kept", value(7, 200_000)).unwrap();
    assert!(t.remove(&w, b"removed").unwrap());
    t.upsert(&w, b"new", value(9, 100_000)).unwrap();
    e.flush().unwrap(); // the changes and their undo are in the log; no END record
    println!("ready");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_cut_off_transaction_on_large_values_is_rolled_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = common::respawn(
        "child_cut_off_in_a_transaction",
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
    assert_eq!(e.rolled_back(), 1, "one transaction cut off");
    let w = e.worker();
    let t = BTree::open(&w, "t").unwrap();
    assert_eq!(t.get(&w, b"kept").unwrap().unwrap(), value(3, 300_000));
    assert_eq!(t.get(&w, b"removed").unwrap().unwrap(), value(5, 50_000));
    assert_eq!(t.get(&w, b"new").unwrap(), None);
    let report = t.verify(&w).unwrap();
    assert_eq!(report.overflow_values, 2);
    assert_eq!(
        e.store().slots_in_use(),
        1 + report.pages.len() as u64,
        "the rolled-back transaction's chains were freed, the committed ones kept"
    );
    drop(w);
    e.close().unwrap();
}
