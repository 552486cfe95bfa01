//! [`Range`]: a Rust iterator over the entries of a key range, in both directions.
//!
//! The iterator holds no latch between calls: it copies a batch of entries (at most
//! [`RANGE_BATCH`]) out of the tree with a short [`BTree::scan`], hands them out, and scans
//! again from just past the last key it copied when they run out. The caller may therefore do
//! anything between two `next()` calls, writing to the same tree included.
//!
//! It is not a snapshot: an entry changed while the iteration runs may be seen before or
//! after the change, or (if inserted or removed meanwhile) not at all; every key is yielded
//! at most once, in order, and within the range. Both ends work at once
//! ([`DoubleEndedIterator`]): the front takes from the low end of what neither end has copied
//! yet, the back from the high end, so no entry comes out twice.

use crate::error::TreeError;
use crate::node::MAX_KEY;
use crate::tree::{BTree, Direction};
use shoal_engine::Worker;
use std::collections::VecDeque;
use std::ops::Bound;

/// Entries a [`Range`] copies out of the tree per scan.
pub const RANGE_BATCH: usize = 64;

/// An entry: key and value, copied out of the tree.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Iterator over `(key, value)` of a key range; see the module docs. Made by
/// [`BTree::range`] and [`BTree::iter`].
pub struct Range<'w> {
    tree: BTree,
    w: &'w Worker,
    /// What neither end has copied yet lies between `lo` and `hi`.
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    /// Copied from the low end, ascending (pop from the front).
    front: VecDeque<Entry>,
    /// Copied from the high end, descending (pop from the front).
    back: VecDeque<Entry>,
    /// Nothing is left between `lo` and `hi`.
    drained: bool,
    failed: bool,
}

impl BTree {
    /// Iterate over the entries whose keys lie in `range` (`..`, `a..b`, `a..=b`, `a..`, ...)
    /// in key order; `.rev()` goes from the high end, and both ends may be taken at once. No
    /// latch is held between items, so the loop body may write to this tree. Not a snapshot:
    /// see [`crate::range`].
    ///
    /// ```no_run
    /// # fn f(t: &shoal_btree::BTree, w: &shoal_engine::Worker) -> Result<(), shoal_btree::TreeError> {
    /// for entry in t.range(w, b"a".as_slice()..b"m".as_slice()) {
    ///     let (key, value) = entry?;
    ///     println!("{key:?} = {value:?}");
    /// }
    /// // the last ten keys, largest first
    /// let last: Vec<_> = t.iter(w).rev().take(10).collect::<Result<_, _>>()?;
    /// # Ok(()) }
    /// ```
    pub fn range<'w, K: AsRef<[u8]>>(
        &self,
        w: &'w Worker,
        range: impl std::ops::RangeBounds<K>,
    ) -> Range<'w> {
        let own = |b: std::ops::Bound<&K>| b.map(|k| k.as_ref().to_vec());
        Range::new(*self, w, own(range.start_bound()), own(range.end_bound()))
    }

    /// Iterate over every entry (see [`BTree::range`]).
    pub fn iter<'w>(&self, w: &'w Worker) -> Range<'w> {
        self.range::<&[u8]>(w, ..)
    }
}

impl<'w> Range<'w> {
    fn new(tree: BTree, w: &'w Worker, lo: Bound<Vec<u8>>, hi: Bound<Vec<u8>>) -> Self {
        let empty = match (&lo, &hi) {
            (Bound::Included(a), Bound::Included(b)) => a > b,
            (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
            | (Bound::Excluded(a), Bound::Included(b)) => a >= b,
            _ => false,
        };
        Range {
            tree,
            w,
            lo,
            hi,
            front: VecDeque::new(),
            back: VecDeque::new(),
            drained: empty,
            failed: false,
        }
    }

    /// Copy the next batch from the low end (`back`: the high end) of the uncopied part.
    fn fill(&mut self, back: bool) -> Result<(), TreeError> {
        // above every key a tree can hold (keys are at most MAX_KEY bytes)
        let top = vec![0xFF; MAX_KEY + 1];
        // scan from this end towards the other one
        let (from, to) = if back {
            (&self.hi, &self.lo)
        } else {
            (&self.lo, &self.hi)
        };
        let start: &[u8] = match from {
            Bound::Unbounded if back => &top,
            Bound::Unbounded => &[],
            Bound::Included(k) | Bound::Excluded(k) => k,
        };
        let dir = if back {
            Direction::Descending
        } else {
            Direction::Ascending
        };
        // whether `k` has not passed the far bound `to`
        let inside = |k: &[u8]| match to {
            Bound::Unbounded => true,
            Bound::Included(b) if back => k >= b.as_slice(),
            Bound::Excluded(b) if back => k > b.as_slice(),
            Bound::Included(b) => k <= b.as_slice(),
            Bound::Excluded(b) => k < b.as_slice(),
        };
        let mut got: Vec<Entry> = Vec::with_capacity(RANGE_BATCH);
        self.tree.scan(self.w, start, dir, |k, v| {
            if matches!(from, Bound::Excluded(x) if x.as_slice() == k) {
                return true; // the near bound itself, excluded
            }
            if !inside(k) {
                return false;
            }
            got.push((k.to_vec(), v.to_vec()));
            got.len() < RANGE_BATCH
        })?;
        if got.len() < RANGE_BATCH {
            self.drained = true;
        }
        if let Some((k, _)) = got.last() {
            let past = Bound::Excluded(k.clone());
            if back {
                self.hi = past;
            } else {
                self.lo = past;
            }
        }
        if back {
            self.back.extend(got);
        } else {
            self.front.extend(got);
        }
        Ok(())
    }

    fn fail(&mut self, e: TreeError) -> Option<Result<Entry, TreeError>> {
        self.failed = true;
        Some(Err(e))
    }
}

impl Iterator for Range<'_> {
    type Item = Result<Entry, TreeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.front.is_empty() && !self.drained {
            if let Err(e) = self.fill(false) {
                return self.fail(e);
            }
        }
        // once nothing is left uncopied, the back's batch continues the front
        self.front
            .pop_front()
            .or_else(|| self.back.pop_back())
            .map(Ok)
    }
}

impl DoubleEndedIterator for Range<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.back.is_empty() && !self.drained {
            if let Err(e) = self.fill(true) {
                return self.fail(e);
            }
        }
        self.back
            .pop_front()
            .or_else(|| self.front.pop_back())
            .map(Ok)
    }
}

impl std::iter::FusedIterator for Range<'_> {}
