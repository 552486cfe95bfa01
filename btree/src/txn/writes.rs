//! A transaction's own writes, kept until its commit: in (tree, key) order, their keys and
//! values in one byte arena, so that a write allocates nothing once the thread's buffers have
//! grown (they are kept for its next transaction). Malloc and free were a tenth of TPC-C's
//! time with a map of owned keys and values.

use super::ReadAt;
use std::ops::{Bound, Range, RangeBounds};

/// One write: `key` of the tree whose root is `root` gets its change.
#[derive(Debug)]
pub(crate) struct Write {
    pub root: u64,
    key: Range<usize>,
    /// The key's first 8 bytes, zero-padded, big-endian: orders most pairs of writes without
    /// comparing their keys ([`prefix`]).
    prefix: u64,
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
    Add(Vec<Addend>),
}

/// An add to a little-endian integer inside a value ([`Op::Add`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Addend {
    /// Where the integer starts in the value.
    pub at: usize,
    /// Its width in bytes: 4 or 8.
    pub width: usize,
    /// Added with wrap-around (a `u32`'s delta is taken modulo 2^32).
    pub delta: i64,
}

impl Addend {
    pub fn end(&self) -> usize {
        self.at + self.width
    }

    /// Add to the integer in `value` (which holds its bytes).
    pub fn apply(&self, value: &mut [u8]) {
        self.apply_to_part(&mut value[self.at..self.end()]);
    }

    /// Add to the integer whose bytes `b` are.
    pub fn apply_to_part(&self, b: &mut [u8]) {
        debug_assert_eq!(b.len(), self.width);
        match self.width {
            4 => {
                let v = u32::from_le_bytes(b.try_into().expect("4 bytes"));
                b.copy_from_slice(&v.wrapping_add(self.delta as u32).to_le_bytes());
            }
            8 => {
                let v = i64::from_le_bytes(b.try_into().expect("8 bytes"));
                b.copy_from_slice(&v.wrapping_add(self.delta).to_le_bytes());
            }
            w => unreachable!("an integer of {w} bytes"),
        }
    }
}

/// Apply every add of `adds` that lies inside `value` (the others wait for the commit, which
/// refuses them).
pub(crate) fn apply_adds(value: &mut [u8], adds: &[Addend]) {
    let len = value.len();
    for a in adds.iter().filter(|a| a.end() <= len) {
        a.apply(value);
    }
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
    /// Adds to integers in the value, applied at the commit to the value the leaf holds then,
    /// without reading it first: adds to one counter commute, so two transactions adding to
    /// it do not conflict. The key must exist then, with the integers inside its value.
    Add(&'a [Addend]),
}

/// A change handed to [`Writes::set`] (a patch's list is taken over).
pub(crate) enum NewOp<'a> {
    Put(&'a [u8]),
    Remove,
    Patch(Vec<(usize, Vec<u8>)>),
    Add(Vec<Addend>),
}

/// The writes of a transaction, at most one per (tree, key), found by a hash of their key:
/// a transaction reads and writes each of its keys several times (TPC-C's Delivery updates
/// 130 rows), and a binary search of a sorted list cost a tenth of the commit path in
/// comparisons. Sorted only where order matters (the commit, a range read).
#[derive(Debug, Default)]
pub(crate) struct Writes {
    bytes: Vec<u8>,
    /// In the order first written.
    list: Vec<Write>,
    /// Open addressing over `list`: index + 1, 0 for an empty slot; a power of two long, at
    /// least twice as long as `list`.
    table: Vec<u32>,
}

/// The free place of a key without a write, found by [`Writes::vacant`]: valid while no write
/// is added.
pub(crate) struct Vacant {
    slot: usize,
    /// How many writes there were when it was found.
    writes: usize,
}

/// A hash of a tree's root and a key: each 8-byte word of the key folded in through
/// SplitMix64's finalizer, whose every output bit depends on every input bit (a plain
/// multiply carries a key's last bytes only upwards, and keys that differ there, as an
/// order's lines do, filled neighbouring slots: 4.8 probes a lookup instead of 1.5).
fn hash(root: u64, key: &[u8]) -> u64 {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let mut h = mix(root ^ ((key.len() as u64) << 56));
    let words = key.chunks_exact(8);
    let rest = words.remainder();
    for c in words {
        h = mix(h ^ u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    if !rest.is_empty() {
        // (the last bytes, zero-padded to a word)
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        h = mix(h ^ u64::from_le_bytes(word));
    }
    h
}

/// `key`'s first 8 bytes (zero-padded) as a big-endian word: where two keys' prefixes differ,
/// they compare as the keys do (the first byte that differs is a real byte of both keys, or
/// the end of the shorter, padded with a 0 below the other's byte); where they are equal, the
/// keys must be compared.
fn prefix(key: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    let n = key.len().min(8);
    word[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(word)
}

impl Writes {
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Forget every write, keeping the buffers.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.list.clear();
        self.table.clear(); // (rebuilt at the first write, at the size it needs)
    }

    /// The bytes the buffers hold room for (what keeping them costs).
    pub fn capacity_bytes(&self) -> usize {
        self.bytes.capacity()
            + self.list.capacity() * std::mem::size_of::<Write>()
            + self.table.capacity() * 4
    }

    /// The index in `list` of `key`'s write, or the free slot of `table` where it would go.
    fn find(&self, root: u64, key: &[u8]) -> Result<usize, usize> {
        if self.table.is_empty() {
            return Err(usize::MAX);
        }
        let mask = self.table.len() - 1;
        let mut s = hash(root, key) as usize & mask;
        loop {
            match self.table[s] {
                0 => return Err(s),
                i => {
                    let w = &self.list[i as usize - 1];
                    if w.root == root && self.bytes[w.key.clone()] == *key {
                        return Ok(i as usize - 1);
                    }
                    s = (s + 1) & mask;
                }
            }
        }
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
            Change::Add(adds) => Op::Add(adds),
        }
    }

    /// The value a put of `key` (tree `root`) writes, to change in place; `None` if the key
    /// has no write or its write is not a put.
    pub fn put_value_mut(&mut self, root: u64, key: &[u8]) -> Option<&mut [u8]> {
        let i = self.find(root, key).ok()?;
        self.put_at_mut(i)
    }

    /// The adds of `key`'s write (tree `root`) to extend, if its write is an add.
    pub fn adds_mut(&mut self, root: u64, key: &[u8]) -> Option<&mut Vec<Addend>> {
        let i = self.find(root, key).ok()?;
        match &mut self.list[i].change {
            Change::Add(adds) => Some(adds),
            _ => None,
        }
    }

    /// The value of write `i` (as [`Writes::set`] returned it) to change in place, if it is a
    /// put.
    pub fn put_at_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        match &self.list[i].change {
            Change::Put(v) => {
                let v = v.clone();
                Some(&mut self.bytes[v])
            }
            _ => None,
        }
    }

    /// `key` of tree `root` gets `op` (replacing an earlier write of it); the write's index.
    pub fn set(&mut self, root: u64, key: &[u8], op: NewOp<'_>, read_at: Option<ReadAt>) -> usize {
        let change = self.change(op);
        match self.find(root, key) {
            Ok(i) => {
                // (a replaced put's bytes stay in the arena until the transaction ends)
                let w = &mut self.list[i];
                w.change = change;
                w.read_at = read_at;
                i
            }
            Err(free) => self.push(free, root, key, change, read_at),
        }
    }

    /// [`Writes::set`], but a key written before keeps where it was read (and one not
    /// written before was not read): for a write that does not read.
    pub fn set_keeping_read(&mut self, root: u64, key: &[u8], op: NewOp<'_>) -> usize {
        let change = self.change(op);
        match self.find(root, key) {
            Ok(i) => {
                self.list[i].change = change;
                i
            }
            Err(free) => self.push(free, root, key, change, None),
        }
    }

    /// Where `key` of tree `root` would go if it has no write (`None`: it has one), for
    /// [`Writes::put_vacant`] while no write is added meanwhile: one lookup instead of two.
    pub fn vacant(&self, root: u64, key: &[u8]) -> Option<Vacant> {
        let slot = self.find(root, key).err()?;
        Some(Vacant {
            slot,
            writes: self.list.len(),
        })
    }

    /// The first write of `key` (tree `root`), at the place `vacant` found for it; its
    /// index.
    pub fn put_vacant(
        &mut self,
        vacant: Vacant,
        root: u64,
        key: &[u8],
        op: NewOp<'_>,
        read_at: Option<ReadAt>,
    ) -> usize {
        assert_eq!(
            vacant.writes,
            self.list.len(),
            "no write was added since the key's place was found"
        );
        debug_assert!(self.find(root, key).is_err(), "the key has no write");
        let change = self.change(op);
        self.push(vacant.slot, root, key, change, read_at)
    }

    /// `op` as kept (a put's bytes copied into the arena).
    fn change(&mut self, op: NewOp<'_>) -> Change {
        match op {
            NewOp::Put(v) => {
                let v0 = self.bytes.len();
                self.bytes.extend_from_slice(v);
                Change::Put(v0..self.bytes.len())
            }
            NewOp::Remove => Change::Remove,
            NewOp::Patch(ps) => Change::Patch(ps),
            NewOp::Add(adds) => Change::Add(adds),
        }
    }

    /// Add the first write of `key`, whose free slot in `table` is `free` (as `find` gave
    /// it, with the table unchanged since); its index.
    fn push(
        &mut self,
        free: usize,
        root: u64,
        key: &[u8],
        change: Change,
        read_at: Option<ReadAt>,
    ) -> usize {
        let k0 = self.bytes.len();
        self.bytes.extend_from_slice(key);
        self.list.push(Write {
            root,
            key: k0..self.bytes.len(),
            prefix: prefix(key),
            change,
            read_at,
        });
        assert!(
            self.list.len() < u32::MAX as usize,
            "writes are counted in u32"
        );
        if self.list.len() * 2 > self.table.len() {
            self.rehash((self.list.len() * 2).next_power_of_two().max(64));
        } else {
            debug_assert_eq!(self.table[free], 0);
            self.table[free] = self.list.len() as u32;
        }
        self.list.len() - 1
    }

    /// Rebuild `table` with `slots` slots.
    fn rehash(&mut self, slots: usize) {
        debug_assert!(slots.is_power_of_two() && slots >= self.list.len() * 2);
        self.table.clear();
        self.table.resize(slots, 0);
        for i in 0..self.list.len() {
            let w = &self.list[i];
            let Err(s) = self.find(w.root, &self.bytes[w.key.clone()]) else {
                unreachable!("one write per key")
            };
            self.table[s] = i as u32 + 1;
        }
    }

    /// Whether write `a` comes before write `b` in (tree, key) order.
    fn cmp(&self, a: &Write, b: &Write) -> std::cmp::Ordering {
        (a.root, a.prefix)
            .cmp(&(b.root, b.prefix))
            .then_with(|| self.key(a).cmp(self.key(b)))
    }

    /// Every write, in (tree, key) order.
    #[cfg(test)]
    pub fn sorted(&self) -> Vec<&Write> {
        let mut all = Vec::new();
        self.sorted_into(&mut all);
        all
    }

    /// Every write, in (tree, key) order, into `out` (emptied first).
    pub fn sorted_into<'a>(&'a self, out: &mut Vec<&'a Write>) {
        out.clear();
        out.extend(self.list.iter());
        out.sort_unstable_by(|a, b| self.cmp(a, b));
    }

    /// The writes of tree `root` whose keys lie between `lo` and `hi`, in key order.
    pub fn in_range(&self, root: u64, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Vec<&Write> {
        let mut got: Vec<&Write> = self
            .list
            .iter()
            .filter(|w| w.root == root && RangeBounds::<[u8]>::contains(&(lo, hi), self.key(w)))
            .collect();
        got.sort_unstable_by(|a, b| self.cmp(a, b));
        got
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(ws: &Writes, list: &[&Write]) -> Vec<(u64, Vec<u8>)> {
        list.iter().map(|w| (w.root, ws.key(w).to_vec())).collect()
    }

    #[test]
    fn writes_come_in_tree_and_key_order_and_a_second_write_replaces_the_first() {
        let mut ws = Writes::default();
        ws.set(2, b"b", NewOp::Put(b"1"), None);
        ws.set(1, b"z", NewOp::Remove, None);
        ws.set(2, b"a", NewOp::Put(b"2"), None);
        ws.set(2, b"b", NewOp::Put(b"3"), None);
        let all = keys(&ws, &ws.sorted());
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
    fn a_vacant_place_takes_the_first_write_of_its_key_through_table_growth() {
        let mut ws = Writes::default();
        for k in 0..500u32 {
            let key = k.to_be_bytes();
            let v = ws.vacant(2, &key).expect("not written yet");
            let i = ws.put_vacant(v, 2, &key, NewOp::Put(&key), None);
            assert_eq!(ws.key(&ws.list[i]), key);
            assert!(ws.vacant(2, &key).is_none());
        }
        for k in 0..500u32 {
            let key = k.to_be_bytes();
            assert!(matches!(ws.op(ws.get(2, &key).unwrap()), Op::Put(v) if v == key));
        }
        // a write without a read replaces the change, in place
        let i = ws.set_keeping_read(2, &7u32.to_be_bytes(), NewOp::Remove);
        assert_eq!(
            ws.set_keeping_read(2, &7u32.to_be_bytes(), NewOp::Remove),
            i
        );
        assert!(matches!(ws.op(&ws.list[i]), Op::Remove));
        assert_eq!(ws.list.len(), 500);
    }

    #[test]
    #[should_panic(expected = "no write was added")]
    fn a_vacant_place_is_refused_after_another_write() {
        let mut ws = Writes::default();
        let v = ws.vacant(1, b"a").unwrap();
        ws.set(1, b"b", NewOp::Remove, None);
        ws.put_vacant(v, 1, b"a", NewOp::Remove, None);
    }

    #[test]
    fn keys_sort_in_byte_order_whatever_their_lengths_and_zero_bytes() {
        // short keys, keys that are zero-padded prefixes of others, equal first words
        let mut all: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0, 0],
            vec![0; 8],
            vec![0; 9],
            vec![0, 1],
            b"ab".to_vec(),
            b"ab\0".to_vec(),
            b"ab\0\x01".to_vec(),
            b"ab\x01".to_vec(),
            b"abcdefgh".to_vec(),
            b"abcdefgh\0".to_vec(),
            b"abcdefgha".to_vec(),
            b"abcdefgi".to_vec(),
            vec![0xFF; 3],
            vec![1, 0, 0, 0, 0, 0, 0, 0],
            vec![0, 0, 0, 0, 0, 0, 0, 9],
        ];
        for i in 0..64u8 {
            all.push(vec![b'k', 0, 0, 0, 0, 0, 0, i % 4, i]);
        }
        let mut ws = Writes::default();
        for (n, k) in all.iter().rev().enumerate() {
            ws.set(7, k, NewOp::Put(&[n as u8]), None);
        }
        all.sort();
        all.dedup();
        let got: Vec<Vec<u8>> = ws.sorted().iter().map(|w| ws.key(w).to_vec()).collect();
        assert_eq!(got, all);
    }

    #[test]
    fn every_write_of_many_is_found_after_the_table_grows() {
        let mut ws = Writes::default();
        let key = |i: u32| i.to_be_bytes()[..(i % 4 + 1) as usize].to_vec();
        for i in 0..1000u32 {
            ws.set(
                u64::from(i % 3),
                &key(i),
                NewOp::Put(&i.to_le_bytes()),
                None,
            );
        }
        for i in 0..1000u32 {
            let w = ws.get(u64::from(i % 3), &key(i)).expect("found");
            // (short keys repeat: the last write of a (tree, key) wins)
            let Op::Put(v) = ws.op(w) else { panic!() };
            let last = u32::from_le_bytes(v.try_into().unwrap());
            assert_eq!((last % 3, key(last)), (i % 3, key(i)));
        }
        assert!(ws.get(7, &key(1)).is_none());
        let sorted = ws.sorted();
        assert!(sorted.windows(2).all(|p| ws.cmp(p[0], p[1]).is_lt()));
    }

    #[test]
    fn keys_that_differ_in_their_last_byte_spread_over_the_table() {
        // an order's lines: the same 7-byte prefix, the line number last
        let mut ws = Writes::default();
        for o in 0..10u32 {
            for n in 1..=10u8 {
                let mut k = vec![0, 1, 3];
                k.extend_from_slice(&(2100 + o).to_be_bytes());
                k.push(n);
                ws.set(7, &k, NewOp::Remove, None);
            }
        }
        // probes a lookup takes, on average, at this load (100 keys in 256 slots)
        let mask = ws.table.len() - 1;
        let probes: usize = ws
            .list
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let mut s = hash(w.root, ws.key(w)) as usize & mask;
                let mut n = 1;
                while ws.table[s] as usize != i + 1 {
                    s = (s + 1) & mask;
                    n += 1;
                }
                n
            })
            .sum();
        let mean = probes as f64 / ws.list.len() as f64;
        assert!(mean < 2.5, "{mean} probes a lookup");
    }

    #[test]
    fn a_range_of_writes_keeps_to_its_tree_and_its_bounds() {
        let mut ws = Writes::default();
        for (root, k) in [(1, "a"), (2, "a"), (2, "c"), (2, "e"), (3, "a")] {
            ws.set(root, k.as_bytes(), NewOp::Remove, None);
        }
        let r = |lo, hi| keys(&ws, &ws.in_range(2, lo, hi));
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
