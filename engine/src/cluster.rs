//! Clusters of engines in one process. [`Cluster::mem`]: N nodes over the `mem` transport (the
//! embedded default and the test bed); [`Cluster::over`]: N nodes over transports built by the
//! caller (e.g. `tcp` over loopback). Each node has its own data directory, frame pool, page
//! provider and message handler.
//!
//! Clean shutdown of a cluster ([`MemCluster::close`]) first sends every page a node holds
//! from another home back to that home (eviction notices, dirty pages attached), waits until no
//! node holds a foreign page, then closes each node (which writes its dirty home pages to its
//! store). Reopening the same directories restores every page; directory metadata is not
//! persisted (after a restart nobody holds a copy, so every home's store is current).

use crate::config::EngineConfig;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::node::Membership;
use crate::pid::MAX_NODES;
use shoal_messaging::{mem_cluster, ChannelLayout, MemTransport, Transport, WaitMode};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a clean shutdown waits for foreign pages to go home.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds a [`Cluster`] with defaults: each node in `<data_dir>/node<i>` with a 64 MiB cache,
/// durability none (set one with [`ClusterBuilder::configure`]: docs/durability.md, "Clusters"),
/// remote pages awaited for at most 10 s; [`ClusterBuilder::mem`] or
/// [`ClusterBuilder::tcp_loopback`] opens it.
///
/// ```
/// use shoal_engine::Cluster;
/// let dir = tempfile::tempdir()?;
/// let cluster = Cluster::builder(2, dir.path()).cache_bytes(16 << 20).mem()?;
/// // a page homed on node 1, written from node 0: the protocol brings it over
/// let pid = cluster.node(1).worker().allocate()?.pid();
/// let w0 = cluster.node(0).worker();
/// w0.run(|w| w.exclusive(pid))?.page_mut().set_u64(0, 7);
/// let read = cluster.node(1).worker().run(|w| w.shared(pid))?.page().u64(0);
/// assert_eq!(read, 7);
/// drop(w0);
/// cluster.close()?; // (dropping it would close it too)
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ClusterBuilder {
    nodes: usize,
    data_dir: PathBuf,
    cache_bytes: usize,
    remote_timeout: Duration,
    configure: Option<Configure>,
}

/// Adjusts node `i`'s configuration (see [`ClusterBuilder::configure`]).
type Configure = Box<dyn Fn(u8, &mut EngineConfig)>;

impl ClusterBuilder {
    /// Page cache per node (default 64 MiB).
    pub fn cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// How long a worker waits for a page from another node (default 10 s).
    pub fn remote_timeout(mut self, t: Duration) -> Self {
        self.remote_timeout = t;
        self
    }

    /// Adjust node `i`'s configuration (durability, devices, ...) after the defaults.
    pub fn configure(mut self, f: impl Fn(u8, &mut EngineConfig) + 'static) -> Self {
        self.configure = Some(Box::new(f));
        self
    }

    fn config(&self, i: u8) -> EngineConfig {
        let mut c = EngineConfig::for_cluster_node(
            self.data_dir.join(format!("node{i}")),
            self.cache_bytes,
        );
        if let Some(f) = &self.configure {
            f(i, &mut c);
        }
        c
    }

    /// Open the nodes in this process over the `mem` transport.
    pub fn mem(self) -> Result<Cluster, EngineError> {
        Cluster::mem(self.nodes, self.remote_timeout, |i| self.config(i))
    }

    /// Open the nodes in this process, connected over tcp on loopback (free ports, a fresh
    /// cluster secret): the same wire path as a cluster of processes, in one process. A node
    /// of such a cluster can crash and restart into it ([`Cluster::crash`],
    /// [`Cluster::restart`]).
    pub fn tcp_loopback(self) -> Result<Cluster, EngineError> {
        use shoal_messaging::free_loopback_addrs;
        if self.nodes == 0 || self.nodes > MAX_NODES {
            return Err(EngineError::Config(format!(
                "a cluster has 1 to {MAX_NODES} nodes, got {}",
                self.nodes
            )));
        }
        let addrs = free_loopback_addrs(self.nodes).map_err(|e| io("free loopback ports", e))?;
        let secret = crate::cluster_file::new_secret_hex()
            .map_err(|e| io("a cluster secret", e))?
            .into_bytes();
        let mesh = Arc::new(TcpMesh {
            addrs,
            secret,
            cluster_id: u64::from(std::process::id()),
        });
        let listeners = mesh
            .addrs
            .iter()
            .map(|a| {
                std::net::TcpListener::bind(a).map_err(|e| io(&format!("listening on {a}"), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // every node's start blocks until the mesh is connected: one thread each
        let starts: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(i, l)| {
                let mesh = Arc::clone(&mesh);
                std::thread::spawn(move || mesh.start(i as u8, l))
            })
            .collect();
        let mut transports = Vec::with_capacity(starts.len());
        for h in starts {
            transports.push(h.join().map_err(|_| {
                EngineError::Config("a transport's start-up thread panicked".into())
            })??);
        }
        let mut c = Cluster::over(transports, self.remote_timeout, |i| self.config(i))?;
        c.tcp = Arc::into_inner(mesh);
        Ok(c)
    }
}

/// An io error of setting a cluster up, as a configuration error saying `what` failed.
fn io(what: &str, e: std::io::Error) -> EngineError {
    EngineError::Config(format!("{what}: {e}"))
}

/// What connects a node of a [`ClusterBuilder::tcp_loopback`] cluster to the others, at the
/// cluster's start and again when the node restarts.
struct TcpMesh {
    addrs: Vec<std::net::SocketAddr>,
    secret: Vec<u8>,
    cluster_id: u64,
}

/// How long a restarting node tries to listen on its address again (its crashed
/// predecessor's listener closes within a few milliseconds of the crash).
const RELISTEN_FOR: Duration = Duration::from_secs(5);

impl TcpMesh {
    /// Node `i`'s transport, listening on `listener`: blocks until every peer is connected
    /// (at a restart, until every live peer took the node back).
    fn start(&self, i: u8, listener: TcpListener) -> Result<Arc<dyn Transport>, EngineError> {
        let mut cfg = shoal_messaging::TcpConfig::new(i, self.cluster_id, self.addrs.clone());
        cfg.secret = self.secret.clone();
        crate::cluster_file::start_tcp(cfg, listener)
    }

    /// Listen on node `i`'s address again (a restart), retrying while the crashed
    /// predecessor's listener is still open.
    fn listen_again(&self, i: u8) -> Result<TcpListener, EngineError> {
        let addr = self.addrs[i as usize];
        let t0 = Instant::now();
        loop {
            match TcpListener::bind(addr) {
                Ok(l) => return Ok(l),
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse && t0.elapsed() < RELISTEN_FOR =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(io(&format!("node {i}: listening on {addr} again"), e)),
            }
        }
    }
}

/// N nodes in one process. Dropping it closes it as [`Cluster::close`] does (errors are
/// logged), so an early return or a panic does not leave every store unclean.
pub struct Cluster {
    nodes: Vec<Engine>,
    mem: Option<Arc<MemTransport>>,
    /// How a node connects again when it restarts (clusters over tcp on loopback).
    tcp: Option<TcpMesh>,
    /// Each node's configuration, to open it again when it restarts.
    cfgs: Vec<EngineConfig>,
    remote_timeout: Duration,
    /// The cluster's identity in this process (`Membership::database`).
    database: u64,
    closed: std::sync::atomic::AtomicBool,
}

impl Cluster {
    /// A [`ClusterBuilder`] for `nodes` nodes under `data_dir`, with defaults.
    pub fn builder(nodes: usize, data_dir: impl Into<PathBuf>) -> ClusterBuilder {
        ClusterBuilder {
            nodes,
            data_dir: data_dir.into(),
            cache_bytes: 64 << 20,
            remote_timeout: Duration::from_secs(10),
            configure: None,
        }
    }

    /// Open `n` nodes over `mem`; `cfg(i)` is node `i`'s configuration (its `node_id` is set
    /// here).
    pub fn mem(
        n: usize,
        remote_timeout: Duration,
        cfg: impl Fn(u8) -> EngineConfig,
    ) -> Result<Cluster, EngineError> {
        if n == 0 || n > MAX_NODES {
            return Err(EngineError::Config(format!(
                "a cluster has 1 to {MAX_NODES} nodes (sharer sets are 64-bit bitmaps), got {n}"
            )));
        }
        let layout = ChannelLayout::new(n as u8);
        let regions = (0..n)
            .map(|_| layout.region())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| EngineError::Config(format!("cluster messaging: {e}")))?;
        let transports =
            mem_cluster(regions).map_err(|e| EngineError::Config(format!("cluster: {e}")))?;
        let killer = Arc::clone(&transports[0]);
        let dyns = transports
            .into_iter()
            .map(|t| t as Arc<dyn Transport>)
            .collect();
        let mut c = Cluster::over(dyns, remote_timeout, cfg)?;
        c.mem = Some(killer);
        Ok(c)
    }

    /// Open one node per transport (transport `i` is node `i`'s; its region must have the
    /// [`ChannelLayout`] of the cluster).
    pub fn over(
        transports: Vec<Arc<dyn Transport>>,
        remote_timeout: Duration,
        cfg: impl Fn(u8) -> EngineConfig,
    ) -> Result<Cluster, EngineError> {
        let mut nodes = Vec::with_capacity(transports.len());
        let mut cfgs: Vec<EngineConfig> = (0..transports.len())
            .map(|i| {
                let mut c = cfg(i as u8);
                c.node_id = i as u8;
                c
            })
            .collect();
        // every node's recovery reads the others' logs (docs/durability.md, "Clusters"): those
        // of the nodes that run with one, each of which must then be readable
        let logs: Vec<Option<PathBuf>> = cfgs
            .iter()
            .map(|c| c.wal_config().map(|w| w.path))
            .collect();
        for (i, c) in cfgs.iter_mut().enumerate() {
            c.peer_logs = (0..logs.len())
                .filter(|&j| j != i)
                .filter_map(|j| logs[j].clone())
                .collect();
        }
        let database = crate::node::new_database_id();
        for (t, c) in transports.into_iter().zip(cfgs.iter().cloned()) {
            nodes.push(Engine::open_member(
                c,
                Membership {
                    transport: t,
                    mode: WaitMode::Park,
                    remote_timeout,
                    database,
                },
            )?);
        }
        Ok(Cluster {
            nodes,
            mem: None,
            tcp: None,
            cfgs,
            remote_timeout,
            database,
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &Engine {
        &self.nodes[i]
    }

    pub fn nodes(&self) -> &[Engine] {
        &self.nodes
    }

    /// Simulate the death of node `i` of a `mem` cluster: every message to or from it fails
    /// from now on, while its engine runs on, cut off. (Over other transports, kill the
    /// process or close its transport; to stop a node as kill -9 would and start it again
    /// later, [`Cluster::crash`] and [`Cluster::restart`].)
    pub fn kill(&self, i: usize) {
        if let Some(t) = &self.mem {
            t.kill(i as u8);
        }
    }

    /// Crash node `i` as kill -9 would ([`Engine`]'s threads stop, its connections close,
    /// dirty pages in its cache are lost, its store stays unclean, its log keeps what was
    /// written to it): the other nodes notice its death and go on (docs/cluster.md,
    /// "Failures"). Its workers' page accesses fail with [`EngineError::Shutdown`]; drop them
    /// before [`Cluster::restart`]. Crashing a crashed node does nothing.
    pub fn crash(&self, i: usize) {
        let Some(e) = self.nodes.get(i) else { return };
        if let Some(t) = &self.mem {
            t.kill(i as u8);
        }
        e.crash();
    }

    /// Whether node `i` crashed ([`Cluster::crash`]) and was not restarted since.
    pub fn crashed(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|e| e.is_closed()) && !self.is_closed()
    }

    /// Start crashed node `i` again into the running cluster, as `shoal node` restarted with
    /// the same command line: it connects to the live nodes (they take it back), recovers
    /// from its log and the others' (pages it lost are brought back), rebuilds the directory
    /// of its home pages from what the others hold, and serves again (docs/cluster.md,
    /// "Failures"). Blocks until it is open. Over `mem` the node's transport is revived
    /// ([`MemTransport::revive`]: the live nodes take it back, its region is zeroed); over tcp
    /// ([`ClusterBuilder::tcp_loopback`]) it listens on its address again and connects. The
    /// caller's transports ([`Cluster::over`]) cannot be built again here: an error.
    pub fn restart(&mut self, i: usize) -> Result<(), EngineError> {
        let n = self.nodes.len();
        if i >= n {
            return Err(EngineError::Config(format!(
                "node {i} restarts, but the cluster has {n} nodes"
            )));
        }
        if self.is_closed() {
            return Err(EngineError::Shutdown);
        }
        if !self.crashed(i) {
            return Err(EngineError::Config(format!(
                "node {i} restarts, but it is running (crash it first: Cluster::crash)"
            )));
        }
        let t0 = Instant::now();
        let transport: Arc<dyn Transport> = match (&self.mem, &self.tcp) {
            (Some(mem), _) => mem
                .revive(i as u8)
                .map_err(|why| EngineError::Join { node: i as u8, why })?,
            (None, Some(tcp)) => tcp.start(i as u8, tcp.listen_again(i as u8)?)?,
            (None, None) => {
                return Err(EngineError::Config(format!(
                    "node {i} restarts, but the transports of Cluster::over cannot be built \
                     again here (Cluster::mem and ClusterBuilder::tcp_loopback restart nodes)"
                )))
            }
        };
        let engine = Engine::open_member(
            self.cfgs[i].clone(),
            Membership {
                transport,
                mode: WaitMode::Park,
                remote_timeout: self.remote_timeout,
                database: self.database,
            },
        )?;
        log::warn!(
            "node {i} restarted into the running cluster in {:.2} s",
            t0.elapsed().as_secs_f64()
        );
        // the crashed engine is closed already: dropping it writes nothing
        self.nodes[i] = engine;
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Clean shutdown (see module docs). Workers must have dropped their guards. Calling it
    /// again does nothing; every node access afterwards fails with [`EngineError::Shutdown`].
    pub fn close(&self) -> Result<(), EngineError> {
        self.close_within(RELEASE_TIMEOUT)
    }

    /// [`Cluster::close`], waiting at most `limit` for foreign pages to go home.
    fn close_within(&self, limit: Duration) -> Result<(), EngineError> {
        if self.closed.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Ok(());
        }
        let mut first = None;
        // a crashed node is not touched again (nothing more reaches its store or log): the
        // others' pages it held stay lost, and their stores stay unclean
        let mut live = Vec::with_capacity(self.nodes.len());
        for (i, e) in self.nodes.iter().enumerate() {
            if e.is_closed() {
                log::error!("closing the cluster while node {i} is crashed");
                first.get_or_insert(EngineError::PeerDead { node: i as u8 });
            } else {
                live.push(e);
            }
        }
        for e in &live {
            if let Err(err) = e.send_pages_home(limit) {
                // close the nodes anyway (their stores then stay marked unclean, as they must)
                log::error!("node {}: sending pages home: {err}", e.node_id());
                first.get_or_insert(err);
            }
        }
        // every page is home, logged whole where it arrived dirty: each log is made durable
        // before any node's last checkpoint drops its records of pages it handed over
        for e in &live {
            if let Err(err) = e.flush_log() {
                log::error!("node {}: flushing its log: {err}", e.node_id());
                first.get_or_insert(err);
            }
        }
        if first.is_none() {
            for e in &live {
                e.peers_flushed();
            }
        }
        for e in &live {
            if let Err(err) = e.close() {
                log::error!("closing node {}: {err}", e.node_id());
                first.get_or_insert(err);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// How long dropping an unclosed cluster waits for foreign pages to go home (a panicking
/// thread does not wait: its nodes close at once, stores with pages away stay unclean).
const DROP_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let limit = if std::thread::panicking() {
            Duration::ZERO
        } else {
            DROP_RELEASE_TIMEOUT
        };
        if let Err(e) = self.close_within(limit) {
            log::error!("closing a dropped cluster: {e}");
        }
    }
}
