//! What a transaction promises on its error paths: a commit too large for the log is refused
//! before anything is written (and the store stays whole); a closure can abort with its own
//! error, which is returned only once what it read is confirmed; retries can be bounded.

use shoal_btree::{
    transact, transact_with, u64_key, Abort, BTree, Retry, TreeError, TxError, MAX_RECORD,
};
use shoal_engine::{Engine, EngineConfig, Worker};

fn balance(v: &[u8]) -> i64 {
    i64::from_le_bytes(v[..8].try_into().expect("a balance"))
}

fn value_of(w: &Worker, tree: &BTree, k: u64) -> Vec<u8> {
    let mut v = Vec::new();
    assert!(tree.lookup(w, u64_key(k), &mut v).unwrap(), "key {k}");
    v
}

#[test]
fn a_commit_too_large_for_one_log_chunk_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || {
        let mut c = EngineConfig::new(dir.path(), 256 << 20);
        c.wal_bytes = 16 << 20;
        c
    };
    let e = Engine::open(cfg()).unwrap();
    let w = e.worker();
    let most = w.most_pages_per_commit();
    assert!(most > 10 && most < 10_000, "{most} pages per commit");
    let tree = BTree::create(&w, "t").unwrap();
    // rows of the largest size a leaf keeps (at most four a leaf): more leaves than one
    // commit may write
    let len = MAX_RECORD - 8;
    let rows = 4 * (most as u64 + 60);
    for k in 0..rows {
        tree.upsert(&w, u64_key(k), vec![1u8; len]).unwrap();
    }
    let leaves = tree.verify(&w).unwrap().leaves as usize;
    assert!(leaves > most, "{leaves} leaves, at most {most} per commit");
    let r = transact(&w, |tx| {
        for k in 0..rows {
            tx.upsert(&tree, u64_key(k), vec![2u8; len])?;
        }
        Ok(())
    });
    match r {
        Err(TxError::TooLarge { leaves: l, most: m }) => {
            assert!(l > m, "{l} > {m}");
            assert_eq!(m, most);
        }
        other => panic!("a commit of {leaves} leaves: {other:?}"),
    }
    for k in 0..rows {
        assert_eq!(value_of(&w, &tree, k), vec![1u8; len], "row {k} unchanged");
    }
    // the store goes on: a commit in parts goes through, and it closes and opens whole
    for part in (0..rows).collect::<Vec<_>>().chunks(most) {
        transact(&w, |tx| {
            for &k in part {
                tx.upsert(&tree, u64_key(k), vec![3u8; len])?;
            }
            Ok(())
        })
        .unwrap();
    }
    drop(w);
    e.close().unwrap();
    let e = Engine::open(cfg()).unwrap();
    let w = e.worker();
    let tree = BTree::open(&w, "t").unwrap();
    for k in 0..rows {
        assert_eq!(
            value_of(&w, &tree, k),
            vec![3u8; len],
            "row {k} after reopening"
        );
    }
    tree.verify(&w).unwrap();
    drop(w);
    e.close().unwrap();
}

/// A tree with accounts 0 and 1 of 1,000 each, on one node.
fn accounts(dir: &std::path::Path) -> (Engine, BTree) {
    let e = Engine::open(EngineConfig::new(dir, 64 << 20)).unwrap();
    let w = e.worker();
    let tree = BTree::create(&w, "accounts").unwrap();
    for k in 0..2 {
        tree.upsert(&w, u64_key(k), 1000i64.to_le_bytes()).unwrap();
    }
    drop(w);
    (e, tree)
}

#[derive(Debug, PartialEq)]
struct Insufficient(i64);

#[test]
fn a_closure_that_aborts_writes_nothing_and_gets_its_own_error_back() {
    let dir = tempfile::tempdir().unwrap();
    let (e, tree) = accounts(dir.path());
    let w = e.worker();
    let mut runs = 0;
    let r = transact_with(&w, Retry::forever(), |tx| {
        runs += 1;
        // a write first, then the decision to give up
        tx.upsert(&tree, u64_key(1), 0i64.to_le_bytes())?;
        let b = balance(&tx.get(&tree, u64_key(0))?.expect("account 0"));
        if b < 5000 {
            return Err(Abort::User(Insufficient(b)));
        }
        Ok(())
    });
    match r {
        Err(Abort::User(i)) => assert_eq!(i, Insufficient(1000)),
        other => panic!("{other:?}"),
    }
    assert_eq!(runs, 1, "an abort whose reads hold is not run again");
    assert_eq!(
        balance(&value_of(&w, &tree, 1)),
        1000,
        "nothing was written"
    );
    drop(w);
    e.close().unwrap();
}

#[test]
fn a_closure_error_that_came_of_reads_that_never_held_together_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let (e, tree) = accounts(dir.path());
    let (w, inner) = (e.worker(), e.worker());
    let mv = |from: u64, to: u64| {
        transact(&inner, |tx| {
            tx.update(&tree, u64_key(from), |v| {
                let b = balance(v) - 10;
                v[..8].copy_from_slice(&b.to_le_bytes())
            })?;
            tx.update(&tree, u64_key(to), |v| {
                let b = balance(v) + 10;
                v[..8].copy_from_slice(&b.to_le_bytes())
            })?;
            Ok(())
        })
        .unwrap()
    };
    // transact_with: the closure's own error
    let mut runs = 0;
    let r = transact_with(&w, Retry::forever(), |tx| {
        runs += 1;
        let x = balance(&tx.get(&tree, u64_key(0))?.expect("x"));
        if runs == 1 {
            mv(0, 1); // after x was read: the sum read below never existed
        }
        let y = balance(&tx.get(&tree, u64_key(1))?.expect("y"));
        if x + y != 2000 {
            return Err(Abort::User(x + y));
        }
        Ok(x + y)
    });
    assert_eq!(r.unwrap(), 2000);
    assert_eq!(
        runs, 2,
        "the first try was a conflict, not the closure's error"
    );
    // transact: an error of the closure's making
    let mut runs = 0;
    let r = transact(&w, |tx| {
        runs += 1;
        let x = balance(&tx.get(&tree, u64_key(0))?.expect("x"));
        if runs == 1 {
            mv(1, 0);
        }
        let y = balance(&tx.get(&tree, u64_key(1))?.expect("y"));
        if x + y != 2000 {
            return Err(TreeError::Exists(format!("a sum of {}", x + y)).into());
        }
        Ok(x + y)
    });
    assert_eq!(r.unwrap(), 2000);
    assert_eq!(
        runs, 2,
        "the first try was a conflict, not the closure's error"
    );
    drop((w, inner));
    e.close().unwrap();
}

#[test]
fn tries_end_when_the_bound_says_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (e, tree) = accounts(dir.path());
    let w = e.worker();
    let mut runs = 0;
    let r: Result<(), Abort<()>> = transact_with(&w, Retry::tries(3), |tx| {
        runs += 1;
        tx.upsert(&tree, u64_key(0), 7i64.to_le_bytes())?;
        Err(Abort::Tx(TxError::Conflict))
    });
    assert!(
        matches!(r, Err(Abort::Tx(TxError::GaveUp { tries: 3 }))),
        "{r:?}"
    );
    assert_eq!(runs, 3);
    let r: Result<(), Abort<()>> =
        transact_with(&w, Retry::for_at_most(std::time::Duration::ZERO), |_| {
            Err(Abort::Tx(TxError::Conflict))
        });
    assert!(
        matches!(r, Err(Abort::Tx(TxError::GaveUp { tries: 1 }))),
        "{r:?}"
    );
    assert_eq!(
        balance(&value_of(&w, &tree, 0)),
        1000,
        "nothing was written"
    );
    drop(w);
    e.close().unwrap();
}

#[test]
fn a_closed_engines_worker_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (e, tree) = accounts(dir.path());
    e.close().unwrap();
    let w = e.worker();
    assert!(matches!(
        w.commit(),
        Err(shoal_engine::EngineError::Shutdown)
    ));
    let r = transact(&w, |tx| tx.upsert(&tree, u64_key(0), 5i64.to_le_bytes()));
    assert!(r.as_ref().is_err_and(|e| e.is_shutdown()), "{r:?}");
}

#[test]
fn many_new_keys_into_one_gap_commit_whole_in_a_batch_and_in_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let w = e.worker();
    // the README's way to seed a table: a batch of 100 rows of 17 bytes into an empty tree
    let seeded = BTree::create(&w, "seeded").unwrap();
    let mut batch = shoal_btree::Batch::new();
    for k in 0..100u64 {
        batch.put(u64_key(k), [k as u8; 17]);
    }
    seeded.apply(&w, &batch).unwrap();
    for k in 0..100u64 {
        assert_eq!(value_of(&w, &seeded, k), [k as u8; 17]);
    }
    seeded.verify(&w).unwrap();
    // one transaction inserting 200 rows of 100 bytes into an empty tree
    let t = BTree::create(&w, "t").unwrap();
    transact(&w, |tx| {
        for k in 0..200u64 {
            assert!(tx.insert(&t, u64_key(k), [1u8; 100])?.inserted());
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(t.count(&w).unwrap(), 200);
    // thousands of rows between two keys of a full tree (one gap of one leaf), with a read
    // of the gap's ends and writes elsewhere in the same commit
    let u = BTree::create(&w, "u").unwrap();
    for k in 0..2000u64 {
        u.upsert(&w, u64_key(k * 10_000), [2u8; 60]).unwrap();
    }
    let rows = 4000u64;
    transact(&w, |tx| {
        assert!(tx.get(&u, u64_key(10_000))?.is_some());
        for k in 0..rows {
            assert!(tx
                .insert(&u, u64_key(10_000 + 1 + k), [3u8; 100])?
                .inserted());
        }
        tx.upsert(&u, u64_key(0), [4u8; 60])?;
        tx.upsert(&u, u64_key(19_990_000), [4u8; 60])?;
        Ok(())
    })
    .unwrap();
    assert_eq!(u.count(&w).unwrap(), 2000 + rows);
    for k in 0..rows {
        assert_eq!(value_of(&w, &u, 10_000 + 1 + k), [3u8; 100]);
    }
    assert_eq!(value_of(&w, &u, 19_990_000), [4u8; 60]);
    let report = u.verify(&w).unwrap();
    assert!(report.leaves > 100, "{report:?}");
    drop(w);
    e.close().unwrap();
}

#[test]
fn a_tree_handle_of_another_engine_is_refused_by_every_operation() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (e1, t1) = accounts(d1.path());
    let (e2, t2) = accounts(d2.path());
    let (w1, w2) = (e1.worker(), e2.worker());
    t2.upsert(&w2, u64_key(0), b"from the OTHER store").unwrap();
    let other = |r: Result<(), TreeError>| {
        assert!(matches!(r, Err(TreeError::OtherEngine { .. })), "{r:?}")
    };
    let mut v = Vec::new();
    other(t1.lookup(&w2, u64_key(0), &mut v).map(drop));
    other(t1.get(&w2, u64_key(0)).map(drop));
    other(t1.upsert(&w2, u64_key(0), b"x").map(drop));
    other(t1.insert(&w2, u64_key(9), b"x").map(drop));
    other(t1.update(&w2, u64_key(0), |_| {}).map(drop));
    other(t1.remove(&w2, u64_key(0)).map(drop));
    other(t1.count(&w2).map(drop));
    other(t1.scan(&w2, b"", shoal_btree::Direction::Ascending, |_, _| true));
    other(t1.iter(&w2).next().expect("an item").map(drop));
    other(t1.apply(&w2, shoal_btree::Batch::new().put(u64_key(0), b"x")));
    assert!(t1.verify(&w2).is_err());
    let in_tx = |f: &dyn Fn(&mut shoal_btree::Transaction<'_>) -> Result<(), TxError>| {
        let r = transact(&w2, |tx| f(tx));
        assert!(
            matches!(r, Err(TxError::Tree(TreeError::OtherEngine { .. }))),
            "{r:?}"
        );
    };
    in_tx(&|tx| tx.get(&t1, u64_key(0)).map(drop));
    in_tx(&|tx| tx.upsert(&t1, u64_key(0), b"x"));
    in_tx(&|tx| tx.add_i64(&t1, u64_key(0), 0, 1));
    in_tx(&|tx| tx.update_part(&t1, u64_key(0), 0..8, |_| {}).map(drop));
    in_tx(&|tx| tx.remove(&t1, u64_key(0)).map(drop));
    in_tx(&|tx| {
        tx.range::<&[u8]>(&t1, .., shoal_btree::Direction::Ascending, 10)
            .map(drop)
    });
    // the other store's data is untouched, and each handle works with its own engine
    assert_eq!(value_of(&w2, &t2, 0), b"from the OTHER store");
    assert_eq!(balance(&value_of(&w1, &t1, 0)), 1000);
    // a handle of a store opened again is refused too (open the tree again)
    drop(w1);
    e1.close().unwrap();
    let e1 = Engine::open(EngineConfig::new(d1.path(), 64 << 20)).unwrap();
    let w1 = e1.worker();
    other(t1.get(&w1, u64_key(0)).map(drop));
    let t1 = BTree::open(&w1, "accounts").unwrap();
    assert_eq!(balance(&value_of(&w1, &t1, 0)), 1000);
    drop((w1, w2));
    e1.close().unwrap();
    e2.close().unwrap();
}

#[test]
fn a_commit_into_a_leaf_of_one_large_record_splits_it_and_commits() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    // one record of about 1 KB: the leaf has about 3 KB free, and three more need a little more
    t.upsert(&w, b"m", [1u8; 1000]).unwrap();
    transact(&w, |tx| {
        for k in [b"a", b"b", b"c"] {
            assert!(tx.insert(&t, k, [2u8; 1000])?.inserted());
        }
        Ok(())
    })
    .unwrap();
    // and the same after the key of the one record
    let u = BTree::create(&w, "u").unwrap();
    u.upsert(&w, b"a", [1u8; 1000]).unwrap();
    transact(&w, |tx| {
        for k in [b"x", b"y", b"z"] {
            assert!(tx.insert(&u, k, [2u8; 1000])?.inserted());
        }
        Ok(())
    })
    .unwrap();
    assert_eq!((t.count(&w).unwrap(), u.count(&w).unwrap()), (4, 4));
    t.verify(&w).unwrap();
    u.verify(&w).unwrap();
    drop(w);
    e.close().unwrap();
}
