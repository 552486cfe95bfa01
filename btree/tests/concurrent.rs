//! Concurrent stress: inserts, removes, lookups and scans together. Every scan is sorted, every
//! acknowledged insert is found, every remove sticks. Run in memory and with the tree 4x larger
//! than the cache (eviction running). Then reopen and find everything again.

use rand::{Rng, SeedableRng};
use shoal_btree::{BTree, Direction, KeyBuilder};
use shoal_engine::{Engine, EngineConfig, OpenMode, Worker};
use std::collections::BTreeSet;

const THREADS: u32 = 4;

fn key(t: u32, i: u32) -> Vec<u8> {
    // interleave threads in key space so they contend for the same leaves
    KeyBuilder::new().u32(i).u32(t).finish()
}

fn value(t: u32, i: u32) -> Vec<u8> {
    let mut v = vec![0u8; 100];
    v[..4].copy_from_slice(&t.to_le_bytes());
    v[4..8].copy_from_slice(&i.to_le_bytes());
    v[8..].fill((i ^ t) as u8);
    v
}

fn check_value(k: &[u8], v: &[u8]) {
    let i = u32::from_be_bytes(k[..4].try_into().unwrap());
    let t = u32::from_be_bytes(k[4..8].try_into().unwrap());
    assert_eq!(
        v,
        value(t, i).as_slice(),
        "value does not belong to its key"
    );
}

/// Scan up to `n` entries from `from` in a random direction: sorted, every value its key's.
fn check_scan(tree: &BTree, w: &Worker, rng: &mut impl Rng, from: &[u8], n: usize) {
    let dir = if rng.random_bool(0.5) {
        Direction::Ascending
    } else {
        Direction::Descending
    };
    let mut prev: Option<Vec<u8>> = None;
    let mut seen = 0;
    tree.scan(w, from, dir, |k, v| {
        if let Some(p) = &prev {
            let sorted = match dir {
                Direction::Ascending => p.as_slice() < k,
                Direction::Descending => p.as_slice() > k,
            };
            assert!(sorted, "scan not sorted");
        }
        check_value(k, v);
        prev = Some(k.to_vec());
        seen += 1;
        seen < n
    })
    .unwrap();
}

/// One owner's operations: owner `t` inserts and removes its own keys, reads everyone's.
/// Returns the keys it owns at the end. Gives the thread's other tasks a turn after every
/// operation (nothing outside tasks).
fn owner_ops(tree: &BTree, w: &Worker, t: u32, per_thread: u32, ops: usize) -> BTreeSet<u32> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64);
    let mut mine = BTreeSet::new();
    let mut buf = Vec::new();
    for _ in 0..ops {
        let i = rng.random_range(0..per_thread);
        let k = key(t, i);
        match rng.random_range(0..10) {
            0..=4 => {
                let fresh = tree.insert(w, &k, value(t, i)).unwrap().inserted();
                assert_eq!(fresh, mine.insert(i), "insert of an owned key");
                assert!(
                    tree.lookup(w, &k, &mut buf).unwrap(),
                    "acknowledged insert not found"
                );
                check_value(&k, &buf);
            }
            5..=6 => {
                assert_eq!(tree.remove(w, &k).unwrap(), mine.remove(&i));
                assert!(
                    !tree.lookup(w, &k, &mut buf).unwrap(),
                    "removed key still found"
                );
            }
            7 => {
                // a batch of own keys (exactly the acknowledged ones are
                // found) and others' (well-formed if present)
                let idx: Vec<u32> = (0..rng.random_range(1..40))
                    .map(|_| rng.random_range(0..per_thread))
                    .collect();
                let owner = |j: usize| {
                    if j.is_multiple_of(3) {
                        (t + 1) % THREADS
                    } else {
                        t
                    }
                };
                let keys: Vec<Vec<u8>> = idx
                    .iter()
                    .enumerate()
                    .map(|(j, &i)| key(owner(j), i))
                    .collect();
                let mut next = 0;
                tree.lookup_many(w, &keys, |j, v| {
                    assert_eq!(j, next, "lookup_many answers in key order");
                    next += 1;
                    if let Some(v) = v {
                        check_value(&keys[j], v);
                    }
                    if owner(j) == t {
                        assert_eq!(
                            v.is_some(),
                            mine.contains(&idx[j]),
                            "lookup_many disagrees with acknowledged writes"
                        );
                    }
                })
                .unwrap();
                assert_eq!(next, keys.len());
            }
            8 => {
                // someone else's key: must be well-formed if present
                let other = key(rng.random_range(0..THREADS), i);
                if tree.lookup(w, &other, &mut buf).unwrap() {
                    check_value(&other, &buf);
                }
            }
            _ => {
                let n = rng.random_range(1..200);
                check_scan(tree, w, &mut rng, &k, n);
            }
        }
        shoal_engine::tasks::yield_now();
    }
    mine
}

/// Returns the tree's pages, the cache's frames and the evictions of the run. With `in_tasks`,
/// half as many threads each run two owners as tasks (shoal_engine::tasks).
fn stress(cache: usize, per_thread: u32, ops: usize, in_tasks: bool) -> (u64, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig::new(dir.path(), cache);
    let e = Engine::open(cfg.clone()).unwrap();
    let tree = BTree::create(&e.worker(), "stress").unwrap();
    let finals: Vec<BTreeSet<u32>> = std::thread::scope(|s| {
        let threads = if in_tasks { THREADS / 2 } else { THREADS };
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (e, tree) = (&e, &tree);
                s.spawn(move || {
                    if !in_tasks {
                        return vec![owner_ops(tree, &e.worker(), t, per_thread, ops)];
                    }
                    // two owners per thread, each a task
                    let out: Vec<std::cell::RefCell<BTreeSet<u32>>> =
                        (0..2).map(|_| Default::default()).collect();
                    shoal_engine::tasks::run(2, |k| {
                        let owner = t * 2 + k as u32;
                        *out[k].borrow_mut() = owner_ops(tree, &e.worker(), owner, per_thread, ops);
                    })
                    .unwrap();
                    out.into_iter().map(|r| r.into_inner()).collect()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let check_all = |e: &Engine, tree: &BTree| {
        let w = e.worker();
        let mut buf = Vec::new();
        let total: usize = finals.iter().map(|s| s.len()).sum();
        for (t, set) in finals.iter().enumerate() {
            for i in 0..per_thread {
                let found = tree.lookup(&w, key(t as u32, i), &mut buf).unwrap();
                assert_eq!(found, set.contains(&i), "thread {t} key {i}");
            }
        }
        let r = tree.verify(&w).unwrap();
        let (n, height) = (r.entries, r.height);
        assert_eq!(n, total as u64);
        assert_eq!(tree.count(&w).unwrap(), total as u64);
        height
    };
    let height = check_all(&e, &tree);
    assert!(height >= 2, "the stress must split nodes");
    let evictions = e.stats().evictions;
    let sizes = (e.store().slots_in_use(), e.frames() as u64, evictions);
    e.close().unwrap();
    drop(e);
    let mut cfg = cfg;
    cfg.mode = OpenMode::Open;
    let e = Engine::open(cfg).unwrap();
    let reopened = BTree::open(&e.worker(), "stress").unwrap();
    assert_eq!(
        reopened.root(),
        tree.root(),
        "the same tree after reopening"
    );
    check_all(&e, &reopened);
    eprintln!("cache {cache}: height {height}, evictions {evictions}");
    sizes
}

#[test]
fn concurrent_ops_in_memory() {
    let (pages, frames, _) = stress(64 << 20, 20_000, 40_000, false);
    assert!(
        pages < frames,
        "the tree fits the cache: {pages} pages, {frames} frames"
    );
}

#[test]
fn concurrent_ops_tree_four_times_the_cache() {
    // ~60K live entries of ~120 bytes in 4 KiB leaves at ~70% fill is ~10 MiB of leaves; a 2 MiB
    // cache holds about a fifth of it.
    let cache = 2 << 20;
    let (pages, frames, evictions) = stress(cache, 30_000, 60_000, false);
    assert!(
        pages >= 3 * frames && evictions >= pages - frames,
        "the tree outgrew the cache and pages were evicted: {pages} pages, {frames} frames, {evictions} evictions"
    );
}

#[test]
fn concurrent_ops_in_tasks_on_a_tree_four_times_the_cache() {
    // The same mix, two tasks per thread: a task pauses for reads and latches in the middle of
    // an operation (a scan's descent among them) while the other writes the same tree.
    let (pages, frames, evictions) = stress(2 << 20, 30_000, 60_000, true);
    assert!(
        pages >= 3 * frames && evictions >= pages - frames,
        "the tree outgrew the cache and pages were evicted: {pages} pages, {frames} frames, {evictions} evictions"
    );
}

#[test]
fn parallel_ascending_loads_leave_full_leaves() {
    // Two loaders of adjacent key ranges (as `shoal ycsb` loads): sequential-insert detection
    // must keep leaves nearly full, not leave a trail of half-full ones at the range boundary.
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 256 << 20)).unwrap();
    let t = BTree::create(&e.worker(), "t").unwrap();
    let per = 200_000u64;
    std::thread::scope(|s| {
        for th in 0..2u64 {
            let (e, t) = (&e, &t);
            s.spawn(move || {
                let w = e.worker();
                for k in th * per..(th + 1) * per {
                    assert!(t
                        .insert(&w, shoal_btree::u64_key(k), [7u8; 128])
                        .unwrap()
                        .inserted());
                }
            });
        }
    });
    let w = e.worker();
    let report = t.verify(&w).unwrap();
    assert_eq!(report.entries, 2 * per);
    // inner nodes too: the level above the leaves is nearly full (47% when inner splits cut
    // in the middle), so the tree is no taller than it needs to be
    let (nodes, bytes) = report.levels[1];
    let fill = bytes as f64 / (nodes as f64 * 4080.0);
    assert!(
        fill > 0.8,
        "level 1: {nodes} nodes {:.0}% full",
        fill * 100.0
    );
    // a leaf holds (4080 - 40 - 16) / (24 + 8 + 128) = 25 such records
    let ideal_leaves = 2 * per / 25;
    let pages = e.store().high_water();
    assert!(
        pages < ideal_leaves * 110 / 100,
        "{pages} pages for {ideal_leaves} full leaves' worth of records"
    );
}

/// Threads remove most of a loaded tree (merging nodes and freeing pages as leaves empty) while
/// they also look keys up, one by one and in batches, scan, and insert some keys back.
/// Returns the loaded tree's pages, the cache's frames and the evictions of the run.
fn drain(cache: usize, per_thread: u32) -> (u64, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), cache)).unwrap();
    let tree = BTree::create(&e.worker(), "drain").unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (e, tree) = (&e, &tree);
            s.spawn(move || {
                let w = e.worker();
                for i in 0..per_thread {
                    assert!(tree.insert(&w, key(t, i), value(t, i)).unwrap().inserted());
                }
            });
        }
    });
    let loaded_height = tree.verify(&e.worker()).unwrap().height;
    let loaded_pages = e.store().slots_in_use();
    let finals: Vec<BTreeSet<u32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (e, tree) = (&e, &tree);
                s.spawn(move || {
                    let w = e.worker();
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(100 + t as u64);
                    let mut mine: BTreeSet<u32> = (0..per_thread).collect();
                    let mut order: Vec<u32> = (0..per_thread).collect();
                    for i in (1..order.len()).rev() {
                        order.swap(i, rng.random_range(0..=i));
                    }
                    let mut buf = Vec::new();
                    for (n, &i) in order.iter().enumerate() {
                        if i % 20 == 0 {
                            continue; // survivors
                        }
                        let k = key(t, i);
                        assert!(tree.remove(&w, &k).unwrap(), "own key {i} missing");
                        mine.remove(&i);
                        assert!(!tree.lookup(&w, &k, &mut buf).unwrap(), "removed key found");
                        match n % 8 {
                            0 => {
                                // one of ours, present or not
                                let j = rng.random_range(0..per_thread);
                                let found = tree.lookup(&w, key(t, j), &mut buf).unwrap();
                                assert_eq!(found, mine.contains(&j), "thread {t} key {j}");
                                if found {
                                    check_value(&key(t, j), &buf);
                                }
                            }
                            1 => {
                                let idx: Vec<u32> = (0..rng.random_range(1..40))
                                    .map(|_| rng.random_range(0..per_thread))
                                    .collect();
                                let keys: Vec<Vec<u8>> = idx
                                    .iter()
                                    .enumerate()
                                    .map(|(j, &i)| {
                                        key(if j % 2 == 0 { t } else { (t + 1) % THREADS }, i)
                                    })
                                    .collect();
                                tree.lookup_many(&w, &keys, |j, v| {
                                    if let Some(v) = v {
                                        check_value(&keys[j], v);
                                    }
                                    if j % 2 == 0 {
                                        assert_eq!(v.is_some(), mine.contains(&idx[j]));
                                    }
                                })
                                .unwrap();
                            }
                            // put one back now and then: splits among the merges
                            2 if rng.random_bool(0.3) => {
                                let j = i ^ 1;
                                let fresh =
                                    tree.insert(&w, key(t, j), value(t, j)).unwrap().inserted();
                                assert_eq!(fresh, mine.insert(j));
                            }
                            3 => check_scan(tree, &w, &mut rng, &k, 100),
                            _ => {}
                        }
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let w = e.worker();
    let mut buf = Vec::new();
    for (t, set) in finals.iter().enumerate() {
        for i in 0..per_thread {
            let found = tree.lookup(&w, key(t as u32, i), &mut buf).unwrap();
            assert_eq!(found, set.contains(&i), "thread {t} key {i}");
        }
    }
    let total: usize = finals.iter().map(BTreeSet::len).sum();
    let r = tree.verify(&w).unwrap();
    let (n, height) = (r.entries, r.height);
    assert_eq!(n, total as u64);
    let pages = e.store().slots_in_use();
    eprintln!(
        "cache {cache}: {loaded_pages} pages, height {loaded_height} -> {pages} pages, height {height}, {total} keys left, {} evictions",
        e.stats().evictions
    );
    assert!(
        pages * 3 < loaded_pages,
        "{pages} pages in use after removing most keys (was {loaded_pages})"
    );
    (loaded_pages, e.frames() as u64, e.stats().evictions)
}

#[test]
fn concurrent_removes_merge_nodes_in_memory() {
    let (pages, frames, _) = drain(64 << 20, 25_000);
    assert!(
        pages < frames,
        "the tree fits the cache: {pages} pages, {frames} frames"
    );
}

#[test]
fn concurrent_removes_merge_nodes_with_eviction() {
    // 100K entries of ~120 bytes are ~15 MiB of leaves, 4x a 4 MiB cache
    let (pages, frames, evictions) = drain(4 << 20, 25_000);
    assert!(
        pages >= 3 * frames && evictions >= pages - frames,
        "the tree outgrew the cache and pages were evicted: {pages} pages, {frames} frames, {evictions} evictions"
    );
}

/// Issue 28: two threads calling `open_or_create` on one new name at once both get the same
/// tree (never an error), and the loser's root page is given back: pages in use are the
/// catalog plus one root per name.
#[test]
fn racing_open_or_create_yields_one_tree_and_leaks_no_page() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 16 << 20)).unwrap();
    let names = 200;
    let start = std::sync::Barrier::new(2);
    let roots: Vec<Vec<shoal_engine::Pid>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let w = e.worker();
                    (0..names)
                        .map(|i| {
                            start.wait();
                            BTree::open_or_create(&w, &format!("t{i}")).unwrap().root()
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(roots[0], roots[1], "both threads got the same trees");
    assert_eq!(
        e.store().slots_in_use(),
        1 + names as u64,
        "catalog + one root each"
    );
    let w = e.worker();
    assert!(matches!(
        BTree::create(&w, "t7"),
        Err(shoal_btree::TreeError::Exists(n)) if n == "t7"
    ));
    drop(w);
    e.close().unwrap();
}
