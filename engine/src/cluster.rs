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
use crate::engine::{Engine, Membership};
use crate::error::EngineError;
use crate::pid::MAX_NODES;
use shoal_messaging::{mem_cluster, ChannelLayout, MemTransport, Transport, WaitMode};
use std::sync::Arc;
use std::time::Duration;

/// How long a clean shutdown waits for foreign pages to go home.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);

/// N nodes in one process. Dropping it closes it as [`Cluster::close`] does (errors are
/// logged), so an early return or a panic does not leave every store unclean.
pub struct Cluster {
    nodes: Vec<Engine>,
    mem: Option<Arc<MemTransport>>,
    closed: std::sync::atomic::AtomicBool,
}

impl Cluster {
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
        for (i, t) in transports.into_iter().enumerate() {
            let mut c = cfg(i as u8);
            c.node_id = i as u8;
            nodes.push(Engine::open_member(
                c,
                Membership {
                    transport: t,
                    mode: WaitMode::Park,
                    remote_timeout,
                },
            )?);
        }
        Ok(Cluster {
            nodes,
            mem: None,
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
    /// from now on. (Over other transports, kill the process or close its transport.)
    pub fn kill(&self, i: usize) {
        if let Some(t) = &self.mem {
            t.kill(i as u8);
        }
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
        for e in &self.nodes {
            if let Err(err) = e.send_pages_home(limit) {
                // close the nodes anyway (their stores then stay marked unclean, as they must)
                log::error!("node {}: sending pages home: {err}", e.node_id());
                first.get_or_insert(err);
            }
        }
        for e in &self.nodes {
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
