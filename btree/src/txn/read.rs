//! A transaction's reads and their validation at commit.
//!
//! Every read copies what it saw out of a leaf under an optimistic guard and records the
//! leaf's stamp. At commit the same code reads again, in *validation* mode: the committer
//! holds exclusive guards on the leaves it writes ([`Held`]), reads those through its own
//! guards, and never waits for a leaf another committer holds (it reports the read as busy
//! instead, which fails the commit: two committers waiting for each other's leaves would wait
//! for ever).

use crate::error::TreeError;
use crate::node::{self, FLAG_OVERFLOW, KIND_INNER, KIND_LEAF, MAX_KEY};
use crate::overflow::{self, ValueRef};
use crate::tree::{BTree, Direction};
use shoal_engine::{
    EngineError, ExclusiveGuard, OpResult, OptimisticGuard, PageRef, PageStamp, Pid, Restart,
    SharedGuard, Worker,
};
use std::ops::Bound;

/// Where a read's bytes are kept: a range of the transaction's byte arena.
pub(crate) type Span = std::ops::Range<usize>;

/// A point read: `key` of `tree` held `seen` (`None`: absent) in leaf `leaf` at `stamp`
/// (key and value kept in the transaction's arena).
#[derive(Debug)]
pub(crate) struct PointRead {
    pub tree: BTree,
    pub key: Span,
    pub seen: Option<Span>,
    pub leaf: Pid,
    pub stamp: PageStamp,
    /// The key's slot in the leaf, if it was found (valid while the leaf's stamp is `stamp`;
    /// `None` also where it was not noted).
    pub slot: Option<usize>,
    /// The value was kept in overflow pages (the leaf holds a reference).
    pub overflow: bool,
    /// Only these bytes of the value were read (`seen` holds them): only they are validated.
    pub part: Option<std::ops::Range<usize>>,
}

/// A read of some bytes of a key's value ([`point_part`]).
pub(crate) struct PartRead {
    pub read: PointRead,
    pub leaf: Pid,
    pub stamp: PageStamp,
    /// What the key's slot held: the value's length (an overflow reference's for a value in
    /// overflow pages); `None`: absent.
    pub len: Option<usize>,
}

/// A range read: the entries of `tree` in `lo..hi` (in `dir` order) were `seen` (keys and
/// values in the arena), the first `fetch` asked for; fewer means the range ended there.
/// `leaves` were walked, with stamps.
#[derive(Debug)]
pub(crate) struct RangeRead {
    pub tree: BTree,
    pub lo: Bound<Vec<u8>>,
    pub hi: Bound<Vec<u8>>,
    pub dir: Direction,
    pub fetch: usize,
    pub seen: Vec<(Span, Span)>,
    pub leaves: Vec<(Pid, PageStamp)>,
}

/// The leaves a committer holds exclusively, in page order.
pub(crate) struct Held<'a, 'w>(pub &'a [ExclusiveGuard<'w>]);

impl<'a, 'w> Held<'a, 'w> {
    pub fn none() -> Held<'a, 'w> {
        Held(&[])
    }

    fn get(&self, pid: Pid) -> Option<&'a ExclusiveGuard<'w>> {
        let i = self.0.binary_search_by_key(&pid, |x| x.pid()).ok()?;
        Some(&self.0[i])
    }
}

/// A leaf being read: through the committer's own exclusive guard, optimistically, or
/// latched shared (with the stamp it had when latched).
enum Leaf<'a, 'w> {
    Held(&'a ExclusiveGuard<'w>),
    Free(OptimisticGuard<'w>),
    Latched(SharedGuard<'w>, PageStamp),
}

impl<'w> Leaf<'_, 'w> {
    fn page(&self) -> PageRef<'_> {
        match self {
            Leaf::Held(x) => x.page(),
            Leaf::Free(g) => g.page(),
            Leaf::Latched(g, _) => g.page(),
        }
    }

    fn pid(&self) -> Pid {
        match self {
            Leaf::Held(x) => x.pid(),
            Leaf::Free(g) => g.pid(),
            Leaf::Latched(g, _) => g.pid(),
        }
    }

    fn stamp(&self) -> PageStamp {
        match self {
            Leaf::Held(x) => x.stamp(),
            Leaf::Free(g) => g.stamp(),
            Leaf::Latched(_, s) => *s,
        }
    }

    fn validate(&self) -> OpResult<()> {
        match self {
            Leaf::Held(_) | Leaf::Latched(..) => Ok(()),
            Leaf::Free(g) => g.validate(),
        }
    }
}

/// How a read takes pages: as any operation (waiting for latches), or while validating a
/// commit (through the committer's guards, never waiting long for another's).
#[derive(Clone, Copy)]
enum Mode<'h, 'a, 'w> {
    /// Leaves read optimistically.
    Plain,
    /// Leaves latched shared while they are copied: for a read whose optimistic tries kept
    /// meeting writers (a leaf written without pause, as a hot account's, changes under every
    /// optimistic copy of it; a latch lets the copy finish, and holds writers back only for
    /// as long as it takes).
    Latched,
    Validating(&'h Held<'a, 'w>),
}

impl Mode<'_, '_, '_> {
    /// The mode of try `tries` (from 1) of a transaction's read.
    fn plain_or_latched(tries: u32) -> Self {
        /// Optimistic tries before a read latches its leaves.
        const OPTIMISTIC_TRIES: u32 = 2;
        if tries > OPTIMISTIC_TRIES {
            Mode::Latched
        } else {
            Mode::Plain
        }
    }
}

/// `g`'s leaf latched shared, if unchanged since `g` read it.
fn latched<'a, 'w>(g: OptimisticGuard<'w>) -> OpResult<Leaf<'a, 'w>> {
    let stamp = g.stamp();
    Ok(Leaf::Latched(g.to_shared()?, stamp))
}

/// A read that met a page another committer holds (validation only).
struct Busy;

type Got<T> = OpResult<Result<T, Busy>>;

fn take<'a, 'w>(w: &'w Worker, mode: Mode<'_, 'a, 'w>, pid: Pid) -> Got<Leaf<'a, 'w>> {
    match mode {
        Mode::Plain => Ok(Ok(Leaf::Free(w.optimistic(pid)?))),
        Mode::Latched => Ok(Ok(latched(w.optimistic(pid)?)?)),
        Mode::Validating(held) => {
            if let Some(x) = held.get(pid) {
                return Ok(Ok(Leaf::Held(x)));
            }
            Ok(w.optimistic_unless_held(pid)?.map(Leaf::Free).ok_or(Busy))
        }
    }
}

fn not_a_node(pid: Pid) -> Restart {
    Restart::Fail(EngineError::Catalog(format!(
        "page {pid} is not a B-tree node (corrupt tree or wrong root)"
    )))
}

/// The leaf whose range holds `key`.
fn find_leaf<'a, 'w>(
    w: &'w Worker,
    mode: Mode<'_, 'a, 'w>,
    tree: BTree,
    key: &[u8],
) -> Got<Leaf<'a, 'w>> {
    match mode {
        // the tree's own descent (with its prefetching)
        Mode::Plain => return Ok(Ok(Leaf::Free(tree.find_leaf(w, key)?))),
        Mode::Latched => return Ok(Ok(latched(tree.find_leaf(w, key)?)?)),
        Mode::Validating(_) => {}
    }
    let mut g = match take(w, mode, tree.root())? {
        Ok(g) => g,
        Err(b) => return Ok(Err(b)),
    };
    loop {
        let p = g.page();
        match node::kind(p) {
            KIND_LEAF => return Ok(Ok(g)),
            KIND_INNER => {
                let (i, _) = node::lower_bound(p, key);
                let c = Pid(node::child(p, i));
                g.validate()?; // `c` is a real pid
                               // A merge may have freed `c` since `g` was read, and loading a freed page can
                               // fail (its slot holds an old image or nothing): a restart when `g` changed
                               // meanwhile, the error it is when not (as `descend` in the tree).
                let next = match take(w, mode, c) {
                    Ok(Ok(n)) => n,
                    Ok(Err(b)) => return Ok(Err(b)),
                    Err(Restart::Fail(e)) => {
                        g.validate()?;
                        return Err(Restart::Fail(e));
                    }
                    Err(r) => return Err(r),
                };
                g.validate()?; // and still the child for the key
                g = next;
            }
            _ => {
                g.validate()?;
                return Err(not_a_node(g.pid()));
            }
        }
    }
}

/// Read an overflow value whose reference is `stored` in `leaf` into `out` (the leaf is
/// validated again afterwards: the chain is only trustworthy while the leaf points at it).
fn read_chain(w: &Worker, leaf: &Leaf<'_, '_>, stored: &[u8], out: &mut Vec<u8>) -> OpResult<()> {
    let r = ValueRef::decode(stored).ok_or_else(|| {
        Restart::Fail(EngineError::Catalog(format!(
            "leaf {} holds a damaged overflow reference",
            leaf.pid()
        )))
    })?;
    let read = overflow::read(w, r, out);
    leaf.validate()?;
    read
}

/// `key`'s value in `tree` now, appended to `out`, with its slot in its leaf (`None`: absent),
/// the leaf, the leaf's stamp and whether the value was in overflow pages.
fn point_at<'a, 'w>(
    w: &'w Worker,
    mode: Mode<'_, 'a, 'w>,
    tree: BTree,
    key: &[u8],
    out: &mut Vec<u8>,
    hint: Option<Hint>,
) -> Got<(Option<usize>, Pid, PageStamp, bool)> {
    let (leaf, (i, found)) = match hinted(w, mode, tree, hint, key)? {
        Some(got) => got,
        None => {
            let leaf = match find_leaf(w, mode, tree, key)? {
                Ok(l) => l,
                Err(b) => return Ok(Err(b)),
            };
            let at = node::lower_bound(leaf.page(), key);
            (leaf, at)
        }
    };
    let p = leaf.page();
    let mut big = false;
    let from = out.len();
    if found {
        node::value_append(p, i, out);
        big = node::val_flags(p, i) & FLAG_OVERFLOW != 0;
    }
    leaf.validate()?;
    if big {
        // (the reference, replaced by the value it points at)
        // (overflow values are rare: their own buffer)
        let stored = out.split_off(from);
        let mut v = Vec::new();
        read_chain(w, &leaf, &stored, &mut v)?;
        out.extend_from_slice(&v);
    }
    Ok(Ok((found.then_some(i), leaf.pid(), leaf.stamp(), big)))
}

/// A leaf a transaction read in a tree, at the stamp it had then ([`point`] starts there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hint {
    pub leaf: Pid,
    pub stamp: PageStamp,
}

/// The leaf `hint` names, for a plain read of `key`, with `key`'s place in it (as
/// [`node::lower_bound`]): if the leaf is unchanged since the hint's stamp (so it is still
/// that leaf of `tree`: a split, merge or free changes the stamp) and holds `key` in its range,
/// it is the leaf a descent would find, and the descent is skipped. `None`: descend (no hint,
/// another mode, the leaf changed or is gone, or the key lies elsewhere).
#[allow(clippy::type_complexity)]
fn hinted<'a, 'w>(
    w: &'w Worker,
    mode: Mode<'_, 'a, 'w>,
    tree: BTree,
    hint: Option<Hint>,
    key: &[u8],
) -> OpResult<Option<(Leaf<'a, 'w>, (usize, bool))>> {
    let (Mode::Plain, Some(h)) = (mode, hint) else {
        return Ok(None);
    };
    let g = match w.optimistic(h.leaf) {
        Ok(g) => g,
        // (freed meanwhile: its slot may hold anything; descend)
        Err(Restart::Fail(_)) => return Ok(None),
        Err(r) => return Err(r),
    };
    let p = g.page();
    if g.stamp() != h.stamp || node::kind(p) != KIND_LEAF {
        return Ok(None);
    }
    // in its range: the key is in it, or lies between two of its keys (both inside its
    // fences), or else its fences say so (a torn read's answer fails the caller's validation)
    let (i, found) = node::lower_bound(p, key);
    if !(found || (i > 0 && i < node::count(p)) || node::covers(p, key)) {
        return Ok(None);
    }
    if cfg!(debug_assertions) {
        // the descent it saves ends here (while the leaf is still as it was)
        let d = tree.find_leaf(w, key)?;
        if d.pid() != g.pid() {
            g.validate()?;
            panic!(
                "leaf {} holds key {key:?} of tree {} unchanged, but the descent ends at {}",
                g.pid(),
                tree.root(),
                d.pid()
            );
        }
    }
    Ok(Some((Leaf::Free(g), (i, found))))
}

/// Read `key` of `tree` for a transaction, keeping key and value in `arena`; from the leaf
/// `hint` names if that leaf is unchanged and holds the key ([`hinted`]).
pub(crate) fn point(
    w: &Worker,
    tree: BTree,
    key: &[u8],
    arena: &mut Vec<u8>,
    hint: Option<Hint>,
) -> Result<PointRead, TreeError> {
    let k0 = arena.len();
    arena.extend_from_slice(key);
    let v0 = arena.len();
    let mut tries = 0;
    let (slot, leaf, stamp, overflow) = w.run(|w| {
        arena.truncate(v0);
        tries += 1;
        point_at(w, Mode::plain_or_latched(tries), tree, key, arena, hint).map(|r| match r {
            Ok(x) => x,
            Err(Busy) => unreachable!("plain reads wait"),
        })
    })?;
    Ok(PointRead {
        tree,
        key: k0..v0,
        seen: slot.map(|_| v0..arena.len()),
        leaf,
        stamp,
        slot,
        overflow,
        part: None,
    })
}

/// Read bytes `part` of `key`'s value in `tree` for a transaction. The read keeps only those
/// bytes (and is validated on them alone) when the value is in its leaf and holds them all;
/// otherwise it is a read of the whole value.
pub(crate) fn point_part(
    w: &Worker,
    tree: BTree,
    key: &[u8],
    part: std::ops::Range<usize>,
    arena: &mut Vec<u8>,
    hint: Option<Hint>,
) -> Result<PartRead, TreeError> {
    let mut r = point(w, tree, key, arena, hint)?;
    let len = r.seen.as_ref().map(|v| {
        if r.overflow {
            overflow::REF_LEN
        } else {
            v.len()
        }
    });
    if let Some(v) = r.seen.clone() {
        if !r.overflow && v.len() >= part.end {
            // the value is the arena's last bytes: keep only the part
            debug_assert_eq!(v.end, arena.len());
            arena.copy_within(v.start + part.start..v.start + part.end, v.start);
            arena.truncate(v.start + part.len());
            r.seen = Some(v.start..v.start + part.len());
            r.part = Some(part);
        }
    }
    Ok(PartRead {
        leaf: r.leaf,
        stamp: r.stamp,
        read: r,
        len,
    })
}

/// A key greater than every key a tree can hold.
fn above_all() -> Vec<u8> {
    vec![0xFF; MAX_KEY + 1]
}

fn below(b: &Bound<Vec<u8>>, k: &[u8]) -> bool {
    // whether `k` lies past the upper end `b` of an ascending walk
    match b {
        Bound::Included(h) => k > h.as_slice(),
        Bound::Excluded(h) => k >= h.as_slice(),
        Bound::Unbounded => false,
    }
}

fn above(b: &Bound<Vec<u8>>, k: &[u8]) -> bool {
    // whether `k` lies past the lower end `b` of a descending walk
    match b {
        Bound::Included(l) => k < l.as_slice(),
        Bound::Excluded(l) => k <= l.as_slice(),
        Bound::Unbounded => false,
    }
}

/// The entries of `tree` in `lo..hi` in `dir` order, at most `fetch`: keys and values
/// appended to `out`, their spans to `entries`, the leaves walked to `leaves`. Each leaf's
/// entries are copied under one optimistic guard and validated (a failed validation restarts
/// the whole walk: the caller truncates); the walk is not a snapshot (the commit's validation
/// makes it one).
#[allow(clippy::too_many_arguments)]
fn walk<'a, 'w>(
    w: &'w Worker,
    mode: Mode<'_, 'a, 'w>,
    tree: BTree,
    (lo, hi): (&Bound<Vec<u8>>, &Bound<Vec<u8>>),
    dir: Direction,
    fetch: usize,
    out: &mut Vec<u8>,
    entries: &mut Vec<(Span, Span)>,
    leaves: &mut Vec<(Pid, PageStamp)>,
) -> Got<()> {
    let first = entries.len();
    // where the walk goes on: past this bound
    let mut at = match dir {
        Direction::Ascending => lo.clone(),
        Direction::Descending => hi.clone(),
    };
    loop {
        // the key to descend to: for an ascending walk past `k`, the smallest key above it
        let key = match (&at, dir) {
            (Bound::Excluded(k), Direction::Ascending) => {
                let mut k = k.clone();
                k.push(0);
                k
            }
            (Bound::Included(k) | Bound::Excluded(k), _) => k.clone(),
            (Bound::Unbounded, Direction::Ascending) => Vec::new(),
            (Bound::Unbounded, Direction::Descending) => above_all(),
        };
        let leaf = match find_leaf(w, mode, tree, &key)? {
            Ok(l) => l,
            Err(b) => return Ok(Err(b)),
        };
        let p = leaf.page();
        let n = node::count(p);
        // slots to copy, in walk order
        let mut ended = false;
        let mut big: Vec<usize> = Vec::new(); // entries whose value is in overflow pages
        match dir {
            Direction::Ascending => {
                let mut i = node::lower_bound(p, &key).0;
                while i < n {
                    let k0 = out.len();
                    node::key_append(p, i, out);
                    if below(hi, &out[k0..]) {
                        out.truncate(k0);
                        ended = true;
                        break;
                    }
                    take_slot(p, i, k0, out, entries, &mut big);
                    if entries.len() - first >= fetch {
                        ended = true;
                        break;
                    }
                    i += 1;
                }
            }
            Direction::Descending => {
                let (i, exact) = node::lower_bound(p, &key);
                let mut j = if exact && matches!(at, Bound::Included(_)) {
                    i + 1
                } else {
                    i
                };
                j = j.min(n);
                while j > 0 {
                    j -= 1;
                    let k0 = out.len();
                    node::key_append(p, j, out);
                    if above(lo, &out[k0..]) {
                        out.truncate(k0);
                        ended = true;
                        break;
                    }
                    take_slot(p, j, k0, out, entries, &mut big);
                    if entries.len() - first >= fetch {
                        ended = true;
                        break;
                    }
                }
            }
        }
        // (where to go on: not needed when the walk ends in this leaf)
        let next = match (ended, dir) {
            (true, _) => None,
            (false, Direction::Ascending) => node::fence(p, true),
            (false, Direction::Descending) => node::fence(p, false),
        };
        leaf.validate()?;
        // values in overflow pages: read their chains now that the references are valid
        for e in big {
            let r = out[entries[e].1.clone()].to_vec();
            let mut v = Vec::new();
            read_chain(w, &leaf, &r, &mut v)?;
            let v0 = out.len();
            out.extend_from_slice(&v);
            entries[e].1 = v0..out.len();
        }
        leaves.push((leaf.pid(), leaf.stamp()));
        if ended {
            return Ok(Ok(()));
        }
        match (next, dir) {
            (None, _) => return Ok(Ok(())),
            // the next leaf holds the keys above this one's upper fence
            (Some(up), Direction::Ascending) => {
                if let Bound::Included(h) | Bound::Excluded(h) = hi {
                    if up >= *h {
                        return Ok(Ok(())); // every key beyond is past the end
                    }
                }
                at = Bound::Excluded(up);
            }
            // the previous leaf holds the lower fence and the keys below it
            (Some(low), Direction::Descending) => {
                if above(lo, &low) {
                    return Ok(Ok(()));
                }
                at = Bound::Included(low);
            }
        }
    }
}

/// Copy the value of slot `i` of leaf page `p` to `out`, after its key (appended from `k0`
/// on), and their spans to `entries`; note it in `big` if its value is in overflow pages.
fn take_slot(
    p: PageRef<'_>,
    i: usize,
    k0: usize,
    out: &mut Vec<u8>,
    entries: &mut Vec<(Span, Span)>,
    big: &mut Vec<usize>,
) {
    let v0 = out.len();
    node::value_append(p, i, out);
    if node::val_flags(p, i) & FLAG_OVERFLOW != 0 {
        big.push(entries.len());
    }
    entries.push((k0..v0, v0..out.len()));
}

/// Read a range of `tree` for a transaction: the first `fetch` entries in `lo..hi`, kept in
/// `arena`.
pub(crate) fn range(
    w: &Worker,
    tree: BTree,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    dir: Direction,
    fetch: usize,
    arena: &mut Vec<u8>,
) -> Result<RangeRead, TreeError> {
    assert!(fetch > 0, "a range read asks for at least one entry");
    let mark = arena.len();
    let mut seen = Vec::new();
    let mut leaves = Vec::new();
    let mut tries = 0;
    w.run(|w| {
        arena.truncate(mark);
        seen.clear();
        leaves.clear();
        tries += 1;
        walk(
            w,
            Mode::plain_or_latched(tries),
            tree,
            (&lo, &hi),
            dir,
            fetch,
            arena,
            &mut seen,
            &mut leaves,
        )
        .map(|r| match r {
            Ok(()) => (),
            Err(Busy) => unreachable!("plain reads wait"),
        })
    })?;
    Ok(RangeRead {
        tree,
        lo,
        hi,
        dir,
        fetch,
        seen,
        leaves,
    })
}

/// Whether the leaf `pid` still has `stamp` (through the committer's guard if it holds it).
fn unchanged(w: &Worker, held: &Held<'_, '_>, pid: Pid, stamp: PageStamp) -> Got<bool> {
    if let Some(x) = held.get(pid) {
        return Ok(Ok(x.stamp() == stamp));
    }
    match w.optimistic_unless_held(pid) {
        Ok(None) => Ok(Err(Busy)),
        Ok(Some(g)) => Ok(Ok(g.stamp() == stamp)),
        // the page is gone (a merge freed it since the read, and its slot reads as never
        // written or as another page): it changed; the caller reads again from the root,
        // where a real failure shows again
        Err(Restart::Fail(_)) => Ok(Ok(false)),
        Err(r) => Err(r),
    }
}

/// The leaves, at their stamps, on which a validation's first pass relied ([`point_holds`],
/// [`range_holds`]), and whether any read was vouched for by its value because its leaf had
/// changed since the read (then the second pass checks every one again: see `validate` in
/// commit.rs).
///
/// Noted only once some read was vouched for by its value (until then no second pass is due):
/// the reads checked before that one held by their unchanged leaves, which `validate` notes
/// then.
#[derive(Default)]
pub(crate) struct Witnesses {
    at: Vec<(Pid, PageStamp)>,
    /// Some read held by its value, its leaf changed since the read.
    pub by_value: bool,
}

/// How a read held at a validation's first pass.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Holds {
    /// It no longer holds (or its leaf is another committer's): a conflict.
    No,
    /// Its leaves are unchanged since the read.
    Unchanged,
    /// Its leaf changed, and read again it gave what the transaction read (the leaves it was
    /// read again from are noted as witnesses).
    ByValue,
}

impl Witnesses {
    pub fn clear(&mut self) {
        self.at.clear();
        self.by_value = false;
    }

    /// Reuse `at`'s allocation (see `validate`).
    pub fn with_buffer(at: Vec<(Pid, PageStamp)>) -> Witnesses {
        let mut w = Witnesses {
            at,
            by_value: false,
        };
        w.clear();
        w
    }

    pub fn into_buffer(self) -> Vec<(Pid, PageStamp)> {
        self.at
    }

    /// Note the leaves of `r`, a read that held by its unchanged leaves.
    pub fn note_point(&mut self, r: &PointRead) {
        self.note(r.leaf, r.stamp);
    }

    /// See [`Witnesses::note_point`].
    pub fn note_range(&mut self, r: &RangeRead) {
        for &(pid, stamp) in &r.leaves {
            self.note(pid, stamp);
        }
    }

    fn note(&mut self, pid: Pid, stamp: PageStamp) {
        if self.at.last() != Some(&(pid, stamp)) {
            self.at.push((pid, stamp));
        }
    }

    /// The second pass: whether every leaf noted still has the stamp noted (a leaf another
    /// committer holds counts as changed).
    pub fn unchanged(&mut self, w: &Worker, held: &Held<'_, '_>) -> OpResult<bool> {
        self.at.sort_unstable_by_key(|&(pid, _)| pid);
        self.at.dedup();
        for &(pid, stamp) in &self.at {
            if !unchanged(w, held, pid, stamp)?.unwrap_or(false) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Whether `r` still holds (validation: `held` are the committer's leaves; `arena` the
/// transaction's bytes; `now` a buffer for the value as it is now; where it held by its value,
/// the leaf it was read again from goes to `witnesses`).
pub(crate) fn point_holds(
    w: &Worker,
    held: &Held<'_, '_>,
    r: &PointRead,
    arena: &[u8],
    now: &mut Vec<u8>,
    witnesses: &mut Witnesses,
) -> OpResult<Holds> {
    if unchanged(w, held, r.leaf, r.stamp)?.unwrap_or(false) {
        return Ok(Holds::Unchanged);
    }
    now.clear();
    let (slot, leaf, stamp, big) = match point_at(
        w,
        Mode::Validating(held),
        r.tree,
        &arena[r.key.clone()],
        now,
        None,
    )? {
        Ok(at) => at,
        Err(Busy) => return Ok(Holds::No),
    };
    witnesses.note(leaf, stamp);
    let holds = match (&r.seen, &r.part) {
        (Some(v), None) => slot.is_some() && now[..] == arena[v.clone()],
        // (a value now in overflow pages: `now` is the value itself, but a patch of its bytes
        // cannot go into its leaf)
        (Some(v), Some(p)) => {
            slot.is_some() && !big && now.get(p.clone()) == Some(&arena[v.clone()])
        }
        (None, _) => slot.is_none(),
    };
    Ok(if holds { Holds::ByValue } else { Holds::No })
}

/// Whether `r` still holds: the same entries in the part of the range it covered, nothing
/// inserted or removed there (where it held by its entries, the leaves it was read again
/// from go to `witnesses`).
pub(crate) fn range_holds(
    w: &Worker,
    held: &Held<'_, '_>,
    r: &RangeRead,
    arena: &[u8],
    witnesses: &mut Witnesses,
) -> OpResult<Holds> {
    let mut same = true;
    for &(pid, stamp) in &r.leaves {
        match unchanged(w, held, pid, stamp)? {
            Ok(true) => {}
            Ok(false) => {
                same = false;
                break;
            }
            Err(Busy) => return Ok(Holds::No),
        }
    }
    if same {
        return Ok(Holds::Unchanged);
    }
    // read the range again, one entry further than what it returned: if it ended early (the
    // range's end), no entry may follow; if it was cut at `fetch`, what follows is outside it
    let (mut bytes, mut again, mut leaves) = (Vec::new(), Vec::new(), Vec::new());
    let walked = walk(
        w,
        Mode::Validating(held),
        r.tree,
        (&r.lo, &r.hi),
        r.dir,
        r.seen.len() + 1,
        &mut bytes,
        &mut again,
        &mut leaves,
    )?;
    if walked.is_err() {
        return Ok(Holds::No); // busy
    }
    for &(pid, stamp) in &leaves {
        witnesses.note(pid, stamp);
    }
    let ended_early = r.seen.len() < r.fetch;
    if again.len() < r.seen.len() || (ended_early && again.len() > r.seen.len()) {
        return Ok(Holds::No);
    }
    let same = r.seen.iter().zip(&again).all(|((k, v), (k2, v2))| {
        arena[k.clone()] == bytes[k2.clone()] && arena[v.clone()] == bytes[v2.clone()]
    });
    Ok(if same { Holds::ByValue } else { Holds::No })
}
