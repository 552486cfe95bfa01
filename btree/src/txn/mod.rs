//! Transactions over any number of trees: serializable, optimistic (docs/transactions.md).
//!
//! A [`Transaction`] reads the trees as they are and keeps its writes to itself until it
//! commits. Every read goes into its *read set*: the value it saw (or that the key was absent)
//! with the stamp of the leaf it came from, and for a range, every entry it saw and every leaf
//! it walked. The commit then
//!
//! 1. latches the leaf of every key it writes, exclusively, in page order, without waiting
//!    for anyone (a busy leaf: let everything go and try again; the same leaf latched twice
//!    is one guard);
//! 2. checks that each of those leaves has room for its writes (else lets everything go,
//!    splits the leaf as any insert would, and tries again);
//! 3. validates the read set: each read leaf is unchanged since the read (same stamp), or,
//!    where it changed, the key still holds what was read (a range: the same entries, nothing
//!    inserted or removed in it, which also excludes phantoms). A read whose leaf another
//!    committer holds is a conflict;
//! 4. writes every change into the leaves it holds and lets them go together: the engine logs
//!    the changes of guards held at once as one chunk, so after a crash all of them are there
//!    or none. Nothing was written before this point, so an abort has nothing to undo.
//!
//! Serializable: the transaction is equivalent to running alone at the moment it held every
//! leaf it writes (step 3 shows that everything it read was still so then, step 4 shows
//! nobody else's write to those leaves came between). It works the same on a cluster: leaf
//! stamps change whenever another node takes a page exclusively, and a page homed elsewhere is
//! fetched through the coherence protocol like any read (a commit that would wait for a remote
//! page while holding leaves lets them go and tries again).
//!
//! It must not know how pages reach memory or other nodes: it uses the engine's guards.

mod commit;
mod read;
mod writes;

use crate::error::TreeError;
use crate::node;
use crate::range::Entry;
use crate::tree::{BTree, Batch, Direction, Insert};
use read::{PointRead, RangeRead};
use shoal_engine::{CommitPoint, Worker};
use std::ops::{Bound, Range, RangeBounds};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use writes::{apply_adds, Addend, NewOp, Op, Writes};

/// Whether commits validate their reads (always, but for the checkers' own tests).
static ISOLATION: AtomicBool = AtomicBool::new(true);

/// Switch read validation off (`false`) for the whole process: commits then write without
/// checking what they read, so transactions are atomic but not isolated. Only for showing
/// that the isolation checkers (tests/transactions.rs) catch what it lets through; never in
/// a real run.
#[doc(hidden)]
pub fn set_isolation_for_checker_tests(on: bool) {
    ISOLATION.store(on, Ordering::Relaxed);
}

fn isolated() -> bool {
    ISOLATION.load(Ordering::Relaxed)
}

/// Why a transaction did not commit. Every variant but [`TxError::DurabilityUnknown`] means
/// nothing of the transaction was written.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// Another transaction changed what this one read (or held a leaf it needed for too
    /// long): nothing of it was written. Running it again usually succeeds ([`transact`]).
    #[error("the transaction conflicted with another one and was rolled back; run it again")]
    Conflict,
    /// An error of the trees or the engine (a full device, a dead node, a key too large, the
    /// engine shut down): nothing was written.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// A write in a read-committed transaction ([`Transaction::read_committed`]), which only
    /// reads: nothing was written.
    #[error("a read-committed transaction only reads; begin a serializable one to write")]
    WriteInReadCommitted,
    /// The transaction writes more leaves than one commit can log at once (the log's room for
    /// one chunk: `EngineConfig::wal_bytes`): nothing was written. Commit in parts, or give
    /// the log more room.
    #[error(
        "the transaction writes {leaves} leaves, and one commit writes at most {most} with this \
         log (each changed leaf is logged, whole at worst, in one chunk of at most a quarter of \
         the log): nothing was written; commit in parts or give the log more room"
    )]
    TooLarge {
        /// Leaves the commit would write.
        leaves: usize,
        /// Most leaves one commit can write with this log.
        most: usize,
    },
    /// The commit's writes were applied, but the log holding them could not be written or
    /// synced: they may or may not survive a crash, and the engine accepts no more writes
    /// (as PostgreSQL and RocksDB stop on a failed fsync). Not a conflict: running the
    /// transaction again would write it twice.
    #[error("the commit was applied, but whether it is durable is unknown (the log failed: {0}); the engine accepts no more writes")]
    DurabilityUnknown(shoal_engine::EngineError),
    /// [`transact_with`] tried the transaction as often or as long as it was allowed, and it
    /// conflicted every time: nothing was written.
    #[error("the transaction conflicted on each of its {tries} tries; nothing was written")]
    GaveUp {
        /// Tries made.
        tries: u32,
    },
}

impl From<shoal_engine::EngineError> for TxError {
    fn from(e: shoal_engine::EngineError) -> TxError {
        TxError::Tree(TreeError::Engine(e))
    }
}

impl TxError {
    /// Whether running the transaction again may succeed.
    pub fn is_conflict(&self) -> bool {
        matches!(self, TxError::Conflict)
    }

    /// Whether the engine was shut down (closed, or crashed by `Cluster::crash`).
    pub fn is_shutdown(&self) -> bool {
        matches!(
            self,
            TxError::Tree(TreeError::Engine(shoal_engine::EngineError::Shutdown))
        )
    }
}

/// Why [`transact_with`] ended without committing: the transaction's own error, or the
/// caller's (the closure's `Err(Abort::User(e))`).
#[derive(Debug, thiserror::Error)]
pub enum Abort<E> {
    /// The transaction failed ([`TxError`]).
    #[error(transparent)]
    Tx(#[from] TxError),
    /// The closure gave up with its own error, and what it read was still so then (it was
    /// not misled by a conflict): nothing was written.
    #[error("the transaction was aborted by its caller")]
    User(E),
}

impl<E> From<TreeError> for Abort<E> {
    fn from(e: TreeError) -> Abort<E> {
        Abort::Tx(TxError::Tree(e))
    }
}

/// Most bytes of each read-set and write-set buffer a thread keeps for its next transaction
/// (TPC-C's Stock-Level reads about 200 stock rows of 306 bytes: its arena must stay, or
/// every one maps and faults in fresh pages).
const SPARE_BYTES: usize = 1 << 20;

/// The buffers of a transaction, kept by its thread for the next one.
#[derive(Default)]
struct Buffers {
    points: Vec<PointRead>,
    arena: Vec<u8>,
    writes: Writes,
    scratch: Vec<u8>,
}

thread_local! {
    /// The buffers of this thread's last transaction, emptied, for its next one: a
    /// transaction then allocates nothing for its point reads and writes (malloc and free
    /// were about a tenth of TPC-C's time).
    static SPARE: std::cell::Cell<Option<Buffers>> = const { std::cell::Cell::new(None) };
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        let mut b = Buffers {
            points: std::mem::take(&mut self.points),
            arena: std::mem::take(&mut self.arena),
            writes: std::mem::take(&mut self.writes),
            scratch: std::mem::take(&mut self.scratch),
        };
        if b.arena.capacity() <= SPARE_BYTES
            && b.points.capacity() * std::mem::size_of::<PointRead>() <= SPARE_BYTES
            && b.writes.capacity_bytes() <= SPARE_BYTES
            && b.scratch.capacity() <= SPARE_BYTES
        {
            b.points.clear();
            b.arena.clear();
            b.writes.clear();
            SPARE.with(|s| s.set(Some(b)));
        }
    }
}

/// Some bytes of a value as a transaction read them ([`Transaction::get_part`]).
struct Part {
    bytes: Vec<u8>,
    /// Where they were read (as [`Write::read_at`]).
    at: Option<ReadAt>,
    /// Read from the tree as a part of a value in its leaf: a write of them can be a patch.
    patchable: bool,
}

/// A change kept as a patch or adds applied over `value`, the value as the tree holds it (a
/// put or a removal replaces the value instead: nothing to apply).
fn apply_over(op: Op<'_>, value: &mut [u8]) {
    match op {
        Op::Patch(ps) => overlay(value, 0, ps),
        Op::Add(adds) => apply_adds(value, adds),
        Op::Put(_) | Op::Remove => {}
    }
}

/// Write the bytes of `patches` over `part`, the bytes of a value from offset `from`.
fn overlay(part: &mut [u8], from: usize, patches: &[(usize, Vec<u8>)]) {
    for (at, bytes) in patches {
        let lo = (*at).max(from);
        let hi = (at + bytes.len()).min(from + part.len());
        if lo < hi {
            part[lo - from..hi - from].copy_from_slice(&bytes[lo - at..hi - at]);
        }
    }
}

/// The leaf a key was read from, its stamp then, and the length of what its slot held
/// (`None`: absent, or not known for sure: a read of some bytes of the value validates only
/// those).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadAt {
    pub leaf: shoal_engine::Pid,
    pub stamp: shoal_engine::PageStamp,
    pub len: Option<usize>,
    /// The key's slot in the leaf at `stamp`, if known ([`read::PointRead::slot`]).
    pub slot: Option<usize>,
}

/// Where a transaction last read each of the last few trees it read ([`read::Hint`]): its
/// next point read of such a tree starts from that leaf while it is unchanged and holds the
/// key, instead of descending (TPC-C's Delivery reads an order's lines one after the other,
/// all in one leaf).
#[derive(Default)]
struct Hints {
    /// (tree root, hint), the oldest replaced first.
    at: [Option<(u64, read::Hint)>; Hints::TREES],
    next: usize,
}

impl Hints {
    const TREES: usize = 4;

    fn get(&self, tree: &BTree) -> Option<read::Hint> {
        let root = tree.root().raw();
        self.at
            .iter()
            .flatten()
            .find(|(r, _)| *r == root)
            .map(|(_, h)| *h)
    }

    fn note(&mut self, tree: &BTree, leaf: shoal_engine::Pid, stamp: shoal_engine::PageStamp) {
        let root = tree.root().raw();
        let h = read::Hint { leaf, stamp };
        if let Some(e) = self.at.iter_mut().flatten().find(|(r, _)| *r == root) {
            e.1 = h;
            return;
        }
        self.at[self.next] = Some((root, h));
        self.next = (self.next + 1) % Self::TREES;
    }
}

/// A transaction of one worker over any number of trees. Made by [`Transaction::begin`];
/// ends with [`Transaction::commit`] or [`Transaction::abort`] (dropping it aborts). Reads see
/// the transaction's own writes.
pub struct Transaction<'w> {
    w: &'w Worker,
    points: Vec<PointRead>,
    ranges: Vec<RangeRead>,
    /// The keys and values the reads saw, one after the other (their spans are in `points`
    /// and `ranges`).
    arena: Vec<u8>,
    /// Its writes, one per (tree, key).
    writes: Writes,
    /// A value on its way from a read to a write ([`Transaction::update`]).
    scratch: Vec<u8>,
    hints: Hints,
    /// Reads are not recorded nor validated, and writes are refused
    /// ([`Transaction::read_committed`]).
    read_committed: bool,
}

impl<'w> Transaction<'w> {
    /// Begin a transaction of worker `w`. Call with no guard held.
    pub fn begin(w: &'w Worker) -> Transaction<'w> {
        let b = SPARE.with(|s| s.take()).unwrap_or_default();
        Transaction {
            w,
            points: b.points,
            ranges: Vec::new(),
            arena: b.arena,
            writes: b.writes,
            scratch: b.scratch,
            hints: Hints::default(),
            read_committed: false,
        }
    }

    /// Begin a read-only transaction of worker `w` at isolation level *read committed*: every
    /// read sees only committed data (a commit's writes reach the leaves all at its end, so
    /// no read can see a change of a transaction that has not committed or that aborted), but
    /// two reads may see different moments (another transaction may commit between them),
    /// and nothing is validated, so it never conflicts. Its writes are refused
    /// ([`TxError::WriteInReadCommitted`]). For reports that tolerate that, as TPC-C allows
    /// its Stock-Level (level 1 isolation, clause 3.4.1): a long read under a stream of
    /// writers then neither repeats nor slows them. Call with no guard held.
    pub fn read_committed(w: &'w Worker) -> Transaction<'w> {
        let mut tx = Self::begin(w);
        tx.read_committed = true;
        tx
    }

    /// Whether the transaction is read committed ([`Transaction::read_committed`]).
    pub fn is_read_committed(&self) -> bool {
        self.read_committed
    }

    /// A write may follow: else [`TxError::WriteInReadCommitted`].
    fn writable(&self) -> Result<(), TxError> {
        if self.read_committed {
            return Err(TxError::WriteInReadCommitted);
        }
        Ok(())
    }

    /// Forget the reads recorded since `points`/`arena` had these lengths (a read-committed
    /// transaction keeps none).
    fn unrecord(&mut self, points: usize, arena: usize) {
        debug_assert!(self.read_committed && self.ranges.is_empty());
        debug_assert!(self.points.len() >= points && self.arena.len() >= arena);
        self.points.truncate(points);
        self.arena.truncate(arena);
    }

    /// The worker the transaction runs on.
    pub fn worker(&self) -> &'w Worker {
        self.w
    }

    /// Whether the transaction has written anything yet.
    pub fn is_read_only(&self) -> bool {
        self.writes.is_empty()
    }

    fn own_write(&self, tree: &BTree, key: &[u8]) -> Option<Op<'_>> {
        let w = self.writes.get(tree.root().raw(), key)?;
        Some(self.writes.op(w))
    }

    /// Where this transaction read `key` of `tree` before writing it (`None`: not written,
    /// or written without reading).
    fn own_read_at(&self, tree: &BTree, key: &[u8]) -> Option<ReadAt> {
        self.writes.get(tree.root().raw(), key)?.read_at
    }

    /// The value of `key` in `tree`, as this transaction sees it.
    pub fn get(&mut self, tree: &BTree, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, TxError> {
        tree.check_worker(self.w)?;
        let mut v = Vec::new();
        let (found, _) = self.read_into(tree, key.as_ref(), &mut v)?;
        Ok(found.then_some(v))
    }

    /// [`Transaction::get`] into the end of `out` (whether found), with where the value came
    /// from (for a write that follows).
    fn read_into(
        &mut self,
        tree: &BTree,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(bool, Option<ReadAt>), TxError> {
        BTree::check_key(key)?;
        let root = tree.root().raw();
        let Some(w) = self.writes.get(root, key) else {
            return self.read_tree_into(tree, key, out);
        };
        let at = w.read_at;
        match self.writes.op(w) {
            Op::Put(v) => {
                out.extend_from_slice(v);
                Ok((true, at))
            }
            Op::Remove => Ok((false, at)),
            Op::Patch(_) | Op::Add(_) => {
                // the whole value now (a read of it all), with this transaction's patch or adds
                let from = out.len();
                let (found, _) = self.read_tree_into(tree, key, out)?;
                if let Some(w) = self.writes.get(root, key) {
                    apply_over(self.writes.op(w), &mut out[from..]);
                }
                Ok((found, at))
            }
        }
    }

    /// `key`'s value in the tree (not this transaction's writes) into the end of `out`,
    /// recorded in the read set.
    fn read_tree_into(
        &mut self,
        tree: &BTree,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(bool, Option<ReadAt>), TxError> {
        let (points, arena) = (self.points.len(), self.arena.len());
        let (seen, at) = self.read_tree(tree, key)?;
        if let Some(v) = seen.clone() {
            out.extend_from_slice(&self.arena[v]);
        }
        if self.read_committed {
            self.unrecord(points, arena);
        }
        Ok((seen.is_some(), Some(at)))
    }

    /// `key`'s value in the tree (not this transaction's writes), recorded in the read set:
    /// where the arena holds it (`None`: absent), and where it was read.
    fn read_tree(
        &mut self,
        tree: &BTree,
        key: &[u8],
    ) -> Result<(Option<read::Span>, ReadAt), TxError> {
        let r = read::point(self.w, *tree, key, &mut self.arena, self.hints.get(tree))?;
        self.hints.note(tree, r.leaf, r.stamp);
        let at = ReadAt {
            leaf: r.leaf,
            stamp: r.stamp,
            slot: r.slot,
            // (what the leaf holds: the reference, for a value in overflow pages)
            len: r.seen.as_ref().map(|v| {
                if r.overflow {
                    crate::overflow::REF_LEN
                } else {
                    v.len()
                }
            }),
        };
        let seen = r.seen.clone();
        self.points.push(r);
        Ok((seen, at))
    }

    /// The values of many keys of `tree` at once: `each(i, value)` for every `keys[i]`, in
    /// order (`None`: absent), as [`Transaction::get`] would give them one by one, but faster
    /// for many keys (the lookups walk down together, their cache misses overlapping: see
    /// [`BTree::lookup_many`]).
    pub fn get_many<K: AsRef<[u8]>>(
        &mut self,
        tree: &BTree,
        keys: &[K],
        mut each: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<(), TxError> {
        tree.check_worker(self.w)?;
        if self.read_committed {
            // nothing to record nor to see of its own (it writes nothing): the committed
            // values straight from the walk, copied once
            return Ok(tree.lookup_many(self.w, keys, each)?);
        }
        // keys this transaction wrote are its own; the rest are read from the tree together
        let theirs: Vec<usize> = (0..keys.len())
            .filter(|&i| self.own_write(tree, keys[i].as_ref()).is_none())
            .collect();
        // (the value spans in the arena: `Some(None)` absent)
        let mut got: Vec<Option<Option<read::Span>>> = vec![None; keys.len()];
        let batch: Vec<&[u8]> = theirs.iter().map(|&i| keys[i].as_ref()).collect();
        let mut alone = Vec::new();
        let (arena, points) = (&mut self.arena, &mut self.points);
        tree.lookup_many_stamped(self.w, &batch, |j, at| match at {
            Some((v, leaf, stamp)) => {
                let i = theirs[j];
                let k0 = arena.len();
                arena.extend_from_slice(keys[i].as_ref());
                let v0 = arena.len();
                let seen = v.map(|v| {
                    arena.extend_from_slice(v);
                    v0..arena.len()
                });
                got[i] = Some(seen.clone());
                points.push(read::PointRead {
                    tree: *tree,
                    key: k0..v0,
                    seen,
                    leaf,
                    stamp,
                    slot: None,
                    overflow: false,
                    part: None,
                });
            }
            None => alone.push(theirs[j]),
        })?;
        let mut own: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        for i in alone {
            own[i] = self.get(tree, keys[i].as_ref())?;
            got[i] = None;
        }
        for (i, k) in keys.iter().enumerate() {
            match got[i].take() {
                Some(span) => each(i, span.map(|v| &self.arena[v])),
                None => {
                    // looked up alone, or this transaction's own write
                    let v = match own[i].take() {
                        Some(v) => Some(v),
                        None => self.get(tree, k.as_ref())?,
                    };
                    each(i, v.as_deref());
                }
            }
        }
        Ok(())
    }

    /// [`Transaction::get_many`] of bytes `part` of each value (clipped to the value, as in
    /// [`Transaction::get_part`]). In a read-committed transaction only those bytes are
    /// copied (a column of many large rows: one cache line of each); in a serializable one
    /// each value is read (and validated) whole, then cut.
    pub fn get_many_part<K: AsRef<[u8]>>(
        &mut self,
        tree: &BTree,
        keys: &[K],
        part: Range<usize>,
        mut each: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<(), TxError> {
        tree.check_worker(self.w)?;
        if self.read_committed {
            return Ok(tree.lookup_many_part(self.w, keys, part, each)?);
        }
        self.get_many(tree, keys, |i, v| {
            each(i, v.map(|v| &v[node::clip(&part, v.len())]))
        })
    }

    /// Insert `key` -> `value` if `key` is absent; [`Insert::Exists`] (and nothing written) if
    /// it is present.
    pub fn insert(
        &mut self,
        tree: &BTree,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<Insert, TxError> {
        tree.check_worker(self.w)?;
        self.writable()?;
        let key = key.as_ref();
        BTree::check_sizes(key, value.as_ref().len())?;
        let (now, at) = self.probe(tree, key)?;
        if now {
            return Ok(Insert::Exists);
        }
        self.put(tree, key, NewOp::Put(value.as_ref()), at);
        Ok(Insert::Inserted)
    }

    /// Insert or replace, without reading: the transaction does not depend on what was there.
    pub fn upsert(
        &mut self,
        tree: &BTree,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<(), TxError> {
        tree.check_worker(self.w)?;
        self.writable()?;
        let key = key.as_ref();
        BTree::check_sizes(key, value.as_ref().len())?;
        // (a key this transaction read keeps where it was read)
        self.writes
            .set_keeping_read(tree.root().raw(), key, NewOp::Put(value.as_ref()));
        Ok(())
    }

    /// Change the value of `key` (its length stays): `f` gets the value as this transaction
    /// sees it. Returns whether the key exists (if not, nothing is written).
    pub fn update(
        &mut self,
        tree: &BTree,
        key: impl AsRef<[u8]>,
        f: impl FnOnce(&mut [u8]),
    ) -> Result<bool, TxError> {
        tree.check_worker(self.w)?;
        self.writable()?;
        let key = key.as_ref();
        let root = tree.root().raw();
        if let Some(vacant) = self.writes.vacant(root, key) {
            // the value read goes straight from the read set's copy to the write's
            BTree::check_key(key)?;
            let (seen, at) = self.read_tree(tree, key)?;
            let Some(v) = seen else {
                return Ok(false);
            };
            let i = self
                .writes
                .put_vacant(vacant, root, key, NewOp::Put(&self.arena[v]), Some(at));
            f(self.writes.put_at_mut(i).expect("just put"));
            return Ok(true);
        }
        let mut v = std::mem::take(&mut self.scratch);
        v.clear();
        let r = self.read_into(tree, key, &mut v);
        let r = match r {
            Ok((true, at)) => {
                f(&mut v);
                self.put(tree, key, NewOp::Put(&v), at);
                Ok(true)
            }
            Ok((false, _)) => Ok(false),
            Err(e) => Err(e),
        };
        self.scratch = v;
        r
    }

    /// Bytes `part` of `key`'s value in `tree`, as this transaction sees it (`None`: the key
    /// is absent). Only these bytes are validated at the commit: a change elsewhere in the
    /// value by another transaction is no conflict (a row's other columns). A value shorter
    /// than `part` gives what it holds of it (and is read whole); so does a value kept in
    /// overflow pages.
    pub fn get_part(
        &mut self,
        tree: &BTree,
        key: impl AsRef<[u8]>,
        part: Range<usize>,
    ) -> Result<Option<Vec<u8>>, TxError> {
        tree.check_worker(self.w)?;
        Ok(self.read_part(tree, key.as_ref(), &part)?.map(|p| p.bytes))
    }

    /// [`Transaction::get_part`] with where it was read and whether it came from the tree as
    /// a part (so that a write of it can be a patch).
    fn read_part(
        &mut self,
        tree: &BTree,
        key: &[u8],
        part: &Range<usize>,
    ) -> Result<Option<Part>, TxError> {
        BTree::check_key(key)?;
        let clip = |v: &[u8]| v[node::clip(part, v.len())].to_vec();
        let mut patches = Vec::new();
        match self.own_write(tree, key) {
            None => {}
            Some(Op::Put(v)) => {
                return Ok(Some(Part {
                    bytes: clip(v),
                    at: self.own_read_at(tree, key),
                    patchable: false,
                }))
            }
            Some(Op::Remove) => return Ok(None),
            Some(Op::Patch(ps)) => patches = ps.to_vec(),
            Some(Op::Add(_)) => {
                // read whole, with the adds (a write of it is then a put)
                let mut v = Vec::new();
                let (found, at) = self.read_into(tree, key, &mut v)?;
                return Ok(found.then(|| Part {
                    bytes: clip(&v),
                    at,
                    patchable: false,
                }));
            }
        }
        let hint = self.hints.get(tree);
        let r = read::point_part(self.w, *tree, key, part.clone(), &mut self.arena, hint)?;
        self.hints.note(tree, r.leaf, r.stamp);
        let whole = r.read.part.is_none();
        let at = ReadAt {
            leaf: r.leaf,
            stamp: r.stamp,
            // (a read of some bytes is validated on those bytes alone: the length it saw may
            // be gone by the commit, so a write of the key must not count on it)
            len: if whole { r.len } else { None },
            slot: r.read.slot,
        };
        let got = r.read.seen.clone().map(|v| {
            let bytes = &self.arena[v];
            let mut out = if whole { clip(bytes) } else { bytes.to_vec() };
            overlay(&mut out, part.start, &patches);
            out
        });
        if self.read_committed {
            self.unrecord(self.points.len(), r.read.key.start);
        } else {
            self.points.push(r.read);
        }
        Ok(got.map(|bytes| Part {
            bytes,
            at: Some(at),
            patchable: !whole,
        }))
    }

    /// Change bytes `part` of `key`'s value in `tree`: `f` gets them as this transaction
    /// sees them. Returns whether the key exists (if not, nothing is written). Only these
    /// bytes are read and written: another transaction may change the rest of the value
    /// meanwhile without a conflict (as a TPC-C Payment adds to a district's year-to-date
    /// total while a NewOrder takes the district's next order id). An error if the value is
    /// shorter than `part`.
    pub fn update_part(
        &mut self,
        tree: &BTree,
        key: impl AsRef<[u8]>,
        part: Range<usize>,
        f: impl FnOnce(&mut [u8]),
    ) -> Result<bool, TxError> {
        tree.check_worker(self.w)?;
        self.writable()?;
        let key = key.as_ref();
        if let Some(v) = self.writes.put_value_mut(tree.root().raw(), key) {
            let bytes = v.get_mut(part.clone()).ok_or(TreeError::PartOutside {
                start: part.start,
                end: part.end,
            })?;
            f(bytes);
            return Ok(true);
        }
        let Some(Part {
            mut bytes,
            at,
            patchable,
        }) = self.read_part(tree, key, &part)?
        else {
            return Ok(false);
        };
        if bytes.len() != part.len() {
            return Err(TreeError::PartOutside {
                start: part.start,
                end: part.end,
            }
            .into());
        }
        if !patchable {
            // read whole (kept in overflow pages): written whole
            return self.update(tree, key, |v| f(&mut v[part]));
        }
        f(&mut bytes);
        let mut patches = match self.own_write(tree, key) {
            Some(Op::Patch(ps)) => ps.to_vec(),
            _ => Vec::new(),
        };
        patches.push((part.start, bytes));
        self.put(tree, key, NewOp::Patch(patches), at);
        Ok(true)
    }

    /// Add `delta` to the little-endian `i64` at bytes `at..at + 8` of `key`'s value, at the
    /// commit, without reading it: the transaction does not depend on the value, so
    /// transactions adding to one counter at once do not conflict (a TPC-C Payment adding to
    /// its warehouse's year-to-date total). A read of the value by this transaction sees the
    /// add (and is a read like any other). The commit fails with
    /// [`TreeError::AddOutside`] (writing nothing) if the key is absent then, its value
    /// shorter than `at + 8`, or kept in overflow pages. Wraps around on overflow.
    pub fn add_i64(
        &mut self,
        tree: &BTree,
        key: impl AsRef<[u8]>,
        at: usize,
        delta: i64,
    ) -> Result<(), TxError> {
        self.add(
            tree,
            key.as_ref(),
            Addend {
                at,
                width: 8,
                delta,
            },
        )
    }

    /// [`Transaction::add_i64`] for a little-endian `u32` (wrapping around).
    pub fn add_u32(
        &mut self,
        tree: &BTree,
        key: impl AsRef<[u8]>,
        at: usize,
        delta: u32,
    ) -> Result<(), TxError> {
        self.add(
            tree,
            key.as_ref(),
            Addend {
                at,
                width: 4,
                delta: i64::from(delta),
            },
        )
    }

    fn add(&mut self, tree: &BTree, key: &[u8], a: Addend) -> Result<(), TxError> {
        tree.check_worker(self.w)?;
        self.writable()?;
        BTree::check_key(key)?;
        let root = tree.root().raw();
        let Some(vacant) = self.writes.vacant(root, key) else {
            // written before: a put's bytes change now; adds gather; else read, add, write
            if let Some(v) = self.writes.put_value_mut(root, key) {
                let Some(bytes) = v.get_mut(a.at..a.end()) else {
                    return Err(TreeError::PartOutside {
                        start: a.at,
                        end: a.end(),
                    }
                    .into());
                };
                a.apply_to_part(bytes);
                return Ok(());
            }
            if let Some(adds) = self.writes.adds_mut(root, key) {
                match adds.iter_mut().find(|b| b.at == a.at && b.width == a.width) {
                    Some(b) => b.delta = b.delta.wrapping_add(a.delta),
                    None => adds.push(a),
                }
                return Ok(());
            }
            return match self.update_part(tree, key, a.at..a.end(), |b| a.apply_to_part(b))? {
                true => Ok(()),
                false => Err(TreeError::AddOutside {
                    key: key.to_vec(),
                    start: a.at,
                    end: a.end(),
                }
                .into()),
            };
        };
        self.writes
            .put_vacant(vacant, root, key, NewOp::Add(vec![a]), None);
        Ok(())
    }

    /// Remove `key`. Returns whether it was there.
    pub fn remove(&mut self, tree: &BTree, key: impl AsRef<[u8]>) -> Result<bool, TxError> {
        tree.check_worker(self.w)?;
        self.writable()?;
        let key = key.as_ref();
        let (now, at) = self.probe(tree, key)?;
        if !now {
            return Ok(false);
        }
        self.put(tree, key, NewOp::Remove, at);
        Ok(true)
    }

    /// Whether `key` of `tree` exists as this transaction sees it (a read of it), and where
    /// it was read.
    fn probe(&mut self, tree: &BTree, key: &[u8]) -> Result<(bool, Option<ReadAt>), TxError> {
        let mut v = std::mem::take(&mut self.scratch);
        v.clear();
        let r = self.read_into(tree, key, &mut v);
        self.scratch = v;
        r
    }

    fn put(&mut self, tree: &BTree, key: &[u8], op: NewOp<'_>, read_at: Option<ReadAt>) {
        self.writes.set(tree.root().raw(), key, op, read_at);
    }

    /// At most `limit` entries of `tree` whose keys lie in `range`, in `dir` order, as this
    /// transaction sees them. Serializable with phantoms excluded: the commit fails if any key
    /// was inserted into or removed from the part of the range this read covered (from its
    /// start to the last entry returned, or to its end if fewer than `limit` came back).
    pub fn range<K: AsRef<[u8]>>(
        &mut self,
        tree: &BTree,
        range: impl RangeBounds<K>,
        dir: Direction,
        limit: usize,
    ) -> Result<Vec<Entry>, TxError> {
        let mut out = Vec::new();
        self.scan(tree, range, dir, limit, |k, v| {
            out.push((k.to_vec(), v.to_vec()))
        })?;
        Ok(out)
    }

    /// [`Transaction::range`], handing each entry to `f` instead of copying it out.
    pub fn scan<K: AsRef<[u8]>>(
        &mut self,
        tree: &BTree,
        range: impl RangeBounds<K>,
        dir: Direction,
        limit: usize,
        mut f: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), TxError> {
        tree.check_worker(self.w)?;
        let own = |b: Bound<&K>| b.map(|k| k.as_ref().to_vec());
        let (lo, hi) = (own(range.start_bound()), own(range.end_bound()));
        if limit == 0 {
            return Ok(());
        }
        // this transaction's writes in the range, in `dir` order
        let ws = &self.writes;
        let mut mine: Vec<(&[u8], Op<'_>)> = ws
            .in_range(
                tree.root().raw(),
                lo.as_ref().map(|k| k.as_slice()),
                hi.as_ref().map(|k| k.as_slice()),
            )
            .into_iter()
            .map(|w| (ws.key(w), ws.op(w)))
            .collect();
        if dir == Direction::Descending {
            mine.reverse();
        }
        // every removal of ours can hide one entry of the tree: read that many more
        let removes = mine
            .iter()
            .filter(|(_, op)| matches!(op, Op::Remove))
            .count();
        let arena0 = self.arena.len();
        let r = read::range(self.w, *tree, lo, hi, dir, limit + removes, &mut self.arena)?;
        let arena = &self.arena;
        let seen = r
            .seen
            .iter()
            .map(|(k, v)| (&arena[k.clone()], &arena[v.clone()]));
        merge(seen, &mine, dir, limit, &mut f);
        if let Some(&(leaf, stamp)) = r.leaves.last() {
            self.hints.note(tree, leaf, stamp);
        }
        if self.read_committed {
            self.arena.truncate(arena0);
        } else {
            self.ranges.push(r);
        }
        Ok(())
    }

    /// Commit: write everything at once if nothing this transaction read has changed, else
    /// [`TxError::Conflict`] (and nothing is written). Durable as the engine's durability says
    /// (with `commit`, this waits until the log holding it is on the device).
    pub fn commit(self) -> Result<(), TxError> {
        let w = self.w;
        let point = self.commit_later()?;
        if w.durability() == shoal_engine::Durability::Commit {
            // (the writes are in the leaves already: a failure now leaves them there)
            w.wait_durable(point).map_err(TxError::DurabilityUnknown)?;
        }
        Ok(())
    }

    /// Whether everything this transaction read is still so, all at one moment (as its
    /// commit would check; nothing is written).
    fn reads_hold(&self) -> Result<bool, TxError> {
        commit::reads_hold(self)
    }

    /// [`Transaction::commit`] without waiting for durability: the point in the log that must
    /// be durable before anyone is told the transaction is done ([`Worker::is_durable`]).
    pub fn commit_later(mut self) -> Result<CommitPoint, TxError> {
        commit::commit(&mut self)
    }

    /// Give the transaction up: nothing of it is written (dropping it does the same).
    pub fn abort(self) {}
}

/// Merge the tree's entries `seen` (in `dir` order) with this transaction's writes `mine` in
/// the same range (in `dir` order): at most `limit` entries, handed to `f`.
fn merge<'s>(
    seen: impl Iterator<Item = (&'s [u8], &'s [u8])>,
    mine: &[(&[u8], Op<'_>)],
    dir: Direction,
    limit: usize,
    f: &mut impl FnMut(&[u8], &[u8]),
) {
    let before = |a: &[u8], b: &[u8]| match dir {
        Direction::Ascending => a < b,
        Direction::Descending => a > b,
    };
    let mut seen = seen.peekable();
    let (mut n, mut j) = (0, 0);
    while n < limit {
        let next = seen.peek().copied();
        let take_mine = match (next, mine.get(j)) {
            (Some((k, _)), Some((m, _))) => !before(k, m),
            (None, Some(_)) => true,
            (_, None) => false,
        };
        if take_mine {
            let (m, op) = mine[j];
            let theirs = match next {
                Some((k, v)) if k == m => {
                    seen.next(); // ours replaces the tree's
                    Some(v)
                }
                _ => None,
            };
            match (op, theirs) {
                (Op::Put(v), _) => {
                    f(m, v);
                    n += 1;
                }
                (op @ (Op::Patch(_) | Op::Add(_)), Some(v)) => {
                    let mut v = v.to_vec();
                    apply_over(op, &mut v);
                    f(m, &v);
                    n += 1;
                }
                // (a patched key the range did not find: its commit fails validation; an
                // added-to one: its commit fails)
                (Op::Patch(_) | Op::Add(_), None) | (Op::Remove, _) => {}
            }
            j += 1;
        } else {
            match seen.next() {
                Some((k, v)) => {
                    f(k, v);
                    n += 1;
                }
                None => break,
            }
        }
    }
}

impl BTree {
    /// Apply every put and remove of `batch`, in order, as one transaction
    /// ([`crate::Transaction`]): isolated from other transactions, and after a crash all of
    /// it or none (with a write-ahead log; docs/durability.md); if it fails (a full device, a
    /// dead node, too large for one commit) nothing of it is written, but for a log that
    /// failed after the batch was applied ([`TreeError::Commit`] holding
    /// [`TxError::DurabilityUnknown`]). Sizes are checked before anything is written.
    /// Committed as [`Worker::commit`] does.
    pub fn apply(&self, w: &Worker, batch: &Batch) -> Result<(), TreeError> {
        self.check_worker(w)?;
        for (k, v) in &batch.ops {
            Self::check_sizes(k, v.as_ref().map_or(0, Vec::len))?;
        }
        crate::tree::no_write_in_own_scan(self.root())?;
        let r = transact(w, |tx| {
            for (k, v) in &batch.ops {
                match v {
                    Some(v) => tx.upsert(self, k, v)?,
                    None => {
                        tx.remove(self, k)?;
                    }
                }
            }
            Ok(())
        });
        match r {
            Ok(()) => Ok(()),
            Err(crate::TxError::Tree(e)) => Err(e),
            Err(e) => Err(TreeError::Commit(Box::new(e))),
        }
    }
}

/// Run `f` as a transaction of `w` and commit it; on [`TxError::Conflict`] (in `f` or at the
/// commit) run it again, after a pause that grows with each try (up to about 10 ms, with
/// jitter), until it commits or fails otherwise. `f` may run several times: it must not have
/// effects outside the transaction that cannot be repeated. An error `f` returns is passed on
/// only if what `f` read was still so when it returned (else the error may have come from
/// reads that never were so together, and `f` runs again); nothing of the transaction is
/// written then. [`transact_with`] lets `f` abort with an error of its own and bounds the
/// tries.
pub fn transact<T>(
    w: &Worker,
    mut f: impl FnMut(&mut Transaction<'_>) -> Result<T, TxError>,
) -> Result<T, TxError> {
    match transact_with::<T, std::convert::Infallible>(w, Retry::forever(), |tx| {
        f(tx).map_err(Abort::Tx)
    }) {
        Ok(v) => Ok(v),
        Err(Abort::Tx(e)) => Err(e),
        Err(Abort::User(never)) => match never {},
    }
}

/// How long [`transact_with`] keeps running a transaction that conflicts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Retry {
    /// Most tries (`None`: no bound).
    pub tries: Option<u32>,
    /// No new try begins after this much time since the first (`None`: no bound).
    pub time: Option<Duration>,
}

impl Retry {
    /// Until it commits or fails otherwise ([`transact`]).
    pub fn forever() -> Retry {
        Retry::default()
    }

    /// At most `tries` tries.
    pub fn tries(tries: u32) -> Retry {
        Retry {
            tries: Some(tries),
            time: None,
        }
    }

    /// No new try after `time`.
    pub fn for_at_most(time: Duration) -> Retry {
        Retry {
            tries: None,
            time: Some(time),
        }
    }
}

/// [`transact`] whose closure may end the transaction with an error of its own,
/// `Err(Abort::User(e))`: nothing is written and, once what it read is confirmed (else it
/// was a conflict and `f` runs again), `Err(Abort::User(e))` is returned. Tries as `retry`
/// allows, then [`TxError::GaveUp`].
///
/// ```no_run
/// # fn demo(w: &shoal_engine::Worker, accounts: &shoal_btree::BTree) {
/// use shoal_btree::{transact_with, u64_key, Abort, Retry};
/// #[derive(Debug)]
/// struct Insufficient(i64);
/// let r = transact_with(w, Retry::tries(100), |tx| {
///     let mut v = tx.get(accounts, u64_key(1))?.unwrap_or_else(|| vec![0; 8]);
///     let balance = v.get(..8).and_then(|b| b.try_into().ok()).map_or(0, i64::from_le_bytes);
///     if balance < 10 {
///         return Err(Abort::User(Insufficient(balance))); // nothing is written
///     }
///     v[..8].copy_from_slice(&(balance - 10).to_le_bytes());
///     tx.upsert(accounts, u64_key(1), &v)?;
///     Ok(())
/// });
/// match r {
///     Ok(()) => {}
///     Err(Abort::User(Insufficient(b))) => eprintln!("only {b} on the account"),
///     Err(Abort::Tx(e)) => eprintln!("{e}"),
/// }
/// # }
/// ```
pub fn transact_with<T, E>(
    w: &Worker,
    retry: Retry,
    mut f: impl FnMut(&mut Transaction<'_>) -> Result<T, Abort<E>>,
) -> Result<T, Abort<E>> {
    let start = std::time::Instant::now();
    let mut tries = 0u32;
    loop {
        let mut tx = Transaction::begin(w);
        tries += 1;
        let r = match f(&mut tx) {
            Ok(v) => tx.commit().map(|()| v).map_err(Abort::Tx),
            // (a conflict found by a read: nothing to confirm)
            Err(Abort::Tx(TxError::Conflict)) => Err(Abort::Tx(TxError::Conflict)),
            // the closure's own error, or one a read or write gave it: passed on only if
            // what it read was so together (else it came of a conflict)
            Err(e) => match tx.reads_hold() {
                Ok(true) => Err(e),
                Ok(false) => Err(Abort::Tx(TxError::Conflict)),
                Err(v) => Err(Abort::Tx(v)),
            },
        };
        match r {
            Err(Abort::Tx(TxError::Conflict)) => {
                let out_of_tries = retry.tries.is_some_and(|n| tries >= n);
                let out_of_time = retry.time.is_some_and(|t| start.elapsed() >= t);
                if out_of_tries || out_of_time {
                    return Err(Abort::Tx(TxError::GaveUp { tries }));
                }
                backoff(tries);
            }
            r => return r,
        }
    }
}

/// The pause before try `tries + 1` of a transaction that conflicted: a spin for the first
/// tries, then a sleep that grows to about 10 ms (with jitter), or in a task a turn for the
/// thread's other tasks. [`transact`] uses it; a caller with its own retry loop (to count its
/// conflicts) can too.
pub fn backoff_after_conflict(tries: u32) {
    backoff(tries)
}

/// See [`backoff_after_conflict`].
fn backoff(tries: u32) {
    if tries < 3 {
        std::hint::spin_loop();
        return;
    }
    if shoal_engine::tasks::yield_now() {
        return; // a task: the thread's other tasks run meanwhile
    }
    let max_us = (1u64 << tries.min(13)).min(10_000);
    // jitter from the clock's low bits: transactions that collided do not collide again
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    let us = max_us / 2 + nanos % (max_us / 2 + 1);
    if us < 50 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(us));
    }
}
