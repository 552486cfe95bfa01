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

/// A B-link tree identified by its root page (which never changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BTree {
    root: Pid,
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

/// One key of a batched lookup.
struct Lane<'w> {
    /// The node the key is at; `None`: a validation failed, look the key up again alone.
    node: Option<OptimisticGuard<'w>>,
    /// While descending: the child to go to next (`NO_PAGE`: none this round).
    child: Pid,
    /// At the leaf: the key's slot, if it exists.
    slot: Option<usize>,
}

/// Latch `child`, just read from `parent`, optimistically, and check that `parent` still
/// points at it. A merge may have freed `child` since `parent` was read, and loading a freed
/// page can fail (its slot holds an old image or nothing): such a failure is a restart when
/// `parent` changed meanwhile, and the error it is when not.
// Always inlined: it is every level of every lookup (out of line, sequential runs of the btree
// bench were slower; inlined, side-by-side runs match the build before it existed).
#[inline(always)]
fn descend<'w>(
    w: &'w Worker,
    parent: &OptimisticGuard<'w>,
    child: Pid,
) -> OpResult<OptimisticGuard<'w>> {
    parent.validate()?; // `child` is a real pid
    let g = match w.optimistic(child) {
        Err(Restart::Fail(e)) => {
            parent.validate()?;
            return Err(Restart::Fail(e));
        }
        r => r?,
    };
    parent.validate()?; // and still the child for the key
    Ok(g)
}

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
    ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
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

thread_local! {
    /// Roots of the trees this thread is scanning right now (inside a `scan` callback). A mark
    /// is only ever set while the scan holds a leaf's shared guard, so a task (shoal_engine::
    /// tasks) never pauses with one set and another task of its thread never sees it.
    static SCANNING: std::cell::RefCell<Vec<Pid>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Marks a tree as being scanned by this thread until dropped.
struct Scanning(Pid);

impl Scanning {
    fn enter(root: Pid) -> Scanning {
        SCANNING.with(|s| s.borrow_mut().push(root));
        Scanning(root)
    }
}

impl Drop for Scanning {
    fn drop(&mut self) {
        SCANNING.with(|s| {
            let mut s = s.borrow_mut();
            let at = s.iter().rposition(|&r| r == self.0);
            debug_assert!(at.is_some(), "scan marks are dropped in order");
            if let Some(at) = at {
                s.remove(at);
            }
        });
    }
}

/// A write to the tree at `root` from inside one of its own scans would wait for the scan's
/// shared latch for ever: refuse it.
fn no_write_in_own_scan(root: Pid) -> Result<(), TreeError> {
    if SCANNING.with(|s| s.borrow().contains(&root)) {
        return Err(TreeError::WriteInScan);
    }
    Ok(())
}

/// Log how to undo an in-place update of `key`'s value from `old` to `new`: only the bytes
/// that changed (rows change a few fields).
fn log_changed_bytes(w: &Worker, root: Pid, key: &[u8], old: &[u8], new: &[u8]) {
    if let Some(first) = old.iter().zip(new).position(|(a, b)| a != b) {
        let last = old.len()
            - old
                .iter()
                .zip(new)
                .rev()
                .position(|(a, b)| a != b)
                .unwrap_or(0);
        w.log_undo(&undo_range(root, key, first, &old[first..last]));
    }
}

/// Copy slot `i`'s whole value out of a leaf a scan holds shared, following an overflow
/// reference (the shared latch keeps its chain from being freed). False: in a task, a page of
/// the chain is one a paused task of this thread is loading (`Worker::run_while_holding`);
/// the scan lets the leaf go and starts over at this slot's key.
fn value_in_scan(
    w: &Worker,
    g: &SharedGuard<'_>,
    i: usize,
    v: &mut Vec<u8>,
) -> Result<bool, TreeError> {
    let p = g.page();
    node::value_into(p, i, v);
    if node::val_flags(p, i) & FLAG_OVERFLOW != 0 {
        let r = ValueRef::decode(v).ok_or_else(|| damaged(g.pid()))?;
        return Ok(w.run_while_holding(|w| overflow::read(w, r, v))?.is_some());
    }
    Ok(true)
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
            Ok(()) => Ok(BTree { root }),
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
        let t = BTree { root };
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

    fn check_sizes(key: &[u8], vlen: usize) -> Result<(), TreeError> {
        if key.len() > MAX_KEY {
            return Err(TreeError::KeyTooLarge {
                len: key.len(),
                max: MAX_KEY,
            });
        }
        if vlen > overflow::MAX_VALUE {
            return Err(TreeError::RecordTooLarge {
                len: key.len() + vlen,
                max: overflow::MAX_VALUE,
            });
        }
        Ok(())
    }

    /// Optimistic descent to the leaf whose range holds `key`.
    fn find_leaf<'w>(&self, w: &'w Worker, key: &[u8]) -> OpResult<OptimisticGuard<'w>> {
        let mut g = w.optimistic(self.root)?;
        loop {
            let p = g.page();
            match node::kind(p) {
                KIND_LEAF => return Ok(g),
                KIND_INNER => {
                    let (i, _) = node::lower_bound(p, key);
                    let c = Pid(node::child(p, i));
                    w.prefetch(c);
                    if node::level(p) == 1 {
                        value_hint::prefetch(w, self.root, p, i, key, c);
                    }
                    g = descend(w, &g, c)?;
                }
                _ => {
                    g.validate()?;
                    return Err(not_a_node(g.pid()));
                }
            }
        }
    }

    /// Copy the value of `key` into `out`. Returns whether the key exists.
    pub fn lookup(
        &self,
        w: &Worker,
        key: impl AsRef<[u8]>,
        out: &mut Vec<u8>,
    ) -> Result<bool, TreeError> {
        self.lookup_into(w, key.as_ref(), out)
    }

    fn lookup_into(&self, w: &Worker, key: &[u8], out: &mut Vec<u8>) -> Result<bool, TreeError> {
        Ok(w.run(|w| {
            let g = self.find_leaf(w, key)?;
            let p = g.page();
            let (i, found) = node::lower_bound(p, key);
            let mut big = false;
            if found {
                value_hint::learn(self.root, p, i);
                node::value_into(p, i, out);
                big = node::val_flags(p, i) & FLAG_OVERFLOW != 0;
            }
            g.validate()?;
            if big {
                let r = ValueRef::decode(out).ok_or_else(|| bad_reference(g.pid()))?;
                let read = overflow::read(w, r, out);
                // the chain is only trustworthy while the leaf still points at it
                g.validate()?;
                read?;
            }
            Ok(found)
        })?)
    }

    /// Look up many keys at once: calls `each(i, value)` for every `keys[i]`, in order of `i`,
    /// with `None` for keys that are absent. Same results as calling [`BTree::lookup`] for each
    /// key, but faster for large batches (a multi-get).
    ///
    /// A single lookup is a chain of cache misses (each node's address is known only once its
    /// parent is searched), so it waits for memory once per level. Here groups of
    /// [`LOOKUP_GROUP`] keys walk down together, level by level: search every key's node, then
    /// start loading every key's child, then latch them, so the misses of a group overlap and
    /// the group waits about once per level instead of once per level and key. A key whose
    /// walk sees a concurrent change (failed validation) is looked up again alone.
    ///
    /// Values are copied and validated before `each` sees them, as in `lookup`.
    pub fn lookup_many<K: AsRef<[u8]>>(
        &self,
        w: &Worker,
        keys: &[K],
        mut each: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<(), TreeError> {
        let width = keys.len().min(LOOKUP_GROUP);
        let mut lanes: Vec<Lane<'_>> = Vec::with_capacity(width);
        let mut bufs: Vec<Vec<u8>> = (0..width).map(|_| Vec::new()).collect();
        for (g, group) in keys.chunks(LOOKUP_GROUP).enumerate() {
            let root = match w.optimistic(self.root) {
                Ok(r) => Some(r),
                Err(Restart::Retry) => None,
                Err(Restart::Fail(e)) => return Err(e.into()),
            };
            lanes.clear();
            lanes.extend(group.iter().map(|_| Lane {
                node: root.clone(),
                child: Pid(NO_PAGE),
                slot: None,
            }));
            self.walk_group(w, group, &mut lanes, &mut bufs)?;
            for (j, lane) in lanes.iter().enumerate() {
                let found = match lane.node {
                    Some(_) => lane.slot.is_some(),
                    None => self.lookup(w, group[j].as_ref(), &mut bufs[j])?,
                };
                each(g * LOOKUP_GROUP + j, found.then_some(&bufs[j][..]));
            }
        }
        Ok(())
    }

    /// Walk a group of keys down to their leaves and copy their values (see `lookup_many`).
    /// Lanes whose walk fails validation end with `node == None`.
    fn walk_group<'w, K: AsRef<[u8]>>(
        &self,
        w: &'w Worker,
        keys: &[K],
        lanes: &mut [Lane<'w>],
        bufs: &mut [Vec<u8>],
    ) -> Result<(), TreeError> {
        // Every round takes each lane that is at an inner node one level down (a lane at a leaf
        // waits for the others), so the rounds end: the tree's height bounds them.
        let mut missing = Vec::new();
        loop {
            let mut descending = false;
            // Search every inner node; start loading the children's translation entries.
            for (lane, key) in lanes.iter_mut().zip(keys) {
                lane.child = Pid(NO_PAGE);
                let Some(g) = &lane.node else { continue };
                let p = g.page();
                match node::kind(p) {
                    KIND_LEAF => {}
                    KIND_INNER => {
                        let (i, _) = node::lower_bound(p, key.as_ref());
                        lane.child = Pid(node::child(p, i));
                        w.prefetch(lane.child);
                        descending = true;
                    }
                    // Not a node (a changing page, or corruption): the lookup alone finds
                    // out which, and reports corruption.
                    _ => lane.node = None,
                }
            }
            if !descending {
                break;
            }
            // The entries are on their way: start loading the children's frames and headers.
            // Children not in memory are read from the store together, not one by one.
            missing.clear();
            for lane in lanes.iter_mut().filter(|l| l.child != Pid(NO_PAGE)) {
                if !w.prefetch_frame(lane.child) {
                    match &lane.node {
                        // validated: `child` is a real page
                        Some(parent) if parent.is_valid() => missing.push(lane.child),
                        _ => lane.node = None,
                    }
                }
            }
            if missing.len() > 1 {
                // Only a head start: a page that fails to load here (say one a merge freed
                // after its parent was read) is loaded again below, where the error counts
                // only if the parent still points at the page.
                let _ = w.load_many(&missing);
            }
            // Latch the children (checking that each parent still points at its child), start
            // loading their slot arrays.
            for lane in lanes.iter_mut().filter(|l| l.child != Pid(NO_PAGE)) {
                let Some(parent) = &lane.node else { continue };
                let next = descend(w, parent, lane.child);
                if let Ok(g) = &next {
                    node::prefetch_slots(g.page());
                }
                lane.node = match next {
                    Ok(g) => Some(g),
                    Err(Restart::Retry) => None,
                    Err(Restart::Fail(e)) => return Err(e.into()),
                };
            }
        }
        // At the leaves: search, start loading the values, then copy them.
        for (lane, key) in lanes.iter_mut().zip(keys) {
            if let Some(g) = &lane.node {
                let p = g.page();
                let (i, found) = node::lower_bound(p, key.as_ref());
                if found {
                    lane.slot = Some(i);
                    node::prefetch_value(p, i);
                }
            }
        }
        for (lane, buf) in lanes.iter_mut().zip(bufs) {
            if let Some(g) = &lane.node {
                if let Some(i) = lane.slot {
                    node::value_into(g.page(), i, buf);
                    if node::val_flags(g.page(), i) & FLAG_OVERFLOW != 0 {
                        lane.node = None; // an overflow value: a lookup of its own reads it
                        continue;
                    }
                }
                if !g.is_valid() {
                    lane.node = None;
                }
            }
        }
        Ok(())
    }

    /// The value of `key`, if present.
    pub fn get(&self, w: &Worker, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, TreeError> {
        let mut v = Vec::new();
        Ok(self.lookup_into(w, key.as_ref(), &mut v)?.then_some(v))
    }

    /// Insert `key` -> `value` if `key` is absent. Returns [`Insert::Exists`] (and changes
    /// nothing) if it exists; the result must be looked at (`.inserted()`).
    pub fn insert(
        &self,
        w: &Worker,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<Insert, TreeError> {
        let mut old = Vec::new();
        Ok(
            match self.put(
                w,
                key.as_ref(),
                value.as_ref(),
                Mode::Insert,
                false,
                &mut old,
            )? {
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
        let mut old = Vec::new();
        self.put(
            w,
            key.as_ref(),
            value.as_ref(),
            Mode::Upsert,
            false,
            &mut old,
        )
    }

    /// Insert or replace; with `keep_old` (or while a transaction logs undo) a replaced value
    /// is left in `old`.
    fn put(
        &self,
        w: &Worker,
        key: &[u8],
        value: &[u8],
        mode: Mode,
        keep_old: bool,
        old: &mut Vec<u8>,
    ) -> Result<Put, TreeError> {
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
        let r = self.put_stored(w, key, stored, flags, mode, keep_old, old);
        if let Some(c) = chain {
            if !matches!(r, Ok(Put::Inserted | Put::Replaced)) {
                overflow::free(w, c); // not referenced: the key existed, or the put failed
            }
        }
        r
    }

    /// `put` of the bytes a leaf slot holds (`flags`: see [`FLAG_OVERFLOW`]). A replaced
    /// value's chain is freed once the leaf's latch is released.
    #[allow(clippy::too_many_arguments)]
    fn put_stored(
        &self,
        w: &Worker,
        key: &[u8],
        stored: &[u8],
        flags: u16,
        mode: Mode,
        keep_old: bool,
        old: &mut Vec<u8>,
    ) -> Result<Put, TreeError> {
        let need = node::entry_space(key.len(), stored.len());
        let log = w.logs_undo();
        // what the slot held before a replace: its bytes and flags
        let mut was: (Vec<u8>, u16) = (Vec::new(), 0);
        loop {
            let step = w.run(|w| {
                let leaf = self.find_leaf(w, key)?;
                let mut x = leaf.to_exclusive()?;
                let pid = x.pid();
                let p = x.page();
                let (i, exact) = node::lower_bound(p, key);
                if exact && keep_old && mode == Mode::Upsert {
                    // the whole value before (read before anything changes: this may restart)
                    node::value_into(p, i, old);
                    if node::val_flags(p, i) & FLAG_OVERFLOW != 0 {
                        let r = ValueRef::decode(old).ok_or_else(|| bad_reference(pid))?;
                        overflow::read(w, r, old)?;
                    }
                }
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
                if log {
                    match step {
                        Step::Done(Put::Inserted) => w.log_undo(&undo_record(self.root, key, None)),
                        // an overflow value's undo is its reference (its chain is freed at
                        // the commit, not before: `overflow::release`)
                        Step::Done(Put::Replaced) if was.1 & FLAG_OVERFLOW != 0 => {
                            w.log_undo(&undo_reference(self.root, key, &was.0))
                        }
                        Step::Done(Put::Replaced) => {
                            w.log_undo(&undo_record(self.root, key, Some(&was.0)))
                        }
                        _ => {}
                    }
                }
                Ok(step)
            })?;
            match step {
                Step::Done(p) => {
                    if p == Put::Replaced && was.1 & FLAG_OVERFLOW != 0 {
                        if let Some(r) = ValueRef::decode(&was.0) {
                            overflow::release(w, r);
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
        let key = key.as_ref();
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
                if w.logs_undo() {
                    // undo puts the old reference back (the old chain is kept until commit)
                    w.log_undo(&undo_reference(self.root, key, &r.encode()));
                }
                x.page_mut().write(off, &new.encode());
                replaced = Some(r);
                return Ok(true);
            }
            let before = w.logs_undo().then(|| v.clone());
            f(&mut v);
            if let Some(old) = before {
                log_changed_bytes(w, self.root, key, &old, &v);
            }
            x.page_mut().write(off, &v);
            Ok(true)
        })?;
        if let Some(r) = replaced {
            overflow::release(w, r);
        }
        Ok(found)
    }

    /// Remove `key`. Returns whether it existed. A leaf left less than a quarter full is
    /// merged with a neighbour when the two fit in one page (see `merge_underfull`).
    pub fn remove(&self, w: &Worker, key: impl AsRef<[u8]>) -> Result<bool, TreeError> {
        let key = key.as_ref();
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
            let undo = w.logs_undo();
            let mut old = Vec::new();
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
                    if undo && chain.is_none() {
                        old.extend_from_slice(n.value(i));
                    }
                    n.remove_at(i);
                }
                exact
            });
            if undo && exact {
                match chain {
                    Some(r) => w.log_undo(&undo_reference(self.root, key, &r.encode())),
                    None => w.log_undo(&undo_record(self.root, key, Some(&old))),
                }
            }
            let underfull = exact && node::is_underfull(x.page());
            Ok((exact, underfull.then(|| (parent, x.pid()))))
        })?;
        if let Some(r) = chain {
            overflow::release(w, r);
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

    /// `target`, a node on `key`'s path, became underfull: merge it with a neighbour under the
    /// same parent (the right one, else the left one) if the two fit in one page, then the
    /// parent if that became underfull, and so on up; a root left with a single child takes
    /// over that child's contents (the tree gets one level lower). Best effort: a merge that
    /// does not fit is skipped, and the remove that asked for it is done either way, so an
    /// error here is logged, not returned (the tree stays valid, only less compact). Only
    /// `remove` calls it. (Pages merged away are freed on a single node and recycled on a
    /// cluster node: `ExclusiveGuard::free`.)
    fn merge_underfull(&self, w: &Worker, key: &[u8], mut target: Pid) {
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
    fn try_merge(&self, w: &Worker, key: &[u8], target: Pid) -> OpResult<Option<Pid>> {
        match self.path_to(w, key, Some(target))? {
            Some((parent, g)) => self.merge_with_neighbour(w, key, parent, g),
            None => Ok(None), // merged or split away meanwhile
        }
    }

    /// `try_merge` for node `g` on `key`'s path, reached through `parent` (`None`: the root).
    fn merge_with_neighbour<'w>(
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
    fn shrink_root(&self, w: &Worker, root: OptimisticGuard<'_>) -> OpResult<()> {
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
    fn try_split(&self, w: &Worker, key: &[u8], target: Pid, need: usize) -> OpResult<()> {
        let Some((parent, g)) = self.path_to(w, key, Some(target))? else {
            return Ok(()); // target is no longer on the path: it was split already
        };
        let mut px = match parent {
            Some(pg) => Some(pg.to_exclusive()?),
            None => None,
        };
        let mut x = g.to_exclusive()?;
        if node::free_space(x.page()) >= need {
            return Ok(()); // someone split it meanwhile
        }
        match px.as_mut() {
            None => self.split_root(w, &mut x, key),
            Some(pxg) => {
                let sep_need = node::entry_space(MAX_KEY, 8);
                if node::free_space(pxg.page()) < sep_need {
                    let ppid = pxg.pid();
                    drop(x);
                    drop(px);
                    self.try_split(w, key, ppid, sep_need)?;
                    return Err(Restart::Retry);
                }
                split_child(w, pxg, &mut x, key)
            }
        }
    }

    /// Descend along `key`'s path to the node `target` (`None`: to the leaf). Returns it with
    /// its parent (`None` for the root), or `None` if `target` is not on the path (any more).
    /// Kept apart from `find_leaf` so that lookups do not carry the parent along.
    #[allow(clippy::type_complexity)]
    fn path_to<'w>(
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

    fn split_root(&self, w: &Worker, root: &mut ExclusiveGuard<'_>, key: &[u8]) -> OpResult<()> {
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
        let (left, sep, right, left_upper) =
            halves(kind, &entries, sequential_cut(kind, &entries, last, key));
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

    /// Visit entries from `start` in `dir` order (ascending: keys >= start; descending: keys
    /// <= start, so descending from `&[]` visits only an empty key: from the last key down is
    /// `iter(w).rev()`) until `f` returns `false`. `f` runs while a shared latch is held: a write to
    /// this tree from inside `f` fails with [`TreeError::WriteInScan`] (it would wait for
    /// that latch for ever). To write while iterating, use [`BTree::range`], which holds no
    /// latch between entries.
    pub fn scan(
        &self,
        w: &Worker,
        start: &[u8],
        dir: Direction,
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), TreeError> {
        let (mut k, mut v) = (Vec::new(), Vec::new());
        match dir {
            Direction::Ascending => {
                // where to (re)start: keys >= `from`. A scan starts over from the root, holding
                // no guard, where a task holding its leaf may not wait (`value_in_scan`,
                // `Worker::run_while_holding`).
                let mut from = start.to_vec();
                'descend: loop {
                    let mut g: SharedGuard<'_> =
                        w.run(|w| self.find_leaf(w, &from)?.to_shared())?;
                    // from here a leaf's guard is held (the next one is taken before the last
                    // is let go) until the scan ends or starts over
                    let _scanning = Scanning::enter(self.root);
                    let mut i = node::lower_bound(g.page(), &from).0;
                    loop {
                        let p = g.page();
                        while i < node::count(p) {
                            node::key_into(p, i, &mut k);
                            if !value_in_scan(w, &g, i, &mut v)? {
                                from.clone_from(&k);
                                continue 'descend;
                            }
                            if !f(&k, &v) {
                                return Ok(());
                            }
                            i += 1;
                        }
                        let r = node::right(p);
                        if r == NO_PAGE {
                            return Ok(());
                        }
                        match w.run_while_holding(|w| w.shared(Pid(r)))? {
                            Some(next) => g = next,
                            None => {
                                // the smallest key above this leaf's upper fence
                                let Some(mut up) = node::fence(p, true) else {
                                    return Err(TreeError::Engine(EngineError::Catalog(format!(
                                        "leaf {} has a right sibling but no upper fence",
                                        g.pid()
                                    ))));
                                };
                                up.push(0);
                                from = up;
                                continue 'descend;
                            }
                        }
                        i = 0;
                    }
                }
            }
            Direction::Descending => {
                let mut bound = start.to_vec();
                'leaf: loop {
                    let g = w.run(|w| self.find_leaf(w, &bound)?.to_shared())?;
                    let _scanning = Scanning::enter(self.root); // let go before `g`
                    let p = g.page();
                    let (i, exact) = node::lower_bound(p, &bound);
                    let mut j = if exact { i + 1 } else { i };
                    while j > 0 {
                        j -= 1;
                        node::key_into(p, j, &mut k);
                        if !value_in_scan(w, &g, j, &mut v)? {
                            // start over at this key (included), holding nothing
                            bound.clone_from(&k);
                            continue 'leaf;
                        }
                        if !f(&k, &v) {
                            return Ok(());
                        }
                    }
                    match node::fence(p, false) {
                        None => return Ok(()),
                        Some(lower) => bound = lower,
                    }
                }
            }
        }
    }

    /// Apply every put and remove of `batch`, in order, as one transaction: after a crash,
    /// all of them or none (with a write-ahead log; docs/durability.md), and if one fails
    /// (a full device, a dead node) the ones before it are undone before the error returns.
    /// Sizes are checked before anything is written. A transaction this worker was running
    /// is committed first; the batch is committed (as [`Worker::commit`] does) at the end.
    pub fn apply(&self, w: &Worker, batch: &Batch) -> Result<(), TreeError> {
        for (k, v) in &batch.ops {
            Self::check_sizes(k, v.as_ref().map_or(0, Vec::len))?;
        }
        no_write_in_own_scan(self.root)?;
        w.begin_transaction()?;
        // what each applied op replaced: to undo them if a later one fails
        let mut before: Vec<(&[u8], Option<Vec<u8>>)> = Vec::with_capacity(batch.ops.len());
        let mut failed = None;
        for (k, v) in &batch.ops {
            let r = match v {
                Some(v) => {
                    let mut old = Vec::new();
                    self.put(w, k, v, Mode::Upsert, true, &mut old)
                        .map(|p| (p == Put::Replaced).then_some(old))
                }
                None => self
                    .get(w, k)
                    .and_then(|old| self.remove(w, k).map(|_| old)),
            };
            match r {
                Ok(old) => before.push((k, old)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            w.rolling_back();
            for (k, old) in before.iter().rev() {
                let undone = match old {
                    Some(v) => self.upsert(w, k, v).map(|_| ()),
                    None => self.remove(w, k).map(|_| ()),
                };
                if let Err(u) = undone {
                    log::error!("undoing a failed batch: {u} (the batch stays partly applied)");
                    break;
                }
            }
            w.commit()?;
            return Err(e);
        }
        w.commit()?;
        Ok(())
    }

    /// Number of entries (a full scan).
    pub fn count(&self, w: &Worker) -> Result<u64, TreeError> {
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

/// How to divide a full node. Leaves: left keeps `entries[..m]` and `sep` (left's upper fence)
/// separates the halves. Inner nodes: left keeps `entries[..m - 1]`, `entries[m - 1]`'s key
/// (= `sep`) moves up and its child becomes left's upper child; right keeps `entries[m..]`.
struct Cut {
    m: usize,
    sep: Vec<u8>,
}

/// Split `entries` of a node of `kind` into (left, separator, right, left's upper child), at
/// `cut` or else in the middle (by bytes).
fn halves<'e, 'a>(
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
    assert!((1..n).contains(&m), "cut {m} of {n} entries");
    if kind == KIND_LEAF {
        (&entries[..m], sep, &entries[m..], NO_PAGE)
    } else {
        let v = entries[m - 1].1;
        let child = LittleEndian::read_u64(v);
        (&entries[..m - 1], sep, &entries[m..], child)
    }
}

/// Sequential-insert detection. If the insert of `key` that needs the split goes right after
/// one of the node's two previous inserts, the workload fills the key space in order (one
/// ascending run, or several side by side, as parallel loaders of adjacent ranges do: two of
/// them alternating in one node each continue their own previous insert); for an inner node the
/// "insert" is the separator that `key`'s child will post when it splits. Then:
///
/// - past the last entry: left keeps all but the last entry (the run continues on the right);
/// - before existing entries: cut at the insertion point (leaves: with a separator just below
///   the first entry on the right), so the run keeps going left and never touches the right
///   node again.
///
/// Either way nodes are left full instead of half full: without it an ascending load leaves
/// every inner node half full, and a tree of 200,000 records one level taller than it needs.
/// Otherwise: `None` (split in the middle).
fn sequential_cut(kind: u8, entries: &[Entry<'_>], last: [usize; 2], key: &[u8]) -> Option<Cut> {
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
    if pos >= n {
        return Some(Cut {
            m: n - 1,
            sep: entries[n - 2].0.to_vec(),
        });
    }
    let next = entries[pos].0;
    let sep = below(next).filter(|s| s.as_slice() >= key)?;
    Some(Cut { m: pos, sep })
}

/// A short key `s` with `s < b`, as close below `b` as a few extra bytes allow (or `None`).
fn below(b: &[u8]) -> Option<Vec<u8>> {
    let (last, head) = b.split_last()?;
    let mut s = head.to_vec();
    if *last > 0 {
        s.push(last - 1);
        s.extend_from_slice(&[0xFF; 8]);
    }
    (s.len() <= MAX_KEY && s.as_slice() < b).then_some(s)
}

fn fill(n: &mut NodeMut<'_>, entries: &[Entry<'_>]) {
    for &(k, v, f) in entries {
        let c = n.count();
        n.insert_flagged(c, k, v, f);
    }
}

/// Move the entries of `rx` into its left neighbour `lx` (children `j` and `j + 1` of `px`;
/// all three exclusively latched; the caller checked that the result fits) and unlink `rx`:
/// `lx` takes over its upper fence, right link and (inner nodes) upper child, and `px` loses
/// the separator between them. The caller frees `rx`.
fn merge_into_left(
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
fn page_copy(g: &ExclusiveGuard<'_>) -> [u8; PAGE_DATA_SIZE] {
    g.data()
        .try_into()
        .expect("a page's data area is PAGE_DATA_SIZE bytes")
}

/// Split non-root node `x` (child of `px`, both exclusively latched) into itself and a new
/// right sibling, and post the separator to the parent.
fn split_child(
    w: &Worker,
    px: &mut ExclusiveGuard<'_>,
    x: &mut ExclusiveGuard<'_>,
    key: &[u8],
) -> OpResult<()> {
    // the entries are read from a copy: `x` is rewritten while they are used
    let orig: [u8; PAGE_DATA_SIZE] = page_copy(x);
    let n = NodeRef::new(&orig);
    let (kind, level, entries, upper) = (n.kind(), n.level(), n.entries(), n.upper_child());
    let (right, (lower_fence, upper_fence), last) = (n.right(), n.fences(), n.last_inserts());
    let (left, sep, rest, left_upper) =
        halves(kind, &entries, sequential_cut(kind, &entries, last, key));
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

/// How to undo one change of a tree in a transaction (`Worker::log_undo`): the tree's root
/// (fixed for its life), the key, and the value before (absent: the key was not there).
/// Layout: root u64, key length u16, kind u8 (0: the key was absent; 1: its old value
/// follows the key; 2: an offset u16 and the old bytes there follow, `undo_range`), key, rest.
fn undo_record(root: Pid, key: &[u8], old: Option<&[u8]>) -> Vec<u8> {
    let mut r = Vec::with_capacity(11 + key.len() + old.map_or(0, <[u8]>::len));
    r.extend_from_slice(&root.raw().to_le_bytes());
    r.extend_from_slice(&(key.len() as u16).to_le_bytes());
    r.push(old.is_some() as u8);
    r.extend_from_slice(key);
    r.extend_from_slice(old.unwrap_or(&[]));
    r
}

/// How to undo a change of an overflow value: put its old reference back (kind 3; the old
/// chain is kept until the transaction commits).
fn undo_reference(root: Pid, key: &[u8], reference: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(11 + key.len() + reference.len());
    r.extend_from_slice(&root.raw().to_le_bytes());
    r.extend_from_slice(&(key.len() as u16).to_le_bytes());
    r.push(3);
    r.extend_from_slice(key);
    r.extend_from_slice(reference);
    r
}

/// How to undo an in-place update: put `old` back at byte `off` of the value (kind 2).
fn undo_range(root: Pid, key: &[u8], off: usize, old: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(13 + key.len() + old.len());
    r.extend_from_slice(&root.raw().to_le_bytes());
    r.extend_from_slice(&(key.len() as u16).to_le_bytes());
    r.push(2);
    r.extend_from_slice(key);
    r.extend_from_slice(&(off as u16).to_le_bytes());
    r.extend_from_slice(old);
    r
}

/// The engine's roll-back hook for B-tree transactions (`EngineConfig::roll_back`): after a
/// crash, each transaction cut off is undone newest change first, by putting back the value
/// each key had before (or removing a key the transaction inserted). Undoing twice (a crash
/// during the roll-back) gives the same result.
pub fn roll_back() -> shoal_engine::RollBack {
    shoal_engine::RollBack(std::sync::Arc::new(|w, unfinished| {
        for t in unfinished {
            for r in t.undo.iter().rev() {
                undo_one(w, r).map_err(|e| format!("transaction {}: {e}", t.txn))?;
            }
        }
        Ok(())
    }))
}

fn undo_one(w: &Worker, r: &[u8]) -> Result<(), String> {
    if r.len() < 11 {
        return Err(format!("undo record of {} bytes is too short", r.len()));
    }
    let root = Pid(LittleEndian::read_u64(&r[0..]));
    let klen = u16::from_le_bytes([r[8], r[9]]) as usize;
    let Some(key) = r.get(11..11 + klen) else {
        return Err("undo record cut short".into());
    };
    let tree = BTree { root };
    let rest = &r[11 + klen..];
    match r[10] {
        0 => {
            tree.remove(w, key).map_err(|e| e.to_string())?;
        }
        1 => {
            tree.upsert(w, key, rest).map_err(|e| e.to_string())?;
        }
        2 if rest.len() >= 2 => {
            let off = u16::from_le_bytes([rest[0], rest[1]]) as usize;
            let old = &rest[2..];
            let mut fits = true;
            let found = tree
                .update(w, key, |v| match v.get_mut(off..off + old.len()) {
                    Some(dst) => dst.copy_from_slice(old),
                    None => fits = false,
                })
                .map_err(|e| e.to_string())?;
            if !found || !fits {
                return Err(format!(
                    "undoing an update of a key of {} bytes: the key is gone or its value shorter",
                    key.len()
                ));
            }
        }
        3 => {
            // put the old overflow reference back (its chain was kept: the transaction never
            // committed); a chain the transaction wrote there is freed by the put
            if ValueRef::decode(rest).is_none() {
                return Err("undo record with a bad overflow reference".into());
            }
            let mut old = Vec::new();
            tree.put_stored(w, key, rest, FLAG_OVERFLOW, Mode::Upsert, false, &mut old)
                .map_err(|e| e.to_string())?;
        }
        k => return Err(format!("undo record of unknown kind {k}")),
    }
    Ok(())
}
