//! The B-link tree's node format: a slotted page with fence keys and a right-sibling link.
//!
//! ```text
//! header (40 bytes)
//!  0 kind      u8    3 = leaf, 4 = inner (0 = not a node: fresh or foreign page)
//!  2 count     u16   number of slots
//!  4 heap      u16   lowest heap offset in use (the heap grows down from PAGE_DATA_SIZE)
//!  6 dead      u16   heap bytes freed by removals (reclaimed by compaction)
//!  8 right     u64   right sibling's pid (B-link), u64::MAX = none
//! 16 upper     u64   inner: child for keys greater than every separator
//! 24 lower fence: off u16, len u16     keys in this node are  > lower fence (if present)
//! 28 upper fence: off u16, len u16     keys in this node are <= upper fence (if present)
//! 32 flags     u8    bit 0: has lower fence, bit 1: has upper fence
//! 34 level     u16   0 for leaves
//! 36 last      u16   slot of the last insert (sequential-insert detection for splits)
//! 38 before    u16   slot of the insert before it (shifted by later inserts before it: two
//!                    interleaved ascending runs each stay recognisable)
//! slots (sorted by key; n = count): three arrays of n 8-byte entries, from offset 40
//!  40          heads    u64 each: first 8 key bytes, big endian, zero padded: most
//!                       comparisons end here, so a search reads only this dense array
//!  40 + 8n     infos    off u16 (heap offset of key bytes, followed by value bytes), klen u16,
//!                       vlen u16 (0 in inner nodes), flags u16 (leaves: bit 0 = the value is
//!                       a reference to overflow pages, see `crate::overflow`)
//!  40 + 16n    children u64 each: inner nodes' child pids; unused in leaves
//! ```
//!
//! A search in an inner node loads only the heads and the children (two thirds of the slot
//! bytes; the infos are needed only to compare whole keys whose heads are equal), a leaf search
//! the heads and the infos. Inserting or removing a slot moves the arrays behind it by 8 or
//! 16 bytes (writers work on a private copy of the page anyway).
//!
//! Inner node semantics: slot i's child holds keys in `(key[i-1], key[i]]`; `upper` holds keys
//! greater than the last separator.
//!
//! Reading functions take a [`PageRef`] and are *total*: on a page that changes under an
//! optimistic reader they return garbage (counts are clamped, reads out of range are zero)
//! but never fault or loop unboundedly; callers validate before trusting results. Writing
//! functions work on a private copy of the page (`ExclusiveGuard::modify`).

use byteorder::{ByteOrder, LittleEndian};
use shoal_engine::{PageRef, PAGE_DATA_SIZE};
use std::cmp::Ordering;
use std::ops::{Deref, DerefMut};

/// Node kinds. (1 and 2 were nodes with interleaved 24-byte slots, before 2026-11-22: pages
/// of that format are "not a node" now.)
pub const KIND_LEAF: u8 = 3;
pub const KIND_INNER: u8 = 4;
pub const NO_PAGE: u64 = u64::MAX;

const KIND: usize = 0;
const COUNT: usize = 2;
const HEAP: usize = 4;
const DEAD: usize = 6;
const RIGHT: usize = 8;
const UPPER: usize = 16;
const LOW_OFF: usize = 24;
const LOW_LEN: usize = 26;
const UP_OFF: usize = 28;
const UP_LEN: usize = 30;
const FLAGS: usize = 32;
const LEVEL: usize = 34;
const LAST_INSERT: usize = 36;
const PREVIOUS_INSERT: usize = 38;
pub const HEADER: usize = 40;
pub const SLOT: usize = 24;
const MAX_SLOTS: usize = (PAGE_DATA_SIZE - HEADER) / SLOT;

/// Longest key the tree accepts.
pub const MAX_KEY: usize = 256;
/// Longest record (key + value) a leaf holds; a longer value goes to overflow pages. YCSB's
/// default record (10 fields of 100 bytes, a key of up to 24 bytes) fits.
pub const MAX_RECORD: usize = 1024;

// Why every record up to MAX_RECORD goes in: an insert that finds no room splits the leaf and
// tries again, and a split leaves at least one entry in each half, so the leaf that takes the
// key holds fewer entries after every split until it holds one. A leaf of one entry has room
// for a second with both fences at their longest (replacing the one entry needs less).
const _: () = assert!(HEADER + 2 * MAX_KEY + 2 * (SLOT + MAX_RECORD) <= PAGE_DATA_SIZE);

/// The 8-byte big-endian head of a key, zero padded.
#[inline]
pub fn head(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

// ---------------------------------------------------------------------------------------------
// Reading (any guard; total on garbage)

#[inline]
pub fn kind(p: PageRef<'_>) -> u8 {
    p.u8(KIND)
}
#[inline]
pub fn count(p: PageRef<'_>) -> usize {
    (p.u16(COUNT) as usize).min(MAX_SLOTS)
}
#[inline]
pub fn right(p: PageRef<'_>) -> u64 {
    p.u64(RIGHT)
}
#[inline]
pub fn level(p: PageRef<'_>) -> u16 {
    p.u16(LEVEL)
}
/// Offset of slot `i`'s head.
#[inline]
fn head_at(i: usize) -> usize {
    HEADER + 8 * i
}
/// Offset of slot `i`'s info (off, klen, vlen) in a node of `n` slots.
#[inline]
fn info_at(n: usize, i: usize) -> usize {
    HEADER + 8 * n + 8 * i
}
/// Offset of slot `i`'s child pid in a node of `n` slots.
#[inline]
fn child_at(n: usize, i: usize) -> usize {
    HEADER + 16 * n + 8 * i
}
/// Slot `i`'s info: (heap offset of its key, key length, value length), read as one word.
#[inline]
fn info(p: PageRef<'_>, i: usize) -> (usize, usize, usize) {
    let w = p.u64(info_at(count(p), i));
    let f = |k: u32| (w >> (16 * k)) as u16 as usize;
    (f(0), f(1), f(2))
}
#[inline]
pub fn key_len(p: PageRef<'_>, i: usize) -> usize {
    info(p, i).1
}
/// Slot `i`'s (heap offset, key length, value length).
#[inline]
pub fn slot_info(p: PageRef<'_>, i: usize) -> (usize, usize, usize) {
    info(p, i)
}
/// Flag of a leaf slot: its value bytes are a reference to overflow pages.
pub const FLAG_OVERFLOW: u16 = 1;
/// Bytes of such a reference (`crate::overflow::ValueRef`).
pub const OVERFLOW_REF_LEN: usize = 16;

/// Slot `i`'s flags (leaves; see [`FLAG_OVERFLOW`]).
#[inline]
pub fn val_flags(p: PageRef<'_>, i: usize) -> u16 {
    let n = count(p);
    if i >= n {
        return 0;
    }
    p.u16(info_at(n, i) + 6)
}

/// Slot `i`'s head.
#[inline]
pub fn head_of(p: PageRef<'_>, i: usize) -> u64 {
    p.u64(head_at(i))
}
/// Offset and length of value `i`'s bytes (leaves): they follow the key in the heap.
#[inline]
fn value_at(p: PageRef<'_>, i: usize) -> (usize, usize) {
    let (off, klen, vlen) = info(p, i);
    (off + klen, vlen)
}
/// Offset of value `i`'s bytes (leaves).
#[inline]
pub fn value_offset(p: PageRef<'_>, i: usize) -> usize {
    value_at(p, i).0
}

/// Copy key `i` into `out`.
pub fn key_into(p: PageRef<'_>, i: usize, out: &mut Vec<u8>) {
    let (off, klen, _) = info(p, i);
    let n = klen.min(MAX_KEY);
    out.resize(n, 0);
    p.read(off, out);
}

/// Append key `i` to `out`.
pub fn key_append(p: PageRef<'_>, i: usize, out: &mut Vec<u8>) {
    let (off, klen, _) = info(p, i);
    let at = out.len();
    out.resize(at + klen.min(MAX_KEY), 0);
    p.read(off, &mut out[at..]);
}

/// Copy value `i` into `out`.
pub fn value_into(p: PageRef<'_>, i: usize, out: &mut Vec<u8>) {
    let (off, n) = value_at(p, i);
    let n = n.min(PAGE_DATA_SIZE);
    // The value's lines are usually not cached yet: start loading all of them at once rather
    // than one after the other as the copy reaches them.
    p.prefetch(off, n);
    out.resize(n, 0);
    p.read(off, out);
}

/// The bytes of `part` that a value of `len` bytes holds: `part` clipped to `0..len` (empty
/// when it starts past the end, or ends before it starts).
pub fn clip(part: &std::ops::Range<usize>, len: usize) -> std::ops::Range<usize> {
    let from = part.start.min(len);
    from..part.end.clamp(from, len)
}

/// Copy bytes `part` of value `i` (clipped to the value: a part past its end is shorter or
/// empty) into `out`, replacing its contents.
pub fn value_part_into(p: PageRef<'_>, i: usize, part: &std::ops::Range<usize>, out: &mut Vec<u8>) {
    let (off, n) = value_at(p, i);
    let n = n.min(PAGE_DATA_SIZE);
    let r = clip(part, n);
    out.clear();
    out.resize(r.len(), 0);
    p.read(off + r.start, out);
}

/// Append value `i` to `out` (as [`value_into`], without replacing what `out` holds).
pub fn value_append(p: PageRef<'_>, i: usize, out: &mut Vec<u8>) {
    let (off, n) = value_at(p, i);
    let n = n.min(PAGE_DATA_SIZE);
    p.prefetch(off, n);
    let at = out.len();
    out.resize(at + n, 0);
    p.read(off, &mut out[at..]);
}

/// Hint: the node will be searched soon (reads kind and count, so the header line should be on
/// its way already): inner nodes need their heads and children, leaves their heads and infos.
#[inline]
pub fn prefetch_slots(p: PageRef<'_>) {
    let n = count(p);
    if kind(p) == KIND_INNER {
        p.prefetch(head_at(0), 8 * n);
        p.prefetch(child_at(n, 0), 8 * n);
    } else {
        p.prefetch(head_at(0), 16 * n);
    }
}

/// Hint: value `i` will be copied soon.
#[inline]
pub fn prefetch_value(p: PageRef<'_>, i: usize) {
    let (off, n) = value_at(p, i);
    p.prefetch(off, n);
}

/// Hint: bytes `part` of value `i` will be copied soon ([`value_part_into`]).
#[inline]
pub fn prefetch_value_part(p: PageRef<'_>, i: usize, part: &std::ops::Range<usize>) {
    let (off, n) = value_at(p, i);
    let r = clip(part, n);
    p.prefetch(off + r.start, r.len());
}

/// Child pid of inner slot `i`, or the upper child for `i == count`.
#[inline]
pub fn child(p: PageRef<'_>, i: usize) -> u64 {
    let n = count(p);
    if i >= n {
        p.u64(UPPER)
    } else {
        p.u64(child_at(n, i))
    }
}

/// Compare key `i` with `key`, whose 8-byte heads are equal (the caller compared them).
#[inline]
fn cmp_same_head(p: PageRef<'_>, i: usize, key: &[u8]) -> Ordering {
    let (off, kl, _) = info(p, i);
    if kl <= 8 && key.len() <= 8 {
        // equal zero-padded heads: the shorter key is the smaller
        kl.cmp(&key.len())
    } else {
        p.compare(off, kl.min(MAX_KEY), key)
    }
}

/// First slot whose key is >= `key`, and whether it is equal.
///
/// A branch-free binary search over the slots' 8-byte heads (the probe sequence depends on the
/// data, so a branchy search mispredicts about every other probe) finds the first slot whose
/// head is >= the key's; a short forward scan over the slots whose head equals the key's then
/// compares whole keys. Heads order like keys (big-endian, zero padded), so the first slot with
/// head >= the key's head is where the keys >= `key` start.
pub fn lower_bound(p: PageRef<'_>, key: &[u8]) -> (usize, bool) {
    let h = head(key);
    let n = count(p);
    // Binary search probes lines all over the slot array; load them all at once rather than
    // one dependent miss per probe. (Measured on the 2-core machine: prefetching only the
    // probed lines, or only the few lines a hint table points at, is slower: the whole arrays
    // of the inner nodes stay cached when every visit touches all their lines.)
    prefetch_slots(p);
    let (mut base, mut len) = (0usize, n);
    while len > 1 {
        let half = len / 2;
        let mid = base + half;
        // `mid - 1` is the last slot of the lower half: if its head is still below `h`, the
        // answer lies in the upper half.
        base = std::hint::select_unpredictable(p.u64(head_at(mid - 1)) < h, mid, base);
        len -= half;
    }
    // `base` is the only candidate left in [base, base + len): step past it if it is below.
    let mut i = base + usize::from(len == 1 && p.u64(head_at(base)) < h);
    // A changing page may hold unsorted garbage: every step below is bounded by `n`.
    while i < n && p.u64(head_at(i)) == h {
        match cmp_same_head(p, i, key) {
            Ordering::Less => i += 1,
            Ordering::Equal => return (i, true),
            Ordering::Greater => return (i, false),
        }
    }
    (i, false)
}

/// The lower (`upper == false`) or upper fence key, if the node has one.
pub fn fence(p: PageRef<'_>, upper: bool) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    fence_into(p, upper, &mut v).then_some(v)
}

/// [`fence`] into `out` (its bytes replaced), without allocating once `out` has room:
/// whether the node has that fence (`out` is left empty if not).
pub fn fence_into(p: PageRef<'_>, upper: bool, out: &mut Vec<u8>) -> bool {
    out.clear();
    let bit = if upper { 2 } else { 1 };
    if p.u8(FLAGS) & bit == 0 {
        return false;
    }
    let (o, l) = if upper {
        (UP_OFF, UP_LEN)
    } else {
        (LOW_OFF, LOW_LEN)
    };
    out.resize((p.u16(l) as usize).min(MAX_KEY), 0);
    p.read(p.u16(o) as usize, out);
    true
}

/// Whether `p` is a leaf whose key range holds `key`: above its lower fence and at most its
/// upper one (a node without a fence is open on that side). Compared in place, without
/// copying the fences out; total on garbage (a torn optimistic read gives a wrong answer that
/// the caller's validation then rejects).
pub fn covers(p: PageRef<'_>, key: &[u8]) -> bool {
    use std::cmp::Ordering::Less;
    if kind(p) != KIND_LEAF {
        return false;
    }
    let flags = p.u8(FLAGS);
    let fence = |o, l| (p.u16(o) as usize, (p.u16(l) as usize).min(MAX_KEY));
    let above_lower = flags & 1 == 0 || {
        let (o, l) = fence(LOW_OFF, LOW_LEN);
        p.compare(o, l, key) == Less
    };
    above_lower
        && (flags & 2 == 0 || {
            let (o, l) = fence(UP_OFF, UP_LEN);
            p.compare(o, l, key) != Less
        })
}

/// Free bytes available for new slots and records (after compaction).
pub fn free_space(p: PageRef<'_>) -> usize {
    let used_slots = HEADER + count(p) * SLOT;
    (p.u16(HEAP) as usize).saturating_sub(used_slots) + p.u16(DEAD) as usize
}

/// Bytes in use: header, slots, fences and live keys and values.
pub fn used(p: PageRef<'_>) -> usize {
    PAGE_DATA_SIZE.saturating_sub(free_space(p))
}

/// Whether a node uses less than a quarter of its page: removes then try to merge it with a
/// neighbour (a merged node is at most full, so a node must lose three quarters of a page
/// again before it is merged again: no merge/split ping-pong).
pub fn is_underfull(p: PageRef<'_>) -> bool {
    used(p) < PAGE_DATA_SIZE / 4
}

/// Bytes the merge of neighbours `left` and `right` of `kind` would use, where `sep_len` is
/// the length of the key that separates them in their parent (left's upper and right's lower
/// fence). The merged node keeps one header, left's lower and right's upper fence; an inner
/// merge pulls the separator down as the entry of left's upper child.
pub fn merged_size(kind: u8, left: PageRef<'_>, right: PageRef<'_>, sep_len: usize) -> usize {
    let both = used(left) + used(right);
    let pulled_down = if kind == KIND_INNER {
        SLOT + sep_len
    } else {
        0
    };
    (both + pulled_down).saturating_sub(HEADER + 2 * sep_len)
}

/// Bytes an entry needs.
pub fn entry_space(klen: usize, vlen: usize) -> usize {
    SLOT + klen + vlen
}

/// Check that a page image is a well-formed node, so that [`NodeMut`] may read it without
/// going out of bounds, and that its byte accounting is exact: kind and counts in range, slots,
/// keys, values and fences inside the heap and not overlapping, each slot's head equal to its
/// key's, key and record sizes within [`MAX_KEY`] and [`MAX_RECORD`], and heap bytes = fences +
/// live keys and values + dead bytes. For the structural verifier (`crate::verify`) and
/// `shoal inspect`; the operations trust the pages they wrote.
pub fn check_layout(b: &[u8; PAGE_DATA_SIZE]) -> Result<(), String> {
    let kind = b[KIND];
    if kind != KIND_LEAF && kind != KIND_INNER {
        return Err(format!("node kind {kind} (not a leaf or an inner node)"));
    }
    let count = g16(b, COUNT);
    let heap = g16(b, HEAP);
    if count > MAX_SLOTS {
        return Err(format!("{count} slots (at most {MAX_SLOTS} fit a page)"));
    }
    if heap > PAGE_DATA_SIZE || heap < HEADER + count * SLOT {
        return Err(format!(
            "heap starts at {heap}, outside {}..={PAGE_DATA_SIZE}",
            HEADER + count * SLOT
        ));
    }
    // (offset, length, what) of every heap object
    let mut objects: Vec<(usize, usize, String)> = Vec::with_capacity(count + 2);
    for (bit, off, len, what) in [(1, LOW_OFF, LOW_LEN, "lower"), (2, UP_OFF, UP_LEN, "upper")] {
        if b[FLAGS] & bit != 0 {
            let len = g16(b, len);
            if len > MAX_KEY {
                return Err(format!("{what} fence of {len} bytes (at most {MAX_KEY})"));
            }
            objects.push((g16(b, off), len, format!("{what} fence")));
        }
    }
    for i in 0..count {
        let s = info_at(count, i);
        let (off, klen, vlen) = (g16(b, s), g16(b, s + 2), g16(b, s + 4));
        if klen > MAX_KEY || klen + vlen > MAX_RECORD {
            return Err(format!(
                "slot {i}: key {klen} and value {vlen} bytes (too long)"
            ));
        }
        if kind == KIND_INNER && vlen != 0 {
            return Err(format!("inner slot {i} has a {vlen}-byte value"));
        }
        let flags = g16(b, s + 6) as u16;
        if kind == KIND_INNER && flags != 0 || flags & !FLAG_OVERFLOW != 0 {
            return Err(format!("slot {i} has flags {flags:#x}"));
        }
        if flags & FLAG_OVERFLOW != 0 && vlen != OVERFLOW_REF_LEN {
            return Err(format!(
                "slot {i} refers to overflow pages with {vlen} bytes (a reference has \
                 {OVERFLOW_REF_LEN})"
            ));
        }
        objects.push((off, klen + vlen, format!("slot {i}")));
    }
    let mut live = 0;
    for (off, len, what) in &objects {
        if *off < heap || off + len > PAGE_DATA_SIZE {
            return Err(format!(
                "{what}: bytes {off}..{} outside the heap {heap}..{PAGE_DATA_SIZE}",
                off + len
            ));
        }
        live += len;
    }
    // an empty record (empty key, empty value) takes no bytes: it overlaps nothing
    objects.retain(|o| o.1 > 0);
    objects.sort_unstable_by_key(|o| o.0);
    for pair in objects.windows(2) {
        if pair[0].0 + pair[0].1 > pair[1].0 {
            return Err(format!("{} overlaps {}", pair[0].2, pair[1].2));
        }
    }
    for i in 0..count {
        let s = info_at(count, i);
        let key = &b[g16(b, s)..][..g16(b, s + 2)];
        if g64(b, head_at(i)) != head(key) {
            return Err(format!("slot {i}: the head does not match the key"));
        }
    }
    let dead = g16(b, DEAD);
    if PAGE_DATA_SIZE - heap != live + dead {
        return Err(format!(
            "heap accounting: {} heap bytes, {live} live + {dead} dead",
            PAGE_DATA_SIZE - heap
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Nodes in plain memory: edited in a private copy of the page (`ExclusiveGuard::modify`), or
// read in place (a guard's `data()`, a page image)

/// A node in plain memory: [`NodeMut`] edits a private copy of a page, [`NodeRef`] reads one
/// (or a page's data area under a shared or exclusive guard).
pub struct Node<B> {
    b: B,
}
pub type NodeMut<'a> = Node<&'a mut [u8; PAGE_DATA_SIZE]>;
pub type NodeRef<'a> = Node<&'a [u8; PAGE_DATA_SIZE]>;

fn g16(b: &[u8], o: usize) -> usize {
    u16::from_le_bytes([b[o], b[o + 1]]) as usize
}
fn s16(b: &mut [u8], o: usize, v: usize) {
    debug_assert!(v <= u16::MAX as usize);
    b[o..o + 2].copy_from_slice(&(v as u16).to_le_bytes());
}
fn g64(b: &[u8], o: usize) -> u64 {
    LittleEndian::read_u64(&b[o..])
}
fn s64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// An entry of a node (used when redistributing entries in splits): key, value, flags,
/// borrowed from the node's bytes (a split takes a copy of the page first).
pub type Entry<'a> = (&'a [u8], &'a [u8], u16);

impl<'a> NodeMut<'a> {
    pub fn new(b: &'a mut [u8; PAGE_DATA_SIZE]) -> Self {
        Node { b }
    }
}

impl<'a> NodeRef<'a> {
    pub fn new(b: &'a [u8; PAGE_DATA_SIZE]) -> Self {
        Node { b }
    }

    /// A view of a page's data area as held by a shared or exclusive guard (`data()`).
    pub fn of(data: &'a [u8]) -> Self {
        Node {
            b: data
                .try_into()
                .expect("a page's data area is PAGE_DATA_SIZE bytes"),
        }
    }
}

impl<B: Deref<Target = [u8; PAGE_DATA_SIZE]>> Node<B> {
    pub fn count(&self) -> usize {
        g16(&self.b[..], COUNT)
    }

    pub fn kind(&self) -> u8 {
        self.b[KIND]
    }

    pub fn level(&self) -> u16 {
        g16(&self.b[..], LEVEL) as u16
    }

    pub fn right(&self) -> u64 {
        g64(&self.b[..], RIGHT)
    }

    pub fn upper_child(&self) -> u64 {
        g64(&self.b[..], UPPER)
    }

    fn fence(&self, upper: bool) -> Option<Vec<u8>> {
        let bit = if upper { 2 } else { 1 };
        if self.b[FLAGS] & bit == 0 {
            return None;
        }
        let (o, l) = if upper {
            (UP_OFF, UP_LEN)
        } else {
            (LOW_OFF, LOW_LEN)
        };
        let (o, l) = (g16(&self.b[..], o), g16(&self.b[..], l));
        Some(self.b[o..o + l].to_vec())
    }

    pub fn key(&self, i: usize) -> &[u8] {
        let s = info_at(self.count(), i);
        let o = g16(&self.b[..], s);
        &self.b[o..o + g16(&self.b[..], s + 2)]
    }

    /// Leaves: the value bytes. Inner nodes: the child pid (8 bytes, in the children array).
    pub fn value(&self, i: usize) -> &[u8] {
        let n = self.count();
        if self.kind() == KIND_INNER {
            let c = child_at(n, i);
            return &self.b[c..c + 8];
        }
        let s = info_at(n, i);
        let o = g16(&self.b[..], s) + g16(&self.b[..], s + 2);
        &self.b[o..o + g16(&self.b[..], s + 4)]
    }

    pub fn entries(&self) -> Vec<Entry<'_>> {
        (0..self.count())
            .map(|i| (self.key(i), self.value(i), self.flags(i)))
            .collect()
    }

    /// Slot `i`'s flags (leaves; see [`FLAG_OVERFLOW`]).
    pub fn flags(&self, i: usize) -> u16 {
        if self.kind() == KIND_INNER {
            return 0;
        }
        g16(&self.b[..], info_at(self.count(), i) + 6) as u16
    }

    fn free_contiguous(&self) -> usize {
        g16(&self.b[..], HEAP) - (HEADER + self.count() * SLOT)
    }

    pub fn free_space(&self) -> usize {
        self.free_contiguous() + g16(&self.b[..], DEAD)
    }

    /// Position of the first key >= `key`, and whether it is equal.
    pub fn lower_bound(&self, key: &[u8]) -> (usize, bool) {
        let (mut lo, mut hi) = (0, self.count());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid).cmp(key) {
                Ordering::Less => lo = mid + 1,
                Ordering::Equal => return (mid, true),
                Ordering::Greater => hi = mid,
            }
        }
        (lo, false)
    }

    /// Whether an entry of this size fits (possibly after compaction).
    pub fn fits(&self, klen: usize, vlen: usize) -> bool {
        self.free_space() >= entry_space(klen, vlen)
    }

    /// Slots of the two most recent inserts, newest first.
    pub fn last_inserts(&self) -> [usize; 2] {
        [
            g16(&self.b[..], LAST_INSERT),
            g16(&self.b[..], PREVIOUS_INSERT),
        ]
    }

    pub fn child(&self, i: usize) -> u64 {
        if i == self.count() {
            self.upper_child()
        } else {
            g64(self.value(i), 0)
        }
    }

    pub fn fences(&self) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        (self.fence(false), self.fence(true))
    }
}

impl<B: DerefMut<Target = [u8; PAGE_DATA_SIZE]>> Node<B> {
    /// Reset to an empty node.
    pub fn init(&mut self, kind: u8, level: u16, lower: Option<&[u8]>, upper: Option<&[u8]>) {
        self.b[..HEADER].fill(0);
        self.b[KIND] = kind;
        s16(&mut self.b[..], HEAP, PAGE_DATA_SIZE);
        s64(&mut self.b[..], RIGHT, NO_PAGE);
        s64(&mut self.b[..], UPPER, NO_PAGE);
        s16(&mut self.b[..], LEVEL, level as usize);
        if let Some(l) = lower {
            self.place_fence(l, false);
        }
        if let Some(u) = upper {
            self.place_fence(u, true);
        }
    }

    /// Copy fence `f` into the heap and point the lower or upper fence at it (the caller made
    /// room).
    fn place_fence(&mut self, f: &[u8], upper: bool) {
        let (off, len, bit) = if upper {
            (UP_OFF, UP_LEN, 2)
        } else {
            (LOW_OFF, LOW_LEN, 1)
        };
        let o = self.heap_alloc(f.len());
        self.b[o..o + f.len()].copy_from_slice(f);
        s16(&mut self.b[..], off, o);
        s16(&mut self.b[..], len, f.len());
        self.b[FLAGS] |= bit;
    }

    fn heap_alloc(&mut self, n: usize) -> usize {
        let o = g16(&self.b[..], HEAP) - n;
        assert!(o >= HEADER + self.count() * SLOT, "node heap overflow");
        s16(&mut self.b[..], HEAP, o);
        o
    }

    pub fn set_right(&mut self, pid: u64) {
        s64(&mut self.b[..], RIGHT, pid)
    }

    pub fn set_upper_child(&mut self, pid: u64) {
        s64(&mut self.b[..], UPPER, pid)
    }

    pub fn value_mut(&mut self, i: usize) -> &mut [u8] {
        let n = self.count();
        if self.kind() == KIND_INNER {
            let c = child_at(n, i);
            return &mut self.b[c..c + 8];
        }
        let s = info_at(n, i);
        let o = g16(&self.b[..], s) + g16(&self.b[..], s + 2);
        let len = g16(&self.b[..], s + 4);
        &mut self.b[o..o + len]
    }

    /// Rewrite the heap without dead bytes.
    pub fn compact(&mut self) {
        let copy: [u8; PAGE_DATA_SIZE] = *self.b;
        let src = NodeRef::new(&copy);
        let entries = src.entries();
        let (lower, upper) = (self.fence(false), self.fence(true));
        let (kind, level, right, up) =
            (self.kind(), self.level(), self.right(), self.upper_child());
        self.init(kind, level, lower.as_deref(), upper.as_deref());
        self.set_right(right);
        self.set_upper_child(up);
        for &(k, v, f) in &entries {
            let n = self.count();
            self.insert_flagged(n, k, v, f);
        }
    }

    /// Replace the upper fence (`None`: none). The old fence's bytes become dead.
    pub fn set_upper_fence(&mut self, fence: Option<&[u8]>) {
        if self.b[FLAGS] & 2 != 0 {
            let dead = g16(&self.b[..], DEAD) + g16(&self.b[..], UP_LEN);
            s16(&mut self.b[..], DEAD, dead);
            self.b[FLAGS] &= !2;
        }
        let Some(f) = fence else { return };
        if self.free_contiguous() < f.len() {
            self.compact();
        }
        self.place_fence(f, true);
    }

    /// Insert at position `i`. The caller checked `fits`. In inner nodes `val` is the child
    /// pid (8 bytes), stored in the slot.
    pub fn insert_at(&mut self, i: usize, key: &[u8], val: &[u8]) {
        self.insert_flagged(i, key, val, 0);
    }

    /// [`NodeMut::insert_flagged`], returning the byte ranges it changed when it needed no
    /// compaction (the header and slot arrays, and the new record on the heap); `None` when
    /// it compacted (then the whole heap moved).
    pub fn insert_flagged_within(
        &mut self,
        i: usize,
        key: &[u8],
        val: &[u8],
        flags: u16,
    ) -> Option<[std::ops::Range<usize>; 2]> {
        // inner nodes keep the child in the children array: only the key goes on the heap
        let vlen = if self.kind() == KIND_INNER {
            0
        } else {
            val.len()
        };
        let record = key.len() + vlen;
        let compacts = self.free_contiguous() < entry_space(key.len(), vlen);
        let heap_before = g16(&self.b[..], HEAP);
        self.insert_flagged(i, key, val, flags);
        let heap_after = g16(&self.b[..], HEAP);
        debug_assert!(compacts || heap_before - heap_after == record);
        (!compacts).then(|| [0..HEADER + self.count() * SLOT, heap_after..heap_before])
    }

    /// [`NodeMut::insert_at`] with the slot's flags (leaves; see [`FLAG_OVERFLOW`]).
    pub fn insert_flagged(&mut self, i: usize, key: &[u8], val: &[u8], flags: u16) {
        let inner = self.kind() == KIND_INNER;
        debug_assert!(!inner || flags == 0, "inner slots have no flags");
        let (child, val): (u64, &[u8]) = if inner { (g64(val, 0), &[]) } else { (0, val) };
        let need = entry_space(key.len(), val.len());
        assert!(self.free_space() >= need, "insert into a full node");
        if self.free_contiguous() < need {
            self.compact();
        }
        let n = self.count();
        assert!(i <= n);
        let o = self.heap_alloc(key.len() + val.len());
        self.b[o..o + key.len()].copy_from_slice(key);
        self.b[o + key.len()..o + key.len() + val.len()].copy_from_slice(val);
        // Open slot i in all three arrays, moving the highest bytes first: children after i
        // by 24 bytes, children before i by 16, infos after i by 16, infos before i by 8,
        // heads after i by 8.
        let b = &mut *self.b;
        b.copy_within(child_at(n, i)..child_at(n, n), child_at(n + 1, i + 1));
        b.copy_within(child_at(n, 0)..child_at(n, i), child_at(n + 1, 0));
        b.copy_within(info_at(n, i)..info_at(n, n), info_at(n + 1, i + 1));
        b.copy_within(info_at(n, 0)..info_at(n, i), info_at(n + 1, 0));
        b.copy_within(head_at(i)..head_at(n), head_at(i + 1));
        s64(b, head_at(i), head(key));
        let s = info_at(n + 1, i);
        s16(b, s, o);
        s16(b, s + 2, key.len());
        s16(b, s + 4, val.len());
        s16(b, s + 6, flags as usize);
        s64(b, child_at(n + 1, i), child);
        s16(b, COUNT, n + 1);
        // the previous insert's slot moved up if this one went before it
        let prev = g16(b, LAST_INSERT);
        s16(
            b,
            PREVIOUS_INSERT,
            if prev >= i && n > 0 { prev + 1 } else { prev },
        );
        s16(b, LAST_INSERT, i);
    }

    /// Remove slot `i`.
    pub fn remove_at(&mut self, i: usize) {
        let n = self.count();
        assert!(i < n);
        let s = info_at(n, i);
        let freed = g16(&self.b[..], s + 2) + g16(&self.b[..], s + 4);
        // Close slot i in all three arrays, moving the lowest bytes first (the mirror of
        // `insert_at`).
        let b = &mut *self.b;
        b.copy_within(head_at(i + 1)..head_at(n), head_at(i));
        b.copy_within(info_at(n, 0)..info_at(n, i), info_at(n - 1, 0));
        b.copy_within(info_at(n, i + 1)..info_at(n, n), info_at(n - 1, i));
        b.copy_within(child_at(n, 0)..child_at(n, i), child_at(n - 1, 0));
        b.copy_within(child_at(n, i + 1)..child_at(n, n), child_at(n - 1, i));
        s16(&mut self.b[..], COUNT, n - 1);
        let dead = g16(&self.b[..], DEAD) + freed;
        s16(&mut self.b[..], DEAD, dead);
    }

    /// Replace slot `i`'s value with one of possibly different length, and its flags. The
    /// caller checked that the new value fits (`free_space() + old len >= new len`).
    pub fn replace_flagged(&mut self, i: usize, val: &[u8], flags: u16) {
        if self.value(i).len() == val.len() {
            self.value_mut(i).copy_from_slice(val);
            let s = info_at(self.count(), i) + 6;
            s16(&mut self.b[..], s, flags as usize);
            return;
        }
        let key = self.key(i).to_vec();
        self.remove_at(i);
        self.insert_flagged(i, &key, val, flags);
    }

    /// Set the child pointer of inner slot `i` (or the upper child for `i == count`).
    pub fn set_child(&mut self, i: usize, pid: u64) {
        if i == self.count() {
            self.set_upper_child(pid);
        } else {
            self.value_mut(i).copy_from_slice(&pid.to_le_bytes());
        }
    }
}
