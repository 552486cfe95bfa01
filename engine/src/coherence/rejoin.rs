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
//! Pages of this home lost with the old incarnation (it held them, or they were on their way
//! from it) are brought back here ([`Coherence::bring_back`]): the restarted node holds its
//! data directory's lock, so the old process is gone and its log is final, and its recovery
//! has not begun (it waits for every live node's welcome), so its log is as the crash left
//! it. Their newest durable versions are in the cluster's logs (the dead node's, and the
//! senders' records if its receipt image was not durable: `logged.rs`): this home merges
//! every node's log for them over its store's copy, as a recovery would, writes the result
//! to its store and serves the pages again, telling the others (`Control::Found`: a copy
//! that lost the page forgets the loss). Only where the directory entry allows it
//! (`DirEntry::brought_back`); the others stay lost until the whole cluster restarts. The
//! rules were found with the model check's restarts (docs/protocol.md, "The model check
//! restarts dead nodes"), which also states what it assumes and the engine does not check.
//!
//! Refused: a lost page without a log (its changes are gone; only a whole-cluster restart,
//! which serves the stored version, brings it back), or whose logs cannot be read whole (a
//! log this node cannot read, named in the error, or a chain with a gap): the restarted
//! node's start fails with this reason, and the pages stay lost.

use super::directory::{Holders, Holds};
use super::possession::Pending;
use super::protocol::{bit, Node};
use super::wire::Control;
use super::{Coherence, PageState};
use crate::buffer::Buffer;
use crate::pid::Pid;
use std::collections::HashSet;
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
        let start = Instant::now();
        let deadline = start + self.waiting.timeout;
        let mut told = Duration::ZERO;
        loop {
            // (the others are asked only once this node is ready itself: each question costs
            // them a pass over their pages)
            let handled = self.death_handled(&self.driver.role.lock(), peer);
            let attempt = handled
                .and_then(|()| self.others_settled(peer))
                .and_then(|()| self.try_take_back(buf, peer));
            match attempt {
                Ok(back) => {
                    let brought = self.bring_back(buf, peer, &back.lost)?;
                    let counted = self.census(buf, peer, &back.kept)?;
                    self.settles.took_back(peer);
                    let c = &self.driver.counters;
                    c.rejoins.fetch_add(1, Ordering::Relaxed);
                    let took = start.elapsed();
                    c.longest_take_back_ms
                        .fetch_max(took.as_millis() as u64, Ordering::Relaxed);
                    log::warn!(
                        "node {}: took restarted node {peer} back in {} ms: {} copies of its pages \
                         dropped here ({} of them changed: their changes are in this node's \
                         log, which its recovery reads); {} pages of this node lost with it \
                         brought back from the logs ({brought} of them newer than the store's \
                         copy); of {} more whose directory entries name other nodes, {} served \
                         again after the live nodes said what they hold of them ({} found held \
                         by one), {} kept lost",
                        self.me,
                        took.as_millis(),
                        back.dropped,
                        back.changed,
                        back.lost.len(),
                        back.kept.len(),
                        counted.served,
                        counted.held,
                        back.kept.len() as u64 - counted.served,
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
                Err(NotNow::Yet(why)) => {
                    // a long wait says what it waits for (once a second at most)
                    if start.elapsed() >= told + Duration::from_secs(1) {
                        told = start.elapsed();
                        log::warn!(
                            "node {}: restarted node {peer} waits {} ms to be taken back: {why}",
                            self.me,
                            told.as_millis()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(20))
                }
            }
        }
    }

    /// One attempt of [`take_back`](Self::take_back), under the handler role: everything
    /// but bringing lost pages back.
    fn try_take_back(&self, buf: &Buffer, peer: Node) -> Result<TakenBack, NotNow> {
        let role = self.driver.role.lock();
        self.death_handled(&role, peer)?;
        // First look, change nothing: every page must be ready.
        for shard in self.pages.shards.iter() {
            for (&pid, ps) in shard.lock().iter() {
                self.ready_for_rejoin(pid, ps, peer)?;
            }
        }
        // Then drop every copy of its pages; forget it as a grant's source; keep this home's
        // pages lost with it lost (their frames dropped) and collect those that can be
        // brought back. (A page that is not ready after all stops the attempt; what was
        // dropped so far is gone for good.)
        let mut back = TakenBack::default();
        let live = self.live_nodes();
        for shard in self.pages.shards.iter() {
            let mut shard = shard.lock();
            let mut gone = Vec::new();
            let mut stopped = None;
            for (&pid, ps) in shard.iter_mut() {
                if let Err(e) = self.ready_for_rejoin(pid, ps, peer) {
                    stopped = Some(e);
                    break;
                }
                if pid.node() != peer {
                    ps.dir.forget_source(peer);
                }
                if pid.node() == self.me && lost_with(ps, peer, self.me, pid) {
                    if let Err(e) = self.keep_lost(buf, pid, ps, peer) {
                        stopped = Some(e);
                        break;
                    }
                    if ps
                        .dir
                        .brought_back(peer, self.me, self.nodes, live)
                        .is_some()
                    {
                        back.lost.push(pid);
                    } else {
                        // asked about (`census`)
                        back.kept.push(pid);
                    }
                    continue;
                }
                if pid.node() != peer {
                    // (`asked_unsent_after`.) A copy lost with it elsewhere stays so until its
                    // home says it brought it back (`Control::Found`, after any stale message
                    // of the home about it, which the loss absorbs).
                    if asked_unsent_after(ps, peer) {
                        self.lose(buf, pid, ps, peer);
                    }
                    continue;
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
                        back.dropped += 1;
                        if h.frame().is_dirty() || ps.copy.dirty {
                            // its changes are in our log: kept until the restarted node
                            // answers a fence (after its recovery has read them), and carried
                            // over if it dies again first
                            back.changed += 1;
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
        Ok(back)
    }

    /// Whether `peer`'s old incarnation's death is handled here (`role`: the handler role,
    /// held): noticed, fenced, everything it sent applied, this node's lease from it run out.
    fn death_handled(&self, role: &super::handler::Role, peer: Node) -> Result<(), NotNow> {
        if self.driver.ch.peer_alive(peer) {
            return Err(NotNow::Yet(format!(
                "node {peer} is still alive here (its death not noticed yet)"
            )));
        }
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
        Ok(())
    }

    /// In [`try_take_back`](Self::try_take_back): this home's page `pid` is lost with
    /// `peer` (marked so, or still held by it): it stays lost (marked so now, if it was not),
    /// this node's own copy ends what it was doing (`lose` again: a request of its own that
    /// the directory dropped when it marked the page lost would wait for ever once the page
    /// is back; found by the model check), and this node's frame of it, a stale copy or one
    /// the loss revoked, leaves the buffer, so that only the version brought back from the
    /// logs is served.
    fn keep_lost(
        &self,
        buf: &Buffer,
        pid: Pid,
        ps: &mut PageState,
        peer: Node,
    ) -> Result<(), NotNow> {
        self.lose(buf, pid, ps, peer);
        if let Some(idx) = buf.resident_frame(pid) {
            let Some(h) = buf.try_hold(idx, pid) else {
                return Err(NotNow::Yet(format!(
                    "this node's frame of its page {pid}, lost with node {peer}, is in use"
                )));
            };
            h.drop_page();
        }
        Ok(())
    }

    /// Bring back this home's pages `lost` with restarted node `peer` (see the module doc):
    /// merge every node's log for them, write what is newer than the store's copy, then serve
    /// them again (the entry `DirEntry::brought_back` makes; `Found` to the others). Returns
    /// how many pages were newer in the logs. An error refuses the restarted node; the pages
    /// stay lost.
    fn bring_back(&self, buf: &Buffer, peer: Node, lost: &[Pid]) -> Result<u64, String> {
        if lost.is_empty() {
            return Ok(0);
        }
        let pids: HashSet<u64> = lost.iter().map(|p| p.raw()).collect();
        let written = buf.store().recover_pages(self.logs(), &pids).map_err(|e| {
            format!(
                "node {}: bringing back {} pages lost with node {peer} from the cluster's \
                     logs failed: {e} (they stay unavailable; stop every node and start the \
                     cluster again once the logs are whole)",
                self.me,
                lost.len()
            )
        })?;
        let _role = self.driver.role.lock();
        let live = self.live_nodes();
        for &pid in lost {
            let mut shard = self.pages.shard(pid).lock();
            let Some(ps) = shard.get_mut(&pid) else {
                continue;
            };
            // only this function clears the mark at the home, under the handler role
            assert_eq!(
                ps.lost,
                Some(peer),
                "{pid}: lost with node {peer} until brought back"
            );
            let Some(entry) = ps.dir.brought_back(peer, self.me, self.nodes, live) else {
                continue;
            };
            self.serve_again(pid, ps, entry);
            drop(shard);
            self.tell_found(pid, peer);
        }
        self.driver
            .counters
            .pages_brought_back
            .fetch_add(lost.len() as u64, Ordering::Relaxed);
        for (pid, version) in &written {
            log::warn!(
                "node {}: page {} (lost with node {peer}) brought back from the logs at \
                 version {version}",
                self.me,
                Pid(*pid)
            );
        }
        Ok(written.len() as u64)
    }

    /// This home's page `pid`, lost, is served again with directory entry `entry` (under the
    /// handler role and the page's shard lock): what waited for it goes on.
    fn serve_again(&self, pid: Pid, ps: &mut PageState, entry: super::directory::DirEntry) {
        ps.dir = entry;
        ps.lost = None;
        ps.error = None;
        ps.page_from = None;
        ps.asked_after = None;
        ps.census = None;
        // a home read in flight is of the store's old version
        ps.home_gen += 1;
        ps.store_copy = super::StoreCopy::None;
        // this node's own copy ended with the loss (`keep_lost`): a request of its own
        // still queued is void (found by the model check: a grant to a copy that no
        // longer asked)
        let me = self.me;
        ps.held.retain(|n| n.from != me);
        ps.dir_deferred.retain(|n| n.from != me);
        self.requeue_deferred(ps);
        if !ps.held.is_empty() {
            self.pages.retry_later(pid);
        }
        Self::wake(ps);
    }

    /// The census of `pid` is over, the page still lost: the messages held for it go on.
    fn end_census(&self, pid: Pid, ps: &mut PageState) {
        ps.census = None;
        if !ps.held.is_empty() {
            self.pages.retry_later(pid);
        }
    }

    /// Tell the live nodes but restarted `peer` that this home's page `pid` is served again:
    /// a copy that lost it forgets the loss (`Control::Found`).
    fn tell_found(&self, pid: Pid, peer: Node) {
        for n in (0..self.nodes).filter(|&n| n != self.me && n != peer) {
            if self.driver.ch.peer_alive(n) {
                self.send_control(n, &Control::Found { pid: pid.raw() });
            }
        }
    }

    /// The census of this home's pages `kept` lost with restarted node `peer` that their
    /// directory entries cannot bring back (`DirEntry::brought_back`): every other node is
    /// asked what it holds of each (`Control::Ask`); messages for them wait here meanwhile
    /// (`apply`). Once every answer is in (at most [`CENSUS_WAIT`]), `DirEntry::counted`
    /// decides: a page an idle live node holds exclusively is served from there; one no live
    /// node holds exclusively is brought back from the logs (as `bring_back`), shared by the
    /// idle sharers. A page some node is busy with, or that is not answered for in time,
    /// stays lost (a restart of the whole cluster brings it back). Only while every node but
    /// `peer` is alive here (a dead one may hold a page). An error refuses the restarted
    /// node (the logs could not be read).
    fn census(&self, buf: &Buffer, peer: Node, kept: &[Pid]) -> Result<Censused, String> {
        let mut done = Censused::default();
        let others: Vec<Node> = (0..self.nodes)
            .filter(|&n| n != self.me && n != peer)
            .collect();
        let stays = |pid: Pid, why: &str| {
            log::warn!(
                "node {}: page {pid}, lost with node {peer}, stays lost: {why}; a restart of \
                 the whole cluster brings it back from the logs",
                self.me
            )
        };
        if kept.is_empty() {
            return Ok(done);
        }
        if let Some(d) = others.iter().find(|&&n| !self.driver.ch.peer_alive(n)) {
            for &pid in kept {
                stays(pid, &format!("node {d} is dead too, and may hold it"));
            }
            return Ok(done);
        }
        // 1. Messages for the pages wait here from now on; each other node is asked.
        {
            let _role = self.driver.role.lock();
            for &pid in kept {
                if let Some(ps) = self.pages.shard(pid).lock().get_mut(&pid) {
                    if ps.lost == Some(peer) {
                        ps.census = Some(Vec::new());
                    }
                }
            }
        }
        for &pid in kept {
            for &n in &others {
                self.send_control(n, &Control::Ask { pid: pid.raw() });
            }
        }
        // 2. The answers (applied by the handler: `on_has`).
        let all_in = |a: &[(Node, Holds)]| others.iter().all(|&n| a.iter().any(|&(m, _)| m == n));
        let answered = |pid: Pid| {
            let shard = self.pages.shard(pid).lock();
            shard
                .get(&pid)
                .and_then(|ps| ps.census.as_deref())
                .is_none_or(&all_in)
        };
        let deadline = Instant::now() + CENSUS_WAIT.min(self.waiting.timeout);
        while !kept.iter().all(|&pid| answered(pid)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        // 3. What the answers say; the pages stay held while their logs are read.
        let mut decided = Vec::new();
        {
            let _role = self.driver.role.lock();
            for &pid in kept {
                let mut shard = self.pages.shard(pid).lock();
                let Some(ps) = shard.get_mut(&pid) else {
                    continue;
                };
                let Some(mut answers) = ps.census.take() else {
                    continue;
                };
                let all = all_in(&answers);
                // this node's own copy ended with the loss (`keep_lost`)
                answers.push((self.me, ps.copy.holds()));
                let counted = (all && ps.lost == Some(peer))
                    .then(|| ps.dir.counted(&answers))
                    .flatten();
                match counted {
                    Some(c) => {
                        decided.push((pid, c, ps.dir));
                        ps.census = Some(answers);
                    }
                    None => {
                        stays(
                            pid,
                            &format!(
                                "the live nodes' answers ({answers:?}, all in: {all}) do not say \
                                 where it is; its directory entry is {:?}",
                                ps.dir
                            ),
                        );
                        self.end_census(pid, ps);
                    }
                }
            }
        }
        let from_logs: HashSet<u64> = decided
            .iter()
            .filter(|(_, c, _)| c.from_logs)
            .map(|(pid, _, _)| pid.raw())
            .collect();
        let written = if from_logs.is_empty() {
            Ok(Vec::new())
        } else {
            buf.store().recover_pages(self.logs(), &from_logs)
        };
        // 4. Served again, unless something changed meanwhile.
        let _role = self.driver.role.lock();
        for (pid, c, before) in decided {
            let mut shard = self.pages.shard(pid).lock();
            let Some(ps) = shard.get_mut(&pid) else {
                continue;
            };
            let unchanged = ps.lost == Some(peer) && ps.dir == before;
            if !unchanged || (c.from_logs && written.is_err()) {
                self.end_census(pid, ps);
                stays(
                    pid,
                    "its state changed during the census, or the logs failed",
                );
                continue;
            }
            log::warn!(
                "node {}: page {pid} (lost with node {peer}) served again after a census: {}",
                self.me,
                if c.from_logs {
                    format!("brought back from the logs, held by {:?}", c.entry.holders)
                } else {
                    format!("held by {:?}, whose copy is the newest", c.entry.holders)
                }
            );
            self.serve_again(pid, ps, c.entry);
            drop(shard);
            self.tell_found(pid, peer);
            done.served += 1;
            done.held += u64::from(!c.from_logs);
        }
        self.driver
            .counters
            .pages_censused
            .fetch_add(done.served, Ordering::Relaxed);
        written.map_err(|e| {
            format!(
                "node {}: bringing back pages lost with node {peer} from the cluster's logs \
                 failed: {e} (they stay unavailable; stop every node and start the cluster \
                 again once the logs are whole)",
                self.me
            )
        })?;
        Ok(done)
    }

    /// Node `from` asks what this node holds of `pid` (the census of its home, `census`):
    /// busy while a message about it waits here, else what the copy says
    /// (`PageCopy::holds`). Every message the home sent before is here by now (one
    /// connection keeps the order).
    pub(super) fn on_ask(&self, from: Node, pid: Pid) {
        if pid.node() != from {
            log::error!(
                "node {}: node {from} asks what this node holds of page {pid}, which only its \
                 home may ask; ignored",
                self.me
            );
            return;
        }
        let holds = match self.pages.shard(pid).lock().get(&pid) {
            None => Holds::Nothing,
            Some(ps) if !ps.held.is_empty() || ps.serve_due => Holds::Busy,
            Some(ps) => ps.copy.holds(),
        };
        self.send_control(
            from,
            &Control::Has {
                pid: pid.raw(),
                holds: super::wire::holds_code(holds),
            },
        );
    }

    /// Node `from` answered this home's census of `pid` (`census`).
    pub(super) fn on_has(&self, from: Node, pid: Pid, holds: u8) {
        let Some(holds) = super::wire::holds_of(holds) else {
            return; // (decoding refuses such codes)
        };
        if pid.node() != self.me {
            return;
        }
        if let Some(a) = self
            .pages
            .shard(pid)
            .lock()
            .get_mut(&pid)
            .and_then(|ps| ps.census.as_mut())
        {
            a.retain(|&(n, _)| n != from);
            a.push((from, holds));
        }
    }

    /// Before taking restarted `peer` back: every other live node has handled its old
    /// incarnation's death as far as this node's pages go (`Control::Settle`). A node that
    /// lost one of them with `peer` reports it (`Lost`, or a request asking again) before it
    /// answers, so the loss is seen here before the take-back decides what to bring back:
    /// without this a report that came after the take-back left the page lost for good (1 in
    /// 150 kills of the process test).
    fn others_settled(&self, peer: Node) -> Result<(), NotNow> {
        let others: Vec<Node> = (0..self.nodes)
            .filter(|&n| n != self.me && n != peer && self.driver.ch.peer_alive(n))
            .collect();
        if others.is_empty() {
            return Ok(());
        }
        let seq = self.settles.next();
        for &n in &others {
            self.send_control(n, &Control::Settle { node: peer, seq });
        }
        let deadline = Instant::now() + SETTLE_WAIT;
        loop {
            let answers: Vec<(Node, Option<bool>)> = others
                .iter()
                .map(|&n| (n, self.settles.answer(n, peer, seq)))
                .collect();
            if let Some(&(n, _)) = answers.iter().find(|(_, a)| *a == Some(false)) {
                return Err(NotNow::Yet(format!(
                    "node {n} still handles node {peer}'s death for this node's pages"
                )));
            }
            if answers.iter().all(|(_, a)| a.is_some()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let silent: Vec<Node> = answers
                    .iter()
                    .filter(|(_, a)| a.is_none())
                    .map(|&(n, _)| n)
                    .collect();
                return Err(NotNow::Yet(format!(
                    "no answer yet from node(s) {silent:?} on whether they handled node \
                     {peer}'s death"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Node `from` asks whether this node has handled restarted node `node`'s old
    /// incarnation's death as far as `from`'s pages go (`others_settled`): noticed, fenced,
    /// everything it sent applied, and no copy of `from`'s pages waiting on it or holding a
    /// message of it. A copy that asked again after `node` died and whose request did not
    /// leave is lost now (what `from` decides once it forgets `node` as the grant's source;
    /// the take-back here does the same), and its `Lost` report leaves before the answer.
    pub(super) fn on_settle(&self, buf: &Buffer, from: Node, node: Node, seq: u64) {
        // alive here again: taken back already, which saw to all of this (a node that took it
        // back first answered "not done" here, and the other's take-back waited in vain:
        // seen in 4 of 12 runs of the single-rejoin process test beside a busy loop)
        let taken_back = self.driver.ch.peer_alive(node) && self.settles.took(node);
        let done = taken_back
            || node < self.nodes
                && node != self.me
                && !self.driver.ch.peer_alive(node)
                && self.driver.dead_drained.load(Ordering::Acquire) & bit(node) != 0
                && self.leases.fence_holds(node)
                && self.pages.shards.iter().all(|shard| {
                    let mut shard = shard.lock();
                    shard
                        .iter_mut()
                        .filter(|(pid, _)| pid.node() == from)
                        .all(|(&pid, ps)| {
                            if asked_unsent_after(ps, node) {
                                self.lose(buf, pid, ps, node);
                            }
                            !waits_on(ps, node) && !ps.held.iter().any(|n| n.from == node)
                        })
                });
        self.send_control(
            from,
            &Control::Settled {
                node,
                seq,
                done: u8::from(done),
            },
        );
    }

    /// Whether `pid`'s state lets `peer`'s old incarnation go (see [`take_back`]).
    fn ready_for_rejoin(&self, pid: Pid, ps: &PageState, peer: Node) -> Result<(), NotNow> {
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
        // (a grant that arrived naming it, as the page's source or a sharer to invalidate,
        // would send its new incarnation a message about the old one's copy; one still on
        // its way is not seen here: docs/protocol.md, "The model check restarts dead nodes")
        let from_it = |n: &super::Note| {
            n.from == peer
                || matches!(&n.msg, super::protocol::Msg::Grant(g)
                    if g.source == Some(peer) || g.invalidate & bit(peer) != 0)
        };
        if ps.held.iter().any(from_it) || ps.dir_deferred.iter().any(from_it) {
            return Err(NotNow::Yet(format!(
                "a message of node {peer}'s old incarnation about page {pid} waits here"
            )));
        }
        if pid.node() == me && lost_with(ps, peer, me, pid) {
            if self.log().is_none() {
                return Err(NotNow::Never(format!(
                    "page {pid} was lost with node {peer} when it died, and without a log its \
                     changes there are gone: a restarted node cannot rejoin a running cluster \
                     while such a page is lost (stop every node and start the cluster again; \
                     the page's stored version is served then)"
                )));
            }
            // brought back from the logs (`bring_back`)
            return Ok(());
        }
        if waits_on(ps, peer) {
            return Err(NotNow::Yet(format!(
                "this node's copy of page {pid} still waits on node {peer}'s old incarnation"
            )));
        }
        if pid.node() == me && ps.dir.counts_on(peer) {
            return Err(NotNow::Yet(format!(
                "the directory entry of page {pid} still counts on node {peer}'s old \
                 incarnation ({:?})",
                ps.dir
            )));
        }
        Ok(())
    }
}

impl Coherence {
    /// The nodes this node does not see dead (itself included).
    fn live_nodes(&self) -> super::protocol::NodeSet {
        (0..self.nodes)
            .filter(|&n| n == self.me || self.driver.ch.peer_alive(n))
            .fold(0, |m, n| m | bit(n))
    }
}

/// What [`Coherence::try_take_back`] did.
#[derive(Default)]
struct TakenBack {
    /// Copies of the restarted node's pages dropped here.
    dropped: u64,
    /// Of those, copies changed here (their changes are in this node's log).
    changed: u64,
    /// This home's pages lost with the old incarnation, to bring back.
    lost: Vec<Pid>,
    /// This home's pages lost with it that their entries cannot bring back
    /// (`DirEntry::brought_back`): the census asks the live nodes about them.
    kept: Vec<Pid>,
}

/// The answers to this node's `Control::Settle` questions: per (answering node, restarted
/// node), the newest question's number answered and whether it said done.
#[derive(Default)]
pub(super) struct Settles {
    seq: std::sync::atomic::AtomicU64,
    /// Bit n: this node took restarted node n back and has not seen it die since (its
    /// answer to a `Settle` about n is then "done": the take-back saw to it).
    taken_back: std::sync::atomic::AtomicU64,
    answers: parking_lot::Mutex<std::collections::HashMap<(Node, Node), (u64, bool)>>,
}

impl Settles {
    /// This node took restarted `n` back (in `take_back`, before it counts as alive here).
    fn took_back(&self, n: Node) {
        self.taken_back.fetch_or(bit(n), Ordering::AcqRel);
    }

    /// The handler saw the nodes in `dead` die.
    pub(super) fn died(&self, dead: super::protocol::NodeSet) {
        self.taken_back.fetch_and(!dead, Ordering::AcqRel);
    }

    fn took(&self, n: Node) -> bool {
        self.taken_back.load(Ordering::Acquire) & bit(n) != 0
    }

    /// A new question's number.
    fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// `from` answered question `seq` about restarted node `node`.
    pub(super) fn answered(&self, from: Node, node: Node, seq: u64, done: u8) {
        let mut a = self.answers.lock();
        let e = a.entry((from, node)).or_insert((0, false));
        if seq >= e.0 {
            *e = (seq, done == 1);
        }
    }

    /// What `from` answered to question `seq` (or a later one) about `node`, if it has.
    fn answer(&self, from: Node, node: Node, seq: u64) -> Option<bool> {
        let a = self.answers.lock();
        a.get(&(from, node))
            .filter(|&&(s, _)| s >= seq)
            .map(|&(_, done)| done)
    }
}

/// How long one round of `Control::Settle` questions waits for its answers.
const SETTLE_WAIT: Duration = Duration::from_millis(200);

/// What [`Coherence::census`] did.
#[derive(Default)]
struct Censused {
    /// Pages served again.
    served: u64,
    /// Of those, pages found held exclusively by a live node (not read from the logs).
    held: u64,
}

/// How long a census waits for the live nodes' answers (at most the remote timeout).
const CENSUS_WAIT: Duration = Duration::from_secs(2);

/// Whether this node's copy (of another home's page) waits on dead `node`: for its page or
/// its answer, or with a message of it deferred.
fn waits_on(ps: &PageState, node: Node) -> bool {
    let pending_on_it = ps.copy.pending != Pending::Idle
        && (ps.page_from == Some(node) || ps.asked_after == Some(node));
    pending_on_it || ps.copy.deferred.iter().any(|d| d.involves(node))
}

/// Whether this node's copy asked again after `node` died and its request did not leave:
/// lost once its home forgets `node` as the grant's source (else the home, asked again, finds
/// it the holder: found by the model check).
fn asked_unsent_after(ps: &PageState, node: Node) -> bool {
    ps.copy.asking_again && ps.copy.pending == Pending::Idle && ps.asked_after == Some(node)
}

/// Whether this home's page `pid` is lost with `peer`: marked so, or still held by it (its
/// directory names it the exclusive holder, and no reclaim from a live source is in progress).
fn lost_with(ps: &PageState, peer: Node, me: Node, pid: Pid) -> bool {
    debug_assert_eq!(pid.node(), me);
    let held_by_it = ps.dir.holders == Holders::Exclusive(peer)
        && ps.dir.reclaiming.is_none()
        && ps.dir.reclaiming_for.is_none();
    ps.lost == Some(peer) || (ps.lost.is_none() && held_by_it)
}
