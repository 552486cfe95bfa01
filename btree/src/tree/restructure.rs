//! Splits and merges: a full node splits top-down (its parent first), an underfull one merges
//! with a neighbour under the same parent; the root never moves.

use super::*;
use std::cmp::Ordering;

/// How to divide a full node. Leaves: left keeps `entries[..m]` and `sep` (left's upper fence)
/// separates the halves. Inner nodes: left keeps `entries[..m - 1]`, `entries[m - 1]`'s key
/// (= `sep`) moves up and its child becomes left's upper child; right keeps `entries[m..]`.
pub(super) struct Cut {
    m: usize,
    sep: Vec<u8>,
}

/// Split `entries` of a node of `kind` into (left, separator, right, left's upper child), at
/// `cut` or else in the middle (by bytes).
pub(super) fn halves<'e, 'a>(
    kind: u8,
    entries: &'e [Entry<'a>],
    cut: Option<Cut>,
) -> (&'e [Entry<'a>], Vec<u8>, &'e [Entry<'a>], u64) {
    let n = entries.len();
    assert!(n >= 2, "splitting a node with {n} entries");
    let (m, sep) = match cut {
        Some(Cut { m, sep }) => (m, sep),
        None => {
            // split by bytes, so nodes with mixed record sizes divide their space evenly
            let total: usize = entries
                .iter()
                .map(|(k, v, _)| k.len() + v.len() + node::SLOT)
                .sum();
            let mut acc = 0;
            let mut m = 1;
            for (i, (k, v, _)) in entries.iter().enumerate() {
                acc += k.len() + v.len() + node::SLOT;
                if acc * 2 >= total {
                    m = (i + 1).clamp(1, n - 1);
                    break;
                }
            }
            (m, entries[m - 1].0.to_vec())
        }
    };
    // each half keeps an entry, except that a leaf's right half may start empty (an
    // ascending run continues there)
    let most = if kind == KIND_LEAF { n } else { n - 1 };
    assert!((1..=most).contains(&m), "cut {m} of {n} entries");
    if kind == KIND_LEAF {
        (&entries[..m], sep, &entries[m..], NO_PAGE)
    } else {
        let v = entries[m - 1].1;
        let child = LittleEndian::read_u64(v);
        (&entries[..m - 1], sep, &entries[m..], child)
    }
}

/// A leaf's cut that counts the entry on its way in (`need` bytes for `key`, which the leaf
/// does not hold yet): the halves come out even once it is in, which matters when a leaf holds
/// only a few records (three of YCSB's 1 KB ones), where a cut of the old entries alone leaves
/// three and one. When the even cut falls right after the new entry, `key` itself separates the
/// halves and the insert lands left. `None` for inner nodes and for a key the leaf holds.
pub(super) fn balanced_cut(
    kind: u8,
    entries: &[Entry<'_>],
    key: &[u8],
    need: usize,
) -> Option<Cut> {
    let n = entries.len();
    let at = entries.partition_point(|&(k, _, _)| k < key);
    if kind != KIND_LEAF || n < 2 || entries.get(at).is_some_and(|&(k, _, _)| k == key) {
        return None;
    }
    let size = |&(k, v, _): &Entry<'_>| k.len() + v.len() + node::SLOT;
    // the n + 1 entries once the new one is in (at position `at`)
    let sizes = (0..=n).map(|j| match j.cmp(&at) {
        Ordering::Less => size(&entries[j]),
        Ordering::Equal => need,
        Ordering::Greater => size(&entries[j - 1]),
    });
    let total: usize = sizes.clone().sum();
    let mut acc = 0;
    // how many of the n + 1 go left: the fewest that hold half the bytes
    let mut left = n;
    for (j, s) in sizes.enumerate() {
        acc += s;
        if acc * 2 >= total {
            left = j + 1;
            break;
        }
    }
    if left == at + 1 && at >= 1 {
        // the new entry is the last one left: it separates the halves
        return Some(Cut {
            m: at,
            sep: key.to_vec(),
        });
    }
    let m = if left <= at { left } else { left - 1 }.clamp(1, n - 1);
    Some(Cut {
        m,
        sep: entries[m - 1].0.to_vec(),
    })
}

/// Sequential-insert detection. If the insert of `key` that needs the split goes right after
/// one of the node's two previous inserts, the workload fills the key space in order (one
/// ascending run, or several side by side, as parallel loaders of adjacent ranges do: two of
/// them alternating in one node each continue their own previous insert); for an inner node the
/// "insert" is the separator that `key`'s child will post when it splits. Then:
///
/// - past the last entry: a leaf keeps every entry and the run continues in the new, empty
///   right leaf (an inner node keeps all but its last separator);
/// - before existing entries: cut at the insertion point (leaves: with a separator just below
///   the first entry on the right), so the run keeps going left and never touches the right
///   node again.
///
/// Either way nodes are left full instead of half full: without it an ascending load leaves
/// every inner node half full, and a tree of 200,000 records one level taller than it needs.
/// Otherwise: `None` (split in the middle). `room`: the bytes the node has for a longer upper
/// fence than its own (its free space plus its upper fence's length).
pub(super) fn sequential_cut(
    kind: u8,
    entries: &[Entry<'_>],
    last: [usize; 2],
    key: &[u8],
    room: usize,
) -> Option<Cut> {
    let n = entries.len();
    let pos = entries.partition_point(|&(k, _, _)| k < key);
    if pos == 0 || !last.iter().any(|&l| pos == l + 1) {
        return None;
    }
    if kind == KIND_INNER {
        // keep at least one separator in each half
        return match pos {
            _ if n < 4 => None,
            p if p >= n => Some(Cut {
                m: n - 1,
                sep: entries[n - 2].0.to_vec(),
            }),
            p if p + 1 < n => Some(Cut {
                m: p + 1,
                sep: entries[p].0.to_vec(),
            }),
            _ => None,
        };
    }
    // A leaf of a few large records (three of YCSB's 1 KB ones) sees a random insert land
    // right after a recent one half the time: there a run is two inserts in a row right
    // before `key`'s place, and anything else splits evenly (`balanced_cut`).
    if n < 4 && (pos < 2 || last != [pos - 1, pos - 2]) {
        return None;
    }
    if pos >= n {
        // every entry stays left if its new upper fence (the last key) fits there, and the
        // new right leaf starts empty and takes the run; else the last entry moves right too
        let m = if room >= entries[n - 1].0.len() {
            n
        } else {
            n - 1
        };
        return Some(Cut {
            m,
            sep: entries[m - 1].0.to_vec(),
        });
    }
    let next = entries[pos].0;
    let sep = below(next).filter(|s| s.as_slice() >= key)?;
    Some(Cut { m: pos, sep })
}

/// Where a node splits.
#[derive(Clone, Copy)]
pub(super) enum How<'k> {
    /// To make room for `need` bytes for `key` (as [`sequential_cut`], else [`balanced_cut`],
    /// else in the middle).
    Make { key: &'k [u8], need: usize },
    /// A leaf, right after `sep` (a key inside its fences): `sep` becomes its upper fence.
    At(&'k [u8]),
    /// In the middle, by bytes.
    Middle,
}

/// Whether both halves of leaf page `p` split right after `sep` ([`How::At`]) fit a page: the
/// left one its keys up to `sep`, its lower fence and `sep`; the right one the rest, `sep` and
/// its upper fence (each written anew: no dead bytes).
fn halves_at_fit(p: shoal_engine::PageRef<'_>, sep: &[u8]) -> bool {
    let n = node::count(p);
    let (i, exact) = node::lower_bound(p, sep);
    let m = (i + usize::from(exact)).min(n);
    let bytes = |r: std::ops::Range<usize>| -> usize {
        r.map(|j| {
            let (_, k, v) = node::slot_info(p, j);
            node::entry_space(k, v)
        })
        .sum()
    };
    let fence = |upper| node::fence(p, upper).map_or(0, |f| f.len());
    let room = PAGE_DATA_SIZE - node::HEADER;
    bytes(0..m) + fence(false) + sep.len() <= room && bytes(m..n) + sep.len() + fence(true) <= room
}

impl How<'_> {
    /// The halves of a node of `kind` holding `entries`, as [`halves`] gives them (`last`:
    /// its last inserts; `room`: as for [`sequential_cut`]).
    fn halves<'e, 'a>(
        self,
        kind: u8,
        entries: &'e [Entry<'a>],
        last: [usize; 2],
        room: usize,
    ) -> (&'e [Entry<'a>], Vec<u8>, &'e [Entry<'a>], u64) {
        match self {
            How::Make { key, .. } if kind == KIND_LEAF && entries.len() < 2 => {
                // no cut divides fewer than two entries: the new key goes to one side, the
                // entry (if any) to the other
                let sep = match entries.first() {
                    Some(&(k, _, _)) if k < key => k,
                    _ => key,
                };
                let m = entries.partition_point(|&(k, _, _)| k <= sep);
                (&entries[..m], sep.to_vec(), &entries[m..], NO_PAGE)
            }
            How::Make { key, need } => {
                let cut = sequential_cut(kind, entries, last, key, room)
                    .or_else(|| balanced_cut(kind, entries, key, need));
                halves(kind, entries, cut)
            }
            How::At(sep) => {
                assert_eq!(kind, KIND_LEAF, "only a leaf splits at a given key");
                let m = entries.partition_point(|&(k, _, _)| k <= sep);
                (&entries[..m], sep.to_vec(), &entries[m..], NO_PAGE)
            }
            How::Middle => halves(kind, entries, None),
        }
    }
}

/// A short key `s` with `s < b`, as close below `b` as a few extra bytes allow (or `None`).
pub(super) fn below(b: &[u8]) -> Option<Vec<u8>> {
    let (last, head) = b.split_last()?;
    let mut s = head.to_vec();
    if *last > 0 {
        s.push(last - 1);
        s.extend_from_slice(&[0xFF; 8]);
    }
    (s.len() <= MAX_KEY && s.as_slice() < b).then_some(s)
}

pub(super) fn fill(n: &mut NodeMut<'_>, entries: &[Entry<'_>]) {
    for &(k, v, f) in entries {
        let c = n.count();
        n.insert_flagged(c, k, v, f);
    }
}

/// Move the entries of `rx` into its left neighbour `lx` (children `j` and `j + 1` of `px`;
/// all three exclusively latched; the caller checked that the result fits) and unlink `rx`:
/// `lx` takes over its upper fence, right link and (inner nodes) upper child, and `px` loses
/// the separator between them. The caller frees `rx`.
pub(super) fn merge_into_left(
    px: &mut ExclusiveGuard<'_>,
    j: usize,
    lx: &mut ExclusiveGuard<'_>,
    rx: &mut ExclusiveGuard<'_>,
) {
    let (lpid, rpid) = (lx.pid().raw(), rx.pid().raw());
    let sep = px.modify(|b| {
        let mut n = NodeMut::new(b);
        assert!(
            n.child(j) == lpid && n.child(j + 1) == rpid,
            "parent does not point at the merged nodes"
        );
        let sep = n.key(j).to_vec();
        n.remove_at(j);
        n.set_child(j, lpid); // the slot that pointed at the right node
        sep
    });
    let r = NodeRef::of(rx.data());
    // Append in place: left keeps its records (compacted only if its heap runs out).
    lx.modify(|b| {
        let mut n = NodeMut::new(b);
        n.set_upper_fence(r.fences().1.as_deref());
        if n.kind() == KIND_INNER {
            // left's upper child holds the keys up to the separator: it becomes an entry
            let c = n.count();
            let child = n.upper_child().to_le_bytes();
            n.insert_at(c, &sep, &child);
        }
        for i in 0..r.count() {
            let c = n.count();
            n.insert_flagged(c, r.key(i), r.value(i), r.flags(i));
        }
        n.set_right(r.right());
        n.set_upper_child(r.upper_child());
    });
}

/// A copy of an exclusively latched page's data area.
pub(super) fn page_copy(g: &ExclusiveGuard<'_>) -> [u8; PAGE_DATA_SIZE] {
    g.data()
        .try_into()
        .expect("a page's data area is PAGE_DATA_SIZE bytes")
}

/// Split non-root node `x` (child of `px`, both exclusively latched) into itself and a new
/// right sibling, and post the separator to the parent.
pub(super) fn split_child(
    w: &Worker,
    px: &mut ExclusiveGuard<'_>,
    x: &mut ExclusiveGuard<'_>,
    how: How<'_>,
) -> OpResult<()> {
    // the entries are read from a copy: `x` is rewritten while they are used
    let orig: [u8; PAGE_DATA_SIZE] = page_copy(x);
    let n = NodeRef::new(&orig);
    let (kind, level, entries, upper) = (n.kind(), n.level(), n.entries(), n.upper_child());
    let (right, (lower_fence, upper_fence), last) = (n.right(), n.fences(), n.last_inserts());
    let room = n.free_space() + upper_fence.as_ref().map_or(0, Vec::len);
    let (left, sep, rest, left_upper) = how.halves(kind, &entries, last, room);
    let mut rg = w.allocate()?;
    let rpid = rg.pid();
    rg.modify(|b| {
        let mut n = NodeMut::new(b);
        n.init(kind, level, Some(&sep), upper_fence.as_deref());
        fill(&mut n, rest);
        n.set_right(right);
        n.set_upper_child(upper);
    });
    let xpid = x.pid();
    x.modify(|b| {
        let mut n = NodeMut::new(b);
        n.init(kind, level, lower_fence.as_deref(), Some(&sep));
        fill(&mut n, left);
        n.set_right(rpid.raw());
        n.set_upper_child(left_upper);
    });
    px.modify(|b| {
        let mut n = NodeMut::new(b);
        let (j, _) = n.lower_bound(&sep);
        assert_eq!(
            n.child(j),
            xpid.raw(),
            "parent does not point at the split node"
        );
        n.set_child(j, rpid.raw());
        n.insert_at(j, &sep, &xpid.raw().to_le_bytes());
    });
    Ok(())
}

impl BTree {
    /// `target`, a node on `key`'s path, became underfull: merge it with a neighbour under the
    /// same parent (the right one, else the left one) if the two fit in one page, then the
    /// parent if that became underfull, and so on up; a root left with a single child takes
    /// over that child's contents (the tree gets one level lower). Best effort: a merge that
    /// does not fit is skipped, and the remove that asked for it is done either way, so an
    /// error here is logged, not returned (the tree stays valid, only less compact). Only
    /// `remove` calls it. (Pages merged away are freed on a single node and recycled on a
    /// cluster node: `ExclusiveGuard::free`.)
    pub(crate) fn merge_underfull(&self, w: &Worker, key: &[u8], mut target: Pid) {
        loop {
            match w.run(|w| self.try_merge(w, key, target)) {
                Ok(Some(next)) => target = next,
                Ok(None) => return,
                Err(e) => return merge_failed(target, &e),
            }
        }
    }

    /// One step of `merge_underfull` for `target`. Returns the node to look at next: the
    /// parent, if the merge left it underfull (or, for the root, with a single child).
    pub(super) fn try_merge(&self, w: &Worker, key: &[u8], target: Pid) -> OpResult<Option<Pid>> {
        match self.path_to(w, key, Some(target))? {
            Some((parent, g)) => self.merge_with_neighbour(w, key, parent, g),
            None => Ok(None), // merged or split away meanwhile
        }
    }

    /// `try_merge` for node `g` on `key`'s path, reached through `parent` (`None`: the root).
    pub(super) fn merge_with_neighbour<'w>(
        &self,
        w: &'w Worker,
        key: &[u8],
        parent: Option<OptimisticGuard<'w>>,
        g: OptimisticGuard<'w>,
    ) -> OpResult<Option<Pid>> {
        let Some(parent) = parent else {
            self.shrink_root(w, g)?;
            return Ok(None);
        };
        let underfull = node::is_underfull(g.page());
        g.validate()?;
        if !underfull {
            return Ok(None); // refilled meanwhile
        }
        let pp = parent.page();
        let (i, _) = node::lower_bound(pp, key); // `target` is child i
        let n = node::count(pp);
        // Separator j lies between children j and j + 1: try the right neighbour (j = i),
        // then the left one (j = i - 1).
        for j in [Some(i), i.checked_sub(1)].into_iter().flatten() {
            if j >= n {
                continue;
            }
            let (lpid, rpid) = (Pid(node::child(pp, j)), Pid(node::child(pp, j + 1)));
            let sep_len = node::key_len(pp, j);
            let left = descend(w, &parent, lpid)?;
            let right = descend(w, &parent, rpid)?;
            let (lp, rp) = (left.page(), right.page());
            let kind = node::kind(lp);
            let fits = node::kind(rp) == kind
                && node::merged_size(kind, lp, rp, sep_len) <= PAGE_DATA_SIZE;
            left.validate()?;
            right.validate()?;
            if !fits {
                continue;
            }
            // Top-down, left to right, like splits and scans: no waiting in a cycle.
            let mut px = parent.to_exclusive()?;
            let mut lx = left.to_exclusive()?;
            let mut rx = right.to_exclusive()?;
            merge_into_left(&mut px, j, &mut lx, &mut rx);
            if let Err(e) = rx.free() {
                // The merge is done (the tree no longer reaches the page): only its slot is
                // not reused. Carry on with the parent.
                log::warn!("B-tree page {rpid} was merged away but could not be freed: {e}");
            }
            let pp = px.page();
            let next = if px.pid() == self.root {
                node::count(pp) == 0
            } else {
                node::is_underfull(pp)
            };
            return Ok(next.then_some(px.pid()));
        }
        Ok(None)
    }

    /// The root (which never moves) has a single child and no separators: copy the child's
    /// contents into it and free the child.
    pub(super) fn shrink_root(&self, w: &Worker, root: OptimisticGuard<'_>) -> OpResult<()> {
        let p = root.page();
        let single = node::kind(p) == KIND_INNER && node::count(p) == 0;
        let only = Pid(node::child(p, 0));
        root.validate()?;
        if !single {
            return Ok(());
        }
        let child = descend(w, &root, only)?;
        let mut rx = root.to_exclusive()?;
        let cx = child.to_exclusive()?;
        // The only child spans every key: no fences, no right sibling.
        debug_assert!(node::fence(cx.page(), false).is_none() && node::right(cx.page()) == NO_PAGE);
        let image = cx.data().to_vec();
        rx.modify(|b| b.copy_from_slice(&image));
        cx.free().map_err(Restart::Fail)
    }

    /// Split the node `target` on `key`'s path unless it already has `need` free bytes.
    pub(crate) fn try_split(
        &self,
        w: &Worker,
        key: &[u8],
        target: Pid,
        need: usize,
    ) -> OpResult<()> {
        let Some((parent, g)) = self.path_to(w, key, Some(target))? else {
            return Ok(()); // target is no longer on the path: it was split already
        };
        let px = match parent {
            Some(pg) => Some(pg.to_exclusive()?),
            None => None,
        };
        let x = g.to_exclusive()?;
        if node::free_space(x.page()) >= need {
            return Ok(()); // someone split it meanwhile
        }
        self.split_latched(w, px, x, key, How::Make { key, need })
    }

    /// Split `x` (exclusively latched, on `key`'s path) as `how` says, under its parent `px`
    /// (`None`: `x` is the root). A parent without room for a separator is split first (then
    /// the caller's operation restarts).
    fn split_latched(
        &self,
        w: &Worker,
        mut px: Option<ExclusiveGuard<'_>>,
        mut x: ExclusiveGuard<'_>,
        key: &[u8],
        how: How<'_>,
    ) -> OpResult<()> {
        match px.as_mut() {
            None => self.split_root(w, &mut x, how),
            Some(pxg) => {
                let sep_need = node::entry_space(MAX_KEY, 8);
                if node::free_space(pxg.page()) < sep_need {
                    let ppid = pxg.pid();
                    drop(x);
                    drop(px);
                    self.try_split(w, key, ppid, sep_need)?;
                    return Err(Restart::Retry);
                }
                split_child(w, pxg, &mut x, how)
            }
        }
    }

    /// Split the leaf whose keys take in `sep` so that `sep` is its last key: the keys up to
    /// `sep` stay, the rest move to a new right sibling (either side may be left without
    /// keys). Nothing to do where a leaf ends at `sep` already. A commit that writes more new
    /// keys into one gap between a leaf's keys than a leaf holds splits it this way at its own
    /// keys, which are not in the tree yet (no split at the leaf's keys separates them).
    pub(crate) fn split_leaf_at(&self, w: &Worker, sep: &[u8]) -> OpResult<()> {
        let Some((parent, g)) = self.path_to(w, sep, None)? else {
            return Ok(());
        };
        let p = g.page();
        let ends_at_sep = node::fence(p, true).is_some_and(|u| u == sep);
        // (a leaf of fewer than two keys always fits: a key, two fences and `sep` take less
        // than a page)
        let fits = node::count(p) < 2 || halves_at_fit(p, sep);
        g.validate()?;
        if ends_at_sep {
            return Ok(());
        }
        // where a half would not hold its keys with `sep` for a fence (a full leaf whose keys
        // all lie on one side of a long `sep`), split in the middle first: the caller tries
        // again, and `sep` then splits a leaf with room
        let how = if fits { How::At(sep) } else { How::Middle };
        let px = match parent {
            Some(pg) => Some(pg.to_exclusive()?),
            None => None,
        };
        let x = g.to_exclusive()?;
        self.split_latched(w, px, x, sep, how)
    }

    /// Descend along `key`'s path to the node `target` (`None`: to the leaf). Returns it with
    /// its parent (`None` for the root), or `None` if `target` is not on the path (any more).
    /// Kept apart from `find_leaf` so that lookups do not carry the parent along.
    #[allow(clippy::type_complexity)]
    pub(super) fn path_to<'w>(
        &self,
        w: &'w Worker,
        key: &[u8],
        target: Option<Pid>,
    ) -> OpResult<Option<(Option<OptimisticGuard<'w>>, OptimisticGuard<'w>)>> {
        let mut parent = None;
        let mut g = w.optimistic(self.root)?;
        while Some(g.pid()) != target {
            let p = g.page();
            match node::kind(p) {
                KIND_INNER => {}
                KIND_LEAF if target.is_none() => break,
                _ => {
                    g.validate()?;
                    return match target {
                        None => Err(not_a_node(g.pid())),
                        Some(_) => Ok(None), // a leaf (or not a node) before `target`
                    };
                }
            }
            let (i, _) = node::lower_bound(p, key);
            let child = descend(w, &g, Pid(node::child(p, i)))?;
            parent = Some(g);
            g = child;
        }
        Ok(Some((parent, g)))
    }

    pub(super) fn split_root(
        &self,
        w: &Worker,
        root: &mut ExclusiveGuard<'_>,
        how: How<'_>,
    ) -> OpResult<()> {
        // the entries are read from a copy: the root is rewritten while they are used
        let orig: [u8; PAGE_DATA_SIZE] = page_copy(root);
        let n = NodeRef::new(&orig);
        let (kind, level, entries, upper, last) = (
            n.kind(),
            n.level(),
            n.entries(),
            n.upper_child(),
            n.last_inserts(),
        );
        let mut lg = w.allocate()?;
        let mut rg = match w.allocate() {
            Ok(g) => g,
            Err(e) => {
                // (a full device, say): give the unused left page back
                let _ = lg.free();
                return Err(e.into());
            }
        };
        let (left, sep, right, left_upper) = how.halves(kind, &entries, last, n.free_space());
        let (lpid, rpid) = (lg.pid(), rg.pid());
        lg.modify(|b| {
            let mut n = NodeMut::new(b);
            n.init(kind, level, None, Some(&sep));
            fill(&mut n, left);
            n.set_right(rpid.raw());
            n.set_upper_child(left_upper);
        });
        rg.modify(|b| {
            let mut n = NodeMut::new(b);
            n.init(kind, level, Some(&sep), None);
            fill(&mut n, right);
            n.set_right(NO_PAGE);
            n.set_upper_child(upper);
        });
        root.modify(|b| {
            let mut n = NodeMut::new(b);
            n.init(KIND_INNER, level + 1, None, None);
            n.insert_at(0, &sep, &lpid.raw().to_le_bytes());
            n.set_upper_child(rpid.raw());
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 47: a leaf of three 1 KB records that takes a fourth splits two and two, wherever
    /// the fourth goes (a cut of the old entries alone leaves three on one side).
    #[test]
    fn a_leaf_of_three_large_records_splits_two_and_two_with_the_fourth() {
        let value = vec![0u8; 1000];
        let keys: [&[u8]; 3] = [b"b", b"d", b"f"];
        let entries: Vec<Entry<'_>> = keys.iter().map(|k| (*k, &value[..], 0)).collect();
        let need = node::entry_space(1, 1000);
        for new in [&b"a"[..], b"c", b"e", b"g"] {
            let cut = balanced_cut(KIND_LEAF, &entries, new, need).expect("a new key");
            let (left, sep, right, _) = halves(KIND_LEAF, &entries, Some(cut));
            let goes_left = new <= sep.as_slice();
            let (l, r) = (
                left.len() + usize::from(goes_left),
                right.len() + usize::from(!goes_left),
            );
            assert_eq!((l, r), (2, 2), "inserting {new:?}: sep {sep:?}");
            assert!(left.iter().all(|e| e.0 <= sep.as_slice()));
            assert!(right.iter().all(|e| e.0 > sep.as_slice()));
        }
        // a key the leaf holds (a value growing in place), and inner nodes: no such cut
        assert!(balanced_cut(KIND_LEAF, &entries, b"d", need).is_none());
        assert!(balanced_cut(KIND_INNER, &entries, b"c", need).is_none());
    }
}
