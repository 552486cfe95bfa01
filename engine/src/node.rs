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

use crate::buffer::table::{TranslationTable, MAX_SLOTS_PER_NODE};
use crate::buffer::{Buffer, FrameIdx, HeldFrame, Possession};
use crate::coherence::protocol::Mode;
use crate::coherence::Coherence;
use crate::durability::{Durability, NodeLog};
use crate::error::EngineError;
use crate::pid::Pid;
use crate::stats::{ProtocolStats, WorkerStats};
use parking_lot::Mutex;
use shoal_messaging::{ChannelLayout, Channels, Transport, WaitMode};
use shoal_storage::{BackendChoice, PageStore, StoreConfig};
use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

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

/// How a node joins a cluster: its transport (whose region has the `ChannelLayout` of the
/// cluster) and how long its workers wait for remote pages.
pub struct Membership {
    pub transport: Arc<dyn Transport>,
    pub mode: WaitMode,
    pub remote_timeout: Duration,
    /// The cluster's identity in this process ([`new_database_id`]): the same for every node
    /// of one cluster, kept when a node restarts. Handles of trees carry it, so that one of
    /// another cluster or engine is refused.
    pub database: u64,
}

/// A new identity for an engine or a cluster, unique in this process ([`Membership::database`],
/// `Worker::database`).
pub fn new_database_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// What a node is built from: the engine's configuration, translated ([`Node::open`]).
pub(crate) struct NodeSpec {
    pub id: u8,
    /// The store as a single node opens it (a cluster node changes what differs).
    pub store: StoreConfig,
    pub frames: usize,
    pub free_target_percent: u32,
    pub free_frame_timeout: Duration,
    pub durability: Durability,
    /// `EngineConfig::checkpoint_past_dead_peers`.
    pub checkpoint_past_dead_peers: bool,
    pub one_pool: bool,
}

/// A node's buffer and, in a cluster, its protocol; its workers' counters.
pub(crate) struct Node {
    /// The identity of its engine, or of its cluster ([`Membership::database`]).
    database: u64,
    buf: Buffer,
    /// The coherence protocol, when this node is a member of a cluster (`None`: a single node
    /// that holds every page exclusively and never sends a message).
    coh: Option<Coherence>,
    /// When changes become durable (`EngineConfig::durability`).
    durability: Durability,
    /// The write-ahead log (None: durability none, or a cluster node).
    log: Option<NodeLog>,
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
    /// Build the node `spec` describes: its store (recovered from its log if need be), its
    /// log, its buffer and, for a member of a cluster, its protocol; a fresh node-0 store gets
    /// its catalog page. `lock` is the data directory's lock, held until the node closes.
    pub fn open(
        mut spec: NodeSpec,
        member: Option<Membership>,
        lock: File,
    ) -> Result<Arc<Node>, EngineError> {
        let database = member.as_ref().map_or_else(new_database_id, |m| m.database);
        let coh = match member {
            None => None,
            Some(m) => {
                if m.transport.node() != spec.id {
                    return Err(EngineError::Config(format!(
                        "the transport is node {}'s, the configuration node {}'s",
                        m.transport.node(),
                        spec.id
                    )));
                }
                let layout = ChannelLayout::new(m.transport.nodes());
                let ch = Channels::new(m.transport, layout, m.mode)
                    .map_err(|e| EngineError::Config(format!("cluster messaging: {e}")))?;
                Some(Coherence::new(ch, m.remote_timeout, spec.one_pool))
            }
        };
        if let Some(c) = &coh {
            // Cluster nodes use pread/pwrite unless io_uring is asked for by name: with both
            // cores saturated, io_uring writes of a cluster node's provider were delayed by
            // 1.7-30 s (until a remote wait timed out), stalling the cluster; with pread and
            // pwrite the same runs had no slow write and no timeout (docs/cluster.md,
            // "Stalls under load"). Single nodes keep io_uring (their batches need depth).
            if spec.store.backend == BackendChoice::Auto {
                spec.store.backend = BackendChoice::Pread;
            }
            assert!(c.nodes() > spec.id, "a member's id is one of its cluster's");
        }
        let table = TranslationTable::new();
        let members: Vec<u8> = match &coh {
            Some(c) => (0..c.nodes()).collect(),
            None => vec![spec.id],
        };
        for n in members {
            table.reserve(n).map_err(|e| EngineError::Resources {
                what: format!(
                    "{} GiB of address space for node {n}'s translation table (is `ulimit -v` set?)",
                    (MAX_SLOTS_PER_NODE * 4) >> 30
                ),
                source: Arc::new(e),
            })?;
        }
        let mut store = PageStore::open(&spec.store)?;
        let log = match store.take_log() {
            Some(opened) => {
                let log = NodeLog::open(opened)?;
                store.set_slot_log(log.log().clone());
                Some(log)
            }
            None => None,
        };
        let buf = Buffer::new(
            spec.id,
            store,
            table,
            spec.frames,
            spec.free_target_percent,
            spec.free_frame_timeout,
        )?;
        if let (Some(c), Some(l)) = (&coh, &log) {
            let logs = spec
                .store
                .wal
                .iter()
                .map(|w| w.path.clone())
                .chain(
                    spec.store
                        .cluster
                        .iter()
                        .flat_map(|c| c.peers.iter().cloned()),
                )
                .collect();
            c.attach_log(
                l.log().clone(),
                spec.durability == crate::durability::Durability::Commit,
                spec.checkpoint_past_dead_peers,
                logs,
            );
        }
        let node = Arc::new(Node::new(buf, coh, spec.durability, log, lock, database));
        if node.id() == 0 && node.buf.store().high_water() == 0 {
            node.create_catalog()?;
        }
        if let Some(c) = &node.coh {
            // Threads that wait for this node's answers may run its handler round themselves
            // (on `mem`, other nodes' workers: `Transport::assist`).
            let weak = Arc::downgrade(&node);
            c.driver()
                .ch
                .transport()
                .region()
                .set_service(Box::new(move || weak.upgrade().is_some_and(|n| n.help())));
            // A peer that died and restarts is taken back (over tcp, and on mem in one
            // process; rdma refuses it): this node forgets its old incarnation first
            // (coherence/rejoin.rs).
            let weak = Arc::downgrade(&node);
            c.driver()
                .ch
                .transport()
                .take_rejoins(Arc::new(move |peer| match weak.upgrade() {
                    Some(n) => n.take_back(peer),
                    None => Err("this node is closing".into()),
                }));
        }
        Ok(node)
    }

    /// A fresh node-0 store: slot 0 is the catalog page, empty. Written (and synced) now, so
    /// that a store that crashes before its first write-back still opens (with
    /// allow_unclean) with a catalog, instead of a page that was never written.
    fn create_catalog(&self) -> Result<(), EngineError> {
        let store = self.buf.store();
        store.reserve(Pid::CATALOG.slot())?;
        let mut empty = shoal_storage::AlignedPage::new();
        let mut req = [shoal_storage::WriteRequest {
            slot: Pid::CATALOG.slot(),
            pid: Pid::CATALOG.raw(),
            page: &mut empty,
        }];
        if let Some(Err(e)) = store.write_batch(&mut req).pop() {
            return Err(e.into());
        }
        store.sync()?;
        let h = self
            .buf
            .install_new_page(Pid::CATALOG, Possession::Exclusive)?;
        if let Some(c) = &self.coh {
            c.adopt_new(Pid::CATALOG, h.idx());
        }
        Ok(())
    }

    fn new(
        buf: Buffer,
        coh: Option<Coherence>,
        durability: Durability,
        log: Option<NodeLog>,
        lock: File,
        database: u64,
    ) -> Node {
        assert_eq!(
            log.is_some(),
            durability.logged(),
            "a node has a log exactly when its durability needs one"
        );
        Node {
            buf,
            coh,
            durability,
            log,
            workers: Mutex::new(Vec::new()),
            retired: WorkerStats::default(),
            recycled: Mutex::new(Vec::new()),
            lock: Mutex::new(Some(lock)),
            database,
        }
    }

    /// The identity of this node's engine or cluster in this process ([`new_database_id`]).
    pub fn database(&self) -> u64 {
        self.database
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

    /// The protocol (None: a single node).
    pub fn coherence(&self) -> Option<&Coherence> {
        self.coh.as_ref()
    }

    /// The node's local buffer (frames, latches, the page store).
    #[inline]
    pub fn buffer(&self) -> &Buffer {
        &self.buf
    }

    /// When changes become durable.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The write-ahead log, if this node has one.
    pub fn log(&self) -> Option<&NodeLog> {
        self.log.as_ref()
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

    /// Whether this node must not latch its copy of `pid` now: a page homed elsewhere while
    /// this node's lease from its home has run out (docs/protocol.md, "Fencing"). Never on a
    /// single node or for this node's own pages.
    #[inline]
    pub fn lease_lapsed(&self, pid: Pid) -> bool {
        pid.node() != self.buf.node && self.coh.as_ref().is_some_and(|c| !c.lease_valid(pid))
    }

    /// Wait until [`lease_lapsed`](Self::lease_lapsed) is over, or fail (the home is dead, or
    /// renewed nothing within the remote timeout).
    #[cold]
    pub fn wait_lease(&self, pid: Pid) -> Result<(), EngineError> {
        match &self.coh {
            Some(c) => c.wait_lease(&self.buf, pid),
            None => Ok(()),
        }
    }

    /// Run a round of this node's message handler if nobody is running one and messages
    /// wait (for threads waiting for this node's answer; see `Coherence::help`).
    pub fn help(&self) -> bool {
        self.coh.as_ref().is_some_and(|c| c.help(&self.buf))
    }

    /// Restarted peer `peer` is about to be connected again: forget its old incarnation
    /// ([`Coherence::take_back`]); an error refuses it.
    fn take_back(&self, peer: u8) -> Result<(), String> {
        if self.buf.is_shutdown() {
            return Err("this node is closing".into());
        }
        match &self.coh {
            Some(c) => c.take_back(&self.buf, peer),
            None => Err("this node is not a cluster member".into()),
        }
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
        let me = self.id();
        let (slot, version) = if self.is_cluster() {
            self.buf
                .store()
                .allocate_versioned(|s| Pid::new(me, s).raw())?
        } else {
            (self.buf.store().allocate()?, 0)
        };
        let pid = Pid::new(me, slot);
        match self.buf.install_new_page(pid, Possession::Exclusive) {
            Ok(mut h) => {
                h.set_version(version);
                if let Some(c) = &self.coh {
                    c.adopt_new(pid, h.idx());
                }
                Ok(h)
            }
            Err(e) => {
                // Give the slot back; it was never used.
                if let Err(f) = self.buf.store().free(slot) {
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

    /// A single node's caller deleted the page `h` holds: its frame and slot are freed (a
    /// cluster node recycles the page instead: [`crate::ExclusiveGuard::free`]).
    pub fn free_page(&self, h: HeldFrame<'_>) -> Result<(), EngineError> {
        assert!(
            !self.is_cluster(),
            "a cluster node recycles, never frees, a page"
        );
        self.buf.free_page(h)
    }

    /// Frames holding a page of another home with changes of this node (or received dirty).
    pub fn foreign_dirty(&self) -> usize {
        let here = self.id();
        self.buf
            .frame_indexes()
            .filter(|&i| {
                let f = self.buf.frame(i);
                f.is_resident() && f.is_dirty() && f.pid().node() != here
            })
            .count()
    }

    /// Keep page `pid` (zeroed, released) for this node's next allocation (a cluster node's
    /// free: see [`crate::ExclusiveGuard::free`]).
    pub fn recycle(&self, pid: Pid) {
        self.recycled.lock().push(pid);
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

    // ------------------------------------------------------------------ the cluster's life

    /// Start the message handler thread (a cluster node; `None` for a single node).
    pub fn start_handler(self: &Arc<Self>) -> Result<Option<JoinHandle<()>>, EngineError> {
        if self.coh.is_none() {
            return Ok(None);
        }
        let n = Arc::clone(self);
        std::thread::Builder::new()
            .name(format!("shoal-handler-{}", self.id()))
            .spawn(move || {
                if let Some(c) = &n.coh {
                    c.run_handler(&n.buf)
                }
            })
            .map(Some)
            .map_err(|e| EngineError::Resources {
                what: "the message handler thread".into(),
                source: Arc::new(e),
            })
    }

    /// Close, part: stop the handler thread `handler` and wait until no helper is inside a
    /// round any more (none starts one after this). Nothing changes the directory afterwards.
    pub fn stop_handler(&self, handler: Option<JoinHandle<()>>) {
        let Some(c) = &self.coh else { return };
        c.driver().stop.store(true, Ordering::Release);
        c.driver().ch.wake();
        if let Some(h) = handler {
            if h.join().is_err() {
                log::error!("the message handler thread panicked");
            }
        }
        c.quiesce();
    }

    /// Send copies of pages homed elsewhere back home (shutdown); how many frames still hold
    /// such pages (0 for a single node).
    pub fn release_remote(&self) -> usize {
        self.coh.as_ref().map_or(0, |c| c.release_remote(&self.buf))
    }

    /// The cluster barrier (a single node passes at once).
    pub fn barrier(&self, limit: Duration) -> Result<(), EngineError> {
        match &self.coh {
            Some(c) => c.barrier(&self.buf, limit),
            None => Ok(()),
        }
    }

    /// This node is about to leave the cluster (its transport stops reporting peers' deaths).
    pub fn departing(&self) {
        if let Some(c) = &self.coh {
            c.driver().ch.transport().departing();
        }
    }

    /// Leave the cluster: peers see this node leave once they left too, or after `linger`.
    pub fn leave_cluster(&self, linger: Duration) {
        if let Some(c) = &self.coh {
            // what still waits for room goes first (sends never wait: messaging's channel.rs)
            if !c.driver().ch.flush_all(linger) {
                log::warn!(
                    "node {}: {} message(s) to peers still waited for room when it left",
                    self.id(),
                    c.driver().ch.backlogged()
                );
            }
            c.driver().ch.transport().leave(linger);
        }
    }

    /// Close every connection at once, sending nothing more (a crash, `Engine::crash`):
    /// peers see this node die.
    pub fn cut_off(&self) {
        if let Some(c) = &self.coh {
            c.driver().ch.transport().leave(Duration::ZERO);
        }
    }

    /// Pages homed here that other nodes hold (0 for a single node): while there are any,
    /// this node's store is not current.
    pub fn homed_pages_away(&self) -> usize {
        self.coh.as_ref().map_or(0, |c| c.homed_pages_away())
    }

    /// Counters of the coherence protocol (all zero for a single node).
    /// This node's eviction notices declined by their homes so far (0 for a single node).
    pub fn evictions_declined(&self) -> u64 {
        self.coh.as_ref().map_or(0, |c| {
            c.driver()
                .counters
                .evictions_declined
                .load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    pub fn protocol_stats(&self) -> ProtocolStats {
        self.coh
            .as_ref()
            .map_or_else(ProtocolStats::default, |c| c.driver().counters.snapshot())
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

    /// One pool: the provider evicts copies of other homes' pages first.
    pub fn one_pool(&self) -> bool {
        self.coh.as_ref().is_some_and(|c| c.one_pool())
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
