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

impl<'w> Range<'w> {
    pub(crate) fn new(tree: BTree, w: &'w Worker, lo: Bound<Vec<u8>>, hi: Bound<Vec<u8>>) -> Self {
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

    /// Copy the next batch from the low end of the uncopied part into `front`.
    fn fill_front(&mut self) -> Result<(), TreeError> {
        let start: &[u8] = match &self.lo {
            Bound::Unbounded => &[],
            Bound::Included(k) | Bound::Excluded(k) => k,
        };
        let (lo, hi) = (&self.lo, &self.hi);
        let mut got: Vec<Entry> = Vec::with_capacity(RANGE_BATCH);
        self.tree
            .scan(self.w, start, Direction::Ascending, |k, v| {
                if matches!(lo, Bound::Excluded(x) if x.as_slice() == k) {
                    return true;
                }
                let inside = match hi {
                    Bound::Unbounded => true,
                    Bound::Included(h) => k <= h.as_slice(),
                    Bound::Excluded(h) => k < h.as_slice(),
                };
                if !inside {
                    return false;
                }
                got.push((k.to_vec(), v.to_vec()));
                got.len() < RANGE_BATCH
            })?;
        if got.len() < RANGE_BATCH {
            self.drained = true;
        }
        if let Some((k, _)) = got.last() {
            self.lo = Bound::Excluded(k.clone());
        }
        self.front.extend(got);
        Ok(())
    }

    /// Copy the next batch from the high end of the uncopied part into `back`.
    fn fill_back(&mut self) -> Result<(), TreeError> {
        // above every key a tree can hold (keys are at most MAX_KEY bytes)
        let top = vec![0xFF; MAX_KEY + 1];
        let start: &[u8] = match &self.hi {
            Bound::Unbounded => &top,
            Bound::Included(k) | Bound::Excluded(k) => k,
        };
        let (lo, hi) = (&self.lo, &self.hi);
        let mut got: Vec<Entry> = Vec::with_capacity(RANGE_BATCH);
        self.tree
            .scan(self.w, start, Direction::Descending, |k, v| {
                if matches!(hi, Bound::Excluded(x) if x.as_slice() == k) {
                    return true;
                }
                let inside = match lo {
                    Bound::Unbounded => true,
                    Bound::Included(l) => k >= l.as_slice(),
                    Bound::Excluded(l) => k > l.as_slice(),
                };
                if !inside {
                    return false;
                }
                got.push((k.to_vec(), v.to_vec()));
                got.len() < RANGE_BATCH
            })?;
        if got.len() < RANGE_BATCH {
            self.drained = true;
        }
        if let Some((k, _)) = got.last() {
            self.hi = Bound::Excluded(k.clone());
        }
        self.back.extend(got);
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
            if let Err(e) = self.fill_front() {
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
            if let Err(e) = self.fill_back() {
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
