//! One pool (`EngineConfig::one_pool`): a home's provider that evicts a clean page nobody else
//! holds offers it to the peer with the most room instead of leaving it only on NVMe; every
//! node tells its peers, periodically, how many frames it could take in ([`Control::Room`]).
//! The protocol side (`Offer`, `OfferReply`, the directory's `offered`) is in
//! docs/protocol.md, "Offered pages".

use super::protocol::{Msg, Node};
use super::wire::Control;
use super::{Coherence, PageState};
use crate::buffer::Buffer;
use crate::pid::Pid;
use shoal_messaging::PAGE_BYTES;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A peer takes offered pages only while it advertises at least this many frames of room.
pub const MIN_ROOM: u64 = 64;

/// One pool's part of a node's protocol state.
pub(super) struct OnePool {
    /// `EngineConfig::one_pool`: forward shared reads to a sharer when the home's copy is not
    /// in memory; offer evicted pages to a peer with room; the provider evicts other homes'
    /// pages first.
    pub enabled: bool,
    /// The room each peer last reported ([`Control::Room`]), less the pages offered to it
    /// since.
    pub peer_room: Box<[AtomicU64]>,
    /// Shutting down: copies go home (`release_remote` was called); no page is offered or
    /// taken in any more. Relaxed: a stale read only lets one more offer out or in, which the
    /// protocol handles like any other (the copy goes home on the next release pass).
    pub leaving: AtomicBool,
}

impl OnePool {
    pub fn new(nodes: u8, enabled: bool) -> OnePool {
        OnePool {
            enabled,
            peer_room: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            leaving: AtomicBool::new(false),
        }
    }
}

impl Coherence {
    /// Frames this node could take in for others: free frames beyond twice its provider's
    /// target (taking them must not make its own provider evict); none once it is leaving
    /// (sending its copies home to shut down).
    pub fn room(&self, buf: &Buffer) -> u64 {
        if self.pool.leaving.load(Ordering::Relaxed) {
            return 0;
        }
        buf.free.len().saturating_sub(buf.free_target * 2) as u64
    }

    /// The other nodes this node does not know dead.
    pub(super) fn live_peers(&self) -> impl Iterator<Item = Node> + '_ {
        (0..self.nodes).filter(move |&n| n != self.me && self.driver.ch.peer_alive(n))
    }

    /// Tell every live peer this node's room (the provider calls it every few milliseconds).
    pub fn advertise_room(&self, buf: &Buffer) {
        if !self.pool.enabled {
            return;
        }
        let frames = self.room(buf);
        for n in self.live_peers() {
            if let Err(e) = self.try_send_control(n, &Control::Room { frames }) {
                log::debug!("node {}: room to node {n}: {e}", self.me);
            }
        }
    }

    /// A peer told us its room.
    pub(super) fn room_of(&self, from: Node, frames: u64) {
        self.pool.peer_room[from as usize].store(frames, Ordering::Relaxed);
    }

    /// The live peer with the most room, if any has at least [`MIN_ROOM`] frames.
    fn roomiest_peer(&self) -> Option<Node> {
        self.live_peers()
            .map(|n| (self.pool.peer_room[n as usize].load(Ordering::Relaxed), n))
            .filter(|&(r, _)| r >= MIN_ROOM)
            .max()
            .map(|(_, n)| n)
    }

    /// The provider is about to drop the frame of `pid`, a clean plain home copy (`bytes`):
    /// offer the page to the peer with the most room. Returns whether an offer left. The frame
    /// may be dropped either way: the store holds the same image, and requests for the page
    /// wait for the peer's answer.
    pub fn offer_away(&self, pid: Pid, bytes: &[u8; PAGE_BYTES]) -> bool {
        if !self.pool.enabled || pid.node() != self.me || self.pool.leaving.load(Ordering::Relaxed)
        {
            return false;
        }
        let Some(to) = self.roomiest_peer() else {
            return false;
        };
        let mut shard = self.pages.shard(pid).lock();
        let ps = shard
            .entry(pid)
            .or_insert_with(|| PageState::new(pid, self.me));
        if ps.lost.is_some() || !ps.held.is_empty() || ps.copy.data.is_some() {
            return false;
        }
        let Some(epoch) = ps.dir.offer(to) else {
            return false; // held by a node, or a copy-back or an offer outstanding
        };
        // one frame less until the peer's next report
        let _ = self.pool.peer_room[to as usize].fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |r| Some(r.saturating_sub(1)),
        );
        if let Err(e) = self.send(to, pid, &Msg::<()>::Offer { epoch, data: () }, Some(bytes)) {
            log::debug!("node {}: offering {pid} to node {to}: {e}", self.me);
            self.offer_unanswered(pid, ps, to);
            return false;
        }
        self.driver.counters.offers.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The offer of `pid` to `to` gets no answer (its send failed, or `to` died): it ends as
    /// declined (nobody holds the page, the store has it), and what waited for it is retried.
    pub(super) fn offer_unanswered(&self, pid: Pid, ps: &mut PageState, to: Node) {
        if let Err(e) = ps.dir.offer_reply(to, false) {
            log::error!("node {}: {pid}: {e}", self.me);
        }
        self.requeue_deferred(ps);
        if !ps.held.is_empty() {
            self.pages.retry_later(pid);
        }
    }
}
