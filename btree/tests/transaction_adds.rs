//! Adds to counters inside values (`Transaction::add_i64`, `add_u32`): applied at the commit
//! without a read, so transactions adding to one counter at once never conflict and no add is
//! lost; a transaction sees its own adds; a reader of the counter still conflicts with an add
//! committed after its read; an add to a key that is not there fails its commit, which writes
//! nothing.

use shoal_btree::{BTree, Direction, Transaction, TreeError, TxError};
use shoal_engine::{Engine, EngineConfig, Worker};

fn engine(dir: &std::path::Path) -> Engine {
    let mut c = EngineConfig::new(dir, 16 << 20);
    c.durability = shoal_engine::Durability::None;
    Engine::open(c).unwrap()
}

/// A counter row: an `i64` at 0, a `u32` at 8, 4 more bytes.
fn counter(w: &Worker) -> BTree {
    let t = BTree::create(w, "counters").unwrap();
    let mut row = [0u8; 16];
    row[8..12].copy_from_slice(&(u32::MAX - 1).to_le_bytes());
    t.upsert(w, b"c", row).unwrap();
    t
}

fn read(w: &Worker, t: &BTree) -> (i64, u32) {
    let v = t.get(w, b"c").unwrap().unwrap();
    (
        i64::from_le_bytes(v[..8].try_into().unwrap()),
        u32::from_le_bytes(v[8..12].try_into().unwrap()),
    )
}

#[test]
fn adds_from_many_threads_to_one_counter_all_commit_without_a_conflict() {
    const THREADS: i64 = 4;
    const EACH: i64 = 2000;
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let w = e.worker();
    let t = counter(&w);
    let conflicts: usize = std::thread::scope(|s| {
        let hands: Vec<_> = (0..THREADS)
            .map(|k| {
                let (e, t) = (&e, &t);
                s.spawn(move || {
                    let w = e.worker();
                    let mut conflicts = 0;
                    for n in 0..EACH {
                        let mut tx = Transaction::begin(&w);
                        tx.add_i64(t, b"c", 0, k * EACH + n).unwrap();
                        tx.add_u32(t, b"c", 8, 1).unwrap();
                        match tx.commit() {
                            Ok(()) => {}
                            Err(TxError::Conflict) => conflicts += 1,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    conflicts
                })
            })
            .collect();
        hands.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(conflicts, 0, "adds read nothing: nothing to conflict with");
    let n = THREADS * EACH;
    // every add is there: the sum of 0..n, and the u32 wrapped around past its maximum
    assert_eq!(
        read(&w, &t),
        (n * (n - 1) / 2, (u32::MAX - 1).wrapping_add(n as u32))
    );
    drop(w);
    e.close().unwrap();
}

#[test]
fn a_transaction_sees_its_own_adds_in_every_read_and_a_later_write_builds_on_them() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let w = e.worker();
    let t = counter(&w);
    let mut tx = Transaction::begin(&w);
    tx.add_i64(&t, b"c", 0, 5).unwrap();
    tx.add_i64(&t, b"c", 0, 2).unwrap();
    tx.add_u32(&t, b"c", 8, 3).unwrap();
    let v = tx.get(&t, b"c").unwrap().unwrap();
    assert_eq!(i64::from_le_bytes(v[..8].try_into().unwrap()), 7);
    assert_eq!(
        tx.get_part(&t, b"c", 8..12).unwrap().unwrap(),
        1u32.to_le_bytes()
    );
    let all = tx
        .range(&t, ..b"z".to_vec(), Direction::Ascending, 10)
        .unwrap();
    assert_eq!(all, vec![(b"c".to_vec(), v.clone())]);
    // a write after the adds starts from the value with them
    assert!(tx
        .update_part(&t, b"c", 0..8, |b| {
            let n = i64::from_le_bytes(b.try_into().unwrap());
            b.copy_from_slice(&(n * 10).to_le_bytes());
        })
        .unwrap());
    tx.add_i64(&t, b"c", 0, 1).unwrap();
    tx.commit().unwrap();
    assert_eq!(read(&w, &t), (71, 1));
    drop(w);
    e.close().unwrap();
}

#[test]
fn a_reader_of_a_counter_conflicts_with_an_add_committed_after_its_read() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let (w1, w2) = (e.worker(), e.worker());
    let t = counter(&w1);
    let mut reader = Transaction::begin(&w1);
    let seen = reader.get(&t, b"c").unwrap().unwrap();
    let mut adder = Transaction::begin(&w2);
    adder.add_i64(&t, b"c", 0, 1).unwrap();
    adder.commit().unwrap();
    reader.upsert(&t, b"copy", seen).unwrap();
    assert!(matches!(reader.commit(), Err(TxError::Conflict)));
    assert_eq!(t.get(&w1, b"copy").unwrap(), None);
    assert_eq!(read(&w1, &t).0, 1);
    drop((w1, w2));
    e.close().unwrap();
}

#[test]
fn an_add_to_a_key_that_is_not_there_fails_its_commit_which_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let w = e.worker();
    let t = counter(&w);
    let outside =
        |r: Result<(), TxError>| matches!(r, Err(TxError::Tree(TreeError::AddOutside { .. })));
    // absent at the commit
    let mut tx = Transaction::begin(&w);
    tx.upsert(&t, b"other", b"x").unwrap();
    tx.add_i64(&t, b"missing", 0, 1).unwrap();
    assert!(outside(tx.commit()));
    // past the value's end (16 bytes)
    let mut tx = Transaction::begin(&w);
    tx.upsert(&t, b"other", b"x").unwrap();
    tx.add_i64(&t, b"c", 12, 1).unwrap();
    assert!(outside(tx.commit()));
    assert_eq!(t.get(&w, b"other").unwrap(), None, "nothing was written");
    assert_eq!(read(&w, &t), (0, u32::MAX - 1));
    // removed by the transaction itself: refused at once
    let mut tx = Transaction::begin(&w);
    assert!(tx.remove(&t, b"c").unwrap());
    assert!(outside(tx.add_i64(&t, b"c", 0, 1)));
    // read-committed transactions write nothing
    let mut rc = Transaction::read_committed(&w);
    assert!(matches!(
        rc.add_i64(&t, b"c", 0, 1),
        Err(TxError::WriteInReadCommitted)
    ));
    drop((tx, rc));
    drop(w);
    e.close().unwrap();
}
