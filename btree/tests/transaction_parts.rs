//! Reads and writes of parts of a value (`Transaction::get_part`, `update_part`): two
//! transactions that change different bytes of one value both commit and both changes stay;
//! the same bytes conflict; a part read conflicts only with a change to its bytes; a
//! transaction sees its own patches in every read; a part beyond the value is an error. Each
//! case interleaves two transactions of two workers step by step in one thread.

use shoal_btree::{BTree, Direction, Transaction, TreeError, TxError};
use shoal_engine::{Engine, EngineConfig, Worker};

fn engine(dir: &std::path::Path) -> Engine {
    let mut c = EngineConfig::new(dir, 16 << 20);
    c.durability = shoal_engine::Durability::None;
    Engine::open(c).unwrap()
}

/// A tree with rows `0..n` of 32 bytes: byte `i` of row `r` holds `r + i`.
fn rows(w: &Worker, n: u8) -> BTree {
    let t = BTree::create(w, "rows").unwrap();
    for r in 0..n {
        let v: Vec<u8> = (0..32).map(|i| r + i).collect();
        t.upsert(w, [r], v).unwrap();
    }
    t
}

fn value(w: &Worker, t: &BTree, r: u8) -> Vec<u8> {
    t.get(w, [r]).unwrap().unwrap()
}

#[test]
fn changes_to_different_bytes_of_one_value_both_commit_and_both_stay() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let (w1, w2) = (e.worker(), e.worker());
    let t = rows(&w1, 4);
    let mut a = Transaction::begin(&w1);
    let mut b = Transaction::begin(&w2);
    assert!(a.update_part(&t, [1], 0..4, |x| x.fill(0xAA)).unwrap());
    assert!(b.update_part(&t, [1], 8..16, |x| x.fill(0xBB)).unwrap());
    a.commit().unwrap();
    b.commit().unwrap(); // the bytes it read (8..16) are as it read them
    let v = value(&w1, &t, 1);
    assert_eq!(&v[0..4], &[0xAA; 4]);
    assert_eq!(&v[8..16], &[0xBB; 8]);
    assert_eq!(&v[4..8], &[5, 6, 7, 8], "the bytes between are untouched");
    assert_eq!(&v[16..], &(17..33).collect::<Vec<u8>>()[..]);
    drop((w1, w2));
    e.close().unwrap();
}

#[test]
fn changes_to_the_same_bytes_conflict_and_the_loser_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let (w1, w2) = (e.worker(), e.worker());
    let t = rows(&w1, 4);
    let mut a = Transaction::begin(&w1);
    let mut b = Transaction::begin(&w2);
    assert!(a.update_part(&t, [2], 4..8, |x| x.fill(1)).unwrap());
    assert!(b.update_part(&t, [2], 6..10, |x| x.fill(2)).unwrap());
    a.commit().unwrap();
    assert!(matches!(b.commit(), Err(TxError::Conflict)));
    let v = value(&w1, &t, 2);
    assert_eq!(&v[4..8], &[1; 4]);
    assert_eq!(&v[8..10], &[10, 11], "nothing of the loser");
    drop((w1, w2));
    e.close().unwrap();
}

#[test]
fn a_part_read_conflicts_only_with_a_change_to_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let (w1, w2) = (e.worker(), e.worker());
    let t = rows(&w1, 4);
    // a change elsewhere in the value (even one that writes the value whole): no conflict
    let mut reader = Transaction::begin(&w1);
    assert_eq!(reader.get_part(&t, [3], 0..2).unwrap(), Some(vec![3, 4]));
    reader.upsert(&t, [0], [9u8; 32]).unwrap(); // a write, so the commit validates
    let mut other = Transaction::begin(&w2);
    other.update(&t, [3], |v| v[20] = 0).unwrap();
    other.commit().unwrap();
    reader.commit().unwrap();
    // a change to the bytes read: a conflict
    let mut reader = Transaction::begin(&w1);
    assert_eq!(reader.get_part(&t, [3], 0..2).unwrap(), Some(vec![3, 4]));
    reader.upsert(&t, [0], [8u8; 32]).unwrap();
    let mut other = Transaction::begin(&w2);
    other.update_part(&t, [3], 1..2, |x| x[0] = 0).unwrap();
    other.commit().unwrap();
    assert!(matches!(reader.commit(), Err(TxError::Conflict)));
    assert_eq!(value(&w1, &t, 0), vec![9u8; 32], "the loser wrote nothing");
    drop((w1, w2));
    e.close().unwrap();
}

#[test]
fn a_transaction_sees_its_own_patches_in_every_read() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let w = e.worker();
    let t = rows(&w, 4);
    let mut tx = Transaction::begin(&w);
    assert!(tx.update_part(&t, [1], 2..4, |x| x.fill(0xEE)).unwrap());
    assert!(tx.update_part(&t, [1], 3..5, |x| x[1] = 0xDD).unwrap());
    let want: Vec<u8> = {
        let mut v: Vec<u8> = (1..33).collect();
        v[2] = 0xEE;
        v[3] = 0xEE;
        v[4] = 0xDD;
        v
    };
    assert_eq!(tx.get(&t, [1]).unwrap(), Some(want.clone()));
    assert_eq!(
        tx.get_part(&t, [1], 1..6).unwrap(),
        Some(want[1..6].to_vec())
    );
    let all = tx.range::<&[u8]>(&t, .., Direction::Ascending, 10).unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(all[1].1, want);
    // a whole-value update after the patches starts from the patched value
    assert!(tx.update(&t, [1], |v| v[0] = 0).unwrap());
    tx.commit().unwrap();
    let mut stored = want;
    stored[0] = 0;
    assert_eq!(value(&w, &t, 1), stored);
    drop(w);
    e.close().unwrap();
}

#[test]
fn a_part_beyond_the_value_is_an_error_and_an_absent_key_is_none() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let w = e.worker();
    let t = rows(&w, 2);
    let mut tx = Transaction::begin(&w);
    let err = tx.update_part(&t, [1], 30..40, |_| {}).unwrap_err();
    assert!(
        matches!(
            err,
            TxError::Tree(TreeError::PartOutside { start: 30, end: 40 })
        ),
        "{err:?}"
    );
    // a read of it gives what the value holds of it
    assert_eq!(tx.get_part(&t, [1], 30..40).unwrap(), Some(vec![31, 32]));
    assert_eq!(tx.get_part(&t, [7], 0..4).unwrap(), None);
    assert!(!tx.update_part(&t, [7], 0..4, |_| {}).unwrap());
    tx.abort();
    drop(w);
    e.close().unwrap();
}
