//! The transport abstraction and the in-process `mem` transport.
//!
//! A transport's primitive is a **one-sided write**: bytes land in a region that a peer
//! registered, with no action by the peer's threads; writes from one node to another are
//! applied in the order they were issued. Each node registers one [`Region`].

use crate::error::MsgError;
use crate::region::Region;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Called by a transport when a dead peer is about to be connected again as a new incarnation
/// (a restarted process; [`Transport::take_rejoins`]), with the peer's id. It runs while the
/// peer is still dead here, before any frame of the new connection is applied and before this
/// node can send to it, and it resets what the layer above keeps about the peer (as for a
/// peer that never sent anything). It may run more than once for one rejoin (an attempt that
/// then fails), and must be harmless for a peer that stays dead. An error refuses the
/// connection with that reason (logged).
pub type RejoinHook = Arc<dyn Fn(u8) -> Result<(), String> + Send + Sync>;

/// One node's view of the cluster's network.
pub trait Transport: Send + Sync + 'static {
    /// This node's id.
    fn node(&self) -> u8;
    /// Number of nodes in the cluster.
    fn nodes(&self) -> u8;
    /// This node's registered region (peers write into it).
    fn region(&self) -> &Region;
    /// Write `data` into `peer`'s region at `offset` (one-sided; ordered per peer).
    fn write(&self, peer: u8, offset: usize, data: &[u8]) -> Result<(), MsgError>;
    /// Two writes to `peer`, in this order (a page, then the message that announces it). A
    /// transport with a per-write cost (a system call, a network packet) sends both at once;
    /// the others write one after the other. If it fails, neither or only the first may have
    /// landed, as with two calls of [`Transport::write`].
    fn write_two(
        &self,
        peer: u8,
        first: (usize, &[u8]),
        then: (usize, &[u8]),
    ) -> Result<(), MsgError> {
        self.write(peer, first.0, first.1)?;
        self.write(peer, then.0, then.1)
    }
    /// Whether `peer` is reachable (false once its connection closed or it died).
    fn peer_alive(&self, peer: u8) -> bool;
    /// Give up on `peer` for good: a message to it could not be delivered although it looked
    /// alive (it took none for the channel's credit timeout), so what the two nodes know of
    /// each other can no longer be trusted. Afterwards `peer_alive(peer)` is false here and
    /// the peer finds out too (tcp and rdma close the connection; `mem` marks it dead), and
    /// both go on as after any node's death.
    fn sever(&self, peer: u8);
    /// Whether [`sever`](Self::sever) ends only this node's link to the peer, so that a node
    /// may sever a peer that stopped answering (a stopped or cut-off process). `mem` severs a
    /// node for the whole process (there is no link to close), so its nodes never do.
    fn severs_one_link(&self) -> bool {
        true
    }
    /// This node leaves: stop sending, wait up to `linger` for every peer to leave too (so
    /// what this node sent last is read before its connections close), then close them. The
    /// in-process `mem` transport does nothing (its nodes share one fate).
    fn leave(&self, linger: std::time::Duration) {
        let _ = linger;
    }
    /// The cluster is shutting down: peers closing their connections from now on is expected
    /// (not logged as an error).
    fn departing(&self) {}
    /// Which connection to `peer` this node has: it changes when the peer was taken back as a
    /// new incarnation ([`Transport::take_rejoins`]). Transports that never reconnect say 0.
    fn connection(&self, peer: u8) -> u64 {
        let _ = peer;
        0
    }
    /// Whether peers took this node back when it started: it restarted into a running
    /// cluster (tcp's hello says so; the others never do).
    fn taken_back(&self) -> bool {
        false
    }
    /// From now on, take a dead peer back when it connects again as a new incarnation,
    /// running `hook` first (see [`RejoinHook`]). Returns whether the transport does (`tcp`
    /// does; a second hook is not taken). Without a hook every restarted node is refused.
    fn take_rejoins(&self, hook: RejoinHook) -> bool {
        let _ = hook;
        false
    }
    /// Do `peer`'s receiving work on this thread, if the transport can ([`Region::serve`] of
    /// the peer's region: only `mem`, whose nodes share the process). Returns whether some
    /// work was done. For a thread that waits for `peer`'s answer: it runs the code that would
    /// produce it instead of waking the thread that would.
    fn assist(&self, peer: u8) -> bool {
        let _ = peer;
        false
    }
    /// How long a thread that waits for an answer from a peer should keep polling for it
    /// before it parks: about one uncontended round trip. `mem` answers within microseconds
    /// (the waiting thread usually does the work itself); over a network the answer takes a
    /// round trip, and a thread that parked before it lands costs a wake-up more.
    fn answer_poll(&self) -> std::time::Duration {
        std::time::Duration::from_micros(20)
    }
    /// This thread starts (`true`) or stops (`false`) polling for answers on behalf of the
    /// regions it can serve: this node's, and on `mem` every node's ([`Region::helpers`]).
    fn helping(&self, on: bool) {
        if on {
            self.region().start_helping();
        } else {
            self.region().stop_helping();
        }
    }
}

/// `mem`: nodes are thread groups in one process; a write is a copy plus a release store.
pub struct MemTransport {
    node: u8,
    regions: Arc<[Arc<Region>]>,
    alive: Arc<[AtomicBool]>,
}

/// Build an in-process cluster of `regions.len()` nodes, one transport per node.
pub fn mem_cluster(regions: Vec<Region>) -> Result<Vec<Arc<MemTransport>>, MsgError> {
    let n = regions.len();
    if n == 0 || n > 64 {
        return Err(MsgError::Config(format!(
            "a cluster has 1 to 64 nodes, got {n}"
        )));
    }
    let regions: Arc<[Arc<Region>]> = regions.into_iter().map(Arc::new).collect();
    let alive: Arc<[AtomicBool]> = (0..n).map(|_| AtomicBool::new(true)).collect();
    Ok((0..n)
        .map(|i| {
            Arc::new(MemTransport {
                node: i as u8,
                regions: Arc::clone(&regions),
                alive: Arc::clone(&alive),
            })
        })
        .collect())
}

impl MemTransport {
    /// Simulate the death of `node`: writes to it fail from now on and every waiter in the
    /// cluster is woken to notice.
    pub fn kill(&self, node: u8) {
        if let Some(a) = self.alive.get(node as usize) {
            a.store(false, Ordering::Release);
        }
        for r in self.regions.iter() {
            r.wake_all();
        }
    }
}

impl Transport for MemTransport {
    fn node(&self) -> u8 {
        self.node
    }
    fn nodes(&self) -> u8 {
        self.regions.len() as u8
    }
    fn region(&self) -> &Region {
        &self.regions[self.node as usize]
    }
    fn write(&self, peer: u8, offset: usize, data: &[u8]) -> Result<(), MsgError> {
        let r = self
            .regions
            .get(peer as usize)
            .ok_or(MsgError::NoSuchPeer(peer, self.nodes()))?;
        if !self.peer_alive(peer) || !self.peer_alive(self.node) {
            return Err(MsgError::PeerDead(peer));
        }
        r.apply(offset, data)
    }
    fn peer_alive(&self, peer: u8) -> bool {
        self.alive
            .get(peer as usize)
            .is_some_and(|a| a.load(Ordering::Acquire))
    }
    fn sever(&self, peer: u8) {
        // In one process there is no connection to close: the peer is dead for every node.
        self.kill(peer);
    }
    fn severs_one_link(&self) -> bool {
        false
    }
    fn assist(&self, peer: u8) -> bool {
        peer != self.node
            && self.peer_alive(peer)
            && self.regions.get(peer as usize).is_some_and(|r| r.serve())
    }
    fn helping(&self, on: bool) {
        for r in self.regions.iter() {
            if on {
                r.start_helping();
            } else {
                r.stop_helping();
            }
        }
    }
}
