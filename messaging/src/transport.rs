//! The transport abstraction and the in-process `mem` transport.
//!
//! A transport's primitive is a **one-sided write**: bytes land in a region that a peer
//! registered, with no action by the peer's threads; writes from one node to another are
//! applied in the order they were issued. Each node registers one [`Region`].

use crate::error::MsgError;
use crate::region::Region;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
    /// cluster (tcp's hello says so; a revived `mem` node's transport too).
    fn taken_back(&self) -> bool {
        false
    }
    /// From now on, take a dead peer back when it connects again as a new incarnation,
    /// running `hook` first (see [`RejoinHook`]). Returns whether the transport does (`tcp`
    /// does, where a second hook is not taken; `mem` does, [`MemTransport::revive`], where a
    /// revived node's hook replaces its predecessor's). Without a hook every restarted node
    /// is refused.
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
/// A node that crashed may come back as a new incarnation ([`MemTransport::revive`]).
pub struct MemTransport {
    node: u8,
    /// This transport's incarnation of its node: its writes fail once the node revived.
    incarnation: u64,
    /// This node came back into the running cluster ([`MemTransport::revive`]).
    taken_back: bool,
    mem: Arc<Mem>,
}

/// What the nodes of one `mem` cluster share.
struct Mem {
    regions: Box<[Region]>,
    alive: Box<[AtomicBool]>,
    /// Each node's current incarnation (see `MemTransport::incarnation`).
    incarnations: Box<[AtomicU64]>,
    /// Each node's connection number as its peers see it (`Transport::connection`): one more
    /// at each revival, once it is alive again.
    connections: Box<[AtomicU64]>,
    /// Each node's rejoin hook ([`Transport::take_rejoins`]), run when a peer revives.
    hooks: Box<[Mutex<Option<RejoinHook>>]>,
}

/// Build an in-process cluster of `regions.len()` nodes, one transport per node.
pub fn mem_cluster(regions: Vec<Region>) -> Result<Vec<Arc<MemTransport>>, MsgError> {
    let n = regions.len();
    if n == 0 || n > 64 {
        return Err(MsgError::Config(format!(
            "a cluster has 1 to 64 nodes, got {n}"
        )));
    }
    let mem = Arc::new(Mem {
        regions: regions.into_boxed_slice(),
        alive: (0..n).map(|_| AtomicBool::new(true)).collect(),
        incarnations: (0..n).map(|_| AtomicU64::new(0)).collect(),
        connections: (0..n).map(|_| AtomicU64::new(0)).collect(),
        hooks: (0..n).map(|_| Mutex::new(None)).collect(),
    });
    Ok((0..n)
        .map(|i| {
            Arc::new(MemTransport {
                node: i as u8,
                incarnation: 0,
                taken_back: false,
                mem: Arc::clone(&mem),
            })
        })
        .collect())
}

impl MemTransport {
    /// Simulate the death of `node`: writes to it fail from now on and every waiter in the
    /// cluster is woken to notice.
    pub fn kill(&self, node: u8) {
        if let Some(a) = self.mem.alive.get(node as usize) {
            a.store(false, Ordering::Release);
        }
        for r in self.mem.regions.iter() {
            r.wake_all();
        }
    }

    /// Bring dead `node` back as a new incarnation (a node restarted in this process), as the
    /// tcp transport takes a restarted process back: its old transport's writes fail for
    /// good; every live node's rejoin hook runs while it is still dead (each resets what its
    /// node keeps about it; an error refuses the revival with that reason, and it stays
    /// dead); its region is zeroed as a new one; then it is alive and its connection number
    /// moves on. Returns the new incarnation's transport. The node's threads must have
    /// stopped (a crashed engine's have: `Cluster::crash`): a write of theirs that passed its
    /// checks before the incarnation moved on would still land.
    ///
    /// Why the zeroed region gets nothing of the old incarnation's peers: a live node writes
    /// into it only through its channel to the node, under that channel's lock for the
    /// node, which its hook's reset takes (`Channels::reset_peer`), so no such write is in
    /// progress once the hooks returned, and none starts before the node is alive again
    /// (each checks it first).
    pub fn revive(&self, node: u8) -> Result<Arc<MemTransport>, String> {
        let m = &self.mem;
        let i = node as usize;
        if i >= m.regions.len() {
            return Err(format!(
                "node {node} is not in this cluster of {}",
                m.regions.len()
            ));
        }
        if m.alive[i].load(Ordering::Acquire) {
            return Err(format!("node {node} is alive: only a dead node revives"));
        }
        // AcqRel: the old incarnation's writes check it after their alive check
        let incarnation = m.incarnations[i].fetch_add(1, Ordering::AcqRel) + 1;
        for (j, hook) in m.hooks.iter().enumerate() {
            if j == i || !m.alive[j].load(Ordering::Acquire) {
                continue;
            }
            let hook = hook.lock().unwrap_or_else(|e| e.into_inner()).clone();
            match hook {
                Some(h) => h(node).map_err(|why| format!("node {j} refused node {node}: {why}"))?,
                None => return Err(format!("node {j} takes no restarted nodes back")),
            }
        }
        m.regions[i].reset();
        // Release (both): the reset region before anyone sees the node alive; alive before
        // the new connection number (a handler that sees the new number sees it alive)
        m.alive[i].store(true, Ordering::Release);
        m.connections[i].fetch_add(1, Ordering::Release);
        Ok(Arc::new(MemTransport {
            node,
            incarnation,
            taken_back: true,
            mem: Arc::clone(m),
        }))
    }

    /// Whether this transport is its node's current incarnation, alive.
    fn current(&self) -> bool {
        let i = self.node as usize;
        self.mem.alive[i].load(Ordering::Acquire)
            && self.mem.incarnations[i].load(Ordering::Acquire) == self.incarnation
    }
}

impl Transport for MemTransport {
    fn node(&self) -> u8 {
        self.node
    }
    fn nodes(&self) -> u8 {
        self.mem.regions.len() as u8
    }
    fn region(&self) -> &Region {
        &self.mem.regions[self.node as usize]
    }
    fn write(&self, peer: u8, offset: usize, data: &[u8]) -> Result<(), MsgError> {
        let r = self
            .mem
            .regions
            .get(peer as usize)
            .ok_or(MsgError::NoSuchPeer(peer, self.nodes()))?;
        if !self.peer_alive(peer) || !self.current() {
            return Err(MsgError::PeerDead(peer));
        }
        r.apply(offset, data)
    }
    fn peer_alive(&self, peer: u8) -> bool {
        self.mem
            .alive
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
    fn connection(&self, peer: u8) -> u64 {
        self.mem
            .connections
            .get(peer as usize)
            // Acquire: pairs with the Release in `revive`
            .map_or(0, |c| c.load(Ordering::Acquire))
    }
    fn taken_back(&self) -> bool {
        self.taken_back
    }
    fn take_rejoins(&self, hook: RejoinHook) -> bool {
        // (a revived node's transport replaces its predecessor's hook)
        *self.mem.hooks[self.node as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(hook);
        true
    }
    fn assist(&self, peer: u8) -> bool {
        peer != self.node
            && self.peer_alive(peer)
            && self
                .mem
                .regions
                .get(peer as usize)
                .is_some_and(|r| r.serve())
    }
    fn helping(&self, on: bool) {
        for r in self.mem.regions.iter() {
            if on {
                r.start_helping();
            } else {
                r.stop_helping();
            }
        }
    }
}
