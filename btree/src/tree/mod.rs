//! The B-link tree: operations over nodes ([`crate::node`]) with optimistic lock coupling.
//!
//! - **Descent** (`find_leaf`): optimistic guards only. At each inner node the child pointer is
//!   read, the node validated (so the pointer is a real pid), the child latched optimistically,
//!   and the node validated again (so the child is still the right one). No latch is written.
//! - **Point reads** copy the value out of the leaf and validate.
//! - **Writes** upgrade the leaf to exclusive (version-checked: the leaf is unchanged since the
//!   descent validated it) and edit it. A full leaf is split first (`try_split`): descend again
//!   to the node, upgrade its parent and then the node (top-down, so lockers never wait in a
//!   cycle), split, restart the write. A full parent is split first, recursively.
//! - **Splits** keep the left half in the node and move the right half to a new right sibling
//!   (so the B-link chain stays intact: `node.right = new`, `new.right = old right`). The root
//!   never moves: a root split moves both halves into two new children.
//! - **Scans** hold a shared guard on one leaf at a time; forward scans follow right links
//!   (latching the next leaf before releasing the current one: always left to right, so no
//!   deadlock with splits, which never latch right to left); backward scans re-descend to the
//!   lower fence key.
//!
//! - **Merges** (`try_merge`): a remove that leaves a node less than a quarter full merges it
//!   with a neighbour under the same parent when both fit in one page: parent, left and right
//!   are upgraded top-down and left to right, the right node's entries move into the left node,
//!   the parent loses the separator, and the right page is freed. Underfull parents merge in
//!   turn; a root left with a single child absorbs it. A descent that loads a page freed under
//!   it restarts when its parent's validation fails (`descend`). On a cluster node the right
//!   page is recycled rather than freed (`ExclusiveGuard::free`). See docs/btree.md.
//! - **Value hint** (`value_hint`): a lookup guesses where its record lies in the leaf from the
//!   parent's separators and starts loading those lines with the leaf's (a prefetch only).

mod lookup;
mod restructure;
mod scan;

use lookup::descend;
pub(crate) use scan::no_write_in_own_scan;

use crate::error::TreeError;
use crate::node::FLAG_OVERFLOW;
use crate::node::{
    self, Entry, NodeMut, NodeRef, KIND_INNER, KIND_LEAF, MAX_KEY, MAX_RECORD, NO_PAGE,
};
use crate::overflow::{self, ValueRef};
use crate::value_hint;
use crate::verify::{verify_tree, TreeReport};
use byteorder::{ByteOrder, LittleEndian};
use shoal_engine::{
    EngineError, ExclusiveGuard, OpResult, OptimisticGuard, Pid, Restart, SharedGuard, Worker,
    PAGE_DATA_SIZE,
};

/// A B-link tree identified by its root page (which never changes), a handle valid with the
/// workers of the engine (or cluster) that made it ([`BTree::create`], [`BTree::open`]): with
/// another's, every operation fails with [`TreeError::OtherEngine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BTree {
    root: Pid,
    /// `Worker::database` of the engine whose tree this is.
    database: u64,
}

/// What an insert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Inserted,
    Replaced,
    Exists,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Insert,
    Upsert,
}

enum Step<T> {
    Done(T),
    Split(Pid, usize),
}

/// Direction of a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Ascending,
    Descending,
}

/// Keys a batched lookup ([`BTree::lookup_many`]) walks down the tree together: enough that
/// their cache misses overlap, few enough that what is loaded for a key is still cached when
/// its turn comes again.
pub const LOOKUP_GROUP: usize = 8;

/// A merge is best effort and its remove is done: report a failed one in the log only.
#[cold]
fn merge_failed(target: Pid, e: &EngineError) {
    log::warn!("merging B-tree node {target} failed (the tree stays valid, unmerged): {e}");
}

/// What [`BTree::insert`] did. Not looking at it is a warning: an insert of a key that
/// exists writes nothing.
#[must_use = "insert writes nothing when the key exists: check `.inserted()` (or use upsert)"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    Inserted,
    Exists,
}

impl Insert {
    /// The key was absent and is now there.
    pub fn inserted(self) -> bool {
        self == Insert::Inserted
    }
}

/// A list of puts and removes that [`BTree::apply`] applies as one transaction.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub(crate) ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Insert or replace `key` -> `value`.
    pub fn put(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> &mut Batch {
        self.ops
            .push((key.as_ref().to_vec(), Some(value.as_ref().to_vec())));
        self
    }

    /// Remove `key` (nothing happens if it is absent).
    pub fn remove(&mut self, key: impl AsRef<[u8]>) -> &mut Batch {
        self.ops.push((key.as_ref().to_vec(), None));
        self
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// A leaf slot flagged as an overflow reference whose bytes are not one.
fn bad_reference(leaf: Pid) -> Restart {
    Restart::Fail(damaged_reference(leaf))
}

fn damaged_reference(leaf: Pid) -> EngineError {
    EngineError::Catalog(format!("leaf {leaf} holds a damaged overflow reference"))
}

fn damaged(leaf: Pid) -> TreeError {
    TreeError::Engine(damaged_reference(leaf))
}

fn not_a_node(pid: Pid) -> Restart {
    Restart::Fail(EngineError::Catalog(format!(
        "page {pid} is not a B-tree node (corrupt tree or wrong root)"
    )))
}

impl BTree {
    /// Create an empty tree registered in the catalog as `name`. Fails with
    /// [`TreeError::Exists`] if the name is taken, also when another thread or node registers
    /// it at the same moment (the root page made for it is then freed again).
    pub fn create(w: &Worker, name: &str) -> Result<BTree, TreeError> {
        if w.catalog_lookup(name)?.is_some() {
            return Err(TreeError::Exists(name.to_string()));
        }
        let mut g = w.allocate()?;
        g.modify(|b| NodeMut::new(b).init(KIND_LEAF, 0, None, None));
        let root = g.pid();
        drop(g);
        match w.catalog_insert(name, root) {
            Ok(()) => Ok(BTree {
                root,
                database: w.database(),
            }),
            Err(e) => {
                // nobody else knows the page: give it back
                if let Err(f) = w.run(|w| w.exclusive(root)).and_then(|g| g.free()) {
                    log::warn!("freeing the unused root {root} of '{name}': {f}");
                }
                Err(match e {
                    EngineError::NameTaken(n) => TreeError::Exists(n),
                    e => e.into(),
                })
            }
        }
    }

    /// Open the tree registered as `name`.
    pub fn open(w: &Worker, name: &str) -> Result<BTree, TreeError> {
        let root = w
            .catalog_lookup(name)?
            .ok_or_else(|| TreeError::NotFound(name.to_string()))?;
        let t = BTree {
            root,
            database: w.database(),
        };
        let kind = w.run(|w| {
            let g = w.optimistic(root)?;
            let k = node::kind(g.page());
            g.validate()?;
            Ok(k)
        })?;
        if kind != KIND_LEAF && kind != KIND_INNER {
            return Err(TreeError::NotATree(name.to_string(), root));
        }
        Ok(t)
    }

    /// Open `name`, creating it if it does not exist.
    pub fn open_or_create(w: &Worker, name: &str) -> Result<BTree, TreeError> {
        match Self::open(w, name) {
            Err(TreeError::NotFound(_)) => match Self::create(w, name) {
                // another thread created it meanwhile
                Err(TreeError::Exists(_)) => Self::open(w, name),
                r => r,
            },
            r => r,
        }
    }

    /// Rename the tree `from` to `to` in the catalog (handles of it stay valid). Fails with
    /// [`TreeError::Exists`] if `to` is taken and [`TreeError::NotFound`] if `from` is not
    /// there.
    pub fn rename(w: &Worker, from: &str, to: &str) -> Result<(), TreeError> {
        if w.catalog_lookup(from)?.is_none() {
            return Err(TreeError::NotFound(from.to_string()));
        }
        w.catalog_rename(from, to).map_err(|e| match e {
            EngineError::NameTaken(n) => TreeError::Exists(n),
            e => e.into(),
        })
    }

    /// Delete the tree `name`: take it out of the catalog, then free every page it has.
    /// Returns the number of pages freed. No thread may use the tree meanwhile or afterwards
    /// (its handles then point at freed pages). A crash in between leaks the pages not freed
    /// yet (the catalog no longer names them); it never leaves a name pointing at freed pages.
    pub fn drop_tree(w: &Worker, name: &str) -> Result<u64, TreeError> {
        let t = BTree::open(w, name)?;
        // every page of the tree, read (and checked) before anything changes
        let report = t.verify(w).map_err(|why| {
            EngineError::Catalog(format!("tree '{name}' is damaged, not dropped: {why}"))
        })?;
        w.catalog_remove(name)?;
        let mut freed = 0;
        for &pid in &report.pages {
            w.run(|w| w.exclusive(pid))?.free()?;
            freed += 1;
        }
        Ok(freed)
    }

    /// The root page (fixed for the tree's life).
    pub fn root(&self) -> Pid {
        self.root
    }

    /// The tree whose root is `root` (the crate's own records name trees by root).
    /// The tree whose root is `root`, for the workers of the engine `database`.
    pub(crate) fn at(root: Pid, database: u64) -> BTree {
        BTree { root, database }
    }

    /// This handle is one of `w`'s engine (or cluster): else [`TreeError::OtherEngine`].
    pub(crate) fn check_worker(&self, w: &Worker) -> Result<(), TreeError> {
        if self.database == w.database() {
            return Ok(());
        }
        Err(TreeError::OtherEngine { root: self.root })
    }

    /// A key longer than [`MAX_KEY`] is an error wherever it is used (it can never be in a
    /// tree: a lookup that said "absent" would hide a caller's bug).
    pub(crate) fn check_key(key: &[u8]) -> Result<(), TreeError> {
        if key.len() > MAX_KEY {
            return Err(TreeError::KeyTooLarge {
                len: key.len(),
                max: MAX_KEY,
            });
        }
        Ok(())
    }

    pub(crate) fn check_sizes(key: &[u8], vlen: usize) -> Result<(), TreeError> {
        Self::check_key(key)?;
        if vlen > overflow::MAX_VALUE {
            return Err(TreeError::ValueTooLarge {
                len: vlen,
                max: overflow::MAX_VALUE,
            });
        }
        Ok(())
    }

    /// Insert `key` -> `value` if `key` is absent. Returns [`Insert::Exists`] (and changes
    /// nothing) if it exists; the result must be looked at (`.inserted()`).
    pub fn insert(
        &self,
        w: &Worker,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<Insert, TreeError> {
        self.check_worker(w)?;
        Ok(
            match self.put(w, key.as_ref(), value.as_ref(), Mode::Insert)? {
                Put::Inserted => Insert::Inserted,
                _ => Insert::Exists,
            },
        )
    }

    /// Insert or replace.
    pub fn upsert(
        &self,
        w: &Worker,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<Put, TreeError> {
        self.check_worker(w)?;
        self.put(w, key.as_ref(), value.as_ref(), Mode::Upsert)
    }

    /// Insert or replace.
    fn put(&self, w: &Worker, key: &[u8], value: &[u8], mode: Mode) -> Result<Put, TreeError> {
        Self::check_sizes(key, value.len())?;
        no_write_in_own_scan(self.root)?;
        // a record too large for a leaf: the value goes to overflow pages first
        let chain = if key.len() + value.len() > MAX_RECORD {
            Some(overflow::write(w, value)?)
        } else {
            None
        };
        let reference = chain.map(|r| r.encode());
        let (stored, flags): (&[u8], u16) = match &reference {
            Some(r) => (&r[..], FLAG_OVERFLOW),
            None => (value, 0),
        };
        let r = self.put_stored(w, key, stored, flags, mode);
        if let Some(c) = chain {
            if !matches!(r, Ok(Put::Inserted | Put::Replaced)) {
                overflow::free(w, c); // not referenced: the key existed, or the put failed
            }
        }
        r
    }

    /// `put` of the bytes a leaf slot holds (`flags`: see [`FLAG_OVERFLOW`]). A replaced
    /// value's chain is freed once the leaf's latch is released.
    fn put_stored(
        &self,
        w: &Worker,
        key: &[u8],
        stored: &[u8],
        flags: u16,
        mode: Mode,
    ) -> Result<Put, TreeError> {
        let need = node::entry_space(key.len(), stored.len());
        // what the slot held before a replace: its bytes and flags
        let mut was: (Vec<u8>, u16) = (Vec::new(), 0);
        loop {
            let step = w.run(|w| {
                let leaf = self.find_leaf(w, key)?;
                let mut x = leaf.to_exclusive()?;
                let pid = x.pid();
                let p = x.page();
                let (i, exact) = node::lower_bound(p, key);
                // (an insert names what it changed, so only that is compared and stored)
                const NOTHING: Option<[std::ops::Range<usize>; 2]> = Some([0..0, 0..0]);
                let step = x.modify_in(|b| {
                    let mut n = NodeMut::new(b);
                    if exact {
                        if mode == Mode::Insert {
                            return (Step::Done(Put::Exists), NOTHING);
                        }
                        if n.free_space() + n.value(i).len() >= stored.len() {
                            was = (n.value(i).to_vec(), n.flags(i));
                            n.replace_flagged(i, stored, flags);
                            return (Step::Done(Put::Replaced), None);
                        }
                        (Step::Split(pid, need), NOTHING)
                    } else if n.fits(key.len(), stored.len()) {
                        let within = n.insert_flagged_within(i, key, stored, flags);
                        (Step::Done(Put::Inserted), within)
                    } else {
                        (Step::Split(pid, need), NOTHING)
                    }
                });
                Ok(step)
            })?;
            match step {
                Step::Done(p) => {
                    if p == Put::Replaced && was.1 & FLAG_OVERFLOW != 0 {
                        if let Some(r) = ValueRef::decode(&was.0) {
                            overflow::free(w, r);
                        }
                    }
                    return Ok(p);
                }
                Step::Split(pid, need) => w.run(|w| self.try_split(w, key, pid, need))?,
            }
        }
    }

    /// Change the value of `key` in place (same length). Returns whether the key exists.
    pub fn update(
        &self,
        w: &Worker,
        key: impl AsRef<[u8]>,
        mut f: impl FnMut(&mut [u8]),
    ) -> Result<bool, TreeError> {
        self.check_worker(w)?;
        let key = key.as_ref();
        Self::check_key(key)?;
        no_write_in_own_scan(self.root)?;
        // an overflow value is rewritten into a new chain; the old one is freed afterwards
        let mut replaced: Option<ValueRef> = None;
        let found = w.run(|w| {
            let leaf = self.find_leaf(w, key)?;
            let (i, found) = node::lower_bound(leaf.page(), key);
            leaf.validate()?;
            if !found {
                return Ok(false);
            }
            let mut x: ExclusiveGuard<'_> = leaf.to_exclusive()?;
            let p = x.page();
            value_hint::learn(self.root, p, i);
            let off = node::value_offset(p, i);
            let mut v = Vec::new();
            node::value_into(p, i, &mut v);
            if node::val_flags(p, i) & FLAG_OVERFLOW != 0 {
                let r = ValueRef::decode(&v).ok_or_else(|| bad_reference(x.pid()))?;
                overflow::read(w, r, &mut v)?; // (may restart: nothing changed yet)
                f(&mut v);
                let new = overflow::write(w, &v).map_err(Restart::Fail)?;
                x.page_mut().write(off, &new.encode());
                replaced = Some(r);
                return Ok(true);
            }
            f(&mut v);
            x.page_mut().write(off, &v);
            Ok(true)
        })?;
        if let Some(r) = replaced {
            overflow::free(w, r);
        }
        Ok(found)
    }

    /// Remove `key`. Returns whether it existed. A leaf left less than a quarter full is
    /// merged with a neighbour when the two fit in one page (see `merge_underfull`).
    pub fn remove(&self, w: &Worker, key: impl AsRef<[u8]>) -> Result<bool, TreeError> {
        self.check_worker(w)?;
        let key = key.as_ref();
        Self::check_key(key)?;
        no_write_in_own_scan(self.root)?;
        // the chain of a removed overflow value, freed once the leaf is released
        let mut chain: Option<ValueRef> = None;
        let (existed, underfull) = w.run(|w| {
            let Some((parent, leaf)) = self.path_to(w, key, None)? else {
                unreachable!("a descent to the leaf ends at a leaf or fails");
            };
            let (_, found) = node::lower_bound(leaf.page(), key);
            leaf.validate()?;
            if !found {
                return Ok((false, None));
            }
            let mut x = leaf.to_exclusive()?;
            let p = x.page();
            let (i, exact) = node::lower_bound(p, key);
            debug_assert!(exact, "leaf unchanged since validation");
            if exact && node::val_flags(p, i) & FLAG_OVERFLOW != 0 {
                let mut r = Vec::new();
                node::value_into(p, i, &mut r);
                chain = Some(ValueRef::decode(&r).ok_or_else(|| bad_reference(x.pid()))?);
            } else {
                chain = None;
            }
            let exact = x.modify(|b| {
                let mut n = NodeMut::new(b);
                let (i, exact) = n.lower_bound(key);
                if exact {
                    n.remove_at(i);
                }
                exact
            });
            let underfull = exact && node::is_underfull(x.page());
            Ok((exact, underfull.then(|| (parent, x.pid()))))
        })?;
        if let Some(r) = chain {
            overflow::free(w, r);
        }
        if let Some((parent, leaf)) = underfull {
            // First with the parent this descent passed (no second descent: removes that
            // keep an underfull leaf whose neighbours are too full to merge stay cheap).
            let first = (|| {
                let g = match &parent {
                    Some(p) => descend(w, p, leaf)?,
                    None => w.optimistic(leaf)?,
                };
                self.merge_with_neighbour(w, key, parent, g)
            })();
            match first {
                Ok(None) => {}
                Ok(Some(next)) => self.merge_underfull(w, key, next),
                Err(Restart::Retry) => self.merge_underfull(w, key, leaf),
                Err(Restart::Fail(e)) => merge_failed(leaf, &e),
            }
        }
        Ok(existed)
    }

    /// Number of entries (a full scan).
    pub fn count(&self, w: &Worker) -> Result<u64, TreeError> {
        self.check_worker(w)?;
        let mut n = 0u64;
        self.scan(w, &[], Direction::Ascending, |_, _| {
            n += 1;
            true
        })?;
        Ok(n)
    }

    /// Check the whole tree's structure (see [`crate::verify`]): node layouts, sorted keys
    /// inside fences, levels, right links on every level, no page reached twice. Takes shared
    /// latches node by node, so run it while the tree is quiet.
    pub fn verify(&self, w: &Worker) -> Result<TreeReport, String> {
        self.check_worker(w).map_err(|e| e.to_string())?;
        verify_tree(self.root, |pid| {
            w.run(|w| {
                let g = w.shared(pid)?;
                let mut copy = Box::new([0u8; shoal_engine::PAGE_DATA_SIZE]);
                copy.copy_from_slice(g.data());
                Ok(copy)
            })
            .map_err(|e| e.to_string())
        })
    }
}
