//! [`Node`]: a [`Buffer`], and the [`Coherence`] protocol when the node is a member of a
//! cluster. This is the one place that tells a single node from a cluster node: guards, the
//! provider and the engine ask the node, and the node either works on its own buffer or goes
//! through the protocol.
//!
//! | question | single node | cluster node |
//! |---|---|---|
//! | a page is not here ([`Node::miss`]) | read it from the store | request it from its home |
//! | a new page ([`Node::allocate_page`]) | a slot of the store | the same, held node-exclusive through the protocol |
//! | a page is deleted ([`Node::free_page`]) | its slot is freed | it is zeroed and kept for the next allocation |
//! | the provider may evict a frame ([`Node::prepare_evict`]) | yes | through the page's directory |
//!
//! It must not know about workers' operations or guards: it answers with frames and errors.

use crate::buffer::{Buffer, FrameIdx, HeldFrame, Possession};
use crate::coherence::protocol::Mode;
use crate::coherence::Coherence;
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::pid::Pid;
use crate::stats::WorkerStats;
use parking_lot::Mutex;
use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a worker's miss came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missed {
    /// The page is (probably) here now: look it up again.
    Here,
    /// As `Here`, and this worker's request brought it: the node keeps it for the worker
    /// until the worker latched it and called [`Node::used`].
    Brought,
    /// The request is out (the worker holds latches and may not wait): restart the operation.
    Asked,
}

/// A node's buffer and, in a cluster, its protocol; its workers' counters.
pub(crate) struct Node {
    pub buf: Buffer,
    /// The coherence protocol, when this node is a member of a cluster (`None`: a single node
    /// that holds every page exclusively and never sends a message).
    pub coh: Option<Coherence>,
    pub cfg: EngineConfig,
    workers: Mutex<Vec<Arc<WorkerStats>>>,
    /// Counters of workers that were dropped (folded in so `workers` does not grow forever).
    retired: WorkerStats,
    /// Pages freed on this cluster node, kept for its next allocations (see
    /// [`crate::ExclusiveGuard::free`]). Always empty on a single node.
    recycled: Mutex<Vec<Pid>>,
    /// The data directory's lock, held from open until [`crate::Engine::close`] (or the
    /// node's drop).
    lock: Mutex<Option<File>>,
}

impl Node {
    pub fn new(buf: Buffer, coh: Option<Coherence>, cfg: EngineConfig, lock: File) -> Node {
        Node {
            buf,
            coh,
            cfg,
            workers: Mutex::new(Vec::new()),
            retired: WorkerStats::default(),
            recycled: Mutex::new(Vec::new()),
            lock: Mutex::new(Some(lock)),
        }
    }

    /// Give up the data directory's lock (the engine is closed: another engine, in this
    /// process or another, may open the store now).
    pub fn release_lock(&self) {
        drop(self.lock.lock().take());
    }

    /// This node's id.
    pub fn id(&self) -> u8 {
        self.buf.node
    }

    pub fn is_cluster(&self) -> bool {
        self.coh.is_some()
    }

    /// `pid` is not resident, or not with possession `want`: bring it in. A single node reads
    /// it from the store. A cluster node asks the page's home and, if `may_wait`, waits for
    /// the answer.
    pub fn miss(&self, pid: Pid, want: Mode, may_wait: bool) -> Result<Missed, EngineError> {
        match &self.coh {
            None => {
                self.buf.fault(pid)?;
                Ok(Missed::Here)
            }
            Some(c) if !may_wait => {
                c.acquire(&self.buf, pid, want, false)?;
                Ok(Missed::Asked)
            }
            Some(c) => Ok(if c.acquire(&self.buf, pid, want, true)? {
                Missed::Brought
            } else {
                Missed::Here
            }),
        }
    }

    /// Run a round of this node's message handler if nobody is running one and messages
    /// wait (for threads waiting for this node's answer; see `Coherence::help`).
    pub fn help(&self) -> bool {
        self.coh.as_ref().is_some_and(|c| c.help(&self.buf))
    }

    /// The worker whose request brought `pid` ([`Missed::Brought`]) latched it.
    pub fn used(&self, pid: Pid) {
        if let Some(c) = &self.coh {
            c.used(pid);
        }
    }

    /// Read the pages among `pids` that are not here in one batch (single nodes; a cluster
    /// node's pages come through the protocol one by one, so it does nothing). Returns how
    /// many it read.
    pub fn load_many(&self, pids: &[Pid]) -> Result<usize, EngineError> {
        if self.is_cluster() || pids.is_empty() {
            return Ok(0);
        }
        self.buf.fault_many(pids)
    }

    /// Allocate a new page homed here: zeroed, dirty, held node-exclusive, its frame held by
    /// the caller.
    pub fn allocate_page(&self) -> Result<HeldFrame<'_>, EngineError> {
        if self.buf.is_shutdown() {
            return Err(EngineError::Shutdown);
        }
        let slot = self.buf.store.allocate()?;
        let pid = Pid::new(self.id(), slot);
        match self.buf.install_new_page(pid, Possession::Exclusive) {
            Ok(h) => {
                if let Some(c) = &self.coh {
                    c.adopt_new(pid, h.idx());
                }
                Ok(h)
            }
            Err(e) => {
                // Give the slot back; it was never used.
                if let Err(f) = self.buf.store.free(slot) {
                    log::warn!("node {}: giving back slot {slot}: {f}", self.id());
                }
                Err(e)
            }
        }
    }

    /// Allocate a new page homed on node `home` (a cluster's other node); the caller takes it
    /// with a guard like any remote page.
    pub fn allocate_on(&self, home: u8) -> Result<Pid, EngineError> {
        match &self.coh {
            Some(c) => c.allocate_on(&self.buf, home),
            None => Err(EngineError::Config(format!(
                "node {home}: this engine is a single node ({})",
                self.id()
            ))),
        }
    }

    /// The caller deleted the page `h` holds: on a single node its frame and slot are freed;
    /// a cluster node zeroes it and keeps it for its next allocation (see
    /// [`crate::ExclusiveGuard::free`]). The frame is released either way.
    pub fn free_page(&self, mut h: HeldFrame<'_>) -> Result<(), EngineError> {
        if self.is_cluster() {
            h.page_mut().fill(0, shoal_storage::PAGE_DATA_SIZE, 0);
            let pid = h.pid();
            drop(h); // a new version: optimistic readers of the page restart
            self.recycled.lock().push(pid);
            return Ok(());
        }
        self.buf.free_page(h)
    }

    /// Take back a page this node recycled, if any.
    pub fn take_recycled(&self) -> Option<Pid> {
        self.recycled.lock().pop()
    }

    /// The pages recycled here (cluster nodes).
    pub fn recycled(&self) -> Vec<Pid> {
        self.recycled.lock().clone()
    }

    /// Close, part: the recycled pages homed on this node go back to its store's free list
    /// (kept across a restart, where the recycled list is not). Only when no other node holds
    /// one of this node's pages (provider and handler stopped, workers gone): then nothing
    /// anywhere refers to them. Pages homed elsewhere stay allocated (their homes' stores
    /// cannot be changed from here).
    pub fn free_recycled_here(&self) {
        let mut freed = 0;
        self.recycled.lock().retain(|&pid| {
            if pid.node() != self.id() {
                return true;
            }
            match self.buf.discard_page(pid) {
                Ok(()) => {
                    freed += 1;
                    false
                }
                Err(e) => {
                    log::warn!("node {}: recycled page {pid}: {e}", self.id());
                    true
                }
            }
        });
        if freed > 0 {
            log::info!(
                "node {}: {freed} recycled pages returned to the free list",
                self.id()
            );
        }
    }

    // ------------------------------------------------------------------ the provider's side

    /// The provider picked frame `idx` (unlatched, resident) to evict: whether it may write
    /// it back and drop it. A cluster node first lets the page's directory release it (an
    /// eviction notice for a page homed elsewhere: the frame is freed when the home accepts).
    pub fn prepare_evict(&self, idx: FrameIdx) -> bool {
        match &self.coh {
            None => true,
            Some(c) => c.prepare_evict(&self.buf, idx),
        }
    }

    /// An eviction pass is over: its eviction notices leave (one batch per home).
    pub fn eviction_pass_done(&self) {
        if let Some(c) = &self.coh {
            c.flush_batches();
        }
    }

    /// The provider holds `h` and wants to drop its page: a single node always may; a cluster
    /// node only drops a plain home copy, not a frame that is (or is becoming) this node's copy.
    pub fn may_drop(&self, h: &HeldFrame<'_>) -> bool {
        match &self.coh {
            None => true,
            Some(c) => h.frame().possession() == Possession::None && c.droppable(h.pid(), h.idx()),
        }
    }

    /// One pool: the provider is about to drop `h`, a clean plain home copy: offer the page to
    /// a peer with room (the frame goes either way).
    pub fn offer_away(&self, h: &HeldFrame<'_>) {
        if let Some(c) = &self.coh {
            c.offer_away(h.pid(), h.bytes());
        }
    }

    /// One pool: tell the peers how many frames this node could take in for them.
    pub fn advertise_room(&self) {
        if let Some(c) = &self.coh {
            c.advertise_room(&self.buf);
        }
    }

    // ------------------------------------------------------------------ workers

    /// Register a worker's counters.
    pub fn register_worker(&self, stats: &Arc<WorkerStats>) {
        self.workers.lock().push(Arc::clone(stats));
    }

    /// A worker is going away: keep its counts, forget its block.
    pub fn retire_worker(&self, stats: &Arc<WorkerStats>) {
        let mut ws = self.workers.lock();
        if let Some(pos) = ws.iter().position(|w| Arc::ptr_eq(w, stats)) {
            ws.swap_remove(pos);
            // Relaxed: the counters are statistics; the mutex orders this against `stats()`.
            for (from, to) in [
                (&stats.hits, &self.retired.hits),
                (&stats.faults, &self.retired.faults),
                (&stats.restarts, &self.retired.restarts),
            ] {
                to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }

    /// The lowest `tx_first` of the workers' running transactions (see `WorkerStats`).
    pub fn oldest_transaction(&self) -> Option<u64> {
        // SeqCst: pairs with the worker's SeqCst store before its first undo chunk is placed
        // (a SeqCst compare-and-swap of the log's tail); the checkpoint's own placement came
        // before this, so a transaction whose undo precedes the checkpoint is seen here.
        self.workers
            .lock()
            .iter()
            .map(|w| w.tx_first.load(Ordering::SeqCst))
            .filter(|&t| t != 0)
            .min()
    }

    /// Every worker's counters (live and retired), summed: (hits, faults, restarts, live
    /// workers).
    pub fn worker_totals(&self) -> (u64, u64, u64, u64) {
        let workers = self.workers.lock();
        let (mut h, mut f, mut r) = (0, 0, 0);
        for w in workers
            .iter()
            .map(|w| &**w)
            .chain(std::iter::once(&self.retired))
        {
            h += w.hits.load(Ordering::Relaxed);
            f += w.faults.load(Ordering::Relaxed);
            r += w.restarts.load(Ordering::Relaxed);
        }
        (h, f, r, workers.len() as u64)
    }
}
