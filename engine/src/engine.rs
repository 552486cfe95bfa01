//! [`Engine`]: one node's buffer manager. Owns the frame pool, translation table, page store,
//! free-frame queue, global epoch and page provider; hands out [`Worker`]s.
//!
//! The fault path (a page that is not resident) lives here; the hit paths are in
//! [`crate::guard`].

use crate::coherence::Coherence;
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::frame::{FramePool, FREE, LOADING, RESIDENT};
use crate::free_frames::FreeFrames;
use crate::guard::Worker;
use crate::latch::Backoff;
use crate::page::PageMut;
use crate::pid::Pid;
use crate::provider;
use crate::stats::{EngineCounters, StatsSnapshot, WorkerStats};
use crate::table::TranslationTable;
use parking_lot::{Condvar, Mutex};
use shoal_messaging::{ChannelLayout, Channels, Transport, WaitMode};
use shoal_storage::{BackendChoice, PageStore, ReadRequest, StoreConfig, PAGE_DATA_SIZE};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// State shared by the engine, its workers and its provider.
pub(crate) struct Inner {
    pub cfg: EngineConfig,
    pub node: u8,
    pub pool: FramePool,
    pub table: TranslationTable,
    pub store: PageStore,
    pub free: FreeFrames,
    /// Global access epoch (advanced by the provider).
    pub epoch: AtomicU32,
    /// The provider keeps at least this many frames free.
    pub free_target: usize,
    pub shutdown: AtomicBool,
    pub provider_wake: Condvar,
    pub provider_mx: Mutex<()>,
    pub frames_freed: Condvar,
    pub frames_mx: Mutex<()>,
    /// Last error the provider hit (reported by faults that starve).
    pub provider_error: Mutex<Option<String>>,
    pub counters: EngineCounters,
    pub workers: Mutex<Vec<Arc<WorkerStats>>>,
    /// Counters of workers that were dropped (folded in so `workers` does not grow forever).
    pub retired: WorkerStats,
    /// The coherence protocol, when this engine is a node of a cluster (`None`: a single node
    /// that holds every page exclusively and never sends a message).
    pub coh: Option<Coherence>,
    /// Pages freed on this cluster node, kept for its next allocations (see
    /// [`crate::ExclusiveGuard::free`]). Always empty on a single node.
    pub recycled: Mutex<Vec<Pid>>,
    _lock: File,
}

/// How long a leaving node waits for its peers to leave too before closing its connections.
pub const LEAVE_LINGER: Duration = Duration::from_secs(5);

/// One node's buffer manager.
pub struct Engine {
    inner: Arc<Inner>,
    provider: Mutex<Option<JoinHandle<()>>>,
    handler: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
}

/// Counters of the coherence protocol at one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProtocolStats {
    /// Possession requests sent by this node's workers (remote misses).
    pub requests: u64,
    /// Messages sent to other nodes.
    pub messages: u64,
    /// Pages sent to other nodes.
    pub pages: u64,
    /// Eviction notices sent.
    pub evict_notices: u64,
    /// Batches sent (one message carrying several eviction notices or replies).
    pub batches: u64,
    /// Messages the handler had to hold and retry (latched page, no free frame, reserved).
    pub held: u64,
}

/// How a node joins a cluster: its transport (whose region has the [`ChannelLayout`] of the
/// cluster) and how long its workers wait for remote pages.
pub struct Membership {
    pub transport: Arc<dyn Transport>,
    pub mode: WaitMode,
    pub remote_timeout: Duration,
}

impl Engine {
    /// The shared state (in-crate tests drive the provider's and handler's pieces directly).
    #[cfg(test)]
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Open (or create, per `cfg.mode`) the node's store and start its page provider.
    pub fn open(cfg: EngineConfig) -> Result<Engine, EngineError> {
        Engine::open_with(cfg, None)
    }

    /// Open node `cfg.node_id` of a cluster (see [`crate::cluster`] for building one).
    pub fn open_member(cfg: EngineConfig, m: Membership) -> Result<Engine, EngineError> {
        Engine::open_with(cfg, Some(m))
    }

    fn open_with(cfg: EngineConfig, member: Option<Membership>) -> Result<Engine, EngineError> {
        cfg.validate()?;
        let coh = match member {
            None => None,
            Some(m) => {
                if m.transport.node() != cfg.node_id {
                    return Err(EngineError::Config(format!(
                        "the transport is node {}'s, the configuration node {}'s",
                        m.transport.node(),
                        cfg.node_id
                    )));
                }
                let layout = ChannelLayout::new(m.transport.nodes());
                let ch = Channels::new(m.transport, layout, m.mode)
                    .map_err(|e| EngineError::Config(format!("cluster messaging: {e}")))?;
                Some(Coherence::new(ch, m.remote_timeout))
            }
        };
        let lock = prepare_data_dir(&cfg)?;
        let table = TranslationTable::new();
        let members: Vec<u8> = match &coh {
            Some(c) => (0..c.nodes()).collect(),
            None => vec![cfg.node_id],
        };
        for n in members {
            table.reserve(n).map_err(|e| {
                EngineError::Config(format!(
                    "cannot reserve {} GiB of address space for node {n}'s translation table \
                     (is `ulimit -v` set?): {e}",
                    (crate::table::MAX_SLOTS_PER_NODE * 4) >> 30
                ))
            })?;
        }
        // The translation table addresses at most MAX_SLOTS_PER_NODE slots per node.
        let max = crate::table::MAX_SLOTS_PER_NODE;
        let store = PageStore::open(&StoreConfig {
            devices: cfg.device_list(),
            mode: cfg.mode,
            backend: match (cfg.backend, &coh) {
                // Cluster nodes use pread/pwrite unless io_uring is asked for by name: with both
                // cores saturated, io_uring writes of a cluster node's provider were delayed by
                // 1.7-30 s (until a remote wait timed out), stalling the cluster; with pread and
                // pwrite the same runs had no slow write and no timeout (docs/cluster.md,
                // "Stalls under load"). Single nodes keep io_uring (their batches need depth).
                (BackendChoice::Auto, Some(_)) => BackendChoice::Pread,
                (b, _) => b,
            },
            node_id: cfg.node_id as u32,
            cluster_id: cfg.cluster_id,
            capacity_pages: if cfg.capacity_pages == 0 {
                max
            } else {
                cfg.capacity_pages.min(max)
            },
            allow_unclean: cfg.allow_unclean,
        })?;
        let frames = cfg.frames();
        let pool = FramePool::new(frames).map_err(|e| {
            EngineError::Config(format!("cannot map {frames} frames of page memory: {e}"))
        })?;
        let free = FreeFrames::all(frames);
        let free_target = (frames * cfg.free_target_percent as usize / 100).max(16);
        let inner = Arc::new(Inner {
            node: cfg.node_id,
            table,
            pool,
            store,
            free,
            epoch: AtomicU32::new(1),
            free_target,
            shutdown: AtomicBool::new(false),
            provider_wake: Condvar::new(),
            provider_mx: Mutex::new(()),
            frames_freed: Condvar::new(),
            frames_mx: Mutex::new(()),
            provider_error: Mutex::new(None),
            counters: EngineCounters::default(),
            workers: Mutex::new(Vec::new()),
            retired: WorkerStats::default(),
            recycled: Mutex::new(Vec::new()),
            coh,
            _lock: lock,
            cfg,
        });
        if inner.node == 0 && inner.store.high_water() == 0 {
            // A fresh node-0 store: slot 0 is the catalog page, empty. Written (and synced)
            // now, so that a store that crashes before its first write-back still opens
            // (with allow_unclean) with a catalog, instead of a page that was never written.
            inner.store.reserve(Pid::CATALOG.slot())?;
            let mut empty = shoal_storage::AlignedPage::new();
            let mut req = [shoal_storage::WriteRequest {
                slot: Pid::CATALOG.slot(),
                pid: Pid::CATALOG.raw(),
                page: &mut empty,
            }];
            if let Some(Err(e)) = inner.store.write_batch(&mut req).pop() {
                return Err(e.into());
            }
            inner.store.sync()?;
            let idx = inner.install_new_page(Pid::CATALOG)?;
            if let Some(c) = &inner.coh {
                c.adopt_new(Pid::CATALOG, idx);
            }
            inner.pool.frame(idx).latch.unlock_exclusive();
        }
        let p = Arc::clone(&inner);
        let handle = std::thread::Builder::new()
            .name(format!("shoal-provider-{}", inner.node))
            .spawn(move || provider::run(p))
            .map_err(|e| EngineError::Config(format!("cannot start the page provider: {e}")))?;
        let handler = match &inner.coh {
            None => None,
            Some(_) => {
                let h = Arc::clone(&inner);
                Some(
                    std::thread::Builder::new()
                        .name(format!("shoal-handler-{}", inner.node))
                        .spawn(move || crate::coherence::run_handler(h))
                        .map_err(|e| {
                            EngineError::Config(format!("cannot start the message handler: {e}"))
                        })?,
                )
            }
        };
        log::info!(
            "node {} engine: {} frames ({}), free target {}, store {}",
            inner.node,
            frames,
            crate::config::format_bytes(inner.cfg.cache_bytes as u64),
            free_target,
            inner.store.backend()
        );
        Ok(Engine {
            inner,
            provider: Mutex::new(Some(handle)),
            handler: Mutex::new(handler),
            closed: AtomicBool::new(false),
        })
    }

    /// Register a worker: the handle a thread uses to take guards.
    pub fn worker(&self) -> Worker {
        let stats = Arc::new(WorkerStats::default());
        self.inner.workers.lock().push(Arc::clone(&stats));
        Worker::new(Arc::clone(&self.inner), stats)
    }

    /// This node's id.
    pub fn node_id(&self) -> u8 {
        self.inner.node
    }

    /// Send every page homed elsewhere back home (shutdown). Returns how many frames still
    /// hold such pages (0 for a single node). Call until it returns 0.
    pub fn release_remote(&self) -> usize {
        match &self.inner.coh {
            Some(c) => c.release_remote(&self.inner),
            None => 0,
        }
    }

    /// Call [`release_remote`](Self::release_remote) until no page homed elsewhere is left
    /// here; fails after `limit`. The other nodes' handlers must be running.
    pub fn send_pages_home(&self, limit: Duration) -> Result<(), EngineError> {
        let t0 = Instant::now();
        loop {
            let left = self.release_remote();
            if left == 0 {
                return Ok(());
            }
            if t0.elapsed() > limit {
                return Err(EngineError::Remote(format!(
                    "node {}: {left} pages of other homes did not go home within {} s",
                    self.inner.node,
                    limit.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Cluster barrier: returns once every node of the cluster called `barrier` as often as this
    /// node has (the n-th calls meet). Fails when a node died or `limit` passed. One thread per
    /// node at a time (further callers queue). A single node returns at once.
    pub fn barrier(&self, limit: Duration) -> Result<(), EngineError> {
        match &self.inner.coh {
            Some(c) => c.barrier(limit),
            None => Ok(()),
        }
    }

    /// Clean shutdown of one node of a multi-process cluster, called by every node once its
    /// workers stopped: send every page homed elsewhere home, wait at a barrier until no node
    /// holds a foreign page, then [`close`](Self::close). `limit` bounds each wait.
    pub fn leave(&self, limit: Duration) -> Result<(), EngineError> {
        self.send_pages_home(limit)?;
        self.barrier(limit)?;
        if let Some(c) = &self.inner.coh {
            c.ch.transport().departing();
        }
        self.close()?;
        if let Some(c) = &self.inner.coh {
            // peers see this node leave once they left too (tcp closes its connections)
            c.ch.transport().leave(LEAVE_LINGER);
        }
        Ok(())
    }

    /// Counters of the coherence protocol (all zero for a single node).
    pub fn protocol_stats(&self) -> ProtocolStats {
        let Some(c) = &self.inner.coh else {
            return ProtocolStats::default();
        };
        let k = &c.counters;
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        ProtocolStats {
            requests: l(&k.requests),
            messages: l(&k.messages),
            pages: l(&k.pages),
            evict_notices: l(&k.evict_notices),
            batches: l(&k.batches),
            held: l(&k.held),
        }
    }

    /// Number of frames in the cache.
    pub fn frames(&self) -> usize {
        self.inner.pool.len()
    }

    /// The node's page store (read-only use: counters, device paths).
    pub fn store(&self) -> &PageStore {
        &self.inner.store
    }

    /// Whether `pid` is in this node's cache right now (a racy snapshot, for tests and tools).
    pub fn is_resident(&self, pid: Pid) -> bool {
        if pid.node() as usize >= crate::pid::MAX_NODES
            || pid.slot() >= crate::table::MAX_SLOTS_PER_NODE
        {
            return false;
        }
        let part = self.inner.table.lock(pid);
        self.inner.table.lookup_locked(&part, pid).is_some()
    }

    /// Sum of all counters.
    pub fn stats(&self) -> StatsSnapshot {
        let i = &self.inner;
        let mut s = StatsSnapshot::default();
        let workers = i.workers.lock();
        s.live_workers = workers.len() as u64;
        for w in workers
            .iter()
            .map(|w| &**w)
            .chain(std::iter::once(&i.retired))
        {
            s.hits += w.hits.load(Ordering::Relaxed);
            s.faults += w.faults.load(Ordering::Relaxed);
            s.restarts += w.restarts.load(Ordering::Relaxed);
        }
        drop(workers);
        s.evictions = i.counters.evictions.load(Ordering::Relaxed);
        s.writebacks = i.counters.writebacks.load(Ordering::Relaxed);
        s.write_errors = i.counters.write_errors.load(Ordering::Relaxed);
        s.store_reads = i.store.stats().reads.load(Ordering::Relaxed);
        s.store_writes = i.store.stats().writes.load(Ordering::Relaxed);
        s.frames = i.pool.len() as u64;
        s.free_frames = i.free.len() as u64;
        s.epoch = i.epoch.load(Ordering::Relaxed) as u64;
        s
    }

    /// Clean shutdown: stop the provider, write every dirty page, persist the allocator and mark
    /// the store clean. Workers must have dropped their guards; operations started afterwards
    /// fail with [`EngineError::Shutdown`]. Calling it twice is harmless.
    pub fn close(&self) -> Result<(), EngineError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.inner.shutdown.store(true, Ordering::Release);
        {
            let _g = self.inner.provider_mx.lock();
            self.inner.provider_wake.notify_all();
        }
        if let Some(h) = self.provider.lock().take() {
            if h.join().is_err() {
                log::error!("the page provider thread panicked");
            }
        }
        if let Some(c) = &self.inner.coh {
            c.stop.store(true, Ordering::Release);
            c.ch.wake();
            if let Some(h) = self.handler.lock().take() {
                if h.join().is_err() {
                    log::error!("the message handler thread panicked");
                }
            }
        }
        // With the handler stopped, nothing changes the directory any more: if another node
        // may still hold a newer image of a page homed here (no orderly shutdown: see
        // `Cluster::close` and `leave`), this store is not current and must not say "clean".
        let away = self.inner.coh.as_ref().map_or(0, |c| c.homed_pages_away());
        if away == 0 {
            self.free_recycled_here();
        }
        // With the provider stopped, this thread is the only writer of pages to the store.
        let written = provider::flush_all(&self.inner)?;
        self.inner.store.sync()?;
        if away > 0 {
            log::error!(
                "node {}: closing while {away} of its pages are held by other nodes (the cluster \
                 did not shut down in order: use Cluster::close or Engine::leave); {written} dirty \
                 pages written, but the store stays marked unclean: changes made elsewhere are lost",
                self.inner.node
            );
            return Err(EngineError::Remote(format!(
                "node {}: {away} of its pages were still held by other nodes at close; the store \
                 is marked unclean",
                self.inner.node
            )));
        }
        self.inner.store.close()?;
        log::info!(
            "node {} closed cleanly ({written} dirty pages written)",
            self.inner.node
        );
        Ok(())
    }
}

impl Engine {
    /// Close, part: the recycled pages homed on this node go back to its store's free list
    /// (kept across a restart, where the recycled list is not). Only when no other node holds
    /// one of this node's pages (provider and handler stopped, workers gone): then nothing
    /// anywhere refers to them. Pages homed elsewhere stay allocated (their homes' stores
    /// cannot be changed from here).
    fn free_recycled_here(&self) {
        let inner = &self.inner;
        let mut freed = 0;
        inner.recycled.lock().retain(|&pid| {
            if pid.node() != inner.node {
                return true;
            }
            match inner.discard_page(pid) {
                Ok(()) => {
                    freed += 1;
                    false
                }
                Err(e) => {
                    log::warn!("node {}: recycled page {pid}: {e}", inner.node);
                    true
                }
            }
        });
        if freed > 0 {
            log::info!(
                "node {}: {freed} recycled pages returned to the free list",
                inner.node
            );
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            log::error!("closing node {} failed: {e}", self.inner.node);
        }
    }
}

fn prepare_data_dir(cfg: &EngineConfig) -> Result<File, EngineError> {
    let dir = &cfg.data_dir;
    let err = |why: String| EngineError::DataDir {
        path: dir.clone(),
        why,
    };
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => return Err(err("exists but is not a directory".into())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if cfg.mode == shoal_storage::OpenMode::Open {
                return Err(err(
                    "does not exist (open mode needs an existing store)".into()
                ));
            }
            std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create it: {e}")))?;
        }
        Err(e) => return Err(err(e.to_string())),
    }
    let path = lock_path(dir, cfg.node_id);
    let f = File::create(&path).map_err(|e| err(format!("cannot create lock file: {e}")))?;
    if !try_flock(&f, libc::LOCK_EX) {
        return Err(err(format!(
            "node {} store is in use by another process (lock {})",
            cfg.node_id,
            path.display()
        )));
    }
    Ok(f)
}

/// The lock file of node `node`'s store in `dir`: an engine holds it exclusively while open.
fn lock_path(dir: &std::path::Path, node: u8) -> std::path::PathBuf {
    dir.join(format!("node{node}.lock"))
}

/// `flock(f, how | LOCK_NB)`: whether the lock was taken.
fn try_flock(f: &File, how: libc::c_int) -> bool {
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    unsafe { libc::flock(f.as_raw_fd(), how | libc::LOCK_NB) == 0 }
}

/// Lock node `node`'s store in `dir` for reading without an engine (`shoal inspect`): a shared
/// lock, so no engine can open the store while it is held, and an error if an engine has it
/// open now. Creates nothing: `Ok(None)` if no engine ever opened the store in `dir`.
pub fn lock_for_reading(dir: &std::path::Path, node: u8) -> Result<Option<File>, EngineError> {
    let path = lock_path(dir, node);
    let f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(EngineError::DataDir {
                path: dir.to_path_buf(),
                why: format!("cannot open lock file {}: {e}", path.display()),
            })
        }
    };
    if !try_flock(&f, libc::LOCK_SH) {
        return Err(EngineError::DataDir {
            path: dir.to_path_buf(),
            why: format!(
                "node {node} store is in use by a running engine (lock {}); stop it first",
                path.display()
            ),
        });
    }
    Ok(Some(f))
}

impl Inner {
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

    /// Read-mostly: the global epoch for access tracking.
    #[inline]
    pub fn current_epoch(&self) -> u32 {
        self.epoch.load(Ordering::Relaxed)
    }

    pub fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Take a frame for `pid` that is free right now, if any: its home frame if that is free
    /// (see [`FramePool::home`]), else any. Wakes the provider when free frames run low (or out).
    pub(crate) fn try_take_free_frame(&self, pid: Pid) -> Option<u32> {
        let home = self.pool.home(pid);
        let i = if self.free.take(home) {
            Some(home)
        } else {
            self.free.take_any()
        };
        if i.is_none() || self.free.len() < self.free_target {
            self.provider_wake.notify_one();
        }
        i
    }

    /// Take a free frame for `pid`, waking the provider and waiting for it if none is free.
    pub fn take_free_frame(&self, pid: Pid) -> Result<u32, EngineError> {
        let mut started: Option<Instant> = None;
        loop {
            if let Some(i) = self.try_take_free_frame(pid) {
                return Ok(i);
            }
            if self.is_shutdown() {
                return Err(EngineError::Shutdown);
            }
            let t0 = *started.get_or_insert_with(Instant::now);
            if t0.elapsed() > self.cfg.free_frame_timeout {
                let why = self.provider_error.lock().clone().unwrap_or_else(|| {
                    format!(
                        "all {} frames are in use and none could be evicted (too many pages fixed by guards?)",
                        self.pool.len()
                    )
                });
                return Err(EngineError::NoFreeFrame {
                    waited_ms: t0.elapsed().as_millis() as u64,
                    why,
                });
            }
            let mut g = self.frames_mx.lock();
            if self.free.is_empty() {
                self.frames_freed.wait_for(&mut g, Duration::from_millis(1));
            }
        }
    }

    /// Forget page `pid` held in frame `idx` (whose exclusive latch the caller holds): unlink it
    /// from the table, mark the frame free, release the latch with a version bump (optimistic
    /// readers of the old page fail validation) and queue the frame as free. Whatever the page
    /// held is dropped: the caller wrote it back, or it is being deleted or failed to load.
    pub fn drop_frame(&self, pid: Pid, idx: u32) {
        let f = self.pool.frame(idx);
        debug_assert!(f.latch.is_exclusive() && f.pid() == pid);
        let part = self.table.lock(pid);
        self.table.remove(&part, idx);
        drop(part);
        f.set_pid(Pid::NONE);
        f.set_state(FREE);
        f.set_dirty(false);
        f.latch.unlock_exclusive();
        self.release_frame(idx);
    }

    /// Give a frame (unlatched, FREE, unlinked) back to the free frames.
    pub fn release_frame(&self, idx: u32) {
        self.free.put(idx);
    }

    /// Load `pid` into a frame (or find that another thread did). Returns the frame index; the
    /// caller re-checks the frame under its latch, since it may be evicted again at once.
    pub fn fault(&self, pid: Pid) -> Result<u32, EngineError> {
        self.check_faultable(pid)?;
        let idx = self.take_free_frame(pid)?;
        if let Some(found) = self.claim_for_load(pid, idx) {
            return Ok(found);
        }
        // SAFETY: the frame's page memory is valid and aligned; we hold its exclusive latch, so no
        // Rust code writes it until we release. Stale optimistic readers may load from it while
        // the kernel fills it; their validation fails because we bump the version on release.
        let r = unsafe {
            self.store
                .read_into(pid.slot(), pid.raw(), self.pool.page_ptr(idx))
        };
        self.finish_load(pid, idx, r)?;
        Ok(idx)
    }

    /// Load the pages among `pids` that are not resident with one batch of reads, all in flight
    /// together. Pages resident or being loaded already are skipped; when no frame is free, the
    /// remaining pages are left alone (they fault one by one when latched). Returns how many
    /// pages it read; the first failed read is the error (every page is handled either way).
    pub fn fault_many(&self, pids: &[Pid]) -> Result<usize, EngineError> {
        for &pid in pids {
            self.check_faultable(pid)?;
        }
        let mut claimed = Vec::with_capacity(pids.len());
        for &pid in pids {
            let Some(idx) = self.try_take_free_frame(pid) else {
                break;
            };
            if self.claim_for_load(pid, idx).is_none() {
                claimed.push((pid, idx));
            }
        }
        let reqs: Vec<ReadRequest> = claimed
            .iter()
            .map(|&(pid, idx)| ReadRequest {
                slot: pid.slot(),
                pid: pid.raw(),
                dst: self.pool.page_ptr(idx),
            })
            .collect();
        // SAFETY: as in `fault`, for each request: we hold its frame's exclusive latch, and the
        // frames (so the destinations) are distinct.
        let results = unsafe { self.store.read_batch(&reqs) };
        let mut out = Ok(claimed.len());
        for (&(pid, idx), r) in claimed.iter().zip(results) {
            if let Err(e) = self.finish_load(pid, idx, r) {
                if out.is_ok() {
                    out = Err(e);
                }
            }
        }
        out
    }

    /// Whether this node may fault `pid` from its store.
    fn check_faultable(&self, pid: Pid) -> Result<(), EngineError> {
        debug_assert!(
            self.coh.is_none(),
            "cluster nodes fault through the protocol"
        );
        if pid.node() != self.node {
            return Err(EngineError::RemotePage(pid, pid.node(), self.node));
        }
        if pid.slot() >= self.store.high_water() {
            return Err(EngineError::NoSuchPage(pid));
        }
        Ok(())
    }

    /// Start loading `pid` into the free frame `idx`: latch it exclusively, mark it LOADING and
    /// enter it in the table. If `pid` is in the table already, give `idx` back and return
    /// that frame instead.
    fn claim_for_load(&self, pid: Pid, idx: u32) -> Option<u32> {
        let part = self.table.lock(pid);
        if let Some(found) = self.table.lookup_locked(&part, pid) {
            drop(part);
            self.release_frame(idx);
            return Some(found);
        }
        let f = self.pool.frame(idx);
        lock_free_frame(f);
        f.set_pid(pid);
        f.set_state(LOADING);
        f.set_dirty(false);
        self.table.insert(&self.pool, &part, idx);
        None
    }

    /// The read of a claimed frame finished with `r`: make the page resident, or drop the
    /// frame and report the error.
    fn finish_load(
        &self,
        pid: Pid,
        idx: u32,
        r: shoal_storage::StoreResult<()>,
    ) -> Result<(), EngineError> {
        let f = self.pool.frame(idx);
        match r {
            Ok(()) => {
                f.set_state(RESIDENT);
                f.set_possession(crate::frame::POSS_EXCLUSIVE);
                f.touch(self.current_epoch());
                f.latch.unlock_exclusive();
                Ok(())
            }
            Err(e) => {
                self.drop_frame(pid, idx);
                Err(EngineError::PageRead {
                    pid,
                    source: Arc::new(e),
                })
            }
        }
    }

    /// Put a brand-new, zeroed page `pid` into a frame. Returns the frame, exclusively latched.
    pub fn install_new_page(&self, pid: Pid) -> Result<u32, EngineError> {
        let fresh = self.take_free_frame(pid)?;
        let part = self.table.lock(pid);
        // A freed slot's old page can still be resident, if some thread faulted it in through
        // a stale pointer after the free. That copy must not survive next to the new page (a
        // later write-back of it would overwrite the new page's slot): take over its frame.
        let idx = match self.table.lookup_locked(&part, pid) {
            Some(stale) => {
                self.release_frame(fresh);
                let mut b = Backoff::new();
                while !self.pool.frame(stale).latch.try_lock_exclusive(None) {
                    b.snooze();
                }
                stale
            }
            None => {
                lock_free_frame(self.pool.frame(fresh));
                fresh
            }
        };
        let f = self.pool.frame(idx);
        f.set_pid(pid);
        f.set_state(RESIDENT);
        f.set_dirty(true);
        f.set_possession(crate::frame::POSS_EXCLUSIVE);
        // SAFETY: we hold the frame's exclusive latch: we are its only writer.
        let mut page = unsafe { PageMut::from_ptr(self.pool.page_ptr(idx)) };
        page.fill(0, PAGE_DATA_SIZE, 0);
        self.table.insert(&self.pool, &part, idx);
        drop(part);
        f.touch(self.current_epoch());
        Ok(idx)
    }

    /// Allocate a new page homed here. Returns its frame, exclusively latched.
    pub fn allocate_page(&self) -> Result<(Pid, u32), EngineError> {
        if self.is_shutdown() {
            return Err(EngineError::Shutdown);
        }
        let slot = self.store.allocate()?;
        let pid = Pid::new(self.node, slot);
        match self.install_new_page(pid) {
            Ok(idx) => {
                if let Some(c) = &self.coh {
                    c.adopt_new(pid, idx);
                }
                Ok((pid, idx))
            }
            Err(e) => {
                // Give the slot back; it was never used.
                let _ = self.store.free(slot);
                Err(e)
            }
        }
    }

    /// Drop page `pid`'s frame if it is resident here (waiting for a latch holder to leave:
    /// the provider writing it back, a stale reader) and return its slot to the allocator. For
    /// a page homed here that nothing can reach any more.
    pub fn discard_page(&self, pid: Pid) -> Result<(), EngineError> {
        let mut b = Backoff::new();
        while let Some(idx) = self.table.lookup(&self.pool, pid) {
            let f = self.pool.frame(idx);
            if !f.latch.try_lock_exclusive(None) {
                b.snooze();
                continue;
            }
            if f.pid() == pid && f.state() == RESIDENT {
                self.drop_frame(pid, idx);
                break;
            }
            f.latch.unlock_exclusive_unchanged();
        }
        // As in `free_page`: the provider issues writes one batch at a time, so a write-back of
        // this page completes before a write of the slot's next page is issued.
        self.store.free(pid.slot())?;
        Ok(())
    }

    /// Drop page `pid` held exclusively in frame `idx` and return its slot to the allocator.
    /// Single node only (cluster nodes recycle: [`crate::ExclusiveGuard::free`]).
    pub fn free_page(&self, pid: Pid, idx: u32) -> Result<(), EngineError> {
        debug_assert!(self.coh.is_none());
        self.drop_frame(pid, idx);
        // The provider is the only writer of pages and issues its writes one batch at a time, so
        // any write of the old page completes before a write of the slot's next owner is issued.
        self.store.free(pid.slot())?;
        Ok(())
    }
}

/// Latch a frame taken from the free frames. It is normally unlatched; a thread that reached it
/// through a stale table hint may hold it shared for an instant before noticing the pid changed.
fn lock_free_frame(f: &crate::frame::Frame) {
    let mut b = Backoff::new();
    while !f.latch.try_lock_exclusive(None) {
        b.snooze();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MIN_CACHE_FRAMES;

    fn frame_of(e: &Engine, pid: Pid) -> Option<u32> {
        e.inner.table.lookup(&e.inner.pool, pid)
    }

    /// The home-frame layout (`FramePool::home`): when the pool holds every page, each page
    /// sits in its home frame, whatever order pages are created or read back in; when it does
    /// not, pages go wherever a frame is free and stay readable.
    #[test]
    fn pages_sit_in_their_home_frames_when_the_pool_holds_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let pids: Vec<Pid> = {
            let e = Engine::open(EngineConfig::new(dir.path(), 8 << 20)).unwrap();
            let w = e.worker();
            let pids: Vec<Pid> = (0..1000u64)
                .map(|i| {
                    let mut g = w.allocate().unwrap();
                    g.page_mut().set_u64(0, i);
                    g.pid()
                })
                .collect();
            for &pid in &pids {
                assert_eq!(frame_of(&e, pid), Some(e.inner.pool.home(pid)), "{pid:?}");
            }
            drop(w);
            e.close().unwrap();
            pids
        };
        // Read back in reverse: faults take each page's home frame again.
        let e = Engine::open(EngineConfig::new(dir.path(), 8 << 20)).unwrap();
        let w = e.worker();
        for (i, &pid) in pids.iter().enumerate().rev() {
            let v = w.run(|w| w.shared(pid).map(|g| g.page().u64(0))).unwrap();
            assert_eq!(v, i as u64);
            assert_eq!(frame_of(&e, pid), Some(e.inner.pool.home(pid)), "{pid:?}");
        }
        drop(w);
        e.close().unwrap();
        drop(e);
        // A pool of 256 frames for 1000 pages: homes collide, every page is still read right.
        let e = Engine::open(EngineConfig::new(dir.path(), MIN_CACHE_FRAMES * 4096)).unwrap();
        let w = e.worker();
        for _ in 0..2 {
            for (i, &pid) in pids.iter().enumerate() {
                let v = w.run(|w| w.shared(pid).map(|g| g.page().u64(0))).unwrap();
                assert_eq!(v, i as u64);
            }
        }
        assert!(e.inner.free.len() <= e.inner.pool.len());
        drop(w);
        e.close().unwrap();
    }
}
