//! Where a lookup's record probably lies in its leaf, guessed before the leaf is read.
//!
//! A point lookup waits for memory once per level and then once more for the record: the
//! record's heap offset is known only after the leaf's slots are searched, so its lines load
//! after the leaf's first lines instead of with them (on the 2-core machine that last miss was
//! a quarter of a lookup's time; docs/BENCHMARKS.md). This module guesses the offset while the
//! leaf is still being fetched, from two things already at hand:
//!
//! - the **parent's separators** around the key (a level-1 node has just been searched): the
//!   key's position between them, as a fraction of their distance (on the 8-byte heads);
//! - the **shape of the last leaf of the same tree** this thread found a record in: its slot
//!   count `n`, record size `rec` (key + value) and `top`, the heap offset where slot 0's
//!   record ends.
//!
//! A leaf filled in key order (a bulk load, ascending inserts, and every leaf just after a
//! split, which rewrites its records in slot order) with records of one size holds record `i`
//! at `top - (i + 1) * rec`; the guess is slot `round(fraction * n) - 1` and its lines are
//! prefetched in the leaf's home frame. For dense integer keys it is exact. Anything else
//! (records of other sizes, leaves filled out of order, a leaf not in its home frame) costs a
//! few wasted prefetches, never a wrong result: only hints are issued, the lookup itself is
//! unchanged. Measured in one process, switching it on and off every 100 ms (`cargo bench -p
//! shoal-benches --bench value_hint`): +30% lookups at 2M records loaded in order, +23% at
//! 10M, +6% with value sizes spread over 32..160 bytes, +1% with the keys loaded in random
//! order.
//!
//! Shapes are kept per thread and tree (a small direct-mapped table keyed by the tree's root),
//! so trees with different record sizes (TPC-C's tables) do not spoil each other's guesses.
//! Only lookups and in-place updates that found their key teach a shape.

use crate::node;
use shoal_engine::{PageRef, Pid, Worker, PAGE_DATA_SIZE};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether guesses are made (on by default; benchmarks switch it to compare).
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Switch the value hint on or off for the whole process (for measurements: see the module
/// docs). Results never depend on it.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// One tree's leaf shape, as last seen by this thread (`rec == 0`: none yet).
#[derive(Clone, Copy)]
struct Shape {
    root: u64,
    top: u32,
    rec: u32,
    n: u32,
}

const NONE: Shape = Shape {
    root: u64::MAX,
    top: 0,
    rec: 0,
    n: 0,
};

/// Trees remembered per thread (direct-mapped by root).
const WAYS: usize = 8;

thread_local! {
    static SHAPES: [Cell<Shape>; WAYS] = const { [const { Cell::new(NONE) }; WAYS] };
}

#[inline]
fn way(root: Pid) -> usize {
    let r = root.raw();
    (r ^ (r >> 17)) as usize % WAYS
}

/// The key went from level-1 node `p` (of the tree rooted at `root`) to its child slot `i`,
/// page `child`: start loading the lines where the key's record probably is. `p` may be read
/// optimistically (garbage in, a wasted prefetch out).
#[inline]
pub(crate) fn prefetch(w: &Worker, root: Pid, p: PageRef<'_>, i: usize, key: &[u8], child: Pid) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let s = SHAPES.with(|t| t[way(root)].get());
    if s.root != root.raw() || i == 0 || i >= node::count(p) {
        return; // no shape yet, or an edge child (one of its bounds is a fence, not at hand)
    }
    let (lo, hi) = (node::head_of(p, i - 1), node::head_of(p, i));
    if let Some(off) = guess(s, lo, hi, node::head(key)) {
        w.prefetch_range(child, off, s.rec as usize);
    }
}

/// A lookup (or update) of the tree rooted at `root` found its key in slot `i` of leaf `p`
/// (validated or about to be): remember the leaf's shape.
#[inline]
pub(crate) fn learn(root: Pid, p: PageRef<'_>, i: usize) {
    let (off, klen, vlen) = node::slot_info(p, i);
    let shape = shape_of(root.raw(), node::count(p), i, off, klen + vlen);
    SHAPES.with(|t| t[way(root)].set(shape));
}

/// The shape of a leaf of `n` slots whose slot `i` holds a record of `rec` bytes at heap
/// offset `off`.
fn shape_of(root: u64, n: usize, i: usize, off: usize, rec: usize) -> Shape {
    let rec = rec.min(u32::MAX as usize) as u32;
    Shape {
        root,
        top: (off.min(u32::MAX as usize) as u32).saturating_add((i as u32 + 1).saturating_mul(rec)),
        rec,
        n: n.min(u32::MAX as usize) as u32,
    }
}

/// The heap offset of the record of key head `k` in a child bounded by separator heads
/// `lo < k <= hi`, if leaves are shaped like `s`; `None` when that cannot be placed.
fn guess(s: Shape, lo: u64, hi: u64, k: u64) -> Option<usize> {
    if s.rec == 0 || s.n == 0 || !(lo < k && k <= hi) {
        return None; // no shape, or heads too coarse to place the key (long keys sharing 8 bytes)
    }
    let fraction = (k - lo) as f64 / (hi - lo) as f64; // in (0, 1]
    let slot = ((fraction * s.n as f64).round() as u32).clamp(1, s.n) - 1;
    let off = s.top.checked_sub((slot + 1).checked_mul(s.rec)?)? as usize;
    // (prefetches are clamped to the page, so a guess past the data area would only waste)
    (off < PAGE_DATA_SIZE).then_some(off)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::u64_key;
    use crate::node::{NodeMut, NodeRef, KIND_LEAF};

    /// A leaf of keys `first..first + n` with `vlen`-byte values, filled in key order, and the
    /// heap offset of each record.
    fn leaf(
        first: u64,
        n: u64,
        vlen: impl Fn(u64) -> usize,
    ) -> (Box<[u8; PAGE_DATA_SIZE]>, Vec<usize>) {
        let mut b = Box::new([0u8; PAGE_DATA_SIZE]);
        let mut m = NodeMut::new(&mut b);
        m.init(
            KIND_LEAF,
            0,
            Some(&u64_key(first - 1)),
            Some(&u64_key(first + n - 1)),
        );
        for (i, k) in (first..first + n).enumerate() {
            m.insert_at(i, &u64_key(k), &vec![7u8; vlen(k)]);
        }
        let r = NodeRef::new(&b);
        let offs = (0..n as usize)
            .map(|i| r.key(i).as_ptr() as usize - b.as_ptr() as usize)
            .collect();
        (b, offs)
    }

    /// Dense keys, one record size, filled in order: from any slot's shape the guess for every
    /// key is its record's offset exactly, in this leaf and in a neighbour of the same shape.
    #[test]
    fn dense_keys_in_key_order_are_placed_exactly() {
        let (b, offs) = leaf(100, 25, |_| 128);
        let (_, next) = leaf(125, 25, |_| 128);
        let h = |k: u64| node::head(&u64_key(k));
        for (j, &off) in offs.iter().enumerate() {
            let s = shape_of(7, NodeRef::new(&b).count(), j, off, 8 + 128);
            for i in 0..25u64 {
                assert_eq!(
                    guess(s, h(99), h(124), h(100 + i)),
                    Some(offs[i as usize]),
                    "from {j}"
                );
                assert_eq!(guess(s, h(124), h(149), h(125 + i)), Some(next[i as usize]));
            }
        }
    }

    /// Records of other sizes: guesses may miss, but always start inside the data area (a
    /// prefetch is clamped to the page); keys that the separators do not bound, and missing
    /// shapes, give no guess.
    #[test]
    fn guesses_stay_in_the_page_or_are_not_made() {
        let (b, offs) = leaf(1000, 20, |k| 32 + (k as usize * 7919) % 129);
        let n = NodeRef::new(&b).count();
        let h = |k: u64| node::head(&u64_key(k));
        for (j, &off) in offs.iter().enumerate() {
            let rec = NodeRef::new(&b).key(j).len() + NodeRef::new(&b).value(j).len();
            let s = shape_of(7, n, j, off, rec);
            for k in 1000..1020 {
                if let Some(g) = guess(s, h(999), h(1019), h(k)) {
                    assert!(g < PAGE_DATA_SIZE, "slot {j}, key {k}: {g}");
                }
            }
            assert_eq!(
                guess(s, h(999), h(1019), h(999)),
                None,
                "not above the lower bound"
            );
            assert_eq!(
                guess(s, h(999), h(1019), h(1020)),
                None,
                "above the upper bound"
            );
            assert_eq!(guess(s, h(5), h(5), h(5)), None);
        }
        assert_eq!(guess(NONE, h(1), h(9), h(5)), None);
    }
}
