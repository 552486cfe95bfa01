//! [`Worker`] and the three page guards: the engine's public access API.
//!
//! | guard | page fixed? | others may | how it ends |
//! |---|---|---|---|
//! | [`OptimisticGuard`] | no (may be evicted or changed) | do anything | `validate()` (restart if it fails) |
//! | [`SharedGuard`] | yes | read (shared or optimistic) | drop |
//! | [`ExclusiveGuard`] | yes | read optimistically (and fail validation) | drop (bumps the version) |
//!
//! Conversions: optimistic -> shared / exclusive (only if nothing changed since the guard was
//! taken), shared -> exclusive (only if no other sharer; else [`Restart::Retry`], since two
//! sharers waiting for each other to leave would deadlock), exclusive -> shared.
//!
//! Acquisitions wait (spin, then yield, then nap; see [`Backoff`]) for conflicting holders; a
//! non-resident page is read from the store first. Operations are written as closures returning
//! [`OpResult`] and run by [`Worker::run`], which retries on [`Restart::Retry`].

mod exclusive;
mod optimistic;
mod shared;

pub use exclusive::ExclusiveGuard;
pub use optimistic::OptimisticGuard;
pub use shared::SharedGuard;

use crate::buffer::frame::Frame;
use crate::buffer::latch::Backoff;
use crate::buffer::page::{Changed, PageMut, PageRef};
use crate::buffer::{FrameIdx, Possession};
use crate::coherence::protocol::Mode;
use crate::durability::{CommitPoint, WorkerLog};
use crate::error::{EngineError, OpResult, Restart};
use crate::node::{Missed, Node};
use crate::pid::Pid;
use crate::stats::{bump, bump_by, WorkerStats};
use shoal_storage::PAGE_DATA_SIZE;
use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Range;
use std::sync::Arc;

/// Where a page was and in which version, at one moment ([`OptimisticGuard::stamp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageStamp {
    frame: u32,
    version: u64,
}

/// A thread's registration with its node: the handle that takes guards. Not `Sync`: one thread
/// uses it at a time (it owns per-thread counters, and will own mailbox slots).
pub struct Worker {
    node: Arc<Node>,
    stats: Arc<WorkerStats>,
    /// Shared and exclusive guards this worker holds: a remote miss waits only when it is 0.
    held: Cell<u32>,
    /// A page whose request this worker waited for: the handler keeps it for us until we
    /// latched it (see `Coherence::used`).
    owed: Cell<Option<Pid>>,
    /// This worker's part of the write-ahead log (None: the node has no log).
    log: Option<WorkerLog>,
    /// The page copy [`ExclusiveGuard::modify`] edits, kept between calls (None while one is
    /// in use: a nested `modify` allocates its own).
    scratch: Cell<Option<Box<[u8; PAGE_DATA_SIZE]>>>,
    _not_sync: PhantomData<Cell<()>>,
}

impl Worker {
    pub(crate) fn new(node: Arc<Node>, stats: Arc<WorkerStats>) -> Worker {
        node.register_worker(&stats);
        Worker {
            log: node.log().map(|l| WorkerLog::new(Arc::clone(l.log()))),
            stats,
            held: Cell::new(0),
            owed: Cell::new(None),
            node,
            scratch: Cell::new(None),
            _not_sync: PhantomData,
        }
    }

    /// Make everything this worker changed durable, as the engine's durability says: with
    /// `commit`, wait until the log holding it is on the device (one flush serves every worker
    /// waiting); with `flush-every-ms` or `none`, return at once. Call it with no guard held.
    /// The same as [`Worker::commit_later`] then, with `commit`, [`Worker::wait_durable`].
    pub fn commit(&self) -> Result<(), EngineError> {
        let point = self.commit_later()?;
        if self.node.durability() == crate::durability::Durability::Commit {
            self.wait_durable(point)?;
        }
        Ok(())
    }

    /// The identity of this worker's engine, or of its cluster, in this process: the same
    /// for every worker of one engine (of one cluster, across node restarts), different for
    /// any other engine. A tree handle carries it and is refused by workers of another.
    pub fn database(&self) -> u64 {
        self.node.database()
    }

    /// Most pages one group of exclusive guards held at once (a transaction's commit) may
    /// change: their changes are logged as one chunk, each page whole at worst, and a chunk
    /// takes at most a quarter of the log. No bound without a log.
    pub fn most_pages_per_commit(&self) -> usize {
        match &self.log {
            Some(log) => log.log().most_pages_per_chunk(),
            None => usize::MAX,
        }
    }

    /// When this worker's commits become durable (the engine's `EngineConfig::durability`).
    pub fn durability(&self) -> crate::durability::Durability {
        self.node.durability()
    }

    /// Commit without waiting: returns the point in the log that must be durable before the
    /// caller may tell anyone the work is done. It covers everything this worker changed and
    /// everything it could have read (the log's tail now: a change is in the log before its
    /// page is unlatched). Meanwhile the worker goes on (the log writer flushes in the
    /// background: group commit without a waiting thread); [`Worker::is_durable`] says when.
    /// Call it with no guard held.
    pub fn commit_later(&self) -> Result<CommitPoint, EngineError> {
        if self.node.buffer().is_shutdown() {
            // (a closed engine's worker commits nothing: its changes were refused)
            return Err(EngineError::Shutdown);
        }
        match &self.log {
            Some(log) => log.commit_later(),
            None => Ok(CommitPoint::NOW),
        }
    }

    /// Whether everything before `point` is durable (an error if the log failed: then it
    /// never will be).
    pub fn is_durable(&self, point: CommitPoint) -> Result<bool, EngineError> {
        match &self.log {
            Some(log) => log.is_durable(point),
            None => Ok(true),
        }
    }

    /// Wait until everything before `point` is durable (flushing it if nobody else is).
    pub fn wait_durable(&self, point: CommitPoint) -> Result<(), EngineError> {
        match &self.log {
            Some(log) => log.wait_durable(point),
            None => Ok(()),
        }
    }

    /// Debug check of the group rule: `idx` is not latched by this worker's open group.
    fn check_not_deferred(&self, idx: FrameIdx) {
        if let Some(log) = &self.log {
            log.check_not_deferred(idx);
        }
    }

    /// The node this worker belongs to.
    pub fn node_id(&self) -> u8 {
        self.node.id()
    }

    /// Pages this node freed and holds for its next allocations (cluster nodes only: see
    /// [`ExclusiveGuard::free`]).
    pub fn recycled_pages(&self) -> Vec<Pid> {
        self.node.recycled()
    }

    /// Bring `pid` to this node with the possession a write needs (node-exclusive), waiting
    /// for it, without latching it: for a caller that will latch several pages at once and
    /// may not wait for a remote page while it holds latches (a transaction's commit).
    /// Gathering its pages first, holding nothing, lets its latching find them here; another
    /// node may still take one back before then (the caller then gathers again). Nothing to
    /// do on a single node. Call it with no guard held.
    pub fn gather_exclusive(&self, pid: Pid) -> Result<(), EngineError> {
        assert_eq!(
            self.held.get(),
            0,
            "gather_exclusive while holding guards (it waits for other nodes)"
        );
        if !self.node.is_cluster() {
            return Ok(());
        }
        bump(&self.stats.faults);
        if let Missed::Brought = self.node.miss(pid, Mode::Exclusive, true)? {
            // no latch follows at once: the page need not be kept for this worker
            self.node.used(pid);
        }
        Ok(())
    }

    /// `pid` is not resident, or not with possession `want`: bring it in. A single node reads
    /// it from the store. A cluster node asks the page's home; it waits for the answer only
    /// if it holds no latch (else it restarts the operation, which drops its guards, so that
    /// two nodes never wait for each other's latches). The caller looks `pid` up again.
    #[cold]
    fn miss(&self, pid: Pid, want: Mode) -> OpResult<()> {
        bump(&self.stats.faults);
        match self.node.miss(pid, want, self.held.get() == 0)? {
            Missed::Here => Ok(()),
            Missed::Brought => {
                self.owed.set(Some(pid));
                Ok(())
            }
            Missed::Asked => Err(Restart::Retry),
        }
    }

    /// A guard on `pid` was taken: if this worker's request brought it, release the handler's
    /// hold on it (it serves others once our latch is gone).
    #[inline]
    fn settle(&self, pid: Pid) {
        if self.owed.get() == Some(pid) {
            self.owed.set(None);
            self.node.used(pid);
        }
    }

    #[inline]
    fn hold(&self) {
        self.held.set(self.held.get() + 1);
        crate::tasks::guard_taken();
    }

    #[inline]
    fn unhold(&self) {
        self.held.set(self.held.get() - 1);
        crate::tasks::guard_dropped();
    }

    /// Wait a little for a latch (see [`Backoff`]); in a task that may not pause and has
    /// waited a while, restart the operation instead (the latch rule in [`crate::tasks`]).
    #[inline]
    fn snooze(backoff: &mut Backoff) -> OpResult<()> {
        if backoff.stuck_in_task() {
            return Err(Restart::Retry);
        }
        backoff.snooze();
        Ok(())
    }

    #[inline]
    fn frame(&self, idx: FrameIdx) -> &Frame {
        self.node.buffer().frame(idx)
    }

    /// Atomic, total read access to frame `idx`'s page, whatever it holds right now.
    #[inline]
    fn page_ref(&self, idx: FrameIdx) -> PageRef<'_> {
        // SAFETY: the pool's page memory lives as long as the engine (which `self` keeps alive)
        // and, while others may write it, is only accessed through atomics; PageRef reads only
        // with atomic loads and never out of range.
        unsafe { PageRef::from_ptr(self.node.buffer().page_ptr(idx)) }
    }

    /// Hint that `pid` will be latched soon: starts loading its translation-table entry, so a
    /// caller can overlap that cache miss with other work (e.g. validating a parent node).
    #[inline]
    pub fn prefetch(&self, pid: Pid) {
        self.node.buffer().prefetch_entry(pid);
    }

    /// Hint: bytes `off..off + len` of `pid`'s page will be read soon. Starts loading them in
    /// the page's preferred frame (a fixed function of its id, see docs/architecture.md), where a page usually is
    /// when the cache holds the data; wasted if it is elsewhere or not resident.
    #[inline]
    pub fn prefetch_range(&self, pid: Pid, off: usize, len: usize) {
        self.node.buffer().prefetch_range(pid, off, len);
    }

    /// Second hint, after [`Worker::prefetch`] had time to load the translation entry: if
    /// `pid` is resident, start loading its frame descriptor and the first lines of its page.
    /// Operations that walk several pages at once (batched lookups) issue both hints for each
    /// page some steps before they latch it, so the cache misses of many pages overlap.
    /// Returns whether `pid` is resident here (a hint: it may be evicted at any moment), so
    /// that such operations can [`Worker::load_many`] the others.
    #[inline]
    pub fn prefetch_frame(&self, pid: Pid) -> bool {
        self.node.buffer().prefetch_frame(pid)
    }

    /// Read the pages among `pids` that are not in memory from the store together (one batch
    /// of I/O in flight), rather than one at a time as each guard would fault them: for
    /// operations that will latch several pages they know in advance (batched lookups).
    /// Resident pages are skipped; when no frame is free the rest are left to fault normally.
    /// Each pid must be a page that exists (e.g. read from a validated node). On a cluster
    /// node this does nothing: its pages come through the coherence protocol one by one.
    pub fn load_many(&self, pids: &[Pid]) -> Result<(), EngineError> {
        let n = self.node.load_many(pids)?;
        bump_by(&self.stats.faults, n as u64);
        Ok(())
    }

    #[inline]
    fn locate(&self, pid: Pid) -> Option<FrameIdx> {
        self.node.buffer().locate(pid)
    }

    /// Every page access fails once the engine is closing or closed.
    #[inline]
    fn check_open(&self) -> OpResult<()> {
        if self.node.buffer().is_shutdown() {
            return Err(Restart::Fail(EngineError::Shutdown));
        }
        Ok(())
    }

    /// Take an optimistic guard on `pid`. Waits while an exclusive holder is in.
    #[inline]
    pub fn optimistic(&self, pid: Pid) -> OpResult<OptimisticGuard<'_>> {
        Ok(self
            .optimistic_waiting(pid, None)?
            .expect("an unbounded wait ends with a guard"))
    }

    /// [`Worker::optimistic`], but without waiting long for an exclusive holder: `Ok(None)`
    /// if `pid` stays exclusively latched for a few backoff steps. For a caller that holds
    /// exclusive guards itself (a transaction's commit validating its reads): waiting for
    /// another such holder could close a cycle.
    pub fn optimistic_unless_held(&self, pid: Pid) -> OpResult<Option<OptimisticGuard<'_>>> {
        self.optimistic_waiting(pid, Some(8))
    }

    /// An optimistic guard on `pid`, waiting for an exclusive holder at most `waits` backoff
    /// steps (`Ok(None)` after them; `None`: for as long as it takes).
    #[inline(always)]
    fn optimistic_waiting(
        &self,
        pid: Pid,
        waits: Option<u32>,
    ) -> OpResult<Option<OptimisticGuard<'_>>> {
        self.check_open()?;
        let mut backoff = Backoff::new();
        let mut waited = 0;
        loop {
            let Some(idx) = self.locate(pid) else {
                self.miss(pid, Mode::Shared)?;
                continue;
            };
            let f = self.frame(idx);
            match f.latch.optimistic_begin() {
                Some(version) if f.pid() == pid && f.is_resident() => {
                    if f.possession() == Possession::None {
                        self.miss(pid, Mode::Shared)?;
                        continue;
                    }
                    if self.node.lease_lapsed(pid) {
                        self.node.wait_lease(pid)?;
                        continue;
                    }
                    f.touch(self.node.buffer().clock());
                    bump(&self.stats.hits);
                    self.settle(pid);
                    return Ok(Some(OptimisticGuard {
                        w: self,
                        idx,
                        pid,
                        version,
                    }));
                }
                Some(_) => {} // the frame moved on to another page: look up again
                None if waits.is_none_or(|n| waited < n) => {
                    waited = waited.saturating_add(1);
                    Worker::snooze(&mut backoff)?;
                }
                None => return Ok(None),
            }
        }
    }

    /// Take a shared guard on `pid` (the page is fixed while it is held).
    pub fn shared(&self, pid: Pid) -> OpResult<SharedGuard<'_>> {
        self.check_open()?;
        let mut backoff = Backoff::new();
        loop {
            let Some(idx) = self.locate(pid) else {
                self.miss(pid, Mode::Shared)?;
                continue;
            };
            let f = self.frame(idx);
            if f.latch.try_lock_shared(None) {
                if f.pid() == pid && f.is_resident() {
                    if f.possession() == Possession::None {
                        f.latch.unlock_shared();
                        self.miss(pid, Mode::Shared)?;
                        continue;
                    }
                    if self.node.lease_lapsed(pid) {
                        f.latch.unlock_shared();
                        self.node.wait_lease(pid)?;
                        continue;
                    }
                    f.touch(self.node.buffer().clock());
                    bump(&self.stats.hits);
                    self.settle(pid);
                    return Ok(SharedGuard::new(self, idx, pid));
                }
                f.latch.unlock_shared();
            } else {
                Worker::snooze(&mut backoff)?;
            }
        }
    }

    /// Take an exclusive guard on `pid` (the page is fixed and marked dirty).
    pub fn exclusive(&self, pid: Pid) -> OpResult<ExclusiveGuard<'_>> {
        let mut backoff = Backoff::new();
        loop {
            let Some(idx) = self.locate(pid) else {
                self.miss(pid, Mode::Exclusive)?;
                continue;
            };
            let f = self.frame(idx);
            if f.latch.try_lock_exclusive(None) {
                if f.pid() == pid && f.is_resident() {
                    if f.possession() != Possession::Exclusive {
                        f.latch.unlock_exclusive_unchanged();
                        self.miss(pid, Mode::Exclusive)?;
                        continue;
                    }
                    if self.node.lease_lapsed(pid) {
                        f.latch.unlock_exclusive_unchanged();
                        self.node.wait_lease(pid)?;
                        continue;
                    }
                    bump(&self.stats.hits);
                    self.settle(pid);
                    return ExclusiveGuard::start(self, idx, pid);
                }
                f.latch.unlock_exclusive_unchanged();
            } else {
                self.check_not_deferred(idx);
                Worker::snooze(&mut backoff)?;
            }
        }
    }

    /// Allocate a zeroed page; returns it exclusively latched. A new page homed on this node,
    /// or on a cluster node first a page this node freed earlier ([`ExclusiveGuard::free`]),
    /// which may be homed on any node: use [`Worker::allocate_on`] where the home matters.
    pub fn allocate(&self) -> Result<ExclusiveGuard<'_>, EngineError> {
        if let Some(g) = self.reuse_recycled() {
            return Ok(g);
        }
        self.allocate_here()
    }

    /// A new page homed on this node, exclusively latched.
    fn allocate_here(&self) -> Result<ExclusiveGuard<'_>, EngineError> {
        if let Some(log) = &self.log {
            // (a failed log takes no more changes: see `Log::fail`)
            log.log().check_failed()?;
        }
        if let Some(log) = self.log.as_ref().filter(|l| l.must_wait()) {
            // the log is nearly full: a new page is logged whole, so wait for a checkpoint
            // first, holding no latch (as `ExclusiveGuard::start` does before a change)
            log.log().wait_for_room()?;
        }
        let h = self.node.allocate_page()?;
        let pid = h.pid();
        self.hold();
        if let Some(log) = &self.log {
            log.open();
        }
        let mut changed = Changed::default();
        // a new page is logged whole even if nothing is written into it
        changed.note(0, PAGE_DATA_SIZE);
        Ok(ExclusiveGuard {
            w: self,
            idx: h.into_guarded(),
            pid,
            changed,
        })
    }

    /// A page this cluster node freed earlier, exclusively latched and still zeroed, if
    /// there is one that can be taken back. A page that cannot (its home died, a remote fetch
    /// timed out) is given up: it stays allocated and unused (logged).
    fn reuse_recycled(&self) -> Option<ExclusiveGuard<'_>> {
        loop {
            let pid = self.node.take_recycled()?;
            match self.run(|w| w.exclusive(pid)) {
                Ok(g) if g.data().iter().all(|&b| b == 0) => return Some(g),
                Ok(g) => {
                    // Nothing reaches a freed page, so nothing may have written it.
                    debug_assert!(false, "freed page {pid} was written");
                    log::error!("freed page {pid} was written while unreachable: not reused");
                    drop(g);
                }
                Err(e) => log::warn!("freed page {pid} cannot be reused ({e}): left unused"),
            }
        }
    }

    /// Allocate a new, zeroed page homed on `node` (this node or another of the cluster);
    /// returns it exclusively latched. Another home allocates the slot and keeps the page,
    /// which then travels here like any remote page (two round trips).
    pub fn allocate_on(&self, node: u8) -> Result<ExclusiveGuard<'_>, EngineError> {
        if node == self.node.id() {
            return self.allocate_here();
        }
        if self.node.buffer().is_shutdown() {
            return Err(EngineError::Shutdown);
        }
        let pid = self.node.allocate_on(node)?;
        self.run(|w| w.exclusive(pid))
    }

    /// Run an optimistic operation to completion: retry on [`Restart::Retry`], return errors.
    /// The closure gets the worker with the caller's lifetime, so it may return a guard.
    pub fn run<'w, T>(
        &'w self,
        op: impl FnMut(&'w Worker) -> OpResult<T>,
    ) -> Result<T, EngineError> {
        match self.retry(op, false)? {
            Some(v) => Ok(v),
            None => unreachable!("retry gives up only when asked to"),
        }
    }

    /// [`Worker::run`] for a caller that holds guards outside `op` (lock coupling, as a scan
    /// stepping to the next leaf). Outside tasks the same as `run`. In a task, `op` may wait
    /// for a frame that a paused task of this thread is loading, and that task cannot run
    /// until this one pauses, which it may not while it holds guards (the latch rule in
    /// [`crate::tasks`]): so after `op` restarted a few times this gives up with `None`, and
    /// the caller lets its guards go and starts over from where it was, without them.
    pub fn run_while_holding<'w, T>(
        &'w self,
        op: impl FnMut(&'w Worker) -> OpResult<T>,
    ) -> Result<Option<T>, EngineError> {
        self.retry(op, true)
    }

    /// Run `op` until it succeeds or fails; with `may_give_up`, `None` after it restarted
    /// twice inside a task that may not pause (see [`Worker::run_while_holding`]).
    #[inline]
    fn retry<'w, T>(
        &'w self,
        mut op: impl FnMut(&'w Worker) -> OpResult<T>,
        may_give_up: bool,
    ) -> Result<Option<T>, EngineError> {
        const GIVE_UP: u32 = 2;
        let mut backoff = Backoff::new();
        let mut restarts = 0;
        loop {
            match op(self) {
                Ok(v) => return Ok(Some(v)),
                Err(Restart::Retry) => {
                    bump(&self.stats.restarts);
                    restarts += 1;
                    if may_give_up
                        && restarts >= GIVE_UP
                        && crate::tasks::in_task()
                        && !crate::tasks::may_pause()
                    {
                        return Ok(None);
                    }
                    backoff.snooze();
                }
                Err(Restart::Fail(e)) => return Err(e),
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.node.retire_worker(&self.stats);
    }
}
