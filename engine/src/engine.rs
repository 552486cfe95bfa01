//! [`Engine`]: one node's buffer manager as its users see it. Opens (or creates) the node's
//! store, builds its [`Node`] (a [`Buffer`], and the coherence protocol on a cluster), starts
//! the page provider thread (and on a cluster the message handler thread), hands out
//! [`Worker`]s, and closes cleanly.
//!
//! The fault path is in [`crate::buffer`], the hit paths in [`crate::guard`], the choice
//! between a single node and a cluster node in [`crate::node`].

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::guard::Worker;
use crate::node::{Membership, Node, NodeSpec};
use crate::pid::Pid;
use crate::provider;
use crate::stats::{ProtocolStats, StatsSnapshot, WorkerStats};
use parking_lot::Mutex;
use shoal_storage::{PageStore, StoreConfig};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a leaving node waits for its peers to leave too before closing its connections.
pub const LEAVE_LINGER: Duration = Duration::from_secs(5);

/// One node's buffer manager.
pub struct Engine {
    node: Arc<Node>,
    provider: Mutex<Option<JoinHandle<()>>>,
    log_writer: Mutex<Option<JoinHandle<()>>>,
    handler: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
    /// A cluster node with a log: every peer made its log durable after every page went
    /// home (an orderly leave, [`Engine::leave`] or [`crate::Cluster::close`]). Only then may
    /// the last checkpoint drop this log's records of pages handed to peers; else the store
    /// stays unclean and the next open recovers (docs/durability.md, "Clusters").
    peers_flushed: AtomicBool,
}

impl Engine {
    /// The node (in-crate tests drive the provider's and handler's pieces directly).
    #[cfg(test)]
    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Open (or create, per `cfg.mode`) the node's store and start its page provider.
    pub fn open(cfg: EngineConfig) -> Result<Engine, EngineError> {
        Engine::open_with(cfg, None)
    }

    /// Open node `cfg.node_id` of a cluster (see [`crate::Cluster`] for building one).
    pub fn open_member(cfg: EngineConfig, m: Membership) -> Result<Engine, EngineError> {
        Engine::open_with(cfg, Some(m))
    }

    fn open_with(cfg: EngineConfig, member: Option<Membership>) -> Result<Engine, EngineError> {
        let t0 = Instant::now();
        cfg.validate()?;
        if member.is_some() && cfg.durability.logged() && cfg.wal_bytes < cfg.cache_bytes as u64 {
            log::warn!(
                "node {}: its log ({}) is smaller than its cache ({}): each checkpoint logs \
                 whole every page of another home this node holds dirty, and while they need \
                 more than the log has free, checkpoints fail (`CheckpointNoRoom`) and changes \
                 with them once the log is nearly full; give the log at least the cache's size \
                 (docs/durability.md, \"Clusters\")",
                cfg.node_id,
                crate::config::format_bytes(cfg.wal_bytes),
                crate::config::format_bytes(cfg.cache_bytes as u64)
            );
        }
        let lock = prepare_data_dir(&cfg)?;
        let store = store_config(&cfg, member.is_some());
        let spec = NodeSpec {
            id: cfg.node_id,
            store,
            frames: cfg.frames(),
            free_target_percent: cfg.free_target_percent,
            free_frame_timeout: cfg.free_frame_timeout,
            durability: cfg.durability,
            checkpoint_past_dead_peers: cfg.checkpoint_past_dead_peers,
            one_pool: cfg.one_pool,
        };
        let node = Node::open(spec, member, lock)?;
        let p = Arc::clone(&node);
        let handle = std::thread::Builder::new()
            .name(format!("shoal-provider-{}", node.id()))
            .spawn(move || provider::run(p))
            .map_err(|e| EngineError::Resources {
                what: "the page provider thread".into(),
                source: Arc::new(e),
            })?;
        let log_writer = match node.log() {
            Some(l) => Some(l.start_writer(node.id(), node.durability())?),
            None => None,
        };
        let handler = node.start_handler()?;
        log::info!(
            "node {} engine: {} frames ({}), free target {}, store {}",
            node.id(),
            node.buffer().frames(),
            crate::config::format_bytes(cfg.cache_bytes as u64),
            node.buffer().free_target,
            node.buffer().store().backend()
        );
        if let Some(c) = node
            .coherence()
            .filter(|c| c.driver().ch.transport().taken_back())
        {
            let took = t0.elapsed();
            c.driver()
                .counters
                .rejoin_ms
                .store(took.as_millis() as u64, Ordering::Relaxed);
            log::warn!(
                "node {}: rejoined the running cluster: taken back, recovered from the logs and \
                 serving again {} ms after its open began",
                node.id(),
                took.as_millis()
            );
        }
        let engine = Engine {
            node,
            provider: Mutex::new(Some(handle)),
            log_writer: Mutex::new(log_writer),
            handler: Mutex::new(handler),
            closed: AtomicBool::new(false),
            peers_flushed: AtomicBool::new(false),
        };
        Ok(engine)
    }

    /// Register a worker: the handle a thread uses to take guards.
    pub fn worker(&self) -> Worker {
        Worker::new(Arc::clone(&self.node), Arc::new(WorkerStats::default()))
    }

    /// This node's id.
    pub fn node_id(&self) -> u8 {
        self.node.id()
    }

    /// Send every page homed elsewhere back home (shutdown). Returns how many frames still
    /// hold such pages (0 for a single node). Call until it returns 0.
    pub fn release_remote(&self) -> usize {
        self.node.release_remote()
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
                return Err(EngineError::PagesAway {
                    node: self.node.id(),
                    count: left,
                    why: format!(
                        "of other homes did not go home within {} s",
                        limit.as_secs_f64()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Cluster barrier: returns once every node of the cluster called `barrier` as often as this
    /// node has (the n-th calls meet). Fails when a node died or `limit` passed. One thread per
    /// node at a time (further callers queue). A single node returns at once.
    pub fn barrier(&self, limit: Duration) -> Result<(), EngineError> {
        self.node.barrier(limit)
    }

    /// Clean shutdown of one node of a multi-process cluster, called by every node once its
    /// workers stopped: send every page homed elsewhere home, wait at a barrier until no node
    /// holds a foreign page, then [`close`](Self::close). `limit` bounds each wait.
    pub fn leave(&self, limit: Duration) -> Result<(), EngineError> {
        self.send_pages_home(limit)?;
        self.barrier(limit)?;
        // Every page is home now, and each home logged the pages that arrived dirty. Each node
        // makes its log durable, and none closes (its last checkpoint drops its log's records
        // of pages it handed over) before all have (docs/durability.md, "Clusters").
        self.flush_log()?;
        self.barrier(limit)?;
        self.peers_flushed();
        self.node.departing();
        self.close()?;
        // peers see this node leave once they left too (tcp closes its connections)
        self.node.leave_cluster(LEAVE_LINGER);
        Ok(())
    }

    /// Every peer made its log durable after every page went home: the close may end with a
    /// last checkpoint (see `Engine::peers_flushed`).
    pub(crate) fn peers_flushed(&self) {
        self.peers_flushed.store(true, Ordering::Release);
    }

    /// Make the log durable up to its tail (nothing without a log).
    pub(crate) fn flush_log(&self) -> Result<(), EngineError> {
        if let Some(l) = self.node.log() {
            l.log().flush_all()?;
        }
        Ok(())
    }

    /// Whether this node restarted into a running cluster: its peers took it back when it
    /// joined (docs/cluster.md, "Failures"). What it reads at its start is then no snapshot
    /// of a quiet cluster: the others ran on meanwhile.
    pub fn rejoined(&self) -> bool {
        self.node
            .coherence()
            .is_some_and(|c| c.driver().ch.transport().taken_back())
    }

    /// Counters of the coherence protocol (all zero for a single node).
    pub fn protocol_stats(&self) -> ProtocolStats {
        self.node.protocol_stats()
    }

    /// Number of frames in the cache.
    pub fn frames(&self) -> usize {
        self.node.buffer().frames()
    }

    /// The node's page store (read-only use: counters, device paths).
    pub fn store(&self) -> &PageStore {
        self.node.buffer().store()
    }

    /// Whether `pid` is in this node's cache right now (a racy snapshot, for tests and tools).
    pub fn is_resident(&self, pid: Pid) -> bool {
        if pid.node() as usize >= crate::pid::MAX_NODES
            || pid.slot() >= crate::buffer::table::MAX_SLOTS_PER_NODE
        {
            return false;
        }
        self.node.buffer().resident_frame(pid).is_some()
    }

    /// Sum of all counters.
    pub fn stats(&self) -> StatsSnapshot {
        let buf = &self.node.buffer();
        let (hits, faults, restarts, live_workers) = self.node.worker_totals();
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            hits,
            faults,
            restarts,
            live_workers,
            evictions: l(&buf.counters.evictions),
            writebacks: l(&buf.counters.writebacks),
            write_errors: l(&buf.counters.write_errors),
            store_reads: l(&buf.store().stats().reads),
            store_writes: l(&buf.store().stats().writes),
            frames: buf.frames() as u64,
            free_frames: buf.free.len() as u64,
            clock: buf.clock() as u64,
            log: self.node.log().map(|l| l.counters()).unwrap_or_default(),
        }
    }

    /// Make every change so far durable without closing. With a write-ahead log (durability
    /// `commit` or `flush-every-ms`): the log is flushed up to its tail, so everything logged
    /// before the call survives a crash (a transaction still running has logged nothing
    /// yet), then a checkpoint writes the dirty pages back, so recovery
    /// replays less. Without a log (durability `none`): every page dirty now is written back
    /// and the devices are synced; that is no crash safety (a crash afterwards still needs
    /// `allow_unclean`, and write-backs made after the flush can leave the trees damaged:
    /// docs/durability.md), only fewer dirty pages. Waits until done; call it with no guard
    /// held.
    pub fn flush(&self) -> Result<(), EngineError> {
        if let Some(l) = self.node.log() {
            l.log().flush_all()?;
        }
        self.node.buffer().flush()
    }

    /// Clean shutdown: stop the provider, write every dirty page, persist the allocator, mark
    /// the store clean and release the data directory's lock (the store may be opened again,
    /// in this process too). Workers must have dropped their guards; every page access
    /// started afterwards (reads too) fails with [`EngineError::Shutdown`]. Calling it twice is
    /// harmless. The lock is released even when closing fails (the store then stays marked
    /// unclean).
    pub fn close(&self) -> Result<(), EngineError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let r = self.close_store();
        self.node.release_lock();
        r
    }

    /// Stop as a killed process stops (kill -9), for crash tests in one process
    /// ([`crate::Cluster::crash`]): the node's connections close first (peers see it die),
    /// then its threads stop without writing anything more: dirty pages in its cache are
    /// lost, its store stays marked unclean and its log holds what was written to it so far
    /// (as after kill -9, which keeps what reached the file). The data directory's lock is
    /// released, so the node can be opened again in this process, recovering from its log.
    /// Page accesses through its workers fail with [`EngineError::Shutdown`] from now on.
    pub(crate) fn crash(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let node = &self.node;
        node.cut_off();
        self.stop_threads();
        node.release_lock();
        log::warn!("node {} crashed (as under kill -9)", node.id());
    }

    /// Shut the buffer down and stop the node's threads: the page provider, the log writer
    /// and the message handler (each joined).
    fn stop_threads(&self) {
        let node = &self.node;
        node.buffer().shut_down();
        if let Some(h) = self.provider.lock().take() {
            if h.join().is_err() {
                log::error!("the page provider thread panicked");
            }
        }
        if let Some(h) = self.log_writer.lock().take() {
            if let Some(l) = node.log() {
                l.stop_writer();
            }
            if h.join().is_err() {
                log::error!("the log writer thread panicked");
            }
        }
        node.stop_handler(self.handler.lock().take());
    }

    /// Whether the engine was closed or crashed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn close_store(&self) -> Result<(), EngineError> {
        let (node, buf) = (&self.node, &self.node.buffer());
        self.stop_threads();
        // With the handler stopped, nothing changes the directory any more: if another node
        // may still hold a newer image of a page homed here (no orderly shutdown: see
        // `Cluster::close` and `leave`), this store is not current and must not say "clean".
        let away = node.homed_pages_away();
        if away == 0 {
            node.free_recycled_here();
        }
        // With the provider stopped, this thread is the only writer of pages to the store.
        let written = provider::flush_all(node)?;
        buf.store().sync()?;
        if away > 0 {
            log::error!(
                "node {}: closing while {away} of its pages are held by other nodes (the cluster \
                 did not shut down in order: use Cluster::close or Engine::leave); {written} dirty \
                 pages written, but the store stays marked unclean: changes made elsewhere are lost",
                node.id()
            );
            return Err(EngineError::PagesAway {
                node: node.id(),
                count: away,
                why: "were still held by other nodes at close; the store is marked unclean".into(),
            });
        }
        if let Some(l) = node.log() {
            if node.coherence().is_some() && !self.peers_flushed.load(Ordering::Acquire) {
                // a peer may not have made durable the receipt of a page this node handed it
                // (it died, or it was never asked): this log's records of that page are its
                // only durable copy, and a last checkpoint would drop them
                return Err(EngineError::Unfenced { node: node.id() });
            }
            let foreign = node.foreign_dirty();
            if foreign > 0 {
                // their changes are only in this log: a last checkpoint would drop them
                return Err(EngineError::PagesAway {
                    node: node.id(),
                    count: foreign,
                    why: "of other homes were still held dirty here at close (not sent home); the \
                          log keeps them and the store stays marked unclean: the next open \
                          recovers them"
                        .into(),
                });
            }
            l.close(buf.store())?;
        }
        buf.store().close()?;
        log::info!(
            "node {} closed cleanly ({written} dirty pages written)",
            node.id()
        );
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            log::error!("closing node {} failed: {e}", self.node.id());
        }
    }
}

/// The page store's configuration for `cfg`; `member`: a cluster node's (whose recovery
/// merges every node's log).
fn store_config(cfg: &EngineConfig, member: bool) -> StoreConfig {
    // The translation table addresses at most MAX_SLOTS_PER_NODE slots per node.
    let max = crate::buffer::table::MAX_SLOTS_PER_NODE;
    let mut store = StoreConfig::new(cfg.device_list());
    store.mode = cfg.mode;
    store.backend = cfg.backend;
    store.node_id = cfg.node_id as u32;
    store.cluster_id = cfg.cluster_id;
    store.capacity_pages = if cfg.capacity_pages == 0 {
        max
    } else {
        cfg.capacity_pages.min(max)
    };
    store.allow_unclean = cfg.allow_unclean;
    store.discard_damaged_log = cfg.discard_damaged_log;
    store.wal = cfg.wal_config();
    store.page_home = Some(|pid| crate::pid::Pid(pid).node());
    if member && store.wal.is_some() {
        store.cluster = Some(shoal_storage::ClusterLogs {
            node: cfg.node_id,
            peers: cfg.peer_logs.clone(),
        });
    }
    store
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
    if cfg.mode != shoal_storage::OpenMode::Open && !store_there(cfg) {
        // a store is about to be made here: only among a store's own files (a directory
        // holding anything else is not a store's, and a typo must not make one among them)
        let foreign = foreign_entries(dir, cfg).map_err(|e| err(format!("cannot list it: {e}")))?;
        if !foreign.is_empty() {
            return Err(err(format!(
                "holds no store, and files that are not a store's ({}{}): a new store is made \
                 only in a new or empty directory, or one holding Shoal's own files (node*)",
                foreign
                    .iter()
                    .take(5)
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", "),
                if foreign.len() > 5 { ", ..." } else { "" }
            )));
        }
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

/// Whether device 0 of `cfg`'s store holds something (a store, or the start of one): else an
/// open makes a new store.
fn store_there(cfg: &EngineConfig) -> bool {
    use std::os::unix::fs::FileTypeExt;
    cfg.device_list()
        .first()
        .is_some_and(|d| match std::fs::metadata(d) {
            Ok(m) => m.file_type().is_block_device() || m.len() > 0,
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
            // (another error: the store's open names it)
        })
}

/// The entries of `dir` that are not a store's own: every file a store makes is named after
/// its node (`node0.lock`, `node0-0.dat`, `node0-0.wal`, their `.creating` and `.carried`
/// companions) or after a device `cfg` names (and its companions), and a file system's root
/// holds `lost+found`.
fn foreign_entries(dir: &std::path::Path, cfg: &EngineConfig) -> std::io::Result<Vec<String>> {
    let devices: Vec<String> = cfg
        .device_list()
        .iter()
        .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let mut foreign = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name().to_string_lossy().into_owned();
        let own = name
            .strip_prefix("node")
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
            || devices.iter().any(|d| name.starts_with(d.as_str()));
        if !own && name != "lost+found" {
            foreign.push(name);
        }
    }
    foreign.sort();
    Ok(foreign)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MIN_CACHE_FRAMES;

    fn frame_of(e: &Engine, pid: Pid) -> Option<crate::buffer::FrameIdx> {
        e.node.buffer().resident_frame(pid)
    }

    /// A directory holding files that are not a store's is never made into one: the open
    /// fails naming them and writes nothing; an empty or new directory, or one holding a
    /// store's own files, takes a new store.
    #[test]
    fn a_store_is_made_only_where_nothing_but_a_stores_files_lie() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("docs");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("README.txt"), "my notes").unwrap();
        let e = Engine::open(EngineConfig::new(&d, 8 << 20))
            .err()
            .expect("refused");
        let msg = e.to_string();
        assert!(msg.contains("README.txt"), "{msg}");
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec!["README.txt".to_string()], "nothing written");
        // new, empty, or the leftovers of a store's own files: made
        for sub in ["new/deeper", "empty"] {
            let p = dir.path().join(sub);
            if sub == "empty" {
                std::fs::create_dir(&p).unwrap();
            }
            let e = Engine::open(EngineConfig::new(&p, 8 << 20)).unwrap();
            e.close().unwrap();
            // and opened again, with its own files there
            let e = Engine::open(EngineConfig::new(&p, 8 << 20)).unwrap();
            e.close().unwrap();
        }
        let p = dir.path().join("leftover");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("node0.lock"), "").unwrap();
        Engine::open(EngineConfig::new(&p, 8 << 20))
            .unwrap()
            .close()
            .unwrap();
        // a device of its own name, with what an interrupted creation of it left
        let p = dir.path().join("named");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("pages.img.creating"), "").unwrap();
        let mut c = EngineConfig::new(&p, 8 << 20);
        c.device_paths = vec![p.join("pages.img")];
        Engine::open(c).unwrap().close().unwrap();
    }

    /// A group of changes the log refuses (more pages at once than one chunk holds) leaves
    /// pages changed that the log does not hold: the log fails for every later change, the
    /// worker's commit reports it, and the engine closes (with the error) instead of waiting
    /// for ever for a flush that cannot come.
    #[test]
    fn a_group_the_log_refuses_fails_the_log_for_every_later_change() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = EngineConfig::new(dir.path(), 64 << 20);
        cfg.wal_bytes = 4 << 20;
        let e = Engine::open(cfg).unwrap();
        let w = e.worker();
        let kept = {
            let mut g = w.allocate().unwrap();
            g.page_mut().set_u64(0, 7);
            g.pid()
        };
        w.commit().unwrap();
        let most = w.most_pages_per_commit();
        assert!(most > 0 && most < 1000, "{most}");
        // one group: more pages held at once than a chunk holds
        let guards: Vec<_> = (0..most + 5).map(|_| w.allocate().unwrap()).collect();
        drop(guards);
        assert!(w.commit_later().is_err(), "the refused group is reported");
        assert!(w.allocate().is_err(), "a failed log takes no new page");
        let other = e.worker();
        let r = other.run(|w| w.exclusive(kept).map(drop));
        assert!(r.is_err(), "a failed log takes no change: {r:?}");
        // close comes back (with the log's error), it does not wait for ever
        let (tx, rx) = std::sync::mpsc::channel();
        drop((w, other));
        std::thread::spawn(move || tx.send(e.close().is_err()));
        let closed = rx.recv_timeout(std::time::Duration::from_secs(60));
        assert_eq!(closed, Ok(true), "close reports the failed log");
    }

    /// The home-frame layout (`FramePool::preferred`): when the pool holds every page, each page
    /// sits in its preferred frame, whatever order pages are created or read back in; when it does
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
                assert_eq!(
                    frame_of(&e, pid),
                    Some(e.node.buffer().preferred(pid)),
                    "{pid:?}"
                );
            }
            drop(w);
            e.close().unwrap();
            pids
        };
        // Read back in reverse: faults take each page's preferred frame again.
        let e = Engine::open(EngineConfig::new(dir.path(), 8 << 20)).unwrap();
        let w = e.worker();
        for (i, &pid) in pids.iter().enumerate().rev() {
            let v = w.run(|w| w.shared(pid).map(|g| g.page().u64(0))).unwrap();
            assert_eq!(v, i as u64);
            assert_eq!(
                frame_of(&e, pid),
                Some(e.node.buffer().preferred(pid)),
                "{pid:?}"
            );
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
        assert!(e.node.buffer().free.len() <= e.node.buffer().frames());
        drop(w);
        e.close().unwrap();
    }
}
