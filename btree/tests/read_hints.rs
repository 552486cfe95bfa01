//! A transaction's point read starts from the leaf of its last read of the same tree when that
//! leaf is unchanged and holds the key (a hint). These tests read through leaves that other
//! workers split, grow and merge meanwhile: every read must still find what a descent from
//! the root finds. (Debug builds also check each hinted read against a descent.)

use shoal_btree::{BTree, Transaction};
use shoal_engine::{Engine, EngineConfig};
use std::sync::atomic::{AtomicBool, Ordering};

fn key(i: u32) -> [u8; 8] {
    let mut k = *b"k\0\0\0\0\0\0\0";
    k[4..].copy_from_slice(&i.to_be_bytes());
    k
}

fn value(i: u32) -> Vec<u8> {
    i.to_le_bytes().repeat(8)
}

#[test]
fn a_read_after_its_leaf_split_finds_the_key_in_the_new_leaf() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let (w, other) = (e.worker(), e.worker());
    let tree = BTree::create(&w, "t").unwrap();
    for i in [10, 20] {
        assert!(tree.insert(&w, key(i), value(i)).unwrap().inserted());
    }
    let mut tx = Transaction::begin(&w);
    assert_eq!(tx.get(&tree, key(10)).unwrap(), Some(value(10)));
    // another worker fills the leaf between the two keys until it splits many times over
    for j in 0..2000u32 {
        let mut k = key(15).to_vec();
        k.extend_from_slice(&j.to_be_bytes());
        assert!(tree.insert(&other, k, [7u8; 100]).unwrap().inserted());
    }
    assert_eq!(tx.get(&tree, key(20)).unwrap(), Some(value(20)));
    assert_eq!(tx.get(&tree, key(19)).unwrap(), None);
    let mut k = key(15).to_vec();
    k.extend_from_slice(&1999u32.to_be_bytes());
    assert_eq!(tx.get(&tree, &k).unwrap(), Some(vec![7u8; 100]));
    // it read no key the other worker changed: nothing to conflict with
    tx.commit().unwrap();
    drop((w, other));
    e.close().unwrap();
}

#[test]
fn reads_in_key_order_find_every_key_while_another_worker_splits_and_merges_their_leaves() {
    const KEYS: u32 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let w = e.worker();
    let tree = BTree::create(&w, "t").unwrap();
    for i in 0..KEYS {
        assert!(tree
            .insert(&w, key(2 * i), value(2 * i))
            .unwrap()
            .inserted());
    }
    let stop = AtomicBool::new(false);
    let passes = std::thread::scope(|s| {
        // the churner: fills the gaps between the kept keys with large values and takes them
        // out again (splits, then merges)
        s.spawn(|| {
            let w = e.worker();
            let mut round = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let lo = (round * 97) % KEYS;
                for i in lo..(lo + 200).min(KEYS) {
                    assert!(tree
                        .insert(&w, key(2 * i + 1), [round as u8; 600])
                        .unwrap()
                        .inserted());
                }
                for i in lo..(lo + 200).min(KEYS) {
                    assert!(tree.remove(&w, key(2 * i + 1)).unwrap());
                }
                round += 1;
            }
        });
        let w = e.worker();
        let mut passes = 0;
        for _ in 0..20 {
            let mut tx = Transaction::begin(&w);
            for i in 0..KEYS {
                let got = tx.get(&tree, key(2 * i)).unwrap();
                assert_eq!(got, Some(value(2 * i)), "kept key {}", 2 * i);
            }
            drop(tx);
            passes += 1;
        }
        stop.store(true, Ordering::Relaxed);
        passes
    });
    assert_eq!(passes, 20);
    drop(w);
    e.close().unwrap();
}
