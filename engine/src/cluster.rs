//! Clusters of engines. [`MemCluster`]: N nodes in one process over the `mem` transport (the
//! embedded default and the test bed), each with its own data directory, frame pool, page
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
use shoal_messaging::{mem_cluster, ChannelLayout, MemTransport, WaitMode};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a clean shutdown waits for foreign pages to go home.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);

/// N nodes in one process.
pub struct MemCluster {
    nodes: Vec<Engine>,
    transports: Vec<Arc<MemTransport>>,
}

impl MemCluster {
    /// Open `n` nodes; `cfg(i)` is node `i`'s configuration (its `node_id` is set here).
    pub fn open(
        n: usize,
        remote_timeout: Duration,
        cfg: impl Fn(u8) -> EngineConfig,
    ) -> Result<MemCluster, EngineError> {
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
        let mut nodes = Vec::with_capacity(n);
        for (i, t) in transports.iter().enumerate() {
            let mut c = cfg(i as u8);
            c.node_id = i as u8;
            nodes.push(Engine::open_member(
                c,
                Membership {
                    transport: Arc::clone(t) as Arc<dyn shoal_messaging::Transport>,
                    mode: WaitMode::Park,
                    remote_timeout,
                },
            )?);
        }
        Ok(MemCluster { nodes, transports })
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &Engine {
        &self.nodes[i]
    }

    pub fn nodes(&self) -> &[Engine] {
        &self.nodes
    }

    /// Simulate the death of node `i`: every message to or from it fails from now on.
    pub fn kill(&self, i: usize) {
        self.transports[0].kill(i as u8);
    }

    /// Clean shutdown (see module docs). Workers must have dropped their guards.
    pub fn close(self) -> Result<(), EngineError> {
        let t0 = Instant::now();
        loop {
            let left: usize = self.nodes.iter().map(|e| e.release_remote()).sum();
            if left == 0 {
                break;
            }
            if t0.elapsed() > RELEASE_TIMEOUT {
                return Err(EngineError::Remote(format!(
                    "{left} pages did not go home within {} s",
                    RELEASE_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut first = None;
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
