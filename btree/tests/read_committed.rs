//! Read-committed transactions (`Transaction::read_committed`): they see only committed
//! values, see a commit that lands between two of their reads, never conflict, and refuse
//! every write. Each case interleaves two workers' transactions step by step in one thread.

use shoal_btree::{BTree, Direction, Transaction, TxError};
use shoal_engine::{Engine, EngineConfig, Worker};

fn engine(dir: &std::path::Path) -> Engine {
    let mut c = EngineConfig::new(dir, 16 << 20);
    c.durability = shoal_engine::Durability::None;
    Engine::open(c).unwrap()
}

/// A tree with rows `0..n`, row `r` holding `[r; 8]`.
fn rows(w: &Worker, n: u8) -> BTree {
    let t = BTree::create(w, "rows").unwrap();
    for r in 0..n {
        t.upsert(w, [r], [r; 8]).unwrap();
    }
    t
}

/// Reads of rows 1 and 2 and of the whole tree, as `tx` sees them.
fn read_all(tx: &mut Transaction<'_>, t: &BTree) -> (Vec<u8>, Vec<u8>, Vec<Vec<u8>>) {
    let one = tx.get(t, [1]).unwrap().unwrap();
    let mut two = Vec::new();
    tx.get_many(t, &[[2u8]], |_, v| two = v.unwrap().to_vec())
        .unwrap();
    let all = tx
        .range::<Vec<u8>>(t, .., Direction::Ascending, 100)
        .unwrap()
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    (one, two, all)
}

#[test]
fn a_read_committed_transaction_sees_only_commits_and_never_conflicts() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let (w1, w2, w3) = (e.worker(), e.worker(), e.worker());
    let t = rows(&w1, 4);
    let mut rc = Transaction::read_committed(&w1);
    let mut ser = Transaction::begin(&w3);
    assert!(rc.is_read_committed() && !ser.is_read_committed());
    // a writer's changes, not yet committed: invisible
    let mut writer = Transaction::begin(&w2);
    writer.upsert(&t, [1], [0xAA; 8]).unwrap();
    writer.upsert(&t, [2], [0xBB; 8]).unwrap();
    let before = read_all(&mut rc, &t);
    assert_eq!(before, read_all(&mut ser, &t));
    assert_eq!(before.0, [1; 8]);
    assert_eq!(before.1, [2; 8]);
    writer.commit().unwrap();
    // committed since: the read-committed transaction's next reads see it
    let (one, two, all) = read_all(&mut rc, &t);
    assert_eq!((one, two), (vec![0xAA; 8], vec![0xBB; 8]));
    assert_eq!(all[1..3], [vec![0xAA; 8], vec![0xBB; 8]]);
    // its commit validates nothing; the serializable one, reading on after the commit, read
    // two moments: a conflict
    rc.commit().unwrap();
    assert_eq!(ser.get(&t, [3]).unwrap().unwrap(), [3; 8]);
    assert!(matches!(ser.commit(), Err(TxError::Conflict)));
    drop((w1, w2, w3));
    e.close().unwrap();
}

#[test]
fn a_read_committed_transaction_refuses_every_write_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let w = e.worker();
    let t = rows(&w, 4);
    let mut rc = Transaction::read_committed(&w);
    let refused = |r: Result<(), TxError>| matches!(r, Err(TxError::WriteInReadCommitted));
    assert!(refused(rc.upsert(&t, [1], [9; 8])));
    assert!(refused(rc.insert(&t, [7], [9; 8]).map(drop)));
    assert!(refused(rc.update(&t, [1], |v| v.fill(9)).map(drop)));
    assert!(refused(
        rc.update_part(&t, [1], 0..2, |v| v.fill(9)).map(drop)
    ));
    assert!(refused(rc.remove(&t, [1]).map(drop)));
    assert!(rc.is_read_only());
    rc.commit().unwrap();
    for r in 0..4u8 {
        assert_eq!(
            t.get(&w, [r]).unwrap().unwrap(),
            [r; 8],
            "row {r} untouched"
        );
    }
    assert_eq!(t.get(&w, [7]).unwrap(), None);
    drop(w);
    e.close().unwrap();
}

#[test]
fn a_part_of_many_values_is_the_same_in_both_isolation_levels() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let w = e.worker();
    let t = BTree::create(&w, "rows").unwrap();
    // values of 0, 3 and 9 bytes, one in overflow pages, and a key that is absent
    t.upsert(&w, [1], []).unwrap();
    t.upsert(&w, [2], [7, 8, 9]).unwrap();
    t.upsert(&w, [3], [1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
    let big: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
    t.upsert(&w, [4], &big).unwrap();
    let keys = [[1u8], [2], [3], [4], [5]];
    let want = vec![
        Some(vec![]),
        Some(vec![8, 9]),
        Some(vec![2, 3, 4]),
        Some(big[1..4].to_vec()),
        None,
    ];
    let mut own = Transaction::begin(&w);
    // a serializable transaction's own write is what it sees
    own.upsert(&t, [2], [0, 1, 2, 3]).unwrap();
    for mut tx in [Transaction::read_committed(&w), Transaction::begin(&w), own] {
        let mut got = Vec::new();
        tx.get_many_part(&t, &keys, 1..4, |i, v| got.push((i, v.map(<[u8]>::to_vec))))
            .unwrap();
        let mut want = want.clone();
        if !tx.is_read_only() {
            want[1] = Some(vec![1, 2, 3]);
        }
        assert_eq!(got, want.into_iter().enumerate().collect::<Vec<_>>());
    }
}
