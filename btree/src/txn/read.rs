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
    Worker,
};
use std::collections::HashMap;
use std::ops::Bound;

/// A point read: `key` of `tree` held `seen` (`None`: absent) in leaf `leaf` at `stamp`.
#[derive(Debug)]
pub(crate) struct PointRead {
    pub tree: BTree,
    pub key: Vec<u8>,
    pub seen: Option<Vec<u8>>,
    pub leaf: Pid,
    pub stamp: PageStamp,
}

/// A range read: the entries of `tree` in `lo..hi` (in `dir` order) were `seen`, the first
/// `fetch` asked for; fewer means the range ended there. `leaves` were walked, with stamps.
#[derive(Debug)]
pub(crate) struct RangeRead {
    pub tree: BTree,
    pub lo: Bound<Vec<u8>>,
    pub hi: Bound<Vec<u8>>,
    pub dir: Direction,
    pub fetch: usize,
    pub seen: Vec<(Vec<u8>, Vec<u8>)>,
    pub leaves: Vec<(Pid, PageStamp)>,
}

/// The leaves a committer holds exclusively, by page.
pub(crate) type Held<'a, 'w> = HashMap<Pid, &'a ExclusiveGuard<'w>>;

/// A leaf being read: through the committer's own exclusive guard, or optimistically.
enum Leaf<'a, 'w> {
    Held(&'a ExclusiveGuard<'w>),
    Free(OptimisticGuard<'w>),
}

impl<'w> Leaf<'_, 'w> {
    fn page(&self) -> PageRef<'_> {
        match self {
            Leaf::Held(x) => x.page(),
            Leaf::Free(g) => g.page(),
        }
    }

    fn pid(&self) -> Pid {
        match self {
            Leaf::Held(x) => x.pid(),
            Leaf::Free(g) => g.pid(),
        }
    }

    fn stamp(&self) -> PageStamp {
        match self {
            Leaf::Held(x) => x.stamp(),
            Leaf::Free(g) => g.stamp(),
        }
    }

    fn validate(&self) -> OpResult<()> {
        match self {
            Leaf::Held(_) => Ok(()),
            Leaf::Free(g) => g.validate(),
        }
    }
}

/// How a read takes pages: as any operation (waiting for latches), or while validating a
/// commit (through the committer's guards, never waiting long for another's).
#[derive(Clone, Copy)]
enum Mode<'h, 'a, 'w> {
    Plain,
    Validating(&'h Held<'a, 'w>),
}

/// A read that met a page another committer holds (validation only).
struct Busy;

type Got<T> = OpResult<Result<T, Busy>>;

fn take<'a, 'w>(w: &'w Worker, mode: Mode<'_, 'a, 'w>, pid: Pid) -> Got<Leaf<'a, 'w>> {
    match mode {
        Mode::Plain => Ok(Ok(Leaf::Free(w.optimistic(pid)?))),
        Mode::Validating(held) => {
            if let Some(x) = held.get(&pid) {
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

/// `key`'s value in `tree` now (`None`: absent), with its leaf and the leaf's stamp.
fn point_at<'a, 'w>(
    w: &'w Worker,
    mode: Mode<'_, 'a, 'w>,
    tree: BTree,
    key: &[u8],
) -> Got<(Option<Vec<u8>>, Pid, PageStamp)> {
    let leaf = match find_leaf(w, mode, tree, key)? {
        Ok(l) => l,
        Err(b) => return Ok(Err(b)),
    };
    let p = leaf.page();
    let (i, found) = node::lower_bound(p, key);
    let mut v = Vec::new();
    let mut big = false;
    if found {
        node::value_into(p, i, &mut v);
        big = node::val_flags(p, i) & FLAG_OVERFLOW != 0;
    }
    leaf.validate()?;
    if big {
        let stored = std::mem::take(&mut v);
        read_chain(w, &leaf, &stored, &mut v)?;
    }
    Ok(Ok((found.then_some(v), leaf.pid(), leaf.stamp())))
}

/// Read `key` of `tree` for a transaction.
pub(crate) fn point(w: &Worker, tree: BTree, key: &[u8]) -> Result<PointRead, TreeError> {
    let (seen, leaf, stamp) = w.run(|w| {
        point_at(w, Mode::Plain, tree, key).map(|r| match r {
            Ok(x) => x,
            Err(Busy) => unreachable!("plain reads wait"),
        })
    })?;
    Ok(PointRead {
        tree,
        key: key.to_vec(),
        seen,
        leaf,
        stamp,
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

/// The entries of `tree` in `lo..hi` in `dir` order, at most `fetch`, with the leaves walked.
/// Each leaf's entries are copied under one optimistic guard and validated; the walk is not a
/// snapshot (the commit's validation makes it one).
#[allow(clippy::type_complexity)]
fn walk<'a, 'w>(
    w: &'w Worker,
    mode: Mode<'_, 'a, 'w>,
    tree: BTree,
    lo: &Bound<Vec<u8>>,
    hi: &Bound<Vec<u8>>,
    dir: Direction,
    fetch: usize,
) -> Got<(Vec<(Vec<u8>, Vec<u8>)>, Vec<(Pid, PageStamp)>)> {
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut leaves = Vec::new();
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
        let mut batch: Vec<(Vec<u8>, Vec<u8>, bool)> = Vec::new();
        let mut ended = false;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        match dir {
            Direction::Ascending => {
                let mut i = node::lower_bound(p, &key).0;
                while i < n {
                    node::key_into(p, i, &mut k);
                    if below(hi, &k) {
                        ended = true;
                        break;
                    }
                    node::value_into(p, i, &mut v);
                    batch.push((
                        k.clone(),
                        v.clone(),
                        node::val_flags(p, i) & FLAG_OVERFLOW != 0,
                    ));
                    if out.len() + batch.len() >= fetch {
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
                    node::key_into(p, j, &mut k);
                    if above(lo, &k) {
                        ended = true;
                        break;
                    }
                    node::value_into(p, j, &mut v);
                    batch.push((
                        k.clone(),
                        v.clone(),
                        node::val_flags(p, j) & FLAG_OVERFLOW != 0,
                    ));
                    if out.len() + batch.len() >= fetch {
                        ended = true;
                        break;
                    }
                }
            }
        }
        let next = match dir {
            Direction::Ascending => node::fence(p, true),
            Direction::Descending => node::fence(p, false),
        };
        leaf.validate()?;
        for (k, stored, big) in batch {
            let mut v = stored;
            if big {
                let r = std::mem::take(&mut v);
                read_chain(w, &leaf, &r, &mut v)?;
            }
            out.push((k, v));
        }
        leaves.push((leaf.pid(), leaf.stamp()));
        if ended {
            return Ok(Ok((out, leaves)));
        }
        match (next, dir) {
            (None, _) => return Ok(Ok((out, leaves))),
            // the next leaf holds the keys above this one's upper fence
            (Some(up), Direction::Ascending) => {
                if let Bound::Included(h) | Bound::Excluded(h) = hi {
                    if up >= *h {
                        return Ok(Ok((out, leaves))); // every key beyond is past the end
                    }
                }
                at = Bound::Excluded(up);
            }
            // the previous leaf holds the lower fence and the keys below it
            (Some(low), Direction::Descending) => {
                if above(lo, &low) {
                    return Ok(Ok((out, leaves)));
                }
                at = Bound::Included(low);
            }
        }
    }
}

/// Read a range of `tree` for a transaction: the first `fetch` entries in `lo..hi`.
pub(crate) fn range(
    w: &Worker,
    tree: BTree,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    dir: Direction,
    fetch: usize,
) -> Result<RangeRead, TreeError> {
    assert!(fetch > 0, "a range read asks for at least one entry");
    let (seen, leaves) = w.run(|w| {
        walk(w, Mode::Plain, tree, &lo, &hi, dir, fetch).map(|r| match r {
            Ok(x) => x,
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
    if let Some(x) = held.get(&pid) {
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

/// Whether `r` still holds (validation: `held` are the committer's leaves). `Ok(false)`: a
/// conflict (changed, or held by another committer).
pub(crate) fn point_holds(w: &Worker, held: &Held<'_, '_>, r: &PointRead) -> OpResult<bool> {
    if unchanged(w, held, r.leaf, r.stamp)?.unwrap_or(false) {
        return Ok(true);
    }
    Ok(match point_at(w, Mode::Validating(held), r.tree, &r.key)? {
        Ok((now, _, _)) => now == r.seen,
        Err(Busy) => false,
    })
}

/// Whether `r` still holds: the same entries in the part of the range it covered, nothing
/// inserted or removed there. `Ok(false)`: a conflict.
pub(crate) fn range_holds(w: &Worker, held: &Held<'_, '_>, r: &RangeRead) -> OpResult<bool> {
    let mut same = true;
    for &(pid, stamp) in &r.leaves {
        match unchanged(w, held, pid, stamp)? {
            Ok(true) => {}
            Ok(false) => {
                same = false;
                break;
            }
            Err(Busy) => return Ok(false),
        }
    }
    if same {
        return Ok(true);
    }
    // read the range again, one entry further than what it returned: if it ended early (the
    // range's end), no entry may follow; if it was cut at `fetch`, what follows is outside it
    let again = match walk(
        w,
        Mode::Validating(held),
        r.tree,
        &r.lo,
        &r.hi,
        r.dir,
        r.seen.len() + 1,
    )? {
        Ok((entries, _)) => entries,
        Err(Busy) => return Ok(false),
    };
    let ended_early = r.seen.len() < r.fetch;
    Ok(if ended_early {
        again == r.seen
    } else {
        again.len() >= r.seen.len() && again[..r.seen.len()] == r.seen[..]
    })
}
