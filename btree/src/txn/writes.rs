//! A transaction's own writes, kept until its commit: in (tree, key) order, their keys and
//! values in one byte arena, so that a write allocates nothing once the thread's buffers have
//! grown (they are kept for its next transaction). Malloc and free were a tenth of TPC-C's
//! time with a map of owned keys and values.

use super::ReadAt;
use std::ops::{Bound, Range};

/// One write: `key` of the tree whose root is `root` gets its change.
#[derive(Debug)]
pub(crate) struct Write {
    pub root: u64,
    key: Range<usize>,
    change: Change,
    /// Where the transaction read the key before writing it, if it did: the commit starts
    /// from that leaf instead of descending, while its stamp is unchanged.
    pub read_at: Option<ReadAt>,
}

/// A write's change as kept (a put's bytes in the arena).
#[derive(Debug)]
enum Change {
    Put(Range<usize>),
    Remove,
    Patch(Vec<(usize, Vec<u8>)>),
}

/// A write's change, its bytes borrowed from the write set.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op<'a> {
    Put(&'a [u8]),
    Remove,
    /// New bytes at offsets of the value, applied in order at the commit to the value the
    /// leaf holds then (the rest of it may have changed meanwhile: only the parts read were
    /// validated). Only for values kept in the leaf.
    Patch(&'a [(usize, Vec<u8>)]),
}

/// A change handed to [`Writes::set`] (a patch's list is taken over).
pub(crate) enum NewOp<'a> {
    Put(&'a [u8]),
    Remove,
    Patch(Vec<(usize, Vec<u8>)>),
}

/// The writes of a transaction, at most one per (tree, key), in that order.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    bytes: Vec<u8>,
    list: Vec<Write>,
}

impl Writes {
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Forget every write, keeping the buffers.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.list.clear();
    }

    /// The bytes the buffers hold room for (what keeping them costs).
    pub fn capacity_bytes(&self) -> usize {
        self.bytes.capacity() + self.list.capacity() * std::mem::size_of::<Write>()
    }

    fn find(&self, root: u64, key: &[u8]) -> Result<usize, usize> {
        self.list
            .binary_search_by(|w| (w.root, &self.bytes[w.key.clone()]).cmp(&(root, key)))
    }

    /// The write of `key` in the tree rooted at `root`, if there is one.
    pub fn get(&self, root: u64, key: &[u8]) -> Option<&Write> {
        self.find(root, key).ok().map(|i| &self.list[i])
    }

    pub fn key(&self, w: &Write) -> &[u8] {
        &self.bytes[w.key.clone()]
    }

    pub fn op<'a>(&'a self, w: &'a Write) -> Op<'a> {
        match &w.change {
            Change::Put(v) => Op::Put(&self.bytes[v.clone()]),
            Change::Remove => Op::Remove,
            Change::Patch(ps) => Op::Patch(ps),
        }
    }

    /// The value a put of `key` (tree `root`) writes, to change in place; `None` if the key
    /// has no write or its write is not a put.
    pub fn put_value_mut(&mut self, root: u64, key: &[u8]) -> Option<&mut [u8]> {
        let i = self.find(root, key).ok()?;
        match &self.list[i].change {
            Change::Put(v) => {
                let v = v.clone();
                Some(&mut self.bytes[v])
            }
            _ => None,
        }
    }

    /// `key` of tree `root` gets `op` (replacing an earlier write of it).
    pub fn set(&mut self, root: u64, key: &[u8], op: NewOp<'_>, read_at: Option<ReadAt>) {
        let change = match op {
            NewOp::Put(v) => {
                let v0 = self.bytes.len();
                self.bytes.extend_from_slice(v);
                Change::Put(v0..self.bytes.len())
            }
            NewOp::Remove => Change::Remove,
            NewOp::Patch(ps) => Change::Patch(ps),
        };
        match self.find(root, key) {
            Ok(i) => {
                // (a replaced put's bytes stay in the arena until the transaction ends)
                let w = &mut self.list[i];
                w.change = change;
                w.read_at = read_at;
            }
            Err(i) => {
                let k0 = self.bytes.len();
                self.bytes.extend_from_slice(key);
                self.list.insert(
                    i,
                    Write {
                        root,
                        key: k0..self.bytes.len(),
                        change,
                        read_at,
                    },
                );
            }
        }
        debug_assert!(
            self.list
                .windows(2)
                .all(|p| (p[0].root, self.key(&p[0])) < (p[1].root, self.key(&p[1]))),
            "writes are kept in (tree, key) order, one per key"
        );
    }

    /// Every write, in (tree, key) order.
    pub fn iter(&self) -> std::slice::Iter<'_, Write> {
        self.list.iter()
    }

    /// The writes of tree `root` whose keys lie between `lo` and `hi`, in key order.
    pub fn in_range(&self, root: u64, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> &[Write] {
        let at = |w: &Write| (w.root, &self.bytes[w.key.clone()]);
        let start = self.list.partition_point(|w| match lo {
            Bound::Included(k) => at(w) < (root, k),
            Bound::Excluded(k) => at(w) <= (root, k),
            Bound::Unbounded => w.root < root,
        });
        let end = self.list.partition_point(|w| match hi {
            Bound::Included(k) => at(w) <= (root, k),
            Bound::Excluded(k) => at(w) < (root, k),
            Bound::Unbounded => w.root <= root,
        });
        // (an empty range, its start after its end)
        self.list.get(start..end).unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(ws: &Writes, list: &[Write]) -> Vec<(u64, Vec<u8>)> {
        list.iter().map(|w| (w.root, ws.key(w).to_vec())).collect()
    }

    #[test]
    fn writes_stay_in_tree_and_key_order_and_a_second_write_replaces_the_first() {
        let mut ws = Writes::default();
        ws.set(2, b"b", NewOp::Put(b"1"), None);
        ws.set(1, b"z", NewOp::Remove, None);
        ws.set(2, b"a", NewOp::Put(b"2"), None);
        ws.set(2, b"b", NewOp::Put(b"3"), None);
        let all: Vec<_> = ws.iter().map(|w| (w.root, ws.key(w).to_vec())).collect();
        assert_eq!(
            all,
            vec![(1, b"z".to_vec()), (2, b"a".to_vec()), (2, b"b".to_vec())]
        );
        assert!(matches!(ws.op(ws.get(2, b"b").unwrap()), Op::Put(b"3")));
        assert!(matches!(ws.op(ws.get(1, b"z").unwrap()), Op::Remove));
        assert!(ws.get(1, b"b").is_none());
        ws.put_value_mut(2, b"a").unwrap()[0] = b'9';
        assert!(matches!(ws.op(ws.get(2, b"a").unwrap()), Op::Put(b"9")));
        assert!(ws.put_value_mut(1, b"z").is_none());
        ws.clear();
        assert!(ws.is_empty() && ws.get(2, b"a").is_none());
    }

    #[test]
    fn a_range_of_writes_keeps_to_its_tree_and_its_bounds() {
        let mut ws = Writes::default();
        for (root, k) in [(1, "a"), (2, "a"), (2, "c"), (2, "e"), (3, "a")] {
            ws.set(root, k.as_bytes(), NewOp::Remove, None);
        }
        let r = |lo, hi| keys(&ws, ws.in_range(2, lo, hi));
        let k = |s: &'static str| (2u64, s.as_bytes().to_vec());
        use Bound::*;
        assert_eq!(r(Unbounded, Unbounded), vec![k("a"), k("c"), k("e")]);
        assert_eq!(r(Excluded(b"a"), Included(b"e")), vec![k("c"), k("e")]);
        assert_eq!(r(Included(b"b"), Excluded(b"e")), vec![k("c")]);
        assert_eq!(r(Included(b"d"), Excluded(b"b")), vec![]);
        assert_eq!(r(Included(b"c"), Included(b"c")), vec![k("c")]);
        assert_eq!(r(Excluded(b"c"), Excluded(b"c")), vec![]);
    }
}
