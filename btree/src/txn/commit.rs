//! A transaction's commit: latch the leaves it writes, check their room, validate its reads,
//! write, let go (see the module docs of `txn`).

use super::read::{point_holds, range_holds, Held, Holds, Witnesses};
use super::writes::{Addend, Op, Write};
use super::{ReadAt, Transaction, TxError};
use crate::error::TreeError;
use crate::node::{self, entry_space, NodeMut, FLAG_OVERFLOW, MAX_RECORD};
use crate::overflow::{self, ValueRef};
use crate::tree::BTree;
use shoal_engine::{
    CommitPoint, ExclusiveGuard, OpResult, OptimisticGuard, Pid, Restart, Worker, PAGE_DATA_SIZE,
};
use std::borrow::Cow;

/// Commit attempts (each latches, checks and validates again) before a commit that keeps
/// meeting busy leaves or splitting gives up with [`TxError::Conflict`].
const ATTEMPTS: u32 = 64;

/// Most bytes the writes into one leaf may take (what a nearly empty leaf holds): where they
/// need more, the leaf is split at keys of the commit's own ([`Attempt::SplitAt`]), since no
/// split at the leaf's keys puts keys between keys that are not in the tree yet.
const MAX_GAP: usize = PAGE_DATA_SIZE - node::HEADER - 2 * node::MAX_KEY;

/// One write as it goes into a leaf: the bytes the slot holds and its flags.
struct Stored<'t> {
    tree: BTree,
    key: &'t [u8],
    /// `None`: remove (or, with `patch`, neither).
    value: Option<(Cow<'t, [u8]>, u16)>,
    /// Bytes to write over the value the leaf holds, at their offsets ([`Op::Patch`]).
    patch: Option<&'t [(usize, Vec<u8>)]>,
    /// Adds to integers of the value the leaf holds ([`Op::Add`]).
    adds: Option<&'t [Addend]>,
    /// Where the transaction read the key (see [`Write::read_at`]).
    read_at: Option<ReadAt>,
}

impl Stored<'_> {
    /// The room this write takes in its leaf at most: what its slot's bytes grow by if the
    /// key was read with a value (the read is validated before anything is written), else a
    /// whole entry.
    fn need_at_most(&self) -> usize {
        let Some((v, _)) = &self.value else {
            return 0;
        };
        match self.read_at.and_then(|r| r.len) {
            Some(old) => v.len().saturating_sub(old),
            None => entry_space(self.key.len(), v.len()),
        }
    }
}

/// What a commit leaves to do once its leaves are let go: overflow chains its writes replaced
/// (to free), and leaves a removal may have left underfull (to merge).
type Leftovers = (Vec<ValueRef>, Vec<(BTree, Vec<u8>, Pid)>);

/// What one attempt came to.
enum Attempt {
    /// Written; what is left to do.
    Done(Leftovers),
    /// A leaf was busy (another committer, a reader's shared latch): try again.
    Busy,
    /// Leaf `pid` on `key`'s path of `tree` needs `need` free bytes: split it, try again.
    Split(BTree, Vec<u8>, Pid, usize),
    /// The writes into one leaf of `tree` need more than a leaf holds: split leaves after
    /// each of these keys of the writes (in key order), so that each part fits, try again.
    SplitAt(BTree, Vec<Vec<u8>>),
    /// A read no longer holds.
    Conflict,
    /// Write `i`'s adds do not fit the value its key has (or it has none).
    AddOutside(usize),
    /// The writes go to this many leaves, more than one commit can log.
    TooLarge(usize),
}

/// The leaves an attempt holds, let go unchanged unless the attempt wrote them.
struct Latched<'a, 'w> {
    guards: &'a mut Vec<ExclusiveGuard<'w>>,
}

impl Drop for Latched<'_, '_> {
    fn drop(&mut self) {
        for g in self.guards.drain(..) {
            g.release_unchanged();
        }
    }
}

/// The buffers of a commit, kept by its thread for the next one, as the transaction's own
/// are: a commit then allocates nothing once they have grown. Empty between commits. Their
/// elements borrow from one commit, so they are kept as `'static` and [`reuse`]d.
#[derive(Default)]
struct Kept {
    order: Vec<&'static Write>,
    stored: Vec<Stored<'static>>,
    leaves: Vec<Pid>,
    each: Each<'static>,
}

/// What one attempt fills and the next empties (see [`attempt`]).
#[derive(Default)]
struct Each<'w> {
    guards: Vec<OptimisticGuard<'w>>,
    latched: Vec<ExclusiveGuard<'w>>,
    goes: Vec<(Pid, usize)>,
    slots: Vec<Option<usize>>,
    groups: Vec<std::ops::Range<usize>>,
    rest: Vec<usize>,
    last: LastLeaf,
}

impl<'w> Each<'w> {
    fn reuse<'v>(self) -> Each<'v> {
        Each {
            guards: reuse(self.guards),
            latched: reuse(self.latched),
            goes: self.goes,
            slots: self.slots,
            groups: self.groups,
            rest: self.rest,
            last: self.last,
        }
    }
}

/// Most writes a commit's kept buffers are kept for (a larger commit's are freed).
const KEPT_WRITES: usize = 4096;

thread_local! {
    static KEPT: std::cell::Cell<Option<Kept>> = const { std::cell::Cell::new(None) };
}

/// `v`, emptied, as a `Vec` of `U` (the same layout, as `T` and `U` that differ only in
/// lifetimes): collecting in place keeps its allocation, so kept buffers whose elements
/// borrow serve one commit after another.
fn reuse<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| unreachable!("emptied")).collect()
}

pub(super) fn commit(tx: &mut Transaction<'_>) -> Result<CommitPoint, TxError> {
    if tx.writes.is_empty() {
        return commit_reads(tx);
    }
    let mut kept = KEPT.with(|k| k.take()).unwrap_or_default();
    let mut order = reuse(std::mem::take(&mut kept.order));
    let mut stored = reuse(std::mem::take(&mut kept.stored));
    let mut each = std::mem::take(&mut kept.each).reuse();
    let r = commit_writes(tx, &mut order, &mut stored, &mut kept.leaves, &mut each);
    if stored.capacity() <= KEPT_WRITES {
        kept.order = reuse(order);
        kept.stored = reuse(stored);
        kept.leaves.clear();
        kept.each = each.reuse();
        KEPT.with(|k| k.set(Some(kept)));
    }
    r
}

/// The commit of a transaction that wrote nothing: valid if every read still holds now, or
/// if every read came from one leaf at one stamp (each read copied what the leaf held at its
/// stamp, so together they are the leaf as it was at that moment: a consistent state,
/// whatever came after).
fn commit_reads(tx: &Transaction<'_>) -> Result<CommitPoint, TxError> {
    let w = tx.w;
    if !reads_hold(tx)? {
        return Err(TxError::Conflict);
    }
    Ok(w.commit_later()?)
}

/// Whether every read of `tx` still holds, all at one moment (its commit's validation,
/// holding no leaf).
pub(super) fn reads_hold(tx: &Transaction<'_>) -> Result<bool, TxError> {
    if one_leaf_one_stamp(tx) {
        return Ok(true);
    }
    Ok(tx.w.run(|w| validate(w, tx, &Held::none()))?)
}

/// The commit of a transaction that wrote (`order`, `stored`, `leaves` and `each` are empty
/// buffers to fill).
fn commit_writes<'t, 'w>(
    tx: &'t Transaction<'w>,
    order: &mut Vec<&'t Write>,
    stored: &mut Vec<Stored<'t>>,
    leaves: &mut Vec<Pid>,
    each: &mut Each<'w>,
) -> Result<CommitPoint, TxError> {
    let w = tx.w;
    // Values too large for a leaf go to overflow pages first (not referenced until the
    // leaves are written; freed again if the commit fails).
    let mut chains: Vec<ValueRef> = Vec::new();
    tx.writes.sorted_into(order);
    let mut prepare = || -> Result<(), TxError> {
        for &wr in order.iter() {
            let key = tx.writes.key(wr);
            let mut adds = None;
            let (value, patch) = match tx.writes.op(wr) {
                Op::Remove => (None, None),
                Op::Patch(ps) => (None, Some(ps)),
                Op::Add(a) => {
                    adds = Some(a);
                    (None, None)
                }
                Op::Put(v) if key.len() + v.len() > MAX_RECORD => {
                    let r = overflow::write(w, v)?;
                    chains.push(r);
                    (Some((Cow::Owned(r.encode().to_vec()), FLAG_OVERFLOW)), None)
                }
                Op::Put(v) => (Some((Cow::Borrowed(v), 0)), None),
            };
            stored.push(Stored {
                tree: BTree::at(Pid(wr.root), w.database()),
                key,
                value,
                patch,
                adds,
                read_at: wr.read_at,
            });
        }
        Ok(())
    };
    if let Err(e) = prepare() {
        chains.iter().for_each(|&r| overflow::free(w, r));
        return Err(e);
    }
    let (replaced, underfull) = match attempts(w, tx, stored, leaves, each) {
        Ok(done) => done,
        Err(e) => {
            chains.iter().for_each(|&r| overflow::free(w, r));
            return Err(e);
        }
    };
    // after the leaves are let go: nobody can reach these chains any more (a reader that saw
    // a reference held the leaf, or fails its validation)
    for r in replaced {
        overflow::free(w, r);
    }
    for (tree, key, pid) in underfull {
        tree.merge_underfull(w, &key, pid);
    }
    // (the writes are in the leaves: an error now is the log's, after them)
    w.commit_later().map_err(TxError::DurabilityUnknown)
}

/// Attempt the commit until it is done, conflicts, or met busy or moving leaves
/// [`ATTEMPTS`] times (then [`TxError::Conflict`]: the caller runs the transaction again).
///
/// A restart (a leaf changed between finding and latching it, or a leaf of another home was
/// asked for while others were latched: a cluster node never waits for a remote page while it
/// holds latches) counts as a busy attempt. Before the next, the attempt's leaves are gathered
/// to this node (node-exclusive, waiting for each while holding nothing: on a single node
/// nothing to do), and a pause that grows with the tries lets a committer that holds them
/// finish. Retrying at once instead let two nodes committing to the same leaves take them from
/// each other for ever, neither ever holding all of its own at once (`shoal tpcc --nodes 2
/// --mode uniform` stopped at 0 transactions/s).
fn attempts<'w>(
    w: &'w Worker,
    tx: &Transaction<'_>,
    stored: &[Stored<'_>],
    leaves: &mut Vec<Pid>,
    each: &mut Each<'w>,
) -> Result<Leftovers, TxError> {
    // (splits make progress, so they do not count as tries: each leaves more room for the
    // writes, and a commit of many writes into an empty tree needs one per leaf it fills; past
    // one per write, and some for other writers filling the same leaves, they count)
    let free_splits = stored.len() + ATTEMPTS as usize;
    let mut tries = 0;
    let mut splits = 0usize;
    while tries < ATTEMPTS {
        leaves.clear();
        let attempt = attempt(w, tx, stored, leaves, each);
        let split = matches!(attempt, Ok(Attempt::Split(..) | Attempt::SplitAt(..)));
        if !split || splits > free_splits {
            tries += 1;
        }
        match attempt {
            Ok(Attempt::Done(left)) => return Ok(left),
            Ok(Attempt::Conflict) => return Err(TxError::Conflict),
            Ok(Attempt::TooLarge(leaves)) => {
                // (only if what it read held: a write set built on reads that never held
                // together is a conflict, run again, not the caller's error)
                if !reads_hold(tx)? {
                    return Err(TxError::Conflict);
                }
                return Err(TxError::TooLarge {
                    leaves,
                    most: w.most_pages_per_commit(),
                });
            }
            Ok(Attempt::AddOutside(i)) => {
                let s = &stored[i];
                let a = s.adds.and_then(|a| a.iter().max_by_key(|a| a.end()));
                return Err(TreeError::AddOutside {
                    key: s.key.to_vec(),
                    start: a.map_or(0, |a| a.at),
                    end: a.map_or(0, |a| a.end()),
                }
                .into());
            }
            Ok(Attempt::Busy) | Err(Restart::Retry) => {
                for &pid in leaves.iter() {
                    // (a leaf freed meanwhile fails here: the next attempt descends again)
                    let _ = w.gather_exclusive(pid);
                }
                super::backoff(tries)
            }
            Ok(Attempt::Split(tree, key, pid, need)) => {
                splits += 1;
                w.run(|w| tree.try_split(w, &key, pid, need))?;
            }
            Ok(Attempt::SplitAt(tree, seps)) => {
                for sep in seps {
                    splits += 1;
                    w.run(|w| tree.split_leaf_at(w, &sep))?;
                }
            }
            Err(Restart::Fail(e)) => return Err(e.into()),
        }
    }
    Err(TxError::Conflict)
}

/// The leaf a descent found last, and the keys it holds (between its fences): the next write
/// of the same tree goes there too if its key lies between them (writes come in key order).
/// Its fence buffers are kept from one descent to the next.
#[derive(Default)]
struct LastLeaf {
    /// The tree and leaf (`None`: no descent yet).
    at: Option<(Pid, Pid)>,
    /// The fences, where the leaf has them (`has_lower`, `has_upper`).
    lower: Vec<u8>,
    upper: Vec<u8>,
    has_lower: bool,
    has_upper: bool,
}

impl LastLeaf {
    fn holds(&self, root: Pid, key: &[u8]) -> Option<Pid> {
        let (r, pid) = self.at?;
        (r == root
            && (!self.has_lower || key > &self.lower[..])
            && (!self.has_upper || key <= &self.upper[..]))
            .then_some(pid)
    }
}

/// One attempt (restarts, `Restart::Retry`, let every leaf go and run it again). `found`
/// gets the leaves it will latch, in page order, once it has found them all; `each` holds
/// its buffers (emptied here).
fn attempt<'w>(
    w: &'w Worker,
    tx: &Transaction<'_>,
    stored: &[Stored<'_>],
    found: &mut Vec<Pid>,
    each: &mut Each<'w>,
) -> OpResult<Attempt> {
    let Each {
        guards,
        latched,
        goes,
        slots,
        groups,
        rest,
        last,
    } = each;
    // (a restart may leave guards: optimistic ones are let go as they are; latched ones were
    // let go unchanged by `Latched`)
    guards.clear();
    debug_assert!(
        latched.is_empty(),
        "an attempt's latches are let go at its end"
    );
    goes.clear();
    groups.clear();
    last.at = None;
    // 1. the leaf of every write (an optimistic guard per leaf, in page order, validated when
    //    it is latched), and which writes go to it: `goes` holds (leaf, write) pairs
    // the slot of write `i`'s key in its leaf, where its read found it in the same leaf at
    // the same stamp (the leaf unchanged since: latching it below checks that it still is)
    slots.clear();
    slots.resize(stored.len(), None);
    let slot =
        |guards: &[OptimisticGuard<'w>], pid: Pid| guards.binary_search_by_key(&pid, |g| g.pid());
    for (i, s) in stored.iter().enumerate() {
        if let Some(pid) = last.holds(s.tree.root(), s.key) {
            goes.push((pid, i));
            continue;
        }
        // the leaf the key was read from, while it is unchanged since (it held the key then)
        if let Some(at) = s.read_at {
            match slot(guards, at.leaf) {
                Ok(j) if guards[j].stamp() == at.stamp => {
                    goes.push((at.leaf, i));
                    slots[i] = at.slot;
                    continue;
                }
                Ok(_) => {}
                Err(j) => match w.optimistic(at.leaf) {
                    Ok(g) if g.stamp() == at.stamp => {
                        guards.insert(j, g);
                        goes.push((at.leaf, i));
                        slots[i] = at.slot;
                        continue;
                    }
                    // changed, or gone (a merge freed it): descend
                    Ok(_) | Err(Restart::Fail(_)) => {}
                    Err(r) => return Err(r),
                },
            }
        }
        let g = s.tree.find_leaf(w, s.key)?;
        let p = g.page();
        last.has_lower = node::fence_into(p, false, &mut last.lower);
        last.has_upper = node::fence_into(p, true, &mut last.upper);
        g.validate()?;
        let pid = g.pid();
        last.at = Some((s.tree.root(), pid));
        if let Err(j) = slot(guards, pid) {
            guards.insert(j, g);
        }
        goes.push((pid, i));
    }
    // (each leaf's writes together, in key order)
    goes.sort_unstable();
    found.extend(guards.iter().map(|g| g.pid()));
    // every leaf written is logged in one chunk, so there is a most (checked before any is
    // latched, let alone written)
    if guards.len() > w.most_pages_per_commit() {
        return Ok(Attempt::TooLarge(guards.len()));
    }
    // 2. latch them in page order without waiting (a changed leaf: start over), and check
    //    each has room for its writes on its page as it is; `groups[k]` are the writes
    //    (`goes[groups[k]]`) into leaf `latched.guards[k]`
    let latched = Latched { guards: latched };
    let mut next = 0;
    for g in guards.drain(..) {
        let first = next;
        while next < goes.len() && goes[next].0 == g.pid() {
            next += 1;
        }
        let ws = &goes[first..next];
        debug_assert!(!ws.is_empty(), "every leaf found has a write");
        let Some(x) = g.try_exclusive()? else {
            return Ok(Attempt::Busy);
        };
        let free = node::free_space(x.page());
        let mut need: usize = ws.iter().map(|&(_, i)| stored[i].need_at_most()).sum();
        if need > free {
            need = leaf_need(&x, ws, stored); // exactly, on the page
        }
        if need > free {
            let s = &stored[ws[0].1];
            if need > MAX_GAP {
                return Ok(Attempt::SplitAt(s.tree, split_keys(ws, stored)));
            }
            return Ok(Attempt::Split(s.tree, s.key.to_vec(), x.pid(), need));
        }
        latched.guards.push(x);
        groups.push(first..next);
    }
    debug_assert_eq!(next, goes.len(), "every write goes to a leaf found");
    // 3. everything read still holds (through the guards held here for these leaves)
    debug_assert!(
        latched.guards.windows(2).all(|p| p[0].pid() < p[1].pid()),
        "leaves are latched in page order"
    );
    if !validate(w, tx, &Held(latched.guards))? {
        return Ok(Attempt::Conflict);
    }
    // a patch goes over a value in its leaf that holds its bytes: so the validated read of
    // those bytes says (checked again here, where it is cheap, instead of trusted)
    for (x, ws) in latched.guards.iter().zip(groups.iter()) {
        for &(_, i) in &goes[ws.clone()] {
            if let Some(ps) = stored[i].patch {
                if !patch_fits(x.page(), stored[i].key, slots[i], ps) {
                    return Ok(Attempt::Conflict);
                }
            }
            // (an add read nothing: a key that is not there for it is the caller's error)
            if let Some(adds) = stored[i].adds {
                if !adds_fit(x.page(), stored[i].key, slots[i], adds) {
                    return Ok(Attempt::AddOutside(i));
                }
            }
        }
    }
    // 4. write: the guards are let go together, their changes logged as one chunk
    let mut replaced = Vec::new();
    let mut underfull = Vec::new();
    for (mut x, ws) in latched.guards.drain(..).zip(groups.iter()) {
        let ws = &goes[ws.clone()];
        let pid = x.pid();
        // same-sized values of the same flags go straight into their place (only their bytes
        // are stored and logged); the rest change the node's layout, in one edit of a copy
        rest.clear();
        for &(_, i) in ws {
            let s = &stored[i];
            let p = x.page();
            let (at, exact) = find_slot(p, s.key, slots[i]);
            if let Some(ps) = s.patch {
                // only the patched bytes are written (and logged)
                let off = node::value_offset(p, at);
                for (o, bytes) in ps {
                    x.page_mut().write(off + o, bytes);
                }
                continue;
            }
            if let Some(adds) = s.adds {
                // each integer read from the latched leaf, added to, written back
                let off = node::value_offset(p, at);
                for a in adds {
                    let mut n = [0u8; 8];
                    let n = &mut n[..a.width];
                    x.page().read(off + a.at, n);
                    a.apply_to_part(n);
                    x.page_mut().write(off + a.at, n);
                }
                continue;
            }
            match &s.value {
                Some((v, flags))
                    if exact
                        && node::val_flags(p, at) == *flags
                        && node::slot_info(p, at).2 == v.len() =>
                {
                    if *flags & FLAG_OVERFLOW != 0 {
                        let mut old = Vec::new();
                        node::value_into(p, at, &mut old);
                        replaced.extend(ValueRef::decode(&old));
                    }
                    let off = node::value_offset(p, at);
                    x.page_mut().write(off, v);
                }
                _ => rest.push(i),
            }
        }
        if rest.is_empty() {
            continue;
        }
        let mut removed = false;
        x.modify_in(|b| {
            let mut n = NodeMut::new(b);
            // inserts alone name what they change (the header and slots, the heap's new
            // part): only that is compared and stored; anything else: the whole page
            let mut within: Option<[std::ops::Range<usize>; 2]> = Some([0..0, 0..0]);
            for &i in rest.iter() {
                let s = &stored[i];
                let (at, exact) = n.lower_bound(s.key);
                if exact && n.flags(at) & FLAG_OVERFLOW != 0 {
                    replaced.extend(ValueRef::decode(n.value(at)));
                }
                match &s.value {
                    None if exact => {
                        n.remove_at(at);
                        removed = true;
                        within = None;
                    }
                    None => {}
                    // (room checked above: the need is at most the free space)
                    Some((v, flags)) if exact => {
                        n.replace_flagged(at, v, *flags);
                        within = None;
                    }
                    Some((v, flags)) => {
                        let r = n.insert_flagged_within(at, s.key, v, *flags);
                        within = match (within, r) {
                            (Some([a0, a1]), Some([b0, b1])) => Some([
                                a0.start.min(b0.start)..a0.end.max(b0.end),
                                if a1.is_empty() {
                                    b1
                                } else {
                                    a1.start.min(b1.start)..a1.end.max(b1.end)
                                },
                            ]),
                            _ => None,
                        };
                    }
                }
            }
            ((), within)
        });
        if removed && node::is_underfull(x.page()) {
            let s = &stored[ws[0].1];
            underfull.push((s.tree, s.key.to_vec(), pid));
        }
    }
    Ok(Attempt::Done((replaced, underfull)))
}

/// Where `key` is in leaf page `p` (as [`node::lower_bound`]): at `known` if the key's read
/// found it there in the page as it still is.
fn find_slot(p: shoal_engine::PageRef<'_>, key: &[u8], known: Option<usize>) -> (usize, bool) {
    match known {
        Some(i) => {
            debug_assert_eq!(
                node::lower_bound(p, key),
                (i, true),
                "a key read in an unchanged leaf is where the read found it"
            );
            (i, true)
        }
        None => node::lower_bound(p, key),
    }
}

/// Whether `key`'s value in leaf page `p` (at slot `known`, if known) is kept in the leaf and
/// holds every byte `patches` writes.
fn patch_fits(
    p: shoal_engine::PageRef<'_>,
    key: &[u8],
    known: Option<usize>,
    patches: &[(usize, Vec<u8>)],
) -> bool {
    let (at, exact) = find_slot(p, key, known);
    exact
        && node::val_flags(p, at) & FLAG_OVERFLOW == 0
        && patches
            .iter()
            .all(|(o, b)| o + b.len() <= node::slot_info(p, at).2)
}

/// Whether `key`'s value in leaf page `p` (at slot `known`, if known) is kept in the leaf and
/// holds every integer `adds` adds to.
fn adds_fit(
    p: shoal_engine::PageRef<'_>,
    key: &[u8],
    known: Option<usize>,
    adds: &[Addend],
) -> bool {
    let (at, exact) = find_slot(p, key, known);
    exact
        && node::val_flags(p, at) & FLAG_OVERFLOW == 0
        && adds.iter().all(|a| a.end() <= node::slot_info(p, at).2)
}

/// Keys of the writes `ws` (into one leaf, in key order) after which to split, so that the
/// writes between two of them need at most three quarters of what a nearly empty leaf holds
/// (each write's room counted at most, as [`Stored::need_at_most`]; the leaves at either end
/// keep the old leaf's keys too, and split again as usual where they do not fit).
fn split_keys(ws: &[(Pid, usize)], stored: &[Stored<'_>]) -> Vec<Vec<u8>> {
    debug_assert!(ws.len() >= 2, "one write fits a leaf");
    let mut keys = Vec::new();
    let mut part = 0;
    for (j, &(_, i)) in ws.iter().enumerate() {
        let need = stored[i].need_at_most();
        if part > 0 && part + need > MAX_GAP / 4 * 3 {
            keys.push(stored[ws[j - 1].1].key.to_vec());
            part = 0;
        }
        part += need;
    }
    if keys.is_empty() {
        // (removals and growth counted as nothing: split in the middle of the writes)
        keys.push(stored[ws[ws.len() / 2 - 1].1].key.to_vec());
    }
    keys
}

/// The room the writes `ws` into leaf `x` take on its page as it is: an insert its entry, a
/// replace what its value grows by (removals are not counted: an upper bound, so writes whose
/// need fits the leaf's free space all fit, in any order).
fn leaf_need(x: &ExclusiveGuard<'_>, ws: &[(Pid, usize)], stored: &[Stored<'_>]) -> usize {
    let p = x.page();
    ws.iter()
        .map(|&(_, i)| {
            let s = &stored[i];
            let Some((v, _)) = &s.value else { return 0 };
            let (at, exact) = node::lower_bound(p, s.key);
            if exact {
                let (_, _, old) = node::slot_info(p, at);
                v.len().saturating_sub(old)
            } else {
                entry_space(s.key.len(), v.len())
            }
        })
        .sum()
}

/// Whether every read of `tx` came from one leaf at one stamp (or it read nothing).
fn one_leaf_one_stamp(tx: &Transaction<'_>) -> bool {
    let mut at = tx
        .points
        .iter()
        .map(|r| (r.leaf, r.stamp))
        .chain(tx.ranges.iter().flat_map(|r| r.leaves.iter().copied()));
    match at.next() {
        None => true,
        Some(first) => at.all(|x| x == first),
    }
}

/// Rounds of validation (each a first pass over every read and a second over the leaves it
/// relied on) before a validation whose leaves keep changing under it is a conflict.
const VALIDATION_ROUNDS: u32 = 3;

/// Whether every read of `tx` still holds, all at one moment (`held`: the leaves the commit
/// holds).
///
/// The first pass checks each read on its own: its leaf still has the stamp it had at the
/// read, or, where the leaf changed, the key (range) still holds what was read. Each read is
/// then known to hold at the moment it was checked, but those are different moments: a value
/// can change after it was checked and change back before the next is read (x checked at
/// 1000; x to 990 and y to 1010; y checked at 1010: together they never existed). Where a
/// leaf unchanged since the read vouched for every read, one moment serves all (the start
/// of validation: each leaf was unchanged from its read to its check, and stamps only grow).
/// Otherwise every leaf the first pass relied on, with the stamp it relied on, is noted as a
/// *witness*, and the second pass checks that each witness is unchanged still: then every one
/// was unchanged from its first-pass read to its second-pass check, an interval that holds
/// the end of the first pass, when every read held together. A witness that changed runs the
/// round again ([`VALIDATION_ROUNDS`], then a conflict).
fn validate(w: &Worker, tx: &Transaction<'_>, held: &Held<'_, '_>) -> OpResult<bool> {
    if !super::isolated() {
        return Ok(true);
    }
    let mut witnesses = Witnesses::with_buffer(WITNESSES.with(|b| b.take()));
    let r = validate_with(w, tx, held, &mut witnesses);
    WITNESSES.with(|b| b.set(witnesses.into_buffer()));
    r
}

thread_local! {
    /// The witnesses' buffer, kept by the thread for its next validation.
    static WITNESSES: std::cell::Cell<Vec<(Pid, shoal_engine::PageStamp)>> =
        const { std::cell::Cell::new(Vec::new()) };
}

fn validate_with(
    w: &Worker,
    tx: &Transaction<'_>,
    held: &Held<'_, '_>,
    witnesses: &mut Witnesses,
) -> OpResult<bool> {
    let mut now = Vec::new(); // (allocated only if a read's leaf changed)
    for _ in 0..VALIDATION_ROUNDS {
        witnesses.clear();
        for (i, r) in tx.points.iter().enumerate() {
            match point_holds(w, held, r, &tx.arena, &mut now, witnesses)? {
                Holds::No => return Ok(false),
                Holds::Unchanged if witnesses.by_value => witnesses.note_point(r),
                Holds::Unchanged => {}
                Holds::ByValue if !witnesses.by_value => {
                    // the first: the reads before it held by their unchanged leaves
                    witnesses.by_value = true;
                    tx.points[..i].iter().for_each(|p| witnesses.note_point(p));
                }
                Holds::ByValue => {}
            }
            #[cfg(test)]
            tests::between_reads();
        }
        for (j, r) in tx.ranges.iter().enumerate() {
            match range_holds(w, held, r, &tx.arena, witnesses)? {
                Holds::No => return Ok(false),
                Holds::Unchanged if witnesses.by_value => witnesses.note_range(r),
                Holds::Unchanged => {}
                Holds::ByValue if !witnesses.by_value => {
                    witnesses.by_value = true;
                    tx.points.iter().for_each(|p| witnesses.note_point(p));
                    tx.ranges[..j].iter().for_each(|q| witnesses.note_range(q));
                }
                Holds::ByValue => {}
            }
            #[cfg(test)]
            tests::between_reads();
        }
        if !witnesses.by_value || !second_pass_on() {
            return Ok(true);
        }
        if witnesses.unchanged(w, held)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether validation runs its second pass (always, but for the test that shows the first
/// pass alone commits a state that never existed).
fn second_pass_on() -> bool {
    #[cfg(test)]
    return tests::second_pass_on();
    #[cfg(not(test))]
    true
}

#[cfg(test)]
#[path = "commit_tests.rs"]
pub(super) mod tests;
