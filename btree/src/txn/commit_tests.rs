//! Tests of the commit that need its inside: a hook that runs other transactions between the
//! reads a validation checks, and a switch for its second pass (the negative control).

use super::*;
use crate::{transact, u64_key, Transaction};
use std::cell::{Cell, RefCell};

thread_local! {
    /// Run by `validate` on this thread after it checked each read (its first pass).
    static BETWEEN_READS: RefCell<Option<Box<dyn FnMut()>>> = const { RefCell::new(None) };
    static SECOND_PASS: Cell<bool> = const { Cell::new(true) };
}

pub(super) fn between_reads() {
    // (taken out while it runs: the hook commits transactions of its own, which validate too)
    let hook = BETWEEN_READS.with(|h| h.borrow_mut().take());
    if let Some(mut f) = hook {
        f();
        BETWEEN_READS.with(|h| {
            let mut h = h.borrow_mut();
            if h.is_none() {
                *h = Some(f);
            }
        });
    }
}

pub(super) fn second_pass_on() -> bool {
    SECOND_PASS.with(|s| s.get())
}

/// Run `f` after every read a validation on this thread checks, until the returned value is
/// dropped.
fn between_reads_run(f: impl FnMut() + 'static) -> impl Drop {
    struct Off;
    impl Drop for Off {
        fn drop(&mut self) {
            BETWEEN_READS.with(|h| *h.borrow_mut() = None);
        }
    }
    BETWEEN_READS.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    Off
}

#[test]
fn a_reused_buffer_keeps_its_room() {
    let mut v: Vec<(&'static [u8], usize)> = Vec::with_capacity(100);
    v.push((b"x", 1));
    let ptr = v.as_ptr() as usize;
    let u: Vec<(&[u8], usize)> = reuse(v);
    assert!(u.is_empty() && u.capacity() >= 100);
    assert_eq!(u.as_ptr() as usize, ptr, "the same allocation");
}

/// Account `x` is key 0, account `y` key `Y`; the keys between them (with 100-byte values)
/// put them in different leaves.
const Y: u64 = 401;

fn balance(v: &[u8]) -> i64 {
    i64::from_le_bytes(v[..8].try_into().expect("a balance"))
}

/// A one-node engine with a tree "accounts": x = y = 1000, in different leaves.
fn two_accounts(dir: &std::path::Path) -> (shoal_engine::Engine, BTree) {
    let e = shoal_engine::Engine::open(shoal_engine::EngineConfig::new(dir, 64 << 20))
        .expect("engine opened");
    let w = e.worker();
    let tree = BTree::create(&w, "accounts").expect("tree created");
    for k in 0..=Y {
        let mut v = vec![0u8; 100];
        v[..8].copy_from_slice(&1000i64.to_le_bytes());
        tree.upsert(&w, u64_key(k), &v).expect("row written");
    }
    let leaf = |k: u64| {
        w.run(|w| tree.find_leaf(w, &u64_key(k)).map(|g| g.pid()))
            .unwrap()
    };
    assert_ne!(leaf(0), leaf(Y), "x and y are in different leaves");
    drop(w);
    (e, tree)
}

/// Move `amt` from `from` to `to` in one transaction of `w`.
fn mv(w: &Worker, tree: &BTree, from: u64, to: u64, amt: i64) {
    transact(w, |tx| {
        tx.update(tree, u64_key(from), |v| {
            let b = balance(v) - amt;
            v[..8].copy_from_slice(&b.to_le_bytes());
        })?;
        tx.update(tree, u64_key(to), |v| {
            let b = balance(v) + amt;
            v[..8].copy_from_slice(&b.to_le_bytes());
        })?;
        Ok(())
    })
    .expect("a move committed");
}

/// How an audit reads the two accounts.
#[derive(Clone, Copy, Debug)]
enum Reads {
    Points,
    Ranges,
    /// Points, and the sum it saw written into another tree (a commit that holds a leaf).
    PointsThenWrite,
}

/// The interleaving of the issue: T reads x (1000); a move makes x 990 and y 1010; T reads y
/// (1010); a move back (1000 / 1000); T commits; while it validates, once it has checked x
/// (changed, but 1000 again), another move (990 / 1010), so that y checks out too (changed,
/// 1010 again). Returns the sum T saw if it committed, `None` if it conflicted.
fn audit_across_moves(reads: Reads) -> Option<i64> {
    let dir = tempfile::tempdir().unwrap();
    let (e, tree) = two_accounts(dir.path());
    let (w, mover) = (e.worker(), e.worker());
    let sums = BTree::create(&w, "sums").unwrap();
    let read = |tx: &mut Transaction<'_>, k: u64| -> i64 {
        match reads {
            Reads::Points | Reads::PointsThenWrite => {
                balance(&tx.get(&tree, u64_key(k)).unwrap().unwrap())
            }
            Reads::Ranges => {
                let got = tx
                    .range(
                        &tree,
                        u64_key(k)..=u64_key(k),
                        crate::Direction::Ascending,
                        10,
                    )
                    .unwrap();
                assert_eq!(got.len(), 1);
                balance(&got[0].1)
            }
        }
    };
    let mut tx = Transaction::begin(&w);
    let x = read(&mut tx, 0);
    mv(&mover, &tree, 0, Y, 10);
    let y = read(&mut tx, Y);
    mv(&mover, &tree, Y, 0, 10);
    if let Reads::PointsThenWrite = reads {
        tx.upsert(&sums, b"sum", (x + y).to_le_bytes()).unwrap();
    }
    let moved = std::rc::Rc::new(Cell::new(false));
    let hook = {
        let (moved, mover, tree) = (moved.clone(), e.worker(), tree);
        between_reads_run(move || {
            if !moved.replace(true) {
                mv(&mover, &tree, 0, Y, 10);
            }
        })
    };
    let r = tx.commit();
    drop(hook);
    assert!(moved.get(), "the hook ran inside the validation");
    let committed = match r {
        Ok(()) => Some(x + y),
        Err(e) if e.is_conflict() => None,
        Err(e) => panic!("the audit failed: {e}"),
    };
    // what is in the database is a state that existed
    let now: i64 = [0, Y]
        .iter()
        .map(|&k| {
            let mut v = Vec::new();
            assert!(tree.lookup(&w, u64_key(k), &mut v).unwrap());
            balance(&v)
        })
        .sum();
    assert_eq!(now, 2000, "the moves keep the total");
    let mut v = Vec::new();
    let written = sums.lookup(&w, b"sum", &mut v).unwrap();
    assert_eq!(
        written,
        matches!(reads, Reads::PointsThenWrite) && committed.is_some(),
        "the sum is written exactly when the audit that writes it commits"
    );
    drop((w, mover));
    e.close().unwrap();
    committed
}

#[test]
fn a_value_that_changes_and_changes_back_during_validation_is_a_conflict() {
    for reads in [Reads::Points, Reads::Ranges, Reads::PointsThenWrite] {
        let got = audit_across_moves(reads);
        assert!(
            got.is_none() || got == Some(2000),
            "{reads:?}: an audit committed x + y = {got:?}, a state that never existed"
        );
    }
}

#[test]
fn without_the_second_pass_an_audit_commits_a_state_that_never_existed() {
    // the negative control: the checker above catches the first pass alone
    SECOND_PASS.with(|s| s.set(false));
    let got: Vec<_> = [Reads::Points, Reads::Ranges, Reads::PointsThenWrite]
        .into_iter()
        .map(audit_across_moves)
        .collect();
    SECOND_PASS.with(|s| s.set(true));
    assert_eq!(
        got,
        vec![Some(2010); 3],
        "each audit committed x + y = 2010"
    );
}

/// The leaf of `key` in `tree`: its page and free bytes.
fn leaf_of(w: &Worker, tree: &BTree, key: &[u8]) -> (Pid, usize) {
    w.run(|w| {
        let g = tree.find_leaf(w, key)?;
        let free = node::free_space(g.page());
        g.validate()?;
        Ok((g.pid(), free))
    })
    .unwrap()
}

#[test]
fn a_commit_whose_read_of_some_bytes_outlived_the_value_length_neither_panics_nor_shows_half() {
    let dir = tempfile::tempdir().unwrap();
    let e =
        shoal_engine::Engine::open(shoal_engine::EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let (w, other) = (e.worker(), e.worker());
    let tree = BTree::create(&w, "t").unwrap();
    for i in 0..2000u64 {
        tree.upsert(&w, u64_key(i), [1u8; 20]).unwrap();
    }
    let k = u64_key(1500);
    tree.upsert(&w, k, vec![7u8; 1000]).unwrap();
    // a key in a leaf before k's in page order (latched, so written, first)
    let (k_leaf, _) = leaf_of(&w, &tree, &k);
    let early = (0..1500u64)
        .map(u64_key)
        .find(|e| leaf_of(&w, &tree, e).0 < k_leaf)
        .expect("a leaf before k's in page order");
    // T reads 8 bytes of k while it is 1,000 bytes long
    let mut tx = Transaction::begin(&w);
    assert!(tx.update_part(&tree, k, 0..8, |b| b[0] = 9).unwrap());
    // another writer shrinks k to 16 bytes, keeping its first 8, and fills k's leaf
    tree.upsert(&other, k, [7u8; 16]).unwrap();
    let mut n = 0u8;
    while leaf_of(&other, &tree, &k).1 >= 900 {
        let mut f = k.to_vec();
        f.push(n);
        tree.upsert(&other, &f, [3u8; 50]).unwrap();
        n += 1;
    }
    let (_, free) = leaf_of(&w, &tree, &k);
    assert!(
        free < 984,
        "k's leaf has no room for 984 more bytes ({free} free)"
    );
    // T writes 1,000 bytes to k and something to the earlier leaf
    tx.upsert(&tree, k, vec![5u8; 1000]).unwrap();
    tx.upsert(&tree, early, b"T was here").unwrap();
    let r = tx.commit();
    let mut v = Vec::new();
    let k_now = tree.lookup(&w, k, &mut v).map(|_| v.clone()).unwrap();
    let early_now = tree.lookup(&w, early, &mut v).map(|_| v.clone()).unwrap();
    match r {
        Ok(()) => {
            assert_eq!(k_now, vec![5u8; 1000]);
            assert_eq!(early_now, b"T was here");
        }
        Err(e) => {
            assert!(e.is_conflict(), "{e}");
            assert_eq!(k_now, vec![7u8; 16], "nothing of T is visible");
            assert_eq!(early_now, [1u8; 20], "nothing of T is visible");
        }
    }
    tree.verify(&w).unwrap();
    drop((w, other));
    e.close().unwrap();
}
