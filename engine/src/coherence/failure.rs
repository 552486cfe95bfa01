//! Dead nodes: pages whose only current copy died with a node are lost (every later access,
//! on every node, fails naming the node), requests that need a dead node are refused, and
//! waits on a dead node end.

use super::possession::{Deferred, Pending};
use super::protocol::{bit, members, Msg, Node, NodeSet};
use super::wire::{Control, REFUSE_HOLDER_DEAD, REFUSE_NO_PAGE};
use super::{Coherence, PageState};
use crate::buffer::Buffer;
use crate::error::EngineError;
use crate::pid::Pid;
use std::sync::atomic::Ordering;

impl Coherence {
    /// The first of `nodes` (other than this one) that is dead.
    pub(super) fn first_dead(&self, nodes: impl Iterator<Item = Node>) -> Option<Node> {
        nodes
            .filter(|&n| n != self.me)
            .find(|&n| !self.driver.ch.peer_alive(n))
    }

    /// A granted request waits for a node that died (the page's sender, or a sharer that must
    /// acknowledge an invalidation). Not the sharer a forwarded read was pointed at: the read
    /// is asked for again once that sharer's fence holds (`after_fence`).
    ///
    /// Nor the previous holder an exclusive grant named as source: the page is asked for
    /// again too, and the home decides (it may reclaim the page from the holder before it,
    /// `DirEntry::reclaim`). A copy that asked again and holds a hand-over it never got loses
    /// the page with the node it asked after (`PageCopy::stuck_asking_again`).
    ///
    /// Nor a sharer whose invalidation ack is due: once its fence holds it can use its copy no
    /// more (as the home forgets it as a sharer then), and its ack counts as given
    /// (`after_fence`). Before, the upgrade that waited for it lost the page.
    pub(super) fn dead_source(&self, ps: &PageState) -> Option<Node> {
        if ps.copy.stuck_asking_again() {
            if let Some(n) = ps.asked_after {
                return Some(n);
            }
        }
        let Pending::Completing { awaiting_page, .. } = ps.copy.pending else {
            return None;
        };
        let from = ps
            .page_from
            .filter(|_| awaiting_page && !ps.copy.awaits_handed_page());
        self.first_dead(from.into_iter())
    }

    /// The node that was to hand `pid` over (the sharer a forwarded read was pointed at, or
    /// the previous exclusive holder) is fenced with every message it sent handled, and its
    /// page never came: ask the home again, or (something was forwarded on to us meanwhile)
    /// lose the page as for any dead source.
    fn ask_again(&self, buf: &Buffer, pid: Pid, ps: &mut PageState, dead: Node) {
        if ps.lost.is_some() {
            // lost here meanwhile (at its home, by another node's report): nothing to ask
            // for; the copy ends and what waits behind it is answered
            self.lose(buf, pid, ps, dead);
            return;
        }
        let Some(out) = ps.copy.ask_again() else {
            self.lose(buf, pid, ps, dead);
            return;
        };
        if pid.node() == self.me {
            ps.dir.own_read_lost(self.me);
        }
        log::warn!(
            "node {}: {pid}: node {dead} died before handing the page over; asking again",
            self.me
        );
        ps.page_from = None;
        ps.asked_after = Some(dead);
        self.driver
            .counters
            .reads_asked_again
            .fetch_add(1, Ordering::Relaxed);
        for (to, msg) in out {
            let request = matches!(msg, Msg::Request { .. });
            if let Err(e) = self.send(to, pid, &msg, None) {
                log::warn!("node {}: {pid}: {e}", self.me);
                if request {
                    // the request never left: the waiting worker gets the error
                    self.request_over(pid, ps);
                    ps.error = Some(e);
                }
            }
        }
    }

    /// This node's request for `pid` never reached the home, or the home refused it: the copy
    /// is idle again, and what arrived meanwhile is served by the handler's next `progress`.
    pub(super) fn request_over(&self, pid: Pid, ps: &mut PageState) {
        if let Err(e) = ps.copy.request_unsent() {
            log::error!("node {}: {pid}: {e}", self.me);
        }
        if !ps.copy.deferred.is_empty() {
            ps.serve_due = true;
            self.pages.retry_later(pid);
        }
    }

    /// The page's current copy died with `dead` before reaching us. Mark the page lost here,
    /// fail whoever waits for it from us (successors in its chain), and tell its home, which
    /// refuses it from now on. Losing updates silently is not an option: every later access,
    /// on every node, is an error naming the dead node.
    ///
    /// A page already marked lost (at its home, by another node's report) still has its
    /// copy here ended: an interaction in progress is over and what waits behind it is
    /// answered (found by the model with deaths: the home's own copy kept a successor's
    /// Transfer for ever).
    pub(super) fn lose(&self, buf: &Buffer, pid: Pid, ps: &mut PageState, dead: Node) {
        let first = ps.lost.is_none();
        if first {
            log::error!(
                "node {}: page {pid} is lost: its copy was at node {dead}, which died",
                self.me
            );
            ps.lost = Some(dead);
        }
        let dead = ps.lost.unwrap_or(dead);
        let (deferred, frame) = ps.copy.lose();
        if let Some(f) = frame {
            // No guard may use the frame again; the provider frees it (`prepare_evict`: a
            // lost page's frame that its copy no longer names). If a worker changed it (now,
            // or before), this node's log holds the only durable record of those changes:
            // checkpoints carry them over (`carry_for_dead`).
            buf.frame(f).revoke_possession();
            self.note_kept_for(dead, pid);
        }
        ps.waiter = false;
        ps.reserved = None;
        ps.serve_due = false;
        ps.error = Some(EngineError::HolderDead { pid, holder: dead });
        for d in deferred {
            self.answer_lost(pid, dead, d);
        }
        if !first {
        } else if pid.node() == self.me {
            // our own page: requests its directory deferred (for a copy-back from this very
            // copy) are refused now, not left waiting (found by the model with deaths); if
            // the directory names this node the holder, the page died with `dead`
            ps.dir.died_with(self.me, dead);
            self.mark_lost_home(pid, ps, dead);
        } else if self.driver.ch.peer_alive(pid.node()) {
            self.send_control(
                pid.node(),
                &Control::Lost {
                    pid: pid.raw(),
                    node: dead,
                },
            );
        }
    }

    /// Answer a message for a lost page: a hand-over request is refused, an invalidation
    /// acknowledged (we hold no copy).
    pub(super) fn answer_lost(&self, pid: Pid, dead: Node, d: Deferred) {
        match d {
            Deferred::Transfer { to, .. } if to != self.me => {
                self.send_refusal(to, pid, REFUSE_HOLDER_DEAD, dead)
            }
            Deferred::Invalidate { from, .. } if from != self.me => {
                if let Err(e) = self.send(from, pid, &Msg::<()>::InvalidateAck, None) {
                    log::warn!("node {}: {e}", self.me);
                }
            }
            Deferred::Reclaim { .. } if pid.node() != self.me => {
                if let Err(e) = self.send(pid.node(), pid, &Msg::<()>::Gone, None) {
                    log::warn!("node {}: {e}", self.me);
                }
            }
            _ => {}
        }
    }

    /// At the home: `pid` is lost with `dead`. Requests the directory deferred (for a
    /// copy-back that will never come) are refused now, as are all later ones.
    pub(super) fn mark_lost_home(&self, pid: Pid, ps: &mut PageState, dead: Node) {
        ps.lost = Some(dead);
        self.requeue_deferred(ps);
        if !ps.held.is_empty() {
            self.pages.retry_later(pid);
        }
    }

    /// After a peer died: every page whose granted request waits for it is lost; at the home,
    /// every page whose copy-back must come from it, too.
    pub(super) fn sweep_dead(&self, buf: &Buffer) {
        for shard in self.pages.shards.iter() {
            let mut shard = shard.lock();
            for (&pid, ps) in shard.iter_mut() {
                if let Some(dead) = self.dead_source(ps) {
                    self.lose(buf, pid, ps, dead);
                }
                let home = pid.node();
                if home != self.me
                    && !self.driver.ch.peer_alive(home)
                    && ps.copy.pending != Pending::Idle
                {
                    // an interaction with the dead home (a request, an eviction notice) never
                    // ends: the page is lost here, what waits behind it is answered, and the
                    // provider frees the frame (found by the model with deaths: an eviction
                    // notice to a dead home kept its frame and a successor's Transfer forever)
                    self.lose(buf, pid, ps, home);
                }
                Self::wake(ps);
                if let Some(n) = ps.dir.offered {
                    // a node cut off but running may have taken the page in and be reading
                    // it: only once its lease has run out (else `after_fence`)
                    if pid.node() == self.me
                        && !self.driver.ch.peer_alive(n)
                        && self.leases.fence_holds(n)
                    {
                        self.offer_unanswered(pid, ps, n);
                    }
                }
                if let Some(n) = ps.dir.awaiting_copy_back {
                    // a sharer serving a forwarded read owes no data: the home waits for its
                    // fence instead (`after_fence`)
                    if pid.node() == self.me
                        && ps.lost.is_none()
                        && !self.driver.ch.peer_alive(n)
                        && !ps.dir.awaits_serving_sharer(n)
                    {
                        log::error!("node {}: page {pid} is lost: its copy-back was due from node {n}, which died", self.me);
                        self.mark_lost_home(pid, ps, n);
                    }
                }
            }
        }
        self.waiting.notify();
    }

    /// The fence now holds for the dead nodes in `nodes` (`lease.rs`): at this home, the
    /// offers to them that were left waiting at their death (`sweep_dead`) end as declined,
    /// they are forgotten as sharers, and the requests that waited for that are retried.
    pub(super) fn after_fence(&self, buf: &Buffer, nodes: NodeSet) {
        let (mut forgotten, mut offers, mut served, mut reclaims) = (0u64, 0u64, 0u64, 0u64);
        let mut acked = 0u64;
        for shard in self.pages.shards.iter() {
            let mut shard = shard.lock();
            for (&pid, ps) in shard.iter_mut() {
                if let Pending::Completing { acks, .. } = ps.copy.pending {
                    // a fenced sharer's invalidation ack counts as given: applied as if it
                    // had arrived (every message it sent is handled: `dead_drained`)
                    for n in members(acks & nodes) {
                        ps.held.push_back(super::Note {
                            from: n,
                            msg: Msg::InvalidateAck,
                            logged: super::Receipt::Nothing,
                        });
                        acked += 1;
                        self.pages.retry_later(pid);
                    }
                }
                if let Some(n) = ps.page_from {
                    if nodes & bit(n) != 0 && ps.copy.awaits_handed_page() {
                        self.ask_again(buf, pid, ps, n);
                        Self::wake(ps);
                    }
                }
                if pid.node() != self.me {
                    continue;
                }
                if ps.dir.forget_serving_sharer(nodes) {
                    served += 1;
                    self.requeue_deferred(ps);
                }
                let chained = ps.dir.chain.is_some();
                match ps.dir.reclaim(nodes) {
                    Some(r) => {
                        reclaims += 1;
                        self.send_reclaim(pid, ps, r);
                    }
                    // the chain led to a dead node too: a holder asking again finds the page
                    // lost now
                    None if chained && ps.dir.chain.is_none() => self.requeue_deferred(ps),
                    None => {}
                }
                if let Some(n) = ps.dir.offered {
                    if nodes & bit(n) != 0 {
                        self.offer_unanswered(pid, ps, n);
                        offers += 1;
                    }
                }
                if ps.dir.forget_sharers(nodes) {
                    forgotten += 1;
                    self.requeue_deferred(ps);
                }
                if ps.dir.forget_settling(nodes) {
                    // (a node listed at a bring-back died before it answered `Found`)
                    self.requeue_deferred(ps);
                }
                if !ps.held.is_empty() {
                    self.pages.retry_later(pid);
                }
                Self::wake(ps);
            }
        }
        let counters = &self.driver.counters;
        counters
            .dead_sharers_forgotten
            .fetch_add(forgotten, Ordering::Relaxed);
        counters
            .dead_servers_forgotten
            .fetch_add(served, Ordering::Relaxed);
        counters
            .grants_reclaimed
            .fetch_add(reclaims, Ordering::Relaxed);
        counters
            .fences_held
            .fetch_add(u64::from(nodes.count_ones()), Ordering::Relaxed);
        counters.acks_of_fenced.fetch_add(acked, Ordering::Relaxed);
        log::warn!(
            "node {}: dead node(s) {:?} fenced (their leases on this node's pages ran out): \
             {forgotten} pages taken over from them as sharers, {served} forwarded reads they \
             were to serve ended, {reclaims} pages granted to them reclaimed from their \
             sources, {offers} offers to them ended, {acked} of their invalidation acks \
             counted as given",
            self.me,
            members(nodes).collect::<Vec<_>>()
        );
        self.waiting.notify();
    }

    /// At the home: ask `source` for the page of the grant of `epoch`, whose requester died
    /// (`DirEntry::reclaim`; the home's own copy when `source` is this node). If the message
    /// cannot leave, the source is gone too and so is the page.
    fn send_reclaim(&self, pid: Pid, ps: &mut PageState, r: super::directory::Reclaim) {
        let source = r.source;
        log::warn!(
            "node {}: {pid}: its requester {:?} died before taking it; reclaiming it from node {source}",
            self.me,
            ps.dir.reclaiming
        );
        let msg = Msg::Reclaim { epoch: r.epoch };
        if source == self.me {
            ps.held.push_back(super::Note {
                from: self.me,
                msg,
                logged: super::Receipt::Nothing,
            });
            self.pages.retry_later(pid);
        } else if let Err(e) = self.send(source, pid, &msg, None) {
            log::warn!(
                "node {}: {pid}: reclaiming from node {source}: {e}",
                self.me
            );
            match ps.dir.gone(source) {
                Some(g) => self.mark_lost_home(pid, ps, g),
                // through a chain: the live holder holds the page again
                None => self.requeue_deferred(ps),
            }
        }
    }

    /// Tell `to` its request for `pid` is refused (see [`refusal`]).
    pub(super) fn send_refusal(&self, to: Node, pid: Pid, code: u8, node: Node) {
        self.send_control(
            to,
            &Control::Refuse {
                pid: pid.raw(),
                code,
                node,
            },
        );
    }
}

/// The error a worker gets for a refused request (`by`: the refusing node).
pub(super) fn refusal(pid: Pid, code: u8, node: Node, by: Node) -> EngineError {
    match code {
        REFUSE_NO_PAGE => EngineError::NoSuchPage { pid },
        REFUSE_HOLDER_DEAD => EngineError::HolderDead { pid, holder: node },
        _ => EngineError::RemoteRead { pid, home: by },
    }
}
