//! Taking a restarted node back (docs/protocol.md, "Rejoin").
//!
//! A node that died and restarts connects to the running nodes as a new incarnation (the
//! transport's rejoin, messaging/src/tcp/rejoin.rs); each live node runs
//! [`Coherence::take_back`] first, while the node is still dead to it. The restarted node
//! does nothing special: it connects before it recovers its store (`Node::open`), starts with
//! an empty directory and no copies, and answers nothing until its recovery is done.
//!
//! What makes its empty directory right: when a live node takes it back, that node holds no
//! copy of the restarted node's pages any more (they are dropped here), and nothing of its
//! own still counts on the old incarnation (its death was handled: swept, fenced, every
//! message it sent applied; no directory entry names it). What makes its recovery complete:
//! this node's lease from it ran out before (no worker of ours can change its pages since),
//! the dropped copies' changes are in this node's log, and the log is made durable here
//! before the restarted node's recovery, which reads every node's log, can start (it starts
//! once every live node welcomed it).
//!
//! Refused, until the whole cluster restarts: a page of this node (or one this node waited
//! for) lost with the old incarnation. Its newest changes are in the dead node's log, and
//! bringing them back while the cluster runs is not built: the restarted node's start fails
//! with this reason.

use super::directory::Holders;
use super::possession::Pending;
use super::protocol::{bit, Node};
use super::Coherence;
use crate::buffer::Buffer;
use crate::pid::Pid;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Why a restarted node cannot be taken back now.
enum NotNow {
    /// Wait: this node is still handling the old incarnation's death.
    Yet(String),
    /// Refuse: a page lost with the old incarnation.
    Never(String),
}

impl Coherence {
    /// The transport's rejoin hook: restarted node `peer` is about to be connected again.
    /// Waits (at most the remote timeout) until this node has handled the old incarnation's
    /// death, then forgets everything about it (see the module doc). An error refuses the
    /// connection, with its reason.
    pub fn take_back(&self, buf: &Buffer, peer: Node) -> Result<(), String> {
        if peer == self.me || peer >= self.nodes {
            return Err(format!("node {peer} is not a peer of node {}", self.me));
        }
        let deadline = Instant::now() + self.waiting.timeout;
        loop {
            match self.try_take_back(buf, peer) {
                Ok(dropped) => {
                    self.driver.counters.rejoins.fetch_add(1, Ordering::Relaxed);
                    log::warn!(
                        "node {}: taking restarted node {peer} back: {} copies of its pages \
                         dropped here ({} of them changed: their changes are in this node's \
                         log, which its recovery reads)",
                        self.me,
                        dropped.0,
                        dropped.1
                    );
                    return Ok(());
                }
                Err(NotNow::Never(why)) => return Err(why),
                Err(NotNow::Yet(why)) if Instant::now() >= deadline => {
                    return Err(format!(
                        "{why} (waited {} ms)",
                        self.waiting.timeout.as_millis()
                    ))
                }
                Err(NotNow::Yet(_)) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// One attempt of [`take_back`](Self::take_back), under the handler role. Returns the
    /// copies of `peer`'s pages dropped, and how many of them were changed here.
    fn try_take_back(&self, buf: &Buffer, peer: Node) -> Result<(u64, u64), NotNow> {
        if self.driver.ch.peer_alive(peer) {
            return Err(NotNow::Yet(format!(
                "node {peer} is still alive here (its death not noticed yet)"
            )));
        }
        let role = self.driver.role.lock();
        let drained = self.driver.dead_drained.load(Ordering::Acquire);
        if !role.handled(peer) || drained & bit(peer) == 0 {
            return Err(NotNow::Yet(format!(
                "node {peer}'s death is not handled here yet (fenced, its messages applied)"
            )));
        }
        if self.leases.valid(peer) {
            return Err(NotNow::Yet(format!(
                "this node's lease on node {peer}'s pages has not run out yet"
            )));
        }
        // First look, change nothing: every page must be ready.
        for shard in self.pages.shards.iter() {
            for (&pid, ps) in shard.lock().iter() {
                self.ready_for_rejoin(pid, ps, peer)?;
            }
        }
        // Then drop every copy of its pages; forget it as a grant's source. (A page that is
        // not ready after all stops the attempt; what was dropped so far is gone for good.)
        let (mut dropped, mut changed) = (0, 0);
        for shard in self.pages.shards.iter() {
            let mut shard = shard.lock();
            let mut gone = Vec::new();
            let mut stopped = None;
            for (&pid, ps) in shard.iter_mut() {
                if pid.node() != peer {
                    ps.dir.forget_source(peer);
                    continue;
                }
                if let Err(e) = self.ready_for_rejoin(pid, ps, peer) {
                    stopped = Some(e);
                    break;
                }
                if let Some(idx) = buf.resident_frame(pid) {
                    // the copy's frame, or one a lost copy left for the provider to free
                    let Some(h) = buf.try_hold(idx, pid) else {
                        stopped = Some(NotNow::Yet(format!(
                            "this node's frame of node {peer}'s page {pid} is in use"
                        )));
                        break;
                    };
                    if ps.copy.data == Some(idx) {
                        dropped += 1;
                        if h.frame().is_dirty() || ps.copy.dirty {
                            // its changes are in our log: kept until the restarted node
                            // answers a fence (after its recovery has read them), and carried
                            // over if it dies again first
                            changed += 1;
                            self.note_kept_for(peer, pid);
                        }
                    }
                    h.drop_page();
                }
                // a worker parked on the page looks again (and finds it unknown here)
                Self::wake(ps);
                gone.push(pid);
            }
            for pid in gone {
                shard.remove(&pid);
            }
            if let Some(e) = stopped {
                return Err(e);
            }
        }
        // The pages noted for the old incarnation: dropped once the new one answers a fence
        // (its recovery is done by then), carried over meanwhile if it dies again.
        self.renote_for_rejoin(peer);
        // Every change this node made to the dropped copies is durable before the restarted
        // node's recovery reads this log.
        if let Some(log) = self.log() {
            log.flush_to(log.tail()).map_err(|e| {
                NotNow::Yet(format!(
                    "making this node's log durable for node {peer}'s recovery: {e}"
                ))
            })?;
        }
        // Its recovery reads this log from its start: none of our checkpoints moves that
        // start until it is done.
        self.hold_checkpoints_for(peer);
        self.leases.forget(peer);
        self.barrier.forget(peer);
        self.room_of(peer, 0);
        self.driver.ch.reset_peer(peer);
        drop(role);
        Ok((dropped, changed))
    }

    /// Whether `pid`'s state lets `peer`'s old incarnation go (see [`take_back`]).
    fn ready_for_rejoin(&self, pid: Pid, ps: &super::PageState, peer: Node) -> Result<(), NotNow> {
        let me = self.me;
        if pid.node() == peer {
            // a copy of its page: dropped, unless something is still in flight about it
            if ps.lost.is_none() && ps.busy() {
                return Err(NotNow::Yet(format!(
                    "node {peer}'s page {pid} is still in flight here"
                )));
            }
            return Ok(());
        }
        // lost: marked so here, or (at the home) still held by the dead node, with no reclaim
        // from a live source in progress
        let held_by_it = pid.node() == me
            && ps.dir.holders == Holders::Exclusive(peer)
            && ps.dir.reclaiming.is_none()
            && ps.dir.reclaiming_for.is_none();
        if ps.lost == Some(peer) || held_by_it {
            let then = if self.log().is_some() {
                "its newest changes are in that node's log: a restarted node cannot rejoin a \
                 running cluster while such a page is lost (stop every node and start the \
                 cluster again; every committed change is recovered then)"
            } else {
                "without a log its changes there are gone: a restarted node cannot rejoin a \
                 running cluster while such a page is lost (stop every node and start the \
                 cluster again; the page's stored version is served then)"
            };
            return Err(NotNow::Never(format!(
                "page {pid} was lost with node {peer} when it died, and {then}"
            )));
        }
        let from_it = |n: &super::Note| n.from == peer;
        if ps.held.iter().any(from_it) || ps.dir_deferred.iter().any(from_it) {
            return Err(NotNow::Yet(format!(
                "a message of node {peer}'s old incarnation about page {pid} waits here"
            )));
        }
        let waits_on_it = ps.copy.pending != Pending::Idle
            && (ps.page_from == Some(peer) || ps.asked_after == Some(peer));
        if ps.copy.deferred.iter().any(|d| d.involves(peer)) || waits_on_it {
            return Err(NotNow::Yet(format!(
                "this node's copy of page {pid} still waits on node {peer}'s old incarnation"
            )));
        }
        if pid.node() == me && ps.dir.counts_on(peer) {
            return Err(NotNow::Yet(format!(
                "the directory entry of page {pid} still counts on node {peer}'s old \
                 incarnation"
            )));
        }
        Ok(())
    }
}
