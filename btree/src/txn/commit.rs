//! A transaction's commit: latch the leaves it writes, check their room, validate its reads,
//! write, let go (see the module docs of `txn`).

use super::read::{point_holds, range_holds, Held};
use super::{Transaction, TxError, Write};
use crate::node::{self, entry_space, NodeMut, FLAG_OVERFLOW, MAX_RECORD};
use crate::overflow::{self, ValueRef};
use crate::tree::BTree;
use shoal_engine::{CommitPoint, ExclusiveGuard, OpResult, Pid, Restart, Worker, PAGE_DATA_SIZE};
use std::collections::BTreeMap;

/// Commit attempts (each latches, checks and validates again) before a commit that keeps
/// meeting busy leaves or splitting gives up with [`TxError::Conflict`].
const ATTEMPTS: u32 = 64;

/// One write as it goes into a leaf: the bytes the slot holds and its flags.
struct Stored<'t> {
    tree: BTree,
    key: &'t [u8],
    /// `None`: remove.
    value: Option<(Vec<u8>, u16)>,
}

/// What a commit leaves to do once its leaves are let go: overflow chains its writes replaced
/// (to free), and leaves a removal may have left underfull (to merge).
type Leftovers = (Vec<ValueRef>, Vec<(BTree, Vec<u8>, Pid)>);

/// What one attempt came to.
enum Attempt {
    /// Written; the overflow chains the writes replaced (freed now that the leaves are let go),
    /// and the leaves a removal may have left underfull.
    Done(Vec<ValueRef>, Vec<(BTree, Vec<u8>, Pid)>),
    /// A leaf was busy (another committer, a reader's shared latch): try again.
    Busy,
    /// Leaf `pid` on `key`'s path of `tree` needs `need` more bytes: split it, try again.
    Split(BTree, Vec<u8>, Pid, usize),
    /// A read no longer holds.
    Conflict,
}

/// The leaves an attempt holds, let go unchanged unless the attempt wrote them.
struct Latched<'w> {
    guards: Vec<ExclusiveGuard<'w>>,
}

impl Drop for Latched<'_> {
    fn drop(&mut self) {
        for g in self.guards.drain(..) {
            g.release_unchanged();
        }
    }
}

pub(super) fn commit(tx: &mut Transaction<'_>) -> Result<CommitPoint, TxError> {
    let w = tx.w;
    if tx.writes.is_empty() {
        // read-only: valid if every read still holds now
        let ok = w.run(|w| validate(w, tx, &Held::new()))?;
        if !ok {
            return Err(TxError::Conflict);
        }
        return Ok(w.commit_later()?);
    }
    // Values too large for a leaf go to overflow pages first (not referenced until the
    // leaves are written; freed again if the commit fails).
    let mut chains: Vec<ValueRef> = Vec::new();
    let mut stored: Vec<Stored<'_>> = Vec::with_capacity(tx.writes.len());
    let mut prepare = || -> Result<(), TxError> {
        for ((root, key), wr) in &tx.writes {
            let tree = BTree::at(Pid(*root));
            let value = match wr {
                Write::Remove => None,
                Write::Put(v) if key.len() + v.len() > MAX_RECORD => {
                    let r = overflow::write(w, v)?;
                    chains.push(r);
                    Some((r.encode().to_vec(), FLAG_OVERFLOW))
                }
                Write::Put(v) => Some((v.clone(), 0)),
            };
            stored.push(Stored { tree, key, value });
        }
        Ok(())
    };
    if let Err(e) = prepare() {
        chains.iter().for_each(|&r| overflow::free(w, r));
        return Err(e);
    }
    let outcome = attempts(w, tx, &stored);
    let (replaced, underfull) = match outcome {
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
    Ok(w.commit_later()?)
}

fn attempts(w: &Worker, tx: &Transaction<'_>, stored: &[Stored<'_>]) -> Result<Leftovers, TxError> {
    for tries in 0..ATTEMPTS {
        match w.run(|w| attempt(w, tx, stored))? {
            Attempt::Done(replaced, underfull) => return Ok((replaced, underfull)),
            Attempt::Conflict => return Err(TxError::Conflict),
            Attempt::Busy => super::backoff(tries + 1),
            Attempt::Split(tree, key, pid, need) => {
                w.run(|w| tree.try_split(w, &key, pid, need))?;
            }
        }
    }
    Err(TxError::Conflict)
}

/// One attempt (restarts, `Restart::Retry`, let every leaf go and run it again).
fn attempt<'w>(w: &'w Worker, tx: &Transaction<'_>, stored: &[Stored<'_>]) -> OpResult<Attempt> {
    // 1. the leaf of every write, and which writes go to it
    let mut leaves: BTreeMap<Pid, (shoal_engine::OptimisticGuard<'w>, Vec<usize>)> =
        BTreeMap::new();
    for (i, s) in stored.iter().enumerate() {
        let g = s.tree.find_leaf(w, s.key)?;
        match leaves.get_mut(&g.pid()) {
            Some((_, ws)) => ws.push(i),
            None => {
                leaves.insert(g.pid(), (g, vec![i]));
            }
        }
    }
    // 2. latch them in page order without waiting (a changed leaf: start over)
    let mut latched = Latched { guards: Vec::new() };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (_, (g, ws)) in leaves {
        match g.try_exclusive()? {
            Some(x) => {
                latched.guards.push(x);
                groups.push(ws);
            }
            None => return Ok(Attempt::Busy),
        }
    }
    // 3. the new contents of each leaf, on a copy: does everything fit?
    let mut images: Vec<Box<[u8; PAGE_DATA_SIZE]>> = Vec::with_capacity(groups.len());
    let mut replaced = Vec::new();
    let mut underfull = Vec::new();
    for (x, ws) in latched.guards.iter().zip(&groups) {
        let mut img: Box<[u8; PAGE_DATA_SIZE]> = Box::new([0; PAGE_DATA_SIZE]);
        img.copy_from_slice(x.data());
        let mut n = NodeMut::new(&mut img);
        let mut removed = false;
        for &i in ws.iter() {
            let s = &stored[i];
            let (at, exact) = n.lower_bound(s.key);
            let old_chain = |n: &NodeMut<'_>| {
                (exact && n.flags(at) & FLAG_OVERFLOW != 0)
                    .then(|| ValueRef::decode(n.value(at)))
                    .flatten()
            };
            match &s.value {
                None => {
                    if exact {
                        replaced.extend(old_chain(&n));
                        n.remove_at(at);
                        removed = true;
                    }
                }
                Some((v, flags)) => {
                    let fits = if exact {
                        n.free_space() + n.value(at).len() >= v.len()
                    } else {
                        n.fits(s.key.len(), v.len())
                    };
                    if !fits {
                        // the room all of this leaf's writes take, on the page as it is:
                        // split until one leaf has it
                        let need = leaf_need(x, ws, stored);
                        if need > MAX_GAP {
                            return Err(Restart::Fail(shoal_engine::EngineError::Config(format!(
                                "a transaction writes {need} bytes into one gap of tree {}'s keys \
                                 (at {:?}); one commit takes at most {MAX_GAP}: commit in parts",
                                s.tree.root(),
                                s.key
                            ))));
                        }
                        return Ok(Attempt::Split(s.tree, s.key.to_vec(), x.pid(), need));
                    }
                    if exact {
                        replaced.extend(old_chain(&n));
                        n.replace_flagged(at, v, *flags);
                    } else {
                        n.insert_flagged(at, s.key, v, *flags);
                    }
                }
            }
        }
        // (as `node::is_underfull`)
        if removed && PAGE_DATA_SIZE - n.free_space() < PAGE_DATA_SIZE / 4 {
            let s = &stored[ws[0]];
            underfull.push((s.tree, s.key.to_vec(), x.pid()));
        }
        images.push(img);
    }
    // 4. everything read still holds (through the guards held here for these leaves)
    let held: Held<'_, 'w> = latched.guards.iter().map(|x| (x.pid(), x)).collect();
    if !validate(w, tx, &held)? {
        return Ok(Attempt::Conflict);
    }
    drop(held);
    // 5. write: the guards are let go together, their changes logged as one chunk
    for (mut x, img) in latched.guards.drain(..).zip(images) {
        x.modify(|b| b.copy_from_slice(&img[..]));
    }
    Ok(Attempt::Done(replaced, underfull))
}

/// Most bytes the writes into one leaf may take (what a nearly empty leaf holds): more cannot
/// be written at once, since no split puts keys between keys that are not in the tree yet.
const MAX_GAP: usize = PAGE_DATA_SIZE - node::HEADER - 2 * node::MAX_KEY;

/// The room the writes `ws` into leaf `x` take on its page as it is: an insert its entry, a
/// replace what its value grows by (removals are not counted: this is an upper bound).
fn leaf_need(x: &ExclusiveGuard<'_>, ws: &[usize], stored: &[Stored<'_>]) -> usize {
    let p = x.page();
    ws.iter()
        .map(|&i| {
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

/// Whether every read of `tx` still holds (`held`: the leaves the commit holds).
fn validate(w: &Worker, tx: &Transaction<'_>, held: &Held<'_, '_>) -> OpResult<bool> {
    if !super::isolated() {
        return Ok(true);
    }
    for r in &tx.points {
        if !point_holds(w, held, r)? {
            return Ok(false);
        }
    }
    for r in &tx.ranges {
        if !range_holds(w, held, r)? {
            return Ok(false);
        }
    }
    Ok(true)
}
