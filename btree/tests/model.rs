//! Property test: random operation sequences on the tree and on `std::collections::BTreeMap`
//! give the same results, including scans in both directions; the tree's structure verifies.

use byteorder::{ByteOrder, LittleEndian};
use proptest::prelude::*;
use shoal_btree::{BTree, Direction, Put};
use shoal_engine::{Engine, EngineConfig};
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u8>, Vec<u8>),
    Upsert(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
    Get(Vec<u8>),
    GetMany(Vec<Vec<u8>>),
    Update(Vec<u8>, u8),
    ScanAsc(Vec<u8>, usize),
    ScanDesc(Vec<u8>, usize),
    /// Remove up to n present keys from this key on (empties ranges: merges nodes).
    Drain(Vec<u8>, usize),
    /// `range(lo..hi)` (bounds: 0 unbounded, 1 included, 2 excluded), taking from the front
    /// (false) or back (true) in this pattern, then the rest from the front.
    Range(Vec<u8>, u8, Vec<u8>, u8, Vec<bool>),
    /// A batch of puts (Some) and removes (None), applied with `apply`.
    Batch(Vec<(Vec<u8>, Option<Vec<u8>>)>),
}

fn bound(k: &[u8], kind: u8) -> std::ops::Bound<Vec<u8>> {
    match kind {
        0 => std::ops::Bound::Unbounded,
        1 => std::ops::Bound::Included(k.to_vec()),
        _ => std::ops::Bound::Excluded(k.to_vec()),
    }
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    // small alphabet and lengths: many collisions, shared prefixes, keys longer and shorter
    // than the 8-byte slot head
    prop::collection::vec(
        prop::sample::select(vec![0u8, 1, 2, b'a', b'b', 255]),
        0..14,
    )
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..300)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (key(), value()).prop_map(|(k, v)| Op::Insert(k, v)),
        2 => (key(), value()).prop_map(|(k, v)| Op::Upsert(k, v)),
        2 => key().prop_map(Op::Remove),
        2 => key().prop_map(Op::Get),
        1 => prop::collection::vec(key(), 0..40).prop_map(Op::GetMany),
        1 => (key(), any::<u8>()).prop_map(|(k, b)| Op::Update(k, b)),
        1 => (key(), 0..40usize).prop_map(|(k, n)| Op::ScanAsc(k, n)),
        1 => (key(), 0..40usize).prop_map(|(k, n)| Op::ScanDesc(k, n)),
        1 => (key(), 0..200usize).prop_map(|(k, n)| Op::Drain(k, n)),
        1 => (key(), 0..3u8, key(), 0..3u8, prop::collection::vec(any::<bool>(), 0..150))
            .prop_map(|(a, x, b, y, takes)| Op::Range(a, x, b, y, takes)),
        1 => prop::collection::vec((key(), prop::option::of(value())), 0..20).prop_map(Op::Batch),
        1 => run_batch(),
    ]
}

/// A batch of many new keys side by side (a key, then 1 to 400 keys that extend it by two
/// bytes of a count: all in one gap of the tree's keys, up to about 120 KB), with removals
/// and replacements of some of them: one commit that splits leaves at its own keys.
fn run_batch() -> impl Strategy<Value = Op> {
    (key(), 1..400u16, 0..300usize, any::<u64>()).prop_map(|(base, n, len, seed)| {
        let mut x = seed | 1;
        let mut ops = Vec::with_capacity(n as usize);
        for i in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut k = base.clone();
            k.extend_from_slice(&i.to_be_bytes());
            let v = (x % 8 != 0).then(|| vec![(x >> 8) as u8; (x as usize >> 16) % (len + 1)]);
            ops.push((k, v));
        }
        Op::Batch(ops)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn tree_matches_btreemap(ops in prop::collection::vec(op(), 1..1500)) {
        check_ops(&ops, 1 << 20)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Issue 28: values of any size up to 1 MB (overflow pages beyond a leaf's record size)
    /// behave as in a BTreeMap, through every operation, scans and ranges included.
    #[test]
    fn large_values_match_btreemap(ops in prop::collection::vec(big_op(), 1..80)) {
        check_ops(&ops, 2 << 20)?;
    }
}

fn big_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..1200),
        3 => prop::collection::vec(any::<u8>(), 1200..20_000),
        1 => (20_000usize..=1 << 20).prop_map(|n| (0..n).map(|i| (i * 7 + n) as u8).collect()),
    ]
}

fn big_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (key(), big_value()).prop_map(|(k, v)| Op::Insert(k, v)),
        3 => (key(), big_value()).prop_map(|(k, v)| Op::Upsert(k, v)),
        2 => key().prop_map(Op::Remove),
        2 => key().prop_map(Op::Get),
        1 => prop::collection::vec(key(), 0..10).prop_map(Op::GetMany),
        1 => (key(), any::<u8>()).prop_map(|(k, b)| Op::Update(k, b)),
        1 => (key(), 0..10usize).prop_map(|(k, n)| Op::ScanAsc(k, n)),
        1 => (key(), 0..10usize).prop_map(|(k, n)| Op::ScanDesc(k, n)),
        1 => (key(), 0..3u8, key(), 0..3u8, prop::collection::vec(any::<bool>(), 0..20))
            .prop_map(|(a, x, b, y, takes)| Op::Range(a, x, b, y, takes)),
        1 => prop::collection::vec((key(), prop::option::of(big_value())), 0..4).prop_map(Op::Batch),
        1 => (key(), 0..20usize).prop_map(|(k, n)| Op::Drain(k, n)),
    ]
}

/// Run `ops` on a tree (with `cache` bytes of cache) and on a BTreeMap and compare.
fn check_ops(ops: &[Op], cache: usize) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    // small caches: larger runs evict tree pages as they go
    let e = Engine::open(EngineConfig::new(dir.path(), cache)).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    let mut m: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Insert(k, v) => {
                let expect = !m.contains_key(k);
                if expect {
                    m.insert(k.clone(), v.clone());
                }
                prop_assert_eq!(t.insert(&w, k, v).unwrap().inserted(), expect);
            }
            Op::Upsert(k, v) => {
                let expect = if m.insert(k.clone(), v.clone()).is_some() {
                    Put::Replaced
                } else {
                    Put::Inserted
                };
                prop_assert_eq!(t.upsert(&w, k, v).unwrap(), expect);
            }
            Op::Remove(k) => prop_assert_eq!(t.remove(&w, k).unwrap(), m.remove(k).is_some()),
            Op::Get(k) => prop_assert_eq!(t.get(&w, k).unwrap(), m.get(k).cloned()),
            Op::GetMany(ks) => {
                let mut got = Vec::new();
                t.lookup_many(&w, ks, |i, v| got.push((i, v.map(<[u8]>::to_vec))))
                    .unwrap();
                let want: Vec<_> = ks
                    .iter()
                    .enumerate()
                    .map(|(i, k)| (i, m.get(k).cloned()))
                    .collect();
                prop_assert_eq!(got, want);
                // bytes 3..40 of each value (clipped: shorter values give less or nothing)
                let mut got = Vec::new();
                t.lookup_many_part(&w, ks, 3..40, |i, v| got.push((i, v.map(<[u8]>::to_vec))))
                    .unwrap();
                let want: Vec<_> = ks
                    .iter()
                    .enumerate()
                    .map(|(i, k)| {
                        let v = m
                            .get(k)
                            .map(|v| v[3.min(v.len())..40.min(v.len())].to_vec());
                        (i, v)
                    })
                    .collect();
                prop_assert_eq!(got, want);
            }
            Op::Update(k, b) => {
                let found = t
                    .update(&w, k, |v| v.iter_mut().for_each(|x| *x ^= *b))
                    .unwrap();
                prop_assert_eq!(found, m.contains_key(k));
                if let Some(v) = m.get_mut(k) {
                    v.iter_mut().for_each(|x| *x ^= *b);
                }
            }
            Op::ScanAsc(k, n) => {
                let mut got = Vec::new();
                t.scan(&w, k, Direction::Ascending, |k, v| {
                    got.push((k.to_vec(), v.to_vec()));
                    got.len() < *n
                })
                .unwrap();
                let want: Vec<_> = m
                    .range(k.clone()..)
                    .take((*n).max(1))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                prop_assert_eq!(got, want);
            }
            Op::ScanDesc(k, n) => {
                let mut got = Vec::new();
                t.scan(&w, k, Direction::Descending, |k, v| {
                    got.push((k.to_vec(), v.to_vec()));
                    got.len() < *n
                })
                .unwrap();
                let want: Vec<_> = m
                    .range(..=k.clone())
                    .rev()
                    .take((*n).max(1))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                prop_assert_eq!(got, want);
            }
            Op::Range(a, x, b, y, takes) => {
                let (lo, hi) = (bound(a, *x), bound(b, *y));
                // BTreeMap::range panics on inverted bounds: the tree's range is empty then
                let inverted = match (&lo, &hi) {
                    (std::ops::Bound::Included(a), std::ops::Bound::Included(b)) => a > b,
                    (std::ops::Bound::Unbounded, _) | (_, std::ops::Bound::Unbounded) => false,
                    (
                        std::ops::Bound::Included(a) | std::ops::Bound::Excluded(a),
                        std::ops::Bound::Included(b) | std::ops::Bound::Excluded(b),
                    ) => a >= b,
                };
                let mut want: std::collections::VecDeque<(Vec<u8>, Vec<u8>)> = if inverted {
                    Default::default()
                } else {
                    m.range((lo.clone(), hi.clone()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                };
                let mut it = t.range(&w, (lo, hi));
                for &back in takes {
                    let got = if back { it.next_back() } else { it.next() };
                    let expect = if back {
                        want.pop_back()
                    } else {
                        want.pop_front()
                    };
                    prop_assert_eq!(got.map(Result::unwrap), expect);
                }
                let rest: Vec<_> = it.map(Result::unwrap).collect();
                prop_assert_eq!(rest, want.into_iter().collect::<Vec<_>>());
            }
            Op::Batch(ops) => {
                let mut b = shoal_btree::Batch::new();
                for (k, v) in ops {
                    match v {
                        Some(v) => {
                            b.put(k, v);
                            m.insert(k.clone(), v.clone());
                        }
                        None => {
                            b.remove(k);
                            m.remove(k);
                        }
                    }
                }
                t.apply(&w, &b).unwrap();
            }
            Op::Drain(k, n) => {
                let gone: Vec<Vec<u8>> = m
                    .range(k.clone()..)
                    .take(*n)
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in &gone {
                    m.remove(k);
                    prop_assert!(t.remove(&w, k).unwrap());
                }
            }
        }
    }
    prop_assert_eq!(t.count(&w).unwrap(), m.len() as u64);
    let report = t.verify(&w).map_err(TestCaseError::fail)?;
    prop_assert_eq!(report.entries, m.len() as u64);
    let mut all = Vec::new();
    t.scan(&w, &[], Direction::Ascending, |k, v| {
        all.push((k.to_vec(), v.to_vec()));
        true
    })
    .unwrap();
    prop_assert_eq!(all, m.into_iter().collect::<Vec<_>>());
    // every page in use is a tree page (overflow chains freed when replaced or removed)
    prop_assert_eq!(e.store().slots_in_use(), 1 + report.pages.len() as u64);
    Ok(())
}

#[test]
fn oversized_keys_and_values_are_refused_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 4 << 20)).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    let err = t.insert(&w, [1u8; 300], b"v").unwrap_err();
    assert!(
        err.to_string().contains("key of 300 bytes is too large"),
        "{err}"
    );
    let err = t
        .upsert(&w, b"k", vec![0u8; shoal_btree::MAX_VALUE + 1])
        .unwrap_err();
    assert!(err.to_string().contains("too large"), "{err}");
    // the tree is untouched and still works with the largest allowed sizes
    assert_eq!(t.count(&w).unwrap(), 0);
    for i in 0..50u32 {
        let k = [&i.to_be_bytes()[..], &[7u8; 252]].concat();
        assert!(t
            .insert(&w, &k, vec![i as u8; shoal_btree::MAX_RECORD - 256])
            .unwrap()
            .inserted());
    }
    assert_eq!(t.verify(&w).unwrap().entries, 50);
    assert!(matches!(
        BTree::create(&w, "t"),
        Err(shoal_btree::TreeError::Exists(_))
    ));
    assert!(matches!(
        BTree::open(&w, "nope"),
        Err(shoal_btree::TreeError::NotFound(_))
    ));
}

/// Issue 47: a record of up to `MAX_RECORD` bytes (YCSB's 1 KB record with its key) lives in
/// its leaf, whatever the key length and the insert order; one byte more takes an overflow
/// page.
#[test]
fn records_of_the_largest_in_leaf_size_stay_in_their_leaves_in_any_order() {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    let max = shoal_btree::MAX_RECORD;
    assert!(max >= 24 + 10 * 100, "YCSB's default record fits");
    // keys of 8 to 24 bytes and of the longest length, shuffled: splits at every position
    let mut keys: Vec<Vec<u8>> = (0..3000u32)
        .map(|i| {
            let len = match i % 4 {
                0 => shoal_btree::MAX_KEY,
                n => 8 + 8 * n as usize,
            };
            let mut k = vec![b'k'; len];
            k[..4].copy_from_slice(&i.wrapping_mul(2_654_435_761).to_be_bytes());
            k
        })
        .collect();
    keys.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(47));
    for (i, k) in keys.iter().enumerate() {
        let v = vec![i as u8; max - k.len()];
        if i % 3 == 0 {
            // a small value first, then replaced by the largest in-leaf one
            assert!(t.insert(&w, k, b"small").unwrap().inserted());
            t.upsert(&w, k, &v).unwrap();
        } else {
            assert!(t.insert(&w, k, &v).unwrap().inserted());
        }
    }
    let r = t.verify(&w).unwrap();
    assert_eq!(r.entries, keys.len() as u64);
    assert_eq!((r.overflow_values, r.overflow_pages), (0, 0));
    // more than one such record per leaf on average (a page each was the old cost; with a
    // quarter of the keys and fences 256 bytes long, a leaf holds two or three)
    assert!(r.leaves * 3 <= keys.len() as u64 * 2, "{} leaves", r.leaves);
    for (i, k) in keys.iter().enumerate().step_by(97) {
        assert_eq!(t.get(&w, k).unwrap(), Some(vec![i as u8; max - k.len()]));
    }
    // one byte more: the value goes to an overflow page
    t.upsert(&w, &keys[0], vec![9u8; max + 1 - keys[0].len()])
        .unwrap();
    let r = t.verify(&w).unwrap();
    assert_eq!((r.overflow_values, r.overflow_pages), (1, 1));
}

#[test]
fn model_sized_runs_split_and_evict() {
    // The property test's largest runs must reach a multi-level tree on a cache that evicts;
    // this checks that claim directly with the same key/value shapes.
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 1 << 20)).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    for i in 0..1500u32 {
        t.upsert(&w, i.to_be_bytes(), [i as u8; 299]).unwrap();
    }
    let r = t.verify(&w).unwrap();
    let (n, height) = (r.entries, r.height);
    assert_eq!(n, 1500);
    assert!(height >= 2, "height {height}");
    for i in 0..20_000u32 {
        t.upsert(&w, (i + 10_000).to_be_bytes(), [1u8; 200])
            .unwrap();
    }
    assert!(
        e.stats().evictions > 0,
        "a 1 MiB cache must evict: {:?}",
        e.stats()
    );
    assert_eq!(t.verify(&w).unwrap().entries, 21_500);
}

#[test]
fn removes_merge_nodes_and_free_their_pages() {
    // 60K records of 8 + 100 bytes: a tree of 3 levels. Removing most of them must merge
    // leaves and inner nodes (pages go back to the store), keep every survivor, and removing
    // the rest must shrink the tree back to a single root leaf.
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 64 << 20)).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    let n = 60_000u64;
    // a scattered insert order: half-full leaves, as random inserts leave them
    let order: Vec<u64> = (0..n).map(|i| (i * 7_919) % n).collect();
    for &k in &order {
        assert!(t
            .insert(&w, shoal_btree::u64_key(k), [k as u8; 100])
            .unwrap()
            .inserted());
    }
    let height = t.verify(&w).unwrap().height;
    assert!(height >= 3, "height {height}");
    let full = e.store().slots_in_use();
    // keep every 50th key
    for &k in &order {
        if k % 50 != 0 {
            assert!(t.remove(&w, shoal_btree::u64_key(k)).unwrap());
        }
    }
    let thin = t.verify(&w).unwrap();
    let (left, lower) = (thin.entries, thin.height);
    assert_eq!(left, n / 50);
    let thinned = e.store().slots_in_use();
    // every page in use is the catalog's or the tree's: merges leak none
    assert_eq!(thinned, 1 + thin.pages.len() as u64);
    // 1,200 records of 132 bytes fit in ~40 leaves; allow for leaves merged only to half
    assert!(
        thinned * 10 < full,
        "{thinned} pages in use after removing 98% (was {full})"
    );
    assert!(
        lower < height,
        "height {height} -> {lower}: {:?}, {} underfull",
        thin.levels,
        thin.underfull
    );
    // a clean reopen finds the merged tree and keeps the freed pages free
    drop(w);
    e.close().unwrap();
    drop(e);
    let mut cfg = EngineConfig::new(dir.path(), 64 << 20);
    cfg.mode = shoal_engine::OpenMode::Open;
    let e = Engine::open(cfg).unwrap();
    let w = e.worker();
    let t = BTree::open(&w, "t").unwrap();
    assert_eq!(e.store().slots_in_use(), thinned);
    assert_eq!(t.verify(&w).unwrap(), thin);
    for k in 0..n {
        let v = t.get(&w, shoal_btree::u64_key(k)).unwrap();
        assert_eq!(v, (k % 50 == 0).then(|| vec![k as u8; 100]), "key {k}");
    }
    for k in (0..n).step_by(50) {
        assert!(t.remove(&w, shoal_btree::u64_key(k)).unwrap());
    }
    let empty = t.verify(&w).unwrap();
    assert_eq!(
        (empty.entries, empty.height, empty.pages.len()),
        (0, 1, 1),
        "an empty tree is one root leaf"
    );
    // the catalog page, the root and nothing else
    assert!(
        e.store().slots_in_use() <= 3,
        "{}",
        e.store().slots_in_use()
    );
    // and it grows again
    for k in 0..5_000u64 {
        assert!(t
            .insert(&w, shoal_btree::u64_key(k), b"again")
            .unwrap()
            .inserted());
    }
    assert_eq!(t.verify(&w).unwrap().entries, 5_000);
}

/// Issue 28: a write to a tree from inside its own scan callback is an error, not a hang; a
/// write to another tree there works; and a `range` loop may write to the tree it iterates
/// (no latch is held between items): every key present at the start is visited once.
#[test]
fn writes_during_iteration_work_or_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 4 << 20)).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    let other = BTree::create(&w, "other").unwrap();
    for k in 0..1000u64 {
        t.upsert(&w, shoal_btree::u64_key(k), k.to_le_bytes())
            .unwrap();
    }
    let mut errors = 0;
    t.scan(&w, &[], Direction::Ascending, |k, v| {
        match t.upsert(&w, k, b"changed") {
            Err(shoal_btree::TreeError::WriteInScan) => errors += 1,
            r => panic!("a write inside its own scan: {r:?}"),
        }
        other.upsert(&w, k, v).unwrap(); // another tree: fine
        errors < 5
    })
    .unwrap();
    assert_eq!(errors, 5);
    assert_eq!(other.count(&w).unwrap(), 5);
    // after the scan, writes work again
    t.upsert(&w, b"after", b"x").unwrap();
    assert!(t.remove(&w, b"after").unwrap());

    // range loop: double every value and insert a new key behind each visited one (the loop
    // may or may not meet those: not a snapshot; the keys there at the start come once each,
    // in order)
    let mut seen = 0u64;
    for entry in t.range(&w, shoal_btree::u64_key(0)..shoal_btree::u64_key(1000)) {
        let (k, v) = entry.unwrap();
        if v == b"new" {
            continue;
        }
        let n = LittleEndian::read_u64(&v);
        assert_eq!(n, seen, "in order, none skipped");
        assert_eq!(
            shoal_btree::u64_key(n).as_slice(),
            k.as_slice(),
            "each key once, in order"
        );
        t.upsert(&w, &k, (n * 2).to_le_bytes()).unwrap();
        let mut behind = k.clone();
        behind.push(0);
        assert!(t.insert(&w, &behind, b"new").unwrap().inserted());
        seen += 1;
    }
    assert_eq!(seen, 1000);
    assert_eq!(t.count(&w).unwrap(), 2000);
    // keys of several types
    t.upsert(&w, "text key", String::from("text value"))
        .unwrap();
    assert_eq!(
        t.get(&w, String::from("text key")).unwrap().unwrap(),
        b"text value"
    );
    assert!(t.iter(&w).next_back().unwrap().unwrap().0 > shoal_btree::u64_key(999).to_vec());
}

/// Issue 28: a batch is size-checked before anything is written.
#[test]
fn a_batch_with_an_oversized_record_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 4 << 20)).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    let mut b = shoal_btree::Batch::new();
    b.put(b"a", b"1").put(b"b", b"2").remove(b"c");
    b.put(b"huge", vec![0u8; shoal_btree::MAX_VALUE + 1]);
    assert!(matches!(
        t.apply(&w, &b),
        Err(shoal_btree::TreeError::ValueTooLarge { .. })
    ));
    assert_eq!(t.count(&w).unwrap(), 0);
}

/// Issue 47: a key too long for any tree is an error on every operation, reads too (a lookup
/// that said "absent" would hide the caller's bug), and an oversized value's error names the
/// value's length, the length the limit is on.
#[test]
fn an_oversized_key_is_an_error_everywhere_and_a_value_error_names_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 4 << 20)).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    let long = vec![7u8; shoal_btree::MAX_KEY + 1];
    let too_long = |r: Result<(), shoal_btree::TreeError>| matches!(r, Err(shoal_btree::TreeError::KeyTooLarge { len, .. }) if len == long.len());
    assert!(too_long(t.insert(&w, &long, b"v").map(|_| ())));
    assert!(too_long(t.get(&w, &long).map(|_| ())));
    assert!(too_long(t.update(&w, &long, |_| {}).map(|_| ())));
    assert!(too_long(t.remove(&w, &long).map(|_| ())));
    assert!(too_long(t.lookup_many(&w, &[&long[..]], |_, _| {})));
    let mut tx = shoal_btree::Transaction::begin(&w);
    let r = tx.get(&t, &long).map(|_| ());
    assert!(
        matches!(
            r,
            Err(shoal_btree::TxError::Tree(
                shoal_btree::TreeError::KeyTooLarge { .. }
            ))
        ),
        "{r:?}"
    );
    drop(tx);
    let big = vec![0u8; shoal_btree::MAX_VALUE + 1];
    let err = t.insert(&w, b"k", &big).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "value of {} bytes is too large (at most {})",
            big.len(),
            shoal_btree::MAX_VALUE
        )
    );
    assert_eq!(t.count(&w).unwrap(), 0);
}

/// Issue 28: trees can be renamed (handles stay valid) and dropped (every page freed: the
/// store's pages in use go back to what they were; the name can be created again).
#[test]
fn trees_are_renamed_and_dropped_without_leaking_pages() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 2 << 20)).unwrap();
    let w = e.worker();
    let keep = BTree::create(&w, "keep").unwrap();
    keep.upsert(&w, b"k", b"v").unwrap();
    let base = e.store().slots_in_use();
    let t = BTree::create(&w, "big").unwrap();
    for k in 0..20_000u64 {
        t.upsert(&w, shoal_btree::u64_key(k), [1u8; 100]).unwrap();
    }
    BTree::rename(&w, "big", "renamed").unwrap();
    assert!(matches!(
        BTree::open(&w, "big"),
        Err(shoal_btree::TreeError::NotFound(_))
    ));
    assert_eq!(BTree::open(&w, "renamed").unwrap(), t);
    assert_eq!(t.count(&w).unwrap(), 20_000, "the handle still works");
    assert!(matches!(
        BTree::rename(&w, "renamed", "keep"),
        Err(shoal_btree::TreeError::Exists(_))
    ));
    assert!(matches!(
        BTree::rename(&w, "nope", "x"),
        Err(shoal_btree::TreeError::NotFound(_))
    ));
    let pages = e.store().slots_in_use() - base;
    assert!(pages > 100, "{pages}");
    assert_eq!(BTree::drop_tree(&w, "renamed").unwrap(), pages);
    assert_eq!(
        e.store().slots_in_use(),
        base,
        "every page of the tree freed"
    );
    assert!(matches!(
        BTree::open(&w, "renamed"),
        Err(shoal_btree::TreeError::NotFound(_))
    ));
    let again = BTree::create(&w, "renamed").unwrap();
    assert_eq!(again.count(&w).unwrap(), 0);
    assert_eq!(keep.get(&w, b"k").unwrap().unwrap(), b"v");
    drop(w);
    e.close().unwrap();
    // and the store reopens with the catalog as left
    let e = Engine::open(EngineConfig::new(dir.path(), 2 << 20)).unwrap();
    let w = e.worker();
    let names: Vec<String> = w
        .catalog_list()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["keep", "renamed"]);
}

/// Issue 28: large values inside transactions with a write-ahead log (their chains written
/// before the commit, the replaced ones freed after it); committed, they stay; the store
/// reopens with them and no page leaks.
#[test]
fn large_values_in_logged_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || {
        let mut c = EngineConfig::new(dir.path(), 4 << 20);
        c.durability = shoal_engine::Durability::Commit;
        c.wal_bytes = 64 << 20;
        c
    };
    let e = Engine::open(cfg()).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    let v = |b: u8, n: usize| vec![b; n];
    for round in 0..3u8 {
        shoal_btree::transact(&w, |tx| {
            tx.upsert(&t, b"a", v(round, 1 << 20))?;
            tx.upsert(&t, b"b", v(round, 300_000))?;
            if round == 2 {
                assert!(tx.remove(&t, b"b")?);
            }
            Ok(())
        })
        .unwrap();
    }
    assert_eq!(t.get(&w, b"a").unwrap().unwrap(), v(2, 1 << 20));
    drop(w);
    e.close().unwrap();
    drop(e);
    let e = Engine::open(cfg()).unwrap();
    let w = e.worker();
    let t = BTree::open(&w, "t").unwrap();
    assert_eq!(t.get(&w, b"a").unwrap().unwrap(), v(2, 1 << 20));
    assert_eq!(t.get(&w, b"b").unwrap(), None);
    assert_eq!(
        e.store().slots_in_use(),
        1 + t.verify(&w).unwrap().pages.len() as u64
    );
    drop(w);
    e.close().unwrap();
}

/// Issue 47: `lookup_part` copies only the asked bytes of a value (one column of a row kept as
/// one value), clipped to the value, from a leaf or from overflow pages; an absent key is
/// `false`.
#[test]
fn a_part_of_a_value_is_its_bytes_clipped_to_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(EngineConfig::new(dir.path(), 16 << 20)).unwrap();
    let w = e.worker();
    let t = BTree::create(&w, "t").unwrap();
    let small: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    let large: Vec<u8> = (0..9000u32).map(|i| (i % 241) as u8).collect();
    assert!(t.insert(&w, b"small", &small).unwrap().inserted());
    assert!(t.insert(&w, b"large", &large).unwrap().inserted());
    let mut out = vec![7u8; 3];
    for (key, v) in [(&b"small"[..], &small), (&b"large"[..], &large)] {
        for part in [0..100, 300..400, 900..1000, 950..1200, 5000..6000, 2..2] {
            assert!(t.lookup_part(&w, key, part.clone(), &mut out).unwrap());
            let (from, to) = (
                part.start.min(v.len()),
                part.end.min(v.len()).max(part.start.min(v.len())),
            );
            assert_eq!(
                out,
                v[from..to],
                "{} {part:?}",
                String::from_utf8_lossy(key)
            );
        }
    }
    assert!(!t.lookup_part(&w, b"none", 0..10, &mut out).unwrap());
    assert!(out.is_empty());
}
